//! The status of one ordered sync (`status.syncRun`): the sync of a new
//! revision of an Application that uses sync waves or hooks, followed across
//! reconciles. A reconcile that waits for a wave or a hook ends; the next one
//! reads this to know which hooks of the revision already ran, and since
//! when a wave has been waited for (its timeout).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where an ordered sync is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RunPhase {
    /// PreSync hooks run; no wave has started.
    #[default]
    PreSync,
    /// The waves (and Sync hooks) are applied in ascending order.
    Sync,
    /// Every wave is Healthy and the prunes are done; PostSync hooks run.
    PostSync,
    Succeeded,
    /// A hook failed or a wave timed out; SyncFail hooks were started.
    Failed,
}

impl RunPhase {
    pub fn is_finished(self) -> bool {
        matches!(self, RunPhase::Succeeded | RunPhase::Failed)
    }
}

/// The phase of a sync at which a hook object (`setpoint.dev/hook`) runs.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum HookPhase {
    #[default]
    PreSync,
    Sync,
    PostSync,
    SyncFail,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum HookState {
    #[default]
    Running,
    Succeeded,
    Failed,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncRun {
    /// The commit this sync applies.
    pub revision: String,
    pub phase: RunPhase,
    /// RFC 3339, with milliseconds.
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Why it failed, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The waves started so far, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveRecord>,
    /// The hooks created so far, in the order they were created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookRecord>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::kubernetes_formats)]
pub struct WaveRecord {
    pub wave: i32,
    /// Objects in the wave (hooks included).
    pub objects: u32,
    pub started_at: String,
    /// From its start until every object of it was Healthy; absent while
    /// it is waited for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookRecord {
    pub phase: HookPhase,
    pub group: String,
    pub version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    pub state: HookState,
    pub started_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
