//! Parameters: what one generator result is, before the template fills in.
//! A parameter set is flat, keyed exactly as Argo CD's default
//! (fasttemplate) syntax names parameters: `path.basename`, `path[0]` and
//! `metadata.labels.app.kubernetes.io/name` are names, not expressions, so
//! a template's `{{ path[0] }}` is one lookup in the map.

use std::collections::BTreeMap;

use serde_json::Value;

/// One parameter set: the values one Application's template is filled with.
pub type Params = BTreeMap<String, String>;

/// An object's keys, nested ones joined with `.` (`{"a":{"b":1}}` gives
/// `a.b`) and list elements by index (`a.0`), as Argo CD flattens a list
/// element or a Git file for its default syntax. Numbers and booleans are
/// their JSON text; null is empty, so `{{ key }}` of a null key renders as
/// nothing rather than failing as an unknown parameter. A top-level
/// non-object gives nothing: the generator that calls this says what it
/// expected.
pub fn flatten(value: &Value) -> Params {
    let mut params = Params::new();
    if let Value::Object(object) = value {
        for (key, value) in object {
            flatten_into(key.clone(), value, &mut params);
        }
    }
    params
}

fn flatten_into(key: String, value: &Value, params: &mut Params) {
    match value {
        Value::Object(object) => {
            for (child, value) in object {
                flatten_into(format!("{key}.{child}"), value, params);
            }
        }
        Value::Array(items) => {
            for (index, value) in items.iter().enumerate() {
                flatten_into(format!("{key}.{index}"), value, params);
            }
        }
        Value::String(text) => {
            params.insert(key, text.clone());
        }
        Value::Null => {
            params.insert(key, String::new());
        }
        Value::Bool(_) | Value::Number(_) => {
            params.insert(key, value.to_string());
        }
    }
}

/// The parameters of a repository directory (`apps/team/x`): `path`,
/// `path.basename`, `path.basenameNormalized`, and each segment as both
/// `path[N]` (Argo CD's default syntax) and `path.segments[N]` (the name
/// its Go-template syntax uses), so either spelling of a template works.
/// The root directory is `""`, with an empty basename and no segments.
pub fn path_params(dir: &str) -> Params {
    let dir = dir.trim_matches('/');
    let basename = dir.rsplit('/').next().unwrap_or("");
    let mut params = Params::new();
    params.insert("path".to_owned(), dir.to_owned());
    params.insert("path.basename".to_owned(), basename.to_owned());
    params.insert(
        "path.basenameNormalized".to_owned(),
        sanitize_name(basename),
    );
    if !dir.is_empty() {
        for (index, segment) in dir.split('/').enumerate() {
            params.insert(format!("path[{index}]"), segment.to_owned());
            params.insert(format!("path.segments[{index}]"), segment.to_owned());
        }
    }
    params
}

/// The parameters of a repository file (`apps/x/config.json`): those of
/// its directory, plus `path.filename` and `path.filenameNormalized`.
pub fn file_params(file: &str) -> Params {
    let file = file.trim_matches('/');
    let (dir, filename) = file.rsplit_once('/').unwrap_or(("", file));
    let mut params = path_params(dir);
    params.insert("path.filename".to_owned(), filename.to_owned());
    params.insert(
        "path.filenameNormalized".to_owned(),
        sanitize_name(filename),
    );
    params
}

/// Argo CD's `SanitizeName`, which its `*Normalized` parameters use:
/// lowercase, every character but `a-z`, `0-9`, `-` and `.` becomes `-`,
/// at most 253 bytes, no leading or trailing `-` or `.`. The same rule, so
/// a name built from `path.basenameNormalized` is the one Argo CD builds.
pub fn sanitize_name(name: &str) -> String {
    let mut sanitized: String = name
        .to_lowercase()
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            _ => '-',
        })
        .collect();
    // Only ASCII remains, so any byte index is a character boundary.
    sanitized.truncate(253);
    sanitized.trim_matches(['-', '.']).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(pairs: &[(&str, &str)]) -> Params {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    #[test]
    fn nested_keys_join_with_dots_and_lists_by_index() {
        let value = json!({
            "cluster": {"name": "prod", "replicas": 3, "canary": false, "zone": null},
            "tags": ["a", {"b": 1.5}],
            "metadata": {"labels": {"app.kubernetes.io/name": "web"}},
            "empty": {}
        });
        assert_eq!(
            flatten(&value),
            params(&[
                ("cluster.canary", "false"),
                ("cluster.name", "prod"),
                ("cluster.replicas", "3"),
                ("cluster.zone", ""),
                ("metadata.labels.app.kubernetes.io/name", "web"),
                ("tags.0", "a"),
                ("tags.1.b", "1.5"),
            ])
        );
    }

    #[test]
    fn a_non_object_flattens_to_nothing() {
        assert!(flatten(&json!(["a"])).is_empty());
        assert!(flatten(&json!("a")).is_empty());
        assert!(flatten(&json!(null)).is_empty());
    }

    #[test]
    fn a_directory_gives_its_path_basename_and_segments() {
        assert_eq!(
            path_params("apps/team/My_App"),
            params(&[
                ("path", "apps/team/My_App"),
                ("path.basename", "My_App"),
                ("path.basenameNormalized", "my-app"),
                ("path[0]", "apps"),
                ("path[1]", "team"),
                ("path[2]", "My_App"),
                ("path.segments[0]", "apps"),
                ("path.segments[1]", "team"),
                ("path.segments[2]", "My_App"),
            ])
        );
    }

    #[test]
    fn the_root_directory_is_empty() {
        assert_eq!(
            path_params(""),
            params(&[
                ("path", ""),
                ("path.basename", ""),
                ("path.basenameNormalized", ""),
            ])
        );
    }

    #[test]
    fn a_file_adds_its_name_to_its_directory() {
        let file = file_params("clusters/eu/Config File.yaml");
        assert_eq!(file["path"], "clusters/eu");
        assert_eq!(file["path.basename"], "eu");
        assert_eq!(file["path[1]"], "eu");
        assert_eq!(file["path.filename"], "Config File.yaml");
        assert_eq!(file["path.filenameNormalized"], "config-file.yaml");

        let root = file_params("config.json");
        assert_eq!(root["path"], "");
        assert_eq!(root["path.filename"], "config.json");
        assert!(!root.contains_key("path[0]"));
    }

    #[test]
    fn names_are_sanitized_as_argo_cd_does() {
        assert_eq!(sanitize_name("_Team.One_"), "team.one");
        assert_eq!(sanitize_name("a/b c"), "a-b-c");
        assert_eq!(sanitize_name(&"x".repeat(300)).len(), 253);
        assert_eq!(sanitize_name("..--"), "");
    }
}
