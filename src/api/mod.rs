//! The Application custom resource (`applications.setpoint.dev/v1alpha1`):
//! what a user asks for (spec) and what Setpoint reports (status).
//!
//! The CRD YAML under `config/crd/` and `charts/setpoint/crds/` is generated
//! from these types (`setpoint crd`); a test keeps the committed copies equal.

mod appset;
mod conditions;
mod notify;
mod operate;
mod receiver;
mod sync_run;

pub use appset::*;
pub use conditions::{Condition, ConditionStatus, ConditionType, set_condition};
pub use notify::*;
pub use operate::*;
pub use receiver::*;
pub use sync_run::{HookPhase, HookRecord, HookState, RunPhase, SyncRun, WaveRecord};

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One Application: a path in a Git repository, kept applied to the cluster.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "setpoint.dev",
    version = "v1alpha1",
    kind = "Application",
    namespaced,
    status = "ApplicationStatus",
    shortname = "spapp",
    category = "setpoint",
    printcolumn = r#"{"name":"Sync","type":"string","jsonPath":".status.sync.status"}"#,
    printcolumn = r#"{"name":"Health","type":"string","jsonPath":".status.health.status"}"#,
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.sync.revision"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSpec {
    pub source: Source,
    #[serde(default)]
    pub destination: Destination,
    #[serde(default)]
    pub sync_policy: SyncPolicy,
    /// The service account of the Application's own namespace that it acts
    /// as, by impersonation, unless its namespace is an admin namespace
    /// (`tenancy.adminNamespaces`); default `tenancy.defaultServiceAccount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Suspend (Flux's `suspend`, `setpoint app suspend`): nothing is
    /// applied or pruned and drift is not corrected; drift is still found
    /// and shown (`status.hold`, the objects' messages, an Event).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// Held at a past revision (`setpoint app rollback`); see [`Pin`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<Pin>,
    /// When automated syncs may run (Argo CD's sync windows); see
    /// [`SyncWindow`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sync_windows: Vec<SyncWindow>,
    /// Fields that are not drift and that Setpoint leaves out of what it
    /// applies (Argo CD's `ignoreDifferences`), e.g. the replicas of a
    /// Deployment that an HPA scales.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ignore_differences: Vec<IgnoreDifferences>,
    /// Applications that must be Synced and Healthy at their current
    /// revision before this one is synced; until then it waits
    /// (`Ready=False`, reason `DependencyNotReady`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<Dependency>,
    /// Custom health for kinds, as CEL expressions (Flux's
    /// `healthCheckExprs`); for the same group and kind they win over the
    /// configuration's (`health.checks`) and over the built-in rules.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_checks: Vec<HealthCheck>,
}

/// One custom health rule: the objects of `apiVersion`'s group and `kind`
/// are assessed by CEL expressions that see the object as `self` (and its
/// top-level fields, `status`, `spec`, `metadata`, by name, as Flux's do).
/// `inProgress` true is Progressing, else `failed` true is Degraded, else
/// `current` true is Healthy, else Progressing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// `example.com/v1`; the version is not compared.
    pub api_version: String,
    pub kind: String,
    pub current: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_progress: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<String>,
}

/// One `spec.ignoreDifferences` rule: the objects it applies to (group and
/// kind, `*` for any; name and namespace when given) and the fields it
/// ignores, by JSON pointer (RFC 6901, `/spec/replicas`) or by the field
/// managers that own them in the live object (`managedFields`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IgnoreDifferences {
    /// The API group; empty for the core group (ConfigMap, Secret).
    #[serde(default)]
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub json_pointers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managed_fields_managers: Vec<String>,
}

/// One Application this one waits for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Dependency {
    pub name: String,
    /// Defaults to this Application's namespace; another namespace only for
    /// an Application of an admin namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Where the manifests are.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// A local path, `file://`, `http(s)://`, `ssh://` or `git@host:org/repo`;
    /// with `chart`, a Helm repository (`http(s)://`, serving `index.yaml`)
    /// or an OCI registry path (`oci://registry/path`).
    #[serde(rename = "repoURL")]
    pub repo_url: String,
    /// A chart of the Helm repository or OCI registry at `repoURL`, rendered
    /// instead of a Git path (Argo CD's `chart`): `targetRevision` is then
    /// its version or a semver range (`1.x`, `>=1.2 <2`, `*`; the newest
    /// matching version wins, prereleases only when the range names one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<String>,
    /// A branch, a tag or a commit id; empty means the default branch. For a
    /// chart, a version or a semver range; empty means the newest release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_revision: Option<String>,
    /// The directory in the repository that holds the manifests; empty is the root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A Secret in the Application's namespace holding `username` and
    /// `password` (or `token`) for an `http(s)://` repository; for a chart,
    /// basic auth, or a bearer `token` (an OCI registry's token service
    /// gets the username and password).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// Render the path as plain YAML and JSON files, even when it holds a
    /// `kustomization.yaml` or a `Chart.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<DirectorySource>,
    /// Render the path with Kustomize; the default when it holds a
    /// `kustomization.yaml`, `kustomization.yml` or `Kustomization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kustomize: Option<KustomizeSource>,
    /// Render the path as a Helm chart; the default when it holds a
    /// `Chart.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm: Option<HelmSource>,
    /// Apply only commits (or tags) signed by a key of a Secret, as Flux's
    /// `GitRepository` `spec.verify`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<Verify>,
}

/// `spec.source.verify`: the commit to be applied (`mode: head`), or the
/// annotated tag `targetRevision` names (`mode: tag`), must carry a good
/// signature by a key of the Secret `secretRef` (in the Application's
/// namespace): OpenPGP public keys in any key ending `.asc` (or `.gpg`,
/// binary), SSH allowed signers (git's `gpg.ssh.allowedSignersFile`
/// format) in `allowed_signers` or any key ending `.allowed_signers`.
/// Anything else is not applied: the Application keeps its last applied
/// revision and is Stalled (`UnsignedCommit`, `UnsignedTag`,
/// `UnknownSigner`, `BadSignature`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Verify {
    #[serde(default)]
    pub mode: VerifyMode,
    pub secret_ref: LocalSecretRef,
}

/// What must be signed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum VerifyMode {
    /// The commit to be applied (Flux's `HEAD`).
    #[default]
    #[serde(rename = "head", alias = "HEAD")]
    Head,
    /// The annotated tag `targetRevision` names, which must point to the
    /// commit applied (Flux's `Tag`).
    #[serde(rename = "tag", alias = "Tag")]
    Tag,
}

/// Who signed an applied revision, and with which key (the audit of
/// `status.operation` and `status.history`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignatureRecord {
    /// The OpenPGP user id, or the SSH principal of the allowed signers.
    pub signer: String,
    /// The OpenPGP primary key's fingerprint, or the SSH key's
    /// (`SHA256:…`).
    pub key: String,
    #[serde(rename = "type")]
    pub kind: SignatureType,
    /// The signed tag (`mode: tag`); absent: the commit was signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SignatureType {
    #[default]
    Openpgp,
    Ssh,
}

/// An Application printed with `{:?}` may reach a log: its repository URL
/// is shown without user info (a password, a token).
impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source")
            .field("repo_url", &crate::secret::ShownUrl(&self.repo_url))
            .field("chart", &self.chart)
            .field("target_revision", &self.target_revision)
            .field("path", &self.path)
            .field("credentials_secret", &self.credentials_secret)
            .field("directory", &self.directory)
            .field("kustomize", &self.kustomize)
            .field("helm", &self.helm)
            .field("verify", &self.verify)
            .finish()
    }
}

/// Plain files (`.yaml`, `.yml`, `.json`) and Jsonnet (`.jsonnet`; a
/// `.libsonnet` is only imported), as Argo CD's `source.directory`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DirectorySource {
    /// How the `.jsonnet` files of the path are evaluated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jsonnet: Option<JsonnetSource>,
}

/// Argo CD's `directory.jsonnet`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JsonnetSource {
    /// External variables (`std.extVar`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ext_vars: Vec<JsonnetVar>,
    /// Top-level arguments: the parameters of a file that is a function.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tlas: Vec<JsonnetVar>,
    /// Import search paths, relative to the repository's root (`vendor`),
    /// after the importing file's directory and the Application's path.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub libs: Vec<String>,
}

/// One external variable or top-level argument.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JsonnetVar {
    pub name: String,
    /// A string, or Jsonnet code when `code` is set.
    #[serde(default)]
    pub value: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub code: bool,
}

/// `kustomize build` of the path (bases elsewhere in the repository work).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KustomizeSource {}

/// `helm template` of the chart at the path, as Argo CD's `source.helm`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HelmSource {
    /// The release name; defaults to the Application's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_name: Option<String>,
    /// Values files, relative to the chart's path, from the same repository;
    /// later files win.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub value_files: Vec<String>,
    /// Inline values as a YAML string; wins over the values files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<String>,
    /// Inline values as an object; wins over `values`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::api::free_form_object")]
    pub values_object: Option<serde_json::Value>,
    /// Leave out the chart's `crds/` directory.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skip_crds: bool,
}

/// Any object: stored as given (`x-kubernetes-preserve-unknown-fields`).
pub fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// Kubernetes knows the integer formats `int32` and `int64`, not schemars'
/// `uint8` … `uint64` (the API server answers `Warning: unrecognized format
/// "uint32"`): an unsigned number becomes an `int32` or `int64` wide enough
/// for it, its `minimum: 0` kept.
pub fn kubernetes_formats(schema: &mut schemars::Schema) {
    use schemars::transform::{RecursiveTransform, Transform};
    RecursiveTransform(|schema: &mut schemars::Schema| {
        let known = match schema.get("format").and_then(|f| f.as_str()) {
            Some("uint8" | "uint16") => "int32",
            Some("uint32" | "uint64" | "uint") => "int64",
            _ => return,
        };
        schema.insert("format".into(), known.into());
    })
    .transform(schema);
}

/// Where the objects go.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// A registered cluster's name (a cluster Secret's `name`), as Argo
    /// CD's; absent or `in-cluster`: the cluster Setpoint runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A registered cluster's API server URL, when `name` is absent;
    /// `https://kubernetes.default.svc` is the cluster Setpoint runs in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The namespace of namespaced objects that name none; defaults to the
    /// Application's own namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// When to change the cluster, as Argo CD's `syncPolicy`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncPolicy {
    /// Sync on its own when Git changes; absent means only on request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub automated: Option<Automated>,
    /// Allow a sync whose render came out empty to prune everything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_empty: bool,
    /// How long one sync wave may take to become Healthy before the sync
    /// fails (`30s`, `10m`, `1h`); default 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_timeout: Option<String>,
    /// Argo CD's sync options for every object of the Application
    /// (`CreateNamespace=true`, `Prune=false`, `Replace=true`,
    /// `Validate=false`, `SkipDryRunOnMissingResource=true`, `PruneLast=true`,
    /// …); an object's `setpoint.dev/sync-options` or
    /// `argocd.argoproj.io/sync-options` annotation wins for that object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sync_options: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Automated {
    /// Delete objects of this Application that Git no longer has.
    #[serde(default)]
    pub prune: bool,
    /// Correct drift in the live cluster even when Git did not change.
    #[serde(default)]
    pub self_heal: bool,
}

/// What Setpoint saw and did, written only when it changed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationStatus {
    #[serde(default)]
    pub sync: SyncStatus,
    #[serde(default)]
    pub health: HealthStatus,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The last commit whose manifests were applied without error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_revision: Option<String>,
    /// Every object of this Application, as of the last reconcile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceStatus>,
    /// The last reconcile that changed the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationSummary>,
    /// The last reconciles that changed the cluster, newest first (at most
    /// `HISTORY_LIMIT`, as Argo CD keeps ten).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<OperationSummary>,
    /// The repository paths the last render read (a directory stands for
    /// everything under it; `""` is the whole repository): a push that
    /// changes none of them does not reconcile this Application.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_inputs: Vec<String>,
    /// The last sync of a new revision that used sync waves or hooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_run: Option<SyncRun>,
    /// Why the last reconcile changed nothing on purpose (suspended, a
    /// sync window), and until when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<HoldStatus>,
    /// The pin (`spec.pin`) the last reconcile followed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<PinnedStatus>,
}

/// How many operations `status.history` keeps.
pub const HISTORY_LIMIT: usize = 10;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Sync {
    Synced,
    OutOfSync,
    #[default]
    Unknown,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    pub status: Sync,
    /// The commit the live state was compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// Ordered from best to worst: an Application's health is its worst resource's.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub enum Health {
    Healthy,
    /// Paused or suspended on purpose (a paused Deployment, a suspended Job
    /// or CronJob), as Argo CD's `Suspended`: worse than Healthy, better
    /// than Progressing.
    Suspended,
    Progressing,
    #[default]
    Unknown,
    Missing,
    Degraded,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    pub status: Health,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceStatus {
    pub group: String,
    pub version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    pub sync: Sync,
    pub health: Health,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct OperationSummary {
    /// Numbered from 1, one more than the entry before (Argo CD's history
    /// id): `setpoint app rollback NS/NAME ID`.
    #[serde(default)]
    pub id: u64,
    pub revision: String,
    pub applied: u32,
    pub pruned: u32,
    pub unchanged: u32,
    pub duration_ms: u64,
    /// RFC 3339.
    pub finished_at: String,
    /// Who signed the revision applied, when `spec.source.verify` asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<SignatureRecord>,
    /// The Application was Synced and Healthy at this revision after it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub healthy: bool,
    /// Who asked for it when someone did: `rollback by alice`, `sync of
    /// Deployment/web by alice`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initiated_by: Option<String>,
}
