//! Kinds read from one condition or their phase, and any other kind by the
//! conditions convention kstatus reads.

use serde_json::Value;

use super::{Assessment, condition, explain, is_true, reason, text, text_of};

pub(super) fn persistent_volume_claim(live: &Value) -> Assessment {
    match text(live, "/status/phase") {
        Some("Bound") => Assessment::healthy(),
        Some("Lost") => Assessment::degraded("the claim lost its volume"),
        phase => Assessment::progressing(format!("claim is {}", phase.unwrap_or("Pending"))),
    }
}

pub(super) fn namespace(live: &Value) -> Assessment {
    if text(live, "/status/phase") == Some("Terminating") {
        return Assessment::progressing("terminating");
    }
    Assessment::healthy()
}

/// As Argo CD: Available is Healthy; not Available (its service has no
/// ready endpoints, the aggregated server does not answer) is Progressing,
/// with the condition's message.
pub(super) fn api_service(live: &Value) -> Assessment {
    match condition(live, "Available") {
        Some(available) if is_true(available) => Assessment::healthy(),
        Some(available) => Assessment::progressing(explain(available, "not available")),
        None => Assessment::progressing("waiting for the APIService to be available"),
    }
}

/// Its kind can be used once Established; names that clash with another CRD
/// never will be.
pub(super) fn custom_resource_definition(live: &Value) -> Assessment {
    if let Some(names) = condition(live, "NamesAccepted")
        && text_of(names, "status") == Some("False")
    {
        return Assessment::degraded(explain(names, "names not accepted"));
    }
    if condition(live, "Established").is_some_and(is_true) {
        return Assessment::healthy();
    }
    Assessment::progressing("waiting for the CRD to be established")
}

/// Any other kind, by the conditions convention kstatus reads (`Ready`,
/// `Stalled`, `Reconciling`, as Flux and most operators set them). An object
/// without conditions, like a ConfigMap, has no notion of health: Healthy.
pub(super) fn by_conditions(live: &Value) -> Assessment {
    if let Some(stalled) = condition(live, "Stalled")
        && is_true(stalled)
    {
        return Assessment::degraded(explain(stalled, "stalled"));
    }
    if let Some(ready) = condition(live, "Ready") {
        return match text_of(ready, "status") {
            Some("True") => Assessment::healthy(),
            Some("False")
                if ["Failed", "Error"]
                    .iter()
                    .any(|w| reason(ready).contains(w)) =>
            {
                Assessment::degraded(explain(ready, "not ready"))
            }
            _ => Assessment::progressing(explain(ready, "not ready")),
        };
    }
    if let Some(reconciling) = condition(live, "Reconciling")
        && is_true(reconciling)
    {
        return Assessment::progressing(explain(reconciling, "reconciling"));
    }
    Assessment::healthy()
}
