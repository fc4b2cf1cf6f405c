//! `setpoint import`, run as a user runs it: the built binary on the typical
//! Argo CD and Flux objects of `tests/import/` (a file, stdin), on input it
//! cannot read, and `--from-cluster` against an Argo CD Application object
//! on the local control plane (with a minimal CRD of Argo CD's kind).

mod support;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};
use serde::Deserialize;
use setpoint::api::{Application, Automated};

use support::{TestNamespace, kube_client, kubeconfig_path, wait_for};

/// Argo CD's CRD name; Argo CD itself is not installed in the local control
/// plane, so this test owns it when it carries `OWNER_LABEL`.
const ARGO_CD_CRD: &str = "applications.argoproj.io";
const OWNER_LABEL: &str = "setpoint.dev/test-crd";

fn data(file: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/import")
        .join(file)
        .display()
        .to_string()
}

/// `setpoint import ARGS`, with `stdin` piped in.
fn import(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(support::process::binary())
        .arg("import")
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run setpoint import");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Every document of `stdout`, as a Setpoint Application.
fn applications(stdout: &str) -> Vec<Application> {
    serde_yaml::Deserializer::from_str(stdout)
        .map(|document| {
            Application::deserialize(document)
                .unwrap_or_else(|e| panic!("not a Setpoint Application ({e}) in\n{stdout}"))
        })
        .collect()
}

fn find<'a>(apps: &'a [Application], name: &str) -> &'a Application {
    apps.iter()
        .find(|a| a.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no Application {name}"))
}

#[test]
fn argo_cd_and_flux_files_print_setpoint_applications() {
    let argocd = data("argocd.yaml");
    let flux = data("flux.yaml");
    let output = import(&["-f", &argocd, "-f", &flux], None);
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "nothing to report: {stderr}");
    let apps = applications(&stdout);
    assert_eq!(apps.len(), 12, "{stdout}");

    let guestbook = find(&apps, "guestbook");
    assert_eq!(guestbook.metadata.namespace.as_deref(), Some("guestbook"));
    assert_eq!(
        guestbook.spec.source.repo_url,
        "https://github.com/argoproj/argocd-example-apps.git"
    );
    assert_eq!(guestbook.spec.source.path.as_deref(), Some("guestbook"));
    assert_eq!(
        guestbook.spec.sync_policy.automated,
        Some(Automated {
            prune: true,
            self_heal: true
        })
    );
    assert_eq!(
        guestbook.spec.sync_policy.sync_options,
        ["CreateNamespace=true", "PruneLast=true"]
    );
    let helm = find(&apps, "helm-guestbook");
    assert_eq!(helm.spec.source.chart.as_deref(), Some("nginx"));
    assert_eq!(
        helm.spec
            .source
            .helm
            .as_ref()
            .unwrap()
            .release_name
            .as_deref(),
        Some("frontend")
    );

    let podinfo = find(&apps, "podinfo");
    assert_eq!(
        podinfo.spec.source.repo_url,
        "https://stefanprodan.github.io/podinfo"
    );
    assert_eq!(podinfo.spec.source.target_revision.as_deref(), Some("6.x"));
    let apps_app = find(&apps, "apps");
    assert_eq!(
        apps_app.spec.source.path.as_deref(),
        Some("apps/production")
    );
    assert_eq!(apps_app.spec.depends_on[0].name, "infra-controllers");

    for comment in [
        "# Imported from Argo CD Application argocd/guestbook (argoproj.io/v1alpha1).",
        "# Imported from Flux Kustomization flux-system/apps (kustomize.toolkit.fluxcd.io/v1).",
        "  # not mapped: spec.source.plugin (config management plugins have no Setpoint equivalent)",
        "# not mapped: spec.decryption (Setpoint does not decrypt SOPS files",
    ] {
        assert!(stdout.contains(comment), "no {comment:?} in\n{stdout}");
    }
}

#[test]
fn stdin_with_unknown_kinds_and_a_broken_document_imports_the_rest() {
    let mixed = std::fs::read_to_string(data("mixed.yaml")).unwrap();
    let output = import(&["-f", "-", "--app-namespace", "source"], Some(&mixed));
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let apps = applications(&stdout);
    assert_eq!(apps.len(), 1);
    assert_eq!(apps[0].metadata.namespace.as_deref(), Some("argocd"));
    assert_eq!(apps[0].spec.destination.namespace.as_deref(), Some("solo"));
    assert!(
        stderr.contains("stdin: document 3: not YAML (line 26): mapping values are not allowed"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "stdin, document 1: ConfigMap argocd/settings (v1) is not an Argo CD or Flux kind \
             setpoint imports; skipped"
        ),
        "{stderr}"
    );
}

#[test]
fn input_that_reads_as_nothing_exits_non_zero() {
    let output = import(&["-f", &data("broken.txt")], None);
    assert_eq!(output.status.code(), Some(1));
    assert!(output.stdout.is_empty());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("broken.txt: document 1: not YAML (line "),
        "{stderr}"
    );
    assert!(stderr.contains("error: no Argo CD Application"), "{stderr}");

    let output = import(&["-f", &data("no-such-file.yaml")], None);
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("no-such-file.yaml: cannot read:"));

    let output = import(&[], None);
    assert_eq!(output.status.code(), Some(2), "clap's usage error");
    assert!(text(&output.stderr).contains("--file"));
}

/// Installs a minimal `applications.argoproj.io` CRD unless one not of this
/// test is there; whether this test owns it (and deletes it at the end).
async fn install_argo_cd_crd(client: &Client) -> bool {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    if let Some(existing) = api.get_opt(ARGO_CD_CRD).await.unwrap() {
        let ours = existing
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key(OWNER_LABEL);
        if !ours {
            return false;
        }
    }
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": ARGO_CD_CRD, "labels": { OWNER_LABEL: "import" } },
        "spec": {
            "group": "argoproj.io",
            "names": { "kind": "Application", "listKind": "ApplicationList",
                       "plural": "applications", "singular": "application" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": true
                }}
            }]
        }
    }))
    .unwrap();
    api.patch(
        ARGO_CD_CRD,
        &PatchParams::apply("setpoint-tests-import").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("apply the Argo CD Application CRD");
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api, ARGO_CD_CRD, conditions::is_crd_established()),
    )
    .await
    .expect("the CRD is Established in time")
    .expect("watch the CRD");
    true
}

/// Deletes the CRD when the test ends, pass or fail, if the test owns it.
struct CrdGuard(bool);

impl Drop for CrdGuard {
    fn drop(&mut self) {
        if !self.0 {
            return;
        }
        let _ = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async {
                    let api: Api<CustomResourceDefinition> = Api::all(kube_client().await);
                    let _ = api.delete(ARGO_CD_CRD, &DeleteParams::background()).await;
                });
            }
        })
        .join();
    }
}

#[tokio::test]
async fn from_the_cluster_an_argo_cd_application_is_imported() {
    let client = kube_client().await;
    let _crd = CrdGuard(install_argo_cd_crd(&client).await);
    let ns = TestNamespace::new("import").await;
    // The binary finds the kind through discovery: wait until it is there.
    let resource = wait_for(
        "argoproj.io Application in discovery",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move {
                let group = kube::discovery::group(&client, "argoproj.io")
                    .await
                    .map_err(|e| e.to_string())?;
                group
                    .recommended_kind("Application")
                    .map(|(resource, _)| resource)
                    .ok_or_else(|| "no Application kind yet".to_string())
            }
        },
    )
    .await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns.name, &resource);
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": "guestbook",
            "finalizers": ["resources-finalizer.argocd.argoproj.io"],
        },
        "spec": {
            "project": "default",
            "source": {
                "repoURL": "https://github.com/argoproj/argocd-example-apps.git",
                "targetRevision": "HEAD",
                "path": "guestbook",
            },
            "destination": { "server": "https://kubernetes.default.svc", "namespace": "guestbook" },
            "syncPolicy": { "automated": { "prune": true }, "syncOptions": ["CreateNamespace=true"] },
        }
    }))
    .unwrap();
    api.create(&PostParams::default(), &object)
        .await
        .expect("create the Argo CD Application");

    let output = import(
        &[
            "--from-cluster",
            "--namespace",
            &ns.name,
            "--app-namespace",
            "source",
        ],
        None,
    );
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    // The finalizer would hold the namespace's deletion: nothing removes it.
    let _ = api
        .patch(
            "guestbook",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await;
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let apps = applications(&stdout);
    assert_eq!(apps.len(), 1, "{stdout}");
    let app = &apps[0];
    assert_eq!(app.metadata.name.as_deref(), Some("guestbook"));
    assert_eq!(app.metadata.namespace.as_deref(), Some(ns.name.as_str()));
    assert!(app.metadata.uid.is_none() && app.metadata.resource_version.is_none());
    assert_eq!(
        app.metadata.finalizers.as_deref(),
        Some(&["resources-finalizer.argocd.argoproj.io".to_string()][..])
    );
    assert_eq!(app.spec.source.path.as_deref(), Some("guestbook"));
    assert_eq!(app.spec.destination.namespace.as_deref(), Some("guestbook"));
    assert_eq!(
        app.spec.sync_policy.automated,
        Some(Automated {
            prune: true,
            self_heal: false
        })
    );
    assert_eq!(app.spec.sync_policy.sync_options, ["CreateNamespace=true"]);
    assert!(stdout.contains(&format!(
        "# Imported from Argo CD Application {}/guestbook (argoproj.io/v1alpha1).",
        ns.name
    )));
    // Kinds whose CRDs the cluster lacks are skipped with a note.
    for (group, kind) in [
        ("kustomize.toolkit.fluxcd.io", "Kustomization"),
        ("helm.toolkit.fluxcd.io", "HelmRelease"),
    ] {
        if kube::discovery::group(&client, group).await.is_err() {
            assert!(
                stderr.contains(&format!(
                    "{kind}.{group}: not served by the cluster (no CRD); skipped"
                )),
                "{stderr}"
            );
        }
    }
}
