//! Drift attribution: the field manager that last wrote a drifted field,
//! read from `metadata.managedFields`.

use serde_json::Value;

use super::FIELD_MANAGER;

/// One entry of `metadata.managedFields` other than Setpoint's own.
pub(super) struct FieldsEntry<'a> {
    pub(super) manager: &'a str,
    operation: &'a str,
    subresource: &'a str,
    time: &'a str,
    pub(super) fields: &'a Value,
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
pub(super) fn blame(managers: &[FieldsEntry<'_>], path: &[&str]) -> Option<String> {
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

/// Whether a fieldsV1 tree has `path` (its keys as the API server writes
/// them, so they compare exactly), or a leaf or an item marker above it.
pub(super) fn owns(fields: &Value, path: &[&str]) -> Option<Ownership> {
    let mut node = fields.as_object()?;
    for (depth, key) in path.iter().enumerate() {
        match node.get(*key) {
            Some(next) => node = next.as_object()?,
            None if depth > 0 && (node.is_empty() || node.contains_key(".")) => {
                return Some(Ownership::Subtree);
            }
            None => return None,
        }
    }
    Some(Ownership::Field)
}
