//! The tap: an Application's Kubernetes Events, as `report/events.rs`
//! writes them, turned into one queued [`Notification`] per Alert that
//! selects them. Published with confirms before the reconcile that wrote
//! the Event returns, so a notification is safe before the reconcile's own
//! delivery is acknowledged; a queue that refuses it is a warning and a
//! metric, never a failed reconcile.
//!
//! The [`Notifier`] is the process's: the Alerts and Providers from
//! reflector stores (scoped like the Applications), the queue, the rate
//! limits, and what the delivery side needs (the kube client, the HTTP
//! client, the delivered-ids store).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::api::{Alert, Application, Provider};
use crate::event::{Cause, Event};
use crate::metrics::{Metrics, NotifyLabels};
use crate::notify::kinds::{self, Emitted};
use crate::notify::matching::{self, RateLimits, Subject};
use crate::notify::sent::Sent;
use crate::notify::{AppRef, Change, Notification, Occurrence};
use crate::queue::Queue;

/// What the Notifier is made of.
pub struct NotifierParts {
    pub client: kube::Client,
    pub alerts: Store<Alert>,
    pub providers: Store<Provider>,
    pub queue: Arc<dyn Queue>,
    pub sent: Arc<dyn Sent>,
    pub metrics: Metrics,
    pub settings: NotifySettings,
}

/// Read once at start.
#[derive(Clone, Debug)]
pub struct NotifySettings {
    /// Deliveries at once in a worker, over all Providers.
    pub concurrency: usize,
    /// Deliveries at once to one Provider.
    pub per_provider: usize,
    /// Deliveries held for one Provider; past it, a delivery goes back to
    /// the queue's backoff (a Provider that hangs cannot fill the worker's
    /// prefetch).
    pub provider_backlog: usize,
    /// A delivery's deadline when its Provider sets none.
    pub timeout: Duration,
    /// The queue's attempts before it parks an event (to count the parked).
    pub max_attempts: u32,
    /// The GitHub API for `github` Providers whose Secret names none.
    pub github_api_url: String,
    /// The GitLab API for `gitlab` Providers whose Secret names none.
    pub gitlab_api_url: String,
}

impl Default for NotifySettings {
    fn default() -> Self {
        Self {
            concurrency: 8,
            per_provider: 4,
            provider_backlog: 64,
            timeout: Duration::from_secs(10),
            max_attempts: 8,
            github_api_url: crate::report::github::DEFAULT_API_URL.into(),
            gitlab_api_url: "https://gitlab.com/api/v4".into(),
        }
    }
}

/// The process's notifier; cheap to clone.
#[derive(Clone)]
pub struct Notifier(pub(crate) Arc<Inner>);

pub(crate) struct Inner {
    pub(crate) client: kube::Client,
    pub(crate) alerts: Store<Alert>,
    pub(crate) providers: Store<Provider>,
    pub(crate) queue: Arc<dyn Queue>,
    pub(crate) sent: Arc<dyn Sent>,
    pub(crate) metrics: Metrics,
    pub(crate) settings: NotifySettings,
    pub(crate) poster: crate::notify::http::Poster,
    limits: Mutex<RateLimits>,
    /// The Ready condition last written per Alert (`namespace/name`), so
    /// an unchanged one is not written again.
    pub(crate) conditions: Mutex<std::collections::HashMap<String, (bool, String)>>,
}

impl Notifier {
    pub fn new(parts: NotifierParts) -> Self {
        Notifier(Arc::new(Inner {
            client: parts.client,
            alerts: parts.alerts,
            providers: parts.providers,
            queue: parts.queue,
            sent: parts.sent,
            metrics: parts.metrics,
            settings: parts.settings,
            poster: crate::notify::http::Poster::new(),
            limits: Mutex::default(),
            conditions: Mutex::default(),
        }))
    }

    pub fn settings(&self) -> &NotifySettings {
        &self.0.settings
    }

    /// The tap of one Application's Events. `source` is the id of the
    /// queue event that caused this reconcile (a preview's pull request
    /// and head): the notifications' ids derive from it.
    pub fn tap(&self, app: &Application, source: Option<&str>) -> Tap {
        let namespace = app.namespace().unwrap_or_default();
        let source = match source {
            Some(source) => source.to_string(),
            // Without one: the Application as this reconcile read it.
            None => format!(
                "{}@{}",
                app.uid().unwrap_or_default(),
                app.resource_version().unwrap_or_default()
            ),
        };
        Tap {
            notifier: self.clone(),
            app: AppRef {
                namespace: namespace.clone(),
                name: app.name_any(),
                uid: app.uid().unwrap_or_default(),
                resource_version: app.resource_version().unwrap_or_default(),
            },
            labels: app.labels().clone(),
            repository: Some(crate::source::repo_url::normalize_url(
                &app.spec.source.repo_url,
            )),
            revision: Mutex::new(
                app.status
                    .as_ref()
                    .and_then(|status| status.sync.revision.clone()),
            ),
            source,
        }
    }

    pub(crate) fn count(&self, provider: &str, outcome: &str) {
        self.0
            .metrics
            .notifications
            .get_or_create(&NotifyLabels {
                provider: provider.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// The Provider `namespace/name`, from the store.
    pub(crate) fn provider(&self, namespace: &str, name: &str) -> Option<Arc<Provider>> {
        self.0
            .providers
            .get(&ObjectRef::new(name).within(namespace))
    }
}

/// One Application's Events, handed to the Alerts.
pub struct Tap {
    notifier: Notifier,
    app: AppRef,
    labels: BTreeMap<String, String>,
    repository: Option<String>,
    /// The revision the reconcile is at (the previous status's until the
    /// source resolves it).
    revision: Mutex<Option<String>>,
    source: String,
}

impl Tap {
    /// The reconcile resolved its revision.
    pub fn at_revision(&self, revision: &str) {
        *self.revision.lock().expect("revision lock") = Some(revision.to_string());
    }

    /// Hands over one Event: one notification per Alert that selects it.
    pub async fn emit(&self, emitted: Emitted<'_>, note: &str, changes: &[Change]) {
        let Some(kind) = kinds::kind_of(emitted) else {
            return;
        };
        let severity = kinds::severity_of(kind);
        let inner = &self.notifier.0;
        let subject = Subject {
            namespace: &self.app.namespace,
            name: &self.app.name,
            labels: &self.labels,
        };
        let alerts: Vec<Arc<Alert>> = inner
            .alerts
            .state()
            .into_iter()
            .filter(|alert| alert.namespace().as_deref() == Some(self.app.namespace.as_str()))
            .filter(|alert| {
                matching::matches(&self.app.namespace, &alert.spec, subject, kind, severity)
            })
            .collect();
        if alerts.is_empty() {
            return;
        }
        let timestamp = crate::reconcile::now();
        let revision = self.revision.lock().expect("revision lock").clone();
        for alert in alerts {
            let alert_name = alert.name_any();
            let provider = alert.spec.provider_ref.name.clone();
            let alert_key = format!("{}/{alert_name}", self.app.namespace);
            let app_key = format!("{}/{}", self.app.namespace, self.app.name);
            match matching::rate_limit(&alert.spec) {
                Ok(Some(interval)) => {
                    let allowed = inner.limits.lock().expect("limits lock").allow(
                        &alert_key,
                        &app_key,
                        kind,
                        interval,
                        Instant::now(),
                    );
                    if !allowed {
                        tracing::debug!(alert = %alert_key, app = %app_key, kind = kind.as_str(), "rate limited");
                        continue;
                    }
                }
                Ok(None) => {}
                Err(message) => {
                    crate::notify::deliver::alert_not_ready(
                        &self.notifier,
                        &self.app.namespace,
                        &alert_name,
                        "InvalidRateLimit",
                        &message,
                    );
                }
            }
            if self
                .notifier
                .provider(&self.app.namespace, &provider)
                .is_none()
            {
                let message = format!(
                    "the Provider {}/{provider} does not exist: notifications of this Alert are dropped",
                    self.app.namespace
                );
                tracing::warn!(alert = %alert_key, "{message}");
                self.notifier
                    .count(&provider_key(&self.app.namespace, &provider), "dropped");
                crate::notify::deliver::alert_not_ready(
                    &self.notifier,
                    &self.app.namespace,
                    &alert_name,
                    "ProviderNotFound",
                    &message,
                );
                continue;
            }
            let notification = Notification {
                id: notification_id(&self.source, &alert_key, emitted, note),
                namespace: self.app.namespace.clone(),
                alert: alert_name,
                provider: provider.clone(),
                summary: alert.spec.summary.clone(),
                metadata: alert
                    .spec
                    .event_metadata
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                occurrence: Occurrence {
                    kind,
                    reason: emitted.reason.to_string(),
                    severity,
                    message: note.to_string(),
                    app: self.app.clone(),
                    revision: revision.clone(),
                    repository: self.repository.clone(),
                    changes: changes.to_vec(),
                    timestamp: timestamp.clone(),
                },
            };
            let mut event = Event::new(notification.key(), Cause::Notify(Box::new(notification)));
            if let Cause::Notify(notification) = &event.cause {
                event.id = notification.id.clone();
            }
            if let Err(error) = inner.queue.publish(&event).await {
                tracing::warn!(alert = %alert_key, app = %app_key, %error, "a notification could not be queued");
                self.notifier
                    .count(&provider_key(&self.app.namespace, &provider), "unpublished");
            }
        }
    }
}

pub(crate) fn provider_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The id of one Alert's copy of one Event: the same source event, Alert
/// and Event give the same id (a redelivered reconcile that says the same
/// again publishes it again, and the delivery side drops the second).
pub fn notification_id(source: &str, alert: &str, emitted: Emitted<'_>, note: &str) -> String {
    crate::ingest::webhook::dedupe::RecordKey::new(&[
        source.as_bytes(),
        alert.as_bytes(),
        emitted.reason.as_bytes(),
        emitted.action.as_bytes(),
        note.as_bytes(),
    ])
    .as_str()
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_source_event_the_alert_and_the_event() {
        let drift = Emitted {
            reason: "DriftCorrected",
            action: "Apply",
            warning: false,
            stalled: false,
        };
        let id = notification_id("e-1", "team/ops", drift, "spec.replicas 5→1");
        assert_eq!(
            id,
            notification_id("e-1", "team/ops", drift, "spec.replicas 5→1")
        );
        assert_ne!(
            id,
            notification_id("e-2", "team/ops", drift, "spec.replicas 5→1")
        );
        assert_ne!(
            id,
            notification_id("e-1", "team/dev", drift, "spec.replicas 5→1")
        );
        assert_ne!(
            id,
            notification_id("e-1", "team/ops", drift, "spec.replicas 6→1")
        );
        assert_eq!(id.len(), 32);
    }
}
