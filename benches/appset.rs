//! `make bench` (appset): an ApplicationSet's git directories generator at
//! scale, with `setpoint run` on RabbitMQ (as benches/floor.rs runs it:
//! `--no-sweep`, `--concurrency 16`) against the real local control plane,
//! one local repository driven by the git CLI, signed GitHub pushes.
//!
//! One set, `fleet`: a `git.directories` generator on `apps/*` and an
//! automated template (`{{ path.basename }}`, path `{{ path }}`, the bench's
//! namespace). Each directory `apps/app-NNNN/` holds one ConfigMap named
//! after it: light objects, so what is measured is Setpoint and the API
//! server, not pods. The set is created against a commit with no
//! directory (it owns 0 Applications), then:
//!
//! 1. one commit adding `SETPOINT_BENCH_APPSET_DIRS` (default 1,000)
//!    directories, one push listing its files: the time from the push to
//!    every Application created, to all Synced at the commit and Healthy,
//!    and to the set's status summary saying so;
//! 2. 20 times: a commit adding one more directory, its push, and the time
//!    from the push to that Application created and Synced at the commit
//!    (p50, p99 and max; with 20 samples the p99 is the max).
//!
//! Also: what Setpoint counts it sent the API server
//! (`setpoint_api_requests_total`), its set evaluations by result and its
//! reconciles for each phase, and the peak RSS of `setpoint run`. The
//! namespace is deleted at the end (and waited for). Run it alone with
//! `cargo bench --bench appset` (KUBECONFIG, SETPOINT_KUBECTL and
//! SETPOINT_HELM as the Makefile sets them, RabbitMQ up);
//! `SETPOINT_BENCH_LOG=info` keeps Setpoint's log and names it at the end.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use setpoint::api::{Application, ApplicationSet, ConditionStatus, ConditionType, Health, Sync};
use support::app::install_appset_crd;
use support::process::{Setpoint, free_port, github_push, post_github, sample, scrape};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, unique_name, wait_for};

const SECRET: &str = "bench-secret";
const SET: &str = "fleet";
const ADDED: usize = 20;
/// The whole of phase 1 (the task's bound is well under 10 minutes).
const DEADLINE: Duration = Duration::from_secs(1200);
/// One added directory.
const ONE_DEADLINE: Duration = Duration::from_secs(120);
/// How often the stores are looked at while a time is taken.
const POLL: Duration = Duration::from_millis(5);

/// Setpoint's `--concurrency`: `SETPOINT_BENCH_CONCURRENCY`, default 16 (its default).
fn concurrency() -> String {
    std::env::var("SETPOINT_BENCH_CONCURRENCY").unwrap_or_else(|_| "16".into())
}

fn dirs() -> usize {
    std::env::var("SETPOINT_BENCH_APPSET_DIRS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1000)
}

fn app_name(i: usize) -> String {
    format!("app-{i:04}")
}

/// Directory `i`'s one file: its path and a ConfigMap named after it.
fn directory(i: usize) -> (String, String) {
    let name = app_name(i);
    (
        format!("apps/{name}/cm.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: value\n"
        ),
    )
}

fn fleet_set(ns: &TestNamespace, repo: &GitRepo) -> ApplicationSet {
    serde_json::from_value(json!({
        "apiVersion": "setpoint.dev/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": { "name": SET, "namespace": ns.name },
        "spec": {
            "generators": [{ "git": {
                "repoURL": repo.url(),
                "directories": [{ "path": "apps/*" }]
            }}],
            "template": {
                "metadata": { "name": "{{ path.basename }}" },
                "spec": {
                    "source": { "repoURL": repo.url(), "path": "{{ path }}" },
                    "destination": { "namespace": ns.name },
                    "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
                }
            }
        }
    }))
    .unwrap()
}

/// The bench namespace's Applications as a watch sees them (one list, then
/// WATCH): polling it costs the API server nothing.
struct Apps {
    store: Store<Application>,
    namespace: String,
    task: tokio::task::JoinHandle<()>,
}

impl Apps {
    async fn start(ns: &TestNamespace) -> Self {
        use kube::runtime::{WatchStreamExt, watcher};
        let (store, writer) = reflector::store();
        let stream = watcher(ns.api::<Application>(), watcher::Config::default())
            .modify(|app| app.managed_fields_mut().clear())
            .reflect(writer)
            .applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while stream.next().await.is_some() {}
        });
        store
            .wait_until_ready()
            .await
            .expect("the Application watch lists");
        Self {
            store,
            namespace: ns.name.clone(),
            task,
        }
    }

    /// The Applications the set owns: (count, Synced at `commit`, and of
    /// those also Healthy).
    fn counts(&self, commit: &str) -> (usize, usize, usize) {
        let (mut owned, mut synced, mut healthy) = (0, 0, 0);
        for app in self.store.state() {
            if !app
                .owner_references()
                .iter()
                .any(|r| r.kind == "ApplicationSet" && r.name == SET)
            {
                continue;
            }
            owned += 1;
            if synced_at(&app, commit) {
                synced += 1;
                if app
                    .status
                    .as_ref()
                    .is_some_and(|s| s.health.status == Health::Healthy)
                {
                    healthy += 1;
                }
            }
        }
        (owned, synced, healthy)
    }

    fn get(&self, name: &str) -> Option<std::sync::Arc<Application>> {
        self.store
            .get(&ObjectRef::new(name).within(&self.namespace))
    }
}

impl Drop for Apps {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn synced_at(app: &Application, commit: &str) -> bool {
    app.status.as_ref().is_some_and(|s| {
        s.sync.status == Sync::Synced && s.sync.revision.as_deref() == Some(commit)
    })
}

/// Polls `done` every `POLL` until it is true; the time from `since`, or a
/// panic with `state()` at the deadline.
async fn until(
    what: &str,
    since: Instant,
    deadline: Duration,
    done: impl Fn() -> bool,
    state: impl Fn() -> String,
) -> Duration {
    loop {
        if done() {
            return since.elapsed();
        }
        if since.elapsed() > deadline {
            panic!(
                "timed out after {deadline:?} waiting for {what}; last state: {}",
                state()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

fn push(port: u16, repo: &GitRepo, commit: &str, changed: &[&str]) {
    let (code, reply) = post_github(
        port,
        Some(SECRET),
        &unique_name("appset-push"),
        &github_push(&repo.url(), commit, changed),
    );
    assert_eq!(code, 200, "{reply}");
}

/// The set's status summary and Ready condition, as a string for waits.
async fn set_state(ns: &TestNamespace) -> (ApplicationSet, String) {
    let set = ns
        .api::<ApplicationSet>()
        .get(SET)
        .await
        .expect("get the ApplicationSet");
    let status = set.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready)
        .map(|c| format!("Ready={:?} {}: {}", c.status, c.reason, c.message))
        .unwrap_or_else(|| "no Ready condition".into());
    let state = format!("{:?}; {ready}", status.summary);
    (set, state)
}

/// `Ok` once the set's status says it owns `count` Applications, all
/// Synced and Healthy, Ready=True for its current generation.
async fn set_settled(ns: &TestNamespace, count: u32) -> Result<(), String> {
    let (set, state) = set_state(ns).await;
    let status = set.status.unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .any(|c| c.type_ == ConditionType::Ready && c.status == ConditionStatus::True);
    let summary = &status.summary;
    if ready
        && status.observed_generation == set.metadata.generation
        && summary.applications == count
        && summary.synced == count
        && summary.healthy == count
    {
        Ok(())
    } else {
        Err(state)
    }
}

/// What Setpoint's /metrics say: requests sent (read, write, dry_run), set
/// evaluations by result, reconciles, the events ready in its queue.
#[derive(Clone, Default)]
struct Counts {
    requests: [f64; 3],
    evaluations: BTreeMap<String, f64>,
    reconciles: f64,
}

impl Counts {
    fn scrape(port: u16) -> Self {
        let text = scrape(port).expect("setpoint's metrics");
        let requests = ["read", "write", "dry_run"].map(|kind| {
            sample(
                &text,
                &format!(r#"setpoint_api_requests_total{{kind="{kind}"}}"#),
            )
            .unwrap_or(0.0)
        });
        let mut evaluations = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("setpoint_appset_evaluations_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let result = labels
                .split(',')
                .find_map(|l| l.strip_prefix("result=\""))
                .map(|r| r.trim_end_matches('"').to_string())
                .unwrap_or_default();
            *evaluations.entry(result).or_insert(0.0) += value.trim().parse().unwrap_or(0.0);
        }
        let reconciles = text
            .lines()
            .filter(|l| l.starts_with("setpoint_reconcile_duration_seconds_count"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        Self {
            requests,
            evaluations,
            reconciles,
        }
    }

    fn since(&self, earlier: &Counts) -> Counts {
        let mut evaluations = self.evaluations.clone();
        for (result, n) in &mut evaluations {
            *n -= earlier.evaluations.get(result).copied().unwrap_or(0.0);
        }
        evaluations.retain(|_, n| *n > 0.0);
        Counts {
            requests: [0, 1, 2].map(|i| self.requests[i] - earlier.requests[i]),
            evaluations,
            reconciles: self.reconciles - earlier.reconciles,
        }
    }

    /// Divided by `n` (per Application, per sample).
    fn describe(&self, n: usize) -> String {
        let n = n as f64;
        let total: f64 = self.requests.iter().sum();
        let evaluations = self
            .evaluations
            .iter()
            .map(|(result, count)| format!("{result} {count:.0}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "API requests {total:.0} ({:.1} each: reads {:.1}, writes {:.1}, dry runs {:.1}); reconciles {:.0} ({:.2} each); set evaluations: {}",
            total / n,
            self.requests[0] / n,
            self.requests[1] / n,
            self.requests[2] / n,
            self.reconciles,
            self.reconciles / n,
            if evaluations.is_empty() {
                "none".into()
            } else {
                evaluations
            }
        )
    }
}

/// Waits until Setpoint's queue holds no ready event.
async fn queue_empty(metrics_port: u16) {
    wait_for("Setpoint's queue empty", ONE_DEADLINE, || async {
        match sample(&scrape(metrics_port)?, "setpoint_queue_messages_ready") {
            Some(0.0) => Ok(()),
            ready => Err(format!("{ready:?} events ready in the queue")),
        }
    })
    .await;
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
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

/// Deletes the namespace and waits until it is gone: a rerun, or the next
/// bench, starts on a quiet API server.
async fn delete_namespace(client: &Client, name: &str) {
    let namespaces = Api::<Namespace>::all(client.clone());
    namespaces.delete(name, &Default::default()).await.ok();
    wait_for(
        "the bench's namespace deleted",
        Duration::from_secs(600),
        || async {
            match namespaces.get_opt(name).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err(format!("{name} still there")),
                Err(error) => Err(error.to_string()),
            }
        },
    )
    .await;
}

#[tokio::main]
async fn main() {
    let size = dirs();
    let ns = TestNamespace::new("appset-bench").await;
    install_appset_crd(&ns.client).await;
    println!(
        "ApplicationSet benchmark (setpoint run on RabbitMQ, local control plane, --concurrency {}): a git directories generator, one ConfigMap per directory",
        concurrency()
    );

    let repo = GitRepo::new();
    repo.write("README.md", "Applications go under apps/.\n");
    let empty = repo.commit("no Application yet");

    let apps = Apps::start(&ns).await;
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("appset");
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let url = amqp_url();
    let concurrency = concurrency();
    let log = std::env::var("SETPOINT_BENCH_LOG").unwrap_or_else(|_| "warn".into());
    let args = [
        "run",
        "--listen",
        &listen,
        "--amqp-prefix",
        &prefix,
        "--no-sweep",
        "--github-secret",
        SECRET,
        "--concurrency",
        &concurrency,
    ];
    let env = [
        ("SETPOINT_AMQP_URL", url.as_str()),
        ("SETPOINT_LOG", log.as_str()),
        ("SETPOINT_METRICS_LISTEN", metrics.as_str()),
    ];
    let mut process = Setpoint::scoped(&ns.name, &args, &env, cache.path());
    process.wait_http().await;
    let port = process.port.unwrap();

    // The set, against a commit with no directory: it owns nothing.
    ns.api::<ApplicationSet>()
        .create(&PostParams::default(), &fleet_set(&ns, &repo))
        .await
        .expect("create the ApplicationSet");
    wait_for(
        "the set evaluated at the empty commit",
        ONE_DEADLINE,
        || async {
            set_settled(&ns, 0).await?;
            let (_, state) = set_state(&ns).await;
            state.contains("0 Applications").then_some(()).ok_or(state)
        },
    )
    .await;
    assert_eq!(apps.counts(&empty).0, 0);
    queue_empty(metrics_port).await;

    // 1. One push adding every directory.
    let mut files = Vec::with_capacity(size);
    for i in 0..size {
        let (path, text) = directory(i);
        repo.write(&path, &text);
        files.push(path);
    }
    let added = repo.commit(&format!("{size} Applications"));
    let changed: Vec<&str> = files.iter().map(String::as_str).collect();
    let before = Counts::scrape(metrics_port);
    let pushed = Instant::now();
    push(port, &repo, &added, &changed);
    let state = || {
        let (owned, synced, healthy) = apps.counts(&added);
        format!("{owned} owned, {synced} Synced at the commit, {healthy} of them Healthy")
    };
    let created = until(
        "every Application created",
        pushed,
        DEADLINE,
        || apps.counts(&added).0 == size,
        state,
    )
    .await;
    let synced = until(
        "every Application Synced",
        pushed,
        DEADLINE,
        || apps.counts(&added).1 == size,
        state,
    )
    .await;
    let healthy = until(
        "every Application Synced and Healthy",
        pushed,
        DEADLINE,
        || apps.counts(&added).2 == size,
        state,
    )
    .await;
    wait_for("the set's status to say so", DEADLINE, || {
        set_settled(&ns, size as u32)
    })
    .await;
    let summary = pushed.elapsed();
    queue_empty(metrics_port).await;
    let first = Counts::scrape(metrics_port).since(&before);
    println!("  {size} directories in one push (one commit, its {size} files listed):");
    println!(
        "  | every Application created                 | {:>8.2} s |",
        created.as_secs_f64()
    );
    println!(
        "  | every Application Synced at the commit    | {:>8.2} s |",
        synced.as_secs_f64()
    );
    println!(
        "  | ... and Healthy (the measure)             | {:>8.2} s |",
        healthy.as_secs_f64()
    );
    println!(
        "  | the set's status summary says so          | {:>8.2} s |",
        summary.as_secs_f64()
    );
    println!(
        "  Setpoint, from the push until settled (queue empty), per Application: {}",
        first.describe(size)
    );

    // 2. One directory added, ADDED times.
    let before = Counts::scrape(metrics_port);
    let mut to_created = Vec::with_capacity(ADDED);
    let mut to_synced = Vec::with_capacity(ADDED);
    for n in 0..ADDED {
        let i = size + n;
        let name = app_name(i);
        let (path, text) = directory(i);
        repo.write(&path, &text);
        let commit = repo.commit(&name);
        let pushed = Instant::now();
        push(port, &repo, &commit, &[&path]);
        let state = || match apps.get(&name) {
            None => "not created".to_string(),
            Some(app) => format!("{:?}", app.status.as_ref().map(|s| &s.sync)),
        };
        to_created.push(
            until(
                &format!("{name} created"),
                pushed,
                ONE_DEADLINE,
                || apps.get(&name).is_some(),
                state,
            )
            .await,
        );
        to_synced.push(
            until(
                &format!("{name} Synced"),
                pushed,
                ONE_DEADLINE,
                || apps.get(&name).is_some_and(|app| synced_at(&app, &commit)),
                state,
            )
            .await,
        );
        // Settled before the next: Healthy, the set's summary, the queue.
        until(
            &format!("{name} Healthy"),
            pushed,
            ONE_DEADLINE,
            || {
                apps.get(&name).is_some_and(|app| {
                    app.status
                        .as_ref()
                        .is_some_and(|s| s.health.status == Health::Healthy)
                })
            },
            state,
        )
        .await;
        wait_for("the set's status to follow", ONE_DEADLINE, || {
            set_settled(&ns, (i + 1) as u32)
        })
        .await;
        queue_empty(metrics_port).await;
    }
    let second = Counts::scrape(metrics_port).since(&before);
    let total = size + ADDED;
    assert_eq!(apps.counts(&repo.head()).0, total);
    to_created.sort();
    to_synced.sort();
    println!("  one directory added ({ADDED} times: a commit, its push), from the push:");
    for (what, took) in [
        ("its Application created", &to_created),
        ("its Application Synced", &to_synced),
    ] {
        println!(
            "  | {what:<25} | p50 {:>7.0} ms | p99 {:>7.0} ms | max {:>7.0} ms |",
            percentile(took, 0.5),
            percentile(took, 0.99),
            took.last().unwrap().as_secs_f64() * 1000.0
        );
    }
    println!(
        "  (with {ADDED} samples the p99 is the max: nearest rank, index round(0.99 x {}) = {})",
        ADDED - 1,
        ((ADDED as f64 - 1.0) * 0.99).round()
    );
    println!(
        "  Setpoint, per added directory (until settled): {}",
        second.describe(ADDED)
    );
    println!(
        "  peak RSS of setpoint run: {:.0} MiB",
        peak_memory_mib(process.child.id())
    );

    drop(apps);
    drop(process);
    if std::env::var_os("SETPOINT_BENCH_LOG").is_some() {
        println!("  Setpoint's log is under {}", cache.keep().display());
    }
    let queue = setpoint::queue::amqp::AmqpQueue::connect(setpoint::queue::amqp::AmqpSettings {
        url: amqp_url(),
        prefix,
        ..Default::default()
    })
    .await;
    queue.delete_topology().await.ok();
    let started = Instant::now();
    delete_namespace(&ns.client, &ns.name).await;
    println!(
        "  namespace {} deleted ({total} Applications, {total} ConfigMaps) in {:.1} s",
        ns.name,
        started.elapsed().as_secs_f64()
    );
}
