//! What the webhook has accepted lately, so a delivery sent again is not
//! enqueued again: GitHub's redeliveries keep their delivery id, and a
//! captured push replayed under a new id (GitHub's signature does not cover
//! the id) still carries the same repository, ref and commits.
//!
//! A record lives for the replay window and is shared by every process that
//! receives webhooks, so neither a restart nor another replica accepts it
//! again: on RabbitMQ (`amqp`) when there is one, in files under the cache
//! directory (`file`) for `setpoint run` with its in-process queue, in
//! memory (`MemorySeen`) for tests.
//!
//! A claim is atomic where the store is shared: of two replicas given the
//! same replay at once, one enqueues it.

pub mod amqp;
pub mod file;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sha2::{Digest, Sha256};

/// The default replay window.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum DedupeError {
    /// The store cannot say whether a delivery was seen: the webhook answers
    /// 503 rather than guess.
    #[error("the replay store is unavailable: {0}")]
    Unavailable(String),
}

/// The fixed-length name of one record (hex SHA-256 of what identifies the
/// delivery): request text never reaches a file name or a queue name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RecordKey(String);

impl RecordKey {
    pub fn new(parts: &[&[u8]]) -> Self {
        let mut hash = Sha256::new();
        for part in parts {
            // Length-prefixed, so ("ab", "c") and ("a", "bc") differ.
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part);
        }
        Self(hex::encode(&hash.finalize()[..16]))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Where records are kept.
#[async_trait]
pub trait Seen: Send + Sync {
    /// Records `key` unless a record of it younger than the window exists:
    /// `true` when this call recorded it (the delivery is new).
    async fn claim(&self, key: &RecordKey) -> Result<bool, DedupeError>;
    /// Removes a record this process claimed whose delivery then failed, so
    /// the Git host's retry goes through.
    async fn forget(&self, key: &RecordKey) -> Result<(), DedupeError>;
}

/// Records in this process only, for tests and static setups.
pub struct MemorySeen {
    window: Duration,
    records: Mutex<HashMap<RecordKey, Instant>>,
}

impl MemorySeen {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            records: Mutex::default(),
        }
    }
}

#[async_trait]
impl Seen for MemorySeen {
    async fn claim(&self, key: &RecordKey) -> Result<bool, DedupeError> {
        let now = Instant::now();
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        records.retain(|_, at| now.duration_since(*at) < self.window);
        if records.contains_key(key) {
            return Ok(false);
        }
        records.insert(key.clone(), now);
        Ok(true)
    }

    async fn forget(&self, key: &RecordKey) -> Result<(), DedupeError> {
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(key);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_length_hex_and_separate_their_parts() {
        let key = RecordKey::new(&[b"github", b"d-1\n../../etc"]);
        assert_eq!(key.as_str().len(), 32);
        assert!(key.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(
            RecordKey::new(&[b"ab", b"c"]),
            RecordKey::new(&[b"a", b"bc"])
        );
        assert_eq!(RecordKey::new(&[b"a", b"b"]), RecordKey::new(&[b"a", b"b"]));
    }

    #[tokio::test]
    async fn memory_records_expire_after_the_window_and_can_be_forgotten() {
        let seen = MemorySeen::new(Duration::from_millis(200));
        let key = RecordKey::new(&[b"k"]);
        assert!(seen.claim(&key).await.unwrap());
        assert!(!seen.claim(&key).await.unwrap());
        seen.forget(&key).await.unwrap();
        assert!(seen.claim(&key).await.unwrap());
        let expiry = Instant::now() + Duration::from_secs(5);
        while !seen.claim(&key).await.unwrap() {
            assert!(Instant::now() < expiry, "the record never expired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
