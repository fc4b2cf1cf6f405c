//! Policy: of the steps a plan lists, which this reconcile may carry out,
//! following the Application's `syncPolicy` as Argo CD does: without
//! `automated` nothing changes unless someone asks for a sync; with it a new
//! revision is synced; drift on an unchanged revision is corrected only with
//! `selfHeal`; deletions need `prune`. Pure.

use std::collections::HashMap;

use serde_json::Value;

use crate::api::SyncPolicy;
use crate::manifest::ObjectId;
use crate::reconcile::plan::{Action, Cause, Plan, Step, find_live};
use crate::reconcile::sync_options::{self, Options, Prune};

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
    /// Why an object's own sync options left it alone.
    pub notes: HashMap<ObjectId, String>,
    /// Objects Git no longer has that `IgnoreExtraneous` keeps out of the
    /// Application's sync status (reported, not counted).
    pub ignored: Vec<&'a Step>,
    /// A hold (`suspended`, `sync window`): nothing was chosen, and each
    /// object left alone says what a sync would do.
    pub held: Option<String>,
}

/// A hold (`operate::hold`): nothing is applied or pruned; every step is
/// left alone and reported as what it would do (`suspended: would set
/// spec.replicas 1→5`).
pub fn hold(decision: &mut Decision<'_>, label: &str) {
    let apply = std::mem::take(&mut decision.apply);
    let prune = std::mem::take(&mut decision.prune);
    decision.skipped.extend(apply);
    decision.skipped.extend(prune);
    decision.held = Some(label.to_string());
}

/// A selective sync (`--only`): only the selected objects are applied,
/// nothing is pruned; the rest is left alone and says so.
pub fn select(decision: &mut Decision<'_>, only: &[crate::operate::Selector]) {
    let apply = std::mem::take(&mut decision.apply);
    for step in apply {
        if only.iter().any(|s| s.matches(&step.id)) {
            decision.apply.push(step);
        } else {
            decision
                .notes
                .insert(step.id.clone(), "not selected by this sync (--only)".into());
            decision.skipped.push(step);
        }
    }
    for step in std::mem::take(&mut decision.prune) {
        decision.notes.insert(
            step.id.clone(),
            "not in Git; a selective sync prunes nothing".into(),
        );
        decision.skipped.push(step);
    }
}

/// The prunes that the live objects' own sync options hold back
/// (`Prune=false`; `Prune=confirm` but for a sync someone asked for), and
/// the extraneous objects left alone that `IgnoreExtraneous` does not count.
pub fn restrain(
    decision: &mut Decision<'_>,
    live: &HashMap<ObjectId, Value>,
    app: Options,
    manual: bool,
) {
    let find = |id: &ObjectId| find_live(id, live);
    let prune = std::mem::take(&mut decision.prune);
    for step in prune {
        let options = find(&step.id).map_or(app, |o| sync_options::of_live(app, o));
        let note = match options.prune {
            Prune::Yes => None,
            Prune::No => Some("not in Git; not pruned (Prune=false)"),
            Prune::Confirm if manual => None,
            Prune::Confirm => {
                Some("not in Git; pruned only by a sync someone asks for (Prune=confirm)")
            }
        };
        match note {
            None => decision.prune.push(step),
            Some(note) => {
                decision.notes.insert(step.id.clone(), note.to_string());
                decision.skipped.push(step);
            }
        }
    }
    let skipped = std::mem::take(&mut decision.skipped);
    for step in skipped {
        let extraneous = matches!(step.action, Action::Prune)
            && find(&step.id).is_some_and(sync_options::ignores_extraneous);
        if extraneous {
            let note = decision.notes.remove(&step.id);
            decision.notes.insert(
                step.id.clone(),
                format!(
                    "{}; IgnoreExtraneous: does not make the Application OutOfSync",
                    note.as_deref().unwrap_or("not in Git")
                ),
            );
            decision.ignored.push(step);
        } else {
            decision.skipped.push(step);
        }
    }
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
    fn a_hold_applies_and_prunes_nothing_even_for_a_manual_sync() {
        let plan = plan();
        let manual = Trigger {
            manual: true,
            new_revision: true,
        };
        let mut d = decide(&plan, &policy(true, true), manual, 5);
        hold(&mut d, "suspended");
        assert!(d.apply.is_empty() && d.prune.is_empty());
        assert_eq!(
            names(&d.skipped),
            ["new", "deleted", "git", "drift", "gone"]
        );
        assert_eq!(d.held.as_deref(), Some("suspended"));
    }

    #[test]
    fn a_selective_sync_applies_the_selected_and_prunes_nothing() {
        let plan = plan();
        let manual = Trigger {
            manual: true,
            new_revision: false,
        };
        let mut d = decide(&plan, &SyncPolicy::default(), manual, 5);
        let only: Vec<crate::operate::Selector> = vec![
            "Deployment/git".parse().unwrap(),
            "Deployment/new".parse().unwrap(),
        ];
        select(&mut d, &only);
        assert_eq!(names(&d.apply), ["new", "git"]);
        assert!(d.prune.is_empty());
        assert_eq!(names(&d.skipped), ["deleted", "drift", "gone"]);
        let gone = &d.skipped[2].id;
        assert_eq!(d.notes[gone], "not in Git; a selective sync prunes nothing");
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

    #[test]
    fn the_objects_own_options_hold_prunes_back() {
        let plan = Plan {
            steps: vec![
                step("kept", Action::Prune),
                step("confirm", Action::Prune),
                step("extra", Action::Prune),
                step("gone", Action::Prune),
            ],
        };
        let live_of = |name: &str, annotations: serde_json::Value| {
            (
                plan.steps
                    .iter()
                    .find(|s| s.id.name == name)
                    .unwrap()
                    .id
                    .clone(),
                serde_json::json!({"metadata": {"name": name, "annotations": annotations}}),
            )
        };
        let live: HashMap<ObjectId, Value> = [
            live_of(
                "kept",
                serde_json::json!({"argocd.argoproj.io/sync-options": "Prune=false"}),
            ),
            live_of(
                "confirm",
                serde_json::json!({"argocd.argoproj.io/sync-options": "Prune=confirm"}),
            ),
            live_of(
                "extra",
                serde_json::json!({
                    "argocd.argoproj.io/sync-options": "Prune=false",
                    "argocd.argoproj.io/compare-options": "IgnoreExtraneous",
                }),
            ),
            live_of("gone", serde_json::json!({})),
        ]
        .into_iter()
        .collect();
        let mut d = decide(&plan, &policy(true, true), Trigger::default(), 5);
        restrain(&mut d, &live, Options::default(), false);
        assert_eq!(names(&d.prune), ["gone"]);
        assert_eq!(names(&d.skipped), ["kept", "confirm"]);
        assert_eq!(names(&d.ignored), ["extra"]);
        assert!(d.notes[&d.skipped[0].id].contains("Prune=false"));
        assert!(d.notes[&d.ignored[0].id].contains("IgnoreExtraneous"));
        // A sync someone asks for prunes a Prune=confirm object.
        let manual = Trigger {
            manual: true,
            new_revision: false,
        };
        let mut d = decide(&plan, &policy(true, true), manual, 5);
        restrain(&mut d, &live, Options::default(), true);
        assert_eq!(names(&d.prune), ["confirm", "gone"]);
    }
}
