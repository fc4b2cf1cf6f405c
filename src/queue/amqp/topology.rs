//! The exchanges and queues, named from one prefix and declared
//! idempotently on every connect; passive declares count what they hold.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};

use super::{short, topology, unavailable};
use crate::queue::{QueueError, RetryPolicy};

/// Exchange and queue names, derived once from the prefix.
#[derive(Clone, Debug)]
pub struct Names {
    pub events: String,
    pub shards: Vec<String>,
    /// Index `n - 1` holds attempt `n`'s delay queue (and its exchange, of
    /// the same name).
    pub retries: Vec<String>,
    pub parked: String,
}

impl Names {
    pub fn new(prefix: &str, shards: u16, retry: &RetryPolicy) -> Self {
        Self {
            events: format!("{prefix}.events"),
            shards: (0..shards).map(|i| format!("{prefix}.shard.{i}")).collect(),
            retries: (1..retry.max_attempts)
                .map(|n| format!("{prefix}.retry.{n}"))
                .collect(),
            parked: format!("{prefix}.parked"),
        }
    }

    /// The delay queue for attempt `attempt` (1-based), if there is one.
    pub fn retry(&self, attempt: u32) -> Option<&str> {
        let index = usize::try_from(attempt).ok()?.checked_sub(1)?;
        self.retries.get(index).map(String::as_str)
    }
}

/// Declares every exchange, queue and binding; idempotent, so run on every
/// connect (a broker that lost its definitions gets them back).
pub(super) async fn declare_topology(
    channel: &Channel,
    names: &Names,
    retry: &RetryPolicy,
) -> Result<(), QueueError> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let events = short(&names.events)?;
    channel
        .exchange_declare(
            events.clone(),
            ExchangeKind::Custom("x-consistent-hash".into()),
            durable,
            FieldTable::default(),
        )
        .await
        .map_err(|e| {
            topology(
                format!(
                    "failed to declare exchange {events} (is the rabbitmq_consistent_hash_exchange \
                     plugin enabled?)"
                ),
                e,
            )
        })?;

    let mut single_active = FieldTable::default();
    single_active.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    for shard in &names.shards {
        let queue = short(shard)?;
        declare_queue(channel, &queue, single_active.clone()).await?;
        // With the consistent-hash exchange the binding key is the weight:
        // equal weights, equal shares of the Applications.
        channel
            .queue_bind(
                queue.clone(),
                events.clone(),
                "1".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| topology(format!("failed to bind {queue} to {events}"), e))?;
    }

    for (n, delay_queue) in (1u32..).zip(&names.retries) {
        let name = short(delay_queue)?;
        let delay_ms = i64::try_from(retry.delay(n).as_millis()).unwrap_or(i64::MAX);
        let mut arguments = FieldTable::default();
        arguments.insert("x-message-ttl".into(), AMQPValue::LongLongInt(delay_ms));
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(names.events.clone().into()),
        );
        declare_queue(channel, &name, arguments).await?;
        channel
            .exchange_declare(
                name.clone(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(|e| topology(format!("failed to declare exchange {name}"), e))?;
        channel
            .queue_bind(
                name.clone(),
                name.clone(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| topology(format!("failed to bind {name} to its exchange"), e))?;
    }

    declare_queue(channel, &short(&names.parked)?, FieldTable::default()).await
}

async fn declare_queue(
    channel: &Channel,
    queue: &ShortString,
    arguments: FieldTable,
) -> Result<(), QueueError> {
    channel
        .queue_declare(queue.clone(), QueueDeclareOptions::durable(), arguments)
        .await
        .map(drop)
        .map_err(|e| {
            topology(
                format!(
                    "failed to declare queue {queue} (if it exists with other arguments, delete it)"
                ),
                e,
            )
        })
}

pub(super) async fn message_count(channel: &Channel, queue: &str) -> Result<u32, QueueError> {
    declared_counts(channel, queue)
        .await
        .map(|counts| counts.messages)
}

async fn declared_counts(channel: &Channel, queue: &str) -> Result<ShardCounts, QueueError> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    channel
        .queue_declare(short(queue)?, passive, FieldTable::default())
        .await
        .map(|declared| ShardCounts {
            messages: declared.message_count(),
            consumers: declared.consumer_count(),
        })
        .map_err(|e| topology(format!("failed to count the messages of {queue}"), e))
}

/// A shard queue's counts, from a passive declare.
#[derive(Clone, Copy, Debug)]
pub(super) struct ShardCounts {
    /// Ready messages.
    pub(super) messages: u32,
    /// Every consumer, the waiting ones of a single-active-consumer queue
    /// included.
    pub(super) consumers: u32,
}

/// Counts every shard on a channel of its own: a shard that is missing
/// closes the channel it was asked on.
pub(super) async fn count_shards(
    connection: Arc<Connection>,
    shards: Vec<String>,
    timeout: Duration,
) -> Result<Vec<ShardCounts>, QueueError> {
    let counted = async {
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| unavailable("failed to open a channel", e))?;
        let mut counts = Vec::with_capacity(shards.len());
        for shard in &shards {
            counts.push(declared_counts(&channel, shard).await?);
        }
        let _ = channel.close(200, "counted".into()).await;
        Ok(counts)
    };
    tokio::time::timeout(timeout, counted)
        .await
        .unwrap_or_else(|_| {
            Err(QueueError::Unavailable(format!(
                "failed to count the shards within {timeout:?}"
            )))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_prefix() {
        let names = Names::new(
            "sp",
            2,
            &RetryPolicy {
                max_attempts: 3,
                ..Default::default()
            },
        );
        assert_eq!(names.events, "sp.events");
        assert_eq!(names.shards, ["sp.shard.0", "sp.shard.1"]);
        assert_eq!(names.retries, ["sp.retry.1", "sp.retry.2"]);
        assert_eq!(names.parked, "sp.parked");
        assert_eq!(names.retry(0), None);
        assert_eq!(names.retry(2), Some("sp.retry.2"));
        assert_eq!(names.retry(3), None);
    }
}
