//! Records as files under the cache directory, for `setpoint run` with its
//! in-process queue: one empty file per record, named by its key, whose
//! modification time is when it was accepted. They survive a restart.
//!
//! A new record is created with `O_EXCL`, so two processes sharing the
//! directory cannot both claim it; replacing an expired record is a remove
//! and a create, serialized within the process.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::{DedupeError, RecordKey, Seen};

pub struct FileSeen {
    dir: PathBuf,
    window: Duration,
    /// Serializes claims in this process, and when expired files were last
    /// swept away.
    last_sweep: Mutex<SystemTime>,
}

impl FileSeen {
    /// Creates `dir` if needed.
    pub fn new(dir: PathBuf, window: Duration) -> Result<Self, DedupeError> {
        std::fs::create_dir_all(&dir).map_err(|e| io_error("create", &dir, e))?;
        Ok(Self {
            dir,
            window,
            last_sweep: Mutex::new(SystemTime::UNIX_EPOCH),
        })
    }

    fn path(&self, key: &RecordKey) -> PathBuf {
        self.dir.join(key.as_str())
    }

    fn expired(&self, path: &Path, now: SystemTime) -> std::io::Result<bool> {
        let modified = std::fs::metadata(path)?.modified()?;
        Ok(now.duration_since(modified).unwrap_or_default() >= self.window)
    }

    /// Removes the expired records, at most once a window.
    fn sweep(&self, now: SystemTime, last: &mut SystemTime) {
        if now.duration_since(*last).unwrap_or_default() < self.window {
            return;
        }
        *last = now;
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if self.expired(&path, now).unwrap_or(false) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}

#[async_trait]
impl Seen for FileSeen {
    async fn claim(&self, key: &RecordKey) -> Result<bool, DedupeError> {
        let path = self.path(key);
        let now = SystemTime::now();
        let mut last = self
            .last_sweep
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.sweep(now, &mut last);
        match self.expired(&path, now) {
            Ok(false) => return Ok(false),
            Ok(true) => match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("remove", &path, e)),
            },
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("read", &path, e)),
        }
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(_) => Ok(true),
            // Another process claimed it in between.
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io_error("create", &path, e)),
        }
    }

    async fn forget(&self, key: &RecordKey) -> Result<(), DedupeError> {
        let path = self.path(key);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_error("remove", &path, e)),
        }
    }
}

fn io_error(what: &str, path: &Path, error: std::io::Error) -> DedupeError {
    DedupeError::Unavailable(format!("failed to {what} {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_survive_a_new_store_on_the_same_directory() {
        let dir = tempfile::tempdir().unwrap();
        let key = RecordKey::new(&[b"push", b"github.com/org/repo"]);
        let before = FileSeen::new(dir.path().join("seen"), Duration::from_secs(300)).unwrap();
        assert!(before.claim(&key).await.unwrap());
        assert!(!before.claim(&key).await.unwrap());
        drop(before);
        // A restart.
        let after = FileSeen::new(dir.path().join("seen"), Duration::from_secs(300)).unwrap();
        assert!(!after.claim(&key).await.unwrap());
        after.forget(&key).await.unwrap();
        assert!(after.claim(&key).await.unwrap());
    }

    #[tokio::test]
    async fn an_expired_record_is_claimed_again_and_swept() {
        let dir = tempfile::tempdir().unwrap();
        let seen = FileSeen::new(dir.path().to_path_buf(), Duration::from_secs(60)).unwrap();
        let (old, other) = (RecordKey::new(&[b"old"]), RecordKey::new(&[b"other"]));
        assert!(seen.claim(&old).await.unwrap());
        assert!(seen.claim(&other).await.unwrap());
        // Both accepted two minutes ago.
        let past = SystemTime::now() - Duration::from_secs(120);
        for key in [&old, &other] {
            std::fs::File::options()
                .write(true)
                .open(seen.path(key))
                .unwrap()
                .set_modified(past)
                .unwrap();
        }
        *seen.last_sweep.lock().unwrap() = past;
        assert!(seen.claim(&old).await.unwrap());
        assert!(!seen.path(&other).exists(), "swept");
    }
}
