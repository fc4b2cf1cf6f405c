//! Receivers (`receivers.setpoint.dev`, Flux's Receiver): events that come
//! from more than Git. A registry announces a push (Harbor, Docker Hub,
//! Quay, GitHub Packages), or a CI job says "deploy now" (`generic`,
//! `generic-hmac`), at `POST /api/webhooks/receivers/<digest>`; the
//! Receiver's `spec.resources`, and for a push the Applications of its
//! namespace whose chart is the pushed repository, get a `Cause::Receiver`
//! event on the queue.
//!
//! The same input rules as the Git webhooks (`webhook/`): the address is
//! looked up in memory (`index`, no API request for a known one), the
//! headers are checked before the body is read (`verify`), the body is read
//! within a size limit, the shared bound on the bytes in flight and the
//! read deadline (`webhook/body.rs`), the payload parsed per type
//! (`payload`) and the Applications chosen (`select`), both pure; 200 only
//! once every event is confirmed by the queue. An unknown address is 404,
//! a suspended or refused Receiver 503 (as Flux), a bad token or signature
//! 401, a body too large 413, malformed JSON or a payload without its
//! repository 400, an event `spec.events` leaves out 400 (as Flux).

pub mod index;
pub mod payload;
pub mod select;
pub mod verify;

use std::sync::Arc;
use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use futures::{StreamExt as _, TryStreamExt as _};
use kube::runtime::reflector::Store;
use serde_json::json;
use tracing::info;

use self::index::ReceiverIndex;
use self::payload::Parsed;
use crate::api::{Application, ReceiverSpec};
use crate::event::{AppKey, Cause, Event};
use crate::ingest::watch::Scope;
use crate::ingest::webhook::body::{self, InFlight};
use crate::ingest::webhook::untrusted::Untrusted;
use crate::ingest::webhook::{WebhookError, WebhookState};
use crate::queue::Queue;

/// Registry payloads are a few kilobytes; GitHub's package events the
/// largest of them.
pub const DEFAULT_BODY_LIMIT: usize = 1024 * 1024;
/// As the Git webhooks: below the senders' own timeouts.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(8);
/// Events of one request in flight to the broker at once.
const PUBLISH_IN_FLIGHT: usize = 64;
/// GitHub's event header.
const GITHUB_EVENT_HEADER: &str = "X-GitHub-Event";
/// Enough of a client-supplied value to name it in a message.
const MAX_ECHO: usize = 64;

/// What `spec.type` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Harbor,
    DockerHub,
    Quay,
    GitHubPackages,
    Generic,
    GenericHmac,
}

impl Kind {
    pub fn parse(text: &str) -> Option<Kind> {
        Some(match text {
            "harbor" => Kind::Harbor,
            "dockerhub" => Kind::DockerHub,
            "quay" => Kind::Quay,
            "github-packages" | "ghcr" => Kind::GitHubPackages,
            "generic" => Kind::Generic,
            "generic-hmac" => Kind::GenericHmac,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Harbor => "harbor",
            Kind::DockerHub => "dockerhub",
            Kind::Quay => "quay",
            Kind::GitHubPackages => "github-packages",
            Kind::Generic => "generic",
            Kind::GenericHmac => "generic-hmac",
        }
    }

    /// A registry announcing pushes, whose payload names the repository.
    pub fn is_registry(self) -> bool {
        !matches!(self, Kind::Generic | Kind::GenericHmac)
    }
}

/// The type of a Receiver's spec, or why it is refused (its `Ready`
/// condition's message): an unknown type, a resource that is not an
/// Application or that names none (Flux requires `matchLabels` with
/// `name: "*"`), no resources for a type whose payload names no repository.
pub fn validate(spec: &ReceiverSpec) -> Result<Kind, String> {
    let kind = Kind::parse(&spec.type_).ok_or_else(|| {
        format!(
            "spec.type {:?} is not one of {}",
            spec.type_,
            crate::api::RECEIVER_TYPES.join(", ")
        )
    })?;
    for (i, resource) in spec.resources.iter().enumerate() {
        if let Some(other) = resource.kind.as_deref().filter(|k| *k != "Application") {
            return Err(format!(
                "spec.resources[{i}].kind {other:?}: a Receiver reconciles Applications"
            ));
        }
        if !select::is_bounded(resource) {
            return Err(format!(
                "spec.resources[{i}] names no Application: give a name, or matchLabels with name \"*\""
            ));
        }
    }
    if !kind.is_registry() && spec.resources.is_empty() {
        return Err(format!(
            "spec.resources is required for type {}",
            kind.as_str()
        ));
    }
    Ok(kind)
}

/// Read once at start.
#[derive(Clone, Debug)]
pub struct ReceiverSettings {
    /// The largest body read, in bytes (`SETPOINT_RECEIVER_BODY_LIMIT`).
    pub body_limit: usize,
    /// How long a body may take to arrive: the webhook's.
    pub read_timeout: Duration,
}

impl ReceiverSettings {
    pub fn from_env(read_timeout: Duration) -> Self {
        let body_limit = std::env::var("SETPOINT_RECEIVER_BODY_LIMIT")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_BODY_LIMIT);
        ReceiverSettings {
            body_limit,
            read_timeout,
        }
    }
}

/// Why a request was refused; each variant is one status code, and the
/// message (never the token) is the body's `error`.
#[derive(Debug, thiserror::Error)]
pub enum ReceiverError {
    #[error("no receiver at this path")]
    NotFound,
    #[error("receiver {0} is suspended")]
    Suspended(String),
    #[error("receiver {receiver} is not ready: {message}")]
    NotReady { receiver: String, message: String },
    #[error("event {event} is not one of spec.events ({allowed})")]
    EventRefused { event: String, allowed: String },
    #[error(transparent)]
    Request(#[from] WebhookError),
}

impl ResponseError for ReceiverError {
    fn status_code(&self) -> StatusCode {
        match self {
            ReceiverError::NotFound => StatusCode::NOT_FOUND,
            ReceiverError::Suspended(_) | ReceiverError::NotReady { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ReceiverError::EventRefused { .. } => StatusCode::BAD_REQUEST,
            ReceiverError::Request(error) => error.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let ReceiverError::Request(error) = self {
            return error.error_response();
        }
        let mut response = HttpResponse::build(self.status_code());
        response.force_close();
        response.json(json!({ "error": self.to_string() }))
    }
}

/// Mounts `POST /api/webhooks/receivers/{digest}`.
pub fn configure(cfg: &mut web::ServiceConfig, state: ReceiverState) {
    cfg.service(
        web::resource(format!("{}{{digest}}", index::PATH_PREFIX))
            .app_data(web::Data::new(state))
            .route(web::post().to(handle)),
    );
}

/// The handler's state, cheap to clone: the settings, the queue, the
/// Applications (the watch's reflector), the digest index and the bytes in
/// flight (shared with the Git webhooks).
#[derive(Clone)]
pub struct ReceiverState(Arc<Inner>);

struct Inner {
    settings: ReceiverSettings,
    queue: Arc<dyn Queue>,
    apps: Store<Application>,
    index: Arc<ReceiverIndex>,
    in_flight: InFlight,
}

impl ReceiverState {
    /// Receivers beside `webhook`, sharing its bound on the bytes in flight.
    /// The index fills once `watch` runs.
    pub fn new(
        settings: ReceiverSettings,
        queue: Arc<dyn Queue>,
        apps: Store<Application>,
        client: kube::Client,
        webhook: &WebhookState,
    ) -> Self {
        ReceiverState(Arc::new(Inner {
            settings,
            queue,
            apps,
            index: ReceiverIndex::new(client),
            in_flight: webhook.in_flight().clone(),
        }))
    }

    /// The watch of the Receivers of `scope` that keeps the index.
    pub fn watch(&self, scope: Scope) -> impl std::future::Future<Output = ()> + Send + 'static {
        Arc::clone(&self.0.index).run(scope)
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
            Ok(Ok(())) => Ok(()),
        }
    }
}

/// A successful answer.
enum Reply {
    Accepted(Vec<AppKey>),
    Pong,
}

async fn handle(
    request: HttpRequest,
    digest: web::Path<String>,
    payload: web::Payload,
    state: web::Data<ReceiverState>,
) -> Result<HttpResponse, ReceiverError> {
    let digest = digest.into_inner();
    match receive(&request, &digest, payload, &state).await {
        Ok(Reply::Accepted(keys)) => {
            let enqueued: Vec<String> = keys.iter().map(AppKey::to_string).collect();
            Ok(HttpResponse::Ok().json(json!({ "enqueued": enqueued })))
        }
        Ok(Reply::Pong) => Ok(HttpResponse::Ok().json(json!({ "pong": true }))),
        Err(error) => {
            info!(
                status = error.status_code().as_u16(),
                %error,
                "receiver request refused"
            );
            Err(error)
        }
    }
}

fn header<'r>(request: &'r HttpRequest, name: &str) -> Option<&'r str> {
    request
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
}

/// A digest as `index::digest` writes it; anything else is no address.
fn is_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

async fn receive(
    request: &HttpRequest,
    digest: &str,
    payload: web::Payload,
    state: &ReceiverState,
) -> Result<Reply, ReceiverError> {
    if !is_digest(digest) {
        return Err(ReceiverError::NotFound);
    }
    let entry = state
        .0
        .index
        .find(digest)
        .await
        .ok_or(ReceiverError::NotFound)?;
    let receiver = entry.key.to_string();
    if entry.spec.suspend {
        return Err(ReceiverError::Suspended(receiver));
    }
    let kind = entry
        .kind
        .clone()
        .map_err(|message| ReceiverError::NotReady {
            receiver: receiver.clone(),
            message,
        })?;
    let limit = state.0.settings.body_limit;
    if kind.is_registry() {
        check_json(request)?;
    }
    let declared = header(request, CONTENT_LENGTH.as_str()).and_then(|l| l.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(WebhookError::TooLarge { limit }.into());
    }
    let headers = verify::Headers {
        authorization: header(request, verify::HARBOR_HEADER),
        github_signature: header(request, verify::GITHUB_SIGNATURE_HEADER),
        signature: header(request, verify::HMAC_HEADER),
    };
    // Before a byte of the body is read.
    verify::check_head(kind, entry.token(), &headers).map_err(WebhookError::Unauthorized)?;
    let timeout = state.0.settings.read_timeout;
    let deadline = (tokio::time::Instant::now() + timeout, timeout);
    let body = body::read(payload, declared, limit, &state.0.in_flight, deadline, None).await?;
    verify::check_body(kind, entry.token(), &headers, &body.bytes)
        .map_err(WebhookError::Unauthorized)?;
    let pushes = if kind.is_registry() {
        let value: serde_json::Value =
            serde_json::from_slice(&body.bytes).map_err(WebhookError::MalformedJson)?;
        let github_event = header(request, GITHUB_EVENT_HEADER).filter(|e| !e.is_empty());
        if kind == Kind::GitHubPackages && github_event.is_none() {
            return Err(WebhookError::MissingHeader(GITHUB_EVENT_HEADER).into());
        }
        let event = payload::event_name(kind, github_event, &value);
        // GitHub's ping is answered whatever the filter.
        if let Some(event) = event.as_deref().filter(|e| *e != "ping")
            && !entry.spec.events.is_empty()
            && !entry.spec.events.iter().any(|allowed| allowed == event)
        {
            return Err(ReceiverError::EventRefused {
                event: Untrusted::capped(event, MAX_ECHO).to_string(),
                allowed: entry.spec.events.join(", "),
            });
        }
        match payload::parse(kind, github_event, &value)
            .map_err(|e| WebhookError::InvalidPayload(e.to_string()))?
        {
            Parsed::Ping => return Ok(Reply::Pong),
            Parsed::Pushes(pushes) => pushes,
        }
    } else {
        Vec::new()
    };
    let candidates: Vec<select::Candidate> = state
        .0
        .apps
        .state()
        .iter()
        .filter(|app| app.metadata.namespace.as_deref() == Some(entry.key.namespace.as_str()))
        .filter_map(|app| select::Candidate::of(app))
        .collect();
    let selected = select::select(
        &entry.key.namespace,
        &entry.spec.resources,
        &pushes,
        &candidates,
    );
    let events: Vec<Event> = selected
        .iter()
        .map(|s| {
            let push = s.push.as_ref().or(pushes.first());
            Event::new(
                s.key.clone(),
                Cause::Receiver {
                    receiver: receiver.clone(),
                    repository: push
                        .map(|p| Untrusted::capped(&p.repository.display(), 256).to_string()),
                    tag: push
                        .and_then(|p| p.tag.as_deref())
                        .map(|t| Untrusted::capped(t, 128).to_string()),
                },
            )
        })
        .collect();
    state.publish(&events).await?;
    let keys: Vec<AppKey> = selected.into_iter().map(|s| s.key).collect();
    info!(
        receiver = %receiver,
        kind = kind.as_str(),
        pushes = ?pushes.iter().map(|p| Untrusted::capped(&p.repository.display(), 256).to_string()).collect::<Vec<_>>(),
        enqueued = ?keys.iter().map(AppKey::to_string).collect::<Vec<_>>(),
        events = ?events.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        "receiver request routed"
    );
    Ok(Reply::Accepted(keys))
}

/// Registry payloads are JSON; anything else is 415, as for the Git hosts.
fn check_json(request: &HttpRequest) -> Result<(), WebhookError> {
    let content_type = header(request, CONTENT_TYPE.as_str()).unwrap_or_default();
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    let received = if content_type.is_empty() {
        "none".into()
    } else {
        Untrusted::capped(content_type, MAX_ECHO).to_string()
    };
    Err(WebhookError::UnsupportedMediaType { received })
}

#[cfg(test)]
mod handler_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LocalSecretRef, ReceiverResource};

    fn spec(kind: &str, resources: Vec<ReceiverResource>) -> ReceiverSpec {
        ReceiverSpec {
            type_: kind.into(),
            secret_ref: LocalSecretRef {
                name: "token".into(),
            },
            resources,
            ..Default::default()
        }
    }

    #[test]
    fn every_documented_type_parses_and_ghcr_is_github_packages() {
        for name in crate::api::RECEIVER_TYPES {
            assert!(Kind::parse(name).is_some(), "{name}");
        }
        assert_eq!(Kind::parse("ghcr"), Some(Kind::GitHubPackages));
        assert_eq!(Kind::parse("gitlab"), None);
    }

    #[test]
    fn a_spec_is_refused_with_the_reason() {
        let web = ReceiverResource {
            name: Some("web".into()),
            ..Default::default()
        };
        assert_eq!(validate(&spec("harbor", vec![])), Ok(Kind::Harbor));
        assert_eq!(
            validate(&spec("generic", vec![web.clone()])),
            Ok(Kind::Generic)
        );
        let error = validate(&spec("generic", vec![])).unwrap_err();
        assert!(error.contains("spec.resources is required"), "{error}");
        let error = validate(&spec("nexus", vec![])).unwrap_err();
        assert!(error.contains("\"nexus\" is not one of"), "{error}");
        let other = ReceiverResource {
            kind: Some("Kustomization".into()),
            ..web.clone()
        };
        let error = validate(&spec("generic", vec![other])).unwrap_err();
        assert!(error.contains("reconciles Applications"), "{error}");
        let any = ReceiverResource {
            name: Some("*".into()),
            ..Default::default()
        };
        let error = validate(&spec("generic", vec![any])).unwrap_err();
        assert!(error.contains("names no Application"), "{error}");
    }

    #[test]
    fn only_a_digest_is_an_address() {
        assert!(is_digest(&index::digest("t", "n", "ns")));
        assert!(!is_digest("team/web"));
        assert!(!is_digest(&"A".repeat(64)));
    }
}
