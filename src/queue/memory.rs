//! The embedded queue of `setpoint run`: the same contract as RabbitMQ's
//! within one process (events are lost with the process, which is why more
//! than one process needs RabbitMQ).
//!
//! It needs no delivery limit (RabbitMQ's `max_deliveries`): it lives in the
//! one process that runs the workers, so an event that crashes a worker (an
//! abort, a kill) takes the queue down with it and cannot crash another.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use super::{Acker, Delivery, Queue, QueueError, RetryPolicy};
use crate::event::Event;

#[derive(Clone)]
pub struct MemoryQueue(Arc<Inner>);

struct Inner {
    sender: mpsc::UnboundedSender<Event>,
    receiver: Mutex<Option<mpsc::UnboundedReceiver<Event>>>,
    policy: RetryPolicy,
    parked: Mutex<Vec<(Event, String)>>,
}

impl MemoryQueue {
    pub fn new(policy: RetryPolicy) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        Self(Arc::new(Inner {
            sender,
            receiver: Mutex::new(Some(receiver)),
            policy,
            parked: Mutex::new(Vec::new()),
        }))
    }

    /// Events that failed `max_attempts` times, with their last error.
    pub fn parked(&self) -> Vec<(Event, String)> {
        self.0.parked.lock().expect("parked lock").clone()
    }

    fn push(&self, event: Event) -> Result<(), QueueError> {
        self.0.sender.send(event).map_err(|_| QueueError::Closed)
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    async fn publish(&self, event: &Event) -> Result<(), QueueError> {
        self.push(event.clone())
    }

    async fn consume(&self, prefetch: u16) -> Result<mpsc::Receiver<Delivery>, QueueError> {
        let mut events = self
            .0
            .receiver
            .lock()
            .expect("receiver lock")
            .take()
            .ok_or_else(|| {
                QueueError::Unavailable("the in-process queue has one consumer".into())
            })?;
        let (deliveries, receiver) = mpsc::channel(prefetch.max(1) as usize);
        let permits = Arc::new(Semaphore::new(prefetch.max(1) as usize));
        let queue = self.clone();
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    break;
                };
                let acker = MemoryAcker {
                    queue: queue.clone(),
                    event: Some(event.clone()),
                    _permit: permit,
                };
                if deliveries
                    .send(Delivery {
                        event,
                        acker: Box::new(acker),
                    })
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
        Ok(receiver)
    }

    fn is_ready(&self) -> bool {
        !self.0.sender.is_closed()
    }
}

struct MemoryAcker {
    queue: MemoryQueue,
    /// Taken when the delivery is settled; still here on drop = redeliver.
    event: Option<Event>,
    _permit: OwnedSemaphorePermit,
}

#[async_trait]
impl Acker for MemoryAcker {
    async fn ack(mut self: Box<Self>) -> Result<(), QueueError> {
        self.event = None;
        Ok(())
    }

    async fn retry(mut self: Box<Self>, error: &str) -> Result<(), QueueError> {
        let mut event = self.event.take().expect("an unsettled delivery");
        event.attempt += 1;
        let policy = &self.queue.0.policy;
        if event.attempt >= policy.max_attempts {
            tracing::warn!(app = %event.app, attempts = event.attempt, error, "parking event");
            self.queue
                .0
                .parked
                .lock()
                .expect("parked lock")
                .push((event, error.to_string()));
            return Ok(());
        }
        let delay = policy.delay(event.attempt);
        let queue = self.queue.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = queue.push(event);
        });
        Ok(())
    }

    async fn requeue(mut self: Box<Self>) -> Result<(), QueueError> {
        let event = self.event.take().expect("an unsettled delivery");
        self.queue.push(event)
    }
}

impl Drop for MemoryAcker {
    fn drop(&mut self) {
        if let Some(event) = self.event.take() {
            let _ = self.queue.push(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::event::{AppKey, Cause};

    fn event(name: &str) -> Event {
        Event::new(AppKey::new("ns", name), Cause::Sweep)
    }

    fn fast() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 3,
            initial: Duration::from_millis(5),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn delivers_in_order_and_acks() {
        let queue = MemoryQueue::new(fast());
        queue.publish(&event("a")).await.unwrap();
        queue.publish(&event("b")).await.unwrap();
        let mut rx = queue.consume(10).await.unwrap();
        let a = rx.recv().await.unwrap();
        let b = rx.recv().await.unwrap();
        assert_eq!(
            (a.event.app.name.as_str(), b.event.app.name.as_str()),
            ("a", "b")
        );
        a.ack().await.unwrap();
        b.ack().await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), rx.recv())
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn prefetch_bounds_outstanding_deliveries() {
        let queue = MemoryQueue::new(fast());
        for name in ["a", "b", "c"] {
            queue.publish(&event(name)).await.unwrap();
        }
        let mut rx = queue.consume(2).await.unwrap();
        let a = rx.recv().await.unwrap();
        let _b = rx.recv().await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), rx.recv())
                .await
                .is_err()
        );
        a.ack().await.unwrap();
        assert_eq!(rx.recv().await.unwrap().event.app.name, "c");
    }

    #[tokio::test]
    async fn retries_with_backoff_then_parks() {
        let queue = MemoryQueue::new(fast());
        queue.publish(&event("a")).await.unwrap();
        let mut rx = queue.consume(1).await.unwrap();
        for attempt in 0..3 {
            let delivery = rx.recv().await.unwrap();
            assert_eq!(delivery.event.attempt, attempt);
            delivery.retry("boom").await.unwrap();
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(50), rx.recv())
                .await
                .is_err()
        );
        let parked = queue.parked();
        assert_eq!(parked.len(), 1);
        assert_eq!(parked[0].1, "boom");
    }

    #[tokio::test]
    async fn a_dropped_delivery_is_delivered_again() {
        let queue = MemoryQueue::new(fast());
        queue.publish(&event("a")).await.unwrap();
        let mut rx = queue.consume(1).await.unwrap();
        drop(rx.recv().await.unwrap());
        assert_eq!(rx.recv().await.unwrap().event.app.name, "a");
    }
}
