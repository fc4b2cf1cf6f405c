//! RabbitMQ stopped and started again in the middle of a burst of webhooks:
//! every webhook that got a 2xx still leads to a reconcile, and Setpoint does
//! not crash. Its own test binary: it stops the shared broker, and cargo runs
//! test binaries one at a time.

mod support;

use std::process::Command;
use std::time::Duration;

use support::app::{automated, create_app, install_crd, synced_at};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const SECRET: &str = "restart-secret";
const APPS: usize = 30;

fn rabbitmqctl(args: &[&str]) {
    let status = Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("rabbitmqctl");
    assert!(
        status.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

#[tokio::test]
async fn webhooks_acknowledged_around_a_broker_restart_all_reconcile() {
    let ns = TestNamespace::new("restart").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let cm = |i: usize, v: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm-{i}\ndata:\n  v: \"{v}\"\n")
    };
    for i in 0..APPS {
        repo.write(&format!("apps/{i}/cm.yaml"), &cm(i, "1"));
    }
    let first = repo.commit("first");
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
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let prefix = amqp_prefix("restart");
    let url = amqp_url();
    let args = [
        "run",
        "--listen",
        &listen,
        "--amqp-prefix",
        &prefix,
        "--no-sweep",
        "--no-watch",
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
    // Without the watch, a webhook per app brings each to the first commit.
    for i in 0..APPS {
        let body = github_push(&repo.url(), &first, &[&format!("apps/{i}/cm.yaml")]);
        wait_for("the webhook to accept", Duration::from_secs(60), || async {
            match post_github(port, Some(SECRET), &support::unique_name("d"), &body) {
                (200, b) if b.contains(&format!("app-{i}\"")) => Ok(()),
                (code, b) => Err(format!("{code} {b}")),
            }
        })
        .await;
    }

    for i in 0..APPS {
        repo.write(&format!("apps/{i}/cm.yaml"), &cm(i, "2"));
    }
    let second = repo.commit("second");
    let mut accepted = Vec::new();
    let mut refused = 0;
    for i in 0..APPS {
        if i == APPS / 3 {
            rabbitmqctl(&["stop_app"]);
        }
        if i == 2 * APPS / 3 {
            rabbitmqctl(&["start_app"]);
            rabbitmqctl(&["await_startup"]);
        }
        let body = github_push(&repo.url(), &second, &[&format!("apps/{i}/cm.yaml")]);
        match post_github(port, Some(SECRET), &format!("second-{i}"), &body) {
            (200, _) => accepted.push(i),
            (503, _) => refused += 1,
            (code, body) => panic!("unexpected {code}: {body}"),
        }
    }
    assert!(refused > 0, "the broker was down for some webhooks");
    assert!(!accepted.is_empty());
    for i in &accepted {
        let name = format!("app-{i}");
        wait_for(
            &format!("{name} at the second commit"),
            Duration::from_secs(120),
            || synced_at(&ns, &name, &second),
        )
        .await;
    }
    assert!(
        setpoint.child.try_wait().unwrap().is_none(),
        "setpoint is still running"
    );
    eprintln!(
        "{} webhooks accepted, {refused} refused with 503 while the broker was down",
        accepted.len()
    );
}
