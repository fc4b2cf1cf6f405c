//! Sync waves and hooks inside one Application, against the real control
//! plane (kwok completes the pods of Jobs at once, so kube-controller-manager
//! marks hook Jobs Complete; a Job whose pods cannot be scheduled fails by
//! its `activeDeadlineSeconds`).

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use setpoint::api::{
    ConditionStatus, ConditionType, Health, HookPhase, HookState, RunPhase, SyncPolicy,
};
use setpoint::reconcile::{Outcome, Request};
use support::app::{
    automated, context, create_app, event_notes, get_app, install_crd, reconcile_app,
};
use support::process::{Setpoint, free_port};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);

fn deployment(name: &str, wave: Option<i32>) -> String {
    let annotations = wave
        .map(|w| format!("  annotations:\n    setpoint.dev/sync-wave: \"{w}\"\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
{annotations}spec:
  replicas: 1
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
      - name: app
        image: app:1
"
    )
}

fn configmap(name: &str, wave: Option<&str>) -> String {
    let annotations = wave
        .map(|w| format!("  annotations:\n    setpoint.dev/sync-wave: \"{w}\"\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n{annotations}data:\n  key: value\n"
    )
}

/// A Job hook: `fails` makes it a Job that cannot run (its pods match no
/// node) and that the Job controller fails after 2 s.
fn hook_job(name: &str, phase: &str, fails: bool) -> String {
    let unschedulable = if fails {
        "      nodeSelector: {setpoint.dev/nowhere: \"true\"}\n"
    } else {
        ""
    };
    let deadline = if fails {
        "  activeDeadlineSeconds: 2\n"
    } else {
        ""
    };
    format!(
        "apiVersion: batch/v1
kind: Job
metadata:
  name: {name}
  annotations:
    setpoint.dev/hook: {phase}
spec:
  backoffLimit: 0
{deadline}  template:
    spec:
      restartPolicy: Never
{unschedulable}      containers:
      - name: run
        image: migrate:1
"
    )
}

async fn hold_pods(ns: &TestNamespace) {
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "no-pods"},
        "spec": {"hard": {"pods": "0"}}
    }))
    .unwrap();
    ns.api::<ResourceQuota>()
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the quota");
}

fn condition(outcome: &Outcome, type_: ConditionType) -> (ConditionStatus, String, String) {
    let c = outcome
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_:?} condition: {:?}", outcome.status.conditions));
    (c.status, c.reason.clone(), c.message.clone())
}

async fn exists<K>(ns: &TestNamespace, name: &str) -> bool
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    <K as kube::Resource>::DynamicType: Default,
{
    ns.api::<K>().get_opt(name).await.expect("get").is_some()
}

/// Reconciles, as the worker does on each event, until `done` says so.
async fn reconcile_until(
    ctx: &setpoint::context::Context,
    ns: &TestNamespace,
    what: &str,
    done: impl Fn(&Outcome) -> Result<(), String>,
) -> Outcome {
    wait_for(what, DEADLINE, || async {
        let outcome = reconcile_app(ctx, ns, "app", &Request::default())
            .await
            .map_err(|e| format!("reconcile failed: {e}"))?;
        done(&outcome).map(|_| outcome)
    })
    .await
}

#[tokio::test]
async fn a_later_wave_waits_for_the_earlier_one_to_be_healthy_and_is_pruned_first() {
    let ns = TestNamespace::new("waves").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    hold_pods(&ns).await;
    let repo = GitRepo::new();
    repo.write("app/deploy.yaml", &deployment("web", Some(0)))
        .write("app/late.yaml", &configmap("late", Some("5")))
        .write("app/keep.yaml", &configmap("keep", None))
        .commit("waves 0 and 5");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;

    let first = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .expect("first reconcile");
    let applied: Vec<&str> = first.applied.iter().map(|id| id.name.as_str()).collect();
    assert!(
        applied.contains(&"web") && applied.contains(&"keep"),
        "{applied:?}"
    );
    assert!(!applied.contains(&"late"), "{applied:?}");
    let (status, reason, message) = condition(&first, ConditionType::Reconciling);
    assert_eq!(
        (status, reason.as_str()),
        (ConditionStatus::True, "WaitingForWave"),
        "{message}"
    );
    assert!(
        message.contains("wave 0") && message.contains("Deployment"),
        "{message}"
    );
    // The pods cannot be created: more reconciles do not start wave 5.
    for _ in 0..3 {
        let again = reconcile_app(&ctx, &ns, "app", &Request::default())
            .await
            .expect("reconcile");
        assert!(again.applied.is_empty(), "{:?}", again.applied);
        assert!(
            !exists::<ConfigMap>(&ns, "late").await,
            "wave 5 applied early"
        );
    }
    let late = get_app(&ns, "app").await.status.unwrap().resources;
    let late = late.iter().find(|r| r.name == "late").expect("listed");
    assert_eq!(late.health, Health::Missing);
    assert_eq!(
        late.message.as_deref(),
        Some("waits for wave 0 to be Healthy")
    );

    // Let the pods in: wave 0 turns Healthy, and wave 5 follows.
    ns.api::<ResourceQuota>()
        .delete("no-pods", &DeleteParams::default())
        .await
        .expect("delete the quota");
    let released = Instant::now();
    // A reconcile may apply wave 5 and then fail on a passing fault (a
    // status write under load): the ConfigMap itself is what counts.
    let done = wait_for("wave 5 applied", DEADLINE, || async {
        let outcome = reconcile_app(&ctx, &ns, "app", &Request::default())
            .await
            .map_err(|e| format!("reconcile failed: {e}"))?;
        if exists::<ConfigMap>(&ns, "late").await {
            Ok(outcome)
        } else {
            Err(format!("{:?}", outcome.status.conditions))
        }
    })
    .await;
    eprintln!(
        "wave 5 applied {:?} after the quota was removed",
        released.elapsed()
    );
    assert!(exists::<ConfigMap>(&ns, "late").await);
    let done = if done.status.health.status == Health::Healthy {
        done
    } else {
        reconcile_until(&ctx, &ns, "Ready", |o| match o.status.health.status {
            Health::Healthy => Ok(()),
            other => Err(format!("{other:?}")),
        })
        .await
    };
    let run = done
        .status
        .sync_run
        .clone()
        .expect("the sync run is recorded");
    assert_eq!(run.phase, RunPhase::Succeeded, "{run:?}");
    let waves: Vec<i32> = run.waves.iter().map(|w| w.wave).collect();
    assert_eq!(waves, [0, 5]);
    assert!(run.waves.iter().all(|w| w.duration_ms.is_some()), "{run:?}");
    assert!(!event_notes(&ns, "app", "WaveHealthy").await.is_empty());

    // Both removed from Git: the ConfigMap of wave 5 goes first.
    let removed = repo
        .remove("app/deploy.yaml")
        .remove("app/late.yaml")
        .commit("remove waves 0 and 5");
    let pruned = reconcile_until(&ctx, &ns, "both pruned", |o| {
        if o.pruned.len() == 2 {
            Ok(())
        } else {
            Err(format!("pruned {:?}", o.pruned))
        }
    })
    .await;
    let order: Vec<&str> = pruned.pruned.iter().map(|id| id.name.as_str()).collect();
    assert_eq!(order, ["late", "web"], "highest wave pruned first");
    assert_eq!(
        pruned.status.sync.revision.as_deref(),
        Some(removed.as_str())
    );
    assert!(exists::<ConfigMap>(&ns, "keep").await);
}

#[tokio::test]
async fn a_wave_not_healthy_in_time_fails_the_sync_naming_the_objects() {
    let ns = TestNamespace::new("wave-timeout").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    hold_pods(&ns).await;
    let repo = GitRepo::new();
    repo.write("app/deploy.yaml", &deployment("web", None))
        .write("app/late.yaml", &configmap("late", Some("1")))
        .commit("two waves");
    let policy = SyncPolicy {
        wave_timeout: Some("2s".into()),
        ..automated(true, true)
    };
    create_app(&ns, "app", &repo.url(), "app", policy).await;
    let failed = reconcile_until(
        &ctx,
        &ns,
        "Stalled by the wave timeout",
        |o| match condition(o, ConditionType::Stalled) {
            (ConditionStatus::True, reason, _) if reason == "WaveTimeout" => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let (_, _, message) = condition(&failed, ConditionType::Stalled);
    assert!(
        message.starts_with("wave 0 was not Healthy within 2s: apps/Deployment")
            && message.contains("/web is Progressing"),
        "{message}"
    );
    assert_eq!(failed.status.sync_run.unwrap().phase, RunPhase::Failed);
    assert!(!exists::<ConfigMap>(&ns, "late").await);
}

#[tokio::test]
async fn a_bad_wave_annotation_is_a_condition_naming_the_object() {
    let ns = TestNamespace::new("bad-wave").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write("app/late.yaml", &configmap("late", Some("last")))
        .commit("bad wave");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    let error = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .expect_err("refused");
    assert_eq!(error.reason(), "InvalidSyncWave");
    assert!(!error.is_transient());
    let app = get_app(&ns, "app").await;
    let stalled = app
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == ConditionType::Stalled)
        .unwrap();
    assert_eq!(stalled.reason, "InvalidSyncWave");
    assert!(
        stalled.message.contains("ConfigMap")
            && stalled
                .message
                .contains("/late (app/late.yaml (document 0))")
            && stalled.message.contains("\"last\", not an integer"),
        "{}",
        stalled.message
    );
    assert!(!exists::<ConfigMap>(&ns, "late").await);
}

#[tokio::test]
async fn a_presync_hook_completes_before_any_wave_and_not_again_on_drift() {
    let ns = TestNamespace::new("presync").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write("app/migrate.yaml", &hook_job("migrate", "PreSync", false))
        .write("app/deploy.yaml", &deployment("web", None))
        .write("app/config.yaml", &configmap("config", Some("-1")))
        .commit("a PreSync hook");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;

    let first = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .expect("first reconcile");
    assert!(first.applied.is_empty(), "{:?}", first.applied);
    assert!(exists::<Job>(&ns, "migrate").await, "the hook runs first");
    assert!(!exists::<ConfigMap>(&ns, "config").await);
    assert!(!exists::<Deployment>(&ns, "web").await);
    let (status, reason, message) = condition(&first, ConditionType::Reconciling);
    assert_eq!(
        (status, reason.as_str()),
        (ConditionStatus::True, "WaitingForHook")
    );
    assert!(message.contains("PreSync hook Job migrate"), "{message}");

    let done = reconcile_until(&ctx, &ns, "synced after the hook", |o| {
        match o.status.sync_run.as_ref().map(|r| r.phase) {
            Some(RunPhase::Succeeded) if o.status.health.status == Health::Healthy => Ok(()),
            other => Err(format!("{other:?} {:?}", o.status.conditions)),
        }
    })
    .await;
    let run = done.status.sync_run.clone().unwrap();
    assert_eq!(run.hooks.len(), 1, "{run:?}");
    assert_eq!(run.hooks[0].phase, HookPhase::PreSync);
    assert_eq!(run.hooks[0].state, HookState::Succeeded);
    assert!(run.hooks[0].duration_ms.is_some());
    let job = ns.api::<Job>().get("migrate").await.unwrap();
    let completed = job.status.unwrap().completion_time.expect("Complete").0;
    let config = ns.api::<ConfigMap>().get("config").await.unwrap();
    let created = config.metadata.creation_timestamp.unwrap().0;
    assert!(
        completed <= created,
        "hook completed {completed}, wave -1 created {created}"
    );
    assert!(
        !done.status.resources.iter().any(|r| r.kind == "Job"),
        "a hook is not an ordinary object"
    );
    let job_uid = job.metadata.uid.clone();

    // Drift: the hook does not run again.
    ns.api::<Deployment>()
        .patch(
            "web",
            &PatchParams::apply("kubectl").force(),
            &Patch::Apply(serde_json::json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web"}, "spec": {"replicas": 3}
            })),
        )
        .await
        .expect("scale");
    let corrected = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .expect("drift correction");
    assert!(
        corrected.applied.iter().any(|id| id.name == "web"),
        "{:?}",
        corrected.applied
    );
    let job = ns.api::<Job>().get("migrate").await.unwrap();
    assert_eq!(job.metadata.uid, job_uid, "the hook ran again");
    assert_eq!(corrected.status.sync_run.unwrap().hooks.len(), 1);
    assert_eq!(event_notes(&ns, "app", "HookStarted").await.len(), 1);
}

#[tokio::test]
async fn a_failing_presync_hook_applies_nothing_and_runs_the_syncfail_hook() {
    let ns = TestNamespace::new("syncfail").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write("app/migrate.yaml", &hook_job("migrate", "PreSync", true))
        .write("app/page.yaml", &hook_job("page", "SyncFail", false))
        .write("app/deploy.yaml", &deployment("web", None))
        .commit("a failing PreSync hook");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;

    let failed = reconcile_until(&ctx, &ns, "Stalled by the hook", |o| {
        match condition(o, ConditionType::Stalled) {
            (ConditionStatus::True, reason, _) if reason == "HookFailed" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (_, _, message) = condition(&failed, ConditionType::Stalled);
    assert!(
        message.starts_with("the PreSync hook batch/Job ") && message.contains("/migrate failed: "),
        "{message}"
    );
    assert!(exists::<Job>(&ns, "page").await, "the SyncFail hook runs");
    assert!(!exists::<Deployment>(&ns, "web").await);
    let run = failed.status.sync_run.clone().unwrap();
    assert_eq!(run.phase, RunPhase::Failed);
    assert!(
        run.hooks
            .iter()
            .any(|h| h.phase == HookPhase::SyncFail && h.name == "page"),
        "{run:?}"
    );
    // Later reconciles of the revision apply nothing and follow the
    // SyncFail hook to its end.
    let after = reconcile_until(&ctx, &ns, "the SyncFail hook done", |o| {
        let run = o.status.sync_run.as_ref().unwrap();
        match run.hooks.iter().find(|h| h.phase == HookPhase::SyncFail) {
            Some(h) if h.state == HookState::Succeeded => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(after.applied.is_empty());
    assert!(!exists::<Deployment>(&ns, "web").await);
    assert!(!event_notes(&ns, "app", "HookFailed").await.is_empty());
}

#[tokio::test]
async fn setpoint_run_resumes_a_waiting_wave_on_the_watch_event_of_the_health_change() {
    let ns = TestNamespace::new("wave-run").await;
    install_crd(&ns.client).await;
    hold_pods(&ns).await;
    let repo = GitRepo::new();
    repo.write("app/deploy.yaml", &deployment("web", None))
        .write("app/late.yaml", &configmap("late", Some("5")))
        .commit("waves 0 and 5");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    // No sweep: only events move the sync on.
    let args = ["run", "--listen", &listen, "--sweep-interval", "1h"];
    let setpoint = Setpoint::scoped(&ns.name, &args, &[], cache.path());
    wait_for("waiting for wave 0", DEADLINE, || async {
        let app = get_app(&ns, "app").await;
        let conditions = app.status.map(|s| s.conditions).unwrap_or_default();
        match conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Reconciling)
        {
            Some(c) if c.reason == "WaitingForWave" => Ok(()),
            other => Err(format!("{other:?}\n{}", setpoint.logs())),
        }
    })
    .await;
    assert!(exists::<Deployment>(&ns, "web").await);
    assert!(!exists::<ConfigMap>(&ns, "late").await);

    ns.api::<ResourceQuota>()
        .delete("no-pods", &DeleteParams::default())
        .await
        .expect("delete the quota");
    let released = Instant::now();
    wait_for("wave 5 applied", DEADLINE, || async {
        if exists::<ConfigMap>(&ns, "late").await {
            Ok(())
        } else {
            Err(setpoint.logs())
        }
    })
    .await;
    eprintln!(
        "setpoint run: wave 5 applied {:?} after the quota was removed",
        released.elapsed()
    );
    let logs = setpoint.logs();
    assert!(
        logs.lines().any(|l| l.contains("enqueue")
            && l.contains("Deployment web")
            && l.contains("health changed")),
        "the watch did not report the Deployment's health change:\n{logs}"
    );
}

#[tokio::test]
async fn crds_in_wave_minus_one_and_their_instances_in_wave_zero() {
    let ns = TestNamespace::new("wave-crd").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let group = format!("{}.example.com", support::unique_name("w").replace('-', ""));
    let crd = format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{group}
  annotations:
    setpoint.dev/sync-wave: \"-1\"
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
        x-kubernetes-preserve-unknown-fields: true
"
    );
    let widget = format!("apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w1\n");
    let repo = GitRepo::new();
    repo.write("app/widget.yaml", &widget)
        .write("app/crd.yaml", &crd)
        .commit("crd in wave -1");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    let done = reconcile_until(&ctx, &ns, "Synced and Healthy", |o| {
        match (o.status.sync.status, o.status.health.status) {
            (setpoint::api::Sync::Synced, Health::Healthy) => Ok(()),
            other => Err(format!("{other:?} {:?}", o.status.conditions)),
        }
    })
    .await;
    let run = done.status.sync_run.expect("recorded");
    let waves: Vec<i32> = run.waves.iter().map(|w| w.wave).collect();
    assert_eq!(waves, [-1, 0]);
    assert_eq!(run.phase, RunPhase::Succeeded);
    let crds: kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = kube::Api::all(ns.client.clone());
    let _ = crds
        .delete(&format!("widgets.{group}"), &Default::default())
        .await;
}
