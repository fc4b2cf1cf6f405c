//! Previews on pull requests: what merging a pull request (GitHub) or a
//! merge request (GitLab) would change in the cluster, posted on it before
//! anyone merges. A step beside the reconcile, not in it; it never writes
//! to the cluster.
//!
//! The webhook turns a `pull_request` (opened, synchronize, reopened) or a
//! `Merge Request Hook` delivery into one `Cause::Preview` event keyed by
//! the pull request, naming the Applications that follow its base
//! repository and branch. A worker takes it with its own permits (previews
//! never wait for reconciles, nor delay them) and, keeping only the newest
//! head of a burst, runs [`run`]:
//!
//! 1. fetch the head from the ref the Git host keeps for it
//!    (`refs/pull/N/head`, `refs/merge-requests/N/head`) and list what it
//!    changes (`git diff base...head`, `source/git/pull.rs`);
//! 2. `select`: the Applications those files touch (their path or their
//!    recorded inputs: Kustomize bases, Helm chart and values);
//! 3. `render`: each rendered at the head and dry-run as its own identity,
//!    through the reconcile's own dry run (plan = create, update, prune);
//! 4. `body`: the text, Secrets masked, capped;
//! 5. `github` (one comment edited in place, a check run `setpoint/preview`)
//!    or `gitlab` (one note edited in place).

pub mod body;
pub mod github;
pub mod gitlab;
pub mod render;
pub mod select;

use std::time::Instant;

use futures::StreamExt;
use kube::Api;
use kube::runtime::reflector::ObjectRef;

use crate::api::Application;
use crate::context::Context;
use crate::event::{AppKey, PullRequest};
use crate::ingest::webhook::AppSource;
use crate::metrics::PreviewLabels;
use crate::reconcile::ReconcileError;
use crate::source::git::GitError;

use render::AppPreview;

/// How many Applications of one preview render and dry-run at once.
const APPS_AT_ONCE: usize = 4;

/// Read once at start (`previews.*` settings).
#[derive(Clone, Debug)]
pub struct PreviewSettings {
    /// Preview pull requests whose head is in a fork (off by default: a
    /// fork's author is anyone; its render still runs in the sandbox).
    pub forks: bool,
    /// Previews running at once in one worker, apart from reconciles.
    pub concurrency: usize,
    /// The largest comment, in characters.
    pub max_chars: usize,
}

impl Default for PreviewSettings {
    fn default() -> Self {
        PreviewSettings {
            forks: false,
            concurrency: 2,
            max_chars: body::DEFAULT_MAX_CHARS,
        }
    }
}

/// The settings and where previews are posted.
#[derive(Clone, Debug, Default)]
pub struct Previews {
    pub settings: PreviewSettings,
    pub github: Option<crate::report::github::PullRequests>,
    pub gitlab: Option<gitlab::Notes>,
}

#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    #[error("no Application of the pull request could be read: {0}")]
    NoApplication(String),
    #[error(transparent)]
    Source(#[from] GitError),
    #[error("failed to read the base repository's credentials: {0}")]
    Credentials(#[source] Box<ReconcileError>),
    #[error(transparent)]
    GitHub(#[from] crate::report::github::GitHubError),
    #[error(transparent)]
    GitLab(#[from] gitlab::GitLabError),
}

/// What one preview found and where it went.
#[derive(Debug, Default)]
pub struct Report {
    pub changed_files: usize,
    pub previews: Vec<AppPreview>,
    pub body: String,
    /// Posted on the Git host (else skipped, or no token for it).
    pub posted: bool,
    pub skipped: Option<&'static str>,
}

/// Previews `pull` and posts the result; counts and times it.
pub async fn run(ctx: &Context, pull: &PullRequest) -> Result<Report, PreviewError> {
    let started = Instant::now();
    let result = preview(ctx, pull).await;
    let outcome = match &result {
        Ok(report) if report.skipped.is_some() => "skipped",
        Ok(report) if report.previews.iter().any(|p| p.result.is_err()) => "failed",
        Ok(_) => "posted",
        Err(_) => "error",
    };
    ctx.metrics
        .previews
        .get_or_create(&PreviewLabels {
            provider: pull.provider.clone(),
            outcome: outcome.into(),
        })
        .inc();
    if outcome != "skipped" {
        ctx.metrics
            .preview_seconds
            .observe(started.elapsed().as_secs_f64());
    }
    result
}

async fn preview(ctx: &Context, pull: &PullRequest) -> Result<Report, PreviewError> {
    let previews = ctx.previews();
    if pull.fork && !previews.settings.forks {
        tracing::info!(pull = %pull.key(), "a fork's pull request; previews.forks is off");
        return Ok(Report {
            skipped: Some("fork"),
            ..Default::default()
        });
    }
    let apps = candidates(ctx, &pull.apps).await;
    let Some(first) = apps.first() else {
        return Err(PreviewError::NoApplication(
            pull.apps
                .iter()
                .map(AppKey::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        ));
    };
    // The base repository, as its Applications name it and with their
    // credentials (read as the first one's identity).
    let url = first.spec.source.repo_url.clone();
    let credentials = crate::reconcile::source_credentials(ctx, first)
        .await
        .map_err(|e| PreviewError::Credentials(Box::new(e)))?;
    ctx.git
        .fetch_pull_head(
            &url,
            credentials.as_ref(),
            &pull.head_ref,
            Some(&pull.head_sha),
        )
        .await?;
    let changed = ctx
        .git
        .changed_files(
            &url,
            &pull.base_branch,
            pull.base_sha.as_deref(),
            &pull.head_sha,
        )
        .await?;
    let sources: Vec<AppSource> = apps.iter().map(crate::ingest::source_of).collect();
    let selected = select::select(pull, &changed, &sources);
    tracing::info!(
        pull = %pull.key(),
        head = %pull.head_sha,
        changed = changed.len(),
        selected = selected.len(),
        "previewing"
    );
    let mut results: Vec<AppPreview> = futures::stream::iter(selected)
        .map(|routed| {
            let app = apps
                .iter()
                .find(|a| crate::ingest::key_of(a) == routed.key)
                .cloned();
            async move {
                let app = app.expect("selected among the candidates");
                render::preview_app(ctx, &app, &pull.head_sha, routed.input).await
            }
        })
        .buffer_unordered(APPS_AT_ONCE)
        .collect()
        .await;
    results.sort_by(|a, b| a.app.cmp(&b.app));
    let text = body::render(pull, &results, previews.settings.max_chars);
    let posted = match pull.provider.as_str() {
        "github" => match &previews.github {
            Some(client) => {
                github::publish(client, pull, &results, &text).await?;
                true
            }
            None => false,
        },
        "gitlab" => match &previews.gitlab {
            Some(client) => {
                client
                    .upsert(pull, body::MARKER, &text, !results.is_empty())
                    .await?;
                true
            }
            None => false,
        },
        _ => false,
    };
    if !posted {
        tracing::warn!(pull = %pull.key(), provider = %pull.provider, "no API token for this Git host: the preview is not posted");
    }
    if posted {
        previews_posted(ctx, pull, &apps, &results).await;
    }
    Ok(Report {
        changed_files: changed.len(),
        previews: results,
        body: text,
        posted,
        skipped: None,
    })
}

/// `PreviewPosted` on each previewed Application (an Event, and the
/// notifications of the Alerts that select it), once per head.
async fn previews_posted(
    ctx: &Context,
    pull: &PullRequest,
    apps: &[Application],
    results: &[AppPreview],
) {
    let source = format!("{}@{}", pull.key(), pull.head_sha);
    for result in results {
        let Some(app) = apps.iter().find(|a| crate::ingest::key_of(a) == result.app) else {
            continue;
        };
        let what = match &result.result {
            Ok(changes) if changes.is_empty() => "no change".to_string(),
            Ok(changes) => format!(
                "{} to create, {} to update, {} to prune",
                changes.creates.len(),
                changes.updates.len(),
                changes.prunes.len()
            ),
            Err(failure) => format!("{}: {}", failure.reason, failure.message),
        };
        let tap = ctx.notifier().map(|n| n.tap(app, Some(&source)));
        let events =
            crate::report::events::Events::new(ctx.client.clone(), ctx.reporter.clone(), app)
                .with_tap(tap);
        let note = format!(
            "preview of pull request #{} (head {}) posted: {what}",
            pull.number,
            &pull.head_sha[..pull.head_sha.len().min(7)]
        );
        events.normal("PreviewPosted", "Preview", note).await;
    }
}

/// The Applications named, from the watch's store when this process has
/// one, else from the API server; those gone since are left out.
async fn candidates(ctx: &Context, keys: &[AppKey]) -> Vec<Application> {
    let mut apps = Vec::with_capacity(keys.len());
    for key in keys {
        if let Some(store) = ctx.applications()
            && let Some(app) = store.get(&ObjectRef::new(&key.name).within(&key.namespace))
        {
            apps.push((*app).clone());
            continue;
        }
        let api: Api<Application> = Api::namespaced(ctx.client.clone(), &key.namespace);
        match api.get_opt(&key.name).await {
            Ok(Some(app)) => apps.push(app),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(app = %key, %error, "cannot read an Application to preview")
            }
        }
    }
    apps
}
