//! Pull requests: the one comment Setpoint keeps on each (found again by a
//! hidden marker and edited in place, never one per push) and check runs on
//! their head commits. The previews (`src/preview/`) decide what they say.
//! The open ones are listed for the ApplicationSet pull-request generator.
//!
//! Check runs can only be created with a GitHub App's installation token; a
//! personal token gets a 403, which the caller logs (the comment still
//! goes out).

use octocrab::params::checks::{CheckRunConclusion, CheckRunOutput, CheckRunStatus};

use super::api::{Api, Request, next_link};
use super::*;

/// The comments and check runs of pull requests.
#[derive(Clone)]
pub struct PullRequests {
    api: Api,
}

/// What became of the comment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommentPosted {
    pub id: u64,
    /// A new comment; else the existing one was edited (or already said it).
    pub created: bool,
}

/// A completed check run on a head commit (octocrab's parameter types).
#[derive(Serialize)]
pub struct CheckRun {
    pub name: String,
    pub head_sha: String,
    pub status: CheckRunStatus,
    pub conclusion: CheckRunConclusion,
    pub output: CheckRunOutput,
}

/// An open pull request (or GitLab merge request) as the pull-request
/// generator sees it: enough to name, check out and label an Application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenPull {
    pub number: u64,
    /// The head branch (`head.ref`); on a fork, the fork's branch.
    pub branch: String,
    /// The branch it would merge into (`base.ref`).
    pub target_branch: String,
    pub head_sha: String,
    pub labels: Vec<String>,
    /// As GitHub gives it (RFC 3339), so a generator can requeue on change.
    pub updated_at: Option<String>,
}

/// A bound on one listing of open pull requests: 5,000 of them. Past it the
/// listing is an error, not a partial answer a generator would prune by.
const MAX_PULL_PAGES: usize = 50;

/// One item of GitHub's pull request list, the fields [`OpenPull`] keeps.
#[derive(Deserialize)]
struct ListedPull {
    number: u64,
    head: ListedHead,
    base: ListedBase,
    #[serde(default)]
    labels: Vec<ListedLabel>,
    #[serde(default)]
    updated_at: Option<String>,
}

#[derive(Deserialize)]
struct ListedHead {
    #[serde(rename = "ref")]
    branch: String,
    sha: String,
}

#[derive(Deserialize)]
struct ListedBase {
    #[serde(rename = "ref")]
    branch: String,
}

#[derive(Deserialize)]
struct ListedLabel {
    name: String,
}

impl From<ListedPull> for OpenPull {
    fn from(pull: ListedPull) -> OpenPull {
        OpenPull {
            number: pull.number,
            branch: pull.head.branch,
            target_branch: pull.base.branch,
            head_sha: pull.head.sha,
            labels: pull.labels.into_iter().map(|label| label.name).collect(),
            updated_at: pull.updated_at,
        }
    }
}

#[derive(Deserialize)]
struct Comment {
    id: u64,
    #[serde(default)]
    body: Option<String>,
}

#[derive(Serialize)]
struct CommentBody<'a> {
    body: &'a str,
}

impl fmt::Debug for PullRequests {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PullRequests")
            .field("api_url", &self.api.api_url)
            .finish()
    }
}

fn check_names(owner: &str, repo: &str) -> Result<(), GitHubError> {
    if is_name(owner) && is_name(repo) {
        Ok(())
    } else {
        Err(GitHubError::InvalidSettings(format!(
            "{owner:?}/{repo:?} is not a repository name"
        )))
    }
}

impl PullRequests {
    pub fn new(settings: &GitHubSettings) -> Result<PullRequests, GitHubError> {
        Ok(PullRequests {
            api: Api::new(settings)?,
        })
    }

    /// Creates the comment on pull request `number`, or edits the one whose
    /// body holds `marker` (the first, oldest, one). With `create` false,
    /// only an existing comment is edited (`None` when there is none).
    pub async fn upsert_comment(
        &self,
        owner: &str,
        repo: &str,
        number: u64,
        marker: &str,
        body: &str,
        create: bool,
    ) -> Result<Option<CommentPosted>, GitHubError> {
        check_names(owner, repo)?;
        let existing = self.find_comment(owner, repo, number, marker).await?;
        if existing.is_none() && !create {
            return Ok(None);
        }
        let posted = match existing {
            Some(comment) => {
                if comment.body.as_deref() != Some(body) {
                    // https://docs.github.com/rest/issues/comments#update-an-issue-comment
                    let path = format!("/repos/{owner}/{repo}/issues/comments/{}", comment.id);
                    let action = format!("edit the preview comment on {owner}/{repo}#{number}");
                    self.api
                        .send(&action, Request::patch(&path, &CommentBody { body }))
                        .await?;
                }
                CommentPosted {
                    id: comment.id,
                    created: false,
                }
            }
            None => {
                // https://docs.github.com/rest/issues/comments#create-an-issue-comment
                let path = format!("/repos/{owner}/{repo}/issues/{number}/comments");
                let action = format!("comment on {owner}/{repo}#{number}");
                let answer = self
                    .api
                    .send(&action, Request::post(&path, &CommentBody { body }))
                    .await?;
                let comment: Comment =
                    serde_json::from_str(&answer.body).map_err(|e| GitHubError::Decode {
                        action,
                        reason: e.to_string(),
                    })?;
                CommentPosted {
                    id: comment.id,
                    created: true,
                }
            }
        };
        Ok(Some(posted))
    }

    /// The comment holding `marker`, through every page of the listing.
    async fn find_comment(
        &self,
        owner: &str,
        repo: &str,
        number: u64,
        marker: &str,
    ) -> Result<Option<Comment>, GitHubError> {
        // https://docs.github.com/rest/issues/comments#list-issue-comments
        let action = format!("list the comments of {owner}/{repo}#{number}");
        let mut path =
            format!("/repos/{owner}/{repo}/issues/{number}/comments?per_page={PER_PAGE}");
        for _ in 0..MAX_PAGES {
            let answer = self.api.send(&action, Request::get(&path)).await?;
            let comments: Vec<Comment> =
                serde_json::from_str(&answer.body).map_err(|e| GitHubError::Decode {
                    action: action.clone(),
                    reason: e.to_string(),
                })?;
            if let Some(found) = comments
                .into_iter()
                .find(|c| c.body.as_deref().is_some_and(|b| b.contains(marker)))
            {
                return Ok(Some(found));
            }
            match next_link(&answer.headers) {
                Some(next) => path = self.api.same_origin(&next, &action)?,
                None => return Ok(None),
            }
        }
        Ok(None)
    }

    /// Every open pull request of `owner/repo`, through every page, in
    /// GitHub's order (newest first). A listing cut short by
    /// [`MAX_PULL_PAGES`] is an error: a generator given part of the list
    /// would delete the Applications of the rest.
    pub async fn list_open(&self, owner: &str, repo: &str) -> Result<Vec<OpenPull>, GitHubError> {
        check_names(owner, repo)?;
        // https://docs.github.com/rest/pulls/pulls#list-pull-requests
        let action = format!("list the open pull requests of {owner}/{repo}");
        let mut path = format!("/repos/{owner}/{repo}/pulls?state=open&per_page={PER_PAGE}");
        let mut open = Vec::new();
        for _ in 0..MAX_PULL_PAGES {
            let answer = self.api.send(&action, Request::get(&path)).await?;
            let pulls: Vec<ListedPull> =
                serde_json::from_str(&answer.body).map_err(|e| GitHubError::Decode {
                    action: action.clone(),
                    reason: e.to_string(),
                })?;
            open.extend(pulls.into_iter().map(OpenPull::from));
            match next_link(&answer.headers) {
                Some(next) => path = self.api.same_origin(&next, &action)?,
                None => return Ok(open),
            }
        }
        Err(GitHubError::Decode {
            action,
            reason: format!("more than {MAX_PULL_PAGES} pages of {PER_PAGE}"),
        })
    }

    /// https://docs.github.com/rest/checks/runs#create-a-check-run
    pub async fn create_check_run(
        &self,
        owner: &str,
        repo: &str,
        run: &CheckRun,
    ) -> Result<(), GitHubError> {
        check_names(owner, repo)?;
        let path = format!("/repos/{owner}/{repo}/check-runs");
        let action = format!(
            "create check run {} on {owner}/{repo}@{}",
            run.name, run.head_sha
        );
        self.api.send(&action, Request::post(&path, run)).await?;
        Ok(())
    }
}
