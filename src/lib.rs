//! Setpoint: a GitOps reconciler. Git holds the desired state of a
//! Kubernetes cluster; Setpoint keeps the live cluster equal to it.
//!
//! The modules follow one event through the loop: `api` (the Application
//! resource), `source` (Git and rendering), `reconcile` (plan, apply, prune,
//! health, status), `report` (Events, GitHub commit statuses and webhook
//! redelivery). See ARCHITECTURE.md.

pub mod api;
pub mod appset;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod context;
pub mod event;
pub mod import;
pub mod ingest;
pub mod logging;
pub mod manifest;
pub mod metrics;
pub mod notify;
pub mod operate;
pub mod preview;
pub mod queue;
pub mod reconcile;
pub mod report;
pub mod secret;
pub mod serve;
pub mod source;
pub mod tenancy;
pub mod ui;
pub mod worker;
