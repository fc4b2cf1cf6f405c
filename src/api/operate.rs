//! Operating a release: a pin to a past revision (`setpoint app rollback`),
//! sync windows, and what the status says of them.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `spec.pin`: the Application is held at this revision instead of
/// following `targetRevision` (written by `setpoint app rollback` and the
/// dashboard's Rollback). Its objects are kept at that revision (drift is
/// corrected under the sync policy); new commits are not applied until
/// someone resumes (`setpoint app resume`, `setpoint app rollback --unpin`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct Pin {
    /// The commit id (for a chart, the version) to keep applied.
    pub revision: String,
    /// Who pinned it: the user the API server authenticated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// The `status.history` entry rolled back to, when it was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_id: Option<u64>,
}

/// Whether a window allows syncs while it is open, or denies them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WindowKind {
    #[default]
    Allow,
    Deny,
}

/// One sync window, as Argo CD's: opens at each time of `schedule` (cron,
/// five fields: minute hour day-of-month month day-of-week) in `timeZone`
/// and stays open for `duration`. While a deny window is open, or while
/// allow windows exist and none is open, automated syncs and drift
/// correction wait; a manual sync needs `--override-window`, unless a window
/// that holds it has `manualSync: true`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncWindow {
    pub kind: WindowKind,
    /// `0 22 * * *`: every day at 22:00.
    pub schedule: String,
    /// `1h`, `30m`, `1h30m`, `2d`.
    pub duration: String,
    /// An IANA time zone (`Europe/Paris`); default UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// Manual syncs may go ahead while this window holds syncs back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manual_sync: bool,
}

/// `status.hold`: why the last reconcile applied nothing it found to
/// change, on purpose.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HoldStatus {
    /// `Suspended` or `SyncWindow`.
    pub reason: String,
    pub message: String,
    /// When syncs may go ahead again (a window's end or next opening),
    /// RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

/// `status.pinned`: the pin the last reconcile followed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedStatus {
    pub revision: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// A newer commit announced for `targetRevision` and not applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newer_revision: Option<String>,
}
