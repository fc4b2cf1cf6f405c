//! An ApplicationSet's status, built from what its evaluation found (pure):
//! its Applications with their sync and health, a summary, and the
//! conditions: `Ready` (every Application as the template says, or why
//! not), `Stalled` (nothing will change until the set or its sources do).

use crate::api::{
    Application, ApplicationSetStatus, Condition, ConditionStatus, ConditionType,
    GeneratedApplication, Health, SetSummary, Sync, set_condition,
};

/// How an evaluation ended, as the conditions say it.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Every Application is as the template says.
    UpToDate { message: String },
    /// Applied what could be, but something was refused (a deletion over
    /// the guard's share, a name another owns): Ready=False.
    Partly { reason: String, message: String },
    /// Nothing was changed: the generators or the template are wrong, and
    /// only a change to the set or its sources helps (Stalled).
    Invalid { reason: String, message: String },
    /// Nothing was changed: a source could not be read; retried.
    Failed { reason: String, message: String },
}

/// The status after an evaluation (`verdict` None: only the summary is
/// refreshed, the conditions kept). `owned` are the set's Applications as
/// read after the writes (those just created without a status yet).
pub fn build(
    previous: Option<&ApplicationSetStatus>,
    generation: Option<i64>,
    verdict: Option<&Verdict>,
    owned: &[&Application],
    now: &str,
) -> ApplicationSetStatus {
    let mut status = previous.cloned().unwrap_or_default();
    let mut applications: Vec<GeneratedApplication> = owned
        .iter()
        .map(|app| {
            let state = app.status.as_ref();
            GeneratedApplication {
                name: app.metadata.name.clone().unwrap_or_default(),
                sync: state.map_or(Sync::Unknown, |s| s.sync.status),
                health: state.map_or(Health::Unknown, |s| s.health.status),
                revision: state.and_then(|s| s.sync.revision.clone()),
            }
        })
        .collect();
    applications.sort_by(|a, b| a.name.cmp(&b.name));
    status.summary = SetSummary {
        applications: applications.len() as u32,
        synced: applications
            .iter()
            .filter(|a| a.sync == Sync::Synced)
            .count() as u32,
        healthy: applications
            .iter()
            .filter(|a| a.health == Health::Healthy)
            .count() as u32,
    };
    status.applications = applications;
    let Some(verdict) = verdict else {
        return status;
    };
    status.observed_generation = generation;
    let condition = |type_, status, reason: &str, message: &str| Condition {
        type_,
        status,
        reason: reason.into(),
        message: message.into(),
        last_transition_time: now.into(),
        observed_generation: generation,
    };
    let (ready, stalled) = match verdict {
        Verdict::UpToDate { message } => (
            condition(
                ConditionType::Ready,
                ConditionStatus::True,
                "ApplicationsUpToDate",
                message,
            ),
            None,
        ),
        Verdict::Partly { reason, message } | Verdict::Failed { reason, message } => (
            condition(
                ConditionType::Ready,
                ConditionStatus::False,
                reason,
                message,
            ),
            None,
        ),
        Verdict::Invalid { reason, message } => (
            condition(
                ConditionType::Ready,
                ConditionStatus::False,
                reason,
                message,
            ),
            Some(condition(
                ConditionType::Stalled,
                ConditionStatus::True,
                reason,
                message,
            )),
        ),
    };
    set_condition(&mut status.conditions, ready);
    match stalled {
        Some(stalled) => set_condition(&mut status.conditions, stalled),
        None => status
            .conditions
            .retain(|c| c.type_ != ConditionType::Stalled),
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApplicationStatus, HealthStatus, SyncStatus};

    fn app(name: &str, sync: Sync, health: Health) -> Application {
        let mut app = Application::new(name, Default::default());
        app.status = Some(ApplicationStatus {
            sync: SyncStatus {
                status: sync,
                revision: Some("abc".into()),
            },
            health: HealthStatus {
                status: health,
                message: None,
            },
            ..Default::default()
        });
        app
    }

    #[test]
    fn the_summary_counts_synced_and_healthy() {
        let a = app("a", Sync::Synced, Health::Healthy);
        let b = app("b", Sync::OutOfSync, Health::Progressing);
        let fresh = Application::new("c", Default::default());
        let verdict = Verdict::UpToDate {
            message: "3 Applications".into(),
        };
        let status = build(None, Some(2), Some(&verdict), &[&b, &a, &fresh], "t1");
        assert_eq!(
            status.summary,
            SetSummary {
                applications: 3,
                synced: 1,
                healthy: 1
            }
        );
        let names: Vec<&str> = status
            .applications
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(status.applications[2].sync, Sync::Unknown);
        assert_eq!(status.conditions[0].reason, "ApplicationsUpToDate");
        assert_eq!(status.observed_generation, Some(2));
    }

    #[test]
    fn invalid_stalls_and_a_fix_clears_it() {
        let invalid = Verdict::Invalid {
            reason: "UnknownParameter".into(),
            message: "unknown parameter \"nmae\"".into(),
        };
        let status = build(None, Some(1), Some(&invalid), &[], "t1");
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.type_ == ConditionType::Stalled && c.status == ConditionStatus::True)
        );
        // A refresh keeps the conditions.
        let refreshed = build(Some(&status), Some(1), None, &[], "t2");
        assert_eq!(refreshed.conditions, status.conditions);
        let fixed = build(
            Some(&status),
            Some(2),
            Some(&Verdict::UpToDate {
                message: "0 Applications".into(),
            }),
            &[],
            "t3",
        );
        assert_eq!(fixed.conditions.len(), 1);
        assert_eq!(fixed.conditions[0].status, ConditionStatus::True);
        assert_eq!(fixed.conditions[0].last_transition_time, "t3");
    }
}
