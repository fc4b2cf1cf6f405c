//! An Argo CD `Application` (`argoproj.io/v1alpha1`) as a Setpoint
//! Application (pure): Setpoint's spec follows Argo CD's, so most fields
//! keep their name; what has no equivalent (projects, plugins, several
//! sources, notifications) becomes a note.

use kube::api::ObjectMeta;
use serde_json::Value;

use crate::api::{
    Application, ApplicationSpec, Automated, Destination, DirectorySource, HelmSource,
    IgnoreDifferences, JsonnetSource, JsonnetVar, KustomizeSource, Source, SyncPolicy,
};
use crate::reconcile::finalize::ARGO_CD_FINALIZER;
use crate::reconcile::sync_options;
use crate::source::repo_url::display_url;

use super::fields::{Fields, Notes};
use super::{Draft, Family, ImportError, SourceKey, describe};

/// Metadata the API server keeps, not the user: dropped without a note.
pub(super) const BOOKKEEPING: [&str; 8] = [
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

pub(super) fn application(value: &Value) -> Result<Draft, ImportError> {
    let object = describe(value);
    let notes = Notes::default();
    let mut root = Fields::new("", Some(value.clone()), &notes);
    root.drop(&["apiVersion", "kind", "status"]);
    root.unmapped(
        "",
        "operation",
        "an Argo CD operation in progress is not imported; `setpoint app sync` starts one",
    );
    let mut metadata_fields = root.object("metadata");
    let metadata = metadata(&mut metadata_fields, &notes);
    metadata_fields.finish("metadata");
    let Some(name) = metadata.name.clone() else {
        return Err(ImportError::MissingField {
            object,
            field: "metadata.name".into(),
        });
    };
    let mut spec = root.object("spec");
    if let Some(project) = spec.string("project") {
        notes.unmapped(
            "",
            &format!("spec.project {project:?}"),
            "Argo CD projects map to Setpoint's namespaces and tenancy: an Application acts as \
             the service account spec.serviceAccountName of its own namespace unless that \
             namespace is one of tenancy.adminNamespaces, and RBAC decides what it may do",
        );
    }
    let source = match (spec.has("source"), spec.has("sources")) {
        (true, _) => {
            if spec.has("sources") {
                spec.unmapped(
                    "spec.source",
                    "sources",
                    "spec.source is set too; Argo CD uses spec.sources then, Setpoint spec.source",
                );
            }
            let fields = spec.object("source");
            source(fields, &notes)
        }
        (false, true) => sources(&mut spec, &notes),
        (false, false) => {
            return Err(ImportError::MissingField {
                object,
                field: "spec.source (or spec.sources)".into(),
            });
        }
    };
    let destination = destination(spec.object("destination"));
    let sync_policy = sync_policy(spec.object("syncPolicy"), &notes);
    let ignore_differences = spec
        .objects("ignoreDifferences")
        .into_iter()
        .filter_map(|rule| ignore_rule(rule, &notes))
        .collect();
    spec.unmapped(
        "",
        "info",
        "Argo CD's information fields for its UI; Setpoint has none",
    );
    spec.unmapped(
        "",
        "revisionHistoryLimit",
        "Setpoint keeps the last 10 syncs in status.history",
    );
    spec.finish("spec");
    root.finish("");
    let destination_namespace = destination.namespace.clone();
    let application = Application {
        metadata,
        spec: ApplicationSpec {
            source,
            destination,
            sync_policy,
            ignore_differences,
            ..Default::default()
        },
        status: None,
    };
    Ok(Draft {
        key: SourceKey {
            family: Family::ArgoCd,
            namespace: application.metadata.namespace.clone().unwrap_or_default(),
            name,
        },
        from: format!(
            "Argo CD {object} ({})",
            value["apiVersion"].as_str().unwrap_or("")
        ),
        application,
        notes,
        destination_namespace,
        credentials_namespace: None,
        depends_on: Vec::new(),
    })
}

/// The metadata kept: name, namespace, labels, the annotations that are not
/// Argo CD's, and the resources finalizer (which Setpoint honours as is).
fn metadata(fields: &mut Fields, notes: &Notes) -> ObjectMeta {
    fields.drop(&BOOKKEEPING);
    let name = fields.string("name");
    let namespace = fields.string("namespace");
    let labels = fields.string_map("labels");
    let mut annotations = fields.string_map("annotations");
    annotations.retain(|key, value| keep_annotation(key, value, notes));
    let mut finalizers = Vec::new();
    for finalizer in fields.strings("finalizers") {
        if finalizer == ARGO_CD_FINALIZER {
            finalizers.push(finalizer);
        } else if let Some(policy) = finalizer.strip_prefix(&format!("{ARGO_CD_FINALIZER}/")) {
            notes.add(
                "metadata.finalizers",
                format!(
                    "note: {finalizer}: Setpoint deletes the objects in prune's order, without \
                     Argo CD's {policy} propagation"
                ),
            );
            finalizers.push(ARGO_CD_FINALIZER.to_string());
        } else {
            notes.unmapped(
                "metadata",
                &format!("metadata.finalizers {finalizer}"),
                "nothing in Setpoint would remove it, so the Application could never be deleted",
            );
        }
    }
    if fields.take("ownerReferences").is_some() {
        notes.unmapped(
            "metadata",
            "metadata.ownerReferences",
            "its owner (an ApplicationSet?) is not imported with it",
        );
    }
    fields.unmapped(
        "metadata",
        "generateName",
        "a Setpoint Application is named",
    );
    ObjectMeta {
        name,
        namespace,
        labels: Some(labels).filter(|l| !l.is_empty()),
        annotations: Some(annotations).filter(|a| !a.is_empty()),
        finalizers: Some(finalizers).filter(|f| !f.is_empty()),
        ..Default::default()
    }
}

/// Whether an annotation of the Argo CD Application is kept; a note for
/// each one that is Argo CD's.
fn keep_annotation(key: &str, value: &str, notes: &Notes) -> bool {
    let field = format!("metadata.annotations[{key}]");
    if key == "kubectl.kubernetes.io/last-applied-configuration" {
        return false;
    }
    if key.starts_with("notifications.argoproj.io/") {
        notes.unmapped(
            "metadata",
            &field,
            "Argo CD notifications; Setpoint reports through Kubernetes Events on the \
             Application, commit statuses and its metrics",
        );
        return false;
    }
    match key {
        "argocd.argoproj.io/sync-wave" => notes.unmapped(
            "metadata",
            &format!("{field} {value:?}"),
            "Applications ordered by waves in an app of apps: say it with spec.dependsOn",
        ),
        "argocd.argoproj.io/manifest-generate-paths" => notes.unmapped(
            "metadata",
            &field,
            "Setpoint routes a push by the paths the last render read (status.sourceInputs)",
        ),
        "argocd.argoproj.io/refresh" => return false,
        _ if key.starts_with("argocd.argoproj.io/") || key.starts_with("argoproj.io/") => notes
            .unmapped(
                "metadata",
                &field,
                "an Argo CD annotation with no Setpoint equivalent",
            ),
        _ => return true,
    }
    false
}

/// `spec.source`, or one of `spec.sources`.
fn source(mut fields: Fields, notes: &Notes) -> Source {
    let at = "spec.source";
    let repo_url = fields.string("repoURL").unwrap_or_default();
    let shown = display_url(&repo_url);
    if shown != repo_url.trim() {
        notes.add(
            at,
            "note: credentials removed from repoURL: put them in a Secret (username and \
             password, or token) named by spec.source.credentialsSecret",
        );
    }
    let chart = fields.string("chart");
    let repo_url = match &chart {
        // Argo CD names an OCI Helm repository without a scheme.
        Some(_) if !shown.contains("://") && !shown.is_empty() => {
            notes.add(
                at,
                "note: a chart repository named without a scheme is an OCI registry in Argo CD; \
                 Setpoint names it oci://",
            );
            format!("oci://{shown}")
        }
        _ => shown,
    };
    let target_revision = fields.string("targetRevision");
    let path = fields.string("path");
    let helm = fields
        .has("helm")
        .then(|| helm(fields.object("helm"), notes));
    let kustomize = fields.has("kustomize").then(|| {
        let mut kustomize = fields.object("kustomize");
        for key in [
            "namePrefix",
            "nameSuffix",
            "images",
            "commonLabels",
            "commonAnnotations",
            "labelWithoutSelector",
            "namespace",
            "replicas",
            "patches",
            "components",
            "forceCommonLabels",
            "forceCommonAnnotations",
        ] {
            kustomize.unmapped(
                "spec.source.kustomize",
                key,
                "Setpoint runs the path's kustomization.yaml as it is: put it there",
            );
        }
        kustomize.unmapped(
            "spec.source.kustomize",
            "version",
            "Setpoint runs kubectl kustomize",
        );
        kustomize.finish("spec.source.kustomize");
        KustomizeSource {}
    });
    let directory = fields
        .has("directory")
        .then(|| directory(fields.object("directory"), notes));
    fields.unmapped(
        at,
        "plugin",
        "config management plugins have no Setpoint equivalent",
    );
    fields.unmapped(
        at,
        "ref",
        "a source that only lends its files to another source has no Setpoint equivalent",
    );
    fields.drop(&["name"]);
    fields.finish(at);
    Source {
        repo_url,
        chart,
        target_revision,
        path,
        credentials_secret: None,
        directory,
        kustomize,
        helm,
        verify: None,
    }
}

/// `spec.sources`: one source maps; of several, the first that renders
/// something (has no `ref` only) is kept and the others noted.
fn sources(spec: &mut Fields, notes: &Notes) -> Source {
    let mut all = spec.objects("sources");
    if all.is_empty() {
        notes.unmapped(
            "spec.source",
            "spec.sources",
            "it is empty; fill in spec.source",
        );
        return Source::default();
    }
    let chosen = all
        .iter()
        .position(|source| !(source.has("ref") && !source.has("path") && !source.has("chart")))
        .unwrap_or(0);
    let count = all.len();
    if count > 1 {
        notes.unmapped(
            "spec.source",
            &format!("spec.sources (all but spec.sources[{chosen}])"),
            "a Setpoint Application has one source: make one Application per source; \
             $ref values files of another source do not resolve",
        );
    }
    source(all.swap_remove(chosen), notes)
}

fn helm(mut fields: Fields, notes: &Notes) -> HelmSource {
    let at = "spec.source.helm";
    let release_name = fields.string("releaseName");
    let value_files = fields.strings("valueFiles");
    for file in value_files.iter().filter(|f| f.starts_with('$')) {
        notes.unmapped(
            at,
            &format!("{}.valueFiles {file}", fields.path),
            "a values file of another source has no Setpoint equivalent",
        );
    }
    let value_files = value_files
        .into_iter()
        .filter(|f| !f.starts_with('$'))
        .collect();
    let values = match fields.take("values") {
        None => None,
        Some(Value::String(text)) => Some(text),
        // Some write it as an object; it is YAML either way.
        Some(other) => serde_yaml::to_string(&other).ok(),
    };
    let values_object = fields.take("valuesObject");
    let skip_crds = fields.bool("skipCrds").unwrap_or(false);
    fields.unmapped(
        at,
        "parameters",
        "write them into valuesObject; helm --set has no Setpoint equivalent",
    );
    fields.unmapped(
        at,
        "fileParameters",
        "helm --set-file has no Setpoint equivalent",
    );
    fields.unmapped(
        at,
        "ignoreMissingValueFiles",
        "a values file Setpoint cannot read is an error",
    );
    fields.unmapped(
        at,
        "namespace",
        "Setpoint renders with the destination namespace",
    );
    fields.unmapped(
        at,
        "kubeVersion",
        "Setpoint renders with the destination cluster's version",
    );
    fields.unmapped(
        at,
        "apiVersions",
        "Setpoint renders with the destination cluster's API groups",
    );
    fields.drop(&["version"]);
    fields.finish(at);
    HelmSource {
        release_name,
        value_files,
        values,
        values_object,
        skip_crds,
    }
}

fn directory(mut fields: Fields, notes: &Notes) -> DirectorySource {
    let at = "spec.source.directory";
    if fields.bool("recurse") != Some(true) {
        notes.add(
            at,
            "note: Setpoint reads the files of subdirectories of the path too (Argo CD only with \
             directory.recurse: true)",
        );
    }
    let jsonnet = fields.has("jsonnet").then(|| {
        let mut jsonnet = fields.object("jsonnet");
        let vars = |jsonnet: &mut Fields, key: &str| -> Vec<JsonnetVar> {
            jsonnet
                .objects(key)
                .into_iter()
                .filter_map(|mut var| {
                    let name = var.string("name")?;
                    let value = var.string("value").unwrap_or_default();
                    let code = var.bool("code").unwrap_or(false);
                    var.finish(at);
                    Some(JsonnetVar { name, value, code })
                })
                .collect()
        };
        let ext_vars = vars(&mut jsonnet, "extVars");
        let tlas = vars(&mut jsonnet, "tlas");
        let libs = jsonnet.strings("libs");
        jsonnet.finish(at);
        JsonnetSource {
            ext_vars,
            tlas,
            libs,
        }
    });
    fields.unmapped(
        at,
        "include",
        "Setpoint reads every .yaml, .yml, .json and .jsonnet file under the path",
    );
    fields.unmapped(
        at,
        "exclude",
        "Setpoint reads every .yaml, .yml, .json and .jsonnet file under the path",
    );
    fields.finish(at);
    DirectorySource { jsonnet }
}

fn destination(mut fields: Fields) -> Destination {
    let destination = Destination {
        name: fields.string("name"),
        server: fields.string("server"),
        namespace: fields.string("namespace"),
    };
    fields.finish("spec.destination");
    destination
}

fn sync_policy(mut fields: Fields, notes: &Notes) -> SyncPolicy {
    let at = "spec.syncPolicy";
    let mut policy = SyncPolicy::default();
    if fields.has("automated") {
        let mut automated = fields.object("automated");
        let prune = automated.bool("prune").unwrap_or(false);
        let self_heal = automated.bool("selfHeal").unwrap_or(false);
        policy.allow_empty = automated.bool("allowEmpty").unwrap_or(false);
        if automated.bool("enabled") == Some(false) {
            notes.add(
                at,
                "note: syncPolicy.automated.enabled is false: syncs only on request",
            );
        } else {
            policy.automated = Some(Automated { prune, self_heal });
        }
        automated.finish(at);
    }
    for option in fields.strings("syncOptions") {
        match sync_options::of_application(std::slice::from_ref(&option)) {
            Ok(_) => policy.sync_options.push(option),
            Err(error) => notes.unmapped(
                at,
                &format!("spec.syncPolicy.syncOptions {option}"),
                &error.to_string(),
            ),
        }
    }
    fields.unmapped(
        at,
        "retry",
        "Setpoint retries a failed sync on its own, with backoff, until Git changes or it \
         succeeds",
    );
    fields.unmapped(
        at,
        "managedNamespaceMetadata",
        "CreateNamespace=true creates a plain Namespace; put its labels in Git",
    );
    fields.finish(at);
    policy
}

fn ignore_rule(mut rule: Fields, notes: &Notes) -> Option<IgnoreDifferences> {
    let at = "spec.ignoreDifferences";
    let Some(kind) = rule.string("kind") else {
        notes.unmapped(at, &rule.path, "it names no kind");
        return None;
    };
    let mapped = IgnoreDifferences {
        group: rule.string("group").unwrap_or_default(),
        kind,
        name: rule.string("name"),
        namespace: rule.string("namespace"),
        json_pointers: rule.strings("jsonPointers"),
        managed_fields_managers: rule.strings("managedFieldsManagers"),
    };
    rule.unmapped(
        at,
        "jqPathExpressions",
        "Setpoint ignores fields by JSON pointer or by field manager; write them as jsonPointers",
    );
    rule.finish(at);
    if mapped.json_pointers.is_empty() && mapped.managed_fields_managers.is_empty() {
        return None;
    }
    Some(mapped)
}
