//! Which revision `setpoint app rollback` goes back to. Pure.

use crate::api::{ApplicationStatus, OperationSummary};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RollbackError {
    #[error(
        "no earlier revision of status.history was Synced and Healthy (history: {history}); name one: setpoint app rollback NAMESPACE/NAME REVISION|HISTORY-ID"
    )]
    NoHealthyRevision { history: String },
    #[error("no history entry {id} (history: {history})")]
    NoSuchEntry { id: u64, history: String },
}

/// What to roll back to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// A revision the history holds (by id, commit or its prefix).
    Entry { revision: String, id: u64 },
    /// A full commit id the history does not hold.
    Commit(String),
    /// A name Git resolves (a tag, a branch, a short commit id).
    Resolve(String),
}

/// `wanted` is a history id (digits), a commit id or its prefix of at
/// least seven characters that the history holds, another commit id, or a
/// tag or branch; none is the newest history entry that was Synced and
/// Healthy at another revision than the one applied now.
pub fn choose(
    status: Option<&ApplicationStatus>,
    wanted: Option<&str>,
) -> Result<Choice, RollbackError> {
    let history: &[OperationSummary] = status.map_or(&[], |s| &s.history);
    let listed = || {
        if history.is_empty() {
            return "empty".to_string();
        }
        history
            .iter()
            .map(|h| {
                format!(
                    "{} {}{}",
                    h.id,
                    &h.revision[..h.revision.len().min(7)],
                    if h.healthy { " healthy" } else { "" }
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let entry = |h: &OperationSummary| Choice::Entry {
        revision: h.revision.clone(),
        id: h.id,
    };
    let Some(wanted) = wanted.map(str::trim).filter(|w| !w.is_empty()) else {
        let current = status.and_then(|s| {
            s.last_applied_revision
                .as_deref()
                .or(s.sync.revision.as_deref())
        });
        return history
            .iter()
            .find(|h| h.healthy && Some(h.revision.as_str()) != current)
            .map(entry)
            .ok_or_else(|| RollbackError::NoHealthyRevision { history: listed() });
    };
    if wanted.len() <= 10 && wanted.chars().all(|c| c.is_ascii_digit()) {
        let id: u64 = wanted.parse().unwrap_or(0);
        return history
            .iter()
            .find(|h| h.id == id)
            .map(entry)
            .ok_or_else(|| RollbackError::NoSuchEntry {
                id,
                history: listed(),
            });
    }
    if wanted.len() >= 7
        && let Some(h) = history.iter().find(|h| h.revision.starts_with(wanted))
    {
        return Ok(entry(h));
    }
    if wanted.len() == 40 && wanted.chars().all(|c| c.is_ascii_hexdigit()) {
        return Ok(Choice::Commit(wanted.to_ascii_lowercase()));
    }
    Ok(Choice::Resolve(wanted.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(id: u64, c: char, healthy: bool) -> OperationSummary {
        OperationSummary {
            id,
            revision: c.to_string().repeat(40),
            healthy,
            ..Default::default()
        }
    }

    fn status(current: char, history: Vec<OperationSummary>) -> ApplicationStatus {
        ApplicationStatus {
            last_applied_revision: Some(current.to_string().repeat(40)),
            history,
            ..Default::default()
        }
    }

    #[test]
    fn the_default_is_the_newest_healthy_revision_before_the_current_one() {
        // 3 is the bad one applied now; 2 never became healthy; 1 did.
        let s = status(
            'c',
            vec![op(3, 'c', false), op(2, 'b', false), op(1, 'a', true)],
        );
        assert_eq!(
            choose(Some(&s), None).unwrap(),
            Choice::Entry {
                revision: "a".repeat(40),
                id: 1
            }
        );
        // The current revision, healthy or not, is never the target.
        let s = status('c', vec![op(2, 'c', true), op(1, 'a', false)]);
        let e = choose(Some(&s), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no earlier revision of status.history was Synced and Healthy (history: 2 ccccccc healthy, 1 aaaaaaa); name one: setpoint app rollback NAMESPACE/NAME REVISION|HISTORY-ID"
        );
        assert!(matches!(
            choose(None, None),
            Err(RollbackError::NoHealthyRevision { .. })
        ));
    }

    #[test]
    fn a_history_id_a_commit_prefix_a_commit_or_a_name() {
        let s = status(
            'c',
            vec![op(3, 'c', false), op(2, 'b', false), op(1, 'a', true)],
        );
        assert_eq!(
            choose(Some(&s), Some("2")).unwrap(),
            Choice::Entry {
                revision: "b".repeat(40),
                id: 2
            }
        );
        assert!(matches!(
            choose(Some(&s), Some("9")),
            Err(RollbackError::NoSuchEntry { id: 9, .. })
        ));
        assert_eq!(
            choose(Some(&s), Some("bbbbbbb")).unwrap(),
            Choice::Entry {
                revision: "b".repeat(40),
                id: 2
            }
        );
        let other = "D".repeat(40);
        assert_eq!(
            choose(Some(&s), Some(&other)).unwrap(),
            Choice::Commit("d".repeat(40))
        );
        assert_eq!(
            choose(Some(&s), Some("v1.2.0")).unwrap(),
            Choice::Resolve("v1.2.0".into())
        );
    }
}
