//! Which Alerts an event goes to, and whether a rate limit holds it back
//! (pure). An Alert sees only the Applications of its own namespace; a
//! source matches by name (`*` for all) and by labels, both when both are
//! set; `eventSeverity: error` keeps the failures only, as Flux's does;
//! empty `eventKinds` means every kind.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::api::{AlertSpec, EventKind, Severity};

/// The Application an event is about, as an Alert selects it.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

/// Whether the Alert of `alert_namespace` sends `kind` of `severity` about
/// `app`.
pub fn matches(
    alert_namespace: &str,
    alert: &AlertSpec,
    app: Subject<'_>,
    kind: EventKind,
    severity: Severity,
) -> bool {
    if alert.suspend || alert_namespace != app.namespace {
        return false;
    }
    if alert.event_severity == Severity::Error && severity != Severity::Error {
        return false;
    }
    if !alert.event_kinds.is_empty() && !alert.event_kinds.contains(&kind) {
        return false;
    }
    alert.event_sources.iter().any(|source| {
        source.kind == "Application"
            && source
                .name
                .as_deref()
                .is_none_or(|name| name == "*" || name == app.name)
            && (source.name.is_some() || !source.match_labels.is_empty())
            && source
                .match_labels
                .iter()
                .all(|(key, value)| app.labels.get(key) == Some(value))
    })
}

/// The Alert's `rateLimit`, or an error naming the bad value.
pub fn rate_limit(alert: &AlertSpec) -> Result<Option<Duration>, String> {
    match alert.rate_limit.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => crate::serve::parse_duration(text)
            .map(Some)
            .map_err(|e| format!("spec.rateLimit: {e}")),
    }
}

/// When each (Alert, Application, kind) was last let through.
#[derive(Debug, Default)]
pub struct RateLimits {
    last: HashMap<(String, String, EventKind), Instant>,
}

/// Remembered entries past which old ones are swept out.
const SWEEP_ABOVE: usize = 10_000;

impl RateLimits {
    /// Whether an event of `kind` about `app` may go out through `alert`
    /// at `now`, at most one per `interval`; records it when it may.
    pub fn allow(
        &mut self,
        alert: &str,
        app: &str,
        kind: EventKind,
        interval: Duration,
        now: Instant,
    ) -> bool {
        let key = (alert.to_string(), app.to_string(), kind);
        if let Some(last) = self.last.get(&key)
            && now.saturating_duration_since(*last) < interval
        {
            return false;
        }
        if self.last.len() > SWEEP_ABOVE {
            // Entries older than an hour limit nothing any rate limit
            // worth having would.
            self.last
                .retain(|_, at| now.saturating_duration_since(*at) < Duration::from_secs(3600));
        }
        self.last.insert(key, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{EventSource, LocalRef};

    fn alert(sources: Vec<EventSource>) -> AlertSpec {
        AlertSpec {
            provider_ref: LocalRef {
                name: "slack".into(),
            },
            event_severity: Severity::Info,
            event_sources: sources,
            event_kinds: vec![],
            summary: None,
            event_metadata: BTreeMap::new(),
            rate_limit: None,
            suspend: false,
        }
    }

    fn by_name(name: &str) -> EventSource {
        EventSource {
            kind: "Application".into(),
            name: Some(name.into()),
            match_labels: BTreeMap::new(),
        }
    }

    fn by_labels(labels: &[(&str, &str)]) -> EventSource {
        EventSource {
            kind: "Application".into(),
            name: None,
            match_labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    fn web(labels: &BTreeMap<String, String>) -> Subject<'_> {
        Subject {
            namespace: "team",
            name: "web",
            labels,
        }
    }

    #[test]
    fn sources_match_by_name_star_or_labels_in_the_alerts_namespace() {
        let labels: BTreeMap<String, String> = [("tier".to_string(), "front".to_string())].into();
        let info = Severity::Info;
        let kind = EventKind::Synced;
        assert!(matches(
            "team",
            &alert(vec![by_name("web")]),
            web(&labels),
            kind,
            info
        ));
        assert!(matches(
            "team",
            &alert(vec![by_name("*")]),
            web(&labels),
            kind,
            info
        ));
        assert!(!matches(
            "team",
            &alert(vec![by_name("api")]),
            web(&labels),
            kind,
            info
        ));
        assert!(
            !matches(
                "other",
                &alert(vec![by_name("*")]),
                web(&labels),
                kind,
                info
            ),
            "another namespace's Alert sees nothing of this one"
        );
        let front = alert(vec![by_labels(&[("tier", "front")])]);
        assert!(matches("team", &front, web(&labels), kind, info));
        let back = alert(vec![by_labels(&[("tier", "back")])]);
        assert!(!matches("team", &back, web(&labels), kind, info));
        let both = alert(vec![EventSource {
            name: Some("api".into()),
            ..by_labels(&[("tier", "front")])
        }]);
        assert!(!matches("team", &both, web(&labels), kind, info));
        let empty = alert(vec![by_labels(&[])]);
        assert!(
            !matches("team", &empty, web(&labels), kind, info),
            "a source naming nothing selects nothing"
        );
        let other_kind = alert(vec![EventSource {
            kind: "Kustomization".into(),
            ..by_name("*")
        }]);
        assert!(!matches("team", &other_kind, web(&labels), kind, info));
    }

    #[test]
    fn severity_kinds_and_suspend_filter() {
        let labels = BTreeMap::new();
        let mut errors = alert(vec![by_name("*")]);
        errors.event_severity = Severity::Error;
        assert!(!matches(
            "team",
            &errors,
            web(&labels),
            EventKind::Synced,
            Severity::Info
        ));
        assert!(matches(
            "team",
            &errors,
            web(&labels),
            EventKind::SyncFailed,
            Severity::Error
        ));
        let mut drift = alert(vec![by_name("*")]);
        drift.event_kinds = vec![EventKind::DriftCorrected];
        assert!(matches(
            "team",
            &drift,
            web(&labels),
            EventKind::DriftCorrected,
            Severity::Info
        ));
        assert!(!matches(
            "team",
            &drift,
            web(&labels),
            EventKind::Synced,
            Severity::Info
        ));
        drift.suspend = true;
        assert!(!matches(
            "team",
            &drift,
            web(&labels),
            EventKind::DriftCorrected,
            Severity::Info
        ));
    }

    #[test]
    fn a_rate_limit_lets_one_per_app_and_kind_through_per_interval() {
        let mut limits = RateLimits::default();
        let start = Instant::now();
        let minute = Duration::from_secs(60);
        let drift = EventKind::DriftCorrected;
        assert!(limits.allow("team/ops", "team/web", drift, minute, start));
        assert!(!limits.allow(
            "team/ops",
            "team/web",
            drift,
            minute,
            start + Duration::from_secs(30)
        ));
        assert!(
            limits.allow("team/ops", "team/api", drift, minute, start),
            "another app"
        );
        assert!(
            limits.allow("team/ops", "team/web", EventKind::Synced, minute, start),
            "another kind"
        );
        assert!(
            limits.allow("team/dev", "team/web", drift, minute, start),
            "another alert"
        );
        assert!(limits.allow("team/ops", "team/web", drift, minute, start + minute));
    }

    #[test]
    fn rate_limits_parse_as_durations() {
        let mut spec = alert(vec![]);
        assert_eq!(rate_limit(&spec), Ok(None));
        spec.rate_limit = Some("1m".into());
        assert_eq!(rate_limit(&spec), Ok(Some(Duration::from_secs(60))));
        spec.rate_limit = Some("soon".into());
        assert!(rate_limit(&spec).unwrap_err().contains("spec.rateLimit"));
    }
}
