//! Drift attribution: the field manager that last wrote a drifted field,
//! read from `metadata.managedFields`.

use serde_json::{Map, Value};

use super::FIELD_MANAGER;
use super::compare::{Segment, loose_eq};

/// One entry of `metadata.managedFields` other than Setpoint's own.
pub(super) struct FieldsEntry<'a> {
    manager: &'a str,
    operation: &'a str,
    subresource: &'a str,
    time: &'a str,
    fields: &'a Value,
}

pub(super) fn field_managers(live: &Value) -> Vec<FieldsEntry<'_>> {
    let Some(entries) = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
    else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let manager = entry.get("manager")?.as_str()?;
            (manager != FIELD_MANAGER).then_some(FieldsEntry {
                manager,
                operation: entry
                    .get("operation")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                subresource: entry
                    .get("subresource")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                time: entry
                    .get("time")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
                fields: entry.get("fieldsV1").unwrap_or(&Value::Null),
            })
        })
        .collect()
}

/// Who changed a drifted field: the latest manager other than Setpoint that
/// owns it, one owning the field itself before one owning a whole subtree
/// above it. A removed field has no owner, so then it is whoever last wrote
/// the object with an Update, except through `status`: controllers write it
/// all the time and never remove what Git sets.
pub(super) fn blame(managers: &[FieldsEntry<'_>], path: &[Segment<'_>]) -> Option<String> {
    let latest = |ownership: Ownership| {
        managers
            .iter()
            .filter(|entry| owns(entry.fields, path) == Some(ownership))
            .max_by_key(|entry| entry.time)
    };
    latest(Ownership::Field)
        .or_else(|| latest(Ownership::Subtree))
        .or_else(|| {
            managers
                .iter()
                .filter(|entry| entry.operation == "Update" && entry.subresource != "status")
                .max_by_key(|entry| entry.time)
        })
        .map(|entry| entry.manager.to_string())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ownership {
    /// The fieldsV1 tree has the whole path.
    Field,
    /// It has a leaf (`{}`) or a `.` (the item itself) at a prefix.
    Subtree,
}

pub(super) fn owns(fields: &Value, path: &[Segment<'_>]) -> Option<Ownership> {
    let mut node = fields.as_object()?;
    for (depth, segment) in path.iter().enumerate() {
        match child(node, segment) {
            Some(next) => node = next.as_object()?,
            None if depth > 0 && (node.is_empty() || node.contains_key(".")) => {
                return Some(Ownership::Subtree);
            }
            None => return None,
        }
    }
    Some(Ownership::Field)
}

/// The fieldsV1 node for one path segment: `f:key`, `k:{"name":"app"}`, `i:0`.
pub(super) fn child<'v>(node: &'v Map<String, Value>, segment: &Segment<'_>) -> Option<&'v Value> {
    match segment {
        Segment::Key(key) => node.get(&format!("f:{key}")),
        Segment::Index(index) => node.get(&format!("i:{index}")),
        Segment::Item { item, .. } => node.iter().find_map(|(name, child)| {
            let key: Map<String, Value> = serde_json::from_str(name.strip_prefix("k:")?).ok()?;
            let matches = !key.is_empty()
                && key.iter().all(|(field, value)| match item.get(field) {
                    Some(own) => loose_eq(own, value),
                    None => field == "protocol" && value == "TCP",
                });
            matches.then_some(child)
        }),
    }
}
