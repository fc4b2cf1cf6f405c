//! Charts from Helm repositories and OCI registries (`spec.source.chart`),
//! against real servers: a Helm repository that `helm package` and `helm
//! repo index` write, served over HTTP (tests/support/charts.rs), and CNCF
//! distribution's registry with charts pushed by `helm push`. Setpoint runs
//! as a process (`setpoint run`) with a 1 s chart poll interval; the objects
//! land on the local control plane.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use setpoint::api::{Application, HelmSource, Source};
use support::app::{all_apps, automated, create_app_from, get_app, install_crd};
use support::charts::{HelmRepo, OciRegistry};
use support::process::{Setpoint, free_port};
use support::{TestNamespace, wait_for};

const POLL: Duration = Duration::from_secs(1);
const DEADLINE: Duration = Duration::from_secs(60);
/// What a reconcile may take once a poll saw the new version (a helm
/// render and an apply on a shared two-core machine).
const RECONCILE: Duration = Duration::from_secs(5);

fn chart_source(repo_url: &str, chart: &str, range: &str) -> Source {
    Source {
        repo_url: repo_url.to_string(),
        chart: Some(chart.to_string()),
        target_revision: Some(range.to_string()),
        helm: Some(HelmSource {
            values_object: Some(json!({ "greeting": "from-setpoint" })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn start_setpoint(
    ns: &TestNamespace,
    cache: &tempfile::TempDir,
    extra: &[(&str, &str)],
) -> Setpoint {
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["run", "--listen", &listen, "--sweep-interval", "1h"];
    let mut env = vec![
        ("SETPOINT_CHART_POLL_INTERVAL", "1s"),
        ("SETPOINT_RETRY_INITIAL", "200ms"),
        ("SETPOINT_MAX_ATTEMPTS", "30"),
    ];
    env.extend_from_slice(extra);
    Setpoint::scoped(&ns.name, &args, &env, cache.path())
}

/// The `data` of the chart's ConfigMap `<app>-config`, with its resourceVersion.
async fn configmap(ns: &TestNamespace, app: &str) -> Option<(String, String, String)> {
    let cm = ns
        .api::<ConfigMap>()
        .get_opt(&format!("{app}-config"))
        .await
        .ok()??;
    let data = cm.data.unwrap_or_default();
    Some((
        data.get("version").cloned().unwrap_or_default(),
        data.get("greeting").cloned().unwrap_or_default(),
        cm.metadata.resource_version.unwrap_or_default(),
    ))
}

/// `Ok` once the app is Synced at `revision` and its ConfigMap says `version`.
async fn installed(
    ns: &TestNamespace,
    app: &str,
    version: &str,
    revision: &str,
) -> Result<(), String> {
    let status = get_app(ns, app).await.status.unwrap_or_default();
    let live = configmap(ns, app).await;
    match (&status.sync.revision, &live) {
        (Some(r), Some((v, greeting, _))) if r == revision && v == version => {
            assert_eq!(greeting, "from-setpoint", "valuesObject applies");
            Ok(())
        }
        _ => Err(format!(
            "revision {:?}, live {live:?}, conditions {:?}",
            status.sync.revision,
            reasons(&get_app(ns, app).await)
        )),
    }
}

fn reasons(app: &Application) -> Vec<String> {
    app.status
        .as_ref()
        .map(|s| {
            s.conditions
                .iter()
                .map(|c| format!("{:?}={:?}:{}:{}", c.type_, c.status, c.reason, c.message))
                .collect()
        })
        .unwrap_or_default()
}

/// `Ok` with the condition's message once a condition has `reason`.
async fn condition(ns: &TestNamespace, app: &str, reason: &str) -> Result<String, String> {
    let app = get_app(ns, app).await;
    app.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.reason == reason))
        .map(|c| c.message.clone())
        .ok_or_else(|| format!("{:?}", reasons(&app)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_from_a_helm_repository_follows_its_range() {
    let ns = TestNamespace::new("chart-http").await;
    install_crd(&ns.client).await;
    let repo = HelmRepo::start().await;
    repo.publish("web", "1.0.0");
    let cache = tempfile::tempdir().unwrap();
    let mut setpoint = start_setpoint(&ns, &cache, &[]);
    setpoint.wait_http().await;
    create_app_from(
        &ns,
        "web",
        chart_source(&repo.url(), "web", "1.x"),
        automated(true, false),
    )
    .await;
    wait_for("1.x to install 1.0.0", DEADLINE, || {
        installed(&ns, "web", "1.0.0", "1.0.0")
    })
    .await;

    // A new matching version is followed within one poll interval, without
    // any webhook.
    repo.publish("web", "1.1.0");
    let published = Instant::now();
    wait_for("1.1.0 to be followed", DEADLINE, || {
        installed(&ns, "web", "1.1.0", "1.1.0")
    })
    .await;
    let took = published.elapsed();
    assert!(
        took < POLL.mul_f64(1.1) + RECONCILE,
        "1.1.0 followed after {took:?}, more than one poll interval (+ the reconcile); logs:\n{}",
        setpoint.logs()
    );

    // 2.0.0 is outside 1.x: three polls later, still 1.1.0, and unchanged.
    let (_, _, version_before) = configmap(&ns, "web").await.unwrap();
    repo.publish("web", "2.0.0");
    let index = "/charts/index.yaml";
    let before = repo.requests(index);
    wait_for("three more polls", DEADLINE, || async {
        let now = repo.requests(index);
        if now >= before + 3 {
            Ok(())
        } else {
            Err(format!("{now} index requests"))
        }
    })
    .await;
    let (version, _, resource_version) = configmap(&ns, "web").await.unwrap();
    assert_eq!(version, "1.1.0");
    assert_eq!(
        resource_version, version_before,
        "the ConfigMap was not written again"
    );
    let app = get_app(&ns, "web").await;
    assert_eq!(app.status.unwrap().sync.revision.as_deref(), Some("1.1.0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_failures_leave_the_live_objects_alone_and_recover() {
    let ns = TestNamespace::new("chart-fail").await;
    install_crd(&ns.client).await;
    let repo = HelmRepo::start().await;
    repo.publish("web", "1.0.0");
    let cache = tempfile::tempdir().unwrap();
    let mut setpoint = start_setpoint(&ns, &cache, &[]);
    setpoint.wait_http().await;
    create_app_from(
        &ns,
        "web",
        chart_source(&repo.url(), "web", "1.x"),
        automated(true, false),
    )
    .await;
    wait_for("1.0.0 installed", DEADLINE, || {
        installed(&ns, "web", "1.0.0", "1.0.0")
    })
    .await;
    let untouched = |expected: &'static str| {
        let ns = &ns;
        async move {
            let (version, _, resource_version) =
                configmap(ns, "web").await.expect("the ConfigMap stays");
            assert_eq!(version, expected, "the live object is left alone");
            resource_version
        }
    };

    // A missing version: a condition; published, it is followed.
    let before = untouched("1.0.0").await;
    ns.api::<Application>()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "source": { "targetRevision": "3.x" } } })),
        )
        .await
        .unwrap();
    let message = wait_for("ChartVersionNotFound", DEADLINE, || {
        condition(&ns, "web", "ChartVersionNotFound")
    })
    .await;
    assert!(
        message.contains("3.x") && message.contains("1.0.0"),
        "{message}"
    );
    assert_eq!(untouched("1.0.0").await, before);
    repo.publish("web", "3.0.0");
    wait_for("3.0.0 installed once published", DEADLINE, || {
        installed(&ns, "web", "3.0.0", "3.0.0")
    })
    .await;

    // A corrupted archive: the digest does not match the index's.
    let before = untouched("3.0.0").await;
    let (served, good) = repo.publish_with("web", "3.1.0", true);
    let message = wait_for("ChartDigestMismatch", DEADLINE, || {
        condition(&ns, "web", "ChartDigestMismatch")
    })
    .await;
    assert!(
        message.contains("digest mismatch") && message.contains("web-3.1.0.tgz"),
        "{message}"
    );
    assert_eq!(untouched("3.0.0").await, before);
    // Fixed: retried with backoff, it syncs.
    std::fs::write(&served, good).unwrap();
    wait_for("3.1.0 installed once fixed", DEADLINE, || {
        installed(&ns, "web", "3.1.0", "3.1.0")
    })
    .await;

    // The repository down: a condition; back up, Ready again.
    let before = untouched("3.1.0").await;
    repo.down().await;
    let message = wait_for("ChartRepositoryUnreachable", DEADLINE, || {
        condition(&ns, "web", "ChartRepositoryUnreachable")
    })
    .await;
    assert!(message.contains(&repo.url()), "{message}");
    assert_eq!(untouched("3.1.0").await, before);
    repo.up().await;
    wait_for("Ready once the repository is back", DEADLINE, || async {
        let app = get_app(&ns, "web").await;
        let status = app.status.clone().unwrap_or_default();
        let failing = status
            .conditions
            .iter()
            .any(|c| c.reason.starts_with("Chart"));
        if !failing && status.sync.revision.as_deref() == Some("3.1.0") {
            Ok(())
        } else {
            Err(format!("{:?}", reasons(&app)))
        }
    })
    .await;
    assert_eq!(untouched("3.1.0").await, before, "recovery rewrote nothing");
    drop(setpoint);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_applications_share_one_index_fetch_per_poll() {
    const APPS: usize = 100;
    let ns = TestNamespace::new("chart-many").await;
    install_crd(&ns.client).await;
    let repo = HelmRepo::start().await;
    repo.publish("web", "1.0.0");
    let cache = tempfile::tempdir().unwrap();
    let mut setpoint = start_setpoint(&ns, &cache, &[("SETPOINT_CONCURRENCY", "16")]);
    setpoint.wait_http().await;
    let started = Instant::now();
    for i in 0..APPS {
        create_app_from(
            &ns,
            &format!("web{i}"),
            chart_source(&repo.url(), "web", "1.x"),
            automated(true, false),
        )
        .await;
    }
    let index = "/charts/index.yaml";
    wait_for("every Application synced", Duration::from_secs(240), || {
        all_apps(&ns, APPS, "synced", |s| {
            s.sync.revision.as_deref() == Some("1.0.0")
        })
    })
    .await;
    // The first syncs share one fetch; the polls meanwhile add one each.
    let polls = started.elapsed().as_secs_f64() / (POLL.as_secs_f64() * 0.9);
    let fetched = repo.requests(index);
    assert!(
        (fetched as f64) <= 1.0 + polls.ceil(),
        "{fetched} index requests for {APPS} Applications in {:?}",
        started.elapsed()
    );
    // Then one fetch per poll, however many Applications.
    let before = repo.requests(index);
    let counting = Instant::now();
    wait_for("five polls", DEADLINE, || async {
        let now = repo.requests(index);
        if now >= before + 5 {
            Ok(())
        } else {
            Err(format!("{now} index requests"))
        }
    })
    .await;
    let took = counting.elapsed();
    assert!(
        took >= POLL.mul_f64(0.9 * 4.0),
        "5 index fetches in {took:?}: more than one per {POLL:?} poll"
    );
    assert!(setpoint.child.try_wait().unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chart_from_an_oci_registry_follows_its_range_with_its_digest() {
    let ns = TestNamespace::new("chart-oci").await;
    install_crd(&ns.client).await;
    let registry = OciRegistry::start().await;
    let first = registry.push("web", "1.0.0");
    let cache = tempfile::tempdir().unwrap();
    let host = registry.host();
    let mut setpoint = start_setpoint(
        &ns,
        &cache,
        &[("SETPOINT_CHART_INSECURE_REGISTRIES", &host)],
    );
    setpoint.wait_http().await;
    create_app_from(
        &ns,
        "web",
        chart_source(&registry.url(), "web", "1.x"),
        automated(true, false),
    )
    .await;
    let revision = format!("1.0.0@{first}");
    wait_for("1.x to install 1.0.0 from OCI", DEADLINE, || {
        installed(&ns, "web", "1.0.0", &revision)
    })
    .await;

    let second = registry.push("web", "1.1.0");
    let published = Instant::now();
    let revision = format!("1.1.0@{second}");
    wait_for("1.1.0 to be followed", DEADLINE, || {
        installed(&ns, "web", "1.1.0", &revision)
    })
    .await;
    let took = published.elapsed();
    assert!(
        took < POLL.mul_f64(1.1) + RECONCILE,
        "1.1.0 followed after {took:?}"
    );

    registry.push("web", "2.0.0");
    let (_, _, before) = configmap(&ns, "web").await.unwrap();
    // Three poll intervals with 2.0.0 published: still 1.1.0.
    let waited = Instant::now();
    wait_for("three poll intervals", DEADLINE, || async {
        if waited.elapsed() >= POLL * 3 {
            Ok(())
        } else {
            Err("waiting".into())
        }
    })
    .await;
    wait_for("still 1.1.0", DEADLINE, || {
        installed(&ns, "web", "1.1.0", &revision)
    })
    .await;
    let (_, _, after) = configmap(&ns, "web").await.unwrap();
    assert_eq!(before, after, "2.0.0 is ignored");
}
