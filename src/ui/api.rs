//! The JSON the pages are made of, under `/api/v1/`, with the same rules:
//! a token, and only what its user may read.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::auth::{Verb, Viewer};
use super::live::{self, Follow};
use super::view::ListQuery;
use super::{Action, Delivery, UiError, UiState};
use crate::event::AppKey;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/v1/applications", web::get().to(applications))
        .route(
            "/api/v1/applications/{namespace}/{name}",
            web::get().to(application),
        )
        .route(
            "/api/v1/applications/{namespace}/{name}/{action}",
            web::post().to(act),
        )
        .route("/api/v1/deliveries", web::get().to(deliveries))
        .route("/api/v1/live", web::get().to(stream))
        .default_service(web::to(not_found));
}

async fn not_found(req: HttpRequest, state: web::Data<UiState>) -> Result<HttpResponse, UiError> {
    // Who asks is checked first: without a token, every path is a 401.
    state.auth.viewer(&req).await?;
    Ok(HttpResponse::NotFound().json(serde_json::json!({ "error": "no such page" })))
}

async fn applications(
    req: HttpRequest,
    state: web::Data<UiState>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, UiError> {
    let viewer = state.auth.viewer(&req).await?;
    Ok(HttpResponse::Ok().json(state.list(&viewer, &query).await?))
}

async fn application(
    req: HttpRequest,
    state: web::Data<UiState>,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, UiError> {
    let viewer = state.auth.viewer(&req).await?;
    let (namespace, name) = path.into_inner();
    Ok(HttpResponse::Ok().json(state.app(&viewer, &AppKey::new(namespace, name)).await?))
}

#[derive(Deserialize, Default)]
struct ActQuery {
    #[serde(default)]
    csrf: String,
    /// Rollback's target: a history id or a commit id (none: the last
    /// revision that was Synced and Healthy before the current one).
    #[serde(default)]
    revision: Option<String>,
}

/// `POST /api/v1/applications/{namespace}/{name}/sync|refresh|rollback|suspend|resume`:
/// with a cookie it needs the page's CSRF token (`?csrf=` or
/// `X-CSRF-Token`); with an `Authorization` header (which a page on another
/// origin cannot send) it does not. 202 when an event was published (with
/// its id; a rollback also names the revision pinned), 200 for a write
/// alone (suspend, resume).
async fn act(
    req: HttpRequest,
    state: web::Data<UiState>,
    path: web::Path<(String, String, Action)>,
    query: web::Query<ActQuery>,
) -> Result<HttpResponse, UiError> {
    let viewer = state.auth.viewer(&req).await?;
    let presented = req
        .headers()
        .get("X-CSRF-Token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(&query.csrf);
    if super::auth::from_cookie(&req) && !state.auth.check_csrf(&viewer, presented) {
        return Err(UiError::Csrf);
    }
    let (namespace, name, action) = path.into_inner();
    let acted = state
        .act(
            &viewer,
            &AppKey::new(namespace, name),
            action,
            query.revision.as_deref(),
        )
        .await?;
    let mut response = match acted.event {
        Some(_) => HttpResponse::Accepted(),
        None => HttpResponse::Ok(),
    };
    Ok(response.json(acted))
}

/// The deliveries `viewer` may see: every one when it may list
/// Applications everywhere, else those routed to an Application it may
/// read, naming only those.
pub async fn deliveries_for(state: &UiState, viewer: &Viewer) -> Result<Vec<Delivery>, UiError> {
    let all = state.deliveries.list();
    if state.auth.allowed(viewer, "", Verb::List).await? {
        return Ok(all);
    }
    let (_, readable) = state.readable(viewer).await?;
    Ok(all
        .into_iter()
        .filter_map(|mut delivery| {
            delivery.applications.retain(|app| {
                app.split_once('/')
                    .is_some_and(|(ns, _)| readable.iter().any(|r| r == ns))
            });
            (!delivery.applications.is_empty()).then_some(delivery)
        })
        .collect())
}

async fn deliveries(req: HttpRequest, state: web::Data<UiState>) -> Result<HttpResponse, UiError> {
    let viewer = state.auth.viewer(&req).await?;
    Ok(HttpResponse::Ok().json(deliveries_for(&state, &viewer).await?))
}

#[derive(Deserialize)]
struct LiveQuery {
    namespace: Option<String>,
    name: Option<String>,
}

/// `GET /api/v1/live`: the page's event stream; one Application's with
/// `?namespace=&name=`, else every Application the viewer may list.
async fn stream(
    req: HttpRequest,
    state: web::Data<UiState>,
    query: web::Query<LiveQuery>,
) -> Result<HttpResponse, UiError> {
    let viewer = state.auth.viewer(&req).await?;
    let updates = state.updates.subscribe();
    let follow = match (&query.namespace, &query.name) {
        (Some(namespace), Some(name)) => {
            let key = AppKey::new(namespace.clone(), name.clone());
            if !state.auth.allowed(&viewer, namespace, Verb::Get).await? {
                return Err(UiError::NotFound(key));
            }
            Follow::App(key)
        }
        _ => Follow::Namespaces(state.readable(&viewer).await?.1),
    };
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("Cache-Control", "no-store"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(live::stream(updates, follow)))
}
