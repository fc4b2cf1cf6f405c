//! Reporting to GitHub from a running Setpoint: commit statuses on the
//! commits it syncs, and the failed webhook deliveries it asks GitHub to
//! redeliver. GitHub cannot be reached from here, so `setpoint run` talks to
//! a local stand-in that checks every request against GitHub's documented
//! REST API (`tests/support/github.rs`); the repository is served over HTTP
//! as `http://127.0.0.1:PORT/acme/deploy.git`, a repository on that
//! "GitHub"; the cluster is the real local control plane.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;

use support::app::{automated, create_app, install_crd, synced_at};
use support::github::{FakeGitHub, TOKEN, delivery};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const SECRET: &str = "webhook-secret-for-github-tests";
const HOOK: &str = "/repos/acme/deploy/hooks/42";

fn configmap(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  key: \"{value}\"\n"
    )
}

/// The (state, description) of each status posted on `sha`, in order.
fn statuses(github: &FakeGitHub, sha: &str, context: &str) -> Vec<(String, String)> {
    github
        .received_on("POST", &format!("/statuses/{sha}"))
        .into_iter()
        .map(|r| r.json())
        .filter(|body| body["context"] == context)
        .map(|body| {
            (
                body["state"].as_str().unwrap_or_default().to_string(),
                body["description"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Waits until the last status posted on `sha` in `context` is `state`;
/// returns them all.
async fn last_status(
    github: &FakeGitHub,
    sha: &str,
    context: &str,
    state: &str,
) -> Vec<(String, String)> {
    wait_for(&format!("{state} on {sha}"), DEADLINE, || async {
        let posted = statuses(github, sha, context);
        match posted.last() {
            Some((last, _)) if last == state => Ok(posted),
            _ => Err(format!("{posted:?}")),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_posts_commit_statuses_and_failed_deliveries_are_redelivered() {
    let ns = TestNamespace::new("github").await;
    install_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    // Two deliveries of the hook: one Setpoint answered, one it never saw
    // (it was down): only the second is asked for again.
    github.state().hooks.insert(
        HOOK.into(),
        vec![vec![
            delivery(12, "g-answered", 200, 3, false),
            delivery(11, "g-missed", 0, 5, false),
        ]],
    );
    let repo = GitRepo::new();
    let good = repo.write("app/cm.yaml", &configmap("1")).commit("good");
    let served = repo.serve_http("acme", "deploy");
    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;

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
            ("SETPOINT_GITHUB_HOOKS", "acme/deploy:42"),
        ],
        cache.path(),
    );
    setpoint.wait_http().await;

    // On start, the missed delivery is asked for again, once.
    wait_for("the missed delivery redelivered", DEADLINE, || async {
        let attempts = github.received_on("POST", "/attempts");
        match &attempts[..] {
            [attempt] if attempt.path == format!("{HOOK}/deliveries/11/attempts") => Ok(()),
            _ => Err(format!("attempts: {attempts:?}")),
        }
    })
    .await;

    // The Application's first sync (its creation is the event): pending,
    // then success, on the synced commit, in the Application's context.
    let context = format!("setpoint/{}/web", ns.name);
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &good)).await;
    let posted = last_status(&github, &good, &context, "success").await;
    assert_eq!(posted.len(), 2, "{posted:?}");
    assert_eq!(posted[0].0, "pending");
    assert_eq!(posted[1].1, "Synced: 1 applied, 0 pruned");

    // Broken YAML pushed and announced by a webhook: pending, then failure
    // naming the file; the live ConfigMap stays as it was.
    let broken = repo
        .write(
            "app/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: [\n",
        )
        .commit("broken");
    let port = setpoint.port.unwrap();
    let body = github_push(&served.url, &broken, &["app/cm.yaml"]);
    let (code, reply) = post_github(port, Some(SECRET), "delivery-broken", &body);
    assert_eq!(code, 200, "{reply}");
    let posted = last_status(&github, &broken, &context, "failure").await;
    assert_eq!(posted[0].0, "pending", "{posted:?}");
    let description = &posted.last().unwrap().1;
    assert!(
        description.starts_with("InvalidManifest") && description.contains("app/cm.yaml"),
        "{description}"
    );
    assert!(description.chars().count() <= 140, "{description}");
    let live: ConfigMap = ns.api().get("settings").await.unwrap();
    assert_eq!(live.data.unwrap()["key"], "1");

    // The fix: pending and success on it, and nothing more (no status for
    // the reconciles that follow of the same, applied revision).
    let all_statuses = || {
        github
            .received()
            .iter()
            .filter(|r| r.path.contains("/statuses/"))
            .count()
    };
    let before = all_statuses();
    let fixed = repo.write("app/cm.yaml", &configmap("2")).commit("fixed");
    let body = github_push(&served.url, &fixed, &["app/cm.yaml"]);
    assert_eq!(
        post_github(port, Some(SECRET), "delivery-fixed", &body).0,
        200
    );
    wait_for("web synced at the fix", DEADLINE, || {
        synced_at(&ns, "web", &fixed)
    })
    .await;
    let posted = last_status(&github, &fixed, &context, "success").await;
    assert_eq!(posted.len(), 2, "{posted:?}");
    assert_eq!(posted[0].0, "pending");
    assert_eq!(all_statuses(), before + 2);

    assert_eq!(github.violations(), Vec::<String>::new());
    let logs = setpoint.logs();
    assert!(!logs.contains(TOKEN), "the token is in the log:\n{logs}");
}
