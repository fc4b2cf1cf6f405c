//! Apply: server-side apply of the objects the policy chose, with the one
//! field manager `setpoint`, in a fixed order:
//!
//! 1. Namespaces, then CustomResourceDefinitions (waiting until each is
//!    Established, so instances in the same commit can follow);
//! 2. configuration, RBAC, services and custom resources;
//! 3. workloads last, so they start with everything they refer to in place.
//!
//! Before anything is written, every object whose kind already exists is sent
//! as a server-side dry run: an object the API server rejects stops the sync
//! with nothing changed. A sync of one object needs none: its apply is all
//! or nothing.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use kube::Client;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};

use crate::reconcile::sync_options::{self, Options, Propagation};
use serde_json::Value;

use crate::manifest::ObjectId;
use crate::reconcile::kinds::{Kind, KindError, Kinds};
use crate::reconcile::live::api_for;
use crate::reconcile::plan::FIELD_MANAGER;
use crate::reconcile::prepare::Desired;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// RBAC refused the Application's identity: nothing of the sync is
    /// applied (the dry run comes first).
    #[error("{}", forbidden_message(.id, .source))]
    Forbidden {
        id: ObjectId,
        #[source]
        source: kube::Error,
    },
    #[error("the API server rejected {id}: {}", status_message(.source))]
    Rejected {
        id: ObjectId,
        #[source]
        source: kube::Error,
    },
    #[error("failed to apply {id}: {source}")]
    ApplyObject {
        id: ObjectId,
        #[source]
        source: kube::Error,
    },
    #[error("CustomResourceDefinition {name} was not Established within {timeout:?}")]
    CrdNotEstablished { name: String, timeout: Duration },
    /// Applying it would be a no-op and its instances would be deleted with
    /// it: nothing is applied until the deletion has finished.
    #[error(
        "CustomResourceDefinition {name} is being deleted (since {since}{}): it and its instances cannot be applied until the deletion completes",
        held_by(.finalizers)
    )]
    CrdTerminating {
        name: String,
        since: String,
        finalizers: Vec<String>,
    },
    #[error("failed to resolve the kind of {id}: {source}")]
    Kind {
        id: ObjectId,
        #[source]
        source: KindError,
    },
    #[error("failed to prune {id}: {source}")]
    Prune {
        id: ObjectId,
        #[source]
        source: kube::Error,
    },
}

impl ApplyError {
    pub fn is_transient(&self) -> bool {
        match self {
            ApplyError::Rejected { .. } | ApplyError::Forbidden { .. } => false,
            ApplyError::Kind { source, .. } => source.is_transient(),
            // Retried: once the deletion completes, the next attempt creates
            // the CRD afresh.
            ApplyError::CrdTerminating { .. } => true,
            _ => true,
        }
    }
}

fn held_by(finalizers: &[String]) -> String {
    if finalizers.is_empty() {
        String::new()
    } else {
        format!(", held by the finalizers {}", finalizers.join(", "))
    }
}

fn status_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// `system:serviceaccount:team-a:deployer cannot create
/// clusterrolebindings.rbac.authorization.k8s.io (rbac.authorization.k8s.io/ClusterRoleBinding admin)`,
/// from the API server's "User \"…\" cannot create resource \"…\" in API
/// group \"…\"" message; the message itself when it reads otherwise.
fn forbidden_message(id: &ObjectId, error: &kube::Error) -> String {
    let message = status_message(error);
    let quoted_after = |marker: &str| -> Option<&str> {
        let rest = &message[message.find(marker)? + marker.len()..];
        rest.split('"').next()
    };
    let user = quoted_after("User \"");
    let verb = message
        .find(" cannot ")
        .map(|i| &message[i + 8..])
        .and_then(|rest| rest.split_whitespace().next());
    let resource = quoted_after("resource \"");
    match (user, verb, resource) {
        (Some(user), Some(verb), Some(resource)) => {
            let group = quoted_after("API group \"").unwrap_or_default();
            let resource = if group.is_empty() {
                resource.to_string()
            } else {
                format!("{resource}.{group}")
            };
            let scope = match &id.namespace {
                Some(ns) => format!(" in namespace {ns}"),
                None => String::new(),
            };
            format!("{user} cannot {verb} {resource}{scope} ({id})")
        }
        _ => format!("forbidden: {id}: {message}"),
    }
}

/// A request the API server refuses for the object's own sake (invalid,
/// malformed, forbidden, its namespace missing) rather than a passing fault.
fn is_rejection(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(s) => {
            matches!(s.code, 400 | 403 | 404 | 405 | 413 | 415 | 422)
                // Server-side apply answers 500 when a field has the wrong type.
                || (s.code == 500 && s.message.contains("failed to create typed patch object"))
        }
        _ => false,
    }
}

/// Apply order: lower first. Helm's install order, with workloads last.
pub fn rank(group: &str, kind: &str) -> u8 {
    match (group, kind) {
        ("", "Namespace") => 0,
        ("apiextensions.k8s.io", "CustomResourceDefinition") => 1,
        (_, "NetworkPolicy" | "ResourceQuota" | "LimitRange" | "PodDisruptionBudget") => 2,
        ("", "ServiceAccount" | "Secret" | "ConfigMap") => 3,
        (_, "StorageClass" | "PersistentVolume" | "PersistentVolumeClaim") => 4,
        ("rbac.authorization.k8s.io", "ClusterRole" | "ClusterRoleBinding") => 5,
        ("rbac.authorization.k8s.io", "Role" | "RoleBinding") => 6,
        ("", "Service") => 7,
        ("apps", "DaemonSet") | ("", "Pod" | "ReplicationController") => 9,
        ("apps", "ReplicaSet" | "Deployment" | "StatefulSet") => 9,
        ("autoscaling", "HorizontalPodAutoscaler") | ("batch", "Job" | "CronJob") => 10,
        ("networking.k8s.io", "IngressClass" | "Ingress") => 11,
        ("apiregistration.k8s.io", "APIService") => 12,
        _ => 8,
    }
}

/// The error that refuses a sync whose desired CustomResourceDefinitions
/// include one that the cluster is deleting (`deletionTimestamp` set, e.g.
/// held by a finalizer): applying it changes nothing, and the instances
/// applied after it would be deleted along with it. Pure: `live` is what the
/// live step read.
pub fn terminating_crd(desired: &[Desired], live: &HashMap<ObjectId, Value>) -> Option<ApplyError> {
    for d in desired {
        let id = &d.manifest.id;
        if !(id.group == "apiextensions.k8s.io" && id.kind == "CustomResourceDefinition") {
            continue;
        }
        let Some(object) = live.get(id) else { continue };
        let metadata = &object["metadata"];
        let Some(since) = metadata["deletionTimestamp"].as_str() else {
            continue;
        };
        let finalizers = metadata["finalizers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str().map(String::from))
            .collect();
        return Some(ApplyError::CrdTerminating {
            name: id.name.clone(),
            since: since.to_string(),
            finalizers,
        });
    }
    None
}

/// The result of applying one object: what the API server returned.
pub struct Applied {
    pub id: ObjectId,
    pub live: Value,
}

fn apply_params(dry_run: bool, options: &Options) -> PatchParams {
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    params.dry_run = dry_run;
    if !options.validate {
        params = params.validation_ignore();
    }
    params
}

/// `Replace=true`: the object is replaced whole (or created), as Argo CD's
/// `kubectl replace`/`create`, instead of server-side applied.
async fn replace(
    api: &kube::Api<kube::api::DynamicObject>,
    id: &ObjectId,
    body: &Value,
) -> Result<kube::api::DynamicObject, ApplyError> {
    let mut object: kube::api::DynamicObject =
        serde_json::from_value(body.clone()).map_err(|error| ApplyError::ApplyObject {
            id: id.clone(),
            source: kube::Error::SerdeError(error),
        })?;
    let params = kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    let existing = api
        .get_opt(&id.name)
        .await
        .map_err(|source| classify(id, source))?;
    match existing {
        Some(live) => {
            object.metadata.resource_version = live.metadata.resource_version;
            api.replace(&id.name, &params, &object).await
        }
        None => api.create(&params, &object).await,
    }
    .map_err(|source| classify(id, source))
}

/// Dry-runs, then applies, `chosen` (indexes into `desired`) in order.
/// Objects in `dry_run_done` were dry-run with the same body in this
/// reconcile already (the server-side diff's input) and are not sent again.
pub async fn apply(
    client: &Client,
    kinds: &Kinds,
    desired: &mut [Desired],
    chosen: &[usize],
    dry_run_done: &HashMap<ObjectId, Value>,
) -> Result<Vec<Applied>, ApplyError> {
    // One object is all or nothing by itself: its apply is its check.
    if chosen.len() > 1 {
        dry_run(client, desired, chosen, dry_run_done).await?;
    }
    apply_checked(client, kinds, desired, chosen).await
}

fn apply_order(desired: &[Desired], chosen: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = chosen.to_vec();
    order.sort_by_key(|&i| {
        let id = &desired[i].manifest.id;
        (rank(&id.group, &id.kind), i)
    });
    order
}

/// A server-side dry run of everything of `chosen` whose kind the server
/// already serves (but those in `dry_run_done`): a rejection stops the sync
/// before anything is written.
pub async fn dry_run(
    client: &Client,
    desired: &[Desired],
    chosen: &[usize],
    dry_run_done: &HashMap<ObjectId, Value>,
) -> Result<(), ApplyError> {
    let order = apply_order(desired, chosen);
    let mut checks = Vec::new();
    for &i in &order {
        let d = &desired[i];
        let Some(kind) = d.kind.as_ref() else {
            continue;
        };
        let id = &d.manifest.id;
        // Already dry-run, or in a namespace this same sync creates (which
        // cannot be dry-run yet).
        if dry_run_done.contains_key(id)
            || id
                .namespace
                .as_ref()
                .is_some_and(|ns| namespace_in(desired, chosen, ns))
        {
            continue;
        }
        let api = api_for(client, &kind.resource, id.namespace.as_deref());
        checks.push(async move {
            api.patch(
                &id.name,
                &apply_params(true, &d.options),
                &Patch::Apply(&d.manifest.body),
            )
            .await
            .map(drop)
            .map_err(|source| classify(id, source))
        });
    }
    // Nothing is written by a dry run, so they all go at once (a few in
    // flight); the first refusal in the apply order is the one reported.
    let answers: Vec<Result<(), ApplyError>> = futures::stream::iter(checks)
        .buffered(DRY_RUNS_IN_FLIGHT)
        .collect()
        .await;
    answers.into_iter().collect()
}

/// Dry runs of one sync in flight at once.
const DRY_RUNS_IN_FLIGHT: usize = 8;

/// Applies `chosen` in the kind order, after [`dry_run`] passed for them
/// (sync waves apply a sync's objects a wave at a time, after one dry run of
/// them all).
pub async fn apply_checked(
    client: &Client,
    kinds: &Kinds,
    desired: &mut [Desired],
    chosen: &[usize],
) -> Result<Vec<Applied>, ApplyError> {
    let order = apply_order(desired, chosen);
    let mut applied = Vec::with_capacity(order.len());
    let mut crds_applied = Vec::new();
    for &i in &order {
        let id = desired[i].manifest.id.clone();
        if desired[i].kind.is_none() {
            // Instances of a CRD from this sync: wait for the CRDs, then resolve.
            wait_established(client, &crds_applied).await?;
            let kind = resolve_new_kind(kinds, client, &id)
                .await
                .map_err(|source| ApplyError::Kind {
                    id: id.clone(),
                    source,
                })?;
            desired[i].kind = Some(kind);
        }
        let d = &desired[i];
        let kind = d.kind.as_ref().expect("resolved above");
        let api = api_for(client, &kind.resource, id.namespace.as_deref());
        let live = if d.options.replace {
            replace(&api, &id, &d.manifest.body).await?
        } else {
            api.patch(
                &id.name,
                &apply_params(false, &d.options),
                &Patch::Apply(&d.manifest.body),
            )
            .await
            .map_err(|source| classify(&id, source))?
        };
        if id.group == "apiextensions.k8s.io" && id.kind == "CustomResourceDefinition" {
            crds_applied.push(id.name.clone());
        }
        tracing::info!(object = %id, "applied");
        applied.push(Applied {
            id,
            live: serde_json::to_value(&live).expect("serializes"),
        });
    }
    Ok(applied)
}

/// `CreateNamespace=true`: the destination namespace is created when it
/// is missing and the render does not hold it. It is not the Application's
/// object (never labelled, never pruned), as in Argo CD.
pub async fn create_namespace(
    client: &Client,
    namespace: &str,
    desired: &[Desired],
) -> Result<(), ApplyError> {
    if desired
        .iter()
        .any(|d| is_namespace(&d.manifest.id, namespace))
    {
        return Ok(());
    }
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let id = ObjectId {
        group: String::new(),
        version: "v1".into(),
        kind: "Namespace".into(),
        namespace: None,
        name: namespace.to_string(),
    };
    if api
        .get_opt(namespace)
        .await
        .map_err(|source| classify(&id, source))?
        .is_some()
    {
        return Ok(());
    }
    let object = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(namespace.to_string()),
            ..Default::default()
        },
        ..Default::default()
    };
    let params = kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    };
    match api.create(&params, &object).await {
        Ok(_) => {
            tracing::info!(%namespace, "created the destination namespace (CreateNamespace=true)");
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(source) => Err(classify(&id, source)),
    }
}

fn namespace_in(desired: &[Desired], chosen: &[usize], namespace: &str) -> bool {
    chosen
        .iter()
        .any(|&i| is_namespace(&desired[i].manifest.id, namespace))
}

fn is_namespace(id: &ObjectId, namespace: &str) -> bool {
    id.group.is_empty() && id.kind == "Namespace" && id.name == namespace
}

pub(crate) fn classify(id: &ObjectId, source: kube::Error) -> ApplyError {
    if matches!(&source, kube::Error::Api(s) if s.code == 403) {
        ApplyError::Forbidden {
            id: id.clone(),
            source,
        }
    } else if is_rejection(&source) {
        ApplyError::Rejected {
            id: id.clone(),
            source,
        }
    } else {
        ApplyError::ApplyObject {
            id: id.clone(),
            source,
        }
    }
}

const CRD_TIMEOUT: Duration = Duration::from_secs(60);

/// How long discovery may lag behind a CRD's Established condition.
const DISCOVERY_LAG: Duration = Duration::from_secs(30);

/// The kind of an instance of a CRD this sync applied. The API server marks
/// a CRD Established before its discovery document lists the new resource
/// (the discovery handler is updated asynchronously), so an unknown kind is
/// asked again, with backoff, for a bounded time.
async fn resolve_new_kind(
    kinds: &Kinds,
    client: &Client,
    id: &ObjectId,
) -> Result<Kind, KindError> {
    let policy = backoff::ExponentialBackoffBuilder::new()
        .with_initial_interval(Duration::from_millis(50))
        .with_max_interval(Duration::from_secs(1))
        .with_max_elapsed_time(Some(DISCOVERY_LAG))
        .build();
    backoff::future::retry(policy, || async {
        kinds
            .resolve(client, &id.api_version(), &id.kind)
            .await
            .map_err(|err| match err {
                KindError::UnknownKind { .. } => backoff::Error::transient(err),
                other => backoff::Error::permanent(other),
            })
    })
    .await
}

async fn wait_established(client: &Client, names: &[String]) -> Result<(), ApplyError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    for name in names {
        let established = kube::runtime::wait::await_condition(
            api.clone(),
            name,
            kube::runtime::wait::conditions::is_crd_established(),
        );
        match tokio::time::timeout(CRD_TIMEOUT, established).await {
            Ok(Ok(_)) => {}
            _ => {
                return Err(ApplyError::CrdNotEstablished {
                    name: name.clone(),
                    timeout: CRD_TIMEOUT,
                });
            }
        }
    }
    Ok(())
}

/// Deletes objects of this Application that Git no longer has, workloads
/// first and namespaces last, each only if it is still the object that was
/// listed (uid precondition).
pub async fn prune(
    client: &Client,
    kinds: &Kinds,
    targets: &[ObjectId],
    live: &HashMap<ObjectId, Value>,
    app_options: Options,
) -> Result<Vec<ObjectId>, ApplyError> {
    let mut order: Vec<&ObjectId> = targets.iter().collect();
    order.sort_by_key(|id| std::cmp::Reverse(rank(&id.group, &id.kind)));
    let mut pruned = Vec::new();
    for id in order {
        let kind = kinds
            .resolve(client, &id.api_version(), &id.kind)
            .await
            .map_err(|source| ApplyError::Kind {
                id: id.clone(),
                source,
            })?;
        let api = api_for(client, &kind.resource, id.namespace.as_deref());
        let uid = live
            .get(id)
            .and_then(|o| o["metadata"]["uid"].as_str())
            .map(String::from);
        let options = live
            .get(id)
            .map_or(app_options, |o| sync_options::of_live(app_options, o));
        let params = DeleteParams {
            propagation_policy: Some(match options.propagation {
                Propagation::Background => PropagationPolicy::Background,
                Propagation::Foreground => PropagationPolicy::Foreground,
                Propagation::Orphan => PropagationPolicy::Orphan,
            }),
            preconditions: uid.map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&id.name, &params).await {
            Ok(_) => {
                tracing::info!(object = %id, "pruned");
                pruned.push(id.clone());
            }
            // Already gone, or replaced by another object of the same name.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(source) => {
                return Err(ApplyError::Prune {
                    id: id.clone(),
                    source,
                });
            }
        }
    }
    Ok(pruned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forbidden(message: &str) -> kube::Error {
        kube::Error::Api(
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "message": message, "reason": "Forbidden", "code": 403
            }))
            .unwrap(),
        )
    }

    #[test]
    fn forbidden_names_the_identity_the_verb_and_the_resource() {
        let id = ObjectId {
            group: "rbac.authorization.k8s.io".into(),
            version: "v1".into(),
            kind: "ClusterRoleBinding".into(),
            namespace: None,
            name: "admin".into(),
        };
        let error = classify(
            &id,
            forbidden(
                "clusterrolebindings.rbac.authorization.k8s.io \"admin\" is forbidden: User \"system:serviceaccount:team-a:deployer\" cannot patch resource \"clusterrolebindings\" in API group \"rbac.authorization.k8s.io\" at the cluster scope",
            ),
        );
        assert!(!error.is_transient());
        assert_eq!(
            error.to_string(),
            "system:serviceaccount:team-a:deployer cannot patch clusterrolebindings.rbac.authorization.k8s.io (rbac.authorization.k8s.io/ClusterRoleBinding admin)"
        );
        let core = ObjectId {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("team-b".into()),
            name: "x".into(),
        };
        let error = classify(
            &core,
            forbidden(
                "configmaps \"x\" is forbidden: User \"system:serviceaccount:team-a:default\" cannot patch resource \"configmaps\" in API group \"\" in the namespace \"team-b\"",
            ),
        );
        assert_eq!(
            error.to_string(),
            "system:serviceaccount:team-a:default cannot patch configmaps in namespace team-b (ConfigMap team-b/x)"
        );
        let odd = classify(&core, forbidden("denied by a webhook"));
        assert_eq!(
            odd.to_string(),
            "forbidden: ConfigMap team-b/x: denied by a webhook"
        );
    }

    use crate::manifest::{Manifest, Origin};
    use serde_json::json;

    fn desired(group: &str, kind: &str, name: &str) -> Desired {
        Desired {
            manifest: Manifest {
                id: ObjectId {
                    group: group.into(),
                    version: "v1".into(),
                    kind: kind.into(),
                    namespace: None,
                    name: name.into(),
                },
                origin: Origin {
                    file: "crd.yaml".into(),
                    document: 0,
                },
                body: json!({}),
            },
            kind: None,
            options: Default::default(),
        }
    }

    #[test]
    fn a_crd_being_deleted_stops_the_sync_and_is_named() {
        let crd = desired(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            "widgets.example.com",
        );
        let widget = desired("example.com", "Widget", "w");
        let mut live = HashMap::new();
        live.insert(
            crd.manifest.id.clone(),
            json!({"metadata": {"name": "widgets.example.com"}}),
        );
        let both = [crd, widget];
        assert!(terminating_crd(&both, &live).is_none());

        live.insert(
            both[0].manifest.id.clone(),
            json!({"metadata": {
                "name": "widgets.example.com",
                "deletionTimestamp": "2026-12-03T14:00:00Z",
                "finalizers": ["example.com/hold", "customresourcecleanup.apiextensions.k8s.io"],
            }}),
        );
        let error = terminating_crd(&both, &live).expect("refused");
        let message = error.to_string();
        assert!(
            message.starts_with(
                "CustomResourceDefinition widgets.example.com is being deleted (since 2026-12-03T14:00:00Z, held by the finalizers example.com/hold, customresourcecleanup.apiextensions.k8s.io)"
            ),
            "{message}"
        );
        assert!(error.is_transient());
    }

    #[test]
    fn only_crds_are_checked_and_absent_ones_pass() {
        // Another kind being deleted is progressing, not an error (health.rs).
        let config = desired("", "ConfigMap", "c");
        let mut live = HashMap::new();
        live.insert(
            config.manifest.id.clone(),
            json!({"metadata": {"deletionTimestamp": "2026-12-03T14:00:00Z"}}),
        );
        let crd = desired(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            "new.example.com",
        );
        assert!(terminating_crd(&[config, crd], &live).is_none());
    }
}
