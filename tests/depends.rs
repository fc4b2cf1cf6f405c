//! `spec.dependsOn` between Applications, with `setpoint run` on RabbitMQ
//! against the real control plane: a dependent applies nothing while its
//! dependency is not Healthy, and follows it within seconds once it is; a
//! cycle is Stalled on every member; a missing dependency is a wait.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, ResourceQuota};
use kube::api::{DeleteParams, PostParams};
use setpoint::api::{
    Application, ApplicationSpec, ConditionStatus, ConditionType, Dependency, Destination, Health,
    Source,
};
use support::app::{automated, install_crd};
use support::process::{Setpoint, free_port};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, no_pods_quota, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);

fn configmap(name: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: \"1\"\n")
}

fn deployment(name: &str) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: app\n        image: app:1\n"
    )
}

/// An Application of `ns` on `path`, its objects in `destination` (its own
/// namespace when None), depending on `depends_on` (names in `ns`).
async fn create(
    ns: &TestNamespace,
    name: &str,
    repo: &GitRepo,
    path: &str,
    destination: Option<&str>,
    depends_on: &[&str],
) {
    let mut app = Application::new(
        name,
        ApplicationSpec {
            source: Source {
                repo_url: repo.url(),
                path: Some(path.into()),
                ..Default::default()
            },
            destination: Destination {
                namespace: destination.map(str::to_string),
                ..Default::default()
            },
            sync_policy: automated(true, true),
            depends_on: depends_on
                .iter()
                .map(|d| Dependency {
                    name: d.to_string(),
                    namespace: None,
                })
                .collect(),
            ..Default::default()
        },
    );
    app.metadata.namespace = Some(ns.name.clone());
    ns.api::<Application>()
        .create(&PostParams::default(), &app)
        .await
        .expect("create Application");
}

fn start(ns: &TestNamespace, cache: &std::path::Path, test: &str) -> Setpoint {
    let prefix = amqp_prefix(test);
    let listen = format!("127.0.0.1:{}", free_port());
    let url = amqp_url();
    Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--amqp-prefix",
            &prefix,
            "--no-sweep",
        ],
        &[("SETPOINT_AMQP_URL", &url)],
        cache,
    )
}

/// `Ok((status, reason, message))` of a condition once `check` accepts it.
async fn condition(
    ns: &TestNamespace,
    app: &str,
    type_: ConditionType,
) -> Result<(ConditionStatus, String, String), String> {
    let app = ns
        .api::<Application>()
        .get(app)
        .await
        .map_err(|e| e.to_string())?;
    let status = app.status.unwrap_or_default();
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status, c.reason.clone(), c.message.clone()))
        .ok_or_else(|| format!("no {type_:?} condition: {:?}", status.conditions))
}

async fn exists(ns: &TestNamespace, configmap: &str) -> bool {
    ns.api::<ConfigMap>()
        .get_opt(configmap)
        .await
        .expect("read ConfigMap")
        .is_some()
}

#[tokio::test]
async fn a_dependent_applies_nothing_until_its_dependency_is_healthy_then_follows_at_once() {
    let ns = TestNamespace::new("deps").await;
    // A's objects go to a namespace of their own, where no pod may start.
    let target = TestNamespace::new("deps-a").await;
    install_crd(&ns.client).await;
    no_pods_quota(&target).await;
    let repo = GitRepo::new();
    repo.write("a/deploy.yaml", &deployment("web"))
        .write("b/cm.yaml", &configmap("b-settings"))
        .commit("a and b");
    create(&ns, "a", &repo, "a", Some(&target.name), &[]).await;
    create(&ns, "b", &repo, "b", None, &["a"]).await;
    let cache = tempfile::tempdir().unwrap();
    let _setpoint = start(&ns, cache.path(), "deps");

    // A is applied and stays Progressing (its ReplicaSet may create no pod);
    // B says it waits for A, and applies nothing.
    wait_for("a applied and Progressing", DEADLINE, || async {
        match condition(&ns, "a", ConditionType::Ready).await? {
            (ConditionStatus::False, reason, _) if reason == "Progressing" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (_, _, message) = wait_for("b waiting for a", DEADLINE, || async {
        match condition(&ns, "b", ConditionType::Ready).await? {
            found @ (ConditionStatus::False, _, _) if found.1 == "DependencyNotReady" => Ok(found),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(message.contains(&format!("{}/a", ns.name)), "{message}");
    // Woken by A's state changing while it waits, its condition follows A's.
    wait_for("b's condition to show a Progressing", DEADLINE, || async {
        match condition(&ns, "b", ConditionType::Ready).await? {
            (ConditionStatus::False, reason, message)
                if reason == "DependencyNotReady" && message.contains("Progressing") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(!exists(&ns, "b-settings").await, "b applied nothing");
    let b = ns.api::<Application>().get("b").await.unwrap();
    assert_eq!(
        b.status.unwrap().sync.status,
        setpoint::api::Sync::Unknown,
        "b's sync status is kept (never compared)"
    );

    // The quota goes: A's pod starts, A turns Healthy, and B follows within
    // seconds, woken by A's status (no requeue or sweep could: there is
    // none for a waiting Application, and the sweep is off).
    target
        .api::<ResourceQuota>()
        .delete("no-pods", &DeleteParams::default())
        .await
        .expect("delete the quota");
    wait_for("a Healthy", DEADLINE, || async {
        let a = ns
            .api::<Application>()
            .get("a")
            .await
            .map_err(|e| e.to_string())?;
        match a.status.map(|s| s.health.status) {
            Some(Health::Healthy) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let healthy = Instant::now();
    wait_for("b applied", Duration::from_secs(10), || async {
        if exists(&ns, "b-settings").await {
            Ok(())
        } else {
            Err("no ConfigMap b-settings yet".to_string())
        }
    })
    .await;
    eprintln!("a Healthy → b applied: {:?}", healthy.elapsed());
    wait_for("b Ready", Duration::from_secs(10), || async {
        match condition(&ns, "b", ConditionType::Ready).await? {
            (ConditionStatus::True, _, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_cycle_is_stalled_on_every_member_and_a_missing_dependency_is_a_wait() {
    let ns = TestNamespace::new("deps-cycle").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write("a/cm.yaml", &configmap("a-settings"))
        .write("b/cm.yaml", &configmap("b-settings"))
        .write("c/cm.yaml", &configmap("c-settings"))
        .write("later/cm.yaml", &configmap("later-settings"))
        .commit("a, b, c and later");
    create(&ns, "a", &repo, "a", None, &["b"]).await;
    create(&ns, "b", &repo, "b", None, &["a"]).await;
    create(&ns, "c", &repo, "c", None, &["later"]).await;
    let cache = tempfile::tempdir().unwrap();
    let _setpoint = start(&ns, cache.path(), "deps-cycle");

    for (app, cycle) in [("a", ["a", "b", "a"]), ("b", ["b", "a", "b"])] {
        let named = cycle.map(|n| format!("{}/{n}", ns.name)).join(" → ");
        let (_, _, message) = wait_for(&format!("{app} Stalled"), DEADLINE, || async {
            match condition(&ns, app, ConditionType::Stalled).await? {
                found @ (ConditionStatus::True, _, _) if found.1 == "DependencyCycle" => Ok(found),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        assert_eq!(message, format!("dependency cycle: {named}"));
    }
    // A missing dependency: a wait that names it, not an error loop.
    let (_, _, message) = wait_for("c waiting for later", DEADLINE, || async {
        match condition(&ns, "c", ConditionType::Ready).await? {
            found @ (ConditionStatus::False, _, _) if found.1 == "DependencyNotReady" => Ok(found),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(
        message.contains(&format!("{}/later (missing", ns.name)),
        "{message}"
    );
    for configmap in ["a-settings", "b-settings", "c-settings"] {
        assert!(!exists(&ns, configmap).await, "{configmap} was applied");
    }

    // The missing one arrives and turns ready: c follows.
    create(&ns, "later", &repo, "later", None, &[]).await;
    wait_for("c applied once later is ready", DEADLINE, || async {
        if exists(&ns, "c-settings").await {
            Ok(())
        } else {
            Err("no ConfigMap c-settings yet".to_string())
        }
    })
    .await;
    assert!(!exists(&ns, "a-settings").await && !exists(&ns, "b-settings").await);
}
