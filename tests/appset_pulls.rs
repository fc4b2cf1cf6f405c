//! ApplicationSets' pull request generator end to end: `setpoint run`
//! against the real local control plane, a repository served over HTTP as
//! GitHub's `acme/deploy` (GitLab's `example/deploy`), signed
//! `pull_request` deliveries and `Merge Request Hook`s, and the local
//! stand-ins for GitHub's and GitLab's REST APIs (`tests/support/github.rs`,
//! `tests/support/gitlab.rs`), which list the open pull requests and check
//! every request against the providers' documentation.
//!
//! Each pull request's head is where the provider keeps it for a pull
//! request from a branch of the repository itself: on that branch and
//! under `refs/pull/N/head` (GitLab: `refs/merge-requests/N/head`). Each
//! head writes `pr/cm.yaml`, a ConfigMap named after its pull request, so
//! the environments of two pull requests deploy side by side.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use serde_json::{Value, json};
use setpoint::api::{Application, ApplicationSet, ConditionStatus};

use support::app::{install_appset_crd, synced_at};
use support::appset::{create_set, label, owned, owns_exactly, ready};
use support::git::git;
use support::github::{FakeGitHub, TOKEN, pull_json};
use support::gitlab::{FakeGitLab, merge_request_json};
use support::process::{Setpoint, free_port, post_github_event, post_gitlab_event};
use support::{GitRepo, TestNamespace, unique_name, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const SECRET: &str = "webhook-secret-for-appset-pull-tests";
const GITLAB_WEBHOOK_TOKEN: &str = "gitlab-webhook-token-for-appset-pull-tests";
const REPO: &str = "acme/deploy";
const PROJECT: &str = "example/deploy";

/// The ConfigMap a pull request's head deploys: `pr-cm-<number>`, its
/// `rev` saying which push of the pull request it is.
fn configmap(number: u64, rev: u32) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: pr-cm-{number}\ndata:\n  rev: \"{rev}\"\n"
    )
}

/// A push to GitHub pull request `number` from `branch`: a commit writing
/// its ConfigMap at `rev`, under `refs/pull/<number>/head` and on `branch`,
/// as GitHub has it. Returns the head commit.
fn push_to_pull(repo: &GitRepo, number: u64, branch: &str, rev: u32) -> String {
    let head = repo.pull_request(
        number,
        &[("pr/cm.yaml", Some(&configmap(number, rev)))],
        &format!("#{number}, push {rev}"),
    );
    push_branch(repo, &head, branch);
    head
}

/// The same for GitLab merge request `iid` (`refs/merge-requests/<iid>/head`).
fn push_to_merge_request(repo: &GitRepo, iid: u64, branch: &str, rev: u32) -> String {
    let head = repo.merge_request(
        iid,
        &[("pr/cm.yaml", Some(&configmap(iid, rev)))],
        &format!("!{iid}, push {rev}"),
    );
    push_branch(repo, &head, branch);
    head
}

fn push_branch(repo: &GitRepo, commit: &str, branch: &str) {
    git(
        &repo.work,
        &[
            "push",
            "--quiet",
            "--force",
            "origin",
            &format!("{commit}:refs/heads/{branch}"),
        ],
    );
}

/// A GitHub `pull_request` delivery of `action` on `acme/deploy` (served at
/// `url`) #`number`, from `branch` (head `head`) onto `main` (at `base`),
/// with `labels`, as GitHub sends it (trimmed).
fn pull_delivery(
    url: &str,
    action: &str,
    number: u64,
    branch: &str,
    base: &str,
    head: &str,
    labels: &[&str],
) -> String {
    let labels: Vec<Value> = labels
        .iter()
        .map(|name| json!({"name": name, "color": "f29513", "default": false}))
        .collect();
    let state = if action == "closed" { "closed" } else { "open" };
    json!({
        "action": action,
        "number": number,
        "pull_request": {
            "number": number,
            "state": state,
            "labels": labels,
            "head": {"ref": branch, "sha": head, "repo": {"full_name": REPO}},
            "base": {"ref": "main", "sha": base, "repo": {"full_name": REPO}}
        },
        "repository": {
            "full_name": REPO,
            "clone_url": url,
            "default_branch": "main"
        }
    })
    .to_string()
}

/// Posts a signed `pull_request` delivery; it must be taken.
fn deliver(port: u16, body: &str) {
    let (code, answer) =
        post_github_event(port, SECRET, "pull_request", &unique_name("delivery"), body);
    assert!(code == 200 || code == 202, "{code} {answer}");
}

/// A GitLab `Merge Request Hook` of `action` (`open`, `update`, `merge`,
/// `close`) on project 14, `example/deploy` (served at `url`), merge
/// request `iid` from `branch` (head `head`) onto `main`, with `labels`.
fn merge_request_hook(
    url: &str,
    action: &str,
    iid: u64,
    branch: &str,
    head: &str,
    labels: &[&str],
) -> String {
    let state = match action {
        "merge" => "merged",
        "close" => "closed",
        _ => "opened",
    };
    let labels: Vec<Value> = labels
        .iter()
        .enumerate()
        .map(|(i, title)| json!({"id": 200 + i, "title": title, "color": "#428BCA"}))
        .collect();
    json!({
        "object_kind": "merge_request",
        "event_type": "merge_request",
        "project": {"id": 14, "git_http_url": url, "default_branch": "main",
                    "path_with_namespace": PROJECT},
        "object_attributes": {
            "iid": iid, "target_branch": "main", "source_branch": branch,
            "source_project_id": 14, "target_project_id": 14, "state": state,
            "action": action,
            "oldrev": if action == "update" { Some("0000000000000000000000000000000000000001") } else { None },
            "last_commit": {"id": head},
            "labels": labels
        },
        "labels": labels
    })
    .to_string()
}

fn deliver_gitlab(port: u16, body: &str) {
    let (code, answer) = post_gitlab_event(port, GITLAB_WEBHOOK_TOKEN, "Merge Request Hook", body);
    assert!(code == 200 || code == 202, "{code} {answer}");
}

/// Setpoint on `ns` with the webhook and `env`; the process and its port.
async fn start(
    ns: &TestNamespace,
    cache: &std::path::Path,
    env: &[(&str, &str)],
) -> (Setpoint, u16) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--github-secret",
            SECRET,
            "--gitlab-token",
            GITLAB_WEBHOOK_TOKEN,
            "--no-sweep",
        ],
        env,
        cache,
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    (setpoint, port)
}

/// Setpoint listing `github`'s pull requests with its token.
async fn start_with_github(
    ns: &TestNamespace,
    github: &FakeGitHub,
    cache: &std::path::Path,
) -> (Setpoint, u16) {
    start(
        ns,
        cache,
        &[
            ("SETPOINT_GITHUB_API_URL", github.url.as_str()),
            ("SETPOINT_GITHUB_TOKEN", TOKEN),
            ("SETPOINT_GITHUB_COMMIT_STATUSES", "false"),
        ],
    )
    .await
}

/// An ApplicationSet over one pull request generator: an Application
/// `<prefix>-<number>` per pull request, deploying `pr/` of `repo_url` at
/// its head into the test's namespace, labelled with its branch's slug.
fn pull_set(
    ns: &TestNamespace,
    name: &str,
    generator: Value,
    prefix: &str,
    repo_url: &str,
) -> ApplicationSet {
    serde_json::from_value(json!({
        "apiVersion": "setpoint.dev/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": { "name": name, "namespace": ns.name },
        "spec": {
            "generators": [{ "pullRequest": generator }],
            "template": {
                "metadata": {
                    "name": format!("{prefix}-{{{{ number }}}}"),
                    "labels": { "branch": "{{ branch_slug }}" }
                },
                "spec": {
                    "source": {
                        "repoURL": repo_url,
                        "targetRevision": "{{ head_sha }}",
                        "path": "pr"
                    },
                    "destination": { "namespace": ns.name },
                    "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
                }
            }
        }
    }))
    .unwrap()
}

/// `Ok` once Application `app` names `commit` as its target and is Synced
/// there.
async fn synced_on(ns: &TestNamespace, app: &str, commit: &str) -> Result<(), String> {
    let found = ns
        .api::<Application>()
        .get(app)
        .await
        .map_err(|e| e.to_string())?;
    let target = found.spec.source.target_revision.as_deref();
    if target != Some(commit) {
        return Err(format!("targetRevision {target:?}"));
    }
    synced_at(ns, app, commit).await
}

/// `Ok` once ConfigMap `name` has `rev`.
async fn configmap_at(ns: &TestNamespace, name: &str, rev: &str) -> Result<(), String> {
    let found = ns
        .api::<ConfigMap>()
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("absent")?;
    let got = found.data.unwrap_or_default().get("rev").cloned();
    (got.as_deref() == Some(rev))
        .then_some(())
        .ok_or(format!("rev {got:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn github_pull_requests_get_environments_from_open_through_each_push_to_close() {
    let ns = TestNamespace::new("appset-pulls").await;
    install_appset_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("README.md", "the deploy repository\n")
        .commit("main");
    let served = repo.serve_http("acme", "deploy");
    // Open from the start: #7 (labelled preview) and #10 (not).
    let seven = push_to_pull(&repo, 7, "fix/Login_Page", 1);
    let ten = push_to_pull(&repo, 10, "docs/typos", 1);
    let pull_7 = pull_json(7, "fix/Login_Page", "main", &seven, &["preview", "bug"]);
    let pull_10 = pull_json(10, "docs/typos", "main", &ten, &["docs"]);
    github.set_pulls(REPO, vec![pull_7.clone(), pull_10.clone()]);

    let cache = tempfile::tempdir().unwrap();
    let (_setpoint, port) = start_with_github(&ns, &github, cache.path()).await;
    let generator =
        json!({ "github": { "owner": "acme", "repo": "deploy", "labels": ["preview"] } });
    create_set(
        &ns,
        &pull_set(&ns, "previews", generator, "pr", &served.url),
    )
    .await;

    // Listed when the set is created: #7's environment, at its head.
    wait_for("pr-7 synced at #7's head", DEADLINE, || {
        synced_on(&ns, "pr-7", &seven)
    })
    .await;
    wait_for("pr-cm-7 deployed", DEADLINE, || {
        configmap_at(&ns, "pr-cm-7", "1")
    })
    .await;
    let pr7 = ns.api::<Application>().get("pr-7").await.unwrap();
    assert_eq!(label(&pr7, "branch"), Some("fix-login-page"));
    assert_eq!(
        label(&pr7, "setpoint.dev/application-set"),
        Some("previews")
    );
    assert_eq!(pr7.spec.source.path.as_deref(), Some("pr"));
    assert_eq!(
        owned(&ns, "previews").await,
        ["pr-7"],
        "#10 has no preview label"
    );

    // #10 is pushed to, still without the label: still nothing for it.
    let ten = push_to_pull(&repo, 10, "docs/typos", 2);
    let pull_10 = pull_json(10, "docs/typos", "main", &ten, &["docs"]);
    github.set_pulls(REPO, vec![pull_7.clone(), pull_10.clone()]);
    deliver(
        port,
        &pull_delivery(
            &served.url,
            "synchronize",
            10,
            "docs/typos",
            &base,
            &ten,
            &["docs"],
        ),
    );

    // #8 opened: listed, and delivered.
    let eight = push_to_pull(&repo, 8, "feature/Preview-8", 1);
    let pull_8 = pull_json(8, "feature/Preview-8", "main", &eight, &["preview"]);
    github.set_pulls(REPO, vec![pull_7.clone(), pull_8, pull_10.clone()]);
    let opened = Instant::now();
    deliver(
        port,
        &pull_delivery(
            &served.url,
            "opened",
            8,
            "feature/Preview-8",
            &base,
            &eight,
            &["preview"],
        ),
    );
    wait_for("pr-8 synced at #8's head", DEADLINE, || {
        synced_on(&ns, "pr-8", &eight)
    })
    .await;
    let took = opened.elapsed();
    println!("GitHub pull request #8 opened -> pr-8 Synced: {took:?}");
    wait_for("pr-cm-8 deployed", DEADLINE, || {
        configmap_at(&ns, "pr-cm-8", "1")
    })
    .await;
    let pr8 = ns.api::<Application>().get("pr-8").await.unwrap();
    assert_eq!(label(&pr8, "branch"), Some("feature-preview-8"));
    // #10's delivery came first and was evaluated by now: no pr-10.
    assert_eq!(owned(&ns, "previews").await, ["pr-7", "pr-8"]);

    // A push to #8: its environment moves to the new head.
    let eight_2 = push_to_pull(&repo, 8, "feature/Preview-8", 2);
    assert_ne!(eight_2, eight);
    let pull_8 = pull_json(8, "feature/Preview-8", "main", &eight_2, &["preview"]);
    github.set_pulls(REPO, vec![pull_7.clone(), pull_8, pull_10.clone()]);
    let pushed = Instant::now();
    deliver(
        port,
        &pull_delivery(
            &served.url,
            "synchronize",
            8,
            "feature/Preview-8",
            &base,
            &eight_2,
            &["preview"],
        ),
    );
    wait_for("pr-8 synced at #8's new head", DEADLINE, || {
        synced_on(&ns, "pr-8", &eight_2)
    })
    .await;
    println!(
        "GitHub pull request #8 pushed to -> pr-8 Synced at the new head: {:?}",
        pushed.elapsed()
    );
    wait_for("pr-cm-8 at its second push", DEADLINE, || {
        configmap_at(&ns, "pr-cm-8", "2")
    })
    .await;
    let after = ns.api::<Application>().get("pr-8").await.unwrap();
    assert_eq!(after.uid(), pr8.uid(), "the same Application, updated");

    // #8 closed: its environment goes (one of two: the guard allows it);
    // #7's stays as it was.
    github.set_pulls(REPO, vec![pull_7, pull_10]);
    deliver(
        port,
        &pull_delivery(
            &served.url,
            "closed",
            8,
            "feature/Preview-8",
            &base,
            &eight_2,
            &["preview"],
        ),
    );
    wait_for("pr-8 deleted", DEADLINE, || {
        owns_exactly(&ns, "previews", &["pr-7"])
    })
    .await;
    let (reason, message) = wait_for("Ready=True after the close", DEADLINE, || async {
        let (reason, message) = ready(&ns, "previews", ConditionStatus::True).await?;
        message
            .contains("1 deleted")
            .then(|| (reason, message.clone()))
            .ok_or(message)
    })
    .await;
    assert_eq!(reason, "ApplicationsUpToDate", "{message}");
    let pr7_after = ns.api::<Application>().get("pr-7").await.unwrap();
    assert_eq!(pr7_after.uid(), pr7.uid());
    assert_eq!(pr7_after.spec, pr7.spec);
    synced_at(&ns, "pr-7", &seven).await.unwrap();

    // Every listing was asked for with the token, as GitHub documents it.
    assert!(
        !github
            .received_on("GET", "/repos/acme/deploy/pulls")
            .is_empty()
    );
    assert!(github.violations().is_empty(), "{:?}", github.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhooks_news_wins_over_a_listing_that_lags() {
    let ns = TestNamespace::new("appset-pulls-lag").await;
    install_appset_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    let repo = GitRepo::new();
    let base = repo
        .write("README.md", "the deploy repository\n")
        .commit("main");
    let served = repo.serve_http("acme", "deploy");
    let seven = push_to_pull(&repo, 7, "feature-7", 1);
    let pull_7 = pull_json(7, "feature-7", "main", &seven, &["preview"]);
    github.set_pulls(REPO, vec![pull_7.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let (_setpoint, port) = start_with_github(&ns, &github, cache.path()).await;
    let generator =
        json!({ "github": { "owner": "acme", "repo": "deploy", "labels": ["preview"] } });
    create_set(&ns, &pull_set(&ns, "lagging", generator, "pr", &served.url)).await;
    wait_for("pr-7 synced", DEADLINE, || synced_on(&ns, "pr-7", &seven)).await;

    // #9 opened; GitHub's listing does not show it yet.
    let nine = push_to_pull(&repo, 9, "feature-9", 1);
    let opened = Instant::now();
    deliver(
        port,
        &pull_delivery(
            &served.url,
            "opened",
            9,
            "feature-9",
            &base,
            &nine,
            &["preview"],
        ),
    );
    wait_for("pr-9 synced at #9's head", DEADLINE, || {
        synced_on(&ns, "pr-9", &nine)
    })
    .await;
    println!(
        "GitHub pull request #9 opened (not listed yet) -> pr-9 Synced: {:?}",
        opened.elapsed()
    );
    assert_eq!(owned(&ns, "lagging").await, ["pr-7", "pr-9"]);

    // The listing catches up; then #9 is closed while the listing still
    // shows it open: the close wins too.
    let pull_9 = pull_json(9, "feature-9", "main", &nine, &["preview"]);
    github.set_pulls(REPO, vec![pull_7, pull_9]);
    deliver(
        port,
        &pull_delivery(
            &served.url,
            "closed",
            9,
            "feature-9",
            &base,
            &nine,
            &["preview"],
        ),
    );
    wait_for("pr-9 deleted", DEADLINE, || {
        owns_exactly(&ns, "lagging", &["pr-7"])
    })
    .await;
    assert!(github.violations().is_empty(), "{:?}", github.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gitlab_merge_requests_get_environments_until_merged_or_closed() {
    let ns = TestNamespace::new("appset-merges").await;
    install_appset_crd(&ns.client).await;
    let gitlab = FakeGitLab::start().await;
    let repo = GitRepo::new();
    repo.write("README.md", "the deploy repository\n")
        .commit("main");
    let served = repo.serve_http("example", "deploy");
    let three = push_to_merge_request(&repo, 3, "mr-3", 1);
    let mr_3 = merge_request_json(3, "mr-3", "main", &three, &["preview"]);
    gitlab.set_merge_requests(PROJECT, vec![mr_3.clone()]);
    let cache = tempfile::tempdir().unwrap();
    let (_setpoint, port) = start(
        &ns,
        cache.path(),
        &[
            ("SETPOINT_GITLAB_API_URL", gitlab.url.as_str()),
            ("SETPOINT_GITLAB_API_TOKEN", support::gitlab::TOKEN),
        ],
    )
    .await;
    let generator = json!({ "gitlab": { "project": PROJECT, "labels": ["preview"] } });
    create_set(&ns, &pull_set(&ns, "merges", generator, "mr", &served.url)).await;
    wait_for("mr-3 synced at !3's head", DEADLINE, || {
        synced_on(&ns, "mr-3", &three)
    })
    .await;
    let mr3 = ns.api::<Application>().get("mr-3").await.unwrap();
    assert_eq!(label(&mr3, "branch"), Some("mr-3"));

    // !4 opened.
    let four = push_to_merge_request(&repo, 4, "mr-4", 1);
    let mr_4 = merge_request_json(4, "mr-4", "main", &four, &["preview"]);
    gitlab.set_merge_requests(PROJECT, vec![mr_3.clone(), mr_4]);
    let opened = Instant::now();
    deliver_gitlab(
        port,
        &merge_request_hook(&served.url, "open", 4, "mr-4", &four, &["preview"]),
    );
    wait_for("mr-4 synced at !4's head", DEADLINE, || {
        synced_on(&ns, "mr-4", &four)
    })
    .await;
    println!(
        "GitLab merge request !4 opened -> mr-4 Synced: {:?}",
        opened.elapsed()
    );
    wait_for("pr-cm-4 deployed", DEADLINE, || {
        configmap_at(&ns, "pr-cm-4", "1")
    })
    .await;
    assert_eq!(owned(&ns, "merges").await, ["mr-3", "mr-4"]);

    // !4 merged: its environment goes, !3's stays.
    gitlab.set_merge_requests(PROJECT, vec![mr_3]);
    deliver_gitlab(
        port,
        &merge_request_hook(&served.url, "merge", 4, "mr-4", &four, &["preview"]),
    );
    wait_for("mr-4 deleted", DEADLINE, || {
        owns_exactly(&ns, "merges", &["mr-3"])
    })
    .await;
    synced_at(&ns, "mr-3", &three).await.unwrap();

    // !3 closed: the last one goes.
    gitlab.set_merge_requests(PROJECT, vec![]);
    deliver_gitlab(
        port,
        &merge_request_hook(&served.url, "close", 3, "mr-3", &three, &["preview"]),
    );
    wait_for("mr-3 deleted", DEADLINE, || {
        owns_exactly(&ns, "merges", &[])
    })
    .await;
    let listings = gitlab
        .received()
        .iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/merge_requests"))
        .count();
    assert!(listings > 0, "the merge requests were listed");
    assert!(gitlab.violations().is_empty(), "{:?}", gitlab.violations());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_github_token_the_set_says_which_variable_to_set_and_creates_nothing() {
    let ns = TestNamespace::new("appset-pulls-notoken").await;
    install_appset_crd(&ns.client).await;
    let github = FakeGitHub::start().await;
    github.set_pulls(
        REPO,
        vec![pull_json(
            7,
            "feature-7",
            "main",
            "6dcb09b5b57875f334f61aebed695e2e4193db5e",
            &["preview"],
        )],
    );
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    // Whatever the environment the tests run in has, no token.
    let mut setpoint = Setpoint::spawn_without(
        &[
            "run",
            "--listen",
            &listen,
            "--github-secret",
            SECRET,
            "--no-sweep",
        ],
        &[
            ("SETPOINT_WATCH_NAMESPACES", ns.name.as_str()),
            ("POD_NAMESPACE", ns.name.as_str()),
            ("SETPOINT_GITHUB_API_URL", github.url.as_str()),
            ("SETPOINT_GITHUB_COMMIT_STATUSES", "false"),
        ],
        &["SETPOINT_GITHUB_TOKEN", "SETPOINT_GITHUB_TOKEN_FILE"],
        cache.path(),
    );
    setpoint.wait_http().await;
    let generator =
        json!({ "github": { "owner": "acme", "repo": "deploy", "labels": ["preview"] } });
    create_set(
        &ns,
        &pull_set(
            &ns,
            "tokenless",
            generator,
            "pr",
            "https://github.com/acme/deploy.git",
        ),
    )
    .await;
    let (reason, message) = wait_for("Ready=False", DEADLINE, || {
        ready(&ns, "tokenless", ConditionStatus::False)
    })
    .await;
    assert_eq!(reason, "PullRequestsFailed", "{message}");
    assert!(message.contains("SETPOINT_GITHUB_TOKEN"), "{message}");
    assert!(message.contains("GitHub"), "{message}");
    let apps = ns
        .api::<Application>()
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        apps.items.is_empty(),
        "{:?}",
        apps.items.iter().map(|a| a.name_any()).collect::<Vec<_>>()
    );
    assert!(
        github.received().is_empty(),
        "nothing was asked of GitHub without a token: {:?}",
        github.received()
    );
    drop(setpoint);
}
