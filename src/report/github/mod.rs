//! Report on GitHub, after the sync: a commit status per Application on the
//! commit it synced (`pending` when the sync starts, then `success` or
//! `failure`), and recovery of the webhook deliveries GitHub gave up on,
//! which Ingest never saw.
//!
//! Both talk to the GitHub REST API (github.com, or GitHub Enterprise Server
//! at `https://HOST/api/v3`) through octocrab's raw calls, so that the status
//! code and the headers of every answer (rate limits, `Link` pagination) are
//! ours to read. Retries are ours too, with `backoff`, bounded in time.
//!
//! Neither may fail a sync: a status that cannot be posted is retried, then
//! logged and counted ([`CommitStatuses::failures`]). The token never reaches
//! an error, a log line or a `Debug` output.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use backoff::ExponentialBackoffBuilder;
use http::header::{ACCEPT, HeaderMap, LINK, RETRY_AFTER};
use http::{Method, StatusCode, Uri};
use jiff::Timestamp;
use kube::ResourceExt;
use octocrab::Octocrab;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::api::Application;
use crate::report::events::error_chain;
use crate::source::repo_url::normalize_url;

mod api;
mod hooks;
mod pulls;
mod statuses;

pub use hooks::{HookRef, HookScope, Redelivery, RedeliveryReport};
pub use pulls::{CheckRun, CommentPosted, OpenPull, PullRequests};
pub use statuses::{CommitStatus, CommitStatuses, State};

/// github.com's API; GitHub Enterprise Server's is `https://HOST/api/v3`.
pub const DEFAULT_API_URL: &str = "https://api.github.com";
/// GitHub rejects a longer status description with a 422.
const DESCRIPTION_LIMIT: usize = 140;
/// Enough of GitHub's error message to say what went wrong.
const MESSAGE_LIMIT: usize = 300;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// GitHub's maximum page size (deliveries, comments, pull requests).
const PER_PAGE: u32 = 100;
/// A bound on one listing, should the cutoff never be reached: 10,000
/// deliveries within the lookback is far more than a push hook sees.
const MAX_PAGES: usize = 100;
/// The longest back-off between two tries of one request.
const MAX_RETRY_INTERVAL: Duration = Duration::from_secs(8);

/// What failed while talking to GitHub. None of them carries the token.
#[derive(Debug, thiserror::Error)]
pub enum GitHubError {
    #[error("invalid GitHub settings: {0}")]
    InvalidSettings(String),
    #[error("invalid webhook {hook:?}: {reason} (expected owner/repo:id or orgs/org:id)")]
    InvalidHook { hook: String, reason: &'static str },
    #[error("invalid commit status for {owner}/{repo}@{sha}: {reason}")]
    InvalidStatus {
        owner: String,
        repo: String,
        sha: String,
        reason: &'static str,
    },
    #[error("{repo} is not a repository on the GitHub of {api_url}")]
    NotGitHub { repo: String, api_url: String },
    #[error("failed to {action}: {source}")]
    Request {
        action: String,
        #[source]
        source: octocrab::Error,
    },
    #[error("failed to {action}: GitHub answered {code}: {message}")]
    Status {
        action: String,
        code: u16,
        message: String,
    },
    #[error(
        "webhook {hook} not found on GitHub (or the token may not read its deliveries: \
         it needs the admin:repo_hook or admin:org_hook scope, or webhooks read permission)"
    )]
    HookNotFound { hook: String },
    #[error("failed to {action}: unexpected answer from GitHub: {reason}")]
    Decode { action: String, reason: String },
    #[error("the GitHub client must be created inside a Tokio runtime")]
    NoRuntime,
}

impl GitHubError {
    /// The HTTP status GitHub answered, if it answered.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            GitHubError::Status { code, .. } => Some(*code),
            GitHubError::HookNotFound { .. } => Some(404),
            _ => None,
        }
    }
}

/// Where GitHub is and what Setpoint may do there.
#[derive(Clone)]
pub struct GitHubSettings {
    /// `https://api.github.com`, or `https://HOST/api/v3` for GitHub
    /// Enterprise Server. Repositories on its host (`github.com` for the
    /// former) get commit statuses; any other repository gets none.
    pub api_url: String,
    /// A token allowed to write commit statuses (`repo:status`, or a
    /// fine-grained "Commit statuses: write") and, for redelivery, to read
    /// and redeliver the hooks' deliveries (`admin:repo_hook`).
    pub token: String,
    /// The webhooks whose failed deliveries are asked for again.
    pub hooks: Vec<HookRef>,
    /// How often the deliveries are listed again after the start-up run.
    pub redelivery_interval: Duration,
    /// How far back a failed delivery is still redelivered. GitHub keeps
    /// deliveries 3 days; older pushes are covered by the sweep anyway.
    pub lookback: Duration,
    /// The first back-off of a failing request; it doubles from there.
    pub retry_initial: Duration,
    /// How long one request keeps being retried before it is given up.
    pub retry_budget: Duration,
}

impl Default for GitHubSettings {
    fn default() -> Self {
        GitHubSettings {
            api_url: DEFAULT_API_URL.into(),
            token: String::new(),
            hooks: Vec::new(),
            redelivery_interval: Duration::from_secs(5 * 60),
            lookback: Duration::from_secs(3 * 60 * 60),
            retry_initial: Duration::from_millis(200),
            retry_budget: Duration::from_secs(30),
        }
    }
}

impl fmt::Debug for GitHubSettings {
    /// Debug output ends up in logs; the token must not.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = if self.token.is_empty() {
            "<none>"
        } else {
            "<redacted>"
        };
        f.debug_struct("GitHubSettings")
            .field("api_url", &self.api_url)
            .field("token", &token)
            .field("hooks", &self.hooks)
            .field("redelivery_interval", &self.redelivery_interval)
            .field("lookback", &self.lookback)
            .field("retry_initial", &self.retry_initial)
            .field("retry_budget", &self.retry_budget)
            .finish()
    }
}

/// A GitHub account or repository name: letters, digits, `-`, `_` and `.`,
/// so it can go into an API path as it is.
fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// `(owner, repo)` when `repo_url` names a repository on the GitHub that
/// `api_url` is the API of; `None` for any other host (no status is posted
/// there). Every spelling the Git source accepts works: `https://`, `ssh://`,
/// scp-like `git@host:owner/repo`, with or without `.git`, any host case.
///
/// The Git host of `https://api.github.com` is `github.com`; of
/// `https://HOST/api/v3` (Enterprise Server) it is `HOST`; of
/// `https://api.SUBDOMAIN.ghe.com` (Enterprise Cloud) `SUBDOMAIN.ghe.com`.
pub fn github_repo(repo_url: &str, api_url: &str) -> Option<(String, String)> {
    let git_host = git_host(api_url)?;
    let key = normalize_url(repo_url);
    if key.starts_with("file://") {
        return None;
    }
    let (authority, path) = key.split_once('/')?;
    let host = strip_port(authority);
    let on_github = host == git_host || (git_host == "github.com" && host == "www.github.com");
    if !on_github {
        return None;
    }
    match path.split('/').collect::<Vec<_>>()[..] {
        [owner, repo] if is_name(owner) && is_name(repo) => {
            Some((owner.to_owned(), repo.to_owned()))
        }
        _ => None,
    }
}

/// The host Git URLs name for the GitHub whose API is `api_url`, lowercase.
fn git_host(api_url: &str) -> Option<String> {
    let uri = api_url.trim().parse::<Uri>().ok()?;
    let host = uri.host()?.to_ascii_lowercase();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some(host.strip_prefix("api.").unwrap_or(host).to_owned())
}

fn strip_port(authority: &str) -> &str {
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => authority,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The context of an Application's statuses: one per Application, so that
/// several Applications synced from one commit each get their own line.
pub fn status_context(namespace: &str, app: &str) -> String {
    format!("setpoint/{namespace}/{app}")
}

// The fake GitHub lives with the integration tests' support, which run
// `setpoint` against it too. The fake GitLab (`src/preview/gitlab.rs`)
// reads its requests with this one's reader.
#[cfg(test)]
#[path = "../../../tests/support/github.rs"]
pub(crate) mod fake;

#[cfg(test)]
mod tests;
