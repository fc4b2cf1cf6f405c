//! Dry run: the input of the server-side diff. Each desired object that is
//! live is sent as a server-side apply dry run (field manager `setpoint`,
//! `dryRun=All`); the API server answers with the object as it would be
//! after the apply, which `plan` compares with the live one.
//!
//! The answers are cached per object, keyed by the live object's version
//! ([`version_key`]) and a hash of the applied body: as long as neither the
//! cluster's copy nor Git's changed, the answer cannot either (short of a
//! change of the kind's schema or of an admission webhook, which the next
//! write of the object picks up). So a reconcile of an in-sync Application
//! whose objects did not move sends no dry run at all. For an object with a
//! `generation`, its version is that and the metadata Setpoint's apply sets:
//! a controller's status writes (a Deployment rolling out) and other
//! managers' annotations (its revision) move the `resourceVersion` but
//! cannot change what Setpoint's fields would be after an apply.
//!
//! An answer that is the live object itself (Setpoint's fields and its
//! managedFields entry as they are: the object is in sync) is held as a
//! mark, not as a copy: a fleet in sync costs a few bytes per object.
//!
//! A dry run is a PATCH but writes nothing: the request counter counts it
//! apart (`dry_runs`), never as a write.

use std::collections::HashMap;
use std::sync::Mutex;

use kube::Client;
use kube::api::{Patch, PatchParams};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::manifest::ObjectId;
use crate::metrics::Metrics;
use crate::reconcile::apply::{ApplyError, classify};
use crate::reconcile::live::api_for;
use crate::reconcile::plan::{FIELD_MANAGER, LiveState, find_live, git_changed};
use crate::reconcile::prepare::Desired;

/// One answer per object: the one for its latest live version and body.
/// Answers are kept as JSON text, several times smaller than a parsed
/// `Value`, and parsed again on a hit.
pub struct DryRunCache {
    entries: Mutex<HashMap<ObjectId, Cached>>,
    max_objects: usize,
}

impl Default for DryRunCache {
    fn default() -> Self {
        Self::with_capacity(MAX_OBJECTS)
    }
}

/// At most this many objects' answers are held; past it, an arbitrary one
/// (often of an object gone since) makes room.
const MAX_OBJECTS: usize = 100_000;

struct Cached {
    resource_version: String,
    body_hash: [u8; 32],
    answer: Answer,
}

enum Answer {
    /// The live object of that version, slimmed, is the answer.
    Live,
    /// The slimmed answer, as JSON text.
    Other(Box<[u8]>),
}

impl DryRunCache {
    fn with_capacity(max_objects: usize) -> Self {
        Self {
            entries: Mutex::default(),
            max_objects,
        }
    }

    /// The answer for `id` at `live`'s version and Git's `body_hash`.
    fn get(&self, id: &ObjectId, live: &Value, body_hash: &[u8; 32]) -> Option<Value> {
        let resource_version = version_key(live);
        let cache = self.entries.lock().expect("dry-run cache lock");
        let cached = cache
            .get(id)
            .filter(|c| c.resource_version == resource_version && &c.body_hash == body_hash)?;
        match &cached.answer {
            Answer::Live => Some(slim(live)),
            Answer::Other(json) => serde_json::from_slice(json).ok(),
        }
    }

    fn put(&self, id: &ObjectId, live: &Value, body_hash: [u8; 32], result: &Value) {
        let result = slim(result);
        let answer = if result == slim(live) {
            Answer::Live
        } else {
            match serde_json::to_vec(&result) {
                Ok(json) => Answer::Other(json.into_boxed_slice()),
                Err(_) => return,
            }
        };
        let resource_version = version_key(live);
        let mut cache = self.entries.lock().expect("dry-run cache lock");
        if cache.len() >= self.max_objects && !cache.contains_key(id) {
            let evicted = cache.keys().next().cloned();
            if let Some(evicted) = evicted {
                cache.remove(&evicted);
            }
        }
        cache.insert(
            id.clone(),
            Cached {
                resource_version,
                body_hash,
                answer,
            },
        );
    }

    /// `live` is what the API server answered to an apply of `body`: a
    /// server-side apply is idempotent, so a dry run of the same body
    /// against that version would answer the object itself. Held as a
    /// mark, the next reconcile sends no dry run for it (until the object
    /// moves or Git's body changes).
    pub fn applied(&self, id: &ObjectId, body: &Value, live: &Value) {
        self.put(id, live, body_hash(body), live);
    }

    /// Objects held (one answer each).
    pub fn len(&self) -> usize {
        self.entries.lock().expect("dry-run cache lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn body_hash(body: &Value) -> [u8; 32] {
    Sha256::digest(body.to_string().as_bytes()).into()
}

fn resource_version(object: &Value) -> &str {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// What a dry-run answer depends on of the live object. With a
/// `generation` (which every change to the spec moves): that, and a digest
/// of the metadata less its `resourceVersion`, its `managedFields` and the
/// labels and annotations that Setpoint's own entry does not own. Without
/// one (a ConfigMap: any change is to what Setpoint may own): the
/// `resourceVersion`.
fn version_key(object: &Value) -> String {
    let Some(metadata) = object.get("metadata").and_then(Value::as_object) else {
        return String::new();
    };
    let Some(generation) = metadata.get("generation").and_then(Value::as_i64) else {
        return resource_version(object).to_string();
    };
    let mut kept = metadata.clone();
    kept.remove("resourceVersion");
    kept.remove("managedFields");
    let [labels, annotations] =
        crate::reconcile::ownership::setpoint_labels_and_annotations(metadata).unwrap_or_default();
    for (map, entries) in [("labels", labels), ("annotations", annotations)] {
        if kept.contains_key(map) {
            kept.insert(map.into(), Value::Object(entries));
        }
    }
    let digest = Sha256::digest(Value::Object(kept).to_string().as_bytes());
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("g{generation}:{hex}")
}

/// What `plan` reads of an answer: Setpoint's own managedFields entry and
/// the object's fields (`status` only when Setpoint's apply owns some of
/// it, as for a kind without a status subresource). Other managers' entries
/// and the status are most of an answer and are left out of the cache,
/// which holds one answer per object of every Application.
fn slim(answer: &Value) -> Value {
    let mut slim = answer.clone();
    let Some(object) = slim.as_object_mut() else {
        return slim;
    };
    let mut owns_status = false;
    if let Some(entries) = object
        .get_mut("metadata")
        .and_then(|metadata| metadata.get_mut("managedFields"))
        .and_then(Value::as_array_mut)
    {
        entries.retain(|entry| entry.get("manager").and_then(Value::as_str) == Some(FIELD_MANAGER));
        owns_status = entries
            .iter()
            .any(|entry| entry.pointer("/fieldsV1/f:status").is_some());
    }
    if !owns_status {
        object.remove("status");
    }
    slim
}

/// The dry-run answers for every desired object that is live, from the
/// cache or from the API server (as the Application's identity); without
/// `git_changes`, none for an object whose Git body changed since it was
/// applied (its plan is an update whatever the diff, and the apply that
/// follows answers with the new object). A
/// rejection stops the reconcile as the apply's dry run would: nothing has
/// been written.
pub async fn dry_run_live(
    client: &Client,
    cache: &DryRunCache,
    metrics: &Metrics,
    desired: &[Desired],
    live: &LiveState,
    git_changes: bool,
) -> Result<HashMap<ObjectId, Value>, ApplyError> {
    let mut results = HashMap::new();
    for d in desired {
        let id = &d.manifest.id;
        let (Some(kind), Some(live_object)) = (&d.kind, find_live(id, &live.objects)) else {
            continue;
        };
        if !git_changes && git_changed(&d.manifest.body, live_object) {
            continue;
        }
        let body_hash = body_hash(&d.manifest.body);
        if let Some(result) = cache.get(id, live_object, &body_hash) {
            metrics.dry_run("cached");
            results.insert(id.clone(), result);
            continue;
        }
        let api = api_for(client, &kind.resource, id.namespace.as_deref());
        let mut params = PatchParams::apply(FIELD_MANAGER).force();
        params.dry_run = true;
        let answer = api
            .patch(&id.name, &params, &Patch::Apply(&d.manifest.body))
            .await
            .map_err(|source| classify(id, source))?;
        metrics.dry_run("sent");
        let result = serde_json::to_value(&answer).expect("serializes");
        cache.put(id, live_object, body_hash, &result);
        results.insert(id.clone(), result);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn id(name: &str) -> ObjectId {
        ObjectId {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: Some("team-a".into()),
            name: name.into(),
        }
    }

    /// A live object of version `rv` (other than every answer below).
    fn at(rv: &str) -> Value {
        json!({"metadata": {"resourceVersion": rv}})
    }

    #[test]
    fn an_answer_that_is_the_live_object_is_held_as_a_mark() {
        let cache = DryRunCache::default();
        let live = json!({
            "metadata": {"name": "web", "resourceVersion": "7", "managedFields": [
                {"manager": "setpoint", "operation": "Apply", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                {"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:metadata": {}}}
            ]},
            "spec": {"replicas": 5},
            "status": {"replicas": 5}
        });
        cache.put(&id("web"), &live, [1; 32], &live.clone());
        let held = cache.entries.lock().unwrap();
        assert!(matches!(held[&id("web")].answer, Answer::Live));
        drop(held);
        assert_eq!(cache.get(&id("web"), &live, &[1; 32]), Some(slim(&live)));
        // Drift: the answer differs from the live object, and is kept.
        let mut drifted = live.clone();
        drifted["metadata"]["resourceVersion"] = json!("8");
        drifted["spec"]["replicas"] = json!(1);
        cache.put(&id("web"), &drifted, [1; 32], &live);
        assert_eq!(cache.get(&id("web"), &drifted, &[1; 32]), Some(slim(&live)));
        assert_eq!(
            cache.get(&id("web"), &live, &[1; 32]),
            None,
            "version 7 is gone"
        );
    }

    #[test]
    fn an_applied_object_is_its_own_answer_until_it_moves() {
        let cache = DryRunCache::default();
        let body = json!({"spec": {"replicas": 5}});
        let live =
            json!({"metadata": {"name": "web", "resourceVersion": "9"}, "spec": {"replicas": 5}});
        cache.applied(&id("web"), &body, &live);
        assert_eq!(
            cache.get(&id("web"), &live, &body_hash(&body)),
            Some(slim(&live))
        );
        let other_body = json!({"spec": {"replicas": 6}});
        assert_eq!(cache.get(&id("web"), &live, &body_hash(&other_body)), None);
        let mut moved = live.clone();
        moved["metadata"]["resourceVersion"] = json!("10");
        assert_eq!(cache.get(&id("web"), &moved, &body_hash(&body)), None);
    }

    #[test]
    fn an_answer_is_returned_for_its_live_version_and_body_only() {
        let cache = DryRunCache::default();
        let answer = json!({"metadata": {"name": "web", "managedFields": [{"manager": "setpoint"}]},
                            "spec": {"replicas": 5, "template": {"spec": {"containers": [{"name": "web"}]}}}});
        cache.put(&id("web"), &at("41"), [1; 32], &answer);
        assert_eq!(cache.get(&id("web"), &at("41"), &[1; 32]), Some(answer));
        assert_eq!(
            cache.get(&id("web"), &at("42"), &[1; 32]),
            None,
            "the object moved"
        );
        assert_eq!(
            cache.get(&id("web"), &at("41"), &[2; 32]),
            None,
            "Git's body changed"
        );
        assert_eq!(cache.get(&id("api"), &at("41"), &[1; 32]), None);
    }

    #[test]
    fn the_cache_keeps_setpoints_fields_and_leaves_out_other_managers_and_the_status() {
        let cache = DryRunCache::default();
        let answer = json!({
            "metadata": {"name": "web", "managedFields": [
                {"manager": "setpoint", "operation": "Apply",
                 "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                {"manager": "kube-controller-manager", "operation": "Update",
                 "subresource": "status", "fieldsV1": {"f:status": {"f:replicas": {}}}}
            ]},
            "spec": {"replicas": 5},
            "status": {"replicas": 5}
        });
        cache.put(&id("web"), &at("41"), [1; 32], &answer);
        assert_eq!(
            cache.get(&id("web"), &at("41"), &[1; 32]),
            Some(json!({
                "metadata": {"name": "web", "managedFields": [
                    {"manager": "setpoint", "operation": "Apply",
                     "fieldsV1": {"f:spec": {"f:replicas": {}}}}
                ]},
                "spec": {"replicas": 5}
            }))
        );
        // A kind without a status subresource: Setpoint's apply owns it.
        let owned = json!({
            "metadata": {"managedFields": [{"manager": "setpoint", "operation": "Apply",
                                            "fieldsV1": {"f:status": {"f:phase": {}}}}]},
            "status": {"phase": "Ready"}
        });
        cache.put(&id("crd"), &at("1"), [1; 32], &owned);
        assert_eq!(cache.get(&id("crd"), &at("1"), &[1; 32]), Some(owned));
    }

    #[test]
    fn a_status_write_or_another_managers_annotation_keeps_the_answer_and_a_spec_change_does_not() {
        let cache = DryRunCache::default();
        let live = json!({
            "metadata": {"name": "web", "resourceVersion": "7", "generation": 2,
                "annotations": {"setpoint.dev/app": "team-a/web"},
                "managedFields": [{"manager": "setpoint", "operation": "Apply",
                    "fieldsV1": {"f:metadata": {"f:annotations": {"f:setpoint.dev/app": {}}},
                                 "f:spec": {"f:replicas": {}}}}]},
            "spec": {"replicas": 5}
        });
        cache.applied(&id("web"), &json!({"b": 1}), &live);
        let hash = body_hash(&json!({"b": 1}));
        // The controller rolled it out: its status and revision annotation.
        let mut rolled = live.clone();
        rolled["metadata"]["resourceVersion"] = json!("8");
        rolled["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!("2");
        rolled["status"] = json!({"observedGeneration": 2});
        assert!(cache.get(&id("web"), &rolled, &hash).is_some());
        // Someone scaled it (the generation moved), or changed Setpoint's
        // annotation.
        let mut scaled = rolled.clone();
        scaled["metadata"]["generation"] = json!(3);
        assert_eq!(cache.get(&id("web"), &scaled, &hash), None);
        let mut annotated = rolled.clone();
        annotated["metadata"]["annotations"]["setpoint.dev/app"] = json!("team-b/web");
        assert_eq!(cache.get(&id("web"), &annotated, &hash), None);
    }

    #[test]
    fn past_its_capacity_one_answer_makes_room() {
        let cache = DryRunCache::with_capacity(2);
        for name in ["a", "b"] {
            cache.put(&id(name), &at("1"), [0; 32], &json!({"n": name}));
        }
        // A new answer for a held object replaces it, evicting nothing.
        cache.put(&id("a"), &at("2"), [0; 32], &json!({"n": "a2"}));
        assert_eq!(cache.len(), 2);
        assert_eq!(
            cache.get(&id("b"), &at("1"), &[0; 32]),
            Some(json!({"n": "b"}))
        );
        cache.put(&id("c"), &at("1"), [0; 32], &json!({"n": "c"}));
        assert_eq!(cache.len(), 2);
        assert_eq!(
            cache.get(&id("c"), &at("1"), &[0; 32]),
            Some(json!({"n": "c"}))
        );
    }
}
