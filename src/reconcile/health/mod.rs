//! Health: after the apply, how each live object is doing, read from its
//! `status` the way Argo CD's health checks (and kstatus) read it. An
//! Application is as healthy as its worst object. Pure: it looks at one live
//! object's JSON, so each rule is a unit test on a realistic status.
//!
//! One file per family of kinds: `workloads.rs` (Deployment, StatefulSet,
//! DaemonSet, ReplicaSet, Pod), `batch.rs` (Job, CronJob), `network.rs`
//! (Service, Ingress), `autoscaling.rs` (HorizontalPodAutoscaler),
//! `conditions.rs` (the kinds read from their conditions or phase, and any
//! other kind), and `cel.rs`: custom rules in CEL (Flux's
//! `healthCheckExprs`) from the configuration and the Application, which
//! replace the built-in rule of their kind.

use serde_json::Value;

use crate::api::Health;

mod autoscaling;
mod batch;
pub mod cel;
mod conditions;
mod network;
mod workloads;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_argo;

pub use cel::{CelError, RuleCache, Rules};

/// One object's health, with a short reason a person can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    pub status: Health,
    pub message: Option<String>,
}

impl Assessment {
    fn healthy() -> Assessment {
        Assessment {
            status: Health::Healthy,
            message: None,
        }
    }

    fn with(status: Health, message: impl Into<String>) -> Assessment {
        Assessment {
            status,
            message: Some(short(message.into())),
        }
    }

    fn healthy_because(message: impl Into<String>) -> Assessment {
        Assessment::with(Health::Healthy, message)
    }

    fn suspended(message: impl Into<String>) -> Assessment {
        Assessment::with(Health::Suspended, message)
    }

    fn progressing(message: impl Into<String>) -> Assessment {
        Assessment::with(Health::Progressing, message)
    }

    fn degraded(message: impl Into<String>) -> Assessment {
        Assessment::with(Health::Degraded, message)
    }
}

/// The Application's health: its worst object's, Healthy when it has none.
/// Suspended is just worse than Healthy, so an Application whose worst
/// object is a paused Deployment is Suspended.
pub fn worst(items: impl IntoIterator<Item = Health>) -> Health {
    items.into_iter().max().unwrap_or(Health::Healthy)
}

/// The health of one live object of the given API group and kind, by the
/// built-in rules.
pub fn assess(group: &str, kind: &str, live: &Value) -> Assessment {
    assess_with(&Rules::default(), group, kind, live)
}

/// The same, where a custom rule of `rules` for the group and kind replaces
/// the built-in one.
pub fn assess_with(rules: &Rules, group: &str, kind: &str, live: &Value) -> Assessment {
    if live
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null())
    {
        return Assessment::progressing("being deleted");
    }
    // A status that predates the last spec change says nothing about it
    // (Flux's CEL rules check the same before their expressions).
    if let (Some(generation), Some(observed)) = (
        int(live, "/metadata/generation"),
        int(live, "/status/observedGeneration"),
    ) && generation > observed
    {
        return Assessment::progressing(format!(
            "waiting for the controller to observe generation {generation}"
        ));
    }
    if let Some(rule) = rules.get(group, kind) {
        return rule.assess(live);
    }
    match (group, kind) {
        ("apps", "Deployment") => workloads::deployment(live),
        ("apps", "StatefulSet") => workloads::stateful_set(live),
        ("apps", "DaemonSet") => workloads::daemon_set(live),
        ("apps", "ReplicaSet") => workloads::replica_set(live),
        ("", "Pod") => workloads::pod(live),
        ("batch", "Job") => batch::job(live),
        ("batch", "CronJob") => batch::cron_job(live),
        ("autoscaling", "HorizontalPodAutoscaler") => autoscaling::horizontal_pod_autoscaler(live),
        ("", "Service") => network::service(live),
        ("networking.k8s.io" | "extensions", "Ingress") => network::ingress(live),
        ("", "PersistentVolumeClaim") => conditions::persistent_volume_claim(live),
        ("", "Namespace") => conditions::namespace(live),
        ("apiregistration.k8s.io", "APIService") => conditions::api_service(live),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            conditions::custom_resource_definition(live)
        }
        _ => conditions::by_conditions(live),
    }
}

/// The rules the configuration declares (`health.checks`), compiled once at
/// start (`configure`); none until then.
pub fn configured() -> std::sync::Arc<Rules> {
    cel::configured()
}

/// Compiles the configuration's rules (`SETPOINT_HEALTH_CHECKS`, JSON, as
/// `config.rs` writes it from `health.checks`) and keeps them for the
/// process: a broken expression is an error naming its kind and field.
pub fn configure_from_env() -> Result<usize, CelError> {
    cel::configure_from_env()
}

/// Health by the configuration's rules, then the built-in ones: for the
/// watches, which compare an object's health with the last one seen.
pub fn assess_configured(group: &str, kind: &str, live: &Value) -> Assessment {
    assess_with(&cel::configured(), group, kind, live)
}

fn condition<'a>(live: &'a Value, kind: &str) -> Option<&'a Value> {
    live.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| text_of(c, "type") == Some(kind))
}

fn is_true(condition: &Value) -> bool {
    text_of(condition, "status") == Some("True")
}

fn reason(condition: &Value) -> &str {
    text_of(condition, "reason").unwrap_or_default()
}

/// A condition's message, else its reason, else the fallback.
fn explain(condition: &Value, fallback: &str) -> String {
    text_of(condition, "message")
        .filter(|m| !m.is_empty())
        .or_else(|| text_of(condition, "reason").filter(|r| !r.is_empty()))
        .unwrap_or(fallback)
        .to_string()
}

fn int(live: &Value, pointer: &str) -> Option<i64> {
    live.pointer(pointer)?.as_i64()
}

/// A status counter: Kubernetes omits zeros.
fn count(live: &Value, pointer: &str) -> i64 {
    int(live, pointer).unwrap_or(0)
}

fn text<'a>(live: &'a Value, pointer: &str) -> Option<&'a str> {
    live.pointer(pointer)?.as_str()
}

fn text_of<'a>(value: &'a Value, field: &str) -> Option<&'a str> {
    value.get(field)?.as_str()
}

fn flag(live: &Value, pointer: &str) -> bool {
    live.pointer(pointer).and_then(Value::as_bool) == Some(true)
}

/// Health messages go into the Application's status and printer columns:
/// one line, a couple hundred characters at most.
const MAX_MESSAGE: usize = 200;

fn short(message: String) -> String {
    let line = message.lines().next().unwrap_or_default().trim();
    if line.chars().count() <= MAX_MESSAGE {
        return line.to_string();
    }
    let mut cut: String = line.chars().take(MAX_MESSAGE - 1).collect();
    cut.push('…');
    cut
}
