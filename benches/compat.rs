//! `make bench`: what Argo CD compatibility costs.
//!
//! 1. End to end, `setpoint run` on the local control plane: from the
//!    creation of an Application to its sync Synced and Healthy, for an
//!    Argo CD-shaped app (a PreSync Job and a PostSync Job named by
//!    `generateName`, a ConfigMap in wave -1, a Deployment in wave 1) and for
//!    the same ConfigMap and Deployment with no annotation. p50 and p99 over
//!    the runs; the difference is what the hooks and waves add (each hook
//!    Job must complete, each wave be Healthy, before the next step).
//! 2. In process: a CEL health rule against the built-in rules, per object.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use kube::api::PostParams;
use serde_json::json;
use setpoint::api::{Application, ApplicationSpec, Health, HealthCheck, RunPhase, Source, Sync};
use setpoint::reconcile::health::{self, Rules};
use support::app::{automated, install_crd};
use support::process::{Setpoint, free_port};
use support::{GitRepo, TestNamespace, wait_for};

const RUNS: usize = 10;

fn job(prefix: &str, phase: &str, policy: &str) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  generateName: {prefix}-\n  annotations:\n    argocd.argoproj.io/hook: {phase}\n    argocd.argoproj.io/hook-delete-policy: {policy}\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: run\n        image: run:1\n"
    )
}

fn objects(wave: bool) -> (String, String) {
    let (cm_wave, deploy_wave) = if wave {
        (
            "  annotations: {argocd.argoproj.io/sync-wave: \"-1\"}\n",
            "  annotations: {argocd.argoproj.io/sync-wave: \"1\"}\n",
        )
    } else {
        ("", "")
    };
    (
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: config\n{cm_wave}data: {{k: v}}\n"
        ),
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n{deploy_wave}spec:\n  replicas: 1\n  selector:\n    matchLabels: {{app: web}}\n  template:\n    metadata:\n      labels: {{app: web}}\n    spec:\n      containers:\n      - name: web\n        image: web:1\n"
        ),
    )
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index].as_secs_f64() * 1000.0
}

/// Creates the Application and waits; the destination namespace is given
/// back, kept to the end (deleted under its Application, it would fail).
async fn converge(
    ns: &TestNamespace,
    name: &str,
    path: &str,
    repo: &str,
    hooks: bool,
) -> (Duration, TestNamespace) {
    let target = TestNamespace::new("bench-compat-t").await;
    let mut app = Application::new(
        name,
        ApplicationSpec {
            source: Source {
                repo_url: repo.into(),
                path: Some(path.into()),
                ..Default::default()
            },
            destination: setpoint::api::Destination {
                namespace: Some(target.name.clone()),
                ..Default::default()
            },
            sync_policy: automated(true, true),
            ..Default::default()
        },
    );
    app.metadata.namespace = Some(ns.name.clone());
    let apps = ns.api::<Application>();
    let started = Instant::now();
    apps.create(&PostParams::default(), &app).await.unwrap();
    wait_for("synced and healthy", Duration::from_secs(120), || async {
        let app = apps.get(name).await.map_err(|e| e.to_string())?;
        let status = app.status.unwrap_or_default();
        let done = status.sync.status == Sync::Synced
            && status.health.status == Health::Healthy
            && (!hooks
                || status
                    .sync_run
                    .as_ref()
                    .is_some_and(|r| r.phase == RunPhase::Succeeded));
        if done {
            Ok(())
        } else {
            Err(format!("{:?} {:?}", status.sync, status.health))
        }
    })
    .await;
    (started.elapsed(), target)
}

#[tokio::main]
async fn main() {
    let ns = TestNamespace::new("bench-compat").await;
    install_crd(&ns.client).await;
    println!("Argo CD compatibility benchmark (setpoint run, local control plane)");
    let repo = GitRepo::new();
    let (cm, deploy) = objects(true);
    repo.write("argo/config.yaml", &cm)
        .write("argo/web.yaml", &deploy)
        .write(
            "argo/pre.yaml",
            &job("migrate", "PreSync", "BeforeHookCreation"),
        )
        .write("argo/post.yaml", &job("smoke", "PostSync", "HookSucceeded"));
    let (cm, deploy) = objects(false);
    repo.write("plain/config.yaml", &cm)
        .write("plain/web.yaml", &deploy);
    repo.commit("an Argo CD-shaped app and a plain one");

    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let _setpoint = Setpoint::scoped(
        &ns.name,
        &["run", "--listen", &listen, "--no-sweep"],
        &[("SETPOINT_LOG", "info")],
        cache.path(),
    );

    let mut targets = Vec::new();
    for (label, path, hooks) in [
        ("plain (2 objects)", "plain", false),
        (
            "Argo CD shape (2 objects, 2 waves, PreSync + PostSync Jobs)",
            "argo",
            true,
        ),
    ] {
        let mut times = Vec::with_capacity(RUNS);
        for run in 0..RUNS {
            let (took, target) =
                converge(&ns, &format!("{path}-{run}"), path, &repo.url(), hooks).await;
            times.push(took);
            targets.push(target);
        }
        times.sort();
        println!(
            "  {label}: create to Synced+Healthy p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({RUNS} runs)",
            percentile(&times, 0.5),
            percentile(&times, 0.99),
            times.last().unwrap().as_secs_f64() * 1000.0
        );
    }

    // CEL against the built-in rules, per object assessed.
    let rules = Rules::compile(&[HealthCheck {
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        current: "self.status.phase == 'Ready'".into(),
        in_progress: Some("self.status.phase == 'Provisioning'".into()),
        failed: Some("self.status.phase == 'Failed'".into()),
    }])
    .expect("compiles");
    let widget = json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "generation": 1},
        "status": {"phase": "Ready", "observedGeneration": 1}
    });
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "generation": 1},
        "spec": {"replicas": 3},
        "status": {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3,
                   "availableReplicas": 3, "readyReplicas": 3}
    });
    const N: u32 = 20_000;
    let started = Instant::now();
    for _ in 0..N {
        assert_eq!(
            health::assess_with(&rules, "example.com", "Widget", &widget).status,
            Health::Healthy
        );
    }
    let cel = started.elapsed() / N;
    let started = Instant::now();
    for _ in 0..N {
        assert_eq!(
            health::assess("apps", "Deployment", &deployment).status,
            Health::Healthy
        );
    }
    let builtin = started.elapsed() / N;
    println!(
        "  health: a CEL rule (3 expressions) {:.1} µs per object, the built-in Deployment rule {:.2} µs",
        cel.as_secs_f64() * 1e6,
        builtin.as_secs_f64() * 1e6
    );
}
