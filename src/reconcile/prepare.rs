//! Prepare: rendered manifests → the objects Setpoint will apply. Each kind is
//! resolved through discovery (or through a CRD in the same render), the
//! namespace is set, and every object is marked as this Application's with a
//! label (to list them) and an annotation (to be sure), plus the hash of its
//! manifest (to tell a Git change from drift).

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::api::Application;
use crate::manifest::{Manifest, ObjectId};
use crate::reconcile::kinds::{Kind, KindError, Kinds};
use crate::reconcile::plan::HASH_ANNOTATION;
use crate::reconcile::sync_options::{self, Options, OptionsError};
use crate::source::render::{RenderError, check_unique};

/// Selects an Application's objects; the value is `app_label_value`.
pub const APP_LABEL: &str = "setpoint.dev/app";
/// `<namespace>/<name>` of the owning Application: the label may be a hash,
/// this is exact, and both must match before Setpoint touches an object.
pub const APP_ANNOTATION: &str = "setpoint.dev/app";

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("{origin}: {source}")]
    Kind {
        origin: crate::manifest::Origin,
        #[source]
        source: KindError,
    },
    #[error(transparent)]
    Duplicate(#[from] RenderError),
    #[error(transparent)]
    Options(#[from] OptionsError),
}

impl PrepareError {
    pub fn is_transient(&self) -> bool {
        matches!(self, PrepareError::Kind { source, .. } if source.is_transient())
    }
}

/// One object to apply, with the resource that serves it. `kind` is None for
/// an instance of a CRD that this same render installs: it is resolved once
/// the CRD is Established.
pub struct Desired {
    pub manifest: Manifest,
    pub kind: Option<Kind>,
    /// Its sync options: the Application's, then its own annotations'.
    pub options: Options,
}

pub fn owner_key(app: &Application) -> String {
    format!(
        "{}/{}",
        app.metadata.namespace.as_deref().unwrap_or_default(),
        app.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A label value (at most 63 characters) for an Application:
/// `<namespace>.<name>`, or a prefix of it and a hash when that is too long.
pub fn app_label_value(app: &Application) -> String {
    let ns = app.metadata.namespace.as_deref().unwrap_or_default();
    let name = app.metadata.name.as_deref().unwrap_or_default();
    let full = format!("{ns}.{name}");
    if full.len() <= 63 {
        return full;
    }
    let hash = hex::encode(&Sha256::digest(full.as_bytes())[..6]);
    let keep = full[..50].trim_end_matches(['.', '-', '_']);
    format!("{keep}-{hash}")
}

/// The namespace of namespaced objects that name none.
pub fn destination_namespace(app: &Application) -> String {
    app.spec
        .destination
        .namespace
        .clone()
        .filter(|ns| !ns.is_empty())
        .or_else(|| app.metadata.namespace.clone())
        .unwrap_or_else(|| "default".into())
}

pub async fn prepare(
    client: &kube::Client,
    kinds: &Kinds,
    app: &Application,
    manifests: Vec<Manifest>,
) -> Result<Vec<Desired>, PrepareError> {
    let destination = destination_namespace(app);
    let label = app_label_value(app);
    let owner = owner_key(app);
    let app_options = sync_options::of_application(&app.spec.sync_policy.sync_options)?;
    // Kinds that CRDs in this render will serve: (group, kind) → namespaced.
    let crd_kinds: Vec<(String, String, bool)> = manifests
        .iter()
        .filter(|m| m.id.group == "apiextensions.k8s.io" && m.id.kind == "CustomResourceDefinition")
        .filter_map(|m| {
            let spec = &m.body["spec"];
            Some((
                spec["group"].as_str()?.to_string(),
                spec["names"]["kind"].as_str()?.to_string(),
                spec["scope"].as_str() != Some("Cluster"),
            ))
        })
        .collect();

    let mut desired = Vec::with_capacity(manifests.len());
    for mut manifest in manifests {
        let options = sync_options::of_object(
            app_options,
            &manifest.body,
            &format!("{} ({})", manifest.id, manifest.origin),
        )?;
        let api_version = manifest.id.api_version();
        let (kind, namespaced) = match kinds.resolve(client, &api_version, &manifest.id.kind).await
        {
            Ok(kind) => {
                let namespaced = kind.namespaced;
                (Some(kind), namespaced)
            }
            Err(KindError::UnknownKind { .. })
                if crd_kinds
                    .iter()
                    .any(|(g, k, _)| *g == manifest.id.group && *k == manifest.id.kind) =>
            {
                let namespaced = crd_kinds
                    .iter()
                    .find(|(g, k, _)| *g == manifest.id.group && *k == manifest.id.kind)
                    .map(|(_, _, n)| *n)
                    .unwrap_or(true);
                (None, namespaced)
            }
            // Its CRD comes from elsewhere (an operator, another
            // Application): resolved when it is applied, and taken to be
            // namespaced (most custom resources are) until then.
            Err(KindError::UnknownKind { .. }) if options.skip_dry_run_on_missing => (None, true),
            Err(source) => {
                return Err(PrepareError::Kind {
                    origin: manifest.origin.clone(),
                    source,
                });
            }
        };
        mark(&mut manifest, namespaced, &destination, &label, &owner);
        desired.push(Desired {
            manifest,
            kind,
            options,
        });
    }
    let manifests: Vec<Manifest> = desired.iter().map(|d| d.manifest.clone()).collect();
    check_unique(&manifests)?;
    Ok(desired)
}

/// Sets the namespace, the ownership label and annotation, and the hash.
fn mark(manifest: &mut Manifest, namespaced: bool, destination: &str, label: &str, owner: &str) {
    let body = &mut manifest.body;
    let metadata = body
        .as_object_mut()
        .expect("render yields objects")
        .entry("metadata")
        .or_insert_with(|| json!({}));
    if namespaced {
        let ns = metadata["namespace"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or(destination);
        let ns = ns.to_string();
        metadata["namespace"] = Value::String(ns.clone());
        manifest.id.namespace = Some(ns);
    } else {
        if let Some(m) = metadata.as_object_mut() {
            m.remove("namespace");
        }
        manifest.id.namespace = None;
    }
    set_entry(metadata, "labels", APP_LABEL, label);
    set_entry(metadata, "annotations", APP_ANNOTATION, owner);
    if let Some(annotations) = metadata["annotations"].as_object_mut() {
        annotations.remove(HASH_ANNOTATION);
    }
    let hash = manifest_hash(body);
    set_entry(&mut body["metadata"], "annotations", HASH_ANNOTATION, &hash);
}

pub(crate) fn set_entry(metadata: &mut Value, map: &str, key: &str, value: &str) {
    if !metadata[map].is_object() {
        metadata[map] = json!({});
    }
    metadata[map][key] = Value::String(value.to_string());
}

/// A short, stable hash of a manifest (serde_json keeps keys sorted).
pub fn manifest_hash(body: &Value) -> String {
    let canonical = serde_json::to_vec(body).expect("JSON serializes");
    hex::encode(&Sha256::digest(&canonical)[..12])
}

/// The identity of a manifest as the apply step addresses it.
pub fn id_of(desired: &Desired) -> &ObjectId {
    &desired.manifest.id
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Origin;

    fn manifest(body: Value) -> Manifest {
        Manifest {
            id: ObjectId {
                group: "".into(),
                version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: body["metadata"]["namespace"].as_str().map(String::from),
                name: "c".into(),
            },
            origin: Origin {
                file: "c.yaml".into(),
                document: 0,
            },
            body,
        }
    }

    #[test]
    fn marks_namespace_ownership_and_hash() {
        let mut m =
            manifest(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}));
        mark(&mut m, true, "dest", "apps.web", "apps/web");
        assert_eq!(m.id.namespace.as_deref(), Some("dest"));
        assert_eq!(m.body["metadata"]["namespace"], "dest");
        assert_eq!(m.body["metadata"]["labels"][APP_LABEL], "apps.web");
        assert_eq!(
            m.body["metadata"]["annotations"][APP_ANNOTATION],
            "apps/web"
        );
        let hash = m.body["metadata"]["annotations"][HASH_ANNOTATION]
            .as_str()
            .unwrap()
            .to_string();
        // Marking again (the same manifest) gives the same hash.
        let mut again = m.clone();
        mark(&mut again, true, "dest", "apps.web", "apps/web");
        assert_eq!(
            again.body["metadata"]["annotations"][HASH_ANNOTATION],
            hash.as_str()
        );
        // A change in Git changes it.
        let mut changed = m.clone();
        changed.body["data"] = json!({"k": "v"});
        mark(&mut changed, true, "dest", "apps.web", "apps/web");
        assert_ne!(
            changed.body["metadata"]["annotations"][HASH_ANNOTATION],
            hash.as_str()
        );
    }

    #[test]
    fn keeps_an_explicit_namespace_and_drops_it_when_cluster_scoped() {
        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "mine"}});
        let mut m = manifest(body.clone());
        mark(&mut m, true, "dest", "l", "o");
        assert_eq!(m.id.namespace.as_deref(), Some("mine"));
        let mut m = manifest(body);
        mark(&mut m, false, "dest", "l", "o");
        assert_eq!(m.id.namespace, None);
        assert!(m.body["metadata"].get("namespace").is_none());
    }

    #[test]
    fn label_values_fit_in_63_characters() {
        let mut app = Application::new("web", Default::default());
        app.metadata.namespace = Some("team".into());
        assert_eq!(app_label_value(&app), "team.web");
        app.metadata.name = Some("x".repeat(80));
        let long = app_label_value(&app);
        assert!(long.len() <= 63, "{long}");
        app.metadata.name = Some("x".repeat(81));
        assert_ne!(app_label_value(&app), long);
    }
}
