//! `make bench` (multicluster): one `setpoint run` (release build, in-process
//! queue) deploying to three control planes, the local one and `make
//! clusters-up`'s staging and prod. `SETPOINT_BENCH_CLUSTER_APPS` (default
//! 100) Applications per cluster, each a ConfigMap and a ServiceAccount.
//! Reports:
//! - the first sync, and one commit changing every Application (one push),
//!   all three clusters up: the time for all, and for local and staging's;
//! - the same commit-changes-all with prod's API server stopped: local and
//!   staging's time (the others should not notice), and how long prod's
//!   Applications take to converge after it returns;
//! - drift on local and staging while prod is down: a replica count changed
//!   by someone else, set back by a watch event, p50/p99 over 20 each.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::api::{Patch, PatchParams};
use setpoint::api::Sync;
use support::app::{AppWatch, automated, create_app, deployment_yaml, install_crd};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::remote::{Remote, RemoteNamespace, register};
use support::{GitRepo, TestNamespace, wait_for};

const SECRET: &str = "bench-secret";
const DRIFT_RUNS: usize = 20;
const CLUSTERS: [&str; 3] = ["local", "staging", "prod"];
const DEADLINE: Duration = Duration::from_secs(1800);

fn objects(cluster: &str, app: usize, value: &str) -> Vec<(String, String)> {
    let name = format!("{cluster}-{app}");
    vec![
        (
            format!("{cluster}/{app}/cm.yaml"),
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  v: \"{value}\"\n"
            ),
        ),
        (
            format!("{cluster}/{app}/sa.yaml"),
            format!(
                "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n  labels: {{v: \"{value}\"}}\n"
            ),
        ),
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

struct Fleet {
    /// One namespace of Applications per cluster (their objects go to the
    /// namespace of the same name on that cluster).
    namespaces: Vec<TestNamespace>,
    watches: Vec<AppWatch>,
    size: usize,
}

impl Fleet {
    fn synced(&self, which: &[usize], commit: &str) -> Result<(), String> {
        for &i in which {
            // local and staging hold one drift Application more.
            let count = self.size + usize::from(i < 2);
            self.watches[i].all(count, CLUSTERS[i], |s| {
                s.sync.status == Sync::Synced && s.sync.revision.as_deref() == Some(commit)
            })?;
        }
        Ok(())
    }

    /// Waits until the Applications of the clusters `which` are synced at
    /// `commit`; the time it took from `since`.
    async fn wait(&self, which: &[usize], commit: &str, since: Instant) -> Duration {
        wait_for("the fleet synced", DEADLINE, || async {
            self.synced(which, commit)
        })
        .await;
        since.elapsed()
    }
}

fn push(port: u16, repo: &GitRepo, commit: &str) {
    let mut body: serde_json::Value =
        serde_json::from_str(&github_push(&repo.url(), commit, &[])).unwrap();
    body["commits"] = serde_json::json!([]);
    let (code, reply) = post_github(
        port,
        Some(SECRET),
        &support::unique_name("mc-push"),
        &body.to_string(),
    );
    assert_eq!(code, 200, "{reply}");
}

/// Scales `deployments`' `drift` to 1 as kubectl does, `DRIFT_RUNS` times,
/// each time until it is back at 2: the sorted correction times.
async fn drift(deployments: &Api<Deployment>) -> Vec<Duration> {
    let kubectl = PatchParams {
        field_manager: Some("kubectl".into()),
        ..Default::default()
    };
    let mut took = Vec::new();
    for _ in 0..DRIFT_RUNS {
        let scale = Patch::Merge(serde_json::json!({"spec": {"replicas": 1}}));
        deployments
            .patch_scale("drift", &kubectl, &scale)
            .await
            .unwrap();
        let scaled = Instant::now();
        wait_for("drift corrected", Duration::from_secs(60), || async {
            let live = deployments.get("drift").await.map_err(|e| e.to_string())?;
            match live.spec.replicas {
                Some(2) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        took.push(scaled.elapsed());
        // The next scale after Setpoint's apply has been seen by its watch.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    took.sort();
    took
}

#[tokio::main]
async fn main() {
    let size: usize = std::env::var("SETPOINT_BENCH_CLUSTER_APPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let down_seconds: u64 = std::env::var("SETPOINT_BENCH_DOWN_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(90);
    let mut namespaces = Vec::new();
    for cluster in CLUSTERS {
        namespaces.push(TestNamespace::new(&format!("mc-bench-{cluster}")).await);
    }
    install_crd(&namespaces[0].client).await;
    let staging = Remote::named("staging").await;
    let prod = Remote::named("prod").await;
    let remotes = [None, Some(&staging), Some(&prod)];
    let mut remote_namespaces: Vec<RemoteNamespace> = Vec::new();
    for (i, remote) in remotes.iter().enumerate() {
        if let Some(remote) = remote {
            remote_namespaces.push(remote.namespace(&namespaces[i].name).await);
            register(
                &namespaces[0],
                CLUSTERS[i],
                CLUSTERS[i],
                &remote.server,
                &remote.certificate_config(),
                Some("*"),
            )
            .await;
        }
    }
    let repo = GitRepo::new();
    let write_all = |value: &str| {
        for cluster in CLUSTERS {
            for app in 0..size {
                for (path, text) in objects(cluster, app, value) {
                    repo.write(&path, &text);
                }
            }
        }
    };
    write_all("1");
    for cluster in ["local", "staging"] {
        repo.write(
            &format!("drift-{cluster}/web.yaml"),
            &deployment_yaml("drift", 2),
        );
    }
    let first = repo.commit("fleet");
    for (i, cluster) in CLUSTERS.iter().enumerate() {
        let ns = &namespaces[i];
        let mut names: Vec<(String, String)> = (0..size)
            .map(|app| (format!("app-{app}"), format!("{cluster}/{app}")))
            .collect();
        if i < 2 {
            names.push(("drift".into(), format!("drift-{cluster}")));
        }
        for (name, path) in &names {
            create_app(ns, name, &repo.url(), path, automated(true, true)).await;
            if i > 0 {
                let patch = serde_json::json!({"spec": {"destination": {"name": cluster}}});
                ns.api::<setpoint::api::Application>()
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .unwrap();
            }
        }
    }
    let mut watches = Vec::new();
    for ns in &namespaces {
        watches.push(AppWatch::start(ns).await);
    }
    let fleet = Fleet {
        namespaces,
        watches,
        size,
    };
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let watched: Vec<&str> = fleet.namespaces.iter().map(|n| n.name.as_str()).collect();
    let watched = watched.join(",");
    let started = Instant::now();
    let mut setpoint = Setpoint::scoped(
        &fleet.namespaces[0].name,
        &[
            "run",
            "--listen",
            &listen,
            "--no-sweep",
            "--github-secret",
            SECRET,
        ],
        &[
            ("SETPOINT_WATCH_NAMESPACES", &watched),
            ("SETPOINT_LOG", "warn"),
        ],
        cache.path(),
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    println!(
        "multi-cluster: 3 clusters x {size} Applications (a ConfigMap and a ServiceAccount each)"
    );
    let all = [0, 1, 2];
    let first_sync = fleet.wait(&all, &first, started).await;
    println!(
        "  | first sync, all up                       | {:>7.1} s |",
        first_sync.as_secs_f64()
    );

    write_all("2");
    let second = repo.commit("fleet v2");
    let pushed = Instant::now();
    push(port, &repo, &second);
    let others_up = fleet.wait(&[0, 1], &second, pushed).await;
    let all_up = fleet.wait(&all, &second, pushed).await;
    println!(
        "  | a commit changing all, all up            | {:>7.1} s | local and staging {:.1} s |",
        all_up.as_secs_f64(),
        others_up.as_secs_f64()
    );

    // prod's API server stopped (the process killed: connections refused).
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/controlplane/cluster.sh");
    let mut stop = std::process::Command::new(script)
        .args(["restart-apiserver", &down_seconds.to_string()])
        .env("CLUSTER_DIR", &prod.dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("stop prod's API server");
    wait_for(
        "prod's API server to stop",
        Duration::from_secs(60),
        || async {
            match prod.client.apiserver_version().await {
                Ok(_) => Err("still answers".to_string()),
                Err(_) => Ok(()),
            }
        },
    )
    .await;
    let stopped = Instant::now();
    write_all("3");
    let third = repo.commit("fleet v3");
    let pushed = Instant::now();
    push(port, &repo, &third);
    let others_down = fleet.wait(&[0, 1], &third, pushed).await;
    println!(
        "  | a commit changing all, prod down         | {:>7.1} s | local and staging ({:+.0}% against all up) |",
        others_down.as_secs_f64(),
        (others_down.as_secs_f64() / others_up.as_secs_f64() - 1.0) * 100.0
    );
    for (i, cluster) in ["local", "staging"].iter().enumerate() {
        let deployments: Api<Deployment> = match i {
            0 => fleet.namespaces[0].api(),
            _ => remote_namespaces[0].api(),
        };
        let took = drift(&deployments).await;
        println!(
            "  | drift on {cluster:<8}, prod down            | p50 {:>6.0} ms | p99 {:>6.0} ms | max {:>6.0} ms |",
            percentile(&took, 0.5),
            percentile(&took, 0.99),
            took.last().unwrap().as_secs_f64() * 1000.0
        );
    }
    let still_down = prod.client.apiserver_version().await.is_err();
    // From the moment prod answers again (cluster.sh returns later, once it
    // is ready for its own checks).
    wait_for(
        "prod's API server to return",
        Duration::from_secs(down_seconds + 120),
        || async {
            prod.client
                .apiserver_version()
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
    let back = Instant::now();
    let down_for = stopped.elapsed();
    let converged = fleet.wait(&[2], &third, back).await;
    let status = stop.wait().expect("prod's API server restarted");
    assert!(status.success(), "cluster.sh restart-apiserver failed");
    println!(
        "  | prod's Applications after it returned    | {:>7.1} s | (down {:.0} s{}) |",
        converged.as_secs_f64(),
        down_for.as_secs_f64(),
        if still_down {
            ""
        } else {
            "; it returned before the drift runs ended"
        }
    );
    drop(setpoint);
}
