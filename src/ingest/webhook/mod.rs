//! The webhook receiver, where most events enter the loop: GitHub and GitLab
//! announce a push, and every Application that follows the pushed repository,
//! revision and path gets an [`Event`] on the queue.
//!
//! A handler does no Git and no cluster work, so it answers within the Git
//! host's timeout (GitHub gives up after 10 s): it checks the content type
//! and the declared length, authenticates what the headers carry before
//! reading the body (`signature`), reads the body within bounds of size,
//! memory and time (`body`) while its signature is computed, drops
//! redeliveries and replays (`dedupe`), routes the push (`route`, a pure
//! function) against an in-memory index of Applications and publishes. It
//! answers 200 only once every event is safe with the queue; a queue that is
//! down answers 503, so the Git host shows the failure and the delivery can
//! be sent again.
//!
//! `github` and `gitlab` bring their provider's headers and payloads to the
//! shape `route` takes. Whatever a request brings reaches the log through
//! `untrusted::Untrusted`.

pub(crate) mod body;
pub mod dedupe;
mod github;
mod gitlab;
pub mod recent;
pub mod route;
pub mod signature;
pub mod untrusted;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use futures::{StreamExt, TryStreamExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{info, warn};

use self::dedupe::{DedupeError, MemorySeen, RecordKey, Seen};
use self::route::Push;
use self::signature::SignatureError;
use self::untrusted::Untrusted;
use crate::event::{AppKey, Cause, Event};
use crate::queue::{Queue, QueueError};

/// GitHub's own limit on a delivery's payload.
pub const DEFAULT_BODY_LIMIT: usize = 25 * 1024 * 1024;
/// GitLab documents no cap; its push payloads list at most 20 commits, far
/// below this.
pub const DEFAULT_GITLAB_BODY_LIMIT: usize = 10 * 1024 * 1024;
/// Two of the largest GitHub bodies at once, and then some.
pub const DEFAULT_IN_FLIGHT_LIMIT: usize = 64 * 1024 * 1024;
/// GitHub gives up on a delivery after 10 s.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Below GitHub's 10 s, so a stuck broker gets a 503 rather than a timeout
/// the sender cannot tell from a lost response.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(8);
/// The events of one push in flight to the broker at once: enough to keep
/// its confirms pipelined, few enough that a push routed to 10,000
/// Applications does not hold every message's frames at once (all at once,
/// the worker's peak memory rose by 40 MiB as the push was published).
const PUBLISH_IN_FLIGHT: usize = 256;
/// Enough of a client-supplied value to say what it was in a message.
const MAX_ECHO: usize = 64;
/// What a 503 for too many bytes in flight asks the sender to wait, seconds.
const BUSY_RETRY_AFTER: u64 = 5;
/// Characters of a changed file's path kept in an event's cause.
const MAX_INPUT_PATH: usize = 256;
/// Characters of a delivery id kept in an event's cause (ids are UUIDs).
const MAX_DELIVERY_ID: usize = 100;

/// What the webhook needs to know of one Application (kept in memory by a
/// kube reflector elsewhere).
#[derive(Clone, PartialEq, Eq)]
pub struct AppSource {
    pub key: AppKey,
    /// As the Application spells it; compared after `normalize_url`.
    pub repo_url: String,
    /// `None`, `""` and `"HEAD"` follow the default branch.
    pub target_revision: Option<String>,
    /// The directory the Application reads; `None` is the repository root.
    pub path: Option<String>,
    /// What its last render read (`status.sourceInputs`): repository paths,
    /// a directory standing for everything under it. Empty until it renders.
    pub inputs: Vec<String>,
}

impl fmt::Debug for AppSource {
    /// The repository URL without its user info (a password, a token).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppSource")
            .field("key", &self.key)
            .field("repo_url", &crate::secret::ShownUrl(&self.repo_url))
            .field("target_revision", &self.target_revision)
            .field("path", &self.path)
            .field("inputs", &self.inputs)
            .finish()
    }
}

/// The Applications the webhook routes to. Called once per push, so it must
/// answer from memory (the integrator implements it over a reflector Store).
pub trait AppIndex: Send + Sync {
    fn apps(&self) -> Vec<AppSource>;

    /// The Applications `push` concerns, and why (`route::route_why`).
    fn route(&self, push: &Push) -> Vec<route::Routed> {
        route::route_why(push, &self.apps())
    }

    /// The ApplicationSets whose git generators `push` moves.
    fn sets_for_push(&self, _push: &Push) -> Vec<AppKey> {
        Vec::new()
    }

    /// The ApplicationSets whose pull request generators list `change`'s
    /// repository.
    fn sets_for_pull(&self, _change: &crate::event::PullChange) -> Vec<AppKey> {
        Vec::new()
    }
}

/// A fixed list, for tests and static setups.
impl AppIndex for Vec<AppSource> {
    fn apps(&self) -> Vec<AppSource> {
        self.clone()
    }
}

/// Read once at start.
#[derive(Clone)]
pub struct WebhookSettings {
    /// Any of them may sign a GitHub delivery, for rotation. Empty values are
    /// ignored; with none, every GitHub delivery is rejected.
    pub github_secrets: Vec<String>,
    /// Any of them may be a GitLab delivery's `X-Gitlab-Token`, for rotation.
    /// Empty values are ignored; with none, every GitLab delivery is rejected.
    pub gitlab_tokens: Vec<String>,
    /// The largest GitHub body read, in bytes; larger ones answer 413.
    pub body_limit: usize,
    /// The same for GitLab.
    pub gitlab_body_limit: usize,
    /// The bytes all bodies being read at once may hold; past it, 503.
    pub in_flight_limit: usize,
    /// How long a body may take to arrive, from its headers on; then 408.
    pub read_timeout: Duration,
    /// How long an accepted delivery id and an accepted push (repository,
    /// ref, commits) are remembered, to drop redeliveries and replays.
    pub replay_window: Duration,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            github_secrets: Vec::new(),
            gitlab_tokens: Vec::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            gitlab_body_limit: DEFAULT_GITLAB_BODY_LIMIT,
            in_flight_limit: DEFAULT_IN_FLIGHT_LIMIT,
            read_timeout: DEFAULT_READ_TIMEOUT,
            replay_window: dedupe::DEFAULT_WINDOW,
        }
    }
}

impl fmt::Debug for WebhookSettings {
    /// Settings end up in logs; the secrets must not.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSettings")
            .field(
                "github_secrets",
                &format_args!("<{} redacted>", self.github_secrets.len()),
            )
            .field(
                "gitlab_tokens",
                &format_args!("<{} redacted>", self.gitlab_tokens.len()),
            )
            .field("body_limit", &self.body_limit)
            .field("gitlab_body_limit", &self.gitlab_body_limit)
            .field("in_flight_limit", &self.in_flight_limit)
            .field("read_timeout", &self.read_timeout)
            .field("replay_window", &self.replay_window)
            .finish()
    }
}

/// Why a delivery was rejected; each variant is one status code, and the
/// message (never a secret) is the body's `error`.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("content type must be application/json, not {received}")]
    UnsupportedMediaType { received: String },
    #[error("failed to read the request body: {0}")]
    ReadBody(String),
    #[error("the request body did not arrive within {0:?}")]
    ReadTimeout(Duration),
    #[error("too many request bodies are being read (over {limit} bytes); retry later")]
    Busy { limit: usize },
    #[error(transparent)]
    Unauthorized(#[from] SignatureError),
    #[error("missing {0} header")]
    MissingHeader(&'static str),
    #[error("malformed JSON: {0}")]
    MalformedJson(#[source] serde_json::Error),
    #[error("invalid push payload: {0}")]
    InvalidPayload(String),
    #[error("queue unavailable: {0}")]
    Unavailable(#[source] QueueError),
    #[error("queue unavailable: no confirmation within {0:?}")]
    PublishTimeout(Duration),
    #[error(transparent)]
    Dedupe(#[from] DedupeError),
}

impl WebhookError {
    fn outcome(&self) -> Outcome {
        match self {
            WebhookError::TooLarge { .. } => Outcome::TooLarge,
            WebhookError::UnsupportedMediaType { .. } => Outcome::UnsupportedMediaType,
            WebhookError::Unauthorized(_) => Outcome::Unauthorized,
            WebhookError::ReadBody(_)
            | WebhookError::MissingHeader(_)
            | WebhookError::MalformedJson(_)
            | WebhookError::InvalidPayload(_) => Outcome::BadRequest,
            WebhookError::ReadTimeout(_) => Outcome::Timeout,
            WebhookError::Busy { .. } => Outcome::Busy,
            WebhookError::Unavailable(_)
            | WebhookError::PublishTimeout(_)
            | WebhookError::Dedupe(_) => Outcome::Unavailable,
        }
    }
}

impl ResponseError for WebhookError {
    fn status_code(&self) -> StatusCode {
        match self {
            WebhookError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            WebhookError::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            WebhookError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            WebhookError::ReadBody(_)
            | WebhookError::MissingHeader(_)
            | WebhookError::MalformedJson(_)
            | WebhookError::InvalidPayload(_) => StatusCode::BAD_REQUEST,
            WebhookError::ReadTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            // The sender retries (or its user redelivers) what failed here.
            WebhookError::Busy { .. }
            | WebhookError::Unavailable(_)
            | WebhookError::PublishTimeout(_)
            | WebhookError::Dedupe(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// A rejection may come before the body was read, or halfway through:
    /// the connection is closed after it rather than the rest read.
    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status_code());
        response.force_close();
        if let WebhookError::Busy { .. } = self {
            response.insert_header((RETRY_AFTER, BUSY_RETRY_AFTER.to_string()));
        }
        response.json(json!({ "error": self.to_string() }))
    }
}

/// Mounts `POST /api/webhooks/github` and `POST /api/webhooks/gitlab`.
pub fn configure(cfg: &mut web::ServiceConfig, state: WebhookState) {
    let state = web::Data::new(state);
    cfg.service(
        web::resource("/api/webhooks/github")
            .app_data(state.clone())
            .route(web::post().to(github::handle)),
    )
    .service(
        web::resource("/api/webhooks/gitlab")
            .app_data(state)
            .route(web::post().to(gitlab::handle)),
    );
}

/// Shared by both handlers and cheap to clone: the settings, the queue, the
/// Application index, the bytes in flight, what was accepted lately and the
/// counters.
#[derive(Clone)]
pub struct WebhookState(Arc<Inner>);

struct Inner {
    settings: WebhookSettings,
    queue: Arc<dyn Queue>,
    apps: Arc<dyn AppIndex>,
    in_flight: body::InFlight,
    seen: Arc<dyn Seen>,
    counters: [[AtomicU64; Outcome::ALL.len()]; Provider::ALL.len()],
    metrics: Option<crate::metrics::Metrics>,
    /// The last deliveries, for the dashboard.
    recent: Option<recent::RecentDeliveries>,
}

impl fmt::Debug for WebhookState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookState")
            .field("settings", &self.0.settings)
            .finish_non_exhaustive()
    }
}

impl WebhookState {
    /// Remembers what it accepted in memory; `with_seen` shares it.
    pub fn new(settings: WebhookSettings, queue: Arc<dyn Queue>, apps: Arc<dyn AppIndex>) -> Self {
        let seen = Arc::new(MemorySeen::new(settings.replay_window));
        Self(Arc::new(Inner {
            in_flight: body::InFlight::new(settings.in_flight_limit),
            settings,
            queue,
            apps,
            seen,
            counters: Default::default(),
            metrics: None,
            recent: None,
        }))
    }

    /// Keeps what was accepted in `seen` (RabbitMQ, files), which other
    /// replicas and later processes share. Call before cloning the state.
    pub fn with_seen(mut self, seen: Arc<dyn Seen>) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.seen = seen;
        }
        self
    }

    /// Counts every delivery's outcome into `metrics` too. Call before
    /// cloning the state.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.metrics = Some(metrics);
        }
        self
    }

    /// Keeps the last deliveries in `recent` (the dashboard's Activity
    /// page). Call before cloning the state.
    pub fn with_recent(mut self, recent: recent::RecentDeliveries) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.recent = Some(recent);
        }
        self
    }

    pub fn settings(&self) -> &WebhookSettings {
        &self.0.settings
    }

    /// The bound on the bytes all bodies hold at once, which the Receivers'
    /// requests share.
    pub(crate) fn in_flight(&self) -> &body::InFlight {
        &self.0.in_flight
    }

    /// `(provider, outcome, count)` for every provider and outcome, zeros
    /// included, so a metrics exporter can publish them as they are.
    /// Providers: `github`, `gitlab`; outcomes: `accepted`, `duplicate`
    /// (a redelivery or a replay), `ignored` (other events, pings),
    /// `unauthorized`, `bad_request`, `unavailable`, `too_large`,
    /// `unsupported_media_type`, `busy` (too many bytes in flight), `timeout`
    /// (a body slower than the read deadline).
    pub fn outcomes(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut outcomes = Vec::new();
        for (p, provider) in Provider::ALL.iter().enumerate() {
            for (o, outcome) in Outcome::ALL.iter().enumerate() {
                let count = self.0.counters[p][o].load(Ordering::Relaxed);
                outcomes.push((provider.as_str(), outcome.as_str(), count));
            }
        }
        outcomes
    }

    /// Counts and logs what became of one delivery and turns a success into
    /// its response; an error goes on to actix, which renders it.
    fn finish(
        &self,
        provider: Provider,
        request: &actix_web::HttpRequest,
        result: Result<Reply, WebhookError>,
    ) -> Result<HttpResponse, WebhookError> {
        let outcome = match &result {
            Ok(reply) => reply.outcome(),
            Err(err) => err.outcome(),
        };
        if let Some(recent) = &self.0.recent {
            let routed = match &result {
                Ok(Reply::Accepted(keys)) => keys.iter().map(AppKey::to_string).collect(),
                _ => Vec::new(),
            };
            recent.record(recent::delivery(
                request,
                provider.as_str(),
                outcome.as_str(),
                routed,
            ));
        }
        self.0.counters[provider as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
        if let Some(metrics) = &self.0.metrics {
            metrics
                .webhooks
                .get_or_create(&crate::metrics::WebhookLabels {
                    provider: provider.as_str().to_string(),
                    outcome: outcome.as_str().to_string(),
                })
                .inc();
        }
        match result {
            Ok(reply) => Ok(reply.into_response()),
            Err(err) => {
                // Messages quote headers and payload fragments.
                warn!(
                    provider = provider.as_str(),
                    outcome = outcome.as_str(),
                    error = %Untrusted(&err.to_string()),
                    "webhook rejected"
                );
                Err(err)
            }
        }
    }

    /// The largest body read for `provider`.
    fn body_limit(&self, provider: Provider) -> usize {
        match provider {
            Provider::GitHub => self.0.settings.body_limit,
            Provider::GitLab => self.0.settings.gitlab_body_limit,
        }
    }

    /// Routes `push` (whose payload is `body`) and publishes one event per
    /// Application, unless the delivery id or the push itself was accepted
    /// within the replay window.
    /// Both are recorded before publishing, so two replicas given the same
    /// delivery at once publish it once; a publish that fails forgets them
    /// again, so the delivery goes through when it is sent again. Events
    /// published before a failure are then published twice, which costs a
    /// reconcile that finds nothing to do. A push that reaches no
    /// Application is not recorded: there is nothing to replay.
    async fn enqueue(
        &self,
        provider: Provider,
        delivery: Option<&str>,
        push: &Push,
        body: &[u8],
    ) -> Result<Reply, WebhookError> {
        let routed = self.0.apps.route(push);
        let sets = self.0.apps.sets_for_push(push);
        let mut keys: Vec<AppKey> = routed.iter().map(|r| r.key.clone()).collect();
        keys.extend(sets.iter().cloned());
        if keys.is_empty() {
            info!(
                provider = provider.as_str(),
                delivery = %Untrusted(delivery.unwrap_or_default()),
                git_ref = %Untrusted(&push.git_ref),
                commit = %push.commit,
                "push concerns no Application"
            );
            return Ok(Reply::Accepted(keys));
        }
        let Some(claimed) = self
            .claim(push_record(provider, push, body), provider, delivery)
            .await?
        else {
            info!(
                provider = provider.as_str(),
                delivery = %Untrusted(delivery.unwrap_or_default()),
                git_ref = %Untrusted(&push.git_ref),
                commit = %push.commit,
                "push already accepted within the replay window; dropped"
            );
            return Ok(Reply::Duplicate);
        };
        let cause_delivery = delivery
            .map(|id| Untrusted::capped(id, MAX_DELIVERY_ID).to_string())
            .unwrap_or_default();
        let set_events = sets.into_iter().map(|set| {
            Event::new(
                set,
                Cause::AppSet {
                    why: format!("a push to {}", Untrusted(&push.git_ref)),
                    refresh_only: false,
                    pull: None,
                },
            )
        });
        let events: Vec<Event> = routed
            .into_iter()
            .map(|routed| {
                let cause = Cause::Webhook {
                    provider: provider.as_str().to_owned(),
                    delivery: cause_delivery.clone(),
                    // Escaped and capped: it reaches a log line and an Event.
                    input: routed
                        .input
                        .map(|file| Untrusted::capped(&file, MAX_INPUT_PATH).to_string()),
                };
                Event::new(routed.key, cause).with_revision(Some(push.commit.clone()))
            })
            .chain(set_events)
            .collect();
        if let Err(err) = self.publish(&events).await {
            self.forget(&claimed).await;
            return Err(err);
        }
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        info!(
            provider = provider.as_str(),
            delivery = %Untrusted(delivery.unwrap_or_default()),
            git_ref = %Untrusted(&push.git_ref),
            commit = %push.commit,
            enqueued = keys.len(),
            events = ?ids,
            "push routed"
        );
        Ok(Reply::Accepted(keys))
    }

    /// Publishes one preview event for `pull` (a pull or merge request
    /// opened or pushed to), naming the Applications that follow its base
    /// repository and branch; the worker keeps those its changes touch.
    /// Deduplicated as pushes are: by delivery id, and by the payload.
    async fn enqueue_preview(
        &self,
        provider: Provider,
        delivery: Option<&str>,
        mut pull: crate::event::PullRequest,
        body: &[u8],
    ) -> Result<Reply, WebhookError> {
        let base = Push {
            repo_urls: pull.repo_urls.clone(),
            git_ref: format!("refs/heads/{}", pull.base_branch),
            commit: pull.head_sha.clone(),
            case_insensitive: true,
            default_branch: pull.default_branch.clone(),
            deleted: false,
            changed_files: None,
        };
        pull.apps = self
            .0
            .apps
            .route(&base)
            .into_iter()
            .map(|r| r.key)
            .collect();
        let key = pull.key();
        if pull.apps.is_empty() {
            info!(
                provider = provider.as_str(),
                delivery = %Untrusted(delivery.unwrap_or_default()),
                pull = %Untrusted(&key.to_string()),
                "pull request concerns no Application"
            );
            return Ok(Reply::Preview(key, 0));
        }
        let repos = route::repository_keys(&base);
        let repos: Vec<&str> = repos.iter().map(String::as_str).collect();
        let record = RecordKey::new(&[
            b"pull",
            provider.as_str().as_bytes(),
            repos.join(" ").as_bytes(),
            pull.number.to_string().as_bytes(),
            pull.head_sha.as_bytes(),
            body,
        ]);
        let Some(claimed) = self.claim(record, provider, delivery).await? else {
            return Ok(Reply::Duplicate);
        };
        pull.delivery = delivery
            .map(|id| Untrusted::capped(id, MAX_DELIVERY_ID).to_string())
            .unwrap_or_default();
        let apps = pull.apps.len();
        let head = pull.head_sha.clone();
        let event = Event::new(key.clone(), Cause::Preview(Box::new(pull)))
            .with_revision(Some(head.clone()));
        if let Err(err) = self.publish(std::slice::from_ref(&event)).await {
            self.forget(&claimed).await;
            return Err(err);
        }
        info!(
            provider = provider.as_str(),
            delivery = %Untrusted(delivery.unwrap_or_default()),
            pull = %Untrusted(&key.to_string()),
            commit = %head,
            apps,
            event = %event.id,
            "pull request preview enqueued"
        );
        Ok(Reply::Preview(key, apps))
    }

    /// Publishes one evaluation for each ApplicationSet whose pull request
    /// generator lists `change`'s repository, carrying what the delivery
    /// said. Deduplicated by the payload, apart from the preview's records.
    async fn enqueue_pull_sets(
        &self,
        provider: Provider,
        delivery: Option<&str>,
        change: crate::event::PullChange,
        body: &[u8],
    ) -> Result<Vec<AppKey>, WebhookError> {
        let sets = self.0.apps.sets_for_pull(&change);
        if sets.is_empty() {
            return Ok(sets);
        }
        let record = RecordKey::new(&[
            b"pull-sets",
            provider.as_str().as_bytes(),
            change.project.as_bytes(),
            change.number.to_string().as_bytes(),
            body,
        ]);
        let Some(claimed) = self.claim(record, provider, None).await? else {
            return Ok(Vec::new());
        };
        let why = format!(
            "pull request #{} {}",
            change.number,
            if change.open { "open" } else { "closed" }
        );
        let events: Vec<Event> = sets
            .iter()
            .map(|set| {
                Event::new(
                    set.clone(),
                    Cause::AppSet {
                        why: why.clone(),
                        refresh_only: false,
                        pull: Some(change.clone()),
                    },
                )
            })
            .collect();
        if let Err(err) = self.publish(&events).await {
            self.forget(&claimed).await;
            return Err(err);
        }
        info!(
            provider = provider.as_str(),
            delivery = %Untrusted(delivery.unwrap_or_default()),
            pull = change.number,
            sets = ?sets.iter().map(AppKey::to_string).collect::<Vec<_>>(),
            "pull request routed to ApplicationSets"
        );
        Ok(sets)
    }

    /// Forgets records this delivery claimed before it failed; one that
    /// cannot be forgotten makes a resend look like a replay until the
    /// window ends, which the log says.
    /// Claims `record` and the delivery's own record within the replay
    /// window: the claimed records, or None (nothing left claimed) when one
    /// was claimed already.
    async fn claim(
        &self,
        record: RecordKey,
        provider: Provider,
        delivery: Option<&str>,
    ) -> Result<Option<Vec<RecordKey>>, WebhookError> {
        let mut records = vec![record];
        if let Some(id) = delivery {
            records.push(RecordKey::new(&[
                b"delivery",
                provider.as_str().as_bytes(),
                id.as_bytes(),
            ]));
        }
        let mut claimed = Vec::new();
        for record in records {
            match self.0.seen.claim(&record).await {
                Ok(true) => claimed.push(record),
                Ok(false) => {
                    self.forget(&claimed).await;
                    return Ok(None);
                }
                Err(err) => {
                    self.forget(&claimed).await;
                    return Err(err.into());
                }
            }
        }
        Ok(Some(claimed))
    }

    /// Publishes `events`, all within `PUBLISH_TIMEOUT`.
    async fn publish(&self, events: &[Event]) -> Result<(), WebhookError> {
        let publishes = futures::stream::iter(events)
            .map(|e| self.0.queue.publish(e))
            .buffer_unordered(PUBLISH_IN_FLIGHT)
            .try_collect::<()>();
        match tokio::time::timeout(PUBLISH_TIMEOUT, publishes).await {
            Err(_) => Err(WebhookError::PublishTimeout(PUBLISH_TIMEOUT)),
            Ok(Err(err)) => Err(WebhookError::Unavailable(err)),
            Ok(Ok(_)) => Ok(()),
        }
    }

    async fn forget(&self, claimed: &[RecordKey]) {
        for record in claimed {
            if let Err(error) = self.0.seen.forget(record).await {
                warn!(
                    record = record.as_str(),
                    window = ?self.0.settings.replay_window,
                    %error,
                    "failed to forget a delivery that was not enqueued; a resend is dropped until the window ends"
                );
            }
        }
    }
}

/// What identifies a push apart from its delivery: the repository (as
/// `route` compares it), the ref, the commit, and the payload itself. A
/// replay repeats the payload byte for byte (GitHub's signature covers it);
/// a new push of the same commit does not: a ref moved back and forth
/// (main: A→B, B→A, A→B) says where it came from (`before`) and when
/// (`pushed_at`), so it is not taken for a replay.
fn push_record(provider: Provider, push: &Push, body: &[u8]) -> RecordKey {
    let repos = route::repository_keys(push);
    let repos: Vec<&str> = repos.iter().map(String::as_str).collect();
    RecordKey::new(&[
        b"push",
        provider.as_str().as_bytes(),
        repos.join(" ").as_bytes(),
        push.git_ref.as_bytes(),
        push.commit.as_bytes(),
        body,
    ])
}

/// The Git hosts, as metrics and `Cause::Webhook` name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Provider {
    GitHub = 0,
    GitLab = 1,
}

impl Provider {
    const ALL: [Provider; 2] = [Provider::GitHub, Provider::GitLab];

    fn as_str(self) -> &'static str {
        match self {
            Provider::GitHub => "github",
            Provider::GitLab => "gitlab",
        }
    }
}

/// What became of one delivery, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Accepted = 0,
    Duplicate,
    Ignored,
    Unauthorized,
    BadRequest,
    Unavailable,
    TooLarge,
    UnsupportedMediaType,
    Busy,
    Timeout,
}

impl Outcome {
    const ALL: [Outcome; 10] = [
        Outcome::Accepted,
        Outcome::Duplicate,
        Outcome::Ignored,
        Outcome::Unauthorized,
        Outcome::BadRequest,
        Outcome::Unavailable,
        Outcome::TooLarge,
        Outcome::UnsupportedMediaType,
        Outcome::Busy,
        Outcome::Timeout,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Duplicate => "duplicate",
            Outcome::Ignored => "ignored",
            Outcome::Unauthorized => "unauthorized",
            Outcome::BadRequest => "bad_request",
            Outcome::Unavailable => "unavailable",
            Outcome::TooLarge => "too_large",
            Outcome::UnsupportedMediaType => "unsupported_media_type",
            Outcome::Busy => "busy",
            Outcome::Timeout => "timeout",
        }
    }
}

/// A successful answer.
#[derive(Debug)]
enum Reply {
    /// A push, routed and published (possibly to no Application).
    Accepted(Vec<AppKey>),
    /// A delivery id or a push accepted within the replay window: published
    /// before, not again.
    Duplicate,
    /// An event that moves no revision, by its name.
    Ignored(String),
    /// GitHub's check that the hook is set up.
    Pong,
    /// A pull request's preview, published (unless it concerns no
    /// Application: 0).
    Preview(AppKey, usize),
}

impl Reply {
    fn outcome(&self) -> Outcome {
        match self {
            Reply::Accepted(_) | Reply::Preview(..) => Outcome::Accepted,
            Reply::Duplicate => Outcome::Duplicate,
            Reply::Ignored(_) | Reply::Pong => Outcome::Ignored,
        }
    }

    fn into_response(self) -> HttpResponse {
        match self {
            Reply::Accepted(keys) => {
                let enqueued: Vec<String> = keys.iter().map(AppKey::to_string).collect();
                HttpResponse::Ok().json(json!({ "enqueued": enqueued }))
            }
            Reply::Duplicate => HttpResponse::Ok().json(json!({ "duplicate": true })),
            Reply::Ignored(event) => HttpResponse::Accepted().json(json!({ "ignored": event })),
            Reply::Pong => HttpResponse::Ok().json(json!({ "pong": true })),
            Reply::Preview(key, apps) => {
                HttpResponse::Ok().json(json!({ "preview": key.to_string(), "applications": apps }))
            }
        }
    }
}

/// A header's value, when it is present and text.
fn header<'r>(request: &'r HttpRequest, name: &str) -> Option<&'r str> {
    request
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

/// At most `MAX_ECHO` characters of a client-supplied value, escaped, for a
/// message.
fn echo(value: &str) -> String {
    Untrusted::capped(value, MAX_ECHO).to_string()
}

/// The checks before anything is read: the content type, and a declared
/// length over `limit`. Returns the declared length.
fn check_head(request: &HttpRequest, limit: usize) -> Result<Option<u64>, WebhookError> {
    let content_type = header(request, CONTENT_TYPE.as_str()).unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        let received = if content_type.is_empty() {
            "none".into()
        } else {
            echo(content_type)
        };
        return Err(WebhookError::UnsupportedMediaType { received });
    }
    let declared = header(request, CONTENT_LENGTH.as_str()).and_then(|len| len.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(WebhookError::TooLarge { limit });
    }
    Ok(declared)
}

/// The body, read within the provider's limit, the bytes in flight and the
/// read deadline (counted from when the handler started), fed to `verifier`
/// as it arrives.
async fn read_body(
    state: &WebhookState,
    provider: Provider,
    declared: Option<u64>,
    payload: web::Payload,
    verifier: Option<&mut signature::GitHubVerifier>,
) -> Result<body::Body, WebhookError> {
    let timeout = state.0.settings.read_timeout;
    let deadline = (tokio::time::Instant::now() + timeout, timeout);
    body::read(
        payload,
        declared,
        state.body_limit(provider),
        &state.0.in_flight,
        deadline,
        verifier,
    )
    .await
}

/// Any JSON value; a syntax error is `MalformedJson`.
fn parse_json(body: &[u8]) -> Result<serde_json::Value, WebhookError> {
    serde_json::from_slice(body).map_err(WebhookError::MalformedJson)
}

/// A provider's payload type out of valid JSON; a missing field or a wrong
/// type is `InvalidPayload`, naming the field.
fn payload_from<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, WebhookError> {
    serde_json::from_value(value).map_err(|err| WebhookError::InvalidPayload(err.to_string()))
}

/// The URLs a payload gives for its repository (the non-empty ones, in the
/// order given); `what` names it in the error when there is none.
fn repository_urls<const N: usize>(
    candidates: [Option<String>; N],
    what: &str,
) -> Result<Vec<String>, WebhookError> {
    let urls: Vec<String> = candidates
        .into_iter()
        .flatten()
        .filter(|url| !url.trim().is_empty())
        .collect();
    if urls.is_empty() {
        return Err(WebhookError::InvalidPayload(format!(
            "the {what} has no URL"
        )));
    }
    Ok(urls)
}

/// The commit a push announces must be a full commit id: it becomes the
/// event's revision, which the worker compares with what it resolved.
fn check_commit(field: &str, commit: &str) -> Result<(), WebhookError> {
    let full =
        (commit.len() == 40 || commit.len() == 64) && commit.bytes().all(|b| b.is_ascii_hexdigit());
    if full {
        Ok(())
    } else {
        Err(WebhookError::InvalidPayload(format!(
            "{field} is not a full commit id"
        )))
    }
}

/// One commit of a push as both providers list it: the files it added,
/// modified and removed, from the repository root.
#[derive(Debug, serde::Deserialize)]
struct CommitFiles {
    added: Option<Vec<String>>,
    modified: Option<Vec<String>>,
    removed: Option<Vec<String>>,
}

/// The union of the commits' files, sorted; `None` when a commit lacks one
/// of its lists, since then what changed is unknown.
fn changed_files(commits: &[CommitFiles]) -> Option<Vec<String>> {
    let mut files = Vec::new();
    for commit in commits {
        let (added, modified, removed) = (
            commit.added.as_ref()?,
            commit.modified.as_ref()?,
            commit.removed.as_ref()?,
        );
        files.extend(added.iter().chain(modified).chain(removed).cloned());
    }
    files.sort();
    files.dedup();
    Some(files)
}

#[cfg(test)]
mod tests;
