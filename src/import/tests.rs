//! Round trips: typical Argo CD and Flux objects (`tests/import/`) imported,
//! printed, parsed back as Setpoint Applications and compared field by
//! field; each comment checked to stand above the field it concerns.

use serde::Deserialize;
use serde_json::json;

use super::*;
use crate::api::{Automated, JsonnetVar};

const ARGOCD: &str = include_str!("../../tests/import/argocd.yaml");
const FLUX: &str = include_str!("../../tests/import/flux.yaml");
const MIXED: &str = include_str!("../../tests/import/mixed.yaml");

/// The printed text and every document of it, parsed as Setpoint
/// Applications.
fn round_trip(text: &str, options: &Options) -> (String, Vec<Application>, Vec<ImportError>) {
    let (objects, mut problems) = parse_documents("input.yaml", text);
    let outcome = import(&objects, options);
    problems.extend(outcome.problems);
    let printed = render(&outcome.imported);
    let parsed = serde_yaml::Deserializer::from_str(&printed)
        .map(|document| Application::deserialize(document).expect("a Setpoint Application"))
        .collect();
    (printed, parsed, problems)
}

fn find<'a>(apps: &'a [Application], name: &str) -> &'a Application {
    apps.iter()
        .find(|a| a.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no Application {name}"))
}

/// The printed document of the Application `name`.
fn document<'a>(printed: &'a str, name: &str) -> &'a str {
    printed
        .split("\n---\n")
        .find(|d| d.contains(&format!("\n  name: {name}\n")))
        .unwrap_or_else(|| panic!("no document for {name} in\n{printed}"))
}

/// The comment lines just above the line `line` of `document`.
fn comments_above<'a>(document: &'a str, line: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = document.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == line)
        .unwrap_or_else(|| panic!("no line {line:?} in\n{document}"));
    let mut comments: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with('#'))
        .map(|l| l.trim_start())
        .collect();
    comments.reverse();
    comments
}

fn has(comments: &[&str], text: &str) -> bool {
    comments.iter().any(|c| c.contains(text))
}

#[test]
fn argo_cd_applications_round_trip() {
    let (printed, apps, problems) = round_trip(ARGOCD, &Options::default());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(apps.len(), 6, "{printed}");

    let guestbook = find(&apps, "guestbook");
    assert_eq!(guestbook.metadata.namespace.as_deref(), Some("guestbook"));
    assert_eq!(
        guestbook.metadata.finalizers.as_deref(),
        Some(&["resources-finalizer.argocd.argoproj.io".to_string()][..])
    );
    let annotations = guestbook.metadata.annotations.clone().unwrap();
    assert_eq!(
        annotations.keys().collect::<Vec<_>>(),
        ["example.com/owner"],
        "notifications and kubectl's annotations are not copied"
    );
    assert_eq!(guestbook.metadata.labels.clone().unwrap()["team"], "web");
    assert!(guestbook.metadata.uid.is_none());
    let spec = &guestbook.spec;
    assert_eq!(
        spec.source.repo_url,
        "https://github.com/argoproj/argocd-example-apps.git"
    );
    assert_eq!(spec.source.target_revision.as_deref(), Some("HEAD"));
    assert_eq!(spec.source.path.as_deref(), Some("guestbook"));
    assert_eq!(
        spec.destination.server.as_deref(),
        Some("https://kubernetes.default.svc")
    );
    assert_eq!(spec.destination.namespace.as_deref(), Some("guestbook"));
    assert_eq!(
        spec.sync_policy.automated,
        Some(Automated {
            prune: true,
            self_heal: true
        })
    );
    assert!(spec.sync_policy.allow_empty);
    assert_eq!(
        spec.sync_policy.sync_options,
        ["CreateNamespace=true", "PruneLast=true"]
    );
    assert_eq!(spec.ignore_differences.len(), 2);
    assert_eq!(spec.ignore_differences[0].group, "apps");
    assert_eq!(spec.ignore_differences[0].json_pointers, ["/spec/replicas"]);
    assert_eq!(spec.ignore_differences[1].name.as_deref(), Some("web-hook"));
    assert_eq!(
        spec.ignore_differences[1].managed_fields_managers,
        ["kube-controller-manager"]
    );
    assert!(spec.ignore_differences[1].json_pointers.is_empty());

    let doc = document(&printed, "guestbook");
    assert!(doc.starts_with(
        "# Imported from Argo CD Application argocd/guestbook (argoproj.io/v1alpha1).\n"
    ));
    let top = comments_above(doc, "apiVersion: setpoint.dev/v1alpha1");
    assert!(
        has(
            &top,
            "not mapped: spec.project \"default\" (Argo CD projects map to Setpoint's namespaces and tenancy"
        ),
        "{top:?}"
    );
    assert!(
        has(&top, "not mapped: spec.revisionHistoryLimit"),
        "{top:?}"
    );
    let metadata = comments_above(doc, "metadata:");
    assert!(
        has(
            &metadata,
            "not mapped: metadata.annotations[notifications.argoproj.io/subscribe.on-sync-succeeded.slack] (Argo CD notifications"
        ),
        "{metadata:?}"
    );
    let policy = comments_above(doc, "  syncPolicy:");
    assert!(
        has(
            &policy,
            "not mapped: spec.syncPolicy.syncOptions NoSuchOption=true (spec.syncPolicy.syncOptions: unknown sync option \"NoSuchOption\""
        ),
        "{policy:?}"
    );
    assert!(
        has(&policy, "not mapped: spec.syncPolicy.retry"),
        "{policy:?}"
    );
    let ignore = comments_above(doc, "  ignoreDifferences:");
    assert!(
        has(
            &ignore,
            "not mapped: spec.ignoreDifferences[1].jqPathExpressions (Setpoint ignores fields by JSON pointer"
        ),
        "{ignore:?}"
    );
}

#[test]
fn argo_cd_helm_kustomize_jsonnet_plugin_and_multi_source() {
    let (printed, apps, _) = round_trip(ARGOCD, &Options::default());

    let helm_app = find(&apps, "helm-guestbook");
    assert_eq!(helm_app.metadata.namespace.as_deref(), Some("frontend"));
    assert_eq!(
        helm_app.metadata.finalizers.as_deref(),
        Some(&["resources-finalizer.argocd.argoproj.io".to_string()][..])
    );
    let source = &helm_app.spec.source;
    assert_eq!(source.repo_url, "https://charts.bitnami.com/bitnami");
    assert_eq!(source.chart.as_deref(), Some("nginx"));
    assert_eq!(source.target_revision.as_deref(), Some("15.x"));
    let helm = source.helm.as_ref().unwrap();
    assert_eq!(helm.release_name.as_deref(), Some("frontend"));
    assert_eq!(helm.value_files, ["values-production.yaml"]);
    assert_eq!(
        helm.values.as_deref(),
        Some("service:\n  type: ClusterIP\n")
    );
    assert_eq!(
        helm.values_object,
        Some(json!({"replicaCount": 2, "ingress": {"enabled": false}}))
    );
    assert!(helm.skip_crds);
    assert_eq!(
        helm_app.spec.destination.name.as_deref(),
        Some("in-cluster")
    );
    assert_eq!(helm_app.spec.sync_policy.automated, None);
    let doc = document(&printed, "helm-guestbook");
    assert!(has(
        &comments_above(doc, "    helm:"),
        "not mapped: spec.source.helm.parameters (write them into valuesObject"
    ));
    assert!(has(
        &comments_above(doc, "  finalizers:"),
        "resources-finalizer.argocd.argoproj.io/background"
    ));

    let kustomize = find(&apps, "kustomize-guestbook");
    assert_eq!(
        kustomize.spec.source.kustomize,
        Some(crate::api::KustomizeSource {})
    );
    let doc = document(&printed, "kustomize-guestbook");
    assert!(has(
        &comments_above(doc, "    kustomize: {}"),
        "not mapped: spec.source.kustomize.namePrefix (Setpoint runs the path's kustomization.yaml"
    ));

    let jsonnet = find(&apps, "jsonnet-guestbook");
    let directory = jsonnet.spec.source.directory.as_ref().unwrap();
    let jsonnet_source = directory.jsonnet.as_ref().unwrap();
    assert_eq!(
        jsonnet_source.tlas,
        [
            JsonnetVar {
                name: "replicas".into(),
                value: "3".into(),
                code: true
            },
            JsonnetVar {
                name: "name".into(),
                value: "jsonnet-guestbook".into(),
                code: false
            },
        ]
    );
    assert_eq!(jsonnet_source.ext_vars[0].name, "env");
    assert_eq!(jsonnet_source.libs, ["vendor"]);
    assert_eq!(
        jsonnet.spec.sync_policy.automated,
        Some(Automated::default())
    );
    let doc = document(&printed, "jsonnet-guestbook");
    assert!(has(
        &comments_above(doc, "metadata:"),
        "argocd.argoproj.io/sync-wave] \"2\" (Applications ordered by waves in an app of apps: say it with spec.dependsOn)"
    ));

    let plugin = find(&apps, "plugin-app");
    assert_eq!(
        plugin.spec.destination.server.as_deref(),
        Some("https://remote.example.com:6443")
    );
    let doc = document(&printed, "plugin-app");
    assert!(has(
        &comments_above(doc, "  source:"),
        "not mapped: spec.source.plugin (config management plugins have no Setpoint equivalent)"
    ));

    let multi = find(&apps, "multi-source");
    assert_eq!(multi.spec.source.chart.as_deref(), Some("prometheus"));
    assert_eq!(multi.spec.source.target_revision.as_deref(), Some("25.8.0"));
    assert!(
        multi
            .spec
            .source
            .helm
            .as_ref()
            .unwrap()
            .value_files
            .is_empty()
    );
    let doc = document(&printed, "multi-source");
    let above = comments_above(doc, "  source:");
    assert!(
        has(&above, "not mapped: spec.sources (all but spec.sources[1])"),
        "{above:?}"
    );
    assert!(has(
        &comments_above(doc, "    helm: {}"),
        "valueFiles $values/charts/prometheus/values.yaml (a values file of another source"
    ));
}

#[test]
fn the_application_namespace_can_stay_or_be_chosen_and_mapped() {
    let keep = Options {
        app_namespace: AppNamespace::Source,
        namespace_map: [("argocd".to_string(), "gitops".to_string())].into(),
    };
    let (_, apps, _) = round_trip(ARGOCD, &keep);
    assert!(
        apps.iter()
            .all(|a| a.metadata.namespace.as_deref() == Some("gitops"))
    );
    let fixed = Options {
        app_namespace: AppNamespace::parse("apps"),
        ..Default::default()
    };
    let (_, apps, _) = round_trip(ARGOCD, &fixed);
    assert!(
        apps.iter()
            .all(|a| a.metadata.namespace.as_deref() == Some("apps"))
    );
}

#[test]
fn flux_kustomizations_with_their_git_repository_round_trip() {
    let (printed, apps, problems) = round_trip(FLUX, &Options::default());
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(apps.len(), 6, "{printed}");

    let infra = find(&apps, "infra-controllers");
    assert_eq!(infra.metadata.namespace.as_deref(), Some("flux-system"));
    assert_eq!(
        infra.spec.source.repo_url,
        "https://github.com/example/fleet-infra"
    );
    assert_eq!(infra.spec.source.target_revision.as_deref(), Some("main"));
    assert_eq!(
        infra.spec.source.path.as_deref(),
        Some("infrastructure/controllers")
    );
    assert_eq!(
        infra.spec.source.credentials_secret.as_deref(),
        Some("flux-system")
    );
    assert_eq!(
        infra.spec.sync_policy.automated,
        Some(Automated {
            prune: true,
            self_heal: true
        })
    );
    assert_eq!(
        infra.metadata.finalizers.as_deref(),
        Some(&["setpoint.dev/resources-finalizer".to_string()][..])
    );
    let doc = document(&printed, "infra-controllers");
    let top = comments_above(doc, "apiVersion: setpoint.dev/v1alpha1");
    assert!(
        has(&top, "not mapped: spec.interval (Setpoint is event-driven"),
        "{top:?}"
    );
    assert!(
        has(&top, "not mapped: spec.wait (Setpoint assesses the health"),
        "{top:?}"
    );
    assert!(has(
        &comments_above(doc, "    credentialsSecret: flux-system"),
        "Flux's bearerToken is token there"
    ));
    assert!(has(
        &comments_above(doc, "  source:"),
        "not mapped: GitRepository flux-system/flux-system spec.ignore"
    ));

    let apps_app = find(&apps, "apps");
    assert_eq!(apps_app.metadata.namespace.as_deref(), Some("apps"));
    assert_eq!(apps_app.spec.destination.namespace.as_deref(), Some("apps"));
    assert!(apps_app.spec.suspend);
    assert_eq!(
        apps_app.spec.service_account_name.as_deref(),
        Some("apps-deployer")
    );
    assert_eq!(
        apps_app.spec.sync_policy.automated,
        Some(Automated {
            prune: false,
            self_heal: true
        })
    );
    assert!(apps_app.metadata.finalizers.is_none());
    assert_eq!(
        apps_app.spec.depends_on,
        [
            Dependency {
                name: "infra-controllers".into(),
                namespace: Some("flux-system".into())
            },
            Dependency {
                name: "cluster-policies".into(),
                namespace: Some("flux-system".into())
            },
        ]
    );
    let doc = document(&printed, "apps");
    let top = comments_above(doc, "apiVersion: setpoint.dev/v1alpha1");
    assert!(
        has(
            &top,
            "not mapped: spec.decryption (Setpoint does not decrypt SOPS"
        ),
        "{top:?}"
    );
    assert!(has(&top, "not mapped: spec.healthChecks"), "{top:?}");
    let source = comments_above(doc, "  source:");
    assert!(has(&source, "not mapped: spec.postBuild"), "{source:?}");
    assert!(has(&source, "not mapped: spec.patches"), "{source:?}");
    assert!(has(
        &comments_above(doc, "  dependsOn:"),
        "dependency flux-system/cluster-policies is not in the input"
    ));
    assert!(has(
        &comments_above(doc, "    credentialsSecret: flux-system"),
        "the Secret is in flux-system: Setpoint reads it from the Application's own namespace"
    ));
    assert!(has(
        &comments_above(doc, "  serviceAccountName: apps-deployer"),
        "must exist in the Application's new namespace"
    ));

    let staging = find(&apps, "staging");
    assert_eq!(
        staging.spec.source.repo_url,
        "ssh://git@github.com/example/releases"
    );
    assert_eq!(
        staging.spec.source.target_revision.as_deref(),
        Some(">=1.0.0 <2.0.0")
    );
    assert_eq!(staging.spec.source.path, None);
    assert_eq!(staging.spec.source.credentials_secret, None);
    assert_eq!(
        staging.spec.destination.name.as_deref(),
        Some("staging-kubeconfig")
    );
    let doc = document(&printed, "staging");
    assert!(has(
        &comments_above(doc, "    targetRevision: '>=1.0.0 <2.0.0'"),
        "spec.ref.semver \">=1.0.0 <2.0.0\" (Setpoint resolves semver ranges for charts only"
    ));
    assert!(has(
        &comments_above(doc, "  destination:"),
        "setpoint.dev/secret-type=cluster"
    ));
    assert!(has(
        &comments_above(doc, "  source:"),
        "GitRepository flux-system/releases spec.secretRef (Setpoint's Git over SSH"
    ));
}

#[test]
fn flux_helm_releases_round_trip() {
    let (printed, apps, _) = round_trip(FLUX, &Options::default());

    let podinfo = find(&apps, "podinfo");
    assert_eq!(podinfo.metadata.namespace.as_deref(), Some("podinfo"));
    let source = &podinfo.spec.source;
    assert_eq!(source.repo_url, "https://stefanprodan.github.io/podinfo");
    assert_eq!(source.chart.as_deref(), Some("podinfo"));
    assert_eq!(source.target_revision.as_deref(), Some("6.x"));
    let helm = source.helm.as_ref().unwrap();
    assert_eq!(helm.release_name.as_deref(), Some("podinfo-podinfo"));
    assert_eq!(
        helm.values_object,
        Some(
            json!({"replicaCount": 2, "ingress": {"enabled": true, "hosts": [{"host": "podinfo.example.com"}]}})
        )
    );
    assert_eq!(
        podinfo.spec.sync_policy.automated,
        Some(Automated {
            prune: true,
            self_heal: true
        })
    );
    assert_eq!(
        podinfo.spec.sync_policy.sync_options,
        ["CreateNamespace=true"]
    );
    let doc = document(&printed, "podinfo");
    assert!(has(
        &comments_above(doc, "    helm:"),
        "not mapped: spec.valuesFrom (Setpoint reads values from Git"
    ));
    assert!(has(
        &comments_above(doc, "  syncPolicy:"),
        "spec.install.remediation"
    ));

    let redis = find(&apps, "redis");
    assert_eq!(redis.metadata.namespace.as_deref(), Some("cache"));
    assert_eq!(
        redis.spec.source.repo_url,
        "oci://registry-1.docker.io/bitnamicharts"
    );
    assert_eq!(redis.spec.source.chart.as_deref(), Some("redis"));
    assert_eq!(redis.spec.source.target_revision.as_deref(), Some("18.x"));
    assert_eq!(
        redis.spec.depends_on,
        [Dependency {
            name: "podinfo".into(),
            namespace: Some("podinfo".into())
        }],
        "the dependency is where its imported Application went"
    );
    assert_eq!(
        redis.spec.sync_policy.automated,
        Some(Automated {
            prune: true,
            self_heal: false
        })
    );

    let web = find(&apps, "web");
    assert_eq!(
        web.spec.source.repo_url,
        "https://github.com/example/fleet-infra"
    );
    assert_eq!(web.spec.source.path.as_deref(), Some("charts/web"));
    assert_eq!(web.spec.source.chart, None);
    assert_eq!(web.spec.source.target_revision.as_deref(), Some("main"));
    let helm = web.spec.source.helm.as_ref().unwrap();
    assert_eq!(
        helm.value_files,
        ["values.yaml", "../../envs/production/web-values.yaml"]
    );
    assert!(helm.skip_crds);
    assert_eq!(helm.release_name, None);
}

#[test]
fn unknown_kinds_and_broken_documents_are_reported_and_the_rest_imported() {
    let (printed, apps, problems) = round_trip(MIXED, &Options::default());
    assert_eq!(apps.len(), 1, "{printed}");
    assert_eq!(apps[0].metadata.namespace.as_deref(), Some("solo"));
    let messages: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(
        messages[0].starts_with("input.yaml: document 3: not YAML (line 26)"),
        "{messages:?}"
    );
    assert_eq!(
        messages[1],
        "input.yaml, document 1: ConfigMap argocd/settings (v1) is not an Argo CD or Flux kind \
         setpoint imports; skipped"
    );
}

#[test]
fn text_that_is_not_yaml_reads_nothing() {
    let (objects, problems) = parse_documents("x", include_str!("../../tests/import/broken.txt"));
    assert!(objects.is_empty());
    assert!(matches!(problems[..], [ImportError::ParseDocument { .. }]));
    let (objects, problems) = parse_documents("x", "just a string\n");
    assert!(objects.is_empty());
    assert_eq!(
        problems,
        [ImportError::NotAnObject {
            origin: "x".into(),
            document: 1
        }]
    );
}

#[test]
fn a_list_is_flattened_and_sources_nothing_uses_are_reported() {
    let list = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
             "metadata": {"name": "lonely", "namespace": "flux-system"},
             "spec": {"url": "https://example.com/r"}},
            {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
             "metadata": {"name": "a", "namespace": "argocd"}, "spec": {}},
        ]
    });
    let (objects, problems) = parse_documents("l", &serde_yaml::to_string(&list).unwrap());
    assert!(problems.is_empty());
    assert_eq!(objects.len(), 2);
    let outcome = import(&objects, &Options::default());
    assert!(outcome.imported.is_empty());
    let messages: Vec<String> = outcome.problems.iter().map(ToString::to_string).collect();
    assert_eq!(
        messages,
        [
            "Application argocd/a: spec.source (or spec.sources) is missing; skipped",
            "GitRepository flux-system/lonely: no Kustomization or HelmRelease of the input uses \
             it; skipped",
        ]
    );
}

#[test]
fn credentials_in_a_url_are_not_printed() {
    let text = "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: s\n\
                spec:\n  source:\n    repoURL: https://bot:hunter2@git.example.com/r.git\n";
    let (printed, apps, _) = round_trip(text, &Options::default());
    assert!(!printed.contains("hunter2"), "{printed}");
    assert_eq!(
        apps[0].spec.source.repo_url,
        "https://git.example.com/r.git"
    );
    assert!(printed.contains("# note: credentials removed from repoURL"));
}

#[test]
fn oci_chart_repositories_are_named_oci() {
    let text = r#"
apiVersion: argoproj.io/v1alpha1
kind: Application
metadata: {name: podinfo, namespace: argocd}
spec:
  source: {repoURL: ghcr.io/stefanprodan/charts, chart: podinfo, targetRevision: 6.5.0}
  destination: {namespace: podinfo}
---
apiVersion: source.toolkit.fluxcd.io/v1
kind: HelmRepository
metadata: {name: charts, namespace: flux-system}
spec: {type: oci, url: "oci://ghcr.io/stefanprodan/charts", secretRef: {name: ghcr}}
---
apiVersion: helm.toolkit.fluxcd.io/v2
kind: HelmRelease
metadata: {name: podinfo-flux, namespace: flux-system}
spec:
  chart: {spec: {chart: podinfo, version: ">=6.0.0", sourceRef: {kind: HelmRepository, name: charts}}}
"#;
    let (printed, apps, problems) = round_trip(text, &Options::default());
    assert!(problems.is_empty(), "{problems:?}");
    let argo = find(&apps, "podinfo");
    assert_eq!(
        argo.spec.source.repo_url,
        "oci://ghcr.io/stefanprodan/charts"
    );
    assert_eq!(argo.spec.source.chart.as_deref(), Some("podinfo"));
    let flux = find(&apps, "podinfo-flux");
    assert_eq!(
        flux.spec.source.repo_url,
        "oci://ghcr.io/stefanprodan/charts"
    );
    assert_eq!(flux.spec.source.target_revision.as_deref(), Some(">=6.0.0"));
    assert_eq!(flux.spec.source.credentials_secret.as_deref(), Some("ghcr"));
    assert_eq!(flux.metadata.namespace.as_deref(), Some("flux-system"));
    let doc = document(&printed, "podinfo-flux");
    assert!(has(
        &comments_above(doc, "    credentialsSecret: ghcr"),
        "a dockerconfigjson Secret does not work there"
    ));
}

#[test]
fn a_flux_git_repositorys_verify_becomes_spec_source_verify() {
    use crate::api::VerifyMode;
    let text = r#"
apiVersion: source.toolkit.fluxcd.io/v1
kind: GitRepository
metadata: {name: signed, namespace: flux-system}
spec:
  url: https://example.com/r.git
  ref: {tag: v1.2.0}
  verify: {mode: TagAndHEAD, secretRef: {name: pgp-public-keys}}
---
apiVersion: kustomize.toolkit.fluxcd.io/v1
kind: Kustomization
metadata: {name: signed, namespace: flux-system}
spec:
  path: ./deploy
  sourceRef: {kind: GitRepository, name: signed}
"#;
    let (printed, apps, problems) = round_trip(text, &Options::default());
    assert!(problems.is_empty(), "{problems:?}");
    let verify = find(&apps, "signed").spec.source.verify.clone().unwrap();
    assert_eq!(verify.mode, VerifyMode::Tag);
    assert_eq!(verify.secret_ref.name, "pgp-public-keys");
    assert!(
        printed.contains("not also the commit it points to"),
        "{printed}"
    );
    assert!(!printed.contains("does not verify"), "{printed}");
}
