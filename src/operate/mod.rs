//! Operating a release: suspend, sync windows, rollback (a pin) and
//! selective sync. The decisions are pure (this module, `window.rs`,
//! `rollback.rs`); the reconcile asks [`hold`] and [`pinned`] once, the
//! policy applies what they say (`reconcile::policy::hold`,
//! `reconcile::policy::select`), and the CLI (`cli/app.rs`) and the
//! dashboard (`ui/`) write `spec.suspend` and `spec.pin`.

pub mod rollback;
pub mod window;

use jiff::Timestamp;

use crate::api::{Application, ApplicationSpec, Pin};
pub use window::WindowError;

/// Why a reconcile may change nothing it finds to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// `Suspended` or `SyncWindow`: the status's reason.
    pub reason: &'static str,
    /// Prefixes each object's message: `suspended: would set …`.
    pub label: String,
    pub message: String,
    pub until: Option<Timestamp>,
}

pub const SUSPENDED: &str = "Suspended";
pub const SYNC_WINDOW: &str = "SyncWindow";

/// What a manual sync asked for, as far as holds go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Asked {
    pub manual: bool,
    /// `--override-window`.
    pub override_window: bool,
}

/// Whether this reconcile is held back: `spec.suspend` always (a manual
/// sync included); a closed sync window for automated syncs and drift
/// correction, and for a manual sync unless it overrides the window or
/// every window that holds it allows manual syncs.
pub fn hold(
    spec: &ApplicationSpec,
    now: Timestamp,
    asked: Asked,
) -> Result<Option<Hold>, WindowError> {
    if spec.suspend {
        return Ok(Some(Hold {
            reason: SUSPENDED,
            label: "suspended".into(),
            message: "spec.suspend is true: nothing is applied, pruned or corrected \
                      (setpoint app resume)"
                .into(),
            until: None,
        }));
    }
    window_hold(spec, now, asked)
}

/// The sync windows' part of [`hold`]; the CLI asks it before a manual sync.
pub fn window_hold(
    spec: &ApplicationSpec,
    now: Timestamp,
    asked: Asked,
) -> Result<Option<Hold>, WindowError> {
    if spec.sync_windows.is_empty() {
        return Ok(None);
    }
    let windows = window::parse(&spec.sync_windows)?;
    match window::state(&windows, now) {
        window::State::Open => Ok(None),
        window::State::Closed { .. } if asked.manual && asked.override_window => Ok(None),
        window::State::Closed {
            manual_sync: true, ..
        } if asked.manual => Ok(None),
        window::State::Closed { until, why, .. } => {
            let when = until.map_or(" with no opening ahead".to_string(), |t| {
                format!(" until {}", rfc3339(t))
            });
            Ok(Some(Hold {
                reason: SYNC_WINDOW,
                label: "sync window".into(),
                message: format!("syncs wait{when}: {why} (a manual sync needs --override-window)"),
                until,
            }))
        }
    }
}

/// The Application as this reconcile renders it: with a pin, its
/// `targetRevision` is the pinned one (Git's commit, or the chart's
/// version), so every source path renders the past revision from the
/// source itself, never from a stored copy.
pub fn pinned(app: &Application) -> Option<(Application, &Pin)> {
    let pin = app.spec.pin.as_ref()?;
    let mut at_pin = app.clone();
    at_pin.spec.source.target_revision = Some(pin.revision.clone());
    Some((at_pin, pin))
}

/// One object a selective sync applies (`--only KIND/NAME`, or
/// `GROUP/KIND/NAME` when two groups share a kind).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub group: Option<String>,
    pub kind: String,
    pub name: String,
}

impl std::str::FromStr for Selector {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = text.trim().split('/').collect();
        let (group, kind, name) = match parts.as_slice() {
            [kind, name] => (None, *kind, *name),
            [group, kind, name] => (Some(group.to_string()), *kind, *name),
            _ => {
                return Err(format!(
                    "--only {text:?}: expected KIND/NAME or GROUP/KIND/NAME"
                ));
            }
        };
        if kind.is_empty() || name.is_empty() {
            return Err(format!(
                "--only {text:?}: expected KIND/NAME or GROUP/KIND/NAME"
            ));
        }
        Ok(Selector {
            group,
            kind: kind.to_string(),
            name: name.to_string(),
        })
    }
}

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.group {
            Some(group) => write!(f, "{group}/{}/{}", self.kind, self.name),
            None => write!(f, "{}/{}", self.kind, self.name),
        }
    }
}

impl Selector {
    /// Kinds compare without case (`deployment/web`).
    pub fn matches(&self, id: &crate::manifest::ObjectId) -> bool {
        self.kind.eq_ignore_ascii_case(&id.kind)
            && self.name == id.name
            && self.group.as_ref().is_none_or(|g| g == &id.group)
    }
}

/// `status.pinned` for this reconcile: the pin, and a newer commit when
/// one was announced (a push's) or an earlier reconcile of the same pin
/// recorded one.
pub fn pinned_status(
    app: &Application,
    known_commit: Option<&str>,
) -> Option<crate::api::PinnedStatus> {
    let pin = app.spec.pin.as_ref()?;
    let previous = app
        .status
        .as_ref()
        .and_then(|s| s.pinned.as_ref())
        .filter(|p| p.revision == pin.revision);
    let newer = known_commit
        .filter(|c| *c != pin.revision)
        .map(str::to_string)
        .or_else(|| previous.and_then(|p| p.newer_revision.clone()));
    Some(crate::api::PinnedStatus {
        revision: pin.revision.clone(),
        by: pin.by.clone(),
        at: pin.at.clone(),
        newer_revision: newer,
    })
}

/// Whole seconds, as Kubernetes writes times.
pub fn rfc3339(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{SyncWindow, WindowKind};

    fn spec(windows: Vec<SyncWindow>) -> ApplicationSpec {
        ApplicationSpec {
            sync_windows: windows,
            ..Default::default()
        }
    }

    fn deny_all(manual_sync: bool) -> SyncWindow {
        SyncWindow {
            kind: WindowKind::Deny,
            schedule: "* * * * *".into(),
            duration: "1h".into(),
            time_zone: None,
            manual_sync,
        }
    }

    const NOW: &str = "2026-12-07T12:00:30Z";

    #[test]
    fn suspend_holds_even_a_manual_sync() {
        let mut s = spec(vec![]);
        s.suspend = true;
        let asked = Asked {
            manual: true,
            override_window: true,
        };
        let hold = hold(&s, NOW.parse().unwrap(), asked).unwrap().unwrap();
        assert_eq!(hold.reason, SUSPENDED);
        assert_eq!(hold.label, "suspended");
    }

    #[test]
    fn a_closed_window_holds_automated_syncs_and_manual_ones_without_the_override() {
        let s = spec(vec![deny_all(false)]);
        let now = NOW.parse().unwrap();
        let held = hold(&s, now, Asked::default()).unwrap().unwrap();
        assert_eq!(held.reason, SYNC_WINDOW);
        assert!(
            held.message
                .starts_with("syncs wait until 2026-12-07T13:00:00Z: inside the deny window"),
            "{}",
            held.message
        );
        let manual = Asked {
            manual: true,
            override_window: false,
        };
        assert!(hold(&s, now, manual).unwrap().is_some());
        let overriding = Asked {
            manual: true,
            override_window: true,
        };
        assert_eq!(hold(&s, now, overriding).unwrap(), None);
        // `manualSync: true` lets a manual sync through without the flag.
        let lenient = spec(vec![deny_all(true)]);
        assert_eq!(hold(&lenient, now, manual).unwrap(), None);
        assert!(hold(&lenient, now, Asked::default()).unwrap().is_some());
        // The override is for a manual sync only.
        let automated_override = Asked {
            manual: false,
            override_window: true,
        };
        assert!(hold(&s, now, automated_override).unwrap().is_some());
    }

    #[test]
    fn selectors_name_a_kind_and_a_name() {
        let s: Selector = "deployment/web".parse().unwrap();
        let id = crate::manifest::ObjectId {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: Some("shop".into()),
            name: "web".into(),
        };
        assert!(s.matches(&id));
        assert!(
            "apps/Deployment/web"
                .parse::<Selector>()
                .unwrap()
                .matches(&id)
        );
        assert!(
            !"batch/Deployment/web"
                .parse::<Selector>()
                .unwrap()
                .matches(&id)
        );
        assert!(!"Deployment/api".parse::<Selector>().unwrap().matches(&id));
        assert!("web".parse::<Selector>().is_err());
        assert!("Deployment/".parse::<Selector>().is_err());
    }

    #[test]
    fn a_pin_renders_the_pinned_revision() {
        let mut app = Application::new("web", spec(vec![]));
        app.spec.source.target_revision = Some("main".into());
        assert!(pinned(&app).is_none());
        app.spec.pin = Some(Pin {
            revision: "a".repeat(40),
            ..Default::default()
        });
        let (at_pin, pin) = pinned(&app).unwrap();
        assert_eq!(at_pin.spec.source.target_revision, Some("a".repeat(40)));
        assert_eq!(pin.revision, "a".repeat(40));
    }
}
