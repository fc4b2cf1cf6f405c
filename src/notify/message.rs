//! What a notification says, before any Provider's format (pure): a title
//! naming the Application and what happened, the Event's text, the fields
//! a drift correction set back (old → new, who), the revision with a link
//! to the commit when the repository is on GitHub or GitLab, and for a
//! failure what to do next.

use crate::api::{EventKind, Severity};
use crate::notify::{Change, Notification};

/// One notification's content; `payload.rs` encodes it per Provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `Drift corrected: team/web`.
    pub title: String,
    /// The Alert's summary, when it has one.
    pub summary: Option<String>,
    /// The Kubernetes Event's note.
    pub text: String,
    pub severity: Severity,
    /// The fields set back, one line each.
    pub changes: Vec<Change>,
    /// `(name, value)` pairs: Application, revision, repository, reason,
    /// the Alert's metadata.
    pub facts: Vec<(String, String)>,
    /// The revision, short, and a link to its commit when one can be made.
    pub revision: Option<(String, Option<String>)>,
    /// For a failure: what to do.
    pub advice: Option<String>,
}

/// The title of `kind`.
fn headline(kind: EventKind) -> &'static str {
    match kind {
        EventKind::Synced => "Synced",
        EventKind::SyncFailed => "Sync failed",
        EventKind::DriftCorrected => "Drift corrected",
        EventKind::HealthDegraded => "Health degraded",
        EventKind::HealthRecovered => "Health recovered",
        EventKind::Stalled => "Stalled",
        EventKind::HookFailed => "Hook failed",
        EventKind::PreviewPosted => "Preview posted",
    }
}

/// Builds what `notification` says.
pub fn build(notification: &Notification) -> Message {
    let occurrence = &notification.occurrence;
    let app = format!("{}/{}", occurrence.app.namespace, occurrence.app.name);
    let revision = occurrence.revision.as_deref().map(|revision| {
        let link = occurrence
            .repository
            .as_deref()
            .and_then(|repository| commit_link(repository, revision));
        (short(revision), link)
    });
    let mut facts = vec![("Application".to_string(), app.clone())];
    if let Some((short, _)) = &revision {
        facts.push(("Revision".into(), short.clone()));
    }
    if let Some(repository) = &occurrence.repository {
        facts.push(("Repository".into(), repository.clone()));
    }
    facts.push(("Reason".into(), occurrence.reason.clone()));
    facts.extend(notification.metadata.iter().cloned());
    Message {
        title: format!("{}: {app}", headline(occurrence.kind)),
        summary: notification.summary.clone(),
        text: occurrence.message.clone(),
        severity: occurrence.severity,
        changes: occurrence.changes.clone(),
        facts,
        revision,
        advice: advice(
            occurrence.kind,
            &occurrence.reason,
            &occurrence.app.namespace,
            &occurrence.app.name,
        ),
    }
}

/// `spec.replicas: 5 → 1 (changed by kubectl)`, or the object recreated.
pub fn change_line(change: &Change) -> String {
    let by = change
        .by
        .as_deref()
        .map(|by| format!(" (changed by {by})"))
        .unwrap_or_default();
    if change.field.is_empty() {
        return format!("{}: recreated{by}", change.object);
    }
    format!(
        "{} {}: {} → {}{by}",
        change.object, change.field, change.from, change.to
    )
}

/// A commit id is shown as its first 7 characters; a chart version whole.
pub fn short(revision: &str) -> String {
    let is_commit =
        matches!(revision.len(), 40 | 64) && revision.bytes().all(|b| b.is_ascii_hexdigit());
    if is_commit {
        revision[..7].to_string()
    } else {
        revision.to_string()
    }
}

/// The web page of `revision` in `repository` (normalized, `host/path`),
/// on GitHub (`github.com`, a `github.` host) or GitLab (`gitlab.com`, a
/// `gitlab.` host); none elsewhere or for what is not a commit id.
pub fn commit_link(repository: &str, revision: &str) -> Option<String> {
    let is_commit =
        matches!(revision.len(), 40 | 64) && revision.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_commit || repository.starts_with("file://") {
        return None;
    }
    let (host, path) = repository.split_once('/')?;
    let name = host.split(':').next().unwrap_or(host);
    if path.is_empty() || path.contains(['?', '#', ' ']) {
        return None;
    }
    if name == "github.com" || name.starts_with("github.") {
        Some(format!("https://{host}/{path}/commit/{revision}"))
    } else if name == "gitlab.com" || name.starts_with("gitlab.") {
        Some(format!("https://{host}/{path}/-/commit/{revision}"))
    } else {
        None
    }
}

/// What to do about `kind` (and, for a stall, its reason).
pub fn advice(kind: EventKind, reason: &str, namespace: &str, name: &str) -> Option<String> {
    let describe = format!("`setpoint app get {namespace}/{name}`");
    let text = match kind {
        EventKind::Synced | EventKind::HealthRecovered | EventKind::PreviewPosted => return None,
        EventKind::DriftCorrected => {
            "If the change was meant, make it in Git: Setpoint sets back what is changed outside Git.".to_string()
        }
        EventKind::SyncFailed => format!(
            "Setpoint retries with backoff. If it keeps failing, read the conditions with {describe}."
        ),
        EventKind::HookFailed => format!(
            "Read the failed hook's logs (`kubectl logs -n <namespace> job/<hook>`), fix it in Git and push; {describe} names the hook."
        ),
        EventKind::HealthDegraded => format!(
            "{describe} lists each object's health; `kubectl describe` the degraded ones."
        ),
        EventKind::Stalled => match reason {
            "InvalidManifest" | "RenderFailed" | "NoManifests" => {
                "Fix the manifests in Git and push: the next commit is synced.".to_string()
            }
            "RevisionNotFound" => {
                "Check spec.source.targetRevision: that branch, tag or commit does not exist.".to_string()
            }
            "PathNotFound" => "Check spec.source.path: it is not in the repository at that revision.".to_string(),
            "Forbidden" => {
                "Grant the Application's service account what the message names, or change the manifests.".to_string()
            }
            "UnknownKind" => {
                "Install the CustomResourceDefinition first, or fix the apiVersion and kind.".to_string()
            }
            "CredentialsInvalid" => "Check the repository's credentials Secret.".to_string(),
            _ => format!(
                "Fix what the message names in Git or in the Application's spec; the next change is reconciled. {describe} shows the conditions."
            ),
        },
    };
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::{AppRef, Occurrence};

    fn notification(kind: EventKind, reason: &str) -> Notification {
        Notification {
            id: "n".into(),
            namespace: "team".into(),
            alert: "ops".into(),
            provider: "slack".into(),
            summary: Some("prod cluster".into()),
            metadata: vec![("env".into(), "prod".into())],
            occurrence: Occurrence {
                kind,
                reason: reason.into(),
                severity: crate::notify::kinds::severity_of(kind),
                message: "apps/v1 Deployment team/web: spec.replicas 5→1 (changed by kubectl)"
                    .into(),
                app: AppRef {
                    namespace: "team".into(),
                    name: "web".into(),
                    ..Default::default()
                },
                revision: Some("0123456789abcdef0123456789abcdef01234567".into()),
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
        }
    }

    #[test]
    fn a_drift_message_names_the_app_the_revision_with_its_link_and_each_field() {
        let message = build(&notification(EventKind::DriftCorrected, "DriftCorrected"));
        assert_eq!(message.title, "Drift corrected: team/web");
        assert_eq!(
            message.revision,
            Some((
                "0123456".into(),
                Some("https://github.com/acme/deploy/commit/0123456789abcdef0123456789abcdef01234567".into())
            ))
        );
        assert_eq!(
            change_line(&message.changes[0]),
            "apps/v1 Deployment team/web spec.replicas: 5 → 1 (changed by kubectl)"
        );
        assert!(
            message
                .facts
                .contains(&("Application".into(), "team/web".into()))
        );
        assert!(message.facts.contains(&("env".into(), "prod".into())));
        assert!(message.advice.unwrap().contains("make it in Git"));
    }

    #[test]
    fn failures_say_what_to_do() {
        let stalled = build(&notification(EventKind::Stalled, "InvalidManifest"));
        assert!(stalled.advice.unwrap().contains("Fix the manifests in Git"));
        let other = build(&notification(
            EventKind::Stalled,
            "OwnedByAnotherApplication",
        ));
        assert!(other.advice.unwrap().contains("setpoint app get team/web"));
        let failed = build(&notification(EventKind::SyncFailed, "FetchFailed"));
        assert!(failed.advice.unwrap().contains("retries with backoff"));
        assert_eq!(
            build(&notification(EventKind::Synced, "Synced")).advice,
            None
        );
    }

    #[test]
    fn links_only_for_commits_on_github_and_gitlab() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            commit_link("gitlab.com/group/sub/project", sha).as_deref(),
            Some(
                "https://gitlab.com/group/sub/project/-/commit/0123456789abcdef0123456789abcdef01234567"
            )
        );
        assert_eq!(
            commit_link("gitlab.example.com:8443/g/p", sha).as_deref(),
            Some(
                "https://gitlab.example.com:8443/g/p/-/commit/0123456789abcdef0123456789abcdef01234567"
            )
        );
        assert_eq!(commit_link("git.example.com/a/b", sha), None);
        assert_eq!(
            commit_link("github.com/a/b", "1.2.3"),
            None,
            "a chart version"
        );
        assert_eq!(commit_link("file:///tmp/repo", sha), None);
        assert_eq!(short(sha), "0123456");
        assert_eq!(short("1.2.3"), "1.2.3");
    }
}
