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

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::fmt::{self, Write as _};

use serde_json::{Map, Number, Value};

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

fn shown(value: Option<&Value>) -> String {
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

/// One step of a path into an object. List items keep the live (or desired)
/// item itself, to match it against `k:{...}` keys in `managedFields`.
#[derive(Clone, Debug)]
enum Segment<'a> {
    Key(&'a str),
    Item {
        key: &'static str,
        value: &'a Value,
        item: &'a Map<String, Value>,
    },
    Index(usize),
}

/// A drift found by the comparison, before it is rendered and attributed.
struct Found<'a> {
    path: Vec<Segment<'a>>,
    live: Option<&'a Value>,
    desired: Option<&'a Value>,
}

fn diff(desired: &Value, live: &Value) -> Vec<Drift> {
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

fn compare<'a>(
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
fn requires_presence(desired: &Value) -> bool {
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
fn ignored(path: &[Segment<'_>], key: &str) -> bool {
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
const MERGE_KEYS: [&str; 7] = [
    "name",
    "containerPort",
    "port",
    "mountPath",
    "devicePath",
    "ip",
    "type",
];

fn merge_key(items: &[Value]) -> Option<&'static str> {
    MERGE_KEYS.into_iter().find(|key| {
        items
            .iter()
            .all(|item| item.get(key).is_some_and(|value| !value.is_null()))
    })
}

/// Lists as server-side apply sees them: associative lists match items by
/// merge key and ignore live items Git does not name; other lists of maps
/// compare item by item; lists of scalars are atomic.
fn compare_list<'a>(
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
fn same_item(key: &str, desired: &Map<String, Value>, live: &Map<String, Value>) -> bool {
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
const QUANTITY_FIELDS: [&str; 7] = [
    "resources",
    "limits",
    "requests",
    "hard",
    "capacity",
    "allocatable",
    "storage",
];

fn in_quantity_field(path: &[Segment<'_>]) -> bool {
    path.iter()
        .any(|segment| matches!(segment, Segment::Key(key) if QUANTITY_FIELDS.contains(key)))
}

/// Equality of two scalars as the API server means it: numbers by value, an
/// int-or-string by its decimal form, quantities by value.
fn scalar_eq(path: &[Segment<'_>], desired: &Value, live: &Value) -> bool {
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
fn loose_eq(a: &Value, b: &Value) -> bool {
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

fn numbers_equal(a: &Number, b: &Number) -> bool {
    match (number_value(a), number_value(b)) {
        (Some(a), Some(b)) => a.same_value(b),
        _ => a.as_f64() == b.as_f64(),
    }
}

fn number_value(n: &Number) -> Option<Quantity> {
    Quantity::parse(&n.to_string())
}

fn quantity_of(value: &Value) -> Option<Quantity> {
    match value {
        Value::String(s) => Quantity::parse(s),
        Value::Number(n) => number_value(n),
        _ => None,
    }
}

/// A Kubernetes quantity as an exact number: `mantissa × 10^exp10 × 2^exp2`,
/// the mantissa stripped of trailing zeros. No floats: `0.1 + 0.2` style
/// errors would make equal requests look like drift.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Quantity {
    mantissa: i128,
    exp10: i32,
    exp2: u32,
}

impl Quantity {
    /// `<sign><digits>[.<digits>]<suffix>`, the suffix one of the decimal SI
    /// `n u m k M G T P E`, the binary `Ki … Ei`, or an exponent `e3`/`E-3`.
    /// None when it is not a quantity or too large to hold exactly.
    fn parse(text: &str) -> Option<Quantity> {
        let bytes = text.as_bytes();
        let (negative, mut at) = match bytes.first() {
            Some(b'-') => (true, 1),
            Some(b'+') => (false, 1),
            _ => (false, 0),
        };
        let (mut mantissa, mut exp10, mut digits, mut seen_dot) = (0i128, 0i32, 0usize, false);
        while let Some(&byte) = bytes.get(at) {
            match byte {
                b'0'..=b'9' => {
                    mantissa = mantissa
                        .checked_mul(10)?
                        .checked_add(i128::from(byte - b'0'))?;
                    if seen_dot {
                        exp10 -= 1;
                    }
                    digits += 1;
                }
                b'.' if !seen_dot => seen_dot = true,
                _ => break,
            }
            at += 1;
        }
        if digits == 0 {
            return None;
        }
        let (suffix10, exp2) = match &text[at..] {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            other => {
                let exponent: i32 = other.strip_prefix(['e', 'E'])?.parse().ok()?;
                if exponent.abs() > 1000 {
                    return None;
                }
                (exponent, 0)
            }
        };
        exp10 += suffix10;
        if mantissa == 0 {
            return Some(Quantity {
                mantissa: 0,
                exp10: 0,
                exp2: 0,
            });
        }
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exp10 += 1;
        }
        if negative {
            mantissa = -mantissa;
        }
        Some(Quantity {
            mantissa,
            exp10,
            exp2,
        })
    }

    fn same_value(self, other: Quantity) -> bool {
        if self.exp2 == other.exp2 || self.mantissa == 0 || other.mantissa == 0 {
            // Decimal forms are canonical once trailing zeros are stripped.
            return self.mantissa == other.mantissa
                && (self.mantissa == 0 || (self.exp10 == other.exp10 && self.exp2 == other.exp2));
        }
        let base = self.exp10.min(other.exp10);
        match (
            self.scaled(self.exp10 - base),
            other.scaled(other.exp10 - base),
        ) {
            (Some(a), Some(b)) => a == b,
            _ => false,
        }
    }

    fn scaled(self, shift10: i32) -> Option<i128> {
        let p10 = 10i128.checked_pow(u32::try_from(shift10).ok()?)?;
        let p2 = 2i128.checked_pow(self.exp2)?;
        self.mantissa.checked_mul(p10)?.checked_mul(p2)
    }
}

fn render_path(path: &[Segment<'_>]) -> String {
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

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// One entry of `metadata.managedFields` other than Setpoint's own.
struct FieldsEntry<'a> {
    manager: &'a str,
    operation: &'a str,
    subresource: &'a str,
    time: &'a str,
    fields: &'a Value,
}

fn field_managers(live: &Value) -> Vec<FieldsEntry<'_>> {
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
fn blame(managers: &[FieldsEntry<'_>], path: &[Segment<'_>]) -> Option<String> {
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
enum Ownership {
    /// The fieldsV1 tree has the whole path.
    Field,
    /// It has a leaf (`{}`) or a `.` (the item itself) at a prefix.
    Subtree,
}

fn owns(fields: &Value, path: &[Segment<'_>]) -> Option<Ownership> {
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
fn child<'v>(node: &'v Map<String, Value>, segment: &Segment<'_>) -> Option<&'v Value> {
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::manifest::{Origin, split_api_version};

    fn id_of(body: &Value) -> ObjectId {
        let (group, version) = split_api_version(body["apiVersion"].as_str().unwrap());
        ObjectId {
            group: group.into(),
            version: version.into(),
            kind: body["kind"].as_str().unwrap().into(),
            namespace: body["metadata"]["namespace"].as_str().map(Into::into),
            name: body["metadata"]["name"].as_str().unwrap().into(),
        }
    }

    fn manifest(body: Value) -> Manifest {
        let origin = Origin {
            file: "app.yaml".into(),
            document: 0,
        };
        Manifest {
            id: id_of(&body),
            origin,
            body,
        }
    }

    fn live_state(objects: &[Value]) -> LiveState {
        LiveState {
            objects: objects.iter().map(|o| (id_of(o), o.clone())).collect(),
            ..LiveState::default()
        }
    }

    fn desired_deployment() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "labels": {"app": "web", "team": "a", "setpoint.dev/app": "shop.web"},
                "annotations": {"setpoint.dev/app": "shop/web", HASH_ANNOTATION: "h1"}
            },
            "spec": {
                "replicas": 5,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [{
                            "name": "app",
                            "image": "app:1",
                            "ports": [{"containerPort": 80, "name": "http"}],
                            "env": [{"name": "MODE", "value": "prod"}],
                            "resources": {
                                "requests": {"cpu": 0.5, "memory": "256Mi"},
                                "limits": {"cpu": 1, "memory": "1024Mi"}
                            }
                        }]
                    }
                }
            }
        })
    }

    /// Setpoint's apply and the controller's status write, as on a fresh
    /// Deployment (a json! of its own: the macro's recursion limit).
    fn managed_fields() -> Value {
        json!([{
            "manager": "setpoint",
            "operation": "Apply",
            "apiVersion": "apps/v1",
            "time": "2026-05-01T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {
                    "f:annotations": {"f:setpoint.dev/app": {}, "f:setpoint.dev/manifest-hash": {}},
                    "f:labels": {"f:app": {}, "f:setpoint.dev/app": {}, "f:team": {}}
                },
                "f:spec": {
                    "f:replicas": {},
                    "f:selector": {},
                    "f:template": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                            ".": {},
                            "f:env": {"k:{\"name\":\"MODE\"}": {
                                ".": {}, "f:name": {}, "f:value": {}
                            }},
                            "f:image": {},
                            "f:name": {},
                            "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {
                                ".": {}, "f:containerPort": {}, "f:name": {}
                            }},
                            "f:resources": {
                                "f:limits": {"f:cpu": {}, "f:memory": {}},
                                "f:requests": {"f:cpu": {}, "f:memory": {}}
                            }
                        }}}
                    }
                }
            }
        }, {
            "manager": "kube-controller-manager",
            "operation": "Update",
            "apiVersion": "apps/v1",
            "time": "2026-05-01T10:00:30Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {
                "f:metadata": {"f:annotations": {"f:deployment.kubernetes.io/revision": {}}},
                "f:status": {"f:availableReplicas": {}, "f:replicas": {}}
            },
            "subresource": "status"
        }])
    }

    /// The desired Deployment as the API server returns it after Setpoint
    /// applied it: defaults filled in, quantities canonical, status set.
    fn live_deployment() -> Value {
        json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "uid": "0b5f4c1e-2d1a-4c7e-9f1e-4c1d2e3f4a5b",
                "resourceVersion": "48213",
                "generation": 3,
                "creationTimestamp": "2026-05-01T10:00:00Z",
                "labels": {"app": "web", "team": "a", "setpoint.dev/app": "shop.web"},
                "annotations": {
                    "deployment.kubernetes.io/revision": "2",
                    "setpoint.dev/app": "shop/web",
                    HASH_ANNOTATION: "h1"
                },
                "managedFields": managed_fields()
            },
            "spec": {
                "replicas": 5,
                "revisionHistoryLimit": 10,
                "progressDeadlineSeconds": 600,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}
                },
                "template": {
                    "metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                    "spec": {
                        "containers": [{
                            "name": "app",
                            "image": "app:1",
                            "imagePullPolicy": "IfNotPresent",
                            "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}],
                            "env": [{"name": "MODE", "value": "prod"}],
                            "resources": {
                                "requests": {"cpu": "500m", "memory": "256Mi"},
                                "limits": {"cpu": "1", "memory": "1Gi"}
                            },
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "File"
                        }],
                        "dnsPolicy": "ClusterFirst",
                        "restartPolicy": "Always",
                        "schedulerName": "default-scheduler",
                        "securityContext": {},
                        "terminationGracePeriodSeconds": 30
                    }
                }
            },
            "status": {
                "observedGeneration": 3,
                "replicas": 5,
                "updatedReplicas": 5,
                "readyReplicas": 5,
                "availableReplicas": 5
            }
        })
    }

    /// Adds a managedFields entry, as another client's write would.
    fn written_by(live: &mut Value, entry: Value) {
        live["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .push(entry);
    }

    fn only_step(plan: &Plan) -> &Action {
        assert_eq!(plan.steps.len(), 1, "{plan:?}");
        &plan.steps[0].action
    }

    fn drift_of(action: &Action) -> &[Drift] {
        match action {
            Action::Update { drift, .. } => drift,
            other => panic!("expected an update, got {other:?}"),
        }
    }

    #[test]
    fn not_live_is_created() {
        let plan = plan(&[manifest(desired_deployment())], &LiveState::default());
        assert_eq!(
            only_step(&plan),
            &Action::Create {
                deleted_live: false
            }
        );
        assert_eq!(plan.creates(), 1);
        assert!(!plan.is_in_sync());
    }

    #[test]
    fn previously_applied_but_gone_is_deleted_live_even_at_another_version() {
        let desired = manifest(desired_deployment());
        let mut before = desired.id.clone();
        before.version = "v1beta2".into();
        let live = LiveState {
            previously_applied: [before].into(),
            ..LiveState::default()
        };
        let plan = plan(&[desired], &live);
        assert_eq!(only_step(&plan), &Action::Create { deleted_live: true });
    }

    #[test]
    fn server_defaults_are_not_drift() {
        // Extra fields, `protocol: TCP` on ports, `imagePullPolicy`,
        // `terminationMessagePath`, status, canonical quantities
        // (`0.5` → `500m`, `1024Mi` → `1Gi`, `1` → `"1"`), bookkeeping metadata.
        let plan = plan(
            &[manifest(desired_deployment())],
            &live_state(&[live_deployment()]),
        );
        assert_eq!(only_step(&plan), &Action::Unchanged);
        assert!(plan.is_in_sync());
        assert_eq!(
            (
                plan.unchanged(),
                plan.updates(),
                plan.creates(),
                plan.prunes()
            ),
            (1, 0, 0, 0)
        );
    }

    #[test]
    fn desired_status_and_bookkeeping_are_skipped() {
        let mut desired = desired_deployment();
        desired["status"] = json!({"replicas": 99});
        desired["metadata"]["resourceVersion"] = json!("1");
        desired["metadata"]["uid"] = json!("other");
        desired["metadata"]["generation"] = json!(1);
        desired["metadata"]["creationTimestamp"] = json!(null);
        desired["metadata"]["managedFields"] = json!([]);
        let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
        assert_eq!(only_step(&plan), &Action::Unchanged);
    }

    #[test]
    fn image_changed_by_kubectl_edit_is_drift_on_the_keyed_container() {
        let mut live = live_deployment();
        live["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:2");
        written_by(
            &mut live,
            json!({
                "manager": "kubectl-edit",
                "operation": "Update",
                "apiVersion": "apps/v1",
                "time": "2026-05-02T09:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"app\"}": {"f:image": {}}
                }}}}}
            }),
        );
        let mut desired = desired_deployment();
        desired["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:1");
        let plan = plan(&[manifest(desired)], &live_state(&[live]));
        let action = only_step(&plan);
        assert!(matches!(
            action,
            Action::Update {
                cause: Cause::Drift,
                ..
            }
        ));
        let drift = drift_of(action);
        assert_eq!(drift.len(), 1);
        assert_eq!(
            drift[0].path,
            "spec.template.spec.containers[name=app].image"
        );
        assert_eq!(drift[0].manager.as_deref(), Some("kubectl-edit"));
        assert_eq!(
            drift[0].to_string(),
            "spec.template.spec.containers[name=app].image app:2→app:1 (changed by kubectl-edit)"
        );
    }

    #[test]
    fn replicas_scaled_through_the_scale_subresource() {
        let mut live = live_deployment();
        live["spec"]["replicas"] = json!(1);
        written_by(
            &mut live,
            json!({
                "manager": "kubectl",
                "operation": "Update",
                "apiVersion": "autoscaling/v1",
                "time": "2026-05-02T09:30:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:replicas": {}}},
                "subresource": "scale"
            }),
        );
        written_by(
            &mut live,
            json!({
                "manager": "kubectl-annotate",
                "operation": "Update",
                "apiVersion": "apps/v1",
                "time": "2026-05-02T10:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:annotations": {"f:note": {}}}}
            }),
        );
        let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
        let drift = drift_of(only_step(&plan));
        let expected = Drift {
            path: "spec.replicas".into(),
            live: Some(json!(1)),
            desired: Some(json!(5)),
            manager: Some("kubectl".into()),
        };
        assert_eq!(drift, [expected]);
        assert_eq!(
            drift[0].to_string(),
            "spec.replicas 1→5 (changed by kubectl)"
        );
        assert_eq!(plan.drift().count(), 1);
    }

    #[test]
    fn hash_change_is_git_changed_even_without_field_drift() {
        let mut desired = desired_deployment();
        desired["metadata"]["annotations"][HASH_ANNOTATION] = json!("h2");
        let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
        assert_eq!(
            only_step(&plan),
            &Action::Update {
                cause: Cause::GitChanged,
                drift: vec![]
            }
        );
    }

    #[test]
    fn git_change_lists_the_fields_it_changes() {
        let mut desired = desired_deployment();
        desired["metadata"]["annotations"][HASH_ANNOTATION] = json!("h2");
        desired["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:3");
        let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
        let action = only_step(&plan);
        assert!(matches!(
            action,
            Action::Update {
                cause: Cause::GitChanged,
                ..
            }
        ));
        assert_eq!(
            drift_of(action)[0].path,
            "spec.template.spec.containers[name=app].image"
        );
    }

    #[test]
    fn live_without_hash_is_git_changed() {
        let mut live = live_deployment();
        live["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(HASH_ANNOTATION);
        let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
        assert!(matches!(
            only_step(&plan),
            Action::Update {
                cause: Cause::GitChanged,
                ..
            }
        ));
    }

    #[test]
    fn owned_but_not_desired_is_pruned_after_the_desired_steps_sorted() {
        let cm = |name: &str| {
            id_of(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "shop"}}))
        };
        let desired = manifest(desired_deployment());
        let mut live = live_state(&[live_deployment()]);
        live.owned = [cm("zeta"), desired.id.clone(), cm("alpha")].into();
        let plan = plan(&[desired], &live);
        let steps: Vec<(&str, &Action)> = plan
            .steps
            .iter()
            .map(|s| (s.id.name.as_str(), &s.action))
            .collect();
        assert_eq!(
            steps,
            [
                ("web", &Action::Unchanged),
                ("alpha", &Action::Prune),
                ("zeta", &Action::Prune)
            ]
        );
        assert_eq!(plan.prunes(), 2);
        assert!(!plan.is_in_sync());
    }

    #[test]
    fn owned_at_another_version_is_the_same_object_not_a_prune() {
        let desired = manifest(desired_deployment());
        let mut owned = desired.id.clone();
        owned.version = "v1beta2".into();
        let mut live = LiveState::default();
        live.objects.insert(owned.clone(), live_deployment());
        live.owned = [owned].into();
        let plan = plan(&[desired], &live);
        assert_eq!(only_step(&plan), &Action::Unchanged);
    }

    #[test]
    fn unowned_live_objects_are_never_pruned() {
        let stranger = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "someone-elses", "namespace": "shop"}});
        let plan = plan(&[], &live_state(&[stranger]));
        assert!(plan.steps.is_empty());
        assert!(plan.is_in_sync());
    }

    #[test]
    fn cpu_half_equals_500m_but_one_is_not_two() {
        let mut desired = desired_deployment();
        desired["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] =
            json!("2");
        let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
        let drift = drift_of(only_step(&plan));
        assert_eq!(drift.len(), 1, "{drift:?}");
        assert_eq!(
            drift[0].path,
            "spec.template.spec.containers[name=app].resources.limits.cpu"
        );
        assert_eq!(
            drift[0].to_string().split(" (").next().unwrap(),
            "spec.template.spec.containers[name=app].resources.limits.cpu 1→2"
        );
    }

    #[test]
    fn label_removed_by_someone_is_blamed_on_their_last_update() {
        let mut live = live_deployment();
        live["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("team");
        written_by(
            &mut live,
            json!({
                "manager": "kubectl-label",
                "operation": "Update",
                "apiVersion": "apps/v1",
                "time": "2026-05-03T08:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {"f:oncall": {}}}}
            }),
        );
        // The controller's status writes come later and are not blamed.
        live["metadata"]["managedFields"][1]["time"] = json!("2026-05-03T08:05:00Z");
        let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
        let drift = drift_of(only_step(&plan));
        assert_eq!(drift.len(), 1);
        assert_eq!(
            drift[0].to_string(),
            "metadata.labels.team <none>→a (changed by kubectl-label)"
        );
    }

    #[test]
    fn removed_field_without_any_update_has_unknown_manager() {
        let mut live = live_deployment();
        live["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("team");
        live["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .truncate(1);
        let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
        let drift = drift_of(only_step(&plan));
        assert_eq!(drift[0].manager, None);
        assert_eq!(
            drift[0].to_string(),
            "metadata.labels.team <none>→a (changed by unknown)"
        );
    }

    #[test]
    fn keys_that_are_not_identifiers_are_quoted() {
        let mut desired = desired_deployment();
        desired["metadata"]["annotations"]["example.com/x"] = json!("yes");
        let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
        let drift = drift_of(only_step(&plan));
        assert_eq!(drift[0].path, r#"metadata.annotations["example.com/x"]"#);
        assert_eq!(drift[0].live, None);
    }

    #[test]
    fn the_latest_owner_is_blamed_and_setpoint_never() {
        let mut live = live_deployment();
        live["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("debug");
        let env_owner = |manager: &str, time: &str| {
            json!({
                "manager": manager, "operation": "Update", "apiVersion": "apps/v1",
                "time": time, "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"app\"}": {"f:env": {"k:{\"name\":\"MODE\"}": {"f:value": {}}}}
                }}}}}
            })
        };
        written_by(&mut live, env_owner("older-tool", "2026-05-02T00:00:00Z"));
        written_by(&mut live, env_owner("kubectl-set", "2026-05-04T00:00:00Z"));
        written_by(&mut live, env_owner("setpoint", "2026-05-05T00:00:00Z"));
        let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
        let drift = drift_of(only_step(&plan));
        assert_eq!(
            drift[0].to_string(),
            "spec.template.spec.containers[name=app].env[name=MODE].value debug→prod (changed by kubectl-set)"
        );
    }

    #[test]
    fn a_field_owner_beats_a_later_subtree_owner() {
        let mut live = live_deployment();
        live["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:2");
        written_by(
            &mut live,
            json!({
                "manager": "kubectl-set", "operation": "Update", "time": "2026-05-02T00:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"app\"}": {"f:image": {}}
                }}}}}
            }),
        );
        written_by(
            &mut live,
            json!({
                "manager": "kubectl-create", "operation": "Update", "time": "2026-05-03T00:00:00Z",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"app\"}": {".": {}, "f:name": {}}
                }}}}}
            }),
        );
        let first = plan(
            &[manifest(desired_deployment())],
            &live_state(&[live.clone()]),
        );
        assert_eq!(
            drift_of(only_step(&first))[0].manager.as_deref(),
            Some("kubectl-set")
        );

        // Without the field owner, the one owning the item is blamed.
        live["metadata"]["managedFields"]
            .as_array_mut()
            .unwrap()
            .remove(2);
        let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
        assert_eq!(
            drift_of(only_step(&plan))[0].manager.as_deref(),
            Some("kubectl-create")
        );
    }

    #[test]
    fn a_missing_list_item_is_drift_at_its_key() {
        let mut desired = desired_deployment();
        desired["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "sidecar", "image": "proxy:1"}));
        let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
        let drift = drift_of(only_step(&plan));
        assert_eq!(drift.len(), 1);
        assert_eq!(drift[0].path, "spec.template.spec.containers[name=sidecar]");
        assert_eq!(drift[0].live, None);
        assert_eq!(
            drift[0].desired,
            Some(json!({"name": "sidecar", "image": "proxy:1"}))
        );
    }

    #[test]
    fn extra_live_list_items_are_not_drift() {
        let mut live = live_deployment();
        let containers = live["spec"]["template"]["spec"]["containers"]
            .as_array_mut()
            .unwrap();
        containers.insert(0, json!({"name": "injected-proxy", "image": "mesh:1"}));
        let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
        assert_eq!(only_step(&plan), &Action::Unchanged);
    }

    fn service(ports: Value, live_ports: Value) -> (Value, Value) {
        let body = |ports: Value| {
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {
                    "name": "web", "namespace": "shop", "annotations": {HASH_ANNOTATION: "s1"}
                },
                "spec": {"selector": {"app": "web"}, "ports": ports}
            })
        };
        let mut live = body(live_ports);
        live["spec"]["clusterIP"] = json!("10.96.0.12");
        live["spec"]["type"] = json!("ClusterIP");
        live["spec"]["sessionAffinity"] = json!("None");
        (body(ports), live)
    }

    #[test]
    fn service_ports_match_by_port_and_protocol() {
        let (desired, live) = service(
            json!([
                {"port": 53, "targetPort": 5353},
                {"port": 53, "protocol": "UDP", "targetPort": 5353}
            ]),
            json!([
                {"port": 53, "protocol": "UDP", "targetPort": 5353},
                {"port": 53, "protocol": "TCP", "targetPort": "5353"}
            ]),
        );
        let same = plan(&[manifest(desired.clone())], &live_state(&[live]));
        assert_eq!(only_step(&same), &Action::Unchanged);

        let (_, live) = service(
            json!([]),
            json!([{"port": 53, "protocol": "TCP", "targetPort": 5353}]),
        );
        let plan = plan(&[manifest(desired)], &live_state(&[live]));
        let drift = drift_of(only_step(&plan));
        assert_eq!(drift.len(), 1);
        assert_eq!(drift[0].path, "spec.ports[port=53]");
        assert_eq!(drift[0].live, None);
    }

    #[test]
    fn int_or_string_matches_its_decimal_form_only() {
        let (desired, live) = service(
            json!([{"port": 80, "targetPort": "8080"}]),
            json!([{"port": 80, "protocol": "TCP", "targetPort": 8080}]),
        );
        assert!(plan(&[manifest(desired)], &live_state(&[live])).is_in_sync());
        let (desired, live) = service(
            json!([{"port": 80, "targetPort": "http"}]),
            json!([{"port": 80, "protocol": "TCP", "targetPort": 8080}]),
        );
        let plan = plan(&[manifest(desired)], &live_state(&[live]));
        assert_eq!(
            drift_of(only_step(&plan))[0].to_string(),
            "spec.ports[port=80].targetPort 8080→http (changed by unknown)"
        );
    }

    fn config_map(data: Value, live_data: Value) -> (Manifest, LiveState) {
        let body = |data: Value| {
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {
                    "name": "settings", "namespace": "shop", "annotations": {HASH_ANNOTATION: "c1"}
                },
                "data": data
            })
        };
        (manifest(body(data)), live_state(&[body(live_data)]))
    }

    fn drift_paths(desired: Value, live: Value) -> Vec<String> {
        let (manifest, live) = config_map(desired, live);
        let plan = plan(&[manifest], &live);
        plan.drift().map(|(_, d)| d.path.clone()).collect()
    }

    #[test]
    fn desired_null_means_absent() {
        assert!(drift_paths(json!({"gone": null}), json!({})).is_empty());
        assert!(drift_paths(json!({"gone": null}), json!({"gone": null})).is_empty());
        let (manifest, live) = config_map(json!({"gone": null}), json!({"gone": "back"}));
        let plan = plan(&[manifest], &live);
        let drift = drift_of(only_step(&plan));
        assert_eq!(
            drift[0].to_string(),
            "data.gone back→<none> (changed by unknown)"
        );
    }

    #[test]
    fn empty_maps_and_lists_match_absent_fields() {
        assert!(
            drift_paths(
                json!({"labels": {}, "args": [], "deep": {"x": null}}),
                json!({})
            )
            .is_empty()
        );
        assert_eq!(
            drift_paths(json!({"args": []}), json!({"args": ["-v"]})),
            ["data.args"]
        );
        assert!(drift_paths(json!({"env": []}), json!({"env": [{"name": "X"}]})).is_empty());
        assert_eq!(drift_paths(json!({"m": {"k": 1}}), json!({})), ["data.m"]);
    }

    #[test]
    fn scalar_lists_are_atomic() {
        assert!(drift_paths(json!({"args": ["a", "b"]}), json!({"args": ["a", "b"]})).is_empty());
        assert_eq!(
            drift_paths(json!({"args": ["a", "b"]}), json!({"args": ["b", "a"]})),
            ["data.args"]
        );
        assert_eq!(
            drift_paths(json!({"args": ["a"]}), json!({"args": ["a", "b"]})),
            ["data.args"]
        );
    }

    #[test]
    fn lists_without_a_merge_key_compare_by_position() {
        let rules = json!([{"verbs": ["get"], "resources": ["pods"]}, {"verbs": ["list"]}]);
        let live_rules = json!([
            {"verbs": ["get"], "resources": ["pods"], "apiGroups": [""]},
            {"verbs": ["watch"]}
        ]);
        assert_eq!(
            drift_paths(json!({"rules": rules}), json!({"rules": live_rules})),
            ["data.rules[1].verbs"]
        );
        assert_eq!(
            drift_paths(
                json!({"rules": [{"verbs": ["get"]}]}),
                json!({"rules": [{"verbs": ["get"]}, {}]})
            ),
            ["data.rules"]
        );
    }

    #[test]
    fn numbers_compare_by_value() {
        assert!(drift_paths(json!({"n": 5}), json!({"n": 5.0})).is_empty());
        assert!(drift_paths(json!({"n": 0.1}), json!({"n": 0.1})).is_empty());
        assert_eq!(drift_paths(json!({"n": 5}), json!({"n": 6})), ["data.n"]);
        assert_eq!(
            drift_paths(json!({"n": true}), json!({"n": "true"})),
            ["data.n"]
        );
        // Quantities only count inside resource fields.
        assert_eq!(
            drift_paths(json!({"n": "1k"}), json!({"n": "1000"})),
            ["data.n"]
        );
        assert!(
            drift_paths(
                json!({"hard": {"pods": "1k"}}),
                json!({"hard": {"pods": "1000"}})
            )
            .is_empty()
        );
    }

    #[test]
    fn long_values_are_cut_in_the_drift_line() {
        let long = "x".repeat(200);
        let drift = Drift {
            path: "data.blob".into(),
            live: Some(json!(long)),
            desired: None,
            manager: None,
        };
        let line = drift.to_string();
        assert!(
            line.starts_with(&format!("data.blob {}…→<none>", "x".repeat(MAX_SHOWN - 1))),
            "{line}"
        );
        let object = Drift {
            path: "spec".into(),
            live: Some(json!({"a": 1})),
            desired: Some(json!([1, "two"])),
            manager: Some("helm".into()),
        };
        assert_eq!(
            object.to_string(),
            r#"spec {"a":1}→[1,"two"] (changed by helm)"#
        );
    }

    fn config_map_named(name: &str) -> Value {
        let metadata = json!({"name": name, "namespace": "x"});
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata})
    }

    #[test]
    fn steps_follow_the_desired_order() {
        let a = manifest(config_map_named("b"));
        let b = manifest(config_map_named("a"));
        let plan = plan(&[a, b], &LiveState::default());
        let names: Vec<&str> = plan.steps.iter().map(|s| s.id.name.as_str()).collect();
        assert_eq!(names, ["b", "a"]);
        assert_eq!(plan.creates(), 2);
    }

    #[test]
    fn quantities_parse_exactly() {
        let q = |s: &str| Quantity::parse(s).unwrap_or_else(|| panic!("{s} should parse"));
        let same = |a: &str, b: &str| q(a).same_value(q(b));
        assert!(same("500m", "0.5"));
        assert!(same("1Gi", "1024Mi"));
        assert!(same("1000", "1k"));
        assert!(same("1e3", "1k"));
        assert!(same("1E3", "1000"));
        assert!(same("1Ki", "1024"));
        assert!(same("0.5Ki", "512"));
        assert!(same("1.5Gi", "1536Mi"));
        assert!(same("100n", "0.1u"));
        assert!(same("1M", "1e6"));
        assert!(same("0", "0Gi"));
        assert!(same("+1", "1"));
        assert!(same("-1m", "-0.001"));
        assert!(same("1.", ".1e1"));
        assert!(same("1Ei", "1152921504606846976"));
        assert!(!same("1G", "1Gi"));
        assert!(!same("1", "2"));
        assert!(!same("1m", "1"));
        assert!(!same("-1", "1"));
        for bad in ["", "m", "1x", "1Kb", "1.2.3", "e3", "1e", "--1", "1 Gi"] {
            assert_eq!(Quantity::parse(bad), None, "{bad}");
        }
        assert!(q("1e-1000").mantissa == 1);
        assert_eq!(Quantity::parse("1e5000"), None);
    }

    #[test]
    fn positional_items_are_attributed_by_index() {
        let (manifest, mut live) = config_map(json!({"rules": [{"verbs": ["get"]}]}), json!({}));
        let live_object = live.objects.values_mut().next().unwrap();
        live_object["data"] = json!({"rules": [{"verbs": ["delete"]}]});
        live_object["metadata"]["managedFields"] = json!([{
            "manager": "rbac-tool", "operation": "Update", "time": "2026-05-01T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {"f:rules": {"i:0": {"f:verbs": {}}}}}
        }]);
        let plan = plan(&[manifest], &live);
        let drift = drift_of(only_step(&plan));
        assert_eq!(drift[0].path, "data.rules[0].verbs");
        assert_eq!(drift[0].manager.as_deref(), Some("rbac-tool"));
    }

    fn secret(fields: Value) -> Value {
        let mut body = json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "db", "namespace": "shop", "annotations": {HASH_ANNOTATION: "x1"}}
        });
        for (key, value) in fields.as_object().unwrap() {
            body[key] = value.clone();
        }
        body
    }

    #[test]
    fn secret_string_data_compares_with_live_data() {
        let desired =
            secret(json!({"stringData": {"password": "hunter2"}, "data": {"user": "YWRt"}}));
        let live = secret(json!({"data": {"password": "aHVudGVyMg==", "user": "YWRt"}}));
        let same = plan(&[manifest(desired.clone())], &live_state(&[live]));
        assert_eq!(only_step(&same), &Action::Unchanged);

        let changed = secret(json!({"data": {"password": "b3RoZXI=", "user": "YWRt"}}));
        let plan = plan(&[manifest(desired)], &live_state(&[changed]));
        let drift = drift_of(only_step(&plan));
        assert_eq!(drift.len(), 1);
        assert_eq!(
            drift[0].to_string(),
            "data.password <redacted>→<redacted> (changed by unknown)"
        );
    }

    #[test]
    fn base64_matches_the_standard_alphabet() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("hello", "aGVsbG8="),
        ];
        for (plain, encoded) in cases {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }
}
