//! Report: telling people what Setpoint did, outside the status: Events on
//! the Application, commit statuses on GitHub.

pub mod events;
pub mod github;
pub mod sync_status;
