//! Flux objects as Setpoint Applications (pure): a `Kustomization` with the
//! `GitRepository` its `sourceRef` names, and a `HelmRelease` with its
//! `HelmRepository`, `OCIRepository` or `GitRepository`. Flux applies on
//! its own and corrects drift at each interval, so an imported Application
//! is automated with selfHeal (a HelmRelease only with drift detection);
//! what Flux deletes with its object (`prune`, an uninstall) Setpoint
//! deletes through the resources finalizer.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashSet};

use kube::api::ObjectMeta;
use serde_json::Value;

use crate::api::{
    Application, ApplicationSpec, Automated, Destination, HelmSource, Source, SyncPolicy,
};
use crate::reconcile::finalize::FINALIZER;
use crate::source::repo_url::{display_url, normalize_path};

use super::argocd::BOOKKEEPING;
use super::fields::{Fields, Notes};
use super::{Draft, Family, ImportError, SourceKey, SourceObject, describe, group_of};

/// The kinds of `source.toolkit.fluxcd.io` read when something names them.
pub(super) const SOURCE_KINDS: [&str; 5] = [
    "GitRepository",
    "HelmRepository",
    "OCIRepository",
    "Bucket",
    "HelmChart",
];

const INTERVAL: &str = "Setpoint is event-driven: webhooks and watches of the live objects, \
                        and one global sweep (--sweep-interval) for the rest";

/// The Flux sources of the input, by kind, namespace and name, and which
/// ones an imported object used.
pub(super) struct Sources<'a> {
    by_key: BTreeMap<(String, String, String), &'a Value>,
    used: RefCell<HashSet<(String, String, String)>>,
}

impl<'a> Sources<'a> {
    pub(super) fn new(objects: &'a [SourceObject]) -> Self {
        let mut by_key = BTreeMap::new();
        for object in objects {
            let value = &object.value;
            let kind = value["kind"].as_str().unwrap_or_default();
            let group = group_of(value["apiVersion"].as_str().unwrap_or_default());
            if group != "source.toolkit.fluxcd.io" || !SOURCE_KINDS.contains(&kind) {
                continue;
            }
            let namespace = value
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let name = value
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            by_key.insert((kind.into(), namespace.into(), name.into()), value);
        }
        Self {
            by_key,
            used: RefCell::default(),
        }
    }

    fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<&'a Value> {
        let key = (kind.to_string(), namespace.to_string(), name.to_string());
        let found = self.by_key.get(&key).copied();
        if found.is_some() {
            self.used.borrow_mut().insert(key);
        }
        found
    }

    /// The sources nothing used, for a note.
    pub(super) fn unused(&self) -> Vec<String> {
        let used = self.used.borrow();
        self.by_key
            .iter()
            .filter(|(key, _)| !used.contains(*key))
            .map(|(_, value)| describe(value))
            .collect()
    }
}

/// A `sourceRef`: kind, name and namespace (default: the referring
/// object's).
struct SourceRef {
    kind: String,
    name: String,
    namespace: String,
}

impl SourceRef {
    fn read(mut fields: Fields, default_kind: &str, namespace: &str) -> Option<SourceRef> {
        let kind = fields
            .string("kind")
            .unwrap_or_else(|| default_kind.to_string());
        let name = fields.string("name")?;
        let namespace = fields
            .string("namespace")
            .unwrap_or_else(|| namespace.to_string());
        fields.drop(&["apiVersion"]);
        fields.finish("spec.source");
        Some(SourceRef {
            kind,
            name,
            namespace,
        })
    }

    fn describe(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// The metadata and the parts every Flux object maps alike.
struct Common {
    name: String,
    namespace: String,
    metadata: ObjectMeta,
    suspend: bool,
    service_account_name: Option<String>,
    target_namespace: Option<String>,
    destination: Destination,
    depends_on: Vec<SourceKey>,
    /// The namespace of the source whose Secret `credentialsSecret` names.
    credentials_namespace: Option<String>,
}

fn common(
    value: &Value,
    family: Family,
    root: &mut Fields,
    spec: &mut Fields,
    notes: &Notes,
) -> Result<Common, ImportError> {
    root.drop(&["apiVersion", "kind", "status"]);
    let mut metadata = root.object("metadata");
    metadata.drop(&BOOKKEEPING);
    metadata.drop(&["ownerReferences"]);
    let Some(name) = metadata.string("name") else {
        return Err(ImportError::MissingField {
            object: describe(value),
            field: "metadata.name".into(),
        });
    };
    let namespace = metadata.string("namespace");
    let labels = metadata.string_map("labels");
    let mut annotations = metadata.string_map("annotations");
    annotations.retain(|key, _| {
        if key == "kubectl.kubernetes.io/last-applied-configuration"
            || key.starts_with("reconcile.fluxcd.io/")
        {
            return false;
        }
        if key.contains("fluxcd.io/") {
            notes.unmapped(
                "metadata",
                &format!("metadata.annotations[{key}]"),
                "a Flux annotation with no Setpoint equivalent",
            );
            return false;
        }
        true
    });
    for finalizer in metadata.strings("finalizers") {
        if !finalizer.ends_with(".fluxcd.io") {
            notes.unmapped(
                "metadata",
                &format!("metadata.finalizers {finalizer}"),
                "nothing in Setpoint would remove it",
            );
        }
    }
    metadata.finish("metadata");
    let own_namespace = namespace.clone().unwrap_or_default();
    let suspend = spec.bool("suspend").unwrap_or(false);
    let service_account_name = spec.string("serviceAccountName");
    let target_namespace = spec.string("targetNamespace");
    let depends_on = spec
        .objects("dependsOn")
        .into_iter()
        .filter_map(|mut dependency| {
            let name = dependency.string("name")?;
            let namespace = dependency
                .string("namespace")
                .unwrap_or_else(|| own_namespace.clone());
            dependency.unmapped(
                "spec.dependsOn",
                "readyExpr",
                "Setpoint waits for a dependency to be Synced and Healthy",
            );
            dependency.finish("spec.dependsOn");
            Some(SourceKey {
                family,
                namespace,
                name,
            })
        })
        .collect();
    let mut destination = Destination {
        namespace: target_namespace.clone(),
        ..Default::default()
    };
    let mut kube_config = spec.object("kubeConfig");
    if kube_config.has("secretRef") {
        let mut secret_ref = kube_config.object("secretRef");
        let secret = secret_ref.string("name").unwrap_or_default();
        let key = secret_ref.string("key");
        secret_ref.finish("spec.destination");
        notes.add(
            "spec.destination",
            format!(
                "note: spec.kubeConfig.secretRef {secret}{}: Setpoint reaches another cluster \
                 through a cluster Secret in its own namespace, labelled \
                 setpoint.dev/secret-type=cluster, with the keys name, server and config (Argo \
                 CD's format; no kubeconfig, no exec credentials); register the cluster so, \
                 named {secret:?}, and allow this namespace with its annotation \
                 setpoint.dev/allowed-namespaces",
                key.map(|k| format!(" (key {k})")).unwrap_or_default()
            ),
        );
        destination.name = Some(secret);
    }
    kube_config.unmapped(
        "spec.destination",
        "configMapRef",
        "Setpoint reaches another cluster through a registered cluster Secret",
    );
    kube_config.finish("spec.destination");
    spec.unmapped("", "interval", INTERVAL);
    spec.unmapped(
        "",
        "retryInterval",
        "Setpoint retries a failed reconcile with its own backoff",
    );
    spec.unmapped(
        "",
        "timeout",
        "Setpoint gives each sync wave spec.syncPolicy.waveTimeout, 10m by default",
    );
    spec.unmapped(
        "",
        "commonMetadata",
        "put the labels and annotations in Git (a kustomization.yaml's commonLabels)",
    );
    Ok(Common {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace,
            labels: Some(labels).filter(|l| !l.is_empty()),
            annotations: Some(annotations).filter(|a| !a.is_empty()),
            ..Default::default()
        },
        name,
        namespace: own_namespace,
        suspend,
        service_account_name,
        target_namespace,
        destination,
        depends_on,
        credentials_namespace: None,
    })
}

/// A Flux `Kustomization` (`kustomize.toolkit.fluxcd.io/v1`).
pub(super) fn kustomization(value: &Value, sources: &Sources) -> Result<Draft, ImportError> {
    let notes = Notes::default();
    let mut root = Fields::new("", Some(value.clone()), &notes);
    let mut spec = root.object("spec");
    let mut common = common(value, Family::Kustomization, &mut root, &mut spec, &notes)?;
    let mut source = Source::default();
    match SourceRef::read(spec.object("sourceRef"), "GitRepository", &common.namespace) {
        None => notes.unmapped(
            "spec.source",
            "spec.sourceRef",
            "it names no source; fill in spec.source.repoURL",
        ),
        Some(reference) if reference.kind == "GitRepository" => {
            match sources.get("GitRepository", &reference.namespace, &reference.name) {
                Some(repository) => {
                    git_repository(repository, &mut source, &notes);
                    common.credentials_namespace = Some(reference.namespace.clone());
                }
                None => notes.add(
                    "spec.source",
                    format!(
                        "not mapped: spec.sourceRef {} (not in the input; fill in \
                         spec.source.repoURL and targetRevision)",
                        reference.describe()
                    ),
                ),
            }
        }
        Some(reference) => notes.unmapped(
            "spec.source",
            &format!("spec.sourceRef {}", reference.describe()),
            "Setpoint reads Git repositories (and charts), not OCI artifacts or buckets",
        ),
    }
    source.path = spec
        .string("path")
        .map(|path| normalize_path(Some(&path)))
        .filter(|path| !path.is_empty());
    let prune = spec.bool("prune").unwrap_or(false);
    let deletion_policy = spec
        .string("deletionPolicy")
        .unwrap_or_else(|| "MirrorPrune".into());
    let deletes = match deletion_policy.as_str() {
        "Delete" => true,
        "Orphan" => false,
        _ => prune,
    };
    let mut finalizers = Vec::new();
    if deletes {
        finalizers.push(FINALIZER.to_string());
        notes.add(
            "metadata.finalizers",
            "note: Flux deletes a Kustomization's objects with it (prune, deletionPolicy); so \
             does Setpoint with this finalizer",
        );
    }
    spec.unmapped(
        "",
        "decryption",
        "Setpoint does not decrypt SOPS files: decrypt them in the cluster (an operator such \
         as sops-secrets-operator or External Secrets) or keep them out of Git",
    );
    for key in ["healthChecks", "wait", "healthCheckExprs"] {
        spec.unmapped(
            "",
            key,
            "Setpoint assesses the health of every object it applies (as wait: true), in \
             sync waves; custom health is declared in Setpoint's configuration",
        );
    }
    for key in [
        "patches",
        "images",
        "postBuild",
        "components",
        "namePrefix",
        "nameSuffix",
    ] {
        spec.unmapped(
            "spec.source",
            key,
            "Setpoint runs the path's own kustomization.yaml: put it there",
        );
    }
    spec.unmapped(
        "spec.syncPolicy",
        "force",
        "the closest is the sync option Replace=true, which replaces every time",
    );
    spec.finish("spec");
    root.finish("");
    Ok(draft(
        value,
        Family::Kustomization,
        common,
        source,
        SyncPolicy {
            automated: Some(Automated {
                prune,
                self_heal: true,
            }),
            ..Default::default()
        },
        finalizers,
        notes,
    ))
}

/// A Flux `HelmRelease` (`helm.toolkit.fluxcd.io/v2`).
pub(super) fn helm_release(value: &Value, sources: &Sources) -> Result<Draft, ImportError> {
    let notes = Notes::default();
    let mut root = Fields::new("", Some(value.clone()), &notes);
    let mut spec = root.object("spec");
    let mut common = common(value, Family::HelmRelease, &mut root, &mut spec, &notes)?;
    let mut source = Source::default();
    let mut helm = HelmSource::default();
    if spec.has("chartRef") {
        let reference =
            SourceRef::read(spec.object("chartRef"), "OCIRepository", &common.namespace);
        match reference {
            Some(reference) if reference.kind == "OCIRepository" => {
                match sources.get("OCIRepository", &reference.namespace, &reference.name) {
                    Some(repository) => {
                        oci_repository(repository, &mut source, &notes);
                        common.credentials_namespace = Some(reference.namespace.clone());
                    }
                    None => missing(&notes, &reference),
                }
            }
            Some(reference) => notes.unmapped(
                "spec.source",
                &format!("spec.chartRef {}", reference.describe()),
                "name the chart's repository instead",
            ),
            None => notes.unmapped("spec.source", "spec.chartRef", "it names no source"),
        }
    } else {
        let mut chart = spec.object("chart");
        let mut chart_spec = chart.object("spec");
        let chart_name = chart_spec.string("chart").unwrap_or_default();
        let version = chart_spec.string("version");
        let values_files = chart_spec.strings("valuesFiles");
        let reference = SourceRef::read(
            chart_spec.object("sourceRef"),
            "HelmRepository",
            &common.namespace,
        );
        match reference {
            Some(reference) if reference.kind == "HelmRepository" => {
                match sources.get("HelmRepository", &reference.namespace, &reference.name) {
                    Some(repository) => {
                        helm_repository(repository, &mut source, &notes);
                        common.credentials_namespace = Some(reference.namespace.clone());
                    }
                    None => missing(&notes, &reference),
                }
                source.chart = Some(chart_name);
                source.target_revision = version.filter(|v| v != "*");
                helm.value_files = values_files;
            }
            Some(reference) if reference.kind == "GitRepository" => {
                match sources.get("GitRepository", &reference.namespace, &reference.name) {
                    Some(repository) => {
                        git_repository(repository, &mut source, &notes);
                        common.credentials_namespace = Some(reference.namespace.clone());
                    }
                    None => missing(&notes, &reference),
                }
                let path = normalize_path(Some(&chart_name));
                // Flux's values files are relative to the repository's root,
                // Setpoint's to the chart's directory.
                helm.value_files = values_files
                    .iter()
                    .map(|file| relative_to(&path, &normalize_path(Some(file))))
                    .collect();
                source.path = Some(path).filter(|p| !p.is_empty());
                if version.is_some() {
                    notes.unmapped(
                        "spec.source",
                        "spec.chart.spec.version",
                        "a chart from Git is the one at the revision",
                    );
                }
            }
            Some(reference) => notes.unmapped(
                "spec.source",
                &format!("spec.chart.spec.sourceRef {}", reference.describe()),
                "Setpoint reads charts from Helm repositories, OCI registries and Git",
            ),
            None => notes.unmapped(
                "spec.source",
                "spec.chart.spec.sourceRef",
                "it names no source",
            ),
        }
        chart_spec.unmapped("spec.source", "interval", INTERVAL);
        chart_spec.unmapped(
            "spec.source",
            "reconcileStrategy",
            "Setpoint renders the chart at each new revision",
        );
        chart_spec.unmapped(
            "spec.source",
            "verify",
            "Setpoint checks a chart against its index's digest, not a signature",
        );
        chart_spec.unmapped(
            "spec.source.helm",
            "ignoreMissingValuesFiles",
            "a values file Setpoint cannot read is an error",
        );
        chart_spec.finish("spec.source");
        chart.finish("spec.source");
    }
    helm.release_name = spec.string("releaseName").or_else(|| {
        // Flux names a release `<targetNamespace>-<name>` when it has a
        // target namespace; Setpoint's default is the Application's name.
        common
            .target_namespace
            .as_ref()
            .map(|target| format!("{target}-{}", common.name))
    });
    helm.values_object = spec.take("values");
    spec.unmapped(
        "spec.source.helm",
        "valuesFrom",
        "Setpoint reads values from Git and the Application only: move them into \
         spec.source.helm.valuesObject or a values file (a Secret's values do not belong in Git)",
    );
    let mut sync_options = Vec::new();
    let mut install = spec.object("install");
    if install.bool("createNamespace") == Some(true) {
        sync_options.push("CreateNamespace=true".to_string());
    }
    if install.string("crds").as_deref() == Some("Skip") {
        helm.skip_crds = true;
    }
    install.unmapped(
        "spec.syncPolicy",
        "remediation",
        "Setpoint retries a failed sync with backoff; there is no Helm rollback",
    );
    install.unmapped(
        "spec.syncPolicy",
        "disableHooks",
        "Setpoint runs a chart's hooks as Argo CD does",
    );
    install.unmapped(
        "spec.syncPolicy",
        "disableWait",
        "Setpoint waits for the health of each sync wave",
    );
    install.finish("spec.syncPolicy");
    let mut drift = spec.object("driftDetection");
    let self_heal = drift.string("mode").as_deref() == Some("enabled");
    if drift.has("ignore") {
        drift.unmapped(
            "spec.ignoreDifferences",
            "ignore",
            "write each rule as spec.ignoreDifferences (group, kind, jsonPointers)",
        );
    }
    drift.finish("spec.syncPolicy");
    if !self_heal {
        notes.add(
            "spec.syncPolicy",
            "note: Flux's drift detection is off for this release: selfHeal is off",
        );
    }
    for (key, reason) in [
        (
            "upgrade",
            "Setpoint applies the rendered chart with a server-side apply, not helm upgrade",
        ),
        (
            "rollback",
            "Setpoint has no Helm release history to roll back to",
        ),
        ("test", "Helm test hooks are not run by Setpoint"),
        (
            "uninstall",
            "Setpoint deletes the objects through its finalizer",
        ),
        ("storageNamespace", "Setpoint keeps no Helm release Secrets"),
        (
            "maxHistory",
            "Setpoint keeps the last 10 syncs in status.history",
        ),
        (
            "postRenderers",
            "put the patches in Git (a kustomization.yaml over the chart)",
        ),
        ("persistentClient", "no Setpoint equivalent"),
    ] {
        spec.unmapped("spec.source.helm", key, reason);
    }
    spec.finish("spec");
    root.finish("");
    notes.add(
        "metadata.finalizers",
        "note: Flux uninstalls a release with its HelmRelease; Setpoint deletes the objects with \
         this finalizer",
    );
    source.helm = Some(helm);
    Ok(draft(
        value,
        Family::HelmRelease,
        common,
        source,
        SyncPolicy {
            automated: Some(Automated {
                prune: true,
                self_heal,
            }),
            sync_options,
            ..Default::default()
        },
        vec![FINALIZER.to_string()],
        notes,
    ))
}

fn missing(notes: &Notes, reference: &SourceRef) {
    notes.add(
        "spec.source",
        format!(
            "not mapped: {} (not in the input; fill in spec.source)",
            reference.describe()
        ),
    );
}

fn draft(
    value: &Value,
    family: Family,
    common: Common,
    source: Source,
    sync_policy: SyncPolicy,
    finalizers: Vec<String>,
    notes: Notes,
) -> Draft {
    let mut metadata = common.metadata;
    metadata.finalizers = Some(finalizers).filter(|f| !f.is_empty());
    Draft {
        key: SourceKey {
            family,
            namespace: common.namespace,
            name: common.name,
        },
        from: format!(
            "Flux {} ({})",
            describe(value),
            value["apiVersion"].as_str().unwrap_or("")
        ),
        application: Application {
            metadata,
            spec: ApplicationSpec {
                source,
                destination: common.destination,
                sync_policy,
                service_account_name: common.service_account_name,
                suspend: common.suspend,
                ..Default::default()
            },
            status: None,
        },
        notes,
        destination_namespace: common.target_namespace,
        credentials_namespace: common.credentials_namespace,
        depends_on: common.depends_on,
    }
}

/// The URL, credentials and notes every source kind maps alike.
fn source_url(fields: &mut Fields, source: &mut Source, notes: &Notes, what: &str) -> String {
    let url = fields.string("url").unwrap_or_default();
    let shown = display_url(&url);
    if shown != url.trim() {
        notes.add(
            "spec.source",
            format!("note: credentials removed from the URL of {what}: put them in a Secret"),
        );
    }
    source.repo_url = shown.clone();
    fields.unmapped("spec.source", "interval", INTERVAL);
    fields.unmapped(
        "spec.source",
        "timeout",
        "Setpoint's Git and chart requests have their own time limits",
    );
    fields.unmapped(
        "spec.source",
        "suspend",
        "suspend the Application instead (spec.suspend)",
    );
    for key in ["certSecretRef", "proxySecretRef", "provider", "insecure"] {
        fields.unmapped(
            "spec.source",
            key,
            "Setpoint uses the system's trust roots, proxy settings and static credentials",
        );
    }
    shown
}

fn credentials(fields: &mut Fields, source: &mut Source, notes: &Notes, keys: &str) {
    let mut secret_ref = fields.object("secretRef");
    if let Some(name) = secret_ref.string("name") {
        notes.add(
            "spec.source.credentialsSecret",
            format!("note: {}: {keys}", secret_ref.path),
        );
        source.credentials_secret = Some(name);
    }
    secret_ref.finish("spec.source");
}

/// The repository URL, revision and credentials of a `GitRepository`.
fn git_repository(value: &Value, source: &mut Source, notes: &Notes) {
    let what = describe(value);
    let mut fields = Fields::new(&format!("{what} spec"), value.get("spec").cloned(), notes);
    let url = source_url(&mut fields, source, notes, &what);
    let mut reference = fields.object("ref");
    let commit = reference.string("commit");
    let name = reference.string("name");
    let semver = reference.string("semver");
    let tag = reference.string("tag");
    let branch = reference.string("branch");
    reference.finish("spec.source.targetRevision");
    source.target_revision = if let Some(commit) = commit {
        Some(commit)
    } else if let Some(name) = name {
        Some(name)
    } else if let Some(range) = semver {
        notes.add(
            "spec.source.targetRevision",
            format!(
                "not mapped: {what} spec.ref.semver {range:?} (Setpoint resolves semver ranges \
                 for charts only: this revision names no branch or tag until it is replaced by \
                 the tag to follow)"
            ),
        );
        Some(range)
    } else if let Some(tag) = tag {
        Some(tag)
    } else if let Some(branch) = branch {
        Some(branch)
    } else {
        notes.add(
            "spec.source.targetRevision",
            format!("note: {what} names no ref: Flux checks out the branch master"),
        );
        Some("master".to_string())
    };
    if url.starts_with("http://") || url.starts_with("https://") {
        credentials(
            &mut fields,
            source,
            notes,
            "Setpoint reads the keys username and password (or token; Flux's bearerToken is \
             token there) from this Secret in the Application's own namespace",
        );
    } else {
        fields.unmapped(
            "spec.source",
            "secretRef",
            "Setpoint's Git over SSH uses the keys of Setpoint's own process, not a Secret's \
             identity and known_hosts",
        );
    }
    git_verify(&mut fields, source, notes);
    for (key, reason) in [
        (
            "ignore",
            "Setpoint reads every manifest file under the path",
        ),
        ("include", "Setpoint reads one repository per Application"),
        (
            "recurseSubmodules",
            "Setpoint does not check out submodules",
        ),
        ("sparseCheckout", "Setpoint reads only the path anyway"),
    ] {
        fields.unmapped("spec.source", key, reason);
    }
    fields.finish("spec.source");
}

/// `spec.verify` to `spec.source.verify`: the same Secret (its `.asc`
/// keys are read the same way), `HEAD` as `head`, `Tag` as `tag`.
fn git_verify(fields: &mut Fields, source: &mut Source, notes: &Notes) {
    use crate::api::{LocalSecretRef, Verify, VerifyMode};
    if !fields.has("verify") {
        return;
    }
    let mut verify = fields.object("verify");
    let mode = verify.string("mode");
    let mut secret_ref = verify.object("secretRef");
    let name = secret_ref.string("name");
    secret_ref.finish("spec.source.verify.secretRef");
    let at = verify.path_of("mode");
    verify.finish("spec.source.verify");
    let mode = match mode.as_deref() {
        None | Some("HEAD" | "head") => VerifyMode::Head,
        Some("Tag") => VerifyMode::Tag,
        Some("TagAndHEAD") => {
            notes.add(
                "spec.source.verify",
                format!(
                    "note: {at} TagAndHEAD: Setpoint verifies the tag (mode tag), not also the commit it points to"
                ),
            );
            VerifyMode::Tag
        }
        Some(other) => {
            notes.unmapped(
                "spec.source.verify",
                &at,
                &format!("unknown mode {other:?}"),
            );
            return;
        }
    };
    match name {
        Some(name) => {
            notes.add(
                "spec.source.verify",
                format!(
                    "note: Setpoint reads the OpenPGP keys of Secret {name} from its keys ending .asc (or .gpg), as Flux's examples name them"
                ),
            );
            source.verify = Some(Verify {
                mode,
                secret_ref: LocalSecretRef { name },
            });
        }
        None => notes.unmapped("spec.source.verify", &at, "it names no secretRef"),
    }
}

/// What a chart repository's or registry's Secret must hold for Setpoint.
const REGISTRY_CREDENTIALS: &str = "Setpoint reads the keys username and password (or a bearer \
     token) from this Secret in the Application's own namespace; a dockerconfigjson Secret does \
     not work there";

/// The URL and credentials of a `HelmRepository` (`type: oci` included).
fn helm_repository(value: &Value, source: &mut Source, notes: &Notes) {
    let what = describe(value);
    let mut fields = Fields::new(&format!("{what} spec"), value.get("spec").cloned(), notes);
    source_url(&mut fields, source, notes, &what);
    fields.drop(&["type"]);
    credentials(&mut fields, source, notes, REGISTRY_CREDENTIALS);
    fields.unmapped(
        "spec.source",
        "passCredentials",
        "Setpoint sends credentials to the repository's host only",
    );
    fields.finish("spec.source");
}

/// The registry path, chart and tag of an `OCIRepository` of a chart:
/// `oci://host/path/chart` is Setpoint's repoURL `oci://host/path` and
/// chart `chart`.
fn oci_repository(value: &Value, source: &mut Source, notes: &Notes) {
    let what = describe(value);
    let mut fields = Fields::new(&format!("{what} spec"), value.get("spec").cloned(), notes);
    let url = source_url(&mut fields, source, notes, &what);
    let trimmed = url.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((repository, chart)) if repository.len() > "oci:/".len() => {
            source.repo_url = repository.to_string();
            source.chart = Some(chart.to_string());
        }
        _ => notes.add(
            "spec.source",
            format!("not mapped: {what} spec.url (not an oci://registry/path/chart URL)"),
        ),
    }
    let mut reference = fields.object("ref");
    let tag = reference.string("tag");
    let semver = reference.string("semver");
    reference.unmapped(
        "spec.source.targetRevision",
        "digest",
        "name the chart's version instead",
    );
    reference.unmapped(
        "spec.source.targetRevision",
        "semverFilter",
        "Setpoint's ranges take prereleases only when they name one",
    );
    reference.finish("spec.source.targetRevision");
    source.target_revision = semver.or(tag).filter(|v| v != "latest");
    credentials(&mut fields, source, notes, REGISTRY_CREDENTIALS);
    fields.unmapped(
        "spec.source",
        "layerSelector",
        "Setpoint takes the chart layer of the manifest",
    );
    fields.finish("spec.source");
}

/// `file`, relative to the repository's root, as a path relative to `dir`.
fn relative_to(dir: &str, file: &str) -> String {
    let dir: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    let file: Vec<&str> = file.split('/').filter(|p| !p.is_empty()).collect();
    let common = dir.iter().zip(&file).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<&str> = vec![".."; dir.len() - common];
    parts.extend(&file[common..]);
    parts.join("/")
}

#[cfg(test)]
mod tests {
    use super::relative_to;

    #[test]
    fn values_files_relative_to_the_chart() {
        assert_eq!(
            relative_to("charts/web", "charts/web/values-prod.yaml"),
            "values-prod.yaml"
        );
        assert_eq!(
            relative_to("charts/web", "envs/prod.yaml"),
            "../../envs/prod.yaml"
        );
        assert_eq!(relative_to("", "values.yaml"), "values.yaml");
    }
}
