//! Records on RabbitMQ, shared by every webhook replica and kept across
//! their restarts, with core RabbitMQ only (no deduplication plugin).
//!
//! A record is a queue named from its key that holds at most one message:
//! declared with `x-max-length: 1` and `x-overflow: reject-publish`, a second
//! publish is refused with a `basic.nack`, so of several replicas claiming
//! the same key at once exactly one gets the `basic.ack`. The message lives
//! for the window (`x-message-ttl`), after which the key can be claimed
//! again; the queue itself goes once unused for longer (`x-expires`). Both
//! are in the queue's name, so a changed window never meets a queue declared
//! with other arguments.
//!
//! This opens a connection of its own, so the event queue's connection and
//! its topology are left as they are.

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Mutex;

use super::{DedupeError, RecordKey, Seen};

/// How long a claim may wait for RabbitMQ: below GitHub's 10 s, with the
/// publishes that follow.
const TIMEOUT: Duration = Duration::from_secs(3);
/// How long an empty record queue outlives its message.
const QUEUE_GRACE: Duration = Duration::from_secs(60);

pub struct AmqpSeen {
    url: String,
    prefix: String,
    window: Duration,
    /// Connected lazily, again after a loss.
    link: Mutex<Option<(Connection, Channel)>>,
    /// The URL (of a comma-separated list: a cluster's nodes) to try first;
    /// the one after the last that failed.
    next_url: std::sync::atomic::AtomicUsize,
}

impl AmqpSeen {
    pub fn new(url: String, prefix: &str, window: Duration) -> Self {
        Self {
            url,
            prefix: prefix.to_string(),
            window,
            link: Mutex::new(None),
            next_url: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// `<prefix>.webhook-seen.<window ms>.<key>`.
    fn queue_name(&self, key: &RecordKey) -> Result<ShortString, DedupeError> {
        let name = format!(
            "{}.webhook-seen.{}.{}",
            self.prefix,
            self.window.as_millis(),
            key.as_str()
        );
        ShortString::try_new(name.as_str())
            .map_err(|e| DedupeError::Unavailable(format!("the name {name:?} is too long: {e}")))
    }

    async fn channel(&self) -> Result<Channel, DedupeError> {
        let mut link = self.link.lock().await;
        if let Some((connection, channel)) = link.as_ref()
            && connection.status().connected()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let properties =
            ConnectionProperties::default().with_connection_name("setpoint-webhook-seen".into());
        let urls = crate::queue::amqp::split_urls(&self.url);
        let start = self.next_url.load(Ordering::Relaxed);
        let mut connected = Err(DedupeError::Unavailable("no RabbitMQ URL given".into()));
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

    /// Drops the link after an error, so the next call connects afresh.
    async fn reset(&self) {
        if let Some((connection, _)) = self.link.lock().await.take() {
            // Its node may be the one that went: start with the next.
            self.next_url.fetch_add(1, Ordering::Relaxed);
            let _ = connection.close(200, "reset".into()).await;
        }
    }

    async fn try_claim(&self, key: &RecordKey) -> Result<bool, DedupeError> {
        let queue = self.queue_name(key)?;
        let channel = self.channel().await?;
        let mut arguments = FieldTable::default();
        let ms = |d: Duration| AMQPValue::LongLongInt(d.as_millis().min(i64::MAX as u128) as i64);
        arguments.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
        arguments.insert(
            "x-overflow".into(),
            AMQPValue::LongString("reject-publish".into()),
        );
        arguments.insert("x-message-ttl".into(), ms(self.window));
        arguments.insert("x-expires".into(), ms(self.window + QUEUE_GRACE));
        channel
            .queue_declare(queue.clone(), QueueDeclareOptions::durable(), arguments)
            .await
            .map_err(|e| unavailable(format!("failed to declare {queue}"), e))?;
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.clone(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                b"",
                BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .map_err(|e| unavailable(format!("failed to publish to {queue}"), e))?;
        match confirm.await {
            Ok(Confirmation::Ack(None)) => Ok(true),
            // Full: a record younger than the window is there.
            Ok(Confirmation::Nack(_)) => Ok(false),
            Ok(Confirmation::Ack(Some(_))) => Err(DedupeError::Unavailable(format!(
                "{queue} expired between its declaration and the claim"
            ))),
            Ok(Confirmation::NotRequested) => Err(DedupeError::Unavailable(
                "the channel is not in confirm mode".into(),
            )),
            Err(e) => Err(unavailable(format!("no confirm from {queue}"), e)),
        }
    }
}

#[async_trait]
impl Seen for AmqpSeen {
    async fn claim(&self, key: &RecordKey) -> Result<bool, DedupeError> {
        self.bounded(self.try_claim(key)).await
    }

    async fn forget(&self, key: &RecordKey) -> Result<(), DedupeError> {
        let queue = self.queue_name(key)?;
        self.bounded(async {
            let channel = self.channel().await?;
            channel
                .queue_delete(queue.clone(), QueueDeleteOptions::default())
                .await
                .map(|_| ())
                .map_err(|e| unavailable(format!("failed to delete {queue}"), e))
        })
        .await
    }
}

impl AmqpSeen {
    /// `call` within `TIMEOUT`; after a failure the next call connects
    /// afresh.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, DedupeError>>,
    ) -> Result<T, DedupeError> {
        let result = tokio::time::timeout(TIMEOUT, call)
            .await
            .unwrap_or_else(|_| {
                Err(DedupeError::Unavailable(format!(
                    "no answer from RabbitMQ within {TIMEOUT:?}"
                )))
            });
        if result.is_err() {
            self.reset().await;
        }
        result
    }
}

fn unavailable(what: impl std::fmt::Display, error: lapin::Error) -> DedupeError {
    DedupeError::Unavailable(format!("{what}: {error}"))
}
