//! ApplicationSets end to end: `setpoint run` against the real local
//! control plane, repositories driven by the git CLI, signed GitHub
//! webhooks. Each test has its own namespace and its own Setpoint.

mod support;

use std::time::{Duration, Instant};

use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use setpoint::api::{Application, ApplicationSet, ConditionStatus, ConditionType};

use support::app::{install_appset_crd, synced_at};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, unique_name, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const SECRET: &str = "webhook-secret-for-appset-tests";

fn configmap(name: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: value\n")
}

/// Setpoint on `ns` with a webhook; the process and its port.
async fn start(
    ns: &TestNamespace,
    cache: &std::path::Path,
    env: &[(&str, &str)],
) -> (Setpoint, u16) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--github-secret",
            SECRET,
            "--no-sweep",
        ],
        env,
        cache,
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    (setpoint, port)
}

/// An ApplicationSet over `generators`, whose template deploys `{{ path }}`
/// of `repo` into the test's namespace, automated with prune.
fn directory_set(
    ns: &TestNamespace,
    name: &str,
    repo: &GitRepo,
    generators: Value,
    policy: Value,
) -> ApplicationSet {
    serde_json::from_value(json!({
        "apiVersion": "setpoint.dev/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": { "name": name, "namespace": ns.name },
        "spec": {
            "generators": generators,
            "template": {
                "metadata": {
                    "name": "{{ path.basename }}",
                    "labels": { "team": "{{ path[0] }}" }
                },
                "spec": {
                    "source": { "repoURL": repo.url(), "path": "{{ path }}" },
                    "destination": { "namespace": ns.name },
                    "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
                }
            },
            "syncPolicy": policy
        }
    }))
    .unwrap()
}

async fn create_set(ns: &TestNamespace, set: &ApplicationSet) {
    ns.api::<ApplicationSet>()
        .create(&PostParams::default(), set)
        .await
        .unwrap_or_else(|e| panic!("create ApplicationSet: {e}"));
}

/// The names of the Applications of `ns` that `set` owns.
async fn owned(ns: &TestNamespace, set: &str) -> Vec<String> {
    let apps = ns
        .api::<Application>()
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut names: Vec<String> = apps
        .iter()
        .filter(|app| {
            app.owner_references()
                .iter()
                .any(|r| r.kind == "ApplicationSet" && r.name == set)
        })
        .map(|app| app.name_any())
        .collect();
    names.sort();
    names
}

async fn set_status(ns: &TestNamespace, name: &str) -> setpoint::api::ApplicationSetStatus {
    ns.api::<ApplicationSet>()
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// `Ok((reason, message))` once the set's Ready condition has `status`.
async fn ready(
    ns: &TestNamespace,
    name: &str,
    status: ConditionStatus,
) -> Result<(String, String), String> {
    let set = set_status(ns, name).await;
    match set
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready)
    {
        Some(c) if c.status == status => Ok((c.reason.clone(), c.message.clone())),
        other => Err(format!("{other:?}")),
    }
}

fn push(port: u16, repo: &GitRepo, commit: &str, changed: &[&str]) {
    let (code, body) = post_github(
        port,
        Some(SECRET),
        &unique_name("d"),
        &github_push(&repo.url(), commit, changed),
    );
    assert_eq!(code, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_adding_a_directory_creates_and_syncs_its_application_and_removing_it_deletes_it() {
    let ns = TestNamespace::new("appset-dirs").await;
    install_appset_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write("apps/web/cm.yaml", &configmap("web"))
        .write("apps/api/cm.yaml", &configmap("api"))
        .write("apps/skip/cm.yaml", &configmap("skip"))
        .write("other/db/cm.yaml", &configmap("db"));
    let first = repo.commit("two apps, one skipped");
    let cache = tempfile::tempdir().unwrap();
    let (setpoint, port) = start(&ns, cache.path(), &[]).await;
    let generators = json!([{ "git": {
        "repoURL": repo.url(),
        "directories": [{ "path": "apps/*" }, { "path": "apps/skip", "exclude": true }]
    }}]);
    create_set(
        &ns,
        &directory_set(&ns, "fleet", &repo, generators, json!({})),
    )
    .await;
    for app in ["api", "web"] {
        wait_for(&format!("{app} synced"), DEADLINE, || {
            synced_at(&ns, app, &first)
        })
        .await;
    }
    assert_eq!(owned(&ns, "fleet").await, ["api", "web"]);
    let web = ns.api::<Application>().get("web").await.unwrap();
    assert_eq!(web.labels().get("team").map(String::as_str), Some("apps"));
    assert_eq!(
        web.labels()
            .get("setpoint.dev/application-set")
            .map(String::as_str),
        Some("fleet")
    );
    assert_eq!(web.spec.source.path.as_deref(), Some("apps/web"));

    // A push adding a directory: its Application, created and synced.
    repo.write("apps/new/cm.yaml", &configmap("new"));
    let second = repo.commit("a new app");
    let pushed = Instant::now();
    push(port, &repo, &second, &["apps/new/cm.yaml"]);
    wait_for("new synced", DEADLINE, || synced_at(&ns, "new", &second)).await;
    let took = pushed.elapsed();
    println!("push to a new Application synced: {took:?}");
    wait_for("the set's status lists 3", DEADLINE, || async {
        let status = set_status(&ns, "fleet").await;
        (status.summary.applications == 3 && status.summary.synced == 3)
            .then_some(())
            .ok_or(format!("{:?}", status.summary))
    })
    .await;

    // A push removing it: deleted (policy sync), with its objects pruned
    // by nobody: the Application is gone, the others stay.
    repo.remove("apps/new/cm.yaml");
    let third = repo.commit("the new app goes");
    push(port, &repo, &third, &["apps/new/cm.yaml"]);
    wait_for("new deleted", DEADLINE, || async {
        let names = owned(&ns, "fleet").await;
        (names == ["api", "web"])
            .then_some(())
            .ok_or(format!("{names:?}"))
    })
    .await;
    let logs = setpoint.logs();
    assert!(logs.contains("ApplicationSet evaluated"), "{logs}");
    drop(setpoint);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_parameter_is_an_error_on_the_status_and_creates_nothing() {
    let ns = TestNamespace::new("appset-param").await;
    install_appset_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write("apps/web/cm.yaml", &configmap("web"));
    repo.commit("one app");
    let cache = tempfile::tempdir().unwrap();
    let (_setpoint, _port) = start(&ns, cache.path(), &[]).await;
    let mut set = directory_set(
        &ns,
        "typo",
        &repo,
        json!([{ "git": { "repoURL": repo.url(), "directories": [{ "path": "apps/*" }] } }]),
        json!({}),
    );
    set.spec.template.metadata.name = "{{ path.basenam }}".into();
    create_set(&ns, &set).await;
    let (reason, message) = wait_for("Ready=False", DEADLINE, || {
        ready(&ns, "typo", ConditionStatus::False)
    })
    .await;
    assert_eq!(reason, "UnknownParameter");
    assert!(message.contains("path.basenam"), "{message}");
    assert!(
        message.contains("path.basename"),
        "the message lists the parameters: {message}"
    );
    let status = set_status(&ns, "typo").await;
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == ConditionType::Stalled && c.status == ConditionStatus::True),
        "{status:?}"
    );
    assert!(
        ns.api::<Application>()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Fixed: the Application comes.
    ns.api::<ApplicationSet>()
        .patch(
            "typo",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"name": "{{ path.basename }}"}}}}),
            ),
        )
        .await
        .unwrap();
    wait_for("Ready=True", DEADLINE, || {
        ready(&ns, "typo", ConditionStatus::True)
    })
    .await;
    assert_eq!(owned(&ns, "typo").await, ["web"]);
    let _ = ns
        .api::<ApplicationSet>()
        .delete("typo", &DeleteParams::default())
        .await;
}
