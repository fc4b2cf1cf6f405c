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
    let namespace = app
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let fail = |message: String| ReconcileError::Credentials {
        namespace: namespace.clone(),
        name: name.to_string(),
        message,
    };
    let secret = Api::<Secret>::namespaced(client.clone(), &namespace)
        .get(name)
        .await
        .map_err(|e| fail(crate::report::events::truncate(&e.to_string(), 200)))?;
    let data = secret.data.unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
    };
    match (text("username"), text("password"), text("token")) {
        (username, Some(password), _) => Ok(Some(Credentials {
            username: username.unwrap_or_else(|| "git".into()),
            password,
        })),
        (username, None, Some(token)) => Ok(Some(Credentials {
            username: username.unwrap_or_else(|| "git".into()),
            password: token,
        })),
        _ => Err(fail("it has neither a password nor a token key".into())),
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
    let namespace = app
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let fail = |message: String| ReconcileError::Credentials {
        namespace: namespace.clone(),
        name: name.to_string(),
        message,
    };
    let secret = Api::<Secret>::namespaced(client.clone(), &namespace)
        .get(name)
        .await
        .map_err(|e| fail(crate::report::events::truncate(&e.to_string(), 200)))?;
    let data = secret.data.unwrap_or_default();
    let text = |key: &str| {
        data.get(key)
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
    };
    match (text("username"), text("password"), text("token")) {
        (Some(username), Some(password), _) => Ok(Some(Auth::Basic { username, password })),
        (_, None, Some(token)) => Ok(Some(Auth::Bearer(token))),
        _ => Err(fail(
            "it has neither username and password nor a token key".into(),
        )),
    }
}
