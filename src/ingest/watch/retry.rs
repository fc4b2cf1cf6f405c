//! The pauses of the watches after failures, and which failures are
//! refusals that retrying soon will not cure.

use super::*;

/// The pauses of one watch after failures. Short and capped low: the
/// watches are few (one per kind in use), and an API server back from a
/// restart must be watched again within seconds. kube's default backoff
/// (0.8 s doubling to 30 s, reset only by an event, which a quiet kind may
/// not have) left scales uncorrected for tens of seconds after each restart.
/// A refusal (403, or a kind the API server does not serve) is retried
/// slowly and warned about once: it lasts until someone changes RBAC or
/// installs a CRD, and the sweep still corrects what it hides.
#[derive(Debug, Default)]
pub(super) struct Retry {
    pub(super) failures: u32,
    pub(super) warned_at: Option<Instant>,
    pub(super) refusal_warned: bool,
}

/// What to do after one failure.
#[derive(Debug, PartialEq)]
pub(super) struct Pause {
    pub(super) delay: Duration,
    /// Log it as a warning (else debug): the first failure of a run of them,
    /// at most one a minute, and a refusal only once.
    pub(super) warn: bool,
}

impl Retry {
    pub(super) const FIRST: Duration = Duration::from_millis(250);
    pub(super) const MAX: Duration = Duration::from_secs(2);
    pub(super) const REFUSED: Duration = Duration::from_secs(300);
    pub(super) const WARN_EVERY: Duration = Duration::from_secs(60);

    pub(super) fn next(&mut self, refused: bool, now: Instant) -> Pause {
        self.failures = self.failures.saturating_add(1);
        if refused {
            let warn = !self.refusal_warned;
            self.refusal_warned = true;
            return Pause {
                delay: Self::REFUSED,
                warn,
            };
        }
        let warn = self
            .warned_at
            .is_none_or(|at| now.duration_since(at) >= Self::WARN_EVERY);
        if warn {
            self.warned_at = Some(now);
        }
        let doubled = Self::FIRST.saturating_mul(1 << (self.failures - 1).min(16));
        Pause {
            delay: doubled.min(Self::MAX).mul_f64(jitter()),
            warn,
        }
    }

    /// An event came through: the next failure starts short again.
    pub(super) fn reset(&mut self) {
        self.failures = 0;
        self.warned_at = None;
        self.refusal_warned = false;
    }
}

/// Whether a watcher event shows the API server answered, so that a run of
/// failures is over: the watcher says Init before every list it tries,
/// answered or not (counted as an answer, a kind that is not served warned
/// on every retry).
pub(crate) fn answered<K>(event: &kube::runtime::watcher::Event<K>) -> bool {
    !matches!(event, kube::runtime::watcher::Event::Init)
}

/// A factor in [0.5, 1], so that watches failing together do not all retry
/// at the same instant.
pub(super) fn jitter() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let random = RandomState::new().hash_one(Instant::now());
    0.5 + (random % 1001) as f64 / 2000.0
}

/// A failure that retrying soon will not cure.
pub(super) fn refused(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(error)
        | watcher::Error::WatchStartFailed(error)
        | watcher::Error::WatchFailed(error) => api_refused(error),
        watcher::Error::WatchError(status) => matches!(status.code, 403 | 404),
        watcher::Error::NoResourceVersion => false,
    }
}

pub(super) fn api_refused(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 403 | 404),
        kube::Error::Discovery(_) => true,
        _ => false,
    }
}
