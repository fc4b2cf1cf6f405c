//! `setpoint app rollback | suspend | resume` and the checks of a manual
//! sync (`--override-window`, `--only`): the I/O around `src/operate/`.
//! Each writes the Application as the kubeconfig's user, so the API
//! server's RBAC decides who may: a user who may not patch it is told so.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use crate::api::Application;
use crate::context::Context;
use crate::operate::rollback::{self, Choice};
use crate::operate::{self, Asked};
use crate::reconcile::status::short;
use crate::reconcile::{self, Request};
use crate::source::git::CheckoutRequest;

/// Who the API server says the kubeconfig's user is (SelfSubjectReview).
pub async fn whoami(client: &kube::Client) -> Option<String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?;
    review.status?.user_info?.username
}

/// Refuses, before anything is read or written, a user who may not patch
/// the Application (a manual sync writes its status and its objects).
pub async fn may_patch(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some("setpoint.dev".into()),
                resource: Some("applications".into()),
                verb: Some("patch".into()),
                namespace: Some(namespace.into()),
                name: Some(name.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = api.create(&PostParams::default(), &review).await?;
    if answer.status.is_some_and(|s| s.allowed) {
        return Ok(());
    }
    let who = whoami(client).await.unwrap_or_else(|| "this user".into());
    anyhow::bail!("{who} may not patch Application {namespace}/{name} (applications.setpoint.dev)")
}

/// A merge patch of the Application's spec, as the kubeconfig's user.
async fn patch_spec(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    spec: serde_json::Value,
) -> anyhow::Result<Application> {
    patch(client, namespace, name, json!({ "spec": spec })).await
}

/// A merge patch of the Application, as the kubeconfig's user.
async fn patch(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    body: serde_json::Value,
) -> anyhow::Result<Application> {
    let api: Api<Application> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams {
        field_manager: Some("setpoint-cli".into()),
        ..Default::default()
    };
    match api.patch(name, &params, &Patch::Merge(body)).await {
        Ok(app) => Ok(app),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            let who = whoami(client).await.unwrap_or_else(|| "this user".into());
            anyhow::bail!(
                "{who} may not patch Application {namespace}/{name}: {}",
                s.message
            )
        }
        Err(e) => Err(anyhow::anyhow!(
            "cannot patch Application {namespace}/{name}: {e}"
        )),
    }
}

/// `setpoint app suspend`: nothing applied, pruned or corrected from now;
/// the worker still compares and reports drift.
pub async fn suspend(ctx: &Context, namespace: &str, name: &str) -> anyhow::Result<i32> {
    patch_spec(&ctx.client, namespace, name, json!({ "suspend": true })).await?;
    println!(
        "{namespace}/{name} suspended: nothing is applied, pruned or corrected until `setpoint app resume {namespace}/{name}`"
    );
    Ok(0)
}

/// `setpoint app resume`: no suspension, no pin; the worker converges at
/// once (the spec change is an event of its own).
pub async fn resume(
    ctx: &Context,
    app: &Application,
    namespace: &str,
    name: &str,
) -> anyhow::Result<i32> {
    let was_pinned = app.spec.pin.as_ref().map(|p| short(Some(&p.revision)));
    patch_spec(
        &ctx.client,
        namespace,
        name,
        json!({ "suspend": false, "pin": null }),
    )
    .await?;
    match was_pinned {
        Some(revision) => println!(
            "{namespace}/{name} resumed: no longer pinned to {revision}; follows {} again",
            app.spec
                .source
                .target_revision
                .as_deref()
                .unwrap_or("the default branch")
        ),
        None => println!("{namespace}/{name} resumed"),
    }
    Ok(0)
}

/// `setpoint app rollback`: pins the Application to a past revision and
/// syncs it now (a manual sync of that revision's render from Git).
pub async fn rollback(
    ctx: &Context,
    app: &Application,
    wanted: Option<&str>,
    unpin: bool,
    override_window: bool,
) -> anyhow::Result<i32> {
    let (namespace, name) = (
        app.metadata.namespace.clone().unwrap_or_default(),
        app.metadata.name.clone().unwrap_or_default(),
    );
    if unpin {
        patch_spec(&ctx.client, &namespace, &name, json!({ "pin": null })).await?;
        println!(
            "{namespace}/{name} unpinned: follows {} again",
            app.spec
                .source
                .target_revision
                .as_deref()
                .unwrap_or("the default branch")
        );
        return Ok(0);
    }
    let choice = match rollback::choose(app.status.as_ref(), wanted) {
        Ok(choice) => choice,
        Err(e) => {
            eprintln!("error: {namespace}/{name}: {e}");
            return Ok(2);
        }
    };
    let (revision, history_id) = match choice {
        Choice::Entry { revision, id } => (revision, Some(id)),
        Choice::Commit(commit) => (commit, None),
        Choice::Resolve(named) if app.spec.source.chart.is_some() => (named, None),
        Choice::Resolve(named) => match resolve(ctx, app, &named).await {
            Ok(commit) => (commit, None),
            Err(e) => {
                eprintln!("error: {namespace}/{name}: cannot resolve {named:?}: {e}");
                return Ok(2);
            }
        },
    };
    let by = whoami(&ctx.client).await;
    let pin = json!({
        "revision": revision,
        "by": by,
        "at": reconcile::now(),
        "historyId": history_id,
    });
    let pinned = patch_spec(
        &ctx.client,
        &namespace,
        &name,
        json!({ "suspend": false, "pin": pin }),
    )
    .await?;
    println!(
        "{namespace}/{name} pinned to {}{}: new commits are not applied until `setpoint app resume`",
        short(Some(&revision)),
        history_id
            .map(|id| format!(" (history {id})"))
            .unwrap_or_default()
    );
    let request = Request {
        manual: true,
        override_window,
        by,
        ..Default::default()
    };
    sync_now(ctx, &pinned, &request).await
}

/// A name (a tag, a branch, a short commit id) as the Application's
/// repository resolves it, with its credentials.
async fn resolve(ctx: &Context, app: &Application, named: &str) -> anyhow::Result<String> {
    let credentials = reconcile::source_credentials(ctx, app).await?;
    let checkout = ctx
        .git
        .checkout(&CheckoutRequest {
            url: &app.spec.source.repo_url,
            revision: Some(named),
            path: app.spec.source.path.as_deref(),
            credentials: credentials.as_ref(),
            known_commit: None,
            fresh_since: None,
        })
        .await?;
    Ok(checkout.commit)
}

/// Whether a manual sync may go now: refused while suspended, and inside
/// a closed sync window without `--override-window` (unless the window
/// allows manual syncs). The message says what to do.
pub fn manual_sync_allowed(app: &Application, override_window: bool) -> Result<(), String> {
    let key = format!(
        "{}/{}",
        app.metadata.namespace.as_deref().unwrap_or_default(),
        app.metadata.name.as_deref().unwrap_or_default()
    );
    if app.spec.suspend {
        return Err(format!(
            "{key} is suspended: nothing is synced until `setpoint app resume {key}`"
        ));
    }
    let asked = Asked {
        manual: true,
        override_window,
    };
    match operate::window_hold(&app.spec, jiff::Timestamp::now(), asked) {
        Ok(None) => Ok(()),
        Ok(Some(hold)) => Err(format!("{key}: {}", hold.message)),
        Err(e) => Err(format!("{key}: {e}")),
    }
}

/// One manual reconcile, printed; the exit code (2 refused, 3 retry).
pub async fn sync_now(ctx: &Context, app: &Application, request: &Request) -> anyhow::Result<i32> {
    let key = format!(
        "{}/{}",
        app.metadata.namespace.as_deref().unwrap_or_default(),
        app.metadata.name.as_deref().unwrap_or_default()
    );
    match reconcile::reconcile(ctx, app, request).await {
        Ok(outcome) => {
            super::print_outcome(&key, &outcome);
            if let Some(hold) = &outcome.status.hold {
                println!("held: {}", hold.message);
            }
            if outcome.requeue_after.is_some() {
                hand_over(ctx, app).await;
            }
            Ok(0)
        }
        Err(error) => {
            eprintln!("error: {}", crate::report::events::error_chain(&error));
            Ok(if error.is_transient() { 3 } else { 2 })
        }
    }
}

/// A manual sync that left something progressing: the controller is asked
/// to look again (the request annotation), so that its own re-checks, not
/// this process's status write, have the last word. Without the request,
/// a controller whose last reconcile had already seen the objects settle
/// would leave this process's `Progressing` standing.
async fn hand_over(ctx: &Context, app: &Application) {
    let (namespace, name) = (
        app.metadata.namespace.as_deref().unwrap_or_default(),
        app.metadata.name.as_deref().unwrap_or_default(),
    );
    let body = json!({
        "metadata": { "annotations": {
            crate::event::REQUESTED_AT: jiff::Timestamp::now().to_string()
        } }
    });
    if let Err(e) = patch(&ctx.client, namespace, name, body).await {
        eprintln!(
            "warning: the controller was not asked to check {namespace}/{name} again (the sweep will): {e}"
        );
    }
}
