//! Worker: take events off the queue and reconcile their Applications.
//!
//! - One reconcile per Application at a time within the process (a slot per
//!   Application); across processes the queue's sharding gives each
//!   Application one active consumer.
//! - A burst for an Application that arrives while it is being reconciled
//!   collapses into at most one more reconcile.
//! - Different Applications reconcile in parallel, up to `concurrency`.
//! - A delivery is acknowledged only after the reconcile that covers it
//!   finished; transient failures go back to the queue with backoff.
//! - Previews of pull requests (`Cause::Preview`) take their own slots,
//!   keyed by the pull request, and their own permits
//!   (`preview_concurrency`), so they never hold back a reconcile; a burst
//!   of pushes to one pull request is covered by one preview of its newest
//!   head.
//! - Notifications (`Cause::Notify`) go to `notify::dispatch`: slots per
//!   Provider and permits of their own, apart from both.
//! - A re-check a progressing reconcile asked for is skipped when a later
//!   reconcile of the Application already left nothing progressing
//!   ([`recheck`]).

mod recheck;

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Api;
use tokio::sync::{Semaphore, watch};

use crate::api::Application;
use crate::context::Context;
use crate::event::{AppKey, Cause, Event};
use crate::queue::{Delivery, Queue};
use crate::reconcile::{self, Request};

#[derive(Clone, Debug)]
pub struct WorkerSettings {
    /// Reconciles running at once in this process.
    pub concurrency: usize,
    /// Deliveries held unacknowledged at once (collapsed ones included).
    pub prefetch: u16,
    /// How long in-flight reconciles may finish after a shutdown request.
    pub grace: Duration,
    /// When set, each reconcile appends `start <app> <worker>` and
    /// `end <app> <worker>` lines here (the exclusivity tests read it).
    pub record: Option<PathBuf>,
    /// Check back this long after a reconcile that left something progressing.
    pub requeue_after: Duration,
    /// Pull request previews running at once, apart from the reconciles.
    pub preview_concurrency: usize,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            prefetch: 256,
            grace: Duration::from_secs(30),
            record: None,
            requeue_after: Duration::from_secs(5),
            preview_concurrency: 2,
        }
    }
}

#[derive(Default)]
struct Slot {
    /// Deliveries that arrived while a reconcile ran: covered by the next one.
    waiting: Vec<Delivery>,
    /// The newest commit a webhook announced for the next reconcile.
    revision: Option<String>,
    /// The latest `fresh_since` of the batch (`u64::MAX`: an event without
    /// one, so fetch).
    fresh_since: u64,
    /// The latest `fresh_since` of the batch's Receiver events (0: none),
    /// which the chart listing must meet too.
    chart_fresh_since: u64,
    manual: bool,
}

struct Shared {
    ctx: Context,
    queue: Arc<dyn Queue>,
    settings: WorkerSettings,
    permits: Semaphore,
    /// Applications being reconciled, with what waits for them.
    slots: Mutex<HashMap<AppKey, Slot>>,
    /// Previews' permits, apart from `permits`.
    preview_permits: Semaphore,
    /// Pull requests being previewed (by `PullRequest::key`), with the
    /// deliveries that came meanwhile.
    previews: Mutex<HashMap<AppKey, Vec<Delivery>>>,
    /// The newest `updated_at` previewed per pull request: a delivery of
    /// an older state arriving late is not previewed over a newer one.
    previewed: Mutex<HashMap<AppKey, String>>,
    /// The re-checks scheduled and published, and what answered them.
    rechecks: Mutex<recheck::Rechecks>,
    /// A sync window's end or opening each held Application waits for
    /// (`status.hold.until`), with a timer set for it.
    wakes: Arc<Mutex<HashMap<AppKey, String>>>,
    /// Notifications, with their own slots (per Provider) and permits.
    notify: Arc<crate::notify::dispatch::Dispatcher>,
    id: String,
    record: Option<Mutex<std::fs::File>>,
    /// Set on shutdown: reconciles not yet started give their deliveries back.
    stopping: std::sync::atomic::AtomicBool,
}

/// Consumes `queue` until `shutdown` turns true, then lets in-flight
/// reconciles finish within the grace period and gives back the rest.
pub async fn run(
    ctx: Context,
    queue: Arc<dyn Queue>,
    settings: WorkerSettings,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let record = match &settings.record {
        Some(path) => Some(Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        )),
        None => None,
    };
    let notify = crate::notify::dispatch::Dispatcher::new(ctx.notifier().cloned());
    let shared = Arc::new(Shared {
        ctx,
        notify,
        queue: queue.clone(),
        permits: Semaphore::new(settings.concurrency.max(1)),
        preview_permits: Semaphore::new(settings.preview_concurrency.max(1)),
        previews: Mutex::new(HashMap::new()),
        previewed: Mutex::new(HashMap::new()),
        settings: settings.clone(),
        slots: Mutex::new(HashMap::new()),
        rechecks: Mutex::new(Default::default()),
        wakes: Default::default(),
        id: format!("{}-{}", hostname(), std::process::id()),
        record,
        stopping: std::sync::atomic::AtomicBool::new(false),
    });
    let mut deliveries = queue.consume(settings.prefetch).await?;
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            delivery = deliveries.recv() => {
                let Some(delivery) = delivery else { break };
                if let Some(task) = accept(&shared, delivery) {
                    tasks.spawn(task);
                }
            }
            _ = shutdown.changed() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
    // Stop taking messages; what is already here goes back to the queue.
    shared
        .stopping
        .store(true, std::sync::atomic::Ordering::SeqCst);
    drop(deliveries);
    tracing::info!(in_flight = tasks.len(), "worker stopping");
    let finished = tokio::time::timeout(settings.grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tasks.abort_all();
    }
    let mut waiting: Vec<Delivery> = {
        let mut slots = shared.slots.lock().expect("slots lock");
        slots.drain().flat_map(|(_, slot)| slot.waiting).collect()
    };
    waiting.extend(
        shared
            .previews
            .lock()
            .expect("previews lock")
            .drain()
            .flat_map(|(_, waiting)| waiting),
    );
    waiting.extend(shared.notify.stop());
    for delivery in waiting {
        let _ = delivery.requeue().await;
    }
    Ok(())
}

type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>>;

/// Takes one delivery: starts a reconcile (or preview) task, or joins the
/// one running.
fn accept(shared: &Arc<Shared>, delivery: Delivery) -> Option<Task> {
    if matches!(delivery.event.cause, Cause::Preview(_)) {
        return accept_preview(shared, delivery);
    }
    if matches!(delivery.event.cause, Cause::Notify(_)) {
        return shared.notify.accept(delivery);
    }
    let app = delivery.event.app.clone();
    let mut slots = shared.slots.lock().expect("slots lock");
    if let Some(slot) = slots.get_mut(&app) {
        absorb(slot, &delivery.event);
        slot.waiting.push(delivery);
        return None;
    }
    let mut first = Slot::default();
    absorb(&mut first, &delivery.event);
    first.waiting.push(delivery);
    slots.insert(app.clone(), Slot::default());
    drop(slots);
    let shared = shared.clone();
    Some(Box::pin(async move { drive(shared, app, first).await }))
}

/// A preview: joins the pull request's slot, or starts its task.
fn accept_preview(shared: &Arc<Shared>, delivery: Delivery) -> Option<Task> {
    let key = delivery.event.app.clone();
    let mut previews = shared.previews.lock().expect("previews lock");
    if let Some(waiting) = previews.get_mut(&key) {
        waiting.push(delivery);
        return None;
    }
    previews.insert(key.clone(), vec![delivery]);
    drop(previews);
    let shared = shared.clone();
    Some(Box::pin(async move { drive_preview(shared, key).await }))
}

/// The pull request of `batch` to preview: the newest `updated_at`, and
/// of equals (or without one) the last delivered (one pull request's
/// events share a shard, in order).
fn newest_preview(batch: &[Delivery]) -> Option<(crate::event::PullRequest, String)> {
    batch
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match &d.event.cause {
            Cause::Preview(pull) => Some((i, pull, &d.event.id)),
            _ => None,
        })
        .max_by(|a, b| (&a.1.updated_at, a.0).cmp(&(&b.1.updated_at, b.0)))
        .map(|(_, pull, id)| ((**pull).clone(), id.clone()))
}

/// Previews one pull request until no delivery waits for it: each round
/// takes, once it holds a permit, every delivery that came so far and
/// previews the newest head among them (`newest_preview`).
async fn drive_preview(shared: Arc<Shared>, key: AppKey) {
    loop {
        let _permit = shared
            .preview_permits
            .acquire()
            .await
            .expect("the semaphore stays open");
        let batch = std::mem::take(
            shared
                .previews
                .lock()
                .expect("previews lock")
                .get_mut(&key)
                .expect("a running preview has a slot"),
        );
        if shared.stopping.load(std::sync::atomic::Ordering::SeqCst) {
            shared.previews.lock().expect("previews lock").remove(&key);
            for delivery in batch {
                let _ = delivery.requeue().await;
            }
            return;
        }
        let newest = newest_preview(&batch).filter(|(pull, _)| {
            let previewed = shared.previewed.lock().expect("previewed lock");
            match (&pull.updated_at, previewed.get(&key)) {
                (Some(at), Some(done)) => at >= done,
                _ => true,
            }
        });
        if let Some((pull, event_id)) = newest {
            if let Some(at) = &pull.updated_at {
                let mut previewed = shared.previewed.lock().expect("previewed lock");
                // A bound on what is remembered: forgetting only allows an
                // old delivery arriving very late to be previewed.
                if previewed.len() > 10_000 {
                    previewed.clear();
                }
                previewed.insert(key.clone(), at.clone());
            }
            let span = tracing::info_span!("preview", pull = %key, event = %event_id, delivery = %pull.delivery, head = %pull.head_sha, coalesced = batch.len());
            let result =
                tracing::Instrument::instrument(crate::preview::run(&shared.ctx, &pull), span)
                    .await;
            match result {
                Ok(report) => tracing::info!(
                    pull = %key,
                    head = %pull.head_sha,
                    applications = report.previews.len(),
                    changed_files = report.changed_files,
                    posted = report.posted,
                    skipped = report.skipped.unwrap_or_default(),
                    "previewed"
                ),
                Err(error) => tracing::warn!(
                    pull = %key,
                    head = %pull.head_sha,
                    error = %crate::report::events::error_chain(&error),
                    "preview failed"
                ),
            }
        }
        // A preview is advice: one that failed is not retried (the next
        // push previews again).
        for delivery in batch {
            if let Err(e) = delivery.ack().await {
                tracing::warn!(pull = %key, error = %e, "failed to ack; the broker redelivers");
            }
        }
        let mut previews = shared.previews.lock().expect("previews lock");
        if previews.get(&key).is_none_or(Vec::is_empty) {
            previews.remove(&key);
            return;
        }
    }
}

fn absorb(slot: &mut Slot, event: &Event) {
    if event.revision.is_some() {
        slot.revision = event.revision.clone();
    }
    slot.manual |= matches!(event.cause, Cause::Manual);
    slot.fresh_since = slot.fresh_since.max(event.fresh_since.unwrap_or(u64::MAX));
    if matches!(event.cause, Cause::Receiver { .. }) {
        slot.chart_fresh_since = slot
            .chart_fresh_since
            .max(event.fresh_since.unwrap_or_default());
    }
}

/// The bound a batch's reconcile resolves its revision under.
fn fresh_since(batch: &Slot) -> Option<std::time::SystemTime> {
    (batch.fresh_since != u64::MAX)
        .then(|| std::time::UNIX_EPOCH + Duration::from_millis(batch.fresh_since))
}

/// Reconciles `app` until no delivery waits for it any more.
async fn drive(shared: Arc<Shared>, app: AppKey, mut batch: Slot) {
    loop {
        let outcome = {
            let _permit = shared
                .permits
                .acquire()
                .await
                .expect("the semaphore stays open");
            if shared.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                // Not started: redelivered, to this process or another.
                let mut waiting = std::mem::take(&mut batch.waiting);
                let slot = shared.slots.lock().expect("slots lock").remove(&app);
                if let Some(slot) = slot {
                    waiting.extend(slot.waiting);
                }
                for delivery in waiting {
                    let _ = delivery.requeue().await;
                }
                return;
            }
            let answered = shared
                .rechecks
                .lock()
                .expect("rechecks lock")
                .answered(batch.waiting.iter().map(|d| &d.event));
            if answered {
                tracing::debug!(app = %app, "re-check already answered by a later reconcile");
                Settled::Done { requeue: false }
            } else {
                let started = Instant::now();
                let outcome = reconcile_once(&shared, &app, &batch).await;
                if matches!(outcome, Settled::Done { requeue: false }) {
                    let mut rechecks = shared.rechecks.lock().expect("rechecks lock");
                    rechecks.settled(&app, started);
                }
                outcome
            }
        };
        let bound = (batch.fresh_since != u64::MAX).then_some(batch.fresh_since);
        settle(&shared, &app, batch.waiting, outcome, bound).await;
        let mut slots = shared.slots.lock().expect("slots lock");
        let slot = slots.get_mut(&app).expect("a running app has a slot");
        if slot.waiting.is_empty() {
            slots.remove(&app);
            return;
        }
        batch = std::mem::take(slot);
    }
}

enum Settled {
    Done { requeue: bool },
    Retry(String),
    Invalid,
}

/// The changed file that routed a push to this Application, from the newest
/// webhook event of the batch that names one.
fn changed_input(batch: &Slot) -> Option<String> {
    batch
        .waiting
        .iter()
        .rev()
        .find_map(|d| match &d.event.cause {
            Cause::Webhook {
                input: Some(input), ..
            } => Some(input.clone()),
            _ => None,
        })
}

async fn reconcile_once(shared: &Shared, app: &AppKey, batch: &Slot) -> Settled {
    let event_id = batch
        .waiting
        .first()
        .map(|d| d.event.id.clone())
        .unwrap_or_default();
    let delivery = batch
        .waiting
        .iter()
        .find_map(|d| match &d.event.cause {
            Cause::Webhook { delivery, .. } => Some(delivery.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let input = changed_input(batch).unwrap_or_default();
    let cause = batch
        .waiting
        .first()
        .map(|d| d.event.cause.kind())
        .unwrap_or_default();
    if app.set_name().is_some() {
        let span = tracing::info_span!("appset", set = %app, event = %event_id, cause, delivery = %delivery);
        return tracing::Instrument::instrument(evaluate_set(shared, app, batch), span).await;
    }
    let span = tracing::info_span!("reconcile", app = %app, event = %event_id, cause, delivery = %delivery, input = %input);
    // Instrumented, not entered: the span must follow the future across awaits.
    tracing::Instrument::instrument(reconcile_in_span(shared, app, batch), span).await
}

/// An ApplicationSet's batch: one evaluation (only a summary refresh when
/// every event of the batch asked only that), with the pull request
/// events' news laid over the provider's listing.
async fn evaluate_set(shared: &Shared, set: &AppKey, batch: &Slot) -> Settled {
    let mut request = crate::appset::Batch {
        refresh_only: true,
        pulls: Vec::new(),
        fresh_since: fresh_since(batch),
    };
    for delivery in &batch.waiting {
        match &delivery.event.cause {
            Cause::AppSet {
                refresh_only, pull, ..
            } => {
                request.refresh_only &= *refresh_only;
                request.pulls.extend(pull.clone());
            }
            _ => request.refresh_only = false,
        }
    }
    shared.record_line("start", set);
    let result = crate::appset::evaluate(&shared.ctx, set, &request).await;
    shared.record_line("end", set);
    match result {
        Ok(evaluated) => {
            tracing::info!(
                created = evaluated.created,
                updated = evaluated.updated,
                deleted = evaluated.deleted,
                result = evaluated.result,
                "ApplicationSet evaluated"
            );
            Settled::Done { requeue: false }
        }
        Err(error) if error.is_transient() => {
            Settled::Retry(crate::report::events::error_chain(&error))
        }
        Err(error) => {
            tracing::warn!(error = %crate::report::events::error_chain(&error), "ApplicationSet refused");
            Settled::Invalid
        }
    }
}

async fn reconcile_in_span(shared: &Shared, app: &AppKey, batch: &Slot) -> Settled {
    let api: Api<Application> = Api::namespaced(shared.ctx.client.clone(), &app.namespace);
    let stored = shared.ctx.stored_application(&app.namespace, &app.name);
    let read = match stored {
        Some(application) => Ok(Some(application)),
        None => api.get_opt(&app.name).await,
    };
    let application = match read {
        Ok(Some(application)) => application,
        // Deleted since: nothing to do.
        Ok(None) => return Settled::Done { requeue: false },
        Err(error) => return Settled::Retry(format!("failed to read Application {app}: {error}")),
    };
    let request = Request {
        manual: batch.manual,
        dry_run: false,
        known_commit: batch.revision.clone(),
        fresh_since: fresh_since(batch),
        chart_fresh_since: (batch.chart_fresh_since > 0)
            .then(|| std::time::UNIX_EPOCH + Duration::from_millis(batch.chart_fresh_since)),
        changed_input: changed_input(batch),
        dry_run_creates: false,
        event_id: batch.waiting.first().map(|d| d.event.id.clone()),
        ..Default::default()
    };
    shared.record_line("start", app);
    let started = std::time::Instant::now();
    let result = reconcile::reconcile(&shared.ctx, &application, &request).await;
    shared.record_line("end", app);
    let metrics = &shared.ctx.metrics;
    let took = started.elapsed();
    match &result {
        Ok(outcome) => {
            let status = &outcome.status;
            let label = match status.sync.status {
                crate::api::Sync::Synced => "synced",
                _ => "out_of_sync",
            };
            metrics.reconciled(&app.namespace, &app.name, label, took);
            metrics.app_status(
                &app.namespace,
                &app.name,
                status.sync.status,
                status.health.status,
            );
        }
        Err(error) if error.is_transient() => {
            metrics.reconciled(&app.namespace, &app.name, "retry", took);
        }
        Err(_) => metrics.reconciled(&app.namespace, &app.name, "failed", took),
    }
    match result {
        Ok(outcome) => {
            tracing::info!(
                applied = outcome.applied.len(),
                pruned = outcome.pruned.len(),
                sync = ?outcome.status.sync.status,
                health = ?outcome.status.health.status,
                "reconciled"
            );
            if let Some(until) = outcome.status.hold.as_ref().and_then(|h| h.until.clone()) {
                schedule_wake(shared, app, until);
            }
            Settled::Done {
                requeue: outcome.requeue_after.is_some(),
            }
        }
        Err(error) if error.is_transient() => {
            Settled::Retry(crate::report::events::error_chain(&error))
        }
        Err(_) => Settled::Invalid,
    }
}

/// `fresh_since`: the batch's bound, which a requeue keeps (it re-checks
/// what this reconcile applied; Git needs no newer look for that).
async fn settle(
    shared: &Arc<Shared>,
    app: &AppKey,
    deliveries: Vec<Delivery>,
    outcome: Settled,
    fresh_since: Option<u64>,
) {
    let mut deliveries = deliveries.into_iter();
    match outcome {
        Settled::Retry(error) => {
            // One retry copy covers the whole batch.
            if let Some(first) = deliveries.next()
                && let Err(e) = first.retry(&error).await
            {
                tracing::warn!(app = %app, error = %e, "failed to schedule a retry; the broker redelivers");
            }
        }
        Settled::Done { requeue: true } => schedule_requeue(shared, app, fresh_since),
        Settled::Done { requeue: false } | Settled::Invalid => {}
    }
    for delivery in deliveries {
        if let Err(e) = delivery.ack().await {
            tracing::warn!(app = %app, error = %e, "failed to ack; the broker redelivers");
        }
    }
}

/// One delayed re-check per Application while something is progressing.
/// It is asked for as of the latest reconcile that asked: only a reconcile
/// that started after that one answers it ([`recheck`]).
fn schedule_requeue(shared: &Arc<Shared>, app: &AppKey, fresh_since: Option<u64>) {
    if !shared.rechecks.lock().expect("rechecks lock").ask(app) {
        return;
    }
    let shared = shared.clone();
    let app = app.clone();
    tokio::spawn(async move {
        tokio::time::sleep(shared.settings.requeue_after).await;
        let event = shared
            .rechecks
            .lock()
            .expect("rechecks lock")
            .due(&app, fresh_since);
        if let Err(error) = shared.queue.publish(&event).await {
            tracing::debug!(app = %app, %error, "requeue not published; the sweep covers it");
        }
    });
}

/// Longer waits are the sweep's.
const MAX_WAKE: Duration = Duration::from_secs(24 * 3600);

/// A reconcile under the sync policy when the sync window that holds `app`
/// ends or an allow window opens (one timer per moment; a process that
/// stops meanwhile leaves it to the sweep).
fn schedule_wake(shared: &Shared, app: &AppKey, until: String) {
    let Ok(at) = until.parse::<jiff::Timestamp>() else {
        return;
    };
    let Ok(wait) = Duration::try_from(at.duration_since(jiff::Timestamp::now())) else {
        return;
    };
    if wait > MAX_WAKE {
        return;
    }
    {
        let mut wakes = shared.wakes.lock().expect("wakes lock");
        if wakes.get(app) == Some(&until) {
            return;
        }
        wakes.insert(app.clone(), until.clone());
    }
    let (wakes, queue) = (shared.wakes.clone(), shared.queue.clone());
    let app = app.clone();
    tokio::spawn(async move {
        // A second past the edge: the window is evaluated after it.
        tokio::time::sleep(wait + Duration::from_secs(1)).await;
        {
            let mut wakes = wakes.lock().expect("wakes lock");
            if wakes.get(&app) == Some(&until) {
                wakes.remove(&app);
            }
        }
        if let Err(error) = queue.publish(&Event::new(app.clone(), Cause::Sweep)).await {
            tracing::debug!(app = %app, %error, "sync window wake not published; the sweep covers it");
        }
    });
}

impl Shared {
    fn record_line(&self, what: &str, app: &AppKey) {
        if let Some(file) = &self.record {
            let line = format!("{what} {app} {}\n", self.id);
            let _ = file.lock().expect("record lock").write_all(line.as_bytes());
        }
    }
}

pub fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "setpoint".into())
}

#[cfg(test)]
mod tests {
    use async_trait::async_trait;

    use super::*;
    use crate::event::PullRequest;
    use crate::queue::{Acker, QueueError};

    struct NoAck;

    #[async_trait]
    impl Acker for NoAck {
        async fn ack(self: Box<Self>) -> Result<(), QueueError> {
            Ok(())
        }
        async fn retry(self: Box<Self>, _: &str) -> Result<(), QueueError> {
            Ok(())
        }
        async fn requeue(self: Box<Self>) -> Result<(), QueueError> {
            Ok(())
        }
    }

    fn preview(head: char, updated_at: Option<&str>) -> Delivery {
        let pull = PullRequest {
            provider: "github".into(),
            delivery: String::new(),
            repo_urls: vec![],
            project: "acme/deploy".into(),
            number: 1,
            base_branch: "main".into(),
            default_branch: None,
            base_sha: None,
            head_sha: head.to_string().repeat(40),
            head_ref: "refs/pull/1/head".into(),
            fork: false,
            updated_at: updated_at.map(Into::into),
            apps: vec![],
        };
        Delivery {
            event: Event::new(pull.key(), Cause::Preview(Box::new(pull))),
            acker: Box::new(NoAck),
        }
    }

    fn head_of(batch: &[Delivery]) -> String {
        newest_preview(batch).unwrap().0.head_sha[..1].to_string()
    }

    #[test]
    fn a_burst_previews_its_newest_head() {
        // In the order they came, when the host gives no time.
        let batch = [preview('a', None), preview('b', None), preview('c', None)];
        assert_eq!(head_of(&batch), "c");
        // By the host's `updated_at`, whatever the order they came in.
        let batch = [
            preview('a', Some("2026-12-04T17:00:01Z")),
            preview('c', Some("2026-12-04T17:00:03Z")),
            preview('b', Some("2026-12-04T17:00:02Z")),
        ];
        assert_eq!(head_of(&batch), "c");
        assert!(newest_preview(&[]).is_none());
    }
}
