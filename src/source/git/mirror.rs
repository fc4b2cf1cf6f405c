//! The bare mirror of one repository in the cache: where it lives, the locks
//! that serialize its use across tasks and processes, its creation, and the
//! repair of one whose last change was killed half-way.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::command::Git;
use super::remote::Remote;
use super::{GitError, Settings};

/// One bare repository in the cache and the locks that serialize its use.
pub(super) struct Mirror {
    pub(super) dir: PathBuf,
    lock_file: PathBuf,
    /// Present while a command that changes refs runs; found at lock time, it
    /// means that command was killed and may have left `*.lock` files behind.
    pub(super) changing_marker: PathBuf,
    /// In-process exclusion; the lock file adds exclusion across processes.
    process_lock: tokio::sync::Mutex<()>,
    /// Fetch generations: the number of fetches started, and the highest
    /// generation that completed. A caller that waited for the lock skips its
    /// fetch when one started after it began waiting has completed.
    pub(super) fetches_started: AtomicU64,
    pub(super) fetches_completed: AtomicU64,
    /// When the newest completed fetch started (wall clock, as events
    /// carry), per caller's credentials.
    last_fetch_started: Mutex<HashMap<String, SystemTime>>,
    /// What each revision resolved to since this process last changed the
    /// mirror's refs (cleared as a change begins): a reconcile whose
    /// revision is known and needs no fetch skips the lock and `git`.
    resolved: Mutex<HashMap<String, String>>,
}

/// Held for the whole checkout: the in-process guard and the locked file.
pub(super) struct MirrorLock<'a> {
    _process: tokio::sync::MutexGuard<'a, ()>,
    _file: std::fs::File,
}

impl Mirror {
    pub(super) fn new(mirrors_dir: &Path, key: &str) -> Self {
        let name = mirror_name(key);
        Mirror {
            dir: mirrors_dir.join(&name),
            lock_file: mirrors_dir.join(format!("{name}.lock")),
            changing_marker: mirrors_dir.join(format!("{name}.changing")),
            process_lock: tokio::sync::Mutex::new(()),
            fetches_started: AtomicU64::new(0),
            fetches_completed: AtomicU64::new(0),
            last_fetch_started: Mutex::default(),
            resolved: Mutex::default(),
        }
    }

    /// Records a completed fetch that started at `started`, made with the
    /// credentials `caller` stands for (see [`Remote::caller`]).
    pub(super) fn fetched(&self, caller: &str, started: SystemTime) {
        let mut last = self
            .last_fetch_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let previous = last.entry(caller.to_owned()).or_insert(started);
        if *previous < started {
            *previous = started;
        }
    }

    /// When the newest completed fetch of this process with `caller`'s
    /// credentials started: another caller's fetch says nothing about
    /// whether this one may read the repository.
    pub(super) fn last_fetch_started(&self, caller: &str) -> Option<SystemTime> {
        self.last_fetch_started
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(caller)
            .copied()
    }

    pub(super) async fn lock(&self) -> Result<MirrorLock<'_>, GitError> {
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
    pub(super) async fn prepare(
        &self,
        remote: &Remote,
        settings: &Settings,
    ) -> Result<(), GitError> {
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

    /// The commit `revision` (its lookup candidates) resolved to, unless
    /// the refs changed since.
    pub(super) fn resolved(&self, revision: &str) -> Option<String> {
        self.resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(revision)
            .cloned()
    }

    pub(super) fn remember_resolved(&self, revision: String, commit: String) {
        let mut resolved = self.resolved.lock().unwrap_or_else(PoisonError::into_inner);
        // Bounded: names a reconcile asks for (branches, tags, commits).
        if resolved.len() >= 10_000 {
            resolved.clear();
        }
        resolved.insert(revision, commit);
    }

    pub(super) async fn begin_change(&self) -> Result<(), GitError> {
        self.resolved
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        tokio::fs::write(&self.changing_marker, b"")
            .await
            .map_err(GitError::io(&self.changing_marker))
    }

    pub(super) async fn end_change(&self) -> Result<(), GitError> {
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
