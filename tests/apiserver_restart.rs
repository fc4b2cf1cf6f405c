//! The kube-apiserver restarted under a running `setpoint run`: after each
//! restart, a replica count changed by someone else is set back within
//! seconds by a watch event (the sweep is an hour away), five times in a row.
//!
//! It restarts the API server, so it runs alone: its own test binary, left
//! out of `cargo test --tests` (`test = false` in Cargo.toml) and run by
//! `make test-restart`, after `make test`. The control plane it restarts is
//! the one `KUBECONFIG` points at: `tests/controlplane/cluster.sh
//! restart-apiserver` with `CLUSTER_DIR` set to `SETPOINT_TEST_CLUSTER_DIR`,
//! or else to the kubeconfig's directory (`<repo>/.cluster` under make). Run
//! it against a control plane of your own, never one others are using:
//!
//! ```text
//! CLUSTER_DIR=$PWD/.cluster tests/controlplane/cluster.sh up
//! KUBECONFIG=$PWD/.cluster/kubeconfig cargo test --test apiserver_restart
//! ```

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use support::app::{
    automated, create_app, deployment_yaml, install_crd, settled_at, time_scale_correction,
};
use support::process::{Setpoint, free_port};
use support::{GitRepo, TestNamespace, kubeconfig_path, wait_for};

const RESTARTS: usize = 5;
/// How long the API server stays down each time.
const DOWN_SECONDS: &str = "5";
/// A scale must be set back within this long after the restart.
const CORRECTED_WITHIN: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_secs(90);

/// The cluster directory `cluster.sh` keeps its pids, ports and data in.
fn cluster_dir() -> PathBuf {
    std::env::var_os("SETPOINT_TEST_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            kubeconfig_path()
                .parent()
                .expect("the kubeconfig is in a directory")
                .to_path_buf()
        })
}

fn restart_apiserver() -> Duration {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/controlplane/cluster.sh");
    let started = Instant::now();
    let out = Command::new(&script)
        .args(["restart-apiserver", DOWN_SECONDS])
        .env("CLUSTER_DIR", cluster_dir())
        .output()
        .expect("run cluster.sh");
    assert!(
        out.status.success(),
        "cluster.sh restart-apiserver failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    started.elapsed()
}

#[tokio::test]
async fn drift_after_each_of_five_apiserver_restarts_is_corrected_by_the_watch() {
    let ns = TestNamespace::new("apirestart").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write("web/deploy.yaml", &deployment_yaml("web", 3))
        .commit("web");
    create_app(&ns, "web", &repo.url(), "web", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    // The sweep an hour away: only a watch event can correct the scale.
    let args = ["run", "--listen", &listen, "--sweep-interval", "1h"];
    let setpoint = Setpoint::scoped(&ns.name, &args, &[], cache.path());
    wait_for("the first sync", DEADLINE, || {
        settled_at(&ns, "web", &commit)
    })
    .await;

    let mut corrections = Vec::new();
    for round in 1..=RESTARTS {
        let restart = restart_apiserver();
        // Our own client may need a moment to reconnect too: the scale is
        // retried until taken, and timed from then.
        let replicas = if round % 2 == 0 { 1 } else { 2 };
        let took = time_scale_correction(&ns, "web", replicas, 3, DEADLINE).await;
        eprintln!(
            "restart {round}: API server back in {restart:?}; scale to {replicas} set back in {took:?}"
        );
        corrections.push(took);
        assert!(
            took < CORRECTED_WITHIN,
            "after restart {round} the scale took {took:?} to be set back (corrections so far: {corrections:?})\n{}",
            setpoint.logs()
        );
    }
}
