//! Watch: drift detection from the live cluster, with no waiting for an
//! interval. Watches the Applications (a spec change is an event; the
//! in-memory index the webhook and the sweep read comes from here) and, for
//! every kind the Applications use, the live objects that carry Setpoint's
//! label. An object changed or deleted by anyone other than Setpoint, or
//! whose health changed, enqueues its Application; Setpoint's own applies do
//! not. Watches start and stop as kinds come and go, and resume after an API
//! server restart by comparing the re-listed objects with what they saw, so a
//! restart is not a flood.
//!
//! A [`Scope`] limits all of this to the Applications of some namespaces
//! (`--watch-namespaces`, like Argo CD's `--application-namespaces` and
//! Flux's `--watch-namespace`): the index holds only those, and a live
//! object whose Application is elsewhere enqueues nothing.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::api::{Application, Health};
use crate::event::{AppKey, Cause, Event};
use crate::queue::Queue;
use crate::reconcile::health::assess;
use crate::reconcile::plan::FIELD_MANAGER;
use crate::reconcile::prepare::{APP_ANNOTATION, APP_LABEL};

/// The namespaces whose Applications this process handles.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Empty: every namespace.
    namespaces: BTreeSet<String>,
}

impl Scope {
    /// Every namespace when `namespaces` is empty (blank entries ignored).
    pub fn new<S: AsRef<str>>(namespaces: impl IntoIterator<Item = S>) -> Self {
        let namespaces = namespaces
            .into_iter()
            .map(|ns| ns.as_ref().trim().to_string())
            .filter(|ns| !ns.is_empty())
            .collect();
        Self { namespaces }
    }

    pub fn contains(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.contains(namespace)
    }

    /// The Applications to watch: one namespace's when the scope is one
    /// namespace (the API server filters, and a Role is enough), else all
    /// of them, filtered here.
    fn applications(&self, client: Client) -> Api<Application> {
        match self.single() {
            Some(namespace) => Api::namespaced(client, namespace),
            None => Api::all(client),
        }
    }

    fn single(&self) -> Option<&str> {
        let mut names = self.namespaces.iter();
        match (names.next(), names.next()) {
            (Some(only), None) => Some(only),
            _ => None,
        }
    }

    /// Whether a watch event may reach the index.
    fn admits(&self, event: &WatchEvent<Application>) -> bool {
        match event {
            WatchEvent::Init | WatchEvent::InitDone => true,
            WatchEvent::InitApply(app) | WatchEvent::Apply(app) | WatchEvent::Delete(app) => {
                self.contains(&app.namespace().unwrap_or_default())
            }
        }
    }
}

impl std::fmt::Display for Scope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.namespaces.is_empty() {
            return f.write_str("all namespaces");
        }
        let names: Vec<&str> = self.namespaces.iter().map(String::as_str).collect();
        write!(f, "namespaces {}", names.join(", "))
    }
}

/// Runs the Application watch over `scope` (feeding `writer`; enqueueing
/// spec changes when `apps` is true) and, when `objects` is true, the
/// live-object watches.
pub async fn run(
    client: Client,
    queue: Arc<dyn Queue>,
    writer: reflector::store::Writer<Application>,
    store: Store<Application>,
    scope: Scope,
    objects: bool,
    apps: bool,
) {
    let watches = Arc::new(Mutex::new(KindWatches::default()));
    let mut generations: HashMap<AppKey, Option<i64>> = HashMap::new();
    let mut listing = true;
    tracing::info!(%scope, "watching Applications");
    let admitted = scope.clone();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(
            scope.applications(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .filter(move |event| {
            let keep = event.as_ref().map_or(true, |event| admitted.admits(event));
            std::future::ready(keep)
        }),
    );
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(%error, "Application watch failed; retrying");
                continue;
            }
        };
        match event {
            WatchEvent::Init => listing = true,
            WatchEvent::InitDone => listing = false,
            WatchEvent::InitApply(app) | WatchEvent::Apply(app) => {
                let key = AppKey::new(app.namespace().unwrap_or_default(), app.name_any());
                let generation = app.metadata.generation;
                let previous = generations.insert(key.clone(), generation);
                // New after the first listing, or its spec changed.
                let changed = match previous {
                    None => !listing || generation_unobserved(&app),
                    Some(previous) => previous != generation,
                };
                if changed && apps {
                    publish(&queue, Event::new(key, Cause::AppChanged)).await;
                }
            }
            WatchEvent::Delete(app) => {
                generations.remove(&AppKey::new(
                    app.namespace().unwrap_or_default(),
                    app.name_any(),
                ));
            }
        }
        if objects && !listing {
            let kinds = kinds_in_use(&store);
            watches
                .lock()
                .expect("watches lock")
                .sync(&client, &queue, &scope, kinds);
        }
    }
}

/// An Application whose current spec no reconcile has seen yet.
fn generation_unobserved(app: &Application) -> bool {
    app.status.as_ref().and_then(|s| s.observed_generation) != app.metadata.generation
}

/// Every (group, version, kind) some Application's last status lists.
fn kinds_in_use(store: &Store<Application>) -> BTreeSet<(String, String, String)> {
    store
        .state()
        .iter()
        .flat_map(|app| app.status.iter().flat_map(|s| s.resources.iter()))
        .map(|r| (r.group.clone(), r.version.clone(), r.kind.clone()))
        .collect()
}

#[derive(Default)]
struct KindWatches {
    running: HashMap<(String, String, String), JoinHandle<()>>,
}

impl KindWatches {
    fn sync(
        &mut self,
        client: &Client,
        queue: &Arc<dyn Queue>,
        scope: &Scope,
        wanted: BTreeSet<(String, String, String)>,
    ) {
        self.running.retain(|kind, task| {
            let keep = wanted.contains(kind) && !task.is_finished();
            if !keep {
                tracing::info!(kind = ?kind, "stopping watch");
                task.abort();
            }
            keep
        });
        for kind in wanted {
            if self.running.contains_key(&kind) {
                continue;
            }
            tracing::info!(kind = ?kind, "starting watch");
            let gvk = GroupVersionKind::gvk(&kind.0, &kind.1, &kind.2);
            let task = tokio::spawn(watch_kind(
                client.clone(),
                ApiResource::from_gvk(&gvk),
                queue.clone(),
                scope.clone(),
            ));
            self.running.insert(kind, task);
        }
    }
}

/// What the watch remembers of one object to tell a real change from a replay.
#[derive(Clone, PartialEq, Eq)]
struct Seen {
    signature: String,
    health: Health,
}

async fn watch_kind(client: Client, resource: ApiResource, queue: Arc<dyn Queue>, scope: Scope) {
    // `ApiResource::from_gvk` guesses the plural; discovery knows it.
    let resource = match kube::discovery::pinned_kind(
        &client,
        &GroupVersionKind::gvk(&resource.group, &resource.version, &resource.kind),
    )
    .await
    {
        Ok((resource, _)) => resource,
        Err(error) => {
            tracing::warn!(kind = %resource.kind, %error, "cannot watch a kind discovery does not know");
            return;
        }
    };
    let api: Api<DynamicObject> = Api::all_with(client, &resource);
    let config = watcher::Config::default().labels(APP_LABEL);
    let stream = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    let mut seen: HashMap<(Option<String>, String), Seen> = HashMap::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(WatchEvent::Apply(object) | WatchEvent::InitApply(object)) => {
                let Some(owner) = owner(&object).filter(|o| scope.contains(&o.namespace)) else {
                    continue;
                };
                let value = serde_json::to_value(&object).unwrap_or(Value::Null);
                let now = Seen {
                    signature: signature(&value),
                    health: assess(&resource.group, &resource.kind, &value).status,
                };
                let key = (object.namespace(), object.name_any());
                let before = seen.insert(key, now.clone());
                let Some(before) = before else { continue };
                let cause = if before.health != now.health {
                    Some("health changed")
                } else if before.signature != now.signature && changed_by_others(&value) {
                    Some("changed outside Setpoint")
                } else {
                    None
                };
                if let Some(why) = cause {
                    let object = format!("{} {}", resource.kind, object.name_any());
                    tracing::debug!(app = %owner, %object, why, "enqueue");
                    publish(&queue, Event::new(owner, Cause::Drift { object })).await;
                }
            }
            Ok(WatchEvent::Delete(object)) => {
                seen.remove(&(object.namespace(), object.name_any()));
                if let Some(owner) = owner(&object).filter(|o| scope.contains(&o.namespace)) {
                    let object = format!("{} {} (deleted)", resource.kind, object.name_any());
                    publish(&queue, Event::new(owner, Cause::Drift { object })).await;
                }
            }
            Ok(WatchEvent::Init | WatchEvent::InitDone) => {}
            Err(error) => {
                tracing::debug!(kind = %resource.kind, %error, "watch interrupted; resuming")
            }
        }
    }
}

fn owner(object: &DynamicObject) -> Option<AppKey> {
    object
        .annotations()
        .get(APP_ANNOTATION)
        .and_then(|owner| AppKey::parse(owner))
}

/// What changes when someone edits an object, but not when a controller
/// writes its status: the generation (or, for kinds without one, the
/// resource version), labels and annotations.
fn signature(object: &Value) -> String {
    let metadata = &object["metadata"];
    let version = match &metadata["generation"] {
        Value::Null => metadata["resourceVersion"].to_string(),
        generation => generation.to_string(),
    };
    format!(
        "{version}|{}|{}",
        metadata["labels"], metadata["annotations"]
    )
}

/// Whether the newest write recorded in `managedFields` (status writes
/// aside) came from someone other than Setpoint. Ties count as someone else:
/// at worst one reconcile too many, never a missed change.
fn changed_by_others(object: &Value) -> bool {
    let Some(entries) = object["metadata"]["managedFields"].as_array() else {
        return true;
    };
    let writes: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| e["subresource"].as_str() != Some("status"))
        .filter_map(|e| Some((e["manager"].as_str()?, e["time"].as_str().unwrap_or(""))))
        .collect();
    let Some(newest) = writes.iter().map(|(_, time)| *time).max() else {
        return true;
    };
    writes
        .iter()
        .any(|(manager, time)| *time == newest && *manager != FIELD_MANAGER)
}

async fn publish(queue: &Arc<dyn Queue>, event: Event) {
    if let Err(error) = queue.publish(&event).await {
        // The sweep catches what a failed publish loses.
        tracing::warn!(app = %event.app, %error, "failed to enqueue a watch event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app_in(namespace: &str) -> Application {
        let mut app = Application::new("web", Default::default());
        app.metadata.namespace = Some(namespace.into());
        app
    }

    #[test]
    fn an_empty_scope_is_every_namespace() {
        let scope = Scope::new(Vec::<String>::new());
        assert!(scope.contains("team-a") && scope.contains("anything"));
        assert!(scope.admits(&WatchEvent::Apply(app_in("team-a"))));
        assert_eq!(scope.single(), None);
        assert_eq!(scope.to_string(), "all namespaces");
        // A blank entry (SETPOINT_WATCH_NAMESPACES="") is no namespace.
        assert_eq!(Scope::new([" ", ""]), scope);
    }

    #[test]
    fn a_scope_admits_only_its_namespaces_applications() {
        let scope = Scope::new(["team-a", " team-b "]);
        assert!(scope.contains("team-a") && scope.contains("team-b"));
        assert!(!scope.contains("team-c"));
        assert!(scope.admits(&WatchEvent::InitApply(app_in("team-b"))));
        assert!(!scope.admits(&WatchEvent::Apply(app_in("team-c"))));
        assert!(!scope.admits(&WatchEvent::Delete(app_in("team-c"))));
        // The listing's bounds always pass: the store needs them.
        assert!(scope.admits(&WatchEvent::Init) && scope.admits(&WatchEvent::InitDone));
        assert_eq!(scope.single(), None);
        assert_eq!(scope.to_string(), "namespaces team-a, team-b");
        assert_eq!(Scope::new(["team-a"]).single(), Some("team-a"));
    }

    fn object(generation: i64, managers: &[(&str, &str, Option<&str>)]) -> Value {
        let entries: Vec<Value> = managers
            .iter()
            .map(|(manager, time, subresource)| {
                let mut entry = json!({"manager": manager, "time": time, "operation": "Update"});
                if let Some(s) = subresource {
                    entry["subresource"] = json!(s);
                }
                entry
            })
            .collect();
        json!({"metadata": {"generation": generation, "labels": {"a": "b"}, "managedFields": entries}})
    }

    #[test]
    fn setpoints_own_apply_is_not_someone_elses_change() {
        let applied = object(
            3,
            &[
                ("kubectl", "2026-01-01T00:00:01Z", Some("scale")),
                ("setpoint", "2026-01-01T00:00:02Z", None),
            ],
        );
        assert!(!changed_by_others(&applied));
    }

    #[test]
    fn a_scale_by_kubectl_is_someone_elses_change() {
        let scaled = object(
            3,
            &[
                ("setpoint", "2026-01-01T00:00:01Z", None),
                ("kubectl", "2026-01-01T00:00:02Z", Some("scale")),
            ],
        );
        assert!(changed_by_others(&scaled));
    }

    #[test]
    fn status_writes_do_not_count() {
        let status = object(
            3,
            &[
                ("setpoint", "2026-01-01T00:00:01Z", None),
                (
                    "kube-controller-manager",
                    "2026-01-01T00:00:09Z",
                    Some("status"),
                ),
            ],
        );
        assert!(!changed_by_others(&status));
    }

    #[test]
    fn the_signature_ignores_status_but_not_spec_or_labels() {
        let a = object(3, &[]);
        let mut status_only = a.clone();
        status_only["status"] = json!({"replicas": 1});
        status_only["metadata"]["resourceVersion"] = json!("99");
        assert_eq!(signature(&a), signature(&status_only));
        assert_ne!(signature(&a), signature(&object(4, &[])));
        let mut relabelled = a.clone();
        relabelled["metadata"]["labels"] = json!({});
        assert_ne!(signature(&a), signature(&relabelled));
    }
}
