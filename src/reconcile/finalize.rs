//! Deleting an Application that carries the resources finalizer deletes
//! its objects first (Argo CD's `resources-finalizer.argocd.argoproj.io`,
//! which Setpoint honours too, and Setpoint's own name): a pull request
//! environment an ApplicationSet deletes on close takes its objects with
//! it. Without the finalizer, the objects stay, as in Argo CD.
//!
//! Only the objects of the status's inventory whose live copy is still
//! annotated as this Application's are deleted (with a uid precondition,
//! in prune's order), as its identity on its destination cluster; then the
//! finalizer is removed, and the API server deletes the Application.

use std::collections::HashMap;

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::api::Application;
use crate::context::Context;
use crate::manifest::ObjectId;

use super::prepare::{APP_ANNOTATION, owner_key};
use super::sync_options;
use super::{ReconcileError, apply, live};

/// Setpoint's name for it.
pub const FINALIZER: &str = "setpoint.dev/resources-finalizer";
/// Argo CD's, honoured the same way.
pub const ARGO_CD_FINALIZER: &str = "resources-finalizer.argocd.argoproj.io";

/// Whether `app` is being deleted and waits for Setpoint to delete its
/// objects.
pub fn pending(app: &Application) -> bool {
    app.metadata.deletion_timestamp.is_some()
        && app
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER || f == ARGO_CD_FINALIZER)
}

/// Deletes `app`'s objects, then lets it go; the objects deleted.
pub async fn finalize(ctx: &Context, app: &Application) -> Result<Vec<ObjectId>, ReconcileError> {
    let identity = ctx.tenancy.identity(app)?;
    let cluster = super::destination(ctx, app).await?;
    let client = cluster.client_for(&identity);
    let owner = owner_key(app);
    // Unreadable options hold nothing back: the objects are deleted.
    let app_options =
        sync_options::of_application(&app.spec.sync_policy.sync_options).unwrap_or_default();
    let mut targets = Vec::new();
    let mut held: HashMap<ObjectId, Value> = HashMap::new();
    let inventory = app.status.iter().flat_map(|s| s.resources.iter());
    for resource in inventory {
        let id = ObjectId {
            group: resource.group.clone(),
            version: resource.version.clone(),
            kind: resource.kind.clone(),
            namespace: resource.namespace.clone(),
            name: resource.name.clone(),
        };
        let kind = match cluster
            .kinds
            .resolve(&client, &id.api_version(), &id.kind)
            .await
        {
            Ok(kind) => kind,
            // A kind the API server no longer serves holds nothing to delete.
            Err(error) => {
                tracing::debug!(object = %id, %error, "kind gone; nothing to delete");
                continue;
            }
        };
        let api = live::api_for(&client, &kind.resource, id.namespace.as_deref());
        let found = api.get_opt(&id.name).await.map_err(|source| {
            ReconcileError::Live(live::LiveError::Get {
                id: id.clone(),
                source,
            })
        })?;
        let Some(object) = found else { continue };
        let object = serde_json::to_value(object).unwrap_or_default();
        // Another Application's now, or never ours: left alone.
        if object["metadata"]["annotations"][APP_ANNOTATION].as_str() != Some(owner.as_str()) {
            continue;
        }
        // `Delete=false` (or Helm's `resource-policy: keep`): it outlives
        // its Application.
        if !sync_options::of_live(app_options, &object).delete {
            tracing::info!(object = %id, "kept: Delete=false");
            continue;
        }
        held.insert(id.clone(), object);
        targets.push(id);
    }
    let pruned = apply::prune(&client, &cluster.kinds, &targets, &held, app_options).await?;
    release(ctx, app).await?;
    tracing::info!(app = %owner, deleted = pruned.len(), "Application deleted with its objects");
    Ok(pruned)
}

/// Removes the resources finalizers, on the version read (a conflict is
/// retried by the queue with a fresh read).
async fn release(ctx: &Context, app: &Application) -> Result<(), ReconcileError> {
    let namespace = app.metadata.namespace.as_deref().unwrap_or("default");
    let name = app.metadata.name.as_deref().unwrap_or_default();
    let kept: Vec<&String> = app
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != FINALIZER && *f != ARGO_CD_FINALIZER)
        .collect();
    let api: Api<Application> = Api::namespaced(ctx.client.clone(), namespace);
    let patch = json!({
        "metadata": {
            "resourceVersion": app.metadata.resource_version,
            "finalizers": kept,
        }
    });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(source) => Err(ReconcileError::WriteStatus {
            app: owner_key(app),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_deleted_application_with_the_finalizer_is_pending() {
        let mut app = Application::new("web", Default::default());
        app.metadata.finalizers = Some(vec![ARGO_CD_FINALIZER.into()]);
        assert!(!pending(&app), "not being deleted");
        app.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        assert!(pending(&app));
        app.metadata.finalizers = Some(vec!["example.com/other".into()]);
        assert!(!pending(&app), "another finalizer");
        app.metadata.finalizers = Some(vec![FINALIZER.into()]);
        assert!(pending(&app));
    }
}
