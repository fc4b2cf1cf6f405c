//! `make bench`: the dashboard with 5,000 Applications in the index, served
//! over HTTP by the dashboard's own routes (`setpoint::ui::configure`): the
//! list page (first page, 50 rows) and `/api/v1/applications`, one request
//! after another on a kept-alive connection; p50/p99/max, and the process's
//! RSS. No cluster: the store is filled in memory and `--ui-auth none`
//! (with `kubernetes`, reviews are cached, so a warm request costs the same).

use std::time::{Duration, Instant};

use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use setpoint::api::{
    Application, ApplicationSpec, ApplicationStatus, Health, HealthStatus, OperationSummary,
    ResourceStatus, Source, Sync, SyncStatus,
};
use setpoint::ui::auth::Authorizer;
use setpoint::ui::{AuthMode, QueueState, UiState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const APPS: usize = 5_000;
const RUNS: usize = 400;
/// The target.
const P99_TARGET: Duration = Duration::from_millis(100);

fn store() -> kube::runtime::reflector::Store<Application> {
    let mut writer: Writer<Application> = Writer::new(());
    for i in 0..APPS {
        let mut app = Application::new(
            &format!("app-{i:04}"),
            ApplicationSpec {
                source: Source {
                    repo_url: format!("https://github.com/example/deploy-{}.git", i % 40),
                    path: Some(format!("envs/app-{i}")),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        app.metadata.namespace = Some(format!("team-{}", i % 50));
        app.metadata.resource_version = Some("1".into());
        app.status = Some(ApplicationStatus {
            sync: SyncStatus {
                status: if i % 17 == 0 {
                    Sync::OutOfSync
                } else {
                    Sync::Synced
                },
                revision: Some(format!("{:040x}", i as u128 * 7919)),
            },
            health: HealthStatus {
                status: if i % 23 == 0 {
                    Health::Progressing
                } else {
                    Health::Healthy
                },
                message: None,
            },
            resources: (0..5)
                .map(|r| ResourceStatus {
                    group: "apps".into(),
                    version: "v1".into(),
                    kind: "Deployment".into(),
                    namespace: Some(format!("team-{}", i % 50)),
                    name: format!("web-{r}"),
                    sync: Sync::Synced,
                    health: Health::Healthy,
                    message: None,
                })
                .collect(),
            operation: Some(OperationSummary {
                revision: format!("{:040x}", i),
                finished_at: "2026-12-03T12:00:00Z".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        writer.apply_watcher_event(&watcher::Event::Apply(app));
    }
    writer.as_reader()
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// One GET on a kept-alive connection; the body's length.
async fn get(stream: &mut tokio::net::TcpStream, path: &str) -> usize {
    let request = format!("GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buffer = Vec::with_capacity(64 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed");
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("a content length");
            while buffer.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await.unwrap();
                buffer.extend_from_slice(&chunk[..n]);
            }
            return length;
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let before = rss_kib();
    let store = store();
    let filled = rss_kib();
    // Never called with --ui-auth none.
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let state = UiState::new(
        store,
        Authorizer::new(client.clone(), AuthMode::None),
        client,
        None,
        Default::default(),
        QueueState::default(),
    );
    let server = actix_web::HttpServer::new(move || {
        let state = state.clone();
        actix_web::App::new().configure(move |cfg| setpoint::ui::configure(cfg, state))
    })
    .workers(2)
    .disable_signals()
    .bind("127.0.0.1:0")
    .unwrap();
    let address = server.addrs()[0];
    tokio::spawn(server.run());
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!(
        "ui: {APPS} Applications in the index, {RUNS} sequential requests per path ({profile} build)"
    );
    let mut failed = false;
    for path in [
        "/",
        "/api/v1/applications",
        "/?sync=OutOfSync&page=2",
        "/api/v1/applications?namespace=team-7&per_page=500",
        "/applications/team-7/app-0007",
    ] {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let bytes = get(&mut stream, path).await;
        let mut times = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            let start = Instant::now();
            get(&mut stream, path).await;
            times.push(start.elapsed());
        }
        times.sort();
        let p99 = percentile(&times, 0.99);
        failed |= p99 > P99_TARGET;
        println!(
            "  GET {path:<52} {bytes:>7} bytes  p50 {:>8.2?}  p99 {:>8.2?}  max {:>8.2?}",
            percentile(&times, 0.50),
            p99,
            times[RUNS - 1]
        );
    }
    println!(
        "  RSS: {} MiB before the index, {} MiB with it, {} MiB after the requests",
        before / 1024,
        filled / 1024,
        rss_kib() / 1024
    );
    println!(
        "  p99 target < {P99_TARGET:?}: {}",
        if failed { "OVER" } else { "ok" }
    );
}
