//! Git requests at scale: 50 Applications in one repository, one
//! `setpoint run`. A push that names its commit is fetched once, however many
//! Applications it enqueues, and a sweep of the in-sync fleet (every
//! Application enqueued once, bounded by its cycle's start) makes at most one
//! request. Counted by the process itself (`setpoint_git_requests_total`),
//! against the real control plane, RabbitMQ and a real repository.

mod support;

use std::time::{Duration, SystemTime};

use setpoint::api::Sync;
use setpoint::event::AppKey;
use setpoint::ingest::sweep::sweep_event;
use setpoint::queue::{Queue, RetryPolicy};
use support::app::{all_apps, automated, create_app, install_crd};
use support::process::{Setpoint, free_port, github_push, post_github, scrape};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const SECRET: &str = "git-requests-secret";
const APPS: usize = 50;
const DEADLINE: Duration = Duration::from_secs(240);

fn app_files(repo: &GitRepo, app: usize, value: &str) {
    repo.write(
        &format!("apps/{app}/cm.yaml"),
        &format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-{app}\ndata:\n  v: \"{value}\"\n"
        ),
    );
    repo.write(
        &format!("apps/{app}/sa.yaml"),
        &format!("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: app-{app}\n"),
    );
}

/// The sum of every sample of `metric`, all label sets together.
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

fn counter(port: u16, metric: &str) -> f64 {
    total(&scrape(port).expect("metrics"), metric)
}

async fn all_synced(ns: &TestNamespace, commit: &str) -> Result<(), String> {
    all_apps(ns, APPS, &format!("synced at {commit}"), |s| {
        s.sync.status == Sync::Synced && s.sync.revision.as_deref() == Some(commit)
    })
    .await
}

#[tokio::test]
async fn a_push_to_fifty_apps_fetches_once_and_a_sweep_at_most_once() {
    let ns = TestNamespace::new("gitreq").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    for app in 0..APPS {
        app_files(&repo, app, "1");
    }
    let first = repo.commit("fifty apps");
    for app in 0..APPS {
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
    let prefix = amqp_prefix("gitreq");
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let url = amqp_url();
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--amqp-prefix",
            &prefix,
            "--no-sweep",
            "--github-secret",
            SECRET,
        ],
        &[
            ("SETPOINT_AMQP_URL", &url),
            ("SETPOINT_METRICS_LISTEN", &metrics_listen),
        ],
        cache.path(),
    );
    setpoint.wait_http().await;
    wait_for("the first sync of 50 apps", DEADLINE, || {
        all_synced(&ns, &first)
    })
    .await;
    const REQUESTS: &str = "setpoint_git_requests_total";
    let initial = counter(metrics_port, REQUESTS);
    // The watch enqueues the 50 Applications of its listing bounded by the
    // listing's start, so the first fetch answers all of them, however long
    // publishing the 50 events takes.
    assert!(
        initial == 1.0,
        "first sync of {APPS} apps made {initial} Git requests; log:\n{}",
        setpoint.logs()
    );

    // One push changing every app; its file list left out, so the webhook
    // enqueues all 50 with the commit.
    for app in 0..APPS {
        app_files(&repo, app, "2");
    }
    let second = repo.commit("fifty apps, v2");
    let mut body: serde_json::Value =
        serde_json::from_str(&github_push(&repo.url(), &second, &[])).unwrap();
    body["commits"] = serde_json::json!([]);
    let (code, answer) = post_github(
        setpoint.port.unwrap(),
        Some(SECRET),
        "gitreq-push",
        &body.to_string(),
    );
    assert_eq!(code, 200, "{answer}");
    wait_for("the push synced on 50 apps", DEADLINE, || {
        all_synced(&ns, &second)
    })
    .await;
    let push = counter(metrics_port, REQUESTS) - initial;
    assert_eq!(
        push,
        1.0,
        "one push to {APPS} apps made {push} Git requests; log:\n{}",
        setpoint.logs()
    );

    // A sweep cycle that starts now: every Application enqueued once, as
    // `ingest::sweep` enqueues them.
    let queue = support::amqp_queue(&prefix, RetryPolicy::default()).await;
    const RECONCILES: &str = "setpoint_reconciles_total";
    let reconciled = counter(metrics_port, RECONCILES);
    let before_sweep = counter(metrics_port, REQUESTS);
    let cycle_start = SystemTime::now();
    for app in 0..APPS {
        let key = AppKey::new(ns.name.clone(), format!("app-{app}"));
        queue.publish(&sweep_event(key, cycle_start)).await.unwrap();
    }
    wait_for("the sweep of 50 apps", DEADLINE, || async {
        let done = counter(metrics_port, RECONCILES) - reconciled;
        if done >= APPS as f64 {
            Ok(())
        } else {
            Err(format!("{done} of {APPS} swept"))
        }
    })
    .await;
    let sweep = counter(metrics_port, REQUESTS) - before_sweep;
    assert!(
        sweep <= 1.0,
        "a sweep of {APPS} in-sync apps made {sweep} Git requests; log:\n{}",
        setpoint.logs()
    );
    all_synced(&ns, &second).await.unwrap();
    drop(setpoint);
    queue.delete_topology().await.ok();
}
