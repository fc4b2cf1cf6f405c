//! A preview on GitLab: one note on the merge request, created once and
//! then edited in place (found again by its hidden marker), through the
//! REST API v4 with a token allowed to write notes (`api` scope; a project
//! or group access token with the Reporter role is enough).
//!
//! The same client lists a project's open merge requests for the
//! ApplicationSet pull-request generator (`read_api` scope is enough).
//!
//! The requests go through octocrab's raw JSON calls, the HTTP client
//! Setpoint already carries for GitHub: no GitHub-specific authentication
//! is configured on it, only GitLab's `PRIVATE-TOKEN` header.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http::header::{HeaderMap, HeaderName};
use http_body_util::combinators::BoxBody;
use octocrab::Octocrab;
use serde::{Deserialize, Serialize};

use crate::event::PullRequest;
use crate::report::github::OpenPull;

/// gitlab.com's API; a self-managed GitLab's is `https://HOST/api/v4`.
pub const DEFAULT_API_URL: &str = "https://gitlab.com/api/v4";
/// GitLab's largest page.
const PER_PAGE: u32 = 100;
const MAX_PAGES: usize = 100;
const TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum GitLabError {
    #[error("invalid GitLab settings: {0}")]
    InvalidSettings(String),
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
    },
    #[error("failed to {action}: unexpected answer from GitLab: {reason}")]
    Decode { action: String, reason: String },
}

impl GitLabError {
    /// The HTTP status GitLab answered, if it answered: a caller tells a
    /// missing project (404) or token (401, 403) from an outage by it.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            GitLabError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Merge request notes on one GitLab.
#[derive(Clone)]
pub struct Notes {
    client: Octocrab,
}

impl fmt::Debug for Notes {
    /// The token must not reach a log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Notes").finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Note {
    id: u64,
    #[serde(default)]
    body: Option<String>,
}

/// One item of GitLab's merge request list, the fields [`OpenPull`] keeps.
/// `labels` are names unless `with_labels_details` is asked for.
#[derive(Deserialize)]
struct ListedMergeRequest {
    iid: u64,
    source_branch: String,
    target_branch: String,
    sha: String,
    #[serde(default)]
    labels: Vec<String>,
    #[serde(default)]
    updated_at: Option<String>,
}

impl From<ListedMergeRequest> for OpenPull {
    fn from(merge_request: ListedMergeRequest) -> OpenPull {
        OpenPull {
            number: merge_request.iid,
            branch: merge_request.source_branch,
            target_branch: merge_request.target_branch,
            head_sha: merge_request.sha,
            labels: merge_request.labels,
            updated_at: merge_request.updated_at,
        }
    }
}

/// The page after this one, from GitLab's `x-next-page` (empty on the last
/// page). Without the header (a proxy may drop it) a full page is taken to
/// have a next one, and a short page to be the last.
fn next_page(headers: &HeaderMap, page: usize, listed: usize) -> Option<usize> {
    match headers.get("x-next-page").map(|value| value.to_str()) {
        Some(Ok(next)) => next.trim().parse().ok(),
        Some(Err(_)) => None,
        None => (listed >= PER_PAGE as usize).then_some(page + 1),
    }
}

#[derive(Serialize)]
struct NoteBody<'a> {
    body: &'a str,
}

/// A project id as a path segment: a number as it is, a `group/project`
/// path URL-encoded.
fn project_segment(project: &str) -> String {
    project
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            other => format!("%{other:02X}"),
        })
        .collect()
}

impl Notes {
    pub fn new(api_url: &str, token: &str) -> Result<Notes, GitLabError> {
        let token = token.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(GitLabError::InvalidSettings(
                "the token is empty or has characters a header cannot carry".into(),
            ));
        }
        let base = api_url
            .trim()
            .trim_end_matches('/')
            .parse::<http::Uri>()
            .map_err(|_| GitLabError::InvalidSettings(format!("{api_url:?} is not a URL")))?;
        let request = |source| GitLabError::Request {
            action: "build the GitLab client".into(),
            source,
        };
        let client = Octocrab::builder()
            .base_uri(base)
            .map_err(request)?
            .add_header(HeaderName::from_static("private-token"), token.to_owned())
            .set_connect_timeout(Some(TIMEOUT))
            .set_read_timeout(Some(TIMEOUT))
            .set_write_timeout(Some(TIMEOUT))
            .build()
            .map_err(request)?;
        Ok(Notes { client })
    }

    /// Creates the note on `pull`'s merge request, or edits the one holding
    /// `marker`; with `create` false, only edits one. Returns its id.
    pub async fn upsert(
        &self,
        pull: &PullRequest,
        marker: &str,
        body: &str,
        create: bool,
    ) -> Result<Option<u64>, GitLabError> {
        let notes = format!(
            "/projects/{}/merge_requests/{}/notes",
            project_segment(&pull.project),
            pull.number
        );
        if let Some(note) = self.find(&notes, marker).await? {
            if note.body.as_deref() != Some(body) {
                let path = format!("{notes}/{}", note.id);
                let response = self
                    .client
                    ._put(path.as_str(), Some(&NoteBody { body }))
                    .await;
                self.answer("edit the preview note", response).await?;
            }
            return Ok(Some(note.id));
        }
        if !create {
            return Ok(None);
        }
        let response = self
            .client
            ._post(notes.as_str(), Some(&NoteBody { body }))
            .await;
        let text = self.answer("add the preview note", response).await?;
        let note: Note = serde_json::from_str(&text).map_err(|e| GitLabError::Decode {
            action: "add the preview note".into(),
            reason: e.to_string(),
        })?;
        Ok(Some(note.id))
    }

    async fn find(&self, notes: &str, marker: &str) -> Result<Option<Note>, GitLabError> {
        for page in 1..=MAX_PAGES {
            let path =
                format!("{notes}?sort=asc&order_by=created_at&per_page={PER_PAGE}&page={page}");
            let response = self.client._get(path.as_str()).await;
            let text = self
                .answer("list the merge request's notes", response)
                .await?;
            let listed: Vec<Note> =
                serde_json::from_str(&text).map_err(|e| GitLabError::Decode {
                    action: "list the merge request's notes".into(),
                    reason: e.to_string(),
                })?;
            let last = listed.len() < PER_PAGE as usize;
            if let Some(found) = listed
                .into_iter()
                .find(|n| n.body.as_deref().is_some_and(|b| b.contains(marker)))
            {
                return Ok(Some(found));
            }
            if last {
                break;
            }
        }
        Ok(None)
    }

    /// Every open merge request of `project` (a numeric id or a
    /// `group/project` path), through every page. A listing cut short by
    /// `MAX_PAGES` is an error: a generator given part of the list would
    /// delete the Applications of the rest.
    pub async fn list_open_merge_requests(
        &self,
        project: &str,
    ) -> Result<Vec<OpenPull>, GitLabError> {
        if project.trim().is_empty() {
            return Err(GitLabError::InvalidSettings("an empty project".into()));
        }
        // https://docs.gitlab.com/api/merge_requests/#list-project-merge-requests
        let action = format!("list the open merge requests of {project}");
        let list = format!("/projects/{}/merge_requests", project_segment(project));
        let mut open = Vec::new();
        let mut page = 1;
        for _ in 0..MAX_PAGES {
            let path = format!("{list}?state=opened&per_page={PER_PAGE}&page={page}");
            let response = self.client._get(path.as_str()).await;
            let (headers, text) = self.answer_with_headers(&action, response).await?;
            let listed: Vec<ListedMergeRequest> =
                serde_json::from_str(&text).map_err(|e| GitLabError::Decode {
                    action: action.clone(),
                    reason: e.to_string(),
                })?;
            let count = listed.len();
            open.extend(listed.into_iter().map(OpenPull::from));
            match next_page(&headers, page, count) {
                Some(next) if next > page => page = next,
                _ => return Ok(open),
            }
        }
        Err(GitLabError::Decode {
            action,
            reason: format!("more than {MAX_PAGES} pages of {PER_PAGE}"),
        })
    }

    async fn answer(
        &self,
        action: &str,
        response: octocrab::Result<http::Response<BoxBody<Bytes, octocrab::Error>>>,
    ) -> Result<String, GitLabError> {
        Ok(self.answer_with_headers(action, response).await?.1)
    }

    /// The body of a 2xx answer, with its headers (the pages of a listing).
    async fn answer_with_headers(
        &self,
        action: &str,
        response: octocrab::Result<http::Response<BoxBody<Bytes, octocrab::Error>>>,
    ) -> Result<(HeaderMap, String), GitLabError> {
        let failed = |source| GitLabError::Request {
            action: action.to_owned(),
            source,
        };
        let response = response.map_err(failed)?;
        let status: StatusCode = response.status();
        let headers = response.headers().clone();
        let text = self.client.body_to_string(response).await.map_err(failed)?;
        if !status.is_success() {
            return Err(GitLabError::Status {
                action: action.to_owned(),
                code: status.as_u16(),
                message: crate::report::events::truncate(&text, 300),
            });
        }
        Ok((headers, text))
    }
}

// The fake GitLab lives with the integration tests' support, which run
// `setpoint` against it too; it reads requests with the fake GitHub's
// reader, which it finds as `super::github`.
#[cfg(test)]
use crate::report::github::fake as github;
#[cfg(test)]
#[path = "../../tests/support/gitlab.rs"]
pub(crate) mod fake;

#[cfg(test)]
mod tests {
    use super::fake::{FakeGitLab, TOKEN, merge_request_json};
    use super::*;

    /// A head commit for merge request `iid`.
    fn sha(iid: u64) -> String {
        format!("{iid:040x}")
    }

    #[test]
    fn project_paths_are_url_encoded() {
        assert_eq!(project_segment("42"), "42");
        assert_eq!(project_segment("group/sub/app"), "group%2Fsub%2Fapp");
    }

    #[tokio::test]
    async fn open_merge_requests_are_listed_through_every_page() {
        let gitlab = FakeGitLab::start().await;
        let merge_requests = (1..=130)
            .rev()
            .map(|iid| merge_request_json(iid, &format!("feature-{iid}"), "main", &sha(iid), &[]))
            .collect();
        gitlab.set_merge_requests("group/sub/app", merge_requests);
        let notes = Notes::new(&gitlab.url, TOKEN).unwrap();
        let open = notes
            .list_open_merge_requests("group/sub/app")
            .await
            .unwrap();

        let iids: Vec<u64> = open.iter().map(|pull| pull.number).collect();
        assert_eq!(iids, (1..=130).rev().collect::<Vec<_>>());
        assert_eq!(open[129].branch, "feature-1");
        let lists = gitlab.received();
        assert_eq!(lists.len(), 2);
        for (list, page) in lists.iter().zip(["1", "2"]) {
            assert_eq!(
                list.path,
                "/api/v4/projects/group%2Fsub%2Fapp/merge_requests"
            );
            assert_eq!(list.query("state"), Some("opened"));
            assert_eq!(list.query("per_page"), Some("100"));
            assert_eq!(list.query("page"), Some(page));
        }
        assert_eq!(gitlab.violations(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn open_merge_requests_keep_branches_sha_and_labels() {
        let gitlab = FakeGitLab::start().await;
        let labelled = merge_request_json(
            4,
            "fix-typo",
            "release-1.2",
            &sha(4),
            &["preview", "team-a"],
        );
        let updated_at = labelled["updated_at"].as_str().unwrap().to_owned();
        gitlab.set_merge_requests("14", vec![labelled]);
        let notes = Notes::new(&gitlab.url, TOKEN).unwrap();
        let open = notes.list_open_merge_requests("14").await.unwrap();

        assert_eq!(
            open,
            [OpenPull {
                number: 4,
                branch: "fix-typo".into(),
                target_branch: "release-1.2".into(),
                head_sha: sha(4),
                labels: vec!["preview".into(), "team-a".into()],
                updated_at: Some(updated_at),
            }]
        );
        let received = gitlab.received();
        assert_eq!(received[0].header("private-token"), Some(TOKEN));
        assert_eq!(received[0].header("authorization"), None);
        // No merge request at all is an empty list, not an error.
        gitlab.set_merge_requests("group/empty", vec![]);
        assert_eq!(
            notes.list_open_merge_requests("group/empty").await.unwrap(),
            []
        );
        assert_eq!(gitlab.violations(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn open_merge_requests_of_an_unknown_project_are_an_error_naming_it() {
        let gitlab = FakeGitLab::start().await;
        let notes = Notes::new(&gitlab.url, TOKEN).unwrap();
        let error = notes
            .list_open_merge_requests("group/missing")
            .await
            .unwrap_err();

        assert_eq!(error.status_code(), Some(404), "{error}");
        assert!(error.to_string().contains("group/missing"), "{error}");
        assert_eq!(gitlab.violations(), Vec::<String>::new());

        let error = notes.list_open_merge_requests(" ").await.unwrap_err();
        assert!(matches!(error, GitLabError::InvalidSettings(_)), "{error}");
        assert_eq!(gitlab.received().len(), 1);
    }

    #[test]
    fn the_next_page_comes_from_x_next_page() {
        let mut headers = HeaderMap::new();
        // No header: a full page has a next one, a short page is the last.
        assert_eq!(next_page(&headers, 1, PER_PAGE as usize), Some(2));
        assert_eq!(next_page(&headers, 1, 3), None);
        headers.insert("x-next-page", "3".parse().unwrap());
        assert_eq!(next_page(&headers, 2, 3), Some(3));
        headers.insert("x-next-page", "".parse().unwrap());
        assert_eq!(next_page(&headers, 2, PER_PAGE as usize), None);
    }
}
