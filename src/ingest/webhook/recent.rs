//! The last webhook deliveries this process received, in memory, for the
//! dashboard's Activity page: a small ring, newest first.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// Deliveries kept.
pub const KEPT: usize = 100;

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Delivery {
    /// RFC 3339.
    pub received_at: String,
    pub provider: String,
    /// As the payload names it (escaped, capped), empty when unread.
    pub repository: String,
    pub commit: String,
    pub delivery: String,
    /// `accepted`, `duplicate`, `ignored`, `unauthorized`, …
    pub outcome: String,
    /// `namespace/name` of the Applications it was routed to.
    pub applications: Vec<String>,
}

#[derive(Clone, Default)]
pub struct RecentDeliveries(Arc<Mutex<VecDeque<Delivery>>>);

impl RecentDeliveries {
    pub fn record(&self, delivery: Delivery) {
        let mut ring = self.0.lock().expect("deliveries lock");
        if ring.len() == KEPT {
            ring.pop_back();
        }
        ring.push_front(delivery);
    }

    /// Newest first.
    pub fn list(&self) -> Vec<Delivery> {
        self.0
            .lock()
            .expect("deliveries lock")
            .iter()
            .cloned()
            .collect()
    }
}

/// What the handler learnt of a delivery before routing it, kept on the
/// request until its outcome is known.
#[derive(Clone)]
struct Pushed {
    delivery: String,
    repository: String,
    commit: String,
}

/// Notes a parsed push on its request (`delivery` is its id, if any).
pub(super) fn remember(
    request: &actix_web::HttpRequest,
    delivery: Option<&str>,
    push: &super::route::Push,
) {
    use actix_web::HttpMessage;
    let repository = push
        .repo_urls
        .first()
        .map(String::as_str)
        .unwrap_or_default();
    request.extensions_mut().insert(Pushed {
        delivery: super::untrusted::Untrusted::capped(delivery.unwrap_or_default(), 100)
            .to_string(),
        repository: super::untrusted::Untrusted::capped(repository, 300).to_string(),
        commit: push.commit.clone(),
    });
}

/// The record of one delivery: what `remember` noted, if the handler got
/// that far, and its outcome.
pub(super) fn delivery(
    request: &actix_web::HttpRequest,
    provider: &str,
    outcome: &str,
    applications: Vec<String>,
) -> Delivery {
    use actix_web::HttpMessage;
    let pushed = request.extensions().get::<Pushed>().cloned();
    Delivery {
        received_at: jiff::Timestamp::now().to_string(),
        provider: provider.to_string(),
        repository: pushed
            .as_ref()
            .map(|p| p.repository.clone())
            .unwrap_or_default(),
        commit: pushed
            .as_ref()
            .map(|p| p.commit.clone())
            .unwrap_or_default(),
        delivery: pushed.map(|p| p.delivery).unwrap_or_default(),
        outcome: outcome.to_string(),
        applications,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest() {
        let recent = RecentDeliveries::default();
        for i in 0..KEPT + 5 {
            recent.record(Delivery {
                received_at: String::new(),
                provider: "github".into(),
                repository: String::new(),
                commit: String::new(),
                delivery: i.to_string(),
                outcome: "accepted".into(),
                applications: Vec::new(),
            });
        }
        let list = recent.list();
        assert_eq!(list.len(), KEPT);
        assert_eq!(list[0].delivery, (KEPT + 4).to_string());
        assert_eq!(list[KEPT - 1].delivery, "5");
    }
}
