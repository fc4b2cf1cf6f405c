//! Plan: the decision of one ApplicationSet evaluation. The Applications
//! the template rendered (desired) against those that exist in the set's
//! namespace: which to create, update, leave alone or delete, under the
//! set's sync policy and its deletion guard. Pure, like the reconcile's
//! `plan(desired, live)`: the I/O lists the Applications before and acts on
//! the plan after.

use std::collections::{BTreeMap, BTreeSet};

use super::template::Rendered;
use crate::api::{ApplicationSpec, ApplicationsSync, SetSyncPolicy};

/// The share of the set's Applications one evaluation may delete when the
/// policy says nothing.
const DEFAULT_MAX_DELETE_PERCENT: u8 = 50;

/// An Application of the set's namespace, as it is now.
#[derive(Clone, Debug, PartialEq)]
pub struct Existing {
    pub name: String,
    pub owner: Owner,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub spec: ApplicationSpec,
}

/// Who an existing Application belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    ThisSet,
    /// Someone else, described for the user: "ApplicationSet team/other",
    /// "no ApplicationSet (created by hand)".
    Other(String),
}

/// What the deletion guard refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    pub would_delete: usize,
    /// The set's Applications before this evaluation.
    pub owned: usize,
    pub max_percent: u8,
}

/// Every name in one list, each list sorted by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub create: Vec<Rendered>,
    pub update: Vec<Rendered>,
    /// Owned and already as desired.
    pub unchanged: Vec<String>,
    /// Owned and different from the template, but the policy is
    /// `create-only`.
    pub held: Vec<String>,
    pub delete: Vec<String>,
    /// Owned and no longer generated, but not deleted: the policy never
    /// deletes, or the deletion guard refused.
    pub kept: Vec<String>,
    /// Desired names an Application the set does not own already has, with
    /// its owner's description: never created, updated or deleted.
    pub conflicts: Vec<(String, String)>,
    pub guard: Option<Guard>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error(
        "two parameter sets render the same Application name {name:?}: the template's name must tell them apart"
    )]
    DuplicateName { name: String },
}

/// What this evaluation does. Owned Applications that are no longer
/// generated are deleted, unless the policy never deletes or the deletion
/// guard refuses: more than one deletion that is more than
/// `maxDeletePercent` (default 50) of the set's Applications deletes
/// nothing, and `guard` says why. A generator that suddenly yields nothing
/// (a moved directory, a pull request API that answers an empty list, a
/// selector with a typo) must not wipe a fleet; the user confirms by
/// raising the limit. One deletion is always allowed, so a set of one can
/// still shrink to zero, and 100 never refuses.
pub fn plan(
    desired: Vec<Rendered>,
    existing: Vec<Existing>,
    policy: &SetSyncPolicy,
) -> Result<Plan, PlanError> {
    let mut by_name: BTreeMap<String, Rendered> = BTreeMap::new();
    for rendered in desired {
        if by_name.contains_key(&rendered.name) {
            return Err(PlanError::DuplicateName {
                name: rendered.name,
            });
        }
        by_name.insert(rendered.name.clone(), rendered);
    }
    let sync = policy.applications_sync.unwrap_or_default();
    let max_percent = policy
        .max_delete_percent
        .unwrap_or(DEFAULT_MAX_DELETE_PERCENT);

    let mut plan = Plan::default();
    let mut owned = 0;
    let mut seen = BTreeSet::new();
    let mut existing = existing;
    existing.sort_by(|a, b| a.name.cmp(&b.name));
    for live in existing {
        if !seen.insert(live.name.clone()) {
            continue;
        }
        let mine = live.owner == Owner::ThisSet;
        owned += usize::from(mine);
        match (by_name.remove(&live.name), live.owner) {
            (Some(_), Owner::Other(owner)) => plan.conflicts.push((live.name, owner)),
            (None, Owner::Other(_)) => {}
            (Some(rendered), Owner::ThisSet) => {
                if !differs(&rendered, &live.labels, &live.annotations, &live.spec) {
                    plan.unchanged.push(live.name);
                } else if sync == ApplicationsSync::CreateOnly {
                    plan.held.push(live.name);
                } else {
                    plan.update.push(rendered);
                }
            }
            (None, Owner::ThisSet) => match sync {
                ApplicationsSync::Sync => plan.delete.push(live.name),
                ApplicationsSync::CreateUpdate | ApplicationsSync::CreateOnly => {
                    plan.kept.push(live.name)
                }
            },
        }
    }
    plan.create = by_name.into_values().collect();

    let deletions = plan.delete.len();
    if deletions > 1 && deletions * 100 > usize::from(max_percent) * owned {
        plan.guard = Some(Guard {
            would_delete: deletions,
            owned,
            max_percent,
        });
        plan.kept.append(&mut plan.delete);
        plan.kept.sort();
    }
    Ok(plan)
}

/// Whether the live Application differs from the rendered one: its spec,
/// or a label or annotation the template sets. Labels and annotations the
/// template does not set belong to others (a tool, a person) and are left
/// alone.
fn differs(
    rendered: &Rendered,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    spec: &ApplicationSpec,
) -> bool {
    let missing = |want: &BTreeMap<String, String>, have: &BTreeMap<String, String>| {
        want.iter().any(|(key, value)| have.get(key) != Some(value))
    };
    rendered.spec != *spec
        || missing(&rendered.labels, labels)
        || missing(&rendered.annotations, annotations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Source;

    fn spec(path: &str) -> ApplicationSpec {
        ApplicationSpec {
            source: Source {
                repo_url: "https://git.example.com/org/apps.git".to_owned(),
                path: Some(path.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn rendered(name: &str, path: &str) -> Rendered {
        Rendered {
            name: name.to_owned(),
            labels: BTreeMap::from([("team".to_owned(), "shop".to_owned())]),
            annotations: BTreeMap::new(),
            spec: spec(path),
        }
    }

    fn owned(name: &str, path: &str) -> Existing {
        Existing {
            name: name.to_owned(),
            owner: Owner::ThisSet,
            labels: BTreeMap::from([
                ("team".to_owned(), "shop".to_owned()),
                ("someone.else/added".to_owned(), "yes".to_owned()),
            ]),
            annotations: BTreeMap::new(),
            spec: spec(path),
        }
    }

    fn names(rendered: &[Rendered]) -> Vec<&str> {
        rendered.iter().map(|r| r.name.as_str()).collect()
    }

    fn policy(sync: ApplicationsSync, max: Option<u8>) -> SetSyncPolicy {
        SetSyncPolicy {
            applications_sync: Some(sync),
            max_delete_percent: max,
        }
    }

    #[test]
    fn create_update_and_unchanged() {
        let mut relabelled = owned("c", "apps/c");
        relabelled
            .labels
            .insert("team".to_owned(), "ops".to_owned());
        let plan = plan(
            vec![
                rendered("d", "apps/d"),
                rendered("b", "apps/b-moved"),
                rendered("a", "apps/a"),
                rendered("c", "apps/c"),
            ],
            vec![owned("a", "apps/a"), owned("b", "apps/b"), relabelled],
            &SetSyncPolicy::default(),
        )
        .unwrap();
        assert_eq!(names(&plan.create), ["d"]);
        assert_eq!(names(&plan.update), ["b", "c"]);
        // Someone else's label on "a" is not a difference.
        assert_eq!(plan.unchanged, ["a"]);
        assert!(plan.delete.is_empty() && plan.kept.is_empty() && plan.guard.is_none());
    }

    #[test]
    fn a_name_held_by_another_owner_is_a_conflict() {
        let mut theirs = owned("web", "apps/other");
        theirs.owner = Owner::Other("ApplicationSet team/other".to_owned());
        let mut by_hand = owned("stray", "x");
        by_hand.owner = Owner::Other("no ApplicationSet (created by hand)".to_owned());
        let plan = plan(
            vec![rendered("web", "apps/web")],
            vec![theirs, by_hand],
            &SetSyncPolicy::default(),
        )
        .unwrap();
        assert_eq!(
            plan.conflicts,
            [("web".to_owned(), "ApplicationSet team/other".to_owned())]
        );
        assert!(plan.create.is_empty() && plan.update.is_empty());
        // Not the set's: never deleted.
        assert!(plan.delete.is_empty() && plan.kept.is_empty());
    }

    #[test]
    fn create_only_holds_updates_and_keeps_the_rest() {
        let plan = plan(
            vec![rendered("a", "apps/a-moved"), rendered("n", "apps/n")],
            vec![owned("a", "apps/a"), owned("gone", "apps/gone")],
            &policy(ApplicationsSync::CreateOnly, None),
        )
        .unwrap();
        assert_eq!(names(&plan.create), ["n"]);
        assert!(plan.update.is_empty());
        assert_eq!(plan.held, ["a"]);
        assert_eq!(plan.kept, ["gone"]);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn create_update_never_deletes() {
        let plan = plan(
            vec![rendered("a", "apps/a-moved")],
            vec![owned("a", "apps/a"), owned("gone", "apps/gone")],
            &policy(ApplicationsSync::CreateUpdate, None),
        )
        .unwrap();
        assert_eq!(names(&plan.update), ["a"]);
        assert_eq!(plan.kept, ["gone"]);
        assert!(plan.delete.is_empty() && plan.guard.is_none());
    }

    fn fleet(n: usize) -> Vec<Existing> {
        (0..n).map(|i| owned(&format!("app-{i}"), "x")).collect()
    }

    fn keep(names: &[usize]) -> Vec<Rendered> {
        names
            .iter()
            .map(|i| rendered(&format!("app-{i}"), "x"))
            .collect()
    }

    #[test]
    fn the_guard_refuses_three_of_four() {
        let plan = plan(keep(&[0]), fleet(4), &SetSyncPolicy::default()).unwrap();
        assert!(plan.delete.is_empty());
        assert_eq!(plan.kept, ["app-1", "app-2", "app-3"]);
        assert_eq!(
            plan.guard,
            Some(Guard {
                would_delete: 3,
                owned: 4,
                max_percent: 50
            })
        );
        assert_eq!(plan.unchanged, ["app-0"]);
    }

    #[test]
    fn the_guard_allows_one_of_one_and_half() {
        let one = plan(vec![], fleet(1), &SetSyncPolicy::default()).unwrap();
        assert_eq!(one.delete, ["app-0"]);
        assert!(one.guard.is_none());

        let half = plan(keep(&[0, 1]), fleet(4), &SetSyncPolicy::default()).unwrap();
        assert_eq!(half.delete, ["app-2", "app-3"]);
        assert!(half.guard.is_none());
    }

    #[test]
    fn at_one_hundred_percent_everything_may_go() {
        let all = plan(vec![], fleet(4), &policy(ApplicationsSync::Sync, Some(100))).unwrap();
        assert_eq!(all.delete.len(), 4);
        assert!(all.guard.is_none());

        let strict = plan(
            keep(&[0, 1]),
            fleet(4),
            &policy(ApplicationsSync::Sync, Some(25)),
        )
        .unwrap();
        assert!(strict.delete.is_empty());
        assert_eq!(strict.guard.map(|g| g.max_percent), Some(25));
    }

    #[test]
    fn duplicate_names_are_refused() {
        assert_eq!(
            plan(
                vec![
                    rendered("web", "a"),
                    rendered("api", "b"),
                    rendered("web", "c")
                ],
                vec![],
                &SetSyncPolicy::default()
            ),
            Err(PlanError::DuplicateName {
                name: "web".to_owned()
            })
        );
    }
}
