//! A preview on GitLab: one note on the merge request, created once and
//! then edited in place (found again by its hidden marker), through the
//! REST API v4 with a token allowed to write notes (`api` scope; a project
//! or group access token with the Reporter role is enough).
//!
//! The requests go through octocrab's raw JSON calls, the HTTP client
//! Setpoint already carries for GitHub: no GitHub-specific authentication
//! is configured on it, only GitLab's `PRIVATE-TOKEN` header.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http::header::HeaderName;
use http_body_util::combinators::BoxBody;
use octocrab::Octocrab;
use serde::{Deserialize, Serialize};

use crate::event::PullRequest;

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

    async fn answer(
        &self,
        action: &str,
        response: octocrab::Result<http::Response<BoxBody<Bytes, octocrab::Error>>>,
    ) -> Result<String, GitLabError> {
        let failed = |source| GitLabError::Request {
            action: action.to_owned(),
            source,
        };
        let response = response.map_err(failed)?;
        let status: StatusCode = response.status();
        let text = self.client.body_to_string(response).await.map_err(failed)?;
        if !status.is_success() {
            return Err(GitLabError::Status {
                action: action.to_owned(),
                code: status.as_u16(),
                message: crate::report::events::truncate(&text, 300),
            });
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_paths_are_url_encoded() {
        assert_eq!(project_segment("42"), "42");
        assert_eq!(project_segment("group/sub/app"), "group%2Fsub%2Fapp");
    }
}
