//! Tenancy: who an Application acts as. Applications of the admin
//! namespaces act with Setpoint's own rights; every other Application acts
//! as a service account of its own namespace, by Kubernetes impersonation,
//! so that the API server's RBAC decides what a tenant may do. Where a
//! tenant's source may come from (no local paths, no global credentials for
//! repositories it was not granted) is decided here too.
//!
//! Pure, except for `impersonating`, which wraps a client.

use std::collections::BTreeSet;

use http::{HeaderValue, Request};
use kube::Client;
use kube::client::Body;

use crate::api::Application;
use crate::source::repo_url::normalize_url;

/// `--admin-namespaces` etc.: the command-line face of `Tenancy`, shared by
/// every subcommand.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct TenancyOptions {
    /// Namespaces whose Applications act with Setpoint's own rights
    /// (comma-separated; `*` makes every namespace one, for a cluster with a
    /// single tenant). Default: the namespace Setpoint runs in
    /// (`POD_NAMESPACE`, else the kubeconfig's namespace).
    #[arg(
        long,
        global = true,
        env = "SETPOINT_ADMIN_NAMESPACES",
        value_delimiter = ','
    )]
    pub admin_namespaces: Vec<String>,
    /// The service account of an Application's namespace that a tenant
    /// Application acts as when it names none (`spec.serviceAccountName`).
    #[arg(
        long,
        global = true,
        env = "SETPOINT_DEFAULT_SERVICE_ACCOUNT",
        default_value = "default"
    )]
    pub default_service_account: String,
    /// Repository URL prefixes (`https://github.com/acme`) for which tenant
    /// Applications may use the configured Git credentials; Applications of
    /// admin namespaces always may.
    #[arg(
        long,
        global = true,
        env = "SETPOINT_GLOBAL_CREDENTIALS_FOR",
        value_delimiter = ','
    )]
    pub global_credentials_for: Vec<String>,
    /// Accept repositories on the local filesystem (paths and `file://`):
    /// for tests and demos, never for a shared installation.
    #[arg(long, global = true, env = "SETPOINT_ALLOW_LOCAL_REPOS")]
    pub allow_local_repos: bool,
}

impl TenancyOptions {
    /// The settings, with the admin namespaces defaulted to the namespace
    /// Setpoint runs in: `POD_NAMESPACE`, else `namespace` (the
    /// kubeconfig's).
    pub fn resolve(&self, namespace: &str) -> Tenancy {
        let listed: Vec<String> = self
            .admin_namespaces
            .iter()
            .map(|ns| ns.trim().to_string())
            .filter(|ns| !ns.is_empty())
            .collect();
        let admins = if listed.iter().any(|ns| ns == ALL) {
            Admins::All
        } else if listed.is_empty() {
            let own = std::env::var("POD_NAMESPACE")
                .ok()
                .filter(|ns| !ns.is_empty())
                .unwrap_or_else(|| namespace.to_string());
            Admins::Namespaces(BTreeSet::from([own]))
        } else {
            Admins::Namespaces(listed.into_iter().collect())
        };
        Tenancy {
            admins,
            default_service_account: self.default_service_account.clone(),
            global_credentials_for: self
                .global_credentials_for
                .iter()
                .filter(|p| !p.trim().is_empty())
                .map(|p| normalize_url(p))
                .collect(),
            allow_local: self.allow_local_repos,
        }
    }
}

/// `--admin-namespaces '*'`: every namespace is an admin namespace.
pub const ALL: &str = "*";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admins {
    All,
    Namespaces(BTreeSet<String>),
}

/// Who may do what; one per process, in the shared context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenancy {
    pub admins: Admins,
    pub default_service_account: String,
    /// Normalized repository keys (`github.com/acme`).
    pub global_credentials_for: Vec<String>,
    pub allow_local: bool,
}

impl Default for Tenancy {
    /// Secure: no admin namespace, no local repositories.
    fn default() -> Self {
        Tenancy {
            admins: Admins::Namespaces(BTreeSet::new()),
            default_service_account: "default".into(),
            global_credentials_for: Vec::new(),
            allow_local: false,
        }
    }
}

/// Whom the requests made for one Application are made as.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// Setpoint's own rights (an Application of an admin namespace).
    Setpoint,
    /// A service account of the Application's own namespace.
    ServiceAccount { namespace: String, name: String },
}

impl Identity {
    /// The user name the API server knows it by.
    pub fn username(&self) -> String {
        match self {
            Identity::Setpoint => "setpoint".into(),
            Identity::ServiceAccount { namespace, name } => {
                format!("system:serviceaccount:{namespace}:{name}")
            }
        }
    }

    pub fn is_admin(&self) -> bool {
        matches!(self, Identity::Setpoint)
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.username())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TenancyError {
    #[error(
        "spec.serviceAccountName {name:?} is not the name of a service account of namespace {namespace}: {reason}"
    )]
    ServiceAccount {
        namespace: String,
        name: String,
        reason: &'static str,
    },
    #[error(
        "repository {url} is on Setpoint's own filesystem; local repositories are refused unless --allow-local-repos (SETPOINT_ALLOW_LOCAL_REPOS) is on"
    )]
    LocalRepository { url: String },
}

impl TenancyError {
    pub fn reason(&self) -> &'static str {
        match self {
            TenancyError::ServiceAccount { .. } => "InvalidServiceAccount",
            TenancyError::LocalRepository { .. } => "LocalRepositoryRefused",
        }
    }
}

impl Tenancy {
    /// Every namespace is an admin namespace (a single-tenant cluster; tests).
    pub fn single_tenant() -> Self {
        Tenancy {
            admins: Admins::All,
            allow_local: true,
            ..Tenancy::default()
        }
    }

    pub fn is_admin_namespace(&self, namespace: &str) -> bool {
        match &self.admins {
            Admins::All => true,
            Admins::Namespaces(namespaces) => namespaces.contains(namespace),
        }
    }

    /// The identity `app` acts as: Setpoint for an admin namespace, else the
    /// service account it names (or the default) in its own namespace. A
    /// name that could point anywhere else is refused.
    pub fn identity(&self, app: &Application) -> Result<Identity, TenancyError> {
        let namespace = app.metadata.namespace.as_deref().unwrap_or("default");
        if self.is_admin_namespace(namespace) {
            return Ok(Identity::Setpoint);
        }
        let name = app
            .spec
            .service_account_name
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(&self.default_service_account);
        if let Err(reason) = check_name(name) {
            return Err(TenancyError::ServiceAccount {
                namespace: namespace.into(),
                name: name.into(),
                reason,
            });
        }
        Ok(Identity::ServiceAccount {
            namespace: namespace.into(),
            name: name.into(),
        })
    }

    /// Refuses a repository on the local filesystem unless allowed.
    pub fn check_source(&self, repo_url: &str) -> Result<(), TenancyError> {
        if !self.allow_local && is_local(repo_url) {
            return Err(TenancyError::LocalRepository {
                url: repo_url.trim().to_string(),
            });
        }
        Ok(())
    }

    /// Whether the globally configured Git credentials may be sent for
    /// `repo_url` on behalf of `identity`: always for an admin Application;
    /// for a tenant, only to repositories under a configured prefix (whole
    /// path segments: `github.com/acme` covers `github.com/acme/web`, not
    /// `github.com/acme-evil/web`).
    pub fn may_use_global_credentials(&self, identity: &Identity, repo_url: &str) -> bool {
        if identity.is_admin() {
            return true;
        }
        let key = normalize_url(repo_url);
        self.global_credentials_for.iter().any(|prefix| {
            let prefix = prefix.trim_end_matches('/');
            key == prefix
                || key
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }
}

/// A repository on the local filesystem: a path or a `file://` URL.
pub fn is_local(repo_url: &str) -> bool {
    normalize_url(repo_url).starts_with("file://")
}

/// A service account name is a DNS subdomain (RFC 1123): no `:` or `/` that
/// could name another namespace's account or another kind of user.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.len() > 253 {
        return Err("longer than 253 characters");
    }
    let valid = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    if valid {
        Ok(())
    } else {
        Err(
            "a name has only lowercase letters, digits, '-' and '.', and names an account of the Application's own namespace",
        )
    }
}

/// A client that sends every request of `base` as `identity` (the
/// `Impersonate-User` header; the API server adds the service account's
/// groups). It shares `base`'s connections and request counter.
pub fn impersonating(base: &Client, identity: &Identity) -> Client {
    if identity.is_admin() {
        return base.clone();
    }
    let user = HeaderValue::from_str(&identity.username())
        .expect("a checked service account name is a valid header value");
    let inner = base.clone();
    let service = tower::service_fn(move |mut request: Request<Body>| {
        let inner = inner.clone();
        request
            .headers_mut()
            .insert("impersonate-user", user.clone());
        async move { inner.send(request).await }
    });
    Client::new(service, base.default_namespace().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ApplicationSpec;

    fn app(namespace: &str, service_account: Option<&str>) -> Application {
        let mut app = Application::new(
            "web",
            ApplicationSpec {
                service_account_name: service_account.map(String::from),
                ..Default::default()
            },
        );
        app.metadata.namespace = Some(namespace.into());
        app
    }

    fn tenancy(admins: &[&str]) -> Tenancy {
        TenancyOptions {
            admin_namespaces: admins.iter().map(|s| s.to_string()).collect(),
            default_service_account: "default".into(),
            global_credentials_for: vec!["https://github.com/acme".into()],
            allow_local_repos: false,
        }
        .resolve("setpoint-system")
    }

    #[test]
    fn admin_namespaces_act_as_setpoint_and_others_as_their_service_account() {
        let t = tenancy(&["setpoint", "platform"]);
        assert_eq!(t.identity(&app("platform", None)), Ok(Identity::Setpoint));
        assert_eq!(
            t.identity(&app("team-a", None)).unwrap().username(),
            "system:serviceaccount:team-a:default"
        );
        assert_eq!(
            t.identity(&app("team-a", Some("deployer")))
                .unwrap()
                .username(),
            "system:serviceaccount:team-a:deployer"
        );
        // An admin namespace's Application naming an account still acts as Setpoint.
        assert_eq!(
            t.identity(&app("setpoint", Some("x"))),
            Ok(Identity::Setpoint)
        );
    }

    #[test]
    fn the_default_admin_namespace_is_the_one_setpoint_runs_in() {
        // POD_NAMESPACE is not set in unit tests: the kubeconfig's namespace.
        if std::env::var_os("POD_NAMESPACE").is_some() {
            return;
        }
        let t = tenancy(&[]);
        assert!(t.is_admin_namespace("setpoint-system"));
        assert!(!t.is_admin_namespace("team-a"));
        assert!(tenancy(&["*"]).is_admin_namespace("anything"));
    }

    #[test]
    fn a_service_account_of_another_namespace_cannot_be_named() {
        let t = tenancy(&["setpoint"]);
        for name in [
            "system:serviceaccount:kube-system:admin",
            "kube-system/admin",
            "Admin",
            "-x",
            "a..b",
        ] {
            let error = t.identity(&app("team-a", Some(name))).unwrap_err();
            assert_eq!(error.reason(), "InvalidServiceAccount", "{name}");
            assert!(error.to_string().contains("team-a"), "{error}");
        }
    }

    #[test]
    fn local_repositories_are_refused_unless_allowed() {
        let t = tenancy(&["setpoint"]);
        for url in ["/etc", "file:///srv/repo", "./repo", "FILE://localhost/x"] {
            assert_eq!(
                t.check_source(url).unwrap_err().reason(),
                "LocalRepositoryRefused",
                "{url}"
            );
        }
        for url in [
            "https://github.com/acme/web",
            "git@github.com:acme/web.git",
            "ssh://git@host/x",
        ] {
            assert!(t.check_source(url).is_ok(), "{url}");
        }
        let allowed = Tenancy {
            allow_local: true,
            ..t
        };
        assert!(allowed.check_source("/srv/repo").is_ok());
    }

    #[test]
    fn global_credentials_only_for_admins_and_granted_prefixes() {
        let t = tenancy(&["setpoint"]);
        let tenant = t.identity(&app("team-a", None)).unwrap();
        assert!(t.may_use_global_credentials(&Identity::Setpoint, "https://example.com/x"));
        assert!(t.may_use_global_credentials(&tenant, "https://github.com/acme/web.git"));
        assert!(t.may_use_global_credentials(&tenant, "git@github.com:acme/web"));
        assert!(!t.may_use_global_credentials(&tenant, "https://github.com/acme-evil/web"));
        assert!(!t.may_use_global_credentials(&tenant, "https://github.com/other/web"));
        assert!(
            !Tenancy::default().may_use_global_credentials(&tenant, "https://github.com/acme/web")
        );
    }
}
