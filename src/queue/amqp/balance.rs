//! Spreading the shards over the consumers: probes tell each consumer which
//! shards it is the active consumer of, a census counts the consumers, and
//! one holding more than its share hands a shard to the next consumer in
//! line once none of that shard's deliveries is with its worker.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{BasicCancelOptions, BasicPublishOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

use super::consume::{Ended, Feeder, requeue_all};
use super::topology::ShardCounts;
use super::{PROBE_HEADER, QueueType, Shared};

/// A shard counts as ours while a probe or an event came from it within
/// this many balance intervals (or while the worker holds one of its
/// deliveries).
const ACTIVE_INTERVALS: u32 = 3;

/// A handoff waiting for its shard's deliveries to be settled gives up
/// after this many balance intervals.
const HANDOFF_INTERVALS: u32 = 3;

/// A zero interval would make the balancing loop spin.
const MIN_BALANCE_INTERVAL: Duration = Duration::from_millis(10);

/// What one `consume` call knows across its subscriptions (a reconnect
/// makes a new one).
pub(super) struct Balance {
    /// Sent in the probe header; tells the consumers apart in a capture.
    pub(super) id: String,
    pub(super) interval: Duration,
    /// Per shard: deliveries handed to the worker and not settled yet. Kept
    /// across reconnects, so a shard whose old deliveries are still being
    /// reconciled is not handed off by the new subscription either.
    pub(super) unsettled: Vec<Arc<Unsettled>>,
    /// Woken when a shard's last unsettled delivery is settled.
    pub(super) idle: Arc<Notify>,
    /// Where the subscriptions start: processes started together then
    /// come first on different shards, hence share them from the start.
    pub(super) offset: usize,
    /// A probe's expiration, in milliseconds (see `probe`).
    pub(super) probe_expiration: String,
    /// `prefetch` permits, one per delivery handed to the worker until it
    /// is settled. The prefetch is set per consumer (global QoS is gone
    /// from RabbitMQ 4, and quorum queues refuse it), so each shard may
    /// send that many; this bounds them over all shards together, as the
    /// `Queue` contract says. What waits for a permit stays unacknowledged
    /// with this consumer, as it would at the broker.
    pub(super) outstanding: Arc<Semaphore>,
}

impl Balance {
    pub(super) fn new(shared: &Shared, prefetch: u16) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let shards = shared.names.shards.len();
        let idle = Arc::new(Notify::new());
        let interval = shared.settings.balance_interval.max(MIN_BALANCE_INTERVAL);
        let random = {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        Self {
            id: format!(
                "{} consumer {}",
                shared.connection_name,
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
            interval,
            unsettled: (0..shards)
                .map(|_| {
                    Arc::new(Unsettled {
                        count: AtomicUsize::new(0),
                        idle: idle.clone(),
                    })
                })
                .collect(),
            idle,
            offset: usize::try_from(random % shards.max(1) as u64).unwrap_or(0),
            outstanding: Arc::new(Semaphore::new(usize::from(prefetch.max(1)))),
            probe_expiration: match shared.settings.queue_type {
                QueueType::Classic => "0".to_string(),
                QueueType::Quorum => interval.as_millis().to_string(),
            },
        }
    }
}

/// Counts the deliveries of one shard that the worker holds.
pub(super) struct Unsettled {
    pub(super) count: AtomicUsize,
    pub(super) idle: Arc<Notify>,
}

impl Unsettled {
    pub(super) fn hold(self: &Arc<Self>, outstanding: OwnedSemaphorePermit) -> Settling {
        self.count.fetch_add(1, Ordering::SeqCst);
        Settling(self.clone(), outstanding)
    }

    pub(super) fn idle(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }
}

/// Held by a delivery until it is settled (acked, requeued, given back),
/// with its place among the `prefetch` deliveries the worker may hold.
pub(super) struct Settling(
    pub(super) Arc<Unsettled>,
    // Never read: held for its drop, which gives the permit back.
    #[allow(dead_code)] OwnedSemaphorePermit,
);

impl Drop for Settling {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_one();
        }
    }
}

/// A shard being handed off: it waits until the worker settled all of its
/// deliveries; what comes from it meanwhile is held here, neither given to
/// the worker nor back to the broker (we are still its active consumer, it
/// would come straight back).
pub(super) struct Pending {
    pub(super) shard: usize,
    pub(super) since: Instant,
    pub(super) held: Vec<AmqpDelivery>,
}

impl Feeder<'_> {
    /// Every interval: probe the shards, then hand off one if we hold more
    /// than our share.
    pub(super) async fn on_census(
        &mut self,
        counts: &[ShardCounts],
        stop: &mut watch::Receiver<()>,
    ) -> Result<(), Ended> {
        let now = Instant::now();
        self.consumers = counts.iter().map(|c| c.consumers).max().unwrap_or(0);
        // A probe behind waiting messages would wait with them (and count
        // as one); a shard with messages proves itself with them.
        if !self.link.connection.status().blocked() {
            for (slot, counts) in self.subscription.shards.iter().zip(counts) {
                if counts.messages == 0
                    && let Err(error) = probe(
                        &self.subscription.channel,
                        &slot.queue,
                        &self.balance.id,
                        &self.balance.probe_expiration,
                    )
                    .await
                {
                    tracing::debug!(%error, queue = %slot.queue, "failed to probe a shard");
                }
            }
        }
        let window = self.balance.interval * ACTIVE_INTERVALS;
        let active: Vec<usize> = (0..self.subscription.shards.len())
            .filter(|&shard| {
                let slot = &self.subscription.shards[shard];
                slot.tag.is_some()
                    && (!self.balance.unsettled[shard].idle()
                        || slot
                            .seen
                            .is_some_and(|seen| now.duration_since(seen) <= window))
            })
            .collect();
        self.shared
            .active_shards
            .store(active.len(), Ordering::Relaxed);
        let step = self.rebalance(&active, stop).await;
        for slot in &mut self.subscription.shards {
            slot.recent /= 2;
        }
        step
    }

    async fn rebalance(
        &mut self,
        active: &[usize],
        stop: &mut watch::Receiver<()>,
    ) -> Result<(), Ended> {
        if let Some(pending) = &self.pending {
            if pending.since.elapsed() < self.balance.interval * HANDOFF_INTERVALS {
                return self.try_hand_off().await;
            }
            // Its deliveries take too long: give up, give the worker what
            // was held; the next interval picks a shard again.
            let mut pending = self.pending.take().expect("a pending handoff");
            tracing::info!(
                queue = %self.subscription.shards[pending.shard].queue,
                "the shard to hand off stayed busy, keeping it"
            );
            while !pending.held.is_empty() {
                let delivery = pending.held.remove(0);
                if let Err(ended) = self.hand_to_worker(pending.shard, delivery, stop).await {
                    self.pending = Some(pending);
                    return Err(ended);
                }
            }
            return Ok(());
        }
        let consumers = usize::try_from(self.consumers).unwrap_or(usize::MAX);
        if consumers <= 1 {
            return Ok(());
        }
        let fair = self.subscription.shards.len().div_ceil(consumers);
        if active.len() <= fair {
            return Ok(());
        }
        let shard = active.iter().copied().min_by_key(|&shard| {
            (
                !self.balance.unsettled[shard].idle(),
                self.subscription.shards[shard].recent,
            )
        });
        if let Some(shard) = shard {
            tracing::debug!(
                queue = %self.subscription.shards[shard].queue,
                active = active.len(),
                fair,
                "handing off a shard"
            );
            self.pending = Some(Pending {
                shard,
                since: Instant::now(),
                held: Vec::new(),
            });
            self.try_hand_off().await?;
        }
        Ok(())
    }

    /// Hands the pending shard to the next consumer once none of its
    /// deliveries is with the worker: cancel (the broker activates the next
    /// consumer in line), give back what was held (it goes to that
    /// consumer), subscribe again (we are now last in line).
    pub(super) async fn try_hand_off(&mut self) -> Result<(), Ended> {
        let Some(shard) = self.pending.as_ref().map(|p| p.shard) else {
            return Ok(());
        };
        if !self.balance.unsettled[shard].idle() {
            return Ok(());
        }
        let pending = self.pending.take().expect("a pending handoff");
        let slot = &mut self.subscription.shards[shard];
        let Some(tag) = slot.tag.take() else {
            requeue_all(pending.held).await;
            return Ok(());
        };
        let queue = slot.queue.clone();
        slot.seen = None;
        if let Err(error) = self
            .subscription
            .channel
            .basic_cancel(tag, BasicCancelOptions::default())
            .await
        {
            tracing::warn!(%error, %queue, "failed to hand off a shard");
            return Err(Ended::Lost);
        }
        requeue_all(pending.held).await;
        if let Err(error) = self.subscription.consume_shard(shard).await {
            tracing::warn!(%error, %queue, "failed to subscribe again after a handoff");
            return Err(Ended::Lost);
        }
        tracing::info!(%queue, consumers = self.consumers, "handed a shard to the next consumer");
        Ok(())
    }

    /// On the way out: what a pending handoff held goes back, after its
    /// consumer is cancelled (else the broker would hand it straight back
    /// to that consumer, whose stream is about to be dropped).
    pub(super) async fn give_back_held(&mut self) {
        let Some(pending) = self.pending.take() else {
            return;
        };
        if pending.held.is_empty() {
            return;
        }
        let timeout = self.shared.settings.confirm_timeout;
        let channel = &self.subscription.channel;
        let _ = tokio::time::timeout(timeout, async {
            if let Some(tag) = self.subscription.shards[pending.shard].tag.take() {
                let _ = channel
                    .basic_cancel(tag, BasicCancelOptions::default())
                    .await;
            }
            requeue_all(pending.held).await;
        })
        .await;
    }
}

/// Asks whoever is the active consumer of `queue` to say so: an empty
/// message through the default exchange, straight to the queue. On a
/// classic queue it expires at once unless a consumer can take it at once,
/// so it never waits in the queue (nor in `depth`) and never outlives its
/// consumer. A quorum queue drops a message that expires at once before any
/// consumer sees it (it expires messages as it applies them), so there it
/// lives one balance interval (`expiration`).
pub(super) async fn probe(
    channel: &Channel,
    queue: &ShortString,
    id: &str,
    expiration: &str,
) -> Result<(), lapin::Error> {
    let mut headers = FieldTable::default();
    headers.insert(
        PROBE_HEADER.into(),
        AMQPValue::LongString(id.to_string().into()),
    );
    let properties = BasicProperties::default()
        .with_expiration(expiration.into())
        .with_headers(headers);
    channel
        .basic_publish(
            "".into(),
            queue.clone(),
            BasicPublishOptions::default(),
            &[],
            properties,
        )
        .await
        .map(drop)
}

pub(super) fn is_probe(properties: &BasicProperties) -> bool {
    properties
        .headers()
        .as_ref()
        .is_some_and(|headers| headers.inner().contains_key(PROBE_HEADER))
}
