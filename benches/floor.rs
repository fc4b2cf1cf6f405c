//! `make bench` (floor): Setpoint against "the floor" (issue 33), in one run
//! on the local control plane, for N Applications of Flux's MTTP shape
//! (ServiceAccount, Service, Deployment of 0 replicas, Ingress).
//!
//! - The floor: a bare kube client, no Git, no render, no diff, no status,
//!   in a namespace of its own where nothing reconciles. It creates the N
//!   Applications (the spec Setpoint gets), then server-side applies the
//!   4N objects (field manager `floor`, force), 64 requests in flight over
//!   kube's default client (HTTP/1.1 there: its connector enables only
//!   HTTP/1, so 64 connections). First sync = the creates + the applies.
//!   Then "a commit changing every Deployment": the N Deployments applied
//!   again with a new pod-template annotation, 64 in flight.
//! - Setpoint: `setpoint run` on RabbitMQ as benches/pipeline.rs runs its
//!   fleets (`--no-sweep`, `--concurrency 16`), one repository with a
//!   directory per app. First sync: from the first Application create to
//!   all N Synced at the commit. Then one commit changing every Deployment
//!   (the same annotation), announced by one signed GitHub push: from the
//!   push to all N Synced at the new commit.
//! - Requests per Application for each phase, from the API server's own
//!   `apiserver_request_total` (every verb but WATCH), scraped before the
//!   phase and once the cluster has settled after it; by verb for both, and
//!   by verb and resource for the change phase. Plus what each side counts
//!   it sent itself, and the peak RSS of `setpoint run`.
//!
//! `SETPOINT_BENCH_FLOOR_APPS` (default `300,1000`) picks the sizes; each
//! app takes a ClusterIP, so 10,000 need the /16 service range of
//! tests/controlplane/cluster.sh. Run it alone with
//! `SETPOINT_BENCH_FLOOR_APPS=300 cargo bench --bench floor` (KUBECONFIG,
//! SETPOINT_KUBECTL and SETPOINT_HELM as the Makefile sets them, RabbitMQ up).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use setpoint::api::{Health, Sync};
use support::app::{AppWatch, automated, create_app, install_crd};
use support::process::{Setpoint, free_port, github_push, post_github, sample, scrape};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, kube_client, wait_for};

const SECRET: &str = "bench-secret";
const IN_FLIGHT: usize = 64;
/// Setpoint's `--concurrency`: `SETPOINT_BENCH_CONCURRENCY`, default 16 (its default).
fn concurrency() -> String {
    std::env::var("SETPOINT_BENCH_CONCURRENCY").unwrap_or_else(|_| "16".into())
}
const DEADLINE: Duration = Duration::from_secs(3600);

/// App `app`'s files, the MTTP shape of benches/pipeline.rs (`mttp_objects`),
/// every object in the Application's namespace. Only the Deployment's pod
/// template carries `rev`: a commit changing `rev` changes every Deployment
/// and nothing else.
fn mttp_objects(app: usize, rev: &str) -> Vec<(String, String)> {
    let name = format!("app-{app}");
    vec![
        (
            format!("apps/{app}/sa.yaml"),
            format!("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n"),
        ),
        (
            format!("apps/{app}/svc.yaml"),
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  labels: {{v: \"1\"}}\nspec:\n  selector: {{app: {name}}}\n  ports: [{{port: 80, targetPort: 8080}}]\n"
            ),
        ),
        (
            format!("apps/{app}/deploy.yaml"),
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: 0\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata:\n      labels: {{app: {name}, v: \"1\"}}\n      annotations: {{bench/rev: \"{rev}\"}}\n    spec:\n      serviceAccountName: {name}\n      containers: [{{name: app, image: registry.invalid/app:1}}]\n"
            ),
        ),
        (
            format!("apps/{app}/ingress.yaml"),
            format!(
                "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  labels: {{v: \"1\"}}\nspec:\n  rules:\n  - host: {name}.example.com\n    http:\n      paths:\n      - path: /\n        pathType: Prefix\n        backend: {{service: {{name: {name}, port: {{number: 80}}}}}}\n"
            ),
        ),
    ]
}

/// The API server's `apiserver_request_total` summed by (verb, resource),
/// WATCH left out. A dry run is its own verb (`APPLY dry run`); a
/// non-resource request is named by its path (`/healthz`, `openapi/v3`).
#[derive(Clone, Default)]
struct Requests(BTreeMap<(String, String), f64>);

impl Requests {
    async fn scrape(client: &Client) -> Self {
        let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
        let text = client
            .request_text(request)
            .await
            .expect("the API server's /metrics (admin client)");
        Self::parse(&text)
    }

    fn parse(text: &str) -> Self {
        let mut sums = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let labels = parse_labels(labels);
            let label = |name: &str| labels.get(name).map(String::as_str).unwrap_or("");
            let verb = label("verb");
            if verb == "WATCH" {
                continue;
            }
            let verb = match label("dry_run") {
                "" => verb.to_string(),
                _ => format!("{verb} dry run"),
            };
            let resource = match (label("group"), label("resource"), label("subresource")) {
                (_, "", path) => path.to_string(),
                (group, resource, sub) => {
                    let group = if group.is_empty() { "core" } else { group };
                    let sub = if sub.is_empty() {
                        String::new()
                    } else {
                        format!("/{sub}")
                    };
                    format!("{group}/{resource}{sub}")
                }
            };
            *sums.entry((verb, resource)).or_insert(0.0) += value;
        }
        Self(sums)
    }

    fn total(&self) -> f64 {
        self.0.values().sum()
    }

    fn by_verb(&self) -> BTreeMap<String, f64> {
        let mut verbs = BTreeMap::new();
        for ((verb, _), n) in &self.0 {
            *verbs.entry(verb.clone()).or_insert(0.0) += n;
        }
        verbs
    }

    fn get(&self, key: &(String, String)) -> f64 {
        self.0.get(key).copied().unwrap_or(0.0)
    }
}

impl std::ops::Sub for &Requests {
    type Output = Requests;
    fn sub(self, earlier: &Requests) -> Requests {
        Requests(
            self.0
                .iter()
                .map(|(key, n)| (key.clone(), n - earlier.get(key)))
                .filter(|(_, n)| *n > 0.0)
                .collect(),
        )
    }
}

/// `name="value",...` (Prometheus text format, `\"` and `\\` escapes).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(escaped);
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(name.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    labels
}

/// The objects of one kind in a namespace, as a watch sees them (one LIST
/// before the measured phases, then WATCH, which the counts leave out).
struct Watched<K: kube::Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Watched<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + std::marker::Sync
        + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    async fn start(ns: &TestNamespace) -> Self {
        use kube::runtime::{WatchStreamExt, watcher};
        let (store, writer) = reflector::store();
        let stream = watcher(ns.api::<K>(), watcher::Config::default())
            .reflect(writer)
            .applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while stream.next().await.is_some() {}
        });
        store.wait_until_ready().await.expect("the watch lists");
        Self { store, task }
    }

    fn count(&self, accepts: impl Fn(&K) -> bool) -> usize {
        self.store.state().iter().filter(|k| accepts(k)).count()
    }
}

impl<K: kube::Resource + Clone + 'static> Drop for Watched<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The cluster's own reaction to a phase, watched in its namespace: the
/// deployment controller has seen every Deployment at `generation` (its
/// ReplicaSet made, its status written) and the EndpointSlice controller
/// has a slice for every Service. Requests are counted up to here on both
/// sides, so the controllers' share is in both or in neither.
struct Cluster {
    deployments: Watched<Deployment>,
    slices: Watched<EndpointSlice>,
}

impl Cluster {
    async fn watch(ns: &TestNamespace) -> Self {
        Self {
            deployments: Watched::start(ns).await,
            slices: Watched::start(ns).await,
        }
    }

    fn settled(&self, size: usize, generation: i64) -> Result<(), String> {
        let observed = self.deployments.count(|d| {
            d.metadata.generation == Some(generation)
                && d.status
                    .as_ref()
                    .and_then(|s| s.observed_generation)
                    .is_some_and(|g| g >= generation)
        });
        let slices = self.slices.count(|_| true);
        if observed == size && slices >= size {
            Ok(())
        } else {
            Err(format!(
                "{observed} of {size} Deployments observed at generation {generation}, {slices} EndpointSlices"
            ))
        }
    }
}

/// One phase of one side: its time, and the requests from its start until
/// the cluster settled after it.
#[derive(Default)]
struct Phase {
    took: Duration,
    requests: Requests,
    /// What the side itself counts it sent (the floor its calls, Setpoint
    /// `setpoint_api_requests_total`: read, write, dry_run).
    own: [f64; 3],
    /// Setpoint's reconciles in the phase and their summed seconds
    /// (`setpoint_reconcile_duration_seconds`); none for the floor.
    reconciles: [f64; 2],
}

/// Creates `size` Applications in `ns`, `IN_FLIGHT` at a time; how long it took.
async fn create_apps(ns: &TestNamespace, size: usize, url: &str) -> Duration {
    let started = Instant::now();
    stream::iter(0..size)
        .map(|app| async move {
            create_app(
                ns,
                &format!("app-{app}"),
                url,
                &format!("apps/{app}"),
                automated(true, true),
            )
            .await
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|_| async {})
        .await;
    started.elapsed()
}

/// Server-side applies `objects` (YAML of one object each) in `ns` as the
/// field manager `floor`, forcing, `IN_FLIGHT` at a time; how many it sent.
async fn apply_all(client: &Client, ns: &str, objects: Vec<String>) -> usize {
    let params = PatchParams::apply("floor").force();
    let count = objects.len();
    stream::iter(objects)
        .map(|text| {
            let params = &params;
            async move {
                let object: serde_json::Value = serde_yaml::from_str(&text).unwrap();
                let resource = match object["kind"].as_str().unwrap() {
                    "ServiceAccount" => ApiResource::erase::<ServiceAccount>(&()),
                    "Service" => ApiResource::erase::<Service>(&()),
                    "Deployment" => ApiResource::erase::<Deployment>(&()),
                    "Ingress" => ApiResource::erase::<Ingress>(&()),
                    kind => panic!("no resource for {kind}"),
                };
                let name = object["metadata"]["name"].as_str().unwrap().to_string();
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource);
                api.patch(&name, params, &Patch::Apply(&object))
                    .await
                    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|_| async {})
        .await;
    count
}

/// The floor: (Application creates alone, first sync, the change).
async fn floor(
    client: &Client,
    ns: &TestNamespace,
    size: usize,
    url: &str,
) -> (Duration, Phase, Phase) {
    let cluster = Cluster::watch(ns).await;
    let objects = |rev: &str, only: Option<&str>| -> Vec<String> {
        (0..size)
            .flat_map(|app| mttp_objects(app, rev))
            .filter(|(path, _)| only.is_none_or(|file| path.ends_with(file)))
            .map(|(_, text)| text)
            .collect()
    };
    let first_objects = objects("1", None);
    let changed = objects("2", Some("/deploy.yaml"));

    let before = Requests::scrape(client).await;
    let started = Instant::now();
    let creates = create_apps(ns, size, url).await;
    let applies = apply_all(client, &ns.name, first_objects).await;
    let took = started.elapsed();
    wait_for("the floor's first sync settled", DEADLINE, || async {
        cluster.settled(size, 1)
    })
    .await;
    let settled = Requests::scrape(client).await;
    let first = Phase {
        took,
        requests: &settled - &before,
        own: [0.0, (size + applies) as f64, 0.0],
        reconciles: [0.0; 2],
    };
    println!(
        "  floor: Applications created in {:.2} s, first sync {:.2} s",
        creates.as_secs_f64(),
        took.as_secs_f64()
    );

    let started = Instant::now();
    let applies = apply_all(client, &ns.name, changed).await;
    let took = started.elapsed();
    wait_for("the floor's change settled", DEADLINE, || async {
        cluster.settled(size, 2)
    })
    .await;
    let change = Phase {
        took,
        requests: &Requests::scrape(client).await - &settled,
        own: [0.0, applies as f64, 0.0],
        reconciles: [0.0; 2],
    };
    println!(
        "  floor: every Deployment changed in {:.2} s",
        took.as_secs_f64()
    );
    (creates, first, change)
}

/// Setpoint's counts of the requests it sent: read, write, dry_run.
fn own_requests(metrics_port: u16) -> [f64; 3] {
    let metrics = scrape(metrics_port).expect("setpoint's metrics");
    ["read", "write", "dry_run"].map(|kind| {
        sample(
            &metrics,
            &format!(r#"setpoint_api_requests_total{{kind="{kind}"}}"#),
        )
        .unwrap_or(0.0)
    })
}

/// Setpoint's reconciles so far and their summed seconds.
fn reconciles(metrics_port: u16) -> [f64; 2] {
    let metrics = scrape(metrics_port).expect("setpoint's metrics");
    ["count", "sum"].map(|what| {
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("setpoint_reconcile_duration_seconds_{what}")))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    })
}

fn minus(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

/// Setpoint: (Application creates while it runs, first sync, the change,
/// its peak RSS in MiB).
async fn setpoint(
    client: &Client,
    ns: &TestNamespace,
    size: usize,
    repo: &GitRepo,
) -> (Duration, Phase, Phase, f64) {
    let cluster = Cluster::watch(ns).await;
    let apps = AppWatch::start(ns).await;
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("floor");
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let url = amqp_url();
    let concurrency = concurrency();
    // SETPOINT_BENCH_LOG=info (say) keeps Setpoint's log at that level, in
    // a directory that is left behind and named at the end.
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
    let first_commit = repo.head();
    let synced_at = |commit: &str, health: bool| {
        apps.all(size, "synced", |s| {
            s.sync.status == Sync::Synced
                && s.sync.revision.as_deref() == Some(commit)
                && (!health || s.health.status == Health::Healthy)
        })
    };
    // Settled: every Application Healthy at `commit`, the controllers done,
    // nothing left in Setpoint's queue.
    let settled = |commit: String, generation: i64| {
        let (cluster, synced_at) = (&cluster, &synced_at);
        async move {
            synced_at(&commit, true)?;
            cluster.settled(size, generation)?;
            match sample(&scrape(metrics_port)?, "setpoint_queue_messages_ready") {
                Some(0.0) => Ok(()),
                ready => Err(format!("{ready:?} events ready in the queue")),
            }
        }
    };

    let before = Requests::scrape(client).await;
    let own_before = own_requests(metrics_port);
    let reconciles_before = reconciles(metrics_port);
    let started = Instant::now();
    let creates = create_apps(ns, size, &repo.url()).await;
    wait_for("Setpoint's first sync", DEADLINE, || async {
        synced_at(&first_commit, false)
    })
    .await;
    let took = started.elapsed();
    println!(
        "  Setpoint: Applications created in {:.2} s, first sync {:.2} s",
        creates.as_secs_f64(),
        took.as_secs_f64()
    );
    wait_for("Setpoint's first sync settled", DEADLINE, || {
        settled(first_commit.clone(), 1)
    })
    .await;
    let at_first = Requests::scrape(client).await;
    let own_first = own_requests(metrics_port);
    let reconciles_first = reconciles(metrics_port);
    let first = Phase {
        took,
        requests: &at_first - &before,
        own: minus(own_first, own_before),
        reconciles: [
            reconciles_first[0] - reconciles_before[0],
            reconciles_first[1] - reconciles_before[1],
        ],
    };

    for app in 0..size {
        let (path, text) = mttp_objects(app, "2").swap_remove(2);
        repo.write(&path, &text);
    }
    let second = repo.commit("every Deployment's pod template changes");
    // One push, its file list left out as in a large push: every app of
    // the repository is enqueued (as benches/pipeline.rs pushes).
    let mut body: serde_json::Value =
        serde_json::from_str(&github_push(&repo.url(), &second, &[])).unwrap();
    body["commits"] = serde_json::json!([]);
    let pushed = Instant::now();
    let (code, reply) = post_github(
        port,
        Some(SECRET),
        &support::unique_name("floor-push"),
        &body.to_string(),
    );
    assert_eq!(code, 200, "{reply}");
    wait_for("Setpoint at the second commit", DEADLINE, || async {
        synced_at(&second, false)
    })
    .await;
    let took = pushed.elapsed();
    println!(
        "  Setpoint: every Deployment changed in {:.2} s",
        took.as_secs_f64()
    );
    wait_for("Setpoint's change settled", DEADLINE, || {
        settled(second.clone(), 2)
    })
    .await;
    let change = Phase {
        took,
        requests: &Requests::scrape(client).await - &at_first,
        own: minus(own_requests(metrics_port), own_first),
        reconciles: {
            let now = reconciles(metrics_port);
            [now[0] - reconciles_first[0], now[1] - reconciles_first[1]]
        },
    };
    let peak = peak_memory_mib(process.child.id());
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
    (creates, first, change, peak)
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

/// Deletes `names` and waits until they are gone (thousands of objects at
/// 10,000 apps): the next size, or a rerun, starts on a quiet API server.
async fn delete_namespaces(client: &Client, names: &[&str]) {
    let namespaces = Api::<Namespace>::all(client.clone());
    for name in names {
        namespaces.delete(name, &Default::default()).await.ok();
    }
    wait_for("the bench's namespaces deleted", DEADLINE, || async {
        for name in names {
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

fn ratio(floor: f64, setpoint: f64) -> String {
    if floor > 0.0 {
        format!("{:.2}x", setpoint / floor)
    } else {
        "-".into()
    }
}

fn report(size: usize, floor: &(Duration, Phase, Phase), setpoint: &(Duration, Phase, Phase, f64)) {
    let per_app = |n: f64| n / size as f64;
    let (floor_creates, floor_first, floor_change) = floor;
    let (setpoint_creates, setpoint_first, setpoint_change, peak) = setpoint;
    println!("floor vs Setpoint, {size} Applications x 4 objects");
    println!(
        "  | phase                          | floor    | Setpoint | ratio  | requests/app floor | Setpoint | ratio  |"
    );
    for (phase, f, s) in [
        ("first sync", floor_first, setpoint_first),
        (
            "a commit changing every Deploy",
            floor_change,
            setpoint_change,
        ),
    ] {
        let (fr, sr) = (per_app(f.requests.total()), per_app(s.requests.total()));
        println!(
            "  | {phase:<30} | {:>6.2} s | {:>6.2} s | {:>6} | {fr:>18.1} | {sr:>8.1} | {:>6} |",
            f.took.as_secs_f64(),
            s.took.as_secs_f64(),
            ratio(f.took.as_secs_f64(), s.took.as_secs_f64()),
            ratio(fr, sr),
        );
    }
    println!(
        "  | create of the Applications     | {:>6.2} s | (while Setpoint runs: {:.2} s) |",
        floor_creates.as_secs_f64(),
        setpoint_creates.as_secs_f64()
    );
    println!(
        "  requests/app: the API server's own apiserver_request_total, every verb but WATCH, from a phase's start until the\n  \
         cluster settled after it (every Deployment observed by its controller, an EndpointSlice per Service; for Setpoint\n  \
         also every Application Healthy and its queue empty). That counts every client of the API server: the\n  \
         controller-manager's ReplicaSets, EndpointSlices and statuses, the scheduler, kwok, the leases, this bench's\n  \
         Application creates (in both) and watches, and whatever else runs on this control plane meanwhile. The\n  \
         controllers' share is the same on both sides; other tests running at the same time add noise to both."
    );
    let own = |p: &Phase| {
        format!(
            "{:.1} (reads {:.1}, writes {:.1}, dry runs {:.1})",
            per_app(p.own.iter().sum()),
            per_app(p.own[0]),
            per_app(p.own[1]),
            per_app(p.own[2])
        )
    };
    println!(
        "  sent by the client itself, per app: floor first sync {:.1} (a create and 4 applies), change {:.1} (an apply);",
        per_app(floor_first.own.iter().sum()),
        per_app(floor_change.own.iter().sum()),
    );
    println!(
        "  Setpoint (setpoint_api_requests_total, its watch requests included) first sync {}, change {}",
        own(setpoint_first),
        own(setpoint_change)
    );
    let reconciled = |p: &Phase| {
        format!(
            "{:.2} per app, {:.0} ms each on average",
            per_app(p.reconciles[0]),
            1000.0 * p.reconciles[1] / p.reconciles[0].max(1.0)
        )
    };
    println!(
        "  Setpoint's reconciles (until settled): first sync {}; change {}",
        reconciled(setpoint_first),
        reconciled(setpoint_change)
    );
    println!("  peak RSS of setpoint run: {peak:.0} MiB");

    println!("  requests/app by verb (API server's count):");
    println!("  | verb                 | first sync floor | Setpoint | change floor | Setpoint |");
    let verbs =
        [floor_first, setpoint_first, floor_change, setpoint_change].map(|p| p.requests.by_verb());
    let mut names: Vec<&String> = verbs.iter().flat_map(|v| v.keys()).collect();
    names.sort();
    names.dedup();
    for verb in names {
        let n = |i: usize| per_app(verbs[i].get(verb).copied().unwrap_or(0.0));
        println!(
            "  | {verb:<20} | {:>16.2} | {:>8.2} | {:>12.2} | {:>8.2} |",
            n(0),
            n(1),
            n(2),
            n(3)
        );
    }

    println!(
        "  a commit changing every Deployment, requests/app by verb and resource (Setpoint's top 12):"
    );
    println!(
        "  | verb                 | resource                                 | floor  | Setpoint |"
    );
    let mut pairs: Vec<(&(String, String), f64)> = setpoint_change
        .requests
        .0
        .iter()
        .map(|(key, n)| (key, *n))
        .collect();
    pairs.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (key, n) in pairs.into_iter().take(12) {
        println!(
            "  | {:<20} | {:<40} | {:>6.2} | {:>8.2} |",
            key.0,
            key.1,
            per_app(floor_change.requests.get(key)),
            per_app(n)
        );
    }
}

#[tokio::main]
async fn main() {
    let client = kube_client().await;
    install_crd(&client).await;
    let sizes: Vec<usize> = std::env::var("SETPOINT_BENCH_FLOOR_APPS")
        .unwrap_or_else(|_| "300,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    println!(
        "floor benchmark (bare client vs setpoint run on RabbitMQ, local control plane, {IN_FLIGHT} requests in flight for the floor, Setpoint --concurrency {})",
        concurrency()
    );
    for size in sizes {
        let repo = GitRepo::new();
        for app in 0..size {
            for (path, text) in mttp_objects(app, "1") {
                repo.write(&path, &text);
            }
        }
        repo.commit("the fleet");
        // Both namespaces stay until the end: deleting the floor's while
        // Setpoint runs would load the API server under it.
        let floor_ns = TestNamespace::new("floor").await;
        let setpoint_ns = TestNamespace::new("floor-setpoint").await;
        let floor = floor(&client, &floor_ns, size, &repo.url()).await;
        let setpoint = setpoint(&client, &setpoint_ns, size, &repo).await;
        report(size, &floor, &setpoint);
        delete_namespaces(&client, &[&floor_ns.name, &setpoint_ns.name]).await;
    }
}
