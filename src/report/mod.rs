//! Report: telling people what Setpoint did, outside the status: Events on
//! the Application, commit statuses on GitHub and GitLab.

pub mod events;
pub mod github;
pub mod gitlab;
pub mod sync_status;

/// Where the reconcile's commit statuses go: GitHub's and GitLab's, each
/// when its token is configured. An Application's repository gets the one
/// whose host it is on (`reconcile::commit_status` picks), others none.
#[derive(Clone, Default)]
pub struct CommitStatuses {
    pub github: Option<github::CommitStatuses>,
    pub gitlab: Option<gitlab::CommitStatuses>,
}
