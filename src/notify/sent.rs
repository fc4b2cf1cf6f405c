//! The notifications already delivered, by id: a delivery looks its id up
//! before posting and records it after the Provider's 2xx, so a
//! notification redelivered by the queue (its worker killed after the post,
//! before the ack) is not posted twice.
//!
//! The webhook's replay store (`ingest/webhook/dedupe/`) claims a key
//! before its work and forgets it after a failure; a notification must be
//! recorded only after its post succeeded (a worker killed between a claim
//! and the post would lose it), so it needs a look-up that records
//! nothing: hence this store, laid out as that one (one record per key
//! hash, for a window).
//!
//! - `AmqpSent`: on RabbitMQ, shared by every worker: a record is a queue
//!   `<prefix>.notify-sent.<window ms>.<key>` holding at most one message
//!   that lives for the window; a look-up declares the queue (the same
//!   arguments, so it never fails on a missing one) and reads its message
//!   count.
//! - `FileSent`: one empty file per record under the cache directory
//!   (`setpoint run` with its in-process queue).
//! - `MemorySent`: in process, for tests.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::ingest::webhook::dedupe::RecordKey;

/// How long a delivered id is remembered: longer than an event's retries
/// take before it is parked.
pub const WINDOW: Duration = Duration::from_secs(3600);
/// How long one look-up or record may wait for RabbitMQ.
const TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, thiserror::Error)]
pub enum SentError {
    #[error("the delivered-notifications store is unavailable: {0}")]
    Unavailable(String),
}

#[async_trait]
pub trait Sent: Send + Sync {
    /// Whether `id` was delivered within the window.
    async fn delivered(&self, id: &str) -> Result<bool, SentError>;
    /// `id` was delivered.
    async fn record(&self, id: &str) -> Result<(), SentError>;
}

fn key(id: &str) -> RecordKey {
    RecordKey::new(&[b"notification", id.as_bytes()])
}

/// Records in this process only.
#[derive(Default)]
pub struct MemorySent {
    records: Mutex<HashMap<RecordKey, Instant>>,
}

#[async_trait]
impl Sent for MemorySent {
    async fn delivered(&self, id: &str) -> Result<bool, SentError> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        Ok(records
            .get(&key(id))
            .is_some_and(|at| at.elapsed() < WINDOW))
    }

    async fn record(&self, id: &str) -> Result<(), SentError> {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.retain(|_, at| at.elapsed() < WINDOW);
        records.insert(key(id), Instant::now());
        Ok(())
    }
}

/// Records as files under a directory, each named by its key.
pub struct FileSent {
    dir: PathBuf,
    last_sweep: Mutex<SystemTime>,
}

impl FileSent {
    pub fn new(dir: PathBuf) -> Result<Self, SentError> {
        std::fs::create_dir_all(&dir).map_err(|e| {
            SentError::Unavailable(format!("failed to create {}: {e}", dir.display()))
        })?;
        Ok(Self {
            dir,
            last_sweep: Mutex::new(SystemTime::UNIX_EPOCH),
        })
    }

    /// Removes the expired records, at most once a window.
    fn sweep(&self, now: SystemTime) {
        let mut last = self.last_sweep.lock().unwrap_or_else(|e| e.into_inner());
        if now.duration_since(*last).unwrap_or_default() < WINDOW {
            return;
        }
        *last = now;
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|at| now.duration_since(at).unwrap_or_default() >= WINDOW);
            if old {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

#[async_trait]
impl Sent for FileSent {
    async fn delivered(&self, id: &str) -> Result<bool, SentError> {
        let path = self.dir.join(key(id).as_str());
        match std::fs::metadata(&path).and_then(|m| m.modified()) {
            Ok(at) => Ok(SystemTime::now().duration_since(at).unwrap_or_default() < WINDOW),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
            Err(e) => Err(SentError::Unavailable(format!(
                "failed to read {}: {e}",
                path.display()
            ))),
        }
    }

    async fn record(&self, id: &str) -> Result<(), SentError> {
        let now = SystemTime::now();
        self.sweep(now);
        let path = self.dir.join(key(id).as_str());
        std::fs::File::create(&path)
            .and_then(|file| file.set_modified(now))
            .map_err(|e| SentError::Unavailable(format!("failed to write {}: {e}", path.display())))
    }
}

/// Records on RabbitMQ, shared by every worker.
pub struct AmqpSent {
    url: String,
    prefix: String,
    link: tokio::sync::Mutex<Option<(Connection, Channel)>>,
    next_url: AtomicUsize,
}

impl AmqpSent {
    pub fn new(url: String, prefix: &str) -> Self {
        Self {
            url,
            prefix: prefix.to_string(),
            link: tokio::sync::Mutex::new(None),
            next_url: AtomicUsize::new(0),
        }
    }

    fn queue(&self, id: &str) -> ShortString {
        let name = format!(
            "{}.notify-sent.{}.{}",
            self.prefix,
            WINDOW.as_millis(),
            key(id).as_str()
        );
        ShortString::from(name)
    }

    fn arguments() -> FieldTable {
        let ms = |d: Duration| AMQPValue::LongLongInt(d.as_millis() as i64);
        let mut arguments = FieldTable::default();
        arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        arguments.insert("x-message-ttl".into(), ms(WINDOW));
        arguments.insert("x-expires".into(), ms(WINDOW + Duration::from_secs(60)));
        arguments
    }

    async fn channel(&self) -> Result<Channel, SentError> {
        let mut link = self.link.lock().await;
        if let Some((connection, channel)) = link.as_ref()
            && connection.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let properties =
            ConnectionProperties::default().with_connection_name("setpoint-notify-sent".into());
        let urls = crate::queue::amqp::split_urls(&self.url);
        let start = self.next_url.load(Ordering::Relaxed);
        let mut connected = Err(SentError::Unavailable("no RabbitMQ URL given".into()));
        for index in (0..urls.len()).map(|k| (start + k) % urls.len()) {
            connected = Connection::connect(urls[index], properties.clone())
                .await
                .map_err(|e| unavailable("failed to connect to RabbitMQ", e));
            if connected.is_ok() {
                self.next_url.store(index, Ordering::Relaxed);
                break;
            }
        }
        let connection = connected?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| unavailable("failed to open a channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| unavailable("failed to enable publisher confirms", e))?;
        *link = Some((connection, channel.clone()));
        Ok(channel)
    }

    /// `call` within `TIMEOUT`; after a failure the next call connects
    /// afresh (to the next URL).
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, SentError>>,
    ) -> Result<T, SentError> {
        let result = tokio::time::timeout(TIMEOUT, call)
            .await
            .unwrap_or_else(|_| {
                Err(SentError::Unavailable(format!(
                    "no answer from RabbitMQ within {TIMEOUT:?}"
                )))
            });
        if result.is_err()
            && let Some((connection, _)) = self.link.lock().await.take()
        {
            self.next_url.fetch_add(1, Ordering::Relaxed);
            let _ = connection.close(200, "reset".into()).await;
        }
        result
    }
}

#[async_trait]
impl Sent for AmqpSent {
    async fn delivered(&self, id: &str) -> Result<bool, SentError> {
        let queue = self.queue(id);
        self.bounded(async {
            let channel = self.channel().await?;
            let declared = channel
                .queue_declare(
                    queue.clone(),
                    QueueDeclareOptions::durable(),
                    Self::arguments(),
                )
                .await
                .map_err(|e| unavailable(format!("failed to declare {queue}"), e))?;
            Ok(declared.message_count() > 0)
        })
        .await
    }

    async fn record(&self, id: &str) -> Result<(), SentError> {
        let queue = self.queue(id);
        self.bounded(async {
            let channel = self.channel().await?;
            channel
                .queue_declare(
                    queue.clone(),
                    QueueDeclareOptions::durable(),
                    Self::arguments(),
                )
                .await
                .map_err(|e| unavailable(format!("failed to declare {queue}"), e))?;
            let confirm = channel
                .basic_publish(
                    "".into(),
                    queue.clone(),
                    BasicPublishOptions::default(),
                    b"",
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .map_err(|e| unavailable(format!("failed to publish to {queue}"), e))?;
            // A nack: the queue is full, the id was recorded already.
            confirm
                .await
                .map(|_| ())
                .map_err(|e| unavailable(format!("no confirm from {queue}"), e))
        })
        .await
    }
}

fn unavailable(what: impl std::fmt::Display, error: lapin::Error) -> SentError {
    SentError::Unavailable(format!("{what}: {error}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_and_file_records_answer_look_ups_without_recording() {
        let dir = tempfile::tempdir().unwrap();
        let stores: Vec<Box<dyn Sent>> = vec![
            Box::new(MemorySent::default()),
            Box::new(FileSent::new(dir.path().join("sent")).unwrap()),
        ];
        for store in stores {
            assert!(!store.delivered("a").await.unwrap());
            assert!(
                !store.delivered("a").await.unwrap(),
                "a look-up records nothing"
            );
            store.record("a").await.unwrap();
            assert!(store.delivered("a").await.unwrap());
            assert!(!store.delivered("b").await.unwrap());
            store.record("a").await.unwrap();
        }
        // A restart keeps the file records.
        let again = FileSent::new(dir.path().join("sent")).unwrap();
        assert!(again.delivered("a").await.unwrap());
    }
}
