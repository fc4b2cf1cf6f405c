//! The committed CRD YAML is what the Rust types generate (`make crd`).

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
