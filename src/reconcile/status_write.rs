//! Writing an Application's status: only when it changed, only onto the
//! version that was read, rebuilt on a fresh read after a conflict.

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::api::{Application, ApplicationStatus};
use crate::context::Context;

use super::status::{self, Report};
use super::{ReconcileError, plan, prepare};

/// Writes the status `report` builds on the Application as read, unless it
/// is what the Application already says; returns it and whether it was
/// written. The write is made only onto the version read (its
/// `resourceVersion`): the status carries what it was built on (the
/// history, the conditions' transition times), so a writer that read the
/// Application earlier must not undo what another wrote since (a manual
/// sync beside a worker). On a conflict the Application is read again and
/// the same report built on its status: what this reconcile did (its
/// operation) is kept, and its `observedGeneration` stays the one it
/// reconciled, since a spec change is an event of its own.
pub(super) async fn write_status(
    ctx: &Context,
    app: &Application,
    report: Report<'_>,
) -> Result<(ApplicationStatus, bool), ReconcileError> {
    let api: Api<Application> = Api::namespaced(
        ctx.client.clone(),
        app.metadata.namespace.as_deref().unwrap_or("default"),
    );
    let name = app.metadata.name.as_deref().unwrap_or_default();
    let error = |source| ReconcileError::WriteStatus {
        app: prepare::owner_key(app),
        source,
    };
    let mut fresh: Option<Application> = None;
    let mut attempt = 1;
    loop {
        let read = fresh.as_ref().unwrap_or(app);
        let status = status::build(Report {
            previous: read.status.as_ref(),
            ..report.clone()
        });
        if read.status.as_ref() == Some(&status) {
            return Ok((status, false));
        }
        let patch = json!({
            "apiVersion": "setpoint.dev/v1alpha1",
            "kind": "Application",
            "metadata": { "resourceVersion": read.metadata.resource_version },
            "status": status,
        });
        let written = api
            .patch_status(
                name,
                &PatchParams::apply(plan::FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await;
        match written {
            Ok(answer) => {
                let namespace = app.metadata.namespace.as_deref().unwrap_or("default");
                ctx.status_written(namespace, name, answer.metadata.resource_version.as_deref());
                return Ok((status, true));
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < STATUS_WRITE_ATTEMPTS => {
                attempt += 1;
                tracing::debug!(
                    attempt,
                    "the Application changed since it was read; its status is built again"
                );
                match api.get_opt(name).await.map_err(error)? {
                    Some(application) => fresh = Some(application),
                    // Deleted meanwhile: no status to keep.
                    None => return Ok((status, false)),
                }
            }
            Err(source) => return Err(error(source)),
        }
    }
}

/// How often a status write is tried on a fresh read after a conflict.
const STATUS_WRITE_ATTEMPTS: u32 = 5;
