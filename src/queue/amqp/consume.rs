//! Consuming: one channel per `consume` call with a consumer on every shard,
//! subscribed again after each reconnect, feeding the worker's receiver.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use backoff::backoff::Backoff;
use futures::future::{BoxFuture, FutureExt};
use futures::stream::{BoxStream, StreamExt};
use lapin::Channel;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::{FieldTable, ShortString};
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};

use super::acker::{AmqpAcker, give_back_later};
use super::balance::{Balance, Pending, Unsettled, is_probe};
use super::connection::{Link, RECONNECT_MAX, STABLE, reconnect_backoff};
use super::redelivery::{self, Admission};
use super::topology::{ShardCounts, count_shards};
use super::{QueueType, Shared, short, unavailable};
use crate::event::Event;
use crate::queue::{Delivery, QueueError};

/// Why a subscription ended.
#[derive(Clone, Copy, Debug)]
pub(super) enum Ended {
    /// The channel or the connection is gone: subscribe again.
    Lost,
    /// The receiver was dropped or the queue stopped.
    Stopped,
}

/// Feeds `deliveries` from every shard, subscribing again on each new
/// connection, until the receiver or the queue is dropped.
pub(super) async fn consume(
    shared: Arc<Shared>,
    prefetch: u16,
    deliveries: mpsc::Sender<Delivery>,
    mut stop: watch::Receiver<()>,
) {
    let balance = Balance::new(&shared, prefetch);
    let mut links = shared.link.subscribe();
    let mut backoff = reconnect_backoff();
    loop {
        let link = tokio::select! {
            _ = stop.changed() => return,
            _ = deliveries.closed() => return,
            link = links.wait_for(|link| link.as_ref().is_some_and(Link::connected)) => {
                match link {
                    Ok(link) => link.clone(),
                    Err(_) => return,
                }
            }
        };
        let Some(link) = link else { continue };
        match subscribe(&shared, &link, prefetch, &balance).await {
            Ok(subscription) => {
                tracing::info!(
                    shards = shared.names.shards.len(),
                    prefetch,
                    consumer = %balance.id,
                    "consuming"
                );
                let since = tokio::time::Instant::now();
                let mut feeder = Feeder {
                    shared: &shared,
                    link: &link,
                    balance: &balance,
                    subscription,
                    deliveries: &deliveries,
                    pending: None,
                    consumers: 0,
                };
                let ended = forward(&mut feeder, &mut stop).await;
                shared.active_shards.store(0, Ordering::Relaxed);
                if since.elapsed() >= STABLE {
                    backoff.reset();
                }
                if let Ended::Stopped = ended {
                    // The consumers are cancelled with the stream: no new
                    // deliveries. The channel stays open while a delivery
                    // still holds it, so a reconcile that is finishing can
                    // still ack; it closes (giving back the rest) after.
                    return;
                }
                tracing::warn!("the consuming channel closed, subscribing again");
            }
            Err(error) => tracing::warn!(%error, "failed to subscribe to the shards, will retry"),
        }
        let delay = backoff.next_backoff().unwrap_or(RECONNECT_MAX);
        tokio::select! {
            _ = stop.changed() => return,
            _ = deliveries.closed() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// What the consumers of one channel yield, tagged with where it came from.
pub(super) struct Incoming {
    pub(super) shard: usize,
    generation: u64,
    /// `None`: that consumer's stream is over (we or the broker cancelled
    /// it).
    pub(super) delivery: Option<Result<AmqpDelivery, lapin::Error>>,
}

pub(super) type Deliveries = futures::stream::SelectAll<BoxStream<'static, Incoming>>;

/// One shard's consumer on the consuming channel, and what we saw of it.
pub(super) struct ShardSlot {
    pub(super) queue: ShortString,
    /// The live consumer's tag; `None` once cancelled by the broker.
    pub(super) tag: Option<ShortString>,
    /// Tells this consumer's deliveries from those a cancelled one of the
    /// same shard still had buffered.
    generation: u64,
    /// When a probe or an event last came on the live consumer: proof that
    /// we are the shard's active consumer.
    pub(super) seen: Option<Instant>,
    /// Deliveries lately (halved every interval), to pick the shard whose
    /// handoff disturbs least.
    pub(super) recent: u32,
}

/// A consuming channel with one consumer per shard. The prefetch is per
/// consumer (RabbitMQ 4 has no global QoS; quorum queues refuse it); the
/// balance's permits bound the deliveries the worker holds over all shards
/// together, as the `Queue` contract says, resubscribed ones included.
pub(super) struct Subscription {
    pub(super) channel: Channel,
    pub(super) stream: Deliveries,
    pub(super) shards: Vec<ShardSlot>,
    next_generation: u64,
    /// Held while subscribed: the consumer on `Names::consumers`.
    _roll_call: lapin::Consumer,
}

impl Subscription {
    pub(super) async fn consume_shard(&mut self, shard: usize) -> Result<(), QueueError> {
        let slot = &mut self.shards[shard];
        let consumer = self
            .channel
            .basic_consume(
                slot.queue.clone(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| unavailable(format!("failed to consume {}", slot.queue), e))?;
        self.next_generation += 1;
        let generation = self.next_generation;
        slot.tag = Some(consumer.tag());
        slot.generation = generation;
        slot.seen = None;
        slot.recent = 0;
        let tagged = consumer
            .map(Some)
            .chain(futures::stream::once(async { None }))
            .map(move |delivery| Incoming {
                shard,
                generation,
                delivery,
            });
        self.stream.push(tagged.boxed());
        Ok(())
    }

    pub(super) fn current(&self, shard: usize, generation: u64) -> bool {
        let slot = &self.shards[shard];
        slot.tag.is_some() && slot.generation == generation
    }
}

/// Opens a channel with the prefetch and one consumer per shard, starting
/// at the balance's offset.
pub(super) async fn subscribe(
    shared: &Shared,
    link: &Link,
    prefetch: u16,
    balance: &Balance,
) -> Result<Subscription, QueueError> {
    let channel = link
        .connection
        .create_channel()
        .await
        .map_err(|e| unavailable("failed to open a consuming channel", e))?;
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await
        .map_err(|e| unavailable("failed to set the prefetch", e))?;
    let shards = shared
        .names
        .shards
        .iter()
        .map(|queue| {
            Ok(ShardSlot {
                queue: short(queue)?,
                tag: None,
                generation: 0,
                seen: None,
                recent: 0,
            })
        })
        .collect::<Result<Vec<_>, QueueError>>()?;
    let count = shards.len();
    // Answers the roll call (see `Names::consumers`); no message comes.
    let roll_call = channel
        .basic_consume(
            short(&shared.names.consumers)?,
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| unavailable(format!("failed to consume {}", shared.names.consumers), e))?;
    let mut subscription = Subscription {
        channel,
        stream: futures::stream::SelectAll::new(),
        shards,
        next_generation: 0,
        _roll_call: roll_call,
    };
    for k in 0..count {
        subscription
            .consume_shard((balance.offset + k) % count)
            .await?;
    }
    Ok(subscription)
}

/// The state of one subscription's forwarding loop.
pub(super) struct Feeder<'a> {
    pub(super) shared: &'a Arc<Shared>,
    pub(super) link: &'a Link,
    pub(super) balance: &'a Balance,
    pub(super) subscription: Subscription,
    pub(super) deliveries: &'a mpsc::Sender<Delivery>,
    pub(super) pending: Option<Pending>,
    /// Consumers of the shards at the last count (every worker process
    /// subscribes to every shard).
    pub(super) consumers: u32,
}

type Census = BoxFuture<'static, Result<Vec<ShardCounts>, QueueError>>;

async fn forward(feeder: &mut Feeder<'_>, stop: &mut watch::Receiver<()>) -> Ended {
    let mut tick = tokio::time::interval(feeder.balance.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut census: Option<Census> = None;
    let idle = feeder.balance.idle.clone();
    let ended = loop {
        let step = tokio::select! {
            _ = stop.changed() => Err(Ended::Stopped),
            _ = feeder.deliveries.closed() => Err(Ended::Stopped),
            _ = tick.tick() => {
                if census.is_none() {
                    census = Some(
                        count_shards(
                            feeder.link.connection.clone(),
                            // The roll call last: its count of consumers
                            // is the one a quorum shard does not give.
                            feeder
                                .shared
                                .names
                                .shards
                                .iter()
                                .chain([&feeder.shared.names.consumers])
                                .cloned()
                                .collect(),
                            feeder.shared.settings.confirm_timeout,
                        )
                        .boxed(),
                    );
                }
                Ok(())
            }
            counted = async { census.as_mut().expect("a census").await }, if census.is_some() => {
                census = None;
                match counted {
                    Ok(counts) => feeder.on_census(&counts, stop).await,
                    Err(error) => {
                        tracing::debug!(%error, "failed to count the shards' consumers");
                        Ok(())
                    }
                }
            }
            _ = idle.notified(), if feeder.pending.is_some() => feeder.try_hand_off().await,
            next = feeder.subscription.stream.next() => match next {
                Some(incoming) => feeder.on_incoming(incoming, stop).await,
                None => Err(Ended::Lost),
            },
        };
        if let Err(ended) = step {
            break ended;
        }
    };
    feeder.give_back_held().await;
    if let Ended::Stopped = ended {
        feeder.give_back_buffered().await;
    }
    ended
}

impl Feeder<'_> {
    /// Stopping with the channel kept open (deliveries of the worker are
    /// still to be settled on it): the consumers are cancelled and what
    /// their prefetch had already brought goes back now, for another
    /// consumer, rather than when the channel closes.
    async fn give_back_buffered(&mut self) {
        let timeout = self.shared.settings.confirm_timeout;
        let subscription = &mut self.subscription;
        let _ = tokio::time::timeout(timeout, async {
            for slot in &mut subscription.shards {
                if let Some(tag) = slot.tag.take() {
                    let _ = subscription
                        .channel
                        .basic_cancel(tag, BasicCancelOptions::default())
                        .await;
                }
            }
            let mut buffered = Vec::new();
            while let Some(Some(incoming)) = subscription.stream.next().now_or_never() {
                if let Some(Ok(delivery)) = incoming.delivery {
                    buffered.push(delivery);
                }
            }
            requeue_all(buffered).await;
        })
        .await;
    }

    async fn on_incoming(
        &mut self,
        incoming: Incoming,
        stop: &mut watch::Receiver<()>,
    ) -> Result<(), Ended> {
        let Incoming {
            shard, generation, ..
        } = incoming;
        let delivery = match incoming.delivery {
            Some(Ok(delivery)) => delivery,
            Some(Err(error)) => {
                tracing::warn!(%error, "consuming failed");
                return Err(Ended::Lost);
            }
            None => {
                if self.subscription.current(shard, generation) {
                    // The broker cancelled us (the queue was deleted, say).
                    let slot = &mut self.subscription.shards[shard];
                    tracing::warn!(queue = %slot.queue, "the broker cancelled a subscription");
                    slot.tag = None;
                    slot.seen = None;
                    if let Some(pending) = self.pending.take_if(|p| p.shard == shard) {
                        requeue_all(pending.held).await;
                    }
                    if self.subscription.shards.iter().all(|s| s.tag.is_none()) {
                        return Err(Ended::Lost);
                    }
                }
                return Ok(());
            }
        };
        let current = self.subscription.current(shard, generation);
        if is_probe(&delivery.properties) {
            let _ = delivery.acker.ack(BasicAckOptions::default()).await;
            if current {
                self.subscription.shards[shard].seen = Some(Instant::now());
            }
            return Ok(());
        }
        if !current {
            // Buffered on a consumer we cancelled: the shard is another
            // consumer's now, the message goes to it.
            requeue_all(vec![delivery]).await;
            return Ok(());
        }
        let slot = &mut self.subscription.shards[shard];
        slot.seen = Some(Instant::now());
        slot.recent = slot.recent.saturating_add(1);
        if let Some(pending) = self.pending.as_mut().filter(|p| p.shard == shard) {
            pending.held.push(delivery);
            return Ok(());
        }
        self.hand_to_worker(shard, delivery, stop).await
    }

    pub(super) async fn hand_to_worker(
        &mut self,
        shard: usize,
        delivery: AmqpDelivery,
        stop: &mut watch::Receiver<()>,
    ) -> Result<(), Ended> {
        let unsettled = &self.balance.unsettled[shard];
        let channel = &self.subscription.channel;
        let outstanding = self.balance.outstanding.clone();
        let permit = tokio::select! {
            _ = stop.changed() => None,
            _ = self.deliveries.closed() => None,
            permit = outstanding.acquire_owned() => permit.ok(),
        };
        let Some(permit) = permit else {
            // Stopping: it goes back now, not when the channel closes.
            requeue_all(vec![delivery]).await;
            return Err(Ended::Stopped);
        };
        let Some(delivery) = decode(self.shared, channel, delivery, unsettled, permit).await else {
            return Ok(());
        };
        tokio::select! {
            _ = stop.changed() => Err(Ended::Stopped),
            sent = self.deliveries.send(delivery) => sent.map_err(|_| Ended::Stopped),
        }
    }
}

pub(super) async fn requeue_all(deliveries: Vec<AmqpDelivery>) {
    let requeue = BasicNackOptions {
        requeue: true,
        ..Default::default()
    };
    for delivery in deliveries {
        let _ = delivery.acker.nack(requeue).await;
    }
}

/// A message that is not an event will never become one: it is parked with
/// the decode error instead of going round forever. An event that came back
/// unacknowledged is counted, or parked at the limit, before the worker
/// sees it (see `redelivery`).
async fn decode(
    shared: &Arc<Shared>,
    channel: &Channel,
    delivery: AmqpDelivery,
    unsettled: &Arc<Unsettled>,
    outstanding: OwnedSemaphorePermit,
) -> Option<Delivery> {
    match Event::from_bytes(&delivery.data) {
        Ok(event) => {
            let headers = delivery.properties.headers().as_ref();
            let max = shared.settings.max_deliveries;
            let admission = match shared.settings.queue_type {
                QueueType::Quorum => redelivery::admit_counted(
                    redelivery::count(headers, redelivery::BROKER_COUNT_HEADER),
                    max,
                ),
                QueueType::Classic => {
                    redelivery::admit(delivery.redelivered, redelivery::deliveries(headers), max)
                }
            };
            if admission != Admission::Deliver {
                redelivery::count_or_park(shared, channel, delivery, &event, admission).await;
                return None;
            }
            let acker = AmqpAcker {
                shared: shared.clone(),
                event: event.clone(),
                delivery: Some(delivery.acker),
                channel: channel.clone(),
                settling: Some(unsettled.hold(outstanding)),
            };
            Some(Delivery {
                event,
                acker: Box::new(acker),
            })
        }
        Err(error) => {
            let error = format!("the message is not an event: {error}");
            tracing::warn!(routing_key = %delivery.routing_key, error, "parking a message");
            let acker = delivery.acker;
            match shared.park(&delivery.data, None, &error).await {
                Ok(()) => {
                    let _ = acker.ack(BasicAckOptions::default()).await;
                }
                Err(error) => {
                    tracing::warn!(%error, "failed to park a message, giving it back");
                    give_back_later(acker, channel.clone(), RECONNECT_MAX, None);
                }
            }
            None
        }
    }
}
