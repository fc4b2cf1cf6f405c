//! `make bench`: the reconcile engine against the real local control plane.
//! Reports the wall time and the API requests of a first sync of 50 objects
//! and of a no-op reconcile of the same Application, as Setpoint itself and
//! as a tenant (impersonating a service account bound to `edit`).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use setpoint::context::Context;
use setpoint::context::RequestCount;
use setpoint::reconcile::Request;
use support::app::{
    automated, context, context_with, create_app, get_app, grant_edit, install_crd,
};
use support::{GitRepo, TestNamespace};

const OBJECTS: usize = 50;
const NOOP_RUNS: usize = 20;

#[tokio::main]
async fn main() {
    let ns = TestNamespace::new("bench").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    for i in 0..OBJECTS {
        let manifest = if i % 10 == 0 {
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web-{i}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: web-{i}}}\n  template:\n    metadata:\n      labels: {{app: web-{i}}}\n    spec:\n      containers:\n      - name: app\n        image: app:1\n"
            )
        } else {
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config-{i}\ndata:\n  key: \"{i}\"\n"
            )
        };
        repo.write(&format!("app/{i:03}.yaml"), &manifest);
    }
    repo.commit("50 objects");
    create_app(&ns, "bench", &repo.url(), "app", automated(true, true)).await;

    let app = get_app(&ns, "bench").await;
    let before = ctx.requests.get();
    let start = Instant::now();
    let first = setpoint::reconcile::reconcile(&ctx, &app, &Request::default())
        .await
        .expect("first sync");
    let first_time = start.elapsed();
    let first_requests = ctx.requests.get() - before;
    assert_eq!(first.applied.len(), OBJECTS);

    // Let the Deployments settle so that the no-op runs are truly no-ops.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let app = get_app(&ns, "bench").await;
        let outcome = setpoint::reconcile::reconcile(&ctx, &app, &Request::default())
            .await
            .unwrap();
        if outcome.in_sync() && !outcome.status_written {
            break;
        }
        assert!(Instant::now() < deadline, "the app did not settle");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (p50, max, requests) = noop_runs(&ctx, &ns).await;

    // The same no-op reconciles as a tenant: every request impersonates the
    // namespace's service account `deployer`, bound to `edit`.
    grant_edit(&ns, "deployer").await;
    let patch = serde_json::json!({ "spec": { "serviceAccountName": "deployer" } });
    ns.api::<setpoint::api::Application>()
        .patch(
            "bench",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let tenant_cache = tempfile::tempdir().unwrap();
    let tenancy = setpoint::tenancy::Tenancy {
        allow_local: true,
        ..Default::default()
    };
    let tenant = context_with(tenancy, &tenant_cache).await;
    let app = get_app(&ns, "bench").await;
    setpoint::reconcile::reconcile(&tenant, &app, &Request::default())
        .await
        .expect("the tenant's first reconcile (its own Git mirror)");
    let (tenant_p50, tenant_max, tenant_requests) = noop_runs(&tenant, &ns).await;
    println!(
        "reconcile benchmark ({OBJECTS} objects: 45 ConfigMaps, 5 Deployments; local control plane)"
    );
    println!(
        "  first sync:         {:>8.1} ms   {:>4} reads {:>4} writes",
        ms(first_time),
        first_requests.reads,
        first_requests.writes
    );
    println!(
        "  no-op reconcile:    {:>8.1} ms p50, {:.1} ms max over {NOOP_RUNS} runs   {:>4} reads {:>4} writes each",
        ms(p50),
        ms(max),
        requests.reads,
        requests.writes
    );
    println!(
        "  no-op as a tenant:  {:>8.1} ms p50, {:.1} ms max over {NOOP_RUNS} runs   {:>4} reads {:>4} writes each (impersonated)",
        ms(tenant_p50),
        ms(tenant_max),
        tenant_requests.reads,
        tenant_requests.writes
    );
}

/// NOOP_RUNS reconciles of the settled Application: p50, max, and the
/// requests of one.
async fn noop_runs(ctx: &Context, ns: &TestNamespace) -> (Duration, Duration, RequestCount) {
    let app = get_app(ns, "bench").await;
    let mut times = Vec::new();
    let mut requests = RequestCount::default();
    for _ in 0..NOOP_RUNS {
        let before = ctx.requests.get();
        let start = Instant::now();
        let outcome = setpoint::reconcile::reconcile(ctx, &app, &Request::default())
            .await
            .unwrap();
        times.push(start.elapsed());
        requests = ctx.requests.get() - before;
        assert!(outcome.in_sync(), "{:?}", outcome.status.conditions);
    }
    times.sort();
    (times[times.len() / 2], times[times.len() - 1], requests)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
