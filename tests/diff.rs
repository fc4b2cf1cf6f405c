//! The server-side diff and `spec.ignoreDifferences` against the real local
//! control plane: Git's quantities in their own form stay in sync with zero
//! writes, a no-op reconcile's cost in API requests, and a `spec.replicas`
//! that another field manager (the HPA's, `kube-controller-manager`, through
//! the scale subresource as the HPA controller writes it) owns.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use setpoint::api::{IgnoreDifferences, Sync};
use setpoint::reconcile::{Request, reconcile};
use support::app::{automated, context, create_app, event_notes, get_app, install_crd};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);
/// How long the HPA and Setpoint must not fight (the 30 s).
const NO_FIGHT: Duration = Duration::from_secs(30);

/// A Deployment whose resources Git writes as people do, not as the API
/// server stores them (`1`, `1Gi`).
fn quantities_yaml(name: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: 2\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: app\n        image: app:1\n        ports:\n        - containerPort: 8080\n        resources:\n          requests: {{cpu: 1000m, memory: 1024Mi}}\n          limits: {{cpu: 2000m, memory: 2048Mi}}\n      - name: sidecar\n        image: proxy:1\n"
    )
}

fn deployment_yaml(name: &str, replicas: u32, image: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: app\n        image: {image}\n"
    )
}

/// Reconciles until the Application is Synced at `commit` and nothing is left
/// to apply.
async fn reconcile_until_synced(
    ctx: &setpoint::context::Context,
    ns: &TestNamespace,
    name: &str,
    commit: &str,
) {
    wait_for(&format!("{name} Synced at {commit}"), DEADLINE, || async {
        let app = get_app(ns, name).await;
        let outcome = reconcile(ctx, &app, &Request::default())
            .await
            .map_err(|e| format!("reconcile failed: {e}"))?;
        let status = &outcome.status;
        if status.sync.status == Sync::Synced
            && status.sync.revision.as_deref() == Some(commit)
            && outcome.in_sync()
        {
            Ok(())
        } else {
            Err(format!(
                "{:?} at {:?}",
                status.sync.status, status.sync.revision
            ))
        }
    })
    .await;
}

#[tokio::test]
async fn quantities_as_git_writes_them_stay_in_sync_with_zero_writes() {
    let ns = TestNamespace::new("diff-quantities").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write("app/deploy.yaml", &quantities_yaml("web"))
        .commit("web");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    reconcile_until_synced(&ctx, &ns, "app", &commit).await;
    let live = ns.api::<Deployment>().get("web").await.unwrap();
    let requests = live.spec.template.spec.unwrap().containers[0]
        .resources
        .clone()
        .unwrap()
        .requests
        .unwrap();
    assert_eq!(
        requests["cpu"].0, "1",
        "the API server's form differs from Git's"
    );
    assert_eq!(requests["memory"].0, "1Gi");

    // Repeated reconciles, as sweeps and watch events make them: nothing is
    // drift, nothing is written, and once the live object stops moving the
    // dry run comes from the cache.
    let deployments = ns.api::<Deployment>();
    let mut quiet = 0;
    for round in 0..6 {
        let version_before = deployments
            .get("web")
            .await
            .unwrap()
            .metadata
            .resource_version;
        let app = get_app(&ns, "app").await;
        let before = ctx.requests.get();
        let outcome = reconcile(&ctx, &app, &Request::default()).await.unwrap();
        let used = ctx.requests.get() - before;
        let version_after = deployments
            .get("web")
            .await
            .unwrap()
            .metadata
            .resource_version;
        assert!(outcome.in_sync(), "round {round}: {:?}", outcome.plan);
        assert!(
            outcome.applied.is_empty(),
            "round {round}: {:?}",
            outcome.applied
        );
        if outcome.status_written {
            // Only the health of the new pods may still move the status.
            assert_eq!(used.writes, 1, "round {round}: {used:?}");
            continue;
        }
        assert_eq!(
            used.writes, 0,
            "round {round}: an in-sync reconcile writes nothing ({used:?})"
        );
        assert!(used.dry_runs <= 1, "round {round}: {used:?}");
        if version_before == version_after {
            // The object did not move since the previous round's dry run.
            if round > 0 {
                assert_eq!(used.dry_runs, 0, "round {round}: cached ({used:?})");
                quiet += 1;
            }
            eprintln!("no-op reconcile, warm dry-run cache: {used:?}");
        }
    }
    assert!(quiet > 0, "the Deployment never stopped moving");
    let drift = event_notes(&ns, "app", "DriftCorrected").await;
    assert!(drift.is_empty(), "{drift:?}");

    // A cold cache (a restarted worker): one dry run per live object, still
    // no write.
    let (cold, _cold_cache) = context().await;
    let app = get_app(&ns, "app").await;
    let before = cold.requests.get();
    let outcome = reconcile(&cold, &app, &Request::default()).await.unwrap();
    let used = cold.requests.get() - before;
    eprintln!("no-op reconcile, cold dry-run cache: {used:?}");
    assert!(outcome.in_sync(), "{:?}", outcome.plan);
    assert_eq!((used.writes, used.dry_runs), (0, 1), "{used:?}");
    assert_eq!(
        cold.metrics
            .dry_runs
            .get_or_create(&setpoint::metrics::DryRunLabels {
                result: "sent".into()
            })
            .get(),
        1
    );
}

/// The HPA's write: `spec.replicas` through the scale subresource with the
/// field manager the HPA controller runs as.
async fn scale_as_hpa(ns: &TestNamespace, name: &str, replicas: i32) {
    let hpa = PatchParams {
        field_manager: Some("kube-controller-manager".into()),
        ..Default::default()
    };
    let patch = Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}}));
    wait_for("the HPA's scale to be accepted", DEADLINE, || async {
        ns.api::<Deployment>()
            .patch_scale(name, &hpa, &patch)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
}

async fn replicas(ns: &TestNamespace, name: &str) -> Option<i32> {
    ns.api::<Deployment>()
        .get(name)
        .await
        .unwrap()
        .spec
        .replicas
}

#[tokio::test]
async fn replicas_owned_by_the_hpa_are_left_to_it_with_a_managed_fields_managers_rule() {
    let ns = TestNamespace::new("diff-hpa").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 2, "app:1"))
        .commit("web");
    // selfHeal on: without the rule Setpoint would set replicas back at once.
    create_app(&ns, "app", &repo.url(), "app", automated(false, true)).await;
    reconcile_until_synced(&ctx, &ns, "app", &commit).await;
    assert_eq!(replicas(&ns, "web").await, Some(2));

    let rule = IgnoreDifferences {
        group: "apps".into(),
        kind: "Deployment".into(),
        managed_fields_managers: vec!["kube-controller-manager".into()],
        ..Default::default()
    };
    let applications = ns.api::<setpoint::api::Application>();
    let set_rule = |rules: serde_json::Value| {
        let applications = applications.clone();
        async move {
            applications
                .patch(
                    "app",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({"spec": {"ignoreDifferences": rules}})),
                )
                .await
                .expect("set spec.ignoreDifferences")
        }
    };
    set_rule(serde_json::to_value([&rule]).unwrap()).await;
    // The rule is also set on the Application as read back before each
    // reconcile: on a shared development cluster the Application CRD is
    // installed by every branch's tests, and one without the field prunes it.
    let with_rule = || async {
        let mut app = get_app(&ns, "app").await;
        app.spec.ignore_differences = vec![rule.clone()];
        app
    };

    scale_as_hpa(&ns, "web", 4).await;
    // No fight: for 30 s, every reconcile leaves the HPA's replicas alone.
    let started = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(2));
    let mut rounds = 0;
    while started.elapsed() < NO_FIGHT {
        ticks.tick().await;
        let outcome = reconcile(&ctx, &with_rule().await, &Request::default())
            .await
            .unwrap();
        assert!(outcome.in_sync(), "{:?}", outcome.plan);
        assert!(outcome.applied.is_empty(), "{:?}", outcome.applied);
        let live = ns.api::<Deployment>().get("web").await.unwrap();
        assert_eq!(
            live.spec.replicas,
            Some(4),
            "replicas set back by: {:?}",
            live.metadata.managed_fields
        );
        rounds += 1;
    }
    assert!(rounds >= 10, "{rounds} reconciles in {NO_FIGHT:?}");
    let corrected = event_notes(&ns, "app", "DriftCorrected").await;
    assert!(corrected.is_empty(), "{corrected:?}");

    // A Git change is applied without the HPA's field: the image changes,
    // the replicas stay the HPA's.
    let commit = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 2, "app:2"))
        .commit("app:2");
    let app = with_rule().await;
    let before = ctx.requests.get();
    let outcome = reconcile(&ctx, &app, &Request::default()).await.unwrap();
    let used = ctx.requests.get() - before;
    assert_eq!(outcome.applied.len(), 1, "{:?}", outcome.plan);
    // No dry run: Git's body changed and the policy applies it, so the
    // apply itself answers with the new object (no diff dry run first, and
    // none of the apply's own for one object).
    assert_eq!(used.dry_runs, 0, "{used:?}");
    let live = ns.api::<Deployment>().get("web").await.unwrap();
    let spec = live.spec;
    assert_eq!(
        spec.template.spec.unwrap().containers[0].image.as_deref(),
        Some("app:2")
    );
    assert_eq!(spec.replicas, Some(4), "the apply kept the HPA's replicas");
    let outcome = reconcile(&ctx, &with_rule().await, &Request::default())
        .await
        .unwrap();
    assert!(outcome.in_sync(), "{:?}", outcome.plan);
    assert_eq!(
        outcome.status.sync.revision.as_deref(),
        Some(commit.as_str())
    );

    // Without the rule, the HPA's replicas are drift, named with their
    // manager (and selfHeal sets them back).
    set_rule(serde_json::Value::Null).await;
    let app = get_app(&ns, "app").await;
    assert!(app.spec.ignore_differences.is_empty());
    let outcome = reconcile(&ctx, &app, &Request::default()).await.unwrap();
    let drift: Vec<String> = outcome
        .plan
        .as_ref()
        .unwrap()
        .drift()
        .map(|(_, d)| d.to_string())
        .collect();
    assert_eq!(
        drift,
        ["spec.replicas 4→2 (changed by kube-controller-manager)"]
    );
    assert_eq!(replicas(&ns, "web").await, Some(2));
    wait_for("the DriftCorrected Event", DEADLINE, || async {
        let notes = event_notes(&ns, "app", "DriftCorrected").await;
        if notes
            .iter()
            .any(|n| n.contains("spec.replicas 4→2 (changed by kube-controller-manager)"))
        {
            Ok(())
        } else {
            Err(format!("{notes:?}"))
        }
    })
    .await;
}
