//! `make bench`: how soon `setpoint app rollback` has the previous revision
//! back and Healthy, for 1 and for 100 Applications, with `setpoint run`
//! on RabbitMQ against the real local control plane. Each Application is a
//! Deployment and a ConfigMap; a good commit becomes Healthy, a bad one (a
//! Deployment whose pods can never be scheduled) is applied, then every
//! Application is rolled back (8 CLI commands at a time for the fleet).
//! Measured per Application from its command's start to its status read
//! Synced and Healthy at the good commit (polled every few milliseconds),
//! and for the fleet from the first command to the last Healthy.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use futures::StreamExt;
use setpoint::api::{Application, ApplicationSpec, Health, Source, Sync};
use support::app::{all_apps, automated, install_crd};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const SECRET: &str = "bench-rollback";
const IN_FLIGHT: usize = 8;

fn files(i: usize, version: u32, ready: bool) -> (String, String) {
    let selector = if ready {
        ""
    } else {
        "      nodeSelector: {setpoint.dev/no-such-node: \"true\"}\n"
    };
    (
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web-{i}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: web-{i}}}\n  template:\n    metadata:\n      labels: {{app: web-{i}}}\n    spec:\n{selector}      containers:\n      - name: app\n        image: app:{version}\n"
        ),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: conf-{i}\ndata: {{v: \"{version}\"}}\n"
        ),
    )
}

fn write_all(repo: &GitRepo, count: usize, version: u32, ready: bool) {
    for i in 0..count {
        let (deploy, conf) = files(i, version, ready);
        repo.write(&format!("apps/{i}/deploy.yaml"), &deploy)
            .write(&format!("apps/{i}/conf.yaml"), &conf);
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

fn rollback(kubeconfig: &std::path::Path, app: &str) -> Instant {
    let out = std::process::Command::new(support::process::binary())
        .args(["app", "rollback", app])
        .env("KUBECONFIG", kubeconfig)
        .env("SETPOINT_ALLOW_LOCAL_REPOS", "true")
        .env("SETPOINT_ADMIN_NAMESPACES", "*")
        .output()
        .expect("run setpoint app rollback");
    assert!(
        out.status.success(),
        "{app}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Instant::now()
}

async fn fleet(count: usize) {
    let ns = TestNamespace::new("bench-rollback").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    write_all(&repo, count, 1, true);
    let good = repo.commit("good");
    let apps = ns.api::<Application>();
    for i in 0..count {
        let mut app = Application::new(
            &format!("app-{i}"),
            ApplicationSpec {
                source: Source {
                    repo_url: repo.url(),
                    path: Some(format!("apps/{i}")),
                    ..Default::default()
                },
                sync_policy: automated(true, true),
                ..Default::default()
            },
        );
        app.metadata.namespace = Some(ns.name.clone());
        apps.create(&Default::default(), &app).await.unwrap();
    }
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("bench-rollback");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let url = amqp_url();
    let _setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--amqp-prefix",
            &prefix,
            "--github-secret",
            SECRET,
            "--no-sweep",
        ],
        &[("SETPOINT_AMQP_URL", &url)],
        cache.path(),
    );
    let deadline = Duration::from_secs(600);
    let healthy_at = |commit: String| {
        move |s: &setpoint::api::ApplicationStatus| {
            s.sync.status == Sync::Synced
                && s.sync.revision.as_deref() == Some(&commit)
                && s.health.status == Health::Healthy
                && s.history.first().is_some_and(|h| h.healthy)
        }
    };
    wait_for("the good revision Healthy", deadline, || {
        all_apps(
            &ns,
            count,
            "Healthy at the good commit",
            healthy_at(good.clone()),
        )
    })
    .await;
    write_all(&repo, count, 2, false);
    let bad = repo.commit("bad");
    let changed: Vec<String> = (0..count)
        .map(|i| format!("apps/{i}/deploy.yaml"))
        .collect();
    let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
    let body = github_push(&repo.url(), &bad, &changed);
    assert_eq!(post_github(port, Some(SECRET), "bench-bad", &body).0, 200);
    wait_for("the bad revision applied", deadline, || {
        all_apps(&ns, count, "Synced at the bad commit", |s| {
            s.sync.status == Sync::Synced && s.sync.revision.as_deref() == Some(&bad)
        })
    })
    .await;

    let kubeconfig = support::kubeconfig_path();
    let started = Instant::now();
    let names: Vec<String> = (0..count).map(|i| format!("{}/app-{i}", ns.name)).collect();
    // Each command's start, and when it returned (it syncs the pin itself).
    let commands: Vec<(String, Instant, Instant)> = futures::stream::iter(names)
        .map(|name| {
            let kubeconfig = kubeconfig.clone();
            async move {
                let start = Instant::now();
                let done = tokio::task::spawn_blocking({
                    let name = name.clone();
                    move || rollback(&kubeconfig, &name)
                })
                .await
                .unwrap();
                (name, start, done)
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let starts: std::collections::HashMap<String, Instant> = commands
        .iter()
        .map(|(name, start, _)| (name.rsplit('/').next().unwrap().to_string(), *start))
        .collect();
    let mut healthy: std::collections::HashMap<String, Instant> = Default::default();
    let accepts = healthy_at(good.clone());
    while healthy.len() < count {
        assert!(
            started.elapsed() < deadline,
            "{} of {count} Healthy again",
            healthy.len()
        );
        for app in apps.list(&Default::default()).await.unwrap().items {
            let name = app.metadata.name.clone().unwrap();
            if !healthy.contains_key(&name) && app.status.as_ref().is_some_and(&accepts) {
                healthy.insert(name, Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let all = healthy.values().max().unwrap().duration_since(started);
    let mut each: Vec<Duration> = healthy
        .iter()
        .map(|(name, at)| at.duration_since(starts[name]))
        .collect();
    each.sort();
    let commands_took = commands
        .iter()
        .map(|(_, s, d)| d.duration_since(*s))
        .max()
        .unwrap();
    println!(
        "  {count:>3} Application(s): rollback -> previous revision Healthy p50 {:>7.1} ms  p99 {:>7.1} ms; all {:>7.1} ms (commands {IN_FLIGHT} at a time, the slowest took {:.1} ms)",
        percentile(&each, 0.5),
        percentile(&each, 0.99),
        all.as_secs_f64() * 1000.0,
        commands_took.as_secs_f64() * 1000.0,
    );
}

#[tokio::main]
async fn main() {
    println!("rollback benchmark (setpoint run on RabbitMQ, local control plane)");
    fleet(1).await;
    fleet(100).await;
}
