//! Metrics in Prometheus' text format, and the probe endpoints, served on
//! `--metrics-listen` by every long-running role:
//!
//! - `GET /metrics`: the metrics below;
//! - `GET /healthz`: 200 while the process runs (liveness);
//! - `GET /readyz`: 200 only when the broker and the API server answer
//!   (readiness), else 503 with what is not reachable.
//!
//! Metric names follow Prometheus' conventions (`_total`, `_seconds`), as
//! Argo CD's and Flux's controllers do.

use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpResponse, web};
use kube::runtime::reflector::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::api::{Application, Health, Sync};
use crate::queue::Queue;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    pub provider: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    pub namespace: String,
    pub app: String,
    /// `synced`, `out_of_sync`, `retry` (a transient error) or `failed`.
    pub outcome: String,
}

/// `sent` (a request to the API server) or `cached` (an earlier answer for
/// the same live version and body).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DryRunLabels {
    pub result: String,
}

/// A preview's provider and outcome: `posted` (changes or none), `failed`
/// (a render or dry run failed: posted too), `error` (nothing could be
/// posted), `skipped` (a fork's, with `previews.forks` off).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PreviewLabels {
    pub provider: String,
    pub outcome: String,
}

/// A notification's Provider (`namespace/name`) and what became of one
/// delivery: `sent`, `failed` (retried with backoff), `parked` (its last
/// attempt failed), `dropped` (no such Provider or Secret, or suspended),
/// `duplicate` (delivered before), `unpublished` (the queue refused it).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotifyLabels {
    pub provider: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub group: String,
    pub kind: String,
    /// The destination cluster (`in-cluster` or a registered cluster's
    /// name: as many as clusters).
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppStatusLabels {
    pub namespace: String,
    pub app: String,
    pub status: String,
}

/// One registered cluster (as many series as clusters).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabels {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub namespace: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Every metric of a process; cheap to clone (the metrics are shared).
#[derive(Clone)]
pub struct Metrics(Arc<Inner>);

pub struct Inner {
    registry: Registry,
    pub webhooks: Family<WebhookLabels, Counter>,
    pub publish_seconds: Histogram,
    pub messages_ready: Gauge,
    pub messages_parked: Gauge,
    pub shards_active: Gauge,
    pub applications_indexed: Gauge,
    pub reconcile_seconds: HistogramFamily<NamespaceLabels>,
    pub reconciles: Family<ReconcileLabels, Counter>,
    pub drift_corrections: Family<KindLabels, Counter>,
    pub dry_runs: Family<DryRunLabels, Counter>,
    pub app_sync: Family<AppStatusLabels, Gauge>,
    pub app_health: Family<AppStatusLabels, Gauge>,
    pub git_fetch_seconds: Histogram,
    pub git_requests: Family<GitRequestLabels, Counter>,
    pub api_requests: Family<ApiRequestLabels, Counter>,
    pub render_runs: Family<RenderLabels, Counter>,
    pub commit_status_failures: Counter,
    pub previews: Family<PreviewLabels, Counter>,
    pub preview_seconds: Histogram,
    pub notifications: Family<NotifyLabels, Counter>,
    pub notify_seconds: Histogram,
    pub cluster_reachable: Family<ClusterLabels, Gauge>,
    pub live_objects_cached: Family<ClusterLabels, Gauge>,
    pub appset_evaluations: Family<AppSetLabels, Counter>,
    pub appset_applications: Family<AppSetLabels, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppSetLabels {
    pub namespace: String,
    pub appset: String,
    /// For evaluations: `applied`, `unchanged`, `refused` (an error on its
    /// status, nothing changed) or `retry`; empty for the gauge.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GitRequestLabels {
    /// The git command that went to the remote: `fetch`.
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    /// `read` (GET), `write` (what persists) or `dry_run` (`dryRun=All`).
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RenderLabels {
    /// `kustomize` or `helm`.
    pub method: String,
}

impl std::ops::Deref for Metrics {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

fn seconds_buckets() -> Histogram {
    // 5 ms to about 82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Counts one dry run of the server-side diff (`sent` or `cached`).
    pub fn dry_run(&self, result: &str) {
        self.dry_runs
            .get_or_create(&DryRunLabels {
                result: result.into(),
            })
            .inc();
    }

    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("setpoint");
        let webhooks = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Webhook deliveries by provider and outcome (accepted, duplicate: a redelivery or a replay, ignored, unauthorized, bad_request, too_large, unsupported_media_type, busy: too many bytes in flight, timeout: the body came too slowly, unavailable)",
            webhooks.clone(),
        );
        let publish_seconds = seconds_buckets();
        registry.register(
            "queue_publish_duration_seconds",
            "Time until the queue confirmed a published event",
            publish_seconds.clone(),
        );
        let messages_ready = Gauge::default();
        registry.register(
            "queue_messages_ready",
            "Events waiting in the queue (shards and retry delays), read at scrape time",
            messages_ready.clone(),
        );
        let messages_parked = Gauge::default();
        registry.register(
            "queue_messages_parked",
            "Events parked after their last attempt failed",
            messages_parked.clone(),
        );
        let shards_active = Gauge::default();
        registry.register(
            "queue_shards_active",
            "Shards this process consumes as their single active consumer, read at scrape time",
            shards_active.clone(),
        );
        let applications_indexed = Gauge::default();
        registry.register(
            "applications_indexed",
            "Applications in this process's index (webhook routing, watch, sweep), read at scrape time",
            applications_indexed.clone(),
        );
        // Per namespace, as Argo CD's argocd_app_reconcile: a histogram per
        // Application is 17 series each (170,000 at 10,000 Applications).
        let reconcile_seconds: HistogramFamily<NamespaceLabels> =
            Family::new_with_constructor(seconds_buckets);
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile, per namespace of Applications",
            reconcile_seconds.clone(),
        );
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles per Application and outcome (synced, out_of_sync, retry, failed)",
            reconciles.clone(),
        );
        let drift_corrections = Family::<KindLabels, Counter>::default();
        registry.register(
            "drift_corrections",
            "Live objects set back to what Git holds, by kind and destination cluster",
            drift_corrections.clone(),
        );
        let dry_runs = Family::<DryRunLabels, Counter>::default();
        registry.register(
            "dry_runs",
            "Server-side apply dry runs of live objects for the diff: sent to the API server, or answered from the cache",
            dry_runs.clone(),
        );
        let app_sync = Family::<AppStatusLabels, Gauge>::default();
        registry.register(
            "app_sync_status",
            "1, labelled with the Application's sync status (Synced, OutOfSync, Unknown); one series per Application",
            app_sync.clone(),
        );
        let app_health = Family::<AppStatusLabels, Gauge>::default();
        registry.register(
            "app_health_status",
            "1, labelled with the Application's health status; one series per Application",
            app_health.clone(),
        );
        let git_fetch_seconds = seconds_buckets();
        registry.register(
            "git_fetch_duration_seconds",
            "Duration of one git fetch of a mirror",
            git_fetch_seconds.clone(),
        );
        let git_requests = Family::<GitRequestLabels, Counter>::default();
        registry.register(
            "git_requests",
            "Git commands that went to a remote repository, by operation (fetch), retries included",
            git_requests.clone(),
        );
        let api_requests = Family::<ApiRequestLabels, Counter>::default();
        registry.register(
            "api_requests",
            "Requests this process sent to the Kubernetes API server, by kind (read, write, dry_run: a dryRun=All request, which persists nothing)",
            api_requests.clone(),
        );
        let render_runs = Family::<RenderLabels, Counter>::default();
        registry.register(
            "render_runs",
            "Runs of an external renderer (cache misses)",
            render_runs.clone(),
        );
        let commit_status_failures = Counter::default();
        registry.register(
            "github_commit_status_failures",
            "Commit statuses that could not be posted after their retries",
            commit_status_failures.clone(),
        );
        let previews = Family::<PreviewLabels, Counter>::default();
        registry.register(
            "previews",
            "Pull request previews by provider and outcome (posted, failed: a render or dry run failed, error: nothing posted, skipped: a fork's)",
            previews.clone(),
        );
        let preview_seconds = seconds_buckets();
        registry.register(
            "preview_duration_seconds",
            "Duration of one pull request preview, from the event to the comment posted",
            preview_seconds.clone(),
        );
        let notifications = Family::<NotifyLabels, Counter>::default();
        registry.register(
            "notifications",
            "Notification deliveries by Provider and outcome: sent, failed (retried), parked (last attempt failed), dropped (no Provider or Secret, or suspended), duplicate (delivered before), unpublished",
            notifications.clone(),
        );
        let notify_seconds = seconds_buckets();
        registry.register(
            "notification_latency_seconds",
            "From the event's publish to the Provider's answer, for the notifications sent",
            notify_seconds.clone(),
        );
        let cluster_reachable = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "cluster_reachable",
            "1 while a registered cluster answered its last probe, 0 while it does not",
            cluster_reachable.clone(),
        );
        let live_objects_cached = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "live_objects_cached",
            "Live objects held in a cluster's watch-fed cache, which the reconciles read instead of the API server; read at scrape time",
            live_objects_cached.clone(),
        );
        let appset_evaluations = Family::<AppSetLabels, Counter>::default();
        registry.register(
            "appset_evaluations",
            "ApplicationSet evaluations, by result: applied (Applications created, updated or deleted), unchanged, refused (an error on its status, nothing changed), retry",
            appset_evaluations.clone(),
        );
        let appset_applications = Family::<AppSetLabels, Gauge>::default();
        registry.register(
            "appset_applications",
            "The Applications an ApplicationSet owns, as of its last evaluation",
            appset_applications.clone(),
        );
        Metrics(Arc::new(Inner {
            registry,
            webhooks,
            publish_seconds,
            messages_ready,
            messages_parked,
            shards_active,
            applications_indexed,
            reconcile_seconds,
            reconciles,
            drift_corrections,
            dry_runs,
            app_sync,
            app_health,
            git_fetch_seconds,
            git_requests,
            api_requests,
            render_runs,
            commit_status_failures,
            previews,
            preview_seconds,
            notifications,
            notify_seconds,
            cluster_reachable,
            live_objects_cached,
            appset_evaluations,
            appset_applications,
        }))
    }

    /// The counter of `git fetch` commands sent to remotes.
    pub fn git_fetches(&self) -> Counter {
        self.git_requests
            .get_or_create(&GitRequestLabels { op: "fetch".into() })
            .clone()
    }

    /// The counter of API requests of one kind (`read`, `write`, `dry_run`).
    pub fn api_requests(&self, kind: &str) -> Counter {
        self.api_requests
            .get_or_create(&ApiRequestLabels { kind: kind.into() })
            .clone()
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// Records the sync and health an Application ended a reconcile with:
    /// one series each, labelled with the status, as kube-state-metrics'
    /// `*_info` series and Argo CD's `argocd_app_info`. A change removes the
    /// series of the status before it (eight series per Application with a
    /// 0 for each other status cost 22 MiB and a 23 MB scrape at 10,000).
    pub fn app_status(&self, namespace: &str, app: &str, sync: Sync, health: Health) {
        let labels = |status: &str| AppStatusLabels {
            namespace: namespace.to_string(),
            app: app.to_string(),
            status: status.to_string(),
        };
        for candidate in [Sync::Synced, Sync::OutOfSync, Sync::Unknown] {
            if candidate != sync {
                self.app_sync.remove(&labels(sync_name(candidate)));
            }
        }
        self.app_sync.get_or_create(&labels(sync_name(sync))).set(1);
        for candidate in [
            Health::Healthy,
            Health::Suspended,
            Health::Progressing,
            Health::Degraded,
            Health::Missing,
            Health::Unknown,
        ] {
            if candidate != health {
                self.app_health.remove(&labels(health_name(candidate)));
            }
        }
        self.app_health
            .get_or_create(&labels(health_name(health)))
            .set(1);
    }

    /// One reconcile's duration (per namespace) and outcome (per
    /// Application).
    pub fn reconciled(&self, namespace: &str, app: &str, outcome: &str, took: Duration) {
        self.reconcile_seconds
            .get_or_create(&NamespaceLabels {
                namespace: namespace.to_string(),
            })
            .observe(took.as_secs_f64());
        self.reconciles
            .get_or_create(&ReconcileLabels {
                namespace: namespace.to_string(),
                app: app.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }
}

fn sync_name(sync: Sync) -> &'static str {
    match sync {
        Sync::Synced => "Synced",
        Sync::OutOfSync => "OutOfSync",
        Sync::Unknown => "Unknown",
    }
}

fn health_name(health: Health) -> &'static str {
    match health {
        Health::Healthy => "Healthy",
        Health::Suspended => "Suspended",
        Health::Progressing => "Progressing",
        Health::Degraded => "Degraded",
        Health::Missing => "Missing",
        Health::Unknown => "Unknown",
    }
}

/// What `/metrics` and `/readyz` look at.
#[derive(Clone)]
pub struct Probes {
    pub metrics: Metrics,
    pub queue: Arc<dyn Queue>,
    pub client: kube::Client,
    /// The Application index, in the roles that keep one.
    pub index: Option<Store<Application>>,
    /// The clusters, whose live caches are counted.
    pub clusters: Option<Arc<crate::cluster::Registry>>,
}

/// How long `/readyz` waits for the API server.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

impl Probes {
    /// `Ok` when the broker and the API server answer; else what does not.
    pub async fn ready(&self) -> Result<(), String> {
        let mut missing = Vec::new();
        if !self.queue.is_ready() {
            missing.push("the queue's broker is not connected".to_string());
        }
        match tokio::time::timeout(READY_TIMEOUT, self.client.apiserver_version()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => missing.push(format!("the API server: {error}")),
            Err(_) => missing.push(format!(
                "the API server did not answer within {READY_TIMEOUT:?}"
            )),
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(missing.join("; "))
        }
    }
}

/// Mounts `/metrics`, `/healthz` and `/readyz`.
pub fn configure(cfg: &mut web::ServiceConfig, probes: Probes) {
    cfg.app_data(web::Data::new(probes))
        .route("/metrics", web::get().to(metrics))
        .route("/healthz", web::get().to(|| async { "ok" }))
        .route("/readyz", web::get().to(readyz));
}

async fn metrics(probes: web::Data<Probes>) -> HttpResponse {
    if let Ok(Some(depth)) = tokio::time::timeout(READY_TIMEOUT, probes.queue.depth()).await {
        probes.metrics.messages_ready.set(i64::from(depth.ready));
        probes.metrics.messages_parked.set(i64::from(depth.parked));
    }
    let count = |gauge: &Gauge, n: usize| gauge.set(i64::try_from(n).unwrap_or(i64::MAX));
    if let Some(active) = probes.queue.active_shards() {
        count(&probes.metrics.shards_active, active);
    }
    if let Some(index) = &probes.index {
        count(&probes.metrics.applications_indexed, index.state().len());
    }
    if let Some(clusters) = &probes.clusters {
        let local = std::iter::once(clusters.local().clone());
        let registered = clusters.clusters().into_iter().filter_map(|(_, c)| c);
        for cluster in local.chain(registered) {
            let labels = ClusterLabels {
                cluster: cluster.name.clone(),
            };
            count(
                &probes.metrics.live_objects_cached.get_or_create(&labels),
                cluster.live.len(),
            );
        }
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(probes.metrics.encode())
}

async fn readyz(probes: web::Data<Probes>) -> HttpResponse {
    match probes.ready().await {
        Ok(()) => HttpResponse::Ok().body("ok"),
        Err(why) => HttpResponse::ServiceUnavailable().body(format!("not ready: {why}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exposed_with_their_labels() {
        let metrics = Metrics::new();
        metrics
            .webhooks
            .get_or_create(&WebhookLabels {
                provider: "github".into(),
                outcome: "accepted".into(),
            })
            .inc();
        metrics.reconciled("team-a", "web", "synced", Duration::from_millis(30));
        metrics.app_status("team-a", "web", Sync::OutOfSync, Health::Healthy);
        metrics
            .drift_corrections
            .get_or_create(&KindLabels {
                group: "apps".into(),
                kind: "Deployment".into(),
                cluster: "staging".into(),
            })
            .inc();
        let text = metrics.encode();
        for line in [
            r#"setpoint_webhook_requests_total{provider="github",outcome="accepted"} 1"#,
            r#"setpoint_reconciles_total{namespace="team-a",app="web",outcome="synced"} 1"#,
            r#"setpoint_reconcile_duration_seconds_count{namespace="team-a"} 1"#,
            r#"setpoint_app_sync_status{namespace="team-a",app="web",status="OutOfSync"} 1"#,
            r#"setpoint_app_health_status{namespace="team-a",app="web",status="Healthy"} 1"#,
            r#"setpoint_drift_corrections_total{group="apps",kind="Deployment",cluster="staging"} 1"#,
            "# TYPE setpoint_git_fetch_duration_seconds histogram",
            "# TYPE setpoint_queue_messages_ready gauge",
            "# TYPE setpoint_applications_indexed gauge",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn an_application_has_one_sync_and_one_health_series() {
        let metrics = Metrics::new();
        metrics.app_status("team-a", "web", Sync::OutOfSync, Health::Healthy);
        metrics.app_status("team-a", "web", Sync::Synced, Health::Progressing);
        metrics.app_status("team-a", "api", Sync::OutOfSync, Health::Healthy);
        let text = metrics.encode();
        let series = |name: &str, app: &str| -> Vec<&str> {
            text.lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .filter(|l| l.contains(&format!("app=\"{app}\"")))
                .collect()
        };
        assert_eq!(
            series("setpoint_app_sync_status", "web"),
            [r#"setpoint_app_sync_status{namespace="team-a",app="web",status="Synced"} 1"#]
        );
        assert_eq!(
            series("setpoint_app_health_status", "web"),
            [r#"setpoint_app_health_status{namespace="team-a",app="web",status="Progressing"} 1"#]
        );
        assert_eq!(
            series("setpoint_app_sync_status", "api"),
            [r#"setpoint_app_sync_status{namespace="team-a",app="api",status="OutOfSync"} 1"#]
        );
    }
}
