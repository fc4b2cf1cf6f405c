//! Reading an imported object field by field (pure): each field read is
//! taken out, so what is left at the end is what the mapping did not use,
//! and a field of the wrong type is a note rather than a panic.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use serde_json::{Map, Value};

use super::Note;

/// The notes of one imported Application, shared by every reader of its
/// object's parts.
#[derive(Clone, Debug, Default)]
pub(super) struct Notes(Rc<RefCell<Vec<Note>>>);

impl Notes {
    /// A comment above the output field `at`.
    pub(super) fn add(&self, at: &str, text: impl Into<String>) {
        let text: String = text.into();
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let note = Note {
            at: at.to_string(),
            text,
        };
        let mut notes = self.0.borrow_mut();
        if !notes.contains(&note) {
            notes.push(note);
        }
    }

    /// `not mapped: FIELD (REASON)` above the output field `at`.
    pub(super) fn unmapped(&self, at: &str, field: &str, reason: &str) {
        self.add(at, format!("not mapped: {field} ({reason})"));
    }

    pub(super) fn into_vec(self) -> Vec<Note> {
        self.0.borrow().clone()
    }
}

/// The fields of one object of the input not read yet, and its path in the
/// input (`spec.source`) for the notes.
pub(super) struct Fields {
    pub(super) path: String,
    map: Map<String, Value>,
    notes: Notes,
}

impl Fields {
    /// `value`'s fields (none when it is absent or not an object; the
    /// latter noted).
    pub(super) fn new(path: &str, value: Option<Value>, notes: &Notes) -> Self {
        let map = match value {
            Some(Value::Object(map)) => map,
            None | Some(Value::Null) => Map::new(),
            Some(other) => {
                notes.add(
                    "",
                    format!(
                        "not mapped: {path} (expected an object, found {})",
                        type_name(&other)
                    ),
                );
                Map::new()
            }
        };
        Self {
            path: path.to_string(),
            map,
            notes: notes.clone(),
        }
    }

    /// The path of one of its fields.
    pub(super) fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    pub(super) fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    pub(super) fn take(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key).filter(|v| !v.is_null())
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &Value) {
        self.notes.add(
            "",
            format!(
                "not mapped: {} (expected {expected}, found {})",
                self.path_of(key),
                type_name(found)
            ),
        );
    }

    /// A string (a number or a boolean is taken as its text).
    pub(super) fn string(&mut self, key: &str) -> Option<String> {
        match self.take(key)? {
            Value::String(text) => Some(text),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            other => {
                self.wrong_type(key, "a string", &other);
                None
            }
        }
    }

    /// A boolean (`"true"` and `"false"` as well).
    pub(super) fn bool(&mut self, key: &str) -> Option<bool> {
        match self.take(key)? {
            Value::Bool(b) => Some(b),
            Value::String(text) if text == "true" => Some(true),
            Value::String(text) if text == "false" => Some(false),
            other => {
                self.wrong_type(key, "true or false", &other);
                None
            }
        }
    }

    /// A list of strings.
    pub(super) fn strings(&mut self, key: &str) -> Vec<String> {
        self.list(key)
            .into_iter()
            .filter_map(|item| match item {
                Value::String(text) => Some(text),
                Value::Number(n) => Some(n.to_string()),
                other => {
                    self.wrong_type(key, "a list of strings", &other);
                    None
                }
            })
            .collect()
    }

    /// A list (absent: empty).
    pub(super) fn list(&mut self, key: &str) -> Vec<Value> {
        match self.take(key) {
            None => Vec::new(),
            Some(Value::Array(items)) => items,
            Some(other) => {
                self.wrong_type(key, "a list", &other);
                Vec::new()
            }
        }
    }

    /// A map of strings (labels, annotations).
    pub(super) fn string_map(&mut self, key: &str) -> BTreeMap<String, String> {
        let mut map = BTreeMap::new();
        match self.take(key) {
            None => {}
            Some(Value::Object(entries)) => {
                for (k, v) in entries {
                    match v {
                        Value::String(text) => {
                            map.insert(k, text);
                        }
                        other => self.wrong_type(&format!("{key}.{k}"), "a string", &other),
                    }
                }
            }
            Some(other) => self.wrong_type(key, "an object", &other),
        }
        map
    }

    /// An object's fields, to read in turn.
    pub(super) fn object(&mut self, key: &str) -> Fields {
        let path = self.path_of(key);
        let value = self.take(key);
        Fields::new(&path, value, &self.notes)
    }

    /// The fields of each item of a list.
    pub(super) fn objects(&mut self, key: &str) -> Vec<Fields> {
        let path = self.path_of(key);
        self.list(key)
            .into_iter()
            .enumerate()
            .map(|(index, item)| Fields::new(&format!("{path}[{index}]"), Some(item), &self.notes))
            .collect()
    }

    /// Drops these fields without a note (the API server's bookkeeping).
    pub(super) fn drop(&mut self, keys: &[&str]) {
        for key in keys {
            self.map.remove(*key);
        }
    }

    /// A `not mapped` note with `reason` for `key`, when it is set.
    pub(super) fn unmapped(&mut self, at: &str, key: &str, reason: &str) {
        if self.take(key).is_some() {
            self.notes.unmapped(at, &self.path_of(key), reason);
        }
    }

    /// A note for each field not read, above the output field `at`.
    pub(super) fn finish(self, at: &str) {
        for key in self.map.keys() {
            if self.map[key].is_null() {
                continue;
            }
            self.notes.unmapped(
                at,
                &self.path_of(key),
                "no Setpoint equivalent; check whether it matters",
            );
        }
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn what_is_not_read_is_noted_and_wrong_types_are_notes_not_panics() {
        let notes = Notes::default();
        let mut spec = Fields::new(
            "spec",
            Some(json!({"prune": "yes", "path": "./a", "extra": 1, "gone": null})),
            &notes,
        );
        assert_eq!(spec.string("path").as_deref(), Some("./a"));
        assert_eq!(spec.bool("prune"), None);
        spec.finish("spec");
        let texts: Vec<String> = notes.into_vec().into_iter().map(|n| n.text).collect();
        assert_eq!(
            texts,
            [
                "not mapped: spec.prune (expected true or false, found a string)",
                "not mapped: spec.extra (no Setpoint equivalent; check whether it matters)",
            ]
        );
    }

    #[test]
    fn an_object_that_is_not_one_is_noted() {
        let notes = Notes::default();
        let mut fields = Fields::new("spec.source", Some(json!("text")), &notes);
        assert_eq!(fields.take("repoURL"), None);
        assert_eq!(
            notes.into_vec()[0].text,
            "not mapped: spec.source (expected an object, found a string)"
        );
    }
}
