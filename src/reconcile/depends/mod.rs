//! Dependencies between Applications (`spec.dependsOn`), decided before the
//! source is read: may this Application sync now, or must it wait for
//! another, or can it never (a cycle, a namespace it may not name)?
//!
//! Pure: the Applications are looked up through a function (the process's
//! reflector store, or what the API server answered), so every case is a
//! unit test on plain data. The watch keeps the reverse index
//! (`ingest/dependents.rs`) and enqueues the dependents of an Application
//! the moment [`ready_revision`] turns to a revision: nothing here polls.

use std::collections::BTreeSet;
use std::sync::Arc;

use kube::ResourceExt;

use crate::api::{Application, ConditionStatus, ConditionType, Health, Sync};
use crate::event::AppKey;

pub mod lookup;

/// The condition reason while a dependency is not ready.
pub const NOT_READY: &str = "DependencyNotReady";

/// What makes a `dependsOn` impossible to satisfy until the spec changes.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum DependsError {
    #[error("dependency cycle: {}", cycle_text(.cycle))]
    Cycle { cycle: Vec<AppKey> },
    #[error(
        "spec.dependsOn names {dependency}, in another namespace: only Applications of admin namespaces may depend on another namespace's Applications"
    )]
    OtherNamespace { dependency: AppKey },
}

impl DependsError {
    /// The condition reason and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            DependsError::Cycle { .. } => "DependencyCycle",
            DependsError::OtherNamespace { .. } => "DependencyNotAllowed",
        }
    }
}

fn cycle_text(cycle: &[AppKey]) -> String {
    cycle
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" → ")
}

/// Where one dependency stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    Ready,
    /// No such Application.
    Missing,
    /// It exists but is not (yet) Synced and Healthy at its revision: why.
    NotReady(String),
}

/// The outcome of the gate when no error stops it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Every dependency is ready (or there are none): sync.
    Open,
    /// Wait: the dependencies that are not ready, in `spec.dependsOn` order.
    Wait(Vec<(AppKey, State)>),
}

impl Gate {
    /// The `Ready=False` message while waiting.
    pub fn message(&self) -> Option<String> {
        let Gate::Wait(waiting) = self else {
            return None;
        };
        let parts: Vec<String> = waiting
            .iter()
            .map(|(key, state)| match state {
                State::Ready => format!("{key} (ready)"),
                State::Missing => format!("{key} (missing: no such Application)"),
                State::NotReady(why) => format!("{key} ({why})"),
            })
            .collect();
        Some(format!("waiting for dependencies: {}", parts.join(", ")))
    }
}

/// The Applications `app` depends on, its own namespace filled in, each once.
pub fn dependencies(app: &Application) -> Vec<AppKey> {
    let own = app.namespace().unwrap_or_default();
    let mut seen = BTreeSet::new();
    app.spec
        .depends_on
        .iter()
        .map(|d| AppKey::new(d.namespace.clone().unwrap_or_else(|| own.clone()), &d.name))
        .filter(|key| seen.insert(key.clone()))
        .collect()
}

/// The revision at which `app` is ready for its dependents: Synced and
/// Healthy, with `Ready=True`, at the revision its current spec resolved to
/// (its status observed the current generation). None when not ready.
pub fn ready_revision(app: &Application) -> Option<String> {
    not_ready_reason(app)
        .is_none()
        .then(|| app.status.as_ref()?.sync.revision.clone())
        .flatten()
}

/// Why `app` is not ready for its dependents; None when it is.
fn not_ready_reason(app: &Application) -> Option<String> {
    if app.spec.suspend {
        return Some("suspended".into());
    }
    let Some(status) = app.status.as_ref() else {
        return Some("not reconciled yet".into());
    };
    if let Some(stalled) = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Stalled && c.status == ConditionStatus::True)
    {
        return Some(format!("Stalled: {}", stalled.reason));
    }
    if app.metadata.generation.is_some() && status.observed_generation != app.metadata.generation {
        return Some("its spec change is not reconciled yet".into());
    }
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready);
    if let Some(ready) = ready
        && ready.reason == NOT_READY
    {
        return Some("waiting for its own dependencies".into());
    }
    let at_revision =
        status.sync.revision.is_some() && status.sync.revision == status.last_applied_revision;
    if status.sync.status != Sync::Synced || status.health.status != Health::Healthy || !at_revision
    {
        return Some(format!(
            "{:?}, {:?}",
            status.sync.status, status.health.status
        ));
    }
    match ready {
        Some(ready) if ready.status == ConditionStatus::True => None,
        Some(ready) => Some(format!("Ready {:?}: {}", ready.status, ready.reason)),
        None => Some("no Ready condition yet".into()),
    }
}

/// The state of one dependency, from what the lookup found.
pub fn state(dependency: Option<&Application>) -> State {
    match dependency {
        None => State::Missing,
        Some(app) => match not_ready_reason(app) {
            None => State::Ready,
            Some(why) => State::NotReady(why),
        },
    }
}

/// A way back from `start` to itself along `dependsOn` edges, as the list of
/// its members from `start` and back to `start`; None when there is none.
/// `edges` gives an Application's dependencies (none when unknown).
pub fn find_cycle(start: &AppKey, edges: &dyn Fn(&AppKey) -> Vec<AppKey>) -> Option<Vec<AppKey>> {
    // Depth first, each Application visited once: a path that reaches an
    // already visited one cannot close a new cycle through `start`.
    let mut visited = BTreeSet::new();
    let mut path = vec![start.clone()];
    let mut stack = vec![edges(start).into_iter()];
    while let Some(next) = stack.last_mut() {
        match next.next() {
            Some(key) if key == *start => {
                path.push(key);
                return Some(path);
            }
            Some(key) => {
                if visited.insert(key.clone()) {
                    stack.push(edges(&key).into_iter());
                    path.push(key);
                }
            }
            None => {
                stack.pop();
                path.pop();
            }
        }
    }
    None
}

/// Whether `app` may sync now. `admin` says whether its namespace is an
/// admin namespace; `lookup` finds an Application (None: no such one).
pub fn gate(
    app: &Application,
    admin: bool,
    lookup: &dyn Fn(&AppKey) -> Option<Arc<Application>>,
) -> Result<Gate, DependsError> {
    let dependencies = dependencies(app);
    if dependencies.is_empty() {
        return Ok(Gate::Open);
    }
    let own = app.namespace().unwrap_or_default();
    if !admin && let Some(other) = dependencies.iter().find(|d| d.namespace != own) {
        return Err(DependsError::OtherNamespace {
            dependency: other.clone(),
        });
    }
    let key = AppKey::new(own, app.name_any());
    // The Application's own edges come from the spec in hand (newer than
    // the store's copy when its spec just changed).
    let edges = |at: &AppKey| {
        if *at == key {
            dependencies.clone()
        } else {
            lookup(at)
                .map(|a| self::dependencies(&a))
                .unwrap_or_default()
        }
    };
    if let Some(cycle) = find_cycle(&key, &edges) {
        return Err(DependsError::Cycle { cycle });
    }
    let waiting: Vec<(AppKey, State)> = dependencies
        .into_iter()
        .map(|d| {
            let found = lookup(&d);
            let state = state(found.as_deref());
            (d, state)
        })
        .filter(|(_, state)| *state != State::Ready)
        .collect();
    Ok(if waiting.is_empty() {
        Gate::Open
    } else {
        Gate::Wait(waiting)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::api::{
        ApplicationSpec, ApplicationStatus, Condition, Dependency, HealthStatus, SyncStatus,
    };

    fn app(namespace: &str, name: &str, depends_on: &[(&str, Option<&str>)]) -> Application {
        let mut app = Application::new(
            name,
            ApplicationSpec {
                depends_on: depends_on
                    .iter()
                    .map(|(name, namespace)| Dependency {
                        name: name.to_string(),
                        namespace: namespace.map(str::to_string),
                    })
                    .collect(),
                ..Default::default()
            },
        );
        app.metadata.namespace = Some(namespace.into());
        app.metadata.generation = Some(1);
        app
    }

    fn condition(type_: ConditionType, status: ConditionStatus, reason: &str) -> Condition {
        Condition {
            type_,
            status,
            reason: reason.into(),
            message: String::new(),
            last_transition_time: "t".into(),
            observed_generation: Some(1),
        }
    }

    fn with_status(mut app: Application, sync: Sync, health: Health, ready: bool) -> Application {
        app.status = Some(ApplicationStatus {
            sync: SyncStatus {
                status: sync,
                revision: Some("abc".into()),
            },
            health: HealthStatus {
                status: health,
                message: None,
            },
            last_applied_revision: Some("abc".into()),
            observed_generation: Some(1),
            conditions: vec![condition(
                ConditionType::Ready,
                if ready {
                    ConditionStatus::True
                } else {
                    ConditionStatus::False
                },
                if ready { "Synced" } else { "Progressing" },
            )],
            ..Default::default()
        });
        app
    }

    fn ready(app: Application) -> Application {
        with_status(app, Sync::Synced, Health::Healthy, true)
    }

    fn store(apps: Vec<Application>) -> HashMap<AppKey, Arc<Application>> {
        apps.into_iter()
            .map(|a| {
                (
                    AppKey::new(a.namespace().unwrap(), a.name_any()),
                    Arc::new(a),
                )
            })
            .collect()
    }

    fn gate_in(
        app: &Application,
        admin: bool,
        apps: &HashMap<AppKey, Arc<Application>>,
    ) -> Result<Gate, DependsError> {
        gate(app, admin, &|key| apps.get(key).cloned())
    }

    #[test]
    fn no_dependencies_is_open() {
        assert_eq!(
            gate_in(&app("ns", "b", &[]), false, &store(vec![])),
            Ok(Gate::Open)
        );
    }

    #[test]
    fn the_namespace_defaults_to_the_applications_own_and_each_is_listed_once() {
        let b = app(
            "team",
            "b",
            &[("a", None), ("a", Some("team")), ("c", Some("infra"))],
        );
        assert_eq!(
            dependencies(&b),
            vec![AppKey::new("team", "a"), AppKey::new("infra", "c")]
        );
    }

    #[test]
    fn a_ready_dependency_opens_the_gate() {
        let apps = store(vec![ready(app("ns", "a", &[]))]);
        let b = app("ns", "b", &[("a", None)]);
        assert_eq!(gate_in(&b, false, &apps), Ok(Gate::Open));
    }

    #[test]
    fn a_progressing_dependency_waits_and_the_message_says_why() {
        let a = with_status(
            app("ns", "a", &[]),
            Sync::Synced,
            Health::Progressing,
            false,
        );
        let apps = store(vec![a]);
        let b = app("ns", "b", &[("a", None)]);
        let gate = gate_in(&b, false, &apps).unwrap();
        assert_eq!(
            gate,
            Gate::Wait(vec![(
                AppKey::new("ns", "a"),
                State::NotReady("Synced, Progressing".into())
            )])
        );
        assert_eq!(
            gate.message().unwrap(),
            "waiting for dependencies: ns/a (Synced, Progressing)"
        );
    }

    #[test]
    fn a_missing_dependency_is_a_wait_naming_it_as_missing_not_an_error() {
        let b = app("ns", "b", &[("ghost", None)]);
        let gate = gate_in(&b, false, &store(vec![])).unwrap();
        assert_eq!(
            gate,
            Gate::Wait(vec![(AppKey::new("ns", "ghost"), State::Missing)])
        );
        assert!(gate.message().unwrap().contains("ns/ghost (missing"));
    }

    #[test]
    fn only_the_dependencies_not_ready_are_listed() {
        let apps = store(vec![
            ready(app("ns", "a", &[])),
            with_status(app("ns", "c", &[]), Sync::OutOfSync, Health::Healthy, false),
        ]);
        let b = app("ns", "b", &[("a", None), ("c", None)]);
        let Gate::Wait(waiting) = gate_in(&b, false, &apps).unwrap() else {
            panic!("waits")
        };
        assert_eq!(
            waiting,
            vec![(
                AppKey::new("ns", "c"),
                State::NotReady("OutOfSync, Healthy".into())
            )]
        );
    }

    #[test]
    fn readiness_needs_the_current_generation_the_applied_revision_and_no_waiting_of_its_own() {
        let ok = ready(app("ns", "a", &[]));
        assert_eq!(ready_revision(&ok), Some("abc".into()));

        let mut newer_spec = ok.clone();
        newer_spec.metadata.generation = Some(2);
        assert_eq!(
            state(Some(&newer_spec)),
            State::NotReady("its spec change is not reconciled yet".into())
        );

        let mut not_applied = ok.clone();
        not_applied.status.as_mut().unwrap().last_applied_revision = Some("old".into());
        assert_eq!(ready_revision(&not_applied), None);

        let mut waiting = ok.clone();
        waiting.status.as_mut().unwrap().conditions = vec![condition(
            ConditionType::Ready,
            ConditionStatus::False,
            NOT_READY,
        )];
        assert_eq!(
            state(Some(&waiting)),
            State::NotReady("waiting for its own dependencies".into())
        );

        let mut stalled = ok.clone();
        stalled.status.as_mut().unwrap().conditions.push(condition(
            ConditionType::Stalled,
            ConditionStatus::True,
            "DependencyCycle",
        ));
        assert_eq!(
            state(Some(&stalled)),
            State::NotReady("Stalled: DependencyCycle".into())
        );

        let mut suspended = ok.clone();
        suspended.spec.suspend = true;
        assert_eq!(ready_revision(&suspended), None);

        assert_eq!(
            state(Some(&app("ns", "new", &[]))),
            State::NotReady("not reconciled yet".into())
        );
    }

    #[test]
    fn a_two_member_cycle_is_named_from_each_side() {
        let a = app("ns", "a", &[("b", None)]);
        let b = app("ns", "b", &[("a", None)]);
        let apps = store(vec![a.clone(), b.clone()]);
        let error = gate_in(&a, false, &apps).unwrap_err();
        assert_eq!(error.to_string(), "dependency cycle: ns/a → ns/b → ns/a");
        assert_eq!(error.reason(), "DependencyCycle");
        assert_eq!(
            gate_in(&b, false, &apps).unwrap_err().to_string(),
            "dependency cycle: ns/b → ns/a → ns/b"
        );
    }

    #[test]
    fn a_longer_cycle_a_self_dependency_and_a_diamond() {
        let apps = store(vec![
            app("ns", "a", &[("b", None)]),
            app("ns", "b", &[("c", None)]),
            app("ns", "c", &[("a", None)]),
        ]);
        let a = apps[&AppKey::new("ns", "a")].clone();
        assert_eq!(
            gate_in(&a, false, &apps).unwrap_err(),
            DependsError::Cycle {
                cycle: ["a", "b", "c", "a"].map(|n| AppKey::new("ns", n)).to_vec()
            }
        );
        let me = app("ns", "me", &[("me", None)]);
        assert_eq!(
            gate_in(&me, false, &store(vec![])).unwrap_err().to_string(),
            "dependency cycle: ns/me → ns/me"
        );
        // a → b, a → c, b → d, c → d: shared, not circular.
        let apps = store(vec![
            app("ns", "b", &[("d", None)]),
            app("ns", "c", &[("d", None)]),
            app("ns", "d", &[]),
        ]);
        let a = app("ns", "a", &[("b", None), ("c", None)]);
        assert!(matches!(gate_in(&a, false, &apps), Ok(Gate::Wait(_))));
    }

    #[test]
    fn a_cycle_elsewhere_is_a_dependency_not_ready_not_a_cycle_of_this_one() {
        let mut b = app("ns", "b", &[("c", None)]);
        b = with_status(b, Sync::Unknown, Health::Unknown, false);
        let apps = store(vec![b, app("ns", "c", &[("b", None)])]);
        let a = app("ns", "a", &[("b", None)]);
        assert!(matches!(gate_in(&a, false, &apps), Ok(Gate::Wait(_))));
    }

    #[test]
    fn another_namespace_only_for_admin_namespaces() {
        let apps = store(vec![ready(app("infra", "db", &[]))]);
        let b = app("team", "b", &[("db", Some("infra"))]);
        let error = gate_in(&b, false, &apps).unwrap_err();
        assert_eq!(error.reason(), "DependencyNotAllowed");
        assert!(error.to_string().contains("infra/db"), "{error}");
        assert_eq!(gate_in(&b, true, &apps), Ok(Gate::Open));
    }
}
