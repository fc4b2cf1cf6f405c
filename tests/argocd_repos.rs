//! Repositories written for Argo CD, unchanged: its wave, hook and sync
//! option annotations, hooks named by `generateName`, Helm's hooks, against
//! the real control plane (kwok completes the pods of Jobs, so hook Jobs
//! finish) and real git repositories.

mod support;

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use setpoint::api::{
    Application, Health, HelmSource, HookPhase, HookState, RunPhase, Source, Sync, SyncPolicy,
};
use setpoint::reconcile::{Outcome, Request, reconcile};
use support::app::{
    automated, context, create_app, create_app_from, get_app, install_crd, reconcile_app,
};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(120);
const SECRET: &str = "argo-hooks-secret";

fn job(metadata: &str) -> String {
    format!(
        "apiVersion: batch/v1
kind: Job
metadata:
{metadata}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: run
        image: migrate:1
"
    )
}

fn deployment(image: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  annotations:
    argocd.argoproj.io/sync-wave: \"1\"
spec:
  replicas: 1
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      containers:
      - name: web
        image: {image}
"
    )
}

fn configmap(name: &str, annotations: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  annotations: {{{annotations}}}\ndata:\n  key: value\n"
    )
}

async fn job_names(ns: &TestNamespace, prefix: &str) -> Vec<String> {
    ns.api::<Job>()
        .list(&ListParams::default())
        .await
        .expect("list jobs")
        .items
        .into_iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .filter_map(|j| j.metadata.name)
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// The Application Synced and Healthy at `revision` with its sync run
/// Succeeded.
fn run_succeeded(app: &Application, revision: &str) -> Result<(), String> {
    let status = app.status.as_ref().ok_or("no status")?;
    let run = status.sync_run.as_ref().ok_or("no sync run")?;
    if status.sync.status == Sync::Synced
        && status.health.status == Health::Healthy
        && run.revision == revision
        && run.phase == RunPhase::Succeeded
    {
        Ok(())
    } else {
        Err(format!(
            "{:?}/{:?} run {:?} at {}: {:?}; {:?}",
            status.sync.status,
            status.health.status,
            run.phase,
            run.revision,
            run.message,
            status.conditions
        ))
    }
}

/// Argo CD's example shape: a PreSync migration Job and a PostSync smoke
/// test Job named by `generateName`, objects in waves -1 and 1, a `Skip`
/// object. `setpoint run` syncs it as Argo CD does: PreSync first, then the
/// waves in order, then PostSync; the PostSync Job is deleted once it
/// succeeded (`HookSucceeded`); each new revision runs a new migration Job
/// and deletes the previous one (`BeforeHookCreation`).
#[tokio::test]
async fn an_argo_cd_repository_with_generated_hooks_and_waves_syncs_as_argo_cd_syncs_it() {
    let ns = TestNamespace::new("argo-hooks").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write(
        "app/pre.yaml",
        &job("  generateName: migrate-
  annotations:
    argocd.argoproj.io/hook: PreSync
    argocd.argoproj.io/hook-delete-policy: BeforeHookCreation"),
    )
    .write(
        "app/post.yaml",
        &job("  generateName: smoke-
  annotations:
    argocd.argoproj.io/hook: PostSync
    argocd.argoproj.io/hook-delete-policy: HookSucceeded"),
    )
    .write(
        "app/config.yaml",
        &configmap("config", "argocd.argoproj.io/sync-wave: \"-1\""),
    )
    .write("app/web.yaml", &deployment("web:1"))
    .write(
        "app/skipped.yaml",
        &configmap("skipped", "argocd.argoproj.io/hook: Skip"),
    );
    let first = repo.commit("an Argo CD app");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let setpoint = Setpoint::scoped(
        &ns.name,
        &["run", "--listen", &listen, "--github-secret", SECRET],
        &[],
        cache.path(),
    );

    let app = wait_for("the first sync run succeeded", DEADLINE, || async {
        let app = get_app(&ns, "app").await;
        run_succeeded(&app, &first)
            .map(|_| app)
            .map_err(|e| format!("{e}\n{}", setpoint.logs()))
    })
    .await;
    let run = app.status.unwrap().sync_run.unwrap();
    let hooks: Vec<(HookPhase, &str, HookState)> = run
        .hooks
        .iter()
        .map(|h| (h.phase, h.name.as_str(), h.state))
        .collect();
    assert_eq!(hooks.len(), 2, "{hooks:?}");
    assert_eq!(hooks[0].0, HookPhase::PreSync);
    assert!(
        hooks[0].1.starts_with("migrate-") && hooks[0].1.len() == 13,
        "{hooks:?}"
    );
    assert_eq!(hooks[1].0, HookPhase::PostSync);
    assert!(hooks[1].1.starts_with("smoke-"), "{hooks:?}");
    assert!(
        hooks.iter().all(|h| h.2 == HookState::Succeeded),
        "{hooks:?}"
    );
    let waves: Vec<i32> = run.waves.iter().map(|w| w.wave).collect();
    assert_eq!(waves, [-1, 1], "{run:?}");
    // PreSync finished before the first wave began; PostSync began after the last.
    let ms = |t: &str| t.parse::<jiff::Timestamp>().unwrap();
    let pre_done = ms(&run.hooks[0].started_at)
        + jiff::SignedDuration::from_millis(run.hooks[0].duration_ms.unwrap());
    assert!(pre_done <= ms(&run.waves[0].started_at), "{run:?}");
    assert!(
        ms(&run.hooks[1].started_at) >= ms(&run.waves[1].started_at),
        "{run:?}"
    );
    // The migration Job stays until the next run; the smoke test is deleted.
    let migrate = hooks[0].1.to_string();
    assert_eq!(job_names(&ns, "migrate-").await, vec![migrate.clone()]);
    wait_for("the PostSync Job deleted", DEADLINE, || async {
        let left = job_names(&ns, "smoke-").await;
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("skipped")
            .await
            .unwrap()
            .is_none(),
        "a Skip hook is never applied"
    );

    // A new revision: a new migration Job, the earlier one deleted first.
    repo.write("app/web.yaml", &deployment("web:2"));
    let second = repo.commit("web 2");
    let (code, answer) = post_github(
        setpoint.port.unwrap(),
        Some(SECRET),
        "argo-hooks-push",
        &github_push(&repo.url(), &second, &["app/web.yaml"]),
    );
    assert_eq!(code, 200, "{answer}");
    let app = wait_for("the second sync run succeeded", DEADLINE, || async {
        let app = get_app(&ns, "app").await;
        run_succeeded(&app, &second)
            .map(|_| app)
            .map_err(|e| format!("{e}\n{}", setpoint.logs()))
    })
    .await;
    let run = app.status.unwrap().sync_run.unwrap();
    let again = run.hooks[0].name.clone();
    assert!(again.starts_with("migrate-") && again != migrate, "{again}");
    wait_for("only the new migration Job left", DEADLINE, || async {
        let left = job_names(&ns, "migrate-").await;
        if left == [again.clone()] {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
}

/// A Helm chart's hooks, mapped as Argo CD maps them: `pre-install` runs
/// before the objects in `hook-weight` order, `hook-succeeded` deletes the
/// Jobs after, a `test` hook is never run.
#[tokio::test]
async fn helm_hooks_run_in_weight_order_and_are_deleted_by_policy() {
    let ns = TestNamespace::new("helm-hooks").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let hook = |name: &str, weight: &str| {
        job(&format!(
            "  name: {{{{ .Release.Name }}}}-{name}
  annotations:
    \"helm.sh/hook\": pre-install,pre-upgrade
    \"helm.sh/hook-weight\": \"{weight}\"
    \"helm.sh/hook-delete-policy\": before-hook-creation,hook-succeeded"
        ))
    };
    repo.write(
        "chart/Chart.yaml",
        "apiVersion: v2\nname: hooked\nversion: 0.1.0\n",
    )
    .write("chart/templates/seed.yaml", &hook("seed", "5"))
    .write("chart/templates/migrate.yaml", &hook("migrate", "-5"))
    .write(
        "chart/templates/test.yaml",
        "apiVersion: v1
kind: Pod
metadata:
  name: {{ .Release.Name }}-test
  annotations:
    \"helm.sh/hook\": test
spec:
  restartPolicy: Never
  containers:
  - name: t
    image: test:1
",
    )
    .write(
        "chart/templates/config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-config\ndata:\n  k: v\n",
    );
    let revision = repo.commit("a chart with hooks");
    let source = Source {
        repo_url: repo.url(),
        path: Some("chart".into()),
        helm: Some(HelmSource::default()),
        ..Default::default()
    };
    create_app_from(&ns, "rel", source, automated(true, true)).await;
    let outcome = wait_for("the chart's sync run succeeded", DEADLINE, || async {
        let outcome = reconcile_app(&ctx, &ns, "rel", &Request::default())
            .await
            .map_err(|e| format!("reconcile failed: {e}"))?;
        let app = get_app(&ns, "rel").await;
        run_succeeded(&app, &revision).map(|_| outcome)
    })
    .await;
    let run = outcome.status.sync_run.clone().unwrap();
    let names: Vec<&str> = run.hooks.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["rel-migrate", "rel-seed"], "{run:?}");
    let ms = |t: &str| t.parse::<jiff::Timestamp>().unwrap();
    let migrate_done = ms(&run.hooks[0].started_at)
        + jiff::SignedDuration::from_millis(run.hooks[0].duration_ms.unwrap());
    assert!(
        migrate_done <= ms(&run.hooks[1].started_at),
        "weight -5 finished before weight 5 began: {run:?}"
    );
    assert!(run.hooks.iter().all(|h| h.phase == HookPhase::PreSync));
    wait_for(
        "both hook Jobs deleted (hook-succeeded)",
        DEADLINE,
        || async {
            let left = job_names(&ns, "rel-").await;
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    )
    .await;
    assert!(ns.api::<Pod>().get_opt("rel-test").await.unwrap().is_none());
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("rel-config")
            .await
            .unwrap()
            .is_some()
    );
}

fn resource<'a>(outcome: &'a Outcome, name: &str) -> &'a setpoint::api::ResourceStatus {
    outcome
        .status
        .resources
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("{name} not listed: {:?}", outcome.status.resources))
}

/// `Prune=false` objects survive a prune (and keep the Application
/// OutOfSync, as in Argo CD); an `IgnoreExtraneous` one does not count;
/// `Delete=false` outlives the Application; `CreateNamespace=true` creates
/// the destination namespace; an unknown option is a clear condition.
#[tokio::test]
async fn sync_options_keep_create_and_refuse_as_argo_cd_documents() {
    let ns = TestNamespace::new("syncopts").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write(
        "app/kept.yaml",
        &configmap("kept", "argocd.argoproj.io/sync-options: Prune=false"),
    )
    .write(
        "app/extra.yaml",
        &configmap(
            "extra",
            "argocd.argoproj.io/sync-options: Prune=false, argocd.argoproj.io/compare-options: IgnoreExtraneous",
        ),
    )
    .write(
        "app/stays.yaml",
        &configmap("stays", "argocd.argoproj.io/sync-options: \"Delete=false\""),
    )
    .write("app/gone.yaml", &configmap("gone", ""));
    repo.commit("four objects");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    let first = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .expect("first sync");
    assert_eq!(first.applied.len(), 4, "{:?}", first.applied);

    repo.remove("app/kept.yaml")
        .remove("app/extra.yaml")
        .remove("app/gone.yaml");
    repo.commit("three removed");
    let second = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .expect("second sync");
    let pruned: Vec<&str> = second.pruned.iter().map(|id| id.name.as_str()).collect();
    assert_eq!(pruned, ["gone"]);
    let configmaps = ns.api::<ConfigMap>();
    for name in ["kept", "extra"] {
        assert!(configmaps.get_opt(name).await.unwrap().is_some(), "{name}");
    }
    assert_eq!(second.status.sync.status, Sync::OutOfSync);
    let kept = resource(&second, "kept");
    assert_eq!(kept.sync, Sync::OutOfSync);
    assert!(
        kept.message.as_deref().unwrap().contains("Prune=false"),
        "{kept:?}"
    );
    assert!(
        resource(&second, "extra")
            .message
            .as_deref()
            .unwrap()
            .contains("IgnoreExtraneous"),
    );
    // With `kept` gone by hand, only the ignored extraneous object is left
    // out of Git: the Application is Synced.
    configmaps
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    let third = wait_for("Synced with only the ignored object", DEADLINE, || async {
        let outcome = reconcile_app(&ctx, &ns, "app", &Request::default())
            .await
            .map_err(|e| e.to_string())?;
        if outcome.status.sync.status == Sync::Synced {
            Ok(outcome)
        } else {
            Err(format!("{:?}", outcome.status.resources))
        }
    })
    .await;
    assert!(configmaps.get_opt("extra").await.unwrap().is_some());
    assert_eq!(resource(&third, "extra").sync, Sync::OutOfSync);

    // Delete=false: the Application deleted with the resources finalizer
    // takes its other objects, not this one.
    let apps = ns.api::<Application>();
    apps.patch(
        "app",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": [
            setpoint::reconcile::finalize::ARGO_CD_FINALIZER
        ]}})),
    )
    .await
    .unwrap();
    apps.delete("app", &DeleteParams::default()).await.unwrap();
    let held = get_app(&ns, "app").await;
    reconcile(&ctx, &held, &Request::default())
        .await
        .expect("finalize");
    assert!(configmaps.get_opt("stays").await.unwrap().is_some());

    // CreateNamespace=true: the destination namespace is created.
    let target = support::unique_name("created");
    repo.write("other/cm.yaml", &configmap("inside", ""));
    repo.commit("another app");
    let mut app = Application::new(
        "creates",
        setpoint::api::ApplicationSpec {
            source: Source {
                repo_url: repo.url(),
                path: Some("other".into()),
                ..Default::default()
            },
            destination: setpoint::api::Destination {
                namespace: Some(target.clone()),
                ..Default::default()
            },
            sync_policy: SyncPolicy {
                sync_options: vec!["CreateNamespace=true".into()],
                ..automated(true, true)
            },
            ..Default::default()
        },
    );
    app.metadata.namespace = Some(ns.name.clone());
    apps.create(&Default::default(), &app).await.unwrap();
    let created = reconcile_app(&ctx, &ns, "creates", &Request::default()).await;
    let namespaces = kube::Api::<Namespace>::all(ns.client.clone());
    let found = namespaces.get_opt(&target).await.unwrap();
    let inside = kube::Api::<ConfigMap>::namespaced(ns.client.clone(), &target)
        .get_opt("inside")
        .await
        .unwrap();
    namespaces
        .delete(&target, &DeleteParams::default())
        .await
        .ok();
    created.expect("synced into a namespace it created");
    assert!(found.is_some() && inside.is_some());

    // An option Setpoint does not know is a condition naming it.
    let mut bad = app.clone();
    bad.metadata.name = Some("bad".into());
    bad.metadata.resource_version = None;
    bad.spec.sync_policy.sync_options = vec!["CreateNamespaces=true".into()];
    apps.create(&Default::default(), &bad).await.unwrap();
    let error = reconcile_app(&ctx, &ns, "bad", &Request::default())
        .await
        .expect_err("refused");
    assert_eq!(error.reason(), "InvalidSyncOption");
    assert!(
        error
            .to_string()
            .contains("unknown sync option \"CreateNamespaces\""),
        "{error}"
    );
}
