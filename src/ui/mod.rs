//! The web dashboard (`--ui-listen`): every Application the viewer may
//! read, its objects and its drift history, live. It reads only what the
//! process already holds in memory (the Application index the watch keeps,
//! the Events watch of `history.rs`, the webhook's recent deliveries); the
//! API server is asked only who the viewer is and what they may read
//! (`auth.rs`, cached), and a Sync or Refresh button publishes an event on
//! the queue like any other source. Rollback, Suspend and Resume write the
//! Application's spec (`operate.rs`), a rollback then publishes a sync.
//!
//! - `view.rs`: pure: filter, count and page the list; one Application's view
//! - `pages.rs`: the HTML, server-rendered (no JavaScript needed)
//! - `api.rs`: the same as JSON under `/api/v1/`
//! - `live.rs`: Server-Sent Events, one stream per page
//! - `auth.rs`: TokenReview, SubjectAccessReview, CSRF tokens
//! - `operate.rs`: what Rollback, Suspend and Resume write, and the writes
//! - `assets/`: the stylesheet and the small script, embedded

pub mod api;
pub mod auth;
pub mod history;
pub mod live;
pub mod operate;
pub mod pages;
pub mod view;

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError, web};
use kube::runtime::reflector::{ObjectRef, Store};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use crate::api::Application;
use crate::event::{AppKey, Cause, Event};
pub use crate::ingest::webhook::recent::Delivery;
use crate::ingest::webhook::recent::RecentDeliveries;
use crate::queue::Queue;
use auth::{Authorizer, Verb, Viewer};
use history::History;
use live::Update;
use view::ListQuery;

pub use auth::AuthMode;

const STYLE: &str = include_str!("assets/style.css");
const SCRIPT: &str = include_str!("assets/live.js");

#[derive(Debug, thiserror::Error)]
pub enum UiError {
    #[error("no token: log in, or send Authorization: Bearer <token>")]
    NoToken,
    #[error("the token was refused by the API server (TokenReview)")]
    InvalidToken,
    #[error("failed to review the viewer with the API server: {0}")]
    Review(#[source] kube::Error),
    #[error("{user} may not {verb} applications.setpoint.dev in namespace {namespace}")]
    Forbidden {
        user: String,
        verb: &'static str,
        namespace: String,
    },
    #[error("the CSRF token is missing or wrong: reload the page and try again")]
    Csrf,
    #[error("Application {0} not found")]
    NotFound(AppKey),
    #[error("this process has no queue to publish on")]
    NoQueue,
    #[error("failed to publish the event for {app}: {source}")]
    Publish {
        app: AppKey,
        #[source]
        source: crate::queue::QueueError,
    },
    #[error("cannot roll back {app}: {message}")]
    Rollback { app: AppKey, message: String },
    #[error(
        "{named:?} is no history id or commit id of this Application: name a history id or a commit id (the dashboard does not run git)"
    )]
    NamedRevision { named: String },
    #[error("failed to patch Application {app}: {source}")]
    Write {
        app: AppKey,
        #[source]
        source: kube::Error,
    },
}

impl UiError {
    fn status(&self) -> StatusCode {
        match self {
            UiError::NoToken | UiError::InvalidToken => StatusCode::UNAUTHORIZED,
            UiError::Review(_) => StatusCode::BAD_GATEWAY,
            UiError::Forbidden { .. } | UiError::Csrf => StatusCode::FORBIDDEN,
            // An Application the viewer may not read looks like one that
            // does not exist.
            UiError::NotFound(_) => StatusCode::NOT_FOUND,
            UiError::NoQueue | UiError::Publish { .. } => StatusCode::SERVICE_UNAVAILABLE,
            UiError::Rollback { .. } => StatusCode::CONFLICT,
            UiError::NamedRevision { .. } => StatusCode::BAD_REQUEST,
            // Setpoint's own write failed (its RBAC, the API server).
            UiError::Write { .. } => StatusCode::BAD_GATEWAY,
        }
    }
}

/// A JSON error body, for `/api/v1/`.
impl ResponseError for UiError {
    fn status_code(&self) -> StatusCode {
        self.status()
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.status());
        if self.status() == StatusCode::UNAUTHORIZED {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        response.json(serde_json::json!({ "error": self.to_string() }))
    }
}

/// The same error as an HTML page, for the pages.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct PageError(#[from] UiError);

impl ResponseError for PageError {
    fn status_code(&self) -> StatusCode {
        self.0.status()
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = HttpResponse::build(self.0.status());
        if self.0.status() == StatusCode::UNAUTHORIZED {
            response.insert_header(("WWW-Authenticate", "Bearer"));
        }
        response
            .content_type("text/html; charset=utf-8")
            .body(pages::error(self.0.status().as_u16(), &self.0.to_string()))
    }
}

/// What the Activity page says about the queue.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueState {
    /// `RabbitMQ, 16 shards` or `in process`.
    pub kind: String,
    /// Reconciles at once in this process (0: it runs no worker).
    pub concurrency: usize,
}

#[derive(Clone)]
pub struct UiState(Arc<Inner>);

pub struct Inner {
    pub store: Store<Application>,
    pub auth: Authorizer,
    /// The process's own client: Rollback, Suspend and Resume write the
    /// Application with it, once `auth` allowed the viewer to patch it.
    pub client: kube::Client,
    /// Where Sync and Refresh publish; none in a process without a queue.
    pub queue: Option<Arc<dyn Queue>>,
    pub updates: broadcast::Sender<Update>,
    pub history: History,
    pub deliveries: RecentDeliveries,
    pub queue_state: QueueState,
}

impl std::ops::Deref for UiState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl UiState {
    pub fn new(
        store: Store<Application>,
        auth: Authorizer,
        client: kube::Client,
        queue: Option<Arc<dyn Queue>>,
        deliveries: RecentDeliveries,
        queue_state: QueueState,
    ) -> Self {
        let (updates, _) = broadcast::channel(1024);
        Self(Arc::new(Inner {
            store,
            auth,
            client,
            queue,
            updates,
            history: History::default(),
            deliveries,
            queue_state,
        }))
    }

    /// The namespaces (of Applications in the index) `viewer` may list.
    async fn readable(
        &self,
        viewer: &Viewer,
    ) -> Result<(Vec<Arc<Application>>, Vec<String>), UiError> {
        let apps = self.store.state();
        let namespaces: std::collections::BTreeSet<&str> = apps
            .iter()
            .filter_map(|a| a.metadata.namespace.as_deref())
            .collect();
        let namespaces = namespaces.into_iter().map(str::to_string).collect();
        let readable = self.auth.readable(viewer, namespaces, Verb::List).await?;
        Ok((apps, readable))
    }

    /// The list `viewer` sees.
    pub async fn list(
        &self,
        viewer: &Viewer,
        query: &ListQuery,
    ) -> Result<view::ListView, UiError> {
        let (apps, readable) = self.readable(viewer).await?;
        Ok(view::list(
            &apps,
            &|ns| readable.binary_search_by(|r| r.as_str().cmp(ns)).is_ok(),
            query,
        ))
    }

    /// One Application, if `viewer` may get it (else not found).
    pub async fn app(&self, viewer: &Viewer, key: &AppKey) -> Result<view::AppView, UiError> {
        if !self.auth.allowed(viewer, &key.namespace, Verb::Get).await? {
            return Err(UiError::NotFound(key.clone()));
        }
        let app = self
            .store
            .get(&ObjectRef::new(&key.name).within(&key.namespace))
            .ok_or_else(|| UiError::NotFound(key.clone()))?;
        let can_patch = self
            .auth
            .allowed(viewer, &key.namespace, Verb::Patch)
            .await?;
        Ok(view::app(
            &app,
            self.history.drift(key),
            self.history.events(key),
            can_patch,
        ))
    }

    /// What `viewer` asks of an Application it may patch: publishes a
    /// manual sync (`sync`) or a reconcile under the sync policy
    /// (`refresh`, as the sweep's); writes `spec.suspend` (`suspend`,
    /// `resume`, which also drops a pin); pins a past revision (`rollback`,
    /// to `wanted` or the last healthy one) and publishes its sync.
    pub async fn act(
        &self,
        viewer: &Viewer,
        key: &AppKey,
        action: Action,
        wanted: Option<&str>,
    ) -> Result<Acted, UiError> {
        if !self.auth.allowed(viewer, &key.namespace, Verb::Get).await?
            || self
                .store
                .get(&ObjectRef::new(&key.name).within(&key.namespace))
                .is_none()
        {
            return Err(UiError::NotFound(key.clone()));
        }
        if !self
            .auth
            .allowed(viewer, &key.namespace, Verb::Patch)
            .await?
        {
            return Err(UiError::Forbidden {
                user: viewer.username.clone(),
                verb: "patch",
                namespace: key.namespace.clone(),
            });
        }
        let mut acted = Acted {
            action: action.as_str(),
            ..Default::default()
        };
        let cause = match action {
            Action::Sync => Cause::Manual,
            Action::Refresh => Cause::Sweep,
            Action::Suspend | Action::Resume => {
                let change = if action == Action::Suspend {
                    operate::Change::Suspend
                } else {
                    operate::Change::Resume
                };
                operate::write(&self.client, key, &change).await?;
                tracing::info!(app = %key, user = %viewer.username, action = action.as_str(), "written from the dashboard");
                return Ok(acted);
            }
            Action::Rollback => {
                // Nothing is written that no sync would follow.
                self.queue.as_ref().ok_or(UiError::NoQueue)?;
                let pin = operate::rollback(&self.client, key, wanted, &viewer.username).await?;
                if !operate::indexed(&self.store, key, &pin, operate::INDEX_WAIT).await {
                    tracing::warn!(app = %key, "the index does not show the pin yet; the sync may render the revision before it (the spec change reconciles again)");
                }
                acted.revision = Some(pin.revision);
                acted.history_id = pin.history_id;
                Cause::Manual
            }
        };
        let queue = self.queue.as_ref().ok_or(UiError::NoQueue)?;
        let event = Event::new(key.clone(), cause);
        queue
            .publish(&event)
            .await
            .map_err(|source| UiError::Publish {
                app: key.clone(),
                source,
            })?;
        tracing::info!(
            app = %key,
            user = %viewer.username,
            action = action.as_str(),
            revision = acted.revision.as_deref().unwrap_or(""),
            history_id = acted.history_id,
            event = %event.id,
            "requested from the dashboard"
        );
        acted.event = Some(event.id);
        Ok(acted)
    }
}

/// What an action did: the event it published, the revision it pinned.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Acted {
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history_id: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Sync,
    Refresh,
    Rollback,
    Suspend,
    Resume,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Sync => "sync",
            Action::Refresh => "refresh",
            Action::Rollback => "rollback",
            Action::Suspend => "suspend",
            Action::Resume => "resume",
        }
    }
}

/// Every route of the dashboard's listener.
pub fn configure(cfg: &mut web::ServiceConfig, state: UiState) {
    cfg.app_data(web::Data::new(state))
        .app_data(web::FormConfig::default().limit(16 * 1024))
        .route("/", web::get().to(list_page))
        .route("/applications/{namespace}/{name}", web::get().to(app_page))
        .route(
            "/applications/{namespace}/{name}/{action}",
            web::post().to(action_form),
        )
        .route("/activity", web::get().to(activity_page))
        .route("/login", web::get().to(login_page))
        .route("/login", web::post().to(login))
        .route("/logout", web::post().to(logout))
        .route(
            "/assets/style.css",
            web::get().to(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/assets/live.js",
            web::get().to(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route("/healthz", web::get().to(|| async { "ok" }))
        .configure(api::configure);
}

fn asset(content_type: &str, body: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("Cache-Control", "public, max-age=300"))
        .body(body)
}

fn html(body: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header(("Cache-Control", "no-store"))
        .insert_header(("X-Frame-Options", "DENY"))
        .insert_header((
            "Content-Security-Policy",
            "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
        ))
        .body(body)
}

async fn list_page(
    req: HttpRequest,
    state: web::Data<UiState>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, PageError> {
    let viewer = state.auth.viewer(&req).await?;
    let view = state.list(&viewer, &query).await?;
    Ok(html(pages::list(&view, &query, &viewer.username)))
}

#[derive(Deserialize)]
struct Notice {
    notice: Option<String>,
}

async fn app_page(
    req: HttpRequest,
    state: web::Data<UiState>,
    path: web::Path<(String, String)>,
    notice: web::Query<Notice>,
) -> Result<HttpResponse, PageError> {
    let viewer = state.auth.viewer(&req).await?;
    let (namespace, name) = path.into_inner();
    let view = state.app(&viewer, &AppKey::new(namespace, name)).await?;
    let notice = match notice.notice.as_deref() {
        Some("sync") => Some("Sync requested: it appears here when the reconcile ends."),
        Some("refresh") => Some("Refresh requested."),
        Some("rollback") => Some("Rolled back: pinned to the revision below, its sync requested."),
        Some("suspend") => Some("Suspended: nothing is applied, pruned or corrected until Resume."),
        Some("resume") => Some("Resumed: it follows its target revision again."),
        _ => None,
    };
    Ok(html(pages::app(
        &view,
        &viewer.username,
        &state.auth.csrf_token(&viewer),
        notice,
    )))
}

#[derive(Deserialize)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    /// Rollback's: a history id or a commit id (empty: the last healthy).
    #[serde(default)]
    revision: Option<String>,
}

async fn action_form(
    req: HttpRequest,
    state: web::Data<UiState>,
    path: web::Path<(String, String, Action)>,
    form: web::Form<ActionForm>,
) -> Result<HttpResponse, PageError> {
    let viewer = state.auth.viewer(&req).await?;
    if auth::from_cookie(&req) && !state.auth.check_csrf(&viewer, &form.csrf) {
        return Err(UiError::Csrf.into());
    }
    let (namespace, name, action) = path.into_inner();
    let key = AppKey::new(namespace, name);
    state
        .act(&viewer, &key, action, form.revision.as_deref())
        .await?;
    let location = format!(
        "/applications/{}/{}?notice={}",
        view::encode_component(&key.namespace),
        view::encode_component(&key.name),
        action.as_str()
    );
    Ok(HttpResponse::SeeOther()
        .insert_header(("Location", location))
        .finish())
}

async fn activity_page(
    req: HttpRequest,
    state: web::Data<UiState>,
) -> Result<HttpResponse, PageError> {
    let viewer = state.auth.viewer(&req).await?;
    let deliveries = api::deliveries_for(&state, &viewer).await?;
    Ok(html(pages::activity(
        &deliveries,
        &state.queue_state,
        &viewer.username,
    )))
}

async fn login_page(state: web::Data<UiState>) -> HttpResponse {
    if state.auth.mode() == AuthMode::None {
        return HttpResponse::SeeOther()
            .insert_header(("Location", "/"))
            .finish();
    }
    html(pages::login(None))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    req: HttpRequest,
    state: web::Data<UiState>,
    form: web::Form<LoginForm>,
) -> HttpResponse {
    let token = form.token.trim();
    match state.auth.authenticate(token).await {
        Ok(_) => {
            let secure = if req.connection_info().scheme() == "https" {
                "; Secure"
            } else {
                ""
            };
            HttpResponse::SeeOther()
                .insert_header(("Location", "/"))
                .insert_header((
                    "Set-Cookie",
                    format!(
                        "{}={token}; Path=/; HttpOnly; SameSite=Strict{secure}",
                        auth::TOKEN_COOKIE
                    ),
                ))
                .finish()
        }
        Err(error) => {
            let mut response = html(pages::login(Some(&error.to_string())));
            *response.status_mut() = error.status();
            response
        }
    }
}

async fn logout() -> HttpResponse {
    HttpResponse::SeeOther()
        .insert_header(("Location", "/login"))
        .insert_header((
            "Set-Cookie",
            format!(
                "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0",
                auth::TOKEN_COOKIE
            ),
        ))
        .finish()
}

/// Where the dashboard listens and how it checks viewers.
#[derive(Clone, Debug)]
pub struct UiSettings {
    pub listen: SocketAddr,
    pub auth: AuthMode,
    /// The namespaces whose Events are watched (empty: all).
    pub namespaces: Vec<String>,
}

/// Starts the background tasks that feed the live streams and binds the
/// listener; the caller spawns the returned server.
pub fn start(
    settings: &UiSettings,
    client: kube::Client,
    state: UiState,
    tasks: &mut tokio::task::JoinSet<()>,
) -> std::io::Result<actix_web::dev::Server> {
    if settings.auth == AuthMode::None {
        tracing::warn!(
            listen = %settings.listen,
            "the dashboard runs with --ui-auth none: anyone who reaches it sees every Application and may sync, roll back or suspend it"
        );
    }
    tasks.spawn(live::watch_index(
        state.store.clone(),
        state.updates.clone(),
    ));
    tasks.spawn(history::run(
        client,
        settings.namespaces.clone(),
        state.history.clone(),
        state.updates.clone(),
    ));
    let server = actix_web::HttpServer::new(move || {
        let state = state.clone();
        actix_web::App::new().configure(move |cfg| configure(cfg, state))
    })
    .workers(2)
    .disable_signals()
    .bind(settings.listen)?;
    for address in server.addrs() {
        tracing::info!(listen = %address, auth = ?settings.auth, "dashboard listening");
    }
    Ok(server.run())
}
