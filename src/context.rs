//! The one shared context of a Setpoint process: the local cluster's client
//! (with its request counter), where the Applications live; the registered
//! clusters they deploy to (`cluster::Registry`, the local one among them);
//! the Git mirrors, renderers and metrics. Cloned cheaply into every
//! reconcile.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use http::{Method, Request};
use kube::client::{Body, ClientBuilder};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::Store;
use kube::{Client, Config};
use prometheus_client::metrics::counter::Counter;
use tower::util::MapRequestLayer;

use crate::api::Application;
use crate::cluster::{Cluster, Registry};
use crate::metrics::Metrics;
use crate::report::CommitStatuses;
use crate::source::chart::{ChartSettings, ChartSource};
use crate::source::git::{Credentials, GitSource};
use crate::source::render::{RenderSettings, Renderers};
use crate::tenancy::{Identity, Tenancy};

#[derive(Clone)]
pub struct Context(Arc<Inner>);

pub struct Inner {
    /// The cluster Setpoint runs in: its Applications, their status and
    /// Events, Leases, credentials Secrets.
    pub client: Client,
    pub requests: RequestCounter,
    /// Where Applications deploy to: the local cluster and the registered
    /// ones, each with its discovery, dry runs and impersonated clients.
    pub clusters: Arc<Registry>,
    pub git: GitSource,
    /// Helm repositories and OCI registries: listings and archives.
    pub charts: ChartSource,
    pub reporter: Reporter,
    /// Kustomize and Helm, with their output cache.
    pub renderers: Renderers,
    pub metrics: Metrics,
    /// Git credentials for http(s) repositories whose Application names no
    /// Secret: `SETPOINT_GIT_USERNAME` and `SETPOINT_GIT_PASSWORD` (or
    /// `SETPOINT_GIT_PASSWORD_FILE`).
    pub git_credentials: Option<Credentials>,
    /// Commit statuses on GitHub and GitLab for the syncs of new revisions,
    /// each when its token is configured (`SETPOINT_GITHUB_TOKEN`,
    /// `SETPOINT_GITLAB_API_TOKEN`).
    pub commit_statuses: CommitStatuses,
    /// Admin namespaces, default service account, where sources may come
    /// from.
    pub tenancy: Tenancy,
    /// The Applications the process's watch holds (when it runs one): the
    /// reconcile reads its dependencies (`spec.dependsOn`) here.
    applications: OnceLock<Store<Application>>,
    /// The `resourceVersion` of each Application's last status written by
    /// this process: the store's copy is used only once it is that recent.
    written: std::sync::Mutex<std::collections::HashMap<(String, String), u64>>,
    /// Pull request previews: settings, and where they are posted.
    previews: OnceLock<crate::preview::Previews>,
    /// Notifications out: the Alerts and Providers, where the tap
    /// publishes and what delivery needs (when this process set one up).
    notifier: OnceLock<crate::notify::Notifier>,
    /// Each Application's custom health rules (`spec.healthChecks` over the
    /// configuration's), compiled once per generation.
    pub health_rules: crate::reconcile::health::RuleCache,
}

impl std::ops::Deref for Context {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl Context {
    /// A context whose client counts every request it sends.
    pub fn new(config: Config, cache_dir: PathBuf, tenancy: Tenancy) -> Result<Self, kube::Error> {
        Self::with_commit_statuses(config, cache_dir, tenancy, CommitStatuses::default())
    }

    /// The same, posting commit statuses through `commit_statuses`.
    pub fn with_commit_statuses(
        config: Config,
        cache_dir: PathBuf,
        tenancy: Tenancy,
        commit_statuses: CommitStatuses,
    ) -> Result<Self, kube::Error> {
        let metrics = Metrics::new();
        let requests = RequestCounter::from_metrics(&metrics);
        let watch_client = crate::ingest::watch::client(config.clone())?;
        let client = counted_client(config, &requests)?;
        let clusters = Arc::new(
            Registry::new(
                Cluster::local(client.clone(), watch_client),
                requests.clone(),
            )
            .with_reachability_gauge(metrics.cluster_reachable.clone()),
        );
        let reporter = Reporter {
            controller: "setpoint".into(),
            instance: std::env::var("POD_NAME")
                .ok()
                .or_else(|| std::env::var("HOSTNAME").ok()),
        };
        Ok(Self(Arc::new(Inner {
            client,
            requests,
            clusters,
            charts: ChartSource::new(ChartSettings::from_env(), cache_dir.clone()),
            // Short in-process retries: the queue retries with backoff too.
            renderers: Renderers::new(RenderSettings::from_env(), cache_dir.join("render"))
                .with_metrics(&metrics),
            git: GitSource::new(cache_dir)
                .with_fetch_retry_budget(std::time::Duration::from_secs(2))
                .with_fetch_histogram(metrics.git_fetch_seconds.clone())
                .with_fetch_requests(metrics.git_fetches()),
            metrics,
            reporter,
            git_credentials: credentials_from_env(),
            commit_statuses,
            tenancy,
            applications: OnceLock::new(),
            written: Default::default(),
            previews: OnceLock::new(),
            notifier: OnceLock::new(),
            health_rules: Default::default(),
        })))
    }

    /// Hands the reconcile the watch's Application store (once).
    pub fn set_applications(&self, store: Store<Application>) {
        let _ = self.applications.set(store);
    }

    /// Sets the previews' settings and clients (once, at start).
    pub fn set_previews(&self, previews: crate::preview::Previews) {
        let _ = self.previews.set(previews);
    }

    /// Sets the notifier (once, at start).
    pub fn set_notifier(&self, notifier: crate::notify::Notifier) {
        let _ = self.notifier.set(notifier);
    }

    /// The notifier, when this process has one.
    pub fn notifier(&self) -> Option<&crate::notify::Notifier> {
        self.notifier.get()
    }

    /// The previews' settings and clients (defaults until set).
    pub fn previews(&self) -> &crate::preview::Previews {
        static DEFAULT: OnceLock<crate::preview::Previews> = OnceLock::new();
        self.previews
            .get()
            .unwrap_or_else(|| DEFAULT.get_or_init(Default::default))
    }

    /// The watch's Application store, if this process runs one.
    pub fn applications(&self) -> Option<&Store<Application>> {
        self.applications.get()
    }

    /// The Application as the watch's store holds it, when that copy is at
    /// least as recent as the last status this process wrote on it (else,
    /// or without a store, None: read it from the API server). A worker
    /// then reads no Application per reconcile; a copy that is stale all
    /// the same (another process wrote since) fails its status write with a
    /// conflict, which reads it again.
    pub fn stored_application(&self, namespace: &str, name: &str) -> Option<Application> {
        let store = self.applications.get()?;
        let app = store.get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))?;
        let held = version(app.metadata.resource_version.as_deref())?;
        let written = self
            .written
            .lock()
            .expect("written versions lock")
            .get(&(namespace.to_string(), name.to_string()))
            .copied();
        written.is_none_or(|w| held >= w).then(|| (*app).clone())
    }

    /// A status write of this process made `namespace/name` this version.
    pub fn status_written(&self, namespace: &str, name: &str, resource_version: Option<&str>) {
        let mut written = self.written.lock().expect("written versions lock");
        let key = (namespace.to_string(), name.to_string());
        match version(resource_version) {
            Some(v) => {
                written.insert(key, v);
            }
            // Not a number: the store's copies cannot be compared with it.
            None => {
                written.insert(key, u64::MAX);
            }
        }
    }

    /// The local cluster's client whose requests are made as `identity`
    /// (an Application's credentials Secret is read with it).
    pub fn client_for(&self, identity: &Identity) -> Client {
        self.clusters.local().client_for(identity)
    }

    /// The cluster Setpoint runs in.
    pub fn local(&self) -> &Arc<Cluster> {
        self.clusters.local()
    }
}

/// A `resourceVersion` as the integer etcd makes it.
fn version(resource_version: Option<&str>) -> Option<u64> {
    resource_version?.parse().ok()
}

fn credentials_from_env() -> Option<Credentials> {
    let password = std::env::var("SETPOINT_GIT_PASSWORD").ok().or_else(|| {
        let file = std::env::var_os("SETPOINT_GIT_PASSWORD_FILE")?;
        std::fs::read_to_string(file)
            .ok()
            .map(|p| p.trim().to_string())
    })?;
    let username = std::env::var("SETPOINT_GIT_USERNAME").unwrap_or_else(|_| "git".into());
    Some(Credentials { username, password })
}

/// Builds a client whose every request is counted by `requests`.
pub fn counted_client(config: Config, requests: &RequestCounter) -> Result<Client, kube::Error> {
    let counter = requests.clone();
    let layer = MapRequestLayer::new(move |request: Request<Body>| {
        let dry_run = request
            .uri()
            .query()
            .is_some_and(|query| query.split('&').any(|pair| pair == "dryRun=All"));
        counter.record(request.method(), dry_run);
        request
    });
    Ok(ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

/// How many requests went to the API server, reads, writes and dry runs
/// apart: the idempotence tests and the benchmarks read it. A dry run
/// (`dryRun=All`, the server-side diff's and the apply's) is a PATCH that
/// persists nothing, so it is not counted as a write. `/metrics` shows the
/// same counts as `setpoint_api_requests_total{kind}`.
#[derive(Clone, Default)]
pub struct RequestCounter([Counter; 3]);

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCount {
    pub reads: u64,
    pub writes: u64,
    pub dry_runs: u64,
}

impl RequestCounter {
    /// Counters registered in `metrics` (reads, writes, dry runs).
    pub fn from_metrics(metrics: &Metrics) -> Self {
        Self(["read", "write", "dry_run"].map(|kind| metrics.api_requests(kind)))
    }

    fn record(&self, method: &Method, dry_run: bool) {
        let slot = if dry_run {
            2
        } else if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            0
        } else {
            1
        };
        self.0[slot].inc();
    }

    pub fn get(&self) -> RequestCount {
        RequestCount {
            reads: self.0[0].get(),
            writes: self.0[1].get(),
            dry_runs: self.0[2].get(),
        }
    }
}

impl std::ops::Sub for RequestCount {
    type Output = RequestCount;
    fn sub(self, earlier: RequestCount) -> RequestCount {
        RequestCount {
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            dry_runs: self.dry_runs - earlier.dry_runs,
        }
    }
}
