//! The Receiver custom resource (`receivers.setpoint.dev/v1alpha1`), shaped
//! like Flux's: an address (`status.webhookPath`) that a registry or a CI job
//! calls to have Applications reconciled at once. What a request means is
//! `src/ingest/receiver/`; these are the types the CRD is generated from.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// An incoming webhook: who may call it (the token of a Secret) and which
/// Applications of its namespace it reconciles.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "setpoint.dev",
    version = "v1alpha1",
    kind = "Receiver",
    namespaced,
    status = "ReceiverStatus",
    shortname = "sprecv",
    category = "setpoint",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Path","type":"string","jsonPath":".status.webhookPath","priority":1}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ReceiverSpec {
    /// Who calls: `harbor`, `dockerhub`, `quay`, `github-packages` (or
    /// `ghcr`), registry push events; `generic` (the address is the
    /// secret) or `generic-hmac` (`X-Signature: sha256=<hex>`).
    #[serde(rename = "type")]
    #[schemars(schema_with = "receiver_type")]
    pub type_: String,
    /// A Secret of the Receiver's namespace whose key `token` is the shared
    /// secret: part of the address, and the key of signatures.
    pub secret_ref: LocalSecretRef,
    /// The Applications of the Receiver's namespace to reconcile, by name
    /// or labels. Optional for the registry types, which also reconcile
    /// the Applications whose chart is the pushed repository.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ReceiverResource>,
    /// The event names acted on (GitHub's `X-GitHub-Event`: `package`,
    /// `registry_package`; Harbor's `type`: `PUSH_ARTIFACT`); empty is all.
    /// Other events are refused with 400, as Flux does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// Requests are answered 503 and trigger nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// A Secret of the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LocalSecretRef {
    pub name: String,
}

/// Applications of the Receiver's namespace: `name` (`*` for any) and, when
/// given, `matchLabels` (all of them).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReceiverResource {
    /// Only `Application` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReceiverStatus {
    /// What to configure in the registry or CI job:
    /// `/api/webhooks/receivers/<sha256 hex of token, name and namespace>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_path: Option<String>,
    /// `Ready`: the Secret was read and the path is served; why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The types `spec.type` accepts, as the API server checks them.
pub const RECEIVER_TYPES: [&str; 7] = [
    "harbor",
    "dockerhub",
    "quay",
    "github-packages",
    "ghcr",
    "generic",
    "generic-hmac",
];

fn receiver_type(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": RECEIVER_TYPES,
    })
}
