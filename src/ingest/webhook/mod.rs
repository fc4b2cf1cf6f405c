//! The webhook receiver, where most events enter the loop: GitHub and GitLab
//! announce a push, and every Application that follows the pushed repository,
//! revision and path gets an [`Event`] on the queue.
//!
//! A handler does no Git and no cluster work, so it answers within the Git
//! host's timeout (GitHub gives up after 10 s): it checks the content type,
//! reads the body up to a limit, authenticates the raw bytes before parsing
//! anything (`signature`), drops redeliveries, routes the push (`route`, a
//! pure function) against an in-memory index of Applications and publishes.
//! It answers 200 only once every event is safe with the queue; a queue that
//! is down answers 503, so the Git host shows the failure and the delivery
//! can be sent again.
//!
//! `github` and `gitlab` bring their provider's headers and payloads to the
//! shape `route` takes.

mod github;
mod gitlab;
pub mod route;
pub mod signature;

use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use futures::StreamExt as _;
use serde::de::DeserializeOwned;
use serde_json::json;
use tracing::{info, warn};

use self::route::Push;
use self::signature::SignatureError;
use crate::event::{AppKey, Cause, Event};
use crate::queue::{Queue, QueueError};

/// GitHub's own limit on a delivery's payload.
pub const DEFAULT_BODY_LIMIT: usize = 25 * 1024 * 1024;
pub const DEFAULT_DEDUPE_CAPACITY: usize = 10_000;
/// Below GitHub's 10 s, so a stuck broker gets a 503 rather than a timeout
/// the sender cannot tell from a lost response.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(8);
/// Enough of a client-supplied value to say what it was in a message.
const MAX_ECHO: usize = 64;

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
}

impl fmt::Debug for AppSource {
    /// The repository URL without its user info (a password, a token).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppSource")
            .field("key", &self.key)
            .field("repo_url", &crate::secret::ShownUrl(&self.repo_url))
            .field("target_revision", &self.target_revision)
            .field("path", &self.path)
            .finish()
    }
}

/// The Applications the webhook routes to. Called once per push, so it must
/// answer from memory (the integrator implements it over a reflector Store).
pub trait AppIndex: Send + Sync {
    fn apps(&self) -> Vec<AppSource>;
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
    /// The largest body read, in bytes; larger ones answer 413.
    pub body_limit: usize,
    /// How many accepted delivery ids are remembered to drop redeliveries;
    /// the oldest are forgotten first. Zero turns deduplication off.
    pub dedupe_capacity: usize,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            github_secrets: Vec::new(),
            gitlab_tokens: Vec::new(),
            body_limit: DEFAULT_BODY_LIMIT,
            dedupe_capacity: DEFAULT_DEDUPE_CAPACITY,
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
            .field("dedupe_capacity", &self.dedupe_capacity)
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
            WebhookError::Unavailable(_) | WebhookError::PublishTimeout(_) => Outcome::Unavailable,
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
            // The sender retries (or its user redelivers) what failed here.
            WebhookError::Unavailable(_) | WebhookError::PublishTimeout(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).json(json!({ "error": self.to_string() }))
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
/// Application index, the delivery ids already accepted and the counters.
#[derive(Clone)]
pub struct WebhookState(Arc<Inner>);

struct Inner {
    settings: WebhookSettings,
    queue: Arc<dyn Queue>,
    apps: Arc<dyn AppIndex>,
    deliveries: Mutex<Deliveries>,
    counters: [[AtomicU64; Outcome::ALL.len()]; Provider::ALL.len()],
    metrics: Option<crate::metrics::Metrics>,
}

impl fmt::Debug for WebhookState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookState")
            .field("settings", &self.0.settings)
            .finish_non_exhaustive()
    }
}

impl WebhookState {
    pub fn new(settings: WebhookSettings, queue: Arc<dyn Queue>, apps: Arc<dyn AppIndex>) -> Self {
        let deliveries = Deliveries::new(settings.dedupe_capacity);
        Self(Arc::new(Inner {
            settings,
            queue,
            apps,
            deliveries: Mutex::new(deliveries),
            counters: Default::default(),
            metrics: None,
        }))
    }

    /// Counts every delivery's outcome into `metrics` too. Call before
    /// cloning the state.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            inner.metrics = Some(metrics);
        }
        self
    }

    pub fn settings(&self) -> &WebhookSettings {
        &self.0.settings
    }

    /// `(provider, outcome, count)` for every provider and outcome, zeros
    /// included, so a metrics exporter can publish them as they are.
    /// Providers: `github`, `gitlab`; outcomes: `accepted`, `duplicate`,
    /// `ignored` (other events, pings), `unauthorized`, `bad_request`,
    /// `unavailable`, `too_large`, `unsupported_media_type`.
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
        result: Result<Reply, WebhookError>,
    ) -> Result<HttpResponse, WebhookError> {
        let outcome = match &result {
            Ok(reply) => reply.outcome(),
            Err(err) => err.outcome(),
        };
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
                warn!(
                    provider = provider.as_str(),
                    outcome = outcome.as_str(),
                    error = %err,
                    "webhook rejected"
                );
                Err(err)
            }
        }
    }

    fn is_duplicate(&self, provider: Provider, delivery: Option<&str>) -> bool {
        delivery.is_some_and(|id| self.deliveries().contains(provider, id))
    }

    fn deliveries(&self) -> std::sync::MutexGuard<'_, Deliveries> {
        self.0
            .deliveries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Routes `push` and publishes one event per Application; the delivery
    /// id is remembered only once all of them are safe, so a delivery that
    /// failed here is processed again when it is sent again. Events published
    /// before a failure are then published twice, which costs a reconcile
    /// that finds nothing to do.
    async fn enqueue(
        &self,
        provider: Provider,
        delivery: Option<&str>,
        push: &Push,
    ) -> Result<Reply, WebhookError> {
        let keys = route::route(push, &self.0.apps.apps());
        let events: Vec<Event> = keys
            .iter()
            .map(|key| {
                let cause = Cause::Webhook {
                    provider: provider.as_str().to_owned(),
                    delivery: delivery.unwrap_or_default().to_owned(),
                };
                Event::new(key.clone(), cause).with_revision(Some(push.commit.clone()))
            })
            .collect();
        let publishes =
            futures::future::try_join_all(events.iter().map(|e| self.0.queue.publish(e)));
        match tokio::time::timeout(PUBLISH_TIMEOUT, publishes).await {
            Err(_) => return Err(WebhookError::PublishTimeout(PUBLISH_TIMEOUT)),
            Ok(Err(err)) => return Err(WebhookError::Unavailable(err)),
            Ok(Ok(_)) => {}
        }
        if let Some(id) = delivery {
            self.deliveries().record(provider, id);
        }
        let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
        info!(
            provider = provider.as_str(),
            delivery = delivery.unwrap_or_default(),
            git_ref = %push.git_ref,
            commit = %push.commit,
            enqueued = keys.len(),
            events = ?ids,
            "push routed"
        );
        Ok(Reply::Accepted(keys))
    }
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
}

impl Outcome {
    const ALL: [Outcome; 8] = [
        Outcome::Accepted,
        Outcome::Duplicate,
        Outcome::Ignored,
        Outcome::Unauthorized,
        Outcome::BadRequest,
        Outcome::Unavailable,
        Outcome::TooLarge,
        Outcome::UnsupportedMediaType,
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
        }
    }
}

/// A successful answer.
#[derive(Debug)]
enum Reply {
    /// A push, routed and published (possibly to no Application).
    Accepted(Vec<AppKey>),
    /// A delivery id already accepted: published before, not again.
    Duplicate,
    /// An event that moves no revision, by its name.
    Ignored(String),
    /// GitHub's check that the hook is set up.
    Pong,
}

impl Reply {
    fn outcome(&self) -> Outcome {
        match self {
            Reply::Accepted(_) => Outcome::Accepted,
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
        }
    }
}

/// The delivery ids accepted lately, oldest first out.
struct Deliveries {
    capacity: usize,
    seen: HashSet<(Provider, String)>,
    order: VecDeque<(Provider, String)>,
}

impl Deliveries {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            seen: HashSet::new(),
            order: VecDeque::new(),
        }
    }

    fn contains(&self, provider: Provider, id: &str) -> bool {
        self.seen.contains(&(provider, id.to_owned()))
    }

    fn record(&mut self, provider: Provider, id: &str) {
        if self.capacity == 0 || !self.seen.insert((provider, id.to_owned())) {
            return;
        }
        self.order.push_back((provider, id.to_owned()));
        while self.order.len() > self.capacity {
            if let Some(oldest) = self.order.pop_front() {
                self.seen.remove(&oldest);
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

/// At most `MAX_ECHO` characters of a client-supplied value, for a message.
fn echo(value: &str) -> String {
    let mut short: String = value.chars().take(MAX_ECHO).collect();
    if short.len() < value.len() {
        short.push('…');
    }
    short
}

/// The checks before the body is trusted with anything: the content type,
/// then the body itself, read whole up to the limit.
async fn read_body(
    request: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, WebhookError> {
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
    // A declared length over the limit is refused before reading anything.
    let declared = header(request, CONTENT_LENGTH.as_str()).and_then(|len| len.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(WebhookError::TooLarge { limit });
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|err| WebhookError::ReadBody(err.to_string()))?;
        if body.len() + chunk.len() > limit {
            return Err(WebhookError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
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
