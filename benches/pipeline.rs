//! `make bench`: the whole service (`setpoint run` on RabbitMQ, release
//! build) against the real local control plane. Reports:
//! - webhook requests per second with signature checking (wrk, if present);
//! - webhook → Synced latency, and drift → corrected latency, p50/p99;
//! - fleets of Applications: the first sync, one commit per repository
//!   changing every app (one push each), and one sweep of the in-sync fleet
//!   (every Application enqueued once, as a sweep cycle does). For each
//!   phase, its time, the CPU seconds of the process and of the API server
//!   with etcd (API CPU), the API requests it
//!   sent (`setpoint_api_requests_total`: reads, writes, dry runs) and its
//!   Git requests (`setpoint_git_requests_total`); then the peak RSS of
//!   `setpoint run` and the RSS of kube-apiserver and etcd.
//!
//! - split roles (one `webhook` and N `worker` processes on one RabbitMQ):
//!   reconciles per second for N = 1, 2, 4 and each process's peak memory.
//!
//! `SETPOINT_BENCH_FLEETS` (default `100,1000`) picks the fleet sizes,
//! `SETPOINT_BENCH_REPOS` (default `1`) how many repositories a fleet is
//! spread over, `SETPOINT_BENCH_NAMESPACES` (default `1`) how many namespaces
//! its objects are spread over (1: all in the Applications' namespace, as in
//! Flux's MTTP benchmark; N > 1: app `i`'s in the `i % N`th of N namespaces
//! of their own), `SETPOINT_BENCH_CONCURRENCY` (default `16`, the default) the
//! `--concurrency` values to compare,
//! `SETPOINT_BENCH_WORKERS` (default `1,2,4`) the worker counts,
//! `SETPOINT_BENCH_ONLY=workers` runs only the split-role part and
//! `SETPOINT_BENCH_ONLY=fleet` only the fleets; `SETPOINT_BENCH_SHAPE=mttp`
//! makes each fleet app the shape of Flux's MTTP benchmark (ServiceAccount,
//! Service, Deployment of 0 replicas, Ingress) instead of three ConfigMaps
//! and a ServiceAccount (`make bench-large`: 10,000 of them).

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Patch, PatchParams};
use setpoint::api::{Health, Sync};
use setpoint::event::AppKey;
use setpoint::ingest::sweep::sweep_event;
use setpoint::queue::Queue;
use support::app::{AppWatch, all_apps, automated, create_app, install_crd};
use support::process::{
    Setpoint, free_port, github_push, github_signature, post_github, sample, scrape,
    wait_for_shared_shards,
};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const SECRET: &str = "bench-secret";
const LATENCY_RUNS: usize = 20;

/// App `app`'s files; its objects name `namespace` when given, else they
/// go to the Application's.
fn objects(app: usize, value: &str, namespace: Option<&str>) -> Vec<(String, String)> {
    let ns = namespace
        .map(|ns| format!("  namespace: {ns}\n"))
        .unwrap_or_default();
    if std::env::var("SETPOINT_BENCH_SHAPE").is_ok_and(|shape| shape == "mttp") {
        return mttp_objects(app, value, &ns);
    }
    let mut files = Vec::new();
    for k in 0..3 {
        files.push((
            format!("apps/{app}/cm-{k}.yaml"),
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-{app}-{k}\n{ns}data:\n  v: \"{value}\"\n"),
        ));
    }
    files.push((
        format!("apps/{app}/sa.yaml"),
        format!("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: app-{app}\n{ns}"),
    ));
    files
}

/// The shape of Flux's MTTP benchmark (`SETPOINT_BENCH_SHAPE=mttp`): a
/// ServiceAccount, a Service, a Deployment of 0 replicas and an Ingress.
/// Each app takes a ClusterIP: 10,000 apps need the /16 service range of
/// tests/controlplane/cluster.sh.
/// `ns` is a `namespace:` line of metadata, or nothing.
fn mttp_objects(app: usize, value: &str, ns: &str) -> Vec<(String, String)> {
    let name = format!("app-{app}");
    vec![
        (
            format!("apps/{app}/sa.yaml"),
            format!("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n{ns}"),
        ),
        (
            format!("apps/{app}/svc.yaml"),
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n{ns}  labels: {{v: \"{value}\"}}\nspec:\n  selector: {{app: {name}}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
            ),
        ),
        (
            format!("apps/{app}/deploy.yaml"),
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n{ns}spec:\n  replicas: 0\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}, v: \"{value}\"}}}}\n    spec:\n      serviceAccountName: {name}\n      containers: [{{name: app, image: registry.invalid/app:{value}}}]\n"
            ),
        ),
        (
            format!("apps/{app}/ingress.yaml"),
            format!(
                "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n{ns}  labels: {{v: \"{value}\"}}\nspec:\n  rules:\n  - host: {name}.example.com\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend: {{service: {{name: {name}, port: {{number: 80}}}}}}\n"
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

fn start(ns: &TestNamespace, cache: &std::path::Path, prefix: &str) -> Setpoint {
    start_with_metrics(ns, cache, prefix, free_port(), 8)
}

/// `setpoint run` for the Applications of `ns` only: other tests' and
/// benchmarks' Applications (and their Git requests) stay out of the figures.
fn start_with_metrics(
    ns: &TestNamespace,
    cache: &std::path::Path,
    prefix: &str,
    metrics_port: u16,
    concurrency: usize,
) -> Setpoint {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{metrics_port}");
    let url = amqp_url();
    let concurrency = concurrency.to_string();
    let args = [
        "run",
        "--listen",
        &listen,
        "--amqp-prefix",
        prefix,
        "--no-sweep",
        "--github-secret",
        SECRET,
        "--concurrency",
        &concurrency,
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

/// What one process has cost so far: CPU, API requests, Git requests.
#[derive(Clone, Copy, Default)]
struct Cost {
    cpu_seconds: f64,
    /// The API server's (and etcd's) CPU seconds: whether it is the limit.
    apiserver_cpu: f64,
    reads: f64,
    writes: f64,
    dry_runs: f64,
    git: f64,
}

impl Cost {
    fn of(pid: u32, metrics_port: u16) -> Self {
        let metrics = scrape(metrics_port).expect("metrics");
        let api = |kind: &str| {
            sample(
                &metrics,
                &format!(r#"setpoint_api_requests_total{{kind="{kind}"}}"#),
            )
            .unwrap_or(0.0)
        };
        Self {
            cpu_seconds: cpu_seconds(pid),
            apiserver_cpu: Self::apiserver_cpu(),
            reads: api("read"),
            writes: api("write"),
            dry_runs: api("dry_run"),
            git: total(&metrics, "setpoint_git_requests_total"),
        }
    }
}

impl Cost {
    fn apiserver_cpu() -> f64 {
        ["kube-apiserver", "etcd"]
            .into_iter()
            .flat_map(pids_of)
            .map(cpu_seconds)
            .sum()
    }
}

impl std::ops::Sub for Cost {
    type Output = Cost;
    fn sub(self, earlier: Cost) -> Cost {
        Cost {
            cpu_seconds: self.cpu_seconds - earlier.cpu_seconds,
            apiserver_cpu: self.apiserver_cpu - earlier.apiserver_cpu,
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            dry_runs: self.dry_runs - earlier.dry_runs,
            git: self.git - earlier.git,
        }
    }
}

/// User and system CPU time of a process (`/proc/PID/stat`, clock ticks of
/// 1/100 s).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // After the command: state is field 3, utime 14 and stime 15.
    let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok());
    (ticks(14).unwrap_or(0.0) + ticks(15).unwrap_or(0.0)) / 100.0
}

/// As `wait_for`, checking every 2 seconds: a check that scrapes
/// `/metrics` (tens of MB at 10,000 Applications, whose series are per
/// Application) would otherwise load the process it measures.
async fn wait_every<F, Fut>(what: &str, deadline: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(()) => return,
            Err(state) => state,
        };
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}; last state: {last}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The processes named `name`.
fn pids_of(name: &str) -> Vec<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-x", name])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines()
        .filter_map(|pid| pid.trim().parse().ok())
        .collect()
}

/// Resident memory now (VmRSS) of the processes named `name`, in MiB.
fn rss_of(name: &str) -> f64 {
    pids_of(name)
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .filter_map(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .sum::<f64>()
        / 1024.0
}

fn phase_line(size: usize, phase: &str, took: Duration, cost: Cost) {
    println!(
        "  | {size:>6} | {phase:<22} | {:>8.1} s | {:>7.1} s | {:>7.1} s | {:>8.0} | {:>7.0} | {:>8.0} | {:>4.0} |",
        took.as_secs_f64(),
        cost.cpu_seconds,
        cost.apiserver_cpu,
        cost.reads,
        cost.writes,
        cost.dry_runs,
        cost.git,
    );
}

/// The list in `var` (comma-separated numbers), or `default`.
fn list(var: &str, default: &str) -> Vec<usize> {
    std::env::var(var)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

/// `size` Applications spread over `repos` repositories (app `i` in
/// repository `i % repos`) and their objects over `spread` namespaces (see
/// the module's comment), synced by one `setpoint run` of `concurrency`
/// reconciles at once: the first sync, one commit per repository changing
/// every app (one push each), and one sweep cycle of the in-sync fleet.
async fn fleet(size: usize, repos: usize, spread: usize, concurrency: usize) {
    let ns = TestNamespace::new("fleet").await;
    let mut targets = Vec::new();
    if spread > 1 {
        for _ in 0..spread {
            targets.push(TestNamespace::new("fleet-objects").await);
        }
    }
    let target = |app: usize| (!targets.is_empty()).then(|| targets[app % spread].name.as_str());
    let repositories: Vec<GitRepo> = (0..repos).map(|_| GitRepo::new()).collect();
    let write_all = |value: &str| {
        for app in 0..size {
            for (path, text) in objects(app, value, target(app)) {
                repositories[app % repos].write(&path, &text);
            }
        }
    };
    write_all("1");
    let first: Vec<String> = repositories.iter().map(|r| r.commit("fleet")).collect();
    for app in 0..size {
        create_app(
            &ns,
            &format!("app-{app}"),
            &repositories[app % repos].url(),
            &format!("apps/{app}"),
            automated(true, true),
        )
        .await;
    }
    // The fleet's state from a watch: listing thousands of Applications at
    // each poll would load the API server as much as Setpoint does.
    let watch = AppWatch::start(&ns).await;
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("fleet");
    // The API server's CPU so far: the first sync's is counted from here.
    let before = Cost {
        apiserver_cpu: Cost::apiserver_cpu(),
        ..Default::default()
    };
    let started = Instant::now();
    let metrics_port = free_port();
    let mut setpoint = start_with_metrics(&ns, cache.path(), &prefix, metrics_port, concurrency);
    setpoint.wait_http().await;
    let pid = setpoint.child.id();
    let deadline = Duration::from_secs(3600);
    let synced_at = |commits: Vec<String>| {
        let watch = &watch;
        async move {
            watch.all(size, "synced", |s| {
                s.sync.status == Sync::Synced
                    && s.sync
                        .revision
                        .as_deref()
                        .is_some_and(|r| commits.iter().any(|c| c == r))
            })
        }
    };
    // Each app is matched against its own repository's commit by the name
    // of the commit it is at: every repository's commit is distinct.
    wait_for("the first sync of the fleet", deadline, || {
        synced_at(first.clone())
    })
    .await;
    let initial = started.elapsed();
    let at_first_sync = Cost::of(pid, metrics_port);
    let initial_cost = at_first_sync - before;
    // Each phase's line as it ends: a 10,000-app run takes over half an hour.
    phase_line(size, "first sync", initial, initial_cost);

    write_all("2");
    let second: Vec<String> = repositories.iter().map(|r| r.commit("fleet v2")).collect();
    let port = setpoint.port.unwrap();
    let pushed = Instant::now();
    for (repo, commit) in repositories.iter().zip(&second) {
        // One push per repository; its file list is left out (as in a
        // large push), so every app of the repository is enqueued.
        let mut body: serde_json::Value =
            serde_json::from_str(&github_push(&repo.url(), commit, &[])).unwrap();
        body["commits"] = serde_json::json!([]);
        let (code, reply) = post_github(
            port,
            Some(SECRET),
            &support::unique_name("fleet-push"),
            &body.to_string(),
        );
        assert_eq!(code, 200, "{reply}");
    }
    wait_for("the fleet at the second commit", deadline, || {
        synced_at(second.clone())
    })
    .await;
    let after_push = pushed.elapsed();
    let push_cost = Cost::of(pid, metrics_port) - at_first_sync;
    phase_line(size, "one commit changes all", after_push, push_cost);

    // One sweep cycle of the in-sync fleet: every Application enqueued once,
    // as the sweep enqueues them. First the rollouts the push started settle
    // (every app Healthy, nothing left in the queue), so that the sweep
    // measures a fleet where nothing moves.
    wait_for(
        "the fleet healthy at the second commit",
        deadline,
        || async {
            watch.all(size, "healthy", |s| {
                s.health.status == Health::Healthy
                    && s.sync
                        .revision
                        .as_deref()
                        .is_some_and(|r| second.iter().any(|c| c == r))
            })
        },
    )
    .await;
    wait_every("the queue drained", deadline, || async {
        match sample(&scrape(metrics_port)?, "setpoint_queue_messages_ready") {
            Some(0.0) => Ok(()),
            ready => Err(format!("{ready:?} ready")),
        }
    })
    .await;
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
    let sweep_start_cost = Cost::of(pid, metrics_port);
    let swept = Instant::now();
    // One cycle: every event bounded by the cycle's start.
    let cycle_start = std::time::SystemTime::now();
    for app in 0..size {
        let key = AppKey::new(ns.name.clone(), format!("app-{app}"));
        queue.publish(&sweep_event(key, cycle_start)).await.unwrap();
    }
    wait_every("the sweep of the fleet", deadline, || async {
        let done = reconciles() - before_sweep;
        if done >= size as f64 {
            Ok(())
        } else {
            Err(format!("{done} of {size} swept"))
        }
    })
    .await;
    let sweep = swept.elapsed();
    let sweep_cost = Cost::of(pid, metrics_port) - sweep_start_cost;
    phase_line(size, "no-op sweep", sweep, sweep_cost);
    println!(
        "  |        | {repos} repo(s), objects in {spread} namespace(s), concurrency {concurrency}: peak RSS setpoint {:.0} MiB; RSS now kube-apiserver {:.0} MiB, etcd {:.0} MiB; Git requests per push {:.1} per repository |",
        peak_memory_mib(pid),
        rss_of("kube-apiserver"),
        rss_of("etcd"),
        push_cost.git / repos as f64,
    );
    if push_cost.git > repos as f64 || sweep_cost.git > repos as f64 {
        // Why more than one per repository: the process's lines about Git.
        let logs = setpoint.logs();
        let lines: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("fetch") || l.contains("git"))
            .collect();
        println!(
            "  {} lines about Git, the last ones:\n{}",
            lines.len(),
            lines[lines.len().saturating_sub(5)..].join("\n")
        );
    }
    drop(setpoint);
    queue.delete_topology().await.ok();
    // The next fleet starts on an API server that is done deleting this one
    // (tens of thousands of objects at 10,000 apps).
    let namespaces = kube::Api::<Namespace>::all(ns.client.clone());
    let names: Vec<&str> = std::iter::once(&ns)
        .chain(&targets)
        .map(|ns| ns.name.as_str())
        .collect();
    for name in &names {
        namespaces.delete(name, &Default::default()).await.ok();
    }
    wait_for("the fleet's namespaces deleted", deadline, || async {
        for name in &names {
            match namespaces.get_opt(name).await {
                Ok(None) => {}
                Ok(Some(_)) => return Err(format!("{name} still there")),
                Err(error) => return Err(error.to_string()),
            }
        }
        Ok(())
    })
    .await;
}

async fn latencies() {
    let ns = TestNamespace::new("latency").await;
    let repo = GitRepo::new();
    for (path, text) in objects(0, "0", None) {
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
        for (path, text) in objects(0, &run.to_string(), None) {
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
        println!(
            "  | apps   | phase                  |     time |     CPU | API CPU | API reads | writes | dry runs |  Git |"
        );
        for size in list("SETPOINT_BENCH_FLEETS", "100,1000") {
            for repos in list("SETPOINT_BENCH_REPOS", "1") {
                for spread in list("SETPOINT_BENCH_NAMESPACES", "1") {
                    for concurrency in list("SETPOINT_BENCH_CONCURRENCY", "16") {
                        fleet(size, repos, spread, concurrency).await;
                    }
                }
            }
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
