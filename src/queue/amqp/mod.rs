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
//! count   ──► <prefix>.events (a redelivered event, its count in a header)
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
//!
//! A single active consumer is whoever subscribed first, so the first
//! process up would be active on every shard and the others mere standbys.
//! Each consumer therefore balances (`balance_interval`): it probes every
//! shard with an empty message to the queue itself (header
//! `x-setpoint-probe`, expiring unless a consumer takes it at once); the
//! active consumer gets and acks it, so each consumer learns which shards
//! are its own. A passive declare tells how many consumers there are. One
//! holding more than `ceil(shards / consumers)` hands one shard a round to
//! the next consumer in line: once none of that shard's deliveries is with
//! its worker (new ones are held back meanwhile), it cancels its consumer
//! there, gives back what it held and subscribes again, last in line. The
//! broker activates the next consumer only after that, so an Application is
//! still reconciled by one process at a time.
//!
//! A delivery whose worker died before acknowledging it comes back to its
//! shard; one that kills every worker it reaches would loop for ever. Each
//! event therefore carries how many of its deliveries went unacknowledged,
//! and at `max_deliveries` it is parked instead of reconciled again
//! (`redelivery`).
//!
//! One file per part: `connection` keeps one connection up, `topology` names
//! and declares the exchanges and queues, `publish` sends with confirms
//! (events, retries, the parking queue), `consume` feeds the worker from
//! every shard, `redelivery` counts the deliveries that were never
//! acknowledged, `balance` spreads the shards over the consumers, and
//! `acker` settles a delivery. The tests against the broker are in `tests/queue.rs`.

mod acker;
mod balance;
mod connection;
mod consume;
mod publish;
mod redelivery;
mod reshard;
mod topology;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{
    BasicGetOptions, BasicNackOptions, ExchangeDeleteOptions, QueueDeleteOptions,
};
use lapin::types::ShortString;
use tokio::sync::{mpsc, watch};

pub use super::QueueDepth;
use super::{Delivery, Queue, QueueError, RetryPolicy};
use crate::event::Event;
use balance::is_probe;
use connection::{LIVENESS_CHECK, Link, supervise};
pub use publish::{ERROR_HEADER_MAX_CHARS, error_header};
use publish::{message_properties, routing_key};
pub use topology::Names;
use topology::message_count;

/// The header of a parked message that holds its last error.
pub const ERROR_HEADER: &str = "x-setpoint-error";

/// The header of an event that came back unacknowledged: how many of its
/// deliveries were never acknowledged (see `redelivery`).
pub const DELIVERIES_HEADER: &str = "x-setpoint-deliveries";

/// The header of a probe (see `Balance`): the consumer that sent it.
pub const PROBE_HEADER: &str = "x-setpoint-probe";

/// `parked()` holds what it read unacknowledged until it gives it back; a
/// bound keeps a huge parking queue from being pulled into memory at once.
const PARKED_READ_LIMIT: usize = 10_000;

#[derive(Clone)]
pub struct AmqpSettings {
    /// `amqp://user:password@host:port/vhost` (the vhost `/` is `%2f`);
    /// several, comma-separated, for the nodes of a cluster: each
    /// (re)connect tries them in turn, starting after the one that failed.
    pub url: String,
    /// What the shard, retry and parking queues are (fixed when they are
    /// first declared; see `QueueType`).
    pub queue_type: QueueType,
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
    /// How often a consumer probes the shards to learn which ones it is
    /// the active consumer of, counts the consumers, and hands one shard to
    /// the next consumer when it holds more than its share.
    pub balance_interval: Duration,
    /// Deliveries without an acknowledgement (the worker crashed, was
    /// killed, lost its connection, or gave it back while stopping) after
    /// which an event is parked instead of being reconciled again.
    pub max_deliveries: u32,
}

impl Default for AmqpSettings {
    fn default() -> Self {
        Self {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            queue_type: QueueType::default(),
            prefix: "setpoint".into(),
            shards: 16,
            retry: RetryPolicy::default(),
            confirm_timeout: Duration::from_secs(10),
            balance_interval: Duration::from_secs(5),
            max_deliveries: 5,
        }
    }
}

/// Settings end up in logs; the URL's password must not.
impl std::fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpSettings")
            .field("url", &redacted_urls(&self.url))
            .field("queue_type", &self.queue_type)
            .field("prefix", &self.prefix)
            .field("shards", &self.shards)
            .field("retry", &self.retry)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("balance_interval", &self.balance_interval)
            .field("max_deliveries", &self.max_deliveries)
            .finish()
    }
}

impl AmqpSettings {
    /// The broker URLs, in the order given.
    pub fn urls(&self) -> Vec<&str> {
        split_urls(&self.url)
    }
}

/// `a, b,c` → `[a, b, c]`; blanks (a trailing comma, a newline in a file)
/// are skipped.
pub fn split_urls(urls: &str) -> Vec<&str> {
    urls.split([',', '\n'])
        .map(str::trim)
        .filter(|url| !url.is_empty())
        .collect()
}

/// Every URL of a list with its password hidden.
pub fn redacted_urls(urls: &str) -> String {
    split_urls(urls)
        .into_iter()
        .map(redacted)
        .collect::<Vec<_>>()
        .join(",")
}

/// The kind of the shard, retry and parking queues.
///
/// Quorum queues (the default) are replicated over a cluster's nodes
/// (Raft): a node lost takes no event with it while a majority is up, and
/// they count the deliveries that came back unacknowledged themselves
/// (`x-delivery-count`). Classic queues live on one node; they are kept for
/// brokers that already hold them (RabbitMQ refuses to redeclare a queue
/// with another type) or cannot run quorum queues. Neither uses what
/// RabbitMQ 4 removed: no global QoS, no transient or mirrored queues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueueType {
    Classic,
    #[default]
    Quorum,
}

impl QueueType {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
        }
    }
}

impl std::str::FromStr for QueueType {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "classic" => Ok(QueueType::Classic),
            "quorum" => Ok(QueueType::Quorum),
            other => Err(format!(
                "unknown queue type {other:?} (expected classic or quorum)"
            )),
        }
    }
}

impl std::fmt::Display for QueueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
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
    /// The index of the URL the next connection attempt starts with.
    next_url: AtomicUsize,
    /// Shards the consumer knows it is active on, as of its last count.
    active_shards: AtomicUsize,
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
            next_url: AtomicUsize::new(0),
            active_shards: AtomicUsize::new(0),
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

    /// The exchange and queue names of this prefix.
    pub fn names(&self) -> &Names {
        &self.0.shared.names
    }

    /// The name this process's connection shows in `rabbitmqctl
    /// list_connections client_properties` and the management UI.
    pub fn connection_name(&self) -> &str {
        &self.0.shared.connection_name
    }

    /// What a failed delivery's retry does with its event: a confirmed copy
    /// to the delay queue of attempt `event.attempt`, or to the parking
    /// queue with `error` once the attempts are used up.
    pub async fn send_retry(&self, event: &Event, error: &str) -> Result<(), QueueError> {
        self.0.shared.send_retry(event, error).await
    }

    /// How many times the background task tried to connect, for metrics and
    /// to prove in tests that it backs off.
    pub fn connection_attempts(&self) -> u64 {
        self.0.shared.connection_attempts.load(Ordering::Relaxed)
    }

    /// How many shards this process's consumer is the active consumer of,
    /// as far as its probes tell (updated every balance interval; 0 when
    /// not consuming). For tests and metrics.
    pub fn active_shards(&self) -> usize {
        self.0.shared.active_shards.load(Ordering::Relaxed)
    }

    /// Counts for tests and metrics. A probe is counted only for the
    /// moment it takes to reach its consumer.
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
    /// (in its place) with a nack sent before this returns; the broker
    /// applies it shortly after, so a count taken at once may miss them.
    /// Messages that are not events (a foreign publisher's) are skipped
    /// here; they stay in the queue.
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
                    if is_probe(&delivery.properties) {
                        continue;
                    }
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
        // Each deletion on a channel of its own, tried a few times: a
        // consumer of this process resubscribing to a shard that just went
        // away can take a channel down with it, and deleting what is already
        // gone succeeds.
        let queues = names
            .shards
            .iter()
            .chain(&names.retries)
            .chain([&names.parked, &names.consumers])
            .map(|queue| (queue, true));
        let exchanges = names
            .retries
            .iter()
            .chain([&names.events])
            .map(|exchange| (exchange, false));
        for (name, is_queue) in queues.chain(exchanges) {
            let what = if is_queue { "queue" } else { "exchange" };
            let mut attempt = 0;
            loop {
                attempt += 1;
                let deleted = shared
                    .with_channel("delete the topology", async |channel| {
                        let result = if is_queue {
                            channel
                                .queue_delete(short(name)?, QueueDeleteOptions::default())
                                .await
                                .map(drop)
                        } else {
                            channel
                                .exchange_delete(short(name)?, ExchangeDeleteOptions::default())
                                .await
                        };
                        result.map_err(|e| topology(format!("failed to delete {what} {name}"), e))
                    })
                    .await;
                match deleted {
                    Ok(()) => break,
                    Err(error) if attempt >= 5 => return Err(error),
                    Err(error) => {
                        tracing::debug!(%error, attempt, "deleting the topology again");
                        tokio::time::sleep(Duration::from_millis(100 * attempt)).await;
                    }
                }
            }
        }
        Ok(())
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
    /// channel of its own; per shard one subscription is active at a time
    /// (single active consumer), and the calls of several processes share
    /// the shards out between them (see the module's doc). Dropping the
    /// receiver stops new deliveries; those already handed out can still be
    /// settled. The receiver ends when this `AmqpQueue` (all its clones) is
    /// dropped.
    async fn consume(&self, prefetch: u16) -> Result<mpsc::Receiver<Delivery>, QueueError> {
        let prefetch = prefetch.max(1);
        let (deliveries, receiver) = mpsc::channel(usize::from(prefetch));
        let stop = self.0.stop.subscribe();
        tokio::spawn(reshard::drain_stale_shards(
            self.0.shared.clone(),
            self.0.stop.subscribe(),
        ));
        tokio::spawn(consume::consume(
            self.0.shared.clone(),
            prefetch,
            deliveries,
            stop,
        ));
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

    async fn depth(&self) -> Option<QueueDepth> {
        AmqpQueue::depth(self).await.ok()
    }

    fn active_shards(&self) -> Option<usize> {
        Some(AmqpQueue::active_shards(self))
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
    use super::*;

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
    fn several_urls_are_split_and_each_hides_its_password() {
        let settings = AmqpSettings {
            url: "amqp://a:pw1@mq-0:5672/%2f, amqp://a:pw2@mq-1:5672/%2f,\namqp://mq-2/,".into(),
            ..Default::default()
        };
        assert_eq!(
            settings.urls(),
            [
                "amqp://a:pw1@mq-0:5672/%2f",
                "amqp://a:pw2@mq-1:5672/%2f",
                "amqp://mq-2/"
            ]
        );
        let shown = format!("{settings:?}");
        assert!(
            shown.contains("amqp://a:***@mq-0:5672/%2f,amqp://a:***@mq-1:5672/%2f,amqp://mq-2/"),
            "{shown}"
        );
        assert!(!shown.contains("pw1") && !shown.contains("pw2"));
    }

    #[test]
    fn queue_types_parse_and_default_to_quorum() {
        assert_eq!(QueueType::default(), QueueType::Quorum);
        assert_eq!("classic".parse(), Ok(QueueType::Classic));
        assert_eq!("quorum".parse(), Ok(QueueType::Quorum));
        assert!(
            "mirrored"
                .parse::<QueueType>()
                .unwrap_err()
                .contains("classic or quorum")
        );
    }

    #[test]
    fn balancing_defaults_to_every_five_seconds() {
        let settings = AmqpSettings::default();
        assert_eq!(settings.balance_interval, Duration::from_secs(5));
        assert!(format!("{settings:?}").contains("balance_interval: 5s"));
    }
}
