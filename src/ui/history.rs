//! What happened to each Application, from the Kubernetes Events Setpoint
//! writes about it (`Synced`, `DriftCorrected`, `Pruned`, `DriftDetected`,
//! errors): one watch per process (not per viewer) keeps the last ones in
//! memory and tells the live streams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Event as KubeEvent;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::broadcast;

use super::live::Update;
use super::view::{DriftRecord, EventRecord, parse_drift};
use crate::event::AppKey;

/// Events kept per Application.
pub const EVENTS_KEPT: usize = 50;

/// Each Application's Events, with their uids, newest first.
type Records = HashMap<AppKey, Vec<(String, EventRecord)>>;

#[derive(Clone, Default)]
pub struct History(Arc<Mutex<Records>>);

impl History {
    /// Records one Event (a later version of the same Event replaces it).
    pub fn record(&self, app: AppKey, uid: String, record: EventRecord) {
        let mut all = self.0.lock().expect("history lock");
        let events = all.entry(app).or_default();
        events.retain(|(id, _)| *id != uid);
        events.push((uid, record));
        events.sort_by(|a, b| b.1.time.cmp(&a.1.time));
        events.truncate(EVENTS_KEPT);
    }

    /// Newest first.
    pub fn events(&self, app: &AppKey) -> Vec<EventRecord> {
        let all = self.0.lock().expect("history lock");
        all.get(app)
            .map(|events| events.iter().map(|(_, e)| e.clone()).collect())
            .unwrap_or_default()
    }

    /// The drift corrections among them, newest first.
    pub fn drift(&self, app: &AppKey) -> Vec<DriftRecord> {
        self.events(app)
            .iter()
            .filter(|e| e.reason == "DriftCorrected")
            .map(|e| parse_drift(&e.time, &e.note))
            .collect()
    }
}

/// The Application an Event is about and what it says, or none.
fn about(event: &KubeEvent) -> Option<(AppKey, String, EventRecord)> {
    let object = &event.involved_object;
    if object.kind.as_deref() != Some("Application")
        || !object
            .api_version
            .as_deref()
            .is_some_and(|v| v.starts_with("setpoint.dev/"))
    {
        return None;
    }
    let key = AppKey::new(object.namespace.clone()?, object.name.clone()?);
    let time = event
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| event.last_timestamp.as_ref().map(|t| t.0.to_string()))
        .or_else(|| event.event_time.as_ref().map(|t| t.0.to_string()))
        .or_else(|| event.first_timestamp.as_ref().map(|t| t.0.to_string()))
        .or_else(|| {
            event
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
        })
        .unwrap_or_default();
    let record = EventRecord {
        time,
        type_: event.type_.clone().unwrap_or_default(),
        reason: event.reason.clone().unwrap_or_default(),
        note: event.message.clone().unwrap_or_default(),
    };
    Some((key, event.metadata.uid.clone().unwrap_or_default(), record))
}

/// Watches the Events about Applications in `namespaces` (none: all) for as
/// long as the process runs, retrying with kube's backoff.
pub async fn run(
    client: Client,
    namespaces: Vec<String>,
    history: History,
    updates: broadcast::Sender<Update>,
) {
    let config = watcher::Config::default().fields("involvedObject.kind=Application");
    let apis: Vec<Api<KubeEvent>> = if namespaces.is_empty() {
        vec![Api::all(client)]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    let streams = apis.into_iter().map(|api| {
        watcher(api, config.clone())
            .default_backoff()
            .applied_objects()
            .boxed()
    });
    let mut all = futures::stream::select_all(streams);
    while let Some(event) = all.next().await {
        match event {
            Ok(event) => {
                if let Some((key, uid, record)) = about(&event) {
                    let reason = record.reason.clone();
                    history.record(key.clone(), uid, record);
                    let _ = updates.send(Update::event(key, reason));
                }
            }
            Err(error) => tracing::debug!(%error, "Event watch for the dashboard failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(time: &str, reason: &str, note: &str) -> EventRecord {
        EventRecord {
            time: time.into(),
            type_: "Normal".into(),
            reason: reason.into(),
            note: note.into(),
        }
    }

    #[test]
    fn events_are_kept_newest_first_and_replaced_by_uid() {
        let history = History::default();
        let key = AppKey::new("ns", "app");
        history.record(
            key.clone(),
            "1".into(),
            record("2026-01-01T00:00:01Z", "Synced", "a"),
        );
        history.record(
            key.clone(),
            "2".into(),
            record(
                "2026-01-01T00:00:03Z",
                "DriftCorrected",
                "apps/Deployment ns/web: spec.replicas 5→1 (changed by kubectl)",
            ),
        );
        history.record(
            key.clone(),
            "1".into(),
            record("2026-01-01T00:00:02Z", "Synced", "b"),
        );
        let events = history.events(&key);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].reason, "DriftCorrected");
        assert_eq!(events[1].note, "b");
        let drift = history.drift(&key);
        assert_eq!(drift.len(), 1);
        assert_eq!(drift[0].fields[0].changed_by, "kubectl");
        assert!(history.events(&AppKey::new("ns", "other")).is_empty());
    }

    #[test]
    fn only_events_about_applications_count() {
        let mut event = KubeEvent::default();
        event.involved_object.kind = Some("Deployment".into());
        assert!(about(&event).is_none());
        event.involved_object.kind = Some("Application".into());
        event.involved_object.api_version = Some("setpoint.dev/v1alpha1".into());
        event.involved_object.namespace = Some("ns".into());
        event.involved_object.name = Some("app".into());
        event.reason = Some("Synced".into());
        let (key, _, record) = about(&event).expect("about an Application");
        assert_eq!(key, AppKey::new("ns", "app"));
        assert_eq!(record.reason, "Synced");
        event.involved_object.api_version = Some("argoproj.io/v1alpha1".into());
        assert!(about(&event).is_none());
    }
}
