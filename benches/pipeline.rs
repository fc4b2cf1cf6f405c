//! `make bench`: the whole service (`setpoint run` on RabbitMQ, release
//! build) against the real local control plane. Reports:
//! - webhook requests per second with signature checking (wrk, if present);
//! - webhook → Synced latency, and drift → corrected latency, p50/p99;
//! - fleets of Applications in one repository synced after a single push:
//!   time until all are Synced, and the peak memory of the process; then one
//!   sweep of the in-sync fleet (every Application enqueued once, as a sweep
//!   cycle does): its duration. For each phase, the Git requests the process
//!   sent (`setpoint_git_requests_total`).
//!
//! - split roles (one `webhook` and N `worker` processes on one RabbitMQ):
//!   reconciles per second for N = 1, 2, 4 and each process's peak memory.
//!
//! `SETPOINT_BENCH_FLEETS` (default `100,1000`) picks the fleet sizes,
//! `SETPOINT_BENCH_WORKERS` (default `1,2,4`) the worker counts,
//! `SETPOINT_BENCH_ONLY=workers` runs only the split-role part and
//! `SETPOINT_BENCH_ONLY=fleet` only the fleets; `SETPOINT_BENCH_SHAPE=mttp`
//! makes each fleet app the shape of Flux's MTTP benchmark (ServiceAccount,
//! Service, Deployment of 0 replicas, Ingress) instead of three ConfigMaps
//! and a ServiceAccount (`make bench-large`: 10,000 of them).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use setpoint::api::Sync;
use setpoint::event::AppKey;
use setpoint::ingest::sweep::sweep_event;
use setpoint::queue::Queue;
use support::app::{all_apps, automated, create_app, install_crd};
use support::process::{
    Setpoint, free_port, github_push, github_signature, post_github, sample, scrape,
    wait_for_shared_shards,
};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const SECRET: &str = "bench-secret";
const LATENCY_RUNS: usize = 20;

fn objects(app: usize, value: &str) -> Vec<(String, String)> {
    if std::env::var("SETPOINT_BENCH_SHAPE").is_ok_and(|shape| shape == "mttp") {
        return mttp_objects(app, value);
    }
    let mut files = Vec::new();
    for k in 0..3 {
        files.push((
            format!("apps/{app}/cm-{k}.yaml"),
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-{app}-{k}\ndata:\n  v: \"{value}\"\n"),
        ));
    }
    files.push((
        format!("apps/{app}/sa.yaml"),
        format!("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: app-{app}\n"),
    ));
    files
}

/// The shape of Flux's MTTP benchmark (`SETPOINT_BENCH_SHAPE=mttp`): a
/// ServiceAccount, a Service, a Deployment of 0 replicas and an Ingress.
/// Each app takes a ClusterIP: 10,000 apps need the /16 service range of
/// tests/controlplane/cluster.sh.
fn mttp_objects(app: usize, value: &str) -> Vec<(String, String)> {
    let name = format!("app-{app}");
    vec![
        (
            format!("apps/{app}/sa.yaml"),
            format!("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n"),
        ),
        (
            format!("apps/{app}/svc.yaml"),
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  labels: {{v: \"{value}\"}}\nspec:\n  selector: {{app: {name}}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
            ),
        ),
        (
            format!("apps/{app}/deploy.yaml"),
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: 0\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}, v: \"{value}\"}}}}\n    spec:\n      serviceAccountName: {name}\n      containers: [{{name: app, image: registry.invalid/app:{value}}}]\n"
            ),
        ),
        (
            format!("apps/{app}/ingress.yaml"),
            format!(
                "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  labels: {{v: \"{value}\"}}\nspec:\n  rules:\n  - host: {name}.example.com\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend: {{service: {{name: {name}, port: {{number: 80}}}}}}\n"
            ),
        ),
    ]
}

async fn all_synced(ns: &TestNamespace, commit: &str, count: usize) -> Result<(), String> {
    all_apps(ns, count, "synced", |s| {
        s.sync.status == Sync::Synced && s.sync.revision.as_deref() == Some(commit)
    })
    .await
}

fn peak_memory_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

/// The sum of every sample of `metric` (all its label sets).
fn total(metrics: &str, metric: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn git_requests(metrics_port: u16) -> f64 {
    total(
        &scrape(metrics_port).expect("metrics"),
        "setpoint_git_requests_total",
    )
}

fn start(ns: &TestNamespace, cache: &std::path::Path, prefix: &str) -> Setpoint {
    start_with_metrics(ns, cache, prefix, free_port())
}

/// `setpoint run` for the Applications of `ns` only: other tests' and
/// benchmarks' Applications (and their Git requests) stay out of the figures.
fn start_with_metrics(
    ns: &TestNamespace,
    cache: &std::path::Path,
    prefix: &str,
    metrics_port: u16,
) -> Setpoint {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{metrics_port}");
    let url = amqp_url();
    let args = [
        "run",
        "--listen",
        &listen,
        "--amqp-prefix",
        prefix,
        "--no-sweep",
        "--github-secret",
        SECRET,
    ];
    Setpoint::scoped(
        &ns.name,
        &args,
        &[
            ("SETPOINT_AMQP_URL", &url),
            ("SETPOINT_LOG", "warn"),
            ("SETPOINT_METRICS_LISTEN", &metrics),
        ],
        cache,
    )
}

async fn fleet(size: usize) {
    let ns = TestNamespace::new("fleet").await;
    let repo = GitRepo::new();
    for app in 0..size {
        for (path, text) in objects(app, "1") {
            repo.write(&path, &text);
        }
    }
    let first = repo.commit("fleet");
    for app in 0..size {
        create_app(
            &ns,
            &format!("app-{app}"),
            &repo.url(),
            &format!("apps/{app}"),
            automated(true, true),
        )
        .await;
    }
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("fleet");
    let started = Instant::now();
    let metrics_port = free_port();
    let mut setpoint = start_with_metrics(&ns, cache.path(), &prefix, metrics_port);
    setpoint.wait_http().await;
    let deadline = Duration::from_secs(1800);
    wait_for("the first sync of the fleet", deadline, || {
        all_synced(&ns, &first, size)
    })
    .await;
    let initial = started.elapsed();
    let git_initial = git_requests(metrics_port);

    for app in 0..size {
        for (path, text) in objects(app, "2") {
            repo.write(&path, &text);
        }
    }
    let second = repo.commit("fleet v2");
    // One push; its file list is left out (as in a large push), so every app
    // of the repository is enqueued.
    let mut body: serde_json::Value =
        serde_json::from_str(&github_push(&repo.url(), &second, &[])).unwrap();
    body["commits"] = serde_json::json!([]);
    let body = body.to_string();
    let port = setpoint.port.unwrap();
    let pushed = Instant::now();
    let (code, _) = post_github(port, Some(SECRET), "fleet-push", &body);
    assert_eq!(code, 200);
    wait_for("the fleet at the second commit", deadline, || {
        all_synced(&ns, &second, size)
    })
    .await;
    let after_push = pushed.elapsed();
    let git_push = git_requests(metrics_port) - git_initial;

    // One sweep cycle of the in-sync fleet: every Application enqueued once,
    // as the sweep enqueues them.
    let queue = setpoint::queue::amqp::AmqpQueue::connect(setpoint::queue::amqp::AmqpSettings {
        url: amqp_url(),
        prefix,
        ..Default::default()
    })
    .await;
    let reconciles = || {
        total(
            &scrape(metrics_port).unwrap_or_default(),
            "setpoint_reconciles_total",
        )
    };
    let before_sweep = reconciles();
    let git_before_sweep = git_requests(metrics_port);
    let swept = Instant::now();
    // One cycle: every event bounded by the cycle's start.
    let cycle_start = std::time::SystemTime::now();
    for app in 0..size {
        let key = AppKey::new(ns.name.clone(), format!("app-{app}"));
        queue.publish(&sweep_event(key, cycle_start)).await.unwrap();
    }
    wait_for("the sweep of the fleet", deadline, || async {
        let done = reconciles() - before_sweep;
        if done >= size as f64 {
            Ok(())
        } else {
            Err(format!("{done} of {size} swept"))
        }
    })
    .await;
    let sweep = swept.elapsed();
    let git_sweep = git_requests(metrics_port) - git_before_sweep;
    println!(
        "  fleet of {size:>4} apps x 4 objects: first sync {:>6.1} s, after one push {:>6.1} s until all Synced, a sweep {:>6.1} s; peak RSS of setpoint run {:.0} MiB",
        initial.as_secs_f64(),
        after_push.as_secs_f64(),
        sweep.as_secs_f64(),
        peak_memory_mib(setpoint.child.id())
    );
    println!(
        "  fleet of {size:>4} apps: Git requests: first sync {git_initial:.0}, per push {git_push:.0}, per sweep {git_sweep:.0}"
    );
    if git_push > 1.0 || git_sweep > 1.0 {
        // Why more than one: the process's warnings about Git.
        let logs = setpoint.logs();
        let lines: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("fetch") || l.contains("git"))
            .collect();
        println!(
            "  {} warnings about Git, the last ones:\n{}",
            lines.len(),
            lines[lines.len().saturating_sub(5)..].join("\n")
        );
    }
    drop(setpoint);
    queue.delete_topology().await.ok();
}

async fn latencies() {
    let ns = TestNamespace::new("latency").await;
    let repo = GitRepo::new();
    for (path, text) in objects(0, "0") {
        repo.write(&path, &text);
    }
    let mut commit = repo.commit("one app");
    create_app(&ns, "app-0", &repo.url(), "apps/0", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("latency");
    let mut setpoint = start(&ns, cache.path(), &prefix);
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    wait_for("the first sync", Duration::from_secs(60), || {
        all_synced(&ns, &commit, 1)
    })
    .await;

    // Webhook → Synced.
    let mut webhook = Vec::new();
    for run in 1..=LATENCY_RUNS {
        for (path, text) in objects(0, &run.to_string()) {
            repo.write(&path, &text);
        }
        commit = repo.commit(&format!("run {run}"));
        let body = github_push(&repo.url(), &commit, &["apps/0/cm-0.yaml"]);
        let start = Instant::now();
        assert_eq!(
            post_github(port, Some(SECRET), &format!("lat-{run}"), &body).0,
            200
        );
        wait_for("synced", Duration::from_secs(30), || {
            all_synced(&ns, &commit, 1)
        })
        .await;
        webhook.push(start.elapsed());
    }

    // Drift → corrected: someone edits a ConfigMap; the watch sees it.
    let config_maps = ns.api::<ConfigMap>();
    let edit = PatchParams {
        field_manager: Some("kubectl-edit".into()),
        ..Default::default()
    };
    let mut drift = Vec::new();
    for run in 0..LATENCY_RUNS {
        let start = Instant::now();
        let patch = Patch::Merge(serde_json::json!({"data": {"v": format!("by-hand-{run}")}}));
        config_maps.patch("app-0-0", &edit, &patch).await.unwrap();
        loop {
            let live = config_maps.get("app-0-0").await.unwrap();
            if live.data.unwrap_or_default().get("v").map(String::as_str)
                == Some(&LATENCY_RUNS.to_string())
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "drift not corrected"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drift.push(start.elapsed());
    }
    webhook.sort();
    drift.sort();
    println!(
        "  webhook -> Synced:     p50 {:>6.1} ms  p99 {:>6.1} ms  ({LATENCY_RUNS} pushes)",
        percentile(&webhook, 0.5),
        percentile(&webhook, 0.99)
    );
    println!(
        "  drift -> corrected:    p50 {:>6.1} ms  p99 {:>6.1} ms  ({LATENCY_RUNS} edits)",
        percentile(&drift, 0.5),
        percentile(&drift, 0.99)
    );

    // Webhook throughput: signed pings (signature check, parse, answer).
    if std::process::Command::new("wrk")
        .arg("--version")
        .output()
        .is_ok()
    {
        let body = r#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("ping.lua");
        std::fs::write(
            &script,
            format!(
                "wrk.method = \"POST\"\nwrk.body = '{body}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"X-GitHub-Event\"] = \"ping\"\nwrk.headers[\"X-Hub-Signature-256\"] = \"{}\"\n",
                github_signature(SECRET, body)
            ),
        )
        .unwrap();
        let out = std::process::Command::new("wrk")
            .args(["-t2", "-c32", "-d5s", "-s", script.to_str().unwrap()])
            .arg(format!("http://127.0.0.1:{port}/api/webhooks/github"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let rps = text
            .lines()
            .find(|l| l.starts_with("Requests/sec"))
            .unwrap_or("Requests/sec: ?");
        let non2xx = text
            .lines()
            .find(|l| l.contains("Non-2xx"))
            .unwrap_or("all 2xx");
        println!(
            "  webhook, signed pings: {} ({}; wrk -t2 -c32 -d5s)",
            rps.trim(),
            non2xx.trim()
        );
    }
    println!(
        "  peak RSS of setpoint run (latency runs): {:.0} MiB",
        peak_memory_mib(setpoint.child.id())
    );
    drop(setpoint);
}

#[tokio::main]
async fn main() {
    let ns = TestNamespace::new("bench-crd").await;
    install_crd(&ns.client).await;
    println!("pipeline benchmark (setpoint on RabbitMQ, local control plane, 2 cores)");
    let only = std::env::var("SETPOINT_BENCH_ONLY").unwrap_or_default();
    if only != "workers" {
        if only != "fleet" {
            latencies().await;
        }
        let fleets = std::env::var("SETPOINT_BENCH_FLEETS").unwrap_or_else(|_| "100,1000".into());
        for size in fleets.split(',').filter_map(|s| s.trim().parse().ok()) {
            fleet(size).await;
        }
    }
    if only == "fleet" {
        return;
    }
    let workers = std::env::var("SETPOINT_BENCH_WORKERS").unwrap_or_else(|_| "1,2,4".into());
    for count in workers.split(',').filter_map(|s| s.trim().parse().ok()) {
        split_roles(count, 300).await;
    }
}

/// `apps` Applications of one ConfigMap each, first-synced by `workers`
/// worker processes from events a webhook published after one push.
async fn split_roles(workers: usize, apps: usize) {
    let ns = TestNamespace::new("split").await;
    let repo = GitRepo::new();
    for app in 0..apps {
        repo.write(
            &format!("apps/{app}/cm.yaml"),
            &format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-{app}\ndata: {{v: \"1\"}}\n"),
        );
    }
    let commit = repo.commit("split roles");
    for app in 0..apps {
        let path = format!("apps/{app}");
        create_app(
            &ns,
            &format!("app-{app}"),
            &repo.url(),
            &path,
            automated(true, true),
        )
        .await;
    }
    let prefix = amqp_prefix("split");
    let url = amqp_url();
    let cache = tempfile::tempdir().unwrap();
    let env = [
        ("SETPOINT_AMQP_URL", url.as_str()),
        ("SETPOINT_LOG", "warn"),
    ];
    let listen = format!("127.0.0.1:{}", free_port());
    let webhook_metrics_port = free_port();
    let webhook_metrics = format!("127.0.0.1:{webhook_metrics_port}");
    let mut webhook_env = env.to_vec();
    webhook_env.push(("SETPOINT_METRICS_LISTEN", webhook_metrics.as_str()));
    let mut webhook = Setpoint::scoped(
        &ns.name,
        &[
            "webhook",
            "--listen",
            &listen,
            "--amqp-prefix",
            &prefix,
            "--github-secret",
            SECRET,
        ],
        &webhook_env,
        cache.path(),
    );
    let mut pool = Vec::new();
    let mut ports = Vec::new();
    for i in 0..workers {
        let dir = cache.path().join(format!("w{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        ports.push(port);
        let metrics = format!("127.0.0.1:{port}");
        let mut env = env.to_vec();
        env.push(("SETPOINT_METRICS_LISTEN", metrics.as_str()));
        pool.push(Setpoint::scoped(
            &ns.name,
            &[
                "worker",
                "--amqp-prefix",
                &prefix,
                "--concurrency",
                "8",
                "--balance-interval",
                "500ms",
            ],
            &env,
            &dir,
        ));
    }
    webhook.wait_http().await;
    // The push comes once the workers share the 16 shards evenly, as on a
    // fleet that has been running, and the webhook's index holds every app.
    wait_for_shared_shards(&ports, 16 / workers).await;
    wait_for(
        "the webhook to index every app",
        Duration::from_secs(60),
        || async {
            let metrics = scrape(webhook_metrics_port)?;
            match sample(&metrics, "setpoint_applications_indexed") {
                Some(n) if n as usize >= apps => Ok(()),
                n => Err(format!("{n:?} indexed")),
            }
        },
    )
    .await;
    let port = webhook.port.unwrap();
    let changed: Vec<String> = (0..apps).map(|app| format!("apps/{app}/cm.yaml")).collect();
    let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
    let body = github_push(&repo.url(), &commit, &changed);
    let started = Instant::now();
    let (code, reply) = post_github(port, Some(SECRET), &support::unique_name("d"), &body);
    assert_eq!(code, 200, "{reply}");
    assert!(
        reply.matches("app-").count() >= apps,
        "the push reaches every app: {reply}"
    );
    wait_for("every app synced", Duration::from_secs(600), || {
        all_synced(&ns, &commit, apps)
    })
    .await;
    let took = started.elapsed();
    let memory: Vec<String> = pool
        .iter()
        .map(|w| format!("{:.0}", peak_memory_mib(w.child.id())))
        .collect();
    println!(
        "  split roles, {workers} worker process(es): {apps} apps first-synced in {:.1} s = {:.0} reconciles/s; peak RSS per worker {} MiB, webhook {:.0} MiB",
        took.as_secs_f64(),
        apps as f64 / took.as_secs_f64(),
        memory.join(", "),
        peak_memory_mib(webhook.child.id())
    );
}
