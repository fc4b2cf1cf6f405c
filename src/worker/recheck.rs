//! Re-checks: a reconcile that leaves something progressing asks for a
//! look back later (a `Requeue` event, published after `requeue_after`).
//! The watch often answers first: the object turning healthy is a drift
//! event, and its reconcile records the health. The re-check, queued
//! behind a backlog, would then reconcile an Application that no longer
//! moves. So this process remembers the re-checks it published, and when
//! each Application's last reconcile that left nothing progressing started;
//! a batch made only of re-checks asked for before that start is answered
//! already, and is acknowledged without a reconcile.
//!
//! Only this process's own re-checks are recognised: one published by
//! another process (before the Application's shard moved here) is
//! reconciled as before. Forgetting (past the bound, or on a restart)
//! costs a reconcile, never a missed one.

use std::collections::HashMap;
use std::time::Instant;

use crate::event::{AppKey, Cause, Event};

/// Past this many entries a map is cleared.
const BOUND: usize = 100_000;

#[derive(Default)]
pub(super) struct Rechecks {
    /// Applications with a re-check scheduled, and when a reconcile last
    /// asked for it (a later ask joins the scheduled one).
    scheduled: HashMap<AppKey, Instant>,
    /// Requeue event id → when the reconcile that asked for it ended.
    published: HashMap<String, Instant>,
    /// Per Application, when its latest reconcile that asked for no
    /// re-check started.
    settled: HashMap<AppKey, Instant>,
}

impl Rechecks {
    /// A reconcile of `app` that ended now asks for a re-check: whether it
    /// is the first ask (the caller then schedules one; a later ask joins
    /// it, as of its own time).
    pub(super) fn ask(&mut self, app: &AppKey) -> bool {
        self.ask_at(app, Instant::now())
    }

    fn ask_at(&mut self, app: &AppKey, at: Instant) -> bool {
        self.scheduled.insert(app.clone(), at).is_none()
    }

    /// The scheduled re-check of `app` is due: its event, remembered as
    /// asked for at the latest ask (publish it next).
    pub(super) fn due(&mut self, app: &AppKey, fresh_since: Option<u64>) -> Event {
        let asked = self.scheduled.remove(app).unwrap_or_else(Instant::now);
        let event = Event::new(app.clone(), Cause::Requeue).with_fresh_since(fresh_since);
        if self.published.len() >= BOUND {
            self.published.clear();
        }
        self.published.insert(event.id.clone(), asked);
        event
    }

    /// A reconcile of `app` that started at `started` left nothing
    /// progressing.
    pub(super) fn settled(&mut self, app: &AppKey, started: Instant) {
        if self.settled.len() >= BOUND && !self.settled.contains_key(app) {
            self.settled.clear();
        }
        let at = self.settled.entry(app.clone()).or_insert(started);
        *at = (*at).max(started);
    }

    /// Whether `batch` (the events of one Application's next reconcile) is
    /// only re-checks of this process's that a later reconcile answered.
    /// Each re-check it names is forgotten either way.
    pub(super) fn answered<'a>(&mut self, batch: impl IntoIterator<Item = &'a Event>) -> bool {
        let mut answered = true;
        let mut any = false;
        for event in batch {
            any = true;
            if !matches!(event.cause, Cause::Requeue) {
                answered = false;
                continue;
            }
            let asked = self.published.remove(&event.id);
            let settled = self.settled.get(&event.app);
            answered &=
                matches!((asked, settled), (Some(asked), Some(settled)) if *settled > asked);
        }
        any && answered
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn app(name: &str) -> AppKey {
        AppKey::new("team-a", name)
    }

    /// The re-check of `app` asked for at `at`, published.
    fn asked_at(rechecks: &mut Rechecks, app: &AppKey, at: Instant) -> Event {
        assert!(rechecks.ask_at(app, at), "no re-check was scheduled");
        rechecks.due(app, None)
    }

    #[test]
    fn a_recheck_is_answered_by_a_later_settled_reconcile_only() {
        let mut rechecks = Rechecks::default();
        let t0 = Instant::now();
        let later = |s: u64| t0 + Duration::from_secs(s);

        // Asked for at t0+1; a reconcile that started at t0 (before) settled.
        let requeue = asked_at(&mut rechecks, &app("a"), later(1));
        rechecks.settled(&app("a"), t0);
        assert!(!rechecks.answered([&requeue]));
        // Its id is forgotten once looked at: a second look reconciles.
        rechecks.settled(&app("a"), later(2));
        assert!(!rechecks.answered([&requeue]));

        // A reconcile that started after it was asked for answers it.
        let requeue = asked_at(&mut rechecks, &app("a"), later(3));
        rechecks.settled(&app("a"), later(4));
        // An earlier start recorded afterwards does not move the time back.
        rechecks.settled(&app("a"), later(1));
        assert!(rechecks.answered([&requeue]));

        // Another Application's settling does not answer it.
        let requeue = asked_at(&mut rechecks, &app("b"), later(5));
        rechecks.settled(&app("a"), later(6));
        assert!(!rechecks.answered([&requeue]));

        // A re-check this process did not publish is reconciled.
        let foreign = Event::new(app("a"), Cause::Requeue);
        assert!(!rechecks.answered([&foreign]));

        // A batch with any other event is reconciled, and empty batches are
        // not answered.
        let requeue = asked_at(&mut rechecks, &app("a"), later(7));
        rechecks.settled(&app("a"), later(8));
        let manual = Event::new(app("a"), Cause::Manual);
        assert!(!rechecks.answered([&requeue, &manual]));
        assert!(!rechecks.answered(std::iter::empty()));

        // Two answered re-checks of one Application in one batch.
        let first = asked_at(&mut rechecks, &app("a"), later(9));
        let second = asked_at(&mut rechecks, &app("a"), later(10));
        rechecks.settled(&app("a"), later(11));
        assert!(rechecks.answered([&first, &second]));
    }

    #[test]
    fn a_later_ask_joins_the_scheduled_recheck_as_of_its_own_time() {
        let mut rechecks = Rechecks::default();
        let t0 = Instant::now();
        let later = |s: u64| t0 + Duration::from_secs(s);
        assert!(rechecks.ask_at(&app("a"), later(1)));
        // A second progressing reconcile ended at t0+3: no second schedule.
        assert!(!rechecks.ask_at(&app("a"), later(3)));
        let requeue = rechecks.due(&app("a"), None);
        // A reconcile that started between the two asks does not answer it.
        rechecks.settled(&app("a"), later(2));
        assert!(!rechecks.answered([&requeue]));
        // Once due, the next ask schedules anew.
        assert!(rechecks.ask_at(&app("a"), later(4)));
        let requeue = rechecks.due(&app("a"), None);
        rechecks.settled(&app("a"), later(5));
        assert!(rechecks.answered([&requeue]));
    }
}
