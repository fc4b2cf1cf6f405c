//! ApplicationSets in tests: create one, the Applications it owns, its
//! status and Ready condition, and labels of the Applications.
#![allow(dead_code)]

use kube::ResourceExt;
use kube::api::PostParams;
use setpoint::api::{
    Application, ApplicationSet, ApplicationSetStatus, ConditionStatus, ConditionType,
};

use super::TestNamespace;

pub async fn create_set(ns: &TestNamespace, set: &ApplicationSet) {
    ns.api::<ApplicationSet>()
        .create(&PostParams::default(), set)
        .await
        .unwrap_or_else(|e| panic!("create ApplicationSet: {e}"));
}

/// The names of the Applications of `ns` that `set` owns, sorted.
pub async fn owned(ns: &TestNamespace, set: &str) -> Vec<String> {
    let apps = ns
        .api::<Application>()
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut names: Vec<String> = apps
        .iter()
        .filter(|app| {
            app.owner_references()
                .iter()
                .any(|r| r.kind == "ApplicationSet" && r.name == set)
        })
        .map(|app| app.name_any())
        .collect();
    names.sort();
    names
}

/// `Ok` once the set owns exactly `names` (sorted).
pub async fn owns_exactly(ns: &TestNamespace, set: &str, names: &[&str]) -> Result<(), String> {
    let owned = owned(ns, set).await;
    (owned == names).then_some(()).ok_or(format!("{owned:?}"))
}

pub async fn set_status(ns: &TestNamespace, name: &str) -> ApplicationSetStatus {
    ns.api::<ApplicationSet>()
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

/// `Ok((reason, message))` once the set's Ready condition has `status`.
pub async fn ready(
    ns: &TestNamespace,
    name: &str,
    status: ConditionStatus,
) -> Result<(String, String), String> {
    let set = set_status(ns, name).await;
    match set
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Ready)
    {
        Some(c) if c.status == status => Ok((c.reason.clone(), c.message.clone())),
        other => Err(format!("{other:?}")),
    }
}

pub fn label<'a>(app: &'a Application, key: &str) -> Option<&'a str> {
    app.labels().get(key).map(String::as_str)
}
