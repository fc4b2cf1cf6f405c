//! Plan: the decision at the heart of a reconcile. Each desired object
//! (rendered from Git, then prepared) is compared with its live copy and gets
//! one step: create it, update it (because Git changed or because the cluster
//! drifted), leave it alone; live objects of this Application that Git no
//! longer has are pruned. Pure: no client, no I/O, so every case is a unit
//! test on plain JSON.
//!
//! The comparison follows server-side apply: only the fields Git sets are
//! compared, so what the API server and other controllers add (defaults,
//! `status`, extra list items) is never drift. A drifted field is reported
//! with the manager that last wrote it, read from `metadata.managedFields`.

mod attribution;
mod compare;
mod quantity;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt;

use serde_json::Value;

use compare::diff;

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

/// Compares desired with live and decides one step per object.
pub fn plan(desired: &[Manifest], live: &LiveState) -> Plan {
    let mut steps: Vec<Step> = desired
        .iter()
        .map(|manifest| Step {
            id: manifest.id.clone(),
            action: decide(manifest, live),
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

fn decide(manifest: &Manifest, live: &LiveState) -> Action {
    let Some(live_object) = find_live(&manifest.id, &live.objects) else {
        let deleted_live = live
            .previously_applied
            .iter()
            .any(|id| id.same_object(&manifest.id));
        return Action::Create { deleted_live };
    };
    let secret = manifest.id.group.is_empty() && manifest.id.kind == "Secret";
    let desired = if secret {
        fold_string_data(&manifest.body)
    } else {
        Cow::Borrowed(&manifest.body)
    };
    let mut drift = diff(&desired, live_object);
    if secret {
        drift.iter_mut().for_each(redact);
    }
    let live_hash = manifest_hash(live_object);
    if live_hash.is_none() || live_hash != manifest_hash(&manifest.body) {
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

/// A Secret as the API server stores it: `stringData` is write-only, folded
/// into `data` base64-encoded (winning over `data`), so comparing it as Git
/// wrote it would be drift forever.
fn fold_string_data(body: &Value) -> Cow<'_, Value> {
    let Some(string_data) = body.get("stringData").and_then(Value::as_object) else {
        return Cow::Borrowed(body);
    };
    let mut folded = body.clone();
    let mut data = folded
        .get("data")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (key, value) in string_data {
        if let Some(text) = value.as_str() {
            data.insert(key.clone(), Value::String(base64(text.as_bytes())));
        }
    }
    if let Some(object) = folded.as_object_mut() {
        object.remove("stringData");
        object.insert("data".into(), Value::Object(data));
    }
    Cow::Owned(folded)
}

/// Standard base64 with padding, as Secret `data` holds it.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let triple = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(
                    ALPHABET[((triple >> (18 - 6 * i)) & 63) as usize],
                ));
            } else {
                out.push('=');
            }
        }
    }
    out
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
fn find_live<'a>(id: &ObjectId, objects: &'a HashMap<ObjectId, Value>) -> Option<&'a Value> {
    if let Some(object) = objects.get(id) {
        return Some(object);
    }
    objects
        .iter()
        .filter(|(key, _)| key.same_object(id))
        .min_by_key(|(key, _)| *key)
        .map(|(_, v)| v)
}

fn manifest_hash(object: &Value) -> Option<&str> {
    object
        .get("metadata")?
        .get("annotations")?
        .get(HASH_ANNOTATION)?
        .as_str()
}
