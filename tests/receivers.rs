//! Receivers (`receivers.setpoint.dev`) against the real thing: `setpoint
//! run` on the local control plane, charts pushed by `helm push` to CNCF
//! distribution's registry, Git repositories made by the git CLI, and
//! requests posted over HTTP as Harbor, a CI job or a signing caller sends
//! them. The chart poll interval is 1 h: whatever follows a push at once
//! was the Receiver's doing.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::json;
use setpoint::api::{
    ConditionStatus, ConditionType, HelmSource, LocalSecretRef, Receiver, ReceiverResource,
    ReceiverSpec, Source,
};
use support::app::{automated, create_app, create_app_from, get_app, install_crd, synced_at};
use support::charts::OciRegistry;
use support::git::GitRepo;
use support::process::{Setpoint, free_port, post};
use support::{TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);
const TOKEN: &str = "receiver-token-7f3a";

async fn install_receiver_crd(client: &kube::Client) {
    install_crd(client).await;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = Receiver::crd();
    let name = crd.metadata.name.clone().unwrap();
    api.patch(
        &name,
        &PatchParams::apply("setpoint-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply the Receiver CRD");
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .expect("the Receiver CRD is Established in time")
    .expect("watch the CRD");
}

async fn create_token_secret(ns: &TestNamespace, name: &str, token: &str) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        string_data: Some([("token".to_string(), token.to_string())].into()),
        ..Default::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the token Secret");
}

fn named(name: &str) -> ReceiverResource {
    ReceiverResource {
        name: Some(name.into()),
        ..Default::default()
    }
}

/// Creates Receiver `name` and returns its `status.webhookPath` once it is
/// Ready.
async fn create_receiver(ns: &TestNamespace, name: &str, spec: ReceiverSpec) -> String {
    let mut receiver = Receiver::new(name, spec);
    receiver.metadata.namespace = Some(ns.name.clone());
    ns.api::<Receiver>()
        .create(&PostParams::default(), &receiver)
        .await
        .expect("create the Receiver");
    wait_for(
        &format!("Receiver {name} to be Ready"),
        DEADLINE,
        || async {
            let receiver = ns
                .api::<Receiver>()
                .get(name)
                .await
                .map_err(|e| e.to_string())?;
            let status = receiver.status.unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .find(|c| c.type_ == ConditionType::Ready);
            match (status.webhook_path, ready) {
                (Some(path), Some(ready)) if ready.status == ConditionStatus::True => Ok(path),
                (path, ready) => Err(format!("{path:?} {ready:?}")),
            }
        },
    )
    .await
}

fn spec(kind: &str, secret: &str, resources: Vec<ReceiverResource>) -> ReceiverSpec {
    ReceiverSpec {
        type_: kind.into(),
        secret_ref: LocalSecretRef {
            name: secret.into(),
        },
        resources,
        ..Default::default()
    }
}

/// Harbor's push payload for `reference` (`host/project/repo:tag`).
fn harbor_push(reference: &str, tag: &str) -> String {
    let (name, _) = reference.rsplit_once(':').unwrap();
    let full = name.split_once('/').unwrap().1;
    json!({
        "type": "PUSH_ARTIFACT",
        "occur_at": 1_700_000_000,
        "operator": "ci",
        "event_data": {
            "resources": [{ "digest": "sha256:00", "tag": tag, "resource_url": reference }],
            "repository": {
                "name": full.rsplit('/').next().unwrap(),
                "namespace": full.split('/').next().unwrap(),
                "repo_full_name": full,
                "repo_type": "private"
            }
        }
    })
    .to_string()
}

fn start_setpoint(
    ns: &TestNamespace,
    cache: &tempfile::TempDir,
    extra: &[(&str, &str)],
) -> Setpoint {
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["run", "--listen", &listen, "--sweep-interval", "1h"];
    let mut env = vec![
        ("SETPOINT_CHART_POLL_INTERVAL", "1h"),
        ("SETPOINT_RETRY_INITIAL", "200ms"),
    ];
    env.extend_from_slice(extra);
    Setpoint::scoped(&ns.name, &args, &env, cache.path())
}

/// The `version` of the chart's ConfigMap `<app>-config`.
async fn chart_version(ns: &TestNamespace, app: &str) -> Option<String> {
    let cm = ns
        .api::<ConfigMap>()
        .get_opt(&format!("{app}-config"))
        .await
        .ok()??;
    cm.data?.get("version").cloned()
}

async fn installed(
    ns: &TestNamespace,
    app: &str,
    version: &str,
    revision: &str,
) -> Result<(), String> {
    let status = get_app(ns, app).await.status.unwrap_or_default();
    let live = chart_version(ns, app).await;
    if status.sync.revision.as_deref() == Some(revision) && live.as_deref() == Some(version) {
        Ok(())
    } else {
        Err(format!(
            "revision {:?}, live {live:?}, conditions {:?}",
            status.sync.revision, status.conditions
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harbor_push_syncs_the_chart_application_at_once() {
    let ns = TestNamespace::new("recv-harbor").await;
    install_receiver_crd(&ns.client).await;
    let registry = OciRegistry::start().await;
    let first = registry.push("web", "1.0.0");
    let cache = tempfile::tempdir().unwrap();
    let host = registry.host();
    let mut setpoint = start_setpoint(
        &ns,
        &cache,
        &[("SETPOINT_CHART_INSECURE_REGISTRIES", &host)],
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    create_token_secret(&ns, "harbor-token", TOKEN).await;
    // No resources: the push itself names the chart Applications.
    let path = create_receiver(&ns, "harbor", spec("harbor", "harbor-token", vec![])).await;
    let source = Source {
        repo_url: registry.url(),
        chart: Some("web".into()),
        target_revision: Some("1.x".into()),
        helm: Some(HelmSource::default()),
        ..Default::default()
    };
    create_app_from(&ns, "web", source, automated(true, false)).await;
    let revision = format!("1.0.0@{first}");
    wait_for("1.0.0 installed", DEADLINE, || {
        installed(&ns, "web", "1.0.0", &revision)
    })
    .await;

    // The listing the first reconcile fetched is good for 1.5 h; the push's
    // event asks for one fetched after it.
    let second = registry.push("web", "1.1.0");
    let body = harbor_push(&format!("{host}/charts/web:1.1.0"), "1.1.0");
    let posted = Instant::now();
    let (code, answer) = post(
        port,
        &path,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", TOKEN),
        ],
        &body,
        "POST",
    );
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains(&format!("{}/web", ns.name)), "{answer}");
    let revision = format!("1.1.0@{second}");
    wait_for("1.1.0 installed after the push", DEADLINE, || {
        installed(&ns, "web", "1.1.0", &revision)
    })
    .await;
    let took = posted.elapsed();
    eprintln!("Harbor push to synced chart Application: {took:?}");
    assert!(
        took < Duration::from_secs(3600),
        "followed after {took:?}: that was the poll, not the receiver"
    );
}

/// What a refused request sends and gets: what it is, the path, the
/// headers, the body, the status and a part of the message.
type BadRequest<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    &'a str,
    u16,
    &'a str,
);

/// Lines of the reconcile record that start reconciles of `app`.
fn starts(record: &std::path::Path, ns: &TestNamespace, app: &str) -> usize {
    let prefix = format!("start {}/{app} ", ns.name);
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .count()
}

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: \"{value}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generic_receivers_deploy_now_and_bad_requests_queue_nothing() {
    let ns = TestNamespace::new("recv-generic").await;
    install_receiver_crd(&ns.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write("target/cm.yaml", &configmap("target", "1"))
        .write("barrier/cm.yaml", &configmap("barrier", "1"))
        .commit("two apps");
    let cache = tempfile::tempdir().unwrap();
    let record = cache.path().join("reconciles.log");
    let mut setpoint = start_setpoint(
        &ns,
        &cache,
        &[
            ("SETPOINT_RECONCILE_RECORD", record.to_str().unwrap()),
            ("SETPOINT_RECEIVER_BODY_LIMIT", "4096"),
        ],
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    create_app(&ns, "target", &repo.url(), "target", automated(true, true)).await;
    create_app(
        &ns,
        "barrier",
        &repo.url(),
        "barrier",
        automated(true, true),
    )
    .await;
    wait_for("target synced", DEADLINE, || {
        synced_at(&ns, "target", &commit)
    })
    .await;
    wait_for("barrier synced", DEADLINE, || {
        synced_at(&ns, "barrier", &commit)
    })
    .await;
    create_token_secret(&ns, "ci-token", TOKEN).await;
    let generic = create_receiver(
        &ns,
        "ci",
        spec("generic", "ci-token", vec![named("target")]),
    )
    .await;
    let signed = create_receiver(
        &ns,
        "signed",
        spec("generic-hmac", "ci-token", vec![named("target")]),
    )
    .await;
    let barrier = create_receiver(
        &ns,
        "barrier",
        spec("generic", "ci-token", vec![named("barrier")]),
    )
    .await;
    let harbor = create_receiver(
        &ns,
        "harbor",
        ReceiverSpec {
            events: vec!["PUSH_ARTIFACT".into()],
            ..spec("harbor", "ci-token", vec![named("target")])
        },
    )
    .await;
    let paused = create_receiver(
        &ns,
        "paused",
        ReceiverSpec {
            suspend: true,
            ..spec("generic", "ci-token", vec![named("target")])
        },
    )
    .await;
    let mut paths = [&generic, &signed, &barrier, &harbor, &paused]
        .map(|p| p.as_str())
        .to_vec();
    paths.sort();
    paths.dedup();
    assert_eq!(paths.len(), 5, "each Receiver has its own address");

    // generic: a commit no webhook announced is deployed now.
    let second = repo
        .write("target/cm.yaml", &configmap("target", "2"))
        .commit("2");
    let (code, answer) = post(port, &generic, &[], "", "POST");
    assert_eq!(code, 200, "{answer}");
    assert!(answer.contains(&format!("{}/target", ns.name)), "{answer}");
    wait_for("target synced at the second commit", DEADLINE, || {
        synced_at(&ns, "target", &second)
    })
    .await;

    // generic-hmac: signed with the token.
    let third = repo
        .write("target/cm.yaml", &configmap("target", "3"))
        .commit("3");
    let body = r#"{"deploy":"now"}"#;
    let signature = setpoint::ingest::receiver::verify::hmac_signature(TOKEN, body.as_bytes());
    let (code, answer) = post(port, &signed, &[("X-Signature", &signature)], body, "POST");
    assert_eq!(code, 200, "{answer}");
    wait_for("target synced at the third commit", DEADLINE, || {
        synced_at(&ns, "target", &third)
    })
    .await;
    wait_for("the target's reconcile to end", DEADLINE, || async {
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        let ends = text
            .lines()
            .filter(|l| l.starts_with(&format!("end {}/target ", ns.name)))
            .count();
        if ends == starts(&record, &ns, "target") {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;

    // Each bad request gets its 4xx (or 503) and queues nothing.
    let before = starts(&record, &ns, "target");
    let json = ("Content-Type", "application/json");
    let push = harbor_push("harbor.example.com/library/web:1.0.0", "1.0.0");
    let unknown = format!("/api/webhooks/receivers/{}", "0".repeat(64));
    let wrong_signature =
        setpoint::ingest::receiver::verify::hmac_signature("not-the-token", body.as_bytes());
    let oversize = format!(r#"{{"pad":"{}"}}"#, "x".repeat(8192));
    let deleted = push.replace("PUSH_ARTIFACT", "DELETE_ARTIFACT");
    let cases: Vec<BadRequest> = vec![
        ("unknown receiver", &unknown, vec![], "", 404, "no receiver"),
        (
            "a name, not a digest",
            "/api/webhooks/receivers/ci",
            vec![],
            "",
            404,
            "no receiver",
        ),
        (
            "bad signature",
            &signed,
            vec![("X-Signature", &wrong_signature)],
            body,
            401,
            "X-Signature does not match",
        ),
        (
            "no signature",
            &signed,
            vec![],
            body,
            401,
            "missing X-Signature",
        ),
        (
            "bad token",
            &harbor,
            vec![json, ("Authorization", "guess")],
            &push,
            401,
            "Authorization does not match",
        ),
        (
            "too large",
            &harbor,
            vec![json, ("Authorization", TOKEN)],
            &oversize,
            413,
            "larger than 4096",
        ),
        (
            "malformed",
            &harbor,
            vec![json, ("Authorization", TOKEN)],
            "{not json",
            400,
            "malformed JSON",
        ),
        (
            "no repository",
            &harbor,
            vec![json, ("Authorization", TOKEN)],
            r#"{"type":"PUSH_ARTIFACT"}"#,
            400,
            "invalid Harbor payload",
        ),
        (
            "not JSON",
            &harbor,
            vec![("Content-Type", "text/plain"), ("Authorization", TOKEN)],
            &push,
            415,
            "application/json",
        ),
        (
            "filtered event",
            &harbor,
            vec![json, ("Authorization", TOKEN)],
            &deleted,
            400,
            "DELETE_ARTIFACT is not one of spec.events",
        ),
        ("suspended", &paused, vec![], "", 503, "suspended"),
    ];
    for (what, path, headers, request, status, message) in &cases {
        let (code, answer) = post(port, path, headers, request, "POST");
        assert_eq!(code, *status, "{what}: {answer}");
        assert!(answer.contains(message), "{what}: {answer}");
        assert!(
            !answer.contains(TOKEN),
            "{what}: the token is echoed: {answer}"
        );
    }
    // A request after them, through the same queue: once its reconcile ran,
    // any event the bad ones had queued would have started too.
    let barrier_before = starts(&record, &ns, "barrier");
    let (code, answer) = post(port, &barrier, &[], "", "POST");
    assert_eq!(code, 200, "{answer}");
    wait_for("the barrier's reconcile", DEADLINE, || async {
        let text = std::fs::read_to_string(&record).unwrap_or_default();
        let ends = text
            .lines()
            .filter(|l| l.starts_with(&format!("end {}/barrier ", ns.name)))
            .count();
        if ends > barrier_before {
            Ok(())
        } else {
            Err(text)
        }
    })
    .await;
    assert_eq!(
        starts(&record, &ns, "target"),
        before,
        "a refused request queued a reconcile:\n{}",
        std::fs::read_to_string(&record).unwrap_or_default()
    );
    let logs = setpoint.logs();
    assert!(!logs.contains(TOKEN), "the token reached the log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_moves_the_address_and_a_missing_secret_says_why() {
    let ns = TestNamespace::new("recv-rotate").await;
    install_receiver_crd(&ns.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write("app/cm.yaml", &configmap("app", "1"))
        .commit("one");
    let cache = tempfile::tempdir().unwrap();
    let mut setpoint = start_setpoint(&ns, &cache, &[]);
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    wait_for("app synced", DEADLINE, || synced_at(&ns, "app", &commit)).await;

    // The Secret comes after the Receiver: Ready=False says which is missing.
    let mut receiver = Receiver::new("ci", spec("generic", "late-token", vec![named("app")]));
    receiver.metadata.namespace = Some(ns.name.clone());
    ns.api::<Receiver>()
        .create(&PostParams::default(), &receiver)
        .await
        .unwrap();
    wait_for("Ready=False SecretNotFound", DEADLINE, || async {
        let receiver = ns
            .api::<Receiver>()
            .get("ci")
            .await
            .map_err(|e| e.to_string())?;
        let status = receiver.status.unwrap_or_default();
        match status
            .conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Ready)
        {
            Some(c) if c.reason == "SecretNotFound" && c.message.contains("late-token") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    create_token_secret(&ns, "late-token", "first-token").await;
    let first = setpoint::ingest::receiver::index::webhook_path("first-token", "ci", &ns.name);
    // A request to the address the token gives is served at once (a miss
    // reads the Secrets again), and the status follows.
    let (code, answer) = post(port, &first, &[], "", "POST");
    assert_eq!(code, 200, "{answer}");
    wait_for("the status to name the address", DEADLINE, || async {
        let receiver = ns
            .api::<Receiver>()
            .get("ci")
            .await
            .map_err(|e| e.to_string())?;
        match receiver.status.unwrap_or_default().webhook_path {
            Some(path) if path == first => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Rotated: the new address works, the old one is gone.
    let patch = json!({ "stringData": { "token": "second-token" } });
    ns.api::<Secret>()
        .patch("late-token", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let second = setpoint::ingest::receiver::index::webhook_path("second-token", "ci", &ns.name);
    wait_for("the rotated address to answer", DEADLINE, || async {
        match post(port, &second, &[], "", "POST") {
            (200, _) => Ok(()),
            (code, answer) => Err(format!("{code} {answer}")),
        }
    })
    .await;
    let (code, answer) = post(port, &first, &[], "", "POST");
    assert_eq!(code, 404, "the old address still answers: {answer}");
}
