//! Plan: the decision at the heart of a reconcile. Each desired object
//! (rendered from Git, then prepared) is compared with its live copy and gets
//! one step: create it, update it (because Git changed or because the cluster
//! drifted), leave it alone; live objects of this Application that Git no
//! longer has are pruned. Pure: no client, no I/O, so every case is a unit
//! test on plain JSON.
//!
//! The comparison is a server-side diff (`compare.rs`): the live object
//! against the API server's dry run of applying Git's object, on the fields
//! Setpoint's apply owns. The dry runs are gathered before (`dry_run.rs`)
//! and are an input here, like the live objects. So normalization
//! (`1000m` and `1`, `1024Mi` and `1Gi`), defaults, list keys and mutating
//! admission are never drift. A drifted field is reported with the manager
//! that last wrote it, read from `metadata.managedFields`
//! (`attribution.rs`); `spec.ignoreDifferences` (`ignore.rs`) takes fields
//! out of both the comparison and the applied object.

mod attribution;
mod compare;
mod ignore;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt;

use serde_json::Value;

use attribution::field_managers;
use compare::{applied_fields, differences, drifts};
use ignore::Ignored;
pub use ignore::applied_body;

use crate::api::IgnoreDifferences;

use crate::manifest::{Manifest, ObjectId};

/// The one field manager Setpoint applies as; its own `managedFields` entry
/// is never blamed for drift.
pub const FIELD_MANAGER: &str = "setpoint";

/// Hash of the Git manifest, set on every applied object: a live hash that
/// differs from the desired one means Git changed, not the cluster.
pub const HASH_ANNOTATION: &str = "setpoint.dev/manifest-hash";

/// What the cluster holds, as fetched for one reconcile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveState {
    /// Live objects (full JSON as the API server returns them, including
    /// metadata.managedFields), keyed by the ObjectId of the desired manifest
    /// they were fetched for, plus the owned ones.
    pub objects: HashMap<ObjectId, Value>,
    /// Live objects that carry this Application's ownership label and
    /// annotation (prune candidates).
    pub owned: BTreeSet<ObjectId>,
    /// Objects this Application applied before (from its last status), to tell
    /// "new in Git" from "deleted by someone".
    pub previously_applied: BTreeSet<ObjectId>,
    /// For each desired object that is live, keyed by its desired id: the
    /// API server's answer to a server-side apply dry run of it (field
    /// manager `setpoint`), with its `managedFields`. A live object without
    /// one is compared by its hash only.
    pub dry_runs: HashMap<ObjectId, Value>,
}

/// Every step of one reconcile: one per desired manifest, in the order given,
/// then the prunes, sorted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub steps: Vec<Step>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub id: ObjectId,
    pub action: Action,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Not live. `deleted_live`: this Application applied it before, so
    /// someone deleted it (drift, healed only with selfHeal), rather than Git
    /// adding it.
    Create {
        deleted_live: bool,
    },
    /// Live but different. `drift` lists the fields Git sets that the live
    /// object does not match; it may be empty when only the hash changed.
    Update {
        cause: Cause,
        drift: Vec<Drift>,
    },
    Unchanged,
    /// Owned by this Application, no longer in Git.
    Prune,
}

/// Why an object needs applying: the policy syncs a Git change on its own
/// but corrects drift only with selfHeal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The live hash annotation differs from the desired one, or is absent.
    GitChanged,
    /// Same hash, but a field Git sets was changed in the cluster.
    Drift,
}

/// One field where live differs from Git, with who changed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Drift {
    /// `spec.replicas`, `spec.template.spec.containers[name=app].image`,
    /// `metadata.annotations["example.com/x"]`.
    pub path: String,
    /// None when the field is absent from the live object.
    pub live: Option<Value>,
    /// None when Git says the field must be absent (a `null`).
    pub desired: Option<Value>,
    /// The field manager that last wrote it, from `managedFields`.
    pub manager: Option<String>,
}

/// Values in a drift line are cut to this many characters: the line goes into
/// Events and status messages, not a full diff.
const MAX_SHOWN: usize = 80;

impl fmt::Display for Drift {
    /// `spec.replicas 1→5 (changed by kubectl)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}→{} (changed by {})",
            self.path,
            shown(self.live.as_ref()),
            shown(self.desired.as_ref()),
            self.manager.as_deref().unwrap_or("unknown"),
        )
    }
}

pub(super) fn shown(value: Option<&Value>) -> String {
    let text = match value {
        None => return "<none>".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    if text.chars().count() <= MAX_SHOWN {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_SHOWN - 1).collect();
    cut.push('…');
    cut
}

impl Plan {
    /// Nothing to create, update or prune: the Application is Synced.
    pub fn is_in_sync(&self) -> bool {
        self.steps
            .iter()
            .all(|step| step.action == Action::Unchanged)
    }

    pub fn creates(&self) -> usize {
        self.count(|action| matches!(action, Action::Create { .. }))
    }

    pub fn updates(&self) -> usize {
        self.count(|action| matches!(action, Action::Update { .. }))
    }

    pub fn unchanged(&self) -> usize {
        self.count(|action| matches!(action, Action::Unchanged))
    }

    pub fn prunes(&self) -> usize {
        self.count(|action| matches!(action, Action::Prune))
    }

    /// Every drifted field with the object it belongs to, for Events and logs.
    pub fn drift(&self) -> impl Iterator<Item = (&ObjectId, &Drift)> {
        self.steps.iter().flat_map(|step| match &step.action {
            Action::Update { drift, .. } => drift.iter().map(|d| (&step.id, d)).collect(),
            _ => Vec::new(),
        })
    }

    fn count(&self, pred: impl Fn(&Action) -> bool) -> usize {
        self.steps.iter().filter(|step| pred(&step.action)).count()
    }
}

/// Compares desired with live and decides one step per object; `ignore` is
/// the Application's `spec.ignoreDifferences`.
pub fn plan(desired: &[Manifest], live: &LiveState, ignore: &[IgnoreDifferences]) -> Plan {
    let mut steps: Vec<Step> = desired
        .iter()
        .map(|manifest| Step {
            id: manifest.id.clone(),
            action: decide(manifest, live, ignore),
        })
        .collect();
    // `owned` is a BTreeSet, so prunes come out sorted. Only objects that carry
    // this Application's marks are candidates: a live object Git does not name
    // is never deleted on a guess.
    let prunes = live
        .owned
        .iter()
        .filter(|owned| {
            !desired
                .iter()
                .any(|manifest| manifest.id.same_object(owned))
        })
        .map(|owned| Step {
            id: owned.clone(),
            action: Action::Prune,
        });
    steps.extend(prunes);
    Plan { steps }
}

fn decide(manifest: &Manifest, live: &LiveState, ignore: &[IgnoreDifferences]) -> Action {
    let Some(live_object) = find_live(&manifest.id, &live.objects) else {
        let deleted_live = live
            .previously_applied
            .iter()
            .any(|id| id.same_object(&manifest.id));
        return Action::Create { deleted_live };
    };
    let drift = match live.dry_runs.get(&manifest.id) {
        Some(dry_run) => drift(manifest, dry_run, live_object, ignore),
        None => Vec::new(),
    };
    if git_changed(&manifest.body, live_object) {
        Action::Update {
            cause: Cause::GitChanged,
            drift,
        }
    } else if drift.is_empty() {
        Action::Unchanged
    } else {
        Action::Update {
            cause: Cause::Drift,
            drift,
        }
    }
}

/// The fields Setpoint's apply owns whose dry-run value differs from live,
/// less those the Application ignores.
fn drift(
    manifest: &Manifest,
    dry_run: &Value,
    live_object: &Value,
    ignore: &[IgnoreDifferences],
) -> Vec<Drift> {
    let Some(fields) = applied_fields(dry_run) else {
        return Vec::new();
    };
    let secret = manifest.id.group.is_empty() && manifest.id.kind == "Secret";
    let fields = if secret {
        fold_string_data(fields)
    } else {
        Cow::Borrowed(fields)
    };
    let ignored = Ignored::for_object(ignore, &manifest.id);
    let managers = field_managers(live_object);
    let found = differences(&fields, dry_run, live_object)
        .into_iter()
        .filter(|found| !ignored.covers(found, &managers))
        .collect();
    let mut drift = drifts(found, &managers);
    if secret {
        drift.iter_mut().for_each(redact);
    }
    drift
}

/// A Secret's `stringData` is write-only: the API server folds it into
/// `data`, but records Setpoint's apply as owning `f:stringData`. Its keys
/// are compared under `data`, where they live.
fn fold_string_data(fields: &Value) -> Cow<'_, Value> {
    let Some(string_data) = fields.get("f:stringData").and_then(Value::as_object) else {
        return Cow::Borrowed(fields);
    };
    let mut folded = fields.clone();
    if let Some(map) = folded.as_object_mut() {
        map.remove("f:stringData");
        let data = map
            .entry("f:data")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(data) = data.as_object_mut() {
            for (key, child) in string_data {
                data.insert(key.clone(), child.clone());
            }
        }
    }
    Cow::Owned(folded)
}

/// Secret values go into Events and status: a drift line names the key,
/// never the value.
fn redact(drift: &mut Drift) {
    let under_data = ["data", "stringData"].iter().any(|field| {
        drift.path == *field
            || drift.path.starts_with(&format!("{field}."))
            || drift.path.starts_with(&format!("{field}["))
    });
    if under_data {
        for value in [&mut drift.live, &mut drift.desired].into_iter().flatten() {
            *value = Value::String("<redacted>".into());
        }
    }
}

/// The live copy of a desired object, possibly fetched at another version.
/// The exact id wins; among other versions the smallest id, so the choice
/// does not depend on HashMap order.
pub fn find_live<'a>(id: &ObjectId, objects: &'a HashMap<ObjectId, Value>) -> Option<&'a Value> {
    if let Some(object) = objects.get(id) {
        return Some(object);
    }
    objects
        .iter()
        .filter(|(key, _)| key.same_object(id))
        .min_by_key(|(key, _)| *key)
        .map(|(_, v)| v)
}

/// Whether Git's `body` for an object differs from what was last applied
/// to `live` (its hash annotation), so that its plan is an update.
pub fn git_changed(body: &Value, live: &Value) -> bool {
    let live_hash = manifest_hash(live);
    live_hash.is_none() || live_hash != manifest_hash(body)
}

fn manifest_hash(object: &Value) -> Option<&str> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(HASH_ANNOTATION)?
        .as_str()
}
