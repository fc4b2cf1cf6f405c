//! Running Setpoint for real: `/metrics`, `/healthz` and `/readyz` of the
//! actual binary against the local control plane and RabbitMQ.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use support::app::{automated, create_app, install_crd, synced_at};
use support::process::{Setpoint, free_port, github_push, post, post_github};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);
const SECRET: &str = "operations-secret";

fn deployment(name: &str, replicas: u32) -> String {
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
        image: app:1
"
    )
}

/// The value of the first sample line that starts with `prefix`.
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

fn scrape(port: u16) -> Result<String, String> {
    match post(port, "/metrics", &[], "", "GET") {
        (200, body) => Ok(body),
        (code, body) => Err(format!("{code} {body}")),
    }
}

#[tokio::test]
async fn metrics_follow_a_push_a_sync_and_a_drift_correction() {
    let ns = TestNamespace::new("metrics").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let repo = GitRepo::new();
    let commit = repo
        .write("apps/web/deploy.yaml", &deployment("web", 2))
        .commit("web");
    create_app(&ns, "web", &repo.url(), "apps/web", automated(true, true)).await;

    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let args = [
        "run",
        "--listen",
        &listen,
        "--metrics-listen",
        &metrics_listen,
        "--github-secret",
        SECRET,
        "--no-sweep",
    ];
    let mut setpoint = Setpoint::spawn(&args, &[], cache.path());
    setpoint.wait_http().await;
    assert_eq!(
        post(metrics_port, "/healthz", &[], "", "GET"),
        (200, "ok".into())
    );
    wait_for("/readyz", DEADLINE, || async {
        match post(metrics_port, "/readyz", &[], "", "GET") {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;

    let port = setpoint.port.unwrap();
    let body = github_push(&repo.url(), &commit, &["apps/web/deploy.yaml"]);
    wait_for("the push to be routed to web", DEADLINE, || async {
        match post_github(port, Some(SECRET), &support::unique_name("d"), &body) {
            (200, reply) if reply.contains("/web\"") => Ok(()),
            (code, reply) => Err(format!("{code} {reply}")),
        }
    })
    .await;
    assert_eq!(post_github(port, Some("wrong"), "d-bad", &body).0, 401);
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &commit)).await;

    let app = format!(r#"namespace="{}",app="web""#, ns.name);
    let text = wait_for("the sync in the metrics", DEADLINE, || async {
        let text = scrape(metrics_port)?;
        let synced = sample(
            &text,
            &format!("setpoint_app_sync_status{{{app},status=\"Synced\"}}"),
        );
        let reconciled = sample(
            &text,
            &format!("setpoint_reconciles_total{{{app},outcome=\"synced\"}}"),
        );
        match (synced, reconciled) {
            (Some(1.0), Some(n)) if n >= 1.0 => Ok(text),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let accepted = sample(
        &text,
        r#"setpoint_webhook_requests_total{provider="github",outcome="accepted"}"#,
    );
    assert!(accepted.is_some_and(|n| n >= 1.0), "{text}");
    let unauthorized = sample(
        &text,
        r#"setpoint_webhook_requests_total{provider="github",outcome="unauthorized"}"#,
    );
    assert_eq!(unauthorized, Some(1.0), "{text}");
    for count in [
        "setpoint_git_fetch_duration_seconds_count",
        "setpoint_queue_publish_duration_seconds_count",
        &format!("setpoint_reconcile_duration_seconds_count{{{app}}}"),
    ] {
        assert!(
            sample(&text, count).is_some_and(|n| n >= 1.0),
            "{count} in\n{text}"
        );
    }
    assert_eq!(
        sample(
            &text,
            &format!("setpoint_app_health_status{{{app},status=\"Degraded\"}}")
        ),
        Some(0.0)
    );

    // Someone scales the Deployment: the watch sees it, the worker sets it
    // back, the metrics count it by kind.
    let before = sample(
        &text,
        r#"setpoint_drift_corrections_total{group="apps",kind="Deployment"}"#,
    )
    .unwrap_or(0.0);
    let scale = serde_json::json!({"spec": {"replicas": 1}});
    ns.api::<Deployment>()
        .patch_scale("web", &PatchParams::default(), &Patch::Merge(&scale))
        .await
        .unwrap();
    wait_for("the drift correction in the metrics", DEADLINE, || async {
        let text = scrape(metrics_port)?;
        match sample(
            &text,
            r#"setpoint_drift_corrections_total{group="apps",kind="Deployment"}"#,
        ) {
            Some(n) if n > before => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn readyz_fails_while_the_broker_is_unreachable_and_healthz_does_not() {
    let cache = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    // Nothing listens on this port.
    let nowhere = format!("amqp://guest:guest@127.0.0.1:{}/%2f", free_port());
    let args = ["worker", "--metrics-listen", &metrics_listen];
    let _worker = Setpoint::spawn(&args, &[("SETPOINT_AMQP_URL", &nowhere)], cache.path());
    wait_for("/healthz", DEADLINE, || async {
        match post(metrics_port, "/healthz", &[], "", "GET") {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    let (code, body) = post(metrics_port, "/readyz", &[], "", "GET");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("broker is not connected"), "{body}");
    assert!(!body.contains("guest"), "no credentials in probes: {body}");
    let (code, metrics) = post(metrics_port, "/metrics", &[], "", "GET");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("# TYPE setpoint_queue_messages_ready gauge"),
        "{metrics}"
    );
}
