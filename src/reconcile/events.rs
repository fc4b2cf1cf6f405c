//! What a reconcile tells about itself besides its status: Kubernetes
//! Events (synced, drift corrected, pruned, drift detected) and the drift
//! metrics.

use crate::api::{ApplicationStatus, Sync};
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
                events
                    .normal(
                        "DriftCorrected",
                        "Apply",
                        format!("{}: {}", step.id, fields.join(", ")),
                    )
                    .await;
            }
            Action::Create { deleted_live: true } => {
                events
                    .normal(
                        "DriftCorrected",
                        "Apply",
                        format!("{}: recreated (it was deleted outside Setpoint)", step.id),
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
