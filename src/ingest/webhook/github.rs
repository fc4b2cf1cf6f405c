//! GitHub's side of the webhook: `X-Hub-Signature-256`, `X-GitHub-Event`,
//! `X-GitHub-Delivery` and the `push` payload, brought to a [`Push`].
//!
//! GitHub cuts a push's commit list (at 20 commits where its docs promise
//! it for timeline events, at 2048 for webhook deliveries) without saying so,
//! and lists none for a new branch or tag, so the changed files are trusted
//! only when the list is surely complete.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::route::{Push, is_null_commit};
use super::{CommitFiles, Provider, Reply, WebhookError, WebhookState, changed_files, signature};

const EVENT_HEADER: &str = "X-GitHub-Event";
const DELIVERY_HEADER: &str = "X-GitHub-Delivery";
/// From this many commits on, the list may have been cut: the lower of
/// GitHub's documented limits, since nothing in the payload tells them apart.
const MAX_LISTED_COMMITS: usize = 20;

pub(super) async fn handle(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<WebhookState>,
) -> Result<HttpResponse, WebhookError> {
    let result = receive(&request, payload, &state).await;
    state.finish(Provider::GitHub, &request, result)
}

async fn receive(
    request: &HttpRequest,
    payload: web::Payload,
    state: &WebhookState,
) -> Result<Reply, WebhookError> {
    let settings = state.settings();
    let declared = super::check_head(request, settings.body_limit)?;
    // No secret, no signature or a malformed one: refused before the body.
    let mut verifier = signature::GitHubVerifier::new(
        &settings.github_secrets,
        super::header(request, signature::GITHUB_HEADER),
    )?;
    let body = super::read_body(
        state,
        Provider::GitHub,
        declared,
        payload,
        Some(&mut verifier),
    )
    .await?;
    verifier.verify()?;
    let body = &body.bytes;
    let event = super::header(request, EVENT_HEADER).filter(|event| !event.is_empty());
    let delivery = super::header(request, DELIVERY_HEADER).filter(|id| !id.is_empty());
    match event.ok_or(WebhookError::MissingHeader(EVENT_HEADER))? {
        "ping" => return Ok(Reply::Pong),
        "push" => {}
        "pull_request" => {
            // The ApplicationSets listing this repository's pull requests
            // hear of every action (opened, pushed to, labelled, closed).
            let sets = match pull_change(body)? {
                Some(change) => {
                    state
                        .enqueue_pull_sets(Provider::GitHub, delivery, change, body)
                        .await?
                }
                None => Vec::new(),
            };
            return match parse_pull_request(body, delivery)? {
                PullRequestEvent::Preview(pull) => {
                    state
                        .enqueue_preview(Provider::GitHub, delivery, *pull, body)
                        .await
                }
                PullRequestEvent::Ignored(_) if !sets.is_empty() => Ok(Reply::Accepted(sets)),
                PullRequestEvent::Ignored(action) => Ok(Reply::Ignored(format!(
                    "pull_request ({})",
                    super::echo(&action)
                ))),
            };
        }
        other => return Ok(Reply::Ignored(super::echo(other))),
    }
    let push = parse_push(body)?;
    super::recent::remember(request, delivery, &push);
    state.enqueue(Provider::GitHub, delivery, &push, body).await
}

/// The fields of GitHub's push payload that routing needs.
#[derive(Debug, Deserialize)]
struct PushPayload {
    #[serde(rename = "ref")]
    git_ref: String,
    after: String,
    created: Option<bool>,
    deleted: Option<bool>,
    forced: Option<bool>,
    commits: Option<Vec<CommitFiles>>,
    repository: Repository,
}

#[derive(Debug, Deserialize)]
struct Repository {
    clone_url: Option<String>,
    ssh_url: Option<String>,
    html_url: Option<String>,
    git_url: Option<String>,
    url: Option<String>,
    default_branch: Option<String>,
    /// The older name of `default_branch`, still sent in push payloads.
    master_branch: Option<String>,
}

impl Repository {
    /// Its clone, SSH, web, git and API URLs, taken out of it (the branch
    /// fields stay).
    fn urls(&mut self) -> Result<Vec<String>, WebhookError> {
        super::repository_urls(
            [
                self.clone_url.take(),
                self.ssh_url.take(),
                self.html_url.take(),
                self.git_url.take(),
                self.url.take(),
            ],
            "repository",
        )
    }
}

/// The fields of GitHub's `pull_request` payload a preview needs.
#[derive(Debug, Deserialize)]
struct PullRequestPayload {
    action: String,
    number: u64,
    pull_request: PullRequestFields,
    repository: Repository,
}

#[derive(Debug, Deserialize)]
struct PullRequestFields {
    head: Branch,
    base: Branch,
    #[serde(default)]
    updated_at: Option<String>,
    /// `open` or `closed`.
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    labels: Vec<Label>,
}

#[derive(Debug, Deserialize)]
struct Label {
    name: String,
}

/// What a `pull_request` delivery tells the ApplicationSets' pull request
/// generators; None for a delivery that names no base repository.
fn pull_change(body: &[u8]) -> Result<Option<crate::event::PullChange>, WebhookError> {
    let payload: PullRequestPayload = super::payload_from(super::parse_json(body)?)?;
    let fields = payload.pull_request;
    super::check_commit("pull_request.head.sha", &fields.head.sha)?;
    let Some(project) = fields.base.repo.map(|r| r.full_name) else {
        return Ok(None);
    };
    let open = payload.action != "closed" && fields.state.as_deref() != Some("closed");
    Ok(Some(crate::event::PullChange {
        provider: "github".into(),
        project: super::untrusted::Untrusted::capped(&project, 200).to_string(),
        project_id: None,
        number: payload.number,
        open,
        branch: fields.head.branch,
        target_branch: fields.base.branch,
        head_sha: fields.head.sha,
        labels: fields.labels.into_iter().map(|l| l.name).collect(),
    }))
}

#[derive(Debug, Deserialize)]
struct Branch {
    #[serde(rename = "ref")]
    branch: String,
    sha: String,
    /// Null when the head's fork was deleted.
    repo: Option<BranchRepository>,
}

#[derive(Debug, Deserialize)]
struct BranchRepository {
    full_name: String,
}

/// What a `pull_request` delivery asks for.
pub(super) enum PullRequestEvent {
    /// Opened, pushed to (synchronize) or reopened: preview its head.
    Preview(Box<crate::event::PullRequest>),
    /// Any other action; closing one removes nothing, its previews stop.
    Ignored(String),
}

fn parse_pull_request(
    body: &[u8],
    delivery: Option<&str>,
) -> Result<PullRequestEvent, WebhookError> {
    let payload: PullRequestPayload = super::payload_from(super::parse_json(body)?)?;
    if !matches!(
        payload.action.as_str(),
        "opened" | "synchronize" | "reopened"
    ) {
        return Ok(PullRequestEvent::Ignored(payload.action));
    }
    let fields = payload.pull_request;
    super::check_commit("pull_request.head.sha", &fields.head.sha)?;
    super::check_commit("pull_request.base.sha", &fields.base.sha)?;
    let mut repository = payload.repository;
    let base_name = fields.base.repo.map(|r| r.full_name);
    let project = base_name
        .clone()
        .ok_or_else(|| WebhookError::InvalidPayload("the base has no repository".into()))?;
    let fork = fields.head.repo.map(|r| r.full_name) != base_name;
    let repo_urls = repository.urls()?;
    Ok(PullRequestEvent::Preview(Box::new(
        crate::event::PullRequest {
            provider: "github".into(),
            delivery: delivery.unwrap_or_default().into(),
            repo_urls,
            project,
            number: payload.number,
            base_branch: fields.base.branch,
            default_branch: repository
                .default_branch
                .or(repository.master_branch)
                .filter(|branch| !branch.is_empty()),
            base_sha: Some(fields.base.sha),
            head_sha: fields.head.sha,
            head_ref: format!("refs/pull/{}/head", payload.number),
            fork,
            updated_at: fields.updated_at,
            apps: Vec::new(),
        },
    )))
}

fn parse_push(body: &[u8]) -> Result<Push, WebhookError> {
    let payload: PushPayload = super::payload_from(super::parse_json(body)?)?;
    super::check_commit("after", &payload.after)?;
    let mut repository = payload.repository;
    let repo_urls = repository.urls()?;
    // A forced push may have dropped commits whose files the list does not
    // show, and a new branch or tag is new to every Application following
    // it; neither says all that changed.
    let rewritten = payload.forced.unwrap_or(false) || payload.created.unwrap_or(false);
    let changed_files = match &payload.commits {
        Some(commits)
            if !rewritten && !commits.is_empty() && commits.len() < MAX_LISTED_COMMITS =>
        {
            changed_files(commits)
        }
        _ => None,
    };
    Ok(Push {
        repo_urls,
        case_insensitive: true,
        git_ref: payload.git_ref,
        deleted: payload.deleted.unwrap_or(false) || is_null_commit(&payload.after),
        commit: payload.after,
        default_branch: repository
            .default_branch
            .or(repository.master_branch)
            .filter(|branch| !branch.is_empty()),
        changed_files,
    })
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::json;

    use super::*;
    use crate::ingest::webhook::tests::github_push;

    fn parse(value: serde_json::Value) -> Push {
        parse_push(value.to_string().as_bytes()).unwrap()
    }

    /// A `pull_request` delivery as GitHub documents it, trimmed.
    pub(crate) fn github_pull_request(action: &str, head_repo: &str) -> serde_json::Value {
        json!({
            "action": action,
            "number": 12,
            "pull_request": {
                "number": 12,
                "state": "open",
                "head": {"ref": "feature", "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e",
                         "repo": {"full_name": head_repo}},
                "base": {"ref": "main", "sha": "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c",
                         "repo": {"full_name": "octo-org/deploy"}}
            },
            "repository": {
                "full_name": "octo-org/deploy",
                "clone_url": "https://github.com/octo-org/deploy.git",
                "default_branch": "main"
            }
        })
    }

    #[test]
    fn opened_synchronize_and_reopened_pull_requests_are_previewed() {
        for action in ["opened", "synchronize", "reopened"] {
            let body = github_pull_request(action, "octo-org/deploy").to_string();
            let PullRequestEvent::Preview(pull) =
                parse_pull_request(body.as_bytes(), Some("d-1")).unwrap()
            else {
                panic!("{action} not previewed");
            };
            assert_eq!(pull.project, "octo-org/deploy");
            assert_eq!(pull.number, 12);
            assert_eq!(pull.base_branch, "main");
            assert_eq!(pull.head_ref, "refs/pull/12/head");
            assert_eq!(pull.head_sha, "6dcb09b5b57875f334f61aebed695e2e4193db5e");
            assert!(!pull.fork);
            assert_eq!(pull.delivery, "d-1");
        }
        let fork = github_pull_request("opened", "someone/deploy").to_string();
        let PullRequestEvent::Preview(pull) = parse_pull_request(fork.as_bytes(), None).unwrap()
        else {
            panic!("not previewed");
        };
        assert!(pull.fork);
    }

    #[test]
    fn every_pull_request_action_tells_the_pull_request_generators() {
        let mut body = github_pull_request("labeled", "octo-org/deploy");
        body["pull_request"]["labels"] = serde_json::json!([{"name": "preview"}]);
        let change = pull_change(body.to_string().as_bytes()).unwrap().unwrap();
        assert!(change.open);
        assert_eq!(change.labels, ["preview"]);
        assert_eq!(change.provider, "github");
        let closed = github_pull_request("closed", "octo-org/deploy").to_string();
        let change = pull_change(closed.as_bytes()).unwrap().unwrap();
        assert!(!change.open);
        assert!(!change.project.is_empty());
    }

    #[test]
    fn other_pull_request_actions_are_ignored() {
        for action in ["closed", "edited", "labeled"] {
            let body = github_pull_request(action, "octo-org/deploy").to_string();
            assert!(matches!(
                parse_pull_request(body.as_bytes(), None).unwrap(),
                PullRequestEvent::Ignored(a) if a == action
            ));
        }
    }

    #[test]
    fn a_documented_push_becomes_a_push() {
        let push = parse(github_push(
            "refs/heads/main",
            &[&["apps/a/deploy.yaml"], &["README.md"]],
        ));
        assert_eq!(push.git_ref, "refs/heads/main");
        assert_eq!(push.commit, "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c");
        assert_eq!(push.default_branch.as_deref(), Some("main"));
        assert!(!push.deleted);
        assert_eq!(
            push.repo_urls,
            [
                "https://github.com/octo-org/deploy.git",
                "git@github.com:octo-org/deploy.git",
                "https://github.com/octo-org/deploy",
                "git://github.com/octo-org/deploy.git",
                "https://github.com/octo-org/deploy",
            ]
        );
        assert_eq!(
            push.changed_files,
            Some(vec![
                "README.md".to_string(),
                "apps/a/deploy.yaml".to_string()
            ])
        );
    }

    #[test]
    fn changed_files_are_the_union_over_commits() {
        let mut payload = github_push("refs/heads/main", &[]);
        payload["commits"] = json!([
            {"id": "1", "added": ["apps/a/new.yaml"], "removed": [], "modified": ["apps/b/x.yaml"]},
            {"id": "2", "added": [], "removed": ["apps/c/old.yaml"], "modified": ["apps/b/x.yaml"]},
        ]);
        assert_eq!(
            parse(payload).changed_files.unwrap(),
            ["apps/a/new.yaml", "apps/b/x.yaml", "apps/c/old.yaml"]
        );
    }

    #[test]
    fn lists_that_may_be_incomplete_are_not_trusted() {
        let files: &[&str] = &["apps/a/x.yaml"];
        // 20 commits: GitHub's cut-off.
        let many = github_push("refs/heads/main", &[files; 20]);
        assert_eq!(parse(many).changed_files, None);
        let nineteen = github_push("refs/heads/main", &[files; 19]);
        assert!(parse(nineteen).changed_files.is_some());
        // No commits, with or without a head commit.
        let mut empty = github_push("refs/heads/main", &[]);
        empty["head_commit"] = json!(null);
        assert_eq!(parse(empty).changed_files, None);
        assert_eq!(
            parse(github_push("refs/heads/main", &[])).changed_files,
            None
        );
        let mut missing = github_push("refs/heads/main", &[files]);
        missing.as_object_mut().unwrap().remove("commits");
        assert_eq!(parse(missing).changed_files, None);
        // Forced and created pushes, even with commits listed.
        for flag in ["forced", "created"] {
            let mut payload = github_push("refs/heads/main", &[files]);
            payload[flag] = json!(true);
            assert_eq!(parse(payload).changed_files, None, "{flag}");
        }
        // A commit without its lists.
        let mut partial = github_push("refs/heads/main", &[files]);
        partial["commits"][0]
            .as_object_mut()
            .unwrap()
            .remove("modified");
        assert_eq!(parse(partial).changed_files, None);
    }

    #[test]
    fn deletions_are_recognized() {
        let mut deleted = github_push("refs/heads/feature", &[]);
        deleted["deleted"] = json!(true);
        deleted["after"] = json!("0000000000000000000000000000000000000000");
        deleted["head_commit"] = json!(null);
        assert!(parse(deleted).deleted);
        let mut zeros_only = github_push("refs/heads/feature", &[]);
        zeros_only["after"] = json!("0000000000000000000000000000000000000000");
        assert!(parse(zeros_only).deleted);
    }

    #[test]
    fn the_older_master_branch_field_is_a_fallback() {
        let mut payload = github_push("refs/heads/trunk", &[]);
        payload["repository"]
            .as_object_mut()
            .unwrap()
            .remove("default_branch");
        payload["repository"]["master_branch"] = json!("trunk");
        assert_eq!(parse(payload).default_branch.as_deref(), Some("trunk"));
    }

    #[test]
    fn missing_or_wrong_fields_are_invalid() {
        let message = |value: serde_json::Value| {
            parse_push(value.to_string().as_bytes())
                .unwrap_err()
                .to_string()
        };
        let mut no_ref = github_push("refs/heads/main", &[]);
        no_ref.as_object_mut().unwrap().remove("ref");
        assert_eq!(message(no_ref), "invalid push payload: missing field `ref`");
        let mut no_repo = github_push("refs/heads/main", &[]);
        no_repo.as_object_mut().unwrap().remove("repository");
        assert_eq!(
            message(no_repo),
            "invalid push payload: missing field `repository`"
        );
        let mut short = github_push("refs/heads/main", &[]);
        short["after"] = json!("0d1a26e");
        assert_eq!(
            message(short),
            "invalid push payload: after is not a full commit id"
        );
        let no_urls = json!({"ref": "refs/heads/main", "after": "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c", "repository": {"name": "deploy"}});
        assert_eq!(
            message(no_urls),
            "invalid push payload: the repository has no URL"
        );
        let wrong_type = json!({"ref": 1, "after": "x", "repository": {}});
        assert!(message(wrong_type).starts_with("invalid push payload: invalid type: integer `1`"));
        assert_eq!(
            parse_push(b"{not json").unwrap_err().to_string(),
            "malformed JSON: key must be a string at line 1 column 2"
        );
    }
}
