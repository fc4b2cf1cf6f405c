use super::api::*;
use super::hooks::*;
use super::statuses::*;
use super::*;

use serde_json::{Value, json};

use super::fake::{API_VERSION, FakeGitHub, Fault, TOKEN, delivery, pull_json};

const SHA: &str = "0123456789abcdef0123456789abcdef01234567";
const HOOK: &str = "/repos/acme/deploy/hooks/42";

/// Settings that reach the fake, with quick retries.
fn settings(github: &FakeGitHub) -> GitHubSettings {
    GitHubSettings {
        api_url: github.url.clone(),
        token: TOKEN.into(),
        retry_initial: Duration::from_millis(10),
        retry_budget: Duration::from_secs(5),
        ..GitHubSettings::default()
    }
}

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
        owner: "acme".into(),
        repo: "deploy".into(),
        sha: SHA.into(),
        state,
        context: status_context("team-a", "web"),
        description: description.into(),
        target_url: None,
    }
}

#[tokio::test]
async fn pending_then_success_arrive_in_order() {
    let github = FakeGitHub::start().await;
    // Were the two posts not serialized, `success` would overtake the
    // slow `pending`.
    github.fail_next([Fault::Delay(Duration::from_millis(300))]);
    let statuses = CommitStatuses::new(&settings(&github)).unwrap();
    statuses.spawn_post(status(State::Pending, "syncing to 0123456"));
    statuses.spawn_post(status(State::Success, "synced 12 objects"));
    eventually("two posted statuses", || statuses.posted() == 2).await;

    let posts = github.received();
    assert_eq!(github.violations(), Vec::<String>::new());
    assert_eq!(posts.len(), 2);
    for post in &posts {
        assert_eq!(post.method, "POST");
        assert_eq!(post.path, format!("/repos/acme/deploy/statuses/{SHA}"));
        assert_eq!(post.headers("authorization"), [format!("Bearer {TOKEN}")]);
        assert_eq!(post.header("accept"), Some("application/vnd.github+json"));
        assert_eq!(post.header("x-github-api-version"), Some(API_VERSION));
        assert!(post.header("user-agent").is_some());
    }
    assert_eq!(
        posts[0].json(),
        json!({"state": "pending", "context": "setpoint/team-a/web", "description": "syncing to 0123456"})
    );
    assert_eq!(
        posts[1].json(),
        json!({"state": "success", "context": "setpoint/team-a/web", "description": "synced 12 objects"})
    );
    assert_eq!(statuses.failures(), 0);
}

#[tokio::test]
async fn server_errors_and_dropped_connections_are_retried() {
    let github = FakeGitHub::start().await;
    github.fail_next([Fault::Status(502), Fault::Drop, Fault::Status(502)]);
    let statuses = CommitStatuses::new(&settings(&github)).unwrap();
    statuses.spawn_post(status(State::Failure, "bad YAML in app.yaml"));
    eventually("the status posted", || statuses.posted() == 1).await;

    assert_eq!(github.received().len(), 4);
    assert_eq!(github.violations(), Vec::<String>::new());
    assert_eq!(statuses.failures(), 0);
}

#[tokio::test]
async fn a_status_that_never_posts_is_counted_not_raised() {
    let github = FakeGitHub::start().await;
    github.fail_always(Fault::Status(500));
    let statuses = CommitStatuses::new(&GitHubSettings {
        retry_budget: Duration::from_millis(300),
        ..settings(&github)
    })
    .unwrap();
    let started = Instant::now();
    statuses.spawn_post(status(State::Pending, "syncing"));
    eventually("the post given up", || statuses.failures() == 1).await;

    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(github.received().len() > 1, "retried");
    assert_eq!(statuses.posted(), 0);
    assert_eq!(github.violations(), Vec::<String>::new());
    // The next status of that context is not stuck behind the failed one.
    github.state().always = None;
    statuses.spawn_post(status(State::Success, "synced"));
    eventually("the next status posted", || statuses.posted() == 1).await;
}

#[tokio::test]
async fn validation_errors_are_not_retried() {
    let github = FakeGitHub::start().await;
    github.fail_next([Fault::Status(422)]);
    let statuses = CommitStatuses::new(&settings(&github)).unwrap();
    let error = statuses
        .post(&status(State::Success, "synced"))
        .await
        .unwrap_err();

    assert_eq!(error.status_code(), Some(422));
    assert!(error.to_string().contains("Validation Failed"), "{error}");
    assert_eq!(github.received().len(), 1);
    assert_eq!(statuses.failures(), 1);
}

#[tokio::test]
async fn rate_limits_are_retried_but_forbidden_is_not() {
    let github = FakeGitHub::start().await;
    let reset = (Timestamp::now().as_second() + 1).to_string();
    github.fail_next([
        Fault::StatusWith(429, vec![("retry-after", "0".into())]),
        Fault::StatusWith(
            403,
            vec![
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", reset),
            ],
        ),
    ]);
    let statuses = CommitStatuses::new(&settings(&github)).unwrap();
    statuses
        .post(&status(State::Success, "synced"))
        .await
        .unwrap();
    assert_eq!(github.received().len(), 3);

    // A 403 without a rate limit is a missing permission: final.
    github.fail_next([Fault::Status(403)]);
    let error = statuses
        .post(&status(State::Success, "synced"))
        .await
        .unwrap_err();
    assert_eq!(error.status_code(), Some(403));
    assert_eq!(github.received().len(), 4);

    // A reset further away than the budget is not waited for.
    let far = (Timestamp::now().as_second() + 3600).to_string();
    github.fail_next([Fault::StatusWith(
        403,
        vec![
            ("x-ratelimit-remaining", "0".into()),
            ("x-ratelimit-reset", far),
        ],
    )]);
    let started = Instant::now();
    let error = statuses
        .post(&status(State::Success, "synced"))
        .await
        .unwrap_err();
    assert_eq!(error.status_code(), Some(403));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(github.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn invalid_statuses_are_refused_before_any_request() {
    let github = FakeGitHub::start().await;
    let statuses = CommitStatuses::new(&settings(&github)).unwrap();
    for invalid in [
        CommitStatus {
            sha: "0123456".into(),
            ..status(State::Success, "")
        },
        CommitStatus {
            repo: "deploy/../../orgs".into(),
            ..status(State::Success, "")
        },
        CommitStatus {
            context: " ".into(),
            ..status(State::Success, "")
        },
    ] {
        let error = statuses.post(&invalid).await.unwrap_err();
        assert!(
            matches!(error, GitHubError::InvalidStatus { .. }),
            "{error}"
        );
    }
    assert!(github.received().is_empty());
}

#[tokio::test]
async fn the_token_never_shows() {
    let github = FakeGitHub::start().await;
    let settings = settings(&github);
    let debug = format!("{settings:?}");
    assert!(!debug.contains(TOKEN), "{debug}");
    assert!(debug.contains("<redacted>"), "{debug}");

    let mut errors = Vec::new();
    let statuses = CommitStatuses::new(&settings).unwrap();
    github.fail_next([Fault::Status(422)]);
    errors.push(
        statuses
            .post(&status(State::Success, ""))
            .await
            .unwrap_err(),
    );
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let unreachable = CommitStatuses::new(&GitHubSettings {
        api_url: format!("http://{closed}"),
        retry_budget: Duration::from_millis(100),
        ..settings.clone()
    })
    .unwrap();
    errors.push(
        unreachable
            .post(&status(State::Success, ""))
            .await
            .unwrap_err(),
    );
    let redelivery = Redelivery::new(&GitHubSettings {
        hooks: vec!["acme/deploy:999".parse().unwrap()],
        ..settings.clone()
    })
    .unwrap();
    errors.push(redelivery.run_once().await.unwrap_err());
    for token in [format!("{TOKEN}\nX-Evil: 1"), String::new()] {
        let settings = GitHubSettings {
            token: token.clone(),
            ..settings.clone()
        };
        errors.push(CommitStatuses::new(&settings).err().unwrap());
    }
    let with_credentials = GitHubSettings {
        api_url: format!("https://x:{TOKEN}@github.example.com/api/v3"),
        ..settings.clone()
    };
    errors.push(CommitStatuses::new(&with_credentials).err().unwrap());

    assert!(
        matches!(errors[1], GitHubError::Request { .. }),
        "{:?}",
        errors[1]
    );
    for error in &errors {
        for text in [error.to_string(), error_chain(error), format!("{error:?}")] {
            assert!(!text.contains(TOKEN), "{text}");
            assert!(!text.contains("SECRET"), "{text}");
        }
    }
}

#[test]
fn github_repositories_are_recognized() {
    let github = Some(("acme".to_owned(), "deploy".to_owned()));
    for url in [
        "https://github.com/acme/deploy",
        "https://github.com/acme/deploy.git",
        "https://GitHub.COM/acme/deploy/",
        "https://user:secret@github.com/acme/deploy.git",
        "git@github.com:acme/deploy.git",
        "git@GITHUB.com:acme/deploy",
        "ssh://git@github.com/acme/deploy",
        "ssh://git@github.com:22/acme/deploy.git",
        "http://www.github.com/acme/deploy",
    ] {
        assert_eq!(github_repo(url, DEFAULT_API_URL), github, "{url}");
        assert_eq!(github_repo(url, "https://api.github.com/"), github, "{url}");
    }
    for url in [
        "https://gitlab.com/acme/deploy",
        "https://github.com.evil.example/acme/deploy",
        "https://github.com/acme",
        "https://github.com/acme/deploy/tree/main",
        "https://ghe.example.com/acme/deploy",
        "/srv/git/acme/deploy",
        "file:///github.com/acme/deploy",
        "",
    ] {
        assert_eq!(github_repo(url, DEFAULT_API_URL), None, "{url}");
    }

    let enterprise = "https://ghe.example.com/api/v3";
    for url in [
        "https://ghe.example.com/acme/deploy.git",
        "git@GHE.example.com:acme/deploy.git",
        "ssh://git@ghe.example.com:2222/acme/deploy",
    ] {
        assert_eq!(github_repo(url, enterprise), github, "{url}");
    }
    assert_eq!(
        github_repo("https://github.com/acme/deploy", enterprise),
        None
    );
    assert_eq!(
        github_repo(
            "https://octocorp.ghe.com/acme/deploy",
            "https://api.octocorp.ghe.com"
        ),
        github
    );
    assert_eq!(
        github_repo("https://github.com/acme/deploy", "not a url"),
        None
    );
}

#[test]
fn descriptions_are_one_short_line() {
    assert_eq!(one_line("synced 3 objects"), "synced 3 objects");
    assert_eq!(
        one_line("failed to apply:\n  Deployment/web:\tinvalid\r\n"),
        "failed to apply: Deployment/web: invalid"
    );
    let long = format!("{}\n{}", "é".repeat(100), "x".repeat(100));
    let cut = one_line(&long);
    assert_eq!(cut.chars().count(), DESCRIPTION_LIMIT);
    assert!(cut.ends_with('…') && !cut.contains('\n'), "{cut}");
    let exact = "a".repeat(DESCRIPTION_LIMIT);
    assert_eq!(one_line(&exact), exact);
}

#[tokio::test]
async fn long_descriptions_are_cut_before_posting() {
    let github = FakeGitHub::start().await;
    let statuses = CommitStatuses::new(&settings(&github)).unwrap();
    let long = format!("error: {}\ncaused by: {}", "x".repeat(150), "y".repeat(50));
    statuses.post(&status(State::Error, &long)).await.unwrap();

    let posted = github.received()[0].json();
    let description = posted["description"].as_str().unwrap();
    assert!(description.chars().count() <= DESCRIPTION_LIMIT);
    assert!(!description.contains('\n'));
    assert!(description.starts_with("error: xxx"));
    assert_eq!(github.violations(), Vec::<String>::new());
}

#[test]
fn hook_refs_parse_and_print() {
    let repo: HookRef = "acme/deploy:12345".parse().unwrap();
    assert_eq!(
        repo,
        HookRef {
            scope: HookScope::Repo {
                owner: "acme".into(),
                repo: "deploy".into()
            },
            id: 12345
        }
    );
    assert_eq!(repo.to_string(), "acme/deploy:12345");
    assert_eq!(repo.path(), "/repos/acme/deploy/hooks/12345");
    let org: HookRef = " orgs/acme:7 ".parse().unwrap();
    assert_eq!(org.scope, HookScope::Org("acme".into()));
    assert_eq!(org.to_string(), "orgs/acme:7");
    assert_eq!(org.path(), "/orgs/acme/hooks/7");
    for invalid in [
        "acme/deploy",
        "acme/deploy:",
        "acme/deploy:0",
        "acme/deploy:-1",
        "acme:12",
        "acme/deploy/x:12",
        "../x:12",
        "acme/de ploy:12",
        "orgs/:12",
    ] {
        let error = invalid.parse::<HookRef>().unwrap_err();
        assert!(
            matches!(error, GitHubError::InvalidHook { .. }),
            "{invalid}"
        );
    }
}

#[test]
fn the_next_page_comes_from_the_link_header() {
    let mut headers = HeaderMap::new();
    assert_eq!(next_link(&headers), None);
    headers.insert(
        LINK,
        r#"<https://api.github.com/x?cursor=a>; rel="prev", <https://api.github.com/x?per_page=100&cursor=v1_b>; rel="next""#
            .parse()
            .unwrap(),
    );
    assert_eq!(
        next_link(&headers).as_deref(),
        Some("https://api.github.com/x?per_page=100&cursor=v1_b")
    );
    headers.insert(
        LINK,
        r#"<https://api.github.com/x>; rel="last""#.parse().unwrap(),
    );
    assert_eq!(next_link(&headers), None);
}

#[tokio::test]
async fn failed_deliveries_are_redelivered_once() {
    let github = FakeGitHub::start().await;
    github.state().hooks.insert(
        HOOK.into(),
        vec![
            vec![
                delivery(108, "g-recovered", 200, 10, true),
                delivery(107, "g-lost", 0, 20, true),
                delivery(106, "g-ok", 200, 30, false),
            ],
            vec![
                delivery(105, "g-lost", 503, 50, false),
                delivery(104, "g-recovered", 502, 60, false),
                delivery(103, "g-old", 500, 5 * 60, false),
            ],
            // Past the lookback: never listed.
            vec![delivery(102, "g-older", 500, 6 * 60, false)],
        ],
    );
    let redelivery = Redelivery::new(&GitHubSettings {
        hooks: vec!["acme/deploy:42".parse().unwrap()],
        ..settings(&github)
    })
    .unwrap();

    let report = redelivery.run_once().await.unwrap();
    assert_eq!(
        report,
        RedeliveryReport {
            listed: 5,
            failed: 1,
            redelivered: vec!["g-lost".into()],
            not_redelivered: vec![],
        }
    );
    let lists = github.received_on("GET", "/deliveries");
    assert_eq!(lists.len(), 2, "the third page is past the cutoff");
    assert_eq!(lists[0].path, format!("{HOOK}/deliveries"));
    assert_eq!(lists[0].query("per_page"), Some("100"));
    assert_eq!(lists[0].query("cursor"), None);
    assert_eq!(lists[1].query("cursor"), Some("v1_1"));
    let attempts = github.received_on("POST", "/attempts");
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].path, format!("{HOOK}/deliveries/107/attempts"));
    assert!(attempts[0].body.is_empty());

    let again = redelivery.run_once().await.unwrap();
    assert_eq!((again.listed, again.failed), (5, 1));
    assert!(again.redelivered.is_empty());
    assert_eq!(github.received_on("POST", "/attempts").len(), 1);
    assert_eq!(github.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn organization_hooks_are_redelivered_too() {
    let github = FakeGitHub::start().await;
    github.state().hooks.insert(
        "/orgs/acme/hooks/7".into(),
        vec![vec![delivery(3, "g-org", 502, 5, false)]],
    );
    let redelivery = Redelivery::new(&GitHubSettings {
        hooks: vec!["orgs/acme:7".parse().unwrap()],
        ..settings(&github)
    })
    .unwrap();
    let report = redelivery.run_once().await.unwrap();
    assert_eq!(report.redelivered, ["g-org"]);
    let attempts = github.received_on("POST", "/attempts");
    assert_eq!(attempts[0].path, "/orgs/acme/hooks/7/deliveries/3/attempts");
    assert_eq!(github.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn a_refused_redelivery_is_asked_again_next_time() {
    let github = FakeGitHub::start().await;
    github.state().hooks.insert(
        HOOK.into(),
        vec![vec![delivery(9, "g-lost", 503, 5, false)]],
    );
    let redelivery = Redelivery::new(&GitHubSettings {
        hooks: vec!["acme/deploy:42".parse().unwrap()],
        ..settings(&github)
    })
    .unwrap();
    // The listing answers, the redelivery is refused.
    github.fail_next([Fault::Delay(Duration::ZERO), Fault::Status(422)]);
    let report = redelivery.run_once().await.unwrap();
    assert_eq!(report.not_redelivered, ["g-lost"]);
    assert!(report.redelivered.is_empty());

    let report = redelivery.run_once().await.unwrap();
    assert_eq!(report.redelivered, ["g-lost"]);
    assert_eq!(github.received_on("POST", "/attempts").len(), 2);
}

#[tokio::test]
async fn an_unknown_hook_is_a_clear_error() {
    let github = FakeGitHub::start().await;
    github.state().hooks.insert(
        HOOK.into(),
        vec![vec![delivery(9, "g-lost", 503, 5, false)]],
    );
    let redelivery = Redelivery::new(&GitHubSettings {
        hooks: vec![
            "acme/deploy:999".parse().unwrap(),
            "acme/deploy:42".parse().unwrap(),
        ],
        ..settings(&github)
    })
    .unwrap();
    let error = redelivery.run_once().await.unwrap_err();

    assert!(
        matches!(error, GitHubError::HookNotFound { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("acme/deploy:999"), "{error}");
    // Not retried, and the other hook is still recovered.
    assert_eq!(github.received_on("GET", "/hooks/999/deliveries").len(), 1);
    assert_eq!(github.received_on("POST", "/attempts").len(), 1);
}

#[tokio::test]
async fn run_recovers_at_start_up_and_stops_on_shutdown() {
    let github = FakeGitHub::start().await;
    github.state().hooks.insert(
        HOOK.into(),
        vec![vec![delivery(9, "g-lost", 503, 5, false)]],
    );
    let redelivery = Redelivery::new(&GitHubSettings {
        hooks: vec!["acme/deploy:42".parse().unwrap()],
        ..settings(&github)
    })
    .unwrap();
    let (stop, shutdown) = watch::channel(false);
    let task = tokio::spawn(redelivery.run(shutdown));
    eventually("the start-up redelivery", || {
        !github.received_on("POST", "/attempts").is_empty()
    })
    .await;
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("run stops on shutdown")
        .unwrap();
}

#[test]
fn failed_events_are_those_with_no_successful_attempt() {
    let at = |minutes: i64| Timestamp::now() - jiff::SignedDuration::from_mins(minutes);
    let parse = |value: Value| serde_json::from_value::<Delivery>(value).unwrap();
    let deliveries = vec![
        (at(1), parse(delivery(5, "b", 500, 1, true))),
        (at(2), parse(delivery(4, "a", 0, 2, true))),
        (at(3), parse(delivery(3, "b", 500, 3, false))),
        (at(4), parse(delivery(2, "a", 502, 4, false))),
        (at(5), parse(delivery(1, "c", 204, 5, false))),
    ];
    let failed: Vec<u64> = failed_deliveries(&deliveries)
        .iter()
        .map(|delivery| delivery.id)
        .collect();
    // Oldest event first, each by its latest attempt.
    assert_eq!(failed, [4, 5]);
}

#[tokio::test]
async fn settings_are_checked() {
    let base = GitHubSettings {
        token: TOKEN.into(),
        ..GitHubSettings::default()
    };
    for api_url in [
        "ftp://ghe.example.com",
        "not a url",
        "https://ghe/?q=1",
        "/api/v3",
    ] {
        let settings = GitHubSettings {
            api_url: api_url.into(),
            ..base.clone()
        };
        assert!(
            matches!(
                CommitStatuses::new(&settings),
                Err(GitHubError::InvalidSettings(_))
            ),
            "{api_url}"
        );
    }
    assert!(matches!(
        Redelivery::new(&base),
        Err(GitHubError::InvalidSettings(_))
    ));
    let statuses = CommitStatuses::new(&GitHubSettings {
        token: format!("{TOKEN}\n"),
        api_url: "https://ghe.example.com/api/v3/".into(),
        ..base.clone()
    })
    .unwrap();
    assert_eq!(statuses.api_url(), "https://ghe.example.com/api/v3");
}

#[test]
fn clients_need_a_runtime() {
    let settings = GitHubSettings {
        token: TOKEN.into(),
        ..GitHubSettings::default()
    };
    assert!(matches!(
        CommitStatuses::new(&settings),
        Err(GitHubError::NoRuntime)
    ));
}

#[tokio::test]
async fn statuses_for_an_application() {
    let statuses = CommitStatuses::new(&GitHubSettings {
        token: TOKEN.into(),
        ..GitHubSettings::default()
    })
    .unwrap();
    let mut app = Application::new(
        "web",
        crate::api::ApplicationSpec {
            source: crate::api::Source {
                repo_url: "git@github.com:acme/deploy.git".into(),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    app.metadata.namespace = Some("team-a".into());
    let status = statuses
        .status_for(&app, SHA, State::Pending, "syncing")
        .unwrap();
    assert_eq!(
        status,
        CommitStatus {
            owner: "acme".into(),
            repo: "deploy".into(),
            sha: SHA.into(),
            state: State::Pending,
            context: "setpoint/team-a/web".into(),
            description: "syncing".into(),
            target_url: None,
        }
    );
    app.spec.destination.name = Some("staging".into());
    let status = statuses
        .status_for(&app, SHA, State::Success, "synced")
        .unwrap();
    assert_eq!(status.context, "setpoint/team-a/web");
    assert_eq!(status.description, "cluster staging: synced");
    app.spec.destination.name = Some("in-cluster".into());
    let status = statuses
        .status_for(&app, SHA, State::Success, "synced")
        .unwrap();
    assert_eq!(status.description, "synced");
    app.spec.source.repo_url = "https://u:pw@gitlab.com/acme/deploy".into();
    let error = statuses
        .status_for(&app, SHA, State::Pending, "syncing")
        .unwrap_err();
    assert!(matches!(error, GitHubError::NotGitHub { .. }));
    assert!(!error.to_string().contains("pw"), "{error}");
}

/// A head commit for pull request `number`.
fn head_sha(number: u64) -> String {
    format!("{number:040x}")
}

#[tokio::test]
async fn open_pulls_are_listed_through_every_page() {
    let github = FakeGitHub::start().await;
    let pulls: Vec<Value> = (1..=130)
        .rev()
        .map(|n| pull_json(n, &format!("feature-{n}"), "main", &head_sha(n), &[]))
        .collect();
    github.set_pulls("acme/deploy", pulls);
    let client = PullRequests::new(&settings(&github)).unwrap();
    let open = client.list_open("acme", "deploy").await.unwrap();

    let numbers: Vec<u64> = open.iter().map(|pull| pull.number).collect();
    assert_eq!(numbers, (1..=130).rev().collect::<Vec<_>>());
    assert_eq!(open[0].branch, "feature-130");
    assert_eq!(open[129].head_sha, head_sha(1));
    let lists = github.received_on("GET", "/repos/acme/deploy/pulls");
    assert_eq!(lists.len(), 2);
    for list in &lists {
        assert_eq!(list.query("state"), Some("open"));
        assert_eq!(list.query("per_page"), Some("100"));
    }
    assert_eq!(lists[0].query("page"), None);
    assert_eq!(lists[1].query("page"), Some("2"));
    assert_eq!(github.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn open_pulls_keep_branches_sha_and_labels() {
    let github = FakeGitHub::start().await;
    let mut from_fork = pull_json(7, "fix-typo", "release-1.2", SHA, &["preview", "team-a"]);
    from_fork["head"]["repo"] = json!({"full_name": "someone/deploy"});
    let updated_at = from_fork["updated_at"].as_str().unwrap().to_owned();
    github.set_pulls(
        "acme/deploy",
        vec![
            from_fork,
            pull_json(3, "main-fix", "main", &head_sha(3), &[]),
        ],
    );
    let client = PullRequests::new(&settings(&github)).unwrap();
    let open = client.list_open("acme", "deploy").await.unwrap();

    assert_eq!(
        open,
        [
            OpenPull {
                number: 7,
                branch: "fix-typo".into(),
                target_branch: "release-1.2".into(),
                head_sha: SHA.into(),
                labels: vec!["preview".into(), "team-a".into()],
                updated_at: Some(updated_at.clone()),
            },
            OpenPull {
                number: 3,
                branch: "main-fix".into(),
                target_branch: "main".into(),
                head_sha: head_sha(3),
                labels: vec![],
                updated_at: Some(updated_at),
            },
        ]
    );
    // No pull request at all is an empty list, not an error.
    github.set_pulls("acme/empty", vec![]);
    assert_eq!(client.list_open("acme", "empty").await.unwrap(), []);
    assert_eq!(github.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn open_pulls_of_an_unknown_repository_are_an_error_naming_it() {
    let github = FakeGitHub::start().await;
    let client = PullRequests::new(&settings(&github)).unwrap();
    let error = client.list_open("acme", "missing").await.unwrap_err();

    assert_eq!(error.status_code(), Some(404), "{error}");
    assert!(error.to_string().contains("acme/missing"), "{error}");
    assert_eq!(github.received().len(), 1, "a 404 is not retried");
    assert_eq!(github.violations(), Vec::<String>::new());

    let error = client.list_open("acme", "../orgs").await.unwrap_err();
    assert!(matches!(error, GitHubError::InvalidSettings(_)), "{error}");
    assert_eq!(github.received().len(), 1);
}

#[tokio::test]
async fn open_pulls_are_listed_with_the_token() {
    let github = FakeGitHub::start().await;
    github.set_pulls(
        "acme/deploy",
        vec![pull_json(1, "feature", "main", SHA, &[])],
    );
    let client = PullRequests::new(&settings(&github)).unwrap();
    client.list_open("acme", "deploy").await.unwrap();

    let lists = github.received_on("GET", "/pulls");
    assert_eq!(lists.len(), 1);
    assert_eq!(
        lists[0].headers("authorization"),
        [format!("Bearer {TOKEN}")]
    );
    assert_eq!(
        lists[0].header("accept"),
        Some("application/vnd.github+json")
    );
    assert_eq!(lists[0].header("x-github-api-version"), Some(API_VERSION));
    assert!(lists[0].body.is_empty());
    assert_eq!(github.violations(), Vec::<String>::new());
}

#[tokio::test]
async fn listing_open_pulls_retries_a_bad_gateway() {
    let github = FakeGitHub::start().await;
    github.set_pulls(
        "acme/deploy",
        vec![pull_json(1, "feature", "main", SHA, &[])],
    );
    github.fail_next([Fault::Status(502)]);
    let client = PullRequests::new(&settings(&github)).unwrap();
    let open = client.list_open("acme", "deploy").await.unwrap();

    assert_eq!(open.len(), 1);
    assert_eq!(
        github.received_on("GET", "/repos/acme/deploy/pulls").len(),
        2
    );
    assert_eq!(github.violations(), Vec::<String>::new());
}
