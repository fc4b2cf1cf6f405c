//! Which cluster an Application deploys to (pure): `spec.destination.name`
//! (a registered cluster's name) or `spec.destination.server` (its URL), as
//! Argo CD's; neither, Argo CD's `in-cluster` or
//! `https://kubernetes.default.svc` means the cluster Setpoint runs in. A
//! registered cluster admits an Application only when its Secret allows the
//! Application's namespace.

use crate::api::Destination;

use super::secret::{Allowed, Entry, EntryError, normalize_server};

/// Argo CD's name for the cluster it runs in.
pub const IN_CLUSTER: &str = "in-cluster";
/// And that cluster's URL from inside it.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";

/// What an Application's destination asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Wanted {
    Local,
    Name(String),
    Server(String),
}

impl Wanted {
    pub fn of(destination: &Destination) -> Wanted {
        let name = destination
            .name
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty());
        let server = destination
            .server
            .as_deref()
            .map(normalize_server)
            .filter(|s| !s.is_empty());
        match (name, server) {
            (Some(name), _) if name != IN_CLUSTER => Wanted::Name(name.to_string()),
            (_, Some(server)) if server != IN_CLUSTER_SERVER && name.is_none() => {
                Wanted::Server(server)
            }
            _ => Wanted::Local,
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Wanted::Local)
    }

    /// Whether `entry` is the cluster this asks for.
    pub fn matches(&self, entry: &Entry) -> bool {
        match self {
            Wanted::Local => false,
            Wanted::Name(name) => &entry.name == name,
            Wanted::Server(server) => &entry.server == server,
        }
    }
}

impl std::fmt::Display for Wanted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wanted::Local => f.write_str(IN_CLUSTER),
            Wanted::Name(name) => f.write_str(name),
            Wanted::Server(server) => f.write_str(server),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DestinationError {
    #[error(
        "no registered cluster is {wanted}: register it with a Secret labelled setpoint.dev/secret-type=cluster in Setpoint's namespace"
    )]
    NotFound { wanted: String },
    #[error("the cluster {cluster} is registered twice ({first} and {second}): remove one")]
    Ambiguous {
        cluster: String,
        first: String,
        second: String,
    },
    #[error(
        "Applications of namespace {namespace} may not deploy to the cluster {cluster}: its Secret {secret} allows {rule}"
    )]
    NotAllowed {
        cluster: String,
        secret: String,
        namespace: String,
        rule: String,
    },
    #[error("the cluster {cluster} cannot be used: {source}")]
    Refused {
        cluster: String,
        #[source]
        source: EntryError,
    },
}

impl DestinationError {
    pub fn reason(&self) -> &'static str {
        match self {
            DestinationError::NotFound { .. } | DestinationError::Ambiguous { .. } => {
                "ClusterNotFound"
            }
            DestinationError::NotAllowed { .. } => "ClusterNotAllowed",
            DestinationError::Refused { .. } => "ClusterCredentialsRefused",
        }
    }
}

/// The registered cluster `wanted` names, when an Application of
/// `namespace` (`admin` when it is an admin namespace) may deploy to it.
pub fn resolve<'a>(
    wanted: &Wanted,
    namespace: &str,
    admin: bool,
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Result<&'a Entry, DestinationError> {
    let mut found: Option<&Entry> = None;
    for entry in entries.into_iter().filter(|e| wanted.matches(e)) {
        if let Some(first) = found {
            return Err(DestinationError::Ambiguous {
                cluster: wanted.to_string(),
                first: first.secret.clone(),
                second: entry.secret.clone(),
            });
        }
        found = Some(entry);
    }
    let entry = found.ok_or_else(|| DestinationError::NotFound {
        wanted: match wanted {
            Wanted::Server(server) => format!("at {server}"),
            other => format!("named {other}"),
        },
    })?;
    if !entry.allowed.admits(namespace, admin) {
        return Err(DestinationError::NotAllowed {
            cluster: entry.name.clone(),
            secret: entry.secret.clone(),
            namespace: namespace.to_string(),
            rule: rule(&entry.allowed),
        });
    }
    if let Err(source) = &entry.access {
        return Err(DestinationError::Refused {
            cluster: entry.name.clone(),
            source: source.clone(),
        });
    }
    Ok(entry)
}

fn rule(allowed: &Allowed) -> String {
    allowed.to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::cluster::secret::Access;

    fn entry(name: &str, server: &str, allowed: Allowed) -> Entry {
        Entry {
            name: name.into(),
            server: server.into(),
            secret: format!("{name}-secret"),
            allowed,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            access: Ok(Access::default()),
        }
    }

    fn destination(name: Option<&str>, server: Option<&str>) -> Destination {
        Destination {
            name: name.map(String::from),
            server: server.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn what_a_destination_asks_for() {
        assert_eq!(Wanted::of(&destination(None, None)), Wanted::Local);
        assert_eq!(
            Wanted::of(&destination(Some("in-cluster"), None)),
            Wanted::Local
        );
        assert_eq!(
            Wanted::of(&destination(None, Some("https://kubernetes.default.svc/"))),
            Wanted::Local
        );
        assert_eq!(
            Wanted::of(&destination(Some("staging"), None)),
            Wanted::Name("staging".into())
        );
        assert_eq!(
            Wanted::of(&destination(None, Some("https://10.0.0.1:6443/"))),
            Wanted::Server("https://10.0.0.1:6443".into())
        );
        // A name wins over a server, as in Argo CD, where both set is refused
        // by its API; here the name decides.
        assert_eq!(
            Wanted::of(&destination(Some("staging"), Some("https://x"))),
            Wanted::Name("staging".into())
        );
    }

    #[test]
    fn resolves_by_name_or_server_within_the_rule() {
        let entries = [
            entry("staging", "https://a", Allowed::All),
            entry(
                "prod",
                "https://b",
                Allowed::Namespaces(BTreeSet::from(["team-a".to_string()])),
            ),
            entry("core", "https://c", Allowed::AdminsOnly),
        ];
        let by_name = Wanted::Name("staging".into());
        assert_eq!(
            resolve(&by_name, "x", false, &entries).unwrap().name,
            "staging"
        );
        let by_server = Wanted::Server("https://b".into());
        assert_eq!(
            resolve(&by_server, "team-a", false, &entries).unwrap().name,
            "prod"
        );
        let error = resolve(&by_server, "team-b", false, &entries).unwrap_err();
        assert_eq!(error.reason(), "ClusterNotAllowed");
        assert_eq!(
            error.to_string(),
            "Applications of namespace team-b may not deploy to the cluster prod: its Secret prod-secret allows the namespaces team-a (setpoint.dev/allowed-namespaces)"
        );
        let core = Wanted::Name("core".into());
        assert!(resolve(&core, "team-a", false, &entries).is_err());
        assert!(resolve(&core, "setpoint", true, &entries).is_ok());
        let missing = resolve(&Wanted::Name("eu".into()), "x", true, &entries).unwrap_err();
        assert_eq!(missing.reason(), "ClusterNotFound");
        assert!(
            missing
                .to_string()
                .starts_with("no registered cluster is named eu")
        );
    }

    #[test]
    fn refused_credentials_and_duplicates_are_named() {
        let mut refused = entry("edge", "https://e", Allowed::All);
        refused.access = Err(EntryError::RunsProgram {
            secret: "edge-secret".into(),
            what: "exec",
        });
        let twice = [
            entry("dup", "https://d1", Allowed::All),
            entry("dup", "https://d2", Allowed::All),
        ];
        let error = resolve(&Wanted::Name("edge".into()), "x", true, [&refused]).unwrap_err();
        assert_eq!(error.reason(), "ClusterCredentialsRefused");
        assert!(
            error.to_string().contains("asks for exec credentials"),
            "{error}"
        );
        let error = resolve(&Wanted::Name("dup".into()), "x", true, &twice).unwrap_err();
        assert!(matches!(error, DestinationError::Ambiguous { .. }));
    }
}
