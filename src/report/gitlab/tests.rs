use std::time::{Duration, Instant};

use serde_json::json;

use super::fake::{FakeGitLab, TOKEN};
use super::*;
use crate::api::{Application, ApplicationSpec, Destination, Source};

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";
const PROJECT: &str = "example/team/deploy";
const PATH: &str =
    "/api/v4/projects/example%2Fteam%2Fdeploy/statuses/0123456789abcdef0123456789abcdef01234567";

/// Polls `condition` until it holds; panics after a deadline.
async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn status(state: State, description: &str) -> CommitStatus {
    CommitStatus {
        project: PROJECT.into(),
        sha: SHA.into(),
        state,
        name: "setpoint/team-a/web".into(),
        description: description.into(),
        target_url: None,
    }
}

/// Posts with quick retries.
fn statuses(gitlab: &FakeGitLab) -> CommitStatuses {
    let client = Client::new(&gitlab.url, TOKEN).unwrap();
    CommitStatuses::with_retry(client, Duration::from_millis(10), Duration::from_secs(5)).unwrap()
}

fn app(repo_url: &str) -> Application {
    let mut app = Application::new(
        "web",
        ApplicationSpec {
            source: Source {
                repo_url: repo_url.into(),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    app.metadata.namespace = Some("team-a".into());
    app
}

#[test]
fn project_paths_are_one_url_encoded_segment() {
    assert_eq!(project_id("42"), "42");
    assert_eq!(project_id("group/project"), "group%2Fproject");
    assert_eq!(
        project_id("group/sub/my.app-1_x"),
        "group%2Fsub%2Fmy.app-1_x"
    );
    assert_eq!(project_id("a b/c?d#e"), "a%20b%2Fc%3Fd%23e");
}

#[test]
fn projects_are_found_on_the_gitlab_host_only() {
    let gitlab = "https://gitlab.com/api/v4";
    for (url, expected) in [
        (
            "https://gitlab.com/group/project.git",
            Some("group/project"),
        ),
        (
            "https://GitLab.com/group/sub/project",
            Some("group/sub/project"),
        ),
        (
            "git@gitlab.com:group/sub/project.git",
            Some("group/sub/project"),
        ),
        (
            "ssh://git@gitlab.com:2222/group/project",
            Some("group/project"),
        ),
        (
            "https://oauth2:glpat-x@gitlab.com/group/project",
            Some("group/project"),
        ),
        // Paths keep their case (GitLab's routes are case-insensitive).
        ("https://gitlab.com/Group/Project", Some("Group/Project")),
        // Another host, GitHub, a local repository.
        ("https://gitlab.example.com/group/project", None),
        ("https://github.com/acme/deploy", None),
        ("/tmp/repo.git", None),
        // Not a project: no namespace, or one of GitLab's own routes.
        ("https://gitlab.com/project", None),
        ("https://gitlab.com/group/project/-/tree/main", None),
    ] {
        assert_eq!(gitlab_project(url, gitlab).as_deref(), expected, "{url}");
    }
    // A self-managed GitLab under a relative URL root: its http(s) paths
    // start with it, its SSH paths do not; the API's port is not the Git's.
    let managed = "https://git.example.com:8443/gitlab/api/v4/";
    assert_eq!(
        gitlab_project("https://git.example.com/gitlab/ops/deploy.git", managed).as_deref(),
        Some("ops/deploy")
    );
    assert_eq!(
        gitlab_project("git@git.example.com:ops/deploy.git", managed).as_deref(),
        Some("ops/deploy")
    );
    assert_eq!(
        gitlab_project("https://example.com/ops/deploy", managed),
        None
    );
}

#[test]
fn github_states_are_said_in_gitlab_s() {
    use crate::report::github::State as GitHub;
    assert_eq!(State::from(GitHub::Pending), State::Running);
    assert_eq!(State::from(GitHub::Success), State::Success);
    assert_eq!(State::from(GitHub::Failure), State::Failed);
    assert_eq!(State::from(GitHub::Error), State::Failed);
    assert_eq!(State::Running.to_string(), "running");
    assert_eq!(
        serde_json::to_value(State::Failed).unwrap(),
        json!("failed")
    );
}

#[test]
fn descriptions_are_one_line_of_at_most_255_characters() {
    assert_eq!(
        one_line("bad YAML:\n  line 3\tcolumn 1"),
        "bad YAML: line 3 column 1"
    );
    let long = one_line(&"é".repeat(300));
    assert_eq!(long.chars().count(), 255);
    assert!(long.ends_with('…'));
}

#[test]
fn gitlab_messages_are_read_from_its_error_bodies() {
    assert_eq!(
        gitlab_message(r#"{"message":"404 Project Not Found"}"#),
        "404 Project Not Found"
    );
    assert_eq!(
        gitlab_message(r#"{"message":{"name":["is too long"]}}"#),
        r#"{"name":["is too long"]}"#
    );
    assert_eq!(
        gitlab_message(r#"{"error":"state does not have a valid value"}"#),
        "state does not have a valid value"
    );
    assert_eq!(gitlab_message(""), "no message");
    assert_eq!(
        gitlab_message("<html>\n bad gateway</html>"),
        "<html> bad gateway</html>"
    );
}

#[tokio::test]
async fn bad_settings_are_refused_and_the_token_never_shows() {
    for (url, token, expected) in [
        ("https://gitlab.com/api/v4", " \n", "no token"),
        ("https://gitlab.com/api/v4", "glpat x", "characters"),
        (
            "https://user:glpat-secret@gitlab.com/api/v4",
            TOKEN,
            "carries credentials",
        ),
        ("gitlab.com/api/v4", TOKEN, "not an http(s) URL"),
        ("https://gitlab.com/api/v4?x=1", TOKEN, "not an http(s) URL"),
    ] {
        let error = Client::new(url, token).unwrap_err().to_string();
        assert!(error.contains(expected), "{url}: {error}");
        assert!(!error.contains("glpat-secret"), "{error}");
    }
    let client = Client::new("https://gitlab.com/api/v4/", TOKEN).unwrap();
    assert_eq!(client.api_url(), "https://gitlab.com/api/v4");
    assert!(!format!("{client:?}").contains(TOKEN));
}

#[tokio::test]
async fn a_status_posts_to_the_project_s_commit_with_gitlab_s_fields() {
    let gitlab = FakeGitLab::start().await;
    let client = Client::new(&gitlab.url, &format!("{TOKEN}\n")).unwrap();
    post_status(
        &client,
        PROJECT,
        SHA,
        State::Running,
        "setpoint/team-a/web",
        "Syncing 0123456",
        Some("https://setpoint.example.com/applications/team-a/web"),
    )
    .await
    .unwrap();

    assert_eq!(gitlab.violations(), Vec::<String>::new());
    let received = gitlab.received();
    assert_eq!(received.len(), 1);
    let post = &received[0];
    assert_eq!((post.method.as_str(), post.path.as_str()), ("POST", PATH));
    assert_eq!(post.header("private-token"), Some(TOKEN));
    assert_eq!(post.header("authorization"), None);
    assert_eq!(
        post.json(),
        json!({"state": "running", "name": "setpoint/team-a/web", "description": "Syncing 0123456",
               "target_url": "https://setpoint.example.com/applications/team-a/web"})
    );
    let stored = gitlab.statuses(PROJECT, SHA);
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["status"], "running");
}

#[tokio::test]
async fn the_same_state_twice_is_done_not_an_error() {
    let gitlab = FakeGitLab::start().await;
    let client = Client::new(&gitlab.url, TOKEN).unwrap();
    let running = status(State::Running, "Syncing");
    assert_eq!(client.send(&running).await.unwrap(), Posted::Set);
    // GitLab refuses `run` from running with a 400: the status holds.
    assert_eq!(client.send(&running).await.unwrap(), Posted::AlreadySo);
    assert_eq!(
        client
            .send(&status(State::Success, "Synced"))
            .await
            .unwrap(),
        Posted::Set
    );

    assert_eq!(gitlab.violations(), Vec::<String>::new());
    assert_eq!(gitlab.received().len(), 3);
    let stored = gitlab.statuses(PROJECT, SHA);
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0]["status"], "success");
    assert_eq!(stored[0]["description"], "Synced");
}

#[tokio::test]
async fn running_then_success_arrive_in_order_through_retries() {
    let gitlab = FakeGitLab::start().await;
    // The first post fails twice: were the posts not serialized, `success`
    // would reach GitLab before `running`.
    gitlab.fail_next([502, 503]);
    let statuses = statuses(&gitlab);
    statuses.spawn_post(status(State::Running, "Syncing 0123456"));
    statuses.spawn_post(status(State::Success, "Synced: 2 applied, 0 pruned"));
    eventually("two posted statuses", || statuses.posted() == 2).await;

    assert_eq!(gitlab.violations(), Vec::<String>::new());
    let states: Vec<String> = gitlab
        .received()
        .iter()
        .map(|post| post.json()["state"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(states, ["running", "running", "running", "success"]);
    assert_eq!(gitlab.statuses(PROJECT, SHA)[0]["status"], "success");
    assert_eq!(statuses.failures(), 0);
}

#[tokio::test]
async fn a_final_answer_is_not_retried_and_is_counted() {
    let gitlab = FakeGitLab::start().await;
    gitlab.fail_next([404]);
    let statuses = statuses(&gitlab);
    let error = statuses
        .post(&status(State::Failed, "InvalidManifest: app/cm.yaml"))
        .await
        .unwrap_err();

    assert_eq!(error.status_code(), Some(404));
    assert!(!error.is_transient());
    assert!(error.to_string().contains(PROJECT), "{error}");
    assert_eq!(gitlab.received().len(), 1);
    assert_eq!((statuses.posted(), statuses.failures()), (0, 1));
    // The next status of that commit and name is not stuck behind it.
    statuses.spawn_post(status(State::Failed, "InvalidManifest: app/cm.yaml"));
    eventually("the next status posted", || statuses.posted() == 1).await;
}

#[tokio::test]
async fn a_status_that_never_posts_is_given_up_within_its_budget() {
    let gitlab = FakeGitLab::start().await;
    gitlab.fail_next([500; 1000]);
    let client = Client::new(&gitlab.url, TOKEN).unwrap();
    let statuses = CommitStatuses::with_retry(
        client,
        Duration::from_millis(10),
        Duration::from_millis(300),
    )
    .unwrap();
    let started = Instant::now();
    let error = statuses
        .post(&status(State::Running, "Syncing"))
        .await
        .unwrap_err();

    assert!(error.is_transient(), "{error}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(gitlab.received().len() > 1, "retried");
    assert_eq!(statuses.failures(), 1);
}

#[tokio::test]
async fn invalid_statuses_are_refused_before_a_request() {
    let gitlab = FakeGitLab::start().await;
    let client = Client::new(&gitlab.url, TOKEN).unwrap();
    let mut short = status(State::Success, "Synced");
    short.sha = "0123456".into();
    let mut unnamed = status(State::Success, "Synced");
    unnamed.name = " ".into();
    let mut linked = status(State::Success, "Synced");
    linked.target_url = Some("javascript:alert(1)".into());
    for (status, reason) in [
        (short, "not a full commit id"),
        (unnamed, "no name"),
        (linked, "target url"),
    ] {
        let error = client.send(&status).await.unwrap_err();
        assert!(error.to_string().contains(reason), "{error}");
    }
    assert!(gitlab.received().is_empty());
}

#[tokio::test]
async fn an_application_s_status_names_its_project_and_context() {
    let gitlab = FakeGitLab::start().await;
    let statuses = statuses(&gitlab);
    let repo = "http://127.0.0.1:9/example/team/deploy.git";
    let web = app(repo);
    assert!(statuses.serves(&web));
    let status = statuses
        .status_for(&web, SHA, State::Running, "Syncing 0123456")
        .unwrap();
    assert_eq!(
        status,
        CommitStatus {
            project: PROJECT.into(),
            sha: SHA.into(),
            state: State::Running,
            name: "setpoint/team-a/web".into(),
            description: "Syncing 0123456".into(),
            target_url: None,
        }
    );

    // A remote destination leads the description.
    let mut remote = app(repo);
    remote.spec.destination = Destination {
        name: Some("prod".into()),
        ..Default::default()
    };
    let description = statuses
        .status_for(&remote, SHA, State::Success, "Synced")
        .unwrap()
        .description;
    assert!(
        description.starts_with("cluster ") && description.ends_with(": Synced"),
        "{description}"
    );

    // Elsewhere, or a chart (its revision is a version): no status.
    let github = app("https://github.com/acme/deploy");
    assert!(!statuses.serves(&github));
    let error = statuses
        .status_for(&github, SHA, State::Running, "x")
        .unwrap_err();
    assert!(matches!(error, GitLabError::NotGitLab { .. }), "{error}");
    let mut chart = app("http://127.0.0.1:9/api/v4/projects/7/packages/helm/stable");
    chart.spec.source.chart = Some("web".into());
    assert!(
        statuses
            .status_for(&chart, SHA, State::Running, "x")
            .is_err()
    );
    let error = statuses
        .status_for(&web, "1.2.3", State::Running, "x")
        .unwrap_err();
    assert!(
        matches!(error, GitLabError::InvalidStatus { .. }),
        "{error}"
    );
    assert!(gitlab.received().is_empty());
}
