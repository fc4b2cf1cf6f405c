//! The unit every step passes along: one Kubernetes object as Git declares
//! it (`Manifest`), named by its identity (`ObjectId`).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who an object is: group, version, kind, namespace (None when
/// cluster-scoped) and name. Two manifests with the same identity are an error.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectId {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectId {
    /// `apiVersion` as written in a manifest: `v1` or `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The identity without the version: an object keeps it when Git moves
    /// it from `v1beta1` to `v1`.
    pub fn same_object(&self, other: &ObjectId) -> bool {
        self.group == other.group
            && self.kind == other.kind
            && self.namespace == other.namespace
            && self.name == other.name
    }
}

impl fmt::Display for ObjectId {
    /// `apps/Deployment default/web`, `Namespace team-a`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.kind)?;
        } else {
            write!(f, "{}/{}", self.group, self.kind)?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " {ns}/{}", self.name),
            None => write!(f, " {}", self.name),
        }
    }
}

/// Where in Git a manifest came from, for error messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// Path relative to the repository root.
    pub file: String,
    /// Index of the YAML document in the file, from 0.
    pub document: usize,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (document {})", self.file, self.document)
    }
}

/// One object as Git declares it: the whole manifest body as JSON.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    pub id: ObjectId,
    pub origin: Origin,
    pub body: Value,
}

/// Splits an `apiVersion` into (group, version): `apps/v1` → (`apps`, `v1`),
/// `v1` → (``, `v1`).
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", api_version),
    }
}
