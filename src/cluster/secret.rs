//! A registered cluster, as its Secret declares it (pure): Argo CD's
//! declarative cluster Secret, read unchanged. The keys `name`, `server` and
//! `config`, the last a JSON object with `bearerToken` (or `username` and
//! `password`) and `tlsClientConfig` (`caData`, `certData`, `keyData`,
//! `insecure`, `serverName`). Credentials that would run a program
//! (`execProviderConfig`, `awsAuthConfig`, a kubeconfig's `exec` or
//! `auth-provider`: the class of Flux's CVE-2022-24817) are refused here,
//! never handed to a client.
//!
//! Which namespaces' Applications may target the cluster is the Secret's
//! annotation `setpoint.dev/allowed-namespaces` (comma-separated, or `*`);
//! without it, only the admin namespaces may.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::config::{
    AuthInfo, Cluster as KubeconfigCluster, Context as KubeconfigContext, Kubeconfig,
    NamedAuthInfo, NamedCluster, NamedContext,
};
use serde::Deserialize;

use crate::secret::Secret as Hidden;

/// The label that makes a Secret a cluster's, Setpoint's and Argo CD's.
pub const SECRET_TYPE_LABELS: [&str; 2] =
    ["setpoint.dev/secret-type", "argocd.argoproj.io/secret-type"];
/// That label's value.
pub const SECRET_TYPE_CLUSTER: &str = "cluster";
/// Which namespaces' Applications may deploy to the cluster.
pub const ALLOWED_NAMESPACES_ANNOTATION: &str = "setpoint.dev/allowed-namespaces";

/// What a cluster Secret says, credentials included (never printed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    /// The API server's URL, as Applications name it in
    /// `destination.server` (compared without a trailing slash).
    pub server: String,
    /// The Secret's own name, for messages.
    pub secret: String,
    pub allowed: Allowed,
    /// The Secret's labels, for selecting clusters.
    pub labels: BTreeMap<String, String>,
    /// The Secret's annotations: an ApplicationSet's cluster generator
    /// passes them on as parameters.
    pub annotations: BTreeMap<String, String>,
    /// The credentials, or why they are refused: a refused cluster is still
    /// registered, so its Applications say why instead of "not found".
    pub access: Result<Access, EntryError>,
}

/// Whose Applications may target a cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allowed {
    /// No annotation: the admin namespaces only.
    AdminsOnly,
    /// `*`: every namespace.
    All,
    Namespaces(BTreeSet<String>),
}

impl Allowed {
    fn parse(annotation: Option<&str>) -> Self {
        let Some(value) = annotation else {
            return Allowed::AdminsOnly;
        };
        let listed: BTreeSet<String> = value
            .split(',')
            .map(|ns| ns.trim().to_string())
            .filter(|ns| !ns.is_empty())
            .collect();
        if listed.contains("*") {
            Allowed::All
        } else {
            Allowed::Namespaces(listed)
        }
    }

    /// Whether an Application of `namespace` may target the cluster.
    pub fn admits(&self, namespace: &str, admin: bool) -> bool {
        admin
            || match self {
                Allowed::AdminsOnly => false,
                Allowed::All => true,
                Allowed::Namespaces(listed) => listed.contains(namespace),
            }
    }
}

impl fmt::Display for Allowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Allowed::AdminsOnly => write!(
                f,
                "only the admin namespaces (the Secret has no {ALLOWED_NAMESPACES_ANNOTATION} annotation)"
            ),
            Allowed::All => f.write_str("every namespace"),
            Allowed::Namespaces(listed) => write!(
                f,
                "the namespaces {} ({ALLOWED_NAMESPACES_ANNOTATION})",
                listed.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

/// How Setpoint authenticates to a cluster. `Debug` shows no secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub bearer_token: Option<Hidden>,
    pub username: Option<String>,
    pub password: Option<Hidden>,
    /// Base64 PEM, as in a kubeconfig's `*-data` keys.
    pub ca_data: Option<String>,
    pub cert_data: Option<String>,
    pub key_data: Option<Hidden>,
    pub insecure: bool,
    pub server_name: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("the cluster Secret {secret} has no `{key}` key")]
    MissingKey { secret: String, key: &'static str },
    #[error("the cluster Secret {secret}'s `{key}` is not UTF-8")]
    NotText { secret: String, key: &'static str },
    #[error("the cluster Secret {secret}'s `config` is not valid JSON: {message}")]
    InvalidConfig { secret: String, message: String },
    #[error("the cluster Secret {secret}'s `server` is not a URL: {server}")]
    InvalidServer { secret: String, server: String },
    #[error(
        "the cluster Secret {secret} asks for {what} credentials, which run a program; Setpoint never runs one: give a bearerToken or a client certificate"
    )]
    RunsProgram { secret: String, what: &'static str },
}

/// The `config` key: Argo CD's `ClusterConfig`, and the kubeconfig names of
/// the credential plugins so that they are refused by name too.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ConfigJson {
    bearer_token: Option<String>,
    username: Option<String>,
    password: Option<String>,
    tls_client_config: Option<TlsJson>,
    exec_provider_config: Option<serde_json::Value>,
    aws_auth_config: Option<serde_json::Value>,
    exec: Option<serde_json::Value>,
    #[serde(alias = "auth-provider")]
    auth_provider: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct TlsJson {
    ca_data: Option<String>,
    cert_data: Option<String>,
    key_data: Option<String>,
    #[serde(default)]
    insecure: bool,
    server_name: Option<String>,
}

impl Entry {
    /// Whether `secret` is labelled as a cluster's.
    pub fn is_cluster_secret(secret: &Secret) -> bool {
        let labels = secret.labels();
        SECRET_TYPE_LABELS
            .iter()
            .any(|label| labels.get(*label).map(String::as_str) == Some(SECRET_TYPE_CLUSTER))
    }

    /// The entry `secret` declares; an error when it names no cluster at
    /// all (no name or server). Refused credentials are kept in `access`.
    pub fn from_secret(secret: &Secret) -> Result<Entry, EntryError> {
        let secret_name = secret.name_any();
        let text = |key: &'static str| -> Result<Option<String>, EntryError> {
            let raw = secret
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .map(|bytes| bytes.0.clone())
                .or_else(|| {
                    secret
                        .string_data
                        .as_ref()
                        .and_then(|data| data.get(key))
                        .map(|s| s.clone().into_bytes())
                });
            raw.map(|bytes| {
                String::from_utf8(bytes).map_err(|_| EntryError::NotText {
                    secret: secret_name.clone(),
                    key,
                })
            })
            .transpose()
        };
        let required = |key: &'static str| -> Result<String, EntryError> {
            text(key)?
                .map(|value| value.trim().to_string())
                .filter(|value| !value.is_empty())
                .ok_or(EntryError::MissingKey {
                    secret: secret_name.clone(),
                    key,
                })
        };
        let name = required("name")?;
        let server = required("server")?;
        if server.parse::<http::Uri>().is_err() || !server.starts_with("http") {
            return Err(EntryError::InvalidServer {
                secret: secret_name,
                server,
            });
        }
        let access = match text("config") {
            Ok(config) => parse_access(&secret_name, config.as_deref().unwrap_or("{}")),
            Err(error) => Err(error),
        };
        Ok(Entry {
            name,
            server: normalize_server(&server),
            allowed: Allowed::parse(
                secret
                    .annotations()
                    .get(ALLOWED_NAMESPACES_ANNOTATION)
                    .map(String::as_str),
            ),
            labels: secret.labels().clone(),
            annotations: secret.annotations().clone(),
            secret: secret_name,
            access,
        })
    }

    /// A kubeconfig of this cluster alone, for kube's own loader (which
    /// reads the PEM data and TLS options as it does for any kubeconfig).
    /// Only the credentials accepted above are in it: no exec, no
    /// auth-provider, no file paths.
    pub fn kubeconfig(&self, access: &Access) -> Kubeconfig {
        let user = AuthInfo {
            token: access
                .bearer_token
                .as_ref()
                .map(|t| t.expose().to_string().into()),
            username: access.username.clone(),
            password: access
                .password
                .as_ref()
                .map(|p| p.expose().to_string().into()),
            client_certificate_data: access.cert_data.clone(),
            client_key_data: access
                .key_data
                .as_ref()
                .map(|k| k.expose().to_string().into()),
            ..Default::default()
        };
        Kubeconfig {
            clusters: vec![NamedCluster {
                name: self.name.clone(),
                cluster: Some(KubeconfigCluster {
                    server: Some(self.server.clone()),
                    insecure_skip_tls_verify: Some(access.insecure),
                    certificate_authority_data: access.ca_data.clone(),
                    tls_server_name: access.server_name.clone(),
                    ..Default::default()
                }),
                other: Default::default(),
            }],
            auth_infos: vec![NamedAuthInfo {
                name: self.name.clone(),
                auth_info: Some(user),
                other: Default::default(),
            }],
            contexts: vec![NamedContext {
                name: self.name.clone(),
                context: Some(KubeconfigContext {
                    cluster: self.name.clone(),
                    user: Some(self.name.clone()),
                    ..Default::default()
                }),
                other: Default::default(),
            }],
            current_context: Some(self.name.clone()),
            ..Default::default()
        }
    }
}

/// The URL as Applications' `destination.server` is compared with it.
pub fn normalize_server(server: &str) -> String {
    server.trim().trim_end_matches('/').to_string()
}

fn parse_access(secret: &str, config: &str) -> Result<Access, EntryError> {
    let parsed: ConfigJson =
        serde_json::from_str(config).map_err(|error| EntryError::InvalidConfig {
            secret: secret.to_string(),
            // serde_json's message names the line and column, never the
            // value: no credential in it.
            message: error.to_string(),
        })?;
    let runs = [
        (parsed.exec_provider_config.is_some(), "execProviderConfig"),
        (parsed.exec.is_some(), "exec"),
        (parsed.auth_provider.is_some(), "auth-provider"),
        (parsed.aws_auth_config.is_some(), "awsAuthConfig"),
    ];
    if let Some((_, what)) = runs.iter().find(|(set, _)| *set) {
        return Err(EntryError::RunsProgram {
            secret: secret.to_string(),
            what,
        });
    }
    let tls = parsed.tls_client_config.unwrap_or_default();
    let nonempty = |value: Option<String>| value.filter(|v| !v.trim().is_empty());
    Ok(Access {
        bearer_token: nonempty(parsed.bearer_token).map(Hidden::new),
        username: nonempty(parsed.username),
        password: nonempty(parsed.password).map(Hidden::new),
        ca_data: nonempty(tls.ca_data),
        cert_data: nonempty(tls.cert_data),
        key_data: nonempty(tls.key_data).map(Hidden::new),
        insecure: tls.insecure,
        server_name: nonempty(tls.server_name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(data: &[(&str, &str)], annotations: &[(&str, &str)]) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.name = Some("staging-secret".into());
        secret.metadata.labels = Some(BTreeMap::from([(
            "argocd.argoproj.io/secret-type".to_string(),
            "cluster".to_string(),
        )]));
        secret.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        secret.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        );
        secret
    }

    #[test]
    fn reads_an_argo_cd_cluster_secret() {
        let config = r#"{"bearerToken":"t0ken-value","tlsClientConfig":{"caData":"Q0E=","insecure":false,"serverName":"kubernetes"}}"#;
        let s = secret(
            &[
                ("name", "staging"),
                ("server", "https://127.0.0.1:6443/"),
                ("config", config),
            ],
            &[(ALLOWED_NAMESPACES_ANNOTATION, "team-a, team-b")],
        );
        assert!(Entry::is_cluster_secret(&s));
        let entry = Entry::from_secret(&s).unwrap();
        assert_eq!(entry.name, "staging");
        assert_eq!(entry.server, "https://127.0.0.1:6443");
        let access = entry.access.clone().unwrap();
        assert_eq!(
            access.bearer_token.as_ref().unwrap().expose(),
            "t0ken-value"
        );
        assert_eq!(access.ca_data.as_deref(), Some("Q0E="));
        assert_eq!(access.server_name.as_deref(), Some("kubernetes"));
        assert!(entry.allowed.admits("team-b", false));
        assert!(!entry.allowed.admits("team-c", false));
        assert!(entry.allowed.admits("team-c", true));
        // No credential in its Debug form, nor in the kubeconfig's.
        let shown = format!("{entry:?} {:?}", entry.kubeconfig(&access));
        assert!(!shown.contains("t0ken-value"), "{shown}");
    }

    #[test]
    fn the_setpoint_label_counts_and_others_do_not() {
        let mut s = secret(&[("name", "a"), ("server", "https://a")], &[]);
        s.metadata.labels = Some(BTreeMap::from([(
            "setpoint.dev/secret-type".to_string(),
            "cluster".to_string(),
        )]));
        assert!(Entry::is_cluster_secret(&s));
        s.metadata.labels = Some(BTreeMap::from([(
            "setpoint.dev/secret-type".to_string(),
            "repository".to_string(),
        )]));
        assert!(!Entry::is_cluster_secret(&s));
    }

    #[test]
    fn credentials_that_run_a_program_are_refused_by_name() {
        for (key, what) in [
            ("execProviderConfig", "execProviderConfig"),
            ("exec", "exec"),
            ("auth-provider", "auth-provider"),
            ("authProvider", "auth-provider"),
            ("awsAuthConfig", "awsAuthConfig"),
        ] {
            let config = format!(r#"{{"{key}": {{"command": "/bin/sh", "args": ["-c", "id"]}}}}"#);
            let s = secret(
                &[("name", "x"), ("server", "https://x"), ("config", &config)],
                &[],
            );
            let entry = Entry::from_secret(&s).unwrap();
            let error = entry.access.unwrap_err();
            assert_eq!(
                error,
                EntryError::RunsProgram {
                    secret: "staging-secret".into(),
                    what
                }
            );
            assert!(error.to_string().contains("never runs one"), "{error}");
        }
    }

    #[test]
    fn a_secret_without_a_name_or_server_is_no_cluster() {
        let error = Entry::from_secret(&secret(&[("server", "https://x")], &[])).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the cluster Secret staging-secret has no `name` key"
        );
        let error = Entry::from_secret(&secret(&[("name", "x"), ("server", "not a url")], &[]))
            .unwrap_err();
        assert!(matches!(error, EntryError::InvalidServer { .. }), "{error}");
    }

    #[test]
    fn broken_config_json_is_named_without_its_content() {
        let s = secret(
            &[
                ("name", "x"),
                ("server", "https://x"),
                ("config", r#"{"bearerToken": "s3cret"#),
            ],
            &[],
        );
        let error = Entry::from_secret(&s).unwrap().access.unwrap_err();
        let shown = error.to_string();
        assert!(
            shown.starts_with("the cluster Secret staging-secret's `config` is not valid JSON")
        );
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn allowed_namespaces() {
        assert_eq!(Allowed::parse(None), Allowed::AdminsOnly);
        assert_eq!(Allowed::parse(Some("a,*")), Allowed::All);
        assert!(!Allowed::parse(Some("")).admits("a", false));
        assert!(Allowed::parse(Some("*")).admits("anything", false));
        assert!(!Allowed::AdminsOnly.admits("a", false));
    }
}
