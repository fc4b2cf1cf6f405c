//! `make bench`: the first sync of 100 Applications sharing one chart, from
//! a Helm repository served over HTTP and from a real OCI registry
//! (tests/support/charts.rs), by one `setpoint run` (embedded queue,
//! `--concurrency 8`) against the local control plane: the wall time until
//! every Application is Synced, the peak RSS of the process, and the
//! listing requests the repository received.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use setpoint::api::{HelmSource, Source};
use support::app::{all_apps, automated, create_app_from, install_crd};
use support::charts::{HelmRepo, OciRegistry};
use support::process::{Setpoint, free_port};
use support::{TestNamespace, wait_for};

const APPS: usize = 100;

#[tokio::main]
async fn main() {
    let repo = HelmRepo::start().await;
    repo.publish("web", "1.0.0");
    let (took, rss) = first_sync("bench-charts-http", &repo.url(), &[]).await;
    println!(
        "  {APPS} Applications, one chart from a Helm repository: first sync {:.1} s, peak RSS of setpoint run {rss:.0} MiB, {} index.yaml request(s)",
        took.as_secs_f64(),
        repo.requests("/charts/index.yaml")
    );

    let registry = OciRegistry::start().await;
    registry.push("web", "1.0.0");
    let host = registry.host();
    let (took, rss) = first_sync(
        "bench-charts-oci",
        &registry.url(),
        &[("SETPOINT_CHART_INSECURE_REGISTRIES", &host)],
    )
    .await;
    println!(
        "  {APPS} Applications, one chart from an OCI registry: first sync {:.1} s, peak RSS of setpoint run {rss:.0} MiB",
        took.as_secs_f64()
    );
}

async fn first_sync(prefix: &str, repo_url: &str, env: &[(&str, &str)]) -> (Duration, f64) {
    let ns = TestNamespace::new(prefix).await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let args = [
        "run",
        "--listen",
        &listen,
        "--sweep-interval",
        "1h",
        "--concurrency",
        "8",
    ];
    let mut setpoint = Setpoint::scoped(&ns.name, &args, env, cache.path());
    setpoint.wait_http().await;
    let started = Instant::now();
    for i in 0..APPS {
        let source = Source {
            repo_url: repo_url.to_string(),
            chart: Some("web".into()),
            target_revision: Some("1.x".into()),
            helm: Some(HelmSource::default()),
            ..Default::default()
        };
        create_app_from(&ns, &format!("web{i}"), source, automated(true, false)).await;
    }
    wait_for("every Application synced", Duration::from_secs(600), || {
        all_apps(&ns, APPS, "synced", |s| {
            s.sync
                .revision
                .as_deref()
                .is_some_and(|r| r.starts_with("1.0.0"))
        })
    })
    .await;
    let took = started.elapsed();
    (took, peak_memory_mib(setpoint.child.id()))
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
