//! Tenancy against the real control plane (RBAC on): an Application outside
//! the admin namespaces acts as a service account of its own namespace, so
//! the API server decides what it may do; it never takes over another
//! Application's objects; admin namespaces keep Setpoint's own rights.

mod support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use setpoint::api::{ConditionStatus, ConditionType, Source};
use setpoint::reconcile::{ReconcileError, Request};
use setpoint::tenancy::{Admins, Tenancy};
use support::app::{
    automated, context_with, create_app, create_app_from, event_notes, get_app, grant_edit,
    install_crd, reconcile_app,
};
use support::{GitRepo, TestNamespace, unique_name};

/// A tenancy whose only admin namespace is none of the tests' namespaces.
fn tenants() -> Tenancy {
    Tenancy {
        admins: Admins::Namespaces(BTreeSet::from(["setpoint-system".to_string()])),
        allow_local: true,
        ..Tenancy::default()
    }
}

fn cache() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("setpoint-tenancy-")
        .tempdir()
        .unwrap()
}

fn configmap_yaml(name: &str, namespace: Option<&str>, value: &str) -> String {
    let namespace = namespace
        .map(|ns| format!("  namespace: {ns}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n{namespace}data:\n  key: \"{value}\"\n"
    )
}

async fn set_service_account(ns: &TestNamespace, app: &str, sa: &str) {
    let patch = serde_json::json!({ "spec": { "serviceAccountName": sa } });
    ns.api::<setpoint::api::Application>()
        .patch(app, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("set spec.serviceAccountName");
}

fn stalled(app: &setpoint::api::Application) -> (String, String) {
    let condition = app
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ConditionType::Stalled && c.status == ConditionStatus::True)
        })
        .unwrap_or_else(|| panic!("no Stalled condition: {:?}", app.status));
    (condition.reason.clone(), condition.message.clone())
}

async fn configmap(ns: &str, name: &str) -> Option<ConfigMap> {
    Api::<ConfigMap>::namespaced(support::kube_client().await, ns)
        .get_opt(name)
        .await
        .expect("read ConfigMap")
}

#[tokio::test]
async fn a_tenant_syncs_what_its_service_account_may_and_nothing_of_a_forbidden_commit() {
    let ns = TestNamespace::new("tenancy-edit").await;
    install_crd(&ns.client).await;
    grant_edit(&ns, "deployer").await;
    let cache = cache();
    let ctx = context_with(tenants(), &cache).await;
    let repo = GitRepo::new();
    repo.write("app/web.yaml", &configmap_yaml("web", None, "1"));
    repo.commit("web");
    create_app(&ns, "web", &repo.url(), "app", automated(true, true)).await;
    set_service_account(&ns, "web", "deployer").await;

    let outcome = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect("the editor may create a ConfigMap in its namespace");
    assert_eq!(outcome.applied.len(), 1);
    assert!(configmap(&ns.name, "web").await.is_some());

    // A commit that adds a ConfigMap and a ClusterRoleBinding to cluster-admin.
    let binding = unique_name("tenancy-escalate");
    repo.write("app/added.yaml", &configmap_yaml("added", None, "2"));
    repo.write(
        "app/escalate.yaml",
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {binding}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}}
subjects:
- {{kind: ServiceAccount, name: deployer, namespace: {ns}}}
",
            ns = ns.name
        ),
    );
    repo.commit("escalate");
    let error = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect_err("a ClusterRoleBinding is beyond the editor");
    assert!(!error.is_transient(), "{error}");
    let (reason, message) = stalled(&get_app(&ns, "web").await);
    assert_eq!(reason, "Forbidden");
    let who = format!("system:serviceaccount:{}:deployer cannot", ns.name);
    assert!(
        message.contains(&who) && message.contains("clusterrolebindings.rbac.authorization.k8s.io"),
        "{message}"
    );
    // All or nothing: the ConfigMap of the same commit was not applied.
    assert!(configmap(&ns.name, "added").await.is_none());
    let crbs: Api<ClusterRoleBinding> = Api::all(ns.client.clone());
    assert!(crbs.get_opt(&binding).await.unwrap().is_none());
    let warnings = event_notes(&ns, "web", "Forbidden").await;
    assert!(
        warnings.iter().any(|n| n.contains(&who)),
        "a Warning Event says who cannot do what: {warnings:?}"
    );

    // The next commit that fixes it syncs normally.
    repo.remove("app/escalate.yaml");
    repo.commit("no escalation");
    reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .expect("the fixed commit syncs");
    assert!(configmap(&ns.name, "added").await.is_some());
}

#[tokio::test]
async fn a_tenant_cannot_reach_beyond_its_namespace() {
    let ns = TestNamespace::new("tenancy-own").await;
    let other = TestNamespace::new("tenancy-other").await;
    install_crd(&ns.client).await;
    grant_edit(&ns, "deployer").await;
    let cache = cache();
    let ctx = context_with(tenants(), &cache).await;

    // Writing into another namespace.
    let repo = GitRepo::new();
    repo.write(
        "app/cm.yaml",
        &configmap_yaml("intruder", Some(&other.name), "x"),
    );
    repo.commit("into another namespace");
    create_app(&ns, "cross", &repo.url(), "app", automated(true, true)).await;
    set_service_account(&ns, "cross", "deployer").await;
    reconcile_app(&ctx, &ns, "cross", &Request::default())
        .await
        .expect_err("another namespace is beyond the editor");
    let (reason, message) = stalled(&get_app(&ns, "cross").await);
    assert_eq!(reason, "Forbidden", "{message}");
    assert!(
        message.contains(&format!("in namespace {}", other.name)),
        "{message}"
    );
    assert!(configmap(&other.name, "intruder").await.is_none());

    // Naming another namespace's service account.
    let mine = GitRepo::new();
    mine.write("app/cm.yaml", &configmap_yaml("mine", None, "x"));
    mine.commit("own");
    create_app(&ns, "borrow", &mine.url(), "app", automated(true, true)).await;
    set_service_account(
        &ns,
        "borrow",
        &format!("system:serviceaccount:{}:default", other.name),
    )
    .await;
    let error = reconcile_app(&ctx, &ns, "borrow", &Request::default())
        .await
        .expect_err("another namespace's service account cannot be named");
    assert!(matches!(error, ReconcileError::Tenancy(_)), "{error}");
    assert_eq!(
        stalled(&get_app(&ns, "borrow").await).0,
        "InvalidServiceAccount"
    );
    assert!(configmap(&ns.name, "mine").await.is_none());

    // Naming a Secret that only another namespace holds: it is looked up in
    // the Application's own namespace, as its service account.
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "git-creds" },
        "stringData": { "username": "u", "password": "other-namespace-password" },
    }))
    .unwrap();
    other
        .api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let source = Source {
        repo_url: mine.url(),
        path: Some("app".into()),
        credentials_secret: Some("git-creds".into()),
        ..Default::default()
    };
    create_app_from(&ns, "creds", source, automated(true, true)).await;
    set_service_account(&ns, "creds", "deployer").await;
    let error = reconcile_app(&ctx, &ns, "creds", &Request::default())
        .await
        .expect_err("no such Secret in the Application's namespace");
    assert!(
        matches!(error, ReconcileError::Credentials { .. }),
        "{error}"
    );
    let (reason, message) = stalled(&get_app(&ns, "creds").await);
    assert_eq!(reason, "CredentialsInvalid");
    assert!(
        message.contains(&format!("{}/git-creds", ns.name)),
        "{message}"
    );

    // The default service account, which was granted nothing, gets nothing.
    create_app(&ns, "nobody", &mine.url(), "app", automated(true, true)).await;
    reconcile_app(&ctx, &ns, "nobody", &Request::default())
        .await
        .expect_err("the default service account may not create ConfigMaps");
    let (reason, message) = stalled(&get_app(&ns, "nobody").await);
    assert_eq!(reason, "Forbidden");
    assert!(
        message.contains(&format!("system:serviceaccount:{}:default cannot", ns.name)),
        "{message}"
    );
}

#[tokio::test]
async fn an_application_never_takes_over_or_prunes_another_applications_objects() {
    let ns = TestNamespace::new("tenancy-owner").await;
    install_crd(&ns.client).await;
    grant_edit(&ns, "deployer").await;
    let cache = cache();
    let ctx = context_with(tenants(), &cache).await;

    let first = GitRepo::new();
    first.write("app/shared.yaml", &configmap_yaml("shared", None, "first"));
    first.write("app/extra.yaml", &configmap_yaml("extra", None, "first"));
    first.commit("first");
    create_app(&ns, "first", &first.url(), "app", automated(true, true)).await;
    set_service_account(&ns, "first", "deployer").await;
    reconcile_app(&ctx, &ns, "first", &Request::default())
        .await
        .expect("first syncs");

    // Another Application declares the same ConfigMap: refused, untouched.
    let second = GitRepo::new();
    second.write("app/shared.yaml", &configmap_yaml("shared", None, "second"));
    second.commit("second");
    create_app(&ns, "second", &second.url(), "app", automated(true, true)).await;
    set_service_account(&ns, "second", "deployer").await;
    let error = reconcile_app(&ctx, &ns, "second", &Request::default())
        .await
        .expect_err("the ConfigMap is first's");
    assert!(matches!(error, ReconcileError::Owned(_)), "{error}");
    let (reason, message) = stalled(&get_app(&ns, "second").await);
    assert_eq!(reason, "OwnedByAnotherApplication");
    assert!(
        message.contains(&format!("belongs to Application {}/first", ns.name)),
        "{message}"
    );
    let shared = configmap(&ns.name, "shared").await.unwrap();
    assert_eq!(shared.data.unwrap()["key"], "first");

    // A third Application with pruning on, whose label someone put on one of
    // first's objects: the annotation still says first's, so it is not pruned.
    let third = GitRepo::new();
    third.write("app/own.yaml", &configmap_yaml("third-own", None, "third"));
    third.commit("third");
    create_app(&ns, "third", &third.url(), "app", automated(true, true)).await;
    set_service_account(&ns, "third", "deployer").await;
    reconcile_app(&ctx, &ns, "third", &Request::default())
        .await
        .expect("third syncs");
    let third_label = get_app(&ns, "third").await;
    let label_value = setpoint::reconcile::prepare::app_label_value(&third_label);
    ns.api::<ConfigMap>()
        .patch(
            "extra",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({
                "metadata": { "labels": { "setpoint.dev/app": label_value } }
            })),
        )
        .await
        .unwrap();
    let outcome = reconcile_app(
        &ctx,
        &ns,
        "third",
        &Request {
            manual: true,
            ..Default::default()
        },
    )
    .await
    .expect("third reconciles");
    assert!(outcome.pruned.is_empty(), "pruned {:?}", outcome.pruned);
    assert!(configmap(&ns.name, "extra").await.is_some());
}

#[tokio::test]
async fn an_admin_namespace_application_still_syncs_cluster_scoped_objects() {
    let ns = TestNamespace::new("tenancy-admin").await;
    install_crd(&ns.client).await;
    let cache = cache();
    let tenancy = Tenancy {
        admins: Admins::Namespaces(BTreeSet::from([ns.name.clone()])),
        allow_local: true,
        ..Tenancy::default()
    };
    let ctx = context_with(tenancy, &cache).await;
    let role = unique_name("tenancy-admin-role");
    let repo = GitRepo::new();
    repo.write(
        "app/role.yaml",
        &format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {role}\nrules: []\n"
        ),
    );
    repo.commit("a cluster role");
    create_app(&ns, "platform", &repo.url(), "app", automated(true, true)).await;
    let outcome = reconcile_app(&ctx, &ns, "platform", &Request::default())
        .await
        .expect("an admin Application acts with Setpoint's rights");
    assert_eq!(outcome.applied.len(), 1);
    let roles: Api<ClusterRole> = Api::all(ns.client.clone());
    let live = roles.get(&role).await.expect("the ClusterRole exists");
    assert_eq!(
        live.annotations().get("setpoint.dev/app"),
        Some(&format!("{}/platform", ns.name))
    );
    roles.delete(&role, &DeleteParams::default()).await.unwrap();
}

#[tokio::test]
async fn local_repositories_are_refused_unless_allowed() {
    let ns = TestNamespace::new("tenancy-local").await;
    install_crd(&ns.client).await;
    let cache = cache();
    let tenancy = Tenancy {
        admins: Admins::All,
        ..Tenancy::default()
    };
    let ctx = context_with(tenancy, &cache).await;
    let repo = GitRepo::new();
    repo.write("app/cm.yaml", &configmap_yaml("local", None, "x"));
    repo.commit("local");
    create_app(&ns, "local", &repo.url(), "app", automated(true, true)).await;
    reconcile_app(&ctx, &ns, "local", &Request::default())
        .await
        .expect_err("a local repository is refused");
    let (reason, message) = stalled(&get_app(&ns, "local").await);
    assert_eq!(reason, "LocalRepositoryRefused");
    assert!(message.contains("--allow-local-repos"), "{message}");
    assert!(configmap(&ns.name, "local").await.is_none());
}

/// Every log line, metric and status written while `setpoint run` serves
/// tenants (a sync, a forbidden commit, a repository URL with a password,
/// signed, unsigned and GitLab deliveries) is free of the webhook secrets,
/// the Git password and the AMQP password.
#[tokio::test]
async fn secrets_appear_in_no_log_line_metric_or_status() {
    use support::process::{
        Setpoint, free_port, github_push, gitlab_push, post, post_github, post_gitlab, scrape,
    };

    let ns = TestNamespace::new("tenancy-secrets").await;
    install_crd(&ns.client).await;
    grant_edit(&ns, "deployer").await;
    let github_secret = unique_name("whsec");
    let gitlab_token = unique_name("gltok");
    let git_password = unique_name("gitpw");
    let url_password = unique_name("urlpw");
    let secrets = [
        github_secret.as_str(),
        gitlab_token.as_str(),
        git_password.as_str(),
        url_password.as_str(),
        support::AMQP_TEST_PASSWORD,
    ];

    let repo = GitRepo::new();
    repo.write("app/web.yaml", &configmap_yaml("web", None, "1"));
    repo.write("other/cm.yaml", &configmap_yaml("other", None, "1"));
    let commit = repo.commit("web");
    let served = repo.serve_http("acme", "deploy");
    let with_password = served
        .url
        .replace("http://", &format!("http://someone:{url_password}@"));
    let escalating = GitRepo::new();
    escalating.write(
        "app/ns.yaml",
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tenancy-secrets-escalation\n",
    );
    escalating.commit("a namespace");

    let port = free_port();
    let metrics_port = free_port();
    let cache = cache();
    let listen = format!("127.0.0.1:{port}");
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let amqp_url = support::amqp_url_with_password();
    let prefix = support::amqp_prefix("secrets");
    let credentials_for = served.url.rsplit_once("/deploy").unwrap().0.to_string();
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--metrics-listen",
            &metrics_listen,
            "--sweep-interval",
            "2s",
        ],
        &[
            ("SETPOINT_ADMIN_NAMESPACES", "setpoint-system"),
            ("SETPOINT_GLOBAL_CREDENTIALS_FOR", &credentials_for),
            ("SETPOINT_GITHUB_SECRETS", &github_secret),
            ("SETPOINT_GITLAB_TOKENS", &gitlab_token),
            ("SETPOINT_GIT_USERNAME", "setpoint"),
            ("SETPOINT_GIT_PASSWORD", &git_password),
            ("SETPOINT_AMQP_URL", &amqp_url),
            ("SETPOINT_AMQP_PREFIX", &prefix),
            ("SETPOINT_LOG", "debug"),
            ("SETPOINT_LOG_FORMAT", "json"),
        ],
        cache.path(),
    );
    setpoint.wait_http().await;

    create_app(&ns, "web", &served.url, "app", automated(true, true)).await;
    set_service_account(&ns, "web", "deployer").await;
    create_app(
        &ns,
        "userinfo",
        &with_password,
        "other",
        automated(true, true),
    )
    .await;
    set_service_account(&ns, "userinfo", "deployer").await;
    create_app(
        &ns,
        "escalate",
        &escalating.url(),
        "app",
        automated(true, true),
    )
    .await;
    set_service_account(&ns, "escalate", "deployer").await;

    let push = github_push(&served.url, &commit, &["app/web.yaml"]);
    assert_eq!(
        post_github(port, Some(&github_secret), &unique_name("d"), &push).0,
        200
    );
    assert_eq!(
        post_github(port, Some("not-the-secret"), &unique_name("d"), &push).0,
        401
    );
    let gitlab = gitlab_push(&served.url, &commit, &["app/web.yaml"]);
    assert_eq!(post_gitlab(port, &gitlab_token, &gitlab).0, 200);
    assert_eq!(post_gitlab(port, "wrong-token", &gitlab).0, 401);

    support::wait_for(
        "web synced, escalate stalled, userinfo reconciled",
        std::time::Duration::from_secs(90),
        || async {
            support::app::synced_at(&ns, "web", &commit).await?;
            for app in ["escalate", "userinfo"] {
                let status = get_app(&ns, app).await.status;
                if status.as_ref().is_none_or(|s| s.conditions.is_empty()) {
                    return Err(format!("{app} has no conditions yet"));
                }
            }
            Ok(())
        },
    )
    .await;
    assert_eq!(stalled(&get_app(&ns, "escalate").await).0, "Forbidden");

    let mut written = setpoint.logs();
    written.push_str(&scrape(metrics_port).expect("metrics"));
    for app in ["web", "userinfo", "escalate"] {
        let status = get_app(&ns, app).await.status;
        written.push_str(&serde_json::to_string(&status).unwrap());
    }
    for reason in ["Synced", "Forbidden", "FetchFailed", "CredentialsInvalid"] {
        for app in ["web", "userinfo", "escalate"] {
            written.push_str(&event_notes(&ns, app, reason).await.join("\n"));
        }
    }
    let (_, readyz) = post(metrics_port, "/readyz", &[], "", "GET");
    written.push_str(&readyz);
    assert!(
        written.contains("escalate"),
        "the collection holds the run's output"
    );
    for secret in secrets {
        assert!(
            !written.contains(secret),
            "a secret was written: {secret}\n{}",
            written
                .lines()
                .filter(|l| l.contains(secret))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
