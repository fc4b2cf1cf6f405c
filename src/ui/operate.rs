//! The dashboard's Rollback, Suspend and Resume (issue 30): what each
//! writes to the Application's spec is decided here without I/O (`pin_for`,
//! `patch_of`); the merge patch that writes it goes out with the dashboard
//! process's own client, once `UiState::act` has checked (by
//! SubjectAccessReview) that the viewer may patch the Application. A
//! rollback picks its revision from the history the API server holds at
//! that moment and writes the pin on that version of the Application only
//! (its resourceVersion), so a history that changed meanwhile is read
//! again rather than overruled.

use std::time::Duration;

use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::UiError;
use crate::api::{Application, ApplicationStatus, Pin};
use crate::event::AppKey;
use crate::operate::rollback::{self, Choice};

/// The field manager of the dashboard's writes.
pub const FIELD_MANAGER: &str = "setpoint-dashboard";

/// How often a rollback reads the Application again when it changed
/// between the read and the write.
const ATTEMPTS: usize = 3;

/// How long a rollback waits for the watch's index to hold its pin before
/// it publishes the sync anyway (the spec change is an event of its own).
pub const INDEX_WAIT: Duration = Duration::from_secs(5);

/// What one action writes to `spec`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Suspend,
    /// No suspension and no pin: follow `targetRevision` again.
    Resume,
    /// Held at a past revision; a rollback also ends a suspension.
    Pin(Pin),
}

/// Why a rollback was refused before anything was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// No revision to go back to (`choose`'s message): 409.
    Conflict(String),
    /// A tag or branch name: resolving it takes Git, which the dashboard
    /// does not run: 400.
    Named(String),
}

/// The pin a rollback writes: `wanted` (a history id, a commit id or a
/// prefix of one the history holds; for a chart, a version), else the
/// newest history entry that was Synced and Healthy before the current one.
pub fn pin_for(
    status: Option<&ApplicationStatus>,
    wanted: Option<&str>,
    chart: bool,
    by: &str,
    at: String,
) -> Result<Pin, Refused> {
    let wanted = wanted.map(str::trim).filter(|w| !w.is_empty());
    let (revision, history_id) = match rollback::choose(status, wanted) {
        Ok(Choice::Entry { revision, id }) => (revision, Some(id)),
        Ok(Choice::Commit(commit)) => (commit, None),
        // A chart's revision is its version: nothing to resolve.
        Ok(Choice::Resolve(version)) if chart => (version, None),
        Ok(Choice::Resolve(named)) => return Err(Refused::Named(named)),
        Err(error) => return Err(Refused::Conflict(error.to_string())),
    };
    Ok(Pin {
        revision,
        by: (!by.is_empty()).then(|| by.to_string()),
        at: Some(at),
        history_id,
    })
}

/// The merge patch of one change; `resource_version` makes the API server
/// refuse it (409) when the Application changed since it was read.
pub fn patch_of(change: &Change, resource_version: Option<&str>) -> Value {
    let spec = match change {
        Change::Suspend => json!({ "suspend": true }),
        Change::Resume => json!({ "suspend": false, "pin": null }),
        Change::Pin(pin) => json!({ "suspend": false, "pin": pin }),
    };
    match resource_version {
        Some(version) => json!({ "metadata": { "resourceVersion": version }, "spec": spec }),
        None => json!({ "spec": spec }),
    }
}

fn api(client: &Client, key: &AppKey) -> Api<Application> {
    Api::namespaced(client.clone(), &key.namespace)
}

fn write_error(key: &AppKey, error: kube::Error) -> UiError {
    match error {
        kube::Error::Api(status) if status.code == 404 => UiError::NotFound(key.clone()),
        source => UiError::Write {
            app: key.clone(),
            source,
        },
    }
}

/// Writes `change` (suspend, resume) as it is, whatever the Application
/// holds now.
pub async fn write(client: &Client, key: &AppKey, change: &Change) -> Result<(), UiError> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    api(client, key)
        .patch(&key.name, &params, &Patch::Merge(patch_of(change, None)))
        .await
        .map_err(|error| write_error(key, error))?;
    Ok(())
}

/// Reads the Application, picks the pin from its history and writes it on
/// that version; reads again when another write came between.
pub async fn rollback(
    client: &Client,
    key: &AppKey,
    wanted: Option<&str>,
    by: &str,
) -> Result<Pin, UiError> {
    let api = api(client, key);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let app = api
            .get_opt(&key.name)
            .await
            .map_err(|error| write_error(key, error))?
            .ok_or_else(|| UiError::NotFound(key.clone()))?;
        let at = crate::operate::rfc3339(jiff::Timestamp::now());
        let chart = app.spec.source.chart.is_some();
        let pin =
            pin_for(app.status.as_ref(), wanted, chart, by, at).map_err(
                |refused| match refused {
                    Refused::Conflict(message) => UiError::Rollback {
                        app: key.clone(),
                        message,
                    },
                    Refused::Named(named) => UiError::NamedRevision { named },
                },
            )?;
        let patch = patch_of(
            &Change::Pin(pin.clone()),
            app.metadata.resource_version.as_deref(),
        );
        match api.patch(&key.name, &params, &Patch::Merge(patch)).await {
            Ok(_) => return Ok(pin),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < ATTEMPTS => continue,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                return Err(UiError::Rollback {
                    app: key.clone(),
                    message: "it changed while the rollback was written; try again".into(),
                });
            }
            Err(error) => return Err(write_error(key, error)),
        }
    }
}

/// Waits (at most `within`) until the watch's index holds `pin`, so that
/// a worker of this process that takes the Application from it renders the
/// pinned revision; whether it did.
pub async fn indexed(
    store: &Store<Application>,
    key: &AppKey,
    pin: &Pin,
    within: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let reference = ObjectRef::new(&key.name).within(&key.namespace);
    loop {
        if store
            .get(&reference)
            .is_some_and(|app| app.spec.pin.as_ref() == Some(pin))
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        // The index has no per-object notification; the watch delivers a
        // write back within milliseconds.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::OperationSummary;

    fn op(id: u64, c: char, healthy: bool) -> OperationSummary {
        OperationSummary {
            id,
            revision: c.to_string().repeat(40),
            healthy,
            ..Default::default()
        }
    }

    fn status() -> ApplicationStatus {
        // 3 is the bad one applied now, 2 never became healthy, 1 did.
        ApplicationStatus {
            last_applied_revision: Some("c".repeat(40)),
            history: vec![op(3, 'c', false), op(2, 'b', false), op(1, 'a', true)],
            ..Default::default()
        }
    }

    const AT: &str = "2026-12-07T12:00:00Z";

    #[test]
    fn rollback_pins_the_last_healthy_revision_with_who_and_when() {
        let pin = pin_for(Some(&status()), None, false, "alice", AT.into()).unwrap();
        assert_eq!(
            pin,
            Pin {
                revision: "a".repeat(40),
                by: Some("alice".into()),
                at: Some(AT.into()),
                history_id: Some(1),
            }
        );
        assert_eq!(
            patch_of(&Change::Pin(pin), Some("42")),
            json!({
                "metadata": { "resourceVersion": "42" },
                "spec": {
                    "suspend": false,
                    "pin": {
                        "revision": "a".repeat(40),
                        "by": "alice",
                        "at": AT,
                        "historyId": 1,
                    },
                },
            })
        );
    }

    #[test]
    fn a_named_history_id_or_commit_is_pinned_and_a_branch_is_refused() {
        let by_id = pin_for(Some(&status()), Some(" 2 "), false, "bob", AT.into()).unwrap();
        assert_eq!(
            (by_id.revision, by_id.history_id),
            ("b".repeat(40), Some(2))
        );
        let by_prefix = pin_for(Some(&status()), Some("aaaaaaa"), false, "bob", AT.into()).unwrap();
        assert_eq!(by_prefix.history_id, Some(1));
        let other = "d".repeat(40);
        let by_commit = pin_for(Some(&status()), Some(&other), false, "bob", AT.into()).unwrap();
        assert_eq!((by_commit.revision, by_commit.history_id), (other, None));
        assert_eq!(
            pin_for(Some(&status()), Some("release-1"), false, "bob", AT.into()),
            Err(Refused::Named("release-1".into()))
        );
        // A chart's revision is a version: pinned as named.
        let chart = pin_for(Some(&status()), Some("1.2.3"), true, "bob", AT.into()).unwrap();
        assert_eq!((chart.revision.as_str(), chart.history_id), ("1.2.3", None));
        // An empty field is no revision named.
        let empty = pin_for(Some(&status()), Some(""), false, "bob", AT.into()).unwrap();
        assert_eq!(empty.history_id, Some(1));
    }

    #[test]
    fn no_healthy_revision_or_no_such_entry_is_a_conflict_with_choose_s_message() {
        let Err(Refused::Conflict(message)) = pin_for(None, None, false, "alice", AT.into()) else {
            panic!("a conflict");
        };
        assert!(
            message.starts_with(
                "no earlier revision of status.history was Synced and Healthy (history: empty)"
            ),
            "{message}"
        );
        let Err(Refused::Conflict(message)) =
            pin_for(Some(&status()), Some("9"), false, "alice", AT.into())
        else {
            panic!("a conflict");
        };
        assert!(message.starts_with("no history entry 9"), "{message}");
    }

    #[test]
    fn suspend_and_resume_patch_the_spec_only() {
        assert_eq!(
            patch_of(&Change::Suspend, None),
            json!({ "spec": { "suspend": true } })
        );
        assert_eq!(
            patch_of(&Change::Resume, None),
            json!({ "spec": { "suspend": false, "pin": null } })
        );
    }
}
