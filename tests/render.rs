//! Kustomize overlays and Helm charts from Git, rendered by the real
//! engines (`kubectl kustomize`, `helm template` built from their Go
//! modules; the Makefile exports `SETPOINT_KUBECTL` and `SETPOINT_HELM`),
//! applied to the real local control plane.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::ListParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use setpoint::api::{ConditionStatus, ConditionType, HelmSource, KustomizeSource, Source, Sync};
use setpoint::reconcile::Request;
use support::app::{
    automated, context, create_app, create_app_from, get_app, install_crd, reconcile_app, synced_at,
};
use support::process::Setpoint;
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);

const BASE_DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: web:1
";

fn overlay(prefix: &str, replicas: u32, tier: &str, extra: &[&str]) -> String {
    let extra: String = extra.iter().map(|r| format!("- {r}\n")).collect();
    format!(
        "namePrefix: {prefix}-
resources:
- ../../base
{extra}replicas:
- name: web
  count: {replicas}
patches:
- target: {{kind: Deployment, name: web}}
  patch: |-
    - op: add
      path: /spec/template/metadata/labels/tier
      value: {tier}
"
    )
}

async fn deployment(ns: &TestNamespace, name: &str) -> Result<Deployment, String> {
    ns.api::<Deployment>()
        .get(name)
        .await
        .map_err(|e| format!("{name}: {e}"))
}

fn replicas(deployment: &Deployment) -> i32 {
    deployment.spec.replicas.unwrap_or(-1)
}

fn pod_label<'a>(deployment: &'a Deployment, key: &str) -> Option<&'a str> {
    deployment
        .spec
        .template
        .metadata
        .as_ref()?
        .labels
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

#[tokio::test]
async fn a_base_and_two_overlays_deploy_as_two_applications() {
    let ns = TestNamespace::new("kustomize").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    // The prod overlay also pulls a base from the same repository by URL,
    // as kustomize's remote references spell it.
    let remote_base = format!("{}//shared?ref=main", repo.url());
    let commit = repo
        .write("base/deployment.yaml", BASE_DEPLOYMENT)
        .write(
            "base/kustomization.yaml",
            "resources:\n- deployment.yaml\nconfigMapGenerator:\n- name: settings\n  literals: [mode=base]\n",
        )
        .write(
            "shared/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shared\ndata: {from: remote}\n",
        )
        .write("shared/kustomization.yaml", "resources: [cm.yaml]\n")
        .write(
            "overlays/staging/kustomization.yaml",
            &overlay("staging", 1, "test", &[]),
        )
        .write(
            "overlays/prod/kustomization.yaml",
            &overlay("prod", 3, "live", &[&remote_base]),
        )
        .commit("base and overlays");
    // Detected from the kustomization.yaml; prod names the method.
    create_app(
        &ns,
        "staging",
        &repo.url(),
        "overlays/staging",
        automated(true, true),
    )
    .await;
    let prod = Source {
        repo_url: repo.url(),
        path: Some("overlays/prod".into()),
        kustomize: Some(KustomizeSource::default()),
        ..Default::default()
    };
    create_app_from(&ns, "prod", prod, automated(true, true)).await;

    for app in ["staging", "prod"] {
        let outcome = reconcile_app(&ctx, &ns, app, &Request::default())
            .await
            .unwrap_or_else(|e| panic!("{app}: {e}"));
        assert_eq!(outcome.status.sync.status, Sync::Synced, "{app}");
        assert_eq!(outcome.revision.as_deref(), Some(commit.as_str()));
    }
    let staging = deployment(&ns, "staging-web").await.unwrap();
    let prod = deployment(&ns, "prod-web").await.unwrap();
    assert_eq!((replicas(&staging), replicas(&prod)), (1, 3));
    assert_eq!(pod_label(&staging, "tier"), Some("test"));
    assert_eq!(pod_label(&prod, "tier"), Some("live"));
    // Generated names (with their hash suffix) and the remote base.
    let configmaps = ns
        .api::<ConfigMap>()
        .list(&ListParams::default())
        .await
        .unwrap();
    let names: Vec<String> = configmaps.items.iter().map(|c| c.name_any()).collect();
    assert!(
        names.iter().any(|n| n.starts_with("staging-settings-"))
            && names.iter().any(|n| n.starts_with("prod-settings-")),
        "{names:?}"
    );
    assert!(names.contains(&"prod-shared".to_string()), "{names:?}");
    assert!(!names.contains(&"staging-shared".to_string()), "{names:?}");
    // Each object belongs to its own Application.
    assert_eq!(
        staging.labels().get("setpoint.dev/app").map(String::as_str),
        Some(format!("{}.staging", ns.name).as_str())
    );

    // A change to the prod overlay in Git changes only prod.
    let changed = repo
        .write(
            "overlays/prod/kustomization.yaml",
            &overlay("prod", 4, "live", &[]),
        )
        .commit("prod: four replicas, no remote base");
    for app in ["staging", "prod"] {
        reconcile_app(&ctx, &ns, app, &Request::default())
            .await
            .unwrap();
    }
    assert_eq!(replicas(&deployment(&ns, "prod-web").await.unwrap()), 4);
    assert_eq!(replicas(&deployment(&ns, "staging-web").await.unwrap()), 1);
    synced_at(&ns, "prod", &changed).await.unwrap();
    // The remote base is gone from Git: pruned.
    wait_for("prod-shared pruned", DEADLINE, || async {
        match ns.api::<ConfigMap>().get_opt("prod-shared").await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_remote_base_on_another_host_is_a_clear_condition() {
    let ns = TestNamespace::new("kustomize-remote").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write(
            "app/kustomization.yaml",
            "resources:\n- https://github.com/example/config//base?ref=main\n",
        )
        .commit("remote base elsewhere");
    create_app(&ns, "remote", &repo.url(), "app", automated(true, true)).await;
    let err = reconcile_app(&ctx, &ns, "remote", &Request::default())
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "RenderFailed", "{err}");
    let status = get_app(&ns, "remote").await.status.unwrap();
    assert_eq!(status.sync.revision.as_deref(), Some(commit.as_str()));
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Stalled)
        .expect("a Stalled condition");
    assert_eq!(stalled.status, ConditionStatus::True);
    assert_eq!(stalled.reason, "RenderFailed");
    assert!(
        stalled.message.contains("kustomize build failed")
            && stalled.message.contains("github.com/example/config")
            && stalled.message.contains("renders offline"),
        "{}",
        stalled.message
    );
}

const CHART: &str = "apiVersion: v2\nname: web\nversion: 0.1.0\n";

const DEPLOYMENT_TEMPLATE: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}
  namespace: {{ .Release.Namespace }}
spec:
  replicas: {{ .Values.replicas }}
  selector:
    matchLabels: {app: {{ .Release.Name }}}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}}
    spec:
      containers:
      - name: web
        image: "{{ .Values.image }}"
"#;

const CAPABILITIES_TEMPLATE: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-capabilities
data:
  kubeMinor: {{ .Capabilities.KubeVersion.Minor | quote }}
  hasDeployments: {{ .Capabilities.APIVersions.Has "apps/v1/Deployment" | quote }}
  hasWidgets: {{ .Capabilities.APIVersions.Has "example.setpoint.dev/v1" | quote }}
  greeting: {{ .Values.greeting | quote }}
"#;

const WIDGET_CRD: &str = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.setpoint.dev
spec:
  group: example.setpoint.dev
  names: {kind: Widget, plural: widgets, singular: widget}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
";

const WIDGET_TEMPLATE: &str = r#"apiVersion: example.setpoint.dev/v1
kind: Widget
metadata:
  name: {{ .Release.Name }}-widget
spec:
  size: {{ .Values.replicas }}
"#;

#[tokio::test]
async fn a_helm_chart_with_a_values_file_deploys_and_follows_git() {
    let ns = TestNamespace::new("helm").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    // A CRD of its own, so each run of this test needs a fresh group name.
    let group = format!("{}.setpoint.dev", ns.name);
    let commit = repo
        .write("charts/web/Chart.yaml", CHART)
        .write(
            "charts/web/values.yaml",
            "replicas: 1\nimage: web:1\ngreeting: from-chart\n",
        )
        .write("charts/web/templates/deployment.yaml", DEPLOYMENT_TEMPLATE)
        .write(
            "charts/web/templates/capabilities.yaml",
            &CAPABILITIES_TEMPLATE.replace("example.setpoint.dev", &group),
        )
        .write(
            "charts/web/templates/widget.yaml",
            &WIDGET_TEMPLATE.replace("example.setpoint.dev", &group),
        )
        .write(
            "charts/web/crds/widgets.yaml",
            &WIDGET_CRD.replace("example.setpoint.dev", &group),
        )
        .write(
            "charts/web/templates/tests/test-pod.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {{ .Release.Name }}-test\n  annotations: {\"helm.sh/hook\": test}\nspec:\n  containers: [{name: t, image: busybox}]\n",
        )
        .write("env/prod.yaml", "replicas: 2\nimage: web:2\n")
        .commit("chart");
    let source = Source {
        repo_url: repo.url(),
        path: Some("charts/web".into()),
        helm: Some(HelmSource {
            release_name: Some("shop".into()),
            value_files: vec!["../../env/prod.yaml".into()],
            values: Some("greeting: inline\n".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    create_app_from(&ns, "web", source, automated(true, true)).await;
    let outcome = reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.status.sync.status, Sync::Synced);
    assert_eq!(outcome.revision.as_deref(), Some(commit.as_str()));

    let shop = deployment(&ns, "shop").await.unwrap();
    assert_eq!(replicas(&shop), 2, "the values file wins over values.yaml");
    let image = shop.spec.template.spec.unwrap().containers[0].image.clone();
    assert_eq!(image.as_deref(), Some("web:2"));
    let capabilities = ns
        .api::<ConfigMap>()
        .get("shop-capabilities")
        .await
        .unwrap();
    let data = capabilities.data.unwrap();
    assert_eq!(data["kubeMinor"], "37");
    assert_eq!(data["hasDeployments"], "true");
    assert_eq!(data["hasWidgets"], "false", "before the chart's CRD exists");
    assert_eq!(data["greeting"], "inline", "inline values win over files");
    // The chart's CRD first, then its instance.
    let widget_api: kube::Api<DynamicObject> = kube::Api::namespaced_with(
        ns.client.clone(),
        &ns.name,
        &ApiResource::from_gvk(&GroupVersionKind::gvk(&group, "v1", "Widget")),
    );
    let widget = widget_api.get("shop-widget").await.unwrap();
    assert_eq!(widget.data["spec"]["size"], 2);
    // Test hooks are not deployed.
    let pods = ns.api::<k8s_openapi::api::core::v1::Pod>();
    assert!(pods.get_opt("shop-test").await.unwrap().is_none());

    // A value changed in Git changes the live object.
    let changed = repo
        .write("env/prod.yaml", "replicas: 3\nimage: web:3\n")
        .commit("prod: three replicas");
    reconcile_app(&ctx, &ns, "web", &Request::default())
        .await
        .unwrap();
    let shop = deployment(&ns, "shop").await.unwrap();
    assert_eq!(replicas(&shop), 3);
    synced_at(&ns, "web", &changed).await.unwrap();
    // The CRD it applied is served now: the next render sees it at once
    // (a new revision, so it is rendered again).
    let later = repo.write("env/note.txt", "x").commit("unrelated");
    wait_for("hasWidgets true", Duration::from_secs(20), || async {
        reconcile_app(&ctx, &ns, "web", &Request::default())
            .await
            .map_err(|e| e.to_string())?;
        synced_at(&ns, "web", &later).await?;
        let data = ns
            .api::<ConfigMap>()
            .get("shop-capabilities")
            .await
            .map_err(|e| e.to_string())?
            .data
            .unwrap_or_default();
        match data.get("hasWidgets").map(String::as_str) {
            Some("true") => Ok(()),
            other => Err(format!("hasWidgets {other:?}")),
        }
    })
    .await;
}

#[tokio::test]
async fn a_failing_template_is_a_condition_naming_it_and_nothing_is_applied() {
    let ns = TestNamespace::new("helm-broken").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let commit = repo
        .write("chart/Chart.yaml", CHART)
        .write("chart/values.yaml", "replicas: 1\nimage: web:1\n")
        .write("chart/templates/deployment.yaml", DEPLOYMENT_TEMPLATE)
        .write(
            "chart/templates/broken.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: broken\ndata:\n  x: {{ .Values.database.host }}\n",
        )
        .commit("broken template");
    // Detected as a chart from its Chart.yaml.
    create_app(&ns, "broken", &repo.url(), "chart", automated(true, true)).await;
    let err = reconcile_app(&ctx, &ns, "broken", &Request::default())
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "RenderFailed", "{err}");
    let status = get_app(&ns, "broken").await.status.unwrap();
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Stalled)
        .expect("a Stalled condition");
    assert_eq!(stalled.reason, "RenderFailed");
    assert!(
        stalled.message.starts_with("helm template failed: ")
            && stalled.message.contains("templates/broken.yaml")
            && stalled.message.contains("database"),
        "{}",
        stalled.message
    );
    assert_eq!(status.sync.revision.as_deref(), Some(commit.as_str()));
    // Nothing of the chart reached the cluster, not even its good template.
    assert!(
        ns.api::<Deployment>()
            .get_opt("broken")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("broken")
            .await
            .unwrap()
            .is_none()
    );

    // A values file that is not there is a clear condition too.
    let source = Source {
        repo_url: repo.url(),
        path: Some("chart".into()),
        helm: Some(HelmSource {
            value_files: vec!["values-missing.yaml".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    create_app_from(&ns, "missing-values", source, automated(true, true)).await;
    let err = reconcile_app(&ctx, &ns, "missing-values", &Request::default())
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "InvalidSource");
    assert!(
        err.to_string().contains(
            "values file values-missing.yaml (chart/values-missing.yaml) is not in the repository"
        ),
        "{err}"
    );
}

/// A `kubectl` that counts its runs in a file, then runs the real one.
fn counting_kubectl(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let real = std::env::var("SETPOINT_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let count = dir.join("kubectl-runs");
    let wrapper = dir.join("kubectl-counting");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec '{real}' \"$@\"\n",
            count.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    (wrapper, count)
}

fn runs(count: &std::path::Path) -> usize {
    std::fs::read_to_string(count)
        .map(|t| {
            t.lines()
                .filter(|l| l.starts_with("kustomize ") && l.contains("/apps/app-"))
                .count()
        })
        .unwrap_or(0)
}

/// `end` lines per Application in a reconcile record.
fn ends(record: &std::path::Path) -> std::collections::HashMap<String, usize> {
    let mut ends = std::collections::HashMap::new();
    for line in std::fs::read_to_string(record).unwrap_or_default().lines() {
        let mut words = line.split_whitespace();
        if words.next() == Some("end")
            && let Some(app) = words.next()
        {
            *ends.entry(app.to_string()).or_insert(0) += 1;
        }
    }
    ends
}

#[tokio::test]
async fn a_sweep_over_a_hundred_unchanged_kustomize_apps_renders_nothing() {
    const APPS: usize = 100;
    let ns = TestNamespace::new("kustomize-sweep").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let repo = GitRepo::new();
    repo.write(
        "base/cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata: {a: b}\n",
    )
    .write("base/kustomization.yaml", "resources: [cm.yaml]\n");
    for i in 0..APPS {
        repo.write(
            &format!("apps/app-{i}/kustomization.yaml"),
            &format!("namePrefix: app-{i}-\nresources: [../../base]\n"),
        );
    }
    let commit = repo.commit("a hundred overlays");
    for i in 0..APPS {
        create_app(
            &ns,
            &format!("app-{i}"),
            &repo.url(),
            &format!("apps/app-{i}"),
            automated(true, true),
        )
        .await;
    }
    let (kubectl, count) = counting_kubectl(cache.path());
    let record = cache.path().join("record");
    let args = [
        "run",
        "--listen",
        "127.0.0.1:0",
        "--no-watch",
        "--sweep-interval",
        "2s",
    ];
    let env = [
        ("SETPOINT_KUBECTL", kubectl.to_str().unwrap()),
        ("SETPOINT_RECONCILE_RECORD", record.to_str().unwrap()),
    ];
    let setpoint = Setpoint::scoped(&ns.name, &args, &env, cache.path());
    wait_for("every app Synced", DEADLINE, || async {
        let mut waiting = 0;
        for i in 0..APPS {
            if synced_at(&ns, &format!("app-{i}"), &commit).await.is_err() {
                waiting += 1;
            }
        }
        if waiting == 0 {
            Ok(())
        } else {
            Err(format!(
                "{waiting} apps not Synced yet; {}",
                setpoint
                    .logs()
                    .lines()
                    .rev()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" | ")
            ))
        }
    })
    .await;
    let rendered = runs(&count);
    assert!(
        (APPS..APPS * 2).contains(&rendered),
        "each overlay rendered about once for its first sync: {rendered}"
    );
    let before = ends(&record);
    // Two more sweeps over every app.
    wait_for("two sweeps over every app", DEADLINE, || async {
        let now = ends(&record);
        let behind = (0..APPS)
            .filter(|i| {
                let key = format!("{}/app-{i}", ns.name);
                now.get(&key).copied().unwrap_or(0) < before.get(&key).copied().unwrap_or(0) + 2
            })
            .count();
        if behind == 0 {
            Ok(())
        } else {
            Err(format!("{behind} apps not swept twice yet"))
        }
    })
    .await;
    assert_eq!(runs(&count), rendered, "the sweep ran kustomize again");
    for i in [0, APPS - 1] {
        synced_at(&ns, &format!("app-{i}"), &commit).await.unwrap();
    }
}

/// The Stalled condition of an Application: its reason and message.
async fn stalled(ns: &TestNamespace, app: &str) -> (String, String) {
    let status = get_app(ns, app).await.status.unwrap_or_default();
    let stalled = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Stalled && c.status == ConditionStatus::True)
        .unwrap_or_else(|| panic!("{app} is not Stalled: {:?}", status.conditions));
    (stalled.reason.clone(), stalled.message.clone())
}

/// Fails when any ConfigMap of the namespace holds `marker`.
async fn marker_nowhere(ns: &TestNamespace, marker: &str) {
    let configmaps = ns
        .api::<ConfigMap>()
        .list(&ListParams::default())
        .await
        .unwrap();
    for configmap in configmaps.items {
        let text = serde_json::to_string(&configmap).unwrap();
        assert!(
            !text.contains(marker),
            "{} holds a file from outside the repository: {text}",
            configmap.name_any()
        );
    }
}

#[tokio::test]
async fn nothing_outside_the_repository_is_read_while_rendering() {
    let ns = TestNamespace::new("render-confined").await;
    install_crd(&ns.client).await;
    let (ctx, cache) = context().await;
    // Files outside the repository, each holding a marker that must reach
    // no object. The render's copy is <cache>/render/render-*/repo, so
    // five `..` from envs/prod reach <cache>.
    let marker = format!("outside-marker-{}", ns.name);
    let outside = cache.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("kustomization.yaml"), "resources: [cm.yaml]\n").unwrap();
    std::fs::write(
        outside.join("cm.yaml"),
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: outside\ndata: {{marker: {marker}}}\n"),
    )
    .unwrap();
    let secret_file = outside.join("secret.yaml");
    std::fs::write(&secret_file, format!("greeting: {marker}\n")).unwrap();

    // The symlinks go in repositories of their own: a symlink pointing
    // outside refuses every render of its repository.
    let chart = |repo: &GitRepo| {
        repo.write("charts/web/Chart.yaml", CHART)
            .write("charts/web/values.yaml", "greeting: from-chart\n")
            .write(
                "charts/web/templates/greeting.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: greeting\ndata:\n  greeting: {{ .Values.greeting | quote }}\n",
            );
    };
    let climbing = GitRepo::new();
    climbing.write(
        "envs/prod/kustomization.yaml",
        "resources:\n- ../../../../../outside\n",
    );
    chart(&climbing);
    climbing.commit("paths that climb out of the repository");
    let generator = GitRepo::new();
    generator.write(
        "envs/gen/kustomization.yaml",
        "configMapGenerator:\n- name: settings\n  files: [app.conf]\n",
    );
    std::os::unix::fs::symlink(&secret_file, generator.work.join("envs/gen/app.conf")).unwrap();
    generator.commit("a generator reading a symlink to outside");
    let values = GitRepo::new();
    chart(&values);
    std::os::unix::fs::symlink(
        &secret_file,
        values.work.join("charts/web/values-prod.yaml"),
    )
    .unwrap();
    values.commit("a values file that is a symlink to outside");

    create_app(
        &ns,
        "climbs",
        &climbing.url(),
        "envs/prod",
        automated(true, true),
    )
    .await;
    create_app(
        &ns,
        "generator",
        &generator.url(),
        "envs/gen",
        automated(true, true),
    )
    .await;
    let helm = |repo: &GitRepo, file: &str| Source {
        repo_url: repo.url(),
        path: Some("charts/web".into()),
        helm: Some(HelmSource {
            value_files: vec![file.into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    create_app_from(
        &ns,
        "values-link",
        helm(&values, "values-prod.yaml"),
        automated(true, true),
    )
    .await;
    // From charts/web, three `..` climb above the repository's root.
    create_app_from(
        &ns,
        "values-up",
        helm(&climbing, "../../../outside/secret.yaml"),
        automated(true, true),
    )
    .await;

    let secret = secret_file.display().to_string();
    for (app, expected) in [
        (
            "climbs",
            "kustomization.yaml in envs/prod: resource ../../../../../outside climbs out of the repository".to_string(),
        ),
        (
            "generator",
            format!("symlink envs/gen/app.conf -> {secret} points outside the repository"),
        ),
        (
            "values-link",
            format!("symlink charts/web/values-prod.yaml -> {secret} points outside the repository"),
        ),
        (
            "values-up",
            "values file ../../../outside/secret.yaml is outside the repository".to_string(),
        ),
    ] {
        let err = reconcile_app(&ctx, &ns, app, &Request::default())
            .await
            .expect_err(app);
        assert!(!err.is_transient(), "{app}: {err}");
        let (reason, message) = stalled(&ns, app).await;
        assert_eq!(reason, "InvalidSource", "{app}: {message}");
        assert!(message.contains(&expected), "{app}: {message}");
    }
    marker_nowhere(&ns, &marker).await;

    // A symlink that stays inside the repository is followed.
    let linked = GitRepo::new();
    linked
        .write(
            "base/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: inside\ndata: {from: base}\n",
        )
        .write("base/kustomization.yaml", "resources: [cm.yaml]\n")
        .write("envs/ok/kustomization.yaml", "resources: [base]\n");
    std::os::unix::fs::symlink("../../base", linked.work.join("envs/ok/base")).unwrap();
    let commit = linked.commit("a base through a symlink inside the repository");
    create_app(
        &ns,
        "linked",
        &linked.url(),
        "envs/ok",
        automated(true, true),
    )
    .await;
    reconcile_app(&ctx, &ns, "linked", &Request::default())
        .await
        .unwrap_or_else(|e| panic!("linked: {e}"));
    synced_at(&ns, "linked", &commit).await.unwrap();
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("inside")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("outside")
            .await
            .unwrap()
            .is_none()
    );
}

/// `a: &a [x, x, …]` with `items` items, then `b: [*a, *a, …]` with
/// `aliases` aliases, as the second document of a file.
fn alias_bomb(items: usize, aliases: usize) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: fine}}\n---\na: &a [{}]\nb: [{}]\n",
        vec!["x"; items].join(","),
        vec!["*a"; aliases].join(",")
    )
}

/// Runs `setpoint <args>` to its end: its exit code, its output and its
/// peak resident memory in KiB (`ru_maxrss` of wait4 on its pid).
async fn run_measured(args: &[&str], cache: &std::path::Path) -> (i32, String, u64) {
    let log = cache.join(format!("{}.log", support::unique_name("measured")));
    let out = std::fs::File::create(&log).unwrap();
    // wait4 below reaps it, as std's wait cannot: only wait4 tells the
    // child's own peak memory.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .args(args)
        .env("KUBECONFIG", support::kubeconfig_path())
        .env("SETPOINT_CACHE_DIR", cache)
        .env("SETPOINT_LOG", "info")
        .env("SETPOINT_ALLOW_LOCAL_REPOS", "true")
        .env("SETPOINT_ADMIN_NAMESPACES", "*")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("start setpoint");
    let pid = child.id() as libc::pid_t;
    let (status, usage) = wait_for("setpoint to exit", DEADLINE, || async {
        let mut status = 0;
        // SAFETY: an all-zero rusage is valid; wait4 only writes to the two
        // locals, for our own child, without blocking.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        match reaped {
            0 => Err("still running".to_string()),
            p if p == pid => Ok((status, usage)),
            _ => panic!("wait4: {}", std::io::Error::last_os_error()),
        }
    })
    .await;
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -libc::WTERMSIG(status)
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    (code, output, usage.ru_maxrss as u64)
}

#[tokio::test]
async fn an_alias_bomb_and_a_huge_document_stall_within_bounded_memory() {
    let ns = TestNamespace::new("render-bomb").await;
    install_crd(&ns.client).await;
    let (_ctx, cache) = context().await;
    let bomb = alias_bomb(20_000, 20_000);
    // About 98 KiB, as the one that killed the workers.
    assert!((90_000..100 * 1024).contains(&bomb.len()), "{}", bomb.len());
    // Under the alias limit, but each alias 10 KB: about 11 MB expanded.
    let huge = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: huge}}\nlong: &long [{}]\ndata: [{}]\n",
        vec!["y".repeat(100); 100].join(","),
        vec!["*long"; 1_100].join(",")
    );
    let repo = GitRepo::new();
    repo.write("apps/bomb/bomb.yaml", &bomb)
        .write("apps/huge/huge.yaml", &huge)
        .commit("an alias bomb and a huge document");
    create_app(&ns, "bomb", &repo.url(), "apps/bomb", automated(true, true)).await;
    create_app(&ns, "huge", &repo.url(), "apps/huge", automated(true, true)).await;

    for (app, expected) in [
        (
            "bomb",
            "apps/bomb/bomb.yaml: document 1: expands to more than 1000000 nodes through aliases (limit SETPOINT_MAX_MANIFEST_NODES)",
        ),
        (
            "huge",
            "apps/huge/huge.yaml: document 0: expands to more than 10485760 bytes through aliases (limit SETPOINT_MAX_MANIFEST_EXPANDED_BYTES)",
        ),
    ] {
        let target = format!("{}/{app}", ns.name);
        let (code, output, peak_kib) = run_measured(&["reconcile", &target], cache.path()).await;
        eprintln!(
            "setpoint reconcile {app}: exit {code}, peak RSS {} MiB",
            peak_kib / 1024
        );
        assert_eq!(code, 2, "{app}: a lasting failure, not a crash: {output}");
        assert!(output.contains(expected), "{app}: {output}");
        assert!(
            peak_kib < 200 * 1024,
            "{app}: setpoint peaked at {} MiB",
            peak_kib / 1024
        );
        let (reason, message) = stalled(&ns, app).await;
        assert_eq!(reason, "ManifestTooLarge");
        assert!(message.contains(expected), "{message}");
    }
}
