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
//! object whose Application is elsewhere enqueues nothing. The live objects
//! are then watched per namespace (each namespace the Applications' objects
//! are in), as the chart's namespaced RBAC (Roles, no ClusterRole) allows;
//! cluster-scoped kinds stay cluster-wide.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::DynamicObject;
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::AppReflector;
use crate::api::{Application, Health};
use crate::cluster::live_cache::Gvk;
use crate::cluster::{Change, Cluster, Registry, Wanted};
use crate::event::{AppKey, Cause, Event};
use crate::ingest::dependents::{Dependents, Due};
use crate::queue::Queue;
use crate::reconcile::depends;
use crate::reconcile::health::assess_configured as assess;
use crate::reconcile::plan::FIELD_MANAGER;
use crate::reconcile::prepare::{APP_ANNOTATION, APP_LABEL};

mod objects;
pub(crate) mod retry;

use objects::*;
use retry::*;

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

    /// Every namespace: no `--watch-namespaces`.
    pub fn is_all(&self) -> bool {
        self.namespaces.is_empty()
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

    /// The one namespace of the scope, when it is one.
    pub fn single(&self) -> Option<&str> {
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

/// How long the API server keeps one watch open (`timeoutSeconds`) before
/// closing it; the watcher then resumes from the last resourceVersion it saw
/// or was sent as a bookmark (bookmarks are on), without a relist. kube gives
/// up on a watch that stays silent 5 s longer than this, so a connection that
/// stalls without closing is replaced within about a minute.
const WATCH_TIMEOUT_SECONDS: u32 = 60;

/// The client the watches list and watch with: kube sets no read timeout,
/// and a relist sent to an API server that had just restarted was seen to
/// get no answer at all, leaving its watch (and drift) stuck. A read
/// timeout above the watch timeout bounds that without cutting quiet
/// watches, which the API server closes first.
pub fn client(mut config: kube::Config) -> Result<Client, kube::Error> {
    config.read_timeout = Some(Duration::from_secs(u64::from(WATCH_TIMEOUT_SECONDS) + 15));
    // Counted from each request, not from when its pooled connection idled.
    config.reset_reader_on_write = true;
    Client::try_from(config)
}

fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS)
}

/// Runs the Application watch over `scope` (feeding `reflect`; enqueueing
/// spec changes, and the Applications of a cluster registered, changed or
/// answering again, when `apps` is true) and, when `objects` is true, the
/// live-object watches on each Application's destination cluster.
#[allow(clippy::too_many_arguments)] // the roles' switches, passed as they are
pub async fn run(
    client: Client,
    clusters: Arc<Registry>,
    queue: Arc<dyn Queue>,
    reflect: AppReflector,
    store: Store<Application>,
    scope: Scope,
    objects: bool,
    apps: bool,
) {
    let watches = Arc::new(Mutex::new(KindWatches::default()));
    let mut generations: HashMap<AppKey, Option<i64>> = HashMap::new();
    // Each Application's reconcile request annotation, as last seen.
    let mut requests: HashMap<AppKey, Option<String>> = HashMap::new();
    // `spec.dependsOn` reversed: Applications that turned ready enqueue
    // their dependents (after the listing, once every dependent is known).
    let mut dependents = Dependents::default();
    let mut due: BTreeMap<AppKey, Due> = BTreeMap::new();
    let mut listing = true;
    let mut targets = Targets::default();
    // The ApplicationSets' status summaries follow their Applications.
    let mut summaries = crate::appset::watch::Summaries::default();
    tracing::info!(%scope, "watching Applications");
    let admitted = scope.clone();
    let AppReflector { writer, routes } = reflect;
    let stream = reflector::reflector(
        writer,
        watcher::watcher(scope.applications(client.clone()), watch_config())
            // Nothing reads an Application's managedFields (its status
            // writes make them a large part of it): the store, held for
            // every Application, keeps them out.
            .modify(|app| app.managed_fields_mut().clear())
            .filter(move |event| {
                let keep = event.as_ref().map_or(true, |event| admitted.admits(event));
                std::future::ready(keep)
            })
            // The webhook's route index changes with the store, event by event.
            .inspect_ok(move |event| {
                if let Some(routes) = &routes {
                    routes.apply_watcher_event(event);
                }
            }),
    );
    futures::pin_mut!(stream);
    let changes = futures::stream::unfold(clusters.subscribe(), |mut changes| async move {
        match changes.recv().await {
            Ok(change) => Some((Some(change), changes)),
            // Some were missed: every cluster's watches are checked.
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some((None, changes)),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
        }
    });
    let inputs =
        futures::stream::select(stream.map(Input::Application), changes.map(Input::Cluster));
    futures::pin_mut!(inputs);
    let mut retry = Retry::default();
    let mut list_started = 0;
    while let Some(input) = inputs.next().await {
        let event = match input {
            Input::Application(event) => event,
            Input::Cluster(change) => {
                if listing {
                    continue;
                }
                if apps {
                    for app in store.state() {
                        let wanted = Wanted::of(&app.spec.destination);
                        if change.as_ref().is_none_or(|c| c.concerns(&wanted)) && !wanted.is_local()
                        {
                            let cause = Cause::ClusterChanged {
                                cluster: wanted.to_string(),
                            };
                            publish(&queue, Event::new(super::key_of(&app), cause)).await;
                        }
                    }
                }
                if objects {
                    watches.lock().expect("watches lock").sync(
                        &clusters,
                        &queue,
                        &store,
                        &scope,
                        targets.wanted(),
                    );
                }
                continue;
            }
        };
        let event = match event {
            Ok(event) => {
                if answered(&event) {
                    retry.reset();
                }
                event
            }
            Err(error) => {
                let pause = retry.next(refused(&error), Instant::now());
                if pause.warn {
                    tracing::warn!(%error, retry_in = ?pause.delay, "Application watch failed; retrying");
                } else {
                    tracing::debug!(%error, retry_in = ?pause.delay, "Application watch failed; retrying");
                }
                tokio::time::sleep(pause.delay).await;
                continue;
            }
        };
        match event {
            WatchEvent::Init => {
                listing = true;
                list_started = crate::event::unix_millis(std::time::SystemTime::now());
            }
            WatchEvent::InitDone => {
                listing = false;
                targets.rebuild(&store.state(), &scope);
            }
            WatchEvent::InitApply(app) | WatchEvent::Apply(app) => {
                let key = AppKey::new(app.namespace().unwrap_or_default(), app.name_any());
                if !listing {
                    targets.set(key.clone(), targets_of(&app, &scope));
                }
                match dependents.apply(&app) {
                    Due::Nothing => {}
                    // Ready wins over a change seen earlier in the listing.
                    now => {
                        let entry = due.entry(key.clone()).or_insert(now);
                        if now == Due::Ready {
                            *entry = now;
                        }
                    }
                }
                // Its wait message was written from a store that had not yet
                // seen a dependency's last change: once more.
                if apps && !listing && stale_wait(&store, &app) {
                    let cause = Cause::DependencyChanged {
                        dependency: String::new(),
                    };
                    publish(&queue, Event::new(key.clone(), cause)).await;
                }
                if let Some(set) = summaries.apply(&app)
                    && apps
                    && !listing
                {
                    publish(&queue, crate::appset::watch::refresh_event(set)).await;
                }
                let generation = app.metadata.generation;
                let previous = generations.insert(key.clone(), generation);
                // New after the first listing, or its spec changed.
                let changed = match previous {
                    None => !listing || generation_unobserved(&app),
                    Some(previous) => previous != generation,
                };
                let request =
                    crate::event::requested_at(app.metadata.annotations.as_ref()).map(String::from);
                // A request made since the Application was first seen.
                let last_request = requests.insert(key.clone(), request.clone());
                let requested =
                    request.is_some() && last_request.is_some_and(|last| last != request);
                if requested && !changed && apps {
                    publish(&queue, Event::new(key.clone(), Cause::Requested)).await;
                }
                if changed && apps {
                    let mut event = Event::new(key, Cause::AppChanged);
                    if listing {
                        // One listing read every Application at once: a fetch
                        // started after it began is fresh for all of them,
                        // however long publishing the listing takes.
                        event = event.with_fresh_since(Some(list_started));
                    }
                    publish(&queue, event).await;
                }
            }
            WatchEvent::Delete(app) => {
                let key = AppKey::new(app.namespace().unwrap_or_default(), app.name_any());
                targets.remove(&key);
                if let Some(set) = summaries.delete(&app)
                    && apps
                {
                    publish(&queue, crate::appset::watch::refresh_event(set)).await;
                }
                dependents.delete(&key);
                due.entry(key.clone()).or_insert(Due::Changed);
                generations.remove(&key);
                requests.remove(&key);
            }
        }
        if !listing {
            let due = std::mem::take(&mut due);
            for (dependency, why) in due.into_iter().filter(|_| apps) {
                for dependent in dependents.of(&dependency) {
                    if why == Due::Changed && !waiting(&store, &dependent) {
                        continue;
                    }
                    tracing::debug!(%dependency, %dependent, ?why, "enqueueing a dependent");
                    let cause = Cause::DependencyChanged {
                        dependency: dependency.to_string(),
                    };
                    publish(&queue, Event::new(dependent, cause)).await;
                }
            }
        }
        if objects && !listing {
            watches.lock().expect("watches lock").sync(
                &clusters,
                &queue,
                &store,
                &scope,
                targets.wanted(),
            );
        }
    }
}

/// What the watch loop reacts to.
enum Input<A> {
    Application(A),
    /// A cluster registered, changed or answering again; None: some such
    /// news was missed.
    Cluster(Option<Change>),
}

/// Whether `key`'s last reconcile left it waiting for a dependency.
fn waiting(store: &Store<Application>, key: &AppKey) -> bool {
    let Some(app) = store.get(&reflector::ObjectRef::new(&key.name).within(&key.namespace)) else {
        return false;
    };
    app.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == crate::api::ConditionType::Ready && c.reason == depends::NOT_READY)
    })
}

/// Whether `app` says it waits for its dependencies with a message other
/// than the one their state in the store gives now.
fn stale_wait(store: &Store<Application>, app: &Application) -> bool {
    let Some(written) = app.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == crate::api::ConditionType::Ready && c.reason == depends::NOT_READY)
    }) else {
        return false;
    };
    let lookup =
        |key: &AppKey| store.get(&reflector::ObjectRef::new(&key.name).within(&key.namespace));
    // Admin or not does not matter here: one that may not name another
    // namespace is Stalled, never waiting.
    match depends::gate(app, true, &lookup) {
        Ok(gate) => gate.message().as_deref() != Some(written.message.as_str()),
        Err(_) => true,
    }
}

/// An Application whose current spec no reconcile has seen yet.
fn generation_unobserved(app: &Application) -> bool {
    app.status.as_ref().and_then(|s| s.observed_generation) != app.metadata.generation
}

/// One live-object watch: a kind, in one namespace or in all of them.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Target {
    /// The cluster the objects are on (the Application's destination).
    cluster: Wanted,
    group: String,
    version: String,
    kind: String,
    /// None: cluster-wide (every namespace, or a cluster-scoped kind).
    namespace: Option<String>,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!("{}/", self.group)
        };
        write!(f, "{group}{} {}", self.version, self.kind)?;
        match &self.namespace {
            Some(namespace) => write!(f, " in {namespace}")?,
            None => f.write_str(" in the cluster")?,
        }
        match &self.cluster {
            Wanted::Local => Ok(()),
            cluster => write!(f, " {cluster}"),
        }
    }
}

/// The watches one Application's last status calls for: one per kind
/// cluster-wide; with a scope, one per kind and namespace its objects are
/// in (a cluster-scoped kind's objects have none), so that Roles in those
/// namespaces are enough.
fn targets_of(app: &Application, scope: &Scope) -> BTreeSet<Target> {
    let cluster = Wanted::of(&app.spec.destination);
    let target = |group: &str, version: &str, kind: &str, namespace: &Option<String>| Target {
        cluster: cluster.clone(),
        group: group.to_string(),
        version: version.to_string(),
        kind: kind.to_string(),
        namespace: if scope.is_all() {
            None
        } else {
            namespace.clone()
        },
    };
    let resources = app
        .status
        .iter()
        .flat_map(|s| s.resources.iter())
        .map(|r| target(&r.group, &r.version, &r.kind, &r.namespace));
    // The hooks a sync created (Jobs, mostly): their completion resumes it.
    let hooks = app
        .status
        .iter()
        .flat_map(|s| s.sync_run.iter())
        .flat_map(|run| run.hooks.iter())
        .map(|h| target(&h.group, &h.version, &h.kind, &h.namespace));
    resources.chain(hooks).collect()
}

/// The watch targets, kept event by event: each Application's, and how many
/// Applications call for each. One Application's status write then costs
/// the same among 10 Applications as among 10,000 (recomputing them from
/// every Application at each event made a sync of a fleet quadratic).
#[derive(Default)]
struct Targets {
    of_app: HashMap<AppKey, BTreeSet<Target>>,
    count: BTreeMap<Target, usize>,
}

impl Targets {
    /// All of them anew, from the store after a (re)listing.
    fn rebuild(&mut self, apps: &[Arc<Application>], scope: &Scope) {
        *self = Self::default();
        for app in apps {
            self.set(super::key_of(app), targets_of(app, scope));
        }
    }

    fn set(&mut self, key: AppKey, targets: BTreeSet<Target>) {
        for target in &targets {
            *self.count.entry(target.clone()).or_default() += 1;
        }
        if let Some(previous) = self.of_app.insert(key, targets) {
            self.release(previous);
        }
    }

    fn remove(&mut self, key: &AppKey) {
        if let Some(previous) = self.of_app.remove(key) {
            self.release(previous);
        }
    }

    fn release(&mut self, targets: BTreeSet<Target>) {
        for target in targets {
            if let Some(count) = self.count.get_mut(&target) {
                *count -= 1;
                if *count == 0 {
                    self.count.remove(&target);
                }
            }
        }
    }

    fn wanted(&self) -> BTreeSet<Target> {
        self.count.keys().cloned().collect()
    }
}

/// The running watches, each with the cluster it watches (a cluster whose
/// Secret changed is a new one: its watches start again with its new
/// credentials).
#[derive(Default)]
struct KindWatches {
    running: HashMap<Target, (JoinHandle<()>, Arc<Cluster>)>,
}

impl KindWatches {
    fn sync(
        &mut self,
        clusters: &Registry,
        queue: &Arc<dyn Queue>,
        store: &Store<Application>,
        scope: &Scope,
        wanted: BTreeSet<Target>,
    ) {
        let registered = clusters.clusters();
        let cluster_of = |wanted: &Wanted| -> Option<Arc<Cluster>> {
            if wanted.is_local() {
                return Some(clusters.local().clone());
            }
            registered
                .iter()
                .find(|(entry, _)| wanted.matches(entry))
                .and_then(|(_, cluster)| cluster.clone())
        };
        self.running.retain(|target, (task, cluster)| {
            let current = cluster_of(&target.cluster);
            let keep = wanted.contains(target)
                && !task.is_finished()
                && current.is_some_and(|c| Arc::ptr_eq(&c, cluster));
            if !keep {
                tracing::info!(%target, "stopping watch");
                task.abort();
            }
            keep
        });
        for target in wanted {
            if self.running.contains_key(&target) {
                continue;
            }
            // An unregistered cluster: its Applications say so; its watch
            // starts when its Secret comes.
            let Some(cluster) = cluster_of(&target.cluster) else {
                continue;
            };
            tracing::info!(%target, "starting watch");
            let task = tokio::spawn(watch_kind(
                cluster.clone(),
                target.clone(),
                queue.clone(),
                store.clone(),
                scope.clone(),
            ));
            self.running.insert(target, (task, cluster));
        }
    }
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

    /// `app` under another name: a second Application.
    fn named(name: &str, app: Arc<Application>) -> Arc<Application> {
        let mut app = (*app).clone();
        app.metadata.name = Some(name.into());
        Arc::new(app)
    }

    fn app_with(resources: &[(&str, &str, Option<&str>)]) -> Arc<Application> {
        let mut app = app_in("team-a");
        app.status = Some(crate::api::ApplicationStatus {
            resources: resources
                .iter()
                .map(|(group, kind, namespace)| crate::api::ResourceStatus {
                    group: group.to_string(),
                    version: "v1".into(),
                    kind: kind.to_string(),
                    namespace: namespace.map(str::to_string),
                    name: "x".into(),
                    sync: Default::default(),
                    health: Health::Healthy,
                    message: None,
                })
                .collect(),
            ..Default::default()
        });
        Arc::new(app)
    }

    #[test]
    fn an_object_first_listed_with_another_health_than_its_status_records_is_a_change() {
        // The status recorded Deployment x as Healthy.
        let app = app_with(&[("apps", "Deployment", Some("team-a"))]);
        let (store, mut writer) = reflector::store::<Application>();
        writer.apply_watcher_event(&WatchEvent::Apply((*app).clone()));
        let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("apps", "v1", "Deployment"));
        let scope = Scope::new(["team-a"]);
        let deployment = |status: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "x", "namespace": "team-a", "generation": 1,
                             "annotations": {APP_ANNOTATION: "team-a/web"}},
                "spec": {"replicas": 1},
                "status": status,
            }))
            .unwrap()
        };
        let first_listing = |object: &DynamicObject| {
            let mut seen = HashMap::new();
            let value = serde_json::to_value(object).unwrap();
            assert_eq!(
                applied(&mut seen, &resource, &scope, object, &value, None),
                None,
                "without statuses a first sighting is no change"
            );
            applied(
                &mut HashMap::new(),
                &resource,
                &scope,
                object,
                &value,
                Some(&store),
            )
        };
        let ready = json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                           "readyReplicas": 1, "availableReplicas": 1});
        assert_eq!(first_listing(&deployment(ready)), None);
        let unavailable = json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                 "unavailableReplicas": 1});
        assert_eq!(
            first_listing(&deployment(unavailable)),
            Some((
                AppKey::new("team-a", "web"),
                "Deployment x".to_string(),
                "health changed"
            ))
        );
    }

    #[test]
    fn watches_are_per_namespace_only_within_a_scope() {
        let apps = [
            app_with(&[
                ("apps", "Deployment", Some("team-a")),
                ("", "Namespace", None),
            ]),
            named("other", app_with(&[("apps", "Deployment", Some("team-b"))])),
        ];
        let shown = |scope: &Scope| -> Vec<String> {
            let mut targets = Targets::default();
            targets.rebuild(&apps, scope);
            targets.wanted().iter().map(Target::to_string).collect()
        };
        assert_eq!(
            shown(&Scope::new(Vec::<String>::new())),
            [
                "v1 Namespace in the cluster",
                "apps/v1 Deployment in the cluster"
            ]
        );
        assert_eq!(
            shown(&Scope::new(["team-a", "team-b"])),
            [
                "v1 Namespace in the cluster",
                "apps/v1 Deployment in team-a",
                "apps/v1 Deployment in team-b"
            ]
        );
    }

    #[test]
    fn a_watch_is_wanted_while_one_application_calls_for_it() {
        let scope = Scope::new(Vec::<String>::new());
        let key = |name: &str| AppKey::new("team-a", name);
        let deployments = app_with(&[("apps", "Deployment", Some("team-a"))]);
        let both = app_with(&[
            ("apps", "Deployment", Some("team-a")),
            ("", "Service", Some("team-a")),
        ]);
        let shown = |targets: &Targets| -> Vec<String> {
            targets.wanted().iter().map(Target::to_string).collect()
        };
        let mut targets = Targets::default();
        targets.set(key("a"), targets_of(&deployments, &scope));
        targets.set(key("b"), targets_of(&both, &scope));
        assert_eq!(
            shown(&targets),
            [
                "v1 Service in the cluster",
                "apps/v1 Deployment in the cluster"
            ]
        );
        // b's new status no longer has the Service: no one calls for it.
        targets.set(key("b"), targets_of(&deployments, &scope));
        assert_eq!(shown(&targets), ["apps/v1 Deployment in the cluster"]);
        targets.remove(&key("a"));
        assert_eq!(shown(&targets), ["apps/v1 Deployment in the cluster"]);
        targets.remove(&key("b"));
        assert!(targets.wanted().is_empty());
        // A relisting counts each Application once.
        targets.rebuild(&[deployments.clone(), deployments], &scope);
        assert_eq!(targets.count.values().sum::<usize>(), 1);
    }

    #[test]
    fn the_hooks_of_a_sync_run_are_watched_so_their_completion_resumes_it() {
        let mut app = (*app_with(&[("apps", "Deployment", Some("team-a"))])).clone();
        let status = app.status.as_mut().unwrap();
        status.sync_run = Some(crate::api::SyncRun {
            hooks: vec![crate::api::HookRecord {
                group: "batch".into(),
                version: "v1".into(),
                kind: "Job".into(),
                namespace: Some("team-a".into()),
                name: "migrate".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let mut wanted = Targets::default();
        wanted.rebuild(&[Arc::new(app)], &Scope::new(["team-a"]));
        let targets: Vec<String> = wanted.wanted().iter().map(Target::to_string).collect();
        assert_eq!(
            targets,
            ["apps/v1 Deployment in team-a", "batch/v1 Job in team-a"]
        );
    }

    #[test]
    fn retries_start_short_double_and_stay_within_two_seconds() {
        let mut retry = Retry::default();
        let now = Instant::now();
        let delays: Vec<Duration> = (0..8).map(|_| retry.next(false, now).delay).collect();
        // Jitter takes up to half of each delay away, never adds.
        assert!(delays[0] >= Duration::from_millis(125) && delays[0] <= Retry::FIRST);
        assert!(delays[2] >= Duration::from_millis(500) && delays[2] <= Duration::from_secs(1));
        assert!(delays.iter().all(|d| *d <= Retry::MAX), "{delays:?}");
        assert!(delays[7] >= Retry::MAX / 2, "{delays:?}");
        retry.reset();
        assert!(retry.next(false, now).delay <= Retry::FIRST);
    }

    #[test]
    fn a_run_of_failures_warns_once_a_minute() {
        let mut retry = Retry::default();
        let start = Instant::now();
        assert!(retry.next(false, start).warn);
        assert!(!retry.next(false, start + Duration::from_secs(2)).warn);
        assert!(!retry.next(false, start + Duration::from_secs(59)).warn);
        assert!(retry.next(false, start + Duration::from_secs(61)).warn);
        retry.reset();
        assert!(retry.next(false, start + Duration::from_secs(62)).warn);
    }

    #[test]
    fn a_refusal_is_retried_slowly_and_warned_about_once() {
        let mut retry = Retry::default();
        let now = Instant::now();
        assert_eq!(
            retry.next(true, now),
            Pause {
                delay: Retry::REFUSED,
                warn: true
            }
        );
        let later = now + Duration::from_secs(3600);
        assert_eq!(
            retry.next(true, later),
            Pause {
                delay: Retry::REFUSED,
                warn: false
            }
        );
    }

    #[test]
    fn forbidden_and_unknown_kinds_are_refusals_and_outages_are_not() {
        let status = |code: u16| kube::core::Status {
            code,
            ..Default::default()
        };
        let api = |code| kube::Error::Api(Box::new(status(code)));
        assert!(refused(&watcher::Error::InitialListFailed(api(403))));
        assert!(refused(&watcher::Error::WatchStartFailed(api(404))));
        assert!(refused(&watcher::Error::WatchError(Box::new(status(403)))));
        assert!(!refused(&watcher::Error::WatchError(Box::new(status(410)))));
        assert!(!refused(&watcher::Error::InitialListFailed(api(503))));
        assert!(!refused(&watcher::Error::NoResourceVersion));
    }

    #[test]
    fn a_relist_that_misses_an_object_reports_it_deleted() {
        let seen_as = |name: &str| Seen {
            owner: AppKey::new("team", name),
            signature: Signature::default(),
            health: Health::Healthy,
        };
        let key = |name: &str| (Some("team".to_string()), name.to_string());
        let mut seen: HashMap<ObjectKey, Seen> =
            [(key("kept"), seen_as("a")), (key("removed"), seen_as("b"))].into();
        let listed: BTreeSet<ObjectKey> = [key("kept"), key("new")].into();
        let gone = gone_from_listing(&mut seen, &listed);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].0, key("removed"));
        assert_eq!(gone[0].1.owner, AppKey::new("team", "b"));
        assert_eq!(seen.keys().collect::<Vec<_>>(), vec![&key("kept")]);
    }

    #[test]
    fn the_signature_of_an_object_setpoint_applied_covers_only_what_setpoint_owns_of_its_metadata()
    {
        let applied = json!({"metadata": {
            "generation": 2,
            "labels": {"setpoint.dev/app": "team.web"},
            "annotations": {"setpoint.dev/app": "team/web"},
            "managedFields": [{"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:metadata": {
                "f:labels": {"f:setpoint.dev/app": {}},
                "f:annotations": {"f:setpoint.dev/app": {}}}}}]}});
        // The Deployment controller's revision annotation: no drift.
        let mut revised = applied.clone();
        revised["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = json!("2");
        assert_eq!(signature(&applied), signature(&revised));
        // Someone changes a value Setpoint owns.
        let mut changed = applied.clone();
        changed["metadata"]["annotations"]["setpoint.dev/app"] = json!("team/other");
        assert_ne!(signature(&applied), signature(&changed));
        // Or removes it (Setpoint's entry no longer lists it).
        let mut removed = applied.clone();
        removed["metadata"]["labels"] = json!({});
        removed["metadata"]["managedFields"][0]["fieldsV1"]["f:metadata"]
            .as_object_mut()
            .unwrap()
            .remove("f:labels");
        assert_ne!(signature(&applied), signature(&removed));
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
