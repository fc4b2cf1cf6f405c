//! The queue between ingest and the workers when Setpoint runs as more than
//! one process: RabbitMQ, through lapin. Ingest publishes here (and answers
//! its webhook only once the broker confirmed), workers consume from here.
//!
//! The topology, all durable and all named from one prefix (`setpoint`):
//!
//! ```text
//! publish ──► <prefix>.events (x-consistent-hash, key = namespace/name)
//!               ├─"1"─► <prefix>.shard.0   (x-single-active-consumer)
//!               ├─ …
//!               └─"1"─► <prefix>.shard.<shards-1>
//! retry n ──► <prefix>.retry.<n> (fanout) ──► <prefix>.retry.<n>
//!               (x-message-ttl = delay(n), dead letters ──► <prefix>.events)
//! park    ──► (default exchange) ──► <prefix>.parked
//! ```
//!
//! Hashing the Application's key puts all its events on one shard, and a
//! single active consumer per shard gives each shard to one worker process
//! at a time, so one Application is reconciled by one process at a time.
//! Retries wait in a delay queue per attempt and are dead-lettered back to
//! the events exchange under their original routing key, hence to their
//! shard; that is why they are published through a fanout exchange with the
//! Application's key and not through the default exchange, whose routing key
//! would be the delay queue's name.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use backoff::ExponentialBackoff;
use backoff::backoff::Backoff;
use futures::StreamExt;
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions,
    BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
};
use tokio::sync::{Mutex, mpsc, watch};

use super::{Acker, Delivery, Queue, QueueError, RetryPolicy};
use crate::event::Event;

/// The header of a parked message that holds its last error.
pub const ERROR_HEADER: &str = "x-setpoint-error";

/// Parked errors are for a person reading them; the whole chain of a failed
/// apply can be long, and headers travel with every copy of the message.
const ERROR_HEADER_MAX_CHARS: usize = 1000;

/// How long one connection attempt (TCP, AMQP handshake, topology) may take
/// before it counts as failed: a host that drops packets would otherwise hang
/// the attempt for the kernel's SYN timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Reconnect backoff: quick after a blip (a broker restart, a closed
/// connection), at most one attempt every `RECONNECT_MAX` while it stays down.
const RECONNECT_INITIAL: Duration = Duration::from_millis(100);
const RECONNECT_MAX: Duration = Duration::from_secs(10);

/// A connection or a subscription that lived this long was a success: the
/// next failure starts the backoff over. One that dies at once (a broker
/// that accepts and closes) keeps backing off instead of spinning.
const STABLE: Duration = Duration::from_secs(1);

/// How often the supervisor looks at the connection's state, in case lapin
/// lost it without an error event.
const LIVENESS_CHECK: Duration = Duration::from_millis(250);

/// `parked()` holds what it read unacknowledged until it gives it back; a
/// bound keeps a huge parking queue from being pulled into memory at once.
const PARKED_READ_LIMIT: usize = 10_000;

#[derive(Clone)]
pub struct AmqpSettings {
    /// `amqp://user:password@host:port/vhost` (the vhost `/` is `%2f`).
    pub url: String,
    /// Every exchange and queue name starts with it, so two installations
    /// (or two tests) can share a broker.
    pub prefix: String,
    /// Shard queues; at most this many worker processes consume at once.
    /// Growing it is safe; shrinking it leaves the extra shard queues bound
    /// (and unconsumed) until an operator deletes them.
    pub shards: u16,
    /// Changing the delays changes the delay queues' arguments: the old
    /// `<prefix>.retry.<n>` queues must be deleted first, RabbitMQ refuses to
    /// redeclare a queue with other arguments.
    pub retry: RetryPolicy,
    /// How long `publish` waits for the broker's confirm; also bounds the
    /// other calls to the broker (`depth`, `parked`, `delete_topology`).
    pub confirm_timeout: Duration,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            prefix: "setpoint".into(),
            shards: 16,
            retry: RetryPolicy::default(),
            confirm_timeout: Duration::from_secs(10),
        }
    }
}

/// Settings end up in logs; the URL's password must not.
impl std::fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSettings")
            .field("url", &redacted(&self.url))
            .field("prefix", &self.prefix)
            .field("shards", &self.shards)
            .field("retry", &self.retry)
            .field("confirm_timeout", &self.confirm_timeout)
            .finish()
    }
}

/// `amqp://user:secret@host/` → `amqp://user:***@host/`.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// Messages waiting in the queues, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueDepth {
    /// Ready (not delivered, or given back) in the shard queues plus those
    /// waiting out a retry delay.
    pub ready: u32,
    /// In the parking queue.
    pub parked: u32,
}

/// A handle on the broker; clones share one connection.
#[derive(Clone)]
pub struct AmqpQueue(Arc<Handle>);

/// Owned by the `AmqpQueue` clones only: when the last one goes, the stop
/// sender goes with it and the background tasks close the connection.
struct Handle {
    shared: Arc<Shared>,
    stop: watch::Sender<()>,
}

/// What the background tasks and the ackers share.
struct Shared {
    settings: AmqpSettings,
    names: Names,
    /// Shown by `rabbitmqctl list_connections client_properties` and in the
    /// management UI, so an operator can tell worker processes apart.
    connection_name: String,
    /// `Some` while connected with the topology declared.
    link: watch::Sender<Option<Link>>,
    connection_attempts: AtomicU64,
}

/// One live connection.
#[derive(Clone)]
struct Link {
    connection: Arc<Connection>,
    /// Publishing channel, in confirm mode; reopened when a channel-level
    /// error (a missing exchange, say) closed it while the connection lived.
    publisher: Arc<Mutex<Option<Channel>>>,
}

/// Exchange and queue names, derived once from the prefix.
#[derive(Clone, Debug)]
struct Names {
    events: String,
    shards: Vec<String>,
    /// Index `n - 1` holds attempt `n`'s delay queue (and its exchange, of
    /// the same name).
    retries: Vec<String>,
    parked: String,
}

impl Names {
    fn new(prefix: &str, shards: u16, retry: &RetryPolicy) -> Self {
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
    fn retry(&self, attempt: u32) -> Option<&str> {
        let index = usize::try_from(attempt).ok()?.checked_sub(1)?;
        self.retries.get(index).map(String::as_str)
    }
}

impl AmqpQueue {
    /// Connects (in the background, retrying with backoff forever: no panic,
    /// no busy loop) and declares the topology idempotently on every
    /// (re)connect. Returns at once, even when the broker is down, so a
    /// process starts and answers /readyz while RabbitMQ comes up;
    /// `is_ready` and `wait_ready` tell when it is usable.
    pub async fn connect(settings: AmqpSettings) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let names = Names::new(&settings.prefix, settings.shards, &settings.retry);
        let connection_name = format!(
            "setpoint {} pid {} #{}",
            settings.prefix,
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let shared = Arc::new(Shared {
            settings,
            names,
            connection_name,
            link: watch::Sender::new(None),
            connection_attempts: AtomicU64::new(0),
        });
        let (stop, stopped) = watch::channel(());
        tokio::spawn(supervise(shared.clone(), stopped));
        Self(Arc::new(Handle { shared, stop }))
    }

    /// Waits until connected with the topology declared; false on timeout.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut links = self.0.shared.link.subscribe();
        while !self.is_ready() {
            // A new link wakes us; the end of a broker alarm changes no
            // link, hence the periodic look as well.
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => return self.is_ready(),
                _ = links.changed() => {}
                _ = tokio::time::sleep(LIVENESS_CHECK) => {}
            }
        }
        true
    }

    /// How many times the background task tried to connect, for metrics and
    /// to prove in tests that it backs off.
    pub fn connection_attempts(&self) -> u64 {
        self.0.shared.connection_attempts.load(Ordering::Relaxed)
    }

    /// Counts for tests and metrics.
    pub async fn depth(&self) -> Result<QueueDepth, QueueError> {
        let shared = &self.0.shared;
        shared
            .with_channel("count the queues", async |channel| {
                let mut ready = 0u32;
                for queue in shared.names.shards.iter().chain(&shared.names.retries) {
                    ready = ready.saturating_add(message_count(channel, queue).await?);
                }
                let parked = message_count(channel, &shared.names.parked).await?;
                Ok(QueueDepth { ready, parked })
            })
            .await
    }

    /// Events parked after their last attempt, with their last error. Reads
    /// the parking queue without consuming it: everything read is given back
    /// (in its place) before this returns. Messages that are not events (a
    /// foreign publisher's) are skipped here; they stay in the queue.
    pub async fn parked(&self) -> Result<Vec<(Event, String)>, QueueError> {
        let shared = &self.0.shared;
        let queue = short(&shared.names.parked)?;
        shared
            .with_channel("read the parking queue", async |channel| {
                let mut parked = Vec::new();
                let mut last_tag = None;
                while parked.len() < PARKED_READ_LIMIT {
                    let got = channel
                        .basic_get(queue.clone(), BasicGetOptions { no_ack: false })
                        .await
                        .map_err(|e| unavailable(format!("failed to read {queue}"), e))?;
                    let Some(message) = got else { break };
                    let delivery = message.delivery;
                    last_tag = Some(delivery.delivery_tag);
                    match Event::from_bytes(&delivery.data) {
                        Ok(event) => parked.push((event, error_header(&delivery.properties))),
                        Err(error) => {
                            tracing::warn!(%error, "skipping a parked message that is not an event")
                        }
                    }
                }
                if let Some(tag) = last_tag {
                    // Closing the channel would give them back too; the nack
                    // just does it before we return.
                    let requeue = BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    };
                    channel
                        .basic_nack(tag, requeue)
                        .await
                        .map_err(|e| unavailable(format!("failed to give back {queue}"), e))?;
                }
                Ok(parked)
            })
            .await
    }

    /// Deletes every exchange and queue of this prefix, messages included.
    /// For tests; a running consumer keeps trying to resubscribe until it is
    /// dropped.
    pub async fn delete_topology(&self) -> Result<(), QueueError> {
        let shared = &self.0.shared;
        let names = &shared.names;
        shared
            .with_channel("delete the topology", async |channel| {
                let queues = names
                    .shards
                    .iter()
                    .chain(&names.retries)
                    .chain([&names.parked]);
                for queue in queues {
                    channel
                        .queue_delete(short(queue)?, QueueDeleteOptions::default())
                        .await
                        .map_err(|e| topology(format!("failed to delete queue {queue}"), e))?;
                }
                for exchange in names.retries.iter().chain([&names.events]) {
                    channel
                        .exchange_delete(short(exchange)?, ExchangeDeleteOptions::default())
                        .await
                        .map_err(|e| {
                            topology(format!("failed to delete exchange {exchange}"), e)
                        })?;
                }
                Ok(())
            })
            .await
    }
}

#[async_trait]
impl Queue for AmqpQueue {
    async fn publish(&self, event: &Event) -> Result<(), QueueError> {
        let shared = &self.0.shared;
        let properties = message_properties(event);
        shared
            .send(
                &shared.names.events,
                &routing_key(event),
                &event.to_bytes(),
                properties,
            )
            .await
    }

    /// Call it once per process: each call subscribes to every shard on a
    /// channel of its own, and a second subscription only waits behind the
    /// first (single active consumer). Dropping the receiver stops new
    /// deliveries; those already handed out can still be settled. The
    /// receiver ends when this `AmqpQueue` (all its clones) is dropped.
    async fn consume(&self, prefetch: u16) -> Result<mpsc::Receiver<Delivery>, QueueError> {
        let prefetch = prefetch.max(1);
        let (deliveries, receiver) = mpsc::channel(usize::from(prefetch));
        let stop = self.0.stop.subscribe();
        tokio::spawn(consume(self.0.shared.clone(), prefetch, deliveries, stop));
        Ok(receiver)
    }

    fn is_ready(&self) -> bool {
        self.0
            .shared
            .link
            .borrow()
            .as_ref()
            .is_some_and(Link::usable)
    }
}

impl Link {
    fn connected(&self) -> bool {
        self.connection.status().connected()
    }

    /// Connected, and not blocked by a broker alarm (memory, disk): a
    /// publish would wait for its confirm timeout.
    fn usable(&self) -> bool {
        self.connected() && !self.connection.status().blocked()
    }

    async fn publisher(&self) -> Result<Channel, lapin::Error> {
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
                    Some(lapin::Event::Error(error)) => {
                        tracing::warn!(%error, "lost the connection to RabbitMQ");
                        return true;
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
    fn current(&self) -> Result<Link, QueueError> {
        self.link
            .borrow()
            .clone()
            .filter(Link::connected)
            .ok_or_else(|| QueueError::Unavailable("not connected to RabbitMQ".into()))
    }

    /// Publishes one message and waits for the broker's confirm: an error
    /// unless the broker took responsibility for it.
    async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), QueueError> {
        let link = self.current()?;
        if !link.usable() {
            return Err(QueueError::Unavailable(
                "RabbitMQ blocks publishing (a memory or disk alarm)".into(),
            ));
        }
        let (exchange_name, key) = (short(exchange)?, short(routing_key)?);
        let timeout = self.settings.confirm_timeout;
        let confirmed = async {
            let channel = link
                .publisher()
                .await
                .map_err(|e| unavailable("failed to open a publishing channel", e))?;
            let confirm = channel
                .basic_publish(
                    exchange_name,
                    key,
                    BasicPublishOptions::default(),
                    body,
                    properties,
                )
                .await
                .map_err(|e| unavailable(format!("failed to publish to {exchange}"), e))?;
            match confirm.await {
                Ok(Confirmation::Ack(None)) => Ok(()),
                Ok(Confirmation::Ack(Some(returned))) => Err(QueueError::NotConfirmed(format!(
                    "{exchange} returned the message: {}",
                    returned.reply_text
                ))),
                Ok(Confirmation::Nack(_)) => Err(QueueError::NotConfirmed(format!(
                    "{exchange} nacked the message"
                ))),
                Ok(Confirmation::NotRequested) => Err(QueueError::NotConfirmed(
                    "the publishing channel is not in confirm mode".into(),
                )),
                Err(error) => Err(QueueError::NotConfirmed(format!("{exchange}: {error}"))),
            }
        };
        tokio::time::timeout(timeout, confirmed)
            .await
            .unwrap_or_else(|_| {
                Err(QueueError::NotConfirmed(format!(
                    "no confirm from {exchange} within {timeout:?}"
                )))
            })
    }

    /// Puts a message in the parking queue with its last error.
    async fn park(
        &self,
        body: &[u8],
        event: Option<&Event>,
        error: &str,
    ) -> Result<(), QueueError> {
        let mut headers = FieldTable::default();
        headers.insert(
            ERROR_HEADER.into(),
            AMQPValue::LongString(truncate(error).into()),
        );
        let properties = match event {
            Some(event) => message_properties(event),
            None => persistent_json(),
        }
        .with_headers(headers);
        // Through the default exchange: the routing key is the queue's name.
        self.send("", &self.names.parked, body, properties).await
    }

    /// Sends a failed event to wait out the delay of its next attempt, or
    /// parks it when it has none left.
    async fn send_retry(&self, event: &Event, error: &str) -> Result<(), QueueError> {
        let max_attempts = self.settings.retry.max_attempts;
        match self
            .names
            .retry(event.attempt)
            .filter(|_| event.attempt < max_attempts)
        {
            Some(delay_queue) => {
                tracing::info!(app = %event.app, attempt = event.attempt, error, "retrying event");
                let properties = message_properties(event);
                self.send(
                    delay_queue,
                    &routing_key(event),
                    &event.to_bytes(),
                    properties,
                )
                .await
            }
            None => {
                tracing::warn!(app = %event.app, attempts = event.attempt, error, "parking event");
                self.park(&event.to_bytes(), Some(event), error).await
            }
        }
    }

    /// Runs `work` on a channel of its own (a passive declare of a missing
    /// queue closes its channel), bounded by the confirm timeout.
    async fn with_channel<T>(
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

    /// One connection attempt: connect, declare the topology, open the
    /// publishing channel.
    async fn establish(&self) -> Result<Link, QueueError> {
        let properties = ConnectionProperties::default()
            .with_connection_name(self.connection_name.clone().into());
        let connection = Connection::connect(&self.settings.url, properties)
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
            declare_topology(&channel, &self.names, &self.settings.retry).await?;
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

/// Declares every exchange, queue and binding; idempotent, so run on every
/// connect (a broker that lost its definitions gets them back).
async fn declare_topology(
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

async fn message_count(channel: &Channel, queue: &str) -> Result<u32, QueueError> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    channel
        .queue_declare(short(queue)?, passive, FieldTable::default())
        .await
        .map(|declared| declared.message_count())
        .map_err(|e| topology(format!("failed to count the messages of {queue}"), e))
}

/// Keeps one connection up: connects with backoff, publishes the live link
/// for everyone else, and starts over when it is lost, until the last
/// `AmqpQueue` is dropped.
async fn supervise(shared: Arc<Shared>, mut stop: watch::Receiver<()>) {
    let mut backoff = reconnect_backoff();
    loop {
        let attempt = shared.connection_attempts.fetch_add(1, Ordering::Relaxed) + 1;
        let established = tokio::select! {
            _ = stop.changed() => return,
            result = tokio::time::timeout(CONNECT_TIMEOUT, shared.establish()) => {
                result.unwrap_or_else(|_| {
                    Err(QueueError::Unavailable(format!("no connection within {CONNECT_TIMEOUT:?}")))
                })
            }
        };
        match established {
            Ok(link) => {
                tracing::info!(attempt, name = %shared.connection_name, "connected to RabbitMQ");
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

fn reconnect_backoff() -> ExponentialBackoff {
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

/// Why a subscription ended.
enum Ended {
    /// The channel or the connection is gone: subscribe again.
    Lost,
    /// The receiver was dropped or the queue stopped.
    Stopped,
}

/// Feeds `deliveries` from every shard, subscribing again on each new
/// connection, until the receiver or the queue is dropped.
async fn consume(
    shared: Arc<Shared>,
    prefetch: u16,
    deliveries: mpsc::Sender<Delivery>,
    mut stop: watch::Receiver<()>,
) {
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
        match subscribe(&shared, &link, prefetch).await {
            Ok((channel, stream)) => {
                tracing::info!(shards = shared.names.shards.len(), prefetch, "consuming");
                let since = tokio::time::Instant::now();
                let ended = forward(&shared, &channel, stream, &deliveries, &mut stop).await;
                if since.elapsed() >= STABLE {
                    backoff.reset();
                }
                if let Ended::Stopped = ended {
                    // The consumers were cancelled with the stream: no new
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

type Deliveries = futures::stream::SelectAll<lapin::Consumer>;

/// Opens a channel with the prefetch and one consumer per shard. The limit
/// is per channel (`global`), so it bounds the deliveries outstanding over
/// all shards together, as the `Queue` contract says.
async fn subscribe(
    shared: &Shared,
    link: &Link,
    prefetch: u16,
) -> Result<(Channel, Deliveries), QueueError> {
    let channel = link
        .connection
        .create_channel()
        .await
        .map_err(|e| unavailable("failed to open a consuming channel", e))?;
    channel
        .basic_qos(prefetch, BasicQosOptions { global: true })
        .await
        .map_err(|e| unavailable("failed to set the prefetch", e))?;
    let mut consumers = Vec::with_capacity(shared.names.shards.len());
    for shard in &shared.names.shards {
        let consumer = channel
            .basic_consume(
                short(shard)?,
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| unavailable(format!("failed to consume {shard}"), e))?;
        consumers.push(consumer);
    }
    Ok((channel, futures::stream::select_all(consumers)))
}

async fn forward(
    shared: &Arc<Shared>,
    channel: &Channel,
    mut stream: Deliveries,
    deliveries: &mpsc::Sender<Delivery>,
    stop: &mut watch::Receiver<()>,
) -> Ended {
    loop {
        let next = tokio::select! {
            _ = stop.changed() => return Ended::Stopped,
            _ = deliveries.closed() => return Ended::Stopped,
            next = stream.next() => next,
        };
        let delivery = match next {
            Some(Ok(delivery)) => delivery,
            Some(Err(error)) => {
                tracing::warn!(%error, "consuming failed");
                return Ended::Lost;
            }
            None => return Ended::Lost,
        };
        let Some(delivery) = decode(shared, channel, delivery).await else {
            continue;
        };
        tokio::select! {
            _ = stop.changed() => return Ended::Stopped,
            sent = deliveries.send(delivery) => {
                if sent.is_err() {
                    return Ended::Stopped;
                }
            }
        }
    }
}

/// A message that is not an event will never become one: it is parked with
/// the decode error instead of going round forever.
async fn decode(
    shared: &Arc<Shared>,
    channel: &Channel,
    delivery: AmqpDelivery,
) -> Option<Delivery> {
    match Event::from_bytes(&delivery.data) {
        Ok(event) => {
            let acker = AmqpAcker {
                shared: shared.clone(),
                event: event.clone(),
                delivery: Some(delivery.acker),
                channel: channel.clone(),
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
                    give_back_later(acker, channel.clone(), RECONNECT_MAX);
                }
            }
            None
        }
    }
}

struct AmqpAcker {
    shared: Arc<Shared>,
    event: Event,
    /// Taken when the delivery is settled; still here on drop = give it
    /// back, as a crash would.
    delivery: Option<lapin::Acker>,
    /// Keeps the delivery's channel open (lapin closes a channel with its
    /// last handle) after the consumer stopped taking messages.
    channel: Channel,
}

impl AmqpAcker {
    fn take(&mut self) -> lapin::Acker {
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
                give_back_later(delivery, self.channel.clone(), delay);
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
            give_back_later(delivery, self.channel.clone(), Duration::ZERO);
        }
    }
}

/// Requeues a delivery after `delay`, holding its prefetch slot (and its
/// channel) meanwhile.
fn give_back_later(delivery: lapin::Acker, channel: Channel, delay: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let requeue = BasicNackOptions {
            requeue: true,
            ..Default::default()
        };
        let _ = delivery.nack(requeue).await;
        drop(channel);
    });
}

fn persistent_json() -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
}

fn message_properties(event: &Event) -> BasicProperties {
    match ShortString::try_new(event.id.as_str()) {
        Ok(id) => persistent_json().with_message_id(id),
        Err(_) => persistent_json(),
    }
}

/// The Application's `namespace/name`. AMQP routing keys hold 255 bytes and
/// a namespace plus a name can hold more; a longer key is cut (on a char
/// boundary), which keeps it stable, and two Applications sharing the first
/// 255 bytes merely share a shard.
fn routing_key(event: &Event) -> String {
    let mut key = event.app.to_string();
    if key.len() > 255 {
        let mut end = 255;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        key.truncate(end);
    }
    key
}

fn truncate(error: &str) -> String {
    match error.char_indices().nth(ERROR_HEADER_MAX_CHARS) {
        Some((end, _)) => format!("{}…", &error[..end]),
        None => error.to_string(),
    }
}

fn error_header(properties: &BasicProperties) -> String {
    let value = properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(ERROR_HEADER));
    match value {
        Some(AMQPValue::LongString(text)) => text.to_string(),
        Some(AMQPValue::ShortString(text)) => text.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// Names come from the prefix; a prefix too long for AMQP's 255-byte names
/// is a configuration error to report, not a panic.
fn short(name: &str) -> Result<ShortString, QueueError> {
    ShortString::try_new(name)
        .map_err(|e| QueueError::Topology(format!("the name {name:?} is too long: {e}")))
}

fn unavailable(what: impl std::fmt::Display, error: lapin::Error) -> QueueError {
    QueueError::Unavailable(format!("{what}: {error}"))
}

fn topology(what: impl std::fmt::Display, error: lapin::Error) -> QueueError {
    QueueError::Topology(format!("{what}: {error}"))
}

#[cfg(test)]
mod tests {
    //! Against the real RabbitMQ on 127.0.0.1:5672
    //! (`tests/broker/rabbitmq.sh up`); each test has its own prefix and
    //! deletes its topology at the end.

    use std::collections::{BTreeMap, BTreeSet, HashMap};
    use std::future::Future;
    use std::time::Instant;

    use super::*;
    use crate::event::{AppKey, Cause, new_id};

    const URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
    const PATIENCE: Duration = Duration::from_secs(20);

    fn settings(test: &str, shards: u16) -> AmqpSettings {
        AmqpSettings {
            url: URL.into(),
            prefix: format!("test-{test}-{}", new_id()),
            shards,
            retry: RetryPolicy {
                max_attempts: 3,
                initial: Duration::from_millis(50),
                ..Default::default()
            },
            confirm_timeout: Duration::from_secs(10),
        }
    }

    /// Deletes a test's topology at the end, also when the test failed.
    struct Cleanup(AmqpSettings);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let settings = self.0.clone();
            // A runtime of its own: the test's may be unwinding.
            let deleted = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                runtime.expect("a runtime").block_on(async {
                    let queue = AmqpQueue::connect(settings).await;
                    queue.wait_ready(PATIENCE).await && queue.delete_topology().await.is_ok()
                })
            })
            .join();
            if !matches!(deleted, Ok(true)) && !std::thread::panicking() {
                panic!("failed to delete the test's topology");
            }
        }
    }

    async fn connected(settings: AmqpSettings) -> AmqpQueue {
        let queue = AmqpQueue::connect(settings).await;
        assert!(
            queue.wait_ready(PATIENCE).await,
            "RabbitMQ is not up on {URL}: run tests/broker/rabbitmq.sh up"
        );
        queue
    }

    fn event(name: &str) -> Event {
        Event::new(AppKey::new("team", name), Cause::Sweep)
    }

    async fn next(deliveries: &mut mpsc::Receiver<Delivery>) -> Delivery {
        tokio::time::timeout(PATIENCE, deliveries.recv())
            .await
            .expect("a delivery within the deadline")
            .expect("the consumer is still running")
    }

    async fn nothing_within(deliveries: &mut mpsc::Receiver<Delivery>, window: Duration) -> bool {
        tokio::time::timeout(window, deliveries.recv())
            .await
            .is_err()
    }

    /// Polls `condition` until it holds; panics with `what` at the deadline.
    async fn eventually<F: Future<Output = bool>>(what: &str, mut condition: impl FnMut() -> F) {
        let deadline = Instant::now() + PATIENCE;
        while !condition().await {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A plain lapin channel, to look at the queues behind the module's back.
    async fn raw_channel() -> (Connection, Channel) {
        let connection = Connection::connect(URL, ConnectionProperties::default())
            .await
            .unwrap();
        let channel = connection.create_channel().await.unwrap();
        (connection, channel)
    }

    /// Takes every message of `queue` (they are gone afterwards).
    async fn drain(channel: &Channel, queue: &str) -> Vec<AmqpDelivery> {
        let mut messages = Vec::new();
        while let Some(message) = channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            messages.push(message.delivery);
        }
        messages
    }

    async fn rabbitmqctl(args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let output = std::process::Command::new("rabbitmqctl")
                .args(&args)
                .output()
                .expect("rabbitmqctl runs");
            assert!(output.status.success(), "rabbitmqctl {args:?}: {output:?}");
            String::from_utf8_lossy(&output.stdout).into_owned()
        })
        .await
        .unwrap()
    }

    /// Closes `queue`'s connection from the broker's side, as a broker
    /// restart or a network cut would.
    async fn close_from_broker(queue: &AmqpQueue) {
        let name = &queue.0.shared.connection_name;
        let listing = rabbitmqctl(&[
            "list_connections",
            "-q",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .await;
        let pid = listing
            .lines()
            .find(|line| line.contains(&format!("\"{name}\"")))
            .and_then(|line| line.split_whitespace().next())
            .unwrap_or_else(|| panic!("no connection named {name} in {listing}"))
            .to_string();
        rabbitmqctl(&["close_connection", &pid, "closed by a test"]).await;
    }

    /// `(consumers, active consumers)` per shard queue of `prefix`.
    async fn consumers(prefix: &str) -> BTreeMap<String, (usize, usize)> {
        let listing = rabbitmqctl(&[
            "list_consumers",
            "-q",
            "--no-table-headers",
            "queue_name",
            "active",
        ])
        .await;
        let mut counts = BTreeMap::<String, (usize, usize)>::new();
        for line in listing.lines() {
            let mut columns = line.split_whitespace();
            let (Some(queue), Some(active)) = (columns.next(), columns.next()) else {
                continue;
            };
            if queue.starts_with(&format!("{prefix}.shard.")) {
                let count = counts.entry(queue.to_string()).or_default();
                count.0 += 1;
                count.1 += usize::from(active == "true");
            }
        }
        counts
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
        assert_eq!(names.retry(0), None);
        assert_eq!(names.retry(2), Some("sp.retry.2"));
        assert_eq!(names.retry(3), None);
    }

    #[test]
    fn settings_hide_the_password() {
        let settings = AmqpSettings {
            url: "amqp://bot:s3cret@mq:5672/%2f".into(),
            ..Default::default()
        };
        let shown = format!("{settings:?}");
        assert!(shown.contains("amqp://bot:***@mq:5672/%2f") && !shown.contains("s3cret"));
        assert_eq!(redacted("amqp://mq:5672"), "amqp://mq:5672");
    }

    #[test]
    fn long_errors_and_keys_are_cut() {
        let error = "é".repeat(5000);
        let cut = truncate(&error);
        assert_eq!(cut.chars().count(), ERROR_HEADER_MAX_CHARS + 1);
        assert_eq!(truncate("short"), "short");

        let long = Event::new(AppKey::new("n".repeat(63), "ü".repeat(200)), Cause::Sweep);
        let key = routing_key(&long);
        assert!(key.len() <= 255 && key.starts_with("nnn"));
        assert_eq!(routing_key(&event("web")), "team/web");
    }

    #[tokio::test]
    async fn publishes_consumes_and_acks_with_confirms() {
        let settings = settings("roundtrip", 4);
        let _cleanup = Cleanup(settings.clone());
        let shards = Names::new(&settings.prefix, settings.shards, &settings.retry).shards;
        let queue = connected(settings).await;
        assert!(queue.is_ready());

        let sent: Vec<Event> = ["a", "b", "c"].into_iter().map(event).collect();
        for event in &sent {
            queue.publish(event).await.unwrap();
        }
        assert_eq!(
            queue.depth().await.unwrap(),
            QueueDepth {
                ready: 3,
                parked: 0
            }
        );

        let mut deliveries = queue.consume(10).await.unwrap();
        let mut received = Vec::new();
        for _ in 0..3 {
            let delivery = next(&mut deliveries).await;
            received.push(delivery.event.clone());
            delivery.ack().await.unwrap();
        }
        received.sort_by(|a, b| a.app.cmp(&b.app));
        assert_eq!(received, sent);

        // Acked, not merely delivered: once the consumer is gone nothing
        // comes back to the shards.
        drop(deliveries);
        let (_connection, channel) = raw_channel().await;
        eventually("the consumer is gone", || async {
            let mut total = (0, 0);
            for shard in &shards {
                let passive = QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                };
                let declared = channel
                    .queue_declare(shard.as_str().into(), passive, FieldTable::default())
                    .await
                    .unwrap();
                total.0 += declared.consumer_count();
                total.1 += declared.message_count();
            }
            assert_eq!(total.1, 0, "an acked event came back");
            total.0 == 0
        })
        .await;
        assert_eq!(queue.depth().await.unwrap(), QueueDepth::default());
        queue.delete_topology().await.unwrap();
        // Idempotent, like the declaration.
        queue.delete_topology().await.unwrap();
        assert!(matches!(queue.depth().await, Err(QueueError::Topology(_))));
    }

    #[tokio::test]
    async fn one_application_always_lands_on_one_shard() {
        let settings = settings("shards", 16);
        let _cleanup = Cleanup(settings.clone());
        let shards = Names::new(&settings.prefix, settings.shards, &settings.retry).shards;
        let queue = connected(settings).await;
        for i in 0..50 {
            queue
                .publish(&event(&format!("app-{}", i % 10)))
                .await
                .unwrap();
        }

        let (_connection, channel) = raw_channel().await;
        let mut shards_of: HashMap<String, BTreeSet<usize>> = HashMap::new();
        let mut total = 0;
        for (index, shard) in shards.iter().enumerate() {
            for message in drain(&channel, shard).await {
                assert_eq!(message.properties.delivery_mode(), &Some(2));
                let event = Event::from_bytes(&message.data).unwrap();
                assert_eq!(message.routing_key.as_str(), event.app.to_string());
                shards_of.entry(event.app.name).or_default().insert(index);
                total += 1;
            }
        }
        assert_eq!(total, 50);
        assert_eq!(shards_of.len(), 10);
        for (app, shards) in &shards_of {
            assert_eq!(shards.len(), 1, "{app} landed on shards {shards:?}");
        }
        let used: BTreeSet<_> = shards_of.values().flatten().collect();
        assert!(
            used.len() > 1,
            "every application hashed to one shard: {used:?}"
        );
        queue.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn each_shard_has_one_active_consumer_across_processes() {
        let settings = settings("single-active", 4);
        let _cleanup = Cleanup(settings.clone());
        let prefix = settings.prefix.clone();
        let first = connected(settings.clone()).await;
        let second = connected(settings).await;
        let mut deliveries = [
            first.consume(50).await.unwrap(),
            second.consume(50).await.unwrap(),
        ];
        eventually("both processes subscribed to every shard", || async {
            let counts = consumers(&prefix).await;
            counts.len() == 4 && counts.values().all(|&(all, _)| all == 2)
        })
        .await;
        for (queue, (_, active)) in consumers(&prefix).await {
            assert_eq!(active, 1, "{queue} has {active} active consumers");
        }

        for i in 0..40 {
            first
                .publish(&event(&format!("app-{}", i % 10)))
                .await
                .unwrap();
        }
        let mut consumers_of: HashMap<String, BTreeSet<usize>> = HashMap::new();
        let mut received = 0;
        let deadline = Instant::now() + PATIENCE;
        while received < 40 {
            assert!(
                Instant::now() < deadline,
                "only {received} of 40 deliveries arrived"
            );
            for (process, receiver) in deliveries.iter_mut().enumerate() {
                if let Ok(Some(delivery)) =
                    tokio::time::timeout(Duration::from_millis(20), receiver.recv()).await
                {
                    consumers_of
                        .entry(delivery.event.app.name.clone())
                        .or_default()
                        .insert(process);
                    delivery.ack().await.unwrap();
                    received += 1;
                }
            }
        }
        for (app, processes) in &consumers_of {
            assert_eq!(processes.len(), 1, "{app} went to processes {processes:?}");
        }
        first.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn retries_with_backoff_then_parks_while_others_flow() {
        let settings = settings("retry", 4);
        let _cleanup = Cleanup(settings.clone());
        let queue = connected(settings).await;
        let policy = queue.0.shared.settings.retry.clone();
        let failing = event("failing");
        queue.publish(&failing).await.unwrap();
        queue.publish(&event("healthy-0")).await.unwrap();
        let mut deliveries = queue.consume(10).await.unwrap();

        let long_error = "x".repeat(5000);
        let mut healthy = 0;
        let mut attempts = Vec::new();
        let mut retried_at = None;
        while attempts.len() < 3 || healthy < 3 {
            let delivery = next(&mut deliveries).await;
            if delivery.event.id != failing.id {
                assert!(delivery.event.app.name.starts_with("healthy"));
                healthy += 1;
                delivery.ack().await.unwrap();
                continue;
            }
            let attempt = delivery.event.attempt;
            if let Some(at) = retried_at {
                let waited = Instant::now().duration_since(at);
                // The delay queue's TTL (counted from before the retry
                // call, so it can only be longer), a little slack for timers.
                assert!(
                    waited + Duration::from_millis(5) >= policy.delay(attempt),
                    "{waited:?}"
                );
            }
            attempts.push(attempt);
            let error = if attempt == 2 {
                long_error.clone()
            } else {
                format!("boom {attempt}")
            };
            retried_at = Some(Instant::now());
            delivery.retry(&error).await.unwrap();
            // Others keep flowing while one event waits out its delay.
            if healthy < 3 {
                queue
                    .publish(&event(&format!("healthy-{}", attempt + 1)))
                    .await
                    .unwrap();
            }
        }
        assert_eq!(attempts, [0, 1, 2]);
        assert!(nothing_within(&mut deliveries, Duration::from_millis(300)).await);

        eventually("the event is parked", || async {
            queue.depth().await.unwrap()
                == QueueDepth {
                    ready: 0,
                    parked: 1,
                }
        })
        .await;
        for _ in 0..2 {
            // Reading does not consume.
            let parked = queue.parked().await.unwrap();
            assert_eq!(parked.len(), 1);
            assert_eq!(parked[0].0.id, failing.id);
            assert_eq!(parked[0].0.attempt, 3);
            assert_eq!(parked[0].1, truncate(&long_error));
        }
        assert_eq!(queue.depth().await.unwrap().parked, 1);
        queue.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn retries_come_back_to_their_applications_shard() {
        let settings = settings("retry-shard", 16);
        let _cleanup = Cleanup(settings.clone());
        let names = Names::new(&settings.prefix, settings.shards, &settings.retry);
        let queue = connected(settings).await;
        let (_connection, channel) = raw_channel().await;

        let mut shards_used = BTreeSet::new();
        for name in ["a", "b", "c", "d", "e", "f"] {
            let mut event = event(name);
            queue.publish(&event).await.unwrap();
            let mut home = None;
            for (index, shard) in names.shards.iter().enumerate() {
                if !drain(&channel, shard).await.is_empty() {
                    home = Some(index);
                }
            }
            let home = home.expect("the event is on a shard");
            shards_used.insert(home);

            event.attempt = 1;
            queue.0.shared.send_retry(&event, "boom").await.unwrap();
            let deadline = Instant::now() + PATIENCE;
            let back = 'wait: loop {
                for (index, shard) in names.shards.iter().enumerate() {
                    if let Some(message) = drain(&channel, shard).await.first() {
                        assert_eq!(Event::from_bytes(&message.data).unwrap().attempt, 1);
                        break 'wait Some(index);
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "the retry of {name} never came back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert_eq!(back, Some(home), "{name} came back to another shard");
        }
        assert!(
            shards_used.len() > 1,
            "all applications on one shard proves nothing"
        );
        queue.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn prefetch_bounds_the_deliveries_outstanding_over_all_shards() {
        let settings = settings("prefetch", 4);
        let _cleanup = Cleanup(settings.clone());
        let queue = connected(settings).await;
        for name in ["a", "b", "c", "d", "e", "f"] {
            queue.publish(&event(name)).await.unwrap();
        }
        let mut deliveries = queue.consume(2).await.unwrap();
        let first = next(&mut deliveries).await;
        let _second = next(&mut deliveries).await;
        assert!(nothing_within(&mut deliveries, Duration::from_millis(300)).await);
        first.ack().await.unwrap();
        let _third = next(&mut deliveries).await;
        assert!(nothing_within(&mut deliveries, Duration::from_millis(300)).await);
        queue.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn requeued_and_dropped_deliveries_are_delivered_again() {
        let settings = settings("requeue", 4);
        let _cleanup = Cleanup(settings.clone());
        let queue = connected(settings).await;
        let sent = event("a");
        queue.publish(&sent).await.unwrap();
        let mut deliveries = queue.consume(1).await.unwrap();
        next(&mut deliveries).await.requeue().await.unwrap();
        drop(next(&mut deliveries).await);
        let again = next(&mut deliveries).await;
        assert_eq!(again.event.id, sent.id);
        again.ack().await.unwrap();
        queue.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn a_dropped_receiver_takes_no_more_but_can_still_ack() {
        let settings = settings("stop-taking", 4);
        let _cleanup = Cleanup(settings.clone());
        let first = connected(settings.clone()).await;
        let mut deliveries = first.consume(1).await.unwrap();
        let (held, waiting) = (event("a"), event("b"));
        first.publish(&held).await.unwrap();
        let in_flight = next(&mut deliveries).await;
        assert_eq!(in_flight.event.id, held.id);
        first.publish(&waiting).await.unwrap();

        // A worker shutting down: stop taking, finish what is running.
        drop(deliveries);
        let second = connected(settings).await;
        let mut taken_over = second.consume(10).await.unwrap();
        let next_one = next(&mut taken_over).await;
        assert_eq!(next_one.event.id, waiting.id);
        in_flight.ack().await.unwrap();
        next_one.ack().await.unwrap();
        assert!(nothing_within(&mut taken_over, Duration::from_millis(300)).await);
        second.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn messages_that_are_not_events_are_parked() {
        let settings = settings("undecodable", 4);
        let _cleanup = Cleanup(settings.clone());
        let names = Names::new(&settings.prefix, settings.shards, &settings.retry);
        let queue = connected(settings).await;
        let mut deliveries = queue.consume(10).await.unwrap();
        let (_connection, channel) = raw_channel().await;
        channel
            .basic_publish(
                names.events.as_str().into(),
                "team/web".into(),
                BasicPublishOptions::default(),
                b"not json",
                BasicProperties::default(),
            )
            .await
            .unwrap();
        queue.publish(&event("after")).await.unwrap();
        assert_eq!(next(&mut deliveries).await.event.app.name, "after");

        eventually("the message is parked", || async {
            queue.depth().await.unwrap().parked == 1
        })
        .await;
        assert!(
            queue.parked().await.unwrap().is_empty(),
            "it is not an event"
        );
        let parked = drain(&channel, &names.parked).await;
        assert_eq!(parked[0].data, b"not json");
        assert!(error_header(&parked[0].properties).starts_with("the message is not an event"));
        queue.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn an_unacked_delivery_goes_to_the_other_process_when_its_connection_dies() {
        let settings = settings("handover", 4);
        let _cleanup = Cleanup(settings.clone());
        let prefix = settings.prefix.clone();
        let first = connected(settings.clone()).await;
        let mut first_deliveries = first.consume(10).await.unwrap();
        let sent = event("a");
        first.publish(&sent).await.unwrap();
        let held = next(&mut first_deliveries).await;
        assert_eq!(held.event.id, sent.id);

        let second = connected(settings).await;
        let mut second_deliveries = second.consume(10).await.unwrap();
        eventually("the second process waits on every shard", || async {
            consumers(&prefix)
                .await
                .values()
                .filter(|&&(all, _)| all == 2)
                .count()
                == 4
        })
        .await;

        let attempts = first.connection_attempts();
        close_from_broker(&first).await;
        let again = next(&mut second_deliveries).await;
        assert_eq!(again.event.id, sent.id);
        assert!(
            held.ack().await.is_err(),
            "the dead channel's ack must not look like a success"
        );
        again.ack().await.unwrap();

        // The first process reconnected, and its receiver yields again once
        // the second is gone.
        eventually("the first process reconnected", || async {
            first.connection_attempts() > attempts && first.is_ready()
        })
        .await;
        drop(second_deliveries);
        drop(second);
        let later = event("a");
        first.publish(&later).await.unwrap();
        assert_eq!(next(&mut first_deliveries).await.event.id, later.id);
        first.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn reconnects_after_the_broker_closes_the_connection() {
        let settings = settings("reconnect", 4);
        let _cleanup = Cleanup(settings.clone());
        let queue = connected(settings).await;
        let mut deliveries = queue.consume(10).await.unwrap();
        queue.publish(&event("before")).await.unwrap();
        next(&mut deliveries).await.ack().await.unwrap();

        let attempts = queue.connection_attempts();
        close_from_broker(&queue).await;
        eventually("a new connection is up", || async {
            queue.connection_attempts() > attempts && queue.is_ready()
        })
        .await;
        queue.publish(&event("after")).await.unwrap();
        let delivery = next(&mut deliveries).await;
        assert_eq!(delivery.event.app.name, "after");
        delivery.ack().await.unwrap();
        queue.delete_topology().await.unwrap();
    }

    #[tokio::test]
    async fn a_broker_that_is_down_fails_fast_without_spinning() {
        let settings = AmqpSettings {
            url: "amqp://127.0.0.1:1/%2f".into(),
            ..settings("down", 4)
        };
        let started = Instant::now();
        let queue = AmqpQueue::connect(settings).await;
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "connect waited for the broker"
        );
        assert!(!queue.is_ready());

        let started = Instant::now();
        let error = queue.publish(&event("a")).await.unwrap_err();
        assert!(matches!(error, QueueError::Unavailable(_)), "{error:?}");
        assert!(
            started.elapsed() < Duration::from_millis(500),
            "publish hung"
        );
        assert!(matches!(
            queue.depth().await,
            Err(QueueError::Unavailable(_))
        ));
        let mut deliveries = queue.consume(1).await.unwrap();

        // Backoff from 100 ms: a handful of attempts in a second, not a spin.
        assert!(!queue.wait_ready(Duration::from_secs(1)).await);
        let attempts = queue.connection_attempts();
        assert!(
            (1..=8).contains(&attempts),
            "{attempts} connection attempts in 1 s"
        );
        assert!(nothing_within(&mut deliveries, Duration::from_millis(50)).await);

        // Dropping the queue stops the reconnecting and ends the receiver.
        drop(queue);
        assert!(
            tokio::time::timeout(PATIENCE, deliveries.recv())
                .await
                .unwrap()
                .is_none()
        );
    }
    #[tokio::test]
    async fn zz_experiment() {
        let q = format!("zz-exp-{}", new_id());
        let (_c1, ch1) = raw_channel().await;
        let (_c2, ch2) = raw_channel().await;
        let (_c3, ch3) = raw_channel().await;
        let mut sac = FieldTable::default();
        sac.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
        ch3.queue_declare(q.as_str().into(), QueueDeclareOptions::default(), sac)
            .await
            .unwrap();
        ch1.basic_qos(1, BasicQosOptions { global: true })
            .await
            .unwrap();
        ch2.basic_qos(1, BasicQosOptions { global: true })
            .await
            .unwrap();
        let mut k1 = ch1
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut k2 = ch2
            .basic_consume(
                q.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let d = ch3
            .queue_declare(q.as_str().into(), passive, FieldTable::default())
            .await
            .unwrap();
        eprintln!(
            "consumer_count with 2 SAC consumers: {}",
            d.consumer_count()
        );
        let probe = BasicProperties::default().with_expiration("0".into());
        ch3.basic_publish(
            "".into(),
            q.as_str().into(),
            BasicPublishOptions::default(),
            b"p1",
            probe.clone(),
        )
        .await
        .unwrap();
        let m = tokio::time::timeout(Duration::from_secs(2), k1.next()).await;
        eprintln!(
            "k1 got ttl0 probe: {:?}",
            m.as_ref().map(|m| m
                .as_ref()
                .map(|m| String::from_utf8_lossy(&m.as_ref().unwrap().data).to_string()))
        );
        // k1 prefetch full now (unacked). Publish another probe: should be dropped.
        ch3.basic_publish(
            "".into(),
            q.as_str().into(),
            BasicPublishOptions::default(),
            b"p2",
            probe.clone(),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let d = ch3
            .queue_declare(q.as_str().into(), passive, FieldTable::default())
            .await
            .unwrap();
        eprintln!(
            "ready after probe to a full consumer: {}",
            d.message_count()
        );
        // backlog: publish a normal message then a probe
        ch3.basic_publish(
            "".into(),
            q.as_str().into(),
            BasicPublishOptions::default(),
            b"m1",
            BasicProperties::default(),
        )
        .await
        .unwrap();
        ch3.basic_publish(
            "".into(),
            q.as_str().into(),
            BasicPublishOptions::default(),
            b"p3",
            probe.clone(),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let d = ch3
            .queue_declare(q.as_str().into(), passive, FieldTable::default())
            .await
            .unwrap();
        eprintln!(
            "ready with m1+p3 behind full consumer: {}",
            d.message_count()
        );
        // ack p1
        m.unwrap()
            .unwrap()
            .unwrap()
            .acker
            .ack(BasicAckOptions::default())
            .await
            .unwrap();
        let m = tokio::time::timeout(Duration::from_secs(2), k1.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        eprintln!("k1 next: {}", String::from_utf8_lossy(&m.data));
        m.acker.ack(BasicAckOptions::default()).await.unwrap();
        let m = tokio::time::timeout(Duration::from_millis(500), k1.next()).await;
        eprintln!("k1 next after: {}", m.is_ok());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let d = ch3
            .queue_declare(q.as_str().into(), passive, FieldTable::default())
            .await
            .unwrap();
        eprintln!("ready at end: {}", d.message_count());
        // cancel k1 while it holds an unacked message: does k2 become active at once?
        ch3.basic_publish(
            "".into(),
            q.as_str().into(),
            BasicPublishOptions::default(),
            b"m2",
            BasicProperties::default(),
        )
        .await
        .unwrap();
        let held = tokio::time::timeout(Duration::from_secs(2), k1.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        ch1.basic_cancel(k1.tag(), Default::default())
            .await
            .unwrap();
        ch3.basic_publish(
            "".into(),
            q.as_str().into(),
            BasicPublishOptions::default(),
            b"m3",
            BasicProperties::default(),
        )
        .await
        .unwrap();
        let m = tokio::time::timeout(Duration::from_secs(1), k2.next()).await;
        eprintln!(
            "k2 while k1 cancelled holding m2: {:?}",
            m.as_ref().map(|m| String::from_utf8_lossy(
                &m.as_ref().unwrap().as_ref().unwrap().data
            )
            .to_string())
        );
        eprintln!(
            "k1 stream after cancel: {:?}",
            tokio::time::timeout(Duration::from_secs(1), k1.next())
                .await
                .map(|x| x.is_none())
        );
        held.acker
            .nack(BasicNackOptions {
                requeue: true,
                ..Default::default()
            })
            .await
            .unwrap();
        ch3.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }
}
