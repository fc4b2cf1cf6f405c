//! The worker's side of notifications: `Cause::Notify` deliveries take
//! slots of their own, one per Provider, and permits of their own, apart
//! from the reconciles' and the previews'. A Provider holds at most
//! `per_provider` deliveries in flight. While its last delivery failed it
//! also holds at most `provider_backlog` waiting, and past that a delivery
//! goes back to the queue's backoff at once, so a Provider that is down or
//! hangs neither fills the worker's prefetch (which the reconciles share)
//! nor delays another Provider. A Provider that answers takes every
//! delivery that comes (the prefetch bounds them): a burst to it is a
//! backlog that drains, never an attempt used up.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::event::Cause;
use crate::notify::Notifier;
use crate::notify::deliver::{self, Delivered};
use crate::queue::Delivery;

pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

#[derive(Default)]
struct ProviderSlot {
    waiting: VecDeque<Delivery>,
    running: usize,
}

/// Hands notifications to their Providers' slots.
pub struct Dispatcher {
    notifier: Option<Notifier>,
    permits: Semaphore,
    slots: Mutex<HashMap<String, ProviderSlot>>,
    /// The Providers whose last delivery failed.
    failing: Mutex<HashSet<String>>,
    stopping: AtomicBool,
}

impl Dispatcher {
    /// Without a notifier (a process that configured none), notifications
    /// are acknowledged and dropped with a warning.
    pub fn new(notifier: Option<Notifier>) -> Arc<Self> {
        let concurrency = notifier
            .as_ref()
            .map_or(1, |n| n.settings().concurrency.max(1));
        Arc::new(Self {
            notifier,
            permits: Semaphore::new(concurrency),
            slots: Mutex::default(),
            failing: Mutex::default(),
            stopping: AtomicBool::new(false),
        })
    }

    /// Takes one `Cause::Notify` delivery: a task to spawn when its
    /// Provider has room for one more in flight.
    pub fn accept(self: &Arc<Self>, delivery: Delivery) -> Option<Task> {
        let Some(notifier) = self.notifier.clone() else {
            return Some(Box::pin(async move {
                tracing::warn!(event = %delivery.event.id, "a notification reached a worker without notifications set up; dropped");
                let _ = delivery.ack().await;
            }));
        };
        let Cause::Notify(notification) = &delivery.event.cause else {
            return None;
        };
        let key = crate::notify::tap::provider_key(&notification.namespace, &notification.provider);
        let settings = notifier.settings();
        let failing = self
            .failing
            .lock()
            .expect("notify failing lock")
            .contains(&key);
        let mut slots = self.slots.lock().expect("notify slots lock");
        let slot = slots.entry(key.clone()).or_default();
        if failing && slot.waiting.len() >= settings.provider_backlog {
            drop(slots);
            let backlog = settings.provider_backlog;
            return Some(Box::pin(async move {
                let error = format!("the provider {key} has {backlog} notifications waiting");
                settle_failed(&notifier, &key, delivery, &error).await;
            }));
        }
        slot.waiting.push_back(delivery);
        if slot.running >= settings.per_provider.max(1) {
            return None;
        }
        slot.running += 1;
        drop(slots);
        let dispatcher = self.clone();
        Some(Box::pin(
            async move { dispatcher.drive(notifier, key).await },
        ))
    }

    /// Stops taking deliveries: the waiting ones are returned (to give
    /// back to the queue).
    pub fn stop(&self) -> Vec<Delivery> {
        self.stopping.store(true, Ordering::SeqCst);
        let mut slots = self.slots.lock().expect("notify slots lock");
        slots
            .values_mut()
            .flat_map(|slot| std::mem::take(&mut slot.waiting))
            .collect()
    }

    /// Delivers the Provider's waiting notifications, one at a time in
    /// this task, until none waits.
    async fn drive(self: Arc<Self>, notifier: Notifier, key: String) {
        loop {
            let _permit = self
                .permits
                .acquire()
                .await
                .expect("the semaphore stays open");
            let next = {
                let mut slots = self.slots.lock().expect("notify slots lock");
                let slot = slots.get_mut(&key).expect("a running provider has a slot");
                match slot.waiting.pop_front() {
                    Some(delivery) if !self.stopping.load(Ordering::SeqCst) => Some(delivery),
                    Some(delivery) => {
                        slot.waiting.push_front(delivery);
                        None
                    }
                    None => None,
                }
            };
            let Some(delivery) = next else {
                let mut slots = self.slots.lock().expect("notify slots lock");
                if let Some(slot) = slots.get_mut(&key) {
                    slot.running -= 1;
                    if slot.running == 0 && slot.waiting.is_empty() {
                        slots.remove(&key);
                    }
                }
                return;
            };
            let ok = handle(&notifier, &key, delivery).await;
            let mut failing = self.failing.lock().expect("notify failing lock");
            if ok {
                failing.remove(&key);
            } else {
                failing.insert(key.clone());
            }
        }
    }
}

/// Whether the Provider answered (or had nothing to answer).
async fn handle(notifier: &Notifier, key: &str, delivery: Delivery) -> bool {
    let Cause::Notify(notification) = &delivery.event.cause else {
        return true;
    };
    let span = tracing::info_span!("notify", provider = %key, id = %notification.id, alert = %notification.alert, kind = notification.occurrence.kind.as_str(), app = %notification.occurrence.app.name, attempt = delivery.event.attempt);
    let result = tracing::Instrument::instrument(
        deliver::deliver(notifier, notification, delivery.event.fresh_since),
        span,
    )
    .await;
    let outcome = match &result {
        Ok(Delivered::Sent) => {
            tracing::info!(provider = %key, id = %notification.id, "notification sent");
            "sent"
        }
        Ok(Delivered::Duplicate) => {
            tracing::info!(provider = %key, id = %notification.id, "notification delivered before; not sent again");
            "duplicate"
        }
        Ok(Delivered::Dropped(why)) => {
            tracing::warn!(provider = %key, id = %notification.id, "notification dropped: {why}");
            "dropped"
        }
        Err(error) => {
            let error = crate::report::events::error_chain(error);
            settle_failed(notifier, key, delivery, &error).await;
            return false;
        }
    };
    notifier.count(key, outcome);
    if let Err(error) = delivery.ack().await {
        tracing::warn!(provider = %key, %error, "failed to ack a notification; the broker redelivers");
    }
    true
}

/// Back to the queue's backoff, or parked after the last attempt.
async fn settle_failed(notifier: &Notifier, key: &str, delivery: Delivery, error: &str) {
    let attempt = delivery.event.attempt + 1;
    if attempt >= notifier.settings().max_attempts {
        tracing::warn!(provider = %key, id = %delivery.event.id, attempt, error, "notification parked after its last attempt");
        notifier.count(key, "parked");
    } else {
        tracing::info!(provider = %key, id = %delivery.event.id, attempt, error, "notification failed; retried with backoff");
        notifier.count(key, "failed");
    }
    if let Err(e) = delivery.retry(error).await {
        tracing::warn!(provider = %key, error = %e, "failed to schedule a notification's retry; the broker redelivers");
    }
}
