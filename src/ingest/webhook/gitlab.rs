//! GitLab's side of the webhook: `X-Gitlab-Token`, `X-Gitlab-Event`, the
//! delivery's idempotency key and the push and tag push payloads (from a
//! project hook, or from a system hook, which sends the same payload), brought
//! to a [`Push`].
//!
//! GitLab lists at most 20 commits but says how many there were
//! (`total_commits_count`), so a cut list is recognized as such.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Deserialize;

use super::route::{Push, is_null_commit};
use super::{CommitFiles, Provider, Reply, WebhookError, WebhookState, changed_files, signature};

const EVENT_HEADER: &str = "X-Gitlab-Event";
/// The same on every retry of one delivery (GitLab 17.4 and later).
const IDEMPOTENCY_HEADER: &str = "Idempotency-Key";
/// Identifies the event; what older GitLab versions offer instead.
const EVENT_UUID_HEADER: &str = "X-Gitlab-Event-UUID";

pub(super) async fn handle(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<WebhookState>,
) -> Result<HttpResponse, WebhookError> {
    let result = receive(&request, payload, &state).await;
    state.finish(Provider::GitLab, &request, result)
}

async fn receive(
    request: &HttpRequest,
    payload: web::Payload,
    state: &WebhookState,
) -> Result<Reply, WebhookError> {
    let settings = state.settings();
    let declared = super::check_head(request, settings.gitlab_body_limit)?;
    // The token is a header: checked before a byte of the body is read.
    signature::verify_gitlab(
        &settings.gitlab_tokens,
        super::header(request, signature::GITLAB_HEADER),
    )?;
    let body = super::read_body(state, Provider::GitLab, declared, payload, None).await?;
    let body = &body.bytes;
    let event = super::header(request, EVENT_HEADER)
        .filter(|event| !event.is_empty())
        .ok_or(WebhookError::MissingHeader(EVENT_HEADER))?;
    let parsed = match event {
        "Push Hook" | "Tag Push Hook" => None,
        "Merge Request Hook" => {
            let delivery = [IDEMPOTENCY_HEADER, EVENT_UUID_HEADER]
                .into_iter()
                .find_map(|name| super::header(request, name).filter(|id| !id.is_empty()));
            let value = super::parse_json(body)?;
            // The ApplicationSets listing this project's merge requests
            // hear of every action (opened, updated, closed, merged).
            let sets = match merge_change(value.clone())? {
                Some(change) => {
                    state
                        .enqueue_pull_sets(Provider::GitLab, delivery, change, body)
                        .await?
                }
                None => Vec::new(),
            };
            return match merge_request_from(value, delivery)? {
                MergeRequestEvent::Preview(pull) => {
                    state
                        .enqueue_preview(Provider::GitLab, delivery, *pull, body)
                        .await
                }
                MergeRequestEvent::Ignored(_) if !sets.is_empty() => Ok(Reply::Accepted(sets)),
                MergeRequestEvent::Ignored(action) => Ok(Reply::Ignored(format!(
                    "{event} ({})",
                    super::echo(&action)
                ))),
            };
        }
        // A system hook's kind is in its body.
        "System Hook" => {
            let value = super::parse_json(body)?;
            let kind = value
                .get("object_kind")
                .or_else(|| value.get("event_name"))
                .and_then(|kind| kind.as_str())
                .unwrap_or_default();
            if !matches!(kind, "push" | "tag_push") {
                let ignored = match kind {
                    "" => event.to_owned(),
                    kind => format!("{event} ({})", super::echo(kind)),
                };
                return Ok(Reply::Ignored(ignored));
            }
            Some(value)
        }
        other => return Ok(Reply::Ignored(super::echo(other))),
    };
    let delivery = [IDEMPOTENCY_HEADER, EVENT_UUID_HEADER]
        .into_iter()
        .find_map(|name| super::header(request, name).filter(|id| !id.is_empty()));
    let value = match parsed {
        Some(value) => value,
        None => super::parse_json(body)?,
    };
    let push = push_from(value)?;
    super::recent::remember(request, delivery, &push);
    state.enqueue(Provider::GitLab, delivery, &push, body).await
}

/// The fields of GitLab's push and tag push payloads that routing needs.
#[derive(Debug, Deserialize)]
struct PushPayload {
    #[serde(rename = "ref")]
    git_ref: String,
    before: Option<String>,
    after: String,
    /// The commit, also for an annotated tag, whose `after` is the tag
    /// object; null when the ref was deleted.
    checkout_sha: Option<String>,
    total_commits_count: Option<u64>,
    commits: Option<Vec<CommitFiles>>,
    project: Option<Project>,
    repository: Option<Repository>,
}

#[derive(Debug, Deserialize)]
struct Project {
    git_http_url: Option<String>,
    git_ssh_url: Option<String>,
    web_url: Option<String>,
    http_url: Option<String>,
    ssh_url: Option<String>,
    url: Option<String>,
    default_branch: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Repository {
    git_http_url: Option<String>,
    git_ssh_url: Option<String>,
    homepage: Option<String>,
    url: Option<String>,
}

fn push_from(value: serde_json::Value) -> Result<Push, WebhookError> {
    let payload: PushPayload = super::payload_from(value)?;
    let deleted = is_null_commit(&payload.after);
    let (field, commit) = match payload
        .checkout_sha
        .filter(|sha| !sha.is_empty() && !deleted)
    {
        Some(sha) => ("checkout_sha", sha),
        None => ("after", payload.after),
    };
    super::check_commit(field, &commit)?;

    let (project, repository) = (payload.project, payload.repository);
    let mut repo_urls = Vec::new();
    if let Some(project) = &project {
        repo_urls.extend(
            [
                &project.git_http_url,
                &project.git_ssh_url,
                &project.web_url,
                &project.http_url,
                &project.ssh_url,
                &project.url,
            ]
            .into_iter()
            .flatten()
            .cloned(),
        );
    }
    if let Some(repository) = &repository {
        repo_urls.extend(
            [
                &repository.git_http_url,
                &repository.git_ssh_url,
                &repository.homepage,
                &repository.url,
            ]
            .into_iter()
            .flatten()
            .cloned(),
        );
    }
    repo_urls.retain(|url| !url.trim().is_empty());
    if repo_urls.is_empty() {
        return Err(WebhookError::InvalidPayload(
            "the project has no URL".into(),
        ));
    }

    // A new branch or tag is new to every Application following it, and a
    // list shorter than the count was cut.
    let created = payload.before.as_deref().is_some_and(is_null_commit);
    let changed_files = match &payload.commits {
        Some(commits)
            if !created
                && !commits.is_empty()
                && payload
                    .total_commits_count
                    .is_none_or(|total| total <= commits.len() as u64) =>
        {
            changed_files(commits)
        }
        _ => None,
    };
    Ok(Push {
        repo_urls,
        git_ref: payload.git_ref,
        commit,
        case_insensitive: true,
        default_branch: project
            .and_then(|project| project.default_branch)
            .filter(|branch| !branch.is_empty()),
        deleted,
        changed_files,
    })
}

/// The fields of GitLab's merge request payload a preview needs.
#[derive(Debug, Deserialize)]
struct MergeRequestPayload {
    project: MergeRequestProject,
    object_attributes: MergeRequestAttributes,
}

#[derive(Debug, Deserialize)]
struct MergeRequestProject {
    id: u64,
    git_http_url: Option<String>,
    git_ssh_url: Option<String>,
    web_url: Option<String>,
    http_url: Option<String>,
    ssh_url: Option<String>,
    url: Option<String>,
    default_branch: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MergeRequestAttributes {
    iid: u64,
    target_branch: String,
    source_project_id: Option<u64>,
    target_project_id: Option<u64>,
    #[serde(default)]
    action: Option<String>,
    /// Present on an `update` that pushed commits.
    #[serde(default)]
    oldrev: Option<String>,
    last_commit: LastCommit,
    /// `2026-12-04 17:00:00 UTC` (GitLab's format).
    #[serde(default)]
    updated_at: Option<String>,
}

#[derive(Debug, Deserialize)]
struct LastCommit {
    id: String,
}

/// The fields of a merge request delivery the ApplicationSets' pull
/// request generators need.
#[derive(Debug, Deserialize)]
struct MergeChangePayload {
    project: MergeChangeProject,
    object_attributes: MergeChangeAttributes,
    #[serde(default)]
    labels: Vec<MergeLabel>,
}

#[derive(Debug, Deserialize)]
struct MergeChangeProject {
    id: u64,
    #[serde(default)]
    path_with_namespace: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MergeChangeAttributes {
    iid: u64,
    source_branch: String,
    target_branch: String,
    /// `opened`, `closed`, `merged`, `locked`.
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    action: Option<String>,
    last_commit: LastCommit,
}

#[derive(Debug, Deserialize)]
struct MergeLabel {
    title: String,
}

fn merge_change(
    value: serde_json::Value,
) -> Result<Option<crate::event::PullChange>, WebhookError> {
    let payload: MergeChangePayload = super::payload_from(value)?;
    let attributes = payload.object_attributes;
    super::check_commit(
        "object_attributes.last_commit.id",
        &attributes.last_commit.id,
    )?;
    let closed = matches!(attributes.state.as_deref(), Some("closed" | "merged"))
        || matches!(attributes.action.as_deref(), Some("close" | "merge"));
    let id = payload.project.id.to_string();
    Ok(Some(crate::event::PullChange {
        provider: "gitlab".into(),
        project: payload
            .project
            .path_with_namespace
            .map(|path| super::untrusted::Untrusted::capped(&path, 200).to_string())
            .unwrap_or_else(|| id.clone()),
        project_id: Some(id),
        number: attributes.iid,
        open: !closed,
        branch: attributes.source_branch,
        target_branch: attributes.target_branch,
        head_sha: attributes.last_commit.id,
        labels: payload.labels.into_iter().map(|l| l.title).collect(),
    }))
}

/// What a merge request delivery asks for.
enum MergeRequestEvent {
    /// Opened, reopened, or updated with new commits: preview its head.
    Preview(Box<crate::event::PullRequest>),
    /// Anything else (closed, merged, approved, a title edited).
    Ignored(String),
}

fn merge_request_from(
    value: serde_json::Value,
    delivery: Option<&str>,
) -> Result<MergeRequestEvent, WebhookError> {
    let payload: MergeRequestPayload = super::payload_from(value)?;
    let attributes = payload.object_attributes;
    let action = attributes.action.clone().unwrap_or_default();
    let new_commits = action == "update" && attributes.oldrev.is_some();
    if !(matches!(action.as_str(), "open" | "reopen") || new_commits) {
        return Ok(MergeRequestEvent::Ignored(action));
    }
    super::check_commit(
        "object_attributes.last_commit.id",
        &attributes.last_commit.id,
    )?;
    let project = payload.project;
    let repo_urls = super::repository_urls(
        [
            project.git_http_url,
            project.git_ssh_url,
            project.web_url,
            project.http_url,
            project.ssh_url,
            project.url,
        ],
        "project",
    )?;
    Ok(MergeRequestEvent::Preview(Box::new(
        crate::event::PullRequest {
            provider: "gitlab".into(),
            delivery: delivery.unwrap_or_default().into(),
            repo_urls,
            project: project.id.to_string(),
            number: attributes.iid,
            base_branch: attributes.target_branch,
            default_branch: project.default_branch.filter(|b| !b.is_empty()),
            base_sha: None,
            head_sha: attributes.last_commit.id,
            head_ref: format!("refs/merge-requests/{}/head", attributes.iid),
            fork: attributes.source_project_id != attributes.target_project_id,
            updated_at: attributes.updated_at,
            apps: Vec::new(),
        },
    )))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ingest::webhook::tests::{gitlab_push, gitlab_tag_push};

    fn merge_request(action: &str, oldrev: Option<&str>, source: u64) -> serde_json::Value {
        json!({
            "object_kind": "merge_request",
            "event_type": "merge_request",
            "project": {"id": 14, "git_http_url": "https://gitlab.example.com/group/deploy.git",
                        "default_branch": "main", "path_with_namespace": "group/deploy"},
            "object_attributes": {
                "iid": 3, "target_branch": "main", "source_branch": "feature",
                "source_project_id": source, "target_project_id": 14,
                "action": action, "oldrev": oldrev, "state": "opened",
                "last_commit": {"id": "da1560886d4f094c3e6c9ef40349f7d38b5d27d7"}
            }
        })
    }

    #[test]
    fn every_merge_request_action_tells_the_pull_request_generators() {
        let mut opened = merge_request("open", None, 14);
        opened["labels"] = json!([{"title": "preview"}]);
        let change = merge_change(opened).unwrap().unwrap();
        assert_eq!(change.project, "group/deploy");
        assert_eq!(change.project_id.as_deref(), Some("14"));
        assert_eq!((change.number, change.open), (3, true));
        assert_eq!(change.branch, "feature");
        assert_eq!(change.labels, ["preview"]);
        for action in ["close", "merge"] {
            let change = merge_change(merge_request(action, None, 14))
                .unwrap()
                .unwrap();
            assert!(!change.open, "{action}");
        }
    }

    #[test]
    fn merge_requests_opened_or_given_commits_are_previewed() {
        for (action, oldrev) in [
            ("open", None),
            ("reopen", None),
            ("update", Some("0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c")),
        ] {
            let MergeRequestEvent::Preview(pull) =
                merge_request_from(merge_request(action, oldrev, 14), Some("k")).unwrap()
            else {
                panic!("{action} not previewed");
            };
            assert_eq!(pull.provider, "gitlab");
            assert_eq!(pull.project, "14");
            assert_eq!(pull.number, 3);
            assert_eq!(pull.head_ref, "refs/merge-requests/3/head");
            assert_eq!(pull.head_sha, "da1560886d4f094c3e6c9ef40349f7d38b5d27d7");
            assert!(!pull.fork);
        }
        let MergeRequestEvent::Preview(fork) =
            merge_request_from(merge_request("open", None, 99), None).unwrap()
        else {
            panic!("not previewed");
        };
        assert!(fork.fork);
        // A title edited, a merge, a close: no preview.
        for (action, oldrev) in [("update", None), ("merge", None), ("close", None)] {
            assert!(matches!(
                merge_request_from(merge_request(action, oldrev, 14), None).unwrap(),
                MergeRequestEvent::Ignored(_)
            ));
        }
    }

    fn parse(value: serde_json::Value) -> Push {
        push_from(value).unwrap()
    }

    #[test]
    fn a_documented_push_becomes_a_push() {
        let push = parse(gitlab_push(
            "refs/heads/master",
            &[&["apps/a/x.yaml"], &["CHANGELOG"]],
        ));
        assert_eq!(push.git_ref, "refs/heads/master");
        assert_eq!(push.commit, "da1560886d4f094c3e6c9ef40349f7d38b5d27d7");
        assert_eq!(push.default_branch.as_deref(), Some("master"));
        assert!(!push.deleted);
        assert!(
            push.repo_urls
                .contains(&"http://example.com/mike/diaspora.git".to_string())
        );
        assert!(
            push.repo_urls
                .contains(&"git@example.com:mike/diaspora.git".to_string())
        );
        assert!(
            push.repo_urls
                .contains(&"http://example.com/mike/diaspora".to_string())
        );
        assert_eq!(push.changed_files.unwrap(), ["CHANGELOG", "apps/a/x.yaml"]);
    }

    #[test]
    fn a_tag_push_uses_the_checkout_sha_and_trusts_no_file_list() {
        let push = parse(gitlab_tag_push("refs/tags/v1.0.0"));
        assert_eq!(push.git_ref, "refs/tags/v1.0.0");
        // The commit, not the annotated tag object in `after`.
        assert_eq!(push.commit, "82b3d5ae55f7080f1e6022629cdb57bfae7cccc7");
        assert_eq!(push.changed_files, None);
        assert!(!push.deleted);
    }

    #[test]
    fn lists_that_may_be_incomplete_are_not_trusted() {
        let files: &[&str] = &["apps/a/x.yaml"];
        let mut cut = gitlab_push("refs/heads/master", &[files; 20]);
        cut["total_commits_count"] = json!(25);
        assert_eq!(parse(cut).changed_files, None);
        let mut whole = gitlab_push("refs/heads/master", &[files; 20]);
        whole["total_commits_count"] = json!(20);
        assert!(parse(whole).changed_files.is_some());
        assert_eq!(
            parse(gitlab_push("refs/heads/master", &[])).changed_files,
            None
        );
        let mut created = gitlab_push("refs/heads/feature", &[files]);
        created["before"] = json!("0000000000000000000000000000000000000000");
        assert_eq!(parse(created).changed_files, None);
    }

    #[test]
    fn deletions_are_recognized() {
        let mut deleted = gitlab_push("refs/heads/feature", &[]);
        deleted["after"] = json!("0000000000000000000000000000000000000000");
        deleted["checkout_sha"] = json!(null);
        assert!(parse(deleted).deleted);
    }

    #[test]
    fn the_repository_urls_are_used_without_a_project() {
        let mut payload = gitlab_push("refs/heads/master", &[&["a"]]);
        payload.as_object_mut().unwrap().remove("project");
        let push = parse(payload);
        assert!(
            push.repo_urls
                .contains(&"git@example.com:mike/diaspora.git".to_string())
        );
        // Without the project there is no default branch.
        assert_eq!(push.default_branch, None);
    }

    #[test]
    fn missing_fields_are_invalid() {
        let message = |value| push_from(value).unwrap_err().to_string();
        let mut no_ref = gitlab_push("refs/heads/master", &[]);
        no_ref.as_object_mut().unwrap().remove("ref");
        assert_eq!(message(no_ref), "invalid push payload: missing field `ref`");
        let mut no_urls = gitlab_push("refs/heads/master", &[]);
        no_urls.as_object_mut().unwrap().remove("project");
        no_urls.as_object_mut().unwrap().remove("repository");
        assert_eq!(
            message(no_urls),
            "invalid push payload: the project has no URL"
        );
        let mut bad_sha = gitlab_push("refs/heads/master", &[]);
        bad_sha["checkout_sha"] = json!("nope");
        assert_eq!(
            message(bad_sha),
            "invalid push payload: checkout_sha is not a full commit id"
        );
    }
}
