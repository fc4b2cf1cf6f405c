//! Notifications out (`providers.setpoint.dev`, `alerts.setpoint.dev`,
//! `setpoint.dev/v1alpha1`), shaped like Flux's notification-controller
//! (`notification.toolkit.fluxcd.io/v1beta3`): a Provider says where
//! messages go and in which format (its address and token live in a
//! Secret, never in the spec: a Slack webhook URL is itself a secret); an
//! Alert picks the Applications of its own namespace and the kinds of
//! events that go to one Provider. What they mean is `src/notify/`.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::Condition;

/// Where notifications go and how they are encoded.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "setpoint.dev",
    version = "v1alpha1",
    kind = "Provider",
    namespaced,
    status = "NotifyStatus",
    shortname = "spprovider",
    category = "setpoint",
    printcolumn = r#"{"name":"Type","type":"string","jsonPath":".spec.type"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    #[serde(rename = "type")]
    pub type_: ProviderType,
    /// The Secret of the Provider's namespace that holds `address` (the
    /// webhook URL; for `github`/`gitlab` the API URL, optional) and
    /// `token` (a bearer token; the signing key for `generic-hmac`; the
    /// API token for `github`/`gitlab`), and for `generic` and
    /// `generic-hmac` optionally `headers` (a YAML map of extra headers).
    pub secret_ref: LocalRef,
    /// The channel to post to (Slack), when the webhook does not fix it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The name messages are posted under (Slack, Discord).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// How long one delivery may take (`10s` when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// Stop sending: notifications for this Provider are dropped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// The formats a Provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderType {
    /// A Slack incoming webhook (`address`), or `chat.postMessage` with a
    /// bot `token`.
    Slack,
    /// A Microsoft Teams workflow webhook (an Adaptive Card).
    Msteams,
    /// A Discord webhook (`content` and `embeds`).
    Discord,
    /// A JSON POST of the event, in Flux's event shape.
    Generic,
    /// The same, signed: `X-Signature: sha256=<hex HMAC of the body>` with
    /// the Secret's `token` as the key.
    GenericHmac,
    /// Commit statuses on GitHub, on the revision the event names.
    Github,
    /// Commit statuses on GitLab.
    Gitlab,
}

impl ProviderType {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderType::Slack => "slack",
            ProviderType::Msteams => "msteams",
            ProviderType::Discord => "discord",
            ProviderType::Generic => "generic",
            ProviderType::GenericHmac => "generic-hmac",
            ProviderType::Github => "github",
            ProviderType::Gitlab => "gitlab",
        }
    }
}

/// An object of the same namespace, by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct LocalRef {
    pub name: String,
}

/// Which Applications' events go to a Provider.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "setpoint.dev",
    version = "v1alpha1",
    kind = "Alert",
    namespaced,
    status = "NotifyStatus",
    shortname = "spalert",
    category = "setpoint",
    printcolumn = r#"{"name":"Provider","type":"string","jsonPath":".spec.providerRef.name"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AlertSpec {
    /// The Provider of the Alert's namespace to send to.
    pub provider_ref: LocalRef,
    /// `info` (every event) or `error` (failures only), as Flux's.
    #[serde(default)]
    pub event_severity: Severity,
    /// The Applications of the Alert's namespace whose events it sends: by
    /// name (`*` for all) or by labels.
    pub event_sources: Vec<EventSource>,
    /// Which kinds of events; empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_kinds: Vec<EventKind>,
    /// A line every message of this Alert starts with (the cluster, the
    /// team).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Extra metadata added to every event (the generic payload's
    /// `metadata`, facts in chat messages).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub event_metadata: BTreeMap<String, String>,
    /// At most one notification per Application and kind within this
    /// interval (`1m`, `30s`); unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// Stop sending this Alert's notifications.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// Flux's event severities: `error` is the failures, `info` everything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    #[default]
    Info,
    Error,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Error => "error",
        }
    }
}

/// Applications an Alert listens to: `name` (`*` for every one) and/or
/// `matchLabels`; both must match when both are set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventSource {
    /// Only `Application`.
    #[serde(default = "application_kind")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
}

fn application_kind() -> String {
    "Application".into()
}

/// What happened to an Application, as an Alert selects it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum EventKind {
    /// A revision was applied (objects created, updated or pruned).
    Synced,
    /// A sync failed and is retried (the cluster, the network, a failed
    /// wave or hook run).
    SyncFailed,
    /// A change made outside Setpoint was set back.
    DriftCorrected,
    /// The Application's health went from Healthy to Degraded.
    HealthDegraded,
    /// It is Healthy again after being Degraded.
    HealthRecovered,
    /// It cannot go on until its source or spec changes (bad YAML, an
    /// unknown kind, a forbidden object).
    Stalled,
    /// A sync hook (Job) failed.
    HookFailed,
    /// A preview of a pull request that would change it was posted.
    PreviewPosted,
}

impl EventKind {
    pub const ALL: [EventKind; 8] = [
        EventKind::Synced,
        EventKind::SyncFailed,
        EventKind::DriftCorrected,
        EventKind::HealthDegraded,
        EventKind::HealthRecovered,
        EventKind::Stalled,
        EventKind::HookFailed,
        EventKind::PreviewPosted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Synced => "synced",
            EventKind::SyncFailed => "syncFailed",
            EventKind::DriftCorrected => "driftCorrected",
            EventKind::HealthDegraded => "healthDegraded",
            EventKind::HealthRecovered => "healthRecovered",
            EventKind::Stalled => "stalled",
            EventKind::HookFailed => "hookFailed",
            EventKind::PreviewPosted => "previewPosted",
        }
    }
}

/// Whether the Alert or Provider can deliver (`Ready`), and why not.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotifyStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_and_providers_read_as_flux_writes_them() {
        let alert: AlertSpec = serde_yaml::from_str(
            r#"
providerRef: {name: slack}
eventSeverity: error
eventSources:
  - name: '*'
  - kind: Application
    matchLabels: {team: web}
eventKinds: [driftCorrected, syncFailed]
rateLimit: 1m
"#,
        )
        .unwrap();
        assert_eq!(alert.event_severity, Severity::Error);
        assert_eq!(alert.event_sources[0].kind, "Application");
        assert_eq!(alert.event_sources[0].name.as_deref(), Some("*"));
        assert_eq!(
            alert.event_kinds,
            [EventKind::DriftCorrected, EventKind::SyncFailed]
        );
        let provider: ProviderSpec =
            serde_yaml::from_str("type: generic-hmac\nsecretRef: {name: hook}\nchannel: ops\n")
                .unwrap();
        assert_eq!(provider.type_, ProviderType::GenericHmac);
        assert_eq!(provider.type_.as_str(), "generic-hmac");
        for kind in EventKind::ALL {
            let text = serde_json::to_string(&kind).unwrap();
            assert_eq!(text, format!("\"{}\"", kind.as_str()));
        }
    }
}
