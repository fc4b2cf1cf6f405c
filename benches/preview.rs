//! `make bench`: how soon a pull request's preview is posted, with
//! `setpoint run` (in-process queue) against the real local control plane
//! and the local stand-in for GitHub's REST API. The time runs from the
//! signed `pull_request` delivery (`synchronize`, a new head each run) to
//! the moment the pull request's comment names that head, polled every few
//! milliseconds. Two shapes: one Application, and 100 Applications of one
//! monorepo that every push of the pull request touches (100 renders and
//! dry runs per preview). Reports p50 and max.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use setpoint::api::Sync;
use support::app::{all_apps, automated, create_app, install_crd};
use support::github::{FakeGitHub, TOKEN};
use support::process::{Setpoint, free_port, github_pull_request, post_github_event};
use support::{GitRepo, TestNamespace, wait_for};

const SECRET: &str = "bench-preview-secret";

fn configmap(name: &str, value: usize) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  value: \"{value}\"\n"
    )
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `apps` Applications (`apps/app-i`, a ConfigMap each), synced; then
/// `runs` pushes to one pull request, each touching every Application,
/// each timed from its delivery to its comment.
async fn scenario(apps: usize, runs: usize, target: Duration) {
    let ns = TestNamespace::new("bench-preview").await;
    install_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    for i in 0..apps {
        repo.write(
            &format!("apps/app-{i}/cm.yaml"),
            &configmap(&format!("cm-{i}"), 0),
        );
    }
    let base = repo.commit("the apps");
    let served = repo.serve_http("acme", "deploy");
    for i in 0..apps {
        create_app(
            &ns,
            &format!("app-{i}"),
            &served.url,
            &format!("apps/app-{i}"),
            automated(true, true),
        )
        .await;
    }
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--github-secret",
            SECRET,
            "--no-sweep",
        ],
        &[
            ("SETPOINT_GITHUB_API_URL", github.url.as_str()),
            ("SETPOINT_GITHUB_TOKEN", TOKEN),
            ("SETPOINT_GITHUB_COMMIT_STATUSES", "false"),
            ("SETPOINT_LOG", "warn"),
        ],
        cache.path(),
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    wait_for("the Applications synced", Duration::from_secs(300), || {
        all_apps(&ns, apps, "synced", |s| {
            s.sync.status == Sync::Synced && s.sync.revision.as_deref() == Some(base.as_str())
        })
    })
    .await;

    let mut times = Vec::with_capacity(runs);
    for run in 1..=runs {
        let files: Vec<(String, String)> = (0..apps)
            .map(|i| {
                (
                    format!("apps/app-{i}/cm.yaml"),
                    configmap(&format!("cm-{i}"), run),
                )
            })
            .collect();
        let files: Vec<(&str, Option<&str>)> = files
            .iter()
            .map(|(path, text)| (path.as_str(), Some(text.as_str())))
            .collect();
        let head = repo.pull_request(1, &files, &format!("run {run}"));
        let action = if run == 1 { "opened" } else { "synchronize" };
        let body = github_pull_request(&served.url, action, 1, &base, &head);
        let heading = format!("Setpoint preview of `{}`", &head[..7]);
        let started = Instant::now();
        let (code, answer) =
            post_github_event(port, SECRET, "pull_request", &format!("d-{run}"), &body);
        assert_eq!(code, 200, "{answer}");
        loop {
            let posted = github
                .comments("acme/deploy", 1)
                .iter()
                .any(|c| c["body"].as_str().is_some_and(|b| b.contains(&heading)));
            if posted {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "run {run}: no comment for {head}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        times.push(started.elapsed());
        let comments = github.comments("acme/deploy", 1);
        assert_eq!(comments.len(), 1, "one comment, edited");
        let text = comments[0]["body"].as_str().unwrap_or_default();
        let shown = format!("{apps} Application");
        assert!(text.contains(&shown), "{text}");
    }
    assert!(github.violations().is_empty(), "{:?}", github.violations());
    times.sort();
    let p50 = times[times.len() / 2];
    let max = *times.last().unwrap();
    println!(
        "  {apps:>3} Application(s), every one touched: delivery -> comment p50 {:>7.1} ms  max {:>7.1} ms  ({runs} pushes; target < {} ms: {})",
        ms(p50),
        ms(max),
        target.as_millis(),
        if max < target { "met" } else { "MISSED" }
    );
}

#[tokio::main]
async fn main() {
    println!(
        "pull request preview benchmark (setpoint run, in-process queue, local control plane, the local GitHub-API test server)"
    );
    scenario(1, 20, Duration::from_secs(1)).await;
    scenario(100, 5, Duration::from_secs(10)).await;
}
