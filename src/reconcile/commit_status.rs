//! Commit statuses for a reconcile: `pending` when the sync of a new
//! revision starts, its ending when the reconcile ends (the decision is
//! `report::sync_status`, pure; this is the glue to the reconcile), on
//! GitHub or GitLab, whichever host the Application's repository is on.

use crate::api::{Application, ConditionStatus, ConditionType, RunPhase};
use crate::context::Context;
use crate::report::events::error_chain;
use crate::report::github::{self, State};
use crate::report::{gitlab, sync_status};

use super::status::short;
use super::{Outcome, ReconcileError, Request};

/// The service that posts `app`'s commit statuses: the configured host
/// its repository is on.
enum Poster<'a> {
    GitHub(&'a github::CommitStatuses),
    GitLab(&'a gitlab::CommitStatuses),
}

impl Poster<'_> {
    /// Posts `state` in the background; never fails the sync.
    fn post(&self, app: &Application, revision: &str, state: State, description: &str) {
        match self {
            Poster::GitHub(statuses) => {
                sync_status::post(statuses, app, revision, state, description);
            }
            Poster::GitLab(statuses) => {
                match statuses.status_for(app, revision, state.into(), description) {
                    Ok(status) => statuses.spawn_post(status),
                    Err(error) => tracing::debug!(%error, "no commit status"),
                }
            }
        }
    }
}

/// Whether this sync of `revision` gets commit statuses (see
/// `report::sync_status`), and the service that posts them. GitHub is asked
/// first: a repository on neither host gets none.
fn commit_statuses<'a>(
    ctx: &'a Context,
    app: &Application,
    request: &Request,
    revision: &str,
) -> Option<Poster<'a>> {
    let statuses = &ctx.commit_statuses;
    let repo_url = &app.spec.source.repo_url;
    let github = statuses
        .github
        .as_ref()
        .filter(|github| github::github_repo(repo_url, github.api_url()).is_some())
        .map(Poster::GitHub);
    let poster = github.or_else(|| {
        statuses
            .gitlab
            .as_ref()
            .filter(|gitlab| gitlab.serves(app))
            .map(Poster::GitLab)
    })?;
    let sight = sync_status::Sight {
        revision,
        announced: request.known_commit.as_deref(),
        manual: request.manual,
    };
    sync_status::announces(app, sight).then_some(poster)
}

pub(super) fn pending(ctx: &Context, app: &Application, request: &Request, revision: &str) {
    if let Some(poster) = commit_statuses(ctx, app, request, revision) {
        let description = format!("Syncing {}", short(Some(revision)));
        poster.post(app, revision, State::Pending, &description);
    }
}

/// The status that follows the pending one, decided on the same (unchanged)
/// Application, so that every pending gets its ending.
pub(super) fn ending(
    ctx: &Context,
    app: &Application,
    request: &Request,
    revision: Option<&str>,
    result: &Result<Outcome, ReconcileError>,
) {
    let Some(revision) = revision else { return };
    let Some(poster) = commit_statuses(ctx, app, request, revision) else {
        return;
    };
    let message;
    let ended = match result {
        Ok(outcome) => {
            let condition = |type_| {
                outcome
                    .status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == type_ && c.status == ConditionStatus::True)
            };
            let ready = outcome
                .status
                .conditions
                .iter()
                .find(|c| c.type_ == ConditionType::Ready)
                .map_or("", |c| c.message.as_str());
            // An ordered sync of this revision that has not finished.
            let run = outcome
                .status
                .sync_run
                .as_ref()
                .filter(|run| run.revision == revision);
            let held = match (run, condition(ConditionType::Stalled)) {
                (Some(run), Some(stalled)) if run.phase == RunPhase::Failed => {
                    Some(sync_status::Held::Failed {
                        reason: &stalled.reason,
                    })
                }
                (Some(run), None) if !run.phase.is_finished() => Some(sync_status::Held::Waiting),
                _ => None,
            };
            Ok(sync_status::Done {
                sync: outcome.status.sync.status,
                applied: outcome.applied.len(),
                pruned: outcome.pruned.len(),
                message: ready,
                held,
            })
        }
        Err(error) => {
            message = error_chain(error);
            Err(sync_status::Failed {
                transient: error.is_transient(),
                reason: error.reason(),
                message: &message,
            })
        }
    };
    let (state, description) = sync_status::ending(ended);
    poster.post(app, revision, state, &description);
}
