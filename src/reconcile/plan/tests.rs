use serde_json::json;

use super::quantity::Quantity;
use super::*;
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
    let plan = plan(&[manifest(desired_deployment())], &LiveState::default());
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
    let plan = plan(&[desired], &live);
    assert_eq!(only_step(&plan), &Action::Create { deleted_live: true });
}

#[test]
fn server_defaults_are_not_drift() {
    // Extra fields, `protocol: TCP` on ports, `imagePullPolicy`,
    // `terminationMessagePath`, status, canonical quantities
    // (`0.5` → `500m`, `1024Mi` → `1Gi`, `1` → `"1"`), bookkeeping metadata.
    let plan = plan(
        &[manifest(desired_deployment())],
        &live_state(&[live_deployment()]),
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
fn desired_status_and_bookkeeping_are_skipped() {
    let mut desired = desired_deployment();
    desired["status"] = json!({"replicas": 99});
    desired["metadata"]["resourceVersion"] = json!("1");
    desired["metadata"]["uid"] = json!("other");
    desired["metadata"]["generation"] = json!(1);
    desired["metadata"]["creationTimestamp"] = json!(null);
    desired["metadata"]["managedFields"] = json!([]);
    let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
    assert_eq!(only_step(&plan), &Action::Unchanged);
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
    let plan = plan(&[manifest(desired)], &live_state(&[live]));
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
    let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
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
    let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
    assert_eq!(
        only_step(&plan),
        &Action::Update {
            cause: Cause::GitChanged,
            drift: vec![]
        }
    );
}

#[test]
fn git_change_lists_the_fields_it_changes() {
    let mut desired = desired_deployment();
    desired["metadata"]["annotations"][HASH_ANNOTATION] = json!("h2");
    desired["spec"]["template"]["spec"]["containers"][0]["image"] = json!("app:3");
    let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
    let action = only_step(&plan);
    assert!(matches!(
        action,
        Action::Update {
            cause: Cause::GitChanged,
            ..
        }
    ));
    assert_eq!(
        drift_of(action)[0].path,
        "spec.template.spec.containers[name=app].image"
    );
}

#[test]
fn live_without_hash_is_git_changed() {
    let mut live = live_deployment();
    live["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(HASH_ANNOTATION);
    let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
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
    let mut live = live_state(&[live_deployment()]);
    live.owned = [cm("zeta"), desired.id.clone(), cm("alpha")].into();
    let plan = plan(&[desired], &live);
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
    let plan = plan(&[desired], &live);
    assert_eq!(only_step(&plan), &Action::Unchanged);
}

#[test]
fn unowned_live_objects_are_never_pruned() {
    let stranger = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "someone-elses", "namespace": "shop"}});
    let plan = plan(&[], &live_state(&[stranger]));
    assert!(plan.steps.is_empty());
    assert!(plan.is_in_sync());
}

#[test]
fn cpu_half_equals_500m_but_one_is_not_two() {
    let mut desired = desired_deployment();
    desired["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("2");
    let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift.len(), 1, "{drift:?}");
    assert_eq!(
        drift[0].path,
        "spec.template.spec.containers[name=app].resources.limits.cpu"
    );
    assert_eq!(
        drift[0].to_string().split(" (").next().unwrap(),
        "spec.template.spec.containers[name=app].resources.limits.cpu 1→2"
    );
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
    let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
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
    let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift[0].manager, None);
    assert_eq!(
        drift[0].to_string(),
        "metadata.labels.team <none>→a (changed by unknown)"
    );
}

#[test]
fn keys_that_are_not_identifiers_are_quoted() {
    let mut desired = desired_deployment();
    desired["metadata"]["annotations"]["example.com/x"] = json!("yes");
    let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift[0].path, r#"metadata.annotations["example.com/x"]"#);
    assert_eq!(drift[0].live, None);
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
    let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
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
        &live_state(&[live.clone()]),
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
    let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
    assert_eq!(
        drift_of(only_step(&plan))[0].manager.as_deref(),
        Some("kubectl-create")
    );
}

#[test]
fn a_missing_list_item_is_drift_at_its_key() {
    let mut desired = desired_deployment();
    desired["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "sidecar", "image": "proxy:1"}));
    let plan = plan(&[manifest(desired)], &live_state(&[live_deployment()]));
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift.len(), 1);
    assert_eq!(drift[0].path, "spec.template.spec.containers[name=sidecar]");
    assert_eq!(drift[0].live, None);
    assert_eq!(
        drift[0].desired,
        Some(json!({"name": "sidecar", "image": "proxy:1"}))
    );
}

#[test]
fn extra_live_list_items_are_not_drift() {
    let mut live = live_deployment();
    let containers = live["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap();
    containers.insert(0, json!({"name": "injected-proxy", "image": "mesh:1"}));
    let plan = plan(&[manifest(desired_deployment())], &live_state(&[live]));
    assert_eq!(only_step(&plan), &Action::Unchanged);
}

fn service(ports: Value, live_ports: Value) -> (Value, Value) {
    let body = |ports: Value| {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {
                "name": "web", "namespace": "shop", "annotations": {HASH_ANNOTATION: "s1"}
            },
            "spec": {"selector": {"app": "web"}, "ports": ports}
        })
    };
    let mut live = body(live_ports);
    live["spec"]["clusterIP"] = json!("10.96.0.12");
    live["spec"]["type"] = json!("ClusterIP");
    live["spec"]["sessionAffinity"] = json!("None");
    (body(ports), live)
}

#[test]
fn service_ports_match_by_port_and_protocol() {
    let (desired, live) = service(
        json!([
            {"port": 53, "targetPort": 5353},
            {"port": 53, "protocol": "UDP", "targetPort": 5353}
        ]),
        json!([
            {"port": 53, "protocol": "UDP", "targetPort": 5353},
            {"port": 53, "protocol": "TCP", "targetPort": "5353"}
        ]),
    );
    let same = plan(&[manifest(desired.clone())], &live_state(&[live]));
    assert_eq!(only_step(&same), &Action::Unchanged);

    let (_, live) = service(
        json!([]),
        json!([{"port": 53, "protocol": "TCP", "targetPort": 5353}]),
    );
    let plan = plan(&[manifest(desired)], &live_state(&[live]));
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift.len(), 1);
    assert_eq!(drift[0].path, "spec.ports[port=53]");
    assert_eq!(drift[0].live, None);
}

#[test]
fn int_or_string_matches_its_decimal_form_only() {
    let (desired, live) = service(
        json!([{"port": 80, "targetPort": "8080"}]),
        json!([{"port": 80, "protocol": "TCP", "targetPort": 8080}]),
    );
    assert!(plan(&[manifest(desired)], &live_state(&[live])).is_in_sync());
    let (desired, live) = service(
        json!([{"port": 80, "targetPort": "http"}]),
        json!([{"port": 80, "protocol": "TCP", "targetPort": 8080}]),
    );
    let plan = plan(&[manifest(desired)], &live_state(&[live]));
    assert_eq!(
        drift_of(only_step(&plan))[0].to_string(),
        "spec.ports[port=80].targetPort 8080→http (changed by unknown)"
    );
}

fn config_map(data: Value, live_data: Value) -> (Manifest, LiveState) {
    let body = |data: Value| {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "settings", "namespace": "shop", "annotations": {HASH_ANNOTATION: "c1"}
            },
            "data": data
        })
    };
    (manifest(body(data)), live_state(&[body(live_data)]))
}

fn drift_paths(desired: Value, live: Value) -> Vec<String> {
    let (manifest, live) = config_map(desired, live);
    let plan = plan(&[manifest], &live);
    plan.drift().map(|(_, d)| d.path.clone()).collect()
}

#[test]
fn desired_null_means_absent() {
    assert!(drift_paths(json!({"gone": null}), json!({})).is_empty());
    assert!(drift_paths(json!({"gone": null}), json!({"gone": null})).is_empty());
    let (manifest, live) = config_map(json!({"gone": null}), json!({"gone": "back"}));
    let plan = plan(&[manifest], &live);
    let drift = drift_of(only_step(&plan));
    assert_eq!(
        drift[0].to_string(),
        "data.gone back→<none> (changed by unknown)"
    );
}

#[test]
fn empty_maps_and_lists_match_absent_fields() {
    assert!(
        drift_paths(
            json!({"labels": {}, "args": [], "deep": {"x": null}}),
            json!({})
        )
        .is_empty()
    );
    assert_eq!(
        drift_paths(json!({"args": []}), json!({"args": ["-v"]})),
        ["data.args"]
    );
    assert!(drift_paths(json!({"env": []}), json!({"env": [{"name": "X"}]})).is_empty());
    assert_eq!(drift_paths(json!({"m": {"k": 1}}), json!({})), ["data.m"]);
}

#[test]
fn scalar_lists_are_atomic() {
    assert!(drift_paths(json!({"args": ["a", "b"]}), json!({"args": ["a", "b"]})).is_empty());
    assert_eq!(
        drift_paths(json!({"args": ["a", "b"]}), json!({"args": ["b", "a"]})),
        ["data.args"]
    );
    assert_eq!(
        drift_paths(json!({"args": ["a"]}), json!({"args": ["a", "b"]})),
        ["data.args"]
    );
}

#[test]
fn lists_without_a_merge_key_compare_by_position() {
    let rules = json!([{"verbs": ["get"], "resources": ["pods"]}, {"verbs": ["list"]}]);
    let live_rules = json!([
        {"verbs": ["get"], "resources": ["pods"], "apiGroups": [""]},
        {"verbs": ["watch"]}
    ]);
    assert_eq!(
        drift_paths(json!({"rules": rules}), json!({"rules": live_rules})),
        ["data.rules[1].verbs"]
    );
    assert_eq!(
        drift_paths(
            json!({"rules": [{"verbs": ["get"]}]}),
            json!({"rules": [{"verbs": ["get"]}, {}]})
        ),
        ["data.rules"]
    );
}

#[test]
fn numbers_compare_by_value() {
    assert!(drift_paths(json!({"n": 5}), json!({"n": 5.0})).is_empty());
    assert!(drift_paths(json!({"n": 0.1}), json!({"n": 0.1})).is_empty());
    assert_eq!(drift_paths(json!({"n": 5}), json!({"n": 6})), ["data.n"]);
    assert_eq!(
        drift_paths(json!({"n": true}), json!({"n": "true"})),
        ["data.n"]
    );
    // Quantities only count inside resource fields.
    assert_eq!(
        drift_paths(json!({"n": "1k"}), json!({"n": "1000"})),
        ["data.n"]
    );
    assert!(
        drift_paths(
            json!({"hard": {"pods": "1k"}}),
            json!({"hard": {"pods": "1000"}})
        )
        .is_empty()
    );
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
    let plan = plan(&[a, b], &LiveState::default());
    let names: Vec<&str> = plan.steps.iter().map(|s| s.id.name.as_str()).collect();
    assert_eq!(names, ["b", "a"]);
    assert_eq!(plan.creates(), 2);
}

#[test]
fn quantities_parse_exactly() {
    let q = |s: &str| Quantity::parse(s).unwrap_or_else(|| panic!("{s} should parse"));
    let same = |a: &str, b: &str| q(a).same_value(q(b));
    assert!(same("500m", "0.5"));
    assert!(same("1Gi", "1024Mi"));
    assert!(same("1000", "1k"));
    assert!(same("1e3", "1k"));
    assert!(same("1E3", "1000"));
    assert!(same("1Ki", "1024"));
    assert!(same("0.5Ki", "512"));
    assert!(same("1.5Gi", "1536Mi"));
    assert!(same("100n", "0.1u"));
    assert!(same("1M", "1e6"));
    assert!(same("0", "0Gi"));
    assert!(same("+1", "1"));
    assert!(same("-1m", "-0.001"));
    assert!(same("1.", ".1e1"));
    assert!(same("1Ei", "1152921504606846976"));
    assert!(!same("1G", "1Gi"));
    assert!(!same("1", "2"));
    assert!(!same("1m", "1"));
    assert!(!same("-1", "1"));
    for bad in ["", "m", "1x", "1Kb", "1.2.3", "e3", "1e", "--1", "1 Gi"] {
        assert_eq!(Quantity::parse(bad), None, "{bad}");
    }
    assert!(q("1e-1000").mantissa == 1);
    assert_eq!(Quantity::parse("1e5000"), None);
}

#[test]
fn positional_items_are_attributed_by_index() {
    let (manifest, mut live) = config_map(json!({"rules": [{"verbs": ["get"]}]}), json!({}));
    let live_object = live.objects.values_mut().next().unwrap();
    live_object["data"] = json!({"rules": [{"verbs": ["delete"]}]});
    live_object["metadata"]["managedFields"] = json!([{
        "manager": "rbac-tool", "operation": "Update", "time": "2026-05-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:data": {"f:rules": {"i:0": {"f:verbs": {}}}}}
    }]);
    let plan = plan(&[manifest], &live);
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift[0].path, "data.rules[0].verbs");
    assert_eq!(drift[0].manager.as_deref(), Some("rbac-tool"));
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
fn secret_string_data_compares_with_live_data() {
    let desired = secret(json!({"stringData": {"password": "hunter2"}, "data": {"user": "YWRt"}}));
    let live = secret(json!({"data": {"password": "aHVudGVyMg==", "user": "YWRt"}}));
    let same = plan(&[manifest(desired.clone())], &live_state(&[live]));
    assert_eq!(only_step(&same), &Action::Unchanged);

    let changed = secret(json!({"data": {"password": "b3RoZXI=", "user": "YWRt"}}));
    let plan = plan(&[manifest(desired)], &live_state(&[changed]));
    let drift = drift_of(only_step(&plan));
    assert_eq!(drift.len(), 1);
    assert_eq!(
        drift[0].to_string(),
        "data.password <redacted>→<redacted> (changed by unknown)"
    );
}

#[test]
fn base64_matches_the_standard_alphabet() {
    let cases = [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("hello", "aGVsbG8="),
    ];
    for (plain, encoded) in cases {
        assert_eq!(base64(plain.as_bytes()), encoded);
    }
    assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
}
