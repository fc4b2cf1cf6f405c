//! Report on GitLab, after the sync: a commit status per Application on the
//! commit it synced, beside GitHub's (`report::github`): `running` when the
//! sync starts, then `success` or `failed`, so that GitLab shows the deploy
//! on the commit, its pipeline and its merge request.
//!
//! The same GitLab as previews (`SETPOINT_GITLAB_API_URL`, its token; the
//! `api` scope, Developer role), through its REST API v4
//! (`POST /projects/:id/statuses/:sha`), with octocrab's raw JSON calls and
//! GitLab's `PRIVATE-TOKEN` header as `preview/gitlab.rs` does. A repository
//! is on that GitLab when its host is the API URL's.
//!
//! [`post_status`] posts one status once (the notifications' `gitlab`
//! provider calls it and retries through its queue);
//! [`CommitStatuses`] posts the reconcile's in the background, in order per
//! commit and name, retried with `backoff`, never failing a sync. The token
//! never reaches an error, a log line or a `Debug` output.

use std::fmt;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{StatusCode, Uri};
use octocrab::Octocrab;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};

use crate::report::github::State as GitHubState;
use crate::source::repo_url::normalize_url;

mod statuses;

pub use statuses::{CommitStatus, CommitStatuses};

/// GitLab keeps at most 255 characters of a description, a name or a URL.
const FIELD_LIMIT: usize = 255;
/// Enough of GitLab's error message to say what went wrong.
const MESSAGE_LIMIT: usize = 300;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const TIMEOUT: Duration = Duration::from_secs(30);
/// GitLab's answer to a status set to the state it is in (`running` twice,
/// `pending` twice): nothing is left to do.
const SAME_STATE: &str = "Cannot transition status via";

/// What failed while talking to GitLab. None of them carries the token.
#[derive(Debug, thiserror::Error)]
pub enum GitLabError {
    #[error("invalid GitLab settings: {0}")]
    InvalidSettings(String),
    #[error("invalid commit status for {project}@{sha}: {reason}")]
    InvalidStatus {
        project: String,
        sha: String,
        reason: &'static str,
    },
    #[error("{repo} is not a project on the GitLab of {api_url}")]
    NotGitLab { repo: String, api_url: String },
    #[error("failed to {action}: {source}")]
    Request {
        action: String,
        #[source]
        source: octocrab::Error,
    },
    #[error("failed to {action}: GitLab answered {code}: {message}")]
    Status {
        action: String,
        code: u16,
        message: String,
        /// GitLab's `Retry-After` on a rate limit.
        retry_after: Option<Duration>,
    },
    #[error("the GitLab client must be created inside a Tokio runtime")]
    NoRuntime,
}

impl GitLabError {
    /// The HTTP status GitLab answered, if it answered.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            GitLabError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether trying again later may succeed: a connection that failed, a
    /// server error, a rate limit. Anything else GitLab answered (401, 403,
    /// 404, 400) is final.
    pub fn is_transient(&self) -> bool {
        match self {
            GitLabError::Request { source, .. } => matches!(
                source,
                octocrab::Error::Hyper { .. } | octocrab::Error::Service { .. }
            ),
            GitLabError::Status { code, .. } => *code == 429 || *code >= 500,
            _ => false,
        }
    }

    /// How long GitLab asked to wait before the next request.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            GitLabError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// What a GitLab commit status says (GitLab's `state`; `skipped` is never
/// posted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting to start.
    Pending,
    /// Started: the sync is running.
    Running,
    Success,
    Failed,
    Canceled,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Pending => "pending",
            State::Running => "running",
            State::Success => "success",
            State::Failed => "failed",
            State::Canceled => "canceled",
        })
    }
}

/// The reconcile decides in GitHub's four states (`report::sync_status`);
/// GitLab says each in its own. GitHub's `pending` is a sync that started,
/// GitLab's `running` (its `pending` is a job not started yet, and some
/// GitLab versions refuse `pending` → `success`); a revision at fault and a
/// sync that failed otherwise are both `failed`, the description telling
/// which.
impl From<GitHubState> for State {
    fn from(state: GitHubState) -> State {
        match state {
            GitHubState::Pending => State::Running,
            GitHubState::Success => State::Success,
            GitHubState::Failure | GitHubState::Error => State::Failed,
        }
    }
}

/// The JSON body of `POST /projects/:id/statuses/:sha`.
#[derive(Serialize)]
struct StatusBody<'a> {
    state: State,
    name: &'a str,
    description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_url: Option<&'a str>,
}

/// A project's path (`group/sub/project`) or numeric id as the `:id`
/// segment of an API path: everything but letters, digits and `-_.~`
/// percent-encoded, so `group%2Fsub%2Fproject`.
pub fn project_id(project: &str) -> String {
    const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    utf8_percent_encode(project, SEGMENT).to_string()
}

/// A GitLab namespace or project path component: letters, digits, `-`, `_`
/// and `.`; never `-` alone, which starts GitLab's own routes (`/-/tree`).
fn is_path_component(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= FIELD_LIMIT
        && !matches!(name, "." | ".." | "-")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Where the GitLab whose API is `api_url` is: its host (lowercase) and the
/// relative URL root its web paths start with (`""`, or `gitlab` for
/// `https://HOST/gitlab/api/v4`).
fn gitlab_location(api_url: &str) -> Option<(String, String)> {
    let uri = api_url.trim().parse::<Uri>().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let path = uri.path().trim_end_matches('/');
    let root = path.strip_suffix("/api/v4").unwrap_or("");
    Some((host.to_ascii_lowercase(), root.trim_matches('/').to_owned()))
}

/// The project path (`group/sub/project`) when `repo_url` names a project
/// on the GitLab that `api_url` is the API of; `None` for any other host (no
/// status is posted there). Every spelling the Git source accepts works:
/// `https://`, `ssh://`, scp-like `git@host:group/project`, with or without
/// `.git`, any port (GitLab's SSH port is seldom its API's), any host case.
/// Over http(s) a self-managed GitLab's relative URL root is left out of the
/// path; its SSH URLs have none.
pub fn gitlab_project(repo_url: &str, api_url: &str) -> Option<String> {
    let (gitlab_host, root) = gitlab_location(api_url)?;
    let key = normalize_url(repo_url);
    if key.starts_with("file://") {
        return None;
    }
    let (authority, path) = key.split_once('/')?;
    if strip_port(authority) != gitlab_host {
        return None;
    }
    let path = match root.as_str() {
        "" => path,
        root => path
            .strip_prefix(root)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(path),
    };
    let components: Vec<&str> = path.split('/').collect();
    (components.len() >= 2 && components.iter().all(|c| is_path_component(c)))
        .then(|| path.to_owned())
}

fn strip_port(authority: &str) -> &str {
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// `text` on one line (every run of whitespace, newlines included, becomes
/// one space) and at most 255 characters, with an ellipsis when cut.
fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= FIELD_LIMIT {
        return line;
    }
    let mut cut: String = line.chars().take(FIELD_LIMIT - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}

fn is_commit_id(sha: &str) -> bool {
    matches!(sha.len(), 40 | 64) && sha.bytes().all(|b| b.is_ascii_hexdigit())
}

/// GitLab's `message` (a text, or a field → errors object) or `error`, or
/// the start of the body, on one line.
fn gitlab_message(body: &str) -> String {
    let text = match serde_json::from_str::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(fields)) => {
            match fields.get("message").or(fields.get("error")) {
                Some(serde_json::Value::String(message)) => message.clone(),
                Some(other) => other.to_string(),
                None => body.to_owned(),
            }
        }
        _ if body.trim().is_empty() => "no message".into(),
        _ => body.to_owned(),
    };
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::report::events::truncate(&line, MESSAGE_LIMIT)
}

/// The GitLab REST API v4 with Setpoint's token. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    octocrab: Octocrab,
    /// As configured, without a trailing slash.
    api_url: String,
}

impl fmt::Debug for Client {
    /// The token must not reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("api_url", &self.api_url)
            .finish_non_exhaustive()
    }
}

/// How one post ended well.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Posted {
    Set,
    /// GitLab refused the transition: the status is in that state already.
    AlreadySo,
}

impl Client {
    /// A client of the GitLab at `api_url` (`https://gitlab.com/api/v4`, or
    /// `https://HOST/api/v4`) with `token` (a file's newline trimmed). Must
    /// be called inside a Tokio runtime (octocrab starts a task).
    pub fn new(api_url: &str, token: &str) -> Result<Client, GitLabError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(GitLabError::NoRuntime);
        }
        let invalid = |reason: &str| GitLabError::InvalidSettings(reason.to_owned());
        let token = token.trim();
        if token.is_empty() {
            return Err(invalid("no token"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "the token has characters an HTTP header cannot carry",
            ));
        }
        let api_url = api_url.trim().trim_end_matches('/').to_owned();
        let base = api_url.parse::<Uri>().ok();
        let authority = base
            .as_ref()
            .and_then(Uri::authority)
            .map_or("", |a| a.as_str());
        if authority.contains('@') {
            // Not echoed: it would be a credential.
            return Err(invalid(
                "the api url carries credentials; the token is given on its own",
            ));
        }
        let base = match base {
            Some(base)
                if matches!(base.scheme_str(), Some("https" | "http"))
                    && !authority.is_empty()
                    && base.query().is_none() =>
            {
                base
            }
            _ => {
                return Err(GitLabError::InvalidSettings(format!(
                    "api url {api_url:?} is not an http(s) URL without a query"
                )));
            }
        };
        let request = |source| GitLabError::Request {
            action: "build the GitLab client".into(),
            source,
        };
        let octocrab = Octocrab::builder()
            .base_uri(base)
            .map_err(request)?
            .add_header(
                http::header::HeaderName::from_static("private-token"),
                token.to_owned(),
            )
            .set_connect_timeout(Some(CONNECT_TIMEOUT))
            .set_read_timeout(Some(TIMEOUT))
            .set_write_timeout(Some(TIMEOUT))
            .build()
            .map_err(request)?;
        Ok(Client { octocrab, api_url })
    }

    /// The API URL, as configured.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The project of `repo_url` on this GitLab, if it is on it.
    pub fn project_of(&self, repo_url: &str) -> Option<String> {
        gitlab_project(repo_url, &self.api_url)
    }

    /// One try of `status`, checked first. A status GitLab says is in that
    /// state already is posted.
    pub(crate) async fn send(&self, status: &CommitStatus) -> Result<Posted, GitLabError> {
        let invalid = |reason| GitLabError::InvalidStatus {
            project: status.project.clone(),
            sha: status.sha.clone(),
            reason,
        };
        if status.project.trim().is_empty() || status.project.len() > 4 * FIELD_LIMIT {
            return Err(invalid("not a GitLab project"));
        }
        if !is_commit_id(&status.sha) {
            return Err(invalid("not a full commit id"));
        }
        if status.name.trim().is_empty() || status.name.chars().count() > FIELD_LIMIT {
            return Err(invalid("no name, or one over 255 characters"));
        }
        if let Some(url) = &status.target_url {
            let http = url.parse::<Uri>().is_ok_and(|uri| {
                matches!(uri.scheme_str(), Some("https" | "http")) && uri.authority().is_some()
            });
            if !http || url.chars().count() > FIELD_LIMIT {
                return Err(invalid(
                    "the target url is not an http(s) URL of 255 characters or less",
                ));
            }
        }
        let body = StatusBody {
            state: status.state,
            name: &status.name,
            description: one_line(&status.description),
            target_url: status.target_url.as_deref(),
        };
        let path = format!(
            "/projects/{}/statuses/{}",
            project_id(&status.project),
            status.sha
        );
        let action = format!(
            "post status {} of {} on {}@{}",
            status.state,
            status.name,
            status.project,
            &status.sha[..12]
        );
        let failed = |source| GitLabError::Request {
            action: action.clone(),
            source,
        };
        let response = self
            .octocrab
            ._post(path.as_str(), Some(&body))
            .await
            .map_err(failed)?;
        let code = response.status();
        let retry_after = response
            .headers()
            .get(RETRY_AFTER)
            .and_then(|value| value.to_str().ok())
            .and_then(|seconds| seconds.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = self
            .octocrab
            .body_to_string(response)
            .await
            .map_err(failed)?;
        if code.is_success() {
            tracing::debug!(%action, code = code.as_u16(), "posted commit status");
            return Ok(Posted::Set);
        }
        let message = gitlab_message(&text);
        if code == StatusCode::BAD_REQUEST && message.contains(SAME_STATE) {
            tracing::debug!(%action, %message, "the commit status is in that state already");
            return Ok(Posted::AlreadySo);
        }
        Err(GitLabError::Status {
            action,
            code: code.as_u16(),
            message,
            retry_after,
        })
    }
}

/// Posts one commit status on `sha` of `project` (a `group/project` path or
/// a numeric id), named `name` (GitLab's context; Setpoint's are
/// [`crate::report::github::status_context`]), once: no retry, no background. The
/// description is made one line of at most 255 characters. A status already
/// in `state` (GitLab refuses the transition with a 400) is no error. An
/// error says with [`GitLabError::is_transient`] whether to try again.
pub async fn post_status(
    client: &Client,
    project: &str,
    sha: &str,
    state: State,
    name: &str,
    description: &str,
    target_url: Option<&str>,
) -> Result<(), GitLabError> {
    let status = CommitStatus {
        project: project.to_owned(),
        sha: sha.to_owned(),
        state,
        name: name.to_owned(),
        description: description.to_owned(),
        target_url: target_url.map(str::to_owned),
    };
    client.send(&status).await.map(|_| ())
}

// The fake GitLab (`tests/support/gitlab.rs`, shared with the integration
// tests) is included once, by the previews' client.
#[cfg(test)]
use crate::preview::gitlab::fake;

#[cfg(test)]
mod tests;
