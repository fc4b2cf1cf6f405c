//! The one message on the queue: which Application to reconcile, why, and
//! (when a webhook said so) which commit. Serialized as JSON; the routing key
//! is the Application's `namespace/name`, so every event of one Application
//! lands on the same shard.

use std::fmt;

use serde::{Deserialize, Serialize};

/// `namespace/name` of an Application.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AppKey {
    pub namespace: String,
    pub name: String,
}

impl AppKey {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `namespace/name`.
    pub fn parse(text: &str) -> Option<Self> {
        let (namespace, name) = text.split_once('/')?;
        (!namespace.is_empty() && !name.is_empty() && !name.contains('/'))
            .then(|| Self::new(namespace, name))
    }
}

/// Events of an ApplicationSet carry this key: its namespace, and its name
/// behind a prefix no Kubernetes name can hold (`:`), so its slot in the
/// worker and its shard never mix with an Application's of that name.
const SET_PREFIX: &str = "applicationset:";

impl AppKey {
    /// The key of ApplicationSet `namespace/name`'s events.
    pub fn set(namespace: impl Into<String>, name: &str) -> Self {
        Self::new(namespace, format!("{SET_PREFIX}{name}"))
    }

    /// The ApplicationSet's name, when this is an ApplicationSet's key.
    pub fn set_name(&self) -> Option<&str> {
        self.name.strip_prefix(SET_PREFIX)
    }
}

impl fmt::Display for AppKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why an Application is to be reconciled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Cause {
    /// A push announced by a Git host's webhook.
    Webhook {
        provider: String,
        delivery: String,
        /// The changed file that routed the push to this Application (one of
        /// its inputs or under one); absent when the push listed no files.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<String>,
    },
    /// A live object of the Application changed or was deleted by someone
    /// other than Setpoint, or its health changed.
    Drift { object: String },
    /// The Application itself was created or its spec changed.
    AppChanged,
    /// The periodic sweep.
    Sweep,
    /// Someone asked (`setpoint app sync`).
    Manual,
    /// The destination cluster was registered, its Secret changed, or it
    /// answers again after being unreachable.
    ClusterChanged { cluster: String },
    /// The last reconcile left something progressing: check back.
    Requeue,
    /// Someone asked for a reconcile by changing the Application's
    /// [`REQUESTED_AT`] annotation (or Flux's `reconcile.fluxcd.io/requestedAt`):
    /// a manual sync from the CLI does, so that the controller looks again
    /// after its status write.
    Requested,
    /// An Application this one names in `spec.dependsOn` became ready (or
    /// ready at another revision), or, while this one waits for it, changed
    /// state or was deleted.
    DependencyChanged { dependency: String },
    /// The chart poller saw the version the Application's range picks
    /// change (or its repository fail or recover).
    Chart {
        repository: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        version: Option<String>,
    },
    /// A Receiver was called (`POST /api/webhooks/receivers/…`): a
    /// registry announced a push of `repository` (`host/path`) at `tag`, or
    /// a CI job asked (`generic`, neither set). The event's `freshSince`
    /// also bounds the chart listing, so the new version is seen at once.
    Receiver {
        /// `namespace/name` of the Receiver.
        receiver: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        repository: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tag: Option<String>,
    },
    /// A pull (merge) request was opened or pushed to: preview what its
    /// head would change, as a comment, without touching the cluster. The
    /// event's `app` is the pull request's key ([`PullRequest::key`]), not
    /// an Application: previews have their own slots and permits.
    Preview(Box<PullRequest>),
    /// One Alert's notification of what happened to an Application, for
    /// its Provider (`src/notify/`). The event's `app` is
    /// [`Notification::key`](crate::notify::Notification::key) and its id
    /// the notification's: notifications have their own slots and permits.
    Notify(Box<crate::notify::Notification>),
    /// An ApplicationSet to evaluate again: a push to a repository one of
    /// its git generators reads, a pull request event of a repository its
    /// pull request generator lists, a cluster Secret, its spec, the sweep.
    /// With `refreshOnly`, one of its Applications changed state: only its
    /// status summary is written again. The event's `app` is
    /// [`AppKey::set`].
    AppSet {
        why: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        refresh_only: bool,
        /// What the pull request event said, laid over the provider's
        /// listing (which may not show it yet).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pull: Option<PullChange>,
    },
}

/// A pull (merge) request opened, pushed to, relabelled or closed, as its
/// webhook said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullChange {
    /// `github` or `gitlab`.
    pub provider: String,
    /// `owner/repo` on GitHub, the project's path on GitLab.
    pub project: String,
    /// GitLab's numeric project id (a generator may name either).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    pub number: u64,
    /// Still open (else closed or merged).
    pub open: bool,
    pub branch: String,
    pub target_branch: String,
    pub head_sha: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
}

/// A pull request (GitHub) or merge request (GitLab) as a preview needs it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullRequest {
    /// `github` or `gitlab`.
    pub provider: String,
    /// The webhook delivery that announced it, for logs.
    #[serde(default)]
    pub delivery: String,
    /// Every spelling of the base repository the payload gives.
    pub repo_urls: Vec<String>,
    /// Where to post: `owner/repo` on GitHub, the project id on GitLab.
    pub project: String,
    /// The pull request's number (GitLab: the merge request's iid).
    pub number: u64,
    /// The branch it would merge into (a name, not a ref).
    pub base_branch: String,
    /// The repository's default branch, for Applications following `HEAD`.
    #[serde(default)]
    pub default_branch: Option<String>,
    /// The base branch's commit when the event was sent (GitHub says it;
    /// GitLab's hook does not): the diff's base when the mirror lacks the
    /// base branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_sha: Option<String>,
    /// The head commit to preview.
    pub head_sha: String,
    /// The ref that holds the head in the base repository:
    /// `refs/pull/N/head` (GitHub), `refs/merge-requests/N/head` (GitLab).
    pub head_ref: String,
    /// The head lives in another repository (a fork).
    #[serde(default)]
    pub fork: bool,
    /// When the Git host last updated the pull request (`updated_at`,
    /// RFC 3339 in UTC): of several deliveries, the newest wins, whatever
    /// order they arrived in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// The Applications that follow the base repository and branch, as the
    /// webhook's index knew them; the worker keeps those the changes touch.
    #[serde(default)]
    pub apps: Vec<AppKey>,
}

impl PullRequest {
    /// The key every event of one pull request carries as its `app`: the
    /// queue's routing key (one shard per pull request) and the worker's
    /// slot, so a burst of pushes coalesces.
    pub fn key(&self) -> AppKey {
        AppKey::new(
            format!("{}-preview", self.provider),
            format!("{}#{}", self.project.replace('/', ":"), self.number),
        )
    }
}

impl Cause {
    /// A short label for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Cause::Webhook { .. } => "webhook",
            Cause::Drift { .. } => "drift",
            Cause::AppChanged => "app-changed",
            Cause::Sweep => "sweep",
            Cause::Manual => "manual",
            Cause::ClusterChanged { .. } => "cluster",
            Cause::Requeue => "requeue",
            Cause::Requested => "requested",
            Cause::DependencyChanged { .. } => "dependency",
            Cause::Chart { .. } => "chart",
            Cause::Receiver { .. } => "receiver",
            Cause::Preview(_) => "preview",
            Cause::Notify(_) => "notify",
            Cause::AppSet {
                refresh_only: true, ..
            } => "appset-refresh",
            Cause::AppSet { .. } => "appset",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub app: AppKey,
    pub cause: Cause,
    /// The commit a webhook announced: the worker skips the fetch when it
    /// already has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Without a `revision`: the worker may resolve the Application's
    /// revision from any fetch that started at or after this moment (Unix
    /// milliseconds), so one fetch serves every event published before it.
    /// Set to the publishing time, or to the start of the sweep cycle. Absent
    /// (an event from an older version): fetch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fresh_since: Option<u64>,
    /// How many times this event failed before (0 on first delivery).
    #[serde(default)]
    pub attempt: u32,
    /// Unique per event, carried into logs from the webhook to the apply.
    pub id: String,
}

impl Event {
    pub fn new(app: AppKey, cause: Cause) -> Self {
        Self {
            app,
            cause,
            revision: None,
            fresh_since: Some(unix_millis(std::time::SystemTime::now())),
            attempt: 0,
            id: new_id(),
        }
    }

    /// A live object of `app` changed (or its health did): the change is in
    /// the cluster, not in Git, so the mirror as fetched within
    /// [`DRIFT_GIT_AGE`] serves it. The health changes of a rollout a push
    /// started then cost no second fetch, and a quiet repository is still
    /// fetched for a drift after a while (as Argo CD compares against the
    /// revision it last resolved until its next refresh).
    pub fn drift(app: AppKey, object: String) -> Self {
        let since = std::time::SystemTime::now()
            .checked_sub(DRIFT_GIT_AGE)
            .unwrap_or(std::time::UNIX_EPOCH);
        Self::new(app, Cause::Drift { object }).with_fresh_since(Some(unix_millis(since)))
    }

    /// See [`Event::fresh_since`]; `None` asks for a fetch.
    pub fn with_fresh_since(mut self, since: Option<u64>) -> Self {
        self.fresh_since = since;
        self
    }

    pub fn with_revision(mut self, revision: Option<String>) -> Self {
        self.revision = revision;
        self
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("events serialize")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

/// The annotation whose every new value asks for a reconcile now (as Flux's
/// `reconcile.fluxcd.io/requestedAt`, also honoured): `setpoint app sync`
/// and `rollback` set it after their own status write.
pub const REQUESTED_AT: &str = "setpoint.dev/requested-at";
/// Flux's name for the same request.
pub const FLUX_REQUESTED_AT: &str = "reconcile.fluxcd.io/requestedAt";

/// The reconcile request an Application's annotations carry, if any.
pub fn requested_at(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> Option<&str> {
    let annotations = annotations?;
    annotations
        .get(REQUESTED_AT)
        .or_else(|| annotations.get(FLUX_REQUESTED_AT))
        .map(String::as_str)
}

/// How old a fetch may be to serve a drift event: see [`Event::drift`].
/// Three minutes, Argo CD's default `timeout.reconciliation`.
pub const DRIFT_GIT_AGE: std::time::Duration = std::time::Duration::from_secs(180);

/// Milliseconds since the Unix epoch (0 before it).
pub fn unix_millis(at: std::time::SystemTime) -> u64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// A unique id: time, process and a counter, hex.
pub fn new_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default();
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{nanos:x}-{:x}-{n:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reconcile_request_is_setpoints_annotation_or_else_fluxs() {
        let map = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(requested_at(None), None);
        assert_eq!(requested_at(Some(&map(&[("other", "1")]))), None);
        assert_eq!(
            requested_at(Some(&map(&[(FLUX_REQUESTED_AT, "f")]))),
            Some("f")
        );
        let both = map(&[(FLUX_REQUESTED_AT, "f"), (REQUESTED_AT, "s")]);
        assert_eq!(requested_at(Some(&both)), Some("s"));
    }

    #[test]
    fn a_drift_event_is_served_by_a_fetch_of_the_last_three_minutes() {
        let now = unix_millis(std::time::SystemTime::now());
        let drift = Event::drift(AppKey::new("team", "web"), "Deployment web".into());
        let since = drift.fresh_since.unwrap();
        let age = DRIFT_GIT_AGE.as_millis() as u64;
        assert!(
            since <= now - age + 1_000 && since + age + 1_000 >= now,
            "{since} {now}"
        );
        let push = Event::new(AppKey::new("team", "web"), Cause::AppChanged);
        assert!(
            push.fresh_since.unwrap() >= now,
            "other events ask for a fetch after them"
        );
    }

    #[test]
    fn events_round_trip_as_json() {
        let event = Event::new(
            AppKey::new("team", "web"),
            Cause::Webhook {
                provider: "github".into(),
                delivery: "d-1".into(),
                input: Some("bases/web/deploy.yaml".into()),
            },
        )
        .with_revision(Some("abc".into()));
        let back = Event::from_bytes(&event.to_bytes()).unwrap();
        assert_eq!(back, event);
        assert!(back.fresh_since.is_some());
        // An event of an older version, without the bound, asks for a fetch.
        let old = r#"{"app":{"namespace":"a","name":"b"},"cause":{"type":"sweep"},"id":"x"}"#;
        assert_eq!(Event::from_bytes(old.as_bytes()).unwrap().fresh_since, None);
        assert!(
            String::from_utf8(event.to_bytes())
                .unwrap()
                .contains(r#""type":"webhook""#)
        );
    }

    #[test]
    fn previews_round_trip_keyed_by_their_pull_request() {
        let pull = PullRequest {
            provider: "github".into(),
            delivery: "d-1".into(),
            repo_urls: vec!["https://github.com/acme/deploy.git".into()],
            project: "acme/deploy".into(),
            number: 12,
            base_branch: "main".into(),
            default_branch: Some("main".into()),
            base_sha: Some("1".repeat(40)),
            head_sha: "2".repeat(40),
            head_ref: "refs/pull/12/head".into(),
            fork: false,
            updated_at: Some("2026-12-04T17:00:00Z".into()),
            apps: vec![AppKey::new("team", "web")],
        };
        let key = pull.key();
        assert_eq!(key.to_string(), "github-preview/acme:deploy#12");
        let event = Event::new(key, Cause::Preview(Box::new(pull)));
        let back = Event::from_bytes(&event.to_bytes()).unwrap();
        assert_eq!(back, event);
        assert_eq!(back.cause.kind(), "preview");
        assert!(
            String::from_utf8(event.to_bytes())
                .unwrap()
                .contains(r#""type":"preview""#)
        );
    }

    #[test]
    fn app_keys_parse_namespace_slash_name() {
        assert_eq!(AppKey::parse("team/web"), Some(AppKey::new("team", "web")));
        assert_eq!(AppKey::parse("web"), None);
        assert_eq!(AppKey::parse("/web"), None);
        assert_eq!(AppKey::parse("a/b/c"), None);
        assert_eq!(AppKey::new("team", "web").to_string(), "team/web");
    }

    #[test]
    fn ids_are_unique() {
        assert_ne!(new_id(), new_id());
    }
}
