//! Which syncs get a commit status on GitHub, and what it says. Pure; the
//! reconcile posts what these decide through [`CommitStatuses`].
//!
//! Like Flux's notification-controller, a status tells the commit's author
//! what became of their revision: `pending` when the sync of a new revision
//! starts, then `success` when it was applied, `failure` when the revision
//! itself is at fault (broken YAML, an unknown kind, an object the API
//! server rejects) and `error` when something else failed and the sync is
//! being retried. A revision already applied gets no new status on every
//! sweep or drift correction, and neither does an Application that syncs
//! only on request, until someone asks for that sync.

use crate::api::{Application, Sync};
use crate::report::github::{CommitStatuses, State};

/// What the reconcile knows when it decides.
#[derive(Clone, Copy, Debug)]
pub struct Sight<'a> {
    /// The commit the source resolved to.
    pub revision: &'a str,
    /// A commit a webhook announced for this reconcile.
    pub announced: Option<&'a str>,
    /// A sync someone asked for.
    pub manual: bool,
}

/// Whether this reconcile's sync of `sight.revision` gets statuses: a
/// revision not applied yet, that this reconcile will sync (automated, or
/// asked for), and that is news: a webhook or a person named it, or no
/// earlier reconcile saw it (a sweep after a missed webhook). A revision
/// whose sync failed is not posted again by each retry of a sweep.
pub fn announces(app: &Application, sight: Sight<'_>) -> bool {
    let status = app.status.as_ref();
    let applied = status.and_then(|s| s.last_applied_revision.as_deref());
    if applied == Some(sight.revision) {
        return false;
    }
    if app.spec.sync_policy.automated.is_none() && !sight.manual {
        return false;
    }
    let seen = status.and_then(|s| s.sync.revision.as_deref()) == Some(sight.revision);
    // An ordered sync of it (waves, hooks) that is still running: its
    // resumed reconciles carry on with the status its start posted.
    let running = status
        .and_then(|s| s.sync_run.as_ref())
        .is_some_and(|run| run.revision == sight.revision && !run.phase.is_finished());
    sight.manual || sight.announced == Some(sight.revision) || !seen || running
}

/// The status that ends a sync, from how it ended: `Ok` with its sync
/// status, applied and pruned counts, or `Err` with whether it is retried,
/// its reason and its message.
pub fn ending(result: Result<Done, Failed<'_>>) -> (State, String) {
    match result {
        Ok(Done {
            held: Some(Held::Failed { reason }),
            message,
            ..
        }) => (State::Failure, format!("{reason}: {message}")),
        Ok(Done {
            held: Some(Held::Waiting),
            message,
            ..
        }) => (State::Pending, format!("Waiting: {message}")),
        Ok(done) => {
            let counts = format!("{} applied, {} pruned", done.applied, done.pruned);
            match done.sync {
                Sync::Synced => (State::Success, format!("Synced: {counts}")),
                _ => (
                    State::Success,
                    format!("Applied, still OutOfSync ({counts}): {}", done.message),
                ),
            }
        }
        Err(failed) if failed.transient => (
            State::Error,
            format!("{} (retrying): {}", failed.reason, failed.message),
        ),
        Err(failed) => (
            State::Failure,
            format!("{}: {}", failed.reason, failed.message),
        ),
    }
}

/// A sync that finished.
#[derive(Clone, Copy, Debug)]
pub struct Done<'a> {
    pub sync: Sync,
    pub applied: usize,
    pub pruned: usize,
    /// What the Ready condition says, for a sync still OutOfSync, waiting
    /// or failed.
    pub message: &'a str,
    /// An ordered sync (waves, hooks) that did not finish: it waits for a
    /// wave or a hook, or it failed (a hook failed, a wave timed out).
    pub held: Option<Held<'a>>,
}

/// Why an ordered sync ended its reconcile before it finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held<'a> {
    /// Waits for a wave to be Healthy or a hook to complete; the next
    /// reconcile resumes it (the status stays `pending`).
    Waiting,
    /// Stalled: the revision's sync failed, with this reason.
    Failed { reason: &'a str },
}

/// A sync that failed.
#[derive(Clone, Copy, Debug)]
pub struct Failed<'a> {
    pub transient: bool,
    pub reason: &'a str,
    pub message: &'a str,
}

/// Posts `state` for `app` at `revision` in the background; never fails the
/// sync. A repository that is not on the configured GitHub gets nothing.
pub fn post(
    statuses: &CommitStatuses,
    app: &Application,
    revision: &str,
    state: State,
    description: &str,
) {
    match statuses.status_for(app, revision, state, description) {
        Ok(status) => statuses.spawn_post(status),
        Err(error) => tracing::debug!(%error, "no commit status"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApplicationSpec, ApplicationStatus, Automated, SyncPolicy, SyncStatus};

    const OLD: &str = "1111111111111111111111111111111111111111";
    const NEW: &str = "2222222222222222222222222222222222222222";

    fn app(automated: bool, applied: Option<&str>, seen: Option<&str>) -> Application {
        let mut app = Application::new(
            "web",
            ApplicationSpec {
                sync_policy: SyncPolicy {
                    automated: automated.then(Automated::default),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        app.status = Some(ApplicationStatus {
            last_applied_revision: applied.map(str::to_owned),
            sync: SyncStatus {
                revision: seen.map(str::to_owned),
                ..Default::default()
            },
            ..Default::default()
        });
        app
    }

    fn sight(announced: Option<&'static str>, manual: bool) -> Sight<'static> {
        Sight {
            revision: NEW,
            announced,
            manual,
        }
    }

    #[test]
    fn a_new_revision_is_announced_once() {
        // A push names it.
        assert!(announces(
            &app(true, Some(OLD), Some(OLD)),
            sight(Some(NEW), false)
        ));
        // A sweep finds it first (the webhook was missed).
        assert!(announces(
            &app(true, Some(OLD), Some(OLD)),
            sight(None, false)
        ));
        // The sweep after a failed sync of it: already told.
        assert!(!announces(
            &app(true, Some(OLD), Some(NEW)),
            sight(None, false)
        ));
        // A push of it again, or a manual sync, tells again.
        assert!(announces(
            &app(true, Some(OLD), Some(NEW)),
            sight(Some(NEW), false)
        ));
        assert!(announces(
            &app(true, Some(OLD), Some(NEW)),
            sight(None, true)
        ));
        // The very first sync.
        assert!(announces(&app(true, None, None), sight(None, false)));
    }

    #[test]
    fn an_applied_revision_or_a_sync_nobody_asked_for_is_not() {
        // Drift corrections and sweeps of the applied revision.
        assert!(!announces(
            &app(true, Some(NEW), Some(NEW)),
            sight(None, false)
        ));
        assert!(!announces(
            &app(true, Some(NEW), Some(NEW)),
            sight(Some(NEW), true)
        ));
        // Manual sync policy: nothing is synced until someone asks.
        assert!(!announces(
            &app(false, Some(OLD), Some(OLD)),
            sight(Some(NEW), false)
        ));
        assert!(announces(
            &app(false, Some(OLD), Some(OLD)),
            sight(None, true)
        ));
    }

    #[test]
    fn the_ending_says_what_became_of_the_revision() {
        let done = |sync| Done {
            sync,
            applied: 2,
            pruned: 1,
            message: "1 object differs (prune is off)",
            held: None,
        };
        assert_eq!(
            ending(Ok(done(Sync::Synced))),
            (State::Success, "Synced: 2 applied, 1 pruned".into())
        );
        assert_eq!(
            ending(Ok(done(Sync::OutOfSync))),
            (
                State::Success,
                "Applied, still OutOfSync (2 applied, 1 pruned): 1 object differs (prune is off)"
                    .into()
            )
        );
        let failed = |transient| Failed {
            transient,
            reason: "InvalidManifest",
            message: "app/cm.yaml: document 1, line 3: bad indentation",
        };
        assert_eq!(
            ending(Err(failed(false))),
            (
                State::Failure,
                "InvalidManifest: app/cm.yaml: document 1, line 3: bad indentation".into()
            )
        );
        assert_eq!(ending(Err(failed(true))).0, State::Error);
    }

    #[test]
    fn an_ordered_sync_is_pending_while_it_waits_and_fails_with_its_hook() {
        let held = |held| Done {
            sync: Sync::OutOfSync,
            applied: 1,
            pruned: 0,
            message: "wave 5 waits for Deployment web",
            held: Some(held),
        };
        assert_eq!(
            ending(Ok(held(Held::Waiting))),
            (
                State::Pending,
                "Waiting: wave 5 waits for Deployment web".into()
            )
        );
        assert_eq!(
            ending(Ok(held(Held::Failed {
                reason: "HookFailed"
            }))),
            (
                State::Failure,
                "HookFailed: wave 5 waits for Deployment web".into()
            )
        );
    }

    #[test]
    fn a_running_ordered_sync_keeps_announcing_its_revision() {
        use crate::api::{RunPhase, SyncRun};
        let mut waiting = app(true, Some(OLD), Some(NEW));
        assert!(!announces(&waiting, sight(None, false)));
        let run = |phase| SyncRun {
            revision: NEW.into(),
            phase,
            ..SyncRun::default()
        };
        waiting.status.as_mut().unwrap().sync_run = Some(run(RunPhase::Sync));
        assert!(announces(&waiting, sight(None, false)));
        waiting.status.as_mut().unwrap().sync_run = Some(run(RunPhase::Failed));
        assert!(!announces(&waiting, sight(None, false)));
    }
}
