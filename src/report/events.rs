//! Kubernetes Events on the Application: synced to a revision, drift
//! corrected (field, old → new, who changed it), objects pruned, errors with
//! their whole chain. Only emitted when something happened, so an in-sync
//! reconcile writes no Event.
//!
//! An `Events` given a tap (`notify::Tap`) also hands each Event to the
//! Alerts that select it: the notifications are fed from here, as Flux's
//! alerts are fed by its controllers' events.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::api::Application;

/// The API server caps an Event's note at 1 kB.
const NOTE_LIMIT: usize = 1000;

pub struct Events {
    recorder: Recorder,
    reference: k8s_openapi::api::core::v1::ObjectReference,
    tap: Option<crate::notify::Tap>,
}

impl Events {
    pub fn new(client: kube::Client, reporter: Reporter, app: &Application) -> Self {
        Self::on(client, reporter, app.object_ref(&()))
    }

    /// Events on any object (an ApplicationSet).
    pub fn on(
        client: kube::Client,
        reporter: Reporter,
        reference: k8s_openapi::api::core::v1::ObjectReference,
    ) -> Self {
        Self {
            recorder: Recorder::new(client, reporter),
            reference,
            tap: None,
        }
    }

    /// Also hands every Event to the notifications' tap.
    pub fn with_tap(mut self, tap: Option<crate::notify::Tap>) -> Self {
        self.tap = tap;
        self
    }

    /// The revision the reconcile resolved, which notifications name.
    pub fn at_revision(&self, revision: &str) {
        if let Some(tap) = &self.tap {
            tap.at_revision(revision);
        }
    }

    pub async fn normal(&self, reason: &str, action: &str, note: String) {
        self.publish(EventType::Normal, reason, action, note, false, &[])
            .await;
    }

    pub async fn warning(&self, reason: &str, action: &str, note: String) {
        self.publish(EventType::Warning, reason, action, note, false, &[])
            .await;
    }

    /// A Normal Event with the fields a drift correction set back, which
    /// the notifications list one by one.
    pub async fn changed(
        &self,
        reason: &str,
        action: &str,
        note: String,
        changes: &[crate::notify::Change],
    ) {
        self.publish(EventType::Normal, reason, action, note, false, changes)
            .await;
    }

    /// A failed reconcile's Warning: `stalled` when it waits for a change
    /// (its Stalled condition), else it is retried.
    pub async fn failed(&self, reason: &str, action: &str, note: String, stalled: bool) {
        self.publish(EventType::Warning, reason, action, note, stalled, &[])
            .await;
    }

    async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
        stalled: bool,
        changes: &[crate::notify::Change],
    ) {
        let note = truncate(&note, NOTE_LIMIT);
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.clone()),
            action: action.into(),
            secondary: None,
        };
        // An Event that cannot be written must not fail the reconcile.
        if let Err(error) = self.recorder.publish(&event, &self.reference).await {
            tracing::warn!(%error, reason, "failed to publish an event");
        }
        if let Some(tap) = &self.tap {
            let emitted = crate::notify::kinds::Emitted {
                reason,
                action,
                warning: type_ == EventType::Warning,
                stalled,
            };
            tap.emit(emitted, &note, changes).await;
        }
    }
}

/// `error: cause: cause`, the whole chain.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut chain = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !chain.contains(&text) {
            chain.push_str(": ");
            chain.push_str(&text);
        }
        source = cause.source();
    }
    chain
}

/// At most `limit` bytes, cut on a character boundary, with an ellipsis.
pub fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit.saturating_sub(3);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("failed to fetch repo")]
    struct Outer(#[source] Inner);
    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Inner;

    #[test]
    fn the_chain_joins_every_cause_once() {
        assert_eq!(
            error_chain(&Outer(Inner)),
            "failed to fetch repo: connection refused"
        );
    }

    #[test]
    fn truncation_respects_characters() {
        assert_eq!(truncate("abc", 10), "abc");
        let long = "é".repeat(600);
        let cut = truncate(&long, 1000);
        assert!(cut.len() <= 1000 && cut.ends_with("..."));
    }
}
