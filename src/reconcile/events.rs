//! What a reconcile tells about itself besides its status: Kubernetes
//! Events (synced, drift corrected, pruned, drift detected, health
//! degraded or recovered) and the drift metrics.

use crate::api::{ApplicationStatus, Health, Sync};
use crate::context::Context;
use crate::manifest::ObjectId;
use crate::report::events::Events;

use super::apply;
use super::plan::{Action, Cause, Plan};
use super::status::short;

/// Drift set back, by kind and cluster, for the metrics.
pub(super) fn count_drift_corrections(
    ctx: &Context,
    cluster: &str,
    plan: &Plan,
    applied: &[apply::Applied],
) {
    for step in &plan.steps {
        let corrected = matches!(
            step.action,
            Action::Update {
                cause: Cause::Drift,
                ..
            } | Action::Create { deleted_live: true }
        );
        if corrected && applied.iter().any(|a| a.id == step.id) {
            ctx.metrics
                .drift_corrections
                .get_or_create(&crate::metrics::KindLabels {
                    group: step.id.group.clone(),
                    kind: step.id.kind.clone(),
                    cluster: cluster.to_owned(),
                })
                .inc();
        }
    }
}

/// What the `Synced` Event says: the revision, and the changed file that
/// routed the push, when one did.
pub(super) struct Synced<'a> {
    pub revision: &'a str,
    pub changed_input: Option<&'a str>,
    /// The destination, when it is not the local cluster.
    pub cluster: Option<&'a str>,
    /// `rollback by alice`, `sync of ConfigMap/b by alice`.
    pub initiated_by: Option<&'a str>,
}

/// DriftCorrected, Pruned and Synced: what this reconcile changed.
pub(super) async fn report_applied(
    events: &Events,
    plan: &Plan,
    applied: &[apply::Applied],
    pruned: &[ObjectId],
    synced: Synced<'_>,
) {
    for step in &plan.steps {
        if !applied.iter().any(|a| a.id == step.id) {
            continue;
        }
        match &step.action {
            Action::Update {
                cause: Cause::Drift,
                drift,
            } => {
                let fields: Vec<String> = drift.iter().map(|d| d.to_string()).collect();
                // The same, field by field, for the notifications.
                let changes: Vec<crate::notify::Change> = drift
                    .iter()
                    .map(|d| crate::notify::Change {
                        object: step.id.to_string(),
                        field: d.path.clone(),
                        from: super::plan::shown(d.live.as_ref()),
                        to: super::plan::shown(d.desired.as_ref()),
                        by: d.manager.clone(),
                    })
                    .collect();
                events
                    .changed(
                        "DriftCorrected",
                        "Apply",
                        format!("{}: {}", step.id, fields.join(", ")),
                        &changes,
                    )
                    .await;
            }
            Action::Create { deleted_live: true } => {
                let recreated = crate::notify::Change {
                    object: step.id.to_string(),
                    ..Default::default()
                };
                events
                    .changed(
                        "DriftCorrected",
                        "Apply",
                        format!("{}: recreated (it was deleted outside Setpoint)", step.id),
                        &[recreated],
                    )
                    .await;
            }
            _ => {}
        }
    }
    if !pruned.is_empty() {
        let names: Vec<String> = pruned.iter().map(|id| id.to_string()).collect();
        events
            .normal("Pruned", "Prune", format!("pruned {}", names.join(", ")))
            .await;
    }
    if !applied.is_empty() || !pruned.is_empty() {
        let unchanged = plan
            .steps
            .iter()
            .filter(|s| matches!(s.action, Action::Unchanged))
            .count();
        events
            .normal(
                "Synced",
                "Sync",
                format!(
                    "synced to revision {}{}: applied {}, pruned {}, unchanged {}{}",
                    short(Some(synced.revision)),
                    synced
                        .cluster
                        .map(|cluster| format!(" on cluster {cluster}"))
                        .unwrap_or_default(),
                    applied.len(),
                    pruned.len(),
                    unchanged,
                    synced
                        .changed_input
                        .map(|input| format!(" (a push changed {input})"))
                        .or_else(|| synced.initiated_by.map(|by| format!(" ({by})")))
                        .unwrap_or_default()
                ),
            )
            .await;
    }
}

/// DriftDetected: an Application that was Synced and is OutOfSync now
/// (its status as written).
pub(super) async fn report_drift_detected(
    events: &Events,
    previous: Option<&ApplicationStatus>,
    status: &ApplicationStatus,
) {
    let was_synced = previous.is_some_and(|s| s.sync.status == Sync::Synced);
    if was_synced && status.sync.status == Sync::OutOfSync {
        let drifted: Vec<String> = status
            .resources
            .iter()
            .filter(|r| r.sync == Sync::OutOfSync)
            .map(|r| {
                format!(
                    "{} {}: {}",
                    r.kind,
                    r.name,
                    r.message.as_deref().unwrap_or("")
                )
            })
            .collect();
        events
            .warning("DriftDetected", "Compare", drifted.join("; "))
            .await;
    }
}

/// Suspended, SyncWindow (a hold began or changed its reason) and Resumed
/// (it ended); Pinned when the Application follows a new pin, Unpinned
/// when it follows its `targetRevision` again.
pub(super) async fn report_hold_change(
    events: &Events,
    previous: Option<&ApplicationStatus>,
    status: &ApplicationStatus,
) {
    let before = previous.and_then(|s| s.hold.as_ref());
    match (before, status.hold.as_ref()) {
        (Some(b), Some(now)) if b.reason == now.reason => {}
        (_, Some(now)) => {
            events
                .normal(&now.reason, "Sync", now.message.clone())
                .await;
        }
        (Some(b), None) => {
            events
                .normal(
                    "Resumed",
                    "Sync",
                    format!("no longer held ({}): syncs go ahead", b.reason),
                )
                .await;
        }
        (None, None) => {}
    }
    let pinned_before = previous.and_then(|s| s.pinned.as_ref());
    match (pinned_before, status.pinned.as_ref()) {
        (Some(b), Some(now)) if b.revision == now.revision => {}
        (_, Some(now)) => {
            let by = now
                .by
                .as_ref()
                .map(|b| format!(" by {b}"))
                .unwrap_or_default();
            events
                .normal(
                    "Pinned",
                    "Sync",
                    format!(
                        "pinned to revision {}{by}: new commits are not applied until resumed",
                        short(Some(&now.revision))
                    ),
                )
                .await;
        }
        (Some(b), None) => {
            events
                .normal(
                    "Unpinned",
                    "Sync",
                    format!(
                        "no longer pinned to {}: follows spec.source.targetRevision again",
                        short(Some(&b.revision))
                    ),
                )
                .await;
        }
        (None, None) => {}
    }
}

/// HealthDegraded (a Warning) when the Application turned Degraded, naming
/// the degraded objects; HealthRecovered when it is Healthy again after
/// being Degraded. Nothing on the first status.
pub(super) async fn report_health_change(
    events: &Events,
    previous: Option<&ApplicationStatus>,
    status: &ApplicationStatus,
) {
    let Some(before) = previous.map(|s| s.health.status) else {
        return;
    };
    match (before, status.health.status) {
        (Health::Degraded, Health::Degraded) => {}
        (_, Health::Degraded) => {
            let degraded: Vec<String> = status
                .resources
                .iter()
                .filter(|r| r.health == Health::Degraded)
                .map(|r| match &r.message {
                    Some(message) => format!("{} {}: {message}", r.kind, r.name),
                    None => format!("{} {}", r.kind, r.name),
                })
                .collect();
            let note = if degraded.is_empty() {
                status.health.message.clone().unwrap_or_default()
            } else {
                degraded.join("; ")
            };
            events
                .warning(
                    "HealthDegraded",
                    "Health",
                    format!("{before:?} → Degraded: {note}"),
                )
                .await;
        }
        (Health::Degraded, Health::Healthy) => {
            events
                .normal(
                    "HealthRecovered",
                    "Health",
                    "Degraded → Healthy: every object is healthy again".into(),
                )
                .await;
        }
        _ => {}
    }
}
