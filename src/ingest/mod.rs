//! Ingest: where reconcile events come from. `webhook` (pushes announced by
//! GitHub and GitLab), `watch` (live objects and Applications changing), and
//! `sweep` (every Application, slowly, in case an event was missed).

pub mod dependents;
pub mod sweep;
pub mod watch;
pub mod webhook;

use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::api::Application;
use crate::event::AppKey;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use webhook::route::{Push, RouteIndex, Routed};
use webhook::{AppIndex, AppSource};

/// The webhook's view of the Applications: the watch's in-memory reflector,
/// so no request is listed per push.
pub struct StoreIndex {
    store: Store<Application>,
    /// The route index of the store's Applications as of a fingerprint of
    /// their uids and resource versions: rebuilt only when one changed.
    cached: Mutex<Option<(u64, Arc<RouteIndex>)>>,
}

impl StoreIndex {
    pub fn new(store: Store<Application>) -> Self {
        StoreIndex {
            store,
            cached: Mutex::default(),
        }
    }

    fn index(&self) -> Arc<RouteIndex> {
        let state = self.store.state();
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for app in &state {
            app.metadata.uid.hash(&mut hasher);
            app.metadata.resource_version.hash(&mut hasher);
        }
        // Any Application added, removed or changed (its status's inputs
        // included) changes it; the store's order changing only costs a
        // rebuild.
        let fingerprint = hasher.finish();
        let mut cached = self.cached.lock().expect("route index lock");
        if let Some((at, index)) = cached.as_ref()
            && *at == fingerprint
        {
            return Arc::clone(index);
        }
        let index = Arc::new(RouteIndex::new(state.iter().map(|app| source_of(app))));
        *cached = Some((fingerprint, Arc::clone(&index)));
        index
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
        self.index().route_why(push)
    }
}

/// What the webhook needs of one Application.
fn source_of(app: &Application) -> AppSource {
    AppSource {
        key: AppKey::new(app.namespace().unwrap_or_default(), app.name_any()),
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
