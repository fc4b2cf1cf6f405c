//! The queue between where events come from (webhooks, watches, the sweep)
//! and the workers. One small interface, two implementations: `amqp`
//! (RabbitMQ, for more than one process) and `memory` (the embedded default of
//! `setpoint run`).
//!
//! The contract both keep:
//! - `publish` returns only once the event is safe (RabbitMQ confirmed it), so
//!   an acknowledged webhook is never lost;
//! - a delivery is acknowledged only after its reconcile finished; one that
//!   is dropped unacknowledged (a crash) is delivered again;
//! - `retry` redelivers after an exponential backoff and, after
//!   `max_attempts`, parks the event with its last error;
//! - an event whose deliveries keep going unacknowledged (its worker dies
//!   while reconciling it) is parked after `max_deliveries` (RabbitMQ; in
//!   process, a crash takes the queue with it, so nothing can loop);
//! - every event of one Application goes to one consumer at a time (the
//!   worker adds a per-Application lock within the process).

pub mod amqp;
pub mod memory;

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use crate::event::Event;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The broker cannot be reached now; the caller answers 503 or retries.
    #[error("the queue is unavailable: {0}")]
    Unavailable(String),
    #[error("the broker did not confirm the message: {0}")]
    NotConfirmed(String),
    #[error("failed to declare the queue topology: {0}")]
    Topology(String),
    #[error("the queue is closed")]
    Closed,
}

/// Retry settings shared by both implementations.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// After this many failed attempts an event is parked.
    pub max_attempts: u32,
    pub initial: Duration,
    pub multiplier: f64,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial: Duration::from_secs(1),
            multiplier: 2.0,
            max_delay: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The delay before attempt `attempt` (1-based), from the `backoff`
    /// crate's exponential policy without jitter, so every event of one
    /// attempt waits equally long (RabbitMQ's delay queues are FIFO).
    pub fn delay(&self, attempt: u32) -> Duration {
        use backoff::backoff::Backoff;
        let mut policy = backoff::ExponentialBackoff {
            initial_interval: self.initial,
            current_interval: self.initial,
            randomization_factor: 0.0,
            multiplier: self.multiplier,
            max_interval: self.max_delay,
            max_elapsed_time: None,
            ..Default::default()
        };
        let mut delay = self.initial;
        for _ in 0..attempt.max(1) {
            delay = policy.next_backoff().unwrap_or(self.max_delay);
        }
        delay
    }
}

/// What a worker does with a delivery once its reconcile is over.
#[async_trait]
pub trait Acker: Send + Sync {
    /// Done: the event is removed.
    async fn ack(self: Box<Self>) -> Result<(), QueueError>;
    /// Failed: redeliver after the backoff for `attempt + 1`, or park it with
    /// `error` once the attempts are used up. The event is kept until the
    /// retry copy is safe.
    async fn retry(self: Box<Self>, error: &str) -> Result<(), QueueError>;
    /// Not processed (shutting down): give it back for redelivery now.
    async fn requeue(self: Box<Self>) -> Result<(), QueueError>;
}

/// One event handed to a worker.
pub struct Delivery {
    pub event: Event,
    pub acker: Box<dyn Acker>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("event", &self.event)
            .finish()
    }
}

impl Delivery {
    pub async fn ack(self) -> Result<(), QueueError> {
        self.acker.ack().await
    }
    pub async fn retry(self, error: &str) -> Result<(), QueueError> {
        self.acker.retry(error).await
    }
    pub async fn requeue(self) -> Result<(), QueueError> {
        self.acker.requeue().await
    }
}

#[async_trait]
pub trait Queue: Send + Sync {
    /// Returns once the event is safe with the queue (publisher confirm).
    async fn publish(&self, event: &Event) -> Result<(), QueueError>;
    /// Starts consuming; at most `prefetch` deliveries are outstanding
    /// (unacknowledged) at once. Survives broker restarts: the receiver keeps
    /// yielding after a reconnect.
    async fn consume(&self, prefetch: u16) -> Result<mpsc::Receiver<Delivery>, QueueError>;
    /// Whether the queue can take a publish right now (for /readyz).
    fn is_ready(&self) -> bool;
    /// Messages waiting, for metrics; `None` when the queue cannot tell.
    async fn depth(&self) -> Option<QueueDepth> {
        None
    }
    /// How many shards this process consumes as the active consumer, for
    /// metrics; `None` when the queue has no shards.
    fn active_shards(&self) -> Option<usize> {
        None
    }
}

/// Messages waiting in a queue, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Ready (not delivered, or given back) plus those waiting out a retry
    /// delay.
    pub ready: u32,
    /// Parked after their last attempt failed.
    pub parked: u32,
}

/// A queue whose publishes are timed into the metrics.
pub struct Metered {
    pub inner: std::sync::Arc<dyn Queue>,
    pub metrics: crate::metrics::Metrics,
}

#[async_trait]
impl Queue for Metered {
    async fn publish(&self, event: &Event) -> Result<(), QueueError> {
        let started = std::time::Instant::now();
        let result = self.inner.publish(event).await;
        if result.is_ok() {
            self.metrics
                .publish_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        result
    }

    async fn consume(&self, prefetch: u16) -> Result<mpsc::Receiver<Delivery>, QueueError> {
        self.inner.consume(prefetch).await
    }

    fn is_ready(&self) -> bool {
        self.inner.is_ready()
    }

    async fn depth(&self) -> Option<QueueDepth> {
        self.inner.depth().await
    }

    fn active_shards(&self) -> Option<usize> {
        self.inner.active_shards()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_exponentially_up_to_the_cap() {
        let policy = RetryPolicy {
            initial: Duration::from_millis(100),
            max_delay: Duration::from_millis(500),
            ..Default::default()
        };
        let delays: Vec<_> = (1..=5).map(|a| policy.delay(a).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 500, 500]);
    }
}
