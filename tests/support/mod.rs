//! What every integration test needs: a client for the local control plane
//! (`make cluster-up`), a namespace of its own, a RabbitMQ queue prefix of its
//! own, a fresh Git repository, and `wait_for`.
//!
//! Each test binary uses a different part of this module.
#![allow(dead_code, unused_imports)]

pub mod app;
pub mod appset;
pub mod charts;
pub mod git;
pub mod github;
pub mod gitlab;
pub mod process;
pub mod remote;
pub mod viewer;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

pub use git::GitRepo;

/// The admin kubeconfig `make cluster-up` writes; `KUBECONFIG` overrides it.
pub fn kubeconfig_path() -> PathBuf {
    std::env::var_os("KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cluster/kubeconfig"))
}

pub async fn kube_config() -> Config {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; start the local control plane with `make cluster-up`",
            path.display()
        )
    });
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a valid kubeconfig")
}

pub async fn kube_client() -> Client {
    Client::try_from(kube_config().await).expect("a kube client")
}

/// A name no other test (in this or another process) uses: `prefix-<pid>-<n>`.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{prefix}-{}-{n}-{:04x}", std::process::id(), nanos & 0xffff)
}

/// A namespace for one test, deleted when the test ends (pass or fail).
pub struct TestNamespace {
    pub name: String,
    pub client: Client,
}

impl TestNamespace {
    pub async fn new(prefix: &str) -> Self {
        let client = kube_client().await;
        let name = unique_name(prefix);
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { "setpoint.dev/test": "true" } }
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        Self { name, client }
    }

    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // The test's runtime may be shutting down: delete from a thread of our own.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    let client = kube_client().await;
                    let _ = Api::<Namespace>::all(client)
                        .delete(&name, &DeleteParams::background())
                        .await;
                });
            }
        })
        .join();
    }
}

/// The broker `make rabbitmq-up` starts, in the virtual host `make test`
/// empties before each run (`tests/broker/rabbitmq.sh fresh-vhost
/// setpoint-test`), so the queues tests leave do not pile up over runs;
/// `SETPOINT_TEST_AMQP_URL` overrides it.
pub fn amqp_url() -> String {
    std::env::var("SETPOINT_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/setpoint-test".to_string())
}

/// The password of the broker user `setpoint-test` that `make test` creates
/// with the test vhost: a string found nowhere else, so a test can look for
/// it in what Setpoint wrote.
pub const AMQP_TEST_PASSWORD: &str = "amqp-pw-7c1e9b3f";

/// The test vhost as user `setpoint-test`.
pub fn amqp_url_with_password() -> String {
    format!("amqp://setpoint-test:{AMQP_TEST_PASSWORD}@127.0.0.1:5672/setpoint-test")
}

/// The queue type the processes under test declare (they read
/// `SETPOINT_AMQP_QUEUE_TYPE` too): quorum unless the variable says classic,
/// so a test runs with either.
pub fn amqp_queue_type() -> setpoint::queue::amqp::QueueType {
    std::env::var("SETPOINT_AMQP_QUEUE_TYPE")
        .ok()
        .map(|kind| {
            kind.parse()
                .expect("SETPOINT_AMQP_QUEUE_TYPE is classic or quorum")
        })
        .unwrap_or_default()
}

/// The event queue as the processes under test declare it under `prefix`
/// (the retry delays are part of the topology), once RabbitMQ answers.
pub async fn amqp_queue(
    prefix: &str,
    retry: setpoint::queue::RetryPolicy,
) -> setpoint::queue::amqp::AmqpQueue {
    use setpoint::queue::amqp::{AmqpQueue, AmqpSettings};
    let queue = AmqpQueue::connect(AmqpSettings {
        url: amqp_url(),
        queue_type: amqp_queue_type(),
        prefix: prefix.to_string(),
        retry,
        ..AmqpSettings::default()
    })
    .await;
    assert!(
        queue.wait_ready(Duration::from_secs(20)).await,
        "RabbitMQ is up (make rabbitmq-up)"
    );
    queue
}

/// A prefix for the exchanges and queues of one test, so tests share the
/// broker without seeing each other's messages.
pub fn amqp_prefix(test: &str) -> String {
    unique_name(&format!("setpoint-test-{test}"))
}

/// Polls `check` until it returns `Ok`, or panics at the deadline with what
/// it was waiting for and the last state `check` reported.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    let mut pause = Duration::from_millis(20);
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(state) => state,
        };
        if start.elapsed() >= deadline {
            panic!("timed out after {deadline:?} waiting for {what}; last state: {last}");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(250));
    }
}

/// A ResourceQuota `no-pods` of 0 pods in `ns`, returned once the API
/// server enforces it (a pod created just before its admission cache has
/// it would slip through): a server-side dry run of a pod is refused.
pub async fn no_pods_quota(ns: &TestNamespace) {
    use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "no-pods" },
        "spec": { "hard": { "pods": "0" } }
    }))
    .unwrap();
    ns.api::<ResourceQuota>()
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the quota");
    let probe: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "quota-probe" },
        "spec": { "containers": [{ "name": "probe", "image": "probe:1" }] }
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the quota enforced", Duration::from_secs(60), || async {
        match ns.api::<Pod>().create(&dry_run, &probe).await {
            // Not any 403: a new namespace refuses pods until its default
            // service account exists.
            Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("exceeded quota") => {
                Ok(())
            }
            other => Err(format!("a pod is still admitted: {:?}", other.map(|_| ()))),
        }
    })
    .await;
}
