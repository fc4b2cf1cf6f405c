//! The webhook under abuse, as the real `setpoint webhook` process on the
//! real RabbitMQ: large unsigned bodies, bodies sent slowly, and replayed
//! pushes, across a restart of the process.
//!
//! Raw TCP clients on 127.0.0.1 send what curl would not (a body cut in
//! half); every loop and every connection count is bounded.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use setpoint::ingest::webhook::dedupe::amqp::AmqpSeen;
use setpoint::ingest::webhook::dedupe::{RecordKey, Seen};
use setpoint::queue::{Queue, RetryPolicy};
use support::app::{create_app, install_crd};
use support::process::{Setpoint, free_port, github_push, post_github, sample};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, unique_name, wait_for};

const SECRET: &str = "webhook-hardening-secret";
/// Well formed, and wrong: what an attacker without the secret can send.
const FORGED: &str = "sha256=0000000000000000000000000000000000000000000000000000000000000000";

/// `setpoint webhook` on RabbitMQ, following the Applications of
/// `namespace` (which need not exist), with `env` on top; and the port of
/// its metrics.
fn webhook(namespace: &str, prefix: &str, cache: &Path, env: &[(&str, &str)]) -> (Setpoint, u16) {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let args = [
        "webhook",
        "--listen",
        &listen,
        "--amqp-prefix",
        prefix,
        "--github-secret",
        SECRET,
    ];
    let url = amqp_url();
    let mut all = vec![
        ("SETPOINT_AMQP_URL", url.as_str()),
        ("SETPOINT_METRICS_LISTEN", metrics.as_str()),
    ];
    all.extend_from_slice(env);
    (
        Setpoint::scoped(namespace, &args, &all, cache),
        metrics_port,
    )
}

/// A kilobyte from /proc/<pid>/status (`VmHWM`, `VmRSS`), in MiB.
fn memory_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kib: f64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap();
    kib / 1024.0
}

/// The head of a GitHub push request with `length` bytes of body to come.
fn github_head(port: u16, length: usize, signature: Option<&str>) -> String {
    let mut head = format!(
        "POST /api/webhooks/github HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nX-GitHub-Event: push\r\nX-GitHub-Delivery: {}\r\nContent-Length: {length}\r\n",
        unique_name("d")
    );
    if let Some(signature) = signature {
        head.push_str(&format!("X-Hub-Signature-256: {signature}\r\n"));
    }
    head.push_str("\r\n");
    head
}

/// The status code of the response on `stream`, read within `deadline`;
/// `None` when the connection ended or the deadline passed without one.
fn read_status(stream: &mut TcpStream, deadline: Duration) -> Option<u16> {
    stream.set_read_timeout(Some(deadline)).unwrap();
    let mut response = Vec::new();
    let mut buffer = [0u8; 4096];
    while !response.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => response.extend_from_slice(&buffer[..n]),
        }
    }
    let text = String::from_utf8_lossy(&response);
    text.strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
}

/// Sends `head` and `body` on one connection while reading the answer: the
/// server may answer (and close) before the body is through.
fn send_whole(port: u16, head: String, body: Arc<Vec<u8>>) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sending = std::thread::spawn(move || {
        // The server closes early on a rejection: a broken pipe is expected.
        let _ = writer
            .write_all(head.as_bytes())
            .and_then(|_| writer.write_all(&body));
    });
    let status = read_status(&mut stream, Duration::from_secs(60));
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let _ = sending.join();
    status
}

#[tokio::test]
async fn fifty_large_unauthenticated_bodies_leave_the_memory_bounded_and_all_are_answered() {
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("hardening-memory");
    let (mut setpoint, _) = webhook(&unique_name("nowhere"), &prefix, cache.path(), &[]);
    setpoint.wait_http().await;
    let (port, pid) = (setpoint.port.unwrap(), setpoint.child.id());
    let before = memory_mib(pid, "VmHWM");

    // Half unsigned, half with a well-formed signature that is wrong: those
    // cannot be refused before their body is read.
    const REQUESTS: usize = 50;
    const BODY: usize = 24 << 20;
    let body = Arc::new(vec![b' '; BODY]);
    let senders: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let signature = (i % 2 == 1).then_some(FORGED);
            let head = github_head(port, BODY, signature);
            let body = body.clone();
            std::thread::spawn(move || send_whole(port, head, body))
        })
        .collect();
    let statuses: Vec<Option<u16>> = senders.into_iter().map(|s| s.join().unwrap()).collect();
    let peak = memory_mib(pid, "VmHWM");
    println!(
        "setpoint webhook VmHWM: {before:.0} MiB at rest, {peak:.0} MiB after {REQUESTS} concurrent {} MiB bodies",
        BODY >> 20
    );
    let mut counts = std::collections::BTreeMap::new();
    for status in &statuses {
        *counts.entry(*status).or_insert(0) += 1;
    }
    println!("answers: {counts:?}");
    // 408: on a loaded machine some of the 50 senders do not get their
    // 24 MiB through within the read deadline; that is an answer too.
    assert!(
        statuses
            .iter()
            .all(|s| matches!(s, Some(401) | Some(408) | Some(413) | Some(503))),
        "every request answered 401, 408, 413 or 503: {counts:?}"
    );
    assert!(
        peak < 150.0,
        "peak RSS {peak:.0} MiB (at rest {before:.0} MiB)"
    );

    // Still serving.
    let push = github_push("https://github.com/example/nothing", &"a".repeat(40), &[]);
    assert_eq!(post_github(port, Some(SECRET), "after-flood", &push).0, 200);
}

#[tokio::test]
async fn half_sent_bodies_are_closed_at_the_read_deadline_while_signed_pushes_are_answered() {
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("hardening-slow");
    const READ_TIMEOUT: Duration = Duration::from_secs(3);
    let (mut setpoint, metrics_port) = webhook(
        &unique_name("nowhere"),
        &prefix,
        cache.path(),
        &[("SETPOINT_WEBHOOK_READ_TIMEOUT", "3s")],
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();

    // 500 connections, each with its headers and half its body sent.
    const SLOW: usize = 500;
    const LENGTH: usize = 2048;
    let started = Instant::now();
    let mut slow: Vec<TcpStream> = (0..SLOW)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let mut request = github_head(port, LENGTH, Some(FORGED)).into_bytes();
            request.extend_from_slice(&[b' '; LENGTH / 2]);
            stream.write_all(&request).unwrap();
            stream
        })
        .collect();

    // A real delivery meanwhile is answered.
    let push = github_push("https://github.com/example/nothing", &"b".repeat(40), &[]);
    let (code, reply) = post_github(port, Some(SECRET), "while-slow", &push);
    assert_eq!(code, 200, "{reply}");

    // Each slow one is answered 408 (or closed) once the deadline passed.
    let mut answered = std::collections::BTreeMap::new();
    let limit = READ_TIMEOUT + Duration::from_secs(15);
    for stream in &mut slow {
        let left = || {
            limit
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1))
        };
        let status = read_status(stream, left());
        // Then nothing more: the server closed the connection.
        let closed = status.is_some() && {
            stream.set_read_timeout(Some(left())).unwrap();
            let mut rest = [0u8; 512];
            loop {
                match stream.read(&mut rest) {
                    Ok(0) => break true,
                    Ok(_) => continue,
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        break false;
                    }
                    Err(_) => break true,
                }
            }
        };
        *answered.entry((status, closed)).or_insert(0) += 1;
    }
    let elapsed = started.elapsed();
    println!("{SLOW} half-sent bodies after {elapsed:?}: {answered:?}");
    assert_eq!(
        answered.get(&(Some(408), true)).copied().unwrap_or(0),
        SLOW,
        "every half-sent body answered 408 and closed: {answered:?}"
    );
    assert!(elapsed < limit, "{elapsed:?}");
    let metrics = support::process::scrape(metrics_port).unwrap();
    assert_eq!(
        sample(
            &metrics,
            r#"setpoint_webhook_requests_total{provider="github",outcome="timeout"}"#
        ),
        Some(SLOW as f64)
    );
}

#[tokio::test]
async fn a_replayed_push_is_dropped_across_a_restart_and_enqueues_nothing() {
    let ns = TestNamespace::new("replay").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let repo = GitRepo::new();
    let commit = repo
        .write(
            "apps/a/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n",
        )
        .commit("a");
    create_app(
        &ns,
        "a",
        &repo.url(),
        "apps/a",
        support::app::automated(true, true),
    )
    .await;
    let prefix = amqp_prefix("replay");
    let queue = support::amqp_queue(&prefix, RetryPolicy::default()).await;

    let body = github_push(&repo.url(), &commit, &["apps/a/cm.yaml"]);
    let (mut first, _) = webhook(&ns.name, &prefix, cache.path(), &[]);
    first.wait_http().await;
    let port = first.port.unwrap();
    // The index fills from the Application watch; a push that reaches no
    // Application is not remembered, so it can be sent again until it does.
    wait_for(
        "the webhook to enqueue app a",
        Duration::from_secs(60),
        || async {
            match post_github(port, Some(SECRET), &unique_name("d"), &body) {
                (200, reply) if reply.contains("/a\"") => Ok(()),
                (code, reply) => Err(format!("{code} {reply}")),
            }
        },
    )
    .await;
    first.kill();

    // Another process (a restart, or another replica) on another port, on
    // another cache: what it remembers is on the broker.
    let other_cache = tempfile::tempdir().unwrap();
    let (mut second, metrics_port) = webhook(&ns.name, &prefix, other_cache.path(), &[]);
    second.wait_http().await;
    let port = second.port.unwrap();
    // Its index must hold the Application first: a push that reaches none
    // is answered before any replay check (seen under load, where the
    // Application watch's first list took longer than the first request).
    wait_for(
        "the second index to hold app a",
        Duration::from_secs(60),
        || async {
            let metrics = support::process::scrape(metrics_port)?;
            match sample(&metrics, "setpoint_applications_indexed") {
                Some(n) if n >= 1.0 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let (code, reply) = post_github(port, Some(SECRET), "replayed-with-a-new-id", &body);
    assert_eq!((code, reply.as_str()), (200, r#"{"duplicate":true}"#));

    let metrics = support::process::scrape(metrics_port).unwrap();
    assert_eq!(
        sample(
            &metrics,
            r#"setpoint_webhook_requests_total{provider="github",outcome="duplicate"}"#
        ),
        Some(1.0)
    );
    // One event on the queue: the first delivery's.
    let mut deliveries = queue.consume(100).await.unwrap();
    let mut events = Vec::new();
    while let Ok(Some(delivery)) =
        tokio::time::timeout(Duration::from_secs(2), deliveries.recv()).await
    {
        events.push(delivery.event.app.name.clone());
        delivery.ack().await.unwrap();
    }
    assert_eq!(events, ["a"]);
    queue.delete_topology().await.unwrap();
}

#[tokio::test]
async fn replicas_sharing_rabbitmq_accept_a_push_once_and_again_after_the_window() {
    let prefix = amqp_prefix("seen");
    let window = Duration::from_secs(2);
    let replicas: Vec<AmqpSeen> = (0..4)
        .map(|_| AmqpSeen::new(amqp_url(), &prefix, window))
        .collect();
    let key = RecordKey::new(&[b"push", unique_name("key").as_bytes()]);

    // The same replay reaches every replica at once: one takes it.
    let claims = futures::future::join_all(replicas.iter().map(|r| r.claim(&key))).await;
    let claims: Vec<bool> = claims.into_iter().map(Result::unwrap).collect();
    assert_eq!(claims.iter().filter(|c| **c).count(), 1, "{claims:?}");
    for replica in &replicas {
        assert!(!replica.claim(&key).await.unwrap());
    }
    // A replica forgets what it could not enqueue.
    replicas[1].forget(&key).await.unwrap();
    assert!(replicas[2].claim(&key).await.unwrap());
    // After the window, a new push.
    let started = Instant::now();
    wait_for("the record to expire", Duration::from_secs(20), || async {
        match replicas[3].claim(&key).await {
            Ok(true) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(started.elapsed() >= window - Duration::from_millis(500));
    replicas[0].forget(&key).await.unwrap();
}
