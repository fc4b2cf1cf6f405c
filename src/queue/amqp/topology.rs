//! The exchanges and queues, named from one prefix and declared
//! idempotently on every connect; passive declares count what they hold.
//!
//! The queues are all of one type (`QueueType`). Quorum queues take
//! `x-queue-type: quorum` and, on the shards, a delivery limit: the broker
//! counts the deliveries that came back unacknowledged (`x-delivery-count`),
//! `redelivery` parks an event at `max_deliveries` with its reason, and
//! `x-delivery-limit` (the most `max_deliveries` may be, so changing that
//! setting never changes a queue's arguments) dead-letters to the parking
//! queue whatever would get past it, where RabbitMQ 4 would otherwise drop
//! it at its default limit of 20. Classic shards carry the count in a header
//! instead (`redelivery`).

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ExchangeKind};

use super::{AmqpSettings, QueueType, short, topology, unavailable};
use crate::queue::{QueueError, RetryPolicy};

/// The broker's own delivery limit on quorum shards: the highest
/// `queue.maxDeliveries` allows, a backstop behind Setpoint's own count.
pub(super) const QUORUM_DELIVERY_LIMIT: i64 = 1000;

/// Exchange and queue names, derived once from the prefix.
#[derive(Clone, Debug)]
pub struct Names {
    pub events: String,
    pub shards: Vec<String>,
    /// Index `n - 1` holds attempt `n`'s delay queue (and its exchange, of
    /// the same name).
    pub retries: Vec<String>,
    pub parked: String,
    /// Every consuming process subscribes to it (it never holds a message):
    /// its consumer count is how many there are. A quorum shard's count
    /// leaves out the consumers waiting behind its single active one.
    pub consumers: String,
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
            consumers: format!("{prefix}.consumers"),
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
    settings: &AmqpSettings,
) -> Result<(), QueueError> {
    let retry = &settings.retry;
    let kind = settings.queue_type;
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

    let shard_arguments = shard_arguments(kind, &names.parked);
    for shard in &names.shards {
        let queue = short(shard)?;
        declare_queue(channel, &queue, kind, shard_arguments.clone()).await?;
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
        let mut arguments = typed(kind);
        arguments.insert("x-message-ttl".into(), AMQPValue::LongLongInt(delay_ms));
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(names.events.clone().into()),
        );
        declare_queue(channel, &name, kind, arguments).await?;
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

    declare_queue(channel, &short(&names.consumers)?, kind, typed(kind)).await?;
    declare_queue(channel, &short(&names.parked)?, kind, typed(kind)).await
}

/// The arguments every queue of this type starts with.
fn typed(kind: QueueType) -> FieldTable {
    let mut arguments = FieldTable::default();
    if kind == QueueType::Quorum {
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(kind.as_str().into()),
        );
    }
    arguments
}

/// A shard's arguments: one active consumer at a time; on quorum queues
/// the broker's delivery limit, past which it dead-letters to the parking
/// queue.
pub(super) fn shard_arguments(kind: QueueType, parked: &str) -> FieldTable {
    let mut arguments = typed(kind);
    arguments.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    if kind == QueueType::Quorum {
        arguments.insert(
            "x-delivery-limit".into(),
            AMQPValue::LongLongInt(QUORUM_DELIVERY_LIMIT),
        );
        arguments.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString("".into()),
        );
        arguments.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(parked.into()),
        );
    }
    arguments
}

async fn declare_queue(
    channel: &Channel,
    queue: &ShortString,
    kind: QueueType,
    arguments: FieldTable,
) -> Result<(), QueueError> {
    channel
        .queue_declare(queue.clone(), QueueDeclareOptions::durable(), arguments)
        .await
        .map(drop)
        .map_err(|e| {
            topology(
                format!(
                    "failed to declare {kind} queue {queue} (if it exists with other arguments or \
                     as another type, set queue.queueType to its type, or delete it once empty)"
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

    fn argument<'a>(arguments: &'a FieldTable, key: &str) -> Option<&'a AMQPValue> {
        arguments.inner().get(key)
    }

    #[test]
    fn quorum_shards_have_a_type_a_delivery_limit_and_park_past_it() {
        let quorum = shard_arguments(QueueType::Quorum, "sp.parked");
        assert_eq!(
            argument(&quorum, "x-queue-type"),
            Some(&AMQPValue::LongString("quorum".into()))
        );
        assert_eq!(
            argument(&quorum, "x-single-active-consumer"),
            Some(&AMQPValue::Boolean(true))
        );
        assert_eq!(
            argument(&quorum, "x-delivery-limit"),
            Some(&AMQPValue::LongLongInt(QUORUM_DELIVERY_LIMIT))
        );
        assert_eq!(
            argument(&quorum, "x-dead-letter-routing-key"),
            Some(&AMQPValue::LongString("sp.parked".into()))
        );
        // The backstop is never below what Setpoint's own count may reach.
        let most = crate::config::SETTINGS
            .iter()
            .find(|s| s.key == "queue.maxDeliveries")
            .map(|s| s.kind);
        assert_eq!(
            most,
            Some(crate::config::Kind::Count {
                min: 1,
                max: QUORUM_DELIVERY_LIMIT as u64
            })
        );
    }

    #[test]
    fn classic_shards_keep_their_arguments() {
        let classic = shard_arguments(QueueType::Classic, "sp.parked");
        let keys: Vec<_> = classic
            .inner()
            .keys()
            .map(|k| k.as_str().to_string())
            .collect();
        assert_eq!(keys, ["x-single-active-consumer"]);
    }

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
        assert_eq!(names.consumers, "sp.consumers");
        assert_eq!(names.retry(0), None);
        assert_eq!(names.retry(2), Some("sp.retry.2"));
        assert_eq!(names.retry(3), None);
    }
}
