//! What a no-op reconcile costs in API requests: an in-sync Application of
//! one ConfigMap and one Deployment (Git's quantities in their own form),
//! reconciled again and again once nothing moves. Prints the counts (run with
//! `--nocapture`), so the cost before and after a change of the reconcile can
//! be compared; fails on any write.

mod support;

use std::time::Duration;

use setpoint::api::Sync;
use setpoint::reconcile::{Request, reconcile};
use support::app::{automated, context, create_app, get_app, install_crd};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_no_op_reconcile_writes_nothing_and_its_requests_are_counted() {
    let ns = TestNamespace::new("noop-cost").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write(
            "app/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  mode: prod\n",
        )
        .write(
            "app/deploy.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: app\n        image: app:1\n        resources:\n          requests: {cpu: 500m, memory: 256Mi}\n",
        )
        .commit("app");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    // Until a reconcile finds nothing to do and writes nothing.
    wait_for("a quiet reconcile", DEADLINE, || async {
        let app = get_app(&ns, "app").await;
        let before = ctx.requests.get();
        let outcome = reconcile(&ctx, &app, &Request::default())
            .await
            .map_err(|e| e.to_string())?;
        let used = ctx.requests.get() - before;
        if outcome.status.sync.status == Sync::Synced
            && outcome.status.sync.revision.as_deref() == Some(commit.as_str())
            && outcome.in_sync()
            && used.writes == 0
        {
            Ok(())
        } else {
            Err(format!("{:?} {used:?}", outcome.status.sync.status))
        }
    })
    .await;
    for round in 0..3 {
        let app = get_app(&ns, "app").await;
        let before = ctx.requests.get();
        let outcome = reconcile(&ctx, &app, &Request::default()).await.unwrap();
        let used = ctx.requests.get() - before;
        eprintln!("no-op reconcile {round}: {used:?}");
        assert!(outcome.in_sync(), "{:?}", outcome.plan);
        assert_eq!(used.writes, 0, "{used:?}");
    }
}
