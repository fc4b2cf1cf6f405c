//! The handlers end to end within the process: real requests through
//! actix's service, the real handlers and the real in-process queue, with
//! payloads shaped like GitHub's and GitLab's documented push events.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix_web::App;
use actix_web::body::MessageBody;
use actix_web::dev::{Service, ServiceResponse};
use actix_web::http::StatusCode;
use actix_web::test::{self, TestRequest};
use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::signature::github_signature;
use super::*;
use crate::logging::tests::Captured;
use crate::queue::memory::MemoryQueue;
use crate::queue::{Delivery, RetryPolicy};

const SECRET: &str = "It's a Secret to Everybody";
const TOKEN: &str = "glpat-webhook-token";
const GITHUB_AFTER: &str = "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c";
const GITLAB_AFTER: &str = "da1560886d4f094c3e6c9ef40349f7d38b5d27d7";
const GITLAB_TAG_COMMIT: &str = "82b3d5ae55f7080f1e6022629cdb57bfae7cccc7";

/// GitHub's documented push event, trimmed, for `octo-org/deploy`; one
/// commit per entry of `commits`, which lists the files it modified.
pub(super) fn github_push(git_ref: &str, commits: &[&[&str]]) -> Value {
    let commits: Vec<Value> = commits
        .iter()
        .enumerate()
        .map(|(i, files)| {
            let id = format!("{:040x}", i + 1);
            json!({
                "id": id,
                "tree_id": "f9d2a07e9488b91af2641b26b9407fe22a451433",
                "distinct": true,
                "message": "Update deploy manifests",
                "timestamp": "2019-05-15T15:20:30Z",
                "url": format!("https://github.com/octo-org/deploy/commit/{id}"),
                "author": {"name": "Codertocat", "email": "21031067+Codertocat@users.noreply.github.com", "username": "Codertocat"},
                "committer": {"name": "GitHub", "email": "noreply@github.com", "username": "web-flow"},
                "added": [],
                "removed": [],
                "modified": files,
            })
        })
        .collect();
    let head_commit = commits.last().cloned().unwrap_or(Value::Null);
    json!({
        "ref": git_ref,
        "before": "6113728f27ae82c7b1a177c8d03f9e96e0adf246",
        "after": GITHUB_AFTER,
        "repository": {
            "id": 186853002,
            "node_id": "MDEwOlJlcG9zaXRvcnkxODY4NTMwMDI=",
            "name": "deploy",
            "full_name": "octo-org/deploy",
            "private": false,
            "owner": {"name": "octo-org", "login": "octo-org", "id": 21031067, "type": "Organization"},
            "html_url": "https://github.com/octo-org/deploy",
            "url": "https://github.com/octo-org/deploy",
            "git_url": "git://github.com/octo-org/deploy.git",
            "ssh_url": "git@github.com:octo-org/deploy.git",
            "clone_url": "https://github.com/octo-org/deploy.git",
            "created_at": 1557933565,
            "pushed_at": 1557933657,
            "default_branch": "main",
            "master_branch": "main",
        },
        "pusher": {"name": "Codertocat", "email": "21031067+Codertocat@users.noreply.github.com"},
        "sender": {"login": "Codertocat", "id": 21031067, "type": "User"},
        "created": false,
        "deleted": false,
        "forced": false,
        "base_ref": null,
        "compare": "https://github.com/octo-org/deploy/compare/6113728f27ae...0d1a26e67d8f",
        "commits": commits,
        "head_commit": head_commit,
    })
}

/// GitLab's documented push event, trimmed, for `mike/diaspora`.
pub(super) fn gitlab_push(git_ref: &str, commits: &[&[&str]]) -> Value {
    let listed: Vec<Value> = commits
        .iter()
        .enumerate()
        .map(|(i, files)| {
            let id = format!("{:040x}", i + 1);
            json!({
                "id": id,
                "message": "Update Catalan translation to e38cb41.",
                "title": "Update Catalan translation to e38cb41.",
                "timestamp": "2011-12-12T14:27:31+02:00",
                "url": format!("http://example.com/mike/diaspora/commit/{id}"),
                "author": {"name": "Jordi Mallach", "email": "jordi@softcatala.org"},
                "added": [],
                "modified": files,
                "removed": [],
            })
        })
        .collect();
    json!({
        "object_kind": "push",
        "event_name": "push",
        "before": "95790bf891e76fee5e1747ab589903a6a1f80f22",
        "after": GITLAB_AFTER,
        "ref": git_ref,
        "ref_protected": true,
        "checkout_sha": GITLAB_AFTER,
        "user_id": 4,
        "user_name": "John Smith",
        "user_username": "jsmith",
        "project_id": 15,
        "project": {
            "id": 15,
            "name": "Diaspora",
            "web_url": "http://example.com/mike/diaspora",
            "git_ssh_url": "git@example.com:mike/diaspora.git",
            "git_http_url": "http://example.com/mike/diaspora.git",
            "namespace": "Mike",
            "visibility_level": 0,
            "path_with_namespace": "mike/diaspora",
            "default_branch": "master",
            "homepage": "http://example.com/mike/diaspora",
            "url": "git@example.com:mike/diaspora.git",
            "ssh_url": "git@example.com:mike/diaspora.git",
            "http_url": "http://example.com/mike/diaspora.git",
        },
        "repository": {
            "name": "Diaspora",
            "url": "git@example.com:mike/diaspora.git",
            "description": "",
            "homepage": "http://example.com/mike/diaspora",
            "git_http_url": "http://example.com/mike/diaspora.git",
            "git_ssh_url": "git@example.com:mike/diaspora.git",
            "visibility_level": 0,
        },
        "commits": listed,
        "total_commits_count": commits.len(),
    })
}

/// GitLab's documented tag push event, trimmed, for an annotated tag: `after`
/// is the tag object, `checkout_sha` the commit it points to.
pub(super) fn gitlab_tag_push(git_ref: &str) -> Value {
    let mut payload = gitlab_push(git_ref, &[]);
    payload["object_kind"] = json!("tag_push");
    payload["event_name"] = json!("tag_push");
    payload["before"] = json!("0000000000000000000000000000000000000000");
    payload["after"] = json!("5937ac0a7beb003549fc5fd26fc247adbce4a52e");
    payload["checkout_sha"] = json!(GITLAB_TAG_COMMIT);
    payload
}

fn app(key: &str, repo_url: &str, revision: Option<&str>, path: Option<&str>) -> AppSource {
    AppSource {
        key: AppKey::parse(key).unwrap(),
        repo_url: repo_url.into(),
        target_revision: revision.map(Into::into),
        path: path.map(Into::into),
        inputs: vec![],
    }
}

fn apps() -> Vec<AppSource> {
    vec![
        // A monorepo on GitHub, spelled three ways.
        app(
            "team/a",
            "https://github.com/octo-org/deploy.git",
            None,
            Some("apps/a"),
        ),
        app(
            "team/b",
            "git@github.com:octo-org/deploy.git",
            Some("main"),
            Some("apps/b"),
        ),
        app(
            "team/root",
            "https://github.com/octo-org/deploy",
            Some("HEAD"),
            None,
        ),
        app(
            "team/staging",
            "https://github.com/octo-org/deploy",
            Some("staging"),
            Some("apps/a"),
        ),
        app(
            "team/release",
            "https://github.com/octo-org/deploy",
            Some("v1.2.0"),
            Some("apps/a"),
        ),
        app(
            "other/elsewhere",
            "https://github.com/octo-org/other",
            None,
            None,
        ),
        // GitLab.
        app(
            "gl/diaspora",
            "http://example.com/mike/diaspora.git",
            None,
            None,
        ),
        app(
            "gl/web",
            "ssh://git@example.com/mike/diaspora",
            Some("v1.0.0"),
            Some("web"),
        ),
        app(
            "gl/feature",
            "git@example.com:mike/diaspora.git",
            Some("feature"),
            Some("web"),
        ),
    ]
}

fn settings() -> WebhookSettings {
    WebhookSettings {
        github_secrets: vec!["the-previous-secret".into(), SECRET.into()],
        gitlab_tokens: vec![TOKEN.into()],
        ..Default::default()
    }
}

/// The webhook's state over a real in-process queue, and that queue's
/// consumer.
struct Fixture {
    state: WebhookState,
    deliveries: mpsc::Receiver<Delivery>,
}

impl Fixture {
    async fn new(settings: WebhookSettings) -> Fixture {
        let queue = MemoryQueue::new(RetryPolicy::default());
        let deliveries = queue.consume(100).await.unwrap();
        let state = WebhookState::new(settings, Arc::new(queue), Arc::new(apps()));
        Fixture { state, deliveries }
    }

    /// Every event on the queue (each acknowledged), once none arrives for a
    /// moment: publishing finished before the response, so they are all
    /// there already.
    async fn enqueued(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Ok(Some(delivery)) =
            tokio::time::timeout(Duration::from_millis(100), self.deliveries.recv()).await
        {
            events.push(delivery.event.clone());
            delivery.ack().await.unwrap();
        }
        events
    }

    fn outcome(&self, provider: &str, outcome: &str) -> u64 {
        self.state
            .outcomes()
            .into_iter()
            .find(|(p, o, _)| *p == provider && *o == outcome)
            .map(|(_, _, count)| count)
            .unwrap()
    }
}

fn keys(events: &[Event]) -> Vec<String> {
    let mut keys: Vec<String> = events.iter().map(|event| event.app.to_string()).collect();
    keys.sort();
    keys
}

fn github_request(event: &str, delivery: &str, body: &[u8]) -> TestRequest {
    TestRequest::post()
        .uri("/api/webhooks/github")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-GitHub-Event", event))
        .insert_header(("X-GitHub-Delivery", delivery))
        .insert_header(("X-Hub-Signature-256", github_signature(SECRET, body)))
        .insert_header(("User-Agent", "GitHub-Hookshot/044aadd"))
        .set_payload(body.to_vec())
}

fn gitlab_request(event: &str, body: &[u8]) -> TestRequest {
    TestRequest::post()
        .uri("/api/webhooks/gitlab")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-Gitlab-Event", event))
        .insert_header(("X-Gitlab-Token", TOKEN))
        .set_payload(body.to_vec())
}

fn bytes(payload: &Value) -> Vec<u8> {
    serde_json::to_vec(payload).unwrap()
}

async fn call<S, R, B>(app: &S, request: R) -> (StatusCode, Value)
where
    S: Service<R, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody,
{
    let response = test::call_service(app, request).await;
    let status = response.status();
    let body = test::read_body(response).await;
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, body)
}

macro_rules! service {
    ($fixture:expr) => {
        test::init_service(App::new().configure(|cfg| configure(cfg, $fixture.state.clone()))).await
    };
}

#[actix_web::test]
async fn a_signed_push_enqueues_exactly_the_matching_apps() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&github_push(
        "refs/heads/main",
        &[&["apps/a/deployment.yaml"]],
    ));
    let (status, reply) = call(&app, github_request("push", "d-1", &body).to_request()).await;

    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"enqueued": ["team/a", "team/root"]}));
    let events = fx.enqueued().await;
    assert_eq!(keys(&events), ["team/a", "team/root"]);
    for event in &events {
        assert_eq!(
            event.cause,
            Cause::Webhook {
                provider: "github".into(),
                delivery: "d-1".into(),
                // What routed the push, named for the Synced Event.
                input: Some("apps/a/deployment.yaml".into()),
            }
        );
        assert_eq!(event.revision.as_deref(), Some(GITHUB_AFTER));
        assert_eq!(event.attempt, 0);
    }
    assert_eq!(fx.outcome("github", "accepted"), 1);
}

#[actix_web::test]
async fn monorepo_apps_are_enqueued_by_path() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&github_push(
        "refs/heads/main",
        &[&["apps/b/service.yaml"], &["README.md"]],
    ));
    let (status, reply) = call(&app, github_request("push", "d-b", &body).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"enqueued": ["team/b", "team/root"]}));
    assert_eq!(keys(&fx.enqueued().await), ["team/b", "team/root"]);
}

#[actix_web::test]
async fn a_push_with_a_cut_commit_list_enqueues_every_app_of_the_revision() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let files: &[&str] = &["docs/index.md"];
    let body = bytes(&github_push("refs/heads/main", &[files; 20]));
    let (status, _) = call(&app, github_request("push", "d-many", &body).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        keys(&fx.enqueued().await),
        ["team/a", "team/b", "team/root"]
    );
}

#[actix_web::test]
async fn tags_and_other_branches_reach_their_apps() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let mut tag = github_push("refs/tags/v1.2.0", &[]);
    tag["created"] = json!(true);
    let (_, reply) = call(
        &app,
        github_request("push", "d-tag", &bytes(&tag)).to_request(),
    )
    .await;
    assert_eq!(reply, json!({"enqueued": ["team/release"]}));
    let staging = github_push("refs/heads/staging", &[&["apps/a/x.yaml"]]);
    let (_, reply) = call(
        &app,
        github_request("push", "d-staging", &bytes(&staging)).to_request(),
    )
    .await;
    assert_eq!(reply, json!({"enqueued": ["team/staging"]}));
    assert_eq!(keys(&fx.enqueued().await), ["team/release", "team/staging"]);
}

#[actix_web::test]
async fn a_deleted_branch_enqueues_nothing() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let mut deleted = github_push("refs/heads/main", &[]);
    deleted["deleted"] = json!(true);
    deleted["after"] = json!("0000000000000000000000000000000000000000");
    let (status, reply) = call(
        &app,
        github_request("push", "d-del", &bytes(&deleted)).to_request(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"enqueued": []}));
    assert!(fx.enqueued().await.is_empty());
}

#[actix_web::test]
async fn the_previous_secret_still_signs_during_rotation() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&github_push("refs/heads/main", &[&["apps/a/x.yaml"]]));
    let request = github_request("push", "d-rot", &body).insert_header((
        "X-Hub-Signature-256",
        github_signature("the-previous-secret", &body),
    ));
    let (status, _) = call(&app, request.to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(keys(&fx.enqueued().await), ["team/a", "team/root"]);
}

#[actix_web::test]
async fn unsigned_or_badly_signed_pushes_are_refused_and_enqueue_nothing() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&github_push("refs/heads/main", &[&["apps/a/x.yaml"]]));

    let missing = TestRequest::post()
        .uri("/api/webhooks/github")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-GitHub-Event", "push"))
        .insert_header(("X-GitHub-Delivery", "d-unsigned"))
        .set_payload(body.clone());
    let (status, reply) = call(&app, missing.to_request()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reply,
        json!({"error": "missing X-Hub-Signature-256 header"})
    );

    let wrong = github_request("push", "d-wrong", &body)
        .insert_header(("X-Hub-Signature-256", github_signature("a guess", &body)));
    let (status, reply) = call(&app, wrong.to_request()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reply,
        json!({"error": "X-Hub-Signature-256 does not match"})
    );

    // Signed, then changed on the way.
    let mut tampered = github_request("push", "d-tampered", &body);
    let mut changed = body.clone();
    changed.extend_from_slice(b" ");
    tampered = tampered.set_payload(changed);
    let (status, _) = call(&app, tampered.to_request()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let malformed = github_request("push", "d-malformed", &body)
        .insert_header(("X-Hub-Signature-256", "sha1=abc"));
    let (status, reply) = call(&app, malformed.to_request()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!reply.to_string().contains(SECRET));

    assert!(fx.enqueued().await.is_empty());
    assert_eq!(fx.outcome("github", "unauthorized"), 4);
    assert_eq!(fx.outcome("github", "accepted"), 0);
}

#[actix_web::test]
async fn the_signature_is_checked_before_the_body_is_parsed() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let request = github_request("push", "d-junk", b"not json").insert_header((
        "X-Hub-Signature-256",
        github_signature("a guess", b"not json"),
    ));
    let (status, _) = call(&app, request.to_request()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(fx.enqueued().await.is_empty());
}

#[actix_web::test]
async fn no_configured_secret_refuses_everything() {
    let mut fx = Fixture::new(WebhookSettings::default()).await;
    let app = service!(fx);
    let body = bytes(&github_push("refs/heads/main", &[&["apps/a/x.yaml"]]));
    let request = github_request("push", "d-1", &body)
        .insert_header(("X-Hub-Signature-256", github_signature("", &body)));
    let (status, reply) = call(&app, request.to_request()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reply,
        json!({"error": "no GitHub webhook secret is configured"})
    );
    assert!(fx.enqueued().await.is_empty());
}

#[actix_web::test]
async fn pings_and_other_events_enqueue_nothing() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let ping = bytes(
        &json!({"zen": "Design for failure.", "hook_id": 30, "hook": {"type": "Repository", "events": ["push"]}}),
    );
    let (status, reply) = call(&app, github_request("ping", "d-ping", &ping).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"pong": true}));

    let issue = bytes(&json!({"action": "opened", "issue": {"number": 1}}));
    let (status, reply) = call(
        &app,
        github_request("issues", "d-issue", &issue).to_request(),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(reply, json!({"ignored": "issues"}));

    assert!(fx.enqueued().await.is_empty());
    assert_eq!(fx.outcome("github", "ignored"), 2);
}

#[actix_web::test]
async fn a_redelivery_is_not_enqueued_twice() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&github_push("refs/heads/main", &[&["apps/a/x.yaml"]]));
    let (status, _) = call(&app, github_request("push", "d-same", &body).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    let (status, reply) = call(&app, github_request("push", "d-same", &body).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"duplicate": true}));
    assert_eq!(keys(&fx.enqueued().await), ["team/a", "team/root"]);
    assert_eq!(fx.outcome("github", "duplicate"), 1);
}

#[actix_web::test]
async fn a_push_replayed_under_a_new_delivery_id_enqueues_nothing() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let push = github_push("refs/heads/main", &[&["apps/a/x.yaml"]]);
    let body = bytes(&push);
    let (_, reply) = call(&app, github_request("push", "d-1", &body).to_request()).await;
    assert_eq!(reply, json!({"enqueued": ["team/a", "team/root"]}));
    // The signature covers the body, not the delivery id: a captured push
    // sent again under any id.
    for id in ["d-2", "d-3"] {
        let (status, reply) = call(&app, github_request("push", id, &body).to_request()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(reply, json!({"duplicate": true}), "{id}");
    }
    assert_eq!(keys(&fx.enqueued().await), ["team/a", "team/root"]);
    assert_eq!(fx.outcome("github", "duplicate"), 2);

    // The ref moved back and forth is a new push: it moved from elsewhere,
    // and GitHub tells a new push time.
    let mut again = push.clone();
    again["before"] = json!("1111111111111111111111111111111111111111");
    again["repository"]["pushed_at"] = json!(1557933999);
    let (_, reply) = call(
        &app,
        github_request("push", "d-4", &bytes(&again)).to_request(),
    )
    .await;
    assert_eq!(reply, json!({"enqueued": ["team/a", "team/root"]}));
    assert_eq!(fx.enqueued().await.len(), 2);
}

#[actix_web::test]
async fn what_was_accepted_is_forgotten_after_the_replay_window() {
    let mut fx = Fixture::new(WebhookSettings {
        replay_window: Duration::from_millis(300),
        ..settings()
    })
    .await;
    let app = service!(fx);
    let body = bytes(&github_push("refs/heads/main", &[&["README.md"]]));
    let (_, reply) = call(&app, github_request("push", "d-1", &body).to_request()).await;
    assert_eq!(reply, json!({"enqueued": ["team/root"]}));
    let (_, reply) = call(&app, github_request("push", "d-1", &body).to_request()).await;
    assert_eq!(reply, json!({"duplicate": true}));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, reply) = call(&app, github_request("push", "d-1", &body).to_request()).await;
        if reply == json!({"enqueued": ["team/root"]}) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{reply}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(fx.enqueued().await.len(), 2);
}

#[actix_web::test]
async fn a_push_that_reaches_no_application_is_not_remembered() {
    let fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let mut elsewhere = github_push("refs/heads/main", &[&["README.md"]]);
    elsewhere["repository"]["clone_url"] = json!("https://github.com/octo-org/unknown.git");
    for key in ["html_url", "url", "git_url", "ssh_url"] {
        elsewhere["repository"][key] = json!(null);
    }
    let body = bytes(&elsewhere);
    for id in ["d-1", "d-1", "d-2"] {
        let (_, reply) = call(&app, github_request("push", id, &body).to_request()).await;
        assert_eq!(reply, json!({"enqueued": []}), "{id}");
    }
    assert_eq!(fx.outcome("github", "duplicate"), 0);
}

#[actix_web::test]
async fn owner_and_repository_names_match_whatever_their_case() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let mut push = github_push("refs/heads/main", &[&["apps/a/x.yaml"]]);
    for (key, url) in [
        ("clone_url", "https://github.com/Octo-Org/Deploy.git"),
        ("ssh_url", "git@github.com:Octo-Org/Deploy.git"),
        ("html_url", "https://github.com/Octo-Org/Deploy"),
        ("git_url", "git://github.com/Octo-Org/Deploy.git"),
        ("url", "https://github.com/Octo-Org/Deploy"),
    ] {
        push["repository"][key] = json!(url);
    }
    let (_, reply) = call(
        &app,
        github_request("push", "d-case", &bytes(&push)).to_request(),
    )
    .await;
    assert_eq!(reply, json!({"enqueued": ["team/a", "team/root"]}));

    // A self-managed GitLab's names too: the push came from its webhook.
    let mut gitlab = gitlab_push("refs/heads/master", &[&["CHANGELOG"]]);
    gitlab["project"]["git_http_url"] = json!("http://example.com/MIKE/Diaspora.git");
    gitlab["project"]["web_url"] = json!("http://example.com/MIKE/Diaspora");
    for key in ["git_ssh_url", "http_url", "ssh_url", "url", "homepage"] {
        gitlab["project"][key] = json!(null);
    }
    gitlab.as_object_mut().unwrap().remove("repository");
    let (_, reply) = call(
        &app,
        gitlab_request("Push Hook", &bytes(&gitlab)).to_request(),
    )
    .await;
    assert_eq!(reply, json!({"enqueued": ["gl/diaspora"]}));
    assert_eq!(fx.enqueued().await.len(), 3);
}

#[actix_web::test]
async fn a_body_over_the_limit_is_refused() {
    let mut fx = Fixture::new(WebhookSettings {
        body_limit: 1024,
        ..settings()
    })
    .await;
    let app = service!(fx);
    let mut payload = github_push("refs/heads/main", &[&["apps/a/x.yaml"]]);
    payload["padding"] = json!("x".repeat(2048));
    let body = bytes(&payload);
    let (status, reply) = call(&app, github_request("push", "d-big", &body).to_request()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        reply,
        json!({"error": "request body is larger than 1024 bytes"})
    );

    // A length that lies is caught while reading.
    let lying = github_request("push", "d-big", &body).insert_header(("Content-Length", "100"));
    let (status, _) = call(&app, lying.to_request()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    assert!(fx.enqueued().await.is_empty());
    assert_eq!(fx.outcome("github", "too_large"), 2);
}

#[actix_web::test]
async fn only_json_is_accepted() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&github_push("refs/heads/main", &[&["apps/a/x.yaml"]]));
    let plain = github_request("push", "d-1", &body).insert_header(("Content-Type", "text/plain"));
    let (status, reply) = call(&app, plain.to_request()).await;
    assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(
        reply,
        json!({"error": "content type must be application/json, not text/plain"})
    );

    // GitHub's other content type.
    let form = github_request("push", "d-2", &body)
        .insert_header(("Content-Type", "application/x-www-form-urlencoded"));
    assert_eq!(
        call(&app, form.to_request()).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    assert!(fx.enqueued().await.is_empty());
    assert_eq!(fx.outcome("github", "unsupported_media_type"), 2);

    let charset = github_request("push", "d-3", &body)
        .insert_header(("Content-Type", "Application/JSON; charset=utf-8"));
    assert_eq!(call(&app, charset.to_request()).await.0, StatusCode::OK);
    assert_eq!(fx.enqueued().await.len(), 2);
}

#[actix_web::test]
async fn malformed_or_incomplete_payloads_are_bad_requests() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let (status, reply) = call(
        &app,
        github_request("push", "d-1", b"{\"ref\": ").to_request(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply,
        json!({"error": "malformed JSON: EOF while parsing a value at line 1 column 8"})
    );

    let (status, reply) = call(&app, github_request("push", "d-2", b"").to_request()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply,
        json!({"error": "malformed JSON: EOF while parsing a value at line 1 column 0"})
    );

    let mut incomplete = github_push("refs/heads/main", &[]);
    incomplete.as_object_mut().unwrap().remove("after");
    let (status, reply) = call(
        &app,
        github_request("push", "d-3", &bytes(&incomplete)).to_request(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply,
        json!({"error": "invalid push payload: missing field `after`"})
    );

    let no_event = github_request("push", "d-4", b"{}").insert_header(("X-GitHub-Event", ""));
    let no_event = no_event.to_request();
    let (status, reply) = call(&app, no_event).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(reply, json!({"error": "missing X-GitHub-Event header"}));

    // A failed delivery is not remembered: fixed, it goes through.
    let fixed = bytes(&github_push("refs/heads/main", &[&["README.md"]]));
    let (status, _) = call(&app, github_request("push", "d-1", &fixed).to_request()).await;
    assert_eq!(status, StatusCode::OK);

    assert_eq!(keys(&fx.enqueued().await), ["team/root"]);
    assert_eq!(fx.outcome("github", "bad_request"), 4);
}

#[actix_web::test]
async fn only_post_is_routed() {
    let fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let request = TestRequest::get().uri("/api/webhooks/github").to_request();
    let response = test::call_service(&app, request).await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
}

/// A broker that is down until told otherwise, in front of a real queue.
struct Broker {
    down: AtomicBool,
    queue: MemoryQueue,
}

#[async_trait]
impl Queue for Broker {
    async fn publish(&self, event: &Event) -> Result<(), QueueError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(QueueError::Unavailable("connection refused".into()));
        }
        self.queue.publish(event).await
    }

    async fn consume(&self, prefetch: u16) -> Result<mpsc::Receiver<Delivery>, QueueError> {
        self.queue.consume(prefetch).await
    }

    fn is_ready(&self) -> bool {
        !self.down.load(Ordering::SeqCst)
    }
}

#[actix_web::test]
async fn an_unavailable_queue_answers_503_and_the_delivery_can_be_sent_again() {
    let broker = Arc::new(Broker {
        down: AtomicBool::new(true),
        queue: MemoryQueue::new(RetryPolicy::default()),
    });
    let deliveries = broker.consume(100).await.unwrap();
    let state = WebhookState::new(settings(), broker.clone(), Arc::new(apps()));
    let mut fx = Fixture { state, deliveries };
    let app = service!(fx);
    let body = bytes(&github_push("refs/heads/main", &[&["apps/a/x.yaml"]]));

    let (status, reply) = call(&app, github_request("push", "d-1", &body).to_request()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reply,
        json!({"error": "queue unavailable: the queue is unavailable: connection refused"})
    );
    assert!(fx.enqueued().await.is_empty());
    assert_eq!(fx.outcome("github", "unavailable"), 1);

    broker.down.store(false, Ordering::SeqCst);
    let (status, reply) = call(&app, github_request("push", "d-1", &body).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"enqueued": ["team/a", "team/root"]}));
    assert_eq!(keys(&fx.enqueued().await), ["team/a", "team/root"]);
}

#[actix_web::test]
async fn a_gitlab_push_with_the_token_enqueues_the_matching_apps() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&gitlab_push(
        "refs/heads/master",
        &[&["app/controller/application.rb"]],
    ));
    let request = gitlab_request("Push Hook", &body).insert_header((
        "X-Gitlab-Event-UUID",
        "f2b5ea20-3c5e-4f5a-9c8e-0a1b2c3d4e5f",
    ));
    let (status, reply) = call(&app, request.to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"enqueued": ["gl/diaspora"]}));
    let events = fx.enqueued().await;
    assert_eq!(keys(&events), ["gl/diaspora"]);
    assert_eq!(
        events[0].cause,
        Cause::Webhook {
            provider: "gitlab".into(),
            delivery: "f2b5ea20-3c5e-4f5a-9c8e-0a1b2c3d4e5f".into(),
            input: Some("app/controller/application.rb".into()),
        }
    );
    assert_eq!(events[0].revision.as_deref(), Some(GITLAB_AFTER));
    assert_eq!(fx.outcome("gitlab", "accepted"), 1);
    assert_eq!(fx.outcome("github", "accepted"), 0);
}

#[actix_web::test]
async fn a_gitlab_tag_push_reaches_the_apps_on_that_tag() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&gitlab_tag_push("refs/tags/v1.0.0"));
    let (status, reply) = call(&app, gitlab_request("Tag Push Hook", &body).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"enqueued": ["gl/web"]}));
    let events = fx.enqueued().await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].revision.as_deref(), Some(GITLAB_TAG_COMMIT));
    // Without a delivery id there is nothing to deduplicate on.
    assert_eq!(
        events[0].cause,
        Cause::Webhook {
            provider: "gitlab".into(),
            delivery: String::new(),
            input: None,
        }
    );
}

#[actix_web::test]
async fn a_gitlab_system_hook_push_is_routed_and_its_other_kinds_ignored() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&gitlab_push("refs/heads/feature", &[&["web/index.yaml"]]));
    let (status, reply) = call(&app, gitlab_request("System Hook", &body).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(reply, json!({"enqueued": ["gl/feature"]}));

    let created = bytes(
        &json!({"event_name": "project_create", "name": "StoreCloud", "path_with_namespace": "jsmith/storecloud"}),
    );
    let (status, reply) = call(&app, gitlab_request("System Hook", &created).to_request()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(reply, json!({"ignored": "System Hook (project_create)"}));

    let note = bytes(&json!({"object_kind": "note"}));
    let (status, reply) = call(&app, gitlab_request("Note Hook", &note).to_request()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(reply, json!({"ignored": "Note Hook"}));

    assert_eq!(keys(&fx.enqueued().await), ["gl/feature"]);
    assert_eq!(fx.outcome("gitlab", "ignored"), 2);
}

#[actix_web::test]
async fn a_pull_request_is_one_preview_event_naming_the_apps_of_its_base_branch() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&super::github::tests::github_pull_request(
        "opened",
        "octo-org/deploy",
    ));
    let (status, reply) = call(
        &app,
        github_request("pull_request", "pr-1", &body).to_request(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        reply,
        json!({"preview": "github-preview/octo-org:deploy#12", "applications": 3})
    );
    let events = fx.enqueued().await;
    assert_eq!(keys(&events), ["github-preview/octo-org:deploy#12"]);
    let Cause::Preview(pull) = &events[0].cause else {
        panic!("{:?}", events[0].cause);
    };
    // Those following main (by name or as the default branch), whatever
    // their path: the worker narrows them down to what the diff touches.
    let apps: Vec<String> = pull.apps.iter().map(AppKey::to_string).collect();
    assert_eq!(apps, ["team/a", "team/b", "team/root"]);
    assert_eq!(
        events[0].revision.as_deref(),
        Some("6dcb09b5b57875f334f61aebed695e2e4193db5e")
    );
    // The same delivery again is a duplicate; a closed one is ignored.
    let (_, reply) = call(
        &app,
        github_request("pull_request", "pr-1", &body).to_request(),
    )
    .await;
    assert_eq!(reply, json!({"duplicate": true}));
    let closed = bytes(&super::github::tests::github_pull_request(
        "closed",
        "octo-org/deploy",
    ));
    let (status, reply) = call(
        &app,
        github_request("pull_request", "pr-2", &closed).to_request(),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_eq!(reply, json!({"ignored": "pull_request (closed)"}));
    assert!(fx.enqueued().await.is_empty());
}

#[actix_web::test]
async fn a_wrong_or_missing_gitlab_token_is_refused() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&gitlab_push("refs/heads/master", &[&["a"]]));
    let wrong = gitlab_request("Push Hook", &body).insert_header(("X-Gitlab-Token", "glpat-guess"));
    let (status, reply) = call(&app, wrong.to_request()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply, json!({"error": "X-Gitlab-Token does not match"}));

    let missing = TestRequest::post()
        .uri("/api/webhooks/gitlab")
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("X-Gitlab-Event", "Push Hook"))
        .set_payload(body);
    let (status, reply) = call(&app, missing.to_request()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply, json!({"error": "missing X-Gitlab-Token header"}));
    assert!(!reply.to_string().contains(TOKEN));

    // GitHub's signature is no GitLab token, and the reverse.
    let signed = bytes(&github_push("refs/heads/main", &[&["README.md"]]));
    let crossed = github_request("push", "d-x", &signed)
        .uri("/api/webhooks/gitlab")
        .insert_header(("X-Gitlab-Event", "Push Hook"));
    assert_eq!(
        call(&app, crossed.to_request()).await.0,
        StatusCode::UNAUTHORIZED
    );
    let crossed = gitlab_request("Push Hook", &signed)
        .uri("/api/webhooks/github")
        .insert_header(("X-GitHub-Event", "push"));
    assert_eq!(
        call(&app, crossed.to_request()).await.0,
        StatusCode::UNAUTHORIZED
    );

    assert!(fx.enqueued().await.is_empty());
    assert_eq!(fx.outcome("gitlab", "unauthorized"), 3);
}

#[actix_web::test]
async fn gitlab_redeliveries_are_recognized_by_their_idempotency_key() {
    let mut fx = Fixture::new(settings()).await;
    let app = service!(fx);
    let body = bytes(&gitlab_push("refs/heads/master", &[&["CHANGELOG"]]));
    // A retry keeps its Idempotency-Key; the key wins over the event UUID.
    for uuid in ["uuid-1", "uuid-2"] {
        let request = gitlab_request("Push Hook", &body)
            .insert_header(("Idempotency-Key", "key-1"))
            .insert_header(("X-Gitlab-Event-UUID", uuid));
        call(&app, request.to_request()).await;
    }
    // Without a key, the event UUID (of another push).
    let mut other = gitlab_push("refs/heads/master", &[&["CHANGELOG"]]);
    other["before"] = json!("1111111111111111111111111111111111111111");
    let body = bytes(&other);
    for _ in 0..2 {
        let request =
            gitlab_request("Push Hook", &body).insert_header(("X-Gitlab-Event-UUID", "uuid-3"));
        call(&app, request.to_request()).await;
    }
    let events = fx.enqueued().await;
    let deliveries: Vec<_> = events
        .iter()
        .map(|event| match &event.cause {
            Cause::Webhook { delivery, .. } => delivery.as_str(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(deliveries, ["key-1", "uuid-3"]);
    assert_eq!(fx.outcome("gitlab", "duplicate"), 2);
}

#[actix_web::test]
async fn gitlab_rejections_share_the_checks() {
    let mut fx = Fixture::new(WebhookSettings {
        gitlab_body_limit: 512,
        ..settings()
    })
    .await;
    let app = service!(fx);
    let big = bytes(&gitlab_push("refs/heads/master", &[&["CHANGELOG"]]));
    let (status, _) = call(&app, gitlab_request("Push Hook", &big).to_request()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let plain = gitlab_request("Push Hook", b"{}").insert_header(("Content-Type", "text/plain"));
    assert_eq!(
        call(&app, plain.to_request()).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let (status, reply) = call(&app, gitlab_request("Push Hook", b"[1,").to_request()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .starts_with("malformed JSON: "),
        "{reply}"
    );
    let (status, reply) = call(&app, gitlab_request("Push Hook", b"{}").to_request()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply,
        json!({"error": "invalid push payload: missing field `ref`"})
    );
    assert!(fx.enqueued().await.is_empty());
    let counts: Vec<(&str, u64)> = ["too_large", "unsupported_media_type", "bad_request"]
        .into_iter()
        .map(|outcome| (outcome, fx.outcome("gitlab", outcome)))
        .collect();
    assert_eq!(
        counts,
        [
            ("too_large", 1),
            ("unsupported_media_type", 1),
            ("bad_request", 2)
        ]
    );
}

#[test]
fn outcomes_list_every_provider_and_outcome() {
    let state = WebhookState::new(
        settings(),
        Arc::new(MemoryQueue::new(RetryPolicy::default())),
        Arc::new(Vec::<AppSource>::new()),
    );
    let outcomes = state.outcomes();
    assert_eq!(outcomes.len(), 20);
    assert!(outcomes.iter().all(|(_, _, count)| *count == 0));
    assert!(outcomes.contains(&("gitlab", "unsupported_media_type", 0)));
}

#[test]
fn settings_debug_redacts_the_secrets() {
    let debug = format!(
        "{:?}",
        WebhookState::new(
            settings(),
            Arc::new(MemoryQueue::new(RetryPolicy::default())),
            Arc::new(Vec::<AppSource>::new()),
        )
    );
    assert!(!debug.contains(SECRET), "{debug}");
    assert!(!debug.contains(TOKEN), "{debug}");
    assert!(debug.contains("<2 redacted>"), "{debug}");
}

#[actix_web::test]
async fn bodies_over_the_bytes_in_flight_answer_503_with_retry_after() {
    let mut fx = Fixture::new(WebhookSettings {
        in_flight_limit: 2048,
        ..settings()
    })
    .await;
    let app = service!(fx);
    let mut large = github_push("refs/heads/main", &[&["apps/a/x.yaml"]]);
    large["padding"] = json!("x".repeat(4096));
    let response = test::call_service(
        &app,
        github_request("push", "d-big", &bytes(&large)).to_request(),
    )
    .await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers().get("Retry-After").unwrap(), "5");
    let reply: Value = serde_json::from_slice(&test::read_body(response).await).unwrap();
    assert_eq!(
        reply,
        json!({"error": "too many request bodies are being read (over 2048 bytes); retry later"})
    );
    // What it held is given back: a body within the limit goes through.
    let small = bytes(&github_push("refs/heads/main", &[&["README.md"]]));
    assert!(small.len() < 2048, "{}", small.len());
    let (status, _) = call(&app, github_request("push", "d-small", &small).to_request()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(fx.state.0.in_flight.held(), 0);
    assert_eq!(fx.outcome("github", "busy"), 1);
    assert_eq!(keys(&fx.enqueued().await), ["team/root"]);
}

#[actix_web::test]
async fn request_values_reach_the_log_escaped_and_capped_in_both_formats() {
    const FORGED: &str = "2026-12-03T13:00:00.000000Z  INFO setpoint::worker: FORGED";
    for json in [false, true] {
        let captured = Captured::default();
        let writer = {
            let captured = captured.clone();
            move || captured.clone()
        };
        let subscriber = crate::logging::subscriber(
            tracing_subscriber::EnvFilter::new("info"),
            json,
            false,
            writer,
        );
        let guard = tracing::subscriber::set_default(subscriber);
        let mut fx = Fixture::new(settings()).await;
        let app = service!(fx);
        // A signed push whose ref carries a line of its own.
        let forged = github_push(&format!("refs/heads/main\n{FORGED} synced"), &[]);
        let (status, _) = call(
            &app,
            github_request("push", "d-forged", &bytes(&forged)).to_request(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        // A 100,000-character ref, and an error that quotes the payload.
        let long = github_push(&format!("refs/heads/{}", "x".repeat(100_000)), &[]);
        let (status, _) = call(
            &app,
            github_request("push", "d-long", &bytes(&long)).to_request(),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let mut quoted = github_push("refs/heads/main", &[]);
        quoted["created"] = json!(format!("{}\n{FORGED}", "y".repeat(100_000)));
        let (status, _) = call(
            &app,
            github_request("push", "d-quoted", &bytes(&quoted)).to_request(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        drop(guard);
        assert!(fx.enqueued().await.is_empty());

        let log = captured.text();
        let format = if json { "json" } else { "text" };
        assert_eq!(log.lines().count(), 3, "{format}: {log}");
        for line in log.lines() {
            assert!(!line.starts_with(FORGED), "{format}: a forged line: {line}");
            assert!(
                line.len() < 2_000,
                "{format}: a line of {} bytes: {}…",
                line.len(),
                &line[..200]
            );
            if json {
                serde_json::from_str::<Value>(line).unwrap();
            }
        }
        assert!(log.contains("FORGED synced"), "{format}: logged, escaped");
        assert!(log.contains("more bytes)"), "{format}: the cut is said");
    }
}
