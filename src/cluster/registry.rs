//! The registered clusters, kept from a watch of the cluster Secrets in
//! Setpoint's namespace: a new Secret is a new cluster, a changed one (a
//! rotated token) replaces its clients, a deleted one drops it, all without
//! a restart. Each cluster is probed while it does not answer, and announced
//! on [`Registry::subscribe`] when it is registered, changed, or answers
//! again, so that its Applications are enqueued and its watches restarted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client, ResourceExt};
use sha2::{Digest, Sha256};
use tokio::sync::{broadcast, watch};

use super::destination::{self, DestinationError, Wanted};
use super::secret::{Entry, EntryError};
use super::{Cluster, Reachability};
use crate::context::RequestCounter;
use crate::metrics::ClusterLabels;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// How often a cluster that does not answer is asked again.
const PROBE_UNREACHABLE: Duration = Duration::from_secs(2);
/// And one that does (its version, for `setpoint cluster list`).
const PROBE_REACHABLE: Duration = Duration::from_secs(30);
/// A probe's own bound.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a reconcile of a remote Application waits for the first
/// listing of the cluster Secrets at start.
const FIRST_LISTING_WAIT: Duration = Duration::from_secs(30);

/// A cluster registered, changed, removed, or answering again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub name: String,
    pub server: String,
}

impl Change {
    /// Whether an Application asking for `wanted` deploys to this cluster.
    pub fn concerns(&self, wanted: &Wanted) -> bool {
        match wanted {
            Wanted::Local => false,
            Wanted::Name(name) => name == &self.name,
            Wanted::Server(server) => server == &self.server,
        }
    }
}

struct Registered {
    entry: Entry,
    /// The clients, or why none could be built.
    cluster: Result<Arc<Cluster>, String>,
    /// A digest of the Secret's data and annotations: an update that
    /// changes neither (a label, a resync) keeps the clients.
    fingerprint: [u8; 32],
}

/// Every cluster Setpoint may deploy to: the local one, and those
/// registered by Secrets.
pub struct Registry {
    local: Arc<Cluster>,
    requests: RequestCounter,
    /// By Secret name.
    registered: RwLock<BTreeMap<String, Registered>>,
    changes: broadcast::Sender<Change>,
    /// True once the cluster Secrets were listed.
    listed: watch::Sender<bool>,
    /// `setpoint_cluster_reachable{cluster}`, from the probes.
    reachable: Option<Family<ClusterLabels, Gauge>>,
}

impl Registry {
    pub fn new(local: Cluster, requests: RequestCounter) -> Self {
        Registry {
            local: Arc::new(local),
            requests,
            registered: RwLock::default(),
            changes: broadcast::channel(1024).0,
            listed: watch::channel(false).0,
            reachable: None,
        }
    }

    /// The same, setting `gauge` from each probe.
    pub fn with_reachability_gauge(mut self, gauge: Family<ClusterLabels, Gauge>) -> Self {
        self.reachable = Some(gauge);
        self
    }

    /// The cluster Setpoint runs in.
    pub fn local(&self) -> &Arc<Cluster> {
        &self.local
    }

    /// Registered, changed, removed and recovered clusters, as they happen.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// The cluster an Application of `namespace` asking for `wanted` deploys
    /// to (`admin`: an admin namespace's). A remote one waits for the first
    /// listing of the cluster Secrets.
    pub async fn resolve(
        &self,
        wanted: &Wanted,
        namespace: &str,
        admin: bool,
    ) -> Result<Arc<Cluster>, DestinationError> {
        if wanted.is_local() {
            return Ok(self.local.clone());
        }
        let mut listed = self.listed.subscribe();
        let _ = tokio::time::timeout(FIRST_LISTING_WAIT, listed.wait_for(|listed| *listed)).await;
        let registered = self.registered.read().expect("registry lock");
        let entry = destination::resolve(
            wanted,
            namespace,
            admin,
            registered.values().map(|r| &r.entry),
        )?;
        match &registered[&entry.secret].cluster {
            Ok(cluster) => Ok(cluster.clone()),
            Err(message) => Err(DestinationError::Refused {
                cluster: entry.name.clone(),
                source: EntryError::InvalidConfig {
                    secret: entry.secret.clone(),
                    message: message.clone(),
                },
            }),
        }
    }

    /// Waits (within the first listing's bound) until the cluster Secrets
    /// were listed once: before that, the registry may not yet know a
    /// cluster that exists.
    pub async fn wait_listed(&self) {
        let mut listed = self.listed.subscribe();
        let _ = tokio::time::timeout(FIRST_LISTING_WAIT, listed.wait_for(|listed| *listed)).await;
    }

    /// The registered entries and their clusters (when built), by name.
    pub fn clusters(&self) -> Vec<(Entry, Option<Arc<Cluster>>)> {
        let registered = self.registered.read().expect("registry lock");
        let mut all: Vec<_> = registered
            .values()
            .map(|r| (r.entry.clone(), r.cluster.as_ref().ok().cloned()))
            .collect();
        all.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        all
    }

    /// Reads `secret` as a cluster's: registered, replaced when its data
    /// changed, or dropped when it no longer is one.
    pub async fn upsert(&self, secret: &Secret) {
        let secret_name = secret.name_any();
        if !Entry::is_cluster_secret(secret) {
            self.remove(&secret_name);
            return;
        }
        let entry = match Entry::from_secret(secret) {
            Ok(entry) => entry,
            Err(error) => {
                tracing::warn!(%error, "ignoring a cluster Secret");
                self.remove(&secret_name);
                return;
            }
        };
        let fingerprint = fingerprint(secret);
        {
            let mut registered = self.registered.write().expect("registry lock");
            if let Some(known) = registered
                .get_mut(&secret_name)
                .filter(|r| r.fingerprint == fingerprint)
            {
                // The same clients; new labels or annotations are news to
                // the ApplicationSets' cluster generators.
                if known.entry.labels != entry.labels
                    || known.entry.annotations != entry.annotations
                {
                    known.entry.labels = entry.labels;
                    known.entry.annotations = entry.annotations;
                    let _ = self.changes.send(Change {
                        name: entry.name,
                        server: entry.server,
                    });
                }
                return;
            }
        }
        let cluster = match &entry.access {
            Ok(access) => Cluster::remote(&entry, access, &self.requests)
                .await
                .map(Arc::new)
                .map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match &cluster {
            Ok(_) => {
                tracing::info!(cluster = %entry.name, server = %entry.server, secret = %secret_name, "cluster registered")
            }
            Err(error) => {
                tracing::warn!(cluster = %entry.name, secret = %secret_name, %error, "cluster registered but not usable")
            }
        }
        let change = Change {
            name: entry.name.clone(),
            server: entry.server.clone(),
        };
        let previous = self.registered.write().expect("registry lock").insert(
            secret_name,
            Registered {
                entry,
                cluster,
                fingerprint,
            },
        );
        if let Some(previous) = previous
            && previous.entry.name != change.name
        {
            let _ = self.changes.send(Change {
                name: previous.entry.name,
                server: previous.entry.server,
            });
        }
        let _ = self.changes.send(change);
    }

    /// Drops the cluster of Secret `secret_name`, if any.
    pub fn remove(&self, secret_name: &str) {
        let removed = self
            .registered
            .write()
            .expect("registry lock")
            .remove(secret_name);
        if let Some(removed) = removed {
            if let Some(gauge) = &self.reachable {
                gauge.remove(&ClusterLabels {
                    cluster: removed.entry.name.clone(),
                });
            }
            tracing::info!(cluster = %removed.entry.name, secret = secret_name, "cluster removed");
            let _ = self.changes.send(Change {
                name: removed.entry.name,
                server: removed.entry.server,
            });
        }
    }

    /// Reads the cluster Secrets of `namespace` once (a one-shot command's
    /// registry: `setpoint reconcile`, `app diff`, `cluster list`).
    pub async fn load(&self, client: &Client, namespace: &str) -> Result<(), kube::Error> {
        let secrets = Api::<Secret>::namespaced(client.clone(), namespace)
            .list(&Default::default())
            .await?;
        for secret in &secrets.items {
            self.upsert(secret).await;
        }
        self.listed.send_replace(true);
        Ok(())
    }

    /// Keeps the registry: watches the Secrets of `namespace` (reading as
    /// clusters those labelled as such) and probes the clusters.
    pub async fn run(self: Arc<Self>, client: Client, namespace: String) {
        tokio::spawn(self.clone().probe());
        let api: Api<Secret> = Api::namespaced(client, &namespace);
        tracing::info!(%namespace, "watching cluster Secrets");
        let stream = watcher::watcher(api, watcher::Config::default().timeout(60));
        futures::pin_mut!(stream);
        let mut listing: Option<BTreeSet<String>> = None;
        while let Some(event) = stream.next().await {
            match event {
                Ok(WatchEvent::Init) => listing = Some(BTreeSet::new()),
                Ok(WatchEvent::InitApply(secret)) => {
                    if let Some(listing) = listing.as_mut() {
                        listing.insert(secret.name_any());
                    }
                    self.upsert(&secret).await;
                }
                Ok(WatchEvent::InitDone) => {
                    let listed = listing.take().unwrap_or_default();
                    let gone: Vec<String> = self
                        .registered
                        .read()
                        .expect("registry lock")
                        .keys()
                        .filter(|name| !listed.contains(*name))
                        .cloned()
                        .collect();
                    for name in gone {
                        self.remove(&name);
                    }
                    self.listed.send_replace(true);
                }
                Ok(WatchEvent::Apply(secret)) => self.upsert(&secret).await,
                Ok(WatchEvent::Delete(secret)) => self.remove(&secret.name_any()),
                Err(error) => {
                    tracing::warn!(%namespace, %error, "cluster Secret watch failed; retrying");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }

    /// Asks each remote cluster for its version: often while it does not
    /// answer, now and then while it does. One that answers again is
    /// announced, so its Applications converge without a manual step.
    async fn probe(self: Arc<Self>) {
        let mut last: BTreeMap<String, Instant> = BTreeMap::new();
        loop {
            tokio::time::sleep(PROBE_UNREACHABLE).await;
            let due: Vec<Arc<Cluster>> = self
                .clusters()
                .into_iter()
                .filter_map(|(_, cluster)| cluster)
                .filter(|cluster| {
                    let interval = match cluster.reachability() {
                        Reachability::Reachable { .. } => PROBE_REACHABLE,
                        _ => PROBE_UNREACHABLE,
                    };
                    last.get(&cluster.name)
                        .is_none_or(|at| at.elapsed() >= interval)
                })
                .collect();
            let probes = due.iter().map(|cluster| async move {
                let answer =
                    tokio::time::timeout(PROBE_TIMEOUT, cluster.client().apiserver_version()).await;
                (cluster, answer)
            });
            for (cluster, answer) in futures::future::join_all(probes).await {
                last.insert(cluster.name.clone(), Instant::now());
                if let Some(gauge) = &self.reachable {
                    let labels = ClusterLabels {
                        cluster: cluster.name.clone(),
                    };
                    gauge
                        .get_or_create(&labels)
                        .set(i64::from(matches!(answer, Ok(Ok(_)))));
                }
                match answer {
                    Ok(Ok(info)) => {
                        if cluster.set_reachable(info.git_version) {
                            tracing::info!(cluster = %cluster.name, "cluster answers again");
                            let _ = self.changes.send(Change {
                                name: cluster.name.clone(),
                                server: cluster.server.clone(),
                            });
                        }
                    }
                    Ok(Err(error)) => cluster.set_unreachable(
                        super::unreachable_cause(&error).unwrap_or_else(|| error.to_string()),
                    ),
                    Err(_) => {
                        cluster.set_unreachable(format!("no answer within {PROBE_TIMEOUT:?}"))
                    }
                }
            }
        }
    }
}

fn fingerprint(secret: &Secret) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for (key, value) in secret.data.iter().flatten() {
        hasher.update(key.as_bytes());
        hasher.update([0]);
        hasher.update(&value.0);
        hasher.update([0]);
    }
    for (key, value) in secret.string_data.iter().flatten() {
        hasher.update(key.as_bytes());
        hasher.update([1]);
        hasher.update(value.as_bytes());
        hasher.update([1]);
    }
    for (key, value) in secret.labels() {
        hasher.update(key.as_bytes());
        hasher.update([3]);
        hasher.update(value.as_bytes());
        hasher.update([3]);
    }
    for (key, value) in secret.annotations() {
        hasher.update(key.as_bytes());
        hasher.update([2]);
        hasher.update(value.as_bytes());
        hasher.update([2]);
    }
    hasher.finalize().into()
}
