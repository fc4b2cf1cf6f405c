//! Many clusters from one Setpoint, against three real control planes: the
//! local one (where the Applications live) and two more (`make clusters-up`:
//! staging and prod), registered by cluster Secrets as Argo CD's users
//! declare them. Apply, prune and drift by watch on a remote cluster,
//! impersonation there, the allowed-namespaces rule, credentials that would
//! run a program, a rotated token, and a remote API server stopped while the
//! other clusters keep syncing.
//!
//! It stops the prod control plane's API server, so it runs in its own
//! binary (`test = false` in Cargo.toml), by `make test-multicluster`.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use setpoint::api::{Application, ConditionStatus, ConditionType};
use setpoint::context::Context;
use setpoint::reconcile::Request;
use setpoint::tenancy::{Admins, Tenancy};
use support::app::{
    automated, context, context_with, create_app, deployment_yaml, event_notes, get_app,
    install_crd, reconcile_app, settled_at, synced_at,
};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::remote::{Remote, register};
use support::{GitRepo, TestNamespace, unique_name, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);
const SECRET: &str = "multicluster-webhook-secret";

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: \"{value}\"\n"
    )
}

/// Points `app`'s destination at a cluster, by name or by server.
async fn set_destination(ns: &TestNamespace, app: &str, destination: serde_json::Value) {
    let patch = serde_json::json!({ "spec": { "destination": destination } });
    ns.api::<Application>()
        .patch(app, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("set spec.destination");
}

async fn configmaps(api: &Api<ConfigMap>) -> BTreeSet<String> {
    api.list(&Default::default())
        .await
        .expect("list ConfigMaps")
        .items
        .iter()
        .map(|c| c.name_any())
        .filter(|n| n != "kube-root-ca.crt")
        .collect()
}

/// The reason and message of `app`'s condition `type_` when it is True.
fn condition(app: &Application, type_: ConditionType) -> Option<(String, String)> {
    app.status.as_ref()?.conditions.iter().find_map(|c| {
        (c.type_ == type_ && c.status == ConditionStatus::True)
            .then(|| (c.reason.clone(), c.message.clone()))
    })
}

/// A context whose registry has read `ns`'s cluster Secrets.
async fn loaded(ctx: &Context, ns: &TestNamespace) {
    ctx.clusters
        .load(&ns.client, &ns.name)
        .await
        .expect("read the cluster Secrets");
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn an_application_applies_and_prunes_on_the_cluster_its_destination_names() {
    let ns = TestNamespace::new("mc-apply").await;
    install_crd(&ns.client).await;
    let staging = Remote::named("staging").await;
    let remote = staging.namespace(&ns.name).await;
    register(
        &ns,
        "staging",
        "staging",
        &staging.server,
        &staging.certificate_config(),
        None,
    )
    .await;
    let (ctx, _cache) = context().await;
    loaded(&ctx, &ns).await;

    let repo = GitRepo::new();
    repo.write("app/a.yaml", &configmap("a", "1"));
    repo.write("app/b.yaml", &configmap("b", "1"));
    repo.write("other/c.yaml", &configmap("c", "1"));
    let first = repo.commit("a and b");
    create_app(&ns, "by-name", &repo.url(), "app", automated(true, true)).await;
    set_destination(&ns, "by-name", serde_json::json!({"name": "staging"})).await;
    let outcome = reconcile_app(&ctx, &ns, "by-name", &Request::default())
        .await
        .expect("the first sync on staging");
    assert_eq!(outcome.applied.len(), 2);
    assert_eq!(configmaps(&remote.api()).await, names(&["a", "b"]));
    assert_eq!(
        configmaps(&ns.api()).await,
        BTreeSet::new(),
        "nothing on the local cluster"
    );
    synced_at(&ns, "by-name", &first).await.unwrap();

    // By server, with a trailing slash, as an Argo CD user may write it.
    create_app(
        &ns,
        "by-server",
        &repo.url(),
        "other",
        automated(true, true),
    )
    .await;
    set_destination(
        &ns,
        "by-server",
        serde_json::json!({"server": format!("{}/", staging.server)}),
    )
    .await;
    reconcile_app(&ctx, &ns, "by-server", &Request::default())
        .await
        .expect("the sync by server");
    assert_eq!(configmaps(&remote.api()).await, names(&["a", "b", "c"]));

    // b leaves Git: pruned from staging; a second reconcile changes nothing.
    repo.remove("app/b.yaml");
    let second = repo.commit("no b");
    let outcome = reconcile_app(&ctx, &ns, "by-name", &Request::default())
        .await
        .expect("the prune on staging");
    assert_eq!(outcome.pruned.len(), 1, "{:?}", outcome.pruned);
    assert_eq!(configmaps(&remote.api()).await, names(&["a", "c"]));
    synced_at(&ns, "by-name", &second).await.unwrap();
    let again = reconcile_app(&ctx, &ns, "by-name", &Request::default())
        .await
        .unwrap();
    assert!(again.applied.is_empty() && again.pruned.is_empty() && !again.status_written);
    let notes = event_notes(&ns, "by-name", "Synced").await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains(" on cluster staging: applied 2")),
        "{notes:?}"
    );

    // `setpoint cluster list`: each cluster, whether it answers, its
    // version and how many Applications deploy there; no credential.
    let out = std::process::Command::new(support::process::binary())
        .args(["cluster", "list", "--namespace", &ns.name])
        .env("KUBECONFIG", support::kubeconfig_path())
        .env("POD_NAMESPACE", &ns.name)
        .output()
        .expect("setpoint cluster list");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{listed} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = listed
        .lines()
        .find(|l| l.starts_with("staging "))
        .unwrap_or_else(|| panic!("no staging row: {listed}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        &cells[..3],
        &["staging", staging.server.as_str(), "Reachable"],
        "{listed}"
    );
    assert!(cells[3].starts_with('v'), "a version: {listed}");
    assert_eq!(cells[4], "2", "{listed}");
    assert!(
        listed.lines().any(|l| l.starts_with("in-cluster ")),
        "{listed}"
    );
    assert!(
        !listed.contains("BEGIN") && !listed.contains("keyData"),
        "{listed}"
    );
}

/// Applications of namespaces that are not admin namespaces.
fn tenants() -> Tenancy {
    Tenancy {
        admins: Admins::Namespaces(BTreeSet::from(["setpoint-system".to_string()])),
        allow_local: true,
        ..Tenancy::default()
    }
}

#[tokio::test]
async fn the_cluster_secret_says_which_namespaces_may_deploy_and_tenants_act_as_their_account_there()
 {
    let ns = TestNamespace::new("mc-tenant").await;
    install_crd(&ns.client).await;
    let staging = Remote::named("staging").await;
    let remote = staging.namespace(&ns.name).await;
    let config = staging.certificate_config();
    register(
        &ns,
        "staging",
        "staging",
        &staging.server,
        &config,
        Some("someone-else"),
    )
    .await;
    let cache = tempfile::tempdir().unwrap();
    let ctx = context_with(tenants(), &cache).await;
    loaded(&ctx, &ns).await;

    let repo = GitRepo::new();
    repo.write("app/web.yaml", &configmap("web", "1"));
    repo.commit("web");
    create_app(&ns, "web", &repo.url(), "app", automated(true, true)).await;
    let patch = serde_json::json!({"spec": {
        "destination": {"name": "staging"}, "serviceAccountName": "deployer"
    }});
    ns.api::<Application>()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let error = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect_err("the namespace is not allowed on staging");
    assert!(!error.is_transient(), "{error}");
    let (reason, message) =
        condition(&get_app(&ns, "web").await, ConditionType::Stalled).expect("a Stalled condition");
    assert_eq!(reason, "ClusterNotAllowed");
    assert_eq!(
        message,
        format!(
            "Applications of namespace {} may not deploy to the cluster staging: its Secret staging allows the namespaces someone-else (setpoint.dev/allowed-namespaces)",
            ns.name
        )
    );
    assert!(
        configmaps(&remote.api()).await.is_empty(),
        "nothing applied"
    );

    // Allowed now; on staging the Application acts as its service account,
    // which may edit its namespace there and nothing more.
    register(
        &ns,
        "staging",
        "staging",
        &staging.server,
        &config,
        Some(&ns.name),
    )
    .await;
    loaded(&ctx, &ns).await;
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "deployer"}})).unwrap();
    remote
        .api()
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "deployer-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "deployer", "namespace": ns.name}],
    }))
    .unwrap();
    remote
        .api()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect("the editor may create a ConfigMap in its namespace on staging");
    assert_eq!(configmaps(&remote.api()).await, names(&["web"]));

    let binding = unique_name("mc-escalate");
    repo.write(
        "app/escalate.yaml",
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: {binding}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}\nsubjects:\n- {{kind: ServiceAccount, name: deployer, namespace: {}}}\n",
            ns.name
        ),
    );
    repo.commit("escalate");
    reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect_err("a ClusterRoleBinding is beyond the editor on staging");
    let (reason, message) =
        condition(&get_app(&ns, "web").await, ConditionType::Stalled).expect("a Stalled condition");
    assert_eq!(reason, "Forbidden");
    let who = format!("system:serviceaccount:{}:deployer", ns.name);
    assert!(message.contains(&who), "{message}");
}

#[tokio::test]
async fn credentials_that_would_run_a_program_are_refused_and_never_shown() {
    let ns = TestNamespace::new("mc-exec").await;
    install_crd(&ns.client).await;
    let staging = Remote::named("staging").await;
    let marker = std::env::temp_dir().join(unique_name("mc-exec-ran"));
    let token = "sekret-token-4f1c9a";
    let config = serde_json::json!({
        "bearerToken": token,
        "execProviderConfig": {"command": "/usr/bin/touch", "args": [marker], "apiVersion": "client.authentication.k8s.io/v1"},
    })
    .to_string();
    register(&ns, "edge", "edge", &staging.server, &config, Some("*")).await;
    let (ctx, _cache) = context().await;
    loaded(&ctx, &ns).await;
    let repo = GitRepo::new();
    repo.write("app/a.yaml", &configmap("a", "1"));
    repo.commit("a");
    create_app(&ns, "edge", &repo.url(), "app", automated(true, true)).await;
    set_destination(&ns, "edge", serde_json::json!({"name": "edge"})).await;
    let error = reconcile_app(&ctx, &ns, "edge", &Request::default())
        .await
        .expect_err("exec credentials are refused");
    assert!(!error.is_transient());
    let app = get_app(&ns, "edge").await;
    let (reason, message) = condition(&app, ConditionType::Stalled).expect("Stalled");
    assert_eq!(reason, "ClusterCredentialsRefused");
    assert!(
        message.contains("asks for execProviderConfig credentials, which run a program"),
        "{message}"
    );
    assert!(!marker.exists(), "the program ran");
    let everything = format!(
        "{} {error} {:?}",
        serde_json::to_string(&app).unwrap(),
        ctx.clusters.clusters()
    );
    assert!(
        !everything.contains(token),
        "the token was shown: {everything}"
    );
}

#[tokio::test]
async fn a_rotated_token_is_used_without_a_restart() {
    let ns = TestNamespace::new("mc-rotate").await;
    install_crd(&ns.client).await;
    let staging = Remote::named("staging").await;
    let remote = staging.namespace(&ns.name).await;
    register(
        &ns,
        "staging",
        "staging",
        &staging.server,
        &staging.token_config("not-a-valid-token"),
        None,
    )
    .await;
    let (ctx, _cache) = context().await;
    // The registry as a running Setpoint keeps it: from a watch.
    let registry = tokio::spawn(ctx.clusters.clone().run(ns.client.clone(), ns.name.clone()));
    let repo = GitRepo::new();
    repo.write("app/a.yaml", &configmap("a", "1"));
    let commit = repo.commit("a");
    create_app(&ns, "web", &repo.url(), "app", automated(true, true)).await;
    set_destination(&ns, "web", serde_json::json!({"name": "staging"})).await;
    let error = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect_err("the API server refuses the token");
    assert!(error.is_transient(), "retried with backoff: {error}");
    let app = get_app(&ns, "web").await;
    let ready = app
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready)
        .cloned()
        .unwrap();
    assert_eq!(ready.reason, "ClusterUnreachable");
    assert!(ready.message.contains("401"), "{}", ready.message);

    let token = staging.admin_token(&unique_name("setpoint-rotate")).await;
    register(
        &ns,
        "staging",
        "staging",
        &staging.server,
        &staging.token_config(&token),
        None,
    )
    .await;
    wait_for("the new token to be used", DEADLINE, || async {
        reconcile_app(&ctx, &ns, "web", &Request::default())
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(configmaps(&remote.api()).await, names(&["a"]));
    synced_at(&ns, "web", &commit).await.unwrap();
    let status = serde_json::to_string(&get_app(&ns, "web").await).unwrap();
    assert!(!status.contains(&token), "the token is in the status");
    registry.abort();
}

/// `setpoint run` for the Applications of `ns`, its cluster Secrets there;
/// the sweep an hour away, so that only watches and webhooks reconcile.
fn setpoint(ns: &TestNamespace, cache: &std::path::Path, listen: &str) -> Setpoint {
    Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            listen,
            "--sweep-interval",
            "1h",
            "--github-secret",
            SECRET,
        ],
        &[],
        cache,
    )
}

#[tokio::test]
async fn a_scale_on_a_remote_cluster_is_set_back_by_a_watch_event() {
    let ns = TestNamespace::new("mc-drift").await;
    install_crd(&ns.client).await;
    let staging = Remote::named("staging").await;
    let remote = staging.namespace(&ns.name).await;
    register(
        &ns,
        "staging",
        "staging",
        &staging.server,
        &staging.certificate_config(),
        None,
    )
    .await;
    let repo = GitRepo::new();
    repo.write("app/web.yaml", &deployment_yaml("web", 2));
    let commit = repo.commit("web");
    create_app(&ns, "web", &repo.url(), "app", automated(true, true)).await;
    set_destination(&ns, "web", serde_json::json!({"name": "staging"})).await;
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut setpoint = setpoint(&ns, cache.path(), &listen);
    setpoint.wait_http().await;
    wait_for("web to settle on staging", DEADLINE, || {
        settled_at(&ns, "web", &commit)
    })
    .await;

    let deployments: Api<Deployment> = remote.api();
    let kubectl = PatchParams {
        field_manager: Some("kubectl".into()),
        ..Default::default()
    };
    let mut corrections = Vec::new();
    for _ in 0..3 {
        let scale = Patch::Merge(serde_json::json!({"spec": {"replicas": 1}}));
        deployments
            .patch_scale("web", &kubectl, &scale)
            .await
            .unwrap();
        let scaled = Instant::now();
        wait_for("staging's web set back to 2 replicas", DEADLINE, || async {
            let live = deployments.get("web").await.map_err(|e| e.to_string())?;
            match live.spec.replicas {
                Some(2) => Ok(()),
                other => Err(format!("{other:?} replicas")),
            }
        })
        .await;
        corrections.push(scaled.elapsed());
    }
    eprintln!("scale corrections on staging: {corrections:?}");
    let logs = setpoint.logs();
    assert!(
        logs.contains("Deployment web"),
        "the drift came from a watch event: {logs}"
    );
}

#[tokio::test]
async fn a_stopped_cluster_costs_the_others_nothing_and_converges_when_it_returns() {
    let ns = TestNamespace::new("mc-down").await;
    install_crd(&ns.client).await;
    let staging = Remote::named("staging").await;
    let prod = Remote::named("prod").await;
    let on_staging = staging.namespace(&ns.name).await;
    let on_prod = prod.namespace(&ns.name).await;
    register(
        &ns,
        "staging",
        "staging",
        &staging.server,
        &staging.certificate_config(),
        None,
    )
    .await;
    register(
        &ns,
        "prod",
        "prod",
        &prod.server,
        &prod.certificate_config(),
        None,
    )
    .await;
    let repo = GitRepo::new();
    for path in ["local", "staging", "prod"] {
        repo.write(&format!("{path}/cm.yaml"), &configmap(path, "1"));
    }
    let first = repo.commit("one");
    for (app, destination) in [
        ("local", None),
        ("staging", Some("staging")),
        ("prod", Some("prod")),
    ] {
        create_app(&ns, app, &repo.url(), app, automated(true, true)).await;
        if let Some(name) = destination {
            set_destination(&ns, app, serde_json::json!({"name": name})).await;
        }
    }
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut setpoint = setpoint(&ns, cache.path(), &listen);
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    for app in ["local", "staging", "prod"] {
        wait_for(&format!("{app} synced"), DEADLINE, || {
            synced_at(&ns, app, &first)
        })
        .await;
    }

    // prod's API server goes away for 30 s.
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/controlplane/cluster.sh");
    let mut stop = std::process::Command::new(script)
        .args(["restart-apiserver", "30"])
        .env("CLUSTER_DIR", &prod.dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("stop prod's API server");
    wait_for("prod's API server to stop", DEADLINE, || async {
        match prod.client.apiserver_version().await {
            Ok(_) => Err("still answers".to_string()),
            Err(_) => Ok(()),
        }
    })
    .await;

    let second = {
        for path in ["local", "staging", "prod"] {
            repo.write(&format!("{path}/cm.yaml"), &configmap(path, "2"));
        }
        repo.commit("two")
    };
    let pushed = Instant::now();
    let (code, body) = post_github(
        port,
        Some(SECRET),
        "mc-down-1",
        &github_push(
            &repo.url(),
            &second,
            &["local/cm.yaml", "staging/cm.yaml", "prod/cm.yaml"],
        ),
    );
    assert_eq!(code, 200, "{body}");
    for app in ["local", "staging"] {
        wait_for(
            &format!("{app} synced while prod is down"),
            DEADLINE,
            || synced_at(&ns, app, &second),
        )
        .await;
    }
    let others = pushed.elapsed();
    assert!(
        prod.client.apiserver_version().await.is_err(),
        "prod came back before the others synced ({others:?}): the test proves nothing"
    );
    wait_for("prod to say ClusterUnreachable", DEADLINE, || async {
        let app = get_app(&ns, "prod").await;
        let ready = app
            .status
            .as_ref()
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == ConditionType::Ready)
            })
            .map(|c| (c.reason.clone(), c.message.clone()));
        match ready {
            Some((reason, message)) if reason == "ClusterUnreachable" => {
                assert!(
                    message.starts_with("the cluster prod does not answer"),
                    "{message}"
                );
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eprintln!("local and staging synced {others:?} after the push, prod down");

    let status = stop.wait().expect("prod's API server restarted");
    assert!(status.success(), "cluster.sh restart-apiserver failed");
    wait_for(
        "prod to converge by itself",
        Duration::from_secs(120),
        || synced_at(&ns, "prod", &second),
    )
    .await;
    let live = Api::<ConfigMap>::namespaced(prod.client.clone(), &on_prod.name)
        .get("prod")
        .await
        .unwrap();
    assert_eq!(live.data.unwrap()["key"], "2");
    drop(on_staging);
}
