//! `setpoint import` (pure): Argo CD `Application`s and Flux
//! `Kustomization`s and `HelmRelease`s (with the sources they name) mapped
//! to Setpoint Applications, each field that has no Setpoint equivalent
//! kept as a note that the output shows as a YAML comment above the part
//! of the Application it concerns. Nothing here reads a file or a cluster:
//! `cli/import.rs` does, and hands the objects in.
//!
//! The mapping takes each known field out of the object it reads; every
//! field left over becomes a "not mapped" note, so nothing is dropped
//! silently but the bookkeeping of the API server (`uid`,
//! `resourceVersion`, `managedFields`, `status`, …).

mod argocd;
mod emit;
mod fields;
mod flux;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Deserialize;
use serde_json::Value;

use crate::api::{Application, Dependency};

pub use emit::render;
use fields::Notes;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImportError {
    #[error("{origin}: document {document}: not YAML (line {line}): {message}")]
    ParseDocument {
        origin: String,
        document: usize,
        line: usize,
        message: String,
    },
    #[error("{origin}: document {document}: not an object with apiVersion and kind; skipped")]
    NotAnObject { origin: String, document: usize },
    #[error("{object} ({api_version}) is not an Argo CD or Flux kind setpoint imports; skipped")]
    UnknownKind {
        object: String,
        api_version: String,
        kind: String,
    },
    #[error("{object}: {reason}; skipped")]
    NotImported { object: String, reason: String },
    #[error("{object}: {field} is missing; skipped")]
    MissingField { object: String, field: String },
}

/// One object read from a file or the cluster, and where it came from
/// (`apps.yaml, document 3`, `the cluster`) for messages.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceObject {
    pub origin: String,
    pub document: usize,
    pub value: Value,
}

/// Where each Setpoint Application is to live.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AppNamespace {
    /// The namespace its objects go to (Argo CD's `destination.namespace`,
    /// Flux's `targetNamespace`), else the imported object's own.
    #[default]
    Destination,
    /// The imported object's own namespace (`argocd`, `flux-system`).
    Source,
    /// This one for every Application.
    Fixed(String),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub app_namespace: AppNamespace,
    /// Namespaces renamed after the choice above (`argocd=gitops`), for the
    /// Applications and the namespaces their `dependsOn` names.
    pub namespace_map: BTreeMap<String, String>,
}

impl AppNamespace {
    /// `destination`, `source`, or a namespace's name.
    pub fn parse(text: &str) -> Self {
        match text {
            "destination" => AppNamespace::Destination,
            "source" => AppNamespace::Source,
            other => AppNamespace::Fixed(other.to_string()),
        }
    }
}

/// One imported Application and what its output shows as comments.
#[derive(Clone, Debug)]
pub struct Imported {
    /// The object it came from: `Argo CD Application argocd/guestbook`.
    pub from: String,
    pub application: Application,
    pub notes: Vec<Note>,
}

/// A comment in the output, above the line of the Application's field `at`
/// (`spec.source.helm`; the nearest parent present when that one is
/// absent; `""` for the top of the document).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub at: String,
    pub text: String,
}

/// What an import made of its input.
#[derive(Debug, Default)]
pub struct Outcome {
    pub imported: Vec<Imported>,
    /// What was skipped, and why (for stderr).
    pub problems: Vec<ImportError>,
}

/// Which kind of object an imported Application came from, as `dependsOn`
/// names others of the same kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Family {
    ArgoCd,
    Kustomization,
    HelmRelease,
}

/// An imported object: its family, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SourceKey {
    family: Family,
    namespace: String,
    name: String,
}

/// An Application before its namespace is decided and its dependencies
/// resolved (those need every object of the input).
struct Draft {
    key: SourceKey,
    from: String,
    application: Application,
    notes: Notes,
    /// The namespace its objects go to, when the object says.
    destination_namespace: Option<String>,
    /// The namespace of the Secret `credentialsSecret` names.
    credentials_namespace: Option<String>,
    /// The objects of the same family it waits for.
    depends_on: Vec<SourceKey>,
}

/// Splits `text` into its YAML documents (at `---` lines, so one broken
/// document does not hide the others) and parses each; a `List` is
/// flattened into its items.
pub fn parse_documents(origin: &str, text: &str) -> (Vec<SourceObject>, Vec<ImportError>) {
    let mut objects = Vec::new();
    let mut problems = Vec::new();
    for (index, (first_line, document)) in split_documents(text).into_iter().enumerate() {
        let document_number = index + 1;
        let parsed = serde_yaml::Deserializer::from_str(&document)
            .next()
            .map(Value::deserialize);
        let value = match parsed {
            None | Some(Ok(Value::Null)) => continue,
            Some(Ok(value)) => value,
            Some(Err(error)) => {
                problems.push(ImportError::ParseDocument {
                    origin: origin.to_string(),
                    document: document_number,
                    line: first_line + error.location().map_or(1, |l| l.line()).saturating_sub(1),
                    message: without_location(&error.to_string()),
                });
                continue;
            }
        };
        flatten(origin, document_number, value, &mut objects, &mut problems);
    }
    (objects, problems)
}

fn flatten(
    origin: &str,
    document: usize,
    value: Value,
    objects: &mut Vec<SourceObject>,
    problems: &mut Vec<ImportError>,
) {
    let is_object = value.get("kind").and_then(Value::as_str).is_some()
        && value.get("apiVersion").and_then(Value::as_str).is_some();
    if !is_object {
        problems.push(ImportError::NotAnObject {
            origin: origin.to_string(),
            document,
        });
        return;
    }
    if value["kind"] == "List" && value["apiVersion"] == "v1" {
        let items = match value.get("items") {
            Some(Value::Array(items)) => items.clone(),
            _ => Vec::new(),
        };
        for item in items {
            flatten(origin, document, item, objects, problems);
        }
        return;
    }
    objects.push(SourceObject {
        origin: origin.to_string(),
        document,
        value,
    });
}

/// The documents of a multi-document YAML text, each with the number of
/// the line its text starts on (the first is 1). A line `---` (or
/// `--- …`) starts a document, a line `...` ends one.
fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut documents = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (index, line) in text.lines().enumerate() {
        let separator = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if separator || line == "..." {
            if !current.trim().is_empty() {
                documents.push((start, std::mem::take(&mut current)));
            }
            current.clear();
            start = index + 2;
            if let Some(rest) = line.strip_prefix("---").filter(|r| !r.trim().is_empty()) {
                // `--- !tag` or `--- {a: 1}`: the rest is the document's start.
                current.push_str(rest.trim_start());
                current.push('\n');
                start = index + 1;
            }
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    if !current.trim().is_empty() {
        documents.push((start, current));
    }
    documents
}

/// serde_yaml puts " at line L column C" in its message; the error names the
/// line (of the whole file) already.
fn without_location(message: &str) -> String {
    match message.find(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

/// The group of an `apiVersion` (`argoproj.io/v1alpha1` → `argoproj.io`).
fn group_of(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// `Kind namespace/name` (or `Kind name`) for messages.
fn describe(value: &Value) -> String {
    let kind = value
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("object");
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("(no name)");
    match value.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(namespace) => format!("{kind} {namespace}/{name}"),
        None => format!("{kind} {name}"),
    }
}

/// Imports every Argo CD Application, Flux Kustomization and HelmRelease of
/// `objects`; the Flux sources they name are looked up among `objects`.
pub fn import(objects: &[SourceObject], options: &Options) -> Outcome {
    let mut outcome = Outcome::default();
    let sources = flux::Sources::new(objects);
    let mut drafts = Vec::new();
    for object in objects {
        let value = &object.value;
        let api_version = value["apiVersion"].as_str().unwrap_or_default();
        let kind = value["kind"].as_str().unwrap_or_default();
        let drafted = match (group_of(api_version), kind) {
            ("argoproj.io", "Application") => argocd::application(value),
            ("argoproj.io", "AppProject") => Err(ImportError::NotImported {
                object: describe(value),
                reason: "Argo CD projects map to Setpoint's namespaces and tenancy (an \
                         Application acts as a service account of its namespace), not to an \
                         object"
                    .into(),
            }),
            ("argoproj.io", "ApplicationSet") => Err(ImportError::NotImported {
                object: describe(value),
                reason: "write it as a Setpoint ApplicationSet (setpoint.dev/v1alpha1); \
                         import maps Applications only"
                    .into(),
            }),
            ("kustomize.toolkit.fluxcd.io", "Kustomization") => {
                flux::kustomization(value, &sources)
            }
            ("helm.toolkit.fluxcd.io", "HelmRelease") => flux::helm_release(value, &sources),
            // Read when a Kustomization or a HelmRelease names them.
            ("source.toolkit.fluxcd.io", _) if flux::SOURCE_KINDS.contains(&kind) => continue,
            _ => Err(ImportError::UnknownKind {
                object: format!(
                    "{}, document {}: {}",
                    object.origin,
                    object.document,
                    describe(value)
                ),
                api_version: api_version.to_string(),
                kind: kind.to_string(),
            }),
        };
        match drafted {
            Ok(draft) => drafts.push(draft),
            Err(problem) => outcome.problems.push(problem),
        }
    }
    for unused in sources.unused() {
        outcome.problems.push(ImportError::NotImported {
            object: unused,
            reason: "no Kustomization or HelmRelease of the input uses it".into(),
        });
    }
    outcome.imported = finish(drafts, options);
    outcome
}

/// Decides each Application's namespace, then points each `dependsOn` at
/// the Application its dependency became.
fn finish(drafts: Vec<Draft>, options: &Options) -> Vec<Imported> {
    let renamed = |namespace: &str| -> String {
        options
            .namespace_map
            .get(namespace)
            .cloned()
            .unwrap_or_else(|| namespace.to_string())
    };
    let mut placed: HashMap<SourceKey, (Option<String>, String)> = HashMap::new();
    let mut drafts: Vec<Draft> = drafts
        .into_iter()
        .map(|mut draft| {
            let own = draft.application.metadata.namespace.clone();
            let chosen = match &options.app_namespace {
                AppNamespace::Destination => match &draft.destination_namespace {
                    Some(destination) => Some(destination.clone()),
                    None => {
                        if let Some(own) = &own {
                            draft.notes.add(
                                "metadata.namespace",
                                format!(
                                    "note: no destination namespace: the Application stays in \
                                     {own}, where its namespaced objects that name none go"
                                ),
                            );
                        }
                        own.clone()
                    }
                },
                AppNamespace::Source => own.clone(),
                AppNamespace::Fixed(namespace) => Some(namespace.clone()),
            };
            let chosen = chosen.map(|n| renamed(&n));
            if chosen != own && draft.application.spec.service_account_name.is_some() {
                draft.notes.add(
                    "spec.serviceAccountName",
                    "note: the service account must exist in the Application's new namespace \
                     (Setpoint impersonates it there)",
                );
            }
            if let Some(secret_namespace) = &draft.credentials_namespace
                && draft.application.spec.source.credentials_secret.is_some()
                && chosen.as_ref() != Some(secret_namespace)
            {
                draft.notes.add(
                    "spec.source.credentialsSecret",
                    format!(
                        "note: the Secret is in {secret_namespace}: Setpoint reads it from the \
                         Application's own namespace, so copy it there"
                    ),
                );
            }
            draft.application.metadata.namespace = chosen.clone();
            let name = draft.application.metadata.name.clone().unwrap_or_default();
            placed.insert(draft.key.clone(), (chosen, name));
            draft
        })
        .collect();
    let mut seen = HashSet::new();
    for draft in &mut drafts {
        let own = draft.application.metadata.namespace.clone();
        let name = draft.application.metadata.name.clone().unwrap_or_default();
        if !seen.insert((own.clone(), name.clone())) {
            draft.notes.add(
                "metadata.name",
                format!(
                    "note: another imported Application is also named {}/{name}: rename one",
                    own.as_deref().unwrap_or("")
                ),
            );
        }
        for wanted in std::mem::take(&mut draft.depends_on) {
            let (namespace, name) = match placed.get(&wanted) {
                Some((namespace, name)) => (namespace.clone(), name.clone()),
                None => {
                    draft.notes.add(
                        "spec.dependsOn",
                        format!(
                            "note: dependency {}/{} is not in the input: its Setpoint Application \
                             is assumed to keep that name and namespace",
                            wanted.namespace, wanted.name
                        ),
                    );
                    let namespace = Some(renamed(&wanted.namespace)).filter(|n| !n.is_empty());
                    (namespace, wanted.name.clone())
                }
            };
            let namespace = namespace.filter(|n| Some(n) != own.as_ref());
            draft
                .application
                .spec
                .depends_on
                .push(Dependency { name, namespace });
        }
    }
    drafts
        .into_iter()
        .map(|draft| Imported {
            from: draft.from,
            application: draft.application,
            notes: draft.notes.into_vec(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
