//! Changing the shard count on a running system, without a drain. The
//! consumers of the new count look, every balance interval, for shard
//! queues of an older, larger count (`<prefix>.shard.<k>` for k at or past
//! the count, by passive declares until the first missing one). Each such
//! stale shard is unbound from the events exchange at once, so no new event
//! goes there. While a consumer of the old count still consumes it, that
//! consumer finishes it; once none does, what it holds is moved to the
//! events exchange (a confirmed republish under its routing key, which
//! hashes it to its new shard, then the ack: a crash in between duplicates,
//! never loses) and the empty, unused queue is deleted. A consumer reads it,
//! not `basic.get`, which quorum queues with a single active consumer
//! refuse. Growing the count needs nothing: the new shards are bound when
//! declared, and the hash ring moves some Applications to them. During the
//! rolling restart an Application may be reconciled by an old and a new
//! process at once: at-least-once, and reconciles are idempotent.

use std::sync::Arc;
use std::time::Duration;

use futures::stream::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use tokio::sync::watch;

use super::connection::Link;
use super::{QueueType, Shared, short, topology, unavailable};
use crate::queue::QueueError;

/// The most shards `queue.shards` allows: no stale shard lies past it.
const MAX_SHARDS: usize = 1024;

/// A stale shard with nothing for this long is taken as empty.
const QUIET: Duration = Duration::from_millis(500);

/// Runs a drain pass every balance interval until stopped.
pub(super) async fn drain_stale_shards(shared: Arc<Shared>, mut stop: watch::Receiver<()>) {
    let mut tick = tokio::time::interval(shared.settings.balance_interval.max(QUIET));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let Ok(link) = shared.current() else { continue };
        if let Err(error) = drain_pass(&shared, &link).await {
            tracing::warn!(%error, "failed to drain the stale shards");
        }
    }
}

/// The name of shard `k` under this prefix.
fn shard_name(shared: &Shared, k: usize) -> String {
    format!("{}.shard.{k}", shared.settings.prefix)
}

async fn drain_pass(shared: &Shared, link: &Link) -> Result<(), QueueError> {
    for k in shared.names.shards.len()..MAX_SHARDS {
        let name = shard_name(shared, k);
        let Some(consumers) = consumers_of(link, &name).await? else {
            return Ok(());
        };
        let queue = short(&name)?;
        let channel = open(link).await?;
        // With the consistent-hash exchange the binding key is the weight.
        channel
            .queue_unbind(
                queue.clone(),
                short(&shared.names.events)?,
                "1".into(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| topology(format!("failed to unbind {queue}"), e))?;
        if consumers > 0 {
            // A process of the old count still consumes it.
            let _ = channel.close(200, "unbound".into()).await;
            continue;
        }
        let moved = move_all(shared, &channel, &queue).await;
        if let Ok(n) = moved
            && n > 0
        {
            tracing::info!(queue = %queue, moved = n, "moved a stale shard's events to the current shards");
        }
        moved?;
        let _ = channel.close(200, "drained".into()).await;
        if delete_if_idle(shared, link, &name).await? {
            tracing::info!(queue = %queue, "deleted a stale shard");
        }
    }
    Ok(())
}

/// Deletes a stale shard that holds nothing and has no consumer. Classic
/// queues check both in the delete itself; quorum queues refuse those flags
/// with a connection error (`NOT_IMPLEMENTED`), so for them a passive
/// declare checks just before an unconditional delete. Unbound, the queue
/// takes no new event in between unless an old-count process re-declares it
/// at that instant; its events then sit in the re-declared queue, which the
/// next pass drains.
async fn delete_if_idle(shared: &Shared, link: &Link, name: &str) -> Result<bool, QueueError> {
    let queue = short(name)?;
    let checked = match shared.settings.queue_type {
        QueueType::Classic => true,
        QueueType::Quorum => {
            let channel = open(link).await?;
            let declared = channel
                .queue_declare(
                    queue.clone(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await;
            let _ = channel.close(200, "counted".into()).await;
            matches!(declared, Ok(d) if d.consumer_count() == 0 && d.message_count() == 0)
        }
    };
    if !checked {
        return Ok(false);
    }
    let flags = shared.settings.queue_type == QueueType::Classic;
    let channel = open(link).await?;
    let deleted = channel
        .queue_delete(
            queue,
            QueueDeleteOptions {
                if_unused: flags,
                if_empty: flags,
                ..Default::default()
            },
        )
        .await;
    if channel.status().connected() {
        let _ = channel.close(200, "deleted".into()).await;
    }
    Ok(deleted.is_ok())
}

async fn open(link: &Link) -> Result<lapin::Channel, QueueError> {
    link.connection
        .create_channel()
        .await
        .map_err(|e| unavailable("failed to open a channel", e))
}

/// `None` when the queue does not exist (the passive declare closes its
/// channel, hence one of its own).
async fn consumers_of(link: &Link, queue: &str) -> Result<Option<u32>, QueueError> {
    let channel = open(link).await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let declared = channel
        .queue_declare(short(queue)?, passive, FieldTable::default())
        .await;
    let _ = channel.close(200, "counted".into()).await;
    Ok(declared.ok().map(|declared| declared.consumer_count()))
}

/// Republishes every message of `queue` through the events exchange, each
/// acknowledged once the copy is confirmed; how many.
async fn move_all(
    shared: &Shared,
    channel: &lapin::Channel,
    queue: &lapin::types::ShortString,
) -> Result<usize, QueueError> {
    channel
        .basic_qos(100, BasicQosOptions::default())
        .await
        .map_err(|e| unavailable("failed to set the prefetch", e))?;
    let mut consumer = channel
        .basic_consume(
            queue.clone(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| unavailable(format!("failed to consume {queue}"), e))?;
    let mut moved = 0;
    while let Ok(Some(delivery)) = tokio::time::timeout(QUIET, consumer.next()).await {
        let delivery = delivery.map_err(|e| unavailable(format!("failed to read {queue}"), e))?;
        shared
            .send(
                &shared.names.events,
                delivery.routing_key.as_str(),
                &delivery.data,
                delivery.properties.clone(),
            )
            .await?;
        delivery
            .acker
            .ack(BasicAckOptions::default())
            .await
            .map_err(|e| unavailable(format!("failed to ack a message of {queue}"), e))?;
        moved += 1;
    }
    let _ = channel
        .basic_cancel(consumer.tag(), BasicCancelOptions::default())
        .await;
    Ok(moved)
}
