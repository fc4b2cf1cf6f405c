//! Graceful shutdown on SIGTERM, against the real control plane and
//! RabbitMQ: a worker stopped in the middle of a burst finishes what it
//! started and gives back the rest; nothing is lost.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use setpoint::event::{AppKey, Cause, Event};
use setpoint::queue::Queue;
use setpoint::queue::amqp::{AmqpQueue, AmqpSettings};
use support::app::{automated, create_app, install_crd, synced_at};
use support::process::Setpoint;
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const APPS: usize = 40;
const DEADLINE: Duration = Duration::from_secs(120);

/// `(starts, ends)` per worker id in a reconcile record.
fn record(path: &std::path::Path) -> HashMap<String, (usize, usize)> {
    let mut by_worker: HashMap<String, (usize, usize)> = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if let [what, _app, worker] = words[..] {
            let entry = by_worker.entry(worker.to_string()).or_default();
            match what {
                "start" => entry.0 += 1,
                "end" => entry.1 += 1,
                _ => {}
            }
        }
    }
    by_worker
}

#[tokio::test]
async fn a_sigterm_during_a_burst_loses_nothing() {
    let ns = TestNamespace::new("sigterm").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    for i in 0..APPS {
        repo.write(
            &format!("apps/{i}/cm.yaml"),
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\ndata: {{n: \"{i}\"}}\n"
            ),
        );
    }
    let commit = repo.commit("a burst of apps");
    for i in 0..APPS {
        let path = format!("apps/{i}");
        create_app(
            &ns,
            &format!("app-{i}"),
            &repo.url(),
            &path,
            automated(true, true),
        )
        .await;
    }
    let prefix = amqp_prefix("sigterm");
    let queue = AmqpQueue::connect(AmqpSettings {
        url: amqp_url(),
        queue_type: support::amqp_queue_type(),
        prefix: prefix.clone(),
        ..AmqpSettings::default()
    })
    .await;
    assert!(
        queue.wait_ready(Duration::from_secs(20)).await,
        "RabbitMQ is up"
    );

    let cache = tempfile::tempdir().unwrap();
    let first_record = cache.path().join("first.log");
    let url = amqp_url();
    let args = [
        "worker",
        "--amqp-prefix",
        &prefix,
        "--concurrency",
        "1",
        "--shutdown-grace",
        "30s",
    ];
    let first_record_s = first_record.to_str().unwrap().to_string();
    let mut first = Setpoint::scoped(
        &ns.name,
        &args,
        &[
            ("SETPOINT_AMQP_URL", url.as_str()),
            ("SETPOINT_RECONCILE_RECORD", first_record_s.as_str()),
        ],
        &cache.path().join("first").tap_mkdir(),
    );
    // One event per Application, published before the worker gets far.
    for i in 0..APPS {
        let event = Event::new(AppKey::new(&ns.name, format!("app-{i}")), Cause::Manual);
        queue.publish(&event).await.unwrap();
    }
    wait_for("the first worker to be in the burst", DEADLINE, || async {
        let starts: usize = record(&first_record).values().map(|(s, _)| s).sum();
        if starts >= 3 {
            Ok(())
        } else {
            Err(format!("{starts} reconciles started"))
        }
    })
    .await;

    // SIGTERM, as Kubernetes sends it.
    let pid = first.child.id() as i32;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = wait_for("the first worker to exit", DEADLINE, || {
        let exited = first.child.try_wait().ok().flatten();
        async move { exited.ok_or_else(|| "still running".to_string()) }
    })
    .await;
    assert!(status.success(), "a clean exit: {status}\n{}", first.logs());
    let done = record(&first_record);
    let (starts, ends) = done.values().fold((0, 0), |(s, e), (a, b)| (s + a, e + b));
    assert_eq!(
        starts, ends,
        "every reconcile it started, it finished: {done:?}"
    );
    assert!(
        ends < APPS,
        "stopped in the middle of the burst ({ends} of {APPS} done)"
    );
    assert!(first.logs().contains("worker stopping"), "{}", first.logs());

    // What it gave back goes to the next worker: every Application syncs.
    let second_record = cache.path().join("second.log");
    let second_record_s = second_record.to_str().unwrap().to_string();
    let _second = Setpoint::scoped(
        &ns.name,
        &args,
        &[
            ("SETPOINT_AMQP_URL", url.as_str()),
            ("SETPOINT_RECONCILE_RECORD", second_record_s.as_str()),
        ],
        &cache.path().join("second").tap_mkdir(),
    );
    wait_for("every Application synced", DEADLINE, || async {
        let mut waiting = Vec::new();
        for i in 0..APPS {
            if synced_at(&ns, &format!("app-{i}"), &commit).await.is_err() {
                waiting.push(i);
            }
        }
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("not synced: {waiting:?}"))
        }
    })
    .await;
    let second_ends: usize = record(&second_record).values().map(|(_, e)| e).sum();
    assert!(
        ends + second_ends >= APPS,
        "{ends} + {second_ends} reconciles cover {APPS} apps"
    );
    wait_for("the queue drained, nothing parked", DEADLINE, || async {
        match queue.depth().await {
            Ok(depth) if depth.ready == 0 && depth.parked == 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
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
