//! Reconcile: make the live cluster equal to Git for one Application, and say
//! truthfully what was done. The steps, in order:
//!
//! 1. source  — fetch the repository and read the files at the revision;
//! 2. render  — files → manifests;
//! 3. prepare — resolve kinds, set namespaces, mark ownership;
//! 4. live    — read the objects the cluster holds;
//! 5. plan    — desired × live (and the cached dry run of each live one) →
//!    create / update / unchanged / prune (pure);
//! 6. policy  — which of those this reconcile may do (pure);
//! 7. apply   — server-side apply in order, then prune (with sync waves or
//!    hooks, `ordered_sync.rs` follows `ordering.rs` instead);
//! 8. health and status — written only when changed; Events for what happened.

pub mod annotations;
pub mod apply;
mod chart;
mod commit_status;
mod credentials;
pub mod depends;
pub mod dry_run;
mod events;
pub mod finalize;
pub mod health;
pub mod kinds;
pub mod live;
mod ordered_sync;
pub mod ordering;
pub mod ownership;
pub mod plan;
pub mod policy;
pub mod prepare;
pub mod signatures;
pub mod status;
mod status_write;
pub mod sync_options;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use serde_json::Value;

use crate::api::{Application, ApplicationStatus, Health, OperationSummary, ResourceStatus, Sync};
use crate::cluster::{Cluster, Wanted};
use crate::context::Context;
use crate::manifest::ObjectId;
use crate::report::events::{Events, error_chain};
use crate::source::chart::ChartError;
use crate::source::git::Checkout;
use crate::source::git::{CheckoutRequest, Credentials, GitError};
use crate::source::render::inputs::Inputs;
use crate::source::render::{Job, Method, RenderError, directory};
use crate::tenancy::TenancyError;

pub(crate) use credentials::chart_auth;

use apply::ApplyError;
use live::LiveError;
use plan::{Action, Plan};
use prepare::PrepareError;
use status::{Ending, Report};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Source(#[from] GitError),
    #[error(transparent)]
    Chart(ChartError),
    #[error("{}", if .0.is_manifest() { format!("invalid manifest: {}", .0) } else { .0.to_string() })]
    Render(#[from] RenderError),
    #[error(transparent)]
    Prepare(#[from] PrepareError),
    #[error(transparent)]
    Live(#[from] LiveError),
    #[error(transparent)]
    Apply(#[from] ApplyError),
    #[error(transparent)]
    Tenancy(#[from] TenancyError),
    #[error(transparent)]
    Ordering(#[from] ordering::OrderingError),
    #[error(transparent)]
    Depends(#[from] depends::DependsError),
    #[error(transparent)]
    DependsLookup(#[from] depends::lookup::LookupError),
    #[error(
        "{}; Setpoint never applies, adopts or prunes another Application's objects",
        .0.iter().map(|f| f.to_string()).collect::<Vec<_>>().join(", ")
    )]
    Owned(Vec<ownership::Foreign>),
    #[error("failed to read the credentials Secret {namespace}/{name}: {message}")]
    Credentials {
        namespace: String,
        name: String,
        message: String,
    },
    #[error(transparent)]
    Destination(#[from] crate::cluster::DestinationError),
    #[error("the cluster {cluster} does not answer: {message}")]
    Unreachable { cluster: String, message: String },
    #[error(transparent)]
    HealthCheck(#[from] health::CelError),
    #[error(transparent)]
    Signature(#[from] crate::source::git::verify::VerifyError),
    #[error("the verification keys Secret {namespace}/{name}: {message}")]
    VerifyKeys {
        namespace: String,
        name: String,
        message: String,
    },
    #[error(transparent)]
    Window(#[from] crate::operate::WindowError),
    /// `--only` named objects the render does not hold: refused before
    /// anything is written, the Application's status included.
    #[error("--only {missing}: not in the render of revision {revision} (its objects: {known})")]
    NotSelected {
        missing: String,
        revision: String,
        known: String,
    },
    #[error("failed to write the status of {app}: {source}")]
    WriteStatus {
        app: String,
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError {
    /// Transient errors are retried with backoff; the others wait for a
    /// change in Git or in the Application.
    pub fn is_transient(&self) -> bool {
        match self {
            ReconcileError::Source(e) => e.is_transient(),
            ReconcileError::Chart(e) => e.is_transient(),
            ReconcileError::Render(e) => e.is_transient(),
            ReconcileError::Prepare(e) => e.is_transient(),
            ReconcileError::Live(_) => true,
            ReconcileError::Apply(e) => e.is_transient(),
            ReconcileError::Tenancy(_) | ReconcileError::Owned(_) => false,
            ReconcileError::Ordering(_) => false,
            ReconcileError::Depends(_) => false,
            ReconcileError::DependsLookup(_) => true,
            ReconcileError::Credentials { .. } => false,
            ReconcileError::Destination(_) => false,
            ReconcileError::Unreachable { .. } => true,
            ReconcileError::WriteStatus { .. } => true,
            ReconcileError::HealthCheck(_) => false,
            ReconcileError::Signature(e) => e.is_transient(),
            ReconcileError::VerifyKeys { .. } => false,
            ReconcileError::Window(_) | ReconcileError::NotSelected { .. } => false,
        }
    }

    /// The condition reason and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ReconcileError::Source(GitError::RevisionNotFound { .. }) => "RevisionNotFound",
            ReconcileError::Source(
                GitError::PathNotFound { .. } | GitError::NotADirectory { .. },
            ) => "PathNotFound",
            ReconcileError::Source(_) => "FetchFailed",
            ReconcileError::Chart(e) => e.reason(),
            ReconcileError::Render(e) => e.reason(),
            ReconcileError::Prepare(PrepareError::Duplicate(_)) => "InvalidManifest",
            ReconcileError::Prepare(PrepareError::Options(_)) => "InvalidSyncOption",
            ReconcileError::Prepare(e) if e.is_transient() => "DiscoveryFailed",
            ReconcileError::Prepare(_) => "UnknownKind",
            ReconcileError::Live(_) => "ReadLiveFailed",
            ReconcileError::Apply(ApplyError::Rejected { .. }) => "ApplyRejected",
            ReconcileError::Apply(ApplyError::Forbidden { .. }) => "Forbidden",
            ReconcileError::Tenancy(e) => e.reason(),
            ReconcileError::Ordering(e) => e.reason(),
            ReconcileError::Depends(e) => e.reason(),
            ReconcileError::DependsLookup(_) => "DependencyReadFailed",
            ReconcileError::Owned(_) => "OwnedByAnotherApplication",
            ReconcileError::Apply(ApplyError::Prune { .. }) => "PruneFailed",
            ReconcileError::Apply(ApplyError::CrdTerminating { .. }) => "CrdTerminating",
            ReconcileError::Apply(_) => "ApplyFailed",
            ReconcileError::Credentials { .. } => "CredentialsInvalid",
            ReconcileError::Destination(e) => e.reason(),
            ReconcileError::Unreachable { .. } => "ClusterUnreachable",
            ReconcileError::WriteStatus { .. } => "StatusWriteFailed",
            ReconcileError::HealthCheck(_) => "InvalidHealthCheck",
            ReconcileError::Signature(e) => e.reason(),
            ReconcileError::VerifyKeys { .. } => "VerificationKeysInvalid",
            ReconcileError::Window(_) => "InvalidSyncWindow",
            ReconcileError::NotSelected { .. } => "NotSelected",
        }
    }
}

/// What asked for this reconcile.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// A sync someone asked for: applies and prunes whatever the policy says.
    pub manual: bool,
    /// Plan only: no writes at all (`setpoint diff`).
    pub dry_run: bool,
    /// A commit a webhook announced: the fetch is skipped when it is known.
    pub known_commit: Option<String>,
    /// Without `known_commit`: a fetch that started at or after this moment
    /// is recent enough (see `CheckoutRequest::fresh_since`).
    pub fresh_since: Option<std::time::SystemTime>,
    /// A registry announced a push of the chart (a Receiver): a chart
    /// listing fetched before this moment is not served.
    pub chart_fresh_since: Option<std::time::SystemTime>,
    /// The changed file that routed a push here (`Cause::Webhook`'s input),
    /// named in the `Synced` Event.
    pub changed_input: Option<String>,
    /// With `dry_run`: also dry-run the objects to create (a preview), so a
    /// rejection or a forbidden create is found without writing anything.
    pub dry_run_creates: bool,
    /// The queue event this reconcile covers: the ids of the notifications
    /// its Events cause derive from it.
    pub event_id: Option<String>,
    /// A manual sync inside a closed sync window (`--override-window`).
    pub override_window: bool,
    /// A selective sync (`--only`): just these objects, no prune.
    pub only: Vec<crate::operate::Selector>,
    /// Who asked (a manual sync from the CLI or the dashboard), for the
    /// history.
    pub by: Option<String>,
}

/// What one reconcile found and did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub revision: Option<String>,
    pub plan: Option<Plan>,
    pub applied: Vec<ObjectId>,
    pub pruned: Vec<ObjectId>,
    /// Steps the policy left alone (OutOfSync).
    pub skipped: Vec<ObjectId>,
    pub status: ApplicationStatus,
    pub status_written: bool,
    /// Check back after this long (something is still progressing).
    pub requeue_after: Option<Duration>,
    /// A dry run's desired objects, as they would be applied (previews show
    /// what a create would create).
    pub desired: Vec<crate::manifest::Manifest>,
}

impl Outcome {
    pub fn in_sync(&self) -> bool {
        self.plan.as_ref().is_some_and(|p| p.is_in_sync())
    }
}

/// The objects the Application's path declares at the checkout's commit:
/// plain files in process, Kustomize and Helm through their cached renders.
async fn render(
    ctx: &Context,
    app: &Application,
    cluster: &Cluster,
    credentials: Option<&Credentials>,
    checkout: &Checkout,
) -> Result<(Vec<crate::manifest::Manifest>, Inputs), ReconcileError> {
    let source = &app.spec.source;
    let method = Method::detect(source, &checkout.path, &checkout.files)?;
    if method == Method::Directory {
        let mut budget = ctx.renderers.settings().budget();
        return Ok((
            directory::render(&checkout.files, &mut budget)?,
            Inputs::directory(&checkout.path),
        ));
    }
    let capabilities = match method {
        Method::Helm(_) => Some(
            ctx.renderers
                .capabilities(&cluster.name, cluster.client())
                .await?,
        ),
        _ => None,
    };
    let namespace = prepare::destination_namespace(app);
    let job = Job {
        method: &method,
        repo_url: &source.repo_url,
        mirror: &checkout.mirror,
        commit: &checkout.commit,
        path: &checkout.path,
        namespace: &namespace,
        app: &app.name_any(),
        capabilities: capabilities.as_deref(),
    };
    let key = job.key();
    if let Some(rendered) = ctx.renderers.cached(&key) {
        return Ok((rendered.manifests.clone(), rendered.inputs.clone()));
    }
    // The whole tree: bases and values files may live outside the path. The
    // commit is known, so no fetch.
    let tree = ctx
        .git
        .checkout(&CheckoutRequest {
            url: &source.repo_url,
            revision: Some(&checkout.commit),
            path: None,
            credentials,
            known_commit: None,
            fresh_since: None,
        })
        .await?;
    let rendered = ctx.renderers.render(&job, key, &tree.files).await?;
    Ok((rendered.manifests.clone(), rendered.inputs.clone()))
}

/// The Git credentials of `app`'s source, as its identity reads them (a
/// preview fetches its pull request's head with them); a source its
/// tenancy refuses is refused here too.
pub(crate) async fn source_credentials(
    ctx: &Context,
    app: &Application,
) -> Result<Option<Credentials>, ReconcileError> {
    let identity = ctx.tenancy.identity(app)?;
    ctx.tenancy.check_source(&app.spec.source.repo_url)?;
    let client = ctx.client_for(&identity);
    credentials::credentials(ctx, app, &identity, &client).await
}

/// One reconcile of one Application.
pub async fn reconcile(
    ctx: &Context,
    app: &Application,
    request: &Request,
) -> Result<Outcome, ReconcileError> {
    let started = Instant::now();
    let tap = ctx
        .notifier()
        .filter(|_| !request.dry_run)
        .map(|notifier| notifier.tap(app, request.event_id.as_deref()));
    let events = Events::new(ctx.client.clone(), ctx.reporter.clone(), app).with_tap(tap);
    if finalize::pending(app) && !request.dry_run {
        let pruned = finalize::finalize(ctx, app).await?;
        return Ok(Outcome {
            status: app.status.clone().unwrap_or_default(),
            pruned,
            ..Default::default()
        });
    }
    if app.metadata.deletion_timestamp.is_some() {
        // Being deleted, and no finalizer of ours: nothing to keep applied.
        return Ok(Outcome {
            status: app.status.clone().unwrap_or_default(),
            ..Default::default()
        });
    }
    // A pin renders its revision through the source's own path.
    let pinned = crate::operate::pinned(app);
    let app = pinned.as_ref().map_or(app, |(at_pin, _)| at_pin);
    let mut revision = None;
    let result = match gate(ctx, app, request).await {
        Ok(depends::Gate::Open) => sync(ctx, app, request, &events, started, &mut revision).await,
        Ok(waiting) => wait_for_dependencies(ctx, app, &events, &waiting).await,
        Err(error) => Err(error),
    };
    if !request.dry_run {
        commit_status::ending(ctx, app, request, revision.as_deref(), &result);
    }
    match result {
        Ok(outcome) => Ok(outcome),
        Err(error) if request.dry_run => Err(error),
        Err(error @ ReconcileError::NotSelected { .. }) => Err(error),
        Err(error) => {
            let message = error_chain(&error);
            let reason = error.reason().to_string();
            let ending = if error.is_transient() {
                Ending::Retrying {
                    reason: reason.clone(),
                    message: message.clone(),
                }
            } else {
                Ending::Stalled {
                    reason: reason.clone(),
                    message: message.clone(),
                }
            };
            let report = Report {
                previous: app.status.as_ref(),
                generation: app.metadata.generation,
                revision: revision.clone(),
                resources: None,
                ending,
                operation: None,
                now: now(),
                inputs: None,
                sync_run: None,
                hold: None,
                pinned: crate::operate::pinned_status(app, request.known_commit.as_deref()),
            };
            tracing::warn!(app = %prepare::owner_key(app), reason, error = %message, "reconcile failed");
            // One Warning per distinct failure, not one per retry.
            if status_write::write_status(ctx, app, report)
                .await
                .is_ok_and(|(_, written)| written)
            {
                if let Some(revision) = &revision {
                    events.at_revision(revision);
                }
                let stalled = !error.is_transient();
                events.failed(&reason, "Reconcile", message, stalled).await;
            }
            Err(error)
        }
    }
}

/// `spec.dependsOn`: whether this reconcile may sync (a dry run always may).
async fn gate(
    ctx: &Context,
    app: &Application,
    request: &Request,
) -> Result<depends::Gate, ReconcileError> {
    if request.dry_run {
        return Ok(depends::Gate::Open);
    }
    Ok(depends::lookup::check(ctx, app).await??)
}

/// A dependency is not ready: nothing is read, applied or pruned; the
/// status says what it waits for and keeps its sync status. No requeue:
/// the watch enqueues this Application when a dependency turns ready.
async fn wait_for_dependencies(
    ctx: &Context,
    app: &Application,
    events: &Events,
    waiting: &depends::Gate,
) -> Result<Outcome, ReconcileError> {
    let message = waiting.message().unwrap_or_default();
    let previous = app.status.as_ref();
    let report = Report {
        previous,
        generation: app.metadata.generation,
        revision: previous.and_then(|s| s.sync.revision.clone()),
        resources: None,
        ending: Ending::Waiting {
            reason: depends::NOT_READY.into(),
            message: message.clone(),
        },
        operation: None,
        now: now(),
        inputs: None,
        sync_run: None,
        hold: None,
        pinned: crate::operate::pinned_status(app, None),
    };
    let (status, status_written) = status_write::write_status(ctx, app, report).await?;
    tracing::info!(app = %prepare::owner_key(app), %message, "not synced: a dependency is not ready");
    if status_written {
        events
            .normal(depends::NOT_READY, "Reconcile", message)
            .await;
    }
    Ok(Outcome {
        status,
        status_written,
        ..Default::default()
    })
}

async fn sync(
    ctx: &Context,
    app: &Application,
    request: &Request,
    events: &Events,
    started: Instant,
    revision_out: &mut Option<String>,
) -> Result<Outcome, ReconcileError> {
    let source = &app.spec.source;
    // Who this Application acts as: every request on its behalf below (the
    // credentials Secret on the local cluster; the live reads, the dry run,
    // the apply, the prune on its destination cluster) goes through `local`
    // or `client`, so each API server's RBAC decides.
    let identity = ctx.tenancy.identity(app)?;
    let cluster = destination(ctx, app).await?;
    if let Some(message) = cluster.unreachable() {
        return Err(ReconcileError::Unreachable {
            cluster: cluster.name.clone(),
            message,
        });
    }
    let local = ctx.client_for(&identity);
    let client = cluster.client_for(&identity);
    let mut signature = None;
    let (revision, manifests, inputs) = if source.chart.is_some() {
        chart::render(ctx, app, &cluster, &local, request, revision_out).await?
    } else {
        git_render(
            ctx,
            app,
            request,
            &identity,
            &cluster,
            &local,
            revision_out,
            &mut signature,
        )
        .await?
    };
    let synced = sync_rendered(
        ctx,
        app,
        request,
        events,
        started,
        Target {
            cluster: &cluster,
            client: &client,
            cached: identity.is_admin(),
        },
        revision,
        manifests,
        inputs,
        signature,
    )
    .await;
    match synced {
        Err(error) if !cluster.is_local() => match crate::cluster::unreachable_cause(&error) {
            Some(message) => {
                cluster.set_unreachable(message.clone());
                Err(ReconcileError::Unreachable {
                    cluster: cluster.name.clone(),
                    message,
                })
            }
            None => Err(error),
        },
        other => other,
    }
}

/// The cluster `app` deploys to, when its namespace may deploy there.
async fn destination(ctx: &Context, app: &Application) -> Result<Arc<Cluster>, ReconcileError> {
    let namespace = app.namespace().unwrap_or_default();
    let wanted = Wanted::of(&app.spec.destination);
    let admin = ctx.tenancy.is_admin_namespace(&namespace);
    Ok(ctx.clusters.resolve(&wanted, &namespace, admin).await?)
}

/// Steps 1–2 from Git: the checkout at the revision, its signature
/// (`spec.source.verify`), then its render.
#[allow(clippy::too_many_arguments)] // the steps' shared state, and what they found out
async fn git_render(
    ctx: &Context,
    app: &Application,
    request: &Request,
    identity: &crate::tenancy::Identity,
    cluster: &Cluster,
    client: &kube::Client,
    revision_out: &mut Option<String>,
    signature_out: &mut Option<crate::api::SignatureRecord>,
) -> Result<(String, Vec<crate::manifest::Manifest>, Inputs), ReconcileError> {
    let source = &app.spec.source;
    ctx.tenancy.check_source(&source.repo_url)?;
    let credentials = credentials::credentials(ctx, app, identity, client).await?;
    let checkout = ctx
        .git
        .checkout(&CheckoutRequest {
            url: &source.repo_url,
            revision: source.target_revision.as_deref(),
            path: source.path.as_deref(),
            credentials: credentials.as_ref(),
            known_commit: request.known_commit.as_deref(),
            fresh_since: request.fresh_since,
        })
        .await?;
    let revision = checkout.commit.clone();
    *revision_out = Some(revision.clone());
    // `spec.source.verify`: an unsigned commit goes no further.
    *signature_out = signatures::verify(
        ctx,
        app,
        client,
        credentials.as_ref(),
        &revision,
        request.dry_run,
    )
    .await?;
    if !request.dry_run {
        commit_status::pending(ctx, app, request, &revision);
    }

    let (manifests, inputs) = render(ctx, app, cluster, credentials.as_ref(), &checkout).await?;
    crate::source::render::check_not_empty(
        source,
        &checkout.path,
        &checkout.files,
        &manifests,
        app.spec.sync_policy.allow_empty,
    )?;
    Ok((revision, manifests, inputs))
}

/// Where a sync's objects go, and as whom.
struct Target<'a> {
    cluster: &'a Cluster,
    /// The destination's client as the Application's identity.
    client: &'a kube::Client,
    /// The identity is Setpoint's own: the cluster's live cache (read as
    /// Setpoint) may answer its reads.
    cached: bool,
}

/// Steps 3–8, the same whatever the source.
#[allow(clippy::too_many_arguments)] // the steps' shared state, passed as it is
async fn sync_rendered(
    ctx: &Context,
    app: &Application,
    request: &Request,
    events: &Events,
    started: Instant,
    target: Target<'_>,
    revision: String,
    manifests: Vec<crate::manifest::Manifest>,
    inputs: Inputs,
    signature: Option<crate::api::SignatureRecord>,
) -> Result<Outcome, ReconcileError> {
    let Target {
        cluster, client, ..
    } = target;
    events.at_revision(&revision);
    let client = client.clone();
    // Live state from the watches, but for a plan shown rather than
    // applied (`setpoint diff`, previews), which reads the API server.
    let cache = (target.cached && !request.dry_run).then_some(&cluster.live);
    let health_rules = ctx.health_rules.for_app(app)?;
    let prepared = prepare::prepare(cluster.client(), &cluster.kinds, app, manifests).await?;
    // Hooks (`setpoint.dev/hook`) run only at their phase of a sync: they are
    // neither planned, nor drift, nor pruned as ordinary objects.
    let mut desired = Vec::with_capacity(prepared.len());
    let mut waves = Vec::with_capacity(prepared.len());
    let mut hooks = Vec::new();
    let mut hook_orderings = Vec::new();
    for d in prepared {
        match ordering::placement(&d.manifest)? {
            ordering::Placement::Object(wave) => {
                desired.push(d);
                waves.push(wave);
            }
            ordering::Placement::Hooks(orderings) => {
                // A hook of several phases is one object per phase.
                for order in orderings {
                    hooks.push(prepare::Desired {
                        manifest: d.manifest.clone(),
                        kind: d.kind.clone(),
                        options: d.options,
                    });
                    hook_orderings.push(order);
                }
            }
            ordering::Placement::Skip => {}
        }
    }
    let how = live::Read::for_reconcile(request.manual);
    let (mut live, skipped_kinds) =
        live::read(&client, &cluster.kinds, app, &desired, how, cache).await?;
    let live_hooks: Vec<ObjectId> = live
        .objects
        .iter()
        .filter(|(_, object)| ordering::is_hook(object))
        .map(|(id, _)| id.clone())
        .collect();
    for id in &live_hooks {
        live.objects.remove(id);
        live.owned.remove(id);
    }
    if let Some(error) = apply::terminating_crd(&desired, &live.objects) {
        return Err(error.into());
    }
    let desired_manifests: Vec<_> = desired.iter().map(|d| d.manifest.clone()).collect();
    let foreign = ownership::foreign(&desired_manifests, &live, &prepare::owner_key(app));
    if !foreign.is_empty() {
        return Err(ReconcileError::Owned(foreign));
    }
    // What Setpoint applies leaves out the fields the Application ignores;
    // the dry runs (the server-side diff's input) are of that object.
    let ignore = &app.spec.ignore_differences;
    for d in &mut desired {
        let live_object = plan::find_live(&d.manifest.id, &live.objects);
        d.manifest.body = plan::applied_body(ignore, &d.manifest.id, &d.manifest.body, live_object);
    }
    let desired_manifests: Vec<_> = desired.iter().map(|d| d.manifest.clone()).collect();
    // Suspended, or a closed sync window: the plan is made and shown,
    // nothing is carried out.
    let held = if request.dry_run {
        None
    } else {
        let asked = crate::operate::Asked {
            manual: request.manual,
            override_window: request.override_window,
        };
        crate::operate::hold(&app.spec, jiff::Timestamp::now(), asked)?
    };
    // A Git change to an object this reconcile will apply anyway needs no
    // dry run for the diff: the apply answers with the new object. A plan
    // shown, or one the policy may hold back, gets the exact diff.
    let applies_git_changes = !request.dry_run
        && held.is_none()
        && (request.manual || app.spec.sync_policy.automated.is_some());
    live.dry_runs = dry_run::dry_run_live(
        &client,
        &cluster.dry_runs,
        &ctx.metrics,
        &desired,
        &live,
        !applies_git_changes,
    )
    .await?;
    let plan = plan::plan(&desired_manifests, &live, ignore);
    if request.dry_run {
        if request.dry_run_creates {
            let index: HashMap<&ObjectId, usize> = desired_manifests
                .iter()
                .enumerate()
                .map(|(i, m)| (&m.id, i))
                .collect();
            let creates: Vec<usize> = plan
                .steps
                .iter()
                .filter(|s| matches!(s.action, Action::Create { .. }))
                .filter_map(|s| index.get(&s.id).copied())
                .collect();
            apply::dry_run(&client, &desired, &creates, &live.dry_runs).await?;
        }
        return Ok(Outcome {
            revision: Some(revision),
            plan: Some(plan),
            desired: desired_manifests,
            ..Default::default()
        });
    }

    let previous = app.status.as_ref();
    let trigger = policy::Trigger {
        manual: request.manual,
        new_revision: previous.and_then(|s| s.last_applied_revision.as_deref()) != Some(&revision),
    };
    let mut decision = policy::decide(&plan, &app.spec.sync_policy, trigger, desired.len());
    let app_options = sync_options::of_application(&app.spec.sync_policy.sync_options)
        .map_err(PrepareError::from)?;
    policy::restrain(&mut decision, &live.objects, app_options, request.manual);
    if let Some(hold) = &held {
        policy::hold(&mut decision, &hold.label);
    } else if !request.only.is_empty() {
        if let Some(error) = not_selected(&plan, &request.only, &revision) {
            return Err(error);
        }
        policy::select(&mut decision, &request.only);
    }
    if app_options.create_namespace && !decision.apply.is_empty() {
        apply::create_namespace(&client, &prepare::destination_namespace(app), &desired).await?;
    }
    let index: HashMap<&ObjectId, usize> = desired_manifests
        .iter()
        .enumerate()
        .map(|(i, m)| (&m.id, i))
        .collect();
    let chosen: Vec<usize> = decision.apply.iter().map(|s| index[&s.id]).collect();
    let prune_targets: Vec<ObjectId> = decision.prune.iter().map(|s| s.id.clone()).collect();
    // A selective sync applies its objects as they are: no hooks, no waves.
    let ordered = request.only.is_empty()
        && (!hooks.is_empty()
            || waves.iter().any(|&w| w != 0)
            || live.objects.values().any(|o| ordering::live_wave(o) != 0)
            || previous
                .and_then(|s| s.sync_run.as_ref())
                .is_some_and(|r| r.revision == revision && !r.phase.is_finished()));
    let (applied, pruned, ordered) = if ordered {
        let skipped_ids: std::collections::HashSet<ObjectId> =
            decision.skipped.iter().map(|s| s.id.clone()).collect();
        let result = ordered_sync::sync(ordered_sync::Input {
            client: &client,
            kinds: &cluster.kinds,
            events,
            revision: &revision,
            previous: previous.and_then(|s| s.sync_run.as_ref()),
            may_sync: held.is_none()
                && (request.manual || app.spec.sync_policy.automated.is_some()),
            manual: request.manual,
            wave_timeout: ordering::wave_timeout(app.spec.sync_policy.wave_timeout.as_deref())?,
            desired: &mut desired,
            waves: &waves,
            hooks: &mut hooks,
            hook_orderings: &hook_orderings,
            chosen: &chosen,
            skipped: &skipped_ids,
            prune: &prune_targets,
            app_options,
            live: &live.objects,
            dry_runs: &live.dry_runs,
            health_rules: &health_rules,
        })
        .await?;
        let applied = result.applied;
        let pruned = result.pruned;
        (applied, pruned, Some((result.run, result.end, result.held)))
    } else {
        let applied = apply::apply(
            &client,
            &cluster.kinds,
            &mut desired,
            &chosen,
            &live.dry_runs,
        )
        .await?;
        let pruned = apply::prune(
            &client,
            &cluster.kinds,
            &prune_targets,
            &live.objects,
            app_options,
        )
        .await?;
        (applied, pruned, None)
    };
    for a in &applied {
        cluster.live.written(&a.id, &a.live);
        if let Some(d) = desired.iter().find(|d| d.manifest.id == a.id) {
            cluster.dry_runs.applied(&a.id, &d.manifest.body, &a.live);
        }
    }
    for id in &pruned {
        cluster.live.deleted(id);
    }
    if applied
        .iter()
        .any(|a| a.id.group == "apiextensions.k8s.io" && a.id.kind == "CustomResourceDefinition")
    {
        ctx.renderers.invalidate_capabilities(&cluster.name).await;
    }

    // Health and per-object status, from what the API server returned.
    let applied_live: HashMap<&ObjectId, &Value> =
        applied.iter().map(|a| (&a.id, &a.live)).collect();
    let skipped: Vec<&ObjectId> = decision.skipped.iter().map(|s| &s.id).collect();
    let mut resources = Vec::with_capacity(plan.steps.len());
    for step in &plan.steps {
        let id = &step.id;
        if pruned.contains(id) {
            continue;
        }
        let live_now = applied_live
            .get(id)
            .copied()
            .or_else(|| live_object(&live.objects, id));
        let assessment = match live_now {
            Some(object) => health::assess_with(&health_rules, &id.group, &id.kind, object),
            None => health::Assessment {
                status: Health::Missing,
                message: Some("not in the cluster".into()),
            },
        };
        let held = ordered
            .as_ref()
            .and_then(|(_, _, held)| held.get(id))
            .filter(|_| !applied_live.contains_key(id));
        let ignored = decision.ignored.iter().any(|s| &s.id == id);
        let is_skipped = skipped.contains(&id) || held.is_some() || ignored;
        let message = if let Some(held) = held {
            Some(held.clone())
        } else if let Some(note) = decision.notes.get(id) {
            Some(note.clone())
        } else if is_skipped && let Some(label) = &decision.held {
            Some(held_message(step, label))
        } else if is_skipped {
            Some(skipped_message(step, decision.prune_blocked.as_deref()))
        } else {
            assessment.message
        };
        resources.push(ResourceStatus {
            group: id.group.clone(),
            version: id.version.clone(),
            kind: id.kind.clone(),
            namespace: id.namespace.clone(),
            name: id.name.clone(),
            sync: if is_skipped {
                Sync::OutOfSync
            } else {
                Sync::Synced
            },
            health: assessment.status,
            message,
        });
    }

    let changed = !applied.is_empty() || !pruned.is_empty();
    let initiated = initiated_by(app, request);
    let operation = changed.then(|| OperationSummary {
        revision: revision.clone(),
        applied: applied.len() as u32,
        pruned: pruned.len() as u32,
        unchanged: plan
            .steps
            .iter()
            .filter(|s| matches!(s.action, Action::Unchanged))
            .count() as u32,
        duration_ms: started.elapsed().as_millis() as u64,
        finished_at: now(),
        initiated_by: initiated.clone(),
        signature: signature.clone(),
        ..Default::default()
    });
    let note = skipped_kinds
        .first()
        .map(|s| format!("cannot list {} in {}: {}", s.kind, s.scope, s.message))
        .or(decision.prune_blocked.clone());
    let out_of_sync = decision.skipped.len() + skipped_kinds.len();
    let (sync_run, ending) = match ordered {
        None => (None, Ending::Done { out_of_sync, note }),
        Some((run, end, _)) => {
            let ending = match end {
                ordered_sync::End::Done => Ending::Done { out_of_sync, note },
                ordered_sync::End::Waiting { reason, message } => Ending::Waiting {
                    reason: reason.into(),
                    message,
                },
                ordered_sync::End::Failed { reason, message } => Ending::Stalled {
                    reason: reason.into(),
                    message,
                },
            };
            (run, ending)
        }
    };
    let waiting = matches!(ending, Ending::Waiting { .. });
    let report = Report {
        previous,
        generation: app.metadata.generation,
        revision: Some(revision.clone()),
        resources: Some(resources),
        ending,
        operation,
        now: now(),
        inputs: Some(inputs),
        sync_run,
        hold: held.map(|h| crate::api::HoldStatus {
            reason: h.reason.into(),
            message: h.message,
            until: h.until.map(crate::operate::rfc3339),
        }),
        pinned: crate::operate::pinned_status(app, request.known_commit.as_deref()),
    };
    // What was applied is reported while the status is written: neither
    // waits for the other.
    let (written, ()) = tokio::join!(
        status_write::write_status(ctx, app, report),
        events::report_applied(
            events,
            &plan,
            &applied,
            &pruned,
            events::Synced {
                revision: &revision,
                changed_input: request.changed_input.as_deref(),
                cluster: (!cluster.is_local()).then_some(cluster.name.as_str()),
                initiated_by: initiated.as_deref(),
            },
        )
    );
    let (new_status, status_written) = written?;
    events::count_drift_corrections(ctx, &cluster.name, &plan, &applied);
    events::report_drift_detected(events, previous, &new_status).await;
    events::report_health_change(events, previous, &new_status).await;
    events::report_hold_change(events, previous, &new_status).await;
    let requeue_after = (waiting
        || matches!(
            new_status.health.status,
            Health::Progressing | Health::Unknown
        ))
    .then_some(Duration::from_secs(2));
    Ok(Outcome {
        revision: Some(revision),
        applied: applied.into_iter().map(|a| a.id).collect(),
        pruned,
        skipped: skipped.into_iter().cloned().collect(),
        plan: Some(plan),
        status: new_status,
        status_written,
        requeue_after,
        desired: Vec::new(),
    })
}

fn live_object<'a>(objects: &'a HashMap<ObjectId, Value>, id: &ObjectId) -> Option<&'a Value> {
    objects.get(id).or_else(|| {
        objects
            .iter()
            .find(|(k, _)| k.same_object(id))
            .map(|(_, v)| v)
    })
}

/// `--only`: the selectors that name no object of the render, as an error.
fn not_selected(
    plan: &plan::Plan,
    only: &[crate::operate::Selector],
    revision: &str,
) -> Option<ReconcileError> {
    let missing: Vec<String> = only
        .iter()
        .filter(|s| !plan.steps.iter().any(|step| s.matches(&step.id)))
        .map(|s| s.to_string())
        .collect();
    if missing.is_empty() {
        return None;
    }
    let known: Vec<String> = plan
        .steps
        .iter()
        .filter(|s| !matches!(s.action, Action::Prune))
        .map(|s| format!("{}/{}", s.id.kind, s.id.name))
        .collect();
    Some(ReconcileError::NotSelected {
        missing: missing.join(", "),
        revision: status::short(Some(revision)).to_string(),
        known: known.join(", "),
    })
}

/// Who the history says asked: a rollback's first apply of its pin, a
/// selective sync, a manual sync someone named.
fn initiated_by(app: &Application, request: &Request) -> Option<String> {
    let by = |who: Option<&String>| who.map_or(String::new(), |w| format!(" by {w}"));
    if let Some(pin) = &app.spec.pin {
        let first = app
            .status
            .as_ref()
            .and_then(|s| s.history.first())
            .is_none_or(|h| h.revision != pin.revision);
        if first {
            return Some(format!("rollback{}", by(pin.by.as_ref())));
        }
    }
    if !request.only.is_empty() {
        let only: Vec<String> = request.only.iter().map(|s| s.to_string()).collect();
        return Some(format!(
            "sync of {}{}",
            only.join(", "),
            by(request.by.as_ref())
        ));
    }
    request
        .by
        .as_ref()
        .filter(|_| request.manual)
        .map(|who| format!("sync by {who}"))
}

/// An object a hold left alone: what a sync would do to it.
fn held_message(step: &plan::Step, label: &str) -> String {
    match &step.action {
        Action::Create { .. } => format!("{label}: would create it"),
        Action::Update { drift, .. } if !drift.is_empty() => {
            let fields: Vec<String> = drift.iter().take(3).map(|d| d.to_string()).collect();
            format!("{label}: would set {}", fields.join(", "))
        }
        Action::Update { .. } => format!("{label}: would update it to Git's version"),
        Action::Prune => format!("{label}: would prune it"),
        Action::Unchanged => String::new(),
    }
}

fn skipped_message(step: &plan::Step, prune_blocked: Option<&str>) -> String {
    match &step.action {
        Action::Create { deleted_live: true } => {
            "deleted from the cluster; not in sync with Git".into()
        }
        Action::Create { .. } => "not yet created".into(),
        Action::Update { drift, .. } => {
            let fields: Vec<String> = drift.iter().take(3).map(|d| d.to_string()).collect();
            format!("differs from Git: {}", fields.join(", "))
        }
        Action::Prune => prune_blocked
            .unwrap_or("not in Git; pruning is off")
            .to_string(),
        Action::Unchanged => String::new(),
    }
}

/// RFC 3339, whole seconds, as Kubernetes writes times.
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
