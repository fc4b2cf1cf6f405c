//! What the pages and the JSON API show, decided from the in-memory index
//! without I/O: the filtered, counted, paged list and one Application's
//! view. Pure, so its cases are unit tests.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::api::{
    Application, Condition, Health, HoldStatus, OperationSummary, ResourceStatus, Sync,
};
use crate::appset::SET_LABEL;
use crate::operate::rollback::{self, Choice};
use crate::source::repo_url::{display_url, normalize_url};

/// The default and the largest page.
pub const PAGE_SIZE: usize = 50;
pub const MAX_PAGE_SIZE: usize = 500;
/// The `appset=` value of the Applications no ApplicationSet generated (a
/// set's name, a Kubernetes name, never is).
pub const NO_SET: &str = "-";

/// The list's filters and page, as the query string carries them.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
pub struct ListQuery {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The destination cluster (`in-cluster`, a registered name or URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// The ApplicationSet that generated it, or [`NO_SET`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub appset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// 1-based.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_page: Option<usize>,
}

impl ListQuery {
    fn page(&self) -> usize {
        self.page.unwrap_or(1).max(1)
    }

    fn per_page(&self) -> usize {
        self.per_page.unwrap_or(PAGE_SIZE).clamp(1, MAX_PAGE_SIZE)
    }

    /// An empty value means no filter (the form's "any").
    fn wanted(value: &Option<String>) -> Option<&str> {
        value.as_deref().map(str::trim).filter(|v| !v.is_empty())
    }

    /// The query string of this query on another page.
    pub fn on_page(&self, page: usize) -> String {
        let mut parts = Vec::new();
        for (key, value) in [
            ("namespace", &self.namespace),
            ("cluster", &self.cluster),
            ("appset", &self.appset),
            ("sync", &self.sync),
            ("health", &self.health),
        ] {
            if let Some(value) = Self::wanted(value) {
                parts.push(format!("{key}={}", encode_component(value)));
            }
        }
        if let Some(per_page) = self.per_page {
            parts.push(format!("per_page={per_page}"));
        }
        parts.push(format!("page={page}"));
        parts.join("&")
    }
}

/// How many Applications the viewer may read, by sync and by health, before
/// the sync and health filters (the namespace filter applies).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Counts {
    pub total: usize,
    pub sync: BTreeMap<String, usize>,
    pub health: BTreeMap<String, usize>,
}

/// One row of the list.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    pub namespace: String,
    pub name: String,
    /// Where it deploys: `in-cluster` or the registered cluster it names.
    pub cluster: String,
    /// The ApplicationSet that generated it, if one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub application_set: Option<String>,
    pub sync: String,
    pub health: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The commit on GitHub or GitLab, when the repository is there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<String>,
    pub message: String,
    /// `spec.suspend`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub suspended: bool,
    /// The revision `spec.pin` holds it at, short.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListView {
    pub counts: Counts,
    /// Rows matching every filter, on all pages.
    pub matching: usize,
    pub page: usize,
    pub per_page: usize,
    pub pages: usize,
    /// The namespaces the viewer may read (for the filter).
    pub namespaces: Vec<String>,
    /// The destination clusters of the Applications it may read.
    pub clusters: Vec<String>,
    /// The ApplicationSets that generated Applications it may read.
    pub application_sets: Vec<String>,
    pub items: Vec<Row>,
}

fn sync_name(sync: Sync) -> &'static str {
    match sync {
        Sync::Synced => "Synced",
        Sync::OutOfSync => "OutOfSync",
        Sync::Unknown => "Unknown",
    }
}

fn health_name(health: Health) -> &'static str {
    match health {
        Health::Healthy => "Healthy",
        Health::Suspended => "Suspended",
        Health::Progressing => "Progressing",
        Health::Unknown => "Unknown",
        Health::Missing => "Missing",
        Health::Degraded => "Degraded",
    }
}

fn namespace_of(app: &Application) -> &str {
    app.metadata.namespace.as_deref().unwrap_or_default()
}

fn name_of(app: &Application) -> &str {
    app.metadata.name.as_deref().unwrap_or_default()
}

fn sync_of(app: &Application) -> &'static str {
    sync_name(
        app.status
            .as_ref()
            .map(|s| s.sync.status)
            .unwrap_or_default(),
    )
}

fn health_of(app: &Application) -> &'static str {
    health_name(
        app.status
            .as_ref()
            .map(|s| s.health.status)
            .unwrap_or_default(),
    )
}

/// The commit page of `revision` when the repository is on GitHub or
/// GitLab (by host name), else none.
pub fn commit_url(repo_url: &str, revision: &str) -> Option<String> {
    if revision.len() < 7 || !revision.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let key = normalize_url(repo_url);
    let host = key.split('/').next()?;
    if key.starts_with("file://") || !key.contains('/') {
        return None;
    }
    if host.contains("github") {
        Some(format!("https://{key}/commit/{revision}"))
    } else if host.contains("gitlab") {
        Some(format!("https://{key}/-/commit/{revision}"))
    } else {
        None
    }
}

fn short(revision: &str) -> String {
    revision.chars().take(7).collect()
}

/// The line a person reads first: a failing condition's message, else the
/// health message.
fn message_of(app: &Application) -> String {
    let Some(status) = &app.status else {
        return String::new();
    };
    status
        .conditions
        .iter()
        .find(|c| {
            matches!(c.type_, crate::api::ConditionType::Stalled)
                && matches!(c.status, crate::api::ConditionStatus::True)
        })
        .map(|c| c.message.clone())
        .or_else(|| status.health.message.clone())
        .unwrap_or_default()
}

fn cluster_of(app: &Application) -> String {
    crate::cluster::Wanted::of(&app.spec.destination).to_string()
}

/// The ApplicationSet that generated `app`: its label, else its controller
/// reference to a set (the set's own `owns` goes by that reference).
fn set_of(app: &Application) -> Option<&str> {
    let label = app
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(SET_LABEL))
        .map(String::as_str);
    label.filter(|set| !set.is_empty()).or_else(|| {
        app.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| {
                r.controller == Some(true)
                    && r.kind == "ApplicationSet"
                    && r.api_version.starts_with("setpoint.dev/")
            })
            .map(|r| r.name.as_str())
    })
}

fn row(app: &Application) -> Row {
    let status = app.status.as_ref();
    let revision = status.and_then(|s| s.sync.revision.clone());
    Row {
        namespace: namespace_of(app).to_string(),
        name: name_of(app).to_string(),
        cluster: cluster_of(app),
        application_set: set_of(app).map(str::to_string),
        sync: sync_of(app).to_string(),
        health: health_of(app).to_string(),
        revision_url: revision
            .as_deref()
            .and_then(|r| commit_url(&app.spec.source.repo_url, r)),
        revision: revision.as_deref().map(short),
        last_sync: status
            .and_then(|s| s.operation.as_ref())
            .map(|o| o.finished_at.clone()),
        message: message_of(app),
        suspended: app.spec.suspend,
        pinned: app.spec.pin.as_ref().map(|p| short(&p.revision)),
    }
}

/// The list the viewer sees: only Applications of namespaces `readable`
/// allows, counted, filtered, sorted by namespace and name, one page.
pub fn list(
    apps: &[Arc<Application>],
    readable: &dyn Fn(&str) -> bool,
    query: &ListQuery,
) -> ListView {
    let namespace = ListQuery::wanted(&query.namespace);
    let cluster = ListQuery::wanted(&query.cluster);
    let mut clusters: BTreeSet<String> = BTreeSet::new();
    let appset = ListQuery::wanted(&query.appset);
    let mut sets: BTreeSet<&str> = BTreeSet::new();
    let sync = ListQuery::wanted(&query.sync);
    let health = ListQuery::wanted(&query.health);
    let mut namespaces: BTreeSet<&str> = BTreeSet::new();
    let mut total = 0;
    let mut syncs: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut healths: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut matching: Vec<&Application> = Vec::new();
    for app in apps {
        let ns = namespace_of(app);
        if !namespaces.contains(ns) {
            if !readable(ns) {
                continue;
            }
            namespaces.insert(ns);
        }
        if namespace.is_some_and(|wanted| wanted != ns) {
            continue;
        }
        let app_cluster = cluster_of(app);
        let other_cluster = cluster.is_some_and(|wanted| wanted != app_cluster);
        clusters.insert(app_cluster);
        let app_set = set_of(app);
        sets.extend(app_set);
        let other_set = appset.is_some_and(|wanted| match app_set {
            Some(set) => wanted != set,
            None => wanted != NO_SET,
        });
        if other_cluster || other_set {
            continue;
        }
        let (app_sync, app_health) = (sync_of(app), health_of(app));
        total += 1;
        *syncs.entry(app_sync).or_default() += 1;
        *healths.entry(app_health).or_default() += 1;
        if sync.is_some_and(|wanted| !wanted.eq_ignore_ascii_case(app_sync))
            || health.is_some_and(|wanted| !wanted.eq_ignore_ascii_case(app_health))
        {
            continue;
        }
        matching.push(app);
    }
    let counts = Counts {
        total,
        sync: syncs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        health: healths
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    };
    let namespaces: Vec<String> = namespaces.into_iter().map(str::to_string).collect();
    let clusters: Vec<String> = clusters.into_iter().collect();
    let application_sets: Vec<String> = sets.into_iter().map(str::to_string).collect();
    matching
        .sort_unstable_by(|a, b| (namespace_of(a), name_of(a)).cmp(&(namespace_of(b), name_of(b))));
    let per_page = query.per_page();
    let pages = matching.len().div_ceil(per_page).max(1);
    let page = query.page().min(pages);
    let items = matching
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .map(|app| row(app))
        .collect();
    ListView {
        counts,
        matching: matching.len(),
        page,
        per_page,
        pages,
        namespaces,
        clusters,
        application_sets,
        items,
    }
}

/// One drift correction, from a `DriftCorrected` Event.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriftRecord {
    pub time: String,
    /// `apps/Deployment ns/web`.
    pub object: String,
    pub fields: Vec<FieldChange>,
    /// The note as written, when it names no field (a recreated object).
    pub note: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FieldChange {
    pub field: String,
    pub old: String,
    pub new: String,
    pub changed_by: String,
}

/// Parses a `DriftCorrected` note: `apps/Deployment ns/web: spec.replicas
/// 1→5 (changed by kubectl), metadata.labels.a x→y (changed by unknown)`.
pub fn parse_drift(time: &str, note: &str) -> DriftRecord {
    let (object, rest) = note.split_once(": ").unwrap_or((note, ""));
    let mut fields = Vec::new();
    // Each field ends with `)`; a value may hold `, ` itself.
    for part in rest.split("), ") {
        let part = part.strip_suffix(')').unwrap_or(part);
        let Some((change, by)) = part.rsplit_once(" (changed by ") else {
            continue;
        };
        let Some((field, values)) = change.split_once(' ') else {
            continue;
        };
        let Some((old, new)) = values.split_once('→') else {
            continue;
        };
        fields.push(FieldChange {
            field: field.to_string(),
            old: old.to_string(),
            new: new.to_string(),
            changed_by: by.to_string(),
        });
    }
    DriftRecord {
        time: time.to_string(),
        object: object.to_string(),
        fields,
        note: rest.to_string(),
    }
}

/// Any Event about an Application, newest first in the view.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventRecord {
    pub time: String,
    pub type_: String,
    pub reason: String,
    pub note: String,
}

/// The objects of one kind.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KindGroup {
    pub kind: String,
    pub objects: Vec<ResourceStatus>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppView {
    pub namespace: String,
    pub name: String,
    /// The ApplicationSet that generated it, if one did.
    pub application_set: Option<String>,
    pub sync: String,
    pub health: String,
    pub health_message: Option<String>,
    /// Without user info holding a secret.
    pub repo_url: String,
    pub target_revision: Option<String>,
    pub path: Option<String>,
    pub revision: Option<String>,
    pub revision_url: Option<String>,
    pub automated: bool,
    pub prune: bool,
    pub self_heal: bool,
    pub allow_empty: bool,
    pub suspend: bool,
    pub conditions: Vec<Condition>,
    pub objects: Vec<KindGroup>,
    pub drift: Vec<DriftRecord>,
    pub operations: Vec<OperationSummary>,
    pub events: Vec<EventRecord>,
    /// Whether the viewer may sync, refresh, roll back, suspend and resume
    /// it.
    pub can_patch: bool,
    /// Why the last reconcile applied nothing on purpose (`status.hold`).
    pub hold: Option<HoldStatus>,
    /// The past revision it is held at (`spec.pin`).
    pub pin: Option<PinView>,
    /// Where Rollback goes without a revision named, or why it cannot.
    pub rollback: RollbackView,
}

/// `spec.pin`, with what the last reconcile said of it (`status.pinned`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PinView {
    pub revision: String,
    pub revision_url: Option<String>,
    pub by: Option<String>,
    pub at: Option<String>,
    pub history_id: Option<u64>,
    /// Whether a reconcile has followed this pin yet.
    pub followed: bool,
    /// A newer commit of `targetRevision` that is not applied.
    pub newer_revision: Option<String>,
}

/// The default target of Rollback (`operate::rollback::choose` without a
/// revision): a history entry, or the reason there is none.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RollbackView {
    pub history_id: Option<u64>,
    pub revision: Option<String>,
    pub refused: Option<String>,
}

/// The pin of `app`, with the newer revision the last reconcile of the
/// same pin recorded.
pub fn pin_of(app: &Application) -> Option<PinView> {
    let pin = app.spec.pin.as_ref()?;
    let pinned = app
        .status
        .as_ref()
        .and_then(|s| s.pinned.as_ref())
        .filter(|p| p.revision == pin.revision);
    Some(PinView {
        revision: pin.revision.clone(),
        revision_url: commit_url(&app.spec.source.repo_url, &pin.revision),
        by: pin.by.clone(),
        at: pin.at.clone(),
        history_id: pin.history_id,
        followed: pinned.is_some(),
        newer_revision: pinned.and_then(|p| p.newer_revision.clone()),
    })
}

/// Where Rollback without a revision goes: the newest history entry that
/// was Synced and Healthy at another revision than the current one.
pub fn rollback_of(app: &Application) -> RollbackView {
    match rollback::choose(app.status.as_ref(), None) {
        Ok(Choice::Entry { revision, id }) => RollbackView {
            history_id: Some(id),
            revision: Some(revision),
            refused: None,
        },
        // Without a revision named, `choose` answers an entry or an error.
        Ok(Choice::Commit(revision) | Choice::Resolve(revision)) => RollbackView {
            history_id: None,
            revision: Some(revision),
            refused: None,
        },
        Err(error) => RollbackView {
            refused: Some(error.to_string()),
            ..Default::default()
        },
    }
}

/// One Application's page, from the index and the Events held in memory.
pub fn app(
    app: &Application,
    drift: Vec<DriftRecord>,
    events: Vec<EventRecord>,
    can_patch: bool,
) -> AppView {
    let status = app.status.clone().unwrap_or_default();
    let mut groups: BTreeMap<String, Vec<ResourceStatus>> = BTreeMap::new();
    for resource in &status.resources {
        let kind = if resource.group.is_empty() {
            resource.kind.clone()
        } else {
            format!("{}/{}", resource.group, resource.kind)
        };
        groups.entry(kind).or_default().push(resource.clone());
    }
    let automated = app.spec.sync_policy.automated.as_ref();
    let revision = status.sync.revision.clone();
    AppView {
        namespace: namespace_of(app).to_string(),
        name: name_of(app).to_string(),
        application_set: set_of(app).map(str::to_string),
        sync: sync_of(app).to_string(),
        health: health_of(app).to_string(),
        health_message: status.health.message.clone(),
        repo_url: display_url(&app.spec.source.repo_url),
        target_revision: app.spec.source.target_revision.clone(),
        path: app.spec.source.path.clone(),
        revision_url: revision
            .as_deref()
            .and_then(|r| commit_url(&app.spec.source.repo_url, r)),
        revision,
        automated: automated.is_some(),
        prune: automated.is_some_and(|a| a.prune),
        self_heal: automated.is_some_and(|a| a.self_heal),
        allow_empty: app.spec.sync_policy.allow_empty,
        suspend: app.spec.suspend,
        conditions: status.conditions.clone(),
        objects: groups
            .into_iter()
            .map(|(kind, objects)| KindGroup { kind, objects })
            .collect(),
        drift,
        operations: status.history.iter().take(10).cloned().collect(),
        events,
        can_patch,
        hold: status.hold.clone(),
        pin: pin_of(app),
        rollback: rollback_of(app),
    }
}

/// Percent-encodes a query value.
pub fn encode_component(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApplicationSpec, ApplicationStatus, HealthStatus, SyncStatus};

    fn app(ns: &str, name: &str, sync: Sync, health: Health) -> Arc<Application> {
        let mut app = Application::new(name, ApplicationSpec::default());
        app.metadata.namespace = Some(ns.into());
        app.spec.source.repo_url = "https://github.com/org/repo.git".into();
        app.status = Some(ApplicationStatus {
            sync: SyncStatus {
                status: sync,
                revision: Some("0123456789abcdef0123456789abcdef01234567".into()),
            },
            health: HealthStatus {
                status: health,
                message: None,
            },
            ..Default::default()
        });
        Arc::new(app)
    }

    fn fleet() -> Vec<Arc<Application>> {
        vec![
            app("b", "two", Sync::OutOfSync, Health::Degraded),
            app("a", "one", Sync::Synced, Health::Healthy),
            app("a", "three", Sync::Synced, Health::Progressing),
            app("secret", "hidden", Sync::Synced, Health::Healthy),
        ]
    }

    #[test]
    fn only_readable_namespaces_are_listed_and_counted() {
        let view = list(&fleet(), &|ns| ns != "secret", &ListQuery::default());
        assert_eq!(view.counts.total, 3);
        assert_eq!(view.namespaces, vec!["a", "b"]);
        assert!(view.items.iter().all(|r| r.namespace != "secret"));
        assert_eq!(view.counts.sync["Synced"], 2);
        assert_eq!(view.counts.sync["OutOfSync"], 1);
        let names: Vec<_> = view.items.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["one", "three", "two"],
            "sorted by namespace, name"
        );
    }

    #[test]
    fn the_cluster_is_a_column_and_a_filter() {
        let mut apps = fleet();
        let mut remote = (*apps[0]).clone();
        remote.spec.destination.name = Some("staging".into());
        apps[0] = Arc::new(remote);
        let view = list(&apps, &|_| true, &ListQuery::default());
        assert_eq!(view.clusters, vec!["in-cluster", "staging"]);
        let query = ListQuery {
            cluster: Some("staging".into()),
            ..Default::default()
        };
        let view = list(&apps, &|_| true, &query);
        let rows: Vec<_> = view
            .items
            .iter()
            .map(|r| (r.name.as_str(), r.cluster.as_str()))
            .collect();
        assert_eq!(rows, vec![("two", "staging")]);
        assert_eq!(view.counts.total, 1, "counted within the cluster filter");
        assert!(query.on_page(2).contains("cluster=staging"));
    }

    /// `app` as the set `set` generates it: the label and the controller
    /// reference.
    fn generated(app: &Arc<Application>, set: &str) -> Arc<Application> {
        let mut app = (**app).clone();
        app.metadata
            .labels
            .get_or_insert_default()
            .insert(SET_LABEL.into(), set.into());
        app.metadata.owner_references = Some(vec![owner(set)]);
        Arc::new(app)
    }

    fn owner(set: &str) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "setpoint.dev/v1alpha1".into(),
            kind: "ApplicationSet".into(),
            name: set.into(),
            uid: format!("uid-{set}"),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    /// Two of `fleet` from set `web`, one from set `api` in another
    /// namespace, `a/three` from none (and `secret/hidden` from `hidden`).
    fn fleet_of_sets() -> Vec<Arc<Application>> {
        let apps = fleet();
        vec![
            generated(&apps[0], "web"),
            generated(&apps[1], "web"),
            apps[2].clone(),
            generated(&apps[3], "hidden"),
            generated(&app("b", "four", Sync::Synced, Health::Healthy), "api"),
        ]
    }

    #[test]
    fn the_application_set_is_a_column_and_a_filter() {
        let apps = fleet_of_sets();
        let readable = |ns: &str| ns != "secret";
        let view = list(&apps, &readable, &ListQuery::default());
        assert_eq!(
            view.application_sets,
            vec!["api", "web"],
            "the sets of readable namespaces only"
        );
        let rows: Vec<_> = view
            .items
            .iter()
            .map(|r| (r.name.as_str(), r.application_set.as_deref()))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("one", Some("web")),
                ("three", None),
                ("four", Some("api")),
                ("two", Some("web")),
            ]
        );

        let query = ListQuery {
            appset: Some("web".into()),
            ..Default::default()
        };
        let view = list(&apps, &readable, &query);
        let names: Vec<_> = view.items.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["one", "two"]);
        assert_eq!(view.counts.total, 2, "counted within the set filter");
        assert_eq!(view.counts.sync["Synced"], 1);
        assert_eq!(view.counts.sync["OutOfSync"], 1);
        assert_eq!(
            view.application_sets,
            vec!["api", "web"],
            "all to pick from"
        );
        assert_eq!(query.on_page(2), "appset=web&page=2");

        let none = ListQuery {
            appset: Some(NO_SET.into()),
            ..Default::default()
        };
        let view = list(&apps, &readable, &none);
        let names: Vec<_> = view.items.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, vec!["three"], "the Applications no set generated");
        assert_eq!(view.counts.total, 1);

        // Within the namespace filter, like the clusters; with the others.
        let query = ListQuery {
            namespace: Some("a".into()),
            appset: Some("web".into()),
            sync: Some("Synced".into()),
            ..Default::default()
        };
        let view = list(&apps, &readable, &query);
        assert_eq!(view.application_sets, vec!["web"]);
        assert_eq!(view.items.len(), 1);
        assert_eq!(view.items[0].name, "one");
        assert_eq!(view.counts.total, 1);
        let query = ListQuery {
            appset: Some("nothing".into()),
            ..Default::default()
        };
        let view = list(&apps, &readable, &query);
        assert_eq!((view.matching, view.counts.total), (0, 0));
    }

    #[test]
    fn the_set_comes_from_the_label_else_the_controller_reference() {
        let apps = fleet();
        let mut by_reference = (*apps[0]).clone();
        by_reference.metadata.owner_references = Some(vec![owner("web")]);
        assert_eq!(set_of(&by_reference), Some("web"));
        let mut not_controller = owner("web");
        not_controller.controller = None;
        by_reference.metadata.owner_references = Some(vec![not_controller]);
        assert_eq!(set_of(&by_reference), None);
        let mut labelled = (*apps[0]).clone();
        labelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert(SET_LABEL.into(), "fleet".into());
        assert_eq!(set_of(&labelled), Some("fleet"));
        let view = super::app(&generated(&apps[0], "web"), vec![], vec![], false);
        assert_eq!(view.application_set.as_deref(), Some("web"));
        assert_eq!(
            super::app(&apps[0], vec![], vec![], false).application_set,
            None
        );
    }

    #[test]
    fn filters_by_namespace_sync_and_health_keep_the_counts_of_the_namespace() {
        let query = ListQuery {
            namespace: Some("a".into()),
            health: Some("progressing".into()),
            ..Default::default()
        };
        let view = list(&fleet(), &|_| true, &query);
        assert_eq!(view.matching, 1);
        assert_eq!(view.items[0].name, "three");
        assert_eq!(view.counts.total, 2, "counts before the sync/health filter");
        let query = ListQuery {
            sync: Some("OutOfSync".into()),
            ..Default::default()
        };
        let view = list(&fleet(), &|_| true, &query);
        assert_eq!(view.items.len(), 1);
        assert_eq!(view.items[0].name, "two");
    }

    #[test]
    fn pages_are_cut_and_the_last_page_is_clamped() {
        let apps: Vec<_> = (0..120)
            .map(|i| app("ns", &format!("app-{i:03}"), Sync::Synced, Health::Healthy))
            .collect();
        let query = ListQuery {
            page: Some(3),
            ..Default::default()
        };
        let view = list(&apps, &|_| true, &query);
        assert_eq!(view.pages, 3);
        assert_eq!(view.items.len(), 20);
        assert_eq!(view.items[0].name, "app-100");
        let query = ListQuery {
            page: Some(99),
            per_page: Some(100),
            ..Default::default()
        };
        let view = list(&apps, &|_| true, &query);
        assert_eq!((view.page, view.items.len()), (2, 20));
        assert_eq!(query.on_page(1), "per_page=100&page=1");
    }

    #[test]
    fn revisions_link_to_github_and_gitlab_only() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            commit_url("git@github.com:org/repo.git", sha).as_deref(),
            Some("https://github.com/org/repo/commit/0123456789abcdef0123456789abcdef01234567")
        );
        assert_eq!(
            commit_url("https://user:pw@gitlab.com/g/sub/repo", sha).as_deref(),
            Some("https://gitlab.com/g/sub/repo/-/commit/0123456789abcdef0123456789abcdef01234567")
        );
        assert_eq!(commit_url("https://git.example.com/org/repo", sha), None);
        assert_eq!(commit_url("/srv/git/repo", sha), None);
        assert_eq!(commit_url("https://github.com/org/repo", "main"), None);
        let view = list(&fleet(), &|_| true, &ListQuery::default());
        assert_eq!(view.items[0].revision.as_deref(), Some("0123456"));
    }

    /// `a/one` pinned to its history entry 1 by alice, after a bad 2.
    fn rolled_back() -> Application {
        let mut app = (*app("a", "one", Sync::Synced, Health::Degraded)).clone();
        let status = app.status.as_mut().unwrap();
        status.sync.revision = Some("b".repeat(40));
        status.history = vec![
            OperationSummary {
                id: 2,
                revision: "b".repeat(40),
                ..Default::default()
            },
            OperationSummary {
                id: 1,
                revision: "a".repeat(40),
                healthy: true,
                initiated_by: Some("sync by bob".into()),
                ..Default::default()
            },
        ];
        app.spec.pin = Some(crate::api::Pin {
            revision: "a".repeat(40),
            by: Some("alice".into()),
            at: Some("2026-12-07T12:00:00Z".into()),
            history_id: Some(1),
        });
        app
    }

    #[test]
    fn a_pin_shows_who_when_and_the_newer_commit_of_the_reconcile_that_followed_it() {
        let mut app = rolled_back();
        let pin = pin_of(&app).unwrap();
        assert_eq!(pin.revision, "a".repeat(40));
        assert_eq!(pin.by.as_deref(), Some("alice"));
        assert_eq!(pin.history_id, Some(1));
        assert!(
            !pin.followed && pin.newer_revision.is_none(),
            "no reconcile yet"
        );
        assert_eq!(
            pin.revision_url.as_deref(),
            Some(format!("https://github.com/org/repo/commit/{}", "a".repeat(40)).as_str())
        );
        app.status.as_mut().unwrap().pinned = Some(crate::api::PinnedStatus {
            revision: "a".repeat(40),
            newer_revision: Some("c".repeat(40)),
            ..Default::default()
        });
        let pin = pin_of(&app).unwrap();
        assert!(pin.followed);
        assert_eq!(pin.newer_revision, Some("c".repeat(40)));
        // What the last reconcile said of another pin is not this pin's.
        app.spec.pin.as_mut().unwrap().revision = "d".repeat(40);
        let pin = pin_of(&app).unwrap();
        assert!(!pin.followed && pin.newer_revision.is_none());
        app.spec.pin = None;
        assert_eq!(pin_of(&app), None, "resumed: the spec says so first");
    }

    #[test]
    fn rollback_names_the_last_healthy_entry_or_why_there_is_none() {
        let app = rolled_back();
        assert_eq!(
            rollback_of(&app),
            RollbackView {
                history_id: Some(1),
                revision: Some("a".repeat(40)),
                refused: None,
            }
        );
        let fresh = app_of_fleet_without_history();
        let view = rollback_of(&fresh);
        assert_eq!((view.history_id, view.revision.as_deref()), (None, None));
        assert!(
            view.refused
                .as_deref()
                .unwrap()
                .starts_with("no earlier revision of status.history was Synced and Healthy"),
            "{view:?}"
        );
        let view = super::app(&app, vec![], vec![], true);
        assert_eq!(view.rollback.history_id, Some(1));
        assert_eq!(
            view.operations[1].initiated_by.as_deref(),
            Some("sync by bob")
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["pin"]["by"], "alice");
        assert_eq!(json["rollback"]["historyId"], 1);
        assert_eq!(json["operations"][1]["healthy"], true);
        assert_eq!(json["operations"][1]["id"], 1);
    }

    fn app_of_fleet_without_history() -> Application {
        (*fleet()[0]).clone()
    }

    #[test]
    fn rows_say_suspended_and_pinned() {
        let mut suspended = (*fleet()[0]).clone();
        suspended.spec.suspend = true;
        let apps = vec![Arc::new(suspended), Arc::new(rolled_back())];
        let view = list(&apps, &|_| true, &ListQuery::default());
        let marks: Vec<_> = view
            .items
            .iter()
            .map(|r| (r.name.as_str(), r.suspended, r.pinned.as_deref()))
            .collect();
        assert_eq!(
            marks,
            vec![("one", false, Some("aaaaaaa")), ("two", true, None)]
        );
    }

    #[test]
    fn a_drift_note_splits_into_fields_with_old_new_and_manager() {
        let record = parse_drift(
            "2026-01-01T00:00:00Z",
            "apps/Deployment ns/web: spec.replicas 1→5 (changed by kubectl), metadata.labels.a x, y→z (changed by unknown)",
        );
        assert_eq!(record.object, "apps/Deployment ns/web");
        assert_eq!(
            record.fields[0],
            FieldChange {
                field: "spec.replicas".into(),
                old: "1".into(),
                new: "5".into(),
                changed_by: "kubectl".into()
            }
        );
        assert_eq!(record.fields[1].old, "x, y");
        assert_eq!(record.fields[1].changed_by, "unknown");
        let recreated = parse_drift(
            "t",
            "ConfigMap ns/c: recreated (it was deleted outside Setpoint)",
        );
        assert!(recreated.fields.is_empty());
        assert_eq!(
            recreated.note,
            "recreated (it was deleted outside Setpoint)"
        );
    }
}
