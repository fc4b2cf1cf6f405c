//! Which kind of notification a Kubernetes Event of an Application is: one
//! table from the Event's reason (and, for a failed reconcile, whether it
//! stalled) to an [`EventKind`], so the Alerts' `eventKinds` mean the same
//! whatever part of the reconcile wrote the Event. Events of no kind here
//! (`Pruned`, `DriftDetected`, `SyncStarted`, `HookSucceeded`, waits) are
//! not notified.

use crate::api::{EventKind, Severity};

/// What the Events room knows of one Event when it hands it over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Emitted<'a> {
    pub reason: &'a str,
    /// The Event's action (`Sync`, `Reconcile`, `Hook`, `Apply`).
    pub action: &'a str,
    pub warning: bool,
    /// A failed reconcile that waits for a change (its Stalled condition).
    pub stalled: bool,
}

/// The kind of notification `event` is, if any.
pub fn kind_of(event: Emitted<'_>) -> Option<EventKind> {
    let kind = match (event.reason, event.action, event.warning) {
        ("Synced", _, false) => EventKind::Synced,
        ("DriftCorrected", _, false) => EventKind::DriftCorrected,
        ("HealthDegraded", _, _) => EventKind::HealthDegraded,
        ("HealthRecovered", _, _) => EventKind::HealthRecovered,
        ("PreviewPosted", _, _) => EventKind::PreviewPosted,
        ("HookFailed", _, true) => EventKind::HookFailed,
        ("Stalled", _, true) => EventKind::Stalled,
        // A wave or hook run that failed (`ordered_sync::fail`).
        (_, "Sync", true) => EventKind::SyncFailed,
        // A reconcile that failed: stalled until something changes, or
        // retried with backoff.
        (_, "Reconcile", true) if event.stalled => EventKind::Stalled,
        (_, "Reconcile", true) => EventKind::SyncFailed,
        _ => return None,
    };
    Some(kind)
}

/// Flux's severity of a kind: the failures are `error`.
pub fn severity_of(kind: EventKind) -> Severity {
    match kind {
        EventKind::SyncFailed
        | EventKind::HealthDegraded
        | EventKind::Stalled
        | EventKind::HookFailed => Severity::Error,
        EventKind::Synced
        | EventKind::DriftCorrected
        | EventKind::HealthRecovered
        | EventKind::PreviewPosted => Severity::Info,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normal(reason: &'static str, action: &'static str) -> Emitted<'static> {
        Emitted {
            reason,
            action,
            warning: false,
            stalled: false,
        }
    }

    fn warning(reason: &'static str, action: &'static str, stalled: bool) -> Emitted<'static> {
        Emitted {
            warning: true,
            stalled,
            ..normal(reason, action)
        }
    }

    #[test]
    fn each_reason_the_reconcile_writes_has_its_kind() {
        assert_eq!(kind_of(normal("Synced", "Sync")), Some(EventKind::Synced));
        assert_eq!(
            kind_of(normal("DriftCorrected", "Apply")),
            Some(EventKind::DriftCorrected)
        );
        assert_eq!(
            kind_of(warning("HookFailed", "Hook", false)),
            Some(EventKind::HookFailed)
        );
        assert_eq!(
            kind_of(warning("WaveTimeout", "Sync", false)),
            Some(EventKind::SyncFailed)
        );
        assert_eq!(
            kind_of(warning("FetchFailed", "Reconcile", false)),
            Some(EventKind::SyncFailed)
        );
        assert_eq!(
            kind_of(warning("InvalidManifest", "Reconcile", true)),
            Some(EventKind::Stalled)
        );
        assert_eq!(
            kind_of(warning("HealthDegraded", "Health", false)),
            Some(EventKind::HealthDegraded)
        );
        assert_eq!(
            kind_of(normal("HealthRecovered", "Health")),
            Some(EventKind::HealthRecovered)
        );
        assert_eq!(
            kind_of(normal("PreviewPosted", "Preview")),
            Some(EventKind::PreviewPosted)
        );
    }

    #[test]
    fn the_rest_is_not_notified() {
        for event in [
            normal("Pruned", "Prune"),
            normal("SyncStarted", "Sync"),
            normal("HookSucceeded", "Hook"),
            normal("DependencyNotReady", "Reconcile"),
            warning("DriftDetected", "Compare", false),
        ] {
            assert_eq!(kind_of(event), None, "{event:?}");
        }
    }

    #[test]
    fn failures_are_errors() {
        assert_eq!(severity_of(EventKind::Stalled), Severity::Error);
        assert_eq!(severity_of(EventKind::HookFailed), Severity::Error);
        assert_eq!(severity_of(EventKind::Synced), Severity::Info);
        assert_eq!(severity_of(EventKind::HealthRecovered), Severity::Info);
    }
}
