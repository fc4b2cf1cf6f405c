//! Live updates: one Server-Sent Events stream per open page, fed by a
//! tokio broadcast of what changed. Application changes come from the
//! in-memory index the Application watch keeps (a change of an
//! Application's resourceVersion there, checked a few times a second, in
//! memory); Events (drift corrections, syncs) from `history`. No viewer
//! ever makes the process call the API server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::Store;
use serde::Serialize;
use tokio::sync::broadcast;

use crate::api::Application;
use crate::event::AppKey;

/// How often the index is compared with what it held.
pub const INDEX_CHECK: Duration = Duration::from_millis(200);

/// A comment line sent this often keeps proxies from closing a quiet stream.
pub const KEEPALIVE: Duration = Duration::from_secs(15);

/// What changed: an Application (`app`), or an Event about it (`event`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Update {
    pub namespace: String,
    pub name: String,
    pub what: &'static str,
    /// The Event's reason, for `event`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

impl Update {
    pub fn app(key: AppKey) -> Self {
        Self {
            namespace: key.namespace,
            name: key.name,
            what: "app",
            reason: String::new(),
        }
    }

    pub fn event(key: AppKey, reason: String) -> Self {
        Self {
            namespace: key.namespace,
            name: key.name,
            what: "event",
            reason,
        }
    }
}

/// The Applications whose resourceVersion changed, appeared or went away
/// between two looks at the index; `seen` becomes the new look.
pub fn changes(seen: &mut HashMap<AppKey, String>, apps: &[Arc<Application>]) -> Vec<AppKey> {
    let mut now = HashMap::with_capacity(apps.len());
    let mut changed = Vec::new();
    for app in apps {
        let key = AppKey::new(
            app.metadata.namespace.clone().unwrap_or_default(),
            app.metadata.name.clone().unwrap_or_default(),
        );
        let version = app.metadata.resource_version.clone().unwrap_or_default();
        if seen.get(&key) != Some(&version) {
            changed.push(key.clone());
        }
        now.insert(key, version);
    }
    for key in seen.keys() {
        if !now.contains_key(key) {
            changed.push(key.clone());
        }
    }
    *seen = now;
    changed
}

/// Sends every change of the index to `updates`, for as long as the
/// process runs. The first look only learns what is there.
pub async fn watch_index(store: Store<Application>, updates: broadcast::Sender<Update>) {
    let mut seen = HashMap::new();
    changes(&mut seen, &store.state());
    let mut tick = tokio::time::interval(INDEX_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if updates.receiver_count() == 0 {
            // Nobody listens: still follow, so the first listener gets
            // only what changed after it came.
            changes(&mut seen, &store.state());
            continue;
        }
        for key in changes(&mut seen, &store.state()) {
            let _ = updates.send(Update::app(key));
        }
    }
}

/// Which updates one stream carries.
#[derive(Clone, Debug)]
pub enum Follow {
    /// The list: any Application of these namespaces.
    Namespaces(Vec<String>),
    /// One Application's page.
    App(AppKey),
}

impl Follow {
    fn wants(&self, update: &Update) -> bool {
        match self {
            Follow::Namespaces(namespaces) => namespaces.contains(&update.namespace),
            Follow::App(key) => key.namespace == update.namespace && key.name == update.name,
        }
    }
}

/// The SSE body: `event: change` with the update as JSON, a comment every
/// `KEEPALIVE`, and `event: lagged` when this stream missed updates (the
/// page then reloads its data all the same).
pub fn stream(
    updates: broadcast::Receiver<Update>,
    follow: Follow,
) -> impl futures::Stream<Item = Result<actix_web::web::Bytes, actix_web::Error>> {
    let hello = actix_web::web::Bytes::from_static(b"retry: 2000\n: connected\n\n");
    let first = futures::stream::once(async move { Ok(hello) });
    let rest = futures::stream::unfold(
        (updates, follow),
        move |(mut updates, follow)| async move {
            let mut keepalive =
                tokio::time::interval_at(tokio::time::Instant::now() + KEEPALIVE, KEEPALIVE);
            loop {
                tokio::select! {
                    _ = keepalive.tick() => {
                        let bytes = actix_web::web::Bytes::from_static(b": keepalive\n\n");
                        return Some((Ok(bytes), (updates, follow)));
                    }
                    received = updates.recv() => match received {
                        Ok(update) if follow.wants(&update) => {
                            let json = serde_json::to_string(&update).expect("updates serialize");
                            let bytes = format!("event: change\ndata: {json}\n\n");
                            return Some((Ok(bytes.into()), (updates, follow)));
                        }
                        Ok(_) => continue,
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            let bytes = actix_web::web::Bytes::from_static(b"event: lagged\ndata: {}\n\n");
                            return Some((Ok(bytes), (updates, follow)));
                        }
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            }
        },
    );
    futures::StreamExt::chain(first, rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ApplicationSpec;

    fn app(ns: &str, name: &str, version: &str) -> Arc<Application> {
        let mut app = Application::new(name, ApplicationSpec::default());
        app.metadata.namespace = Some(ns.into());
        app.metadata.resource_version = Some(version.into());
        Arc::new(app)
    }

    #[test]
    fn changed_new_and_gone_applications_are_reported_once() {
        let mut seen = HashMap::new();
        let first = changes(&mut seen, &[app("a", "x", "1"), app("a", "y", "1")]);
        assert_eq!(first.len(), 2);
        assert!(changes(&mut seen, &[app("a", "x", "1"), app("a", "y", "1")]).is_empty());
        let next = changes(&mut seen, &[app("a", "x", "2"), app("b", "z", "1")]);
        assert_eq!(
            next,
            vec![
                AppKey::new("a", "x"),
                AppKey::new("b", "z"),
                AppKey::new("a", "y")
            ]
        );
    }

    #[test]
    fn a_stream_follows_its_namespaces_or_its_application() {
        let update = Update::app(AppKey::new("a", "x"));
        assert!(Follow::Namespaces(vec!["a".into()]).wants(&update));
        assert!(!Follow::Namespaces(vec!["b".into()]).wants(&update));
        assert!(Follow::App(AppKey::new("a", "x")).wants(&update));
        assert!(!Follow::App(AppKey::new("a", "y")).wants(&update));
    }
}
