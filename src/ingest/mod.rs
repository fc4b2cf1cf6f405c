//! Ingest: where reconcile events come from. `webhook` (pushes announced by
//! GitHub and GitLab), `watch` (live objects and Applications changing), and
//! `sweep` (every Application, slowly, in case an event was missed).

pub mod sweep;
pub mod watch;
