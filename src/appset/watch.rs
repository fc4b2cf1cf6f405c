//! The ApplicationSets' watch (I/O): a reflector store of the sets (the
//! webhook routes pushes and pull request events to them from it, the
//! sweep walks it) and the events it publishes: a set created or whose
//! spec changed, the sets with a cluster generator when a cluster is
//! registered, changed or removed. `Summaries` (pure) is fed by the
//! Application watch: an Application of a set that changes sync, health
//! or revision asks for its set's status summary again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client, ResourceExt};

use crate::api::{Application, ApplicationSet, Health, Sync};
use crate::cluster::Registry;
use crate::event::{AppKey, Cause, Event};
use crate::queue::Queue;

use super::SET_LABEL;
use super::route::{key_of, reads_clusters};

/// Runs the sets' watch over `namespace` (every namespace when None),
/// filtered by `admits`; publishes evaluations when `enqueue` is true.
#[allow(clippy::too_many_arguments)] // the roles' switches and shared parts, passed as they are
pub async fn run(
    client: Client,
    clusters: Arc<Registry>,
    queue: Arc<dyn Queue>,
    writer: Writer<ApplicationSet>,
    store: Store<ApplicationSet>,
    namespace: Option<String>,
    admits: impl Fn(&str) -> bool + Send + 'static,
    enqueue: bool,
) {
    let api: Api<ApplicationSet> = match &namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    let stream = reflector::reflector(
        writer,
        watcher::watcher(api, watcher::Config::default().timeout(60))
            .modify(|set| set.managed_fields_mut().clear()),
    );
    futures::pin_mut!(stream);
    let mut changes = clusters.subscribe();
    let mut generations: HashMap<AppKey, Option<i64>> = HashMap::new();
    let mut listing = true;
    let mut failures = 0u32;
    loop {
        let event = tokio::select! {
            event = stream.next() => match event {
                Some(event) => event,
                None => return,
            },
            change = changes.recv() => {
                if change.is_err_and(|e| matches!(e, tokio::sync::broadcast::error::RecvError::Closed)) {
                    return;
                }
                if enqueue && !listing {
                    for set in store.state().iter().filter(|s| reads_clusters(s)) {
                        publish(&queue, key_of(set), "a cluster changed").await;
                    }
                }
                continue;
            }
        };
        let event = match event {
            Ok(event) => {
                if crate::ingest::watch::retry::answered(&event) {
                    failures = 0;
                }
                event
            }
            Err(error) => {
                failures += 1;
                // Without the CRD every list fails: say so once, then
                // keep trying quietly, slower.
                if failures == 1 {
                    tracing::warn!(%error, "ApplicationSet watch failed (is the ApplicationSet CRD installed?); retrying");
                } else {
                    tracing::debug!(%error, "ApplicationSet watch failed; retrying");
                }
                let pause = Duration::from_secs(2u64.saturating_pow(failures.min(6)).min(60));
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        match event {
            WatchEvent::Init => listing = true,
            WatchEvent::InitDone => listing = false,
            WatchEvent::InitApply(set) | WatchEvent::Apply(set) => {
                if !admits(&set.namespace().unwrap_or_default()) {
                    continue;
                }
                let key = key_of(&set);
                let generation = set.metadata.generation;
                let previous = generations.insert(key.clone(), generation);
                let unobserved =
                    set.status.as_ref().and_then(|s| s.observed_generation) != generation;
                let changed = match previous {
                    None => !listing || unobserved,
                    Some(previous) => previous != generation,
                };
                if changed && enqueue {
                    publish(&queue, key, "its spec changed").await;
                }
            }
            WatchEvent::Delete(set) => {
                generations.remove(&key_of(&set));
            }
        }
    }
}

async fn publish(queue: &Arc<dyn Queue>, key: AppKey, why: &str) {
    let event = Event::new(
        key,
        Cause::AppSet {
            why: why.into(),
            refresh_only: false,
            pull: None,
        },
    );
    if let Err(error) = queue.publish(&event).await {
        tracing::warn!(set = %event.app, %error, "failed to enqueue an ApplicationSet; the sweep covers it");
    }
}

/// The state of each generated Application its set's status shows: when
/// one changes, the set's summary is refreshed.
#[derive(Default)]
pub struct Summaries {
    seen: HashMap<AppKey, (Sync, Health, Option<String>)>,
}

impl Summaries {
    /// The set whose summary `app`'s change affects, if any.
    pub fn apply(&mut self, app: &Application) -> Option<AppKey> {
        let set = app.labels().get(SET_LABEL)?;
        let namespace = app.namespace().unwrap_or_default();
        let key = AppKey::new(namespace.clone(), app.name_any());
        let state = app
            .status
            .as_ref()
            .map_or((Sync::Unknown, Health::Unknown, None), |s| {
                (s.sync.status, s.health.status, s.sync.revision.clone())
            });
        let previous = self.seen.insert(key, state.clone());
        (previous.as_ref() != Some(&state)).then(|| AppKey::set(namespace, set))
    }

    /// A deleted Application: its set's summary changes.
    pub fn delete(&mut self, app: &Application) -> Option<AppKey> {
        let set = app.labels().get(SET_LABEL)?;
        let namespace = app.namespace().unwrap_or_default();
        self.seen
            .remove(&AppKey::new(namespace.clone(), app.name_any()));
        Some(AppKey::set(namespace, set))
    }
}

/// What the Application watch publishes for a summary change.
pub fn refresh_event(set: AppKey) -> Event {
    Event::new(
        set,
        Cause::AppSet {
            why: "an Application changed state".into(),
            refresh_only: true,
            pull: None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApplicationStatus, HealthStatus, SyncStatus};

    fn app(sync: Sync) -> Application {
        let mut app = Application::new("a", Default::default());
        app.metadata.namespace = Some("team".into());
        app.labels_mut().insert(SET_LABEL.into(), "fleet".into());
        app.status = Some(ApplicationStatus {
            sync: SyncStatus {
                status: sync,
                revision: None,
            },
            health: HealthStatus::default(),
            ..Default::default()
        });
        app
    }

    #[test]
    fn a_state_change_refreshes_the_set_once() {
        let mut summaries = Summaries::default();
        let set = AppKey::set("team", "fleet");
        assert_eq!(summaries.apply(&app(Sync::OutOfSync)), Some(set.clone()));
        assert_eq!(summaries.apply(&app(Sync::OutOfSync)), None);
        assert_eq!(summaries.apply(&app(Sync::Synced)), Some(set.clone()));
        let unowned = Application::new("b", Default::default());
        assert_eq!(summaries.apply(&unowned), None);
        assert_eq!(summaries.delete(&app(Sync::Synced)), Some(set));
    }
}
