//! Whether a checkout needs a fetch: the decision that keeps Git requests to
//! one per repository per push (or per sweep cycle) in a process, however
//! many Applications share the repository. Pure; the checkout gathers the
//! facts from the mirror.

use std::time::SystemTime;

/// What the checkout knows when it holds the mirror's lock.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Facts<'a> {
    /// `targetRevision` is a full commit id.
    pub(super) wants_commit: bool,
    /// The commit the revision names in the mirror now, if any.
    pub(super) local: Option<&'a str>,
    /// The commit a webhook announced for this revision.
    pub(super) announced: Option<&'a str>,
    /// The announced commit is in the mirror and an ancestor of `local`
    /// (the branch is already at or past the push).
    pub(super) announced_contained: bool,
    /// A fetch that started after this caller began waiting for the lock
    /// completed meanwhile (the single flight of concurrent checkouts).
    pub(super) fetched_while_waiting: bool,
    /// The revision must come from a fetch that started at or after this
    /// moment: when the event was published, or when its sweep cycle began.
    pub(super) fresh_since: Option<SystemTime>,
    /// When the newest completed fetch of the mirror (in this process) started.
    pub(super) last_fetch_started: Option<SystemTime>,
}

/// Why the mirror can answer without a fetch; `None`: fetch.
pub(super) fn skip_reason(facts: &Facts<'_>) -> Option<&'static str> {
    if facts.wants_commit && facts.local.is_some() {
        // A commit id names the same tree forever.
        return Some("the commit is in the mirror");
    }
    if let (Some(announced), Some(local)) = (facts.announced, facts.local)
        && announced.trim().eq_ignore_ascii_case(local)
    {
        return Some("the announced commit is in the mirror");
    }
    if facts.announced.is_some() && facts.local.is_some() && facts.announced_contained {
        return Some("the mirror is already past the announced commit");
    }
    if facts.fetched_while_waiting {
        return Some("fetched while waiting");
    }
    if facts.announced.is_some() {
        // A push names its commit: only the commit itself (above) may spare
        // the fetch, never clocks, which another process's may disagree with.
        return None;
    }
    match (facts.fresh_since, facts.last_fetch_started) {
        (Some(since), Some(fetched)) if fetched >= since => Some("fetched since the event"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const A: &str = "1111111111111111111111111111111111111111";
    const B: &str = "2222222222222222222222222222222222222222";

    fn at(seconds: u64) -> Option<SystemTime> {
        Some(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
    }

    #[test]
    fn a_commit_in_the_mirror_is_never_fetched() {
        let facts = Facts {
            wants_commit: true,
            local: Some(A),
            ..Default::default()
        };
        assert!(skip_reason(&facts).is_some());
        let missing = Facts {
            wants_commit: true,
            ..Default::default()
        };
        assert_eq!(skip_reason(&missing), None);
    }

    #[test]
    fn a_push_fetches_until_the_mirror_holds_its_commit() {
        let held = Facts {
            local: Some(A),
            announced: Some(&A.to_uppercase()),
            ..Default::default()
        };
        assert!(skip_reason(&held).is_some());
        let older = Facts {
            local: Some(B),
            announced: Some(A),
            // Clocks say fresh, but the push named another commit.
            fresh_since: at(10),
            last_fetch_started: at(20),
            ..Default::default()
        };
        assert_eq!(skip_reason(&older), None);
        let past = Facts {
            announced_contained: true,
            ..older
        };
        assert!(skip_reason(&past).is_some());
        let waited = Facts {
            fetched_while_waiting: true,
            ..older
        };
        assert!(skip_reason(&waited).is_some());
    }

    #[test]
    fn without_a_commit_a_fetch_since_the_event_is_enough() {
        let fresh = Facts {
            local: Some(A),
            fresh_since: at(10),
            last_fetch_started: at(10),
            ..Default::default()
        };
        assert!(skip_reason(&fresh).is_some());
        let stale = Facts {
            last_fetch_started: at(9),
            ..fresh
        };
        assert_eq!(skip_reason(&stale), None);
        let never = Facts {
            last_fetch_started: None,
            ..fresh
        };
        assert_eq!(skip_reason(&never), None);
        // No bound (an older event, the CLI): fetch.
        let unbounded = Facts {
            fresh_since: None,
            ..fresh
        };
        assert_eq!(skip_reason(&unbounded), None);
        // A revision the fresh fetch did not find does not exist.
        let missing = Facts {
            local: None,
            ..fresh
        };
        assert!(skip_reason(&missing).is_some());
    }
}
