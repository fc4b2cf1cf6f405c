//! Ingest: where reconcile events come from. `webhook` (pushes announced by
//! GitHub and GitLab), `watch` (live objects and Applications changing), and
//! `sweep` (every Application, slowly, in case an event was missed).

pub mod dependents;
pub mod receiver;
pub mod sweep;
pub mod watch;
pub mod webhook;

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;

use crate::api::Application;
use crate::event::AppKey;
use std::sync::{Arc, Mutex, RwLock};

use webhook::route::{Push, RouteIndex, Routed};
use webhook::{AppIndex, AppSource};

/// The webhook's view of the Applications: the watch's in-memory reflector,
/// so no request is listed per push, and a route index kept from the same
/// watch events (`apply_watcher_event`), one Application at a time, so no
/// push waits for it to be rebuilt.
pub struct StoreIndex {
    store: Store<Application>,
    /// The ApplicationSets pushes and pull request events re-evaluate.
    sets: Option<Store<crate::api::ApplicationSet>>,
    routes: RwLock<RouteIndex>,
    /// The index of a relist under way (from `Init` to `InitDone`), swapped
    /// in whole at its end, as the store's writer swaps its buffer.
    relist: Mutex<Option<RouteIndex>>,
}

impl StoreIndex {
    /// The index of `store`'s Applications as they are now; from then on, the
    /// events that change the store must be given to `apply_watcher_event`
    /// too (`AppReflector`).
    pub fn new(store: Store<Application>) -> Self {
        let routes = RouteIndex::new(store.state().iter().map(|app| source_of(app)));
        StoreIndex {
            store,
            sets: None,
            routes: RwLock::new(routes),
            relist: Mutex::default(),
        }
    }

    /// Brings the route index up to date with `event`, as
    /// `reflector::store::Writer::apply_watcher_event` does the store: an
    /// Application applied or deleted touches only its own entries; a relist
    /// is built aside and replaces the index at its end.
    pub fn apply_watcher_event(&self, event: &watcher::Event<Application>) {
        let mut relist = self.relist.lock().expect("route relist lock");
        match event {
            watcher::Event::Apply(app) => {
                let source = source_of(app);
                self.write().apply(source);
            }
            watcher::Event::Delete(app) => self.write().remove(&key_of(app)),
            watcher::Event::Init => *relist = Some(RouteIndex::default()),
            watcher::Event::InitApply(app) => {
                relist.get_or_insert_default().apply(source_of(app));
            }
            watcher::Event::InitDone => {
                let fresh = relist.take().unwrap_or_default();
                let stale = std::mem::replace(&mut *self.write(), fresh);
                // Freed after the lock is released.
                drop(stale);
            }
        }
    }

    /// Routes pushes and pull request events to the sets of `sets` too.
    pub fn with_sets(mut self, sets: Store<crate::api::ApplicationSet>) -> Self {
        self.sets = Some(sets);
        self
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, RouteIndex> {
        self.routes.write().expect("route index lock")
    }
}

impl AppIndex for StoreIndex {
    fn apps(&self) -> Vec<AppSource> {
        self.store
            .state()
            .iter()
            .map(|app| source_of(app))
            .collect()
    }

    fn route(&self, push: &Push) -> Vec<Routed> {
        self.routes
            .read()
            .expect("route index lock")
            .route_why(push)
    }

    fn sets_for_push(&self, push: &Push) -> Vec<AppKey> {
        let Some(sets) = &self.sets else {
            return Vec::new();
        };
        let sets = sets.state();
        crate::appset::route::sets_for_push(push, sets.iter().map(|s| &**s))
    }

    fn sets_for_pull(&self, change: &crate::event::PullChange) -> Vec<AppKey> {
        let Some(sets) = &self.sets else {
            return Vec::new();
        };
        let sets = sets.state();
        crate::appset::route::sets_for_pull(change, sets.iter().map(|s| &**s))
    }
}

/// What the Application watch feeds from each event: the reflector's store,
/// and, when this process runs the webhook, its route index.
pub struct AppReflector {
    pub writer: Writer<Application>,
    pub routes: Option<Arc<StoreIndex>>,
}

pub(crate) fn key_of(app: &Application) -> AppKey {
    AppKey::new(app.namespace().unwrap_or_default(), app.name_any())
}

/// What the webhook needs of one Application.
pub(crate) fn source_of(app: &Application) -> AppSource {
    AppSource {
        key: key_of(app),
        repo_url: app.spec.source.repo_url.clone(),
        target_revision: app.spec.source.target_revision.clone(),
        path: app.spec.source.path.clone(),
        inputs: app
            .status
            .as_ref()
            .map(|s| s.source_inputs.clone())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApplicationSpec, ApplicationStatus, Source};

    fn application(name: &str, path: &str, inputs: &[&str]) -> Application {
        let mut app = Application::new(
            name,
            ApplicationSpec {
                source: Source {
                    repo_url: "https://github.com/octo-org/deploy.git".into(),
                    path: Some(path.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        app.metadata.namespace = Some("team".into());
        app.status = Some(ApplicationStatus {
            source_inputs: inputs.iter().map(|i| i.to_string()).collect(),
            ..Default::default()
        });
        app
    }

    fn push(file: &str) -> Push {
        Push {
            repo_urls: vec!["https://github.com/octo-org/deploy".into()],
            git_ref: "refs/heads/main".into(),
            commit: "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c".into(),
            default_branch: Some("main".into()),
            changed_files: Some(vec![file.into()]),
            ..Default::default()
        }
    }

    /// The store and the index fed one event, as the watch feeds them.
    struct Watched {
        writer: Writer<Application>,
        index: StoreIndex,
    }

    impl Watched {
        fn new() -> Self {
            let writer = Writer::new(());
            let index = StoreIndex::new(writer.as_reader());
            Watched { writer, index }
        }

        fn event(&mut self, event: watcher::Event<Application>) {
            self.writer.apply_watcher_event(&event);
            self.index.apply_watcher_event(&event);
        }

        fn routed(&self, file: &str) -> Vec<String> {
            let routed: Vec<String> = self
                .index
                .route(&push(file))
                .into_iter()
                .map(|r| r.key.name)
                .collect();
            // As routing the store's Applications afresh would.
            let fresh: Vec<String> = RouteIndex::new(self.index.apps())
                .route_why(&push(file))
                .into_iter()
                .map(|r| r.key.name)
                .collect();
            assert_eq!(routed, fresh, "{file}");
            routed
        }
    }

    #[test]
    fn the_route_index_follows_the_watch_events() {
        let mut watched = Watched::new();
        let prod = application("prod", "envs/prod", &["bases/web", "envs/prod"]);
        watched.event(watcher::Event::Apply(prod.clone()));
        watched.event(watcher::Event::Apply(application(
            "staging",
            "envs/staging",
            &["bases/web", "envs/staging"],
        )));
        assert_eq!(watched.routed("bases/web/deploy.yaml"), ["prod", "staging"]);

        // Its status's inputs changed: rendered over another base now.
        watched.event(watcher::Event::Apply(application(
            "staging",
            "envs/staging",
            &["bases/api", "envs/staging"],
        )));
        assert_eq!(watched.routed("bases/web/deploy.yaml"), ["prod"]);
        assert_eq!(watched.routed("bases/api/x.yaml"), ["staging"]);

        watched.event(watcher::Event::Delete(prod));
        assert!(watched.routed("bases/web/deploy.yaml").is_empty());
        assert_eq!(watched.routed("envs/staging/x.yaml"), ["staging"]);
    }

    #[test]
    fn a_relist_replaces_the_index_at_its_end() {
        let mut watched = Watched::new();
        watched.event(watcher::Event::Apply(application("gone", "envs/gone", &[])));
        watched.event(watcher::Event::Apply(application("kept", "envs/kept", &[])));

        // A relist after a watch restart: `gone` was deleted meanwhile.
        watched.event(watcher::Event::Init);
        watched.event(watcher::Event::InitApply(application(
            "kept",
            "envs/kept",
            &["bases/web", "envs/kept"],
        )));
        // Until it ends, pushes are routed as before, as the store answers.
        assert_eq!(watched.routed("envs/gone/x.yaml"), ["gone"]);
        assert!(watched.routed("bases/web/x.yaml").is_empty());
        watched.event(watcher::Event::InitApply(application(
            "new",
            "envs/new",
            &[],
        )));
        watched.event(watcher::Event::InitDone);
        assert!(watched.routed("envs/gone/x.yaml").is_empty());
        assert_eq!(watched.routed("bases/web/x.yaml"), ["kept"]);
        assert_eq!(watched.routed("envs/new/x.yaml"), ["new"]);
    }

    #[test]
    fn an_index_made_over_a_filled_store_knows_its_applications() {
        let mut writer = Writer::new(());
        writer.apply_watcher_event(&watcher::Event::Apply(application(
            "prod",
            "envs/prod",
            &["bases/web"],
        )));
        let index = StoreIndex::new(writer.as_reader());
        let routed: Vec<String> = index
            .route(&push("bases/web/x.yaml"))
            .into_iter()
            .map(|r| r.key.name)
            .collect();
        assert_eq!(routed, ["prod"]);
    }
}
