//! Clusters: where Applications deploy to. The cluster Setpoint runs in and
//! every cluster registered by a Secret (`secret.rs`, pure) are each one
//! [`Cluster`]: its client, its discovery, its dry-run answers, its live
//! objects from its watches (`live_cache.rs`), its impersonated clients and
//! whether it answers. The [`Registry`]
//! (`registry.rs`) keeps them, from a watch of the cluster Secrets; a
//! reconcile resolves its Application's destination to one (`destination.rs`,
//! pure) once, at its start, and hands that down, so the steps below never
//! pick a client themselves.

pub mod destination;
pub mod live_cache;
pub mod registry;
pub mod secret;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::Client;

use crate::context::{RequestCounter, counted_client};
use crate::reconcile::dry_run::DryRunCache;
use crate::reconcile::kinds::Kinds;
use crate::tenancy::{Identity, impersonating};

pub use destination::{DestinationError, IN_CLUSTER, Wanted};
pub use live_cache::LiveCache;
pub use registry::{Change, Registry};
pub use secret::Entry;

/// A request to another cluster gives up after this long without an answer:
/// a cluster that went away must not hold a worker slot.
pub const REMOTE_REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// And a connection after this long.
pub const REMOTE_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot build a client for the cluster {cluster}: {message}")]
    Client { cluster: String, message: String },
}

/// One cluster Setpoint deploys to.
pub struct Cluster {
    pub name: String,
    /// Its API server's URL (`https://kubernetes.default.svc` for the local
    /// one, as Argo CD names it).
    pub server: String,
    client: Client,
    /// The same credentials, with the read timeout the watches need.
    watch_client: Client,
    /// Discovery, per group-version.
    pub kinds: Kinds,
    /// The server-side diff's dry-run answers, per object.
    pub dry_runs: DryRunCache,
    /// Its live objects of the watched kinds (`live_cache.rs`).
    pub live: LiveCache,
    /// One impersonating client per tenant identity, sharing `client`'s
    /// connections.
    impersonated: Mutex<HashMap<Identity, Client>>,
    reachability: Mutex<Reachability>,
    local: bool,
}

/// Its name, URL and reachability; never a credential (the clients hold
/// them, and are not shown).
impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("name", &self.name)
            .field("server", &self.server)
            .field("local", &self.local)
            .field("reachability", &self.reachability())
            .finish_non_exhaustive()
    }
}

/// Whether a cluster answered lately.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reachability {
    /// Not asked yet.
    Unknown,
    Reachable {
        version: String,
    },
    /// The error it gave (no credential is ever in one), and since when.
    Unreachable {
        error: String,
        since: Instant,
    },
}

impl Cluster {
    /// The cluster Setpoint runs in: the clients it was started with.
    pub fn local(client: Client, watch_client: Client) -> Self {
        Self::with_clients(
            destination::IN_CLUSTER.into(),
            destination::IN_CLUSTER_SERVER.into(),
            client,
            watch_client,
            true,
        )
    }

    /// A registered cluster: clients built from its Secret's credentials,
    /// every request counted in `requests`, bounded in time.
    pub async fn remote(
        entry: &Entry,
        access: &secret::Access,
        requests: &RequestCounter,
    ) -> Result<Self, ClusterError> {
        let failed = |message: String| ClusterError::Client {
            cluster: entry.name.clone(),
            message,
        };
        let mut config = kube::Config::from_custom_kubeconfig(
            entry.kubeconfig(access),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| failed(e.to_string()))?;
        config.connect_timeout = Some(REMOTE_CONNECT_TIMEOUT);
        let watch_client =
            crate::ingest::watch::client(config.clone()).map_err(|e| failed(e.to_string()))?;
        config.read_timeout = Some(REMOTE_REQUEST_TIMEOUT);
        config.reset_reader_on_write = true;
        let client = counted_client(config, requests).map_err(|e| failed(e.to_string()))?;
        Ok(Self::with_clients(
            entry.name.clone(),
            entry.server.clone(),
            client,
            watch_client,
            false,
        ))
    }

    fn with_clients(
        name: String,
        server: String,
        client: Client,
        watch_client: Client,
        local: bool,
    ) -> Self {
        Cluster {
            name,
            server,
            client,
            watch_client,
            kinds: Kinds::default(),
            dry_runs: DryRunCache::default(),
            live: LiveCache::default(),
            impersonated: Mutex::default(),
            reachability: Mutex::new(Reachability::Unknown),
            local,
        }
    }

    pub fn is_local(&self) -> bool {
        self.local
    }

    /// Setpoint's own client of this cluster.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The client the live-object watches use.
    pub fn watch_client(&self) -> &Client {
        &self.watch_client
    }

    /// The client whose requests are made as `identity`: Setpoint's own for
    /// an admin Application, else one that impersonates the service account
    /// (of the same name on every cluster).
    pub fn client_for(&self, identity: &Identity) -> Client {
        if identity.is_admin() {
            return self.client.clone();
        }
        let mut clients = self.impersonated.lock().expect("impersonated clients lock");
        clients
            .entry(identity.clone())
            .or_insert_with(|| impersonating(&self.client, identity))
            .clone()
    }

    pub fn reachability(&self) -> Reachability {
        self.reachability.lock().expect("reachability lock").clone()
    }

    /// The error that made it unreachable, while it is.
    pub fn unreachable(&self) -> Option<String> {
        match &*self.reachability.lock().expect("reachability lock") {
            Reachability::Unreachable { error, .. } => Some(error.clone()),
            _ => None,
        }
    }

    /// It answered; true when it was unreachable before (its Applications
    /// are due a reconcile).
    pub fn set_reachable(&self, version: String) -> bool {
        let mut state = self.reachability.lock().expect("reachability lock");
        let was_unreachable = matches!(*state, Reachability::Unreachable { .. });
        *state = Reachability::Reachable { version };
        was_unreachable
    }

    /// It did not answer, or refused Setpoint's credentials.
    pub fn set_unreachable(&self, error: String) {
        let mut state = self.reachability.lock().expect("reachability lock");
        if !matches!(*state, Reachability::Unreachable { .. }) {
            tracing::warn!(cluster = %self.name, %error, "cluster unreachable");
            *state = Reachability::Unreachable {
                error,
                since: Instant::now(),
            };
        }
    }
}

/// Whether `error` (or what caused it) says the cluster did not answer or
/// refused the credentials, rather than something about one object: the
/// message to show, when it does.
pub fn unreachable_cause(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(kube_error) = e.downcast_ref::<kube::Error>() {
            return match kube_error {
                kube::Error::HyperError(_) | kube::Error::Service(_) => {
                    Some(kube_error.to_string())
                }
                kube::Error::Api(status) if status.code == 401 => Some(format!(
                    "the API server refused Setpoint's credentials (401 {})",
                    status.message
                )),
                _ => None,
            };
        }
        current = e.source();
    }
    None
}
