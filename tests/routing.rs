//! A push routed by what each Application's render reads
//! (`status.sourceInputs`), end to end: `setpoint run` against the real
//! control plane and RabbitMQ, signed GitHub pushes with changed-file lists,
//! reconciles counted in the worker's record file.

mod support;

use std::time::{Duration, Instant};

use setpoint::api::{HelmSource, Source};
use support::app::{
    automated, create_app, create_app_from, event_notes, get_app, install_crd, synced_at,
};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, unique_name, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
/// How soon both Applications reading a changed shared input are synced.
const ROUTED_WITHIN: Duration = Duration::from_secs(1);
const SECRET: &str = "webhook-secret-for-tests";

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  key: \"{value}\"\n"
    )
}

/// Two Applications over one repository, and the files one push each
/// changes: one both read (outside either's path), one only `first` reads,
/// one neither reads.
struct Scenario<'a> {
    ns: &'a TestNamespace,
    repo: &'a GitRepo,
    first: &'a str,
    second: &'a str,
    shared: &'a str,
    only_first: &'a str,
    neither: &'a str,
    /// The file's contents at version `n`.
    contents: fn(&str, u32) -> String,
}

fn ends(record: &std::path::Path, ns: &str, app: &str) -> usize {
    let mine = format!("end {ns}/{app} ");
    std::fs::read_to_string(record)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with(&mine))
        .count()
}

async fn run(scenario: Scenario<'_>, initial: &str, inputs: [&[&str]; 2]) {
    let Scenario {
        ns,
        repo,
        first,
        second,
        shared,
        only_first,
        neither,
        contents,
    } = scenario;
    let cache = tempfile::tempdir().unwrap();
    let record = cache.path().join("reconciles.log");
    let prefix = amqp_prefix("inputs");
    let listen = format!("127.0.0.1:{}", free_port());
    let url = amqp_url();
    let args = [
        "run",
        "--listen",
        &listen,
        "--amqp-prefix",
        &prefix,
        "--no-sweep",
        "--github-secret",
        SECRET,
    ];
    let env = [
        ("SETPOINT_AMQP_URL", url.as_str()),
        ("SETPOINT_RECONCILE_RECORD", record.to_str().unwrap()),
    ];
    let mut setpoint = Setpoint::scoped(&ns.name, &args, &env, cache.path());
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    for app in [first, second] {
        wait_for(&format!("{app} synced"), DEADLINE, || {
            synced_at(ns, app, initial)
        })
        .await;
    }
    // Recorded on the status, so every webhook replica knows them.
    for (app, expected) in [first, second].into_iter().zip(inputs) {
        let status = get_app(ns, app).await.status.unwrap();
        assert_eq!(status.source_inputs, expected, "{app}'s inputs");
    }
    let post = |commit: &str, changed: &str| {
        let (code, body) = post_github(
            port,
            Some(SECRET),
            &unique_name("d"),
            &github_push(&repo.url(), commit, &[changed]),
        );
        assert_eq!(code, 200, "{body}");
        body
    };
    let key = |app: &str| format!("\"{}/{app}\"", ns.name);
    let (first_before, second_before) = (
        ends(&record, &ns.name, first),
        ends(&record, &ns.name, second),
    );

    // Only the first reads it: only the first syncs.
    let c2 = repo
        .write(only_first, &contents(only_first, 2))
        .commit("first only");
    let body = post(&c2, only_first);
    assert!(
        body.contains(&key(first)) && !body.contains(&key(second)),
        "{body}"
    );
    wait_for("the first synced", DEADLINE, || synced_at(ns, first, &c2)).await;

    // Neither reads it: nothing is enqueued.
    let c3 = repo.write(neither, &contents(neither, 3)).commit("neither");
    let body = post(&c3, neither);
    assert_eq!(body, "{\"enqueued\":[]}", "a push touching neither");

    // Both read it, though it is under neither's path: both sync, at once.
    let c4 = repo.write(shared, &contents(shared, 4)).commit("shared");
    let sent = Instant::now();
    let body = post(&c4, shared);
    assert!(
        body.contains(&key(first)) && body.contains(&key(second)),
        "{body}"
    );
    for app in [first, second] {
        wait_for(
            &format!("{app} synced at the shared change"),
            DEADLINE,
            || synced_at(ns, app, &c4),
        )
        .await;
    }
    let took = sent.elapsed();
    eprintln!("a push to a shared input synced both Applications in {took:?}");
    assert!(took < ROUTED_WITHIN, "both synced only after {took:?}");

    // Counted: the first reconciled for its own change and the shared one,
    // the second for the shared one only; the push touching neither, never.
    // The record's end line follows the status write: wait for it.
    let counts = || {
        (
            ends(&record, &ns.name, first) - first_before,
            ends(&record, &ns.name, second) - second_before,
        )
    };
    wait_for("the reconciles recorded", DEADLINE, || async {
        match counts() {
            (f, s) if f >= 2 && s >= 1 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        counts(),
        (2, 1),
        "{}",
        std::fs::read_to_string(&record).unwrap()
    );
    // Saying why: the Synced Event and the reconcile's log line.
    for app in [first, second] {
        let notes = event_notes(ns, app, "Synced").await;
        assert!(
            notes
                .iter()
                .any(|n| n.ends_with(&format!("(a push changed {shared})"))),
            "{app}: {notes:?}"
        );
    }
    let logs = setpoint.logs();
    assert!(logs.contains(&format!("input={shared}")), "{logs}");
    support::amqp_queue(&prefix, Default::default())
        .await
        .delete_topology()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_push_to_a_kustomize_base_elsewhere_syncs_every_overlay_over_it() {
    let ns = TestNamespace::new("inputs-kustomize").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let overlay =
        |env: &str| format!("namePrefix: {env}-\nresources:\n- ../../bases/web\n- overlay.yaml\n");
    let contents: fn(&str, u32) -> String = |path, n| match path {
        "bases/web/cm.yaml" => configmap("web", &n.to_string()),
        "envs/prod/overlay.yaml" => configmap("overlay", &n.to_string()),
        _ => format!("# version {n}\n"),
    };
    let initial = repo
        .write("bases/web/kustomization.yaml", "resources: [cm.yaml]\n")
        .write("bases/web/cm.yaml", &contents("bases/web/cm.yaml", 1))
        .write("envs/prod/kustomization.yaml", &overlay("prod"))
        .write(
            "envs/prod/overlay.yaml",
            &contents("envs/prod/overlay.yaml", 1),
        )
        .write("envs/staging/kustomization.yaml", &overlay("staging"))
        .write("envs/staging/overlay.yaml", &configmap("overlay", "s"))
        .write("docs/README.md", "# deploy\n")
        .commit("two overlays over one base");
    create_app(&ns, "prod", &repo.url(), "envs/prod", automated(true, true)).await;
    create_app(
        &ns,
        "staging",
        &repo.url(),
        "envs/staging",
        automated(true, true),
    )
    .await;
    let scenario = Scenario {
        ns: &ns,
        repo: &repo,
        first: "prod",
        second: "staging",
        shared: "bases/web/cm.yaml",
        only_first: "envs/prod/overlay.yaml",
        neither: "docs/README.md",
        contents,
    };
    run(
        scenario,
        &initial,
        [&["bases/web", "envs/prod"], &["bases/web", "envs/staging"]],
    )
    .await;
}

#[tokio::test]
async fn a_push_to_helm_values_outside_the_chart_syncs_the_apps_reading_them() {
    let ns = TestNamespace::new("inputs-helm").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let contents: fn(&str, u32) -> String = |_, n| format!("key: \"{n}\"\n");
    let template = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cfg\ndata:\n  key: {{ .Values.key | quote }}\n  env: {{ .Values.env | quote }}\n";
    let initial = repo
        .write(
            "charts/web/Chart.yaml",
            "apiVersion: v2\nname: web\nversion: 0.1.0\n",
        )
        .write("charts/web/values.yaml", "key: \"0\"\nenv: none\n")
        .write("charts/web/templates/cm.yaml", template)
        .write("values/common.yaml", &contents("", 1))
        .write("values/prod.yaml", "env: prod\n")
        .write("values/staging.yaml", "env: staging\n")
        .write("docs/README.md", "# deploy\n")
        .commit("one chart, values outside it");
    for env in ["prod", "staging"] {
        let source = Source {
            repo_url: repo.url(),
            path: Some("charts/web".into()),
            helm: Some(HelmSource {
                value_files: vec![
                    "../../values/common.yaml".into(),
                    format!("../../values/{env}.yaml"),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        create_app_from(&ns, env, source, automated(true, true)).await;
    }
    let contents: fn(&str, u32) -> String = |path, n| match path {
        "values/prod.yaml" => format!("env: prod-{n}\n"),
        "docs/README.md" => format!("# version {n}\n"),
        _ => format!("key: \"{n}\"\n"),
    };
    let scenario = Scenario {
        ns: &ns,
        repo: &repo,
        first: "prod",
        second: "staging",
        shared: "values/common.yaml",
        only_first: "values/prod.yaml",
        neither: "docs/README.md",
        contents,
    };
    run(
        scenario,
        &initial,
        [
            &["charts/web", "values/common.yaml", "values/prod.yaml"],
            &["charts/web", "values/common.yaml", "values/staging.yaml"],
        ],
    )
    .await;
}
