//! One connection to RabbitMQ, kept up in the background: connect with
//! backoff, declare the topology, publish the live link for the publishers
//! and the consumers, start over when it is lost.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use backoff::ExponentialBackoff;
use backoff::backoff::Backoff;
use futures::stream::StreamExt;
use lapin::options::ConfirmSelectOptions;
use lapin::uri::AMQPUri;
use lapin::{Channel, Connection, ConnectionProperties};
use tokio::sync::{Mutex, watch};

use super::topology::declare_topology;
use super::{Shared, unavailable};
use crate::queue::QueueError;

/// How long one connection attempt to one URL (TCP, AMQP handshake,
/// topology) may take before it counts as failed: a host that drops packets
/// would otherwise hang the attempt for the kernel's SYN timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Reconnect backoff: quick after a blip (a broker restart, a closed
/// connection), at most one attempt every `RECONNECT_MAX` while it stays down.
const RECONNECT_INITIAL: Duration = Duration::from_millis(100);
pub(super) const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// A connection or a subscription that lived this long was a success: the
/// next failure starts the backoff over. One that dies at once (a broker
/// that accepts and closes) keeps backing off instead of spinning.
pub(super) const STABLE: Duration = Duration::from_secs(1);

/// How often the supervisor looks at the connection's state, in case lapin
/// lost it without an error event.
pub(super) const LIVENESS_CHECK: Duration = Duration::from_millis(250);

/// The largest frame this client asks for, unless the URL's `frame_max`
/// says otherwise. lapin keeps a send and a receive buffer of 32 frames per
/// connection: at RabbitMQ's default of 128 KiB that was 8 MiB a connection
/// (40% of a worker's heap at 1,000 Applications, measured with jemalloc's
/// profiler); Setpoint's messages are well under 32 KiB, and a larger one is
/// sent as several frames.
const FRAME_MAX: u32 = 32 * 1024;

/// One live connection.
#[derive(Clone)]
pub(super) struct Link {
    pub(super) connection: Arc<Connection>,
    /// Publishing channel, in confirm mode; reopened when a channel-level
    /// error (a missing exchange, say) closed it while the connection lived.
    pub(super) publisher: Arc<Mutex<Option<Channel>>>,
}

impl Link {
    pub(super) fn connected(&self) -> bool {
        self.connection.status().connected()
    }

    /// Connected, and not blocked by a broker alarm (memory, disk): a
    /// publish would wait for its confirm timeout.
    pub(super) fn usable(&self) -> bool {
        self.connected() && !self.connection.status().blocked()
    }

    pub(super) async fn publisher(&self) -> Result<Channel, lapin::Error> {
        let mut slot = self.publisher.lock().await;
        if let Some(channel) = slot.as_ref()
            && channel.status().connected()
        {
            return Ok(channel.clone());
        }
        let channel = self.connection.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        *slot = Some(channel.clone());
        Ok(channel)
    }

    /// Resolves when the connection is gone (true) or when we are told to
    /// stop (false).
    async fn until_lost(&self, stop: &mut watch::Receiver<()>) -> bool {
        let mut events = Box::pin(self.connection.events_listener());
        let mut check = tokio::time::interval(LIVENESS_CHECK);
        loop {
            tokio::select! {
                _ = stop.changed() => return false,
                event = events.next() => match event {
                    // A channel closed by the broker (a passive declare of a
                    // missing queue, say) is reported here too; only an error
                    // that took the connection with it is a loss.
                    Some(lapin::Event::Error(error)) if !self.connection.status().connected() => {
                        tracing::warn!(%error, "lost the connection to RabbitMQ");
                        return true;
                    }
                    Some(lapin::Event::Error(error)) => {
                        tracing::debug!(%error, "a channel was closed by RabbitMQ");
                    }
                    Some(_) => {}
                    None => return true,
                },
                _ = check.tick() => {
                    if !self.connection.status().connected() {
                        tracing::warn!("lost the connection to RabbitMQ");
                        return true;
                    }
                }
            }
        }
    }
}

impl Shared {
    pub(super) fn current(&self) -> Result<Link, QueueError> {
        self.link
            .borrow()
            .clone()
            .filter(Link::connected)
            .ok_or_else(|| QueueError::Unavailable("not connected to RabbitMQ".into()))
    }

    /// Runs `work` on a channel of its own (a passive declare of a missing
    /// queue closes its channel), bounded by the confirm timeout.
    pub(super) async fn with_channel<T>(
        &self,
        what: &str,
        work: impl AsyncFnOnce(&Channel) -> Result<T, QueueError>,
    ) -> Result<T, QueueError> {
        let link = self.current()?;
        let timeout = self.settings.confirm_timeout;
        let bounded = async {
            let channel = link
                .connection
                .create_channel()
                .await
                .map_err(|e| unavailable("failed to open a channel", e))?;
            let result = work(&channel).await;
            if channel.status().connected() {
                let _ = channel.close(200, "done".into()).await;
            }
            result
        };
        tokio::time::timeout(timeout, bounded)
            .await
            .unwrap_or_else(|_| {
                Err(QueueError::Unavailable(format!(
                    "failed to {what} within {timeout:?}"
                )))
            })
    }

    /// One connection attempt: the broker URLs in turn, starting with
    /// `next_url`, until one connects with the topology declared.
    async fn establish(&self) -> Result<(Link, usize), QueueError> {
        let urls = self.settings.urls();
        if urls.is_empty() {
            return Err(QueueError::Unavailable("no RabbitMQ URL given".into()));
        }
        let start = self.next_url.load(Ordering::Relaxed);
        let mut failures = Vec::with_capacity(urls.len());
        for index in (0..urls.len()).map(|k| (start + k) % urls.len()) {
            let url = urls[index];
            let attempt = tokio::time::timeout(CONNECT_TIMEOUT, self.establish_on(url))
                .await
                .unwrap_or_else(|_| {
                    Err(QueueError::Unavailable(format!(
                        "no connection within {CONNECT_TIMEOUT:?}"
                    )))
                });
            match attempt {
                Ok(link) => return Ok((link, index)),
                Err(error) => {
                    tracing::debug!(url = %super::redacted(url), %error, "a broker URL failed");
                    failures.push(format!("{}: {error}", super::redacted(url)));
                }
            }
        }
        Err(QueueError::Unavailable(failures.join("; ")))
    }

    /// Connect to one URL, declare the topology, open the publishing
    /// channel.
    async fn establish_on(&self, url: &str) -> Result<Link, QueueError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(self.connection_name.clone().into());
        let mut uri: AMQPUri = url.parse().map_err(|error| {
            QueueError::Unavailable(format!("failed to connect to RabbitMQ: {error}"))
        })?;
        uri.query.frame_max.get_or_insert(FRAME_MAX);
        let connection = Connection::connect_uri(uri, properties)
            .await
            .map_err(|e| unavailable("failed to connect to RabbitMQ", e))?;
        let link = Link {
            connection: Arc::new(connection),
            publisher: Arc::default(),
        };
        let ready = async {
            let channel = link
                .connection
                .create_channel()
                .await
                .map_err(|e| unavailable("failed to open a channel", e))?;
            declare_topology(&channel, &self.names, &self.settings).await?;
            let _ = channel.close(200, "declared".into()).await;
            link.publisher()
                .await
                .map_err(|e| unavailable("failed to open a publishing channel", e))
        };
        match ready.await {
            Ok(_) => Ok(link),
            Err(error) => {
                let _ = link.connection.close(200, "topology failed".into()).await;
                Err(error)
            }
        }
    }
}

/// Keeps one connection up: connects with backoff, publishes the live link
/// for everyone else, and starts over when it is lost, until the last
/// `AmqpQueue` is dropped.
pub(super) async fn supervise(shared: Arc<Shared>, mut stop: watch::Receiver<()>) {
    let mut backoff = reconnect_backoff();
    loop {
        let attempt = shared.connection_attempts.fetch_add(1, Ordering::Relaxed) + 1;
        let established = tokio::select! {
            _ = stop.changed() => return,
            result = shared.establish() => result,
        };
        match established {
            Ok((link, index)) => {
                let urls = shared.settings.urls();
                let url = urls
                    .get(index)
                    .map(|url| super::redacted(url))
                    .unwrap_or_default();
                tracing::info!(attempt, name = %shared.connection_name, %url, "connected to RabbitMQ");
                // Lost, it is most likely this node that went: the next
                // attempt starts with the next URL (one URL: itself).
                shared
                    .next_url
                    .store((index + 1) % urls.len().max(1), Ordering::Relaxed);
                let since = tokio::time::Instant::now();
                shared.link.send_replace(Some(link.clone()));
                let lost = link.until_lost(&mut stop).await;
                if since.elapsed() >= STABLE {
                    backoff.reset();
                }
                shared.link.send_replace(None);
                if !lost {
                    let _ = link.connection.close(200, "shutting down".into()).await;
                    return;
                }
            }
            Err(error) => {
                tracing::warn!(%error, attempt, "failed to connect to RabbitMQ, will retry")
            }
        }
        let delay = backoff.next_backoff().unwrap_or(RECONNECT_MAX);
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

pub(super) fn reconnect_backoff() -> ExponentialBackoff {
    ExponentialBackoff {
        initial_interval: RECONNECT_INITIAL,
        current_interval: RECONNECT_INITIAL,
        randomization_factor: 0.25,
        multiplier: 2.0,
        max_interval: RECONNECT_MAX,
        max_elapsed_time: None,
        ..Default::default()
    }
}
