//! The annotations that place an object in a sync (pure): Setpoint's own,
//! Argo CD's and Helm's, read as Argo CD reads them, so a repository written
//! for Argo CD (or a chart written for Helm) syncs unchanged. Where
//! Setpoint's and another's are both set on an object, Setpoint's wins;
//! Argo CD's wins over Helm's.
//!
//! | Setpoint | Argo CD | Helm |
//! |---|---|---|
//! | `setpoint.dev/sync-wave` | `argocd.argoproj.io/sync-wave` | `helm.sh/hook-weight` |
//! | `setpoint.dev/hook` | `argocd.argoproj.io/hook` | `helm.sh/hook` (`pre-install`, `pre-upgrade` → PreSync; `post-install`, `post-upgrade` → PostSync) |
//! | `setpoint.dev/hook-delete-policy` | `argocd.argoproj.io/hook-delete-policy` | `helm.sh/hook-delete-policy` |
//!
//! Values may be comma-separated lists (`PreSync,PostSync`,
//! `before-hook-creation,hook-succeeded`), as both document.

use serde_json::Value;

use crate::api::HookPhase;

pub const WAVE: [&str; 3] = [
    "setpoint.dev/sync-wave",
    "argocd.argoproj.io/sync-wave",
    "helm.sh/hook-weight",
];
pub const HOOK: [&str; 3] = [
    "setpoint.dev/hook",
    "argocd.argoproj.io/hook",
    "helm.sh/hook",
];
pub const DELETE_POLICY: [&str; 3] = [
    "setpoint.dev/hook-delete-policy",
    "argocd.argoproj.io/hook-delete-policy",
    "helm.sh/hook-delete-policy",
];
const HELM_HOOK: &str = "helm.sh/hook";
/// On a hook object named by Setpoint from `metadata.generateName`: the prefix.
pub const GENERATED_FROM: &str = "setpoint.dev/generate-name";

/// The first of `keys` that the object carries, and its value.
pub fn first<'a>(body: &'a Value, keys: &[&'static str]) -> Option<(&'static str, &'a str)> {
    let annotations = body.pointer("/metadata/annotations")?;
    keys.iter()
        .find_map(|&key| Some((key, annotations.get(key)?.as_str()?)))
}

/// Where an object's hook annotation puts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookAnnotation {
    /// No hook annotation (or Helm's `crd-install`): an ordinary object.
    None,
    /// Run at these phases of a sync (one object per phase).
    Phases(Vec<HookPhase>),
    /// Never applied by a sync: Argo CD's `Skip`, its deletion hooks
    /// (`PreDelete`, `PostDelete`), and Helm's hooks that have no sync
    /// equivalent (`pre-delete`, `post-delete`, `pre-rollback`,
    /// `post-rollback`, `test`).
    Skip,
}

/// A hook annotation value that is none of the known ones.
#[derive(Debug, PartialEq, Eq)]
pub struct Unknown {
    pub annotation: &'static str,
    pub value: String,
}

fn entries(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|v| !v.is_empty())
}

/// The phases (or skip) an object's hook annotation names.
pub fn hook(body: &Value) -> Result<HookAnnotation, Unknown> {
    let Some((annotation, value)) = first(body, &HOOK) else {
        return Ok(HookAnnotation::None);
    };
    let unknown = || Unknown {
        annotation,
        value: value.to_string(),
    };
    let mut phases = Vec::new();
    let mut skip = false;
    let mut ordinary = false;
    for entry in entries(value) {
        let phase = if annotation == HELM_HOOK {
            match entry {
                "pre-install" | "pre-upgrade" => Some(HookPhase::PreSync),
                "post-install" | "post-upgrade" => Some(HookPhase::PostSync),
                "crd-install" => {
                    ordinary = true;
                    None
                }
                "pre-delete" | "post-delete" | "pre-rollback" | "post-rollback" | "test"
                | "test-success" | "test-failure" => {
                    skip = true;
                    None
                }
                _ => return Err(unknown()),
            }
        } else {
            match entry {
                "PreSync" => Some(HookPhase::PreSync),
                "Sync" => Some(HookPhase::Sync),
                "PostSync" => Some(HookPhase::PostSync),
                "SyncFail" => Some(HookPhase::SyncFail),
                "Skip" | "PreDelete" | "PostDelete" => {
                    skip = true;
                    None
                }
                _ => return Err(unknown()),
            }
        };
        if let Some(phase) = phase
            && !phases.contains(&phase)
        {
            phases.push(phase);
        }
    }
    Ok(if !phases.is_empty() {
        HookAnnotation::Phases(phases)
    } else if skip {
        HookAnnotation::Skip
    } else if ordinary {
        HookAnnotation::None
    } else {
        return Err(unknown());
    })
}

/// When a hook's objects are deleted; several may be set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeletePolicy {
    /// The previous run's object is deleted before this run creates its own
    /// (the default when no policy is set, as in Argo CD).
    pub before_hook_creation: bool,
    pub hook_succeeded: bool,
    pub hook_failed: bool,
}

impl Default for DeletePolicy {
    fn default() -> Self {
        DeletePolicy {
            before_hook_creation: true,
            hook_succeeded: false,
            hook_failed: false,
        }
    }
}

/// The delete policy of a hook.
pub fn delete_policy(body: &Value) -> Result<DeletePolicy, Unknown> {
    let Some((annotation, value)) = first(body, &DELETE_POLICY) else {
        return Ok(DeletePolicy::default());
    };
    let mut policy = DeletePolicy {
        before_hook_creation: false,
        hook_succeeded: false,
        hook_failed: false,
    };
    for entry in entries(value) {
        match entry {
            "BeforeHookCreation" | "before-hook-creation" => policy.before_hook_creation = true,
            "HookSucceeded" | "hook-succeeded" => policy.hook_succeeded = true,
            "HookFailed" | "hook-failed" => policy.hook_failed = true,
            _ => {
                return Err(Unknown {
                    annotation,
                    value: value.to_string(),
                });
            }
        }
    }
    if policy
        == (DeletePolicy {
            before_hook_creation: false,
            hook_succeeded: false,
            hook_failed: false,
        })
    {
        return Ok(DeletePolicy::default());
    }
    Ok(policy)
}

/// Whether a live object is one of the hooks a sync creates: hooks are
/// never pruned as ordinary objects, and their changes are not drift.
pub fn is_hook(live: &Value) -> bool {
    matches!(hook(live), Ok(HookAnnotation::Phases(_)))
}

/// The wave annotation, when the object has one: its name and value.
pub fn wave(body: &Value) -> Option<(&'static str, &str)> {
    first(body, &WAVE)
}

/// The name of a hook object given only `metadata.generateName`: the prefix
/// and five characters that are new for each run of a sync (the run's
/// revision and start), so the object of an earlier run is another object.
pub fn generated_name(prefix: &str, revision: &str, run_started: &str, phase: HookPhase) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{revision}\n{run_started}\n{phase:?}\n{prefix}"));
    // Kubernetes' own suffixes use consonants and digits; so do these.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = digest
        .iter()
        .take(5)
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    let keep = prefix.len().min(63 - 5);
    format!("{}{suffix}", &prefix[..keep])
}

/// `metadata.generateName` of an object that has no `metadata.name`.
pub fn generate_name(body: &Value) -> Option<&str> {
    let metadata = body.get("metadata")?;
    if metadata.get("name").and_then(Value::as_str).is_some() {
        return None;
    }
    metadata
        .get("generateName")
        .and_then(Value::as_str)
        .filter(|g| !g.is_empty())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn with(annotations: Value) -> Value {
        json!({"metadata": {"name": "x", "annotations": annotations}})
    }

    #[test]
    fn argo_cd_and_helm_hooks_map_to_phases() {
        let cases = [
            (
                json!({"argocd.argoproj.io/hook": "PreSync"}),
                vec![HookPhase::PreSync],
            ),
            (
                json!({"argocd.argoproj.io/hook": "PreSync,PostSync"}),
                vec![HookPhase::PreSync, HookPhase::PostSync],
            ),
            (
                json!({"helm.sh/hook": "pre-install,pre-upgrade"}),
                vec![HookPhase::PreSync],
            ),
            (
                json!({"helm.sh/hook": "post-install, post-upgrade"}),
                vec![HookPhase::PostSync],
            ),
            // Setpoint's wins over Argo CD's, Argo CD's over Helm's.
            (
                json!({"setpoint.dev/hook": "SyncFail", "argocd.argoproj.io/hook": "PreSync"}),
                vec![HookPhase::SyncFail],
            ),
            (
                json!({"argocd.argoproj.io/hook": "Sync", "helm.sh/hook": "pre-install"}),
                vec![HookPhase::Sync],
            ),
        ];
        for (annotations, phases) in cases {
            assert_eq!(
                hook(&with(annotations.clone())),
                Ok(HookAnnotation::Phases(phases)),
                "{annotations}"
            );
        }
    }

    #[test]
    fn skipped_and_ordinary_hooks() {
        for skip in [
            json!({"argocd.argoproj.io/hook": "Skip"}),
            json!({"argocd.argoproj.io/hook": "PostDelete"}),
            json!({"helm.sh/hook": "test"}),
            json!({"helm.sh/hook": "pre-delete"}),
        ] {
            assert_eq!(hook(&with(skip)), Ok(HookAnnotation::Skip));
        }
        assert_eq!(
            hook(&with(json!({"helm.sh/hook": "crd-install"}))),
            Ok(HookAnnotation::None)
        );
        assert_eq!(hook(&with(json!({}))), Ok(HookAnnotation::None));
        assert!(!is_hook(&with(json!({"helm.sh/hook": "crd-install"}))));
        assert!(is_hook(&with(json!({"helm.sh/hook": "post-install"}))));
        let bad = hook(&with(json!({"argocd.argoproj.io/hook": "PreSink"}))).unwrap_err();
        assert_eq!(bad.annotation, "argocd.argoproj.io/hook");
        assert_eq!(bad.value, "PreSink");
        assert!(hook(&with(json!({"helm.sh/hook": "pre-instal"}))).is_err());
    }

    #[test]
    fn delete_policies_combine() {
        assert_eq!(delete_policy(&with(json!({}))), Ok(DeletePolicy::default()));
        let helm = delete_policy(&with(
            json!({"helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded"}),
        ))
        .unwrap();
        assert!(helm.before_hook_creation && helm.hook_succeeded && !helm.hook_failed);
        let argo = delete_policy(&with(
            json!({"argocd.argoproj.io/hook-delete-policy": "HookFailed"}),
        ))
        .unwrap();
        assert!(!argo.before_hook_creation && argo.hook_failed);
        assert!(
            delete_policy(&with(
                json!({"argocd.argoproj.io/hook-delete-policy": "Never"})
            ))
            .is_err()
        );
    }

    #[test]
    fn waves_come_from_the_first_family_that_has_one() {
        assert_eq!(
            wave(&with(json!({"helm.sh/hook-weight": "-5"}))),
            Some(("helm.sh/hook-weight", "-5"))
        );
        assert_eq!(
            wave(&with(
                json!({"argocd.argoproj.io/sync-wave": "2", "setpoint.dev/sync-wave": "1"})
            )),
            Some(("setpoint.dev/sync-wave", "1"))
        );
    }

    #[test]
    fn generated_names_are_new_for_each_run() {
        let a = generated_name(
            "migrate-",
            "abc",
            "2026-12-07T08:00:00.000Z",
            HookPhase::PreSync,
        );
        let b = generated_name(
            "migrate-",
            "abc",
            "2026-12-07T08:05:00.000Z",
            HookPhase::PreSync,
        );
        let again = generated_name(
            "migrate-",
            "abc",
            "2026-12-07T08:00:00.000Z",
            HookPhase::PreSync,
        );
        assert!(
            a.starts_with("migrate-") && a.len() == "migrate-".len() + 5,
            "{a}"
        );
        assert_ne!(a, b);
        assert_eq!(a, again);
        let long = "x".repeat(70);
        assert_eq!(generated_name(&long, "r", "t", HookPhase::Sync).len(), 63);
        assert_eq!(
            generate_name(&json!({"metadata": {"generateName": "job-"}})),
            Some("job-")
        );
        assert_eq!(
            generate_name(&json!({"metadata": {"name": "j", "generateName": "job-"}})),
            None
        );
    }
}
