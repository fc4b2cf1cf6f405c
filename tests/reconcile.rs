//! The reconcile engine against the real local control plane and real Git
//! repositories: sync, drift correction, Git changes, prune, bad input, CRDs,
//! idempotence, and `setpoint diff`.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, ResourceExt};
use setpoint::api::{ConditionStatus, ConditionType, Health, Sync};
use setpoint::reconcile::{Request, reconcile};
use support::app::{
    automated, context, create_app, event_notes, get_app, install_crd, reconcile_app,
};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);

fn deployment_yaml(name: &str, replicas: u32, image: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
      - name: app
        image: {image}
        ports:
        - containerPort: 8080
        resources:
          requests: {{cpu: 0.1, memory: 64Mi}}
"
    )
}

fn configmap_yaml(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: \"{value}\"\n"
    )
}

async fn running_pods(ns: &TestNamespace, app: &str) -> Result<usize, String> {
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map_err(|e| e.to_string())?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count())
}

/// Reconciles (as the worker does on each event) until the Application is
/// Synced and Healthy at `revision`.
async fn reconcile_until_healthy(
    ctx: &setpoint::context::Context,
    ns: &TestNamespace,
    name: &str,
    revision: &str,
) {
    wait_for(
        &format!("{name} Synced and Healthy at {revision}"),
        DEADLINE,
        || async {
            let outcome = reconcile_app(ctx, ns, name, &Request::default())
                .await
                .map_err(|e| format!("reconcile failed: {e}"))?;
            let status = &outcome.status;
            if status.sync.status == Sync::Synced
                && status.health.status == Health::Healthy
                && status.sync.revision.as_deref() == Some(revision)
            {
                Ok(())
            } else {
                Err(format!(
                    "{:?} {:?} {:?} at {:?}",
                    status.sync.status,
                    status.health.status,
                    status.health.message,
                    status.sync.revision
                ))
            }
        },
    )
    .await
}

#[tokio::test]
async fn canonical_case_syncs_five_replicas_and_corrects_a_scale_down() {
    let ns = TestNamespace::new("canonical").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write("apps/web/deploy.yaml", &deployment_yaml("web", 5, "app:1"))
        .commit("web");
    create_app(&ns, "web", &repo.url(), "apps/web", automated(true, true)).await;

    let first = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect("first sync");
    assert_eq!(first.applied.len(), 1, "the Deployment was applied");
    reconcile_until_healthy(&ctx, &ns, "web", &commit).await;
    assert_eq!(running_pods(&ns, "web").await.unwrap(), 5);
    let app = get_app(&ns, "web").await;
    let status = app.status.unwrap();
    assert_eq!(
        status.last_applied_revision.as_deref(),
        Some(commit.as_str())
    );
    assert_eq!(status.resources.len(), 1);
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready)
        .unwrap();
    assert_eq!(ready.status, ConditionStatus::True);

    // `kubectl scale --replicas=1`: the scale subresource, manager kubectl.
    let deployments = ns.api::<Deployment>();
    let scale = PatchParams {
        field_manager: Some("kubectl".into()),
        ..Default::default()
    };
    deployments
        .patch_scale(
            "web",
            &scale,
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();

    let outcome = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect("heal");
    assert_eq!(
        outcome.applied.len(),
        1,
        "the drifted Deployment was re-applied"
    );
    let live = deployments.get("web").await.unwrap();
    assert_eq!(live.spec.replicas, Some(5));
    let notes = event_notes(&ns, "web", "DriftCorrected").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("spec.replicas 1→5 (changed by kubectl)")),
        "DriftCorrected events: {notes:?}"
    );
    wait_for("5 pods Running again", DEADLINE, || async {
        match running_pods(&ns, "web").await? {
            5 => Ok(()),
            n => Err(format!("{n} Running")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_new_commit_updates_the_image_and_the_revision() {
    let ns = TestNamespace::new("image").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let first = repo
        .write("deploy/web.yaml", &deployment_yaml("web", 1, "app:1"))
        .commit("v1");
    create_app(&ns, "web", &repo.url(), "deploy", automated(true, true)).await;
    reconcile_until_healthy(&ctx, &ns, "web", &first).await;

    let second = repo
        .write("deploy/web.yaml", &deployment_yaml("web", 1, "app:2"))
        .commit("v2");
    let outcome = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .unwrap();
    assert_eq!(outcome.revision.as_deref(), Some(second.as_str()));
    let live = ns.api::<Deployment>().get("web").await.unwrap();
    let image = live.spec.template.spec.unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some("app:2"));
    assert_eq!(
        get_app(&ns, "web")
            .await
            .status
            .unwrap()
            .sync
            .revision
            .as_deref(),
        Some(second.as_str())
    );
    reconcile_until_healthy(&ctx, &ns, "web", &second).await;
}

#[tokio::test]
async fn a_file_removed_from_git_is_pruned_only_with_prune_on() {
    let ns = TestNamespace::new("prune").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    for app in ["pruning", "keeping"] {
        repo.write(
            &format!("{app}/a.yaml"),
            &configmap_yaml(&format!("{app}-a"), "1"),
        );
        repo.write(
            &format!("{app}/b.yaml"),
            &configmap_yaml(&format!("{app}-b"), "1"),
        );
    }
    repo.commit("two config maps each");
    create_app(
        &ns,
        "pruning",
        &repo.url(),
        "pruning",
        automated(true, true),
    )
    .await;
    create_app(
        &ns,
        "keeping",
        &repo.url(),
        "keeping",
        automated(false, true),
    )
    .await;
    for app in ["pruning", "keeping"] {
        reconcile_app(&ctx, &ns, app, &Request::default())
            .await
            .unwrap();
    }
    let config_maps = ns.api::<ConfigMap>();
    // An object nobody declared, in the same namespace: never touched.
    config_maps
        .create(
            &Default::default(),
            &serde_yaml::from_str(&configmap_yaml("bystander", "1")).unwrap(),
        )
        .await
        .unwrap();

    repo.remove("pruning/b.yaml")
        .remove("keeping/b.yaml")
        .commit("drop b");
    let pruning = reconcile_app(&ctx, &ns, "pruning", &Request::default())
        .await
        .unwrap();
    assert_eq!(pruning.pruned.len(), 1);
    assert_eq!(pruning.pruned[0].name, "pruning-b");
    wait_for("pruning-b deleted", DEADLINE, || async {
        match config_maps
            .get_opt("pruning-b")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
    assert_eq!(pruning.status.sync.status, Sync::Synced);

    let keeping = reconcile_app(&ctx, &ns, "keeping", &Request::default())
        .await
        .unwrap();
    assert!(keeping.pruned.is_empty());
    assert!(
        config_maps.get_opt("keeping-b").await.unwrap().is_some(),
        "prune off: it stays"
    );
    assert_eq!(keeping.status.sync.status, Sync::OutOfSync);
    let reported = keeping
        .status
        .resources
        .iter()
        .find(|r| r.name == "keeping-b")
        .unwrap();
    assert_eq!(reported.sync, Sync::OutOfSync);
    assert!(
        reported.message.as_deref().unwrap().contains("not in Git"),
        "{reported:?}"
    );
    assert!(config_maps.get_opt("bystander").await.unwrap().is_some());
}

#[tokio::test]
async fn an_object_labelled_for_the_app_that_no_status_recorded_is_pruned_by_a_manual_sync() {
    // A reconcile applied it, its status write was lost, and Git dropped it
    // since: reconciles read the status's inventory (a GET per object, of
    // constant cost however many objects share the namespace) and do not
    // see it; a manual sync reads by label and prunes it.
    let ns = TestNamespace::new("inventory").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write("app/a.yaml", &configmap_yaml("a", "1"));
    repo.commit("one config map");
    create_app(&ns, "web", &repo.url(), "app", automated(true, true)).await;
    let first = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .unwrap();
    assert_eq!(first.status.sync.status, Sync::Synced);
    let config_maps = ns.api::<ConfigMap>();
    let mut stray: ConfigMap = serde_yaml::from_str(&configmap_yaml("stray", "1")).unwrap();
    stray.metadata.labels = Some([("setpoint.dev/app".into(), format!("{}.web", ns.name))].into());
    stray.metadata.annotations =
        Some([("setpoint.dev/app".into(), format!("{}/web", ns.name))].into());
    config_maps
        .create(&Default::default(), &stray)
        .await
        .unwrap();

    let automatic = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .unwrap();
    assert!(automatic.pruned.is_empty(), "{:?}", automatic.pruned);
    assert!(config_maps.get_opt("stray").await.unwrap().is_some());

    let manual = Request {
        manual: true,
        ..Default::default()
    };
    let synced = reconcile_app(&ctx, &ns, "web", &manual).await.unwrap();
    assert_eq!(
        synced
            .pruned
            .iter()
            .map(|id| id.name.as_str())
            .collect::<Vec<_>>(),
        ["stray"]
    );
    wait_for("stray deleted", DEADLINE, || async {
        match config_maps
            .get_opt("stray")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
    assert!(config_maps.get_opt("a").await.unwrap().is_some());
}

#[tokio::test]
async fn broken_yaml_stalls_touches_nothing_and_the_fix_syncs() {
    let ns = TestNamespace::new("broken").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let good = repo
        .write("app/cm.yaml", &configmap_yaml("settings", "1"))
        .commit("good");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    reconcile_until_healthy(&ctx, &ns, "app", &good).await;
    let before = ns.api::<ConfigMap>().get("settings").await.unwrap();

    repo.write("app/cm.yaml", &configmap_yaml("settings", "2"))
        .write(
            "app/broken.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n   labels: {a: b}\n",
        )
        .commit("broken");
    let error = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .unwrap_err();
    assert!(!error.is_transient(), "bad YAML waits for a fix: {error}");
    let status = get_app(&ns, "app").await.status.unwrap();
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Stalled)
        .unwrap();
    assert_eq!(stalled.status, ConditionStatus::True);
    assert_eq!(stalled.reason, "InvalidManifest");
    assert!(
        stalled
            .message
            .contains("app/broken.yaml: document 0, line 5"),
        "{}",
        stalled.message
    );
    let after = ns.api::<ConfigMap>().get("settings").await.unwrap();
    assert_eq!(
        before.resource_version(),
        after.resource_version(),
        "live objects untouched"
    );
    assert!(
        event_notes(&ns, "app", "InvalidManifest")
            .await
            .iter()
            .any(|n| n.contains("line 5"))
    );

    let fixed = repo.remove("app/broken.yaml").commit("fix");
    reconcile_until_healthy(&ctx, &ns, "app", &fixed).await;
    let data = ns
        .api::<ConfigMap>()
        .get("settings")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(data["key"], "2");
}

#[tokio::test]
async fn an_unknown_kind_and_a_missing_path_are_conditions() {
    let ns = TestNamespace::new("badinput").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write(
        "app/x.yaml",
        "apiVersion: nowhere.example.com/v1\nkind: Gadget\nmetadata:\n  name: g\n",
    )
    .commit("unknown kind");
    create_app(&ns, "unknown", &repo.url(), "app", automated(true, true)).await;
    create_app(
        &ns,
        "nopath",
        &repo.url(),
        "missing/dir",
        automated(true, true),
    )
    .await;

    let error = reconcile_app(&ctx, &ns, "unknown", &Request::default())
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "UnknownKind");
    let ready = get_app(&ns, "unknown").await.status.unwrap().conditions;
    let ready = ready
        .iter()
        .find(|c| c.type_ == ConditionType::Ready)
        .unwrap();
    assert!(
        ready
            .message
            .contains("unknown kind Gadget in nowhere.example.com/v1"),
        "{}",
        ready.message
    );
    assert!(ready.message.contains("app/x.yaml"), "{}", ready.message);

    let error = reconcile_app(&ctx, &ns, "nopath", &Request::default())
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "PathNotFound");
    assert!(!error.is_transient());
}

/// A namespaced `Widget` kind in `group`, and one instance `w1` of it.
fn widget_crd_and_instance(group: &str) -> (String, String) {
    let crd = format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget}}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {{type: integer}}
"
    );
    let widget =
        format!("apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n");
    (crd, widget)
}

#[tokio::test]
async fn a_crd_and_its_instance_in_one_commit_sync_in_one_reconcile() {
    let ns = TestNamespace::new("crd").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let group = format!("{}.example.com", support::unique_name("w").replace('-', ""));
    let (crd, widget) = widget_crd_and_instance(&group);
    let repo = GitRepo::new();
    repo.write("app/widget.yaml", &widget)
        .write("app/crd.yaml", &crd)
        .commit("crd and widget");
    create_app(&ns, "widgets", &repo.url(), "app", automated(true, true)).await;

    let outcome = reconcile_app(&ctx, &ns, "widgets", &Request::default())
        .await
        .expect("one reconcile");
    assert_eq!(outcome.applied.len(), 2);
    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), &ns.name, &ApiResource::from_gvk(&gvk));
    let live = widgets.get("w1").await.expect("the instance exists");
    assert_eq!(live.data["spec"]["size"], 3);
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(ns.client.clone());
    let _ = crds
        .delete(&format!("widgets.{group}"), &Default::default())
        .await;
}

#[tokio::test]
async fn a_crd_being_deleted_fails_the_sync_and_nothing_is_applied() {
    let ns = TestNamespace::new("crd-deleting").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let group = format!("{}.example.com", support::unique_name("d").replace('-', ""));
    let name = format!("widgets.{group}");
    let (crd_yaml, widget) = widget_crd_and_instance(&group);

    // The CRD exists, held by a finalizer of the test's, and is deleted: it
    // stays, terminating.
    let crds: Api<CustomResourceDefinition> = Api::all(ns.client.clone());
    let mut crd: CustomResourceDefinition = serde_yaml::from_str(&crd_yaml).unwrap();
    crd.metadata.finalizers = Some(vec![HOLD.into()]);
    crds.create(&PostParams::default(), &crd).await.unwrap();
    crds.delete(&name, &DeleteParams::default()).await.unwrap();
    wait_for("the CRD to be terminating", DEADLINE, || async {
        let live = crds.get(&name).await.map_err(|e| e.to_string())?;
        match live.metadata.deletion_timestamp {
            Some(_) => Ok(()),
            None => Err("no deletionTimestamp yet".into()),
        }
    })
    .await;

    let repo = GitRepo::new();
    repo.write("app/crd.yaml", &crd_yaml)
        .write("app/widget.yaml", &widget)
        .commit("crd and widget");
    create_app(&ns, "widgets", &repo.url(), "app", automated(true, true)).await;
    let result = reconcile_app(&ctx, &ns, "widgets", &Request::default()).await;
    let status = get_app(&ns, "widgets").await.status.unwrap_or_default();
    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), &ns.name, &ApiResource::from_gvk(&gvk));
    let instance = widgets.get_opt("w1").await;
    // Let the deletion finish before asserting, so a failure leaves nothing.
    let _ = crds
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;

    let error = result.expect_err("the sync fails");
    assert_eq!(error.reason(), "CrdTerminating", "{error}");
    let expected = format!("CustomResourceDefinition {name} is being deleted");
    assert!(error.to_string().contains(&expected), "{error}");
    assert!(error.to_string().contains(HOLD), "{error}");
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready)
        .expect("a Ready condition");
    assert_eq!(ready.status, ConditionStatus::False);
    assert_eq!(ready.reason, "CrdTerminating");
    assert!(ready.message.contains(&expected), "{}", ready.message);
    // Nothing reported applied, nothing assessed, nothing created.
    assert!(status.operation.is_none(), "{:?}", status.operation);
    assert!(status.resources.is_empty(), "{:?}", status.resources);
    assert_eq!(status.health.status, Health::Unknown);
    assert!(
        matches!(instance, Ok(None)),
        "the instance was created: {instance:?}"
    );
}

/// A finalizer no controller removes: holds a CRD in its deletion.
const HOLD: &str = "setpoint.dev/test-hold";

#[tokio::test]
async fn a_second_reconcile_of_an_in_sync_app_makes_zero_writes() {
    let ns = TestNamespace::new("idempotent").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write("app/cm.yaml", &configmap_yaml("settings", "1"))
        .write("app/deploy.yaml", &deployment_yaml("web", 2, "app:1"))
        .commit("app");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    reconcile_until_healthy(&ctx, &ns, "app", &commit).await;

    let app = get_app(&ns, "app").await;
    let before = ctx.requests.get();
    let outcome = setpoint::reconcile::reconcile(&ctx, &app, &Request::default())
        .await
        .unwrap();
    let used = ctx.requests.get() - before;
    assert!(outcome.in_sync(), "{:?}", outcome.plan);
    assert!(!outcome.status_written);
    assert_eq!(
        used.writes, 0,
        "an in-sync reconcile writes nothing ({used:?})"
    );
    assert!(used.reads > 0, "it did read the live state ({used:?})");
}

#[tokio::test]
async fn self_heal_off_reports_drift_and_leaves_it() {
    let ns = TestNamespace::new("noheal").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write("app/cm.yaml", &configmap_yaml("settings", "from-git"))
        .commit("cm");
    create_app(&ns, "app", &repo.url(), "app", automated(false, false)).await;
    reconcile_until_healthy(&ctx, &ns, "app", &commit).await;

    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    ns.api::<ConfigMap>()
        .patch(
            "settings",
            &edit,
            &Patch::Merge(serde_json::json!({"data": {"key": "by-hand"}})),
        )
        .await
        .unwrap();
    let outcome = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .unwrap();
    assert!(outcome.applied.is_empty());
    assert_eq!(outcome.status.sync.status, Sync::OutOfSync);
    let message = outcome.status.resources[0].message.clone().unwrap();
    assert!(
        message.contains("data.key from-git→by-hand")
            || message.contains("data.key by-hand→from-git"),
        "{message}"
    );
    assert!(message.contains("kubectl-edit"), "{message}");
    let data = ns
        .api::<ConfigMap>()
        .get("settings")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(data["key"], "by-hand", "left alone");

    // Someone asks for a sync: corrected.
    let synced = reconcile_app(
        &ctx,
        &ns,
        "app",
        &Request {
            manual: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(synced.applied.len(), 1);
    let data = ns
        .api::<ConfigMap>()
        .get("settings")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(data["key"], "from-git");
}

#[tokio::test]
async fn setpoint_diff_exits_1_on_drift_and_0_in_sync() {
    let ns = TestNamespace::new("diff").await;
    install_crd(&ns.client).await;
    let (ctx, cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write("app/cm.yaml", &configmap_yaml("settings", "from-git"))
        .commit("cm");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    reconcile_until_healthy(&ctx, &ns, "app", &commit).await;

    let diff = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
            .args(["diff", &format!("{}/app", ns.name)])
            .env("KUBECONFIG", support::kubeconfig_path())
            .env("SETPOINT_ALLOW_LOCAL_REPOS", "true")
            .env("SETPOINT_ADMIN_NAMESPACES", "*")
            .env("SETPOINT_CACHE_DIR", cache.path())
            .output()
            .expect("run setpoint diff");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (code, output) = diff();
    assert_eq!(code, Some(0), "in sync: {output}");
    assert!(output.contains("unchanged"), "{output}");

    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    ns.api::<ConfigMap>()
        .patch(
            "settings",
            &edit,
            &Patch::Merge(serde_json::json!({"data": {"key": "by-hand"}})),
        )
        .await
        .unwrap();
    let (code, output) = diff();
    assert_eq!(code, Some(1), "drift: {output}");
    assert!(
        output.contains("data.key by-hand→from-git (changed by kubectl-edit)"),
        "{output}"
    );
    let live = ns
        .api::<ConfigMap>()
        .get("settings")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(live["key"], "by-hand", "diff changes nothing");
}

#[tokio::test]
async fn a_reconcile_from_a_stale_read_keeps_what_another_wrote_since() {
    let ns = TestNamespace::new("stale").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let first = repo
        .write("app/cm.yaml", &configmap_yaml("settings", "1"))
        .commit("one");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    // A second writer (a manual sync, another process) read the
    // Application before anything was synced, and is slow.
    let stale = get_app(&ns, "app").await;
    reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .unwrap();
    let second = repo
        .write("app/cm.yaml", &configmap_yaml("settings", "2"))
        .commit("two");
    // A change in the cluster for the slow writer's own operation to record.
    let cms: Api<ConfigMap> = ns.api();
    cms.delete("settings", &Default::default()).await.unwrap();
    reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .unwrap();
    let history = |app: &setpoint::api::Application| -> Vec<String> {
        let status = app.status.clone().unwrap_or_default();
        status.history.iter().map(|h| h.revision.clone()).collect()
    };
    assert_eq!(
        history(&get_app(&ns, "app").await),
        [second.clone(), first.clone()]
    );

    // The slow writer finds the ConfigMap deleted again, recreates it and
    // writes a status built on what it read, which knows neither sync: the
    // API server refuses that write, and the status is built again on the
    // Application as it is now, its own operation added on top.
    cms.delete("settings", &Default::default()).await.unwrap();
    let outcome = setpoint::reconcile::reconcile(&ctx, &stale, &Request::default())
        .await
        .unwrap();
    assert_eq!(outcome.applied.len(), 1, "{:?}", outcome.plan);
    assert!(outcome.status_written);
    let now = get_app(&ns, "app").await;
    assert_eq!(
        history(&now),
        [second.clone(), second.clone(), first.clone()]
    );
    assert_eq!(now.status.as_ref().unwrap().sync.status, Sync::Synced);
    assert_eq!(outcome.status, now.status.unwrap());
}

/// An Application with the resources finalizer (Argo CD's name, or
/// Setpoint's) takes its objects with it when deleted; one without leaves
/// them, as in Argo CD.
#[tokio::test]
async fn deleting_an_application_with_the_resources_finalizer_deletes_its_objects() {
    let ns = TestNamespace::new("finalizer").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write("with/cm.yaml", &configmap_yaml("with-finalizer", "a"))
        .write("without/cm.yaml", &configmap_yaml("without-finalizer", "a"));
    repo.commit("two apps");
    let apps = ns.api::<setpoint::api::Application>();
    for (app, path, finalizer) in [
        (
            "with",
            "with",
            Some(setpoint::reconcile::finalize::ARGO_CD_FINALIZER),
        ),
        ("without", "without", None),
    ] {
        create_app(&ns, app, &repo.url(), path, automated(true, false)).await;
        if let Some(finalizer) = finalizer {
            apps.patch(
                app,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": [finalizer]}})),
            )
            .await
            .unwrap();
        }
        reconcile_app(&ctx, &ns, app, &Request::default())
            .await
            .unwrap();
    }
    let configmaps = ns.api::<ConfigMap>();
    assert!(
        configmaps
            .get_opt("with-finalizer")
            .await
            .unwrap()
            .is_some()
    );
    for app in ["with", "without"] {
        apps.delete(app, &DeleteParams::default()).await.unwrap();
    }
    // Held by its finalizer until a reconcile deletes its objects.
    let held = get_app(&ns, "with").await;
    assert!(held.metadata.deletion_timestamp.is_some());
    let outcome = reconcile(&ctx, &held, &Request::default()).await.unwrap();
    assert_eq!(outcome.pruned.len(), 1, "{:?}", outcome.pruned);
    wait_for("the Application gone", DEADLINE, || async {
        match apps.get_opt("with").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(app) => Err(format!("finalizers {:?}", app.metadata.finalizers)),
        }
    })
    .await;
    assert!(
        configmaps
            .get_opt("with-finalizer")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        configmaps
            .get_opt("without-finalizer")
            .await
            .unwrap()
            .is_some(),
        "without the finalizer the objects stay"
    );
}
