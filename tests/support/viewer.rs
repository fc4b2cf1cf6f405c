//! A dashboard viewer: a service account allowed some verbs on
//! Applications in one namespace, and its token.

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::PostParams;

use super::TestNamespace;

/// A service account in `ns` with a Role allowing `verbs` on Applications
/// there, and a token for it from the TokenRequest API (what `kubectl
/// create token` asks for).
pub async fn viewer(ns: &TestNamespace, name: &str, verbs: &[&str]) -> String {
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } })).unwrap();
    let accounts = ns.api::<ServiceAccount>();
    accounts.create(&PostParams::default(), &sa).await.unwrap();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "rules": [{ "apiGroups": ["setpoint.dev"], "resources": ["applications"], "verbs": verbs }],
    }))
    .unwrap();
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
        "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": ns.name }],
    }))
    .unwrap();
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("a token");
    answer.status.and_then(|s| s.token).expect("a token")
}
