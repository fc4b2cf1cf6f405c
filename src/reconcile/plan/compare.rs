//! The comparison of one desired object with its live copy, field by field,
//! as server-side apply merges them.

use std::fmt::Write as _;

use serde_json::{Map, Number, Value};

use super::attribution::{blame, field_managers};
use super::quantity::Quantity;
use super::{Drift, HASH_ANNOTATION, shown};

/// One step of a path into an object. List items keep the live (or desired)
/// item itself, to match it against `k:{...}` keys in `managedFields`.
#[derive(Clone, Debug)]
pub(super) enum Segment<'a> {
    Key(&'a str),
    Item {
        key: &'static str,
        value: &'a Value,
        item: &'a Map<String, Value>,
    },
    Index(usize),
}

/// A drift found by the comparison, before it is rendered and attributed.
pub(super) struct Found<'a> {
    path: Vec<Segment<'a>>,
    live: Option<&'a Value>,
    desired: Option<&'a Value>,
}

pub(super) fn diff(desired: &Value, live: &Value) -> Vec<Drift> {
    let mut found = Vec::new();
    compare(&mut Vec::new(), desired, Some(live), &mut found);
    let managers = field_managers(live);
    found
        .into_iter()
        .map(|f| Drift {
            path: render_path(&f.path),
            manager: blame(&managers, &f.path),
            live: f.live.cloned(),
            desired: f.desired.cloned(),
        })
        .collect()
}

pub(super) fn compare<'a>(
    path: &mut Vec<Segment<'a>>,
    desired: &'a Value,
    live: Option<&'a Value>,
    found: &mut Vec<Found<'a>>,
) {
    let live = live.filter(|value| !value.is_null());
    let mut drifted = |live: Option<&'a Value>| {
        let desired = Some(desired).filter(|value| !value.is_null());
        found.push(Found {
            path: path.clone(),
            live,
            desired,
        });
    };
    match (desired, live) {
        (_, None) => {
            if requires_presence(desired) {
                drifted(None);
            }
        }
        (Value::Null, Some(live)) => drifted(Some(live)),
        (Value::Object(desired), Some(Value::Object(live))) => {
            for (key, desired_value) in desired {
                if ignored(path, key) {
                    continue;
                }
                path.push(Segment::Key(key));
                compare(path, desired_value, live.get(key), found);
                path.pop();
            }
        }
        (Value::Array(_), Some(live @ Value::Array(_))) => {
            compare_list(path, desired, live, found);
        }
        (Value::Object(_) | Value::Array(_), Some(live)) => drifted(Some(live)),
        (_, Some(live)) => {
            if !scalar_eq(path, desired, live) {
                drifted(Some(live));
            }
        }
    }
}

/// Whether a desired value, absent from live, is drift. Kubernetes omits
/// empty maps and lists (`annotations: {}`, `args: []`) and nulls, and
/// without the schema they cannot be told from fields that must exist, so
/// only a value with something in it must be present.
pub(super) fn requires_presence(desired: &Value) -> bool {
    match desired {
        Value::Null => false,
        Value::Object(map) => map.values().any(requires_presence),
        Value::Array(items) => !items.is_empty(),
        _ => true,
    }
}

/// Fields Git may carry that are not Setpoint's to compare: `status` belongs
/// to controllers, the hash is compared on its own, the version is matched
/// by identity (the API server converts), and the rest is server bookkeeping.
pub(super) fn ignored(path: &[Segment<'_>], key: &str) -> bool {
    match path {
        [] => matches!(key, "status" | "apiVersion"),
        [Segment::Key("metadata")] => matches!(
            key,
            "managedFields" | "resourceVersion" | "uid" | "generation" | "creationTimestamp"
        ),
        [Segment::Key("metadata"), Segment::Key("annotations")] => key == HASH_ANNOTATION,
        _ => false,
    }
}

/// Merge keys of Kubernetes' associative lists, in the order tried: a list
/// is associative by the first one every desired item has.
pub(super) const MERGE_KEYS: [&str; 7] = [
    "name",
    "containerPort",
    "port",
    "mountPath",
    "devicePath",
    "ip",
    "type",
];

pub(super) fn merge_key(items: &[Value]) -> Option<&'static str> {
    MERGE_KEYS.into_iter().find(|key| {
        items
            .iter()
            .all(|item| item.get(key).is_some_and(|value| !value.is_null()))
    })
}

/// Lists as server-side apply sees them: associative lists match items by
/// merge key and ignore live items Git does not name; other lists of maps
/// compare item by item; lists of scalars are atomic.
pub(super) fn compare_list<'a>(
    path: &mut Vec<Segment<'a>>,
    desired: &'a Value,
    live: &'a Value,
    found: &mut Vec<Found<'a>>,
) {
    let (Value::Array(desired_items), Value::Array(live_items)) = (desired, live) else {
        return;
    };
    let whole = |path: &[Segment<'a>], found: &mut Vec<Found<'a>>| {
        found.push(Found {
            path: path.to_vec(),
            live: Some(live),
            desired: Some(desired),
        });
    };
    if desired_items.is_empty() {
        // Git sets no item. Live items of an associative list are other
        // managers'; of an atomic list, they are drift.
        if !live_items.is_empty() && merge_key(live_items).is_none() {
            whole(path, found);
        }
        return;
    }
    if let Some(key) = merge_key(desired_items) {
        for desired_item in desired_items {
            let Some(desired_map) = desired_item.as_object() else {
                continue;
            };
            let live_item = live_items.iter().find(|live_item| {
                live_item
                    .as_object()
                    .is_some_and(|live_map| same_item(key, desired_map, live_map))
            });
            let item = live_item.and_then(Value::as_object).unwrap_or(desired_map);
            path.push(Segment::Item {
                key,
                value: &desired_map[key],
                item,
            });
            compare(path, desired_item, live_item, found);
            path.pop();
        }
        return;
    }
    if desired_items
        .iter()
        .all(|item| !item.is_object() && !item.is_array())
    {
        let equal = desired_items.len() == live_items.len()
            && desired_items
                .iter()
                .zip(live_items)
                .all(|(d, l)| scalar_eq(path, d, l));
        if !equal {
            whole(path, found);
        }
        return;
    }
    if desired_items.len() != live_items.len() {
        whole(path, found);
        return;
    }
    for (index, (desired_item, live_item)) in desired_items.iter().zip(live_items).enumerate() {
        path.push(Segment::Index(index));
        compare(path, desired_item, Some(live_item), found);
        path.pop();
    }
}

/// Whether two list items are the same by merge key. Ports also match on
/// protocol, which the API server defaults to TCP.
pub(super) fn same_item(
    key: &str,
    desired: &Map<String, Value>,
    live: &Map<String, Value>,
) -> bool {
    let same_key = match (desired.get(key), live.get(key)) {
        (Some(d), Some(l)) => loose_eq(d, l),
        _ => false,
    };
    if !same_key {
        return false;
    }
    if matches!(key, "containerPort" | "port") {
        let protocol = |item: &Map<String, Value>| {
            item.get("protocol")
                .and_then(Value::as_str)
                .unwrap_or("TCP")
                .to_string()
        };
        return protocol(desired) == protocol(live);
    }
    true
}

/// Fields whose values are Kubernetes quantities (`500m`, `1Gi`) when both
/// sides parse as one.
pub(super) const QUANTITY_FIELDS: [&str; 7] = [
    "resources",
    "limits",
    "requests",
    "hard",
    "capacity",
    "allocatable",
    "storage",
];

pub(super) fn in_quantity_field(path: &[Segment<'_>]) -> bool {
    path.iter()
        .any(|segment| matches!(segment, Segment::Key(key) if QUANTITY_FIELDS.contains(key)))
}

/// Equality of two scalars as the API server means it: numbers by value, an
/// int-or-string by its decimal form, quantities by value.
pub(super) fn scalar_eq(path: &[Segment<'_>], desired: &Value, live: &Value) -> bool {
    if loose_eq(desired, live) {
        return true;
    }
    if in_quantity_field(path)
        && let (Some(d), Some(l)) = (quantity_of(desired), quantity_of(live))
    {
        return d.same_value(l);
    }
    false
}

/// Equality with numbers compared by value (`5 == 5.0`) and an int-or-string
/// matching a number written out (`"8080" == 8080`).
pub(super) fn loose_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => numbers_equal(a, b),
        (Value::Number(n), Value::String(s)) | (Value::String(s), Value::Number(n)) => {
            let plain = s
                .bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+'));
            match (plain.then(|| Quantity::parse(s)).flatten(), number_value(n)) {
                (Some(s), Some(n)) => s.same_value(n),
                _ => false,
            }
        }
        _ => a == b,
    }
}

pub(super) fn numbers_equal(a: &Number, b: &Number) -> bool {
    match (number_value(a), number_value(b)) {
        (Some(a), Some(b)) => a.same_value(b),
        _ => a.as_f64() == b.as_f64(),
    }
}

pub(super) fn number_value(n: &Number) -> Option<Quantity> {
    Quantity::parse(&n.to_string())
}

pub(super) fn quantity_of(value: &Value) -> Option<Quantity> {
    match value {
        Value::String(s) => Quantity::parse(s),
        Value::Number(n) => number_value(n),
        _ => None,
    }
}

pub(super) fn render_path(path: &[Segment<'_>]) -> String {
    let mut out = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) if is_identifier(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Key(key) => {
                let _ = write!(out, "[{}]", Value::String((*key).to_string()));
            }
            Segment::Item { key, value, .. } => {
                let _ = write!(out, "[{key}={}]", shown(Some(value)));
            }
            Segment::Index(index) => {
                let _ = write!(out, "[{index}]");
            }
        }
    }
    if out.is_empty() {
        out.push('.');
    }
    out
}

pub(super) fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}
