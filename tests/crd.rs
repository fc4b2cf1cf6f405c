//! The committed CRD YAML is what the Rust types generate (`make crd`), and
//! the real API server takes it without a warning.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

#[test]
fn committed_applicationset_crds_match_the_types() {
    let generated = setpoint::cli::appset_crd_yaml();
    for path in [
        "config/crd/applicationsets.setpoint.dev.yaml",
        "charts/setpoint/crds/applicationsets.setpoint.dev.yaml",
    ] {
        let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        let committed = std::fs::read_to_string(&full).unwrap_or_default();
        assert!(
            committed == generated,
            "{path} is stale: run `make crd` and commit it"
        );
    }
}

#[test]
fn committed_receiver_crds_match_the_types() {
    let generated = setpoint::cli::receiver_crd_yaml();
    for path in [
        "config/crd/receivers.setpoint.dev.yaml",
        "charts/setpoint/crds/receivers.setpoint.dev.yaml",
    ] {
        let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        let committed = std::fs::read_to_string(&full).unwrap_or_default();
        assert!(
            committed == generated,
            "{path} is stale: run `make crd` and commit it"
        );
    }
}

#[test]
fn committed_notification_crds_match_the_types() {
    for (generated, plural) in [
        (setpoint::cli::provider_crd_yaml(), "providers"),
        (setpoint::cli::alert_crd_yaml(), "alerts"),
    ] {
        for dir in ["config/crd", "charts/setpoint/crds"] {
            let path = format!("{dir}/{plural}.setpoint.dev.yaml");
            let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(&path);
            let committed = std::fs::read_to_string(&full).unwrap_or_default();
            assert!(
                committed == generated,
                "{path} is stale: run `make crd` and commit it"
            );
        }
    }
}

#[test]
fn committed_crds_match_the_types() {
    let generated = setpoint::cli::crd_yaml();
    for path in [
        "config/crd/applications.setpoint.dev.yaml",
        "charts/setpoint/crds/applications.setpoint.dev.yaml",
    ] {
        let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        let committed = std::fs::read_to_string(&full).unwrap_or_default();
        assert!(
            committed == generated,
            "{path} is stale: run `make crd` and commit it"
        );
    }
}

#[test]
fn the_crd_prints_sync_health_and_revision_columns() {
    let generated = setpoint::cli::crd_yaml();
    for column in [
        "name: Sync",
        "name: Health",
        "name: Revision",
        "jsonPath: .status.sync.revision",
    ] {
        assert!(generated.contains(column), "missing {column}");
    }
}

#[test]
fn the_crd_uses_only_integer_formats_kubernetes_knows() {
    let generated = setpoint::cli::crd_yaml();
    for line in generated.lines() {
        if let Some(format) = line.trim().strip_prefix("format: ") {
            assert!(
                ["int32", "int64"].contains(&format),
                "Kubernetes does not know the format {format:?}"
            );
        }
    }
}

/// `kubectl` prints the API server's `Warning` headers on stderr; kube-rs
/// does not surface them. A server-side dry run of a create (a CRD in a group
/// of this test's own: an update would only warn of newly added formats).
#[test]
fn the_committed_crds_are_created_without_a_warning_from_the_api_server() {
    for plural in [
        "applications",
        "applicationsets",
        "receivers",
        "providers",
        "alerts",
    ] {
        created_without_a_warning(plural);
    }
}

fn created_without_a_warning(plural: &str) {
    let committed = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("config/crd/{plural}.setpoint.dev.yaml")),
    )
    .unwrap();
    let group = format!("{}.setpoint.dev", support::unique_name("crd"));
    let renamed = committed
        .replace(
            &format!("name: {plural}.setpoint.dev"),
            &format!("name: {plural}.{group}"),
        )
        .replace("group: setpoint.dev", &format!("group: {group}"));
    assert_ne!(renamed, committed);
    let kubectl = std::env::var("SETPOINT_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let mut child = Command::new(&kubectl)
        .args(["create", "--dry-run=server", "-o", "name", "-f", "-"])
        .env("KUBECONFIG", support::kubeconfig_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {kubectl} (set SETPOINT_KUBECTL): {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(renamed.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains(&format!("{plural}.{group}")), "{stdout}");
    assert!(!stderr.contains("Warning"), "{stderr}");
}
