//! Status: what one reconcile found and did → the Application's status.
//! Pure; the caller writes it through the status subresource only when it
//! differs from what is there, so an in-sync reconcile writes nothing.

use crate::api::{
    ApplicationStatus, Condition, ConditionStatus, ConditionType, Health, HealthStatus, HoldStatus,
    OperationSummary, PinnedStatus, ResourceStatus, Sync, SyncRun, SyncStatus, set_condition,
};
use crate::reconcile::health::worst;
use crate::source::render::inputs::Inputs;

/// How the reconcile ended, for the conditions.
#[derive(Clone, Debug, PartialEq)]
pub enum Ending {
    /// Everything chosen was applied; `out_of_sync` objects were left alone.
    Done {
        out_of_sync: usize,
        note: Option<String>,
    },
    /// Bad input: waits for a change in Git or in the Application.
    Stalled { reason: String, message: String },
    /// A passing fault: retried with backoff.
    Retrying { reason: String, message: String },
    /// Not synced as far as it could be, on purpose: a sync wave or hook
    /// holds it (Progressing), or a dependency is not ready (the last
    /// comparison and its sync status stay as they are).
    Waiting { reason: String, message: String },
}

#[derive(Clone)]
pub struct Report<'a> {
    pub previous: Option<&'a ApplicationStatus>,
    pub generation: Option<i64>,
    /// None when the source could not be read.
    pub revision: Option<String>,
    /// None when the comparison could not be made (keep the last one).
    pub resources: Option<Vec<ResourceStatus>>,
    pub ending: Ending,
    /// Set when this reconcile changed the cluster.
    pub operation: Option<OperationSummary>,
    pub now: String,
    /// The repository paths the render read; None when it did not get that
    /// far (keep the last ones).
    pub inputs: Option<Inputs>,
    /// The ordered sync (waves and hooks) to record; None keeps the last.
    pub sync_run: Option<SyncRun>,
    /// What held this reconcile back on purpose (`status.hold`).
    pub hold: Option<HoldStatus>,
    /// The pin it followed (`status.pinned`).
    pub pinned: Option<PinnedStatus>,
}

pub fn build(report: Report<'_>) -> ApplicationStatus {
    let previous = report.previous.cloned().unwrap_or_default();
    let mut status = ApplicationStatus {
        observed_generation: report.generation,
        conditions: previous.conditions.clone(),
        last_applied_revision: previous.last_applied_revision.clone(),
        operation: report.operation.clone().or(previous.operation.clone()),
        history: previous.history.clone(),
        sync_run: report.sync_run.clone().or(previous.sync_run.clone()),
        hold: report.hold.clone(),
        pinned: report.pinned.clone(),
        source_inputs: report
            .inputs
            .as_ref()
            .map_or(previous.source_inputs.clone(), |i| i.paths.clone()),
        ..Default::default()
    };
    if let Some(inputs) = &report.inputs {
        if inputs.capped {
            set_condition(
                &mut status.conditions,
                Condition {
                    type_: ConditionType::InputsCapped,
                    status: ConditionStatus::True,
                    reason: "TooManyInputs".into(),
                    message: format!(
                        "the render reads more than {} paths: every push to the repository reconciles this Application",
                        crate::source::render::inputs::MAX_INPUTS
                    ),
                    last_transition_time: report.now.clone(),
                    observed_generation: report.generation,
                },
            );
        } else {
            status
                .conditions
                .retain(|c| c.type_ != ConditionType::InputsCapped);
        }
    }
    if let Some(operation) = &report.operation {
        let mut operation = operation.clone();
        operation.id = previous.history.first().map_or(1, |h| h.id + 1);
        status.history.insert(0, operation);
        status.history.truncate(crate::api::HISTORY_LIMIT);
    }
    let compared = report.resources.is_some();
    status.resources = report.resources.unwrap_or(previous.resources.clone());
    // An Application whose objects no sync has looked at yet (never fetched,
    // or failing from the start) has no health to speak of: Unknown, not the
    // Healthy of an empty list.
    let assessed =
        compared || !status.resources.is_empty() || status.last_applied_revision.is_some();
    let health = if assessed {
        worst(status.resources.iter().map(|r| r.health))
    } else {
        Health::Unknown
    };
    let unhealthy: Vec<String> = status
        .resources
        .iter()
        .filter(|r| r.health == health && health != Health::Healthy)
        .map(|r| {
            let what = format!("{} {}", r.kind, r.name);
            match &r.message {
                Some(m) => format!("{what}: {m}"),
                None => what,
            }
        })
        .take(3)
        .collect();
    status.health = HealthStatus {
        status: health,
        message: (!unhealthy.is_empty()).then(|| unhealthy.join("; ")),
    };

    let sync = match (&report.ending, compared) {
        (Ending::Waiting { .. }, false) => previous.sync.status,
        (_, false) => Sync::Unknown,
        (Ending::Done { out_of_sync: 0, .. }, true) => Sync::Synced,
        _ => Sync::OutOfSync,
    };
    status.sync = SyncStatus {
        status: sync,
        revision: report.revision.clone(),
    };
    if matches!(report.ending, Ending::Done { .. })
        && report.revision.is_some()
        && (report.operation.is_some() || sync == Sync::Synced)
    {
        status.last_applied_revision = report.revision.clone();
    }
    // The newest history entry of this revision was Synced and Healthy
    // after it: a revision `setpoint app rollback` may go back to.
    if sync == Sync::Synced
        && health == Health::Healthy
        && matches!(report.ending, Ending::Done { out_of_sync: 0, .. })
        && let Some(entry) = status
            .history
            .iter_mut()
            .find(|h| Some(&h.revision) == report.revision.as_ref())
    {
        entry.healthy = true;
    }

    let rev = short(report.revision.as_deref());
    let (ready, reconciling, stalled) = match &report.ending {
        // Held on purpose (suspended, a sync window): not ready, nothing
        // to wait for; says what it would change.
        Ending::Done { out_of_sync, .. } if report.hold.is_some() => {
            let hold = report.hold.as_ref().expect("matched");
            let message = if *out_of_sync == 0 {
                hold.message.clone()
            } else {
                format!(
                    "{}; {out_of_sync} object(s) differ from revision {rev} and were left alone",
                    hold.message
                )
            };
            (
                cond(false, &hold.reason, message),
                cond(false, &hold.reason, String::new()),
                cond(false, &hold.reason, String::new()),
            )
        }
        Ending::Done { out_of_sync: 0, .. } => match health {
            Health::Healthy => (
                cond(
                    true,
                    "Synced",
                    format!("applied revision {rev}; all objects healthy"),
                ),
                cond(false, "Synced", String::new()),
                cond(false, "Synced", String::new()),
            ),
            // Paused on purpose: not ready, but nothing to wait for either.
            Health::Suspended => (
                cond(
                    false,
                    "Suspended",
                    status.health.message.clone().unwrap_or_default(),
                ),
                cond(false, "Suspended", String::new()),
                cond(false, "Suspended", String::new()),
            ),
            Health::Degraded | Health::Missing => (
                cond(
                    false,
                    "Degraded",
                    status.health.message.clone().unwrap_or_default(),
                ),
                cond(false, "Degraded", String::new()),
                cond(false, "Degraded", String::new()),
            ),
            _ => (
                cond(
                    false,
                    "Progressing",
                    status.health.message.clone().unwrap_or_default(),
                ),
                cond(
                    true,
                    "Progressing",
                    status.health.message.clone().unwrap_or_default(),
                ),
                cond(false, "Progressing", String::new()),
            ),
        },
        Ending::Done { out_of_sync, note } => {
            let message = note.clone().unwrap_or_else(|| {
                format!("{out_of_sync} object(s) differ from revision {rev} and were left alone")
            });
            (
                cond(false, "OutOfSync", message),
                cond(false, "OutOfSync", String::new()),
                cond(false, "OutOfSync", String::new()),
            )
        }
        Ending::Stalled { reason, message } => (
            cond(false, reason, message.clone()),
            cond(false, reason, String::new()),
            cond(true, reason, message.clone()),
        ),
        Ending::Retrying { reason, message } => (
            cond(false, reason, message.clone()),
            cond(true, reason, message.clone()),
            cond(false, reason, String::new()),
        ),
        Ending::Waiting { reason, message } => (
            cond(false, reason, message.clone()),
            cond(true, reason, message.clone()),
            cond(false, reason, String::new()),
        ),
    };
    for (type_, (is_true, reason, message)) in [
        (ConditionType::Ready, ready),
        (ConditionType::Reconciling, reconciling),
        (ConditionType::Stalled, stalled),
    ] {
        set_condition(
            &mut status.conditions,
            Condition {
                type_,
                status: if is_true {
                    ConditionStatus::True
                } else {
                    ConditionStatus::False
                },
                reason,
                message,
                last_transition_time: report.now.clone(),
                observed_generation: report.generation,
            },
        );
    }
    status
}

fn cond(is_true: bool, reason: &str, message: String) -> (bool, String, String) {
    (is_true, reason.to_string(), message)
}

/// The first 12 characters of a commit id, as in a log line.
pub fn short(revision: Option<&str>) -> String {
    revision
        .map(|r| r.chars().take(12).collect())
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(name: &str, health: Health) -> ResourceStatus {
        ResourceStatus {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: Some("ns".into()),
            name: name.into(),
            sync: Sync::Synced,
            health,
            message: None,
        }
    }

    fn report(
        previous: Option<&ApplicationStatus>,
        ending: Ending,
        now: &str,
    ) -> ApplicationStatus {
        build(Report {
            previous,
            generation: Some(1),
            revision: Some("0123456789abcdef".into()),
            resources: Some(vec![
                resource("a", Health::Healthy),
                resource("b", Health::Healthy),
            ]),
            ending,
            operation: None,
            inputs: None,
            sync_run: None,
            hold: None,
            pinned: None,
            now: now.into(),
        })
    }

    #[test]
    fn source_inputs_are_recorded_kept_and_a_cap_is_a_condition() {
        let done = Ending::Done {
            out_of_sync: 0,
            note: None,
        };
        let with = |previous: Option<&ApplicationStatus>, inputs: Option<Inputs>| {
            build(Report {
                previous,
                generation: Some(1),
                revision: Some("0123456789abcdef".into()),
                resources: Some(vec![]),
                ending: done.clone(),
                operation: None,
                inputs,
                sync_run: None,
                hold: None,
                pinned: None,
                now: "t".into(),
            })
        };
        let recorded = with(
            None,
            Some(Inputs {
                paths: vec!["bases/web".into(), "envs/prod".into()],
                capped: false,
            }),
        );
        assert_eq!(recorded.source_inputs, ["bases/web", "envs/prod"]);
        // A reconcile that did not render keeps the last ones.
        let kept = with(Some(&recorded), None);
        assert_eq!(kept.source_inputs, recorded.source_inputs);
        let capped = with(
            Some(&recorded),
            Some(Inputs {
                paths: vec![String::new()],
                capped: true,
            }),
        );
        assert_eq!(capped.source_inputs, [""]);
        let condition = capped
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::InputsCapped)
            .expect("InputsCapped");
        assert_eq!(condition.status, ConditionStatus::True);
        assert_eq!(condition.reason, "TooManyInputs");
        // Gone once the render reads fewer again.
        let again = with(Some(&capped), Some(Inputs::directory("apps/a")));
        assert_eq!(again.source_inputs, ["apps/a"]);
        assert!(
            again
                .conditions
                .iter()
                .all(|c| c.type_ != ConditionType::InputsCapped)
        );
    }

    fn ready(status: &ApplicationStatus) -> &Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Ready)
            .unwrap()
    }

    #[test]
    fn an_unchanged_reconcile_builds_an_equal_status() {
        let done = Ending::Done {
            out_of_sync: 0,
            note: None,
        };
        let first = report(None, done.clone(), "t1");
        assert_eq!(first.sync.status, Sync::Synced);
        assert_eq!(first.health.status, Health::Healthy);
        assert_eq!(ready(&first).status, ConditionStatus::True);
        assert_eq!(
            first.last_applied_revision.as_deref(),
            Some("0123456789abcdef")
        );
        let second = report(Some(&first), done, "t2");
        assert_eq!(first, second, "nothing changed, so nothing to write");
    }

    #[test]
    fn history_keeps_the_last_ten_operations_newest_first() {
        let mut status = ApplicationStatus::default();
        for i in 0..12 {
            let operation = OperationSummary {
                revision: format!("r{i}"),
                applied: 1,
                pruned: 0,
                unchanged: 0,
                duration_ms: 5,
                finished_at: format!("t{i}"),
                ..Default::default()
            };
            status = build(Report {
                previous: Some(&status),
                generation: Some(1),
                revision: Some(format!("r{i}")),
                resources: Some(vec![]),
                ending: Ending::Done {
                    out_of_sync: 0,
                    note: None,
                },
                operation: Some(operation),
                inputs: None,
                sync_run: None,
                hold: None,
                pinned: None,
                now: format!("t{i}"),
            });
        }
        let revisions: Vec<&str> = status.history.iter().map(|o| o.revision.as_str()).collect();
        assert_eq!(
            revisions,
            ["r11", "r10", "r9", "r8", "r7", "r6", "r5", "r4", "r3", "r2"]
        );
        // A reconcile that changed nothing adds nothing.
        let unchanged = build(Report {
            previous: Some(&status),
            generation: Some(1),
            revision: Some("r11".into()),
            resources: Some(vec![]),
            ending: Ending::Done {
                out_of_sync: 0,
                note: None,
            },
            operation: None,
            inputs: None,
            sync_run: None,
            hold: None,
            pinned: None,
            now: "t12".into(),
        });
        assert_eq!(unchanged.history, status.history);
    }

    #[test]
    fn stalled_keeps_the_last_applied_revision_and_says_why() {
        let done = report(
            None,
            Ending::Done {
                out_of_sync: 0,
                note: None,
            },
            "t1",
        );
        let stalled = build(Report {
            previous: Some(&done),
            generation: Some(2),
            revision: Some("fedcba".into()),
            resources: None,
            ending: Ending::Stalled {
                reason: "InvalidManifest".into(),
                message: "a.yaml: document 0, line 3: bad".into(),
            },
            operation: None,
            inputs: None,
            sync_run: None,
            hold: None,
            pinned: None,
            now: "t2".into(),
        });
        assert_eq!(stalled.sync.status, Sync::Unknown);
        assert_eq!(
            stalled.last_applied_revision.as_deref(),
            Some("0123456789abcdef")
        );
        assert_eq!(ready(&stalled).reason, "InvalidManifest");
        assert_eq!(ready(&stalled).last_transition_time, "t2");
        let s = stalled
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Stalled)
            .unwrap();
        assert_eq!(s.status, ConditionStatus::True);
        assert!(s.message.contains("line 3"));
    }

    #[test]
    fn health_is_unknown_until_a_sync_has_assessed_the_objects() {
        let failing = |previous: Option<&ApplicationStatus>, ending: Ending| {
            build(Report {
                previous,
                generation: Some(1),
                revision: None,
                resources: None,
                ending,
                operation: None,
                inputs: None,
                sync_run: None,
                hold: None,
                pinned: None,
                now: "t1".into(),
            })
        };
        let fetch_failed = Ending::Retrying {
            reason: "FetchFailed".into(),
            message: "failed to fetch https://git.example/repo".into(),
        };
        // Failing from the very first fetch, retried or stalled, or suspended.
        for ending in [
            fetch_failed.clone(),
            Ending::Stalled {
                reason: "RevisionNotFound".into(),
                message: "no such branch".into(),
            },
        ] {
            let status = failing(None, ending.clone());
            assert_eq!(status.health.status, Health::Unknown, "{ending:?}");
            assert_eq!(status.health.message, None);
            // And still Unknown on the next failure.
            let again = failing(Some(&status), ending);
            assert_eq!(again.health.status, Health::Unknown);
        }
        // Once a sync has assessed the objects, a failure keeps that health.
        let done = report(
            None,
            Ending::Done {
                out_of_sync: 0,
                note: None,
            },
            "t0",
        );
        assert_eq!(
            failing(Some(&done), fetch_failed.clone()).health.status,
            Health::Healthy
        );
        // A sync that found nothing to apply did assess: Healthy, as Argo CD.
        let empty = build(Report {
            previous: None,
            generation: Some(1),
            revision: Some("r".into()),
            resources: Some(vec![]),
            ending: Ending::Done {
                out_of_sync: 0,
                note: None,
            },
            operation: None,
            inputs: None,
            sync_run: None,
            hold: None,
            pinned: None,
            now: "t0".into(),
        });
        assert_eq!(empty.health.status, Health::Healthy);
        assert_eq!(
            failing(Some(&empty), fetch_failed).health.status,
            Health::Healthy
        );
    }

    #[test]
    fn health_is_the_worst_resource_health() {
        let status = build(Report {
            previous: None,
            generation: None,
            revision: Some("r".into()),
            resources: Some(vec![
                resource("a", Health::Healthy),
                ResourceStatus {
                    message: Some("2 of 5 available".into()),
                    ..resource("b", Health::Progressing)
                },
            ]),
            ending: Ending::Done {
                out_of_sync: 0,
                note: None,
            },
            operation: None,
            inputs: None,
            sync_run: None,
            hold: None,
            pinned: None,
            now: "t".into(),
        });
        assert_eq!(status.health.status, Health::Progressing);
        assert_eq!(
            status.health.message.as_deref(),
            Some("Deployment b: 2 of 5 available")
        );
        let reconciling = status
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Reconciling)
            .unwrap();
        assert_eq!(reconciling.status, ConditionStatus::True);
    }

    #[test]
    fn waiting_keeps_the_sync_status_and_says_why_in_ready() {
        let done = report(
            None,
            Ending::Done {
                out_of_sync: 0,
                note: None,
            },
            "t1",
        );
        let waiting = build(Report {
            previous: Some(&done),
            generation: Some(2),
            revision: done.sync.revision.clone(),
            resources: None,
            ending: Ending::Waiting {
                reason: "DependencyNotReady".into(),
                message: "waiting for dependencies: ns/a (Synced, Progressing)".into(),
            },
            operation: None,
            inputs: None,
            sync_run: None,
            hold: None,
            pinned: None,
            now: "t2".into(),
        });
        assert_eq!(waiting.sync, done.sync);
        assert_eq!(waiting.resources, done.resources);
        let ready = ready(&waiting);
        assert_eq!(ready.status, ConditionStatus::False);
        assert_eq!(ready.reason, "DependencyNotReady");
        assert!(ready.message.contains("ns/a"));
        // A first reconcile that waits has nothing compared yet: Unknown.
        let first = build(Report {
            previous: None,
            generation: Some(1),
            revision: None,
            resources: None,
            ending: Ending::Waiting {
                reason: "DependencyNotReady".into(),
                message: "m".into(),
            },
            operation: None,
            inputs: None,
            sync_run: None,
            hold: None,
            pinned: None,
            now: "t".into(),
        });
        assert_eq!(first.sync.status, Sync::Unknown);
    }
}
