//! Applications in tests: the CRD installed on the local control plane, an
//! Application pointing at a test repository, a Setpoint context, and a
//! reconcile that re-reads the Application first (as a worker does).

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, CustomResourceExt};
use setpoint::api::{
    Application, ApplicationSpec, ApplicationStatus, Automated, Source, SyncPolicy,
};
use setpoint::context::Context;
use setpoint::reconcile::{Outcome, ReconcileError, Request, reconcile};
use setpoint::tenancy::Tenancy;

use super::{TestNamespace, kube_config};

/// Installs (or updates) the Application CRD and waits until it is served.
pub async fn install_crd(client: &kube::Client) {
    apply_crd(client, Application::crd()).await;
}

/// Applies the ApplicationSet CRD (beside the Application's) and waits
/// until it is Established.
pub async fn install_appset_crd(client: &kube::Client) {
    install_crd(client).await;
    apply_crd(client, setpoint::api::ApplicationSet::crd()).await;
}

async fn apply_crd(client: &kube::Client, crd: CustomResourceDefinition) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap();
    api.patch(
        &name,
        &PatchParams::apply("setpoint-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap_or_else(|e| panic!("apply the CRD {name}: {e}"));
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .unwrap_or_else(|_| panic!("the CRD {name} is Established in time"))
    .expect("watch the CRD");
}

/// A Setpoint context against the local control plane, with its own Git cache.
pub async fn context() -> (Context, tempfile::TempDir) {
    let cache = tempfile::Builder::new()
        .prefix("setpoint-cache-")
        .tempdir()
        .unwrap();
    // Every namespace an admin namespace, local repositories allowed: the
    // tenancy tests build their own context (`context_with`).
    let ctx = context_with(Tenancy::single_tenant(), &cache).await;
    (ctx, cache)
}

/// A context with the given tenancy settings, its Git cache in `cache`.
pub async fn context_with(tenancy: Tenancy, cache: &tempfile::TempDir) -> Context {
    Context::new(kube_config().await, cache.path().to_path_buf(), tenancy).expect("a context")
}

pub fn automated(prune: bool, self_heal: bool) -> SyncPolicy {
    SyncPolicy {
        automated: Some(Automated { prune, self_heal }),
        ..Default::default()
    }
}

/// Creates an Application in the test namespace; objects go to that namespace.
pub async fn create_app(
    ns: &TestNamespace,
    name: &str,
    repo_url: &str,
    path: &str,
    sync_policy: SyncPolicy,
) -> Application {
    let source = Source {
        repo_url: repo_url.to_string(),
        path: Some(path.to_string()),
        ..Default::default()
    };
    create_app_from(ns, name, source, sync_policy).await
}

/// Creates an Application with the given source (Kustomize, Helm, ...).
pub async fn create_app_from(
    ns: &TestNamespace,
    name: &str,
    source: Source,
    sync_policy: SyncPolicy,
) -> Application {
    let mut app = Application::new(
        name,
        ApplicationSpec {
            source,
            sync_policy,
            ..Default::default()
        },
    );
    app.metadata.namespace = Some(ns.name.clone());
    ns.api::<Application>()
        .create(&PostParams::default(), &app)
        .await
        .expect("create Application")
}

pub async fn get_app(ns: &TestNamespace, name: &str) -> Application {
    ns.api::<Application>()
        .get(name)
        .await
        .expect("get Application")
}

/// The condition of `type_` in `status`; panics naming the conditions there
/// when it is missing.
pub fn condition(
    status: &setpoint::api::ApplicationStatus,
    type_: setpoint::api::ConditionType,
) -> &setpoint::api::Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_:?} condition: {:?}", status.conditions))
}

/// Re-reads the Application and reconciles it once.
pub async fn reconcile_app(
    ctx: &Context,
    ns: &TestNamespace,
    name: &str,
    request: &Request,
) -> Result<Outcome, ReconcileError> {
    let app = get_app(ns, name).await;
    reconcile(ctx, &app, request).await
}

/// The notes of the Events with `reason` on the Application.
pub async fn event_notes(ns: &TestNamespace, app: &str, reason: &str) -> Vec<String> {
    let events: Api<Event> = ns.api();
    let list = events
        .list(&ListParams::default().fields(&format!("regarding.name={app}")))
        .await
        .expect("list events");
    list.items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// `Ok` once the Application's status is Synced at `commit`; else its state.
pub async fn synced_at(ns: &TestNamespace, app: &str, commit: &str) -> Result<(), String> {
    synced_in(&status_of(ns, app).await?, commit)
}

/// `Ok` once the Application is Synced and Healthy at `commit`: nothing of
/// its first sync is still settling (no health change left to report).
pub async fn settled_at(ns: &TestNamespace, app: &str, commit: &str) -> Result<(), String> {
    let status = status_of(ns, app).await?;
    synced_in(&status, commit)?;
    match status.health.status {
        setpoint::api::Health::Healthy => Ok(()),
        health => Err(format!(
            "Synced but {health:?}: {}",
            status.health.message.as_deref().unwrap_or("no message")
        )),
    }
}

/// `Ok` once `count` Applications of `ns` have a status `accepts`; else
/// how many do.
pub async fn all_apps(
    ns: &TestNamespace,
    count: usize,
    what: &str,
    accepts: impl Fn(&ApplicationStatus) -> bool,
) -> Result<(), String> {
    let apps = ns
        .api::<Application>()
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?;
    all_of(apps.items.iter(), count, what, accepts)
}

/// Whether exactly `count` of `apps` are accepted (`what` names the state).
fn all_of<'a>(
    apps: impl Iterator<Item = &'a Application>,
    count: usize,
    what: &str,
    accepts: impl Fn(&ApplicationStatus) -> bool,
) -> Result<(), String> {
    let matching = apps
        .filter(|a| match &a.status {
            Some(status) => accepts(status),
            None => accepts(&ApplicationStatus::default()),
        })
        .count();
    if matching == count {
        Ok(())
    } else {
        Err(format!("{matching} of {count} {what}"))
    }
}

/// The Applications of a namespace as a watch sees them: one list, then
/// their changes. For fleets, where listing every Application at each poll
/// would load the API server (and this process) more than what is measured.
pub struct AppWatch {
    store: kube::runtime::reflector::Store<Application>,
    task: tokio::task::JoinHandle<()>,
}

impl AppWatch {
    pub async fn start(ns: &TestNamespace) -> Self {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, reflector, watcher};
        let (store, writer) = reflector::store();
        let stream = watcher(ns.api::<Application>(), watcher::Config::default())
            .modify(|app| app.metadata.managed_fields = None)
            .reflect(writer)
            .applied_objects();
        let task = tokio::spawn(async move {
            futures::pin_mut!(stream);
            while stream.next().await.is_some() {}
        });
        store
            .wait_until_ready()
            .await
            .expect("the Application watch lists");
        Self { store, task }
    }

    /// As [`all_apps`], from the watch.
    pub fn all(
        &self,
        count: usize,
        what: &str,
        accepts: impl Fn(&ApplicationStatus) -> bool,
    ) -> Result<(), String> {
        let apps = self.store.state();
        all_of(apps.iter().map(|app| app.as_ref()), count, what, accepts)
    }
}

impl Drop for AppWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn status_of(ns: &TestNamespace, app: &str) -> Result<ApplicationStatus, String> {
    let app = ns
        .api::<Application>()
        .get(app)
        .await
        .map_err(|e| e.to_string())?;
    Ok(app.status.unwrap_or_default())
}

fn synced_in(status: &ApplicationStatus, commit: &str) -> Result<(), String> {
    match (status.sync.status, status.sync.revision.as_deref()) {
        (setpoint::api::Sync::Synced, Some(r)) if r == commit => Ok(()),
        (sync, revision) => Err(format!("{sync:?} at {revision:?}")),
    }
}

/// A Deployment manifest: `replicas` pods labelled `app: <name>`.
pub fn deployment_yaml(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{app: {name}}}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n    spec:\n      containers:\n      - name: app\n        image: app:1\n"
    )
}

/// Scales the Deployment `name` to `replicas` as `kubectl scale` does (the
/// scale subresource, field manager `kubectl`), retrying until the API
/// server takes it, then waits until it is back at `desired` replicas and
/// returns how long that took from the accepted scale.
pub async fn time_scale_correction(
    ns: &TestNamespace,
    name: &str,
    replicas: i32,
    desired: i32,
    deadline: Duration,
) -> Duration {
    use k8s_openapi::api::apps::v1::Deployment;
    let deployments = ns.api::<Deployment>();
    let kubectl = PatchParams {
        field_manager: Some("kubectl".into()),
        ..Default::default()
    };
    let patch = Patch::Merge(serde_json::json!({"spec": {"replicas": replicas}}));
    super::wait_for("the scale to be accepted", deadline, || async {
        deployments
            .patch_scale(name, &kubectl, &patch)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let scaled = std::time::Instant::now();
    super::wait_for(
        &format!("{name} to be set back to {desired} replicas"),
        deadline,
        || async {
            let live = deployments.get(name).await.map_err(|e| e.to_string())?;
            match live.spec.replicas {
                Some(n) if n == desired => Ok(()),
                other => Err(format!("{other:?} replicas")),
            }
        },
    )
    .await;
    scaled.elapsed()
}

/// A service account `name` in `ns`, bound to the ClusterRole `edit` there.
pub async fn grant_edit(ns: &TestNamespace, name: &str) {
    let sa: k8s_openapi::api::core::v1::ServiceAccount =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } })).unwrap();
    ns.api::<k8s_openapi::api::core::v1::ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await
        .expect("create the service account");
    let binding: k8s_openapi::api::rbac::v1::RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("{name}-edit") },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit" },
        "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": ns.name }],
    }))
    .unwrap();
    ns.api::<k8s_openapi::api::rbac::v1::RoleBinding>()
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind edit");
}
