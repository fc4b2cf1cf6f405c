//! Steps 1–2 for a chart from a Helm repository or an OCI registry
//! (`spec.source.chart`): the credentials (as the Application's identity),
//! the version its range picks with the verified archive (`source::chart`),
//! then `helm template` of the unpacked chart, cached like a Git render by
//! (options, repository and chart, archive digest, namespace, release,
//! capabilities). Nothing here touches the live objects: a failure leaves
//! them as they are.

use std::path::Path;

use kube::{Client, ResourceExt};

use super::{ReconcileError, Request, credentials, prepare};
use crate::api::Application;
use crate::cluster::Cluster;
use crate::context::Context;
use crate::manifest::Manifest;
use crate::source::chart::cache::ChartRequest;
use crate::source::chart::{ChartError, Repository};
use crate::source::render::inputs::Inputs;
use crate::source::render::{Job, Method, RenderError};

/// The chart's objects, and the revision they come from (the version, and
/// for OCI its manifest digest), written to `revision_out` as soon as known.
pub(super) async fn render(
    ctx: &Context,
    app: &Application,
    cluster: &Cluster,
    client: &Client,
    request: &Request,
    revision_out: &mut Option<String>,
) -> Result<(String, Vec<Manifest>, Inputs), ReconcileError> {
    let source = &app.spec.source;
    let chart = source.chart.as_deref().unwrap_or_default();
    if source.directory.is_some() || source.kustomize.is_some() {
        return Err(RenderError::InvalidSource(
            "spec.source.chart renders with helm: directory and kustomize do not apply".into(),
        )
        .into());
    }
    if source
        .path
        .as_deref()
        .is_some_and(|p| !p.is_empty() && p != ".")
    {
        return Err(RenderError::InvalidSource(
            "spec.source.path does not apply to a chart from a chart repository".into(),
        )
        .into());
    }
    let repository = Repository::parse(&source.repo_url, chart)?;
    let auth = credentials::chart_auth(app, client).await?;
    let resolved = ctx
        .charts
        .resolve(&ChartRequest {
            repository: &repository,
            chart,
            range: source.target_revision.as_deref(),
            auth: auth.as_ref(),
            known_version: request.known_commit.as_deref(),
            fresh_since: request.chart_fresh_since,
        })
        .await?;
    *revision_out = Some(resolved.revision.clone());
    let method = Method::Helm(source.helm.clone().unwrap_or_default());
    let capabilities = ctx
        .renderers
        .capabilities(&cluster.name, cluster.client())
        .await?;
    let namespace = prepare::destination_namespace(app);
    let repo_key = format!("{}#{chart}", repository.key());
    let name = app.name_any();
    let job = Job {
        method: &method,
        repo_url: &repo_key,
        mirror: Path::new(""),
        commit: &resolved.digest,
        path: "",
        namespace: &namespace,
        app: &name,
        capabilities: Some(&capabilities),
    };
    let key = job.key();
    let rendered = match ctx.renderers.cached(&key) {
        Some(rendered) => rendered,
        None => {
            let unpacked = ctx.charts.unpack(chart, &resolved).await?;
            ctx.renderers
                .render_chart(&job, key, &unpacked.chart)
                .await?
        }
    };
    Ok((
        resolved.revision,
        rendered.manifests.clone(),
        rendered.inputs.clone(),
    ))
}

impl From<ChartError> for ReconcileError {
    fn from(error: ChartError) -> Self {
        ReconcileError::Chart(error)
    }
}
