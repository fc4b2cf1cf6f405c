//! The dependencies' side of the gate: the Applications `spec.dependsOn`
//! reaches, from the process's reflector store when it has one (the same
//! copy whose changes enqueue the dependents, so a dependent woken by its
//! dependency turning ready sees it ready), else from the API server.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::{Gate, dependencies, gate};
use crate::api::Application;
use crate::context::Context;
use crate::event::AppKey;

/// How long a reconcile waits for the store's first listing before asking
/// the API server instead.
const STORE_READY: Duration = Duration::from_secs(5);

/// Applications read from the API server at most, following `dependsOn`
/// for cycles; past it the walk stops (what lies beyond is not read).
const MAX_READS: usize = 100;

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("failed to read the dependency {dependency}: {source}")]
    ReadDependency {
        dependency: AppKey,
        #[source]
        source: kube::Error,
    },
}

/// Whether `app` may sync now ([`gate`]), its dependencies looked up.
pub async fn check(
    ctx: &Context,
    app: &Application,
) -> Result<Result<Gate, super::DependsError>, LookupError> {
    if app.spec.depends_on.is_empty() {
        return Ok(Ok(Gate::Open));
    }
    let admin = ctx
        .tenancy
        .is_admin_namespace(&app.namespace().unwrap_or_default());
    if let Some(store) = ctx.applications()
        && tokio::time::timeout(STORE_READY, store.wait_until_ready())
            .await
            .is_ok_and(|ready| ready.is_ok())
    {
        let lookup = |key: &AppKey| store.get(&ObjectRef::new(&key.name).within(&key.namespace));
        return Ok(gate(app, admin, &lookup));
    }
    let read = read_closure(ctx, app).await?;
    Ok(gate(app, admin, &|key| read.get(key).cloned().flatten()))
}

/// Every Application reachable from `app` along `dependsOn`, as the API
/// server has it (None: no such Application).
async fn read_closure(
    ctx: &Context,
    app: &Application,
) -> Result<HashMap<AppKey, Option<Arc<Application>>>, LookupError> {
    let mut read: HashMap<AppKey, Option<Arc<Application>>> = HashMap::new();
    let mut queue: VecDeque<AppKey> = dependencies(app).into();
    while let Some(key) = queue.pop_front() {
        if read.contains_key(&key) || read.len() >= MAX_READS {
            continue;
        }
        let api: Api<Application> = Api::namespaced(ctx.client.clone(), &key.namespace);
        let found = api
            .get_opt(&key.name)
            .await
            .map_err(|source| LookupError::ReadDependency {
                dependency: key.clone(),
                source,
            })?;
        if let Some(found) = &found {
            queue.extend(dependencies(found));
        }
        read.insert(key, found.map(Arc::new));
    }
    Ok(read)
}
