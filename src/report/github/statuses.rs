//! Commit statuses: one per Application on the commit it synced, posted in
//! the background in order, retried, never failing a sync.

use super::api::*;
use super::*;

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
pub(super) struct StatusBody<'a> {
    pub(super) state: State,
    pub(super) context: &'a str,
    pub(super) description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) target_url: Option<&'a str>,
}

/// `text` on one line (every run of whitespace, newlines included, becomes
/// one space) and at most `DESCRIPTION_LIMIT` characters, with an ellipsis
/// when cut.
pub(super) fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= DESCRIPTION_LIMIT {
        return line;
    }
    let mut cut: String = line.chars().take(DESCRIPTION_LIMIT - 1).collect();
    cut.truncate(cut.trim_end().len());
    cut.push('…');
    cut
}

pub(super) fn is_commit_id(sha: &str) -> bool {
    matches!(sha.len(), 40 | 64) && sha.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Posts commit statuses. Cheap to clone: clones share the client, the
/// per-status queues and the counters.
#[derive(Clone)]
pub struct CommitStatuses {
    inner: Arc<StatusesInner>,
}

pub(super) struct StatusesInner {
    pub(super) api: Api,
    /// Where [`CommitStatuses::spawn_post`] runs its posts, so it works from
    /// any thread.
    pub(super) runtime: tokio::runtime::Handle,
    /// The statuses waiting to be posted, per (owner, repo, sha, context); a
    /// key is present while a task is posting its statuses, in order.
    pub(super) queues: Mutex<HashMap<QueueKey, VecDeque<CommitStatus>>>,
    pub(super) posted: AtomicU64,
    pub(super) failures: AtomicU64,
}

pub(super) type QueueKey = (String, String, String, String);

pub(super) fn queue_key(status: &CommitStatus) -> QueueKey {
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
        // A remote destination leads the description, so that the cut to
        // 140 characters never drops it.
        let wanted = crate::cluster::destination::Wanted::of(&app.spec.destination);
        let description = if wanted.is_local() {
            description.to_owned()
        } else {
            format!("cluster {wanted}: {description}")
        };
        Ok(CommitStatus {
            owner,
            repo,
            sha: sha.to_owned(),
            state,
            context: status_context(&namespace, &app.name_any()),
            description,
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

    pub(super) async fn try_post(&self, status: &CommitStatus) -> Result<(), GitHubError> {
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
    pub(super) async fn drain(&self, key: QueueKey) {
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

    pub(super) fn queues(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<QueueKey, VecDeque<CommitStatus>>> {
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
pub(super) struct DrainGuard<'a> {
    pub(super) statuses: &'a CommitStatuses,
    pub(super) key: &'a QueueKey,
    pub(super) finished: bool,
}

impl Drop for DrainGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.statuses.queues().remove(self.key);
        }
    }
}
