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
//! Credentials never reach argv, a URL or an error message: they travel as an
//! `http.extraHeader` in `GIT_CONFIG_*` environment variables, and whatever
//! git writes to stderr is scrubbed of them before it becomes an error.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use backoff::ExponentialBackoffBuilder;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWrite;
use tokio::process::{ChildStdin, Command};
use tracing::{debug, info, warn};

/// A first fetch of a large repository is slow; a stalled one must still end.
const FETCH_TIMEOUT: Duration = Duration::from_secs(300);
/// Commands that only read the mirror; minutes here mean something is wrong.
const LOCAL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one checkout keeps retrying a failing fetch before it gives the
/// error to the worker, whose own retry (with its own backoff) takes over.
const FETCH_RETRY_BUDGET: Duration = Duration::from_secs(25);
/// Enough of git's stderr to say what went wrong, not enough to flood an Event.
const MAX_STDERR: usize = 4096;

/// Where the remote's default branch lands, for an empty `targetRevision`.
const DEFAULT_BRANCH_REF: &str = "refs/setpoint/HEAD";
const BRANCHES: &str = "+refs/heads/*:refs/heads/*";
const TAGS: &str = "+refs/tags/*:refs/tags/*";
const DEFAULT_BRANCH: &str = "+HEAD:refs/setpoint/HEAD";
/// What git says when the remote's HEAD names a branch that does not exist.
const NO_REMOTE_HEAD: &str = "couldn't find remote ref HEAD";

/// Inherited `GIT_*` variables that only say where git, ssh or TLS live; every
/// other one (`GIT_DIR`, `GIT_CONFIG_*`, `GIT_TRACE*`, `GIT_ASKPASS`, …) would
/// change what a command does, or print secrets, so it is removed.
const KEPT_GIT_VARS: &[&str] = &[
    "GIT_EXEC_PATH",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "GIT_PROXY_COMMAND",
    "GIT_HTTP_USER_AGENT",
];

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
/// username with a token).
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
    /// has the revision at that commit, the fetch is skipped.
    pub known_commit: Option<&'a str>,
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
        // Taken before waiting for the lock: a fetch that starts after this
        // point also sees whatever the caller is looking for.
        let waiting_since = mirror.fetches_started.load(Ordering::SeqCst);
        let _lock = mirror.lock().await?;
        mirror.prepare(&remote, &self.settings).await?;
        let git = Git {
            mirror: &mirror,
            remote: &remote,
            settings: &self.settings,
        };

        let mut commit = git.resolve(&wanted).await?;
        let up_to_date = match (&wanted, &commit) {
            // A commit id names the same tree forever.
            (Wanted::Commit(_), Some(_)) => true,
            (_, Some(local)) => request
                .known_commit
                .is_some_and(|known| known.trim().eq_ignore_ascii_case(local)),
            (_, None) => false,
        };
        if up_to_date {
            debug!(url = %remote.display_url, revision = %wanted, "mirror up to date, fetch skipped");
        } else if mirror.fetches_completed.load(Ordering::SeqCst) > waiting_since {
            debug!(url = %remote.display_url, revision = %wanted, "fetched while waiting, fetch skipped");
        } else {
            self.fetch(&git).await?;
            commit = git.resolve(&wanted).await?;
        }
        let commit = commit.ok_or_else(|| remote.revision_not_found(&wanted))?;
        let files = git.read_files(&commit, &path).await?;
        Ok(Checkout {
            commit,
            path,
            files,
            mirror: mirror.dir.clone(),
        })
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
        let mut args = vec!["fetch", "--prune", "--no-tags", "origin"];
        args.extend_from_slice(refspecs);
        debug!(url = %git.remote.display_url, "git fetch");
        git.run_changing(&args, "fetch", true).await
    }
}

/// One bare repository in the cache and the locks that serialize its use.
struct Mirror {
    dir: PathBuf,
    lock_file: PathBuf,
    /// Present while a command that changes refs runs; found at lock time, it
    /// means that command was killed and may have left `*.lock` files behind.
    changing_marker: PathBuf,
    /// In-process exclusion; the lock file adds exclusion across processes.
    process_lock: tokio::sync::Mutex<()>,
    /// Fetch generations: the number of fetches started, and the highest
    /// generation that completed. A caller that waited for the lock skips its
    /// fetch when one started after it began waiting has completed.
    fetches_started: AtomicU64,
    fetches_completed: AtomicU64,
}

/// Held for the whole checkout: the in-process guard and the locked file.
struct MirrorLock<'a> {
    _process: tokio::sync::MutexGuard<'a, ()>,
    _file: std::fs::File,
}

impl Mirror {
    fn new(mirrors_dir: &Path, key: &str) -> Self {
        let name = mirror_name(key);
        Mirror {
            dir: mirrors_dir.join(&name),
            lock_file: mirrors_dir.join(format!("{name}.lock")),
            changing_marker: mirrors_dir.join(format!("{name}.changing")),
            process_lock: tokio::sync::Mutex::new(()),
            fetches_started: AtomicU64::new(0),
            fetches_completed: AtomicU64::new(0),
        }
    }

    async fn lock(&self) -> Result<MirrorLock<'_>, GitError> {
        let process = self.process_lock.lock().await;
        let parent = self.dir.parent().unwrap_or(Path::new("."));
        tokio::fs::create_dir_all(parent)
            .await
            .map_err(GitError::io(parent))?;
        let lock_file = self.lock_file.clone();
        // `File::lock` blocks the thread until another process lets go.
        let file = tokio::task::spawn_blocking(move || {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_file)?;
            file.lock()?;
            Ok(file)
        })
        .await
        .map_err(io::Error::other)
        .and_then(|locked| locked)
        .map_err(GitError::io(&self.lock_file))?;
        Ok(MirrorLock {
            _process: process,
            _file: file,
        })
    }

    /// Creates the mirror on first use and repairs one whose last change was
    /// killed half-way. Called with the lock held.
    async fn prepare(&self, remote: &Remote, settings: &Settings) -> Result<(), GitError> {
        if exists(&self.changing_marker).await? {
            warn!(mirror = %self.dir.display(), "a git command was killed; removing its stale lock files");
            let dir = self.dir.clone();
            tokio::task::spawn_blocking(move || remove_lock_files(&dir))
                .await
                .map_err(io::Error::other)
                .and_then(|removed| removed)
                .map_err(GitError::io(&self.dir))?;
            self.end_change().await?;
        }
        if exists(&self.dir).await? {
            return Ok(());
        }
        // Built beside its final place and renamed, so a half-made mirror is
        // never mistaken for a ready one.
        let mut staging = self.dir.clone().into_os_string();
        staging.push(".init");
        let staging = PathBuf::from(staging);
        match tokio::fs::remove_dir_all(&staging).await {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                return Err(GitError::io(&staging)(err));
            }
            _ => {}
        }
        let git = Git {
            mirror: self,
            remote,
            settings,
        };
        let init: [&[&str]; 3] = [
            &["init", "--bare", "--quiet", "--template="],
            &["remote", "add", "--", "origin", &remote.fetch_url],
            // `remote add` also configures `refs/remotes/origin/*`, which
            // every fetch would then fill with a second copy of the branches.
            &["config", "--unset-all", "remote.origin.fetch"],
        ];
        for args in init {
            git.run_in(&staging, args, "init").await?;
        }
        tokio::fs::rename(&staging, &self.dir)
            .await
            .map_err(GitError::io(&self.dir))?;
        info!(url = %remote.display_url, mirror = %self.dir.display(), "created mirror");
        Ok(())
    }

    async fn begin_change(&self) -> Result<(), GitError> {
        tokio::fs::write(&self.changing_marker, b"")
            .await
            .map_err(GitError::io(&self.changing_marker))
    }

    async fn end_change(&self) -> Result<(), GitError> {
        match tokio::fs::remove_file(&self.changing_marker).await {
            Err(err) if err.kind() != io::ErrorKind::NotFound => {
                Err(GitError::io(&self.changing_marker)(err))
            }
            _ => Ok(()),
        }
    }
}

async fn exists(path: &Path) -> Result<bool, GitError> {
    tokio::fs::try_exists(path)
        .await
        .map_err(GitError::io(path))
}

/// Git's lock files are `<name>.lock` beside what they guard (refs, packed
/// refs, config, shallow); objects never use them.
fn remove_lock_files(dir: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if entry.file_name() != "objects" {
                remove_lock_files(&path)?;
            }
        } else if path.extension().is_some_and(|ext| ext == "lock") {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// `<sha256(key)[..16]>-<last path element>`: unique, and still readable by
/// a person looking at the cache.
fn mirror_name(key: &str) -> String {
    let digest = hex::encode(Sha256::digest(key.as_bytes()));
    let last = key.rsplit('/').find(|part| !part.is_empty()).unwrap_or("");
    let mut readable: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    readable = readable.trim_start_matches('.').to_owned();
    if readable.is_empty() {
        readable.push_str("repo");
    }
    format!("{}-{readable}", &digest[..16])
}

/// What `targetRevision` asks for.
#[derive(Debug)]
enum Wanted {
    /// The remote's default branch.
    Default,
    /// A full commit id, lowercase.
    Commit(String),
    /// A branch, a tag, a short commit id or a full ref name.
    Name(String),
}

impl Wanted {
    fn parse(revision: Option<&str>) -> Wanted {
        match revision.map(str::trim) {
            None | Some("") | Some("HEAD") => Wanted::Default,
            Some(id) if is_full_commit_id(id) => Wanted::Commit(id.to_ascii_lowercase()),
            Some(name) => Wanted::Name(name.to_owned()),
        }
    }

    /// The expressions to try, in order; the first that names a commit wins.
    fn candidates(&self) -> Vec<String> {
        match self {
            Wanted::Default => vec![format!("{DEFAULT_BRANCH_REF}^{{commit}}")],
            Wanted::Commit(id) => vec![format!("{id}^{{commit}}")],
            Wanted::Name(name) => {
                let mut candidates = vec![
                    format!("refs/heads/{name}^{{commit}}"),
                    format!("refs/tags/{name}^{{commit}}"),
                ];
                if name.starts_with("refs/") || (is_hex(name) && name.len() >= 4) {
                    candidates.push(format!("{name}^{{commit}}"));
                }
                candidates
            }
        }
    }
}

impl fmt::Display for Wanted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wanted::Default => f.write_str("HEAD"),
            Wanted::Commit(id) => f.write_str(id),
            Wanted::Name(name) => f.write_str(name),
        }
    }
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// SHA-1 or SHA-256.
fn is_full_commit_id(text: &str) -> bool {
    (text.len() == 40 || text.len() == 64) && is_hex(text)
}

/// `git check-ref-format`'s rules, so a revision can never smuggle in rev
/// syntax (`main~1`, `v1^{tree}`, `@{yesterday}`) or an option.
fn is_valid_ref_name(name: &str) -> bool {
    !name.is_empty()
        && name != "@"
        && !name.starts_with('-')
        && !name.ends_with('.')
        && !name.contains("..")
        && !name.contains("@{")
        && !name
            .chars()
            .any(|c| c.is_ascii_control() || " ~^:?*[\\".contains(c))
        && name
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.') && !part.ends_with(".lock"))
}

/// The repository of one request, in its three spellings.
struct Remote {
    /// What git fetches from: the URL as given (local paths made absolute).
    fetch_url: String,
    /// What messages show: user info removed.
    display_url: String,
    /// The mirror key, [`normalize_url`].
    key: String,
    /// `(config key, value)` of the `http.extraHeader` carrying credentials.
    auth: Option<(String, String)>,
    /// Strings that must never appear in an error.
    secrets: Vec<String>,
}

impl Remote {
    fn new(url: &str, credentials: Option<&Credentials>) -> Result<Remote, GitError> {
        let url = url.trim();
        let location = Location::parse(url);
        let display_url = location.display();
        let invalid = |reason| GitError::InvalidUrl {
            url: display_url.clone(),
            reason,
        };
        if url.is_empty() {
            return Err(invalid("it is empty"));
        }
        if url.starts_with('-') {
            return Err(invalid("it must not start with '-'"));
        }
        if url.chars().any(|c| c.is_ascii_control()) {
            return Err(invalid("it contains control characters"));
        }
        if is_remote_helper_syntax(url) {
            return Err(invalid("the <transport>::<address> syntax is not allowed"));
        }
        let mut secrets = Vec::new();
        let mut auth = None;
        let fetch_url = match &location {
            Location::Local(path)
                if !url
                    .get(..7)
                    .is_some_and(|scheme| scheme.eq_ignore_ascii_case("file://")) =>
            {
                path.clone()
            }
            Location::Local(_) => url.to_owned(),
            Location::Remote(remote) => {
                if let Some(scheme) = &remote.scheme
                    && !matches!(
                        scheme.as_str(),
                        "http" | "https" | "ssh" | "git" | "git+ssh" | "ssh+git"
                    )
                {
                    return Err(invalid("the scheme must be http, https, ssh, git or file"));
                }
                if remote.host.is_empty() {
                    return Err(invalid("it names no host"));
                }
                let http = matches!(remote.scheme.as_deref(), Some("http" | "https"));
                if let Some(userinfo) = remote.userinfo {
                    // Over http(s) a lone user name is usually a token; over
                    // ssh it is just the account (`git@`).
                    if http {
                        secrets.push(userinfo.to_owned());
                    }
                    if let Some((_, password)) = userinfo.split_once(':') {
                        secrets.push(password.to_owned());
                    }
                }
                if let (true, Some(credentials)) = (http, credentials) {
                    let token =
                        BASE64.encode(format!("{}:{}", credentials.username, credentials.password));
                    // Scoped to the host, so a redirect to another host does
                    // not carry the credentials along.
                    let key = format!(
                        "http.{}://{}/.extraHeader",
                        remote.scheme.as_deref().unwrap_or("https"),
                        remote.authority()
                    );
                    let value = format!("Authorization: Basic {token}");
                    secrets.extend([value.clone(), token, credentials.password.clone()]);
                    auth = Some((key, value));
                }
                url.to_owned()
            }
        };
        // Longest first: the header contains the token.
        secrets.retain(|secret| !secret.is_empty());
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        Ok(Remote {
            key: location.key(),
            fetch_url,
            display_url,
            auth,
            secrets,
        })
    }

    fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "<redacted>");
        }
        text
    }

    fn fetch_failed(&self, stderr: String) -> GitError {
        GitError::Fetch {
            url: self.display_url.clone(),
            stderr,
        }
    }

    fn revision_not_found(&self, wanted: &Wanted) -> GitError {
        GitError::RevisionNotFound {
            url: self.display_url.clone(),
            revision: wanted.to_string(),
        }
    }
}

/// `ext::sh -c …` and friends run arbitrary commands.
fn is_remote_helper_syntax(url: &str) -> bool {
    url.split_once("::").is_some_and(|(transport, _)| {
        !transport.is_empty()
            && transport
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}

/// Commands against one mirror, with the environment every one of them gets.
struct Git<'a> {
    mirror: &'a Mirror,
    remote: &'a Remote,
    settings: &'a Settings,
}

impl Git<'_> {
    /// Runs a command that must succeed; its stdout on success.
    async fn run_checked(
        &self,
        args: &[&str],
        input: Option<Vec<u8>>,
        operation: &'static str,
    ) -> Result<Vec<u8>, GitError> {
        let output = self
            .run(args, input, operation, self.settings.local_timeout, false)
            .await?;
        self.checked(args, output)
    }

    async fn run_in(
        &self,
        git_dir: &Path,
        args: &[&str],
        operation: &'static str,
    ) -> Result<Vec<u8>, GitError> {
        let command = self.command(git_dir, args, false);
        let output = self
            .spawn(command, None, operation, self.settings.local_timeout)
            .await?;
        self.checked(args, output)
    }

    fn checked(&self, args: &[&str], output: Output) -> Result<Vec<u8>, GitError> {
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(GitError::Git {
                command: self.remote.scrub(&args.join(" ")),
                stderr: self.remote.scrub(&stderr_text(&output)),
            })
        }
    }

    /// Runs a command that writes refs or config, marked so that a kill at
    /// its timeout is noticed and git's stale `*.lock` files are removed.
    async fn run_changing(
        &self,
        args: &[&str],
        operation: &'static str,
        network: bool,
    ) -> Result<Output, GitError> {
        let timeout = if network {
            self.settings.fetch_timeout
        } else {
            self.settings.local_timeout
        };
        self.mirror.begin_change().await?;
        let output = self.run(args, None, operation, timeout, network).await?;
        // Not reached when the command was killed at its timeout: the marker
        // stays for the next holder of the lock.
        self.mirror.end_change().await?;
        Ok(output)
    }

    async fn run(
        &self,
        args: &[&str],
        input: Option<Vec<u8>>,
        operation: &'static str,
        timeout: Duration,
        network: bool,
    ) -> Result<Output, GitError> {
        let command = self.command(&self.mirror.dir, args, network);
        self.spawn(command, input, operation, timeout).await
    }

    fn command(&self, git_dir: &Path, args: &[&str], network: bool) -> Command {
        let mut command = Command::new("git");
        // An auto gc left running in the background would be a second git
        // operation on the mirror, outside its lock and its timeout.
        command
            .arg("--git-dir")
            .arg(git_dir)
            .args(["-c", "gc.autoDetach=false"])
            .args(args);
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("GIT_") && !KEPT_GIT_VARS.contains(&name.as_ref()) {
                command.env_remove(name.as_ref());
            }
        }
        command
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            // Behaviour comes from the arguments, never from whoever's
            // ~/.gitconfig happens to be on the machine.
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_COUNT", "0")
            .env("GIT_LITERAL_PATHSPECS", "1")
            .env("GIT_ALLOW_PROTOCOL", "file:git:http:https:ssh")
            .env("LC_ALL", "C")
            // Killing git at its timeout leaves its transport helper behind;
            // this makes a stalled one give up on its own.
            .env("GIT_HTTP_LOW_SPEED_LIMIT", "1")
            .env(
                "GIT_HTTP_LOW_SPEED_TIME",
                self.settings
                    .fetch_timeout
                    .as_secs()
                    .clamp(1, 60)
                    .to_string(),
            );
        if std::env::var_os("GIT_SSH_COMMAND").is_none() && std::env::var_os("GIT_SSH").is_none() {
            // A password or passphrase prompt would hang until the timeout.
            command.env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes");
        }
        if network && let Some((key, value)) = &self.remote.auth {
            command
                .env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", key)
                .env("GIT_CONFIG_VALUE_0", value);
        }
        // The mirrors directory always exists; the process's own working
        // directory might not.
        if let Some(parent) = git_dir.parent() {
            command.current_dir(parent);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    async fn spawn(
        &self,
        mut command: Command,
        input: Option<Vec<u8>>,
        operation: &'static str,
        timeout: Duration,
    ) -> Result<Output, GitError> {
        if input.is_some() {
            command.stdin(Stdio::piped());
        }
        let mut child = command
            .spawn()
            .map_err(|source| GitError::Spawn { source })?;
        let stdin = child.stdin.take();
        // Written while stdout is read: git answers `cat-file --batch` as it
        // reads, and both pipes would fill up otherwise.
        let feed = async move {
            match (stdin, input) {
                (Some(mut stdin), Some(input)) => write_all(&mut stdin, &input).await,
                _ => Ok(()),
            }
        };
        let exchange = async { tokio::join!(feed, child.wait_with_output()) };
        // On timeout the child is dropped, and kill_on_drop kills it.
        let (fed, output) =
            tokio::time::timeout(timeout, exchange)
                .await
                .map_err(|_| GitError::Timeout {
                    url: self.remote.display_url.clone(),
                    operation,
                    after: timeout,
                })?;
        let output = output.map_err(|source| GitError::Spawn { source })?;
        match fed {
            // A git that failed stops reading; its stderr says why.
            Err(err) if output.status.success() => Err(GitError::Git {
                command: operation.to_owned(),
                stderr: format!("failed to write to git's stdin: {err}"),
            }),
            _ => Ok(output),
        }
    }

    /// The commit `wanted` names in the mirror as it is now, if any.
    async fn resolve(&self, wanted: &Wanted) -> Result<Option<String>, GitError> {
        let candidates = wanted.candidates();
        let mut input = candidates.join("\n").into_bytes();
        input.push(b'\n');
        let args = ["cat-file", "--batch-check=%(objectname) %(objecttype)"];
        let stdout = self.run_checked(&args, Some(input), "cat-file").await?;
        let stdout = String::from_utf8_lossy(&stdout);
        // One line per candidate: `<id> commit`, or `<name> missing` /
        // `<name> ambiguous`.
        Ok(stdout.lines().find_map(|line| {
            let (id, kind) = line.rsplit_once(' ')?;
            (kind == "commit" && is_full_commit_id(id)).then(|| id.to_owned())
        }))
    }

    async fn read_files(&self, commit: &str, path: &str) -> Result<Vec<SourceFile>, GitError> {
        let mut args = vec!["ls-tree", "-r", "-z", "--full-tree", commit, "--"];
        if !path.is_empty() {
            args.push(path);
        }
        let listing = self.run_checked(&args, None, "ls-tree").await?;
        let prefix = format!("{path}/");
        let mut blobs = Vec::new();
        for entry in listing.split(|b| *b == 0).filter(|e| !e.is_empty()) {
            let Some((mode, kind, id, name)) = parse_tree_entry(entry) else {
                return Err(self.unexpected(&args, "unexpected ls-tree output"));
            };
            if !path.is_empty() && name == path {
                return Err(GitError::NotADirectory {
                    path: path.to_owned(),
                    commit: commit.to_owned(),
                });
            }
            if !path.is_empty() && !name.starts_with(&prefix) {
                continue;
            }
            // Symlinks could point outside the path, and submodules are
            // another repository: neither is part of the source.
            if kind == "blob" && mode != "120000" {
                blobs.push((name, id));
            }
        }
        if blobs.is_empty() && !path.is_empty() {
            return Err(GitError::PathNotFound {
                path: path.to_owned(),
                commit: commit.to_owned(),
            });
        }
        if blobs.is_empty() {
            return Ok(Vec::new());
        }

        let mut input = Vec::with_capacity(blobs.len() * 41);
        for (_, id) in &blobs {
            input.extend_from_slice(id.as_bytes());
            input.push(b'\n');
        }
        let args = ["cat-file", "--batch"];
        let batch = self.run_checked(&args, Some(input), "cat-file").await?;
        let contents = parse_batch(&batch, blobs.len())
            .ok_or_else(|| self.unexpected(&args, "unexpected cat-file output"))?;
        let mut files: Vec<SourceFile> = blobs
            .into_iter()
            .zip(contents)
            .map(|((path, _), contents)| SourceFile { path, contents })
            .collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    fn unexpected(&self, args: &[&str], what: &str) -> GitError {
        GitError::Git {
            command: args.join(" "),
            stderr: what.to_owned(),
        }
    }
}

/// `<mode> SP <type> SP <id> TAB <path>`.
fn parse_tree_entry(entry: &[u8]) -> Option<(&str, &str, &str, String)> {
    let tab = entry.iter().position(|b| *b == b'\t')?;
    let meta = std::str::from_utf8(&entry[..tab]).ok()?;
    let mut fields = meta.split(' ');
    let (mode, kind, id) = (fields.next()?, fields.next()?, fields.next()?);
    // Git allows any bytes in a path; the rest of Setpoint works with text.
    let name = String::from_utf8_lossy(&entry[tab + 1..]).into_owned();
    Some((mode, kind, id, name))
}

/// `<id> SP <type> SP <size> LF <contents> LF`, once per object asked for.
fn parse_batch(mut batch: &[u8], expected: usize) -> Option<Vec<Vec<u8>>> {
    let mut contents = Vec::with_capacity(expected);
    while contents.len() < expected {
        let newline = batch.iter().position(|b| *b == b'\n')?;
        let header = std::str::from_utf8(&batch[..newline]).ok()?;
        let size: usize = header.rsplit(' ').next()?.parse().ok()?;
        let body = batch.get(newline + 1..newline + 1 + size)?;
        contents.push(body.to_vec());
        batch = batch.get(newline + 1 + size + 1..)?;
    }
    Some(contents)
}

async fn write_all(stdin: &mut ChildStdin, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let written = std::future::poll_fn(|cx| Pin::new(&mut *stdin).poll_write(cx, buf)).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[written..];
    }
    Ok(())
}

fn stderr_text(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr);
    let text = text.trim();
    if text.is_empty() {
        return format!("git exited with {}", output.status);
    }
    if text.len() <= MAX_STDERR {
        return text.to_owned();
    }
    let mut end = MAX_STDERR;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A repository URL, taken apart the way git reads it.
enum Location<'a> {
    Remote(RemoteUrl<'a>),
    /// An absolute local path.
    Local(String),
}

struct RemoteUrl<'a> {
    /// Lowercase; `None` for the scp-like `[user@]host:path`.
    scheme: Option<String>,
    userinfo: Option<&'a str>,
    /// Lowercase.
    host: String,
    port: Option<&'a str>,
    path: &'a str,
}

impl RemoteUrl<'_> {
    fn authority(&self) -> String {
        match self.port {
            Some(port) => format!("{}:{port}", self.host),
            None => self.host.clone(),
        }
    }

    fn default_port(&self) -> bool {
        let default = match self.scheme.as_deref() {
            Some("http") => "80",
            Some("https") => "443",
            Some("git") => "9418",
            _ => "22",
        };
        self.port.is_none_or(|port| port == default)
    }
}

impl<'a> Location<'a> {
    fn parse(url: &'a str) -> Location<'a> {
        let url = url.trim();
        if let Some((scheme, rest)) = url.split_once("://")
            && !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            let scheme = scheme.to_ascii_lowercase();
            if scheme == "file" {
                let path = rest.strip_prefix("localhost").unwrap_or(rest);
                return Location::Local(absolute(path));
            }
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let (userinfo, host_port) = match authority.rsplit_once('@') {
                Some((userinfo, host_port)) => (Some(userinfo), host_port),
                None => (None, authority),
            };
            let (host, port) = split_host_port(host_port);
            return Location::Remote(RemoteUrl {
                scheme: Some(scheme),
                userinfo,
                host: host.to_ascii_lowercase(),
                port,
                path,
            });
        }
        // Git's rule: a colon before any slash makes it scp-like ssh.
        if let Some(colon) = url.find(':')
            && url.find('/').is_none_or(|slash| colon < slash)
        {
            let (authority, path) = (&url[..colon], &url[colon + 1..]);
            let (userinfo, host) = match authority.rsplit_once('@') {
                Some((userinfo, host)) => (Some(userinfo), host),
                None => (None, authority),
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            return Location::Remote(RemoteUrl {
                scheme: None,
                userinfo,
                host: host.to_ascii_lowercase(),
                port: None,
                path,
            });
        }
        Location::Local(absolute(url))
    }

    fn key(&self) -> String {
        match self {
            Location::Local(path) => format!("file://{}", trim_trailing_slashes(path)),
            Location::Remote(remote) => {
                let mut path = trim_trailing_slashes(remote.path.trim_start_matches('/'));
                path = path.strip_suffix(".git").unwrap_or(path);
                path = path.trim_end_matches('/');
                let host = if remote.default_port() {
                    remote.host.clone()
                } else {
                    remote.authority()
                };
                if path.is_empty() {
                    host
                } else {
                    format!("{host}/{path}")
                }
            }
        }
    }

    fn display(&self) -> String {
        match self {
            Location::Local(path) => format!("file://{path}"),
            Location::Remote(remote) => match &remote.scheme {
                Some(scheme) => format!("{scheme}://{}{}", remote.authority(), remote.path),
                None => format!("{}:{}", remote.host, remote.path),
            },
        }
    }
}

fn split_host_port(host_port: &str) -> (&str, Option<&str>) {
    if host_port.starts_with('[')
        && let Some(end) = host_port.find(']')
    {
        let port = host_port[end + 1..].strip_prefix(':');
        return (&host_port[..=end], port.filter(|p| !p.is_empty()));
    }
    match host_port.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
            (host, Some(port).filter(|p| !p.is_empty()))
        }
        _ => (host_port, None),
    }
}

fn trim_trailing_slashes(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() && path.starts_with('/') {
        "/"
    } else {
        trimmed
    }
}

fn absolute(path: &str) -> String {
    std::path::absolute(path)
        .map(|path| path.to_string_lossy().into_owned())
        .unwrap_or_else(|_| path.to_owned())
}

/// The key two spellings of one repository share, also used to match a
/// webhook's repository to Applications: `github.com/org/repo` for
/// `https://github.com/org/repo.git`, `git@github.com:org/repo` and
/// `ssh://git@github.com/org/repo`; `file:///abs/path` for a local repository.
pub fn normalize_url(url: &str) -> String {
    Location::parse(url).key()
}

/// The URL as a person reads it: when its user info holds a secret (what
/// `Remote::new` scrubs: a password, or any user info over http(s), a
/// token) without it, as every error of this module shows it; otherwise as
/// written (`git@host:org/repo` keeps its user).
pub fn display_url(url: &str) -> String {
    let location = Location::parse(url);
    let secret = match &location {
        Location::Remote(remote) => remote.userinfo.is_some_and(|userinfo| {
            userinfo.contains(':') || matches!(remote.scheme.as_deref(), Some("http" | "https"))
        }),
        Location::Local(_) => false,
    };
    if secret {
        location.display()
    } else {
        url.trim().to_owned()
    }
}

/// `./apps/a/`, `/apps/a` and `apps//a` all mean `apps/a`; `None`, `""`,
/// `"."` and `"/"` mean the root, `""`.
pub fn normalize_path(path: Option<&str>) -> String {
    path.unwrap_or("")
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::process::Command as StdCommand;

    /// A repository made with the git CLI, independent of the machine's config.
    struct Origin {
        _dir: tempfile::TempDir,
        path: PathBuf,
    }

    impl Origin {
        fn new() -> Origin {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("origin");
            let origin = Origin { _dir: dir, path };
            std::fs::create_dir(&origin.path).unwrap();
            origin.git(&["init", "--quiet", "--initial-branch=main"]);
            origin
        }

        fn url(&self) -> String {
            self.path.to_string_lossy().into_owned()
        }

        fn git(&self, args: &[&str]) -> String {
            let output = StdCommand::new("git")
                .args(args)
                .current_dir(&self.path)
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_CONFIG_GLOBAL", "/dev/null")
                .env("GIT_AUTHOR_NAME", "Test")
                .env("GIT_AUTHOR_EMAIL", "test@example.com")
                .env("GIT_COMMITTER_NAME", "Test")
                .env("GIT_COMMITTER_EMAIL", "test@example.com")
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).unwrap().trim().to_owned()
        }

        fn write(&self, path: &str, contents: &str) {
            let path = self.path.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
        }

        fn commit(&self, message: &str) -> String {
            self.git(&["add", "--all"]);
            self.git(&["commit", "--quiet", "--allow-empty", "-m", message]);
            self.git(&["rev-parse", "HEAD"])
        }
    }

    struct Fixture {
        origin: Origin,
        _cache: tempfile::TempDir,
        source: GitSource,
    }

    impl Fixture {
        fn new() -> Fixture {
            let origin = Origin::new();
            let cache = tempfile::tempdir().unwrap();
            let source = GitSource::new(cache.path().to_owned());
            Fixture {
                origin,
                _cache: cache,
                source,
            }
        }

        async fn checkout(
            &self,
            revision: Option<&str>,
            path: Option<&str>,
        ) -> Result<Checkout, GitError> {
            let url = self.origin.url();
            self.source
                .checkout(&CheckoutRequest {
                    url: &url,
                    revision,
                    path,
                    ..Default::default()
                })
                .await
        }
    }

    fn names(checkout: &Checkout) -> Vec<&str> {
        checkout.files.iter().map(|f| f.path.as_str()).collect()
    }

    fn contents<'a>(checkout: &'a Checkout, path: &str) -> &'a str {
        let file = checkout.files.iter().find(|f| f.path == path).unwrap();
        std::str::from_utf8(&file.contents).unwrap()
    }

    #[test]
    fn git_source_is_cheap_to_share() {
        fn shareable<T: Clone + Send + Sync + 'static>() {}
        shareable::<GitSource>();
    }

    #[tokio::test]
    async fn default_branch() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "a: 1\n");
        let first = fx.origin.commit("first");
        fx.origin.git(&["checkout", "--quiet", "-b", "other"]);
        fx.origin.write("b.yaml", "b: 1\n");
        fx.origin.commit("on other");
        fx.origin.git(&["checkout", "--quiet", "main"]);

        for revision in [None, Some(""), Some("HEAD")] {
            let checkout = fx.checkout(revision, None).await.unwrap();
            assert_eq!(checkout.commit, first);
            assert_eq!(checkout.path, "");
            assert_eq!(names(&checkout), ["a.yaml"]);
            assert_eq!(contents(&checkout, "a.yaml"), "a: 1\n");
        }
    }

    #[tokio::test]
    async fn branch() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "main\n");
        fx.origin.commit("first");
        fx.origin.git(&["checkout", "--quiet", "-b", "feature/x"]);
        fx.origin.write("a.yaml", "feature\n");
        let feature = fx.origin.commit("feature");
        fx.origin.git(&["checkout", "--quiet", "main"]);

        let checkout = fx.checkout(Some("feature/x"), None).await.unwrap();
        assert_eq!(checkout.commit, feature);
        assert_eq!(contents(&checkout, "a.yaml"), "feature\n");

        let full_ref = fx.checkout(Some("refs/heads/feature/x"), None).await;
        assert_eq!(full_ref.unwrap().commit, feature);
    }

    #[tokio::test]
    async fn lightweight_and_annotated_tags_resolve_to_their_commit() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "v1\n");
        let v1 = fx.origin.commit("v1");
        fx.origin.git(&["tag", "v1"]);
        fx.origin.write("a.yaml", "v2\n");
        let v2 = fx.origin.commit("v2");
        fx.origin.git(&["tag", "-a", "v2", "-m", "release 2"]);
        fx.origin.write("a.yaml", "v3\n");
        fx.origin.commit("after");

        let checkout = fx.checkout(Some("v1"), None).await.unwrap();
        assert_eq!(checkout.commit, v1);
        assert_eq!(contents(&checkout, "a.yaml"), "v1\n");
        let checkout = fx.checkout(Some("v2"), None).await.unwrap();
        assert_eq!(checkout.commit, v2, "the commit, not the tag object");
        assert_eq!(contents(&checkout, "a.yaml"), "v2\n");
    }

    #[tokio::test]
    async fn full_and_short_commit_ids() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "old\n");
        let old = fx.origin.commit("old");
        fx.origin.write("a.yaml", "new\n");
        fx.origin.commit("new");

        let checkout = fx.checkout(Some(&old), None).await.unwrap();
        assert_eq!(checkout.commit, old);
        assert_eq!(contents(&checkout, "a.yaml"), "old\n");

        let upper = old.to_ascii_uppercase();
        assert_eq!(fx.checkout(Some(&upper), None).await.unwrap().commit, old);

        let checkout = fx.checkout(Some(&old[..8]), None).await.unwrap();
        assert_eq!(checkout.commit, old);
    }

    #[tokio::test]
    async fn missing_revision() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "a\n");
        fx.origin.commit("first");

        let err = fx.checkout(Some("v9"), None).await.unwrap_err();
        assert!(matches!(err, GitError::RevisionNotFound { .. }), "{err:?}");
        assert!(!err.is_transient());
        let expected = format!(
            "revision v9 not found in file://{} (no branch, tag or commit by that name)",
            fx.origin.url()
        );
        assert_eq!(err.to_string(), expected);

        let missing_commit = "0123456789abcdef0123456789abcdef01234567";
        let err = fx.checkout(Some(missing_commit), None).await.unwrap_err();
        assert!(matches!(err, GitError::RevisionNotFound { .. }), "{err:?}");

        // Rev syntax is not a revision name, and does not cost a fetch.
        let fetches = fx.source.fetch_count();
        for revision in ["main~1", "main^{tree}", "-main", "main@{1}", "a..b"] {
            let err = fx.checkout(Some(revision), None).await.unwrap_err();
            assert!(matches!(err, GitError::RevisionNotFound { .. }), "{err:?}");
        }
        assert_eq!(fx.source.fetch_count(), fetches);
    }

    #[tokio::test]
    async fn missing_path_and_a_file_as_path() {
        let fx = Fixture::new();
        fx.origin.write("apps/a/x.yaml", "x\n");
        let commit = fx.origin.commit("first");

        let err = fx.checkout(None, Some("apps/b")).await.unwrap_err();
        assert!(matches!(err, GitError::PathNotFound { .. }), "{err:?}");
        assert!(!err.is_transient());
        assert_eq!(
            err.to_string(),
            format!("path apps/b not found at commit {commit} (no files under it)")
        );
        // A prefix of a name is not a directory.
        let err = fx.checkout(None, Some("apps/a/x")).await.unwrap_err();
        assert!(matches!(err, GitError::PathNotFound { .. }), "{err:?}");

        let err = fx.checkout(None, Some("apps/a/x.yaml")).await.unwrap_err();
        assert!(matches!(err, GitError::NotADirectory { .. }), "{err:?}");
        assert!(!err.is_transient());
        assert!(err.to_string().contains("must be a directory"), "{err}");
    }

    #[tokio::test]
    async fn files_under_path_nested_and_sorted() {
        let fx = Fixture::new();
        fx.origin.write("apps/a/z.yaml", "z\n");
        fx.origin.write("apps/a/sub/deeper/b.yaml", "b\n");
        fx.origin.write("apps/a/a.yaml", "a\n");
        fx.origin.write("apps/a-b/c.yaml", "other app\n");
        fx.origin.write("apps/ab/d.yaml", "other app\n");
        fx.origin.write("root.yaml", "root\n");
        std::os::unix::fs::symlink("../../root.yaml", fx.origin.path.join("apps/a/link.yaml"))
            .unwrap();
        let commit = fx.origin.commit("first");

        for path in ["apps/a", "./apps/a/", "/apps/a", "apps//a"] {
            let checkout = fx.checkout(None, Some(path)).await.unwrap();
            assert_eq!(checkout.commit, commit);
            assert_eq!(checkout.path, "apps/a");
            assert_eq!(
                names(&checkout),
                ["apps/a/a.yaml", "apps/a/sub/deeper/b.yaml", "apps/a/z.yaml"]
            );
            assert_eq!(contents(&checkout, "apps/a/sub/deeper/b.yaml"), "b\n");
        }

        let root = fx.checkout(None, Some(".")).await.unwrap();
        assert_eq!(root.path, "");
        assert_eq!(root.files.len(), 6);
        assert!(root.files.windows(2).all(|w| w[0].path < w[1].path));
    }

    #[tokio::test]
    async fn empty_tree_at_root_is_no_files() {
        let fx = Fixture::new();
        let commit = fx.origin.commit("empty");
        let checkout = fx.checkout(None, None).await.unwrap();
        assert_eq!(checkout.commit, commit);
        assert!(checkout.files.is_empty());
    }

    #[test]
    fn path_normalization() {
        for (input, expected) in [
            (None, ""),
            (Some(""), ""),
            (Some("."), ""),
            (Some("/"), ""),
            (Some("./"), ""),
            (Some("apps/a"), "apps/a"),
            (Some("./apps/a/"), "apps/a"),
            (Some("/apps/a"), "apps/a"),
            (Some("apps//a"), "apps/a"),
            (Some("apps/./a/."), "apps/a"),
        ] {
            assert_eq!(normalize_path(input), expected, "{input:?}");
        }
    }

    #[tokio::test]
    async fn fetch_skipped_when_the_commit_is_known() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "a\n");
        let commit = fx.origin.commit("first");
        let url = fx.origin.url();

        fx.checkout(Some("main"), None).await.unwrap();
        assert_eq!(fx.source.fetch_count(), 1);

        for revision in [Some("main"), None] {
            let request = CheckoutRequest {
                url: &url,
                revision,
                known_commit: Some(&commit),
                ..Default::default()
            };
            let checkout = fx.source.checkout(&request).await.unwrap();
            assert_eq!(checkout.commit, commit);
        }
        // A commit id already in the mirror needs no fetch either.
        fx.checkout(Some(&commit), None).await.unwrap();
        assert_eq!(fx.source.fetch_count(), 1);

        // A known commit the mirror does not have yet is fetched.
        fx.origin.write("a.yaml", "b\n");
        let next = fx.origin.commit("second");
        let request = CheckoutRequest {
            url: &url,
            revision: Some("main"),
            known_commit: Some(&next),
            ..Default::default()
        };
        assert_eq!(fx.source.checkout(&request).await.unwrap().commit, next);
        assert_eq!(fx.source.fetch_count(), 2);
    }

    #[tokio::test]
    async fn incremental_fetch_picks_up_new_commits_and_deleted_branches() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "1\n");
        let first = fx.origin.commit("first");
        fx.origin.git(&["branch", "doomed"]);
        assert_eq!(fx.checkout(Some("main"), None).await.unwrap().commit, first);
        assert_eq!(
            fx.checkout(Some("doomed"), None).await.unwrap().commit,
            first
        );

        fx.origin.write("a.yaml", "2\n");
        let second = fx.origin.commit("second");
        fx.origin.git(&["branch", "--quiet", "-D", "doomed"]);

        let checkout = fx.checkout(Some("main"), None).await.unwrap();
        assert_eq!(checkout.commit, second);
        assert_eq!(contents(&checkout, "a.yaml"), "2\n");
        let err = fx.checkout(Some("doomed"), None).await.unwrap_err();
        assert!(matches!(err, GitError::RevisionNotFound { .. }), "{err:?}");
        // The earlier commit stays readable by id.
        let old = fx.checkout(Some(&first), None).await.unwrap();
        assert_eq!(contents(&old, "a.yaml"), "1\n");
    }

    #[tokio::test]
    async fn concurrent_checkouts_share_the_mirror() {
        let fx = Fixture::new();
        for app in 0..8 {
            fx.origin
                .write(&format!("apps/{app}/deploy.yaml"), &format!("app: {app}\n"));
        }
        let commit = fx.origin.commit("apps");
        let url = fx.origin.url();

        let mut tasks = Vec::new();
        for app in 0..8 {
            let source = fx.source.clone();
            let url = url.clone();
            tasks.push(tokio::spawn(async move {
                let path = format!("apps/{app}");
                let request = CheckoutRequest {
                    url: &url,
                    path: Some(&path),
                    ..Default::default()
                };
                source.checkout(&request).await
            }));
        }
        for (app, task) in tasks.into_iter().enumerate() {
            let checkout = task.await.unwrap().unwrap();
            assert_eq!(checkout.commit, commit);
            let expected = format!("app: {app}\n");
            assert_eq!(
                contents(&checkout, &format!("apps/{app}/deploy.yaml")),
                expected
            );
        }
        let fetches = fx.source.fetch_count();
        assert!((1..8).contains(&fetches), "{fetches} fetches");
    }

    #[tokio::test]
    async fn sources_in_two_processes_share_the_cache_dir() {
        // Two GitSources have separate in-process locks, as two processes
        // would; only the lock file keeps them apart.
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "a\n");
        let commit = fx.origin.commit("first");
        let url = fx.origin.url();
        let other = GitSource::new(fx._cache.path().to_owned());

        let mut tasks = Vec::new();
        for source in [&fx.source, &other, &fx.source, &other] {
            let source = source.clone();
            let url = url.clone();
            tasks.push(tokio::spawn(async move {
                let request = CheckoutRequest {
                    url: &url,
                    ..Default::default()
                };
                source.checkout(&request).await
            }));
        }
        for task in tasks {
            assert_eq!(task.await.unwrap().unwrap().commit, commit);
        }
    }

    #[tokio::test]
    async fn spellings_of_one_repository_share_a_mirror() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "a\n");
        let commit = fx.origin.commit("first");
        let url = fx.origin.url();
        let file_url = format!("file://{url}/");

        for spelling in [&url, &file_url] {
            let request = CheckoutRequest {
                url: spelling,
                revision: Some(&commit),
                ..Default::default()
            };
            fx.source.checkout(&request).await.unwrap();
        }
        assert_eq!(fx.source.fetch_count(), 1);

        let mirrors: Vec<String> = std::fs::read_dir(fx._cache.path().join("mirrors"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| !name.ends_with(".lock"))
            .collect();
        let key = normalize_url(&url);
        let digest = hex::encode(Sha256::digest(key.as_bytes()));
        assert_eq!(mirrors, [format!("{}-origin", &digest[..16])]);
    }

    #[tokio::test]
    async fn a_remote_head_naming_a_missing_branch_leaves_branches_usable() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "a\n");
        let commit = fx.origin.commit("first");
        fx.origin
            .git(&["symbolic-ref", "HEAD", "refs/heads/nothing"]);

        let checkout = fx.checkout(Some("main"), None).await.unwrap();
        assert_eq!(checkout.commit, commit);
        let err = fx.checkout(None, None).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "revision HEAD not found in file://{} (the repository has no default branch)",
                fx.origin.url()
            )
        );
    }

    #[tokio::test]
    async fn a_killed_fetch_does_not_wedge_the_mirror() {
        let fx = Fixture::new();
        fx.origin.write("a.yaml", "1\n");
        fx.origin.commit("first");
        fx.checkout(Some("main"), None).await.unwrap();

        // What a fetch killed at its timeout leaves behind.
        let mirror = fx.source.mirror(&normalize_url(&fx.origin.url()));
        std::fs::write(mirror.dir.join("refs/heads/main.lock"), "").unwrap();
        std::fs::write(&mirror.changing_marker, "").unwrap();

        fx.origin.write("a.yaml", "2\n");
        let second = fx.origin.commit("second");
        let checkout = fx.checkout(Some("main"), None).await.unwrap();
        assert_eq!(checkout.commit, second);
        assert!(!mirror.changing_marker.exists());
    }

    #[test]
    fn url_normalization() {
        for (url, expected) in [
            ("https://github.com/org/repo", "github.com/org/repo"),
            ("https://github.com/org/repo.git", "github.com/org/repo"),
            ("https://github.com/org/repo.git/", "github.com/org/repo"),
            ("https://github.com/org/repo/", "github.com/org/repo"),
            ("HTTPS://GitHub.COM/org/Repo", "github.com/org/Repo"),
            ("http://github.com/org/repo", "github.com/org/repo"),
            ("ssh://git@github.com/org/repo.git", "github.com/org/repo"),
            ("git@github.com:org/repo.git", "github.com/org/repo"),
            ("git@GitHub.com:org/repo", "github.com/org/repo"),
            ("github.com:org/repo", "github.com/org/repo"),
            (
                "https://user:secret@github.com/org/repo",
                "github.com/org/repo",
            ),
            ("https://token@github.com/org/repo", "github.com/org/repo"),
            ("https://github.com:443/org/repo", "github.com/org/repo"),
            ("http://github.com:80/org/repo", "github.com/org/repo"),
            ("ssh://git@github.com:22/org/repo", "github.com/org/repo"),
            ("git://github.com:9418/org/repo", "github.com/org/repo"),
            (
                "https://git.example.com:8443/org/repo",
                "git.example.com:8443/org/repo",
            ),
            (
                "ssh://git@git.example.com:2222/org/repo",
                "git.example.com:2222/org/repo",
            ),
            ("http://[::1]:8080/org/repo", "[::1]:8080/org/repo"),
            (
                "https://gitlab.com/group/sub/repo.git",
                "gitlab.com/group/sub/repo",
            ),
            ("  https://github.com/org/repo  ", "github.com/org/repo"),
            ("/tmp/x/origin.git", "file:///tmp/x/origin.git"),
            ("/tmp/x/origin.git/", "file:///tmp/x/origin.git"),
            ("file:///tmp/x/origin.git", "file:///tmp/x/origin.git"),
            ("file:///tmp/x/origin/", "file:///tmp/x/origin"),
            ("file://localhost/tmp/x/origin", "file:///tmp/x/origin"),
        ] {
            assert_eq!(normalize_url(url), expected, "{url}");
        }
        let relative = normalize_url("./repo");
        assert!(relative.starts_with("file:///"), "{relative}");
        assert!(relative.ends_with("/repo"), "{relative}");
    }

    #[tokio::test]
    async fn invalid_urls_are_rejected_before_git_runs() {
        let cache = tempfile::tempdir().unwrap();
        let source = GitSource::new(cache.path().to_owned());
        for url in [
            "",
            "--upload-pack=touch /tmp/pwned",
            "ext::sh -c touch% /tmp/pwned",
            "ftp://example.com/repo",
            "https://",
        ] {
            let request = CheckoutRequest {
                url,
                ..Default::default()
            };
            let err = source.checkout(&request).await.unwrap_err();
            assert!(matches!(err, GitError::InvalidUrl { .. }), "{url}: {err:?}");
            assert!(!err.is_transient());
        }
        assert_eq!(source.fetch_count(), 0);
    }

    #[test]
    fn credentials_debug_redacts_the_password() {
        let credentials = Credentials {
            username: "bot".into(),
            password: "hunter2".into(),
        };
        let debug = format!("{credentials:?}");
        assert!(debug.contains("bot"), "{debug}");
        assert!(!debug.contains("hunter2"), "{debug}");
    }

    fn assert_no_secret(text: &str, credentials: &Credentials) {
        let token = BASE64.encode(format!("{}:{}", credentials.username, credentials.password));
        assert!(!text.contains(&credentials.password), "{text}");
        assert!(!text.contains(&token), "{text}");
    }

    #[tokio::test]
    async fn credentials_never_appear_in_errors() {
        let cache = tempfile::tempdir().unwrap();
        let source =
            GitSource::new(cache.path().to_owned()).with_fetch_retry_budget(Duration::ZERO);
        let credentials = Credentials {
            username: "bot".into(),
            password: "s3cr3t-password".into(),
        };
        for url in [
            "http://127.0.0.1:1/org/repo.git",
            "http://bot:s3cr3t-password@127.0.0.1:1/org/repo.git",
        ] {
            let request = CheckoutRequest {
                url,
                credentials: Some(&credentials),
                ..Default::default()
            };
            let err = source.checkout(&request).await.unwrap_err();
            assert!(matches!(err, GitError::Fetch { .. }), "{err:?}");
            assert!(err.is_transient());
            let text = format!("{err} {err:?}");
            assert!(text.contains("http://127.0.0.1:1/org/repo.git"), "{text}");
            assert_no_secret(&text, &credentials);
        }
    }

    /// Accepts one HTTP request, returns its head, answers with `response`
    /// (or nothing, holding the connection, when `None`).
    fn one_shot_server(response: Option<&'static str>) -> (u16, std::sync::mpsc::Receiver<String>) {
        use std::io::{BufRead, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = io::BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            sender.send(head).unwrap();
            match response {
                Some(response) => {
                    let mut stream = stream;
                    let _ = stream.write_all(response.as_bytes());
                }
                // Hold the connection until the client gives up.
                None => while reader.read_line(&mut String::new()).unwrap_or(0) > 0 {},
            }
        });
        (port, receiver)
    }

    #[tokio::test]
    async fn credentials_travel_as_a_header() {
        let (port, requests) = one_shot_server(Some(
            "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        ));
        let cache = tempfile::tempdir().unwrap();
        let source =
            GitSource::new(cache.path().to_owned()).with_fetch_retry_budget(Duration::ZERO);
        let credentials = Credentials {
            username: "bot".into(),
            password: "s3cr3t-password".into(),
        };
        let url = format!("http://127.0.0.1:{port}/org/repo.git");
        let request = CheckoutRequest {
            url: &url,
            credentials: Some(&credentials),
            ..Default::default()
        };
        let err = source.checkout(&request).await.unwrap_err();
        assert!(matches!(err, GitError::Fetch { .. }), "{err:?}");
        assert_no_secret(&format!("{err} {err:?}"), &credentials);

        let head = requests.recv().unwrap();
        let token = BASE64.encode("bot:s3cr3t-password");
        assert!(
            head.contains(&format!("Authorization: Basic {token}")),
            "{head}"
        );
    }

    #[tokio::test]
    async fn a_stalled_fetch_times_out() {
        let (port, _requests) = one_shot_server(None);
        let cache = tempfile::tempdir().unwrap();
        let source = GitSource::new(cache.path().to_owned())
            .with_fetch_retry_budget(Duration::ZERO)
            .with_fetch_timeout(Duration::from_millis(500));
        let url = format!("http://127.0.0.1:{port}/org/repo.git");
        let request = CheckoutRequest {
            url: &url,
            ..Default::default()
        };
        let err = source.checkout(&request).await.unwrap_err();
        assert!(matches!(err, GitError::Timeout { .. }), "{err:?}");
        assert!(err.is_transient());
        assert_eq!(
            err.to_string(),
            format!("git fetch for {url} timed out after 500ms")
        );
    }
}
