//! Ownership: an object whose `setpoint.dev/app` annotation names another
//! Application is never applied, adopted or pruned by this one (pure).
//! Objects that name no owner may still be adopted, within what the
//! Application's identity may do.

use crate::manifest::{Manifest, ObjectId};
use crate::reconcile::plan::FIELD_MANAGER;
use crate::reconcile::plan::LiveState;
use crate::reconcile::prepare::APP_ANNOTATION;

/// `metadata`'s labels and annotations cut to the keys Setpoint's own
/// `managedFields` entry owns: what others add (a controller's revision
/// annotation, a `kubectl annotate` of a key Git does not set) is theirs
/// and no apply of Setpoint's changes it. None when Setpoint has no entry.
pub fn setpoint_labels_and_annotations(
    metadata: &serde_json::Map<String, serde_json::Value>,
) -> Option<[serde_json::Map<String, serde_json::Value>; 2]> {
    let owned = metadata
        .get("managedFields")
        .and_then(serde_json::Value::as_array)?
        .iter()
        .find(|e| e.get("manager").and_then(serde_json::Value::as_str) == Some(FIELD_MANAGER))?
        .pointer("/fieldsV1/f:metadata");
    Some(["labels", "annotations"].map(|map| {
        let keys = owned.and_then(|o| o.get(format!("f:{map}")));
        metadata
            .get(map)
            .and_then(serde_json::Value::as_object)
            .into_iter()
            .flatten()
            .filter(|(key, _)| keys.is_some_and(|keys| keys.get(format!("f:{key}")).is_some()))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }))
}

/// A desired object that the cluster holds as another Application's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Foreign {
    pub id: ObjectId,
    /// `<namespace>/<name>` of the Application that owns it.
    pub owner: String,
}

impl std::fmt::Display for Foreign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} belongs to Application {}", self.id, self.owner)
    }
}

/// The desired objects that live objects owned by another Application than
/// `owner` (`<namespace>/<name>`) stand in the way of.
pub fn foreign(desired: &[Manifest], live: &LiveState, owner: &str) -> Vec<Foreign> {
    desired
        .iter()
        .filter_map(|manifest| {
            let object = live.objects.get(&manifest.id).or_else(|| {
                live.objects
                    .iter()
                    .find(|(id, _)| id.same_object(&manifest.id))
                    .map(|(_, object)| object)
            })?;
            let named = object["metadata"]["annotations"][APP_ANNOTATION].as_str()?;
            (named != owner).then(|| Foreign {
                id: manifest.id.clone(),
                owner: named.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashMap;

    fn manifest(name: &str) -> Manifest {
        Manifest {
            id: ObjectId {
                group: String::new(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: Some("team-a".into()),
                name: name.into(),
            },
            origin: crate::manifest::Origin {
                file: "cm.yaml".into(),
                document: 0,
            },
            body: json!({"apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": name, "namespace": "team-a"}}),
        }
    }

    fn live(objects: &[(&Manifest, Option<&str>)]) -> LiveState {
        let objects: HashMap<ObjectId, serde_json::Value> = objects
            .iter()
            .map(|(m, owner)| {
                let mut body = m.body.clone();
                if let Some(owner) = owner {
                    body["metadata"]["annotations"] = json!({ APP_ANNOTATION: owner });
                }
                (m.id.clone(), body)
            })
            .collect();
        LiveState {
            objects,
            ..Default::default()
        }
    }

    #[test]
    fn objects_of_another_application_are_foreign() {
        let (mine, theirs, unowned, absent) = (
            manifest("mine"),
            manifest("theirs"),
            manifest("unowned"),
            manifest("absent"),
        );
        let live = live(&[
            (&mine, Some("team-a/web")),
            (&theirs, Some("team-b/api")),
            (&unowned, None),
        ]);
        let found = foreign(
            &[mine, theirs.clone(), unowned, absent],
            &live,
            "team-a/web",
        );
        assert_eq!(
            found,
            vec![Foreign {
                id: theirs.id,
                owner: "team-b/api".into()
            }]
        );
        assert_eq!(
            found[0].to_string(),
            "ConfigMap team-a/theirs belongs to Application team-b/api"
        );
    }
}
