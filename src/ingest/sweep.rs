//! Sweep: the slow safety net. Every Application is enqueued once per
//! interval (default 10 minutes), each at its own moment of the cycle (a hash
//! of its name and the cycle number: spread out, and jittered from one cycle
//! to the next), so an event that was missed is still corrected. With several
//! replicas only the holder of a Kubernetes Lease sweeps.
//!
//! Each event carries the start of its cycle as its freshness bound: a worker
//! resolves the revision from any fetch that started after the cycle began,
//! so a cycle costs one Git request per repository per worker process, not
//! one per Application, and a push the webhook missed is seen by the first
//! cycle that starts after it.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::api::Application;
use crate::event::{AppKey, Cause, Event, unix_millis};
use crate::queue::Queue;

#[derive(Clone, Debug)]
pub struct SweepSettings {
    pub interval: Duration,
    /// None: sweep without asking (a single replica).
    pub lease: Option<LeaseSettings>,
}

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

/// Sweeps the Applications of `store` and, when given, the
/// ApplicationSets of `sets` (each evaluated again once per interval).
pub async fn run(
    client: Client,
    store: Store<Application>,
    sets: Option<Store<crate::api::ApplicationSet>>,
    queue: Arc<dyn Queue>,
    settings: SweepSettings,
) {
    let interval = settings.interval.max(Duration::from_millis(100));
    let tick = (interval / 100).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let start = Instant::now();
    let start_wall = SystemTime::now();
    let mut previous = Duration::ZERO;
    let mut lease = settings.lease.map(|s| Leader::new(client.clone(), s));
    let mut ticker = tokio::time::interval(tick);
    loop {
        ticker.tick().await;
        let elapsed = start.elapsed();
        if let Some(leader) = lease.as_mut()
            && !leader.holds().await
        {
            previous = elapsed;
            continue;
        }
        let set_keys = sets
            .iter()
            .flat_map(|sets| sets.state())
            .map(|set| crate::appset::route::key_of(&set));
        let app_keys = store
            .state()
            .into_iter()
            .map(|app| AppKey::new(app.namespace().unwrap_or_default(), app.name_any()));
        for key in app_keys.chain(set_keys) {
            let Some(cycle) = due(&key, interval, previous, elapsed) else {
                continue;
            };
            let event = sweep_event(key.clone(), start_wall + interval * cycle as u32);
            if let Err(error) = queue.publish(&event).await {
                tracing::warn!(app = %key, %error, "sweep could not enqueue");
            }
        }
        previous = elapsed;
    }
}

/// What the sweep publishes for `app` in the cycle that began at `cycle_start`.
pub fn sweep_event(app: AppKey, cycle_start: SystemTime) -> Event {
    let cause = match app.set_name() {
        Some(_) => Cause::AppSet {
            why: "the sweep".into(),
            refresh_only: false,
            pull: None,
        },
        None => Cause::Sweep,
    };
    Event::new(app, cause).with_fresh_since(Some(unix_millis(cycle_start)))
}

/// The cycle whose moment for `app` falls in `(from, to]`, if any.
fn due(app: &AppKey, interval: Duration, from: Duration, to: Duration) -> Option<u64> {
    let interval_ms = interval.as_millis().max(1) as u64;
    let (from, to) = (from.as_millis() as u64, to.as_millis() as u64);
    // Each cycle the moment moves: spread out and jittered.
    let first_cycle = from / interval_ms;
    let last_cycle = to / interval_ms;
    (first_cycle..=last_cycle).find(|&cycle| {
        let moment = cycle * interval_ms + offset(app, cycle) % interval_ms;
        moment > from && moment <= to
    })
}

fn offset(app: &AppKey, cycle: u64) -> u64 {
    let mut hasher = DefaultHasher::new();
    (app, cycle).hash(&mut hasher);
    hasher.finish()
}

/// A minimal leader election on a coordination.k8s.io Lease: take it when it
/// is free or expired, renew it while held.
struct Leader {
    api: Api<Lease>,
    settings: LeaseSettings,
    held_until: Option<Instant>,
}

impl Leader {
    fn new(client: Client, settings: LeaseSettings) -> Self {
        Self {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            held_until: None,
        }
    }

    /// Whether this replica holds the lease now; renews it when a third of
    /// its duration has passed.
    async fn holds(&mut self) -> bool {
        let renew_at = self
            .held_until
            .map(|until| until - self.settings.duration * 2 / 3);
        if renew_at.is_some_and(|at| Instant::now() < at) {
            return true;
        }
        match self.try_acquire().await {
            Ok(true) => {
                self.held_until = Some(Instant::now() + self.settings.duration);
                true
            }
            Ok(false) => {
                self.held_until = None;
                false
            }
            Err(error) => {
                tracing::warn!(%error, "lease check failed");
                // Keep sweeping only while the last renewal is still valid.
                self.held_until.is_some_and(|until| Instant::now() < until)
            }
        }
    }

    async fn try_acquire(&self) -> Result<bool, kube::Error> {
        let now = jiff::Timestamp::now();
        let me = &self.settings.identity;
        let seconds = self.settings.duration.as_secs().max(1) as i32;
        let lease = match self.api.get_opt(&self.settings.name).await? {
            Some(lease) => lease,
            None => {
                let lease: Lease = serde_json::from_value(json!({
                    "metadata": {"name": self.settings.name},
                    "spec": {"holderIdentity": me, "leaseDurationSeconds": seconds,
                             "acquireTime": micro(now), "renewTime": micro(now)}
                }))
                .expect("a valid Lease");
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                };
            }
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref();
        let expired = spec.renew_time.as_ref().is_none_or(|renewed| {
            let duration = spec.lease_duration_seconds.unwrap_or(seconds) as i64;
            renewed.0.as_second() + duration < now.as_second()
        });
        if holder != Some(me) && !expired && holder.is_some() {
            return Ok(false);
        }
        // The resourceVersion makes this a compare-and-swap: two replicas
        // racing for an expired lease cannot both win.
        let patch = json!({
            "metadata": {"resourceVersion": lease.resource_version()},
            "spec": {"holderIdentity": me, "leaseDurationSeconds": seconds, "renewTime": micro(now)}
        });
        match self
            .api
            .patch(
                &self.settings.name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

fn micro(time: jiff::Timestamp) -> String {
    time.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_app_is_due_once_per_cycle() {
        let interval = Duration::from_secs(60);
        let apps: Vec<AppKey> = (0..200)
            .map(|i| AppKey::new("ns", format!("app-{i}")))
            .collect();
        let tick = Duration::from_millis(500);
        for app in &apps {
            let mut cycles = Vec::new();
            let mut t = Duration::ZERO;
            while t < interval * 3 {
                if let Some(cycle) = due(app, interval, t, t + tick) {
                    // Due inside the cycle it names: its start bounds the
                    // freshness of the event.
                    assert!(interval * cycle as u32 <= t + tick, "{app}");
                    cycles.push(cycle);
                }
                t += tick;
            }
            assert_eq!(cycles, [0, 1, 2], "{app} swept once per cycle");
        }
    }

    #[test]
    fn a_sweep_event_is_bounded_by_its_cycle_start() {
        let start = std::time::UNIX_EPOCH + Duration::from_secs(1_000);
        let event = sweep_event(AppKey::new("ns", "a"), start);
        assert_eq!(event.cause, Cause::Sweep);
        assert_eq!(event.fresh_since, Some(1_000_000));
        assert_eq!(event.revision, None);
    }

    #[test]
    fn apps_are_spread_over_the_cycle() {
        let interval = Duration::from_secs(60);
        let apps: Vec<AppKey> = (0..600)
            .map(|i| AppKey::new("ns", format!("app-{i}")))
            .collect();
        // The first tenth of the cycle holds roughly a tenth of the apps.
        let early = apps
            .iter()
            .filter(|a| due(a, interval, Duration::ZERO, interval / 10).is_some())
            .count();
        assert!(
            (30..=90).contains(&early),
            "{early} of 600 in the first tenth"
        );
    }
}
