//! The plain directory: every `.yaml`, `.yml` and `.json` file under the
//! path, recursively, in path order; multi-document YAML; empty documents
//! skipped; `kind: List` flattened. Pure: a function of the files. Parsing
//! is bounded (`budget`): a file, a document once its aliases are expanded,
//! and the whole render each have a size limit.

use serde::Deserialize;
use serde_json::Value;

use super::budget::{self, ManifestLimits};
use super::{RenderError, check_unique};
use crate::manifest::{Manifest, ObjectId, Origin, split_api_version};
use crate::source::git::SourceFile;

pub fn render(files: &[SourceFile], budget: &mut Budget) -> Result<Vec<Manifest>, RenderError> {
    let mut files: Vec<&SourceFile> = files.iter().filter(|f| is_manifest(&f.path)).collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut manifests = Vec::new();
    for file in files {
        budget.check(file, true)?;
        manifests.extend(parse_objects(file)?);
    }
    check_unique(&manifests)?;
    Ok(manifests)
}

/// What one render's parsing may still cost: the per-file and per-document
/// limits, and the bytes left for the whole render (its documents' expanded
/// sizes added up).
#[derive(Clone, Debug)]
pub struct Budget {
    pub limits: ManifestLimits,
    left: u64,
    total: u64,
}

impl Budget {
    /// `total`: the bytes all the render's documents may expand to.
    pub fn new(limits: ManifestLimits, total: usize) -> Self {
        let total = total as u64;
        Budget {
            limits,
            left: total,
            total,
        }
    }

    /// Refuses `file` when it is larger than a manifest file may be (a
    /// file from Git; a renderer's output is bounded as it is read), or when
    /// one of its documents expands beyond the limits.
    fn check(&mut self, file: &SourceFile, from_git: bool) -> Result<(), RenderError> {
        let too_large = |document: Option<usize>, message: String| RenderError::ManifestTooLarge {
            file: file.path.clone(),
            document,
            message,
        };
        let limits = &self.limits;
        if from_git && file.contents.len() > limits.max_file_bytes {
            return Err(too_large(
                None,
                format!(
                    "{} bytes, more than the {} a manifest file may have (limit SETPOINT_MAX_MANIFEST_BYTES)",
                    file.contents.len(),
                    limits.max_file_bytes
                ),
            ));
        }
        let expanded = if file.path.to_ascii_lowercase().ends_with(".json") {
            // JSON has no aliases: its size is its size.
            file.contents.len() as u64
        } else {
            budget::scan(&file.contents, limits)
                .map_err(|e| too_large(Some(e.document), e.message))?
                .iter()
                .map(|size| size.bytes)
                .sum()
        };
        self.charge(&file.path, expanded)
    }

    /// Takes `bytes` of `file` from what the render may still produce.
    fn charge(&mut self, file: &str, bytes: u64) -> Result<(), RenderError> {
        self.left = self
            .left
            .checked_sub(bytes)
            .ok_or_else(|| RenderError::ManifestTooLarge {
                file: file.to_string(),
                document: None,
                message: format!(
                    "the render's manifests add up to more than {} bytes (limit SETPOINT_RENDER_MAX_OUTPUT)",
                    self.total
                ),
            })?;
        Ok(())
    }
}

/// The objects of one JSON text an evaluation produced (a `.jsonnet`
/// file's, named by `file`): an object, or an array of objects (`null`
/// items skipped), each flattened as a YAML document is.
pub(super) fn json_objects(
    file: &str,
    json: &str,
    budget: &mut Budget,
) -> Result<Vec<Manifest>, RenderError> {
    budget.charge(file, json.len() as u64)?;
    let value: Value = serde_json::from_str(json).map_err(|e| RenderError::ParseManifest {
        file: file.to_string(),
        document: 0,
        line: Some(e.line()),
        message: e.to_string(),
    })?;
    let origin = Origin {
        file: file.to_string(),
        document: 0,
    };
    let mut manifests = Vec::new();
    match value {
        Value::Array(items) => {
            for item in items.into_iter().filter(|item| !item.is_null()) {
                flatten(item, &origin, &mut manifests)?;
            }
        }
        Value::Null => {}
        value => flatten(value, &origin, &mut manifests)?,
    }
    Ok(manifests)
}

/// The objects of one renderer's output (named like a file), in document
/// order.
pub(super) fn rendered_objects(
    output: &SourceFile,
    budget: &mut Budget,
) -> Result<Vec<Manifest>, RenderError> {
    budget.check(output, false)?;
    parse_objects(output)
}

/// The objects of one YAML or JSON file, in document order; its cost was
/// checked.
fn parse_objects(file: &SourceFile) -> Result<Vec<Manifest>, RenderError> {
    let mut manifests = Vec::new();
    for (document, value) in parse_file(file)? {
        let origin = Origin {
            file: file.path.clone(),
            document,
        };
        flatten(value, &origin, &mut manifests)?;
    }
    Ok(manifests)
}

fn is_manifest(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower.ends_with(".yaml") || lower.ends_with(".yml") || lower.ends_with(".json")
}

/// The documents of one file, with their index; empty ones dropped.
fn parse_file(file: &SourceFile) -> Result<Vec<(usize, Value)>, RenderError> {
    if file.path.to_ascii_lowercase().ends_with(".json") {
        let value: Value =
            serde_json::from_slice(&file.contents).map_err(|e| RenderError::ParseManifest {
                file: file.path.clone(),
                document: 0,
                line: Some(e.line()),
                message: e.to_string(),
            })?;
        return Ok(if value.is_null() {
            vec![]
        } else {
            vec![(0, value)]
        });
    }
    let mut documents = Vec::new();
    for (index, document) in serde_yaml::Deserializer::from_slice(&file.contents).enumerate() {
        let value = Value::deserialize(document).map_err(|e| RenderError::ParseManifest {
            file: file.path.clone(),
            document: index,
            line: e.location().map(|l| l.line()),
            message: strip_location(&e.to_string()),
        })?;
        if !value.is_null() {
            documents.push((index, value));
        }
    }
    Ok(documents)
}

/// serde_yaml says " at line L column C" inside its message; the error
/// already has the line, so keep the column only.
fn strip_location(message: &str) -> String {
    let Some(at) = message.find(" at line ") else {
        return message.to_string();
    };
    let rest = &message[at + " at line ".len()..];
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    let rest = &rest[digits..];
    match rest.strip_prefix(" column ") {
        Some(column) => format!("{} at column {column}", &message[..at]),
        None => format!("{}{rest}", &message[..at]),
    }
}

fn flatten(value: Value, origin: &Origin, out: &mut Vec<Manifest>) -> Result<(), RenderError> {
    let invalid = |message: String| RenderError::InvalidObject {
        origin: origin.clone(),
        message,
    };
    if !value.is_object() {
        return Err(invalid(format!(
            "expected an object, found {}",
            json_type(&value)
        )));
    }
    if value["kind"] == "List" && value.get("items").is_some() {
        let Value::Array(items) = value["items"].clone() else {
            return Err(invalid("a List's items must be a list".into()));
        };
        for item in items {
            flatten(item, origin, out)?;
        }
        return Ok(());
    }
    let field = |name: &str, value: &Value| -> Result<String, RenderError> {
        match value {
            Value::String(s) if !s.is_empty() => Ok(s.clone()),
            Value::Null => Err(invalid(format!("{name} is missing"))),
            _ => Err(invalid(format!("{name} must be a non-empty string"))),
        }
    };
    let api_version = field("apiVersion", &value["apiVersion"])?;
    let kind = field("kind", &value["kind"])?;
    // An object given only `generateName` is named when a sync creates it:
    // allowed for hooks only (`reconcile::ordering` refuses the others).
    let name = match (
        &value["metadata"]["name"],
        &value["metadata"]["generateName"],
    ) {
        (Value::Null, Value::String(prefix)) if !prefix.is_empty() => prefix.clone(),
        (name, _) => field("metadata.name", name)?,
    };
    let namespace = match &value["metadata"]["namespace"] {
        Value::Null => None,
        Value::String(s) if s.is_empty() => None,
        Value::String(s) => Some(s.clone()),
        _ => return Err(invalid("metadata.namespace must be a string".into())),
    };
    let (group, version) = split_api_version(&api_version);
    let id = ObjectId {
        group: group.to_string(),
        version: version.to_string(),
        kind,
        namespace,
        name,
    };
    out.push(Manifest {
        id,
        origin: origin.clone(),
        body: value,
    });
    Ok(())
}

fn json_type(value: &Value) -> &'static str {
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

    fn file(path: &str, contents: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            contents: contents.as_bytes().to_vec(),
        }
    }

    fn render(files: &[SourceFile]) -> Result<Vec<Manifest>, RenderError> {
        super::render(files, &mut Budget::new(ManifestLimits::default(), 32 << 20))
    }

    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n";

    #[test]
    fn reads_yaml_yml_and_json_recursively_in_path_order() {
        let manifests = render(&[
            file("app/z.yaml", &CM.replace("name: a", "name: z")),
            file("app/README.md", "# not a manifest"),
            file("app/sub/b.yml", &CM.replace("name: a", "name: b")),
            file(
                "app/c.json",
                r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"c","namespace":"x"}}"#,
            ),
        ])
        .unwrap();
        let names: Vec<_> = manifests.iter().map(|m| m.id.name.as_str()).collect();
        assert_eq!(names, ["c", "b", "z"]);
        assert_eq!(manifests[0].id.group, "apps");
        assert_eq!(manifests[0].id.version, "v1");
        assert_eq!(manifests[0].id.namespace.as_deref(), Some("x"));
        assert_eq!(manifests[1].id.group, "");
        assert_eq!(
            manifests[1].origin,
            Origin {
                file: "app/sub/b.yml".into(),
                document: 0
            }
        );
    }

    #[test]
    fn multi_document_yaml_skips_empty_documents() {
        let text = format!(
            "---\n{CM}---\n# only a comment\n---\n{}",
            CM.replace("a\n", "b\n")
        );
        let manifests = render(&[file("all.yaml", &text)]).unwrap();
        assert_eq!(manifests.len(), 2);
        assert_eq!(manifests[1].origin.document, 2);
    }

    #[test]
    fn a_list_is_flattened() {
        let text = format!(
            "apiVersion: v1\nkind: List\nitems:\n- {}\n",
            r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}"#
        );
        let manifests = render(&[file("list.yaml", &text)]).unwrap();
        assert_eq!(manifests.len(), 1);
        assert_eq!(manifests[0].id.name, "x");
    }

    #[test]
    fn a_parse_error_names_the_file_the_document_and_the_line() {
        let broken = format!("{CM}---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: [b\n");
        let err = render(&[file("apps/web/broken.yaml", &broken)]).unwrap_err();
        let RenderError::ParseManifest {
            file,
            document,
            line,
            ..
        } = &err
        else {
            panic!("{err}");
        };
        assert_eq!(file, "apps/web/broken.yaml");
        assert_eq!(*document, 1);
        assert!(matches!(line, Some(9) | Some(10)), "line {line:?}");
        let message = err.to_string();
        assert!(
            message.starts_with("apps/web/broken.yaml: document 1, line"),
            "{message}"
        );
        assert!(
            !message.contains("at line 10"),
            "the line is said once: {message}"
        );
    }

    #[test]
    fn a_json_parse_error_has_its_line() {
        let err = render(&[file("x.json", "{\n  \"kind\": \n}")]).unwrap_err();
        assert!(
            matches!(err, RenderError::ParseManifest { line: Some(3), .. }),
            "{err}"
        );
    }

    #[test]
    fn objects_need_api_version_kind_and_name() {
        for (text, missing) in [
            (
                "kind: ConfigMap\nmetadata: {name: a}\n",
                "apiVersion is missing",
            ),
            ("apiVersion: v1\nmetadata: {name: a}\n", "kind is missing"),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
                "metadata.name is missing",
            ),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: 5}\n",
                "must be a non-empty",
            ),
            ("- a\n- b\n", "expected an object, found a list"),
        ] {
            let err = render(&[file("f.yaml", text)]).unwrap_err().to_string();
            assert!(err.contains(missing), "{err} should say {missing}");
            assert!(err.starts_with("f.yaml (document 0)"), "{err}");
        }
    }

    #[test]
    fn the_same_object_twice_is_an_error_whatever_the_version() {
        let other = CM.replace("apiVersion: v1", "apiVersion: v2");
        let err = render(&[file("a.yaml", CM), file("b.yaml", &other)]).unwrap_err();
        assert!(matches!(err, RenderError::DuplicateObject { .. }));
        assert!(
            err.to_string()
                .contains("a.yaml (document 0) and in b.yaml"),
            "{err}"
        );
        // Same name, other namespace: two objects.
        let other_ns = CM.replace("name: a", "name: a\n  namespace: b");
        assert_eq!(
            render(&[file("a.yaml", CM), file("b.yaml", &other_ns)])
                .unwrap()
                .len(),
            2
        );
    }

    fn alias_bomb(items: usize, aliases: usize) -> String {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: bomb}}\na: &a [{}]\nb: [{}]\n",
            vec!["x"; items].join(","),
            vec!["*a"; aliases].join(",")
        )
    }

    #[test]
    fn the_alias_bomb_is_refused_naming_the_file_and_the_document() {
        let started = std::time::Instant::now();
        let text = format!("{CM}---\n{}", alias_bomb(20_000, 20_000));
        let err = render(&[file("apps/bomb.yaml", &text)]).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(err.reason(), "ManifestTooLarge");
        assert!(!err.is_transient());
        assert_eq!(
            err.to_string(),
            "apps/bomb.yaml: document 1: expands to more than 1000000 nodes through aliases (limit SETPOINT_MAX_MANIFEST_NODES)"
        );
    }

    #[test]
    fn anchors_and_aliases_within_the_limits_still_parse() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, labels: &labels {app: web}}\ndata: *labels\n";
        let manifests = render(&[file("a.yaml", text)]).unwrap();
        assert_eq!(manifests[0].body["data"]["app"], "web");
        // The same with the bomb's shape, small.
        let manifests = render(&[file("b.yaml", &alias_bomb(100, 100))]).unwrap();
        assert_eq!(manifests[0].body["b"][99][99], "x");
    }

    #[test]
    fn a_file_over_the_size_limit_is_refused_before_parsing() {
        let limits = ManifestLimits {
            max_file_bytes: 1024,
            ..Default::default()
        };
        let big = format!("{CM}data:\n  x: {}\n", "y".repeat(2048));
        let err = super::render(
            &[file("apps/big.yaml", &big)],
            &mut Budget::new(limits, 1 << 20),
        )
        .unwrap_err();
        assert_eq!(err.reason(), "ManifestTooLarge");
        assert!(
            err.to_string().starts_with(&format!(
                "apps/big.yaml: {} bytes, more than the 1024 a manifest file may have",
                big.len()
            )),
            "{err}"
        );
        // JSON too.
        let json = format!("{{\"x\": \"{}\"}}", "y".repeat(2048));
        let err = super::render(
            &[file("big.json", &json)],
            &mut Budget::new(limits, 1 << 20),
        )
        .unwrap_err();
        assert_eq!(err.reason(), "ManifestTooLarge");
    }

    #[test]
    fn the_whole_render_has_a_budget() {
        let files: Vec<SourceFile> = (0..10)
            .map(|i| {
                file(
                    &format!("f{i}.yaml"),
                    &CM.replace("name: a", &format!("name: a{i}")),
                )
            })
            .collect();
        let err =
            super::render(&files, &mut Budget::new(ManifestLimits::default(), 300)).unwrap_err();
        assert_eq!(err.reason(), "ManifestTooLarge");
        assert!(
            err.to_string()
                .contains("add up to more than 300 bytes (limit SETPOINT_RENDER_MAX_OUTPUT)"),
            "{err}"
        );
        assert_eq!(
            super::render(&files, &mut Budget::new(ManifestLimits::default(), 1 << 20))
                .unwrap()
                .len(),
            10
        );
    }
}
