//! The writes of a plan (I/O): each Application created or updated by
//! server-side apply with the set's field manager, labelled with the set's
//! name and owned by it (a controller reference, so deleting the set lets
//! the API server's garbage collector delete them, as Argo CD's do); each
//! deletion made only on the Application the plan saw (its uid).
//! Applications are written 16 at a time; one that fails does not stop
//! the others.

use futures::StreamExt;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::api::{Application, ApplicationSet};
use crate::context::Context;

use super::plan::Plan;
use super::template::Rendered;
use super::{FIELD_MANAGER, SET_LABEL};

const IN_FLIGHT: usize = 16;

/// What the writes did.
#[derive(Debug, Default)]
pub struct Written {
    pub created: Vec<String>,
    pub updated: Vec<String>,
    pub deleted: Vec<String>,
    /// The Applications as the API server answered the applies.
    pub applied: Vec<Application>,
    /// Those that failed, and why.
    pub failed: Vec<(String, String)>,
}

pub async fn apply(ctx: &Context, set: &ApplicationSet, plan: &Plan) -> Written {
    let namespace = set.metadata.namespace.clone().unwrap_or_default();
    let api: Api<Application> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut written = Written::default();
    // Owned, so the futures borrow nothing (and stay Send).
    let applies: Vec<(String, bool, serde_json::Value)> = plan
        .create
        .iter()
        .map(|r| (r, true))
        .chain(plan.update.iter().map(|r| (r, false)))
        .map(|(r, create)| (r.name.clone(), create, body(set, &namespace, r)))
        .collect();
    let mut answers = futures::stream::iter(applies)
        .map(|(name, create, body)| {
            let api = api.clone();
            async move {
                let answer = api
                    .patch(
                        &name,
                        &PatchParams::apply(FIELD_MANAGER).force(),
                        &Patch::Apply(&body),
                    )
                    .await;
                (name, create, answer)
            }
        })
        .buffer_unordered(IN_FLIGHT);
    while let Some((name, create, answer)) = answers.next().await {
        match answer {
            Ok(app) => {
                if create {
                    written.created.push(name);
                } else {
                    written.updated.push(name);
                }
                written.applied.push(app);
            }
            Err(error) => written.failed.push((name, error.to_string())),
        }
    }
    drop(answers);
    let deletes: Vec<(String, Option<String>)> = plan
        .delete
        .iter()
        .map(|name| (name.clone(), uid_of(ctx, &namespace, name)))
        .collect();
    let mut answers = futures::stream::iter(deletes)
        .map(|(name, uid)| {
            let api = api.clone();
            async move {
                let params = DeleteParams {
                    preconditions: uid.map(|uid| Preconditions {
                        uid: Some(uid),
                        resource_version: None,
                    }),
                    ..DeleteParams::background()
                };
                let answer = api.delete(&name, &params).await;
                (name, answer)
            }
        })
        .buffer_unordered(IN_FLIGHT);
    while let Some((name, answer)) = answers.next().await {
        match answer {
            Ok(_) => written.deleted.push(name),
            Err(kube::Error::Api(status)) if status.code == 404 => written.deleted.push(name),
            Err(error) => written.failed.push((name, error.to_string())),
        }
    }
    for list in [
        &mut written.created,
        &mut written.updated,
        &mut written.deleted,
    ] {
        list.sort();
    }
    written.failed.sort();
    written
}

/// The uid of the Application the plan decided to delete, so a new one of
/// the same name made since is not deleted.
fn uid_of(ctx: &Context, namespace: &str, name: &str) -> Option<String> {
    let store = ctx.applications()?;
    let app = store.get(&kube::runtime::reflector::ObjectRef::new(name).within(namespace))?;
    app.uid()
}

/// The Application `rendered` describes, as the set applies it.
pub fn body(set: &ApplicationSet, namespace: &str, rendered: &Rendered) -> serde_json::Value {
    let mut labels = rendered.labels.clone();
    labels.insert(SET_LABEL.into(), set.name_any());
    json!({
        "apiVersion": "setpoint.dev/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": rendered.name,
            "namespace": namespace,
            "labels": labels,
            "annotations": rendered.annotations,
            "finalizers": set.spec.template.metadata.finalizers,
            "ownerReferences": [{
                "apiVersion": "setpoint.dev/v1alpha1",
                "kind": "ApplicationSet",
                "name": set.name_any(),
                "uid": set.metadata.uid,
                "controller": true,
                "blockOwnerDeletion": true,
            }],
        },
        "spec": rendered.spec,
    })
}
