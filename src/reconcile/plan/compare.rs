//! The comparison of one live object with the result of a server-side apply
//! dry run of Git's version of it (field manager `setpoint`).
//!
//! The dry run is the API server's own answer to "what would this object be
//! after Setpoint applied Git's": quantities in canonical form, defaults
//! filled in, mutating admission run, list items merged by the keys the
//! schema declares. Its `managedFields` entry for `setpoint` is the set of
//! fields Git sets, written by the API server in its own terms (`f:` a
//! field, `k:{…}` a list item by its keys, `v:` a set member, `i:` a
//! position). The comparison walks that set and compares, field by field,
//! the dry run's value with the live one: nothing is guessed, so a
//! difference is a real one.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::attribution::{FieldsEntry, blame};
use super::{Drift, FIELD_MANAGER, HASH_ANNOTATION, shown};

/// A drift found by the comparison, before it is rendered and attributed.
pub(super) struct Found<'a> {
    /// The fieldsV1 keys from the root: `f:spec`, `k:{"name":"app"}`, …
    pub(super) path: Vec<&'a str>,
    /// The JSON pointer of the field in the dry run (or in live, where the
    /// dry run has no such list item), for `ignoreDifferences.jsonPointers`.
    pub(super) pointer: String,
    pub(super) live: Option<&'a Value>,
    pub(super) desired: Option<&'a Value>,
}

/// The fields Setpoint's apply would own: the dry run's `setpoint` Apply
/// entry. None when it has none (the dry run answered without it).
pub(super) fn applied_fields(dry_run: &Value) -> Option<&Value> {
    dry_run
        .pointer("/metadata/managedFields")?
        .as_array()?
        .iter()
        .find(|entry| {
            entry.get("manager").and_then(Value::as_str) == Some(FIELD_MANAGER)
                && entry.get("operation").and_then(Value::as_str) == Some("Apply")
                && entry.get("subresource").is_none_or(Value::is_null)
        })?
        .get("fieldsV1")
}

/// Every field of `fields` (Setpoint's, from `applied_fields`) whose
/// dry-run value differs from live.
pub(super) fn differences<'a>(
    fields: &'a Value,
    dry_run: &'a Value,
    live: &'a Value,
) -> Vec<Found<'a>> {
    let mut found = Vec::new();
    let Value::Object(fields) = fields else {
        return found;
    };
    walk(
        fields,
        Some(dry_run),
        Some(live),
        &mut Vec::new(),
        &mut String::new(),
        &mut found,
    );
    found
}

/// Renders and attributes what `differences` found.
pub(super) fn drifts(found: Vec<Found<'_>>, managers: &[FieldsEntry<'_>]) -> Vec<Drift> {
    found
        .into_iter()
        .map(|f| Drift {
            path: render_path(&f.path),
            manager: blame(managers, &f.path),
            live: f.live.cloned(),
            desired: f.desired.cloned(),
        })
        .collect()
}

fn walk<'a>(
    fields: &'a Map<String, Value>,
    desired: Option<&'a Value>,
    live: Option<&'a Value>,
    path: &mut Vec<&'a str>,
    pointer: &mut String,
    found: &mut Vec<Found<'a>>,
) {
    for (key, child) in fields {
        if key == "." || skipped(path, key) {
            continue;
        }
        let (desired_value, live_value, step) = match select(key, desired, live) {
            Some(selected) => selected,
            None => continue,
        };
        let mark = pointer.len();
        pointer.push_str(&step);
        path.push(key);
        let leaf = child
            .as_object()
            .is_none_or(|map| map.keys().all(|k| k == "."));
        let live_value = live_value.filter(|v| !v.is_null());
        let desired_value = desired_value.filter(|v| !v.is_null());
        match (desired_value, live_value, child) {
            // A whole list item Git sets is missing from live: one drift for
            // the item, not one per field.
            (Some(_), None, _) if key.starts_with("k:") || key.starts_with("v:") => {
                found.push(Found {
                    path: path.clone(),
                    pointer: pointer.clone(),
                    live: None,
                    desired: desired_value,
                })
            }
            (_, _, Value::Object(children)) if !leaf => {
                if desired_value.is_some() && live_value.is_none() && !is_empty(desired_value) {
                    found.push(Found {
                        path: path.clone(),
                        pointer: pointer.clone(),
                        live: None,
                        desired: desired_value,
                    });
                } else {
                    walk(children, desired_value, live_value, path, pointer, found);
                }
            }
            _ => {
                if desired_value != live_value && !(is_empty(desired_value) && live_value.is_none())
                {
                    found.push(Found {
                        path: path.clone(),
                        pointer: pointer.clone(),
                        live: live_value,
                        desired: desired_value,
                    });
                }
            }
        }
        path.pop();
        pointer.truncate(mark);
    }
}

/// An empty map or list: the API server drops them, so one that is absent
/// on the other side is the same.
fn is_empty(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::Object(map)) => map.is_empty(),
        Some(Value::Array(items)) => items.is_empty(),
        _ => false,
    }
}

/// The values one fieldsV1 key selects in the dry run and in live, and the
/// JSON pointer step to it (positions as in the dry run when it has the item).
fn select<'a>(
    key: &str,
    desired: Option<&'a Value>,
    live: Option<&'a Value>,
) -> Option<(Option<&'a Value>, Option<&'a Value>, String)> {
    if let Some(name) = key.strip_prefix("f:") {
        let get = |value: Option<&'a Value>| value.and_then(|v| v.get(name));
        return Some((get(desired), get(live), format!("/{}", escape(name))));
    }
    if let Some(index) = key.strip_prefix("i:") {
        let index: usize = index.parse().ok()?;
        let get = |value: Option<&'a Value>| value.and_then(|v| v.get(index));
        return Some((get(desired), get(live), format!("/{index}")));
    }
    let find = |value: Option<&'a Value>| -> Option<(usize, &'a Value)> {
        let items = value?.as_array()?;
        items
            .iter()
            .enumerate()
            .find(|(_, item)| item_matches(key, item))
    };
    let (d, l) = (find(desired), find(live));
    let position = d.or(l).map_or(0, |(i, _)| i);
    Some((d.map(|(_, v)| v), l.map(|(_, v)| v), format!("/{position}")))
}

/// Whether a list item is the one a `k:{…}` (its key fields) or `v:…` (its
/// value) fieldsV1 key names.
pub(super) fn item_matches(key: &str, item: &Value) -> bool {
    if let Some(keys) = key.strip_prefix("k:") {
        let Ok(Value::Object(keys)) = serde_json::from_str::<Value>(keys) else {
            return false;
        };
        return !keys.is_empty()
            && keys
                .iter()
                .all(|(field, value)| item.get(field) == Some(value));
    }
    if let Some(value) = key.strip_prefix("v:") {
        return serde_json::from_str::<Value>(value).is_ok_and(|value| &value == item);
    }
    false
}

/// Fields that are not Setpoint's to compare: the hash is compared on its
/// own (a different hash is a Git change, not drift).
fn skipped(path: &[&str], key: &str) -> bool {
    matches!(path, ["f:metadata", "f:annotations"])
        && key.strip_prefix("f:") == Some(HASH_ANNOTATION)
}

/// `~` and `/` escaped, as RFC 6901 wants in a pointer.
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// `spec.template.spec.containers[name=app].image`,
/// `metadata.annotations["example.com/x"]`, `ports[containerPort=80,protocol=TCP]`.
pub(super) fn render_path(path: &[&str]) -> String {
    let mut out = String::new();
    for key in path {
        if let Some(name) = key.strip_prefix("f:") {
            if is_identifier(name) {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(name);
            } else {
                let _ = write!(out, "[{}]", Value::String(name.to_string()));
            }
        } else if let Some(index) = key.strip_prefix("i:") {
            let _ = write!(out, "[{index}]");
        } else if let Some(keys) = key.strip_prefix("k:") {
            let keys: Map<String, Value> = serde_json::from_str(keys).unwrap_or_default();
            let shown_keys: Vec<String> = keys
                .iter()
                .map(|(field, value)| format!("{field}={}", shown(Some(value))))
                .collect();
            let _ = write!(out, "[{}]", shown_keys.join(","));
        } else if let Some(value) = key.strip_prefix("v:") {
            let value: Value = serde_json::from_str(value).unwrap_or(Value::Null);
            let _ = write!(out, "[{}]", shown(Some(&value)));
        }
    }
    if out.is_empty() {
        out.push('.');
    }
    out
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
