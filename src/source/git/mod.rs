//! The Git source, the first step of a reconcile: bring the Application's
//! repository up to date in a local mirror, resolve `targetRevision` to a
//! commit and read the files under `path` at that commit, for `render`.
//!
//! It shells out to the `git` CLI rather than linking a Git library: the CLI
//! speaks every transport and auth scheme users already rely on, and a
//! misbehaving command can be killed at its timeout. Every Application that
//! names the same repository (however it spells the URL) shares one bare
//! mirror under the cache directory, fetched incrementally.
//!
//! Credentials never reach argv, the mirror's config, an error or a log line:
//! a credentialsSecret's, or the user info of an `http(s)` repository URL
//! (which git is then given without it), travel as an `http.extraHeader` in
//! `GIT_CONFIG_*` environment variables (not `-c` on argv, which every local
//! user can read in `/proc/<pid>/cmdline`), and whatever git writes to stderr
//! is scrubbed of them before it becomes an error.

mod command;
mod files;
mod freshness;
mod mirror;
mod pull;
mod remote;
mod revision;
mod tree;
pub mod verify;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use backoff::ExponentialBackoffBuilder;
use tracing::{debug, info, warn};

use crate::source::repo_url::normalize_path;
use command::{Git, stderr_text};
use mirror::Mirror;
use remote::Remote;
use revision::{Wanted, is_valid_ref_name};

/// A first fetch of a large repository is slow; a stalled one must still end.
const FETCH_TIMEOUT: Duration = Duration::from_secs(300);
/// Commands that only read the mirror; minutes here mean something is wrong.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one checkout keeps retrying a failing fetch before it gives the
/// error to the worker, whose own retry (with its own backoff) takes over.
const FETCH_RETRY_BUDGET: Duration = Duration::from_secs(25);

/// Where the remote's default branch lands, for an empty `targetRevision`.
const DEFAULT_BRANCH_REF: &str = "refs/setpoint/HEAD";
const BRANCHES: &str = "+refs/heads/*:refs/heads/*";
const TAGS: &str = "+refs/tags/*:refs/tags/*";
const DEFAULT_BRANCH: &str = "+HEAD:refs/setpoint/HEAD";
/// What git says when the remote's HEAD names a branch that does not exist.
const NO_REMOTE_HEAD: &str = "couldn't find remote ref HEAD";

/// What failed while getting an Application's files out of Git.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("invalid repository url {url}: {reason}")]
    InvalidUrl { url: String, reason: &'static str },
    #[error("failed to fetch {url}: {stderr}")]
    Fetch { url: String, stderr: String },
    #[error("git {operation} for {url} timed out after {after:?}")]
    Timeout {
        url: String,
        operation: &'static str,
        after: Duration,
    },
    #[error("failed to run git: {source}")]
    Spawn {
        #[source]
        source: io::Error,
    },
    #[error(
        "revision {revision} not found in {url} ({})",
        not_found_reason(revision)
    )]
    RevisionNotFound { url: String, revision: String },
    #[error("path {path} not found at commit {commit} (no files under it)")]
    PathNotFound { path: String, commit: String },
    #[error("path {path} at commit {commit} is a file, but the source path must be a directory")]
    NotADirectory { path: String, commit: String },
    #[error("failed to access {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("git {command} failed: {stderr}")]
    Git { command: String, stderr: String },
}

fn not_found_reason(revision: &str) -> &'static str {
    if revision == "HEAD" {
        "the repository has no default branch"
    } else {
        "no branch, tag or commit by that name"
    }
}

impl GitError {
    /// Transient errors are retried with backoff; the others are the
    /// Application's own mistake (a revision or path that does not exist) and
    /// wait for the Application or the repository to change.
    ///
    /// `Io` and `Git` count as transient: the user cannot fix a full disk or a
    /// mirror git refuses to read by editing the Application.
    pub fn is_transient(&self) -> bool {
        match self {
            GitError::Fetch { .. }
            | GitError::Timeout { .. }
            | GitError::Spawn { .. }
            | GitError::Io { .. }
            | GitError::Git { .. } => true,
            GitError::InvalidUrl { .. }
            | GitError::RevisionNotFound { .. }
            | GitError::PathNotFound { .. }
            | GitError::NotADirectory { .. } => false,
        }
    }

    fn io(path: &Path) -> impl FnOnce(io::Error) -> GitError + '_ {
        move |source| GitError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// HTTP(S) basic-auth credentials from the Application's `credentialsSecret`.
/// A token goes in `password` (GitHub and GitLab accept any non-empty
/// username with a token). They win over user info in the repository URL,
/// which is otherwise sent the same way.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    /// Debug output ends up in logs; the password must not.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// One checkout: which repository, which revision, which directory.
#[derive(Clone, Copy, Default)]
pub struct CheckoutRequest<'a> {
    /// As the Application spells it; only its normalized form is the mirror key.
    pub url: &'a str,
    /// A branch, a tag, a (short) commit id or a full ref name; `None`, `""`
    /// and `"HEAD"` mean the remote's default branch.
    pub revision: Option<&'a str>,
    /// The directory to read; `None` is the repository root.
    pub path: Option<&'a str>,
    /// Sent only to `http(s)` remotes.
    pub credentials: Option<&'a Credentials>,
    /// A commit a webhook announced for this revision: when the mirror already
    /// has the revision at that commit (or past it), the fetch is skipped.
    pub known_commit: Option<&'a str>,
    /// Without an announced commit: the revision may come from any fetch
    /// (in this process) that started at or after this moment, typically
    /// when the event was published or its sweep cycle began. `None`: fetch
    /// unless a fetch started while this request waited for the mirror.
    pub fresh_since: Option<SystemTime>,
}

impl fmt::Debug for CheckoutRequest<'_> {
    /// The URL without its user info, as in every message of this module.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckoutRequest")
            .field("url", &crate::secret::ShownUrl(self.url))
            .field("revision", &self.revision)
            .field("path", &self.path)
            .field("credentials", &self.credentials)
            .field("known_commit", &self.known_commit)
            .field("fresh_since", &self.fresh_since)
            .finish()
    }
}

/// The files of one Application at one commit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkout {
    /// The full commit id `revision` resolved to.
    pub commit: String,
    /// The normalized source path; `""` is the root.
    pub path: String,
    /// Every regular file under `path`, sorted by path.
    pub files: Vec<SourceFile>,
    /// The bare mirror the files were read from.
    pub mirror: PathBuf,
}

/// One regular file as Git holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceFile {
    /// Relative to the repository root (not to the source path), so messages
    /// name the file the way the repository does.
    pub path: String,
    pub contents: Vec<u8>,
}

/// Reads Applications' files out of Git through local bare mirrors. Cheap to
/// clone: the mirrors and their locks are shared.
#[derive(Clone)]
pub struct GitSource {
    shared: Arc<Shared>,
    settings: Settings,
}

#[derive(Clone, Copy, Debug)]
struct Settings {
    fetch_timeout: Duration,
    local_timeout: Duration,
    fetch_retry_budget: Duration,
}

struct Shared {
    mirrors_dir: PathBuf,
    mirrors: Mutex<HashMap<String, Arc<Mirror>>>,
    fetches: AtomicU64,
    /// Each successful logical fetch's duration, for the metrics.
    fetch_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
    /// Every `git fetch` sent to a remote, for the metrics.
    fetch_requests: Option<prometheus_client::metrics::counter::Counter>,
    /// The files already read, per (repository, commit, path).
    files: files::FileCache,
    /// Signature verdicts, per (commit or tag object, keys digest).
    verdicts: verify::Verdicts,
}

impl fmt::Debug for GitSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GitSource")
            .field("mirrors_dir", &self.shared.mirrors_dir)
            .field("settings", &self.settings)
            .field("fetches", &self.fetch_count())
            .finish()
    }
}

impl GitSource {
    /// Mirrors live in `cache_dir/mirrors/`; the directory is created on first use.
    pub fn new(cache_dir: PathBuf) -> Self {
        GitSource {
            shared: Arc::new(Shared {
                mirrors_dir: cache_dir.join("mirrors"),
                mirrors: Mutex::new(HashMap::new()),
                fetches: AtomicU64::new(0),
                fetch_seconds: None,
                fetch_requests: None,
                files: files::FileCache::new(files::DEFAULT_BUDGET),
                verdicts: verify::Verdicts::default(),
            }),
            settings: Settings {
                fetch_timeout: FETCH_TIMEOUT,
                local_timeout: LOCAL_TIMEOUT,
                fetch_retry_budget: FETCH_RETRY_BUDGET,
            },
        }
    }

    /// The limit on one `git fetch` (default 5 minutes).
    pub fn with_fetch_timeout(mut self, timeout: Duration) -> Self {
        self.settings.fetch_timeout = timeout;
        self
    }

    /// The limit on one command that only reads the mirror (default 1 minute).
    pub fn with_local_timeout(mut self, timeout: Duration) -> Self {
        self.settings.local_timeout = timeout;
        self
    }

    /// How long a checkout retries a failing fetch (default 25 s); zero
    /// means a single attempt.
    pub fn with_fetch_retry_budget(mut self, budget: Duration) -> Self {
        self.settings.fetch_retry_budget = budget;
        self
    }

    /// Observes each fetch's duration into `histogram`.
    pub fn with_fetch_histogram(
        mut self,
        histogram: prometheus_client::metrics::histogram::Histogram,
    ) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.fetch_seconds = Some(histogram);
        }
        self
    }

    /// Counts each `git fetch` command (retries included) in `counter`.
    pub fn with_fetch_requests(
        mut self,
        counter: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        if let Some(shared) = Arc::get_mut(&mut self.shared) {
            shared.fetch_requests = Some(counter);
        }
        self
    }

    /// How many `git fetch` commands ran, retries included.
    pub fn fetch_count(&self) -> u64 {
        self.shared.fetches.load(Ordering::SeqCst)
    }

    /// Fetch (when needed), resolve the revision, read the files under path at
    /// that commit.
    pub async fn checkout(&self, request: &CheckoutRequest<'_>) -> Result<Checkout, GitError> {
        let remote = Remote::new(request.url, request.credentials)?;
        let path = normalize_path(request.path);
        let wanted = Wanted::parse(request.revision);
        if let Wanted::Name(name) = &wanted
            && !is_valid_ref_name(name)
        {
            // Not a name git could hold: no fetch can make it appear.
            return Err(remote.revision_not_found(&wanted));
        }

        let mirror = self.mirror(&remote.key);
        if let Some(checkout) = self
            .checkout_unlocked(&mirror, &remote, &wanted, request, &path)
            .await?
        {
            return Ok(checkout);
        }
        // Taken before waiting for the lock: a fetch that starts after this
        // point also sees whatever the caller is looking for.
        let waiting_since = mirror.fetches_started.load(Ordering::SeqCst);
        let lock = mirror.lock().await?;
        mirror.prepare(&remote, &self.settings).await?;
        let git = Git {
            mirror: &mirror,
            remote: &remote,
            settings: &self.settings,
        };

        let mut commit = git.resolve(&wanted).await?;
        let announced_contained = match (request.known_commit, &commit) {
            (Some(announced), Some(local)) if !announced.trim().eq_ignore_ascii_case(local) => {
                git.contains(announced.trim(), local).await?
            }
            _ => false,
        };
        let facts = freshness::Facts {
            wants_commit: matches!(wanted, Wanted::Commit(_)),
            local: commit.as_deref(),
            announced: request.known_commit,
            announced_contained,
            fetched_while_waiting: mirror.fetches_completed.load(Ordering::SeqCst) > waiting_since,
            fresh_since: request.fresh_since,
            last_fetch_started: mirror.last_fetch_started(&remote.caller()),
        };
        match freshness::skip_reason(&facts) {
            Some(reason) => {
                debug!(url = %remote.display_url, revision = %wanted, reason, "fetch skipped");
            }
            None => {
                self.fetch(&git).await?;
                commit = git.resolve(&wanted).await?;
                if commit.is_none() && matches!(wanted, Wanted::Commit(_)) {
                    self.fetch_pull_heads(&git).await?;
                    commit = git.resolve(&wanted).await?;
                }
            }
        }
        let commit = commit.ok_or_else(|| remote.revision_not_found(&wanted))?;
        // Objects never change: the files are read without the lock, side
        // by side with other checkouts of the repository.
        drop(lock);
        let files = self.read_files(&git, &remote.key, &commit, &path).await?;
        Ok(Checkout {
            commit,
            path,
            files,
            mirror: mirror.dir.clone(),
        })
    }

    /// The checkout without the mirror's lock, when this process already
    /// resolved the revision since the refs last changed and the same
    /// freshness rules as under the lock say no fetch is needed (a push's
    /// own commit, a commit id): a fleet of Applications on one repository
    /// does not queue on the lock for one `git` each.
    async fn checkout_unlocked(
        &self,
        mirror: &Mirror,
        remote: &Remote,
        wanted: &Wanted,
        request: &CheckoutRequest<'_>,
        path: &str,
    ) -> Result<Option<Checkout>, GitError> {
        let Some(local) = mirror.resolved(&wanted.key()) else {
            return Ok(None);
        };
        let facts = freshness::Facts {
            wants_commit: matches!(wanted, Wanted::Commit(_)),
            local: Some(&local),
            announced: request.known_commit,
            // Asking would need `git`: the locked path does.
            announced_contained: false,
            fetched_while_waiting: false,
            fresh_since: request.fresh_since,
            last_fetch_started: mirror.last_fetch_started(&remote.caller()),
        };
        let Some(reason) = freshness::skip_reason(&facts) else {
            return Ok(None);
        };
        debug!(url = %remote.display_url, revision = %wanted, reason, "fetch skipped, revision known");
        let git = Git {
            mirror,
            remote,
            settings: &self.settings,
        };
        let files = self.read_files(&git, &remote.key, &local, path).await?;
        Ok(Some(Checkout {
            commit: local,
            path: path.to_owned(),
            files,
            mirror: mirror.dir.clone(),
        }))
    }

    /// The files under `path` at `commit`, from the cache or the mirror.
    async fn read_files(
        &self,
        git: &Git<'_>,
        key: &str,
        commit: &str,
        path: &str,
    ) -> Result<Vec<SourceFile>, GitError> {
        if let Some(files) = self.shared.files.get(key, commit, path) {
            return Ok(files.as_ref().clone());
        }
        let files = git.read_files(commit, path).await?;
        self.shared
            .files
            .insert(key, commit, path, Arc::new(files.clone()));
        Ok(files)
    }

    fn mirror(&self, key: &str) -> Arc<Mirror> {
        let mut mirrors = self
            .shared
            .mirrors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mirror = mirrors
            .entry(key.to_owned())
            .or_insert_with(|| Arc::new(Mirror::new(&self.shared.mirrors_dir, key)));
        Arc::clone(mirror)
    }

    /// One logical fetch, retried with backoff while it fails transiently.
    async fn fetch(&self, git: &Git<'_>) -> Result<(), GitError> {
        let mirror = git.mirror;
        let generation = mirror.fetches_started.fetch_add(1, Ordering::SeqCst) + 1;
        // The remote URL is set before every fetch: another spelling of the
        // same repository (or another process) may have set its own.
        let args = ["remote", "set-url", "origin", &git.remote.fetch_url];
        let output = git.run_changing(&args, "remote set-url", false).await?;
        git.checked(&args, output)?;
        let policy = ExponentialBackoffBuilder::new()
            .with_initial_interval(Duration::from_millis(500))
            .with_multiplier(2.0)
            .with_max_interval(Duration::from_secs(8))
            .with_max_elapsed_time(Some(self.settings.fetch_retry_budget))
            .build();
        let started = Instant::now();
        let started_at = SystemTime::now();
        backoff::future::retry_notify(
            policy,
            || async {
                self.fetch_once(git).await.map_err(|err| {
                    if err.is_transient() {
                        backoff::Error::transient(err)
                    } else {
                        backoff::Error::permanent(err)
                    }
                })
            },
            |err: GitError, wait: Duration| {
                warn!(error = %err, retry_in = ?wait, "fetch failed, retrying");
            },
        )
        .await?;
        mirror
            .fetches_completed
            .fetch_max(generation, Ordering::SeqCst);
        mirror.fetched(&git.remote.caller(), started_at);
        if let Some(histogram) = &self.shared.fetch_seconds {
            histogram.observe(started.elapsed().as_secs_f64());
        }
        info!(url = %git.remote.display_url, elapsed = ?started.elapsed(), "fetched");
        Ok(())
    }

    async fn fetch_once(&self, git: &Git<'_>) -> Result<(), GitError> {
        let mut refspecs = vec![BRANCHES, TAGS, DEFAULT_BRANCH];
        let output = self.run_fetch(git, &refspecs).await?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = git.remote.scrub(&stderr_text(&output));
        if !stderr.contains(NO_REMOTE_HEAD) {
            return Err(git.remote.fetch_failed(stderr));
        }
        // A remote whose HEAD names a missing branch (a bare repository
        // created with another default branch name) still has usable
        // branches and tags; only the default branch is unknown.
        refspecs.pop();
        let output = self.run_fetch(git, &refspecs).await?;
        if !output.status.success() {
            return Err(git
                .remote
                .fetch_failed(git.remote.scrub(&stderr_text(&output))));
        }
        let args = ["update-ref", "-d", DEFAULT_BRANCH_REF];
        let output = git.run_changing(&args, "update-ref", false).await?;
        git.checked(&args, output)?;
        Ok(())
    }

    async fn run_fetch(&self, git: &Git<'_>, refspecs: &[&str]) -> Result<Output, GitError> {
        self.shared.fetches.fetch_add(1, Ordering::SeqCst);
        if let Some(counter) = &self.shared.fetch_requests {
            counter.inc();
        }
        let mut args = vec!["fetch", "--prune", "--no-tags", "origin"];
        args.extend_from_slice(refspecs);
        debug!(url = %git.remote.display_url, "git fetch");
        git.run_changing(&args, "fetch", true).await
    }
}

#[cfg(test)]
mod tests;
