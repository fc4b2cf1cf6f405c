//! Services and Ingresses: as Argo CD, a load balancer is Progressing until
//! it has an address. A local cluster without a load balancer controller
//! (kind, kwok) never assigns one, so such objects stay Progressing there,
//! as they do in Argo CD.

use serde_json::Value;

use super::{Assessment, text};

fn has_address(live: &Value) -> bool {
    live.pointer("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .is_some_and(|entries| !entries.is_empty())
}

pub(super) fn service(live: &Value) -> Assessment {
    if text(live, "/spec/type") == Some("LoadBalancer") && !has_address(live) {
        return Assessment::progressing("waiting for a load balancer address");
    }
    Assessment::healthy()
}

pub(super) fn ingress(live: &Value) -> Assessment {
    if !has_address(live) {
        return Assessment::progressing("waiting for the ingress controller to assign an address");
    }
    Assessment::healthy()
}
