//! HorizontalPodAutoscalers, from their conditions as Argo CD reads them
//! (gitops-engine's `health_hpa.go`): the first condition whose type and
//! reason say it cannot get the scale or its metrics is Degraded, the first
//! that says it rescaled or is within range is Healthy; otherwise it is
//! Progressing ("waiting to autoscale"), as with no conditions yet.

use serde_json::Value;

use super::{Assessment, text, text_of};

/// (type, reason) pairs Argo CD reads as Degraded.
const DEGRADED: [(&str, &str); 4] = [
    ("AbleToScale", "FailedGetScale"),
    ("AbleToScale", "FailedUpdateScale"),
    ("ScalingActive", "FailedGetResourceMetric"),
    ("ScalingActive", "InvalidSelector"),
];

/// (type, reason) pairs Argo CD reads as Healthy.
const HEALTHY: [(&str, &str); 4] = [
    ("AbleToScale", "SucceededRescale"),
    ("ScalingLimited", "DesiredWithinRange"),
    ("ScalingLimited", "TooFewReplicas"),
    ("ScalingLimited", "TooManyReplicas"),
];

/// `status.conditions` (autoscaling/v2), else the conditions annotation an
/// autoscaling/v1 object carries.
fn conditions(live: &Value) -> Vec<Value> {
    if let Some(list) = live.pointer("/status/conditions").and_then(Value::as_array) {
        return list.clone();
    }
    text(
        live,
        "/metadata/annotations/autoscaling.alpha.kubernetes.io~1conditions",
    )
    .and_then(|raw| serde_json::from_str::<Vec<Value>>(raw).ok())
    .unwrap_or_default()
}

pub(super) fn horizontal_pod_autoscaler(live: &Value) -> Assessment {
    for condition in conditions(live) {
        let pair = (
            text_of(&condition, "type").unwrap_or_default(),
            text_of(&condition, "reason").unwrap_or_default(),
        );
        let message = text_of(&condition, "message").unwrap_or(pair.1).to_string();
        if DEGRADED.contains(&pair) {
            return Assessment::degraded(message);
        }
        if HEALTHY.contains(&pair) {
            return Assessment::healthy_because(message);
        }
    }
    Assessment::progressing("waiting to autoscale")
}
