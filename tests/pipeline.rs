//! The event pipeline end to end: Setpoint runs as its own processes against
//! the real control plane, the real RabbitMQ and real Git repositories;
//! webhooks are posted over HTTP, signed as GitHub and GitLab sign them.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use setpoint::queue::amqp::AmqpQueue;
use setpoint::queue::{Queue, RetryPolicy};
use support::app::{automated, create_app, install_crd, synced_at};
use support::process::{
    Setpoint, free_port, github_push, gitlab_push, post_github, post_gitlab, wait_for_shared_shards,
};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const SECRET: &str = "webhook-secret-for-tests";

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: \"{value}\"\n"
    )
}

fn deployment(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: app\n        image: app:1\n"
    )
}

async fn amqp(prefix: &str) -> AmqpQueue {
    amqp_with(prefix, RetryPolicy::default()).await
}

/// The queue as the processes under test declare it (the retry delays are
/// part of the topology).
async fn amqp_with(prefix: &str, retry: RetryPolicy) -> AmqpQueue {
    support::amqp_queue(prefix, retry).await
}

fn run_args<'a>(port: &'a str, prefix: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--listen",
        port,
        "--amqp-prefix",
        prefix,
        "--no-sweep",
        "--github-secret",
        SECRET,
        "--gitlab-token",
        SECRET,
    ]
}

#[tokio::test]
async fn a_signed_github_or_gitlab_push_syncs_the_app_to_that_commit() {
    let ns = TestNamespace::new("webhook").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let repo = GitRepo::new();
    let first = repo
        .write("app/cm.yaml", &configmap("settings", "1"))
        .commit("one");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;

    let prefix = amqp_prefix("webhook");
    let listen = format!("127.0.0.1:{}", free_port());
    let url = amqp_url();
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &run_args(&listen, &prefix),
        &[("SETPOINT_AMQP_URL", &url)],
        cache.path(),
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    // Created: the watch enqueues it and it syncs without any webhook.
    wait_for("the first sync", DEADLINE, || synced_at(&ns, "app", &first)).await;

    let second = repo
        .write("app/cm.yaml", &configmap("settings", "2"))
        .commit("two");
    let (code, body) = post_github(
        port,
        Some(SECRET),
        "delivery-1",
        &github_push(&repo.url(), &second, &["app/cm.yaml"]),
    );
    assert_eq!(code, 200, "{body}");
    assert!(body.contains(&format!("{}/app", ns.name)), "{body}");
    wait_for("the GitHub push synced", DEADLINE, || {
        synced_at(&ns, "app", &second)
    })
    .await;

    let third = repo
        .write("app/cm.yaml", &configmap("settings", "3"))
        .commit("three");
    let (code, body) = post_gitlab(
        port,
        SECRET,
        &gitlab_push(&repo.url(), &third, &["app/cm.yaml"]),
    );
    assert_eq!(code, 200, "{body}");
    wait_for("the GitLab push synced", DEADLINE, || {
        synced_at(&ns, "app", &third)
    })
    .await;
    let data = ns
        .api::<ConfigMap>()
        .get("settings")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(data["key"], "3");
    amqp(&prefix).await.delete_topology().await.unwrap();
}

#[tokio::test]
async fn a_bad_signature_is_401_and_enqueues_nothing_and_pushes_route_by_path() {
    let ns = TestNamespace::new("routing").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let repo = GitRepo::new();
    let commit = repo
        .write("apps/a/cm.yaml", &configmap("a", "1"))
        .write("apps/b/cm.yaml", &configmap("b", "1"))
        .commit("a and b");
    create_app(&ns, "a", &repo.url(), "apps/a", automated(true, true)).await;
    create_app(&ns, "b", &repo.url(), "apps/b", automated(true, true)).await;

    // The webhook role alone: what it enqueues stays on RabbitMQ to be read.
    let prefix = amqp_prefix("routing");
    let queue = amqp(&prefix).await;
    let listen = format!("127.0.0.1:{}", free_port());
    let url = amqp_url();
    let args = [
        "webhook",
        "--listen",
        &listen,
        "--amqp-prefix",
        &prefix,
        "--github-secret",
        SECRET,
    ];
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &args,
        &[("SETPOINT_AMQP_URL", &url)],
        cache.path(),
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    let body = github_push(&repo.url(), &commit, &["apps/a/cm.yaml"]);

    let (code, _) = post_github(port, None, "d-unsigned", &body);
    assert_eq!(code, 401);
    let (code, _) = post_github(port, Some("not-the-secret"), "d-wrong", &body);
    assert_eq!(code, 401);
    assert_eq!(queue.depth().await.unwrap().ready, 0, "nothing enqueued");

    // The index fills from the Application watch: retry until it knows both.
    let accepted = wait_for("the webhook to match app a", DEADLINE, || async {
        match post_github(port, Some(SECRET), &support::unique_name("d"), &body) {
            (200, body) if body.contains("/a\"") => Ok(body),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    assert!(
        !accepted.contains("/b\""),
        "app b saw no change: {accepted}"
    );
    let mut deliveries = queue.consume(100).await.unwrap();
    let mut apps = Vec::new();
    while let Ok(Some(delivery)) =
        tokio::time::timeout(Duration::from_secs(2), deliveries.recv()).await
    {
        apps.push(delivery.event.app.name.clone());
        delivery.ack().await.unwrap();
    }
    assert!(
        !apps.is_empty() && apps.iter().all(|a| a == "a"),
        "only app a was enqueued: {apps:?}"
    );
    queue.delete_topology().await.unwrap();
}

#[tokio::test]
async fn a_manual_scale_is_corrected_by_the_watch_and_without_it_by_the_sweep() {
    let ns = TestNamespace::new("drift").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write("watched/deploy.yaml", &deployment("watched", 3))
        .write("swept/deploy.yaml", &deployment("swept", 3))
        .commit("two deployments");
    create_app(
        &ns,
        "watched",
        &repo.url(),
        "watched",
        automated(true, true),
    )
    .await;
    create_app(&ns, "swept", &repo.url(), "swept", automated(true, true)).await;
    let deployments = ns.api::<Deployment>();
    let replicas = |name: &'static str| {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get(name).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(d.spec.replicas.unwrap_or(1))
        }
    };

    // Watch path: no webhook, no sweep. The in-process queue.
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let watched = Setpoint::scoped(
        &ns.name,
        &["run", "--listen", &listen, "--no-sweep"],
        &[],
        cache.path(),
    );
    wait_for("watched synced", DEADLINE, || {
        synced_at(&ns, "watched", &commit)
    })
    .await;
    let scale = PatchParams {
        field_manager: Some("kubectl".into()),
        ..Default::default()
    };
    let one = Patch::Merge(serde_json::json!({"spec": {"replicas": 1}}));
    deployments
        .patch_scale("watched", &scale, &one)
        .await
        .unwrap();
    wait_for("the watch to correct the scale", DEADLINE, || async {
        match replicas("watched").await? {
            3 => Ok(()),
            n => Err(format!("{n} replicas")),
        }
    })
    .await;
    drop(watched);

    // Sweep path: no watches; a short interval.
    let listen = format!("127.0.0.1:{}", free_port());
    let args = [
        "run",
        "--listen",
        &listen,
        "--no-watch",
        "--sweep-interval",
        "2s",
    ];
    let _swept = Setpoint::scoped(&ns.name, &args, &[], cache.path());
    wait_for("swept synced", DEADLINE, || {
        synced_at(&ns, "swept", &commit)
    })
    .await;
    deployments
        .patch_scale("swept", &scale, &one)
        .await
        .unwrap();
    wait_for("the sweep to correct the scale", DEADLINE, || async {
        match replicas("swept").await? {
            3 => Ok(()),
            n => Err(format!("{n} replicas")),
        }
    })
    .await;
}

/// `--watch-namespaces` (Argo CD's `--application-namespaces`): the
/// Applications of other namespaces are not indexed, swept or watched.
#[tokio::test]
async fn watch_namespaces_leave_other_namespaces_applications_alone() {
    let ns = TestNamespace::new("scoped").await;
    let other = TestNamespace::new("unscoped").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write("in/cm.yaml", &configmap("in-scope", "1"))
        .write("out/cm.yaml", &configmap("out-of-scope", "1"))
        .commit("two apps");
    create_app(&ns, "in", &repo.url(), "in", automated(true, true)).await;
    create_app(&other, "out", &repo.url(), "out", automated(true, true)).await;

    let cache = tempfile::tempdir().unwrap();
    let record = cache.path().join("reconciles.log");
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["run", "--listen", &listen, "--sweep-interval", "1s"];
    let env = [
        ("SETPOINT_WATCH_NAMESPACES", ns.name.as_str()),
        ("SETPOINT_RECONCILE_RECORD", record.to_str().unwrap()),
        ("POD_NAMESPACE", ns.name.as_str()),
    ];
    let setpoint = Setpoint::spawn(&args, &env, cache.path());
    wait_for("the in-scope app synced", DEADLINE, || {
        synced_at(&ns, "in", &commit)
    })
    .await;
    // Three sweeps of the in-scope app: the out-of-scope one would have had
    // as many chances by now (the sweep walks every indexed app each cycle).
    let mine = format!("end {}/in ", ns.name);
    wait_for("three reconciles of the in-scope app", DEADLINE, || async {
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        match text.lines().filter(|l| l.starts_with(&mine)).count() {
            n if n >= 3 => Ok(text),
            n => Err(format!("{n} so far:\n{text}")),
        }
    })
    .await;
    let text = std::fs::read_to_string(&record).unwrap();
    assert!(
        !text.contains(&format!("{}/", other.name)),
        "an Application outside the scope was reconciled:\n{text}"
    );
    let out = support::app::get_app(&other, "out").await;
    assert!(
        out.status.is_none(),
        "the out-of-scope Application got a status: {:?}",
        out.status
    );
    assert!(
        other
            .api::<ConfigMap>()
            .get_opt("out-of-scope")
            .await
            .unwrap()
            .is_none(),
        "the out-of-scope app's ConfigMap was applied"
    );
    assert!(
        setpoint.logs().contains(&format!("namespaces {}", ns.name)),
        "the scope is logged"
    );
}

#[tokio::test]
async fn two_workers_fifty_apps_five_hundred_events_never_overlap() {
    let ns = TestNamespace::new("burst").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    for i in 0..50 {
        repo.write(
            &format!("apps/{i}/cm.yaml"),
            &configmap(&format!("cm-{i}"), "1"),
        );
    }
    let commit = repo.commit("fifty apps");
    for i in 0..50 {
        create_app(
            &ns,
            &format!("app-{i}"),
            &repo.url(),
            &format!("apps/{i}"),
            automated(true, true),
        )
        .await;
    }
    let prefix = amqp_prefix("burst");
    let queue = amqp(&prefix).await;
    let cache = tempfile::tempdir().unwrap();
    let record = cache.path().join("reconciles.log");
    let url = amqp_url();
    let record_s = record.to_str().unwrap().to_string();
    let env = [
        ("SETPOINT_AMQP_URL", url.as_str()),
        ("SETPOINT_RECONCILE_RECORD", record_s.as_str()),
    ];
    let args = [
        "worker",
        "--amqp-prefix",
        &prefix,
        "--concurrency",
        "4",
        "--balance-interval",
        "300ms",
    ];
    // Each worker's /metrics says how many of the 16 shards it is the
    // active consumer of; the burst comes once they share them fairly, as
    // it would on a running fleet (a burst already waiting when the first
    // worker starts is all prefetched by it, which is correct but is not
    // what this test is about).
    let ports = [free_port(), free_port()];
    let mut pool = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let listen = format!("127.0.0.1:{port}");
        let mut env = env.to_vec();
        env.push(("SETPOINT_METRICS_LISTEN", listen.as_str()));
        let dir = cache.path().join(format!("w{i}")).tap_mkdir();
        pool.push(Setpoint::scoped(&ns.name, &args, &env, &dir));
    }
    wait_for_shared_shards(&ports, 8).await;

    for n in 0..500 {
        let app = setpoint::event::AppKey::new(&ns.name, format!("app-{}", n % 50));
        let event = setpoint::event::Event::new(app, setpoint::event::Cause::Manual);
        queue.publish(&event).await.unwrap();
    }
    for i in 0..50 {
        let name = format!("app-{i}");
        wait_for(&format!("{name} synced"), DEADLINE, || {
            synced_at(&ns, &name, &commit)
        })
        .await;
    }
    // Both workers are idle once the queue is empty and nothing is in flight.
    wait_for("the queue to drain", DEADLINE, || async {
        let depth = queue.depth().await.map_err(|e| e.to_string())?;
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        let starts = text.lines().filter(|l| l.starts_with("start")).count();
        let ends = text.lines().filter(|l| l.starts_with("end")).count();
        if depth.ready == 0 && starts == ends {
            Ok(())
        } else {
            Err(format!("{depth:?}, {starts} starts, {ends} ends"))
        }
    })
    .await;

    // The record is one file both workers append to: its line order is the
    // order of the events, so an overlap would show as two starts in a row.
    let text = std::fs::read_to_string(&record).unwrap();
    let mut running: HashMap<&str, &str> = HashMap::new();
    let mut reconciles = 0;
    let mut workers = std::collections::HashSet::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        let (what, app, worker) = (parts[0], parts[1], parts[2]);
        workers.insert(worker);
        match what {
            "start" => {
                if let Some(other) = running.insert(app, worker) {
                    panic!("{app} started on {worker} while running on {other}");
                }
                reconciles += 1;
            }
            _ => assert_eq!(
                running.remove(app),
                Some(worker),
                "{app} ended where it started"
            ),
        }
    }
    assert!(
        reconciles < 250,
        "500 events collapsed into {reconciles} reconciles"
    );
    assert!(reconciles >= 50);
    assert_eq!(workers.len(), 2, "both workers took part: {workers:?}");
    queue.delete_topology().await.unwrap();
}

#[tokio::test]
async fn an_event_that_always_fails_is_parked_while_others_flow() {
    let ns = TestNamespace::new("parking").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write("app/cm.yaml", &configmap("good", "1"))
        .commit("good");
    create_app(&ns, "good", &repo.url(), "app", automated(true, true)).await;
    // Nothing listens on port 1: every fetch fails, a transient error.
    create_app(
        &ns,
        "unreachable",
        "http://127.0.0.1:1/nowhere.git",
        "app",
        automated(true, true),
    )
    .await;
    let prefix = amqp_prefix("parking");
    let retry = RetryPolicy {
        max_attempts: 3,
        initial: Duration::from_millis(100),
        ..Default::default()
    };
    let queue = amqp_with(&prefix, retry).await;
    let cache = tempfile::tempdir().unwrap();
    let url = amqp_url();
    let args = [
        "worker",
        "--amqp-prefix",
        &prefix,
        "--max-attempts",
        "3",
        "--retry-initial",
        "100ms",
    ];
    let _worker = Setpoint::scoped(
        &ns.name,
        &args,
        &[("SETPOINT_AMQP_URL", &url)],
        cache.path(),
    );
    for name in ["unreachable", "good"] {
        let app = setpoint::event::AppKey::new(&ns.name, name);
        queue
            .publish(&setpoint::event::Event::new(
                app,
                setpoint::event::Cause::Manual,
            ))
            .await
            .unwrap();
    }
    wait_for("good synced", DEADLINE, || synced_at(&ns, "good", &commit)).await;
    let parked = wait_for("the failing event parked", DEADLINE, || async {
        let parked = queue.parked().await.map_err(|e| e.to_string())?;
        if parked.is_empty() {
            Err("nothing parked yet".into())
        } else {
            Ok(parked)
        }
    })
    .await;
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].0.app.name, "unreachable");
    assert_eq!(parked[0].0.attempt, 3);
    assert!(
        parked[0].1.contains("127.0.0.1:1"),
        "the last error: {}",
        parked[0].1
    );
    queue.delete_topology().await.unwrap();
}

trait TapMkdir {
    fn tap_mkdir(self) -> Self;
}

impl TapMkdir for std::path::PathBuf {
    fn tap_mkdir(self) -> Self {
        std::fs::create_dir_all(&self).unwrap();
        self
    }
}

#[tokio::test]
async fn a_worker_killed_mid_reconcile_leaves_the_event_to_another() {
    let ns = TestNamespace::new("sigkill").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    // Enough objects that the reconcile takes a while to apply.
    for i in 0..300 {
        repo.write(
            &format!("app/cm-{i:03}.yaml"),
            &configmap(&format!("cm-{i}"), "1"),
        );
    }
    let commit = repo.commit("300 config maps");
    create_app(&ns, "big", &repo.url(), "app", automated(true, true)).await;
    let prefix = amqp_prefix("sigkill");
    let queue = amqp(&prefix).await;
    let cache = tempfile::tempdir().unwrap();
    let record = cache.path().join("reconciles.log");
    let (url, record_s) = (amqp_url(), record.to_str().unwrap().to_string());
    let env = [
        ("SETPOINT_AMQP_URL", url.as_str()),
        ("SETPOINT_RECONCILE_RECORD", record_s.as_str()),
    ];
    let args = ["worker", "--amqp-prefix", &prefix];
    let mut workers = [
        Setpoint::scoped(&ns.name, &args, &env, &cache.path().join("w1").tap_mkdir()),
        Setpoint::scoped(&ns.name, &args, &env, &cache.path().join("w2").tap_mkdir()),
    ];
    let app = setpoint::event::AppKey::new(&ns.name, "big");
    queue
        .publish(&setpoint::event::Event::new(
            app,
            setpoint::event::Cause::Manual,
        ))
        .await
        .unwrap();

    let started = wait_for("a reconcile to start", DEADLINE, || async {
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        text.lines()
            .find(|l| l.starts_with("start"))
            .map(String::from)
            .ok_or_else(|| "none yet".to_string())
    })
    .await;
    let worker = started.rsplit('-').next().unwrap().parse::<u32>().unwrap();
    let victim = workers
        .iter()
        .position(|w| w.child.id() == worker)
        .expect("a worker of ours");
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &worker.to_string()])
        .status();
    workers[victim].kill();

    wait_for("the other worker to converge the app", DEADLINE, || {
        synced_at(&ns, "big", &commit)
    })
    .await;
    let text = wait_for("the other worker's reconcile to end", DEADLINE, || async {
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.starts_with("end") && !l.ends_with(&format!("-{worker}")))
        {
            Ok(text)
        } else {
            Err(text)
        }
    })
    .await;
    let killed: Vec<&str> = text
        .lines()
        .filter(|l| l.ends_with(&format!("-{worker}")))
        .collect();
    assert!(
        killed.iter().all(|l| l.starts_with("start")),
        "the killed worker never finished: {killed:?}"
    );
    queue.delete_topology().await.unwrap();
}
