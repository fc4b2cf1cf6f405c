//! The reverse index of `spec.dependsOn` (dependency → dependents), fed by
//! the Application watch: when an Application turns ready for its
//! dependents, or becomes ready at another revision, they are enqueued at
//! once. No polling: a dependent waiting for its dependencies reconciles
//! again only then (or when its own spec changes).

use std::collections::{BTreeSet, HashMap};

use kube::ResourceExt;

use crate::api::Application;
use crate::event::AppKey;
use crate::reconcile::depends::{State, dependencies, ready_revision, state};

/// What an Application's change means for its dependents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    Nothing,
    /// It turned ready, or ready at another revision: every dependent.
    Ready,
    /// It is still not ready, for another reason: the dependents waiting
    /// for it, so that their condition says where it stands now.
    Changed,
}

#[derive(Debug, Default)]
pub struct Dependents {
    /// Dependency → the Applications that name it (it may not exist yet).
    by_dependency: HashMap<AppKey, BTreeSet<AppKey>>,
    /// Dependent → what it named, to undo on change or delete.
    declared: HashMap<AppKey, Vec<AppKey>>,
    /// Each Application's last readiness: the revision it is ready at, and
    /// where it stands.
    ready: HashMap<AppKey, (Option<String>, State)>,
}

impl Dependents {
    /// Records `app` as the watch sees it now, and says which of its
    /// dependents are due an event.
    pub fn apply(&mut self, app: &Application) -> Due {
        let key = key_of(app);
        let named = dependencies(app);
        if self.declared.get(&key) != Some(&named) {
            self.forget_edges(&key);
            for dependency in &named {
                self.by_dependency
                    .entry(dependency.clone())
                    .or_default()
                    .insert(key.clone());
            }
            if named.is_empty() {
                self.declared.remove(&key);
            } else {
                self.declared.insert(key.clone(), named);
            }
        }
        let now = (ready_revision(app), state(Some(app)));
        let before = self.ready.insert(key, now.clone());
        match before {
            _ if now.0.is_some()
                && before.as_ref().and_then(|b| b.0.as_ref()) != now.0.as_ref() =>
            {
                Due::Ready
            }
            Some(before) if before.1 != now.1 => Due::Changed,
            None if now.0.is_none() => Due::Changed,
            _ => Due::Nothing,
        }
    }

    /// `key` was deleted: its edges go (its dependents stay indexed under
    /// it, waiting for it as missing).
    pub fn delete(&mut self, key: &AppKey) {
        self.forget_edges(key);
        self.ready.remove(key);
    }

    /// The Applications that name `key` in `spec.dependsOn`.
    pub fn of(&self, key: &AppKey) -> Vec<AppKey> {
        self.by_dependency
            .get(key)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn forget_edges(&mut self, key: &AppKey) {
        for dependency in self.declared.remove(key).unwrap_or_default() {
            if let Some(dependents) = self.by_dependency.get_mut(&dependency) {
                dependents.remove(key);
                if dependents.is_empty() {
                    self.by_dependency.remove(&dependency);
                }
            }
        }
    }
}

pub fn key_of(app: &Application) -> AppKey {
    AppKey::new(app.namespace().unwrap_or_default(), app.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        ApplicationSpec, ApplicationStatus, Condition, ConditionStatus, ConditionType, Dependency,
        Health, HealthStatus, Sync, SyncStatus,
    };

    fn app(name: &str, depends_on: &[&str]) -> Application {
        let mut app = Application::new(
            name,
            ApplicationSpec {
                depends_on: depends_on
                    .iter()
                    .map(|d| Dependency {
                        name: d.to_string(),
                        namespace: None,
                    })
                    .collect(),
                ..Default::default()
            },
        );
        app.metadata.namespace = Some("ns".into());
        app.metadata.generation = Some(1);
        app
    }

    fn ready_at(mut app: Application, revision: &str) -> Application {
        app.status = Some(ApplicationStatus {
            sync: SyncStatus {
                status: Sync::Synced,
                revision: Some(revision.into()),
            },
            health: HealthStatus {
                status: Health::Healthy,
                message: None,
            },
            last_applied_revision: Some(revision.into()),
            observed_generation: Some(1),
            conditions: vec![Condition {
                type_: ConditionType::Ready,
                status: ConditionStatus::True,
                reason: "Synced".into(),
                message: String::new(),
                last_transition_time: "t".into(),
                observed_generation: Some(1),
            }],
            ..Default::default()
        });
        app
    }

    fn key(name: &str) -> AppKey {
        AppKey::new("ns", name)
    }

    #[test]
    fn dependents_are_found_even_before_their_dependency_exists() {
        let mut index = Dependents::default();
        index.apply(&app("b", &["a"]));
        index.apply(&app("c", &["a", "x"]));
        assert_eq!(index.of(&key("a")), vec![key("b"), key("c")]);
        assert_eq!(index.of(&key("x")), vec![key("c")]);
        assert!(index.of(&key("b")).is_empty());
    }

    #[test]
    fn turning_ready_or_changing_revision_is_due_once_and_other_changes_too() {
        let mut index = Dependents::default();
        index.apply(&app("b", &["a"]));
        assert_eq!(index.apply(&app("a", &[])), Due::Changed, "created");
        assert_eq!(index.apply(&app("a", &[])), Due::Nothing, "no change");
        let mut progressing = ready_at(app("a", &[]), "r1");
        progressing.status.as_mut().unwrap().health.status = Health::Progressing;
        assert_eq!(index.apply(&progressing), Due::Changed, "progressing");
        let ready = |revision| ready_at(app("a", &[]), revision);
        assert_eq!(index.apply(&ready("r1")), Due::Ready, "became ready");
        assert_eq!(index.apply(&ready("r1")), Due::Nothing, "same revision");
        assert_eq!(index.apply(&ready("r2")), Due::Ready, "new revision");
        assert_eq!(index.apply(&app("a", &[])), Due::Changed, "no longer ready");
        assert_eq!(index.apply(&ready("r2")), Due::Ready, "ready again");
    }

    #[test]
    fn a_changed_or_deleted_dependent_leaves_the_index() {
        let mut index = Dependents::default();
        index.apply(&app("b", &["a"]));
        index.apply(&app("b", &["c"]));
        assert!(index.of(&key("a")).is_empty());
        assert_eq!(index.of(&key("c")), vec![key("b")]);
        index.delete(&key("b"));
        assert!(index.of(&key("c")).is_empty());
        assert!(index.by_dependency.is_empty() && index.declared.is_empty());
    }
}
