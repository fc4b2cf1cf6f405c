//! Health: after the apply, how each live object is doing, read from its
//! `status` the way kstatus and Argo CD's health checks read it. An
//! Application is as healthy as its worst object. Pure: it looks at one live
//! object's JSON, so each rule is a unit test on a realistic status.

use serde_json::Value;

use crate::api::Health;

/// One object's health, with a short reason a person can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    pub status: Health,
    pub message: Option<String>,
}

impl Assessment {
    fn healthy() -> Assessment {
        Assessment {
            status: Health::Healthy,
            message: None,
        }
    }

    fn healthy_because(message: impl Into<String>) -> Assessment {
        Assessment {
            status: Health::Healthy,
            message: Some(short(message.into())),
        }
    }

    fn progressing(message: impl Into<String>) -> Assessment {
        Assessment {
            status: Health::Progressing,
            message: Some(short(message.into())),
        }
    }

    fn degraded(message: impl Into<String>) -> Assessment {
        Assessment {
            status: Health::Degraded,
            message: Some(short(message.into())),
        }
    }
}

/// The Application's health: its worst object's, Healthy when it has none.
pub fn worst(items: impl IntoIterator<Item = Health>) -> Health {
    items.into_iter().max().unwrap_or(Health::Healthy)
}

/// The health of one live object of the given API group and kind.
pub fn assess(group: &str, kind: &str, live: &Value) -> Assessment {
    if live
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return Assessment::progressing("being deleted");
    }
    // A status that predates the last spec change says nothing about it.
    if let (Some(generation), Some(observed)) = (
        int(live, "/metadata/generation"),
        int(live, "/status/observedGeneration"),
    ) && generation > observed
    {
        return Assessment::progressing(format!(
            "waiting for the controller to observe generation {generation}"
        ));
    }
    match (group, kind) {
        ("apps", "Deployment") => deployment(live),
        ("apps", "StatefulSet") => stateful_set(live),
        ("apps", "DaemonSet") => daemon_set(live),
        ("apps", "ReplicaSet") => replica_set(live),
        ("", "Pod") => pod(live),
        ("batch", "Job") => job(live),
        ("", "PersistentVolumeClaim") => persistent_volume_claim(live),
        ("", "Service") => service(live),
        ("", "Namespace") => namespace(live),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => custom_resource_definition(live),
        _ => by_conditions(live),
    }
}

/// Workload controllers always set `observedGeneration`; without it the
/// controller has not looked at the object yet, and zero counts mean nothing.
fn unobserved(live: &Value) -> Option<Assessment> {
    int(live, "/status/observedGeneration")
        .is_none()
        .then(|| Assessment::progressing("waiting for the controller to report status"))
}

/// As `kubectl rollout status`: a deadline exceeded is a failure; otherwise
/// the rollout is done when every replica is updated, old ones are gone and
/// the updated ones are available.
fn deployment(live: &Value) -> Assessment {
    if let Some(progressing) = condition(live, "Progressing")
        && reason(progressing) == "ProgressDeadlineExceeded"
    {
        return Assessment::degraded(explain(progressing, "progress deadline exceeded"));
    }
    if live.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
        return Assessment::healthy_because("rollout paused");
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
fn stateful_set(live: &Value) -> Assessment {
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

fn daemon_set(live: &Value) -> Assessment {
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

fn replica_set(live: &Value) -> Assessment {
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
/// ConfigMap or Secret, a container that keeps crashing.
const STUCK_REASONS: [&str; 5] = [
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "InvalidImageName",
];

fn pod(live: &Value) -> Assessment {
    let phase = text(live, "/status/phase").unwrap_or("Pending");
    match phase {
        "Succeeded" => return Assessment::healthy_because("completed"),
        "Failed" => {
            let why = text(live, "/status/message").or_else(|| text(live, "/status/reason"));
            return Assessment::degraded(why.unwrap_or("pod failed"));
        }
        _ => {}
    }
    let statuses = ["/status/initContainerStatuses", "/status/containerStatuses"]
        .iter()
        .filter_map(|pointer| live.pointer(pointer).and_then(Value::as_array))
        .flatten();
    for container in statuses {
        let Some(waiting) = container.pointer("/state/waiting") else {
            continue;
        };
        let why = waiting
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if STUCK_REASONS.contains(&why) {
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

fn job(live: &Value) -> Assessment {
    if condition(live, "Complete").is_some_and(is_true) {
        return Assessment::healthy();
    }
    // FailureTarget comes first: the Job has failed and is cleaning up.
    for failure in ["Failed", "FailureTarget"] {
        if let Some(failed) = condition(live, failure)
            && is_true(failed)
        {
            return Assessment::degraded(explain(failed, "job failed"));
        }
    }
    if live.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true) {
        return Assessment::healthy_because("suspended");
    }
    let succeeded = count(live, "/status/succeeded");
    match int(live, "/spec/completions") {
        Some(completions) => {
            Assessment::progressing(format!("{succeeded} of {completions} completions"))
        }
        None => Assessment::progressing("running"),
    }
}

fn persistent_volume_claim(live: &Value) -> Assessment {
    match text(live, "/status/phase") {
        Some("Bound") => Assessment::healthy(),
        Some("Lost") => Assessment::degraded("the claim lost its volume"),
        phase => Assessment::progressing(format!("claim is {}", phase.unwrap_or("Pending"))),
    }
}

fn service(live: &Value) -> Assessment {
    let load_balancer = text(live, "/spec/type") == Some("LoadBalancer");
    let addresses = live
        .pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array);
    if load_balancer && addresses.is_none_or(Vec::is_empty) {
        return Assessment::progressing("waiting for a load balancer address");
    }
    Assessment::healthy()
}

fn namespace(live: &Value) -> Assessment {
    if text(live, "/status/phase") == Some("Terminating") {
        return Assessment::progressing("terminating");
    }
    Assessment::healthy()
}

/// Its kind can be used once Established; names that clash with another CRD
/// never will be.
fn custom_resource_definition(live: &Value) -> Assessment {
    if let Some(names) = condition(live, "NamesAccepted")
        && text_of(names, "status") == Some("False")
    {
        return Assessment::degraded(explain(names, "names not accepted"));
    }
    if condition(live, "Established").is_some_and(is_true) {
        return Assessment::healthy();
    }
    Assessment::progressing("waiting for the CRD to be established")
}

/// Any other kind, by the conditions convention kstatus reads (`Ready`,
/// `Stalled`, `Reconciling`, as Flux and most operators set them). An object
/// without conditions, like a ConfigMap, has no notion of health: Healthy.
fn by_conditions(live: &Value) -> Assessment {
    if let Some(stalled) = condition(live, "Stalled")
        && is_true(stalled)
    {
        return Assessment::degraded(explain(stalled, "stalled"));
    }
    if let Some(ready) = condition(live, "Ready") {
        return match text_of(ready, "status") {
            Some("True") => Assessment::healthy(),
            Some("False")
                if ["Failed", "Error"]
                    .iter()
                    .any(|w| reason(ready).contains(w)) =>
            {
                Assessment::degraded(explain(ready, "not ready"))
            }
            _ => Assessment::progressing(explain(ready, "not ready")),
        };
    }
    if let Some(reconciling) = condition(live, "Reconciling")
        && is_true(reconciling)
    {
        return Assessment::progressing(explain(reconciling, "reconciling"));
    }
    Assessment::healthy()
}

fn condition<'a>(live: &'a Value, kind: &str) -> Option<&'a Value> {
    live.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| text_of(c, "type") == Some(kind))
}

fn is_true(condition: &Value) -> bool {
    text_of(condition, "status") == Some("True")
}

fn reason(condition: &Value) -> &str {
    text_of(condition, "reason").unwrap_or_default()
}

/// A condition's message, else its reason, else the fallback.
fn explain(condition: &Value, fallback: &str) -> String {
    text_of(condition, "message")
        .filter(|m| !m.is_empty())
        .or_else(|| text_of(condition, "reason").filter(|r| !r.is_empty()))
        .unwrap_or(fallback)
        .to_string()
}

fn strategy(live: &Value) -> &str {
    text(live, "/spec/updateStrategy/type").unwrap_or("RollingUpdate")
}

fn int(live: &Value, pointer: &str) -> Option<i64> {
    live.pointer(pointer)?.as_i64()
}

/// A status counter: Kubernetes omits zeros.
fn count(live: &Value, pointer: &str) -> i64 {
    int(live, pointer).unwrap_or(0)
}

fn text<'a>(live: &'a Value, pointer: &str) -> Option<&'a str> {
    live.pointer(pointer)?.as_str()
}

fn text_of<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field)?.as_str()
}

/// Health messages go into the Application's status and printer columns:
/// one line, a couple hundred characters at most.
const MAX_MESSAGE: usize = 200;

fn short(message: String) -> String {
    let line = message.lines().next().unwrap_or_default().trim();
    if line.chars().count() <= MAX_MESSAGE {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(MAX_MESSAGE - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn status_of(group: &str, kind: &str, live: Value) -> (Health, Option<String>) {
        let assessment = assess(group, kind, &live);
        (assessment.status, assessment.message)
    }

    fn progressing(message: &str) -> (Health, Option<String>) {
        (Health::Progressing, Some(message.to_string()))
    }

    fn degraded(message: &str) -> (Health, Option<String>) {
        (Health::Degraded, Some(message.to_string()))
    }

    const HEALTHY: (Health, Option<String>) = (Health::Healthy, None);

    fn deployment(spec: Value, status: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "generation": 4},
            "spec": spec,
            "status": status
        })
    }

    fn rolled_out() -> Value {
        json!({
            "observedGeneration": 4, "replicas": 3, "updatedReplicas": 3,
            "readyReplicas": 3, "availableReplicas": 3,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable",
                 "message": "Deployment has minimum availability."},
                {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                 "message": "ReplicaSet \"web-5d9c7b\" has successfully progressed."}
            ]
        })
    }

    #[test]
    fn worst_is_the_maximum_and_healthy_when_empty() {
        assert_eq!(worst([]), Health::Healthy);
        assert_eq!(
            worst([Health::Healthy, Health::Progressing]),
            Health::Progressing
        );
        assert_eq!(
            worst([Health::Missing, Health::Degraded, Health::Unknown]),
            Health::Degraded
        );
        assert_eq!(
            worst([Health::Unknown, Health::Progressing]),
            Health::Unknown
        );
    }

    #[test]
    fn an_unobserved_generation_is_progressing_for_any_kind() {
        let mut live = deployment(json!({"replicas": 3}), rolled_out());
        live["metadata"]["generation"] = json!(5);
        assert_eq!(
            status_of("apps", "Deployment", live),
            progressing("waiting for the controller to observe generation 5")
        );
        let widget = json!({
            "metadata": {"name": "w", "generation": 2},
            "status": {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}
        });
        assert_eq!(
            status_of("example.com", "Widget", widget).0,
            Health::Progressing
        );
    }

    #[test]
    fn objects_being_deleted_are_progressing() {
        let mut live = deployment(json!({"replicas": 3}), rolled_out());
        live["metadata"]["deletionTimestamp"] = json!("2026-05-01T10:00:00Z");
        assert_eq!(
            status_of("apps", "Deployment", live),
            progressing("being deleted")
        );
    }

    #[test]
    fn deployment_rolled_out_is_healthy() {
        let live = deployment(json!({"replicas": 3}), rolled_out());
        assert_eq!(status_of("apps", "Deployment", live), HEALTHY);
    }

    #[test]
    fn deployment_past_its_deadline_is_degraded() {
        let mut status = rolled_out();
        status["updatedReplicas"] = json!(1);
        status["conditions"][1] = json!({
            "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
            "message": "ReplicaSet \"web-7f8d9\" has timed out progressing."
        });
        let live = deployment(json!({"replicas": 3}), status);
        assert_eq!(
            status_of("apps", "Deployment", live),
            degraded("ReplicaSet \"web-7f8d9\" has timed out progressing.")
        );
    }

    #[test]
    fn deployment_paused_is_healthy_with_a_note() {
        let mut status = rolled_out();
        status["updatedReplicas"] = json!(1);
        let live = deployment(json!({"replicas": 3, "paused": true}), status);
        assert_eq!(
            status_of("apps", "Deployment", live),
            (Health::Healthy, Some("rollout paused".into()))
        );
    }

    #[test]
    fn deployment_rollout_steps_are_progressing() {
        let with = |changes: Value| {
            let mut status = rolled_out();
            for (key, value) in changes.as_object().unwrap() {
                status[key] = value.clone();
            }
            status
        };
        let live = deployment(json!({"replicas": 3}), with(json!({"updatedReplicas": 1})));
        assert_eq!(
            status_of("apps", "Deployment", live),
            progressing("1 of 3 updated replicas")
        );
        let live = deployment(json!({"replicas": 3}), with(json!({"replicas": 4})));
        assert_eq!(
            status_of("apps", "Deployment", live),
            progressing("1 old replicas pending termination")
        );
        let live = deployment(
            json!({"replicas": 3}),
            with(json!({"availableReplicas": 2})),
        );
        assert_eq!(
            status_of("apps", "Deployment", live),
            progressing("2 of 3 updated replicas available")
        );
        // spec.replicas defaults to 1; zero counters are omitted.
        let live = deployment(json!({}), json!({"observedGeneration": 4}));
        assert_eq!(
            status_of("apps", "Deployment", live),
            progressing("0 of 1 updated replicas")
        );
        let live = deployment(json!({"replicas": 0}), json!({"observedGeneration": 4}));
        assert_eq!(status_of("apps", "Deployment", live), HEALTHY);
    }

    #[test]
    fn a_fresh_deployment_without_status_is_progressing() {
        let live = json!({"metadata": {"name": "web", "generation": 1}, "spec": {"replicas": 2}});
        assert_eq!(
            status_of("apps", "Deployment", live),
            progressing("waiting for the controller to report status")
        );
    }

    fn stateful_set(spec: Value, status: Value) -> Value {
        json!({"metadata": {"name": "db", "generation": 2}, "spec": spec, "status": status})
    }

    fn settled_set() -> Value {
        json!({
            "observedGeneration": 2, "replicas": 3, "readyReplicas": 3, "currentReplicas": 3,
            "updatedReplicas": 3, "availableReplicas": 3,
            "currentRevision": "db-6b8f7c", "updateRevision": "db-6b8f7c", "collisionCount": 0
        })
    }

    #[test]
    fn stateful_set_rules() {
        let spec = json!({"replicas": 3, "updateStrategy": {"type": "RollingUpdate"}});
        assert_eq!(
            status_of(
                "apps",
                "StatefulSet",
                stateful_set(spec.clone(), settled_set())
            ),
            HEALTHY
        );

        let mut status = settled_set();
        status["readyReplicas"] = json!(2);
        assert_eq!(
            status_of("apps", "StatefulSet", stateful_set(spec.clone(), status)),
            progressing("2 of 3 replicas ready")
        );

        let mut status = settled_set();
        status["updatedReplicas"] = json!(1);
        status["updateRevision"] = json!("db-77d9c5");
        assert_eq!(
            status_of(
                "apps",
                "StatefulSet",
                stateful_set(spec.clone(), status.clone())
            ),
            progressing("1 of 3 updated replicas")
        );

        status["updatedReplicas"] = json!(3);
        assert_eq!(
            status_of("apps", "StatefulSet", stateful_set(spec, status.clone())),
            progressing("rolling update to revision db-77d9c5")
        );

        // A partition holds back the pods below it: done when those above it are updated.
        let partitioned = json!({"replicas": 3, "updateStrategy": {
            "type": "RollingUpdate", "rollingUpdate": {"partition": 2}}});
        status["updatedReplicas"] = json!(1);
        assert_eq!(
            status_of(
                "apps",
                "StatefulSet",
                stateful_set(partitioned, status.clone())
            ),
            HEALTHY
        );

        // OnDelete waits for someone to delete the pods: nothing to wait for here.
        let on_delete = json!({"replicas": 3, "updateStrategy": {"type": "OnDelete"}});
        assert_eq!(
            status_of("apps", "StatefulSet", stateful_set(on_delete, status)),
            HEALTHY
        );
    }

    fn daemon_set(strategy: &str, status: Value) -> Value {
        json!({
            "metadata": {"name": "agent", "generation": 1},
            "spec": {"updateStrategy": {"type": strategy}},
            "status": status
        })
    }

    #[test]
    fn daemon_set_rules() {
        let status = |updated: i64, available: i64| {
            json!({
                "observedGeneration": 1, "desiredNumberScheduled": 3, "currentNumberScheduled": 3,
                "numberReady": available, "numberAvailable": available,
                "updatedNumberScheduled": updated, "numberMisscheduled": 0
            })
        };
        assert_eq!(
            status_of(
                "apps",
                "DaemonSet",
                daemon_set("RollingUpdate", status(3, 3))
            ),
            HEALTHY
        );
        assert_eq!(
            status_of(
                "apps",
                "DaemonSet",
                daemon_set("RollingUpdate", status(2, 3))
            ),
            progressing("2 of 3 updated pods scheduled")
        );
        assert_eq!(
            status_of(
                "apps",
                "DaemonSet",
                daemon_set("RollingUpdate", status(3, 1))
            ),
            progressing("1 of 3 pods available")
        );
        assert_eq!(
            status_of("apps", "DaemonSet", daemon_set("OnDelete", status(2, 3))),
            HEALTHY
        );
    }

    #[test]
    fn replica_set_rules() {
        let replica_set = |status: Value| {
            let metadata = json!({"name": "web-5d9c7b", "generation": 1});
            json!({"metadata": metadata, "spec": {"replicas": 2}, "status": status})
        };
        let ok = json!({
            "observedGeneration": 1, "replicas": 2, "readyReplicas": 2, "availableReplicas": 2
        });
        assert_eq!(status_of("apps", "ReplicaSet", replica_set(ok)), HEALTHY);
        let short = json!({"observedGeneration": 1, "replicas": 2, "availableReplicas": 1});
        assert_eq!(
            status_of("apps", "ReplicaSet", replica_set(short)),
            progressing("1 of 2 replicas available")
        );
        let quota = json!({
            "observedGeneration": 1, "replicas": 0,
            "conditions": [{"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate",
                "message": "pods \"web-5d9c7b-x\" is forbidden: exceeded quota: compute"}]
        });
        assert_eq!(
            status_of("apps", "ReplicaSet", replica_set(quota)),
            degraded("pods \"web-5d9c7b-x\" is forbidden: exceeded quota: compute")
        );
    }

    fn pod(status: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1"}, "status": status})
    }

    fn container(name: &str, ready: bool, state: Value) -> Value {
        json!({"name": name, "ready": ready, "restartCount": 0, "image": "app:1", "state": state})
    }

    #[test]
    fn pod_running_and_ready_is_healthy() {
        let live = pod(json!({
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"},
                {"type": "PodScheduled", "status": "True"}
            ],
            "containerStatuses": [
                container("app", true, json!({"running": {"startedAt": "2026-05-01T10:00:00Z"}}))
            ]
        }));
        assert_eq!(status_of("", "Pod", live), HEALTHY);
    }

    #[test]
    fn pod_finished() {
        assert_eq!(
            status_of("", "Pod", pod(json!({"phase": "Succeeded"}))),
            (Health::Healthy, Some("completed".into()))
        );
        let evicted = pod(json!({"phase": "Failed", "reason": "Evicted",
            "message": "The node was low on resource: memory."}));
        assert_eq!(
            status_of("", "Pod", evicted),
            degraded("The node was low on resource: memory.")
        );
        let failed = pod(json!({"phase": "Failed", "reason": "DeadlineExceeded"}));
        assert_eq!(status_of("", "Pod", failed), degraded("DeadlineExceeded"));
    }

    #[test]
    fn pod_stuck_containers_are_degraded_by_name() {
        let crashing = pod(json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [
                container("sidecar", true, json!({"running": {}})),
                container("app", false, json!({"waiting": {"reason": "CrashLoopBackOff",
                    "message": "back-off 5m0s restarting failed container=app pod=web-1"}}))
            ]
        }));
        assert_eq!(
            status_of("", "Pod", crashing),
            degraded(
                "container app: CrashLoopBackOff: back-off 5m0s restarting failed container=app pod=web-1"
            )
        );
        for reason in [
            "ImagePullBackOff",
            "ErrImagePull",
            "CreateContainerConfigError",
            "InvalidImageName",
        ] {
            let stuck = pod(json!({
                "phase": "Pending",
                "initContainerStatuses": [
                    container("migrate", false, json!({"waiting": {"reason": reason}}))
                ]
            }));
            assert_eq!(
                status_of("", "Pod", stuck),
                degraded(&format!("container migrate: {reason}"))
            );
        }
    }

    #[test]
    fn pod_on_its_way_is_progressing() {
        let creating = pod(json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [
                container("app", false, json!({"waiting": {"reason": "ContainerCreating"}}))
            ]
        }));
        assert_eq!(
            status_of("", "Pod", creating),
            progressing("pod Pending, 0 of 1 containers ready")
        );
        let unschedulable = pod(json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient cpu."}]
        }));
        assert_eq!(
            status_of("", "Pod", unschedulable),
            progressing("0/3 nodes are available: 3 Insufficient cpu.")
        );
        let starting = pod(json!({
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "False"},
                {"type": "PodScheduled", "status": "True"}
            ],
            "containerStatuses": [
                container("app", false, json!({"running": {}})),
                container("proxy", true, json!({"running": {}}))
            ]
        }));
        assert_eq!(
            status_of("", "Pod", starting),
            progressing("pod Running, 1 of 2 containers ready")
        );
        assert_eq!(
            status_of("", "Pod", pod(json!({}))),
            progressing("pod Pending, 0 of 0 containers ready")
        );
    }

    fn job(spec: Value, status: Value) -> Value {
        json!({"metadata": {"name": "migrate", "generation": 1}, "spec": spec, "status": status})
    }

    #[test]
    fn job_rules() {
        let complete = json!({"succeeded": 1, "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True"},
            {"type": "Complete", "status": "True"}]});
        assert_eq!(
            status_of("batch", "Job", job(json!({"completions": 1}), complete)),
            HEALTHY
        );

        let failed = json!({"failed": 7, "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
             "message": "Job has reached the specified backoff limit"}]});
        assert_eq!(
            status_of("batch", "Job", job(json!({}), failed)),
            degraded("Job has reached the specified backoff limit")
        );

        let suspended = json!({"conditions": [
            {"type": "Suspended", "status": "True", "reason": "JobSuspended"}]});
        assert_eq!(
            status_of("batch", "Job", job(json!({"suspend": true}), suspended)),
            (Health::Healthy, Some("suspended".into()))
        );

        let running = json!({"active": 2, "succeeded": 1, "startTime": "2026-05-01T10:00:00Z"});
        assert_eq!(
            status_of(
                "batch",
                "Job",
                job(json!({"completions": 3}), running.clone())
            ),
            progressing("1 of 3 completions")
        );
        assert_eq!(
            status_of("batch", "Job", job(json!({}), running)),
            progressing("running")
        );
    }

    #[test]
    fn persistent_volume_claim_rules() {
        let claim = |phase: &str| json!({"metadata": {"name": "data"}, "status": {"phase": phase}});
        assert_eq!(
            status_of("", "PersistentVolumeClaim", claim("Bound")),
            HEALTHY
        );
        assert_eq!(
            status_of("", "PersistentVolumeClaim", claim("Lost")),
            degraded("the claim lost its volume")
        );
        assert_eq!(
            status_of("", "PersistentVolumeClaim", claim("Pending")),
            progressing("claim is Pending")
        );
    }

    #[test]
    fn service_rules() {
        let service = |kind: &str, status: Value| {
            let spec = json!({"type": kind, "ports": [{"port": 80}]});
            json!({"metadata": {"name": "web"}, "spec": spec, "status": status})
        };
        assert_eq!(
            status_of(
                "",
                "Service",
                service("ClusterIP", json!({"loadBalancer": {}}))
            ),
            HEALTHY
        );
        assert_eq!(
            status_of(
                "",
                "Service",
                service("LoadBalancer", json!({"loadBalancer": {}}))
            ),
            progressing("waiting for a load balancer address")
        );
        let assigned =
            json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10", "ipMode": "VIP"}]}});
        assert_eq!(
            status_of("", "Service", service("LoadBalancer", assigned)),
            HEALTHY
        );
    }

    #[test]
    fn namespace_rules() {
        let ns = |phase: &str| json!({"metadata": {"name": "team-a"}, "status": {"phase": phase}});
        assert_eq!(status_of("", "Namespace", ns("Active")), HEALTHY);
        assert_eq!(
            status_of("", "Namespace", ns("Terminating")),
            progressing("terminating")
        );
    }

    #[test]
    fn custom_resource_definition_rules() {
        let crd = |conditions: Value| {
            json!({"metadata": {"name": "widgets.example.com", "generation": 1},
                   "status": {"conditions": conditions, "acceptedNames": {"kind": "Widget"}}})
        };
        let group = "apiextensions.k8s.io";
        let established = crd(json!([
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}
        ]));
        assert_eq!(
            status_of(group, "CustomResourceDefinition", established),
            HEALTHY
        );
        let pending =
            crd(json!([{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts"}]));
        assert_eq!(
            status_of(group, "CustomResourceDefinition", pending),
            progressing("waiting for the CRD to be established")
        );
        let clash = crd(
            json!([{"type": "NamesAccepted", "status": "False", "reason": "ListKindConflict",
            "message": "\"WidgetList\" is already in use"}]),
        );
        assert_eq!(
            status_of(group, "CustomResourceDefinition", clash),
            degraded("\"WidgetList\" is already in use")
        );
    }

    fn custom(conditions: Value) -> Value {
        json!({
            "apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
            "metadata": {"name": "repo", "generation": 3},
            "status": {"observedGeneration": 3, "conditions": conditions}
        })
    }

    #[test]
    fn other_kinds_follow_their_conditions() {
        let g = "source.toolkit.fluxcd.io";
        let ready = custom(json!([{"type": "Ready", "status": "True", "reason": "Succeeded"}]));
        assert_eq!(status_of(g, "GitRepository", ready), HEALTHY);
        let stalled = custom(json!([
            {"type": "Stalled", "status": "True", "reason": "InvalidURL",
             "message": "invalid URL: ftp://x"},
            {"type": "Ready", "status": "False", "reason": "InvalidURL"}
        ]));
        assert_eq!(
            status_of(g, "GitRepository", stalled),
            degraded("invalid URL: ftp://x")
        );
        let failing = custom(
            json!([{"type": "Ready", "status": "False", "reason": "GitOperationFailed",
            "message": "failed to checkout and determine revision: unable to clone"}]),
        );
        assert_eq!(
            status_of(g, "GitRepository", failing),
            degraded("failed to checkout and determine revision: unable to clone")
        );
        let waiting = custom(
            json!([{"type": "Ready", "status": "False", "reason": "DependencyNotReady",
            "message": "dependency 'infra' is not ready"}]),
        );
        assert_eq!(
            status_of(g, "GitRepository", waiting),
            progressing("dependency 'infra' is not ready")
        );
        let unknown =
            custom(json!([{"type": "Ready", "status": "Unknown", "reason": "Progressing"}]));
        assert_eq!(
            status_of(g, "GitRepository", unknown),
            progressing("Progressing")
        );
        let reconciling =
            custom(json!([{"type": "Reconciling", "status": "True", "reason": "NewGeneration"}]));
        assert_eq!(
            status_of(g, "GitRepository", reconciling),
            progressing("NewGeneration")
        );
    }

    #[test]
    fn objects_without_a_notion_of_health_are_healthy() {
        let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "settings"}, "data": {"a": "b"}});
        assert_eq!(status_of("", "ConfigMap", config_map), HEALTHY);
        let role = json!({"metadata": {"name": "reader"}, "rules": []});
        assert_eq!(
            status_of("rbac.authorization.k8s.io", "Role", role),
            HEALTHY
        );
    }

    #[test]
    fn long_messages_are_cut_to_one_short_line() {
        let long = format!("{}\nsecond line", "x".repeat(500));
        let live = custom(json!([{"type": "Stalled", "status": "True", "message": long}]));
        let message = assess("example.com", "Widget", &live).message.unwrap();
        assert_eq!(message.chars().count(), MAX_MESSAGE);
        assert!(message.ends_with('…') && !message.contains('\n'));
    }
}
