//! Live: what the cluster holds of an Application's objects, read one of two
//! ways ([`Read`]).
//!
//! - **Inventory**, for every reconcile but a manual sync: a GET for each
//!   desired object and each object of the last status (the inventory, as
//!   Flux's kustomize-controller keeps it). Each GET costs the API server the
//!   same however many objects share the namespace. An object labelled for
//!   the Application but in neither (applied by a reconcile whose status
//!   write was lost, then dropped from Git; or left by a deleted Application
//!   of the same name) is not seen.
//! - **Labelled**, for a manual sync: one labelled list per (kind, namespace)
//!   in use, plus a GET for each desired object the lists did not return
//!   (one that exists without Setpoint's label). Kinds listed in the last
//!   status but gone from Git are listed too. It finds every object carrying
//!   the Application's label, so a manual sync prunes what the inventory
//!   missed; but each list costs the API server a pass over every object of
//!   its kind in the namespace (4.4 ms of its CPU at 10,000 ConfigMaps, 0.8
//!   ms in an empty namespace, against 0.7–1.2 ms for a GET), which made the
//!   first sync of thousands of Applications in one namespace quadratic.
//!
//! Either way, a cluster's live cache (`cluster/live_cache.rs`, fed by the
//! watches), when the reconcile may use it, answers first: an object of a
//! watched kind costs no request at all, and the cache's objects that carry
//! the Application's annotation are its prune candidates too (what the
//! labelled lists find, for free). An object no synced watch covers is read
//! as above. The cache is read as Setpoint; so it serves only Applications
//! that act as Setpoint (admin namespaces): a tenant's reads stay requests
//! made as its service account, which its RBAC decides.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kube::api::{DynamicObject, ListParams};
use kube::discovery::ApiResource;
use kube::{Api, Client};
use serde_json::Value;

use crate::api::Application;
use crate::cluster::LiveCache;
use crate::cluster::live_cache::{Gvk, Lookup};
use crate::manifest::ObjectId;
use crate::reconcile::kinds::{Kind, Kinds};
use crate::reconcile::plan::LiveState;
use crate::reconcile::prepare::{APP_ANNOTATION, APP_LABEL, Desired, app_label_value, owner_key};

#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("failed to list {kind} in {scope}: {source}")]
    List {
        kind: String,
        scope: String,
        #[source]
        source: kube::Error,
    },
    #[error("failed to read {id}: {source}")]
    Get {
        id: ObjectId,
        #[source]
        source: kube::Error,
    },
}

/// A kind Setpoint could not list (403): skipped and reported, never guessed.
#[derive(Debug, Clone)]
pub struct Skipped {
    pub kind: String,
    pub scope: String,
    pub message: String,
}

pub fn api_for(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// How [`read`] finds the live objects (see the module's comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Read {
    Labelled,
    Inventory,
}

impl Read {
    /// Labelled for a manual sync; else Inventory, also for an Application
    /// whose status holds no inventory yet (its first sync GETs what Git
    /// holds, as Flux's does).
    pub fn for_reconcile(manual: bool) -> Self {
        if manual {
            Read::Labelled
        } else {
            Read::Inventory
        }
    }
}

pub async fn read(
    client: &Client,
    kinds: &Kinds,
    app: &Application,
    desired: &[Desired],
    how: Read,
    cache: Option<&LiveCache>,
) -> Result<(LiveState, Vec<Skipped>), LiveError> {
    if how == Read::Inventory {
        return read_inventory(client, kinds, app, desired, cache).await;
    }
    let label = format!("{APP_LABEL}={}", app_label_value(app));
    let owner = owner_key(app);
    let previously_applied = inventory(app);

    // (apiVersion, kind, namespace) → the resource to list it with.
    let mut scopes: BTreeMap<(String, String, Option<String>), Kind> = BTreeMap::new();
    for d in desired {
        if let Some(kind) = &d.kind {
            let id = &d.manifest.id;
            scopes.insert(
                (id.api_version(), id.kind.clone(), id.namespace.clone()),
                kind.clone(),
            );
        }
    }
    for id in &previously_applied {
        let key = (id.api_version(), id.kind.clone(), id.namespace.clone());
        if scopes
            .keys()
            .any(|(av, k, ns)| *k == key.1 && *ns == key.2 && same_group(av, id))
        {
            continue;
        }
        // A kind that is gone (its CRD deleted) has nothing left to prune.
        if let Ok(kind) = kinds.resolve(client, &key.0, &key.1).await {
            scopes.insert(key, kind);
        }
    }

    let mut objects: HashMap<ObjectId, Value> = HashMap::new();
    let mut owned = BTreeSet::new();
    let mut skipped = Vec::new();
    for ((api_version, kind_name, namespace), kind) in &scopes {
        let api = api_for(client, &kind.resource, namespace.as_deref());
        let scope = namespace.clone().unwrap_or_else(|| "the cluster".into());
        let list = match api.list(&ListParams::default().labels(&label)).await {
            Ok(list) => list,
            Err(kube::Error::Api(status)) if status.code == 403 => {
                skipped.push(Skipped {
                    kind: format!("{api_version} {kind_name}"),
                    scope,
                    message: status.message.clone(),
                });
                continue;
            }
            Err(source) => {
                return Err(LiveError::List {
                    kind: kind_name.clone(),
                    scope,
                    source,
                });
            }
        };
        for object in list.items {
            let Some(name) = object.metadata.name.clone() else {
                continue;
            };
            let is_ours = is_ours(&object, &owner);
            let (group, version) = crate::manifest::split_api_version(api_version);
            let id = ObjectId {
                group: group.into(),
                version: version.into(),
                kind: kind_name.clone(),
                namespace: object.metadata.namespace.clone(),
                name,
            };
            if is_ours {
                owned.insert(id.clone());
            }
            objects.insert(id, listed_object(object, api_version, kind_name));
        }
    }

    // Desired objects the labelled lists did not return: they may exist
    // unlabelled (made by hand, or by another tool) and will be adopted.
    for d in desired {
        let (Some(kind), id) = (&d.kind, &d.manifest.id) else {
            continue;
        };
        if objects.contains_key(id) {
            continue;
        }
        if let Some(object) = get(client, kind, id, &mut skipped).await? {
            objects.insert(
                id.clone(),
                serde_json::to_value(&object).expect("objects serialize"),
            );
        }
    }
    Ok(found(objects, owned, previously_applied, skipped))
}

/// What either read found: the live state, before its dry runs.
fn found(
    objects: HashMap<ObjectId, Value>,
    owned: BTreeSet<ObjectId>,
    previously_applied: BTreeSet<ObjectId>,
    skipped: Vec<Skipped>,
) -> (LiveState, Vec<Skipped>) {
    let live = LiveState {
        objects,
        owned,
        previously_applied,
        dry_runs: HashMap::new(),
    };
    (live, skipped)
}

/// Whether `object` (as JSON) is annotated as `owner`'s.
fn is_ours_value(object: &Value, owner: &str) -> bool {
    object
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(APP_ANNOTATION))
        .and_then(Value::as_str)
        == Some(owner)
}

/// Whether `object` is annotated as `owner`'s.
fn is_ours(object: &DynamicObject, owner: &str) -> bool {
    object
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(APP_ANNOTATION))
        .is_some_and(|a| a == owner)
}

/// One GET: the object, or none when it does not exist or when this
/// identity may not read its kind (then recorded in `skipped`).
async fn get(
    client: &Client,
    kind: &Kind,
    id: &ObjectId,
    skipped: &mut Vec<Skipped>,
) -> Result<Option<DynamicObject>, LiveError> {
    let api = api_for(client, &kind.resource, id.namespace.as_deref());
    match api.get_opt(&id.name).await {
        Ok(object) => Ok(object),
        Err(kube::Error::Api(status)) if status.code == 403 => {
            skipped.push(Skipped {
                kind: format!("{} {}", id.api_version(), id.kind),
                scope: id.namespace.clone().unwrap_or_else(|| "the cluster".into()),
                message: status.message.clone(),
            });
            Ok(None)
        }
        Err(source) => Err(LiveError::Get {
            id: id.clone(),
            source,
        }),
    }
}

/// The objects the Application's last status lists.
fn inventory(app: &Application) -> BTreeSet<ObjectId> {
    app.status
        .iter()
        .flat_map(|s| &s.resources)
        .map(|r| ObjectId {
            group: r.group.clone(),
            version: r.version.clone(),
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        })
        .collect()
}

/// [`Read::Inventory`]: a GET for each desired object and each object of
/// the last status that `cache` cannot answer for; with a cache, also what
/// it holds of the Application's in the scopes of those objects.
async fn read_inventory(
    client: &Client,
    kinds: &Kinds,
    app: &Application,
    desired: &[Desired],
    cache: Option<&LiveCache>,
) -> Result<(LiveState, Vec<Skipped>), LiveError> {
    let owner = owner_key(app);
    let previously_applied = inventory(app);
    let mut wanted: Vec<(ObjectId, Kind)> = desired
        .iter()
        .filter_map(|d| Some((d.manifest.id.clone(), d.kind.clone()?)))
        .collect();
    for id in &previously_applied {
        if wanted.iter().any(|(w, _)| w.same_object(id)) {
            continue;
        }
        // A kind that is gone (its CRD deleted) has nothing left to prune.
        if let Ok(kind) = kinds.resolve(client, &id.api_version(), &id.kind).await {
            wanted.push((id.clone(), kind));
        }
    }
    let mut objects: HashMap<ObjectId, Value> = HashMap::new();
    let mut owned = BTreeSet::new();
    let mut skipped = Vec::new();
    let scopes: BTreeSet<(Gvk, Option<String>)> = wanted
        .iter()
        .map(|(id, _)| {
            let gvk = Gvk::new(&id.group, &id.version, &id.kind);
            (gvk, id.namespace.clone())
        })
        .collect();
    for (id, kind) in wanted {
        let object = match cache.map(|cache| cache.get(&id)) {
            Some(Lookup::Found(object)) => Some(object),
            Some(Lookup::Absent) => None,
            Some(Lookup::Unknown) | None => get(client, &kind, &id, &mut skipped)
                .await?
                .map(|object| serde_json::to_value(&object).expect("objects serialize")),
        };
        if let Some(object) = object {
            if is_ours_value(&object, &owner) {
                owned.insert(id.clone());
            }
            objects.insert(id, object);
        }
    }
    // Objects of the Application that neither Git nor its last status
    // names (applied by a reconcile whose status write was lost, or left by
    // a deleted Application of the same name): the cache has them.
    for (gvk, namespace) in scopes.iter().filter(|_| cache.is_some()) {
        let Some(held) =
            cache.and_then(|c| c.owned_by(gvk, namespace.as_deref(), APP_ANNOTATION, &owner))
        else {
            continue;
        };
        for (id, object) in held {
            if objects.keys().any(|known| known.same_object(&id)) {
                continue;
            }
            owned.insert(id.clone());
            objects.insert(id, object);
        }
    }
    Ok(found(objects, owned, previously_applied, skipped))
}

/// List items come without `apiVersion` and `kind`; put them back so the
/// object reads as a GET would return it.
fn listed_object(object: DynamicObject, api_version: &str, kind: &str) -> Value {
    let mut value = serde_json::to_value(&object).expect("objects serialize");
    value["apiVersion"] = Value::String(api_version.to_string());
    value["kind"] = Value::String(kind.to_string());
    value
}

fn same_group(api_version: &str, id: &ObjectId) -> bool {
    crate::manifest::split_api_version(api_version).0 == id.group
}
