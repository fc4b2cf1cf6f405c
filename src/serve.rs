//! The long-running roles, assembled: `run` (everything in one process, the
//! embedded queue by default), `webhook`, `worker`, `watch` and `sweep`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use kube::runtime::reflector;
use tokio::sync::watch;

use crate::api::Application;
use crate::context::Context;
use crate::ingest::sweep::{self, LeaseSettings, SweepSettings};
use crate::ingest::watch as live_watch;
use crate::ingest::webhook::{self, WebhookSettings};
use crate::metrics::Probes;
use crate::queue::amqp::{AmqpQueue, AmqpSettings, QueueType};
use crate::queue::memory::MemoryQueue;
use crate::queue::{Metered, Queue, RetryPolicy};
use crate::report::github::{self, CommitStatuses, GitHubSettings, HookRef, Redelivery};
use crate::secret::Secret;
use crate::tenancy::TenancyOptions;
use crate::worker::{self, WorkerSettings};

/// Which parts of Setpoint this process runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Roles {
    pub webhook: bool,
    pub worker: bool,
    pub watch: bool,
    pub sweep: bool,
    /// The dashboard (`setpoint ui`; `run` with `--ui-listen`).
    pub ui: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ServeOptions {
    /// RabbitMQ; without it `run` uses the in-process queue. Repeated or
    /// comma-separated for the nodes of a cluster, tried in turn.
    #[arg(
        long,
        env = "SETPOINT_AMQP_URL",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub amqp_url: Vec<Secret>,
    /// A file holding the RabbitMQ URL (it carries a password); several,
    /// one a line or comma-separated.
    #[arg(long, env = "SETPOINT_AMQP_URL_FILE", conflicts_with = "amqp_url")]
    pub amqp_url_file: Option<PathBuf>,
    /// What the shard, retry and parking queues are: quorum (replicated over
    /// a cluster) or classic (for queues that already exist as classic).
    #[arg(long, env = "SETPOINT_AMQP_QUEUE_TYPE", default_value = "quorum")]
    pub amqp_queue_type: QueueType,
    /// Prefix of the exchanges and queues on RabbitMQ.
    #[arg(long, env = "SETPOINT_AMQP_PREFIX", default_value = "setpoint")]
    pub amqp_prefix: String,
    /// Shard queues (fixed for a deployment: every process must agree).
    #[arg(long, env = "SETPOINT_AMQP_SHARDS", default_value_t = 16)]
    pub shards: u16,
    /// How often workers probe which shards they own and rebalance them.
    #[arg(long, env = "SETPOINT_BALANCE_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub balance_interval: Duration,
    /// Where the webhook listens.
    #[arg(long, env = "SETPOINT_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// Where the web dashboard listens (`run`, `ui`); off unless set.
    #[arg(long, env = "SETPOINT_UI_LISTEN")]
    pub ui_listen: Option<SocketAddr>,
    /// How the dashboard checks its viewers: `kubernetes` (a bearer token,
    /// TokenReview and SubjectAccessReview) or `none` (local use only).
    #[arg(long, env = "SETPOINT_UI_AUTH", value_enum, default_value_t = crate::ui::AuthMode::Kubernetes)]
    pub ui_auth: crate::ui::AuthMode,
    /// Where /metrics, /healthz and /readyz are served (every role).
    #[arg(long, env = "SETPOINT_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    pub metrics_listen: SocketAddr,
    /// How long in-flight reconciles may finish after SIGTERM; what is left
    /// is given back to the queue.
    #[arg(long, env = "SETPOINT_SHUTDOWN_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// GitHub webhook secrets, comma-separated (several while rotating).
    #[arg(
        long,
        env = "SETPOINT_GITHUB_SECRETS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub github_secret: Vec<Secret>,
    /// A file holding a GitHub webhook secret (repeatable, or comma-separated).
    #[arg(long, env = "SETPOINT_GITHUB_SECRET_FILES", value_delimiter = ',')]
    pub github_secret_file: Vec<PathBuf>,
    /// GitLab webhook tokens, comma-separated.
    #[arg(
        long,
        env = "SETPOINT_GITLAB_TOKENS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub gitlab_token: Vec<Secret>,
    /// A file holding a GitLab webhook token (repeatable, or comma-separated).
    #[arg(long, env = "SETPOINT_GITLAB_TOKEN_FILES", value_delimiter = ',')]
    pub gitlab_token_file: Vec<PathBuf>,
    /// Largest GitHub webhook body accepted, in bytes (GitHub's own cap is
    /// 25 MiB).
    #[arg(long, env = "SETPOINT_WEBHOOK_BODY_LIMIT", default_value_t = webhook::DEFAULT_BODY_LIMIT)]
    pub body_limit: usize,
    /// Largest GitLab webhook body accepted, in bytes.
    #[arg(long, env = "SETPOINT_WEBHOOK_GITLAB_BODY_LIMIT", default_value_t = webhook::DEFAULT_GITLAB_BODY_LIMIT)]
    pub gitlab_body_limit: usize,
    /// Bytes all webhook bodies being read at once may hold; past it, 503.
    #[arg(long, env = "SETPOINT_WEBHOOK_IN_FLIGHT_LIMIT", default_value_t = webhook::DEFAULT_IN_FLIGHT_LIMIT)]
    pub in_flight_limit: usize,
    /// How long a webhook body may take to arrive; then 408.
    #[arg(long, env = "SETPOINT_WEBHOOK_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub read_timeout: Duration,
    /// How long accepted deliveries and pushes are remembered, to drop
    /// redeliveries and replays (on RabbitMQ, or under the cache directory).
    #[arg(long, env = "SETPOINT_WEBHOOK_REPLAY_WINDOW", default_value = "5m", value_parser = parse_duration)]
    pub replay_window: Duration,
    /// Reconciles at once in this process.
    #[arg(long, env = "SETPOINT_CONCURRENCY", default_value_t = 16)]
    pub concurrency: usize,
    /// Every Application is reconciled at least this often (e.g. 10m, 30s).
    #[arg(long, env = "SETPOINT_SWEEP_INTERVAL", default_value = "10m", value_parser = parse_duration)]
    pub sweep_interval: Duration,
    /// Each chart repository (spec.source.chart) is polled for new versions
    /// this often, with jitter, by the sweep role (e.g. 5m, 1s).
    #[arg(long, env = "SETPOINT_CHART_POLL_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub chart_poll_interval: Duration,
    /// Handle only the Applications of these namespaces (comma-separated;
    /// empty: every namespace), as Argo CD's `--application-namespaces`.
    /// Every process of one installation should agree.
    #[arg(long, env = "SETPOINT_WATCH_NAMESPACES", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,
    /// Namespace of the cluster Secrets (labelled
    /// `setpoint.dev/secret-type: cluster` or Argo CD's
    /// `argocd.argoproj.io/secret-type: cluster`): Setpoint's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub cluster_namespace: String,
    /// Namespace of the sweep's Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// `run` only: leave out the live-object watches.
    #[arg(long)]
    pub no_watch: bool,
    /// `run` only: leave out the sweep.
    #[arg(long)]
    pub no_sweep: bool,
    /// `worker` only: also watch the live objects.
    #[arg(long)]
    pub watch: bool,
    /// Append `start`/`end` lines for each reconcile to this file.
    #[arg(long, env = "SETPOINT_RECONCILE_RECORD")]
    pub record: Option<PathBuf>,
    /// Attempts before a failing event is parked.
    #[arg(long, env = "SETPOINT_MAX_ATTEMPTS", default_value_t = 8)]
    pub max_attempts: u32,
    /// RabbitMQ only: deliveries never acknowledged (the worker crashed or
    /// was killed while reconciling) before an event is parked, so that an
    /// event that kills its worker does not go round for ever.
    #[arg(long, env = "SETPOINT_MAX_DELIVERIES", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_deliveries: u32,
    /// Delay before the first retry (doubling after).
    #[arg(long, env = "SETPOINT_RETRY_INITIAL", default_value = "1s", value_parser = parse_duration)]
    pub retry_initial: Duration,
    /// The GitHub REST API: `https://HOST/api/v3` for GitHub Enterprise
    /// Server. Repositories on its host get commit statuses.
    #[arg(long, env = "SETPOINT_GITHUB_API_URL", default_value = github::DEFAULT_API_URL)]
    pub github_api_url: String,
    /// A GitHub token (commit statuses: write; for redelivery, the hooks'
    /// admin). Without one, nothing is posted to GitHub.
    #[arg(long, env = "SETPOINT_GITHUB_TOKEN", hide_env_values = true)]
    pub github_token: Option<Secret>,
    /// A file holding that token.
    #[arg(
        long,
        env = "SETPOINT_GITHUB_TOKEN_FILE",
        conflicts_with = "github_token"
    )]
    pub github_token_file: Option<PathBuf>,
    /// Post `pending`, then `success`/`failure` on each synced commit
    /// (workers; needs a token).
    #[arg(long, env = "SETPOINT_GITHUB_COMMIT_STATUSES", default_value_t = true, action = clap::ArgAction::Set)]
    pub github_commit_statuses: bool,
    /// Setpoint's webhooks on GitHub (`owner/repo:ID` or `orgs/ORG:ID`),
    /// whose failed deliveries the webhook role asks GitHub to redeliver.
    #[arg(long, env = "SETPOINT_GITHUB_HOOKS", value_delimiter = ',')]
    pub github_hooks: Vec<HookRef>,
    /// How often those deliveries are looked at (and once at start).
    #[arg(long, env = "SETPOINT_GITHUB_REDELIVERY_INTERVAL", default_value = "5m", value_parser = parse_duration)]
    pub github_redelivery_interval: Duration,
    /// The GitLab REST API (`https://HOST/api/v4` for a self-managed one),
    /// where merge request previews and commit statuses are posted.
    #[arg(long, env = "SETPOINT_GITLAB_API_URL", default_value = crate::preview::gitlab::DEFAULT_API_URL)]
    pub gitlab_api_url: String,
    /// A GitLab token that writes merge request notes and commit statuses
    /// (`api` scope).
    #[arg(long, env = "SETPOINT_GITLAB_API_TOKEN", hide_env_values = true)]
    pub gitlab_api_token: Option<Secret>,
    /// A file holding that token.
    #[arg(
        long,
        env = "SETPOINT_GITLAB_API_TOKEN_FILE",
        conflicts_with = "gitlab_api_token"
    )]
    pub gitlab_api_token_file: Option<PathBuf>,
    /// Post `running`, then `success`/`failed` on each synced commit of a
    /// project on that GitLab (workers; needs its token).
    #[arg(long, env = "SETPOINT_GITLAB_COMMIT_STATUSES", default_value_t = true, action = clap::ArgAction::Set)]
    pub gitlab_commit_statuses: bool,
    /// Pull request previews at once in each worker, apart from the
    /// reconciles (`--concurrency`), so previews never delay a sync.
    #[arg(long, env = "SETPOINT_PREVIEW_CONCURRENCY", default_value_t = 2)]
    pub preview_concurrency: usize,
    /// Notification deliveries at once in each worker (over every
    /// Provider; at most 4 to one), apart from reconciles and previews.
    #[arg(long, env = "SETPOINT_NOTIFY_CONCURRENCY", default_value_t = 8)]
    pub notify_concurrency: usize,
    /// Preview pull requests whose head is in a fork too (rendered in the
    /// same sandbox as any render).
    #[arg(long, env = "SETPOINT_PREVIEW_FORKS", default_value_t = false, action = clap::ArgAction::Set)]
    pub preview_forks: bool,
}

/// `500ms`, `30s`, `10m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like 30s or 10m"))?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    })
}

fn secrets(values: &[Secret], files: &[PathBuf]) -> anyhow::Result<Vec<String>> {
    let mut all: Vec<String> = values
        .iter()
        .map(|s| s.expose().trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for file in files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| anyhow::anyhow!("cannot read secret file {}: {e}", file.display()))?;
        all.push(text.trim().to_string());
    }
    Ok(all)
}

/// The GitHub settings, when a token is configured.
fn github_settings(options: &ServeOptions) -> anyhow::Result<Option<GitHubSettings>> {
    let token = secrets(
        options.github_token.as_slice(),
        options.github_token_file.as_slice(),
    )?
    .into_iter()
    .next()
    .unwrap_or_default();
    if token.is_empty() {
        if !options.github_hooks.is_empty() {
            anyhow::bail!(
                "--github-hooks needs a token to list their deliveries: set SETPOINT_GITHUB_TOKEN or SETPOINT_GITHUB_TOKEN_FILE"
            );
        }
        return Ok(None);
    }
    Ok(Some(GitHubSettings {
        api_url: options.github_api_url.trim_end_matches('/').to_string(),
        token,
        hooks: options.github_hooks.clone(),
        redelivery_interval: options.github_redelivery_interval,
        ..GitHubSettings::default()
    }))
}

/// The GitLab API token, when one is configured.
fn gitlab_token(options: &ServeOptions) -> anyhow::Result<Option<String>> {
    Ok(secrets(
        options.gitlab_api_token.as_slice(),
        options.gitlab_api_token_file.as_slice(),
    )?
    .into_iter()
    .next()
    .filter(|token| !token.is_empty()))
}

/// The previews' settings, and where they can be posted (a token each).
fn previews(
    options: &ServeOptions,
    github: Option<&GitHubSettings>,
) -> anyhow::Result<crate::preview::Previews> {
    let gitlab = match gitlab_token(options)? {
        Some(token) => Some(crate::preview::gitlab::Notes::new(
            &options.gitlab_api_url,
            &token,
        )?),
        None => None,
    };
    Ok(crate::preview::Previews {
        settings: crate::preview::PreviewSettings {
            forks: options.preview_forks,
            concurrency: options.preview_concurrency.max(1),
            ..Default::default()
        },
        github: github.map(github::PullRequests::new).transpose()?,
        gitlab,
    })
}

pub async fn serve(
    options: ServeOptions,
    roles: Roles,
    cache_dir: PathBuf,
    tenancy: &TenancyOptions,
) -> anyhow::Result<()> {
    let config = kube::Config::infer().await?;
    let tenancy = tenancy.resolve(&config.default_namespace);
    tracing::info!(admins = ?tenancy.admins, allow_local = tenancy.allow_local, "tenancy");
    let watch_client = live_watch::client(config.clone())?;
    let github = github_settings(&options)?;
    let github_statuses = match &github {
        Some(settings) if roles.worker && options.github_commit_statuses => {
            tracing::info!(api = %settings.api_url, "posting commit statuses on GitHub");
            Some(CommitStatuses::new(settings)?)
        }
        _ => None,
    };
    let gitlab_statuses = match gitlab_token(&options)? {
        Some(token) if roles.worker && options.gitlab_commit_statuses => {
            let client = crate::report::gitlab::Client::new(&options.gitlab_api_url, &token)?;
            tracing::info!(api = %client.api_url(), "posting commit statuses on GitLab");
            Some(crate::report::gitlab::CommitStatuses::new(client)?)
        }
        _ => None,
    };
    let commit_statuses = crate::report::CommitStatuses {
        github: github_statuses,
        gitlab: gitlab_statuses,
    };
    // Custom health rules (`health.checks`): a broken expression stops here.
    let health_checks = crate::reconcile::health::configure_from_env()?;
    // Namespaces' default `spec.source.verify` (`source.verify`).
    let verify_defaults = crate::reconcile::signatures::configure_from_env()
        .map_err(|message| anyhow::anyhow!(message))?;
    tracing::info!(
        namespaces = verify_defaults,
        "default signature verification"
    );
    if roles.worker {
        for missing in crate::source::render::RenderSettings::from_env().missing_tools() {
            tracing::warn!("{missing}");
        }
    }
    tracing::info!(health_checks, "custom health rules");
    let ctx = Context::with_commit_statuses(config, cache_dir.clone(), tenancy, commit_statuses)?;
    if roles.worker {
        ctx.set_previews(previews(&options, github.as_ref())?);
    }
    let retry = RetryPolicy {
        max_attempts: options.max_attempts,
        initial: options.retry_initial,
        ..Default::default()
    };
    let mut amqp = None;
    let amqp_url = match (options.amqp_url.as_slice(), &options.amqp_url_file) {
        ([_, ..], _) => Some(
            options
                .amqp_url
                .iter()
                .map(Secret::expose)
                .collect::<Vec<_>>()
                .join(","),
        ),
        ([], Some(file)) => Some(
            std::fs::read_to_string(file)
                .map_err(|e| {
                    anyhow::anyhow!("cannot read the AMQP URL file {}: {e}", file.display())
                })?
                .trim()
                .to_string(),
        ),
        ([], None) => None,
    };
    let queue: Arc<dyn Queue> = match &amqp_url {
        Some(url) => {
            let queue = AmqpQueue::connect(AmqpSettings {
                url: url.clone(),
                queue_type: options.amqp_queue_type,
                prefix: options.amqp_prefix.clone(),
                shards: options.shards,
                retry,
                balance_interval: options.balance_interval,
                max_deliveries: options.max_deliveries,
                ..AmqpSettings::default()
            })
            .await;
            amqp = Some(queue.clone());
            Arc::new(queue)
        }
        None if roles.webhook && roles.worker => Arc::new(MemoryQueue::new(retry)),
        None => anyhow::bail!("this role needs RabbitMQ: pass --amqp-url or SETPOINT_AMQP_URL"),
    };
    let queue: Arc<dyn Queue> = Arc::new(Metered {
        inner: queue,
        metrics: ctx.metrics.clone(),
    });
    // The Application index: the webhook matches pushes against it, the
    // sweep walks it, the watch learns the kinds in use from it.
    let (store, writer) = reflector::store::<Application>();
    let needs_index = roles.webhook || roles.watch || roles.sweep || roles.ui;
    if needs_index {
        // The reconcile reads `spec.dependsOn`'s Applications there.
        ctx.set_applications(store.clone());
    }
    // The ApplicationSets, beside: the webhook routes to them, the sweep
    // walks them.
    let (set_store, set_writer) = reflector::store::<crate::api::ApplicationSet>();
    // The webhook's route index, kept by the same watch.
    let routes = roles.webhook.then(|| {
        Arc::new(crate::ingest::StoreIndex::new(store.clone()).with_sets(set_store.clone()))
    });
    let probes = Probes {
        metrics: ctx.metrics.clone(),
        queue: queue.clone(),
        client: ctx.client.clone(),
        index: needs_index.then(|| store.clone()),
        clusters: Some(ctx.clusters.clone()),
    };
    let metrics_server = actix_web::HttpServer::new(move || {
        let probes = probes.clone();
        actix_web::App::new().configure(move |cfg| crate::metrics::configure(cfg, probes))
    })
    .workers(1)
    .disable_signals()
    .bind(options.metrics_listen)
    .map_err(|e| {
        anyhow::anyhow!(
            "cannot listen on {} for metrics: {e}",
            options.metrics_listen
        )
    })?;
    for address in metrics_server.addrs() {
        tracing::info!(listen = %address, "metrics, /healthz and /readyz");
    }
    let metrics_server = metrics_server.run();
    let metrics_handle = metrics_server.handle();
    tokio::spawn(metrics_server);
    // /readyz says 503 meanwhile.
    if let Some(amqp) = amqp
        && !amqp.wait_ready(Duration::from_secs(30)).await
    {
        tracing::warn!("RabbitMQ is not reachable yet; retrying in the background");
    }

    let (shutdown_tx, shutdown) = watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    // The registered clusters, from the cluster Secrets of Setpoint's
    // namespace: the workers deploy with them, the watches watch them.
    if roles.worker || roles.watch || roles.ui {
        tasks.spawn(
            ctx.clusters
                .clone()
                .run(watch_client.clone(), options.cluster_namespace.clone()),
        );
    }
    if roles.worker {
        // Notifications: the Alerts and Providers of the namespaces handled,
        // and the record of those delivered (shared on RabbitMQ).
        let (alerts, alert_writer) = reflector::store::<crate::api::Alert>();
        let (providers, provider_writer) = reflector::store::<crate::api::Provider>();
        let scope = live_watch::Scope::new(&options.watch_namespaces);
        let namespace = scope.single().map(str::to_string);
        tasks.spawn(crate::notify::watch::run(
            watch_client.clone(),
            namespace.clone(),
            alert_writer,
        ));
        tasks.spawn(crate::notify::watch::run(
            watch_client.clone(),
            namespace,
            provider_writer,
        ));
        let sent: Arc<dyn crate::notify::sent::Sent> = match &amqp_url {
            Some(url) => Arc::new(crate::notify::sent::AmqpSent::new(
                url.clone(),
                &options.amqp_prefix,
            )),
            None => Arc::new(crate::notify::sent::FileSent::new(
                cache_dir.join("notify-sent"),
            )?),
        };
        ctx.set_notifier(crate::notify::Notifier::new(
            crate::notify::tap::NotifierParts {
                client: ctx.client.clone(),
                alerts,
                providers,
                queue: queue.clone(),
                sent,
                metrics: ctx.metrics.clone(),
                settings: crate::notify::tap::NotifySettings {
                    concurrency: options.notify_concurrency.max(1),
                    max_attempts: options.max_attempts,
                    github_api_url: options.github_api_url.clone(),
                    gitlab_api_url: options.gitlab_api_url.clone(),
                    ..Default::default()
                },
            },
        ));
    }
    if needs_index {
        let scope = live_watch::Scope::new(&options.watch_namespaces);
        let namespace = scope.single().map(str::to_string);
        tasks.spawn(crate::appset::watch::run(
            watch_client.clone(),
            ctx.clusters.clone(),
            queue.clone(),
            set_writer,
            set_store.clone(),
            namespace,
            move |ns| scope.contains(ns),
            roles.watch,
        ));
    }
    if needs_index {
        let client = watch_client;
        let clusters = ctx.clusters.clone();
        let queue = queue.clone();
        let store = store.clone();
        let objects = roles.watch;
        let enqueue_apps = roles.watch;
        let scope = live_watch::Scope::new(&options.watch_namespaces);
        let reflect = crate::ingest::AppReflector {
            writer,
            routes: routes.clone(),
        };
        tasks.spawn(async move {
            live_watch::run(
                client,
                clusters,
                queue,
                reflect,
                store,
                scope,
                objects,
                enqueue_apps,
            )
            .await;
        });
    }
    if roles.sweep {
        let settings = SweepSettings {
            interval: options.sweep_interval,
            lease: Some(LeaseSettings {
                namespace: options.lease_namespace.clone(),
                name: "setpoint-sweeper".into(),
                identity: format!("{}-{}", crate::worker::hostname(), std::process::id()),
                duration: Duration::from_secs(15),
            }),
        };
        tasks.spawn(sweep::run(
            ctx.client.clone(),
            store.clone(),
            Some(set_store.clone()),
            queue.clone(),
            settings,
        ));
        tasks.spawn(crate::source::chart::poll::run(
            ctx.clone(),
            store.clone(),
            queue.clone(),
            options.chart_poll_interval,
        ));
    }
    let worker_task = roles.worker.then(|| {
        let settings = WorkerSettings {
            concurrency: options.concurrency,
            record: options.record.clone(),
            grace: options.shutdown_grace,
            preview_concurrency: options.preview_concurrency.max(1),
            ..WorkerSettings::default()
        };
        let (ctx, queue, shutdown) = (ctx.clone(), queue.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(error) = worker::run(ctx, queue, settings, shutdown).await {
                tracing::error!(%error, "worker stopped");
            }
        })
    });
    // The last webhook deliveries, for the dashboard's Activity page.
    let deliveries = webhook::recent::RecentDeliveries::default();
    let server = if let Some(routes) = routes {
        let settings = WebhookSettings {
            github_secrets: secrets(&options.github_secret, &options.github_secret_file)?,
            gitlab_tokens: secrets(&options.gitlab_token, &options.gitlab_token_file)?,
            body_limit: options.body_limit,
            gitlab_body_limit: options.gitlab_body_limit,
            in_flight_limit: options.in_flight_limit,
            read_timeout: options.read_timeout,
            replay_window: options.replay_window,
        };
        let largest = settings.body_limit.max(settings.gitlab_body_limit);
        if settings.in_flight_limit < largest {
            anyhow::bail!(
                "--in-flight-limit ({}) must be at least the largest body limit ({largest}), or such a body could never be read",
                settings.in_flight_limit
            );
        }
        // What was accepted is shared by every replica and outlives this
        // process: on RabbitMQ when there is one, else under the cache.
        let seen: Arc<dyn webhook::dedupe::Seen> = match &amqp_url {
            Some(url) => Arc::new(webhook::dedupe::amqp::AmqpSeen::new(
                url.clone(),
                &options.amqp_prefix,
                settings.replay_window,
            )),
            None => Arc::new(webhook::dedupe::file::FileSeen::new(
                cache_dir.join("webhook-seen"),
                settings.replay_window,
            )?),
        };
        let read_timeout = settings.read_timeout;
        let state = webhook::WebhookState::new(settings, queue.clone(), routes)
            .with_seen(seen)
            .with_metrics(ctx.metrics.clone())
            .with_recent(deliveries.clone());
        // Receivers (`/api/webhooks/receivers/…`), beside the Git webhooks.
        let receivers = crate::ingest::receiver::ReceiverState::new(
            crate::ingest::receiver::ReceiverSettings::from_env(read_timeout),
            queue.clone(),
            store.clone(),
            ctx.client.clone(),
            &state,
        );
        tasks.spawn(receivers.watch(live_watch::Scope::new(&options.watch_namespaces)));
        let server = actix_web::HttpServer::new(move || {
            let (state, receivers) = (state.clone(), receivers.clone());
            actix_web::App::new()
                .configure(move |cfg| webhook::configure(cfg, state.clone()))
                .configure(move |cfg| crate::ingest::receiver::configure(cfg, receivers.clone()))
                .route("/healthz", actix_web::web::get().to(|| async { "ok" }))
        })
        .workers(2)
        .disable_signals()
        .bind(options.listen)?
        .run();
        tracing::info!(listen = %options.listen, "webhook listening");
        Some(server)
    } else {
        None
    };
    if let Some(settings) = github
        .as_ref()
        .filter(|s| roles.webhook && !s.hooks.is_empty())
    {
        let redelivery = Redelivery::new(settings)?;
        tracing::info!(
            hooks = settings.hooks.len(),
            interval = ?settings.redelivery_interval,
            "redelivering the webhook deliveries that failed"
        );
        tasks.spawn(redelivery.run(shutdown.clone()));
    }
    let handle = server.as_ref().map(|s| s.handle());
    if let Some(server) = server {
        tokio::spawn(server);
    }
    let ui_handle = match options.ui_listen.filter(|_| roles.ui) {
        Some(listen) => {
            let settings = crate::ui::UiSettings {
                listen,
                auth: options.ui_auth,
                namespaces: options.watch_namespaces.clone(),
            };
            let queue_state = crate::ui::QueueState {
                kind: match &amqp_url {
                    Some(_) => format!("RabbitMQ, {} shards", options.shards),
                    None => "in process".to_string(),
                },
                concurrency: if roles.worker { options.concurrency } else { 0 },
            };
            let state = crate::ui::UiState::new(
                store.clone(),
                crate::ui::auth::Authorizer::new(ctx.client.clone(), options.ui_auth),
                ctx.client.clone(),
                Some(queue.clone()),
                deliveries.clone(),
                queue_state,
            );
            let server = crate::ui::start(&settings, ctx.client.clone(), state, &mut tasks)
                .map_err(|e| anyhow::anyhow!("cannot listen on {listen} for the dashboard: {e}"))?;
            let handle = server.handle();
            tokio::spawn(server);
            Some(handle)
        }
        None => None,
    };

    wait_for_signal().await;
    tracing::info!("shutting down");
    if let Some(handle) = handle {
        handle.stop(true).await;
    }
    if let Some(handle) = ui_handle {
        handle.stop(false).await;
    }
    // No new events from the watch and the sweep; the worker finishes its
    // in-flight reconciles within its grace period and gives back the rest.
    tasks.abort_all();
    let _ = shutdown_tx.send(true);
    if let Some(worker) = worker_task {
        let _ = worker.await;
    }
    metrics_handle.stop(true).await;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
