//! Health as Argo CD assesses it, and custom health in CEL, against the real
//! local control plane: a paused Deployment makes its Application
//! Suspended; a custom resource follows its Application's CEL rule as its
//! status changes; a broken expression is a clear condition, not a crash.

mod support;

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use setpoint::api::{
    Application, ApplicationSpec, ConditionStatus, ConditionType, Health, HealthCheck, Source,
};
use setpoint::reconcile::Request;
use support::app::{
    automated, condition, context, create_app, get_app, install_crd, reconcile_app,
};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);

/// Reconciles (as the worker does on each event) until the Application's
/// health is `want`; its status then.
async fn reconcile_until(
    ctx: &setpoint::context::Context,
    ns: &TestNamespace,
    name: &str,
    want: Health,
) -> setpoint::api::ApplicationStatus {
    wait_for(&format!("{name} {want:?}"), DEADLINE, || async {
        reconcile_app(ctx, ns, name, &Request::default())
            .await
            .map_err(|e| format!("reconcile: {e}"))?;
        let status = get_app(ns, name).await.status.unwrap_or_default();
        if status.health.status == want {
            Ok(status)
        } else {
            Err(format!("health {:?}", status.health))
        }
    })
    .await
}

#[tokio::test]
async fn a_paused_deployment_makes_its_application_suspended() {
    let ns = TestNamespace::new("health-paused").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write(
        "app/web.yaml",
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  paused: true
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: app
        image: registry.example/web:1
",
    )
    .write(
        "app/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: b\n",
    )
    .commit("a paused deployment");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;

    let status = reconcile_until(&ctx, &ns, "app", Health::Suspended).await;
    assert_eq!(
        status.health.message.as_deref(),
        Some("Deployment web: Deployment is paused")
    );
    let web = status
        .resources
        .iter()
        .find(|r| r.kind == "Deployment")
        .unwrap();
    assert_eq!(web.health, Health::Suspended);
    let ready = condition(&status, ConditionType::Ready);
    assert_eq!(ready.status, ConditionStatus::False);
    assert_eq!(ready.reason, "Suspended");
}

/// A namespaced `Widget` kind in `group` with a status subresource.
fn widget_crd(group: &str) -> String {
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.{group}
spec:
  group: {group}
  scope: Namespaced
  names: {{plural: widgets, singular: widget, kind: Widget}}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {{status: {{}}}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {{type: integer}}
          status:
            type: object
            properties:
              phase: {{type: string}}
              message: {{type: string}}
"
    )
}

async fn create_app_with_checks(
    ns: &TestNamespace,
    name: &str,
    repo_url: &str,
    checks: Vec<HealthCheck>,
) {
    let mut app = Application::new(
        name,
        ApplicationSpec {
            source: Source {
                repo_url: repo_url.to_string(),
                path: Some("app".into()),
                ..Default::default()
            },
            sync_policy: automated(true, true),
            health_checks: checks,
            ..Default::default()
        },
    );
    app.metadata.namespace = Some(ns.name.clone());
    ns.api::<Application>()
        .create(&PostParams::default(), &app)
        .await
        .expect("create Application");
}

fn widget_check(group: &str, failed: &str) -> HealthCheck {
    HealthCheck {
        api_version: format!("{group}/v1"),
        kind: "Widget".into(),
        current: "has(self.status) && has(self.status.phase) && self.status.phase == 'Ready'"
            .into(),
        in_progress: None,
        failed: Some(failed.into()),
    }
}

async fn delete_crd(ns: &TestNamespace, group: &str) {
    let crds: Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    > = Api::all(ns.client.clone());
    let _ = crds
        .delete(&format!("widgets.{group}"), &Default::default())
        .await;
}

#[tokio::test]
async fn a_custom_resource_follows_its_applications_cel_rule() {
    let ns = TestNamespace::new("health-cel").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let group = format!("{}.example.com", support::unique_name("h").replace('-', ""));
    let repo = GitRepo::new();
    repo.write("app/crd.yaml", &widget_crd(&group))
        .write(
            "app/widget.yaml",
            &format!(
                "apiVersion: {group}/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n"
            ),
        )
        .commit("a widget");
    create_app_with_checks(
        &ns,
        "widgets",
        &repo.url(),
        vec![widget_check(
            &group,
            "has(self.status) && has(status.phase) && status.phase == 'Failed'",
        )],
    )
    .await;

    // No status yet: neither expression holds.
    let status = reconcile_until(&ctx, &ns, "widgets", Health::Progressing).await;
    let widget = status
        .resources
        .iter()
        .find(|r| r.kind == "Widget")
        .unwrap();
    assert_eq!(
        widget.message.as_deref(),
        Some("waiting for the health check to pass")
    );

    let gvk = GroupVersionKind::gvk(&group, "v1", "Widget");
    let widgets: Api<DynamicObject> =
        Api::namespaced_with(ns.client.clone(), &ns.name, &ApiResource::from_gvk(&gvk));
    let set_status = |status: serde_json::Value| {
        let widgets = widgets.clone();
        async move {
            widgets
                .patch_status(
                    "w1",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({ "status": status })),
                )
                .await
                .expect("patch the Widget's status");
        }
    };

    set_status(serde_json::json!({"phase": "Ready"})).await;
    reconcile_until(&ctx, &ns, "widgets", Health::Healthy).await;

    set_status(serde_json::json!({"phase": "Failed", "message": "disk full"})).await;
    let status = reconcile_until(&ctx, &ns, "widgets", Health::Degraded).await;
    assert_eq!(
        status.health.message.as_deref(),
        Some("Widget w1: disk full")
    );
    delete_crd(&ns, &group).await;
}

#[tokio::test]
async fn a_broken_cel_expression_is_a_clear_condition() {
    let ns = TestNamespace::new("health-cel-broken").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write(
        "app/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: b\n",
    )
    .commit("one config map");
    create_app_with_checks(
        &ns,
        "app",
        &repo.url(),
        vec![widget_check("example.com", "self.status.phase ==")],
    )
    .await;

    let error = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .unwrap_err();
    assert_eq!(error.reason(), "InvalidHealthCheck");
    assert!(!error.is_transient(), "waits for a fix: {error}");
    let status = get_app(&ns, "app").await.status.unwrap();
    let ready = condition(&status, ConditionType::Ready);
    assert_eq!(ready.status, ConditionStatus::False);
    assert_eq!(ready.reason, "InvalidHealthCheck");
    assert!(
        ready
            .message
            .starts_with("invalid health check for Widget (example.com/v1): failed: "),
        "{}",
        ready.message
    );
    // Nothing was applied with rules that cannot be read.
    let applied = ns
        .api::<k8s_openapi::api::core::v1::ConfigMap>()
        .get_opt("settings")
        .await
        .unwrap();
    assert!(applied.is_none());
}
