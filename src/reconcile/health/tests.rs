//! The built-in rules on realistic objects; recorded objects of the rules
//! Argo CD added are in `testdata/`.

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
    // Argo CD's order: Suspended just after Healthy, before Progressing.
    assert_eq!(
        worst([Health::Healthy, Health::Suspended]),
        Health::Suspended
    );
    assert_eq!(
        worst([Health::Suspended, Health::Progressing]),
        Health::Progressing
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
fn deployment_paused_is_suspended() {
    let mut status = rolled_out();
    status["updatedReplicas"] = json!(1);
    let live = deployment(json!({"replicas": 3, "paused": true}), status);
    assert_eq!(
        status_of("apps", "Deployment", live),
        (Health::Suspended, Some("Deployment is paused".into()))
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
        (Health::Suspended, Some("Job is suspended".into()))
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
    let assigned = json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.10", "ipMode": "VIP"}]}});
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
    let unknown = custom(json!([{"type": "Ready", "status": "Unknown", "reason": "Progressing"}]));
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
