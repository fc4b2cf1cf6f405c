//! Status conditions in the kstatus convention (`Ready`, `Reconciling`,
//! `Stalled`), updated as `meta.SetStatusCondition` does: the transition time
//! moves only when the status itself changes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ConditionType {
    /// The live state equals Git and is healthy.
    Ready,
    /// Setpoint is still working towards Ready (applied, waiting on health).
    Reconciling,
    /// Setpoint cannot go on until something changes (bad YAML, unknown kind).
    Stalled,
    /// The render reads more paths than the status keeps: its recorded
    /// inputs are the whole repository, so every push reconciles it.
    InputsCapped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: ConditionType,
    pub status: ConditionStatus,
    /// CamelCase, machine-readable: `Synced`, `InvalidManifest`, `FetchFailed`.
    pub reason: String,
    pub message: String,
    /// RFC 3339; kept while the status does not change.
    pub last_transition_time: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Sets one condition in `conditions`, keeping its `lastTransitionTime` when
/// its status did not change.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time.clone();
            }
            *existing = new;
        }
        None => conditions.push(new),
    }
    conditions.sort_by_key(|c| c.type_ as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(status: ConditionStatus, reason: &str, at: &str) -> Condition {
        Condition {
            type_: ConditionType::Ready,
            status,
            reason: reason.into(),
            message: format!("{reason} message"),
            last_transition_time: at.into(),
            observed_generation: Some(1),
        }
    }

    #[test]
    fn transition_time_is_kept_while_the_status_holds() {
        let mut conditions = vec![];
        set_condition(
            &mut conditions,
            condition(ConditionStatus::True, "Synced", "t1"),
        );
        set_condition(
            &mut conditions,
            condition(ConditionStatus::True, "SyncedAgain", "t2"),
        );
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].last_transition_time, "t1");
        assert_eq!(conditions[0].reason, "SyncedAgain");
    }

    #[test]
    fn transition_time_moves_when_the_status_changes() {
        let mut conditions = vec![condition(ConditionStatus::True, "Synced", "t1")];
        set_condition(
            &mut conditions,
            condition(ConditionStatus::False, "Broken", "t2"),
        );
        assert_eq!(conditions[0].last_transition_time, "t2");
        assert_eq!(conditions[0].status, ConditionStatus::False);
    }

    #[test]
    fn conditions_stay_in_a_stable_order() {
        let mut conditions = vec![];
        let mut stalled = condition(ConditionStatus::True, "Bad", "t1");
        stalled.type_ = ConditionType::Stalled;
        set_condition(&mut conditions, stalled);
        set_condition(
            &mut conditions,
            condition(ConditionStatus::False, "Bad", "t1"),
        );
        let types: Vec<_> = conditions.iter().map(|c| c.type_).collect();
        assert_eq!(types, vec![ConditionType::Ready, ConditionType::Stalled]);
    }
}
