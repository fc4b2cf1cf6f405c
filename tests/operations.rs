//! Running Setpoint for real: `/metrics`, `/healthz` and `/readyz` of the
//! actual binary against the local control plane and RabbitMQ.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams, PostParams};
use setpoint::api::{Application, ApplicationSpec, Source};
use support::app::{automated, create_app, install_crd, settled_at, synced_at};
use support::process::{Setpoint, free_port, github_push, post, post_github, sample, scrape};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);

/// Each `setpoint run` here is scoped to its test's namespace; the two
/// tests that start one also take turns, so that neither's figures or logs
/// carry the other's load.
static ONE_RUN_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
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

#[tokio::test]
async fn metrics_follow_a_push_a_sync_and_a_drift_correction() {
    let _turn = ONE_RUN_AT_A_TIME.lock().await;
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
    let mut setpoint = Setpoint::scoped(&ns.name, &args, &[], cache.path());
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
    // The index holds this namespace's one Application (the process is
    // scoped to it), not the other tests' Applications.
    assert_eq!(
        sample(&text, "setpoint_applications_indexed"),
        Some(1.0),
        "{text}"
    );
    let unauthorized = sample(
        &text,
        r#"setpoint_webhook_requests_total{provider="github",outcome="unauthorized"}"#,
    );
    assert_eq!(unauthorized, Some(1.0), "{text}");
    for count in [
        "setpoint_git_fetch_duration_seconds_count",
        "setpoint_queue_publish_duration_seconds_count",
        &format!(
            "setpoint_reconcile_duration_seconds_count{{namespace=\"{}\"}}",
            ns.name
        ),
    ] {
        assert!(
            sample(&text, count).is_some_and(|n| n >= 1.0),
            "{count} in\n{text}"
        );
    }
    // One health series: the status it has, not a 0 for each other one.
    assert_eq!(
        sample(
            &text,
            &format!("setpoint_app_health_status{{{app},status=\"Degraded\"}}")
        ),
        None
    );

    // Someone scales the Deployment: the watch sees it, the worker sets it
    // back, the metrics count it by kind.
    let before = sample(
        &text,
        r#"setpoint_drift_corrections_total{group="apps",kind="Deployment",cluster="in-cluster"}"#,
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
            r#"setpoint_drift_corrections_total{group="apps",kind="Deployment",cluster="in-cluster"}"#,
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

fn setpoint_command(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(args)
        .output()
        .expect("run setpoint")
}

#[test]
fn config_check_accepts_the_documented_file_and_explains_each_error() {
    let documented = concat!(env!("CARGO_MANIFEST_DIR"), "/config/setpoint.yaml");
    let out = setpoint_command(&["config", "check", documented]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "queue:\n  shards: many\n  amqpURL: amqp://admin:hunter2@rabbit/\nworker:\n  concurrncy: 4\n",
    )
    .unwrap();
    let out = setpoint_command(&["config", "check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines[0].ends_with("queue.shards: expected a whole number, found \"many\""),
        "{stderr}"
    );
    assert!(
        lines[1].contains("queue.amqpURL: secrets do not belong"),
        "{stderr}"
    );
    assert!(
        lines[2].ends_with("worker.concurrncy: unknown setting (did you mean worker.concurrency?)"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");

    // A role refuses to start on it, with the same explanations.
    let out = setpoint_command(&["--config", bad.to_str().unwrap(), "worker"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("worker.concurrncy: unknown setting"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[tokio::test]
async fn the_file_configures_a_role_the_environment_and_flags_override_it_and_logs_follow_one_delivery()
 {
    let _turn = ONE_RUN_AT_A_TIME.lock().await;
    let ns = TestNamespace::new("config").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let repo = GitRepo::new();
    let commit = repo
        .write("apps/web/deploy.yaml", &deployment("web", 1))
        .commit("web");
    create_app(&ns, "web", &repo.url(), "apps/web", automated(true, true)).await;

    let (webhook_port, file_metrics, env_metrics) = (free_port(), free_port(), free_port());
    let secret_file = cache.path().join("github-secret");
    std::fs::write(&secret_file, format!("{SECRET}\n")).unwrap();
    let config = cache.path().join("setpoint.yaml");
    std::fs::write(
        &config,
        format!(
            "log:\n  level: info\n  format: json\nwebhook:\n  listen: 127.0.0.1:{webhook_port}\n  githubSecretFiles: [{}]\nmetrics:\n  listen: 127.0.0.1:{file_metrics}\nsweep:\n  interval: 1h\n",
            secret_file.display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let unset = ["SETPOINT_LOG", "SETPOINT_METRICS_LISTEN", "SETPOINT_LISTEN"];
    // Only this namespace: the other tests here run side by side, and a
    // process reconciling their manual Applications would race their CLI.
    let scope = [
        ("SETPOINT_WATCH_NAMESPACES", ns.name.as_str()),
        ("POD_NAMESPACE", ns.name.as_str()),
    ];

    // The file alone: its ports, its secret, JSON logs.
    let mut setpoint =
        Setpoint::spawn_without(&["--config", config, "run"], &scope, &unset, cache.path());
    setpoint.port = Some(webhook_port);
    setpoint.wait_http().await;
    assert_eq!(post(file_metrics, "/healthz", &[], "", "GET").0, 200);
    // The Application's creation syncs it; then a push changes it. The push
    // comes once the first sync settled, so that it is the push's event, and
    // not a health change of the first sync's rollout, that finds the new
    // commit (either would apply it; only the push's carries the delivery).
    wait_for("web synced and healthy", DEADLINE, || {
        settled_at(&ns, "web", &commit)
    })
    .await;
    let commit = repo
        .write("apps/web/deploy.yaml", &deployment("web", 2))
        .commit("web: two replicas");
    let body = github_push(&repo.url(), &commit, &["apps/web/deploy.yaml"]);
    let delivery = support::unique_name("delivery");
    wait_for("the push routed", DEADLINE, || async {
        match post_github(webhook_port, Some(SECRET), &delivery, &body) {
            (200, reply) if reply.contains("/web\"") => Ok(()),
            (code, reply) => Err(format!("{code} {reply}")),
        }
    })
    .await;
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &commit)).await;
    // One delivery, followed from the webhook to the apply in the JSON logs.
    let logs = wait_for("the apply in the logs", DEADLINE, || async {
        let logs = setpoint.logs();
        if logs
            .lines()
            .any(|l| l.contains(r#""message":"applied""#) && l.contains(&delivery))
        {
            Ok(logs)
        } else {
            Err(logs.lines().last().unwrap_or_default().to_string())
        }
    })
    .await;
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(!lines.is_empty(), "JSON logs: {logs}");
    let routed = lines
        .iter()
        .find(|l| {
            l["fields"]["message"] == "push routed" && l["fields"]["delivery"] == delivery.as_str()
        })
        .unwrap_or_else(|| panic!("no 'push routed' for {delivery}: {logs}"));
    let event = routed["fields"]["events"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let applied = lines
        .iter()
        .find(|l| l["fields"]["message"] == "applied" && l["span"]["delivery"] == delivery.as_str())
        .unwrap_or_else(|| panic!("no 'applied' for {delivery}: {logs}"));
    assert_eq!(applied["span"]["delivery"], delivery.as_str(), "{applied}");
    assert_eq!(
        applied["span"]["app"],
        format!("{}/web", ns.name),
        "{applied}"
    );
    let event_id = applied["span"]["event"].as_str().unwrap();
    assert!(event.contains(event_id), "{event} should name {event_id}");
    assert!(
        applied["fields"]["object"]
            .as_str()
            .is_some_and(|o| o.contains("Deployment") && o.contains("web")),
        "{applied}"
    );
    assert!(!logs.contains(SECRET), "the secret is never logged");
    drop(setpoint);

    // The environment beats the file, a flag beats both.
    let env_listen = format!("127.0.0.1:{env_metrics}");
    let flag_port = free_port();
    let flag_listen = format!("127.0.0.1:{flag_port}");
    let mut setpoint = Setpoint::spawn_without(
        &["--config", config, "run", "--listen", &flag_listen],
        &[("SETPOINT_METRICS_LISTEN", &env_listen), scope[0], scope[1]],
        &["SETPOINT_LOG", "SETPOINT_LISTEN"],
        cache.path(),
    );
    setpoint.wait_http().await;
    assert_eq!(post(env_metrics, "/healthz", &[], "", "GET").0, 200);
    assert_eq!(
        post(file_metrics, "/healthz", &[], "", "GET").0,
        0,
        "not on the file's port"
    );
    assert_eq!(
        post(webhook_port, "/healthz", &[], "", "GET").0,
        0,
        "not on the file's port"
    );
}

fn app_cli(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .arg("app")
        .args(args)
        .env("KUBECONFIG", support::kubeconfig_path())
        .env("SETPOINT_ALLOW_LOCAL_REPOS", "true")
        .env("SETPOINT_ADMIN_NAMESPACES", "*")
        .output()
        .expect("run setpoint app");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn the_app_cli_lists_gets_diffs_syncs_and_shows_history() {
    let ns = TestNamespace::new("app-cli").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    let repo = GitRepo::new();
    let first = repo
        .write("apps/web/deploy.yaml", &deployment("web", 1))
        .commit("one replica");
    // No automated policy: only a manual sync changes anything.
    create_app(&ns, "web", &repo.url(), "apps/web", Default::default()).await;
    let n = ns.name.as_str();

    let (code, out, err) = app_cli(&["diff", "web", "-n", n, "--cache-dir", cache_dir]);
    assert_eq!(code, 1, "out of sync before the first sync: {out}{err}");
    assert!(
        out.contains("create") && out.contains("apps/Deployment"),
        "{out}"
    );

    let (code, out, err) = app_cli(&["sync", &format!("{n}/web"), "--cache-dir", cache_dir]);
    assert_eq!(code, 0, "{out}{err}");
    synced_at(&ns, "web", &first).await.unwrap();
    let (code, _, _) = app_cli(&["diff", "web", "-n", n, "--cache-dir", cache_dir]);
    assert_eq!(code, 0, "in sync after it");

    let second = repo
        .write("apps/web/deploy.yaml", &deployment("web", 2))
        .commit("two replicas");
    let (code, out, err) = app_cli(&["sync", "web", "-n", n, "--cache-dir", cache_dir]);
    assert_eq!(code, 0, "{out}{err}");
    synced_at(&ns, "web", &second).await.unwrap();

    let (code, out, _) = app_cli(&["list", "-n", n]);
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "SYNC", "HEALTH", "REVISION", "MESSAGE"]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[..2], ["web", "Synced"], "{out}");
    assert_eq!(row[3], &second[..12], "{out}");
    let (_, all, _) = app_cli(&["list", "-A"]);
    assert!(
        all.lines().any(|l| l.starts_with(n) && l.contains(" web ")),
        "{all}"
    );

    let (code, out, _) = app_cli(&["get", "web", "-n", n]);
    assert_eq!(code, 0);
    assert!(out.contains("Sync policy:  manual"), "{out}");
    assert!(
        out.contains(&format!("Synced at {}", &second[..12])),
        "{out}"
    );
    assert!(
        out.contains("apps/Deployment") && out.contains("CONDITIONS"),
        "{out}"
    );
    let (_, json, _) = app_cli(&["get", "web", "-n", n, "-o", "json"]);
    let object: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(object["kind"], "Application");
    assert_eq!(object["status"]["sync"]["revision"], second.as_str());

    let (code, out, _) = app_cli(&["history", "web", "-n", n]);
    assert_eq!(code, 0);
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "two syncs changed the cluster: {out}");
    assert!(
        rows[0].contains(&second[..12]) && rows[1].contains(&first[..12]),
        "{out}"
    );
    let (_, yaml, _) = app_cli(&["history", "web", "-n", n, "-o", "yaml"]);
    let history: Vec<serde_json::Value> = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(history[0]["revision"], second.as_str());
    assert_eq!(history[0]["applied"], 1);

    let (code, _, err) = app_cli(&["get", "missing", "-n", n]);
    assert_ne!(code, 0);
    assert!(
        err.contains(&format!("cannot read Application {n}/missing")),
        "{err}"
    );
}

#[tokio::test]
async fn app_get_and_list_never_print_a_password_from_the_repository_url() {
    let ns = TestNamespace::new("app-secret").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    let n = ns.name.as_str();
    // Nothing listens on port 9: every fetch fails, from the first.
    let url = "https://bot:s3cr3t-pass@127.0.0.1:9/org/repo.git";
    let mut app = Application::new(
        "web",
        ApplicationSpec {
            source: Source {
                repo_url: url.into(),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    app.metadata.namespace = Some(ns.name.clone());
    // As `kubectl apply` leaves it: the whole object again in an annotation.
    let last_applied = serde_json::to_string(&app).unwrap();
    app.metadata.annotations = Some(
        [(
            "kubectl.kubernetes.io/last-applied-configuration".to_string(),
            last_applied,
        )]
        .into(),
    );
    ns.api::<Application>()
        .create(&PostParams::default(), &app)
        .await
        .unwrap();

    let (code, out, err) = app_cli(&["sync", "web", "-n", n, "--cache-dir", cache_dir]);
    assert!(matches!(code, 2 | 3), "the fetch fails: {code} {out}{err}");
    assert!(!(out.clone() + &err).contains("s3cr3t"), "{out}{err}");

    let (code, table, _) = app_cli(&["get", "web", "-n", n]);
    assert_eq!(code, 0);
    assert!(
        table.contains("Repo:         https://127.0.0.1:9/org/repo.git"),
        "{table}"
    );
    // Never fetched, never assessed: Unknown, not Healthy.
    assert!(table.contains("Health:       Unknown"), "{table}");
    assert!(table.contains("FetchFailed"), "{table}");
    let (_, json, _) = app_cli(&["get", "web", "-n", n, "-o", "json"]);
    let object: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        object["spec"]["source"]["repoURL"],
        "https://127.0.0.1:9/org/repo.git"
    );
    assert_eq!(object["status"]["health"]["status"], "Unknown");
    assert!(
        object["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .is_some_and(|a| a.contains("https://127.0.0.1:9/org/repo.git")),
        "{json}"
    );
    let (_, yaml, _) = app_cli(&["get", "web", "-n", n, "-o", "yaml"]);
    let (_, list, _) = app_cli(&["list", "-n", n]);
    let (_, list_yaml, _) = app_cli(&["list", "-n", n, "-o", "yaml"]);
    let (_, list_json, _) = app_cli(&["list", "-n", n, "-o", "json"]);
    for out in [&table, &json, &yaml, &list, &list_yaml, &list_json] {
        assert!(!out.contains("s3cr3t"), "{out}");
        assert!(!out.contains("bot:"), "{out}");
    }
    let row: Vec<&str> = list.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[..3], ["web", "Unknown", "Unknown"], "{list}");
}
