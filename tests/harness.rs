//! The test harness itself is real: the local control plane schedules pods
//! that kwok runs, RabbitMQ confirms and delivers persistent messages, and the
//! Git helper makes real commits.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use support::{GitRepo, TestNamespace, wait_for};

fn deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": { "containers": [{ "name": "app", "image": "registry.invalid/app:1" }] }
            }
        }
    }))
    .unwrap()
}

/// (pods that exist, pods Running on the kwok node)
async fn pod_counts(ns: &TestNamespace, app: &str) -> Result<(usize, usize), String> {
    let pods = ns
        .api::<Pod>()
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map_err(|e| format!("list pods: {e}"))?;
    let running = pods
        .items
        .iter()
        .filter(|p| {
            let status = p.status.as_ref();
            status.and_then(|s| s.phase.as_deref()) == Some("Running")
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("kwok-node-0")
        })
        .count();
    Ok((pods.items.len(), running))
}

#[tokio::test]
async fn deployment_pods_run_on_the_kwok_node_and_scale_down() {
    let ns = TestNamespace::new("harness").await;
    let deployments = ns.api::<Deployment>();
    deployments
        .create(&Default::default(), &deployment("web", 5))
        .await
        .expect("create deployment");

    wait_for(
        "5 pods Running on kwok-node-0",
        Duration::from_secs(90),
        || async {
            match pod_counts(&ns, "web").await? {
                (5, 5) => Ok(()),
                (total, running) => Err(format!("{total} pods, {running} Running")),
            }
        },
    )
    .await;

    // What `kubectl scale --replicas=1` does: patch the scale subresource.
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "replicas": 1 } })),
        )
        .await
        .expect("scale to 1");

    wait_for(
        "the pod count to fall to 1",
        Duration::from_secs(90),
        || async {
            match pod_counts(&ns, "web").await? {
                (1, 1) => Ok(()),
                (total, running) => Err(format!("{total} pods, {running} Running")),
            }
        },
    )
    .await;
}

#[tokio::test]
async fn rabbitmq_confirms_delivers_and_acks_a_persistent_message() {
    let queue = support::amqp_prefix("harness");
    let conn = Connection::connect(&support::amqp_url(), ConnectionProperties::default())
        .await
        .expect("connect to RabbitMQ (make rabbitmq-up)");
    let channel = conn.create_channel().await.unwrap();
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();

    let confirm = channel
        .basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b"reconcile default/web",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(
        confirm.is_ack(),
        "the broker confirmed the publish: {confirm:?}"
    );

    let message = wait_for(
        "the message to be ready",
        Duration::from_secs(10),
        || async {
            channel
                .basic_get(queue.as_str().into(), BasicGetOptions::default())
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "queue empty".to_string())
        },
    )
    .await;
    assert_eq!(message.delivery.data, b"reconcile default/web");
    assert_eq!(message.delivery.properties.delivery_mode(), &Some(2));
    message
        .delivery
        .ack(BasicAckOptions::default())
        .await
        .unwrap();

    // Acked: nothing is left to redeliver.
    let left = channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    assert_eq!(left.message_count(), 0);
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
}

#[test]
fn git_repo_commits_reach_the_bare_repository() {
    let repo = GitRepo::new();
    let first = repo
        .write("apps/web/deploy.yaml", "kind: Deployment\n")
        .commit("first");
    let second = repo.remove("apps/web/deploy.yaml").commit("second");
    assert_ne!(first, second);
    assert_eq!(first.len(), 40);
    let bare_head = support::git::git(&repo.bare, &["rev-parse", "main"]);
    assert_eq!(bare_head, second);
    let listed = support::git::git(&repo.bare, &["ls-tree", "-r", "--name-only", &first]);
    assert_eq!(listed, "apps/web/deploy.yaml");
}
