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
use support::appset::{create_set, label, owned, owns_exactly, ready, set_status};
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

// --- Helpers of the tests below ---------------------------------------------

/// An ApplicationSet over `generators` with the whole `template` given.
fn set_of(
    ns: &TestNamespace,
    name: &str,
    generators: Value,
    template: Value,
    policy: Value,
) -> ApplicationSet {
    serde_json::from_value(json!({
        "apiVersion": "setpoint.dev/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": { "name": name, "namespace": ns.name },
        "spec": { "generators": generators, "template": template, "syncPolicy": policy }
    }))
    .unwrap()
}

/// `Ok` once the Application is Synced, at whatever commit.
async fn synced(ns: &TestNamespace, app: &str) -> Result<(), String> {
    let app = ns
        .api::<Application>()
        .get(app)
        .await
        .map_err(|e| e.to_string())?;
    match app.status.map(|s| s.sync.status) {
        Some(setpoint::api::Sync::Synced) => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// The (type, note) of the events.k8s.io Events with `reason` on the
/// ApplicationSet `set`.
async fn set_events(ns: &TestNamespace, set: &str, reason: &str) -> Vec<(String, String)> {
    use k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = ns.api();
    events
        .list(&kube::api::ListParams::default().fields(&format!("regarding.name={set}")))
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("ApplicationSet"))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

/// Registers a cluster `name` by a Secret of that name in `ns` (Setpoint's
/// namespace in these tests), as Argo CD's users declare one: a bearer
/// token is enough. Nothing listens at its server: the generator needs no
/// answer from it.
async fn register_cluster(ns: &TestNamespace, name: &str, labels: Value) {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use k8s_openapi::api::core::v1::Secret;
    let mut all_labels = json!({ "setpoint.dev/secret-type": "cluster" });
    all_labels
        .as_object_mut()
        .unwrap()
        .extend(labels.as_object().unwrap().clone());
    let server = format!("https://127.0.0.1:{}", free_port());
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "labels": all_labels,
            "annotations": { "setpoint.dev/allowed-namespaces": "*" }
        },
        "data": {
            "name": STANDARD.encode(name),
            "server": STANDARD.encode(&server),
            "config": STANDARD.encode(json!({ "bearerToken": "not-a-real-token" }).to_string()),
        }
    }))
    .unwrap();
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the cluster Secret");
}

/// A directory `fleet/<name>` per name (what a directory generator reads)
/// and the manifests the Applications deploy, `manifests/<name>`, apart: a
/// push that removes a `fleet/` directory leaves every Application's source
/// as it was.
fn fleet(repo: &GitRepo, names: &[&str]) {
    for name in names {
        repo.write(&format!("fleet/{name}/owner.yaml"), "owner: someone\n")
            .write(&format!("manifests/{name}/cm.yaml"), &configmap(name));
    }
}

fn fleet_set(ns: &TestNamespace, name: &str, repo: &GitRepo, policy: Value) -> ApplicationSet {
    set_of(
        ns,
        name,
        json!([{ "git": { "repoURL": repo.url(), "directories": [{ "path": "fleet/*" }] } }]),
        json!({
            "metadata": { "name": "{{ path.basename }}" },
            "spec": {
                "source": { "repoURL": repo.url(), "path": "manifests/{{ path.basename }}" },
                "destination": { "namespace": ns.name },
                "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
            }
        }),
        policy,
    )
}

// --- The tests ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_git_file_generator_flattens_nested_keys_and_a_push_changing_a_file_updates_its_application()
 {
    let ns = TestNamespace::new("appset-files").await;
    install_appset_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write(
        "clusters/dev/config.json",
        r#"{"env": {"name": "dev", "replicas": 1}, "team": "a"}"#,
    )
    .write(
        "clusters/prod/config.yaml",
        "env:\n  name: prod\n  replicas: 3\nteam: b\n",
    )
    .write("clusters/notes.txt", "not a config file\n")
    .write("manifests/dev/cm.yaml", &configmap("cm-dev"))
    .write("manifests/prod/cm.yaml", &configmap("cm-prod"));
    let first = repo.commit("two environments");
    let cache = tempfile::tempdir().unwrap();
    let (_setpoint, port) = start(&ns, cache.path(), &[]).await;
    let set = set_of(
        &ns,
        "envs",
        json!([{ "git": { "repoURL": repo.url(), "files": [{ "path": "clusters/*/config.*" }] } }]),
        json!({
            "metadata": {
                "name": "app-{{ env.name }}",
                "labels": { "team": "{{ team }}", "replicas": "{{ env.replicas }}" }
            },
            "spec": {
                "source": { "repoURL": repo.url(), "path": "manifests/{{ env.name }}" },
                "destination": { "namespace": ns.name },
                "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
            }
        }),
        json!({}),
    );
    create_set(&ns, &set).await;
    for app in ["app-dev", "app-prod"] {
        wait_for(&format!("{app} synced"), DEADLINE, || {
            synced_at(&ns, app, &first)
        })
        .await;
    }
    assert_eq!(owned(&ns, "envs").await, ["app-dev", "app-prod"]);
    let apps = ns.api::<Application>();
    for (app, env, team, replicas) in [("app-dev", "dev", "a", "1"), ("app-prod", "prod", "b", "3")]
    {
        let app = apps.get(app).await.unwrap();
        assert_eq!(label(&app, "team"), Some(team), "{:?}", app.labels());
        assert_eq!(
            label(&app, "replicas"),
            Some(replicas),
            "{:?}",
            app.labels()
        );
        assert_eq!(
            app.spec.source.path.as_deref(),
            Some(format!("manifests/{env}").as_str())
        );
    }
    // Each deployed what its parameter's directory holds.
    let configmaps = ns.api::<k8s_openapi::api::core::v1::ConfigMap>();
    for name in ["cm-dev", "cm-prod"] {
        configmaps
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("ConfigMap {name}: {e}"));
    }

    // A push changing dev's team: app-dev's label follows, app-prod stays.
    repo.write(
        "clusters/dev/config.json",
        r#"{"env": {"name": "dev", "replicas": 1}, "team": "c"}"#,
    );
    let second = repo.commit("dev changes team");
    push(port, &repo, &second, &["clusters/dev/config.json"]);
    wait_for("app-dev's team label is c", DEADLINE, || async {
        let app = apps.get("app-dev").await.map_err(|e| e.to_string())?;
        match label(&app, "team") {
            Some("c") => Ok(app),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let prod = apps.get("app-prod").await.unwrap();
    assert_eq!(label(&prod, "team"), Some("b"));
    assert_eq!(owned(&ns, "envs").await, ["app-dev", "app-prod"]);
    let (reason, message) = ready(&ns, "envs", ConditionStatus::True).await.unwrap();
    assert_eq!(reason, "ApplicationsUpToDate");
    assert!(message.contains("1 updated"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_matrix_of_directories_and_selected_clusters_follows_the_cluster_secrets_labels() {
    let ns = TestNamespace::new("appset-matrix").await;
    install_appset_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write("apps/web/cm.yaml", &configmap("web"))
        .write("apps/api/cm.yaml", &configmap("api"));
    repo.commit("two apps");
    let cache = tempfile::tempdir().unwrap();
    // Setpoint's namespace (POD_NAMESPACE) is the test's: its cluster
    // Secrets are read there.
    let (_setpoint, _port) = start(&ns, cache.path(), &[]).await;
    register_cluster(&ns, "staging", json!({ "env": "staging" })).await;
    let set = set_of(
        &ns,
        "matrix",
        json!([{ "matrix": { "generators": [
            { "git": { "repoURL": repo.url(), "directories": [{ "path": "apps/*" }] } },
            { "clusters": { "selector": { "matchLabels": { "env": "staging" } } } }
        ] } }]),
        json!({
            "metadata": {
                "name": "{{ path.basename }}-{{ name }}",
                "labels": { "cluster": "{{ name }}", "env": "{{ metadata.labels.env }}" }
            },
            "spec": {
                "source": { "repoURL": repo.url(), "path": "{{ path }}" },
                "destination": { "name": "{{ name }}", "namespace": ns.name }
            }
        }),
        // The selector no longer matching takes both Applications at once:
        // 2 of 2 is over the default guard of 50%, which would keep them
        // (the guard is the next test's); here the removal is meant.
        json!({ "maxDeletePercent": 100 }),
    );
    create_set(&ns, &set).await;
    wait_for("api-staging and web-staging", DEADLINE, || {
        owns_exactly(&ns, "matrix", &["api-staging", "web-staging"])
    })
    .await;
    for (app, path) in [("api-staging", "apps/api"), ("web-staging", "apps/web")] {
        let app = ns.api::<Application>().get(app).await.unwrap();
        assert_eq!(app.spec.destination.name.as_deref(), Some("staging"));
        assert_eq!(app.spec.destination.server, None);
        assert_eq!(app.spec.source.path.as_deref(), Some(path));
        assert_eq!(label(&app, "cluster"), Some("staging"));
        assert_eq!(label(&app, "env"), Some("staging"));
    }
    let (reason, _) = wait_for("Ready=True", DEADLINE, || {
        ready(&ns, "matrix", ConditionStatus::True)
    })
    .await;
    assert_eq!(reason, "ApplicationsUpToDate");

    // The Secret's label changes: the set is evaluated again by the cluster
    // change alone (no push), and its Applications go.
    ns.api::<k8s_openapi::api::core::v1::Secret>()
        .patch(
            "staging",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "env": "retired" } } })),
        )
        .await
        .unwrap();
    wait_for("the Applications deleted", DEADLINE, || {
        owns_exactly(&ns, "matrix", &[])
    })
    .await;
    let (_, message) = wait_for("Ready=True after the deletion", DEADLINE, || async {
        let (reason, message) = ready(&ns, "matrix", ConditionStatus::True).await?;
        message
            .contains("2 deleted")
            .then_some((reason, message.clone()))
            .ok_or(message)
    })
    .await;
    assert!(message.starts_with("0 Applications"), "{message}");
    let apps = ns
        .api::<Application>()
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        apps.items.is_empty(),
        "{:?}",
        apps.items.iter().map(|a| a.name_any()).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_generator_yields_in_cluster_for_an_admin_namespace() {
    let ns = TestNamespace::new("appset-incluster").await;
    install_appset_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write("apps/web/cm.yaml", &configmap("web"));
    let first = repo.commit("one app");
    let cache = tempfile::tempdir().unwrap();
    // Every namespace is an admin namespace (`start`'s default, `*`).
    let (_setpoint, _port) = start(&ns, cache.path(), &[]).await;
    let set = set_of(
        &ns,
        "local",
        json!([{ "clusters": {} }]),
        json!({
            "metadata": { "name": "web-{{ name }}" },
            "spec": {
                "source": { "repoURL": repo.url(), "path": "apps/web" },
                "destination": { "server": "{{ server }}", "namespace": ns.name },
                "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
            }
        }),
        json!({}),
    );
    create_set(&ns, &set).await;
    wait_for("web-in-cluster synced", DEADLINE, || {
        synced_at(&ns, "web-in-cluster", &first)
    })
    .await;
    assert_eq!(owned(&ns, "local").await, ["web-in-cluster"]);
    let app = ns.api::<Application>().get("web-in-cluster").await.unwrap();
    assert_eq!(
        app.spec.destination.server.as_deref(),
        Some("https://kubernetes.default.svc")
    );
    ns.api::<k8s_openapi::api::core::v1::ConfigMap>()
        .get("web")
        .await
        .expect("the ConfigMap on the local cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deletion_guard_refuses_to_delete_every_application_until_the_limit_is_raised() {
    let ns = TestNamespace::new("appset-guard").await;
    install_appset_crd(&ns.client).await;
    let repo = GitRepo::new();
    let names = ["a", "b", "c", "d"];
    fleet(&repo, &names);
    let first = repo.commit("four apps");
    let cache = tempfile::tempdir().unwrap();
    let (_setpoint, port) = start(&ns, cache.path(), &[]).await;
    create_set(&ns, &fleet_set(&ns, "guarded", &repo, json!({}))).await;
    for app in names {
        wait_for(&format!("{app} synced"), DEADLINE, || {
            synced_at(&ns, app, &first)
        })
        .await;
    }
    assert_eq!(owned(&ns, "guarded").await, names);

    // A push removing every directory: the generator yields nothing.
    let removed: Vec<String> = names
        .iter()
        .map(|n| format!("fleet/{n}/owner.yaml"))
        .collect();
    for path in &removed {
        repo.remove(path);
    }
    let second = repo.commit("every directory goes");
    let changed: Vec<&str> = removed.iter().map(String::as_str).collect();
    push(port, &repo, &second, &changed);
    let (_, message) = wait_for("Ready=False", DEADLINE, || {
        ready(&ns, "guarded", ConditionStatus::False)
    })
    .await;
    assert!(
        message.contains("refused to delete 4 of its 4 Applications")
            && message.contains("more than 50%")
            && message.contains("a, b, c, d")
            && message.contains("maxDeletePercent"),
        "{message}"
    );
    assert_eq!(
        ready(&ns, "guarded", ConditionStatus::False)
            .await
            .unwrap()
            .0,
        "DeletionRefused"
    );
    let warnings = wait_for("a DeletionRefused Event", DEADLINE, || async {
        let events = set_events(&ns, "guarded", "DeletionRefused").await;
        (!events.is_empty())
            .then_some(events.clone())
            .ok_or(format!("{events:?}"))
    })
    .await;
    assert!(
        warnings.iter().all(|(type_, _)| type_ == "Warning"),
        "{warnings:?}"
    );
    assert!(
        warnings.iter().any(
            |(_, note)| note.contains("refused to delete 4 of its 4 Applications")
                && note.contains("a, b, c, d")
        ),
        "{warnings:?}"
    );
    // Nothing deleted, nothing disturbed.
    assert_eq!(owned(&ns, "guarded").await, names);
    for app in names {
        synced(&ns, app).await.unwrap();
    }
    assert!(set_events(&ns, "guarded", "Deleted").await.is_empty());

    // The user confirms: the limit raised to 100, every one goes.
    ns.api::<ApplicationSet>()
        .patch(
            "guarded",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "syncPolicy": { "maxDeletePercent": 100 } } })),
        )
        .await
        .unwrap();
    wait_for("the Applications deleted", DEADLINE, || {
        owns_exactly(&ns, "guarded", &[])
    })
    .await;
    let (reason, message) = wait_for("Ready=True", DEADLINE, || {
        ready(&ns, "guarded", ConditionStatus::True)
    })
    .await;
    assert_eq!(reason, "ApplicationsUpToDate");
    assert!(message.contains("4 deleted"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_update_keeps_the_application_of_a_removed_directory() {
    let ns = TestNamespace::new("appset-keep").await;
    install_appset_crd(&ns.client).await;
    let repo = GitRepo::new();
    fleet(&repo, &["a", "b"]);
    let first = repo.commit("two apps");
    let cache = tempfile::tempdir().unwrap();
    let (_setpoint, port) = start(&ns, cache.path(), &[]).await;
    create_set(
        &ns,
        &fleet_set(
            &ns,
            "keeper",
            &repo,
            json!({ "applicationsSync": "create-update" }),
        ),
    )
    .await;
    for app in ["a", "b"] {
        wait_for(&format!("{app} synced"), DEADLINE, || {
            synced_at(&ns, app, &first)
        })
        .await;
    }
    let (_, message) = ready(&ns, "keeper", ConditionStatus::True).await.unwrap();
    assert!(message.starts_with("2 Applications"), "{message}");
    let before = ns.api::<Application>().get("b").await.unwrap();

    repo.remove("fleet/b/owner.yaml");
    let second = repo.commit("b's directory goes");
    push(port, &repo, &second, &["fleet/b/owner.yaml"]);
    // The evaluation of that commit: its generator yielded only a.
    wait_for("the evaluation of the push", DEADLINE, || async {
        let (_, message) = ready(&ns, "keeper", ConditionStatus::True).await?;
        message
            .starts_with("1 Applications")
            .then_some(())
            .ok_or(message)
    })
    .await;
    assert_eq!(owned(&ns, "keeper").await, ["a", "b"]);
    let after = ns.api::<Application>().get("b").await.unwrap();
    assert_eq!(
        after.uid(),
        before.uid(),
        "the same Application, not a new one"
    );
    assert_eq!(after.spec, before.spec);
    synced(&ns, "b").await.unwrap();
    assert!(set_events(&ns, "keeper", "Deleted").await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_application_made_by_hand_is_left_alone_and_the_status_names_it() {
    let ns = TestNamespace::new("appset-owner").await;
    install_appset_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write("apps/web/cm.yaml", &configmap("web"))
        .write("apps/api/cm.yaml", &configmap("api"))
        .write("other/db/cm.yaml", &configmap("db"));
    let first = repo.commit("two apps and a database");
    let cache = tempfile::tempdir().unwrap();
    let (_setpoint, _port) = start(&ns, cache.path(), &[]).await;
    // `web`, by hand, from another directory, before the set.
    let by_hand = support::app::create_app(
        &ns,
        "web",
        &repo.url(),
        "other/db",
        support::app::automated(true, true),
    )
    .await;
    wait_for("web (by hand) synced", DEADLINE, || {
        synced_at(&ns, "web", &first)
    })
    .await;
    let generators =
        json!([{ "git": { "repoURL": repo.url(), "directories": [{ "path": "apps/*" }] } }]);
    create_set(
        &ns,
        &directory_set(&ns, "fleet", &repo, generators, json!({})),
    )
    .await;
    let (reason, message) = wait_for("Ready=False", DEADLINE, || {
        ready(&ns, "fleet", ConditionStatus::False)
    })
    .await;
    assert_eq!(reason, "NameConflict", "{message}");
    assert!(
        message.contains("Application web exists and is not this set's"),
        "{message}"
    );
    // The set's other Application is there.
    wait_for("api synced", DEADLINE, || synced_at(&ns, "api", &first)).await;
    assert_eq!(owned(&ns, "fleet").await, ["api"]);

    let web = ns.api::<Application>().get("web").await.unwrap();
    assert_eq!(web.uid(), by_hand.uid());
    assert_eq!(web.spec, by_hand.spec, "its spec as its author wrote it");
    assert!(
        web.owner_references().is_empty(),
        "{:?}",
        web.owner_references()
    );
    assert_eq!(label(&web, "setpoint.dev/application-set"), None);
    assert_eq!(label(&web, "team"), None);
    assert!(
        !web.managed_fields()
            .iter()
            .any(|f| f.manager.as_deref() == Some(setpoint::appset::FIELD_MANAGER)),
        "the set wrote nothing on it: {:?}",
        web.managed_fields()
    );
    let warnings = set_events(&ns, "fleet", "NameConflict").await;
    assert!(
        warnings
            .iter()
            .any(|(type_, note)| type_ == "Warning" && note.contains("Application web")),
        "{warnings:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_set_acts_as_its_service_account_and_gets_no_in_cluster() {
    let ns = TestNamespace::new("appset-tenant").await;
    install_appset_crd(&ns.client).await;
    support::app::grant_edit(&ns, "deployer").await;
    let repo = GitRepo::new();
    let role = unique_name("appset-tenant-escalate");
    repo.write("apps/web/cm.yaml", &configmap("web")).write(
        "apps/escalate/role.yaml",
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {role}\nrules: []\n"
        ),
    );
    let first = repo.commit("an app and one beyond an editor");
    let cache = tempfile::tempdir().unwrap();
    // The test's namespace is no admin namespace: its Applications act as
    // a service account of theirs, and the cluster generator gives it no
    // local cluster.
    let (_setpoint, _port) = start(
        &ns,
        cache.path(),
        &[("SETPOINT_ADMIN_NAMESPACES", "setpoint-system")],
    )
    .await;
    let set = set_of(
        &ns,
        "tenant",
        json!([{ "git": { "repoURL": repo.url(), "directories": [{ "path": "apps/*" }] } }]),
        json!({
            "metadata": { "name": "{{ path.basename }}" },
            "spec": {
                "source": { "repoURL": repo.url(), "path": "{{ path }}" },
                "destination": { "namespace": ns.name },
                "serviceAccountName": "deployer",
                "syncPolicy": { "automated": { "prune": true, "selfHeal": true } }
            }
        }),
        json!({}),
    );
    create_set(&ns, &set).await;
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &first)).await;
    ns.api::<k8s_openapi::api::core::v1::ConfigMap>()
        .get("web")
        .await
        .expect("the editor's ConfigMap");
    // The ClusterRole is beyond `edit`: refused to deployer, by name.
    let who = format!("system:serviceaccount:{}:deployer cannot", ns.name);
    let (reason, message) = wait_for("escalate refused", DEADLINE, || async {
        let app = ns
            .api::<Application>()
            .get("escalate")
            .await
            .map_err(|e| e.to_string())?;
        app.status
            .as_ref()
            .and_then(|s| {
                s.conditions.iter().find(|c| {
                    c.type_ == ConditionType::Stalled && c.status == ConditionStatus::True
                })
            })
            .map(|c| (c.reason.clone(), c.message.clone()))
            .ok_or(format!("{:?}", app.status))
    })
    .await;
    assert_eq!(reason, "Forbidden", "{message}");
    assert!(message.contains(&who), "{message}");
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(ns.client.clone());
    assert!(roles.get_opt(&role).await.unwrap().is_none());
    assert_eq!(owned(&ns, "tenant").await, ["escalate", "web"]);
    for app in ns
        .api::<Application>()
        .list(&Default::default())
        .await
        .unwrap()
    {
        assert_eq!(app.namespace().as_deref(), Some(ns.name.as_str()));
        assert_eq!(app.spec.service_account_name.as_deref(), Some("deployer"));
    }

    // A cluster generator of a tenant namespace: no in-cluster (admin
    // namespaces only) and no registered cluster, so nothing, and Ready.
    let clusters = set_of(
        &ns,
        "clusters",
        json!([{ "clusters": {} }]),
        json!({
            "metadata": { "name": "web-{{ name }}" },
            "spec": {
                "source": { "repoURL": repo.url(), "path": "apps/web" },
                "destination": { "server": "{{ server }}", "namespace": ns.name },
                "serviceAccountName": "deployer"
            }
        }),
        json!({}),
    );
    create_set(&ns, &clusters).await;
    let (reason, message) = wait_for("Ready=True", DEADLINE, || {
        ready(&ns, "clusters", ConditionStatus::True)
    })
    .await;
    assert_eq!(reason, "ApplicationsUpToDate");
    assert!(message.starts_with("0 Applications"), "{message}");
    let status = set_status(&ns, "clusters").await;
    assert_eq!(status.summary.applications, 0, "{status:?}");
    assert!(owned(&ns, "clusters").await.is_empty());
    assert!(
        ns.api::<Application>()
            .get_opt("web-in-cluster")
            .await
            .unwrap()
            .is_none()
    );
}
