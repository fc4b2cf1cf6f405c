//! Which Applications a Receiver's request reconciles (pure): those its
//! `spec.resources` name (by name or labels, in its own namespace), and, for
//! a registry push, those of its namespace whose chart is the pushed
//! repository: an OCI chart `oci://host/path` + `chart` is `host/path/chart`;
//! a Helm repository's chart matches a push to the repository's host whose
//! last path segment is the chart's name.

use std::collections::BTreeMap;

use crate::api::{Application, ReceiverResource};
use crate::event::AppKey;
use crate::source::chart::Repository;

use super::payload::{Announcement, RegistryRepo, normalize_host};

/// What the selection needs of one Application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub key: AppKey,
    pub labels: BTreeMap<String, String>,
    /// `spec.source.chart`, and its repository parsed.
    pub chart: Option<(String, Repository)>,
}

impl Candidate {
    pub fn of(app: &Application) -> Option<Candidate> {
        let namespace = app.metadata.namespace.clone()?;
        let name = app.metadata.name.clone()?;
        let source = &app.spec.source;
        let chart = source.chart.as_deref().and_then(|chart| {
            Repository::parse(&source.repo_url, chart)
                .ok()
                .map(|repository| (chart.to_string(), repository))
        });
        Some(Candidate {
            key: AppKey::new(namespace, name),
            labels: app.metadata.labels.clone().unwrap_or_default(),
            chart,
        })
    }
}

/// Whether `resource` names `candidate` (whose namespace is the Receiver's).
fn names(resource: &ReceiverResource, candidate: &Candidate) -> bool {
    let kind = resource.kind.as_deref().unwrap_or("Application");
    if kind != "Application" {
        return false;
    }
    let by_name = match resource.name.as_deref() {
        None | Some("") | Some("*") => true,
        Some(name) => name == candidate.key.name,
    };
    by_name
        && resource
            .match_labels
            .iter()
            .all(|(k, v)| candidate.labels.get(k) == Some(v))
}

/// An entry that selects by something: a name or labels (an empty entry,
/// or `name: "*"` without labels, would select every Application).
pub fn is_bounded(resource: &ReceiverResource) -> bool {
    let any_name = matches!(resource.name.as_deref(), None | Some("") | Some("*"));
    !any_name || !resource.match_labels.is_empty()
}

/// Whether a push to `pushed` is the repository of chart `chart` from
/// `repository`.
pub fn chart_matches(chart: &str, repository: &Repository, pushed: &RegistryRepo) -> bool {
    let host_matches = |host: &str| {
        pushed
            .host
            .as_deref()
            .is_none_or(|pushed| pushed == normalize_host(host))
    };
    match repository {
        Repository::Oci { registry, name } => {
            host_matches(registry) && name.eq_ignore_ascii_case(&pushed.path)
        }
        Repository::Http { url } => {
            let rest = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
            let host = rest.split('/').next().unwrap_or_default();
            // A push names the chart, not the index: the last segment of
            // its path is the chart (Harbor's `project/chart`).
            let last = pushed.path.rsplit('/').next().unwrap_or_default();
            pushed.host.is_some() && host_matches(host) && last.eq_ignore_ascii_case(chart)
        }
    }
}

/// One Application to reconcile, and the push that named it (None: the
/// Receiver's resources named it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selected {
    pub key: AppKey,
    pub push: Option<Announcement>,
}

/// The Applications of `namespace` among `candidates` that `resources` name
/// or whose chart one of `pushes` is, each once, by key.
pub fn select(
    namespace: &str,
    resources: &[ReceiverResource],
    pushes: &[Announcement],
    candidates: &[Candidate],
) -> Vec<Selected> {
    let mut selected: BTreeMap<AppKey, Option<Announcement>> = BTreeMap::new();
    for candidate in candidates {
        if candidate.key.namespace != namespace {
            continue;
        }
        let pushed = candidate.chart.as_ref().and_then(|(chart, repository)| {
            pushes
                .iter()
                .find(|push| chart_matches(chart, repository, &push.repository))
        });
        if let Some(push) = pushed {
            selected.insert(candidate.key.clone(), Some(push.clone()));
        } else if resources.iter().any(|r| names(r, candidate)) {
            selected.entry(candidate.key.clone()).or_insert(None);
        }
    }
    selected
        .into_iter()
        .map(|(key, push)| Selected { key, push })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(name: &str, labels: &[(&str, &str)], chart: Option<(&str, &str)>) -> Candidate {
        Candidate {
            key: AppKey::new("team", name),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            chart: chart
                .map(|(url, chart)| (chart.to_string(), Repository::parse(url, chart).unwrap())),
        }
    }

    fn push(reference: &str) -> Announcement {
        let (repository, tag) = RegistryRepo::from_reference(reference).unwrap();
        Announcement { repository, tag }
    }

    fn keys(selected: &[Selected]) -> Vec<&str> {
        selected.iter().map(|s| s.key.name.as_str()).collect()
    }

    fn by_name(name: &str) -> ReceiverResource {
        ReceiverResource {
            name: Some(name.into()),
            ..Default::default()
        }
    }

    #[test]
    fn resources_select_by_name_and_labels_in_the_receivers_namespace() {
        let apps = vec![
            candidate("web", &[("tier", "front")], None),
            candidate("api", &[("tier", "back")], None),
            candidate("db", &[("tier", "back"), ("env", "prod")], None),
        ];
        assert_eq!(
            keys(&select("team", &[by_name("web")], &[], &apps)),
            ["web"]
        );
        let labelled = ReceiverResource {
            name: Some("*".into()),
            match_labels: [("tier".to_string(), "back".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            keys(&select("team", std::slice::from_ref(&labelled), &[], &apps)),
            ["api", "db"]
        );
        // Another namespace's Receiver names none of them.
        assert!(select("other", &[by_name("web")], &[], &apps).is_empty());
        // Another kind is not an Application.
        let kustomization = ReceiverResource {
            kind: Some("Kustomization".into()),
            name: Some("web".into()),
            ..Default::default()
        };
        assert!(select("team", &[kustomization], &[], &apps).is_empty());
        assert!(is_bounded(&labelled));
        assert!(is_bounded(&by_name("web")));
        assert!(!is_bounded(&ReceiverResource::default()));
    }

    #[test]
    fn a_push_selects_the_oci_charts_of_that_repository() {
        let apps = vec![
            candidate("web", &[], Some(("oci://127.0.0.1:5000/charts", "web"))),
            candidate(
                "web-other-registry",
                &[],
                Some(("oci://ghcr.io/charts", "web")),
            ),
            candidate("api", &[], Some(("oci://127.0.0.1:5000/charts", "api"))),
            candidate("git", &[], None),
        ];
        let selected = select(
            "team",
            &[],
            &[push("127.0.0.1:5000/charts/web:1.1.0")],
            &apps,
        );
        assert_eq!(keys(&selected), ["web"]);
        assert_eq!(
            selected[0].push.as_ref().unwrap().tag.as_deref(),
            Some("1.1.0")
        );
        // A Harbor payload without a host matches on the path alone.
        let bare = Announcement {
            repository: RegistryRepo {
                host: None,
                path: "charts/web".into(),
            },
            tag: None,
        };
        assert_eq!(
            keys(&select("team", &[], &[bare], &apps)),
            ["web", "web-other-registry"]
        );
        // Docker Hub's names are one host.
        let hub = vec![candidate(
            "hub",
            &[],
            Some(("oci://registry-1.docker.io/acme", "web")),
        )];
        assert_eq!(
            keys(&select("team", &[], &[push("docker.io/acme/web:2")], &hub)),
            ["hub"]
        );
    }

    #[test]
    fn a_push_selects_a_helm_repositorys_chart_by_host_and_name() {
        let apps = vec![
            candidate(
                "web",
                &[],
                Some(("https://harbor.example.com/chartrepo/library", "web")),
            ),
            candidate(
                "api",
                &[],
                Some(("https://harbor.example.com/chartrepo/library", "api")),
            ),
            candidate(
                "elsewhere",
                &[],
                Some(("https://charts.example.net/library", "web")),
            ),
        ];
        assert_eq!(
            keys(&select(
                "team",
                &[],
                &[push("harbor.example.com/library/web:1.0.0")],
                &apps
            )),
            ["web"]
        );
    }

    #[test]
    fn resources_and_pushes_together_select_each_application_once() {
        let apps = vec![
            candidate("web", &[], Some(("oci://127.0.0.1:5000/charts", "web"))),
            candidate("api", &[], None),
        ];
        let selected = select(
            "team",
            &[by_name("web"), by_name("api")],
            &[push("127.0.0.1:5000/charts/web:1.1.0")],
            &apps,
        );
        assert_eq!(keys(&selected), ["api", "web"]);
        assert!(selected[0].push.is_none());
        assert!(selected[1].push.is_some(), "the push is kept for web");
    }
}
