//! Previews on pull requests, end to end: `setpoint run` against the real
//! local control plane, a repository served over HTTP as GitHub's
//! `acme/deploy` (pull requests' heads under `refs/pull/N/head`, as GitHub
//! keeps them), signed `pull_request` deliveries, and the local stand-in
//! for GitHub's REST API (`tests/support/github.rs`), which checks every
//! comment and check run request against GitHub's documentation.
//! `setpoint diff --revision` is run as a user would.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::Value;

use support::app::{automated, create_app, deployment_yaml, get_app, install_crd, synced_at};
use support::github::{FakeGitHub, Fault, TOKEN};
use support::process::{
    Setpoint, free_port, github_pull_request, github_push, gitlab_merge_request, post_github_event,
    post_gitlab_event, sample, scrape,
};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const SECRET: &str = "webhook-secret-for-preview-tests";
const REPO: &str = "acme/deploy";

fn configmap(name: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  mode: blue\n")
}

/// Setpoint on `ns`, posting to `github`; returns it and its metrics port.
async fn start(
    ns: &TestNamespace,
    github: &FakeGitHub,
    cache: &std::path::Path,
) -> (Setpoint, u16) {
    start_with(ns, github, cache, &[]).await
}

/// The same with more variables.
async fn start_with(
    ns: &TestNamespace,
    github: &FakeGitHub,
    cache: &std::path::Path,
    extra: &[(&str, &str)],
) -> (Setpoint, u16) {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
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
            ("SETPOINT_METRICS_LISTEN", metrics.as_str()),
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .collect::<Vec<_>>(),
        cache,
    );
    setpoint.wait_http().await;
    (setpoint, metrics_port)
}

/// The Deployment's metadata once it is available: from then on nothing
/// writes it any more (its status included), so any write would show in its
/// resourceVersion.
async fn settled_deployment(
    ns: &TestNamespace,
    name: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    let deployments = ns.api::<Deployment>();
    wait_for(&format!("{name} available"), DEADLINE, || async {
        let live = deployments.get(name).await.map_err(|e| e.to_string())?;
        let status = live.status.clone().unwrap_or_default();
        let settled = status.observed_generation == live.metadata.generation
            && status.available_replicas == Some(1)
            && status.updated_replicas == Some(1);
        settled
            .then_some(live.metadata)
            .ok_or(format!("{status:?}"))
    })
    .await
}

/// Waits until pull request `number` has a comment holding every one of
/// `texts`; returns the comments.
/// A signed `pull_request` delivery of `action` on pull request `number`
/// of the repository at `url`: the status code and the answer.
fn send_pull_request(
    port: u16,
    url: &str,
    action: &str,
    number: u64,
    base: &str,
    head: &str,
    delivery: &str,
) -> (u16, String) {
    let body = github_pull_request(url, action, number, base, head);
    post_github_event(port, SECRET, "pull_request", delivery, &body)
}

async fn comment_with(github: &FakeGitHub, number: u64, texts: &[&str]) -> Vec<Value> {
    wait_for(
        &format!("a comment on #{number} with {texts:?}"),
        DEADLINE,
        || async {
            let comments = github.comments(REPO, number);
            let found = comments.iter().any(|c| {
                let body = c["body"].as_str().unwrap_or_default();
                texts.iter().all(|t| body.contains(t))
            });
            if found {
                Ok(comments)
            } else {
                Err(format!("{comments:#?}"))
            }
        },
    )
    .await
}

/// Waits for the check run on `sha`; returns it.
async fn check_run_on(github: &FakeGitHub, sha: &str) -> Value {
    wait_for(&format!("a check run on {sha}"), DEADLINE, || async {
        let runs = github.check_runs(REPO);
        runs.iter()
            .find(|r| r["head_sha"] == sha)
            .cloned()
            .ok_or(format!("{runs:#?}"))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_request_gets_one_comment_edited_per_push_and_the_cluster_is_untouched() {
    let ns = TestNamespace::new("preview").await;
    install_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web at 1 replica");
    let served = repo.serve_http("acme", "deploy");
    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;
    // Another Application of the repository that the pull request does not
    // touch: not previewed.
    repo.write("other/cm.yaml", &configmap("other"));
    let base = {
        let commit = repo.commit("another app");
        assert_ne!(commit, base);
        commit
    };
    create_app(&ns, "other", &served.url, "other", automated(true, true)).await;

    let cache = tempfile::tempdir().unwrap();
    let (setpoint, metrics_port) = start(&ns, &github, cache.path()).await;
    let port = setpoint.port.unwrap();
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &base)).await;
    wait_for("other synced", DEADLINE, || synced_at(&ns, "other", &base)).await;
    let deployments = ns.api::<Deployment>();
    let before = settled_deployment(&ns, "web").await;

    // The pull request: 3 replicas and a new ConfigMap.
    let head = repo.pull_request(
        5,
        &[
            ("app/deploy.yaml", Some(&deployment_yaml("web", 3))),
            ("app/settings.yaml", Some(&configmap("settings"))),
        ],
        "three replicas and settings",
    );
    let (code, answer) = send_pull_request(port, &served.url, "opened", 5, &base, &head, "d-open");
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains("\"applications\":2"), "{answer}");

    let comments = comment_with(
        &github,
        5,
        &[
            "-spec.replicas: 1",
            "+spec.replicas: 3",
            "**Create** `ConfigMap",
        ],
    )
    .await;
    assert_eq!(comments.len(), 1, "{comments:#?}");
    let text = comments[0]["body"].as_str().unwrap();
    assert!(text.starts_with("<!-- setpoint-preview -->"), "{text}");
    assert!(text.contains(&format!("{}/web", ns.name)), "{text}");
    assert!(text.contains("settings"), "{text}");
    assert!(!text.contains(&format!("{}/other", ns.name)), "{text}");
    let run = check_run_on(&github, &head).await;
    assert_eq!(run["name"], "setpoint/preview");
    assert_eq!(run["status"], "completed");
    assert_eq!(run["conclusion"], "success", "{run:#}");

    // A second push to the pull request edits the same comment.
    let head2 = repo.pull_request(
        5,
        &[("app/deploy.yaml", Some(&deployment_yaml("web", 4)))],
        "four replicas",
    );
    let (code, answer) =
        send_pull_request(port, &served.url, "synchronize", 5, &base, &head2, "d-sync");
    assert_eq!(code, 200, "{answer}");
    let comments = comment_with(&github, 5, &["+spec.replicas: 4", "**Create** `ConfigMap"]).await;
    assert_eq!(comments.len(), 1, "{comments:#?}");
    assert_eq!(github.received_on("POST", "/issues/5/comments").len(), 1);
    assert_eq!(
        github
            .received_on("PATCH", &format!("/issues/comments/{}", comments[0]["id"]))
            .len(),
        1
    );
    check_run_on(&github, &head2).await;
    // A pull request that touches no Application gets its check run but
    // no comment.
    let readme = repo.pull_request(7, &[("README.md", Some("docs\n"))], "docs");
    let (code, answer) =
        send_pull_request(port, &served.url, "opened", 7, &base, &readme, "d-docs");
    assert_eq!(code, 200, "{answer}");
    let run = check_run_on(&github, &readme).await;
    assert_eq!(run["conclusion"], "success", "{run:#}");
    assert!(github.comments(REPO, 7).is_empty());
    // A pull request from a fork is not previewed (previews.forks is off).
    let mut fork: Value = serde_json::from_str(&github_pull_request(
        &served.url,
        "opened",
        6,
        &base,
        &head2,
    ))
    .unwrap();
    fork["pull_request"]["head"]["repo"]["full_name"] = "someone/deploy".into();
    let (code, answer) =
        post_github_event(port, SECRET, "pull_request", "d-fork", &fork.to_string());
    assert_eq!(code, 200, "{answer}");
    wait_for("the fork's preview skipped", DEADLINE, || async {
        let metrics = scrape(metrics_port)?;
        sample(
            &metrics,
            "setpoint_previews_total{provider=\"github\",outcome=\"skipped\"}",
        )
        .filter(|n| *n == 1.0)
        .ok_or(metrics)
    })
    .await;
    assert!(github.comments(REPO, 6).is_empty());
    // A closed pull request is not previewed again.
    let (code, answer) =
        send_pull_request(port, &served.url, "closed", 5, &base, &head2, "d-close");
    assert_eq!(code, 202, "{answer}");

    // Nothing in the cluster changed: the Deployment as it was, no
    // ConfigMap, the Application still at the base.
    let after = deployments.get("web").await.unwrap().metadata;
    assert_eq!(after.resource_version, before.resource_version);
    assert_eq!(after.generation, before.generation);
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("settings")
            .await
            .unwrap()
            .is_none()
    );
    let app = get_app(&ns, "web").await;
    assert_eq!(
        app.status.unwrap().sync.revision.as_deref(),
        Some(base.as_str())
    );
    let metrics = scrape(metrics_port).unwrap();
    assert_eq!(
        sample(
            &metrics,
            "setpoint_previews_total{provider=\"github\",outcome=\"posted\"}"
        ),
        Some(3.0),
        "{metrics}"
    );
    assert!(github.violations().is_empty(), "{:?}", github.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_render_fails_the_check_run_with_the_file_and_line() {
    let ns = TestNamespace::new("preview-broken").await;
    install_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    let served = repo.serve_http("acme", "deploy");
    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let (setpoint, _) = start(&ns, &github, cache.path()).await;
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &base)).await;

    let head = repo.pull_request(
        9,
        &[(
            "app/bad.yaml",
            Some("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bad\ndata:\n  a: b\n"),
        )],
        "broken YAML",
    );
    let (code, answer) = send_pull_request(
        setpoint.port.unwrap(),
        &served.url,
        "opened",
        9,
        &base,
        &head,
        "d-bad",
    );
    assert_eq!(code, 200, "{answer}");
    let run = check_run_on(&github, &head).await;
    assert_eq!(run["conclusion"], "failure", "{run:#}");
    let summary = run["output"]["summary"].as_str().unwrap();
    assert!(summary.contains("app/bad.yaml, line"), "{summary}");
    let annotation = &run["output"]["annotations"][0];
    assert_eq!(annotation["path"], "app/bad.yaml", "{run:#}");
    assert!(annotation["start_line"].as_u64().unwrap() >= 1);
    let comments = comment_with(&github, 9, &["❌", "app/bad.yaml"]).await;
    assert_eq!(comments.len(), 1);
    assert!(github.violations().is_empty(), "{:?}", github.violations());
}

#[tokio::test]
async fn setpoint_diff_revision_prints_the_preview_and_exits_as_diff() {
    let ns = TestNamespace::new("preview-cli").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    // Not automated, no Setpoint running: synced once by hand.
    create_app(&ns, "web", &repo.url(), "app", Default::default()).await;
    let head = repo.pull_request(
        3,
        &[("app/settings.yaml", Some(&configmap("settings")))],
        "settings",
    );
    let cache = tempfile::tempdir().unwrap();
    let app = format!("{}/web", ns.name);
    let setpoint = |args: &[&str]| {
        let out = std::process::Command::new(support::process::binary())
            .args(args)
            .env("KUBECONFIG", support::kubeconfig_path())
            .env("SETPOINT_CACHE_DIR", cache.path())
            .env("SETPOINT_ALLOW_LOCAL_REPOS", "true")
            .env("SETPOINT_ADMIN_NAMESPACES", "*")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let diff = |revision: &str| setpoint(&["diff", &app, "--revision", revision]);
    let (code, out) = setpoint(&["reconcile", &app, "--sync"]);
    assert_eq!(code, Some(0), "{out}");
    let before = settled_deployment(&ns, "web").await;
    // The synced revision, by branch and by commit: nothing to change.
    for revision in ["main", base.as_str()] {
        let (code, out) = diff(revision);
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains("no changes"), "{out}");
    }
    // The pull request's ref, fetched from the repository, then its commit.
    for revision in ["refs/pull/3/head", head.as_str()] {
        let (code, out) = diff(revision);
        assert_eq!(code, Some(1), "{out}");
        assert!(out.contains("**Create** `ConfigMap"), "{out}");
        assert!(!out.contains("**Update**"), "{out}");
    }
    let broken = repo.pull_request(3, &[("app/bad.yaml", Some("kind: [unclosed\n"))], "broken");
    let (code, out) = diff("refs/pull/3/head");
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("app/bad.yaml"), "{out}");
    let (code, out) = diff(&broken);
    assert_eq!(code, Some(2), "{out}");
    // None of them changed anything.
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("settings")
            .await
            .unwrap()
            .is_none()
    );
    let after = ns.api::<Deployment>().get("web").await.unwrap().metadata;
    assert_eq!(after.resource_version, before.resource_version);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_pushes_to_one_pull_request_coalesces_into_a_preview_of_the_newest_head() {
    let ns = TestNamespace::new("preview-burst").await;
    install_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    let served = repo.serve_http("acme", "deploy");
    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let (setpoint, metrics_port) = start(&ns, &github, cache.path()).await;
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &base)).await;

    const PUSHES: u32 = 6;
    let heads: Vec<String> = (2..2 + PUSHES)
        .map(|replicas| {
            repo.pull_request(
                21,
                &[("app/deploy.yaml", Some(&deployment_yaml("web", replicas)))],
                &format!("{replicas} replicas"),
            )
        })
        .collect();
    // Delivered one after another, as fast as they go.
    for (i, head) in heads.iter().enumerate() {
        let action = if i == 0 { "opened" } else { "synchronize" };
        let delivery = format!("d-burst-{i}");
        let (code, answer) = send_pull_request(
            setpoint.port.unwrap(),
            &served.url,
            action,
            21,
            &base,
            head,
            &delivery,
        );
        assert_eq!(code, 200, "{answer}");
    }
    let newest = heads.last().unwrap();
    let comments = comment_with(
        &github,
        21,
        &[
            &format!("`{}`", &newest[..7]),
            &format!("+spec.replicas: {}", PUSHES + 1),
        ],
    )
    .await;
    assert_eq!(comments.len(), 1);
    check_run_on(&github, newest).await;
    // Fewer previews than pushes (each counted once it posted its check
    // run), the newest last.
    let (previews, runs) = wait_for("the previews counted", DEADLINE, || async {
        let metrics = scrape(metrics_port)?;
        let previews = sample(
            &metrics,
            "setpoint_previews_total{provider=\"github\",outcome=\"posted\"}",
        )
        .unwrap_or_default();
        let runs = github.check_runs(REPO);
        (runs.len() as f64 == previews)
            .then(|| (previews, runs.clone()))
            .ok_or(format!("{previews} previews, {} check runs", runs.len()))
    })
    .await;
    assert!(
        previews < PUSHES as f64,
        "{previews} previews of {PUSHES} pushes"
    );
    assert_eq!(runs.last().unwrap()["head_sha"], newest.as_str());
    assert!(github.violations().is_empty(), "{:?}", github.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_request_gets_one_note_edited_per_push() {
    const WEBHOOK_TOKEN: &str = "gitlab-webhook-token-for-previews";
    let ns = TestNamespace::new("preview-gitlab").await;
    install_crd(&ns.client).await;
    let gitlab = support::gitlab::FakeGitLab::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    let served = repo.serve_http("example", "deploy");
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
            ("SETPOINT_GITLAB_API_TOKEN", support::gitlab::TOKEN),
        ],
        cache.path(),
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &base)).await;

    let note_with = |text: String| {
        let gitlab = &gitlab;
        async move {
            wait_for(&format!("a note with {text}"), DEADLINE, || async {
                let notes = gitlab.notes("14", 4);
                notes
                    .iter()
                    .any(|n| n["body"].as_str().is_some_and(|b| b.contains(&text)))
                    .then(|| notes.clone())
                    .ok_or(format!("{notes:#?} {:?}", gitlab.violations()))
            })
            .await
        }
    };
    let head = repo.merge_request(
        4,
        &[("app/deploy.yaml", Some(&deployment_yaml("web", 2)))],
        "two replicas",
    );
    let body = gitlab_merge_request(&served.url, "open", 4, &head);
    let (code, answer) = post_gitlab_event(port, WEBHOOK_TOKEN, "Merge Request Hook", &body);
    assert_eq!(code, 200, "{answer}");
    let notes = note_with("+spec.replicas: 2".into()).await;
    assert_eq!(notes.len(), 1);

    let head = repo.merge_request(
        4,
        &[("app/deploy.yaml", Some(&deployment_yaml("web", 3)))],
        "three replicas",
    );
    let body = gitlab_merge_request(&served.url, "update", 4, &head);
    let (code, answer) = post_gitlab_event(port, WEBHOOK_TOKEN, "Merge Request Hook", &body);
    assert_eq!(code, 200, "{answer}");
    let notes = note_with("+spec.replicas: 3".into()).await;
    assert_eq!(notes.len(), 1, "{notes:#?}");
    let puts = gitlab
        .received()
        .into_iter()
        .filter(|r| r.method == "PUT")
        .count();
    assert_eq!(puts, 1);
    assert!(gitlab.violations().is_empty(), "{:?}", gitlab.violations());
    // The merge request's head was never applied.
    let live = ns.api::<Deployment>().get("web").await.unwrap();
    assert_eq!(live.spec.replicas, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_application_is_previewed_as_its_own_service_account() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube::api::{Patch, PatchParams, PostParams};

    let ns = TestNamespace::new("preview-tenant").await;
    install_crd(&ns.client).await;
    // `deployer` may manage Deployments and nothing else.
    let post = PostParams::default();
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "deployer"}})).unwrap();
    ns.api::<ServiceAccount>()
        .create(&post, &account)
        .await
        .unwrap();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "deployments"},
        "rules": [{"apiGroups": ["apps"], "resources": ["deployments"],
                   "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"]}]
    }))
    .unwrap();
    ns.api::<Role>().create(&post, &role).await.unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "deployer-deployments"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "deployments"},
        "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": ns.name}]
    }))
    .unwrap();
    ns.api::<RoleBinding>()
        .create(&post, &binding)
        .await
        .unwrap();

    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    let served = repo.serve_http("acme", "deploy");
    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;
    let patch = serde_json::json!({"spec": {"serviceAccountName": "deployer"}});
    ns.api::<setpoint::api::Application>()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let cache = tempfile::tempdir().unwrap();
    // No admin namespace here: the Application acts as `deployer`.
    let (setpoint, _) = start_with(
        &ns,
        &github,
        cache.path(),
        &[("SETPOINT_ADMIN_NAMESPACES", "setpoint-system")],
    )
    .await;
    wait_for("web synced as deployer", DEADLINE, || {
        synced_at(&ns, "web", &base)
    })
    .await;

    // A ConfigMap, which `deployer` may not create: the dry run says so.
    let head = repo.pull_request(
        31,
        &[("app/settings.yaml", Some(&configmap("settings")))],
        "settings",
    );
    let (code, answer) = send_pull_request(
        setpoint.port.unwrap(),
        &served.url,
        "opened",
        31,
        &base,
        &head,
        "d-tenant",
    );
    assert_eq!(code, 200, "{answer}");
    let deployer = format!("system:serviceaccount:{}:deployer", ns.name);
    let comments = comment_with(&github, 31, &["❌", "Forbidden", &deployer, "configmaps"]).await;
    assert_eq!(comments.len(), 1);
    let run = check_run_on(&github, &head).await;
    assert_eq!(run["conclusion"], "failure", "{run:#}");
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("settings")
            .await
            .unwrap()
            .is_none()
    );
    assert!(github.violations().is_empty(), "{:?}", github.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_preview_never_delays_a_sync() {
    let ns = TestNamespace::new("preview-lane").await;
    install_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    let served = repo.serve_http("acme", "deploy");
    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    // One reconcile at a time, one preview at a time.
    let (setpoint, _) = start_with(
        &ns,
        &github,
        cache.path(),
        &[
            ("SETPOINT_CONCURRENCY", "1"),
            ("SETPOINT_PREVIEW_CONCURRENCY", "1"),
        ],
    )
    .await;
    let port = setpoint.port.unwrap();
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &base)).await;

    // GitHub answers every request 4 s late: the preview holds its permit
    // for three of them.
    github.fail_always(Fault::Delay(Duration::from_secs(4)));
    let head = repo.pull_request(
        41,
        &[("app/deploy.yaml", Some(&deployment_yaml("web", 2)))],
        "two replicas",
    );
    let (code, answer) = send_pull_request(port, &served.url, "opened", 41, &base, &head, "d-slow");
    assert_eq!(code, 200, "{answer}");
    wait_for("the preview under way", DEADLINE, || async {
        let logs = setpoint.logs();
        logs.contains("previewing")
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    })
    .await;
    // Meanwhile a push to main is synced at once.
    let pushed = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 3))
        .commit("three replicas");
    let push = github_push(&served.url, &pushed, &["app/deploy.yaml"]);
    let (code, answer) = post_github_event(port, SECRET, "push", "d-push", &push);
    assert_eq!(code, 200, "{answer}");
    wait_for("the push synced", DEADLINE, || {
        synced_at(&ns, "web", &pushed)
    })
    .await;
    assert!(
        github.comments(REPO, 41).is_empty(),
        "the preview finished first: nothing was shown"
    );
    // And the preview still comes.
    comment_with(&github, 41, &["+spec.replicas: 2"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_travel_over_rabbitmq_like_any_event() {
    let ns = TestNamespace::new("preview-amqp").await;
    install_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    let served = repo.serve_http("acme", "deploy");
    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let url = support::amqp_url();
    let prefix = support::amqp_prefix("preview");
    let (setpoint, _) = start_with(
        &ns,
        &github,
        cache.path(),
        &[
            ("SETPOINT_AMQP_URL", url.as_str()),
            ("SETPOINT_AMQP_PREFIX", prefix.as_str()),
        ],
    )
    .await;
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &base)).await;
    let head = repo.pull_request(
        51,
        &[("app/deploy.yaml", Some(&deployment_yaml("web", 5)))],
        "five replicas",
    );
    let (code, answer) = send_pull_request(
        setpoint.port.unwrap(),
        &served.url,
        "opened",
        51,
        &base,
        &head,
        "d-amqp",
    );
    assert_eq!(code, 200, "{answer}");
    let comments = comment_with(&github, 51, &["+spec.replicas: 5"]).await;
    assert_eq!(comments.len(), 1);
    check_run_on(&github, &head).await;
    assert!(github.violations().is_empty(), "{:?}", github.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_to_a_kustomize_base_previews_the_overlays_over_it() {
    let ns = TestNamespace::new("preview-kustomize").await;
    install_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("bases/web/deploy.yaml", &deployment_yaml("web", 1))
        .write("bases/web/kustomization.yaml", "resources: [deploy.yaml]\n")
        .write(
            "envs/prod/kustomization.yaml",
            "resources: [../../bases/web]\nnamePrefix: prod-\n",
        )
        .write("other/cm.yaml", &configmap("other"))
        .commit("a base, an overlay and another app");
    let served = repo.serve_http("acme", "deploy");
    create_app(&ns, "prod", &served.url, "envs/prod", automated(true, true)).await;
    create_app(&ns, "other", &served.url, "other", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let (setpoint, _) = start(&ns, &github, cache.path()).await;
    wait_for("prod synced", DEADLINE, || synced_at(&ns, "prod", &base)).await;
    wait_for("other synced", DEADLINE, || synced_at(&ns, "other", &base)).await;

    // Only the base changes: the overlay over it is previewed (its render
    // recorded the base among its inputs), the other app is not.
    let head = repo.pull_request(
        61,
        &[("bases/web/deploy.yaml", Some(&deployment_yaml("web", 2)))],
        "two replicas in the base",
    );
    let (code, answer) = send_pull_request(
        setpoint.port.unwrap(),
        &served.url,
        "opened",
        61,
        &base,
        &head,
        "d-kust",
    );
    assert_eq!(code, 200, "{answer}");
    let prod = format!("{}/prod (`bases/web/deploy.yaml` changed)", ns.name);
    let comments = comment_with(
        &github,
        61,
        &[&prod, "Deployment", "prod-web", "+spec.replicas: 2"],
    )
    .await;
    let text = comments[0]["body"].as_str().unwrap();
    assert!(text.contains("1 Application:"), "{text}");
    assert!(!text.contains(&format!("{}/other", ns.name)), "{text}");
}

/// In process, where the requests can be counted: a preview sends reads and
/// dry runs, and not one write.
#[tokio::test]
async fn a_preview_sends_dry_runs_and_no_write() {
    let ns = TestNamespace::new("preview-count").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = support::app::context().await;
    let repo = GitRepo::new();
    let base = repo
        .write("app/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    create_app(&ns, "web", &repo.url(), "app", automated(true, true)).await;
    let request = setpoint::reconcile::Request::default();
    let outcome = support::app::reconcile_app(&ctx, &ns, "web", &request)
        .await
        .unwrap();
    assert_eq!(outcome.revision.as_deref(), Some(base.as_str()));

    let head = repo.pull_request(
        71,
        &[
            ("app/deploy.yaml", Some(&deployment_yaml("web", 2))),
            ("app/settings.yaml", Some(&configmap("settings"))),
        ],
        "two replicas and settings",
    );
    let app = get_app(&ns, "web").await;
    let before = ctx.requests.get();
    ctx.git
        .fetch_pull_head(
            &app.spec.source.repo_url,
            None,
            "refs/pull/71/head",
            Some(&head),
        )
        .await
        .unwrap();
    let changes = setpoint::preview::render::changes(&ctx, &app, &head)
        .await
        .unwrap();
    let sent = ctx.requests.get() - before;
    assert_eq!(changes.creates.len(), 1, "{changes:?}");
    assert_eq!(changes.updates.len(), 1, "{changes:?}");
    assert_eq!(sent.writes, 0, "{sent:?}");
    // The Deployment's server-side diff and the ConfigMap's create.
    assert!(sent.dry_runs >= 2, "{sent:?}");
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("settings")
            .await
            .unwrap()
            .is_none()
    );
    // The Application's status is as the sync left it.
    let after = get_app(&ns, "web").await;
    assert_eq!(after.status, app.status);
}
