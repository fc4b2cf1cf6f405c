//! The reconcile's commit statuses on GitLab: one per Application on the
//! commit it synced, posted in the background in order, retried, never
//! failing a sync.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use backoff::ExponentialBackoffBuilder;
use kube::ResourceExt;
use tracing::{debug, warn};

use super::{Client, GitLabError, Posted, State, gitlab_project, is_commit_id};
use crate::api::Application;
use crate::report::events::error_chain;
use crate::report::github::status_context;
use crate::source::repo_url::normalize_url;

/// The longest back-off between two tries of one status.
const MAX_RETRY_INTERVAL: Duration = Duration::from_secs(8);

/// One status to post on one commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitStatus {
    /// The project's path (`group/sub/project`) or numeric id.
    pub project: String,
    /// The full commit id.
    pub sha: String,
    pub state: State,
    /// GitLab's name (context) of the status: [`status_context`].
    pub name: String,
    /// Any text: it is made one line of at most 255 characters when posted.
    pub description: String,
    /// A link from the status, e.g. to a dashboard.
    pub target_url: Option<String>,
}

/// Posts commit statuses. Cheap to clone: clones share the client, the
/// per-status queues and the counters.
#[derive(Clone)]
pub struct CommitStatuses {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    /// Where [`CommitStatuses::spawn_post`] runs its posts, so it works from
    /// any thread.
    runtime: tokio::runtime::Handle,
    /// The statuses waiting to be posted, per (project, sha, name); a key is
    /// present while a task is posting its statuses, in order.
    queues: Mutex<HashMap<QueueKey, VecDeque<CommitStatus>>>,
    retry_initial: Duration,
    retry_budget: Duration,
    posted: AtomicU64,
    failures: AtomicU64,
}

type QueueKey = (String, String, String);

/// GitLab's paths and commit ids are case-insensitive; names are not.
fn queue_key(status: &CommitStatus) -> QueueKey {
    (
        status.project.to_ascii_lowercase(),
        status.sha.to_ascii_lowercase(),
        status.name.clone(),
    )
}

impl CommitStatuses {
    /// Posts through `client`, retrying a failing status for 30 seconds.
    /// Must be called inside a Tokio runtime.
    pub fn new(client: Client) -> Result<CommitStatuses, GitLabError> {
        CommitStatuses::with_retry(client, Duration::from_millis(200), Duration::from_secs(30))
    }

    /// The same, with the first back-off `initial` (it doubles from there)
    /// and each status given up after `budget`.
    pub fn with_retry(
        client: Client,
        initial: Duration,
        budget: Duration,
    ) -> Result<CommitStatuses, GitLabError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| GitLabError::NoRuntime)?;
        Ok(CommitStatuses {
            inner: Arc::new(Inner {
                client,
                runtime,
                queues: Mutex::default(),
                retry_initial: initial,
                retry_budget: budget,
                posted: AtomicU64::new(0),
                failures: AtomicU64::new(0),
            }),
        })
    }

    /// The client the statuses go through (its API URL, for the log).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// Whether `app`'s repository is a project on this GitLab.
    pub fn serves(&self, app: &Application) -> bool {
        gitlab_project(&app.spec.source.repo_url, self.inner.client.api_url()).is_some()
    }

    /// The status of `app`'s sync of commit `sha`, on the project its source
    /// names. [`GitLabError::NotGitLab`] when that repository is not on this
    /// GitLab, or is a chart's (whose revision is a version): there is no
    /// status to post then, which is no failure.
    pub fn status_for(
        &self,
        app: &Application,
        sha: &str,
        state: State,
        description: &str,
    ) -> Result<CommitStatus, GitLabError> {
        let repo_url = &app.spec.source.repo_url;
        let api_url = self.inner.client.api_url();
        let project = gitlab_project(repo_url, api_url)
            .filter(|_| app.spec.source.chart.is_none())
            .ok_or_else(|| GitLabError::NotGitLab {
                // Normalized: a URL may carry credentials.
                repo: normalize_url(repo_url),
                api_url: api_url.to_owned(),
            })?;
        if !is_commit_id(sha) {
            return Err(GitLabError::InvalidStatus {
                project,
                sha: sha.to_owned(),
                reason: "not a full commit id",
            });
        }
        let namespace = app.namespace().unwrap_or_default();
        // A remote destination leads the description, so that the cut to
        // 255 characters never drops it.
        let wanted = crate::cluster::destination::Wanted::of(&app.spec.destination);
        let description = if wanted.is_local() {
            description.to_owned()
        } else {
            format!("cluster {wanted}: {description}")
        };
        Ok(CommitStatus {
            project,
            sha: sha.to_owned(),
            state,
            name: status_context(&namespace, &app.name_any()),
            description,
            target_url: None,
        })
    }

    /// Posts `status`, retrying with backoff on network errors, 5xx answers
    /// and rate limits (after GitLab's `Retry-After`), for at most the retry
    /// budget. Other answers are final. Counted in
    /// [`posted`](Self::posted) or [`failures`](Self::failures).
    pub async fn post(&self, status: &CommitStatus) -> Result<(), GitLabError> {
        let result = self.try_post(status).await;
        let counter = match result {
            Ok(()) => &self.inner.posted,
            Err(_) => &self.inner.failures,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    async fn try_post(&self, status: &CommitStatus) -> Result<(), GitLabError> {
        let inner = &self.inner;
        let policy = ExponentialBackoffBuilder::new()
            .with_initial_interval(inner.retry_initial)
            .with_multiplier(2.0)
            .with_max_interval(MAX_RETRY_INTERVAL.max(inner.retry_initial))
            .with_max_elapsed_time(Some(inner.retry_budget))
            .build();
        let started = Instant::now();
        let posted = backoff::future::retry_notify(
            policy,
            || async {
                inner.client.send(status).await.map_err(|error| {
                    match (error.is_transient(), error.retry_after()) {
                        (false, _) => backoff::Error::permanent(error),
                        (true, None) => backoff::Error::transient(error),
                        (true, Some(wait)) if started.elapsed() + wait <= inner.retry_budget => {
                            backoff::Error::retry_after(error, wait)
                        }
                        // Waiting for the rate limit would spend the budget.
                        (true, Some(_)) => backoff::Error::permanent(error),
                    }
                })
            },
            |error: GitLabError, wait: Duration| {
                debug!(error = %error_chain(&error), retry_in = ?wait, "GitLab request failed, retrying");
            },
        )
        .await?;
        if posted == Posted::AlreadySo {
            debug!(project = %status.project, sha = %status.sha, name = %status.name, state = %status.state, "commit status unchanged");
        }
        Ok(())
    }

    /// Posts `status` in the background and returns at once; never fails
    /// the caller. A status that cannot be posted is logged and counted.
    /// Statuses of one commit and name are posted in the order they were
    /// given, each after the previous one finished, so a `success` never
    /// overtakes its `running`.
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
                    project = %next.project,
                    sha = %next.sha,
                    name = %next.name,
                    state = %next.state,
                    "failed to post a GitLab commit status; giving up on it"
                );
            }
        }
    }

    fn queues(&self) -> MutexGuard<'_, HashMap<QueueKey, VecDeque<CommitStatus>>> {
        self.inner
            .queues
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Statuses GitLab accepted, or said it held already.
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
