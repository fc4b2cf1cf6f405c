//! A RabbitMQ cluster that loses a node in the middle of a burst of
//! webhooks: every push answered 200 still leads to its Application syncing
//! that commit (or a later one), nothing is parked, the burst finishes.
//!
//! Against the 3-node cluster of `tests/broker/rabbitmq.sh cluster-up`
//! (AMQP on 127.0.0.1:5681-5683), which it stops and starts node by node,
//! so it is a test binary of its own, run by `make test-ha` (`test = false`
//! in Cargo.toml). Its queues are the type `SETPOINT_AMQP_QUEUE_TYPE` says,
//! quorum by default: classic queues live on one node, and losing that node
//! loses them (the failure model in ARCHITECTURE.md). With
//! `SETPOINT_AMQP_QUEUE_TYPE=classic` this test fails: most pushes are
//! answered 503 while the node holding the queues is down.

mod support;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use setpoint::api::{Application, Sync as SyncStatus};
use setpoint::queue::amqp::{AmqpQueue, AmqpSettings};
use support::app::{automated, create_app, install_crd};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_queue_type, wait_for};

const SECRET: &str = "ha-secret";
const APPS: usize = 100;
const ROUNDS: usize = 5;
const SHARDS: &str = "8";

/// Node `n`'s AMQP URL (the default vhost; guest is allowed on loopback).
fn node_url(n: usize) -> String {
    format!("amqp://guest:guest@127.0.0.1:{}/%2f", 5680 + n)
}

/// The three nodes' URLs, starting with node `first`.
fn urls_from(first: usize) -> String {
    (0..3)
        .map(|k| node_url((first - 1 + k) % 3 + 1))
        .collect::<Vec<_>>()
        .join(",")
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/broker/rabbitmq.sh")
}

fn cluster(args: &[&str]) {
    let output = Command::new(script())
        .args(args)
        .output()
        .expect("rabbitmq.sh");
    assert!(
        output.status.success(),
        "rabbitmq.sh {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Starts node `n` again in the background: the burst goes on meanwhile.
fn start_node(n: usize) -> Child {
    Command::new(script())
        .args(["cluster-start", &n.to_string()])
        .spawn()
        .expect("rabbitmq.sh cluster-start")
}

fn wait_child(mut child: Child, what: &str) {
    let status = child.wait().expect(what);
    assert!(status.success(), "{what} failed");
}

fn config_map(i: usize, round: usize) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\ndata:\n  v: \"{round}\"\n")
}

/// `Ok` once `app` is Synced at one of `commits`.
async fn synced_at_any(ns: &TestNamespace, app: &str, commits: &[String]) -> Result<(), String> {
    let app = ns
        .api::<Application>()
        .get(app)
        .await
        .map_err(|e| e.to_string())?;
    let status = app.status.unwrap_or_default();
    match (status.sync.status, status.sync.revision) {
        (SyncStatus::Synced, Some(revision)) if commits.contains(&revision) => Ok(()),
        (sync, revision) => Err(format!("{sync:?} at {revision:?}")),
    }
}

#[tokio::test]
async fn a_cluster_that_loses_a_node_loses_no_acknowledged_push() {
    cluster(&["cluster-up"]);
    let ns = TestNamespace::new("ha").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    for i in 0..APPS {
        repo.write(&format!("apps/{i}/cm.yaml"), &config_map(i, 0));
    }
    let mut commits = vec![repo.commit("round 0")];
    for i in 0..APPS {
        create_app(
            &ns,
            &format!("app-{i}"),
            &repo.url(),
            &format!("apps/{i}"),
            automated(true, true),
        )
        .await;
    }

    // Two processes, each with the three URLs in another order: A (which
    // takes the webhooks) connects to node 1, B to node 2.
    let prefix = amqp_prefix("ha");
    let queue_type = amqp_queue_type().to_string();
    let caches = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let spawn = |first: usize, cache: &tempfile::TempDir| {
        let listen = format!("127.0.0.1:{}", free_port());
        let args = [
            "run",
            "--listen",
            &listen,
            "--amqp-prefix",
            &prefix,
            "--shards",
            SHARDS,
            "--no-sweep",
            "--no-watch",
            "--github-secret",
            SECRET,
        ];
        let urls = urls_from(first);
        let env = [
            ("SETPOINT_AMQP_URL", urls.as_str()),
            ("SETPOINT_AMQP_QUEUE_TYPE", queue_type.as_str()),
            ("SETPOINT_BALANCE_INTERVAL", "1s"),
        ];
        Setpoint::scoped(&ns.name, &args, &env, cache.path())
    };
    let mut a = spawn(1, &caches[0]);
    let mut b = spawn(2, &caches[1]);
    a.wait_http().await;
    b.wait_http().await;
    let port = a.port.unwrap();

    // Without the watch, a push per app brings each to the first commit.
    for i in 0..APPS {
        let body = github_push(&repo.url(), &commits[0], &[&format!("apps/{i}/cm.yaml")]);
        wait_for("the webhook to accept", Duration::from_secs(60), || async {
            match post_github(port, Some(SECRET), &support::unique_name("d"), &body) {
                (200, b) if b.contains(&format!("app-{i}\"")) => Ok(()),
                (code, b) => Err(format!("{code} {b}")),
            }
        })
        .await;
    }
    for i in 0..APPS {
        let name = format!("app-{i}");
        wait_for(
            &format!("{name} at the first commit"),
            Duration::from_secs(180),
            || synced_at_any(&ns, &name, &commits[..1]),
        )
        .await;
    }

    // The burst: a commit changing every app per round, a push per app per
    // round. Node 1 (A's) stops after the first 100 pushes and starts again
    // while the burst goes on; once it is back, node 2 (B's, and A's since
    // it left node 1) stops, and starts again.
    let burst = Instant::now();
    let mut last_accepted: Vec<Option<usize>> = vec![None; APPS];
    let (mut accepted, mut refused) = (0usize, 0usize);
    let mut restarting = None;
    for round in 1..=ROUNDS {
        for i in 0..APPS {
            repo.write(&format!("apps/{i}/cm.yaml"), &config_map(i, round));
        }
        commits.push(repo.commit(&format!("round {round}")));
        for i in 0..APPS {
            let sent = (round - 1) * APPS + i;
            match sent {
                100 => {
                    cluster(&["cluster-stop", "1"]);
                    eprintln!("[ha] node 1 stopped at push {sent}");
                }
                200 => restarting = Some(start_node(1)),
                300 => {
                    wait_child(restarting.take().unwrap(), "starting node 1");
                    cluster(&["cluster-status"]);
                    cluster(&["cluster-stop", "2"]);
                    eprintln!("[ha] node 2 stopped at push {sent}");
                }
                400 => restarting = Some(start_node(2)),
                _ => {}
            }
            let body = github_push(
                &repo.url(),
                &commits[round],
                &[&format!("apps/{i}/cm.yaml")],
            );
            match post_github(port, Some(SECRET), &format!("burst-{round}-{i}"), &body) {
                (200, _) => {
                    accepted += 1;
                    last_accepted[i] = Some(round);
                }
                (503, _) => refused += 1,
                (code, body) => panic!("push {sent}: unexpected {code}: {body}"),
            }
        }
    }
    if let Some(child) = restarting.take() {
        wait_child(child, "starting node 2");
    }
    let posted = burst.elapsed();
    eprintln!("[ha] {accepted} pushes answered 200, {refused} answered 503, in {posted:?}");
    assert!(accepted >= ROUNDS * APPS / 2, "most pushes were accepted");

    for (i, round) in last_accepted.iter().enumerate() {
        let Some(round) = round else { continue };
        let name = format!("app-{i}");
        wait_for(
            &format!("{name} at round {round} or later"),
            Duration::from_secs(300),
            || synced_at_any(&ns, &name, &commits[*round..]),
        )
        .await;
    }
    eprintln!(
        "[ha] every accepted push synced {:?} after the burst began",
        burst.elapsed()
    );

    let queue = AmqpQueue::connect(AmqpSettings {
        url: urls_from(3),
        queue_type: amqp_queue_type(),
        prefix: prefix.clone(),
        shards: SHARDS.parse().unwrap(),
        ..AmqpSettings::default()
    })
    .await;
    assert!(queue.wait_ready(Duration::from_secs(30)).await);
    let depth = queue.depth().await.unwrap();
    assert_eq!(
        depth.parked,
        0,
        "nothing is parked: {:?}",
        queue.parked().await
    );
    for process in [&mut a, &mut b] {
        assert!(
            process.child.try_wait().unwrap().is_none(),
            "setpoint is still running"
        );
    }
    a.kill();
    b.kill();
    queue.delete_topology().await.unwrap();
}
