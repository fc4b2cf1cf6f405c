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

/// github.com's API; GitHub Enterprise Server's is `https://HOST/api/v3`.
pub const DEFAULT_API_URL: &str = "https://api.github.com";
/// GitHub rejects a longer status description with a 422.
const DESCRIPTION_LIMIT: usize = 140;
/// Enough of GitHub's error message to say what went wrong.
const MESSAGE_LIMIT: usize = 300;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// GitHub's maximum page size for deliveries.
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

/// Whose webhook: a repository's or an organization's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HookScope {
    Repo { owner: String, repo: String },
    Org(String),
}

/// One webhook, spelled `owner/repo:12345` for a repository's and
/// `orgs/org:12345` for an organization's (the id is in the hook's settings
/// URL on GitHub).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HookRef {
    pub scope: HookScope,
    pub id: u64,
}

impl HookRef {
    /// The hook's API path, without the base URL.
    fn path(&self) -> String {
        match &self.scope {
            HookScope::Repo { owner, repo } => format!("/repos/{owner}/{repo}/hooks/{}", self.id),
            HookScope::Org(org) => format!("/orgs/{org}/hooks/{}", self.id),
        }
    }
}

impl FromStr for HookRef {
    type Err = GitHubError;

    fn from_str(text: &str) -> Result<HookRef, GitHubError> {
        let invalid = |reason| GitHubError::InvalidHook {
            hook: text.to_owned(),
            reason,
        };
        let (scope, id) = text.trim().rsplit_once(':').ok_or(invalid("no :id"))?;
        let id = id
            .parse::<u64>()
            .ok()
            .filter(|id| *id > 0)
            .ok_or(invalid("the id is not a positive number"))?;
        let scope = match scope.split('/').collect::<Vec<_>>()[..] {
            ["orgs", org] if is_name(org) => HookScope::Org(org.to_owned()),
            [owner, repo] if is_name(owner) && is_name(repo) => HookScope::Repo {
                owner: owner.to_owned(),
                repo: repo.to_owned(),
            },
            _ => return Err(invalid("not a GitHub owner/repo or orgs/org")),
        };
        Ok(HookRef { scope, id })
    }
}

impl fmt::Display for HookRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            HookScope::Repo { owner, repo } => write!(f, "{owner}/{repo}:{}", self.id),
            HookScope::Org(org) => write!(f, "orgs/{org}:{}", self.id),
        }
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

/// What a commit status says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The sync started.
    Pending,
    /// The sync finished and the Application is in sync.
    Success,
    /// The sync failed on the revision's own content (bad YAML, a rejected
    /// object): the commit is at fault.
    Failure,
    /// The sync failed for some other reason (cluster, network).
    Error,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Pending => "pending",
            State::Success => "success",
            State::Failure => "failure",
            State::Error => "error",
        })
    }
}

/// One status to post on one commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitStatus {
    pub owner: String,
    pub repo: String,
    /// The full commit id.
    pub sha: String,
    pub state: State,
    /// [`status_context`].
    pub context: String,
    /// Any text: it is made one line of at most 140 characters when posted.
    pub description: String,
    /// A link from the status, e.g. to a dashboard.
    pub target_url: Option<String>,
}

/// The JSON body of `POST /repos/{owner}/{repo}/statuses/{sha}`.
#[derive(Serialize)]
struct StatusBody<'a> {
    state: State,
    context: &'a str,
    description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    target_url: Option<&'a str>,
}

/// `text` on one line (every run of whitespace, newlines included, becomes
/// one space) and at most `DESCRIPTION_LIMIT` characters, with an ellipsis
/// when cut.
fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= DESCRIPTION_LIMIT {
        return line;
    }
    let mut cut: String = line.chars().take(DESCRIPTION_LIMIT - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}

fn is_commit_id(sha: &str) -> bool {
    matches!(sha.len(), 40 | 64) && sha.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Posts commit statuses. Cheap to clone: clones share the client, the
/// per-status queues and the counters.
#[derive(Clone)]
pub struct CommitStatuses {
    inner: Arc<StatusesInner>,
}

struct StatusesInner {
    api: Api,
    /// Where [`CommitStatuses::spawn_post`] runs its posts, so it works from
    /// any thread.
    runtime: tokio::runtime::Handle,
    /// The statuses waiting to be posted, per (owner, repo, sha, context); a
    /// key is present while a task is posting its statuses, in order.
    queues: Mutex<HashMap<QueueKey, VecDeque<CommitStatus>>>,
    posted: AtomicU64,
    failures: AtomicU64,
}

type QueueKey = (String, String, String, String);

fn queue_key(status: &CommitStatus) -> QueueKey {
    (
        status.owner.to_ascii_lowercase(),
        status.repo.to_ascii_lowercase(),
        status.sha.to_ascii_lowercase(),
        status.context.clone(),
    )
}

impl CommitStatuses {
    /// Must be called inside a Tokio runtime (octocrab starts a task).
    pub fn new(settings: &GitHubSettings) -> Result<CommitStatuses, GitHubError> {
        Ok(CommitStatuses {
            inner: Arc::new(StatusesInner {
                api: Api::new(settings)?,
                runtime: tokio::runtime::Handle::current(),
                queues: Mutex::default(),
                posted: AtomicU64::new(0),
                failures: AtomicU64::new(0),
            }),
        })
    }

    /// The API URL the statuses go to, as configured.
    pub fn api_url(&self) -> &str {
        &self.inner.api.api_url
    }

    /// The status of `app`'s sync of commit `sha`, on the repository its
    /// source names. [`GitHubError::NotGitHub`] when that repository is not
    /// on this GitHub: there is no status to post then, which is no failure.
    pub fn status_for(
        &self,
        app: &Application,
        sha: &str,
        state: State,
        description: &str,
    ) -> Result<CommitStatus, GitHubError> {
        let repo_url = &app.spec.source.repo_url;
        let (owner, repo) = github_repo(repo_url, self.api_url()).ok_or_else(|| {
            GitHubError::NotGitHub {
                // Normalized: a URL may carry credentials.
                repo: normalize_url(repo_url),
                api_url: self.api_url().to_owned(),
            }
        })?;
        let namespace = app.namespace().unwrap_or_default();
        Ok(CommitStatus {
            owner,
            repo,
            sha: sha.to_owned(),
            state,
            context: status_context(&namespace, &app.name_any()),
            description: description.to_owned(),
            target_url: None,
        })
    }

    /// Posts `status`, retrying with backoff on network errors, 5xx answers
    /// and rate limits, for at most the retry budget. Other 4xx answers are
    /// final. Counted in [`posted`](Self::posted) or
    /// [`failures`](Self::failures).
    pub async fn post(&self, status: &CommitStatus) -> Result<(), GitHubError> {
        let result = self.try_post(status).await;
        let counter = match result {
            Ok(()) => &self.inner.posted,
            Err(_) => &self.inner.failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    async fn try_post(&self, status: &CommitStatus) -> Result<(), GitHubError> {
        let invalid = |reason| GitHubError::InvalidStatus {
            owner: status.owner.clone(),
            repo: status.repo.clone(),
            sha: status.sha.clone(),
            reason,
        };
        if !is_name(&status.owner) || !is_name(&status.repo) {
            return Err(invalid("not a GitHub owner/repo"));
        }
        if !is_commit_id(&status.sha) {
            return Err(invalid("not a full commit id"));
        }
        if status.context.trim().is_empty() {
            return Err(invalid("no context"));
        }
        let body = StatusBody {
            state: status.state,
            context: &status.context,
            description: one_line(&status.description),
            target_url: status.target_url.as_deref(),
        };
        let path = format!(
            "/repos/{}/{}/statuses/{}",
            status.owner, status.repo, status.sha
        );
        let action = format!(
            "post status {} of {} on {}/{}@{}",
            status.state,
            status.context,
            status.owner,
            status.repo,
            &status.sha[..12]
        );
        let answer = self
            .inner
            .api
            .send(&action, Request::post(&path, &body))
            .await?;
        debug!(%action, code = answer.status.as_u16(), "posted commit status");
        Ok(())
    }

    /// Posts `status` in the background and returns at once; never fails
    /// the caller. A status that cannot be posted is logged and counted.
    /// Statuses of one commit and context are posted in the order they were
    /// given, each after the previous one finished, so a `success` never
    /// overtakes its `pending`.
    pub fn spawn_post(&self, status: CommitStatus) {
        let key = queue_key(&status);
        let start = match self.queues().entry(key.clone()) {
            Entry::Occupied(mut queue) => {
                queue.get_mut().push_back(status);
                false
            }
            Entry::Vacant(slot) => {
                slot.insert(VecDeque::from([status]));
                true
            }
        };
        if start {
            let statuses = self.clone();
            self.inner
                .runtime
                .spawn(async move { statuses.drain(key).await });
        }
    }

    /// Posts the statuses queued under `key` until there are none; the key
    /// is removed (so the next status starts a new task) under the same lock
    /// that finds its queue empty.
    async fn drain(&self, key: QueueKey) {
        let mut guard = DrainGuard {
            statuses: self,
            key: &key,
            finished: false,
        };
        loop {
            let next = {
                let mut queues = self.queues();
                match queues.get_mut(&key).and_then(VecDeque::pop_front) {
                    Some(status) => status,
                    None => {
                        queues.remove(&key);
                        guard.finished = true;
                        return;
                    }
                }
            };
            if let Err(error) = self.post(&next).await {
                warn!(
                    error = %error_chain(&error),
                    repo = %format_args!("{}/{}", next.owner, next.repo),
                    sha = %next.sha,
                    context = %next.context,
                    state = %next.state,
                    "failed to post a commit status; giving up on it"
                );
            }
        }
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<QueueKey, VecDeque<CommitStatus>>> {
        self.inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Statuses GitHub accepted.
    pub fn posted(&self) -> u64 {
        self.inner.posted.load(Ordering::Relaxed)
    }

    /// Statuses given up on: rejected, or still failing at the end of the
    /// retry budget.
    pub fn failures(&self) -> u64 {
        self.inner.failures.load(Ordering::Relaxed)
    }
}

/// Should a drain task end without emptying its queue (its runtime shutting
/// down), the key goes, so that later statuses are not stuck behind it.
struct DrainGuard<'a> {
    statuses: &'a CommitStatuses,
    key: &'a QueueKey,
    finished: bool,
}

impl Drop for DrainGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.statuses.queues().remove(self.key);
        }
    }
}

/// Asks GitHub to deliver again the webhook deliveries that failed: GitHub
/// does not retry them, and a push that never reached Ingest would wait for
/// the next sweep.
pub struct Redelivery {
    api: Api,
    hooks: Vec<HookRef>,
    interval: Duration,
    lookback: Duration,
    /// The (hook, guid) already asked for in this process, and when that
    /// delivery first happened, so that they are asked for once and
    /// forgotten once past the lookback.
    asked: Mutex<HashMap<(HookRef, String), Timestamp>>,
}

/// What one [`Redelivery::run_once`] saw and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedeliveryReport {
    /// Deliveries listed within the lookback, over all hooks.
    pub listed: usize,
    /// Deliveries (by guid) with no successful attempt.
    pub failed: usize,
    /// The guids GitHub was asked, in this run, to deliver again.
    pub redelivered: Vec<String>,
    /// The guids whose redelivery GitHub refused or could not be reached
    /// for; the next run asks again.
    pub not_redelivered: Vec<String>,
}

/// One item of `GET …/hooks/{id}/deliveries`. Every attempt of one event
/// has its own `id` and shares the event's `guid`.
#[derive(Clone, Debug, Deserialize)]
struct Delivery {
    id: u64,
    guid: String,
    delivered_at: String,
    #[serde(default)]
    redelivery: bool,
    #[serde(default)]
    status: String,
    /// What Setpoint's webhook answered; 0 when it was not reached.
    #[serde(default)]
    status_code: i64,
    #[serde(default)]
    event: String,
    #[serde(default)]
    action: Option<String>,
}

impl Delivery {
    fn succeeded(&self) -> bool {
        (200..300).contains(&self.status_code)
    }
}

/// The latest attempt of each event none of whose attempts succeeded,
/// oldest event first: what to ask GitHub to deliver again.
fn failed_deliveries(deliveries: &[(Timestamp, Delivery)]) -> Vec<&Delivery> {
    struct Event<'a> {
        succeeded: bool,
        first: Timestamp,
        latest: (Timestamp, &'a Delivery),
    }
    let mut events: HashMap<&str, Event<'_>> = HashMap::new();
    for (at, delivery) in deliveries {
        let event = events.entry(delivery.guid.as_str()).or_insert(Event {
            succeeded: false,
            first: *at,
            latest: (*at, delivery),
        });
        event.succeeded |= delivery.succeeded();
        event.first = event.first.min(*at);
        if (*at, delivery.id) > (event.latest.0, event.latest.1.id) {
            event.latest = (*at, delivery);
        }
    }
    let mut failed: Vec<Event<'_>> = events
        .into_values()
        .filter(|event| !event.succeeded)
        .collect();
    failed.sort_by_key(|event| (event.first, event.latest.1.id));
    failed.into_iter().map(|event| event.latest.1).collect()
}

impl Redelivery {
    /// Must be called inside a Tokio runtime (octocrab starts a task).
    pub fn new(settings: &GitHubSettings) -> Result<Redelivery, GitHubError> {
        if settings.hooks.is_empty() {
            return Err(GitHubError::InvalidSettings(
                "no webhooks to recover the deliveries of".into(),
            ));
        }
        if settings.redelivery_interval.is_zero() {
            return Err(GitHubError::InvalidSettings(
                "the redelivery interval must be positive".into(),
            ));
        }
        Ok(Redelivery {
            api: Api::new(settings)?,
            hooks: settings.hooks.clone(),
            interval: settings.redelivery_interval,
            lookback: settings.lookback,
            asked: Mutex::default(),
        })
    }

    /// Runs once at once, then once per interval, until `shutdown` turns
    /// true (or its sender is gone). Errors are logged: the next run tries
    /// again.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !*shutdown.borrow() {
            tokio::select! {
                _ = ticks.tick() => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
            }
            tokio::select! {
                result = self.run_once() => log_report(result),
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Lists each hook's deliveries back to the lookback, and asks GitHub to
    /// deliver again the latest attempt of each event that never succeeded
    /// and that this process has not asked for yet. A hook that cannot be
    /// listed does not stop the others; the first such error is returned.
    pub async fn run_once(&self) -> Result<RedeliveryReport, GitHubError> {
        let cutoff = Timestamp::now()
            .saturating_sub(self.lookback)
            .unwrap_or(Timestamp::MIN);
        self.asked().retain(|_, first| *first >= cutoff);
        let mut report = RedeliveryReport::default();
        let mut first_error = None;
        for hook in &self.hooks {
            if let Err(error) = self.recover(hook, cutoff, &mut report).await {
                warn!(%hook, error = %error_chain(&error), "failed to recover a webhook's deliveries");
                first_error.get_or_insert(error);
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(report),
        }
    }

    async fn recover(
        &self,
        hook: &HookRef,
        cutoff: Timestamp,
        report: &mut RedeliveryReport,
    ) -> Result<(), GitHubError> {
        let deliveries = self.list(hook, cutoff).await?;
        report.listed += deliveries.len();
        let failed = failed_deliveries(&deliveries);
        report.failed += failed.len();
        for latest in failed {
            let key = (hook.clone(), latest.guid.clone());
            if self.asked().contains_key(&key) {
                continue;
            }
            match self.redeliver(hook, latest).await {
                Ok(()) => {
                    let first = deliveries
                        .iter()
                        .filter(|(_, delivery)| delivery.guid == latest.guid)
                        .map(|(at, _)| *at)
                        .min()
                        .unwrap_or(cutoff);
                    self.asked().insert(key, first);
                    report.redelivered.push(latest.guid.clone());
                }
                Err(error) => {
                    warn!(%hook, guid = %latest.guid, error = %error_chain(&error), "failed to ask for a redelivery");
                    report.not_redelivered.push(latest.guid.clone());
                }
            }
        }
        Ok(())
    }

    /// The hook's deliveries no older than `cutoff`. GitHub lists the newest
    /// first, a page at a time, each page naming the next in its `Link`
    /// header; the listing stops at the first page that reaches the cutoff.
    async fn list(
        &self,
        hook: &HookRef,
        cutoff: Timestamp,
    ) -> Result<Vec<(Timestamp, Delivery)>, GitHubError> {
        let action = format!("list the deliveries of webhook {hook}");
        let mut path = format!("{}/deliveries?per_page={PER_PAGE}", hook.path());
        let mut deliveries = Vec::new();
        for _ in 0..MAX_PAGES {
            let answer = self
                .api
                .send(&action, Request::get(&path))
                .await
                .map_err(|error| match error {
                    GitHubError::Status { code: 404, .. } => GitHubError::HookNotFound {
                        hook: hook.to_string(),
                    },
                    error => error,
                })?;
            let page: Vec<Delivery> =
                serde_json::from_str(&answer.body).map_err(|error| GitHubError::Decode {
                    action: action.clone(),
                    reason: error.to_string(),
                })?;
            let mut reached_cutoff = page.is_empty();
            for delivery in page {
                let at = delivery
                    .delivered_at
                    .parse::<Timestamp>()
                    .map_err(|error| GitHubError::Decode {
                        action: action.clone(),
                        reason: format!(
                            "delivery {} has delivered_at {:?}: {error}",
                            delivery.id, delivery.delivered_at
                        ),
                    })?;
                if at < cutoff {
                    reached_cutoff = true;
                } else {
                    deliveries.push((at, delivery));
                }
            }
            if reached_cutoff {
                return Ok(deliveries);
            }
            match next_link(&answer.headers) {
                Some(next) => path = self.api.same_origin(&next, &action)?,
                None => return Ok(deliveries),
            }
        }
        warn!(%hook, pages = MAX_PAGES, "stopped listing deliveries before the lookback");
        Ok(deliveries)
    }

    async fn redeliver(&self, hook: &HookRef, delivery: &Delivery) -> Result<(), GitHubError> {
        let action = format!(
            "redeliver delivery {} ({} {}) of webhook {hook}",
            delivery.id, delivery.event, delivery.guid
        );
        let path = format!("{}/deliveries/{}/attempts", hook.path(), delivery.id);
        debug!(
            %hook,
            guid = %delivery.guid,
            id = delivery.id,
            status = %delivery.status,
            code = delivery.status_code,
            redelivery = delivery.redelivery,
            action = ?delivery.action,
            "asking for a redelivery"
        );
        self.api.send(&action, Request::post_empty(&path)).await?;
        Ok(())
    }

    fn asked(&self) -> std::sync::MutexGuard<'_, HashMap<(HookRef, String), Timestamp>> {
        self.asked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn log_report(result: Result<RedeliveryReport, GitHubError>) {
    match result {
        Ok(report) if report.redelivered.is_empty() && report.not_redelivered.is_empty() => {
            debug!(
                listed = report.listed,
                failed = report.failed,
                "no webhook delivery to redeliver"
            );
        }
        Ok(report) => info!(
            listed = report.listed,
            failed = report.failed,
            redelivered = ?report.redelivered,
            not_redelivered = ?report.not_redelivered,
            "asked GitHub to redeliver failed webhook deliveries"
        ),
        Err(error) => warn!(
            error = %error_chain(&error),
            "failed to recover webhook deliveries; trying again at the next interval"
        ),
    }
}

/// The `rel="next"` target of a `Link` header: `<url>; rel="next", …`.
fn next_link(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(LINK)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|link| {
            let (target, params) = link.trim().strip_prefix('<')?.split_once('>')?;
            let next = params.split(';').any(|param| {
                let Some((name, value)) = param.split_once('=') else {
                    return false;
                };
                name.trim().eq_ignore_ascii_case("rel")
                    && value
                        .trim()
                        .trim_matches('"')
                        .split_ascii_whitespace()
                        .any(|rel| rel.eq_ignore_ascii_case("next"))
            });
            next.then(|| target.to_owned())
        })
}

/// The GitHub REST API, through octocrab, with our retries.
#[derive(Clone)]
struct Api {
    octocrab: Octocrab,
    /// As configured, without a trailing slash.
    api_url: String,
    base: Uri,
    retry_initial: Duration,
    retry_budget: Duration,
}

/// One request: the method, the path (and query) under the API URL, the
/// JSON body.
struct Request<'a> {
    method: Method,
    path: &'a str,
    body: Option<serde_json::Value>,
}

impl<'a> Request<'a> {
    fn get(path: &'a str) -> Request<'a> {
        Request {
            method: Method::GET,
            path,
            body: None,
        }
    }

    fn post(path: &'a str, body: &impl Serialize) -> Request<'a> {
        Request {
            method: Method::POST,
            path,
            // Serializing our own body types cannot fail.
            body: serde_json::to_value(body).ok(),
        }
    }

    fn post_empty(path: &'a str) -> Request<'a> {
        Request {
            method: Method::POST,
            path,
            body: None,
        }
    }
}

/// A 2xx answer.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Api {
    fn new(settings: &GitHubSettings) -> Result<Api, GitHubError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(GitHubError::NoRuntime);
        }
        let invalid = |reason: &str| GitHubError::InvalidSettings(reason.to_owned());
        // A token read from a file often ends with a newline.
        let token = settings.token.trim();
        if token.is_empty() {
            return Err(invalid("no token"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "the token has characters an HTTP header cannot carry",
            ));
        }
        let api_url = settings.api_url.trim().trim_end_matches('/').to_owned();
        let base = api_url.parse::<Uri>().map_err(|_| {
            GitHubError::InvalidSettings(format!("api url {api_url:?} is not a URL"))
        })?;
        let authority = base.authority().map(|a| a.as_str()).unwrap_or("");
        if authority.contains('@') {
            // Not echoed: it would be a credential.
            return Err(invalid(
                "the api url carries credentials; the token is given on its own",
            ));
        }
        if !matches!(base.scheme_str(), Some("https" | "http"))
            || authority.is_empty()
            || base.query().is_some()
        {
            return Err(GitHubError::InvalidSettings(format!(
                "api url {api_url:?} is not an http(s) URL without a query"
            )));
        }
        let octocrab = Octocrab::builder()
            .base_uri(base.clone())
            .map_err(|source| GitHubError::Request {
                action: "configure the GitHub client".into(),
                source,
            })?
            .personal_token(token.to_owned())
            // octocrab sends `User-Agent: octocrab` and
            // `X-GitHub-Api-Version: 2022-11-28` itself.
            .add_header(ACCEPT, "application/vnd.github+json".into())
            .set_connect_timeout(Some(CONNECT_TIMEOUT))
            .set_read_timeout(Some(READ_TIMEOUT))
            .set_write_timeout(Some(WRITE_TIMEOUT))
            .build()
            .map_err(|source| GitHubError::Request {
                action: "build the GitHub client".into(),
                source,
            })?;
        Ok(Api {
            octocrab,
            api_url,
            base,
            retry_initial: settings.retry_initial,
            retry_budget: settings.retry_budget,
        })
    }

    /// Sends `request` until GitHub answers 2xx, a final error, or the retry
    /// budget is spent.
    async fn send(&self, action: &str, request: Request<'_>) -> Result<Answer, GitHubError> {
        let policy = ExponentialBackoffBuilder::new()
            .with_initial_interval(self.retry_initial)
            .with_multiplier(2.0)
            .with_max_interval(MAX_RETRY_INTERVAL.max(self.retry_initial))
            .with_max_elapsed_time(Some(self.retry_budget))
            .build();
        let started = Instant::now();
        backoff::future::retry_notify(
            policy,
            || async {
                let answer = self.send_once(action, &request).await?;
                if answer.status.is_success() {
                    return Ok(answer);
                }
                let error = GitHubError::Status {
                    action: action.to_owned(),
                    code: answer.status.as_u16(),
                    message: github_message(&answer.body),
                };
                match retry_decision(&answer, &error, Timestamp::now()) {
                    Retry::No => Err(backoff::Error::permanent(error)),
                    Retry::Backoff => Err(backoff::Error::transient(error)),
                    Retry::After(wait) if started.elapsed() + wait <= self.retry_budget => {
                        Err(backoff::Error::retry_after(error, wait))
                    }
                    // Waiting for the rate limit would spend the budget.
                    Retry::After(_) => Err(backoff::Error::permanent(error)),
                }
            },
            |error: GitHubError, wait: Duration| {
                debug!(error = %error_chain(&error), retry_in = ?wait, "GitHub request failed, retrying");
            },
        )
        .await
    }

    async fn send_once(
        &self,
        action: &str,
        request: &Request<'_>,
    ) -> Result<Answer, backoff::Error<GitHubError>> {
        let request_failed = |source: octocrab::Error| {
            let transient = matches!(
                source,
                octocrab::Error::Hyper { .. } | octocrab::Error::Service { .. }
            );
            let error = GitHubError::Request {
                action: action.to_owned(),
                source,
            };
            if transient {
                backoff::Error::transient(error)
            } else {
                backoff::Error::permanent(error)
            }
        };
        let response = match (&request.method, &request.body) {
            (&Method::GET, _) => self.octocrab._get(request.path).await,
            (_, Some(body)) => self.octocrab._post(request.path, Some(body)).await,
            (_, None) => self.octocrab._post(request.path, None::<&()>).await,
        }
        .map_err(request_failed)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = self
            .octocrab
            .body_to_string(response)
            .await
            .map_err(request_failed)?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// The path and query of `url` when it is on the API's own origin: the
    /// token goes nowhere else.
    fn same_origin(&self, url: &str, action: &str) -> Result<String, GitHubError> {
        let decode = |reason: String| GitHubError::Decode {
            action: action.to_owned(),
            reason,
        };
        let uri = url
            .parse::<Uri>()
            .map_err(|_| decode(format!("the next page {url:?} is not a URL")))?;
        let same = uri.authority().is_none()
            || (uri.scheme() == self.base.scheme() && uri.authority() == self.base.authority());
        if !same {
            return Err(decode(format!(
                "the next page {url:?} is not on {}",
                self.api_url
            )));
        }
        Ok(uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()))
    }
}

enum Retry {
    No,
    Backoff,
    After(Duration),
}

/// Server errors and rate limits are retried; other answers are final. A
/// rate limit says when to come back: `Retry-After` (secondary limits) or
/// `X-RateLimit-Reset` once `X-RateLimit-Remaining` is 0 (primary limits,
/// which GitHub answers with 403 or 429).
fn retry_decision(answer: &Answer, error: &GitHubError, now: Timestamp) -> Retry {
    let header = |name: &str| {
        answer
            .headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
    };
    let retry_after = header(RETRY_AFTER.as_str())
        .and_then(|seconds| seconds.parse::<u64>().ok())
        .map(Duration::from_secs);
    let exhausted = header("x-ratelimit-remaining") == Some("0");
    let reset = header("x-ratelimit-reset")
        .and_then(|epoch| epoch.parse::<i64>().ok())
        .map(|epoch| Duration::from_secs(epoch.saturating_sub(now.as_second()).max(1) as u64));
    let wait = retry_after.or(if exhausted { reset } else { None });
    let code = answer.status;
    let rate_limited = code == StatusCode::TOO_MANY_REQUESTS
        || (code == StatusCode::FORBIDDEN
            && (exhausted
                || retry_after.is_some()
                || error
                    .to_string()
                    .to_ascii_lowercase()
                    .contains("rate limit")));
    match wait {
        _ if !(rate_limited || code.is_server_error()) => Retry::No,
        Some(wait) => Retry::After(wait),
        None => Retry::Backoff,
    }
}

/// GitHub's `message` (and its validation `errors`), or the start of the
/// body, on one line.
fn github_message(body: &str) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        message: String,
        #[serde(default)]
        errors: Vec<serde_json::Value>,
    }
    let text = match serde_json::from_str::<ErrorBody>(body) {
        Ok(error) if error.errors.is_empty() => error.message,
        Ok(error) => format!(
            "{} ({})",
            error.message,
            serde_json::Value::Array(error.errors)
        ),
        Err(_) if body.trim().is_empty() => "no message".into(),
        Err(_) => body.to_owned(),
    };
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::report::events::truncate(&line, MESSAGE_LIMIT)
}

// The fake GitHub lives with the integration tests' support, which run
// `setpoint` against it too.
#[cfg(test)]
#[path = "../../tests/support/github.rs"]
mod fake;

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::{Value, json};

    use super::fake::{API_VERSION, FakeGitHub, Fault, TOKEN, delivery};

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
        app.spec.source.repo_url = "https://u:pw@gitlab.com/acme/deploy".into();
        let error = statuses
            .status_for(&app, SHA, State::Pending, "syncing")
            .unwrap_err();
        assert!(matches!(error, GitHubError::NotGitHub { .. }));
        assert!(!error.to_string().contains("pw"), "{error}");
    }
}
