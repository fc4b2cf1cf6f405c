//! The files of (repository, commit, path), kept in memory once read: a
//! commit never changes, so a sweep over in-sync Applications, and every
//! reconcile after the first at one commit, reads them without running git.
//! Bounded by the bytes it holds; the least recently used entry goes first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::SourceFile;

/// 64 MiB: about 30,000 Applications of four small manifests each.
pub(super) const DEFAULT_BUDGET: usize = 64 << 20;

/// `(mirror key, commit, path)`.
type Key = (String, String, String);

pub(super) struct FileCache {
    budget: usize,
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    map: HashMap<Key, Entry>,
    bytes: usize,
    clock: u64,
}

struct Entry {
    used: u64,
    bytes: usize,
    files: Arc<Vec<SourceFile>>,
}

impl FileCache {
    pub(super) fn new(budget: usize) -> Self {
        FileCache {
            budget,
            inner: Mutex::default(),
        }
    }

    pub(super) fn get(&self, repo: &str, commit: &str, path: &str) -> Option<Arc<Vec<SourceFile>>> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.clock += 1;
        let now = inner.clock;
        let key = (repo.to_owned(), commit.to_owned(), path.to_owned());
        let entry = inner.map.get_mut(&key)?;
        entry.used = now;
        Some(Arc::clone(&entry.files))
    }

    pub(super) fn insert(&self, repo: &str, commit: &str, path: &str, files: Arc<Vec<SourceFile>>) {
        let bytes = files
            .iter()
            .map(|f| f.path.len() + f.contents.len())
            .sum::<usize>()
            + path.len()
            + commit.len()
            + repo.len();
        if bytes > self.budget / 4 {
            // One huge tree must not push out everything else.
            return;
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.clock += 1;
        let used = inner.clock;
        let key = (repo.to_owned(), commit.to_owned(), path.to_owned());
        if let Some(old) = inner.map.insert(key, Entry { used, bytes, files }) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        while inner.bytes > self.budget {
            let Some(oldest) = inner
                .map
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(key, _)| key.clone())
            else {
                break;
            };
            if let Some(entry) = inner.map.remove(&oldest) {
                inner.bytes -= entry.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(size: usize) -> Arc<Vec<SourceFile>> {
        Arc::new(vec![SourceFile {
            path: "a".into(),
            contents: vec![b'x'; size],
        }])
    }

    #[test]
    fn entries_are_keyed_by_repository_commit_and_path() {
        let cache = FileCache::new(1 << 20);
        cache.insert("r", "c1", "apps/a", files(10));
        assert!(cache.get("r", "c1", "apps/a").is_some());
        assert!(cache.get("r", "c2", "apps/a").is_none());
        assert!(cache.get("r", "c1", "apps/b").is_none());
        assert!(cache.get("other", "c1", "apps/a").is_none());
    }

    #[test]
    fn the_least_recently_used_goes_first_when_over_budget() {
        let cache = FileCache::new(1000);
        cache.insert("r", "c", "a", files(200));
        cache.insert("r", "c", "b", files(200));
        cache.insert("r", "c", "c", files(200));
        // `a` is used again: `b` is now the oldest.
        assert!(cache.get("r", "c", "a").is_some());
        cache.insert("r", "c", "d", files(200));
        cache.insert("r", "c", "e", files(200));
        assert!(cache.get("r", "c", "b").is_none());
        assert!(cache.get("r", "c", "a").is_some());
        assert!(cache.get("r", "c", "e").is_some());
        // Larger than a quarter of the budget: not kept at all.
        cache.insert("r", "c", "huge", files(300));
        assert!(cache.get("r", "c", "huge").is_none());
    }
}
