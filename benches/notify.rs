//! `make bench`: notifications out, with `setpoint run` on RabbitMQ against
//! the real local control plane and local HTTP receivers.
//!
//! 1. Latency: one Application, one `generic` Provider; each run scales its
//!    Deployment as `kubectl scale` does and times the drift correction's
//!    notification from the accepted scale to the receiver (p50, p99), and
//!    reads `setpoint_notification_latency_seconds` (queued → answered).
//! 2. Throughput: `SETPOINT_BENCH_NOTIFY_APPS` Applications (1,000 by
//!    default) of one repository, one commit changing every one, announced
//!    by one push: each `Synced` goes to two Providers, one up, one down
//!    (connections refused, so every delivery to it fails and goes to the
//!    queue's backoff). Timed from the push to the last notification the
//!    live Provider got; the dead one's failures are counted beside.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt};
use serde_json::json;
use setpoint::api::{Alert, Provider, Sync};
use support::app::{
    all_apps, automated, create_app, deployment_yaml, install_crd, time_scale_correction,
};
use support::process::{Setpoint, free_port, github_push, post_github, sample, scrape};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const SECRET: &str = "bench-notify-secret";

/// Receives notifications and keeps (arrival, body) of each.
#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<(Instant, serde_json::Value)>>>,
}

impl Receiver {
    fn start() -> (Self, u16) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let receiver = Receiver::default();
        let server = receiver.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let server = server.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut length = 0;
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                        if line.trim().is_empty() {
                            break;
                        }
                        if let Some(value) =
                            line.to_ascii_lowercase().strip_prefix("content-length:")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                        line.clear();
                    }
                    let mut body = vec![0; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    let at = Instant::now();
                    let mut stream = stream;
                    let _ = stream.write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    if let Ok(value) = serde_json::from_slice(&body) {
                        server.got.lock().unwrap().push((at, value));
                    }
                });
            }
        });
        (receiver, port)
    }

    fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }
}

async fn apply_crd(client: &kube::Client, crd: CustomResourceDefinition) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap();
    api.patch(
        &name,
        &PatchParams::apply("setpoint-bench").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        kube::runtime::wait::await_condition(
            api,
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        ),
    )
    .await
    .unwrap()
    .unwrap();
}

async fn provider(ns: &TestNamespace, name: &str, address: &str, kinds: &[&str]) {
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": name}, "stringData": {"address": address},
    }))
    .unwrap();
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let provider: Provider = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "generic", "secretRef": {"name": name}},
    }))
    .unwrap();
    ns.api::<Provider>()
        .create(&PostParams::default(), &provider)
        .await
        .unwrap();
    let alert: Alert = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"providerRef": {"name": name}, "eventSources": [{"name": "*"}], "eventKinds": kinds},
    }))
    .unwrap();
    ns.api::<Alert>()
        .create(&PostParams::default(), &alert)
        .await
        .unwrap();
}

async fn namespace(prefix: &str) -> TestNamespace {
    let ns = TestNamespace::new(prefix).await;
    install_crd(&ns.client).await;
    apply_crd(&ns.client, Provider::crd()).await;
    apply_crd(&ns.client, Alert::crd()).await;
    ns
}

fn run(ns: &TestNamespace, listen: &str, metrics: u16, cache: &std::path::Path) -> Setpoint {
    let url = amqp_url();
    let prefix = amqp_prefix("bench-notify");
    let metrics = format!("127.0.0.1:{metrics}");
    Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--amqp-prefix",
            &prefix,
            "--listen",
            listen,
            "--metrics-listen",
            &metrics,
            "--github-secret",
            SECRET,
            "--no-sweep",
        ],
        &[
            ("SETPOINT_AMQP_URL", url.as_str()),
            ("SETPOINT_LOG", "warn"),
        ],
        cache,
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn latency(runs: usize) {
    let ns = namespace("bench-notify-lat").await;
    let (receiver, port) = Receiver::start();
    provider(
        &ns,
        "hook",
        &format!("http://127.0.0.1:{port}/"),
        &["driftCorrected"],
    )
    .await;
    let repo = GitRepo::new();
    repo.write("web/deploy.yaml", &deployment_yaml("web", 1));
    let commit = repo.commit("web");
    create_app(&ns, "web", &repo.url(), "web", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let listen = format!("127.0.0.1:{}", free_port());
    let _setpoint = run(&ns, &listen, metrics, cache.path());
    wait_for("web synced", Duration::from_secs(60), || async {
        support::app::synced_at(&ns, "web", &commit).await
    })
    .await;
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let before = receiver.count();
        let scaled = Instant::now();
        time_scale_correction(&ns, "web", 2 + run as i32 % 3, 1, Duration::from_secs(60)).await;
        wait_for("the notification", Duration::from_secs(60), || async {
            if receiver.count() > before {
                Ok(())
            } else {
                Err("none yet".to_string())
            }
        })
        .await;
        let at = receiver.got.lock().unwrap()[before].0;
        times.push(at - scaled);
    }
    times.sort();
    let p = |q: f64| times[((times.len() as f64 * q).ceil() as usize).clamp(1, times.len()) - 1];
    let text = scrape(metrics).unwrap_or_default();
    let sum = sample(&text, "setpoint_notification_latency_seconds_sum").unwrap_or(0.0);
    let count = sample(&text, "setpoint_notification_latency_seconds_count").unwrap_or(1.0);
    println!(
        "  latency, kubectl scale -> drift corrected -> generic provider: p50 {:>7.1} ms  p99 {:>7.1} ms  ({runs} runs); queued -> answered mean {:>6.1} ms",
        ms(p(0.5)),
        ms(p(0.99)),
        sum / count.max(1.0) * 1000.0
    );
}

fn configmap(i: usize, value: usize) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\ndata:\n  value: \"{value}\"\n"
    )
}

async fn throughput(apps: usize) {
    let ns = namespace("bench-notify-tp").await;
    let (receiver, port) = Receiver::start();
    provider(
        &ns,
        "live",
        &format!("http://127.0.0.1:{port}/"),
        &["synced"],
    )
    .await;
    let dead = free_port();
    provider(
        &ns,
        "dead",
        &format!("http://127.0.0.1:{dead}/"),
        &["synced"],
    )
    .await;
    let repo = GitRepo::new();
    for i in 0..apps {
        repo.write(&format!("apps/{i}/cm.yaml"), &configmap(i, 0));
    }
    let base = repo.commit("the apps");
    for i in 0..apps {
        create_app(
            &ns,
            &format!("app-{i}"),
            &repo.url(),
            &format!("apps/{i}"),
            automated(true, true),
        )
        .await;
    }
    let cache = tempfile::tempdir().unwrap();
    let metrics = free_port();
    let web = free_port();
    let mut setpoint = run(&ns, &format!("127.0.0.1:{web}"), metrics, cache.path());
    setpoint.wait_http().await;
    wait_for("the Applications synced", Duration::from_secs(900), || {
        all_apps(&ns, apps, "synced", |s| {
            s.sync.status == Sync::Synced && s.sync.revision.as_deref() == Some(base.as_str())
        })
    })
    .await;
    // The initial syncs' notifications, first.
    wait_for(
        "the initial notifications",
        Duration::from_secs(300),
        || async {
            match receiver.count() {
                n if n >= apps => Ok(()),
                n => Err(format!("{n} of {apps}")),
            }
        },
    )
    .await;
    let initial = receiver.count();
    for i in 0..apps {
        repo.write(&format!("apps/{i}/cm.yaml"), &configmap(i, 1));
    }
    let commit = repo.commit("every app");
    let changed: Vec<String> = (0..apps).map(|i| format!("apps/{i}/cm.yaml")).collect();
    let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
    let body = github_push(&repo.url(), &commit, &changed);
    let pushed = Instant::now();
    let (code, reply) = post_github(web, Some(SECRET), &support::unique_name("d"), &body);
    assert_eq!(code, 200, "{reply}");
    // The push's notifications: those naming its commit.
    let of_push = || -> Vec<(Instant, String)> {
        let got = receiver.got.lock().unwrap();
        got.iter()
            .skip(initial)
            .filter(|(_, body)| body["metadata"]["revision"] == commit.as_str())
            .map(|(at, body)| {
                let name = body["involvedObject"]["name"].as_str().unwrap_or_default();
                (*at, name.to_string())
            })
            .collect()
    };
    wait_for("every notification", Duration::from_secs(900), || async {
        let got = of_push().len();
        if got >= apps {
            Ok(())
        } else {
            Err(format!("{got} of {apps}"))
        }
    })
    .await;
    let got = of_push();
    let last = got.iter().map(|(at, _)| *at).max().unwrap();
    let mut per_app: BTreeMap<String, usize> = BTreeMap::new();
    for (_, name) in &got {
        *per_app.entry(name.clone()).or_default() += 1;
    }
    let took = last - pushed;
    let text = scrape(metrics).unwrap_or_default();
    let failed = sample(
        &text,
        &format!(
            "setpoint_notifications_total{{provider=\"{}/dead\",outcome=\"failed\"}}",
            ns.name
        ),
    )
    .unwrap_or(0.0);
    println!(
        "  throughput, {apps} Applications synced at once, one provider down: {apps} notifications in {:.2} s = {:.0}/s to the live provider ({} Applications, none twice: {}); {failed:.0} failed deliveries to the dead one meanwhile",
        took.as_secs_f64(),
        apps as f64 / took.as_secs_f64(),
        per_app.len(),
        per_app.values().all(|&n| n == 1),
    );
}

#[tokio::main]
async fn main() {
    let apps: usize = std::env::var("SETPOINT_BENCH_NOTIFY_APPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let runs: usize = std::env::var("SETPOINT_BENCH_NOTIFY_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    println!(
        "notification benchmark (setpoint run on RabbitMQ, local control plane, local HTTP receivers)"
    );
    latency(runs).await;
    throughput(apps).await;
}
