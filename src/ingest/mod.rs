//! Ingest: where reconcile events come from. `webhook` (pushes announced by
//! GitHub and GitLab), `watch` (live objects and Applications changing), and
//! `sweep` (every Application, slowly, in case an event was missed).

pub mod sweep;
pub mod watch;
pub mod webhook;

use kube::ResourceExt;
use kube::runtime::reflector::Store;

use crate::api::Application;
use crate::event::AppKey;
use webhook::{AppIndex, AppSource};

/// The webhook's view of the Applications: the watch's in-memory reflector,
/// so no request is listed per push.
pub struct StoreIndex(pub Store<Application>);

impl AppIndex for StoreIndex {
    fn apps(&self) -> Vec<AppSource> {
        self.0
            .state()
            .iter()
            .map(|app| AppSource {
                key: AppKey::new(app.namespace().unwrap_or_default(), app.name_any()),
                repo_url: app.spec.source.repo_url.clone(),
                target_revision: app.spec.source.target_revision.clone(),
                path: app.spec.source.path.clone(),
                inputs: app
                    .status
                    .as_ref()
                    .map(|s| s.source_inputs.clone())
                    .unwrap_or_default(),
            })
            .collect()
    }
}
