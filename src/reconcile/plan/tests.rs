use serde_json::json;

use super::*;
use crate::api::IgnoreDifferences;
use crate::manifest::{Origin, split_api_version};

fn id_of(body: &Value) -> ObjectId {
    let (group, version) = split_api_version(body["apiVersion"].as_str().unwrap());
    ObjectId {
        group: group.into(),
        version: version.into(),
        kind: body["kind"].as_str().unwrap().into(),
        namespace: body["metadata"]["namespace"].as_str().map(Into::into),
        name: body["metadata"]["name"].as_str().unwrap().into(),
    }
}

fn manifest(body: Value) -> Manifest {
    let origin = Origin {
        file: "app.yaml".into(),
        document: 0,
    };
    Manifest {
        id: id_of(&body),
        origin,
        body,
    }
}

fn live_state(objects: &[Value]) -> LiveState {
    LiveState {
        objects: objects.iter().map(|o| (id_of(o), o.clone())).collect(),
        ..LiveState::default()
    }
}

/// The live object with the API server's answer to a dry run of applying
/// `desired_deployment()` to it: `live_deployment()`, the object as it was
/// right after Setpoint applied it (whatever drifted is set back).
fn diffed(live: Value) -> LiveState {
    with_dry_run(live, live_deployment())
}

fn with_dry_run(live: Value, dry_run: Value) -> LiveState {
    let mut state = live_state(&[live]);
    state.dry_runs.insert(id_of(&dry_run), dry_run);
    state
}

fn desired_deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "labels": {"app": "web", "team": "a", "setpoint.dev/app": "shop.web"},
            "annotations": {"setpoint.dev/app": "shop/web", HASH_ANNOTATION: "h1"}
        },
        "spec": {
            "replicas": 5,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": "app:1",
                        "ports": [{"containerPort": 80, "name": "http"}],
                        "env": [{"name": "MODE", "value": "prod"}],
                        "resources": {
                            "requests": {"cpu": 0.5, "memory": "256Mi"},
                            "limits": {"cpu": 1, "memory": "1024Mi"}
                        }
                    }]
                }
            }
        }
    })
}

/// Setpoint's apply and the controller's status write, as on a fresh
/// Deployment (a json! of its own: the macro's recursion limit).
fn managed_fields() -> Value {
    json!([{
        "manager": "setpoint",
        "operation": "Apply",
        "apiVersion": "apps/v1",
        "time": "2026-05-01T10:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {
                "f:annotations": {"f:setpoint.dev/app": {}, "f:setpoint.dev/manifest-hash": {}},
                "f:labels": {"f:app": {}, "f:setpoint.dev/app": {}, "f:team": {}}
            },
            "f:spec": {
                "f:replicas": {},
                "f:selector": {},
                "f:template": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"app\"}": {
                        ".": {},
                        "f:env": {"k:{\"name\":\"MODE\"}": {
                            ".": {}, "f:name": {}, "f:value": {}
                        }},
                        "f:image": {},
                        "f:name": {},
                        "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {
                            ".": {}, "f:containerPort": {}, "f:name": {}
                        }},
                        "f:resources": {
                            "f:limits": {"f:cpu": {}, "f:memory": {}},
                            "f:requests": {"f:cpu": {}, "f:memory": {}}
                        }
                    }}}
                }
            }
        }
    }, {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "apps/v1",
        "time": "2026-05-01T10:00:30Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": {"f:annotations": {"f:deployment.kubernetes.io/revision": {}}},
            "f:status": {"f:availableReplicas": {}, "f:replicas": {}}
        },
        "subresource": "status"
    }])
}

/// The desired Deployment as the API server returns it after Setpoint
/// applied it: defaults filled in, quantities canonical, status set.
fn live_deployment() -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "0b5f4c1e-2d1a-4c7e-9f1e-4c1d2e3f4a5b",
            "resourceVersion": "48213",
            "generation": 3,
            "creationTimestamp": "2026-05-01T10:00:00Z",
            "labels": {"app": "web", "team": "a", "setpoint.dev/app": "shop.web"},
            "annotations": {
                "deployment.kubernetes.io/revision": "2",
                "setpoint.dev/app": "shop/web",
                HASH_ANNOTATION: "h1"
            },
            "managedFields": managed_fields()
        },
        "spec": {
            "replicas": 5,
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}
            },
            "template": {
                "metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": "app:1",
                        "imagePullPolicy": "IfNotPresent",
                        "ports": [{"containerPort": 80, "name": "http", "protocol": "TCP"}],
                        "env": [{"name": "MODE", "value": "prod"}],
                        "resources": {
                            "requests": {"cpu": "500m", "memory": "256Mi"},
                            "limits": {"cpu": "1", "memory": "1Gi"}
                        },
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File"
                    }],
                    "dnsPolicy": "ClusterFirst",
                    "restartPolicy": "Always",
                    "schedulerName": "default-scheduler",
                    "securityContext": {},
                    "terminationGracePeriodSeconds": 30
                }
            }
        },
        "status": {
            "observedGeneration": 3,
            "replicas": 5,
            "updatedReplicas": 5,
            "readyReplicas": 5,
            "availableReplicas": 5
        }
    })
}

/// Adds a managedFields entry, as another client's write would.
fn written_by(live: &mut Value, entry: Value) {
    live["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .push(entry);
}

fn only_step(plan: &Plan) -> &Action {
    assert_eq!(plan.steps.len(), 1, "{plan:?}");
    &plan.steps[0].action
}

fn drift_of(action: &Action) -> &[Drift] {
    match action {
        Action::Update { drift, .. } => drift,
        other => panic!("expected an update, got {other:?}"),
    }
}

#[test]
fn not_live_is_created() {
    let plan = plan(
        &[manifest(desired_deployment())],
        &LiveState::default(),
        &[],
    );
    assert_eq!(
        only_step(&plan),
        &Action::Create {
            deleted_live: false
        }
    );
    assert_eq!(plan.creates(), 1);
    assert!(!plan.is_in_sync());
}

#[test]
fn previously_applied_but_gone_is_deleted_live_even_at_another_version() {
    let desired = manifest(desired_deployment());
    let mut before = desired.id.clone();
    before.version = "v1beta2".into();
    let live = LiveState {
        previously_applied: [before].into(),
        ..LiveState::default()
    };
    let plan = plan(&[desired], &live, &[]);
    assert_eq!(only_step(&plan), &Action::Create { deleted_live: true });
}

#[test]
fn server_defaults_are_not_drift() {
    // Extra fields, `protocol: TCP` on ports, `imagePullPolicy`,
    // `terminationMessagePath`, status, canonical quantities
    // (`0.5` → `500m`, `1024Mi` → `1Gi`, `1` → `"1"`), bookkeeping metadata.
    let plan = plan(
        &[manifest(desired_deployment())],
        &diffed(live_deployment()),
        &[],
    );
    assert_eq!(only_step(&plan), &Action::Unchanged);
    assert!(plan.is_in_sync());
    assert_eq!(
        (
            plan.unchanged(),
            plan.updates(),
            plan.creates(),
            plan.prunes()
        ),
        (1, 0, 0, 0)
    );
}

#[test]
fn image_changed_by_kubectl_edit_is_drift_on_the_keyed_container() {
    let mut live = live_deployment();
    live["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:2");
    written_by(
        &mut live,
        json!({
            "manager": "kubectl-edit",
            "operation": "Update",
            "apiVersion": "apps/v1",
            "time": "2026-05-02T09:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"app\"}": {"f:image": {}}
            }}}}}
        }),
    );
    let mut desired = desired_deployment();
    desired["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:1");
    let plan = plan(&[manifest(desired)], &diffed(live), &[]);
    let action = only_step(&plan);
    assert!(matches!(
        action,
        Action::Update {
            cause: Cause::Drift,
            ..
        }
    ));
    let drift = drift_of(action);
    assert_eq!(drift.len(), 1);
    assert_eq!(
        drift[0].path,
        "spec.template.spec.containers[name=app].image"
    );
    assert_eq!(drift[0].manager.as_deref(), Some("kubectl-edit"));
    assert_eq!(
        drift[0].to_string(),
        "spec.template.spec.containers[name=app].image app:2→app:1 (changed by kubectl-edit)"
    );
}

#[test]
fn replicas_scaled_through_the_scale_subresource() {
    let mut live = live_deployment();
    live["spec"]["replicas"] = json!(1);
    written_by(
        &mut live,
        json!({
            "manager": "kubectl",
            "operation": "Update",
            "apiVersion": "autoscaling/v1",
            "time": "2026-05-02T09:30:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:replicas": {}}},
            "subresource": "scale"
        }),
    );
    written_by(
        &mut live,
        json!({
            "manager": "kubectl-annotate",
            "operation": "Update",
            "apiVersion": "apps/v1",
            "time": "2026-05-02T10:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {"f:note": {}}}}
        }),
    );
    let plan = plan(&[manifest(desired_deployment())], &diffed(live), &[]);
    let drift = drift_of(only_step(&plan));
    let expected = Drift {
        path: "spec.replicas".into(),
        live: Some(json!(1)),
        desired: Some(json!(5)),
        manager: Some("kubectl".into()),
    };
    assert_eq!(drift, [expected]);
    assert_eq!(
        drift[0].to_string(),
        "spec.replicas 1→5 (changed by kubectl)"
    );
    assert_eq!(plan.drift().count(), 1);
}

#[test]
fn hash_change_is_git_changed_even_without_field_drift() {
    let mut desired = desired_deployment();
    desired["metadata"]["annotations"][HASH_ANNOTATION] = json!("h2");
    let plan = plan(&[manifest(desired)], &diffed(live_deployment()), &[]);
    assert_eq!(
        only_step(&plan),
        &Action::Update {
            cause: Cause::GitChanged,
            drift: vec![]
        }
    );
}

#[test]
fn live_without_hash_is_git_changed() {
    let mut live = live_deployment();
    live["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(HASH_ANNOTATION);
    let plan = plan(&[manifest(desired_deployment())], &diffed(live), &[]);
    assert!(matches!(
        only_step(&plan),
        Action::Update {
            cause: Cause::GitChanged,
            ..
        }
    ));
}

#[test]
fn owned_but_not_desired_is_pruned_after_the_desired_steps_sorted() {
    let cm = |name: &str| {
        id_of(&json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "shop"}}))
    };
    let desired = manifest(desired_deployment());
    let mut live = diffed(live_deployment());
    live.owned = [cm("zeta"), desired.id.clone(), cm("alpha")].into();
    let plan = plan(&[desired], &live, &[]);
    let steps: Vec<(&str, &Action)> = plan
        .steps
        .iter()
        .map(|s| (s.id.name.as_str(), &s.action))
        .collect();
    assert_eq!(
        steps,
        [
            ("web", &Action::Unchanged),
            ("alpha", &Action::Prune),
            ("zeta", &Action::Prune)
        ]
    );
    assert_eq!(plan.prunes(), 2);
    assert!(!plan.is_in_sync());
}

#[test]
fn owned_at_another_version_is_the_same_object_not_a_prune() {
    let desired = manifest(desired_deployment());
    let mut owned = desired.id.clone();
    owned.version = "v1beta2".into();
    let mut live = LiveState::default();
    live.objects.insert(owned.clone(), live_deployment());
    live.owned = [owned].into();
    let plan = plan(&[desired], &live, &[]);
    assert_eq!(only_step(&plan), &Action::Unchanged);
}

#[test]
fn unowned_live_objects_are_never_pruned() {
    let stranger = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "someone-elses", "namespace": "shop"}});
    let plan = plan(&[], &live_state(&[stranger]), &[]);
    assert!(plan.steps.is_empty());
    assert!(plan.is_in_sync());
}

#[test]
fn label_removed_by_someone_is_blamed_on_their_last_update() {
    let mut live = live_deployment();
    live["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("team");
    written_by(
        &mut live,
        json!({
            "manager": "kubectl-label",
            "operation": "Update",
            "apiVersion": "apps/v1",
            "time": "2026-05-03T08:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {"f:oncall": {}}}}
        }),
    );
    // The controller's status writes come later and are not blamed.
    live["metadata"]["managedFields"][1]["time"] = json!("2026-05-03T08:05:00Z");
    let plan = plan(&[manifest(desired_deployment())], &diffed(live), &[]);
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift.len(), 1);
    assert_eq!(
        drift[0].to_string(),
        "metadata.labels.team <none>→a (changed by kubectl-label)"
    );
}

#[test]
fn removed_field_without_any_update_has_unknown_manager() {
    let mut live = live_deployment();
    live["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("team");
    live["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .truncate(1);
    let plan = plan(&[manifest(desired_deployment())], &diffed(live), &[]);
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift[0].manager, None);
    assert_eq!(
        drift[0].to_string(),
        "metadata.labels.team <none>→a (changed by unknown)"
    );
}

#[test]
fn the_latest_owner_is_blamed_and_setpoint_never() {
    let mut live = live_deployment();
    live["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("debug");
    let env_owner = |manager: &str, time: &str| {
        json!({
            "manager": manager, "operation": "Update", "apiVersion": "apps/v1",
            "time": time, "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"app\"}": {"f:env": {"k:{\"name\":\"MODE\"}": {"f:value": {}}}}
            }}}}}
        })
    };
    written_by(&mut live, env_owner("older-tool", "2026-05-02T00:00:00Z"));
    written_by(&mut live, env_owner("kubectl-set", "2026-05-04T00:00:00Z"));
    written_by(&mut live, env_owner("setpoint", "2026-05-05T00:00:00Z"));
    let plan = plan(&[manifest(desired_deployment())], &diffed(live), &[]);
    let drift = drift_of(only_step(&plan));
    assert_eq!(
        drift[0].to_string(),
        "spec.template.spec.containers[name=app].env[name=MODE].value debug→prod (changed by kubectl-set)"
    );
}

#[test]
fn a_field_owner_beats_a_later_subtree_owner() {
    let mut live = live_deployment();
    live["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:2");
    written_by(
        &mut live,
        json!({
            "manager": "kubectl-set", "operation": "Update", "time": "2026-05-02T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"app\"}": {"f:image": {}}
            }}}}}
        }),
    );
    written_by(
        &mut live,
        json!({
            "manager": "kubectl-create", "operation": "Update", "time": "2026-05-03T00:00:00Z",
            "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"app\"}": {".": {}, "f:name": {}}
            }}}}}
        }),
    );
    let first = plan(
        &[manifest(desired_deployment())],
        &diffed(live.clone()),
        &[],
    );
    assert_eq!(
        drift_of(only_step(&first))[0].manager.as_deref(),
        Some("kubectl-set")
    );

    // Without the field owner, the one owning the item is blamed.
    live["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
        .remove(2);
    let plan = plan(&[manifest(desired_deployment())], &diffed(live), &[]);
    assert_eq!(
        drift_of(only_step(&plan))[0].manager.as_deref(),
        Some("kubectl-create")
    );
}

#[test]
fn extra_live_list_items_are_not_drift() {
    let mut live = live_deployment();
    let containers = live["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap();
    containers.insert(0, json!({"name": "injected-proxy", "image": "mesh:1"}));
    let plan = plan(&[manifest(desired_deployment())], &diffed(live), &[]);
    assert_eq!(only_step(&plan), &Action::Unchanged);
}

#[test]
fn long_values_are_cut_in_the_drift_line() {
    let long = "x".repeat(200);
    let drift = Drift {
        path: "data.blob".into(),
        live: Some(json!(long)),
        desired: None,
        manager: None,
    };
    let line = drift.to_string();
    assert!(
        line.starts_with(&format!("data.blob {}…→<none>", "x".repeat(MAX_SHOWN - 1))),
        "{line}"
    );
    let object = Drift {
        path: "spec".into(),
        live: Some(json!({"a": 1})),
        desired: Some(json!([1, "two"])),
        manager: Some("helm".into()),
    };
    assert_eq!(
        object.to_string(),
        r#"spec {"a":1}→[1,"two"] (changed by helm)"#
    );
}

fn config_map_named(name: &str) -> Value {
    let metadata = json!({"name": name, "namespace": "x"});
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata})
}

#[test]
fn steps_follow_the_desired_order() {
    let a = manifest(config_map_named("b"));
    let b = manifest(config_map_named("a"));
    let plan = plan(&[a, b], &LiveState::default(), &[]);
    let names: Vec<&str> = plan.steps.iter().map(|s| s.id.name.as_str()).collect();
    assert_eq!(names, ["b", "a"]);
    assert_eq!(plan.creates(), 2);
}

// Recorded from the local control plane (kube-apiserver v1.37): a
// Deployment applied with `cpu: 1000m` and `memory: 1024Mi`, read back, and
// the answer to a server-side apply dry run of the same manifest.
const QUANTITIES_LIVE: &str = include_str!("testdata/quantities-live.json");
const QUANTITIES_DRY_RUN: &str = include_str!("testdata/quantities-dry-run.json");
// The same for a Deployment with containers `a, b` live and Git's order
// `b, a` in the dry run.
const REORDERED_LIVE: &str = include_str!("testdata/reordered-live.json");
const REORDERED_DRY_RUN: &str = include_str!("testdata/reordered-dry-run.json");

fn recorded(text: &str) -> Value {
    serde_json::from_str(text).expect("recorded JSON")
}

fn recorded_plan(git: Value, live: &str, dry_run: &str, ignore: &[IgnoreDifferences]) -> Plan {
    plan(
        &[manifest(git)],
        &with_dry_run(recorded(live), recorded(dry_run)),
        ignore,
    )
}

#[test]
fn cpu_1000m_and_memory_1024mi_against_the_servers_1_and_1gi_are_not_drift() {
    let live = recorded(QUANTITIES_LIVE);
    let container = &live["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        container["resources"]["requests"],
        json!({"cpu": "1", "memory": "1Gi"})
    );
    // Git's manifest as written: `1000m`, `1024Mi`, no defaults.
    let mut git = live.clone();
    git["spec"]["template"]["spec"]["containers"][0] = json!({
        "name": "app", "image": "app:1", "ports": [{"containerPort": 80}],
        "resources": {"requests": {"cpu": "1000m", "memory": "1024Mi"}}
    });
    let plan = recorded_plan(git, QUANTITIES_LIVE, QUANTITIES_DRY_RUN, &[]);
    // The recorded object carries no hash annotation: a Git change, and
    // still not one drifted field.
    assert_eq!(
        only_step(&plan),
        &Action::Update {
            cause: Cause::GitChanged,
            drift: vec![]
        }
    );
}

#[test]
fn defaulted_fields_and_the_port_protocol_are_not_drift() {
    // The recorded live object has `protocol: TCP`, `imagePullPolicy`,
    // `strategy`, `revisionHistoryLimit`: none is in Setpoint's fields.
    let live = recorded(QUANTITIES_LIVE);
    assert_eq!(
        live["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"],
        "TCP"
    );
    let dry_run = recorded(QUANTITIES_DRY_RUN);
    let fields = compare::applied_fields(&dry_run).unwrap();
    assert!(compare::differences(fields, &dry_run, &live).is_empty());
}

#[test]
fn a_list_keyed_by_name_reordered_in_git_is_not_drift() {
    let dry_run = recorded(REORDERED_DRY_RUN);
    let names = |object: &Value| -> Vec<String> {
        object["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&dry_run), ["b", "a"]);
    assert_eq!(names(&recorded(REORDERED_LIVE)), ["a", "b"]);
    let plan = recorded_plan(dry_run, REORDERED_LIVE, REORDERED_DRY_RUN, &[]);
    assert_eq!(only_step(&plan), &Action::Unchanged);
}

#[test]
fn a_changed_quantity_is_drift_at_its_keyed_container() {
    let mut live = recorded(REORDERED_LIVE);
    live["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = json!("2");
    written_by(
        &mut live,
        json!({
            "manager": "kubectl-edit", "operation": "Update", "apiVersion": "apps/v1",
            "time": "2026-12-03T17:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"a\"}": {"f:resources": {"f:requests": {"f:cpu": {}}}}
            }}}}}
        }),
    );
    let dry_run = recorded(REORDERED_DRY_RUN);
    let plan = plan(
        &[manifest(dry_run.clone())],
        &with_dry_run(live, dry_run),
        &[],
    );
    let drift = drift_of(only_step(&plan));
    assert_eq!(
        drift.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "spec.template.spec.containers[name=a].resources.requests.cpu 2→1 (changed by kubectl-edit)"
        ]
    );
}

#[test]
fn a_missing_list_item_is_drift_at_its_key() {
    let mut live = recorded(REORDERED_LIVE);
    live["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .remove(1);
    let dry_run = recorded(REORDERED_DRY_RUN);
    let plan = plan(
        &[manifest(dry_run.clone())],
        &with_dry_run(live, dry_run),
        &[],
    );
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!(drift[0].path, "spec.template.spec.containers[name=b]");
    assert_eq!(drift[0].live, None);
    assert_eq!(drift[0].desired.as_ref().unwrap()["image"], "side:1");
}

#[test]
fn git_change_lists_the_fields_it_changes() {
    let mut desired = desired_deployment();
    desired["metadata"]["annotations"][HASH_ANNOTATION] = json!("h2");
    desired["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:3");
    let mut dry_run = live_deployment();
    dry_run["metadata"]["annotations"][HASH_ANNOTATION] = json!("h2");
    dry_run["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:3");
    let plan = plan(
        &[manifest(desired)],
        &with_dry_run(live_deployment(), dry_run),
        &[],
    );
    let action = only_step(&plan);
    assert!(matches!(
        action,
        Action::Update {
            cause: Cause::GitChanged,
            ..
        }
    ));
    // The hash annotation is compared on its own, not listed.
    assert_eq!(
        drift_of(action)
            .iter()
            .map(|d| d.path.as_str())
            .collect::<Vec<_>>(),
        ["spec.template.spec.containers[name=app].image"]
    );
}

#[test]
fn keys_that_are_not_identifiers_are_quoted() {
    let mut dry_run = live_deployment();
    dry_run["metadata"]["annotations"]["example.com/x"] = json!("yes");
    dry_run["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]["f:annotations"]["f:example.com/x"] =
        json!({});
    let plan = plan(
        &[manifest(desired_deployment())],
        &with_dry_run(live_deployment(), dry_run),
        &[],
    );
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift[0].path, r#"metadata.annotations["example.com/x"]"#);
    assert_eq!(drift[0].live, None);
}

#[test]
fn atomic_lists_compare_whole() {
    let mut dry_run = live_deployment();
    dry_run["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["a", "b"]);
    dry_run["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
        ["k:{\"name\":\"app\"}"]["f:args"] = json!({});
    let mut live = dry_run.clone();
    assert_eq!(
        only_step(&plan(
            &[manifest(desired_deployment())],
            &with_dry_run(live.clone(), dry_run.clone()),
            &[]
        )),
        &Action::Unchanged
    );
    live["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["b", "a"]);
    let plan = plan(
        &[manifest(desired_deployment())],
        &with_dry_run(live, dry_run),
        &[],
    );
    assert_eq!(
        drift_of(only_step(&plan))[0].path,
        "spec.template.spec.containers[name=app].args"
    );
}

#[test]
fn without_a_dry_run_only_the_hash_is_compared() {
    let mut live = live_deployment();
    live["spec"]["replicas"] = json!(1);
    let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]), &[]);
    assert_eq!(only_step(&plan), &Action::Unchanged);
}

fn secret(fields: Value) -> Value {
    let mut body = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": "db", "namespace": "shop", "annotations": {HASH_ANNOTATION: "x1"}}
    });
    for (key, value) in fields.as_object().unwrap() {
        body[key] = value.clone();
    }
    body
}

#[test]
fn secret_string_data_compares_with_live_data_and_is_redacted() {
    let desired = secret(json!({"stringData": {"password": "hunter2"}}));
    // As the API server answers: `stringData` folded into `data`, the
    // managed field recorded as `f:stringData`.
    let mut dry_run = secret(json!({"data": {"password": "aHVudGVyMg=="}}));
    dry_run["metadata"]["managedFields"] = json!([{
        "manager": "setpoint", "operation": "Apply", "apiVersion": "v1",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:stringData": {"f:password": {}}, "f:type": {}}
    }]);
    let same = plan(
        &[manifest(desired.clone())],
        &with_dry_run(dry_run.clone(), dry_run.clone()),
        &[],
    );
    assert_eq!(only_step(&same), &Action::Unchanged);

    let changed = secret(json!({"data": {"password": "b3RoZXI="}}));
    let plan = plan(&[manifest(desired)], &with_dry_run(changed, dry_run), &[]);
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift.len(), 1);
    assert_eq!(
        drift[0].to_string(),
        "data.password <redacted>→<redacted> (changed by unknown)"
    );
}

fn rule(json: Value) -> IgnoreDifferences {
    serde_json::from_value(json).unwrap()
}

/// The HPA's write: `spec.replicas` through the scale subresource, as
/// kube-controller-manager records it.
fn scaled_by_hpa(replicas: u32) -> Value {
    let mut live = live_deployment();
    live["spec"]["replicas"] = json!(replicas);
    written_by(
        &mut live,
        json!({
            "manager": "kube-controller-manager", "operation": "Update",
            "apiVersion": "autoscaling/v1", "time": "2026-05-02T09:30:00Z",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}},
            "subresource": "scale"
        }),
    );
    live
}

#[test]
fn ignore_differences_by_json_pointer() {
    let live = scaled_by_hpa(8);
    let replicas =
        rule(json!({"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/replicas"]}));
    let plan_with = |rules: &[IgnoreDifferences]| {
        plan(
            &[manifest(desired_deployment())],
            &diffed(live.clone()),
            rules,
        )
    };
    assert_eq!(
        only_step(&plan_with(std::slice::from_ref(&replicas))),
        &Action::Unchanged
    );
    // A pointer above the field covers it; other objects' rules do not.
    let spec =
        rule(json!({"group": "apps", "kind": "*", "name": "web", "jsonPointers": ["/spec"]}));
    assert_eq!(only_step(&plan_with(&[spec])), &Action::Unchanged);
    let other = rule(
        json!({"group": "apps", "kind": "Deployment", "name": "api", "jsonPointers": ["/spec/replicas"]}),
    );
    let near =
        rule(json!({"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/replica"]}));
    for rules in [vec![other], vec![near], vec![]] {
        let plan = plan_with(&rules);
        assert_eq!(
            drift_of(only_step(&plan))[0].to_string(),
            "spec.replicas 8→5 (changed by kube-controller-manager)"
        );
    }
}

#[test]
fn ignore_differences_by_managed_fields_manager() {
    let hpa = rule(json!({
        "group": "apps", "kind": "Deployment",
        "managedFieldsManagers": ["kube-controller-manager"]
    }));
    let live = scaled_by_hpa(8);
    let plan_with = |live: &Value| {
        plan(
            &[manifest(desired_deployment())],
            &diffed(live.clone()),
            std::slice::from_ref(&hpa),
        )
    };
    assert_eq!(only_step(&plan_with(&live)), &Action::Unchanged);
    // Its status writes do not make the whole object ignored: a field it does
    // not own is still drift.
    let mut edited = live.clone();
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:9");
    let plan = plan_with(&edited);
    assert_eq!(
        drift_of(only_step(&plan))
            .iter()
            .map(|d| d.path.as_str())
            .collect::<Vec<_>>(),
        ["spec.template.spec.containers[name=app].image"]
    );
}

#[test]
fn applied_body_leaves_out_what_another_manager_owns() {
    let hpa = rule(json!({
        "group": "apps", "kind": "Deployment",
        "managedFieldsManagers": ["kube-controller-manager"]
    }));
    let desired = manifest(desired_deployment());
    let live = scaled_by_hpa(8);
    let body = applied_body(
        std::slice::from_ref(&hpa),
        &desired.id,
        &desired.body,
        Some(&live),
    );
    assert_eq!(body["spec"].get("replicas"), None);
    // Its status and annotation fields are not Git's: nothing else goes.
    assert_eq!(body["spec"]["template"], desired.body["spec"]["template"]);
    assert_eq!(body["metadata"], desired.body["metadata"]);
    // Not live yet: Git's object whole (the first apply sets replicas).
    let first = applied_body(std::slice::from_ref(&hpa), &desired.id, &desired.body, None);
    assert_eq!(first, desired.body);
}

#[test]
fn applied_body_keeps_the_live_value_of_a_pointer_only_setpoint_owns() {
    let pointer =
        rule(json!({"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/replicas"]}));
    let desired = manifest(desired_deployment());
    // Only Setpoint owns replicas (someone changed the value without taking
    // the field, as a status-less patch cannot): leaving it out would make
    // the API server delete it, so the live value is applied.
    let mut live = live_deployment();
    live["spec"]["replicas"] = json!(3);
    let body = applied_body(
        std::slice::from_ref(&pointer),
        &desired.id,
        &desired.body,
        Some(&live),
    );
    assert_eq!(body["spec"]["replicas"], 3);
    // Owned by the HPA too: left out.
    let body = applied_body(
        std::slice::from_ref(&pointer),
        &desired.id,
        &desired.body,
        Some(&scaled_by_hpa(8)),
    );
    assert_eq!(body["spec"].get("replicas"), None);
    // A rule for another kind changes nothing.
    let other = rule(json!({"group": "", "kind": "ConfigMap", "jsonPointers": ["/spec/replicas"]}));
    let body = applied_body(&[other], &desired.id, &desired.body, Some(&live));
    assert_eq!(body, desired.body);
}

#[test]
fn a_listed_manager_owning_a_map_does_not_cover_its_other_fields() {
    // kube-controller-manager owns the annotations map's existence (`.`)
    // and its revision annotation: a label or annotation Git sets that
    // someone else changed is still drift under its rule.
    let hpa = rule(json!({
        "group": "apps", "kind": "Deployment",
        "managedFieldsManagers": ["kube-controller-manager"]
    }));
    let mut live = live_deployment();
    live["metadata"]["managedFields"][1]["fieldsV1"]["f:metadata"]["f:annotations"]["."] =
        json!({});
    live["metadata"]["annotations"]["setpoint.dev/app"] = json!("other/app");
    let plan = plan(&[manifest(desired_deployment())], &diffed(live), &[hpa]);
    assert_eq!(
        drift_of(only_step(&plan))[0].path,
        r#"metadata.annotations["setpoint.dev/app"]"#
    );
}
