//! `spec.ignoreDifferences`, as Argo CD names it: fields an Application
//! neither compares nor applies, named by JSON pointer (`/spec/replicas`) or
//! by the field managers that own them in the live object (an HPA,
//! `kube-controller-manager`).
//!
//! Two pure functions: `Ignored::covers` drops a found difference from the
//! plan, and `applied_body` leaves the fields out of the object Setpoint
//! applies, so server-side apply neither overwrites them nor keeps Setpoint
//! as their owner.

use serde_json::Value;

use super::FIELD_MANAGER;
use super::attribution::FieldsEntry;
use super::compare::{Found, item_matches};
use crate::api::IgnoreDifferences;
use crate::manifest::ObjectId;

/// The rules of an Application that match one object.
#[derive(Debug, Default)]
pub(super) struct Ignored<'a> {
    pointers: Vec<&'a str>,
    managers: Vec<&'a str>,
}

/// Whether a rule names this object: group and kind exactly (or `*`), and
/// name and namespace when the rule gives them.
fn matches(rule: &IgnoreDifferences, id: &ObjectId) -> bool {
    let same = |pattern: &str, value: &str| pattern == "*" || pattern == value;
    same(&rule.group, &id.group)
        && same(&rule.kind, &id.kind)
        && rule.name.as_deref().is_none_or(|name| name == id.name)
        && rule
            .namespace
            .as_deref()
            .is_none_or(|ns| Some(ns) == id.namespace.as_deref())
}

impl<'a> Ignored<'a> {
    pub(super) fn for_object(rules: &'a [IgnoreDifferences], id: &ObjectId) -> Ignored<'a> {
        let mut ignored = Ignored::default();
        for rule in rules.iter().filter(|rule| matches(rule, id)) {
            ignored
                .pointers
                .extend(rule.json_pointers.iter().map(String::as_str));
            ignored
                .managers
                .extend(rule.managed_fields_managers.iter().map(String::as_str));
        }
        ignored
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pointers.is_empty() && self.managers.is_empty()
    }

    /// A difference at or under an ignored pointer, or on a field a listed
    /// manager owns in the live object, is not drift.
    pub(super) fn covers(&self, found: &Found<'_>, live_managers: &[FieldsEntry<'_>]) -> bool {
        self.pointers
            .iter()
            .any(|pointer| under(&found.pointer, pointer))
            || live_managers.iter().any(|entry| {
                self.managers.contains(&entry.manager) && owns_value(entry.fields, &found.path)
            })
    }
}

/// Whether a manager owns the value at `path`: the field itself, or an
/// atomic value above it (a leaf `{}`). Owning a map's or an item's
/// existence (`.`) is not owning its fields.
fn owns_value(fields: &Value, path: &[&str]) -> bool {
    let mut node = fields;
    for (depth, key) in path.iter().enumerate() {
        let Some(map) = node.as_object() else {
            return false;
        };
        match map.get(*key) {
            Some(next) => node = next,
            None => return depth > 0 && map.is_empty(),
        }
    }
    true
}

/// Whether `pointer` is `prefix` or below it.
fn under(pointer: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty()
        || pointer == prefix
        || pointer
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The object Setpoint applies for `desired` (Git's, prepared), given the
/// live copy and the Application's rules:
///
/// - not live yet: Git's object whole. Nothing owns the fields yet, and an
///   HPA needs the Deployment to exist with Git's replicas first (Argo CD's
///   `RespectIgnoreDifferences` also applies everything on creation);
/// - a field a listed manager owns in live: left out. With server-side apply
///   a field left out of the applied configuration is no longer Setpoint's,
///   and since another manager owns it the API server keeps its value;
/// - a field at an ignored pointer: left out too when another manager owns
///   it; when only Setpoint does (it set the field on the first apply) the
///   live value is applied instead, because a field Setpoint alone owns and
///   no longer applies would be deleted by the API server.
pub fn applied_body(
    rules: &[IgnoreDifferences],
    id: &ObjectId,
    desired: &Value,
    live: Option<&Value>,
) -> Value {
    let ignored = Ignored::for_object(rules, id);
    let mut body = desired.clone();
    let Some(live) = live else {
        return body;
    };
    if ignored.is_empty() {
        return body;
    }
    let entries = live
        .pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    for entry in entries {
        let manager = entry.get("manager").and_then(Value::as_str);
        if manager.is_some_and(|m| ignored.managers.contains(&m))
            && let Some(fields) = entry.get("fieldsV1")
        {
            remove_fields(&mut body, fields);
        }
    }
    for pointer in &ignored.pointers {
        if body.pointer(pointer).is_none() {
            continue;
        }
        let tokens = tokens(pointer);
        let owned_by_another = entries.iter().any(|entry| {
            entry.get("manager").and_then(Value::as_str) != Some(FIELD_MANAGER)
                && entry
                    .get("fieldsV1")
                    .is_some_and(|fields| owns_pointer(fields, live, &tokens))
        });
        match live.pointer(pointer) {
            Some(value) if !owned_by_another => {
                if let Some(slot) = body.pointer_mut(pointer) {
                    *slot = value.clone();
                }
            }
            _ => remove_pointer(&mut body, &tokens),
        }
    }
    body
}

/// RFC 6901 tokens of a pointer.
fn tokens(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .skip(1)
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect()
}

fn remove_pointer(body: &mut Value, tokens: &[String]) {
    let Some((last, parents)) = tokens.split_last() else {
        return;
    };
    let mut node = body;
    for token in parents {
        node = match node {
            Value::Object(map) => match map.get_mut(token) {
                Some(next) => next,
                None => return,
            },
            Value::Array(items) => match token.parse::<usize>().ok().and_then(|i| items.get_mut(i))
            {
                Some(next) => next,
                None => return,
            },
            _ => return,
        };
    }
    match node {
        Value::Object(map) => {
            map.remove(last);
        }
        Value::Array(items) => {
            if let Some(i) = last.parse::<usize>().ok().filter(|i| *i < items.len()) {
                items.remove(i);
            }
        }
        _ => {}
    }
}

/// Whether a manager's fieldsV1 tree covers the field a pointer names in
/// `live` (list positions resolved to the item's `k:`, `v:` or `i:` key).
fn owns_pointer(fields: &Value, live: &Value, tokens: &[String]) -> bool {
    let mut node = fields;
    let mut value = live;
    for (depth, token) in tokens.iter().enumerate() {
        let Some(map) = node.as_object() else {
            return false;
        };
        let (next_node, next_value) = match value {
            Value::Array(items) => {
                let Some((index, item)) = token
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get(i).map(|item| (i, item)))
                else {
                    return false;
                };
                let position = format!("i:{index}");
                let child = map
                    .iter()
                    .find(|(key, _)| *key == &position || item_matches(key, item))
                    .map(|(_, child)| child);
                (child, item)
            }
            _ => (
                map.get(&format!("f:{token}")),
                value.get(token).unwrap_or(&Value::Null),
            ),
        };
        match next_node {
            Some(child) => {
                node = child;
                value = next_value;
            }
            None => return depth > 0 && map.is_empty(),
        }
    }
    true
}

/// Removes from `body` the fields a fieldsV1 tree lists, keeping the key
/// fields of list items (an item without its key cannot be applied).
fn remove_fields(body: &mut Value, fields: &Value) {
    let Some(fields) = fields.as_object() else {
        return;
    };
    for (key, child) in fields {
        let leaf = child
            .as_object()
            .is_none_or(|map| map.keys().all(|k| k == "."));
        if let Some(name) = key.strip_prefix("f:") {
            let Value::Object(map) = body else { continue };
            if leaf {
                map.remove(name);
            } else if let Some(next) = map.get_mut(name) {
                remove_fields(next, child);
            }
        } else if key.starts_with("k:") || key.starts_with("v:") || key.starts_with("i:") {
            let Value::Array(items) = body else { continue };
            let position = key.strip_prefix("i:").and_then(|i| i.parse::<usize>().ok());
            let found = items
                .iter_mut()
                .enumerate()
                .find(|(i, item)| position == Some(*i) || item_matches(key, item));
            if let Some((_, item)) = found
                && !leaf
            {
                let keys: Vec<String> = key
                    .strip_prefix("k:")
                    .and_then(|k| serde_json::from_str::<serde_json::Map<String, Value>>(k).ok())
                    .map(|k| k.keys().cloned().collect())
                    .unwrap_or_default();
                let mut child = child.clone();
                if let Some(map) = child.as_object_mut() {
                    for key_field in keys {
                        map.remove(&format!("f:{key_field}"));
                    }
                }
                remove_fields(item, &child);
            }
        }
    }
}
