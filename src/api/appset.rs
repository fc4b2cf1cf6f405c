//! The ApplicationSet custom resource (`applicationsets.setpoint.dev/v1alpha1`):
//! generators that yield parameter sets, and an Application template that
//! each set of parameters fills in (Argo CD's ApplicationSet, its default
//! `{{ name }}` syntax). What the generators and the template mean is
//! `src/appset/`; these are the types the CRD is generated from.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Condition, Health, Sync};

/// A fleet of Applications from one template.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "setpoint.dev",
    version = "v1alpha1",
    kind = "ApplicationSet",
    namespaced,
    status = "ApplicationSetStatus",
    shortname = "spappset",
    category = "setpoint",
    printcolumn = r#"{"name":"Applications","type":"integer","jsonPath":".status.summary.applications"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationSetSpec {
    /// Each yields parameter sets; the Applications are the union over
    /// the generators (one Application per distinct name).
    pub generators: Vec<Generator>,
    pub template: Template,
    #[serde(default)]
    pub sync_policy: SetSyncPolicy,
}

/// One generator: exactly one of its fields is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Generator {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list: Option<ListGenerator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitGenerator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<ClusterGenerator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<PullRequestGenerator>,
    /// Every combination of the parameter sets of two generators (each
    /// pair's parameters together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix: Option<Combination>,
    /// The first generator's parameter sets, each updated with those of
    /// the others that have the same values of `mergeKeys`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<Combination>,
}

/// Literal parameter sets.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListGenerator {
    /// Each an object; nested keys become `a.b` parameters.
    #[schemars(schema_with = "free_form_list")]
    pub elements: Vec<serde_json::Value>,
}

/// The directories or files of a Git repository at a revision.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitGenerator {
    #[serde(rename = "repoURL")]
    pub repo_url: String,
    /// A branch, a tag or a commit; empty is the default branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// A Secret of the set's namespace with `username` and `password` (or
    /// `token`) for an `http(s)://` repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// Directories matching these globs (`*` within one path segment, `**`
    /// across), minus those matching an `exclude: true` entry; parameters
    /// `path`, `path.basename`, `path.basenameNormalized`, `path[N]`
    /// (`path.segments[N]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub directories: Vec<GitPathPattern>,
    /// YAML or JSON files matching these globs: each file (each element of
    /// a file holding a list) is a parameter set of its keys, nested keys
    /// flattened to `a.b`, plus the `path` parameters of its directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<GitPathPattern>,
}

impl std::fmt::Debug for GitGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitGenerator")
            .field("repo_url", &crate::secret::ShownUrl(&self.repo_url))
            .field("revision", &self.revision)
            .field("credentials_secret", &self.credentials_secret)
            .field("directories", &self.directories)
            .field("files", &self.files)
            .finish()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitPathPattern {
    pub path: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclude: bool,
}

/// The registered clusters (cluster Secrets) the set's namespace may
/// deploy to, and the local one (`in-cluster`) for an admin namespace;
/// parameters `name`, `server`, `metadata.labels.<key>`,
/// `metadata.annotations.<key>`, and `values.<key>`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGenerator {
    /// Only the clusters whose Secret has these labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Extra parameters, `values.<key>`, the same for every cluster.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, String>,
}

/// `matchLabels` (all must hold) and `matchExpressions`, as Kubernetes'.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelExpression>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelExpression {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// The open pull requests (GitLab: merge requests) of one repository:
/// parameters `number`, `branch`, `branch_slug`, `target_branch`,
/// `head_sha`, `head_short_sha`, `labels` (comma-separated).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PullRequestGenerator {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github: Option<GitHubPulls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitlab: Option<GitLabMerges>,
    /// A pull request is kept when any filter accepts it (all when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<PullRequestFilter>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitHubPulls {
    pub owner: String,
    pub repo: String,
    /// Only pull requests with every one of these labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitLabMerges {
    /// The project's id or its path (`group/project`).
    pub project: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PullRequestFilter {
    /// A regular expression the head branch must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_match: Option<String>,
    /// A regular expression the target branch must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_branch_match: Option<String>,
}

/// Two generators combined. Each is a generator as above; one nested in a
/// matrix or merge may itself be a matrix or merge.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Combination {
    #[schemars(schema_with = "free_form_list")]
    pub generators: Vec<serde_json::Value>,
    /// For `merge`: the parameters whose values pair parameter sets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub merge_keys: Vec<String>,
}

/// The Application each parameter set fills in: every string in it may
/// hold `{{ parameter }}`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Template {
    pub metadata: TemplateMetadata,
    /// An Application's spec.
    #[schemars(schema_with = "crate::api::free_form_object")]
    pub spec: serde_json::Value,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Set on each Application as it is: `setpoint.dev/resources-finalizer`
    /// (or Argo CD's `resources-finalizer.argocd.argoproj.io`) makes the
    /// deletion of a generated Application delete its objects too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalizers: Vec<String>,
}

/// What an evaluation may do to the set's Applications.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct SetSyncPolicy {
    /// `sync` (the default): create, update and delete; `create-update`:
    /// never delete; `create-only`: never update or delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applications_sync: Option<ApplicationsSync>,
    /// One evaluation may delete at most this share (percent) of the set's
    /// Applications, else it deletes none and says why (default 50; 100
    /// allows any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub max_delete_percent: Option<u8>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ApplicationsSync {
    #[default]
    Sync,
    CreateUpdate,
    CreateOnly,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct ApplicationSetStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The Applications the last evaluation yielded, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applications: Vec<GeneratedApplication>,
    #[serde(default)]
    pub summary: SetSummary,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GeneratedApplication {
    pub name: String,
    pub sync: Sync,
    pub health: Health,
    /// The commit it was last compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct SetSummary {
    pub applications: u32,
    pub synced: u32,
    pub healthy: u32,
}

fn free_form_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
    })
}
