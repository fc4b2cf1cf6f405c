//! Settling a delivery once its reconcile is over: ack, retry (a confirmed
//! copy to the delay queue, then the ack), or give it back.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lapin::Channel;
use lapin::options::{BasicAckOptions, BasicNackOptions};

use super::balance::Settling;
use super::{Shared, unavailable};
use crate::event::Event;
use crate::queue::{Acker, QueueError};

pub(super) struct AmqpAcker {
    pub(super) shared: Arc<Shared>,
    pub(super) event: Event,
    /// Taken when the delivery is settled; still here on drop = give it
    /// back, as a crash would.
    pub(super) delivery: Option<lapin::Acker>,
    /// Keeps the delivery's channel open (lapin closes a channel with its
    /// last handle) after the consumer stopped taking messages.
    pub(super) channel: Channel,
    /// Keeps the delivery's shard from being handed off until the delivery
    /// is settled.
    pub(super) settling: Option<Settling>,
}

impl AmqpAcker {
    pub(super) fn take(&mut self) -> lapin::Acker {
        self.delivery.take().expect("an unsettled delivery")
    }
}

/// lapin answers `false` when the delivery's channel is gone: the broker
/// already gave the message back and will deliver it again.
fn settled(what: &str, result: Result<bool, lapin::Error>) -> Result<(), QueueError> {
    match result {
        Ok(true) => Ok(()),
        Ok(false) => Err(QueueError::Unavailable(format!(
            "failed to {what}: the delivery's channel closed, the broker delivers it again"
        ))),
        Err(error) => Err(unavailable(format!("failed to {what}"), error)),
    }
}

#[async_trait]
impl Acker for AmqpAcker {
    async fn ack(mut self: Box<Self>) -> Result<(), QueueError> {
        let delivery = self.take();
        settled("ack", delivery.ack(BasicAckOptions::default()).await)
    }

    /// The copy is confirmed before the original is acked: a crash in
    /// between leaves both, a duplicate rather than a loss.
    async fn retry(mut self: Box<Self>, error: &str) -> Result<(), QueueError> {
        let delivery = self.take();
        let mut event = self.event.clone();
        event.attempt += 1;
        match self.shared.send_retry(&event, error).await {
            Ok(()) => settled("ack", delivery.ack(BasicAckOptions::default()).await),
            Err(failed) => {
                // Unacked, it would hold a prefetch slot until the channel
                // closes; given back at once, a broker that refuses
                // publishes (an alarm) would see it reconciled in a loop.
                let delay = self.shared.settings.retry.delay(event.attempt);
                give_back_later(delivery, self.channel.clone(), delay, self.settling.take());
                Err(failed)
            }
        }
    }

    async fn requeue(mut self: Box<Self>) -> Result<(), QueueError> {
        let delivery = self.take();
        let requeue = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        settled("requeue", delivery.nack(requeue).await)
    }
}

impl Drop for AmqpAcker {
    fn drop(&mut self) {
        if let Some(delivery) = self.delivery.take()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            give_back_later(
                delivery,
                self.channel.clone(),
                Duration::ZERO,
                self.settling.take(),
            );
        }
    }
}

/// Requeues a delivery after `delay`, holding its prefetch slot (and its
/// channel, and its shard) meanwhile.
pub(super) fn give_back_later(
    delivery: lapin::Acker,
    channel: Channel,
    delay: Duration,
    settling: Option<Settling>,
) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let requeue = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        let _ = delivery.nack(requeue).await;
        drop(channel);
        drop(settling);
    });
}
