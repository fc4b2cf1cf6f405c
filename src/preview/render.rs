//! One Application's preview: its source rendered at the pull request's
//! head commit and dry-run against the live cluster as its own identity
//! (the tenancy module's impersonated service account), through the
//! reconcile's own steps in dry-run mode: the same renderers and sandbox,
//! the same server-side diff, the same plan. Nothing is written: the
//! reconcile's dry run stops before the policy, the apply and the status,
//! and the objects to create are only sent with `dryRun=All`.

use crate::api::Application;
use crate::context::Context;
use crate::event::AppKey;
use crate::manifest::{Manifest, ObjectId};
use crate::reconcile::plan::{Action, Drift};
use crate::reconcile::{self, ReconcileError, Request};
use crate::source::render::RenderError;

/// What the head would do to one Application.
#[derive(Clone, Debug, PartialEq)]
pub struct AppPreview {
    pub app: AppKey,
    /// The changed file that selected it.
    pub input: Option<String>,
    pub result: Result<Changes, Failure>,
}

/// The plan of the head commit against the live cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changes {
    /// Objects to create, as they would be applied.
    pub creates: Vec<Manifest>,
    pub updates: Vec<Update>,
    pub prunes: Vec<ObjectId>,
    pub unchanged: usize,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.creates.is_empty() && self.updates.is_empty() && self.prunes.is_empty()
    }
}

/// An object to update, with each field that would change.
#[derive(Clone, Debug, PartialEq)]
pub struct Update {
    pub id: ObjectId,
    pub drift: Vec<Drift>,
}

/// A render or a dry run that failed.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The condition reason a sync would have set (`InvalidManifest`, ...).
    pub reason: String,
    /// The whole error chain: the renderer's or the API server's message.
    pub message: String,
    /// The file (and line) it names, for a check run annotation.
    pub file: Option<String>,
    pub line: Option<usize>,
    /// Not the pull request's fault (the cluster or Git unreachable).
    pub transient: bool,
}

impl Failure {
    pub fn from_error(error: &ReconcileError) -> Failure {
        let (file, line) = match error {
            ReconcileError::Render(RenderError::ParseManifest { file, line, .. }) => {
                (Some(file.clone()), *line)
            }
            ReconcileError::Render(RenderError::ManifestTooLarge { file, .. }) => {
                (Some(file.clone()), None)
            }
            ReconcileError::Render(RenderError::InvalidObject { origin, .. }) => {
                (Some(origin.file.clone()), None)
            }
            _ => (None, None),
        };
        Failure {
            reason: error.reason().to_string(),
            message: crate::report::events::error_chain(error),
            file,
            line,
            transient: error.is_transient(),
        }
    }
}

/// Renders `app` at `head` and dry-runs it.
pub async fn preview_app(
    ctx: &Context,
    app: &Application,
    head: &str,
    input: Option<String>,
) -> AppPreview {
    let key = AppKey::new(
        app.metadata.namespace.clone().unwrap_or_default(),
        app.metadata.name.clone().unwrap_or_default(),
    );
    let result = changes(ctx, app, head).await;
    AppPreview {
        app: key,
        input,
        result: result.map_err(|error| Failure::from_error(&error)),
    }
}

/// The head's plan for `app`, by the reconcile's dry run of a copy of it
/// that follows `head`.
pub async fn changes(
    ctx: &Context,
    app: &Application,
    revision: &str,
) -> Result<Changes, ReconcileError> {
    let mut at_head = app.clone();
    at_head.spec.source.target_revision = Some(revision.to_string());
    // A preview shows the head, whatever the Application's policy or state.
    at_head.spec.suspend = false;
    let request = Request {
        dry_run: true,
        dry_run_creates: true,
        // A commit id is announced (no fetch when the mirror has it); a
        // branch or tag name (`setpoint diff --revision`) is fetched.
        known_commit: is_commit(revision).then(|| revision.to_string()),
        ..Default::default()
    };
    let outcome = reconcile::reconcile(ctx, &at_head, &request).await?;
    let plan = outcome.plan.unwrap_or_default();
    let mut changes = Changes::default();
    for step in plan.steps {
        match step.action {
            Action::Create { .. } => {
                if let Some(manifest) = outcome.desired.iter().find(|m| m.id == step.id) {
                    changes.creates.push(manifest.clone());
                }
            }
            Action::Update { drift, .. } => changes.updates.push(Update { id: step.id, drift }),
            Action::Prune => changes.prunes.push(step.id),
            Action::Unchanged => changes.unchanged += 1,
        }
    }
    Ok(changes)
}

fn is_commit(revision: &str) -> bool {
    matches!(revision.len(), 40 | 64) && revision.bytes().all(|b| b.is_ascii_hexdigit())
}
