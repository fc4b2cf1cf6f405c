//! One evaluation of an ApplicationSet, the worker's one way in: read the
//! set, gather what its generators read (`facts`), run the pure steps
//! (`generate` → `template::render` → `plan`), write the Applications
//! (`write`), then the status and the Events. An error of the set itself
//! (a generator, a template, two Applications of one name) changes no
//! Application and says why on the status; a source that cannot be read
//! (Git, the pull request API) changes none either and is retried.

use std::collections::BTreeMap;
use std::time::SystemTime;

use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use crate::api::{Application, ApplicationSet};
use crate::context::Context;
use crate::event::{AppKey, PullChange};
use crate::metrics::AppSetLabels;
use crate::report::events::Events;

use super::plan::{Existing, Owner, Plan};
use super::status::{self, Verdict};
use super::{AppSetError, FIELD_MANAGER, SET_LABEL, facts, generate, plan, template, write};

/// What the worker's batch of events for one set asks.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// Only the status summary (an Application of the set changed state).
    pub refresh_only: bool,
    /// What pull request webhooks said, newest last.
    pub pulls: Vec<PullChange>,
    /// The freshness bound of its Git reads (see `source::git`).
    pub fresh_since: Option<SystemTime>,
}

/// What an evaluation did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evaluated {
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
    /// `applied`, `unchanged`, `refused` or `refreshed`.
    pub result: &'static str,
}

/// Evaluates the ApplicationSet of `key` (see the module's doc).
pub async fn evaluate(
    ctx: &Context,
    key: &AppKey,
    batch: &Batch,
) -> Result<Evaluated, AppSetError> {
    let name = key.set_name().unwrap_or(&key.name);
    let sets: Api<ApplicationSet> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let Some(set) = sets.get_opt(name).await.map_err(AppSetError::Read)? else {
        // Deleted: the API server's garbage collector deletes what it owned.
        return Ok(Evaluated {
            result: "unchanged",
            ..Default::default()
        });
    };
    let labels = AppSetLabels {
        namespace: key.namespace.clone(),
        appset: name.to_string(),
        result: String::new(),
    };
    let result = if batch.refresh_only {
        refresh(ctx, &set).await
    } else {
        run(ctx, &set, batch).await
    };
    let outcome = match &result {
        Ok(evaluated) => evaluated.result,
        Err(error) if error.is_transient() => "retry",
        Err(_) => "refused",
    };
    ctx.metrics
        .appset_evaluations
        .get_or_create(&AppSetLabels {
            result: outcome.into(),
            ..labels.clone()
        })
        .inc();
    result
}

/// Only the status summary, from the set's Applications as they are.
async fn refresh(ctx: &Context, set: &ApplicationSet) -> Result<Evaluated, AppSetError> {
    let apps = applications(ctx, set).await?;
    let owned: Vec<&Application> = apps.iter().filter(|a| owns(set, a)).collect();
    let status = status::build(
        set.status.as_ref(),
        set.metadata.generation,
        None,
        &owned,
        &crate::reconcile::now(),
    );
    write_status(ctx, set, status).await?;
    Ok(Evaluated {
        result: "refreshed",
        ..Default::default()
    })
}

async fn run(ctx: &Context, set: &ApplicationSet, batch: &Batch) -> Result<Evaluated, AppSetError> {
    let events = Events::on(
        ctx.client.clone(),
        ctx.reporter.clone(),
        set.object_ref(&()),
    );
    let generated = match generate_all(ctx, set, batch).await {
        Ok(rendered) => rendered,
        Err(error) => {
            let message = crate::report::events::error_chain(&error);
            let verdict = if error.is_transient() {
                Verdict::Failed {
                    reason: error.reason().into(),
                    message: message.clone(),
                }
            } else {
                Verdict::Invalid {
                    reason: error.reason().into(),
                    message: message.clone(),
                }
            };
            let apps = applications(ctx, set).await?;
            let owned: Vec<&Application> = apps.iter().filter(|a| owns(set, a)).collect();
            let status = status::build(
                set.status.as_ref(),
                set.metadata.generation,
                Some(&verdict),
                &owned,
                &crate::reconcile::now(),
            );
            if write_status(ctx, set, status).await? {
                events
                    .warning(error.reason(), "Evaluate", message.clone())
                    .await;
            }
            tracing::warn!(error = %message, "ApplicationSet not evaluated; no Application changed");
            return Err(error);
        }
    };
    let apps = applications(ctx, set).await?;
    let existing: Vec<Existing> = apps.iter().map(|app| existing(set, app)).collect();
    let plan = match plan::plan(generated, existing, &set.spec.sync_policy) {
        Ok(plan) => plan,
        Err(error) => {
            let error = AppSetError::Plan(error);
            let message = crate::report::events::error_chain(&error);
            let owned: Vec<&Application> = apps.iter().filter(|a| owns(set, a)).collect();
            let verdict = Verdict::Invalid {
                reason: error.reason().into(),
                message: message.clone(),
            };
            let status = status::build(
                set.status.as_ref(),
                set.metadata.generation,
                Some(&verdict),
                &owned,
                &crate::reconcile::now(),
            );
            if write_status(ctx, set, status).await? {
                events.warning(error.reason(), "Evaluate", message).await;
            }
            return Err(error);
        }
    };
    let written = write::apply(ctx, set, &plan).await;
    let mut after = apps;
    after.retain(|app| !written.deleted.contains(&app.name_any()));
    for app in &written.applied {
        after.retain(|a| a.name_any() != app.name_any());
        after.push(app.clone());
    }
    let owned: Vec<&Application> = after.iter().filter(|a| owns(set, a)).collect();
    let verdict = verdict(&plan, &written);
    let status = status::build(
        set.status.as_ref(),
        set.metadata.generation,
        Some(&verdict),
        &owned,
        &crate::reconcile::now(),
    );
    let status_changed = write_status(ctx, set, status).await?;
    announce(&events, &plan, &written, &verdict, status_changed).await;
    tracing::info!(
        created = written.created.len(),
        updated = written.updated.len(),
        deleted = written.deleted.len(),
        unchanged = plan.unchanged.len(),
        kept = plan.kept.len(),
        conflicts = plan.conflicts.len(),
        failed = written.failed.len(),
        "ApplicationSet evaluated"
    );
    if let Some((name, error)) = written.failed.first() {
        return Err(AppSetError::Write {
            app: name.clone(),
            reason: error.clone(),
        });
    }
    let changed = written.created.len() + written.updated.len() + written.deleted.len();
    Ok(Evaluated {
        created: written.created.len(),
        updated: written.updated.len(),
        deleted: written.deleted.len(),
        result: if changed > 0 { "applied" } else { "unchanged" },
    })
}

/// Generators, then the template for each parameter set.
async fn generate_all(
    ctx: &Context,
    set: &ApplicationSet,
    batch: &Batch,
) -> Result<Vec<template::Rendered>, AppSetError> {
    // Its name is the value of its Applications' label.
    let name = set.name_any();
    if name.len() > 63 {
        return Err(generate::GenerateError::Invalid {
            at: "metadata.name".into(),
            reason: format!(
                "{name:?} is {} characters; a set's name is its Applications' {SET_LABEL} label value, at most 63",
                name.len()
            ),
        }
        .into());
    }
    let needs = generate::needs(&set.spec.generators)?;
    let facts = facts::gather(ctx, set, &needs, batch.fresh_since, &batch.pulls).await?;
    let params = generate::generate(&set.spec.generators, &facts)?;
    params
        .iter()
        .map(|params| template::render(&set.spec.template, params).map_err(AppSetError::from))
        .collect()
}

fn verdict(plan: &Plan, written: &write::Written) -> Verdict {
    let total = plan.create.len() + plan.update.len() + plan.unchanged.len() + plan.held.len();
    let counts = format!(
        "{total} Applications ({} created, {} updated, {} deleted)",
        written.created.len(),
        written.updated.len(),
        written.deleted.len()
    );
    let mut problems = Vec::new();
    let mut reason = None;
    if let Some(guard) = &plan.guard {
        reason.get_or_insert("DeletionRefused");
        problems.push(format!(
            "refused to delete {} of its {} Applications in one evaluation (more than {}%): {}; if this is meant, raise spec.syncPolicy.maxDeletePercent",
            guard.would_delete,
            guard.owned,
            guard.max_percent,
            shortlist(&plan.kept)
        ));
    }
    for (name, owner) in &plan.conflicts {
        reason.get_or_insert("NameConflict");
        problems.push(format!(
            "Application {name} exists and is not this set's ({owner}): left as it is"
        ));
    }
    for (name, error) in &written.failed {
        reason.get_or_insert("WriteFailed");
        problems.push(format!("Application {name}: {error}"));
    }
    match reason {
        None => Verdict::UpToDate { message: counts },
        Some(reason) => Verdict::Partly {
            reason: reason.into(),
            message: format!("{counts}; {}", problems.join("; ")),
        },
    }
}

async fn announce(
    events: &Events,
    plan: &Plan,
    written: &write::Written,
    verdict: &Verdict,
    status_changed: bool,
) {
    for (reason, names) in [
        ("Created", &written.created),
        ("Updated", &written.updated),
        ("Deleted", &written.deleted),
    ] {
        if !names.is_empty() {
            let note = format!(
                "{} Application{}: {}",
                reason.to_lowercase(),
                if names.len() == 1 { "" } else { "s" },
                shortlist(names)
            );
            events.normal(reason, "Evaluate", note).await;
        }
    }
    if let Verdict::Partly { reason, message } = verdict
        && (status_changed || plan.guard.is_some())
    {
        events.warning(reason, "Evaluate", message.clone()).await;
    }
}

/// At most 20 names, then how many more.
fn shortlist(names: &[String]) -> String {
    let mut text = names
        .iter()
        .take(20)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 20 {
        text.push_str(&format!(" and {} more", names.len() - 20));
    }
    text
}

/// The Applications of the set's namespace: from the watch's store when
/// this process runs one, else one list.
async fn applications(
    ctx: &Context,
    set: &ApplicationSet,
) -> Result<Vec<Application>, AppSetError> {
    let namespace = set.metadata.namespace.as_deref().unwrap_or_default();
    // A store that has not listed yet could miss an Application made by
    // hand, which the set would then take over: wait for its listing, else
    // list.
    let listed = match ctx.applications() {
        Some(store) => matches!(
            tokio::time::timeout(std::time::Duration::from_secs(30), store.wait_until_ready())
                .await,
            Ok(Ok(()))
        ),
        None => false,
    };
    if let Some(store) = ctx.applications().filter(|_| listed) {
        return Ok(store
            .state()
            .iter()
            .filter(|app| app.metadata.namespace.as_deref() == Some(namespace))
            .map(|app| (**app).clone())
            .collect());
    }
    let api: Api<Application> = Api::namespaced(ctx.client.clone(), namespace);
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(AppSetError::Read)?
        .items)
}

/// Whether `app` is `set`'s: its controller reference names the set's uid.
pub fn owns(set: &ApplicationSet, app: &Application) -> bool {
    app.owner_references()
        .iter()
        .any(|r| r.kind == "ApplicationSet" && Some(&r.uid) == set.metadata.uid.as_ref())
}

/// How the plan sees a live Application.
fn existing(set: &ApplicationSet, app: &Application) -> Existing {
    let owner = if owns(set, app) {
        Owner::ThisSet
    } else {
        let namespace = app.namespace().unwrap_or_default();
        match app
            .owner_references()
            .iter()
            .find(|r| r.kind == "ApplicationSet")
        {
            Some(other) => Owner::Other(format!(
                "owned by ApplicationSet {namespace}/{}",
                other.name
            )),
            None => Owner::Other("made by hand or by another tool".into()),
        }
    };
    let without_ours = |map: &BTreeMap<String, String>| {
        let mut map = map.clone();
        map.remove(SET_LABEL);
        map
    };
    Existing {
        name: app.name_any(),
        owner,
        labels: without_ours(app.labels()),
        annotations: app.annotations().clone(),
        spec: app.spec.clone(),
    }
}

/// Writes `status` unless the set already says it; whether it wrote.
async fn write_status(
    ctx: &Context,
    set: &ApplicationSet,
    status: crate::api::ApplicationSetStatus,
) -> Result<bool, AppSetError> {
    // The gauge follows what every status this process builds counts.
    ctx.metrics
        .appset_applications
        .get_or_create(&AppSetLabels {
            namespace: set.namespace().unwrap_or_default(),
            appset: set.name_any(),
            result: String::new(),
        })
        .set(i64::from(status.summary.applications));
    if set.status.as_ref() == Some(&status) {
        return Ok(false);
    }
    let api: Api<ApplicationSet> = Api::namespaced(
        ctx.client.clone(),
        set.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = json!({
        "apiVersion": "setpoint.dev/v1alpha1",
        "kind": "ApplicationSet",
        "status": status,
    });
    api.patch_status(
        &set.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(AppSetError::WriteStatus)?;
    Ok(true)
}
