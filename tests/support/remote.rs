//! The other local control planes (`make clusters-up`: `.cluster-staging`
//! and `.cluster-prod`, each a whole control plane of its own from
//! `tests/controlplane/cluster.sh` with its own `CLUSTER_DIR`), and cluster
//! Secrets registering them, as an Argo CD user declares them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use super::TestNamespace;

/// One of the other control planes.
pub struct Remote {
    pub dir: PathBuf,
    /// Its API server's URL (`https://127.0.0.1:PORT`).
    pub server: String,
    pub client: Client,
}

impl Remote {
    /// The control plane `make clusters-up` started as `.cluster-<name>`
    /// (`SETPOINT_TEST_CLUSTERS_DIR` moves their parent).
    pub async fn named(name: &str) -> Remote {
        let parent = std::env::var_os("SETPOINT_TEST_CLUSTERS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
        let dir = parent.join(format!(".cluster-{name}"));
        let path = dir.join("kubeconfig");
        let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
            panic!(
                "cannot read {}: {e}; start the other control planes with `make clusters-up`",
                path.display()
            )
        });
        let server = kubeconfig.clusters[0]
            .cluster
            .as_ref()
            .and_then(|c| c.server.clone())
            .expect("a server in the kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("a client config");
        Remote {
            dir,
            server,
            client: Client::try_from(config).expect("a client"),
        }
    }

    fn pem(&self, file: &str) -> String {
        let path = self.dir.join("pki").join(file);
        STANDARD.encode(std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
    }

    /// Argo CD's `config` with the control plane's admin client certificate
    /// (system:masters).
    pub fn certificate_config(&self) -> String {
        serde_json::json!({
            "tlsClientConfig": {
                "caData": self.pem("ca.crt"),
                "certData": self.pem("admin.crt"),
                "keyData": self.pem("admin.key"),
            }
        })
        .to_string()
    }

    /// Argo CD's `config` with a bearer token, checking the server's
    /// certificate against the control plane's CA.
    pub fn token_config(&self, token: &str) -> String {
        serde_json::json!({
            "bearerToken": token,
            "tlsClientConfig": { "caData": self.pem("ca.crt") }
        })
        .to_string()
    }

    /// A token of a cluster-admin service account `name` (kube-system).
    pub async fn admin_token(&self, name: &str) -> String {
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), "kube-system");
        let account: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        let _ = accounts.create(&PostParams::default(), &account).await;
        let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}],
        }))
        .unwrap();
        let _ = Api::<ClusterRoleBinding>::all(self.client.clone())
            .create(&PostParams::default(), &binding)
            .await;
        let request = k8s_openapi::api::authentication::v1::TokenRequest {
            spec: Some(k8s_openapi::api::authentication::v1::TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer = accounts
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .expect("a token");
        answer
            .status
            .and_then(|s| s.token)
            .expect("a token in the answer")
    }

    /// The namespace `name` on this control plane, deleted when the guard
    /// is dropped.
    pub async fn namespace(&self, name: &str) -> RemoteNamespace {
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { "setpoint.dev/test": "true" } }
        }))
        .unwrap();
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name} on {}: {e}", self.server));
        RemoteNamespace {
            name: name.to_string(),
            client: self.client.clone(),
            dir: self.dir.clone(),
        }
    }
}

/// A namespace on another control plane, deleted at the end of the test.
pub struct RemoteNamespace {
    pub name: String,
    pub client: Client,
    dir: PathBuf,
}

impl RemoteNamespace {
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for RemoteNamespace {
    fn drop(&mut self) {
        // A client of the deleting thread's own runtime: the test's may be
        // the one waiting here.
        let (name, dir) = (self.name.clone(), self.dir.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    let Ok(kubeconfig) = Kubeconfig::read_from(dir.join("kubeconfig")) else {
                        return;
                    };
                    let options = KubeConfigOptions::default();
                    let Ok(config) = Config::from_custom_kubeconfig(kubeconfig, &options).await
                    else {
                        return;
                    };
                    let Ok(client) = Client::try_from(config) else {
                        return;
                    };
                    let _ = Api::<Namespace>::all(client)
                        .delete(&name, &DeleteParams::background())
                        .await;
                });
            }
        })
        .join();
    }
}

/// Registers (or updates) a cluster in `ns` by a Secret labelled as Argo
/// CD labels its cluster Secrets; `allowed` is the allowed-namespaces
/// annotation.
pub async fn register(
    ns: &TestNamespace,
    secret: &str,
    name: &str,
    server: &str,
    config: &str,
    allowed: Option<&str>,
) {
    let annotations: BTreeMap<String, String> = allowed
        .map(|a| BTreeMap::from([("setpoint.dev/allowed-namespaces".to_string(), a.to_string())]))
        .unwrap_or_default();
    let body: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": secret,
            "labels": {"argocd.argoproj.io/secret-type": "cluster"},
            "annotations": annotations,
        },
        "data": {
            "name": STANDARD.encode(name),
            "server": STANDARD.encode(server),
            "config": STANDARD.encode(config),
        },
    }))
    .unwrap();
    ns.api::<Secret>()
        .patch(
            secret,
            &PatchParams::apply("setpoint-tests").force(),
            &Patch::Apply(&body),
        )
        .await
        .expect("apply the cluster Secret");
}
