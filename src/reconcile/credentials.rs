//! Git credentials for an Application's source.

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::api::Application;
use crate::context::Context;
use crate::source::git::Credentials;

use super::ReconcileError;

/// Git credentials from the Secret the Application names: `username` and
/// `password`, or a `token` (sent as the password of user `git`).
pub(super) async fn credentials(
    ctx: &Context,
    app: &Application,
) -> Result<Option<Credentials>, ReconcileError> {
    let Some(name) = app.spec.source.credentials_secret.as_deref() else {
        return Ok(ctx.git_credentials.clone());
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
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), &namespace)
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
