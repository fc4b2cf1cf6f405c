//! Credentials for an Application's source: a Git repository's, a chart
//! repository's.

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::api::Application;
use crate::context::Context;
use crate::source::chart::Auth;
use crate::source::git::Credentials;
use crate::tenancy::Identity;

use super::ReconcileError;

/// Git credentials from the Secret the Application names: `username` and
/// `password`, or a `token` (sent as the password of user `git`), read from
/// its own namespace as its identity (`client`). Without one, the configured
/// credentials, where the tenancy settings let this identity use them.
pub(super) async fn credentials(
    ctx: &Context,
    app: &Application,
    identity: &Identity,
    client: &Client,
) -> Result<Option<Credentials>, ReconcileError> {
    let Some(name) = app.spec.source.credentials_secret.as_deref() else {
        let allowed = ctx
            .tenancy
            .may_use_global_credentials(identity, &app.spec.source.repo_url);
        return Ok(ctx.git_credentials.clone().filter(|_| allowed));
    };
    let keys = SecretKeys::read(app, client, name).await?;
    let username = keys.username.unwrap_or_else(|| "git".into());
    match keys.password.or(keys.token) {
        Some(password) => Ok(Some(Credentials { username, password })),
        None => Err(keys
            .secret
            .error("it has neither a password nor a token key")),
    }
}

/// A chart repository's credentials, from the Secret the Application names
/// (read from its own namespace as its identity, `client`): `username` and
/// `password` as basic auth, else a bearer `token`. The global Git
/// credentials are never sent to a chart repository.
pub(crate) async fn chart_auth(
    app: &Application,
    client: &Client,
) -> Result<Option<Auth>, ReconcileError> {
    let Some(name) = app.spec.source.credentials_secret.as_deref() else {
        return Ok(None);
    };
    let keys = SecretKeys::read(app, client, name).await?;
    match (keys.username, keys.password, keys.token) {
        (Some(username), Some(password), _) => Ok(Some(Auth::Basic { username, password })),
        (_, None, Some(token)) => Ok(Some(Auth::Bearer(token))),
        _ => Err(keys
            .secret
            .error("it has neither username and password nor a token key")),
    }
}

/// The Secret an Application names, for its error messages.
struct SecretRef {
    namespace: String,
    name: String,
}

impl SecretRef {
    fn error(&self, message: impl Into<String>) -> ReconcileError {
        ReconcileError::Credentials {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            message: message.into(),
        }
    }
}

/// The `username`, `password` and `token` keys (trimmed) of the Secret
/// `name` in the Application's own namespace, read as its identity
/// (`client`).
struct SecretKeys {
    secret: SecretRef,
    username: Option<String>,
    password: Option<String>,
    token: Option<String>,
}

impl SecretKeys {
    async fn read(app: &Application, client: &Client, name: &str) -> Result<Self, ReconcileError> {
        let secret = SecretRef {
            namespace: app
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".into()),
            name: name.to_string(),
        };
        let data = Api::<Secret>::namespaced(client.clone(), &secret.namespace)
            .get(name)
            .await
            .map_err(|e| secret.error(crate::report::events::truncate(&e.to_string(), 200)))?
            .data
            .unwrap_or_default();
        let text = |key: &str| {
            data.get(key)
                .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
        };
        Ok(Self {
            username: text("username"),
            password: text("password"),
            token: text("token"),
            secret,
        })
    }
}
