//! Operating a release with `setpoint run` and the `setpoint app` CLI:
//! rollback to the last good revision (pinned, drift still corrected, a
//! new commit held until resume), suspend and resume, a deny window and
//! its override, a selective sync, and a user who may not patch the
//! Application refused each of them.

mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use setpoint::api::{Application, SyncWindow, WindowKind};
use support::app::{
    automated, create_app, event_notes, get_app, install_crd, settled_at, synced_at,
    time_scale_correction,
};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const SECRET: &str = "operate-secret";

fn app_cli(args: &[&str]) -> (i32, String, String) {
    app_cli_as(&support::kubeconfig_path(), args)
}

fn app_cli_as(kubeconfig: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_setpoint"))
        .arg("app")
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("SETPOINT_ALLOW_LOCAL_REPOS", "true")
        .env("SETPOINT_ADMIN_NAMESPACES", "*")
        .output()
        .expect("run setpoint app");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn files(replicas: u32, config: &str, ready: bool) -> (String, String) {
    // A Deployment whose pods can never be scheduled never becomes ready.
    let selector = if ready {
        String::new()
    } else {
        "      nodeSelector: {setpoint.dev/no-such-node: \"true\"}\n".to_string()
    };
    (
        format!(
            "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: {replicas}
  progressDeadlineSeconds: 10
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
{selector}      containers:
      - name: app
        image: app:1
"
        ),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: conf\ndata:\n  version: \"{config}\"\n"
        ),
    )
}

fn commit(repo: &GitRepo, replicas: u32, config: &str, ready: bool, message: &str) -> String {
    let (deploy, conf) = files(replicas, config, ready);
    repo.write("apps/web/deploy.yaml", &deploy)
        .write("apps/web/conf.yaml", &conf)
        .commit(message)
}

async fn config_version(ns: &TestNamespace) -> Result<String, String> {
    let cm = ns
        .api::<ConfigMap>()
        .get("conf")
        .await
        .map_err(|e| e.to_string())?;
    Ok(cm
        .data
        .unwrap_or_default()
        .remove("version")
        .unwrap_or_default())
}

async fn config_is(ns: &TestNamespace, want: &str) -> Result<(), String> {
    match config_version(ns).await? {
        v if v == want => Ok(()),
        v => Err(format!("version {v}")),
    }
}

/// A namespace whose Application `web` (automated, prune and self-heal)
/// follows a repository at its first commit (`replicas`, config "1").
async fn web_app(prefix: &str, replicas: u32) -> (TestNamespace, GitRepo, String) {
    let ns = TestNamespace::new(prefix).await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let first = commit(&repo, replicas, "1", true, "first");
    create_app(&ns, "web", &repo.url(), "apps/web", automated(true, true)).await;
    (ns, repo, first)
}

/// `setpoint run` scoped to `ns`, answering HTTP, and its webhook port.
struct Running {
    /// Killed when dropped.
    _setpoint: Setpoint,
    port: u16,
    _cache: tempfile::TempDir,
}

async fn run(ns: &TestNamespace) -> Running {
    let cache = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let args = [
        "run",
        "--listen",
        &listen,
        "--github-secret",
        SECRET,
        "--no-sweep",
    ];
    let mut setpoint = Setpoint::scoped(&ns.name, &args, &[], cache.path());
    setpoint.wait_http().await;
    Running {
        _setpoint: setpoint,
        port,
        _cache: cache,
    }
}

#[tokio::test]
async fn a_rollback_puts_the_last_good_revision_back_and_holds_it_until_resumed() {
    let (ns, repo, good) = web_app("rollback", 2).await;
    let running = run(&ns).await;
    let port = running.port;
    wait_for("the good revision Healthy", DEADLINE, || {
        settled_at(&ns, "web", &good)
    })
    .await;
    wait_for("its history entry marked healthy", DEADLINE, || async {
        let app = get_app(&ns, "web").await;
        match app.status.unwrap_or_default().history.first() {
            Some(h) if h.revision == good && h.healthy && h.id == 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // A bad commit: its Deployment never becomes ready.
    let bad = commit(&repo, 2, "2", false, "bad");
    let body = github_push(&repo.url(), &bad, &["apps/web/deploy.yaml"]);
    assert_eq!(post_github(port, Some(SECRET), "push-bad", &body).0, 200);
    wait_for("the bad revision applied", DEADLINE, || {
        synced_at(&ns, "web", &bad)
    })
    .await;
    wait_for("the bad config", DEADLINE, || config_is(&ns, "2")).await;

    let n = ns.name.as_str();
    let (code, out, err) = app_cli(&["rollback", &format!("{n}/web")]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("pinned to {} (history 1)", &good[..12])),
        "{out}"
    );
    // Applied by the rollback itself, from Git's render of that commit.
    config_is(&ns, "1").await.unwrap();
    let app = get_app(&ns, "web").await;
    let pin = app.spec.pin.clone().expect("pinned");
    assert_eq!(pin.revision, good);
    assert!(pin.by.is_some(), "the pin says who: {pin:?}");
    wait_for("the rolled-back revision Healthy", DEADLINE, || {
        settled_at(&ns, "web", &good)
    })
    .await;
    let status = get_app(&ns, "web").await.status.unwrap();
    assert_eq!(status.pinned.as_ref().unwrap().revision, good);
    let entry = status
        .history
        .iter()
        .find(|h| h.revision == good && h.id == 3);
    assert!(
        entry
            .and_then(|h| h.initiated_by.as_deref())
            .is_some_and(|b| b.starts_with("rollback by ")),
        "{:?}",
        status.history
    );
    wait_for("a Pinned Event", DEADLINE, || async {
        let notes = event_notes(&ns, "web", "Pinned").await;
        notes
            .iter()
            .any(|n| n.contains(&good[..12]))
            .then_some(())
            .ok_or(format!("{notes:?}"))
    })
    .await;
    let (_, described, _) = app_cli(&["get", &format!("{n}/web")]);
    assert!(
        described.contains(&format!("Pinned:       {}", &good[..12])),
        "{described}"
    );

    // Drift on the rolled-back state is still corrected.
    time_scale_correction(&ns, "web", 1, 2, DEADLINE).await;

    // A new commit is announced: held, and the status says so.
    let next = commit(&repo, 3, "3", true, "next");
    let body = github_push(&repo.url(), &next, &["apps/web/conf.yaml"]);
    assert_eq!(post_github(port, Some(SECRET), "push-next", &body).0, 200);
    wait_for("the newer commit recorded", DEADLINE, || async {
        let status = get_app(&ns, "web").await.status.unwrap_or_default();
        match status.pinned.and_then(|p| p.newer_revision) {
            Some(newer) if newer == next => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(config_version(&ns).await.unwrap(), "1");

    let (code, out, err) = app_cli(&["resume", &format!("{n}/web")]);
    assert_eq!(code, 0, "{out}{err}");
    wait_for("the new commit applied after resume", DEADLINE, || {
        synced_at(&ns, "web", &next)
    })
    .await;
    config_is(&ns, "3").await.unwrap();
    assert!(get_app(&ns, "web").await.spec.pin.is_none());
    drop(running);
}

#[tokio::test]
async fn a_suspended_application_reports_drift_and_resume_corrects_it() {
    let (ns, _repo, first) = web_app("suspend", 2).await;
    let running = run(&ns).await;
    wait_for("first Healthy", DEADLINE, || settled_at(&ns, "web", &first)).await;

    let n = ns.name.as_str();
    let (code, out, err) = app_cli(&["suspend", &format!("{n}/web")]);
    assert_eq!(code, 0, "{out}{err}");
    wait_for("the hold in the status", DEADLINE, || async {
        let status = get_app(&ns, "web").await.status.unwrap_or_default();
        match status.hold {
            Some(h) if h.reason == "Suspended" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    let deployments = ns.api::<Deployment>();
    let kubectl = PatchParams {
        field_manager: Some("kubectl".into()),
        ..Default::default()
    };
    deployments
        .patch_scale(
            "web",
            &kubectl,
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let message = wait_for("the drift shown while suspended", DEADLINE, || async {
        let status = get_app(&ns, "web").await.status.unwrap_or_default();
        status
            .resources
            .iter()
            .find(|r| r.kind == "Deployment")
            .and_then(|r| r.message.clone())
            .filter(|m| m.starts_with("suspended: would set spec.replicas 1→2"))
            .ok_or(format!("{:?}", status.resources))
    })
    .await;
    assert!(message.contains("changed by kubectl"), "{message}");
    // Shown, not corrected: the status was written after that decision.
    let live = deployments.get("web").await.unwrap();
    assert_eq!(live.spec.replicas, Some(1));
    let status = get_app(&ns, "web").await.status.unwrap();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == setpoint::api::ConditionType::Ready);
    assert_eq!(ready.map(|c| c.reason.as_str()), Some("Suspended"));
    wait_for(
        "a DriftDetected Event saying what a sync would do",
        DEADLINE,
        || async {
            let notes = event_notes(&ns, "web", "DriftDetected").await;
            notes
                .iter()
                .any(|n| n.contains("suspended: would set spec.replicas 1→2"))
                .then_some(())
                .ok_or(format!("{notes:?}"))
        },
    )
    .await;
    // A manual sync is refused while suspended.
    let (code, _, err) = app_cli(&["sync", &format!("{n}/web")]);
    assert_eq!(code, 2);
    assert!(err.contains("is suspended"), "{err}");

    let (code, out, err) = app_cli(&["resume", &format!("{n}/web")]);
    assert_eq!(code, 0, "{out}{err}");
    wait_for("the replicas set back on resume", DEADLINE, || async {
        match deployments
            .get("web")
            .await
            .map_err(|e| e.to_string())?
            .spec
            .replicas
        {
            Some(2) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    wait_for("a Resumed Event", DEADLINE, || async {
        let notes = event_notes(&ns, "web", "Resumed").await;
        (!notes.is_empty()).then_some(()).ok_or("none".to_string())
    })
    .await;
    drop(running);
}

#[tokio::test]
async fn a_deny_window_holds_automated_syncs_and_a_manual_sync_overrides_it() {
    let (ns, _repo, first) = web_app("window", 1).await;
    // Denied all the time: every minute opens another hour.
    let windows = vec![SyncWindow {
        kind: WindowKind::Deny,
        schedule: "* * * * *".into(),
        duration: "1h".into(),
        time_zone: Some("Europe/Paris".into()),
        manual_sync: false,
    }];
    ns.api::<Application>()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"syncWindows": windows}})),
        )
        .await
        .unwrap();
    let running = run(&ns).await;
    let hold = wait_for("the window's hold", DEADLINE, || async {
        let status = get_app(&ns, "web").await.status.unwrap_or_default();
        status
            .hold
            .filter(|h| h.reason == "SyncWindow" && status.sync.revision.as_deref() == Some(&first))
            .ok_or(format!("{:?}", status.sync))
    })
    .await;
    assert!(hold.until.is_some(), "{hold:?}");
    assert!(
        hold.message.contains("syncs wait until"),
        "{}",
        hold.message
    );
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("conf")
            .await
            .unwrap()
            .is_none()
    );

    let n = ns.name.as_str();
    let (code, _, err) = app_cli(&["sync", &format!("{n}/web")]);
    assert_eq!(code, 2);
    assert!(err.contains("--override-window"), "{err}");
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("conf")
            .await
            .unwrap()
            .is_none()
    );

    let (code, out, err) = app_cli(&["sync", &format!("{n}/web"), "--override-window"]);
    assert_eq!(code, 0, "{out}{err}");
    config_is(&ns, "1").await.unwrap();
    let status = get_app(&ns, "web").await.status.unwrap();
    assert!(
        status.history[0]
            .initiated_by
            .as_deref()
            .is_some_and(|b| b.starts_with("sync by ")),
        "{:?}",
        status.history
    );
    drop(running);
}

#[tokio::test]
async fn a_selective_sync_applies_one_object_of_three() {
    let ns = TestNamespace::new("selective").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    for name in ["a", "b", "c"] {
        repo.write(
            &format!("apps/cm/{name}.yaml"),
            &format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  k: v\n"),
        );
    }
    repo.commit("three");
    // A manual policy: nothing happens but what is asked.
    create_app(&ns, "cms", &repo.url(), "apps/cm", Default::default()).await;
    let cache = tempfile::tempdir().unwrap();
    let cache_dir = cache.path().to_str().unwrap();
    let n = ns.name.as_str();
    let app = format!("{n}/cms");

    let (code, _, err) = app_cli(&[
        "sync",
        &app,
        "--only",
        "ConfigMap/zzz",
        "--cache-dir",
        cache_dir,
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--only ConfigMap/zzz: not in the render"),
        "{err}"
    );
    assert!(
        err.contains("ConfigMap/b"),
        "the render's objects are listed: {err}"
    );

    let (code, out, err) = app_cli(&[
        "sync",
        &app,
        "--only",
        "configmap/b",
        "--cache-dir",
        cache_dir,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let cms = ns.api::<ConfigMap>();
    assert!(cms.get_opt("b").await.unwrap().is_some());
    assert!(cms.get_opt("a").await.unwrap().is_none());
    assert!(cms.get_opt("c").await.unwrap().is_none());
    let status = get_app(&ns, "cms").await.status.unwrap();
    assert_eq!(status.sync.status, setpoint::api::Sync::OutOfSync);
    let a = status.resources.iter().find(|r| r.name == "a").unwrap();
    assert_eq!(
        a.message.as_deref(),
        Some("not selected by this sync (--only)")
    );
    assert!(
        status.history[0]
            .initiated_by
            .as_deref()
            .is_some_and(|b| b.starts_with("sync of configmap/b by ")),
        "{:?}",
        status.history
    );
    let synced = event_notes(&ns, "cms", "Synced").await;
    assert!(
        synced
            .iter()
            .any(|n| n.contains("applied 1, pruned 0") && n.contains("(sync of configmap/b by ")),
        "{synced:?}"
    );
}

/// A kubeconfig for the local control plane that authenticates with `token`.
fn kubeconfig_with_token(dir: &std::path::Path, token: &str) -> std::path::PathBuf {
    let mut config = kube::config::Kubeconfig::read_from(support::kubeconfig_path()).unwrap();
    for auth in &mut config.auth_infos {
        auth.auth_info = Some(kube::config::AuthInfo {
            token: Some(token.to_string().into()),
            ..Default::default()
        });
    }
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

#[tokio::test]
async fn a_user_who_may_not_patch_the_application_is_refused_every_operation() {
    let (ns, _repo, _first) = web_app("op-rbac", 1).await;
    let token = support::viewer::viewer(&ns, "reader", &["get", "list", "watch"]).await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = kubeconfig_with_token(dir.path(), &token);
    let n = ns.name.as_str();
    let app = format!("{n}/web");
    let who = format!("system:serviceaccount:{n}:reader may not patch Application {n}/web");
    for args in [
        vec!["suspend", app.as_str()],
        vec!["resume", app.as_str()],
        vec!["rollback", app.as_str(), "--unpin"],
        vec!["sync", app.as_str()],
    ] {
        let (code, out, err) = app_cli_as(&kubeconfig, &args);
        assert_ne!(code, 0, "{args:?}: {out}");
        assert!(err.contains(&who), "{args:?}: {err}");
    }
    let app = get_app(&ns, "web").await;
    assert!(!app.spec.suspend && app.spec.pin.is_none());
}

#[tokio::test]
async fn a_reconcile_request_annotation_applies_a_commit_no_event_announced() {
    let (ns, repo, first) = web_app("requested", 1).await;
    let _running = run(&ns).await;
    wait_for("the first commit Healthy", DEADLINE, || {
        settled_at(&ns, "web", &first)
    })
    .await;
    let apps = ns.api::<Application>();
    // Commits no webhook announces and no sweep (`--no-sweep`) looks for:
    // only the request, Flux's annotation and then Setpoint's, makes the
    // controller fetch them.
    for (before, config, annotation) in [
        ("1", "2", "reconcile.fluxcd.io/requestedAt"),
        ("2", "3", "setpoint.dev/requested-at"),
    ] {
        let next = commit(&repo, 1, config, true, config);
        config_is(&ns, before).await.unwrap();
        let body = serde_json::json!({
            "metadata": {"annotations": {annotation: format!("request {config}")}}
        });
        apps.patch("web", &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap();
        wait_for(
            &format!("commit {config} applied on request"),
            DEADLINE,
            || synced_at(&ns, "web", &next),
        )
        .await;
        config_is(&ns, config).await.unwrap();
    }
}
