//! Policy: of the steps a plan lists, which this reconcile may carry out,
//! following the Application's `syncPolicy` as Argo CD does: without
//! `automated` nothing changes unless someone asks for a sync; with it a new
//! revision is synced; drift on an unchanged revision is corrected only with
//! `selfHeal`; deletions need `prune`. Pure.

use crate::api::SyncPolicy;
use crate::reconcile::plan::{Action, Cause, Plan, Step};

/// Why this reconcile runs, as far as the policy cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trigger {
    /// Someone asked for a sync (`setpoint reconcile --sync`, the app CLI).
    pub manual: bool,
    /// The commit differs from the last one applied.
    pub new_revision: bool,
}

#[derive(Debug, Default, PartialEq)]
pub struct Decision<'a> {
    pub apply: Vec<&'a Step>,
    pub prune: Vec<&'a Step>,
    /// Steps left alone: reported as OutOfSync.
    pub skipped: Vec<&'a Step>,
    /// Why prunes were withheld, when they were.
    pub prune_blocked: Option<String>,
}

pub fn decide<'a>(
    plan: &'a Plan,
    policy: &SyncPolicy,
    trigger: Trigger,
    desired_count: usize,
) -> Decision<'a> {
    let automated = policy.automated.as_ref();
    let may_sync = trigger.manual || automated.is_some();
    let heal = trigger.manual || trigger.new_revision || automated.is_some_and(|a| a.self_heal);
    let may_prune = trigger.manual || automated.is_some_and(|a| a.prune);
    let mut decision = Decision::default();
    for step in &plan.steps {
        let act = match &step.action {
            Action::Unchanged => continue,
            Action::Create {
                deleted_live: false,
            } => may_sync,
            Action::Update {
                cause: Cause::GitChanged,
                ..
            } => may_sync,
            Action::Create { deleted_live: true }
            | Action::Update {
                cause: Cause::Drift,
                ..
            } => may_sync && heal,
            Action::Prune => {
                if !may_prune {
                    decision.skipped.push(step);
                } else if desired_count == 0 && !policy.allow_empty {
                    decision.prune_blocked = Some(
                        "the render came out empty: refusing to prune everything \
                         (set syncPolicy.allowEmpty to allow it)"
                            .into(),
                    );
                    decision.skipped.push(step);
                } else {
                    decision.prune.push(step);
                }
                continue;
            }
        };
        if act {
            decision.apply.push(step);
        } else {
            decision.skipped.push(step);
        }
    }
    decision
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Automated;
    use crate::manifest::ObjectId;

    fn step(name: &str, action: Action) -> Step {
        let id = ObjectId {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: Some("ns".into()),
            name: name.into(),
        };
        Step { id, action }
    }

    fn plan() -> Plan {
        Plan {
            steps: vec![
                step(
                    "new",
                    Action::Create {
                        deleted_live: false,
                    },
                ),
                step("deleted", Action::Create { deleted_live: true }),
                step(
                    "git",
                    Action::Update {
                        cause: Cause::GitChanged,
                        drift: vec![],
                    },
                ),
                step(
                    "drift",
                    Action::Update {
                        cause: Cause::Drift,
                        drift: vec![],
                    },
                ),
                step("same", Action::Unchanged),
                step("gone", Action::Prune),
            ],
        }
    }

    fn names(steps: &[&Step]) -> Vec<String> {
        steps.iter().map(|s| s.id.name.clone()).collect()
    }

    fn policy(prune: bool, self_heal: bool) -> SyncPolicy {
        SyncPolicy {
            automated: Some(Automated { prune, self_heal }),
            ..Default::default()
        }
    }

    #[test]
    fn without_automated_nothing_changes_unless_asked() {
        let plan = plan();
        let d = decide(&plan, &SyncPolicy::default(), Trigger::default(), 5);
        assert!(d.apply.is_empty() && d.prune.is_empty());
        assert_eq!(
            names(&d.skipped),
            ["new", "deleted", "git", "drift", "gone"]
        );
        let manual = Trigger {
            manual: true,
            new_revision: false,
        };
        let d = decide(&plan, &SyncPolicy::default(), manual, 5);
        assert_eq!(names(&d.apply), ["new", "deleted", "git", "drift"]);
        assert_eq!(names(&d.prune), ["gone"]);
    }

    #[test]
    fn automated_without_self_heal_leaves_drift_on_the_same_revision() {
        let plan = plan();
        let d = decide(&plan, &policy(false, false), Trigger::default(), 5);
        assert_eq!(names(&d.apply), ["new", "git"]);
        assert_eq!(names(&d.skipped), ["deleted", "drift", "gone"]);
    }

    #[test]
    fn a_new_revision_syncs_everything_even_without_self_heal() {
        let plan = plan();
        let trigger = Trigger {
            manual: false,
            new_revision: true,
        };
        let d = decide(&plan, &policy(false, false), trigger, 5);
        assert_eq!(names(&d.apply), ["new", "deleted", "git", "drift"]);
    }

    #[test]
    fn self_heal_corrects_drift_and_prune_deletes() {
        let plan = plan();
        let d = decide(&plan, &policy(true, true), Trigger::default(), 5);
        assert_eq!(names(&d.apply), ["new", "deleted", "git", "drift"]);
        assert_eq!(names(&d.prune), ["gone"]);
        assert!(d.skipped.is_empty());
    }

    #[test]
    fn an_empty_render_never_prunes_everything_unless_allowed() {
        let plan = Plan {
            steps: vec![step("gone", Action::Prune)],
        };
        let d = decide(&plan, &policy(true, true), Trigger::default(), 0);
        assert!(d.prune.is_empty());
        assert!(d.prune_blocked.unwrap().contains("allowEmpty"));
        let mut allow = policy(true, true);
        allow.allow_empty = true;
        let d = decide(&plan, &allow, Trigger::default(), 0);
        assert_eq!(names(&d.prune), ["gone"]);
    }
}
