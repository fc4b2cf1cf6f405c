//! Workload controllers and their Pods, as `kubectl rollout status` and
//! Argo CD's health checks read them.

use serde_json::Value;

use super::{Assessment, condition, count, explain, flag, int, is_true, reason, text};

/// Workload controllers always set `observedGeneration`; without it the
/// controller has not looked at the object yet, and zero counts mean nothing.
fn unobserved(live: &Value) -> Option<Assessment> {
    int(live, "/status/observedGeneration")
        .is_none()
        .then(|| Assessment::progressing("waiting for the controller to report status"))
}

fn strategy(live: &Value) -> &str {
    text(live, "/spec/updateStrategy/type").unwrap_or("RollingUpdate")
}

/// Paused on purpose is Suspended (as Argo CD); else as `kubectl rollout
/// status`: a deadline exceeded is a failure; otherwise the rollout is done
/// when every replica is updated, old ones are gone and the updated ones are
/// available.
pub(super) fn deployment(live: &Value) -> Assessment {
    if flag(live, "/spec/paused") {
        return Assessment::suspended("Deployment is paused");
    }
    if let Some(progressing) = condition(live, "Progressing")
        && reason(progressing) == "ProgressDeadlineExceeded"
    {
        return Assessment::degraded(explain(progressing, "progress deadline exceeded"));
    }
    if let Some(pending) = unobserved(live) {
        return pending;
    }
    let replicas = int(live, "/spec/replicas").unwrap_or(1);
    let updated = count(live, "/status/updatedReplicas");
    let total = count(live, "/status/replicas");
    let available = count(live, "/status/availableReplicas");
    if updated < replicas {
        return Assessment::progressing(format!("{updated} of {replicas} updated replicas"));
    }
    if total > updated {
        return Assessment::progressing(format!(
            "{} old replicas pending termination",
            total - updated
        ));
    }
    if available < updated {
        return Assessment::progressing(format!(
            "{available} of {updated} updated replicas available"
        ));
    }
    Assessment::healthy()
}

/// Ready replicas first; then, for a RollingUpdate, the pods above the
/// partition updated and, without a partition, the revision switched over.
/// OnDelete updates wait for someone to delete pods, so they are not waited for.
pub(super) fn stateful_set(live: &Value) -> Assessment {
    if let Some(pending) = unobserved(live) {
        return pending;
    }
    let replicas = int(live, "/spec/replicas").unwrap_or(1);
    let ready = count(live, "/status/readyReplicas");
    if ready < replicas {
        return Assessment::progressing(format!("{ready} of {replicas} replicas ready"));
    }
    if strategy(live) != "RollingUpdate" {
        return Assessment::healthy();
    }
    let partition = count(live, "/spec/updateStrategy/rollingUpdate/partition");
    let target = (replicas - partition).max(0);
    let updated = count(live, "/status/updatedReplicas");
    if updated < target {
        return Assessment::progressing(format!("{updated} of {target} updated replicas"));
    }
    let current = text(live, "/status/currentRevision");
    let update = text(live, "/status/updateRevision");
    if partition == 0
        && let (Some(current), Some(update)) = (current, update)
        && current != update
    {
        return Assessment::progressing(format!("rolling update to revision {update}"));
    }
    Assessment::healthy()
}

pub(super) fn daemon_set(live: &Value) -> Assessment {
    if let Some(pending) = unobserved(live) {
        return pending;
    }
    let desired = count(live, "/status/desiredNumberScheduled");
    let updated = count(live, "/status/updatedNumberScheduled");
    let available = count(live, "/status/numberAvailable");
    if strategy(live) == "RollingUpdate" && updated < desired {
        return Assessment::progressing(format!("{updated} of {desired} updated pods scheduled"));
    }
    if available < desired {
        return Assessment::progressing(format!("{available} of {desired} pods available"));
    }
    Assessment::healthy()
}

pub(super) fn replica_set(live: &Value) -> Assessment {
    if let Some(failure) = condition(live, "ReplicaFailure")
        && is_true(failure)
    {
        return Assessment::degraded(explain(failure, "failed to create replicas"));
    }
    if let Some(pending) = unobserved(live) {
        return pending;
    }
    let replicas = int(live, "/spec/replicas").unwrap_or(1);
    let available = count(live, "/status/availableReplicas");
    if available < replicas {
        return Assessment::progressing(format!("{available} of {replicas} replicas available"));
    }
    Assessment::healthy()
}

/// Waiting reasons that do not clear up on their own: a bad image, a missing
/// ConfigMap or Secret, a container that keeps crashing. Argo CD reads any
/// reason starting with `Err` or ending with `Error` or `BackOff` so.
fn stuck(reason: &str) -> bool {
    reason.starts_with("Err")
        || reason.ends_with("Error")
        || reason.ends_with("BackOff")
        || reason == "InvalidImageName"
}

fn container_statuses(live: &Value) -> impl Iterator<Item = &Value> {
    ["/status/initContainerStatuses", "/status/containerStatuses"]
        .into_iter()
        .filter_map(|pointer| live.pointer(pointer).and_then(Value::as_array))
        .flatten()
}

/// Why a container that ended failed: its message, OOMKilled, or its exit
/// code; None for one still running or that ended well.
fn failure(container: &Value) -> Option<String> {
    let terminated = container.pointer("/state/terminated")?;
    if let Some(message) = terminated
        .get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
    {
        return Some(message.to_string());
    }
    if terminated.get("reason").and_then(Value::as_str) == Some("OOMKilled") {
        return Some("OOMKilled".into());
    }
    let code = terminated.get("exitCode").and_then(Value::as_i64)?;
    let name = container.get("name").and_then(Value::as_str).unwrap_or("?");
    (code != 0).then(|| format!("container {name:?} failed with exit code {code}"))
}

/// As Argo CD, by restart policy. `Always` (the default): a stuck container
/// is Degraded, a Running and Ready pod Healthy. `Never` and `OnFailure`
/// pods have a finite life (hooks, mostly): Progressing until they
/// complete, never Degraded for a container that may still recover; but a
/// container of a `Never` pod that failed is not restarted: Degraded.
pub(super) fn pod(live: &Value) -> Assessment {
    let policy = text(live, "/spec/restartPolicy").unwrap_or("Always");
    let phase = text(live, "/status/phase").unwrap_or("Pending");
    match phase {
        "Succeeded" => return Assessment::healthy_because("completed"),
        "Failed" => {
            let why = text(live, "/status/message")
                .filter(|m| !m.is_empty())
                .map(str::to_string)
                .or_else(|| container_statuses(live).find_map(failure))
                .or_else(|| text(live, "/status/reason").map(str::to_string));
            return Assessment::degraded(why.unwrap_or_else(|| "pod failed".into()));
        }
        _ => {}
    }
    if policy == "Never"
        && let Some(why) = container_statuses(live).find_map(failure)
    {
        return Assessment::degraded(why);
    }
    if policy == "Always" {
        for container in container_statuses(live) {
            let Some(waiting) = container.pointer("/state/waiting") else {
                continue;
            };
            let why = waiting
                .get("reason")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if stuck(why) {
                let name = container.get("name").and_then(Value::as_str).unwrap_or("?");
                let mut message = format!("container {name}: {why}");
                if let Some(detail) = waiting.get("message").and_then(Value::as_str) {
                    message.push_str(": ");
                    message.push_str(detail);
                }
                return Assessment::degraded(message);
            }
        }
        if phase == "Running" && condition(live, "Ready").is_some_and(is_true) {
            return Assessment::healthy();
        }
    } else if phase == "Running" {
        return Assessment::progressing(format!(
            "pod running (restartPolicy {policy}): healthy once it completes"
        ));
    }
    if let Some(scheduled) = condition(live, "PodScheduled")
        && !is_true(scheduled)
    {
        return Assessment::progressing(explain(scheduled, "not scheduled yet"));
    }
    let containers = live
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array);
    let total = containers.map_or(0, Vec::len);
    let ready = containers.map_or(0, |all| {
        all.iter()
            .filter(|c| c.get("ready").and_then(Value::as_bool) == Some(true))
            .count()
    });
    Assessment::progressing(format!("pod {phase}, {ready} of {total} containers ready"))
}
