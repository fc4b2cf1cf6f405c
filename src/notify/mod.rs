//! Notifications out: what happened to an Application, told where its
//! team already talks (Slack, Microsoft Teams, Discord, a generic or signed
//! webhook, GitHub or GitLab commit statuses), as Flux's
//! notification-controller does with its `Provider` and `Alert` objects
//! (`src/api/notify.rs`).
//!
//! The path of one notification:
//!
//! 1. **Tap** (`tap.rs`). Every Kubernetes Event of an Application goes
//!    through `report/events.rs`; an `Events` built by a reconcile also
//!    hands each one to the process's [`tap::Notifier`]. `kinds.rs` (pure)
//!    maps its reason to a kind (`synced`, `driftCorrected`, ...), or to
//!    none; `matching.rs` (pure) picks the Alerts of the Application's
//!    namespace that select it and applies their rate limits.
//! 2. **Queue.** One [`Notification`] per (Alert, event) is published, with
//!    publisher confirms, as `Cause::Notify` on the same queue as every
//!    event, before the reconcile returns: it is safe before the
//!    reconcile's own delivery is acknowledged. Its id is derived from the
//!    event that caused the reconcile, so a redelivered reconcile that says
//!    the same thing publishes the same id.
//! 3. **Dispatch** (`dispatch.rs`). The worker hands `Cause::Notify` to
//!    slots of their own, keyed by Provider, with permits of their own: a
//!    slow or failing Provider never holds back a reconcile or another
//!    Provider.
//! 4. **Deliver** (`deliver.rs`). The id is looked up among those already
//!    delivered (`sent.rs`: on RabbitMQ, or files under the cache); the
//!    Provider and its Secret are read, the message built (`message.rs`,
//!    pure) and encoded for the Provider (`payload.rs`, pure), and POSTed
//!    (`http.rs`) with the id in `X-Setpoint-Event-Id`. A success is
//!    recorded; a failure goes back to the queue's backoff and is parked
//!    after its last attempt. Counted in `setpoint_notifications_total`.

pub mod deliver;
pub mod dispatch;
pub mod http;
pub mod kinds;
pub mod matching;
pub mod message;
pub mod payload;
pub mod sent;
pub mod tap;
pub mod watch;

use serde::{Deserialize, Serialize};

use crate::api::{EventKind, Severity};

pub use tap::{Notifier, Tap};

/// One notification on the queue: one Alert's copy of one event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Notification {
    /// Derived from the event and the Alert: the delivered-ids record and
    /// `X-Setpoint-Event-Id` carry it.
    pub id: String,
    /// The Alert's namespace (the Application's, the Provider's).
    pub namespace: String,
    pub alert: String,
    pub provider: String,
    /// The Alert's `summary`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The Alert's `eventMetadata`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metadata: Vec<(String, String)>,
    pub occurrence: Occurrence,
}

impl Notification {
    /// The queue event's key: every notification of one Provider shares a
    /// shard and a dispatch slot. `:` is in no Kubernetes name, so the key
    /// never meets an Application's.
    pub fn key(&self) -> crate::event::AppKey {
        crate::event::AppKey::new(&self.namespace, format!("notify:{}", self.provider))
    }
}

/// What happened to an Application, as its Kubernetes Event said it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Occurrence {
    pub kind: EventKind,
    /// The Kubernetes Event's reason (`DriftCorrected`, `InvalidManifest`).
    pub reason: String,
    pub severity: Severity,
    /// The Kubernetes Event's note.
    pub message: String,
    pub app: AppRef,
    /// The commit (or chart version) the Application is at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The repository or chart repository, normalized (no credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Drift set back: each field, its value before and after, who changed
    /// it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
    /// RFC 3339, when the event was emitted.
    pub timestamp: String,
}

/// The Application an occurrence is about.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppRef {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_version: String,
}

/// One field set back by a drift correction.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// `apps/v1 Deployment team/web`.
    pub object: String,
    /// `spec.replicas`; empty for an object recreated.
    pub field: String,
    /// The live value Setpoint found (`<none>` when absent).
    pub from: String,
    /// What Git says, and what it is now.
    pub to: String,
    /// The field manager that made the change (`kubectl`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notifications_round_trip_keyed_by_their_provider() {
        let notification = Notification {
            id: "n-1".into(),
            namespace: "team".into(),
            alert: "ops".into(),
            provider: "slack".into(),
            summary: Some("prod".into()),
            metadata: vec![("env".into(), "prod".into())],
            occurrence: Occurrence {
                kind: EventKind::DriftCorrected,
                reason: "DriftCorrected".into(),
                severity: Severity::Info,
                message: "spec.replicas 1→5".into(),
                app: AppRef {
                    namespace: "team".into(),
                    name: "web".into(),
                    ..Default::default()
                },
                revision: Some("a".repeat(40)),
                repository: Some("github.com/acme/deploy".into()),
                changes: vec![Change {
                    object: "apps/v1 Deployment team/web".into(),
                    field: "spec.replicas".into(),
                    from: "5".into(),
                    to: "1".into(),
                    by: Some("kubectl".into()),
                }],
                timestamp: "2026-01-01T00:00:00Z".into(),
            },
        };
        let text = serde_json::to_string(&notification).unwrap();
        assert_eq!(
            serde_json::from_str::<Notification>(&text).unwrap(),
            notification
        );
        assert_eq!(notification.key().to_string(), "team/notify:slack");
    }
}
