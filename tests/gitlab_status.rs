//! Commit statuses on GitLab from a running Setpoint. GitLab cannot be
//! reached from here, so `setpoint run` talks to a local stand-in that checks
//! every request against GitLab's documented REST API v4 and keeps each
//! commit's statuses as GitLab does, refusing a transition to the state a
//! status is in (`tests/support/gitlab.rs`); the repository is served over
//! HTTP as `http://127.0.0.1:PORT/example/team/deploy.git`, a project of a
//! subgroup on that "GitLab" (same host); the cluster is the real local
//! control plane.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use support::app::{automated, create_app, install_crd, synced_at};
use support::gitlab::{FakeGitLab, TOKEN};
use support::process::{Setpoint, free_port, gitlab_push, post_gitlab};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const WEBHOOK_TOKEN: &str = "gitlab-webhook-token-for-statuses";
const PROJECT: &str = "example/team/deploy";
const PROJECT_ID: &str = "example%2Fteam%2Fdeploy";

fn configmap(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  key: \"{value}\"\n"
    )
}

/// The (state, description) of each status posted on `sha` named `name`,
/// in order, each on the project's own path.
fn posted(gitlab: &FakeGitLab, sha: &str, name: &str) -> Vec<(String, String)> {
    gitlab
        .received()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.ends_with(&format!("/statuses/{sha}")))
        .inspect(|r| {
            assert_eq!(
                r.path,
                format!("/api/v4/projects/{PROJECT_ID}/statuses/{sha}")
            )
        })
        .map(|r| r.json())
        .filter(|body| body["name"] == name)
        .map(|body| {
            let text = |key: &str| body[key].as_str().unwrap_or_default().to_owned();
            (text("state"), text("description"))
        })
        .collect()
}

/// Waits until the status GitLab holds on `sha` named `name` is `state`;
/// returns the posts of that commit and name.
async fn holds(gitlab: &FakeGitLab, sha: &str, name: &str, state: &str) -> Vec<(String, String)> {
    wait_for(&format!("{state} on {sha}"), DEADLINE, || async {
        let held: Vec<Value> = gitlab.statuses(PROJECT, sha);
        let last = held.iter().rev().find(|status| status["name"] == name);
        match last {
            Some(status) if status["status"] == state => Ok(posted(gitlab, sha, name)),
            _ => Err(format!("{held:?} {:?}", gitlab.violations())),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_of_a_gitlab_project_sets_its_commit_statuses() {
    let ns = TestNamespace::new("gitlab-status").await;
    install_crd(&ns.client).await;
    let gitlab = FakeGitLab::start().await;
    let repo = GitRepo::new();
    let good = repo.write("app/cm.yaml", &configmap("1")).commit("good");
    let served = repo.serve_http("example/team", "deploy");
    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;

    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--gitlab-token",
            WEBHOOK_TOKEN,
            "--no-sweep",
        ],
        &[
            ("SETPOINT_GITLAB_API_URL", gitlab.url.as_str()),
            ("SETPOINT_GITLAB_API_TOKEN", TOKEN),
        ],
        cache.path(),
    );
    setpoint.wait_http().await;

    // The Application's first sync (its creation is the event): running,
    // then success, on the synced commit of the project, in the
    // Application's name.
    let name = format!("setpoint/{}/web", ns.name);
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &good)).await;
    let posts = holds(&gitlab, &good, &name, "success").await;
    assert_eq!(
        posts,
        [
            ("running".into(), format!("Syncing {}", &good[..12])),
            ("success".into(), "Synced: 1 applied, 0 pruned".into())
        ]
    );

    // Broken YAML pushed and announced by GitLab's push hook: running, then
    // failed naming the file; the live ConfigMap stays as it was.
    let broken = repo
        .write(
            "app/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata: [\n",
        )
        .commit("broken");
    let port = setpoint.port.unwrap();
    let body = gitlab_push(&served.url, &broken, &["app/cm.yaml"]);
    let (code, reply) = post_gitlab(port, WEBHOOK_TOKEN, &body);
    assert_eq!(code, 200, "{reply}");
    let posts = holds(&gitlab, &broken, &name, "failed").await;
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert_eq!(posts[0].0, "running", "{posts:?}");
    let description = &posts[1].1;
    assert!(
        description.starts_with("InvalidManifest") && description.contains("app/cm.yaml"),
        "{description}"
    );
    assert!(description.chars().count() <= 255, "{description}");
    let live: ConfigMap = ns.api().get("settings").await.unwrap();
    assert_eq!(live.data.unwrap()["key"], "1");

    // The fix: running and success on it, and nothing more on the commits
    // already reported.
    let fixed = repo.write("app/cm.yaml", &configmap("2")).commit("fixed");
    let body = gitlab_push(&served.url, &fixed, &["app/cm.yaml"]);
    assert_eq!(post_gitlab(port, WEBHOOK_TOKEN, &body).0, 200);
    wait_for("web synced at the fix", DEADLINE, || {
        synced_at(&ns, "web", &fixed)
    })
    .await;
    let posts = holds(&gitlab, &fixed, &name, "success").await;
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert_eq!(posts[0].0, "running");
    assert_eq!(posted(&gitlab, &good, &name).len(), 2);
    assert_eq!(posted(&gitlab, &broken, &name).len(), 2);

    assert_eq!(gitlab.violations(), Vec::<String>::new());
    for request in gitlab.received() {
        assert_eq!(request.header("private-token"), Some(TOKEN));
    }
    let logs = setpoint.logs();
    assert!(!logs.contains(TOKEN), "the token is in the log:\n{logs}");
}
