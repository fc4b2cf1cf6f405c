//! Live state from the watch-fed cache: `setpoint run` against the real
//! control plane, its requests counted by the API server itself
//! (`apiserver_request_total` on its `/metrics`). This file's tests run in
//! a test binary of their own, one at a time (see `SERIAL`), so the counts
//! are those of this process and of the control plane's own controllers.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use setpoint::api::{Health, Sync};
use support::app::{AppWatch, automated, create_app, install_crd};
use support::process::{Setpoint, free_port, github_push, post_github, sample, scrape};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(120);
const SECRET: &str = "live-cache-secret";
const APPS: usize = 12;

/// The tests count the API server's requests: never two at once.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn configmap(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  value: \"{value}\"\n"
    )
}

fn service_account(name: &str, value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {name}\n  annotations:\n    example.com/value: \"{value}\"\n"
    )
}

/// App `i`'s two files at `value`.
fn write_app(repo: &GitRepo, i: usize, value: &str) {
    repo.write(
        &format!("app-{i}/cm.yaml"),
        &configmap(&format!("cm-{i}"), value),
    );
    repo.write(
        &format!("app-{i}/sa.yaml"),
        &service_account(&format!("sa-{i}"), value),
    );
}

/// `apiserver_request_total` summed by (verb, resource, subresource), dry
/// runs apart (verb `APPLY dryRun`), WATCH left out.
async fn api_requests() -> BTreeMap<(String, String, String), f64> {
    let client = support::kube_client().await;
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client
        .request_text(request)
        .await
        .expect("the API server's metrics");
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| -> String {
            labels
                .split(',')
                .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let mut verb = label("verb");
        if verb == "WATCH" {
            continue;
        }
        if !label("dry_run").is_empty() {
            verb.push_str(" dryRun");
        }
        let key = (verb, label("resource"), label("subresource"));
        *counts.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    counts
}

fn delta(
    after: &BTreeMap<(String, String, String), f64>,
    before: &BTreeMap<(String, String, String), f64>,
    verb: &str,
    resource: &str,
    subresource: &str,
) -> f64 {
    let key = (
        verb.to_string(),
        resource.to_string(),
        subresource.to_string(),
    );
    after.get(&key).copied().unwrap_or(0.0) - before.get(&key).copied().unwrap_or(0.0)
}

/// Every change, for the failure message.
fn changes(
    after: &BTreeMap<(String, String, String), f64>,
    before: &BTreeMap<(String, String, String), f64>,
) -> String {
    after
        .iter()
        .filter_map(|(key, n)| {
            let d = n - before.get(key).copied().unwrap_or(0.0);
            (d > 0.0).then(|| format!("{} {} {}: {d}", key.0, key.1, key.2))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `setpoint run` (embedded queue) for `ns`, and its metrics port.
async fn start(ns: &TestNamespace, cache: &tempfile::TempDir) -> (Setpoint, u16, u16) {
    start_with(ns, cache, &[]).await
}

async fn start_with(
    ns: &TestNamespace,
    cache: &tempfile::TempDir,
    env: &[(&str, &str)],
) -> (Setpoint, u16, u16) {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics_port = free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--no-sweep",
            "--github-secret",
            SECRET,
        ],
        &[&[("SETPOINT_METRICS_LISTEN", metrics.as_str())], env].concat(),
        cache.path(),
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    (setpoint, port, metrics_port)
}

/// Until the cache of the local cluster holds `objects` objects.
async fn cached(metrics_port: u16, objects: usize) {
    wait_for("the live cache to hold the fleet", DEADLINE, || async {
        let text = scrape(metrics_port)?;
        match sample(
            &text,
            "setpoint_live_objects_cached{cluster=\"in-cluster\"}",
        ) {
            Some(n) if n >= objects as f64 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

fn synced_at<'a>(commit: &'a str) -> impl Fn(&setpoint::api::ApplicationStatus) -> bool + 'a {
    move |status| {
        status.sync.status == Sync::Synced
            && status.sync.revision.as_deref() == Some(commit)
            && status.health.status == Health::Healthy
    }
}

#[tokio::test]
async fn a_change_to_a_synced_fleet_reads_no_live_object_and_writes_one_status_each() {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("live-cache").await;
    install_crd(&ns.client).await;
    let cache = tempfile::tempdir().unwrap();
    let repo = GitRepo::new();
    for i in 0..APPS {
        write_app(&repo, i, "1");
    }
    let first = repo.commit("one");
    for i in 0..APPS {
        let path = format!("app-{i}");
        create_app(
            &ns,
            &format!("app-{i}"),
            &repo.url(),
            &path,
            automated(true, true),
        )
        .await;
    }
    let apps = AppWatch::start(&ns).await;
    let (setpoint, port, metrics_port) = start(&ns, &cache).await;
    wait_for("the first sync", DEADLINE, || async {
        apps.all(APPS, "synced", synced_at(&first))
    })
    .await;
    // Every object of the fleet is watched, and held.
    cached(metrics_port, 2 * APPS).await;

    let before = api_requests().await;
    for i in 0..APPS {
        write_app(&repo, i, "2");
    }
    let second = repo.commit("two");
    let changed: Vec<String> = (0..APPS)
        .flat_map(|i| [format!("app-{i}/cm.yaml"), format!("app-{i}/sa.yaml")])
        .collect();
    let changed: Vec<&str> = changed.iter().map(String::as_str).collect();
    let (code, body) = post_github(
        port,
        Some(SECRET),
        "live-cache-1",
        &github_push(&repo.url(), &second, &changed),
    );
    assert_eq!(code, 200, "{body}");
    wait_for("the push synced", DEADLINE, || async {
        apps.all(APPS, "synced", synced_at(&second))
    })
    .await;
    let after = api_requests().await;
    let all = changes(&after, &before);

    // No live object was read: the cache answered. (LISTs are not counted:
    // the namespace controller lists every kind of the namespaces other
    // tests leave behind.)
    for resource in ["configmaps", "serviceaccounts"] {
        assert_eq!(
            delta(&after, &before, "GET", resource, ""),
            0.0,
            "{all}\n{}",
            setpoint.logs()
        );
    }
    // Nor an Application: the watch's store has them.
    assert_eq!(
        delta(&after, &before, "GET", "applications", ""),
        0.0,
        "{all}"
    );
    // One status write per Application, and the applies of what changed.
    assert_eq!(
        delta(&after, &before, "APPLY", "applications", "status"),
        APPS as f64,
        "{all}"
    );
    for resource in ["configmaps", "serviceaccounts"] {
        assert_eq!(
            delta(&after, &before, "APPLY", resource, ""),
            APPS as f64,
            "{all}"
        );
    }
    let data = ns
        .api::<ConfigMap>()
        .get("cm-0")
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(data["value"], "2");
}

/// One Application (`app-0`: a ConfigMap and a ServiceAccount at value
/// "0") synced by a `setpoint run` whose cache holds both objects.
struct OneApp {
    ns: TestNamespace,
    repo: GitRepo,
    apps: AppWatch,
    port: u16,
    metrics_port: u16,
    _setpoint: Setpoint,
    _cache: tempfile::TempDir,
}

impl OneApp {
    async fn synced(name: &str) -> OneApp {
        let ns = TestNamespace::new(name).await;
        install_crd(&ns.client).await;
        let cache = tempfile::tempdir().unwrap();
        let repo = GitRepo::new();
        write_app(&repo, 0, "0");
        let first = repo.commit("zero");
        create_app(&ns, "app-0", &repo.url(), "app-0", automated(true, true)).await;
        let apps = AppWatch::start(&ns).await;
        let (setpoint, port, metrics_port) = start(&ns, &cache).await;
        wait_for("the first sync", DEADLINE, || async {
            apps.all(1, "synced", synced_at(&first))
        })
        .await;
        cached(metrics_port, 2).await;
        OneApp {
            ns,
            repo,
            apps,
            port,
            metrics_port,
            _setpoint: setpoint,
            _cache: cache,
        }
    }
}

#[tokio::test]
async fn objects_deleted_by_hand_and_kinds_seen_first_are_handled_from_and_beside_the_cache() {
    let _serial = SERIAL.lock().await;
    let OneApp {
        ns,
        repo,
        apps,
        port,
        metrics_port,
        // Bound, not `..`: left out, the process would stop here.
        _setpoint,
        _cache,
        ..
    } = OneApp::synced("live-cache-edges").await;

    // Deleted by hand: the watch drops it from the cache and enqueues the
    // Application, whose reconcile recreates it (not a stale "it exists").
    let configmaps = ns.api::<ConfigMap>();
    let uid = configmaps.get("cm-0").await.unwrap().metadata.uid;
    configmaps
        .delete("cm-0", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the ConfigMap recreated", DEADLINE, || async {
        match configmaps
            .get_opt("cm-0")
            .await
            .map_err(|e| e.to_string())?
        {
            Some(cm) if cm.metadata.uid != uid => Ok(()),
            other => Err(format!("{:?}", other.map(|cm| cm.metadata.uid))),
        }
    })
    .await;

    // A kind no watch covers yet (a Service): read from the API server,
    // applied, then watched like the others.
    repo.write(
        "app-0/svc.yaml",
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n",
    );
    let second = repo.commit("a Service");
    push(port, &repo, &second, &["app-0/svc.yaml"]);
    wait_for("the Service synced", DEADLINE, || async {
        apps.all(1, "synced", synced_at(&second))
    })
    .await;
    assert!(ns.api::<Service>().get_opt("web").await.unwrap().is_some());
    cached(metrics_port, 3).await;

    // Dropped from Git: pruned, from what the cache holds.
    repo.remove("app-0/svc.yaml");
    let third = repo.commit("no Service");
    push(port, &repo, &third, &["app-0/svc.yaml"]);
    wait_for("the Service pruned", DEADLINE, || async {
        match ns
            .api::<Service>()
            .get_opt("web")
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(_) => Err("still there".to_string()),
        }
    })
    .await;
    wait_for("synced without it", DEADLINE, || async {
        apps.all(1, "synced", synced_at(&third))
    })
    .await;
}

/// Pushes `commit` of `repo` to the process on `port`, naming `files`.
fn push(port: u16, repo: &GitRepo, commit: &str, files: &[&str]) {
    push_url(port, &repo.url(), commit, files)
}

fn push_url(port: u16, url: &str, commit: &str, files: &[&str]) {
    let (code, body) = post_github(
        port,
        Some(SECRET),
        &support::unique_name("live-cache-push"),
        &github_push(url, commit, files),
    );
    assert_eq!(code, 200, "{body}");
}

#[tokio::test]
async fn a_change_by_someone_else_beside_a_push_ends_as_git_says_whatever_the_cache_held() {
    let _serial = SERIAL.lock().await;
    let OneApp {
        ns,
        repo,
        apps,
        port,
        // Bound, not `..`: left out, the process would stop here.
        _setpoint,
        _cache,
        ..
    } = OneApp::synced("live-cache-race").await;
    let configmaps = ns.api::<ConfigMap>();
    let accounts = ns.api::<ServiceAccount>();
    for round in 1..=4 {
        // Git changes the ConfigMap while someone else changes the value
        // Setpoint applied to the ServiceAccount, at the same moment: the
        // reconcile may plan from a copy older than that change, and the
        // apply then meets a newer object. Either way the watch's event
        // for it follows, and both end as Git has them.
        let value = round.to_string();
        repo.write("app-0/cm.yaml", &configmap("cm-0", &value));
        let commit = repo.commit(&format!("round {round}"));
        let by_hand =
            serde_json::json!({"metadata": {"annotations": {"example.com/value": "by hand"}}});
        let (url, pushed) = (repo.url(), commit.clone());
        let pusher =
            tokio::task::spawn_blocking(move || push_url(port, &url, &pushed, &["app-0/cm.yaml"]));
        let (params, merge) = (PatchParams::default(), Patch::Merge(&by_hand));
        let patched = accounts.patch("sa-0", &params, &merge).await;
        pusher.await.unwrap();
        patched.expect("change the ServiceAccount by hand");
        wait_for("Git's values back", DEADLINE, || async {
            let cm = configmaps.get("cm-0").await.map_err(|e| e.to_string())?;
            let sa = accounts.get("sa-0").await.map_err(|e| e.to_string())?;
            let data = cm.data.unwrap_or_default().get("value").cloned();
            let annotation = sa
                .metadata
                .annotations
                .unwrap_or_default()
                .get("example.com/value")
                .cloned();
            match (data.as_deref(), annotation.as_deref()) {
                (Some(d), Some("0")) if d == value => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        wait_for("synced at the round's commit", DEADLINE, || async {
            apps.all(1, "synced", synced_at(&commit))
        })
        .await;
    }
}

#[tokio::test]
async fn a_tenant_reads_as_itself_though_the_cache_holds_its_objects() {
    let _serial = SERIAL.lock().await;
    let ns = TestNamespace::new("live-cache-tenant").await;
    install_crd(&ns.client).await;
    // A service account that may write ConfigMaps but not read them.
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "writer"}})).unwrap();
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "write-configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch", "update"]}],
    }))
    .unwrap();
    ns.api::<Role>()
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "writer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "write-configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "writer", "namespace": ns.name}],
    }))
    .unwrap();
    ns.api::<RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let cache = tempfile::tempdir().unwrap();
    let repo = GitRepo::new();
    repo.write("app/cm.yaml", &configmap("cm", "1"));
    let first = repo.commit("one");
    create_app(&ns, "web", &repo.url(), "app", automated(true, true)).await;
    let patch = serde_json::json!({"spec": {"serviceAccountName": "writer"}});
    ns.api::<setpoint::api::Application>()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let apps = AppWatch::start(&ns).await;
    // The test's namespace is a tenant's: the Application acts as `writer`.
    let (_setpoint, port, metrics_port) = start_with(
        &ns,
        &cache,
        &[("SETPOINT_ADMIN_NAMESPACES", "setpoint-system")],
    )
    .await;
    let unreadable = |commit: &str| {
        let commit = commit.to_string();
        move |status: &setpoint::api::ApplicationStatus| {
            status.sync.revision.as_deref() == Some(commit.as_str())
                && status.sync.status == Sync::OutOfSync
                && serde_json::to_string(status)
                    .unwrap()
                    .contains("cannot list v1 ConfigMap")
        }
    };
    wait_for(
        "applied, but not readable as the tenant",
        DEADLINE,
        || async { apps.all(1, "applied unreadable", unreadable(&first)) },
    )
    .await;
    // Setpoint's own watch holds the ConfigMap now.
    cached(metrics_port, 1).await;

    repo.write("app/cm.yaml", &configmap("cm", "2"));
    let second = repo.commit("two");
    push(port, &repo, &second, &["app/cm.yaml"]);
    wait_for("the change applied as the tenant", DEADLINE, || async {
        let cm = ns
            .api::<ConfigMap>()
            .get("cm")
            .await
            .map_err(|e| e.to_string())?;
        match cm.data.unwrap_or_default().get("value").map(String::as_str) {
            Some("2") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    // Still read as the tenant, who may not: the cache's copy answered
    // nothing for it.
    wait_for(
        "reported unreadable at the second commit",
        DEADLINE,
        || async { apps.all(1, "applied unreadable", unreadable(&second)) },
    )
    .await;
}
