//! Sync options (pure), as Argo CD documents them: for every object of an
//! Application in `spec.syncPolicy.syncOptions`, and for one object in its
//! `setpoint.dev/sync-options` or `argocd.argoproj.io/sync-options`
//! annotation (comma-separated `Key=value`; the object's win over the
//! Application's, Setpoint's annotation over Argo CD's). Helm's
//! `helm.sh/resource-policy: keep` is `Delete=false`, as in Argo CD.
//! `argocd.argoproj.io/compare-options: IgnoreExtraneous` (or Setpoint's
//! `setpoint.dev/compare-options`) keeps an object that Git no longer has
//! from making its Application OutOfSync.

use serde_json::Value;

use super::annotations::first;

pub const SYNC_OPTIONS: [&str; 2] = [
    "setpoint.dev/sync-options",
    "argocd.argoproj.io/sync-options",
];
pub const COMPARE_OPTIONS: [&str; 2] = [
    "setpoint.dev/compare-options",
    "argocd.argoproj.io/compare-options",
];
const HELM_RESOURCE_POLICY: &str = "helm.sh/resource-policy";

/// The options Setpoint knows, for the error message.
const KNOWN: &str = "Prune, Delete, Replace, ServerSideApply, Validate, \
    SkipDryRunOnMissingResource, CreateNamespace, PruneLast, ApplyOutOfSyncOnly, \
    RespectIgnoreDifferences, FailOnSharedResource, PrunePropagationPolicy";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OptionsError {
    #[error("{place}: sync option {entry:?} is not Key=value (known keys: {KNOWN})")]
    Malformed { place: String, entry: String },
    #[error("{place}: unknown sync option {key:?} (known: {KNOWN})")]
    Unknown { place: String, key: String },
    #[error("{place}: sync option {key}={value:?} is not one of {allowed}")]
    BadValue {
        place: String,
        key: String,
        value: String,
        allowed: &'static str,
    },
}

/// When an object Git no longer has is deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Prune {
    #[default]
    Yes,
    /// `Prune=false`: never; the object is left and reported.
    No,
    /// `Prune=confirm`: only by a sync someone asked for.
    Confirm,
}

/// How a prune deletes (`PrunePropagationPolicy`).
/// Setpoint's default is `background` (Argo CD's is `foreground`): a
/// pruned object is gone at once, its dependents removed after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Propagation {
    Foreground,
    #[default]
    Background,
    Orphan,
}

/// The options that apply to one object (or, before the object's own, to
/// every object of an Application).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub prune: Prune,
    /// `Delete=false`: kept when its Application is deleted.
    pub delete: bool,
    /// `Replace=true`: replaced (PUT, or created) instead of applied.
    pub replace: bool,
    /// `Validate=false`: the API server does not reject unknown fields.
    pub validate: bool,
    /// `SkipDryRunOnMissingResource=true`: a kind the server does not serve
    /// yet (its CRD comes from elsewhere) is not an error before the apply.
    pub skip_dry_run_on_missing: bool,
    /// `CreateNamespace=true` (Application-level): the destination
    /// namespace is created when missing.
    pub create_namespace: bool,
    pub propagation: Propagation,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            prune: Prune::Yes,
            delete: true,
            replace: false,
            validate: true,
            skip_dry_run_on_missing: false,
            create_namespace: false,
            propagation: Propagation::Background,
        }
    }
}

fn boolean(place: &str, key: &str, value: &str) -> Result<bool, OptionsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(OptionsError::BadValue {
            place: place.to_string(),
            key: key.to_string(),
            value: value.to_string(),
            allowed: "true, false",
        }),
    }
}

/// `entries` laid over `base`; `place` names where they came from.
pub fn parse<'a>(
    base: Options,
    entries: impl IntoIterator<Item = &'a str>,
    place: &str,
) -> Result<Options, OptionsError> {
    let mut options = base;
    for entry in entries.into_iter().map(str::trim).filter(|e| !e.is_empty()) {
        let Some((key, value)) = entry.split_once('=') else {
            return Err(OptionsError::Malformed {
                place: place.to_string(),
                entry: entry.to_string(),
            });
        };
        let (key, value) = (key.trim(), value.trim());
        let bad = |allowed| OptionsError::BadValue {
            place: place.to_string(),
            key: key.to_string(),
            value: value.to_string(),
            allowed,
        };
        match key {
            "Prune" => {
                options.prune = match value.to_ascii_lowercase().as_str() {
                    "true" => Prune::Yes,
                    "false" => Prune::No,
                    "confirm" => Prune::Confirm,
                    _ => return Err(bad("true, false, confirm")),
                }
            }
            "Delete" => {
                options.delete = match value.to_ascii_lowercase().as_str() {
                    "true" => true,
                    // Kept unless someone deletes it by hand: the safe
                    // reading of "ask first".
                    "false" | "confirm" => false,
                    _ => return Err(bad("true, false, confirm")),
                }
            }
            "Replace" => options.replace = boolean(place, key, value)?,
            "Validate" => options.validate = boolean(place, key, value)?,
            "SkipDryRunOnMissingResource" => {
                options.skip_dry_run_on_missing = boolean(place, key, value)?
            }
            "CreateNamespace" => options.create_namespace = boolean(place, key, value)?,
            "PrunePropagationPolicy" => {
                options.propagation = match value.to_ascii_lowercase().as_str() {
                    "foreground" => Propagation::Foreground,
                    "background" => Propagation::Background,
                    "orphan" => Propagation::Orphan,
                    _ => return Err(bad("foreground, background, orphan")),
                }
            }
            // What Setpoint always does: server-side apply, prunes after
            // every wave is applied, applies only what differs, leaves out
            // ignored fields, refuses another Application's objects.
            "ServerSideApply"
            | "PruneLast"
            | "ApplyOutOfSyncOnly"
            | "RespectIgnoreDifferences"
            | "FailOnSharedResource" => {
                boolean(place, key, value)?;
            }
            _ => {
                return Err(OptionsError::Unknown {
                    place: place.to_string(),
                    key: key.to_string(),
                });
            }
        }
    }
    Ok(options)
}

/// The Application's options (`spec.syncPolicy.syncOptions`).
pub fn of_application(list: &[String]) -> Result<Options, OptionsError> {
    parse(
        Options::default(),
        list.iter().map(String::as_str),
        "spec.syncPolicy.syncOptions",
    )
}

/// One object's options: the Application's, then Argo CD's annotation, then
/// Setpoint's. `object` names it in an error.
pub fn of_object(app: Options, body: &Value, object: &str) -> Result<Options, OptionsError> {
    let mut options = app;
    if first(body, &[HELM_RESOURCE_POLICY]).map(|(_, v)| v.trim()) == Some("keep") {
        options.delete = false;
    }
    for key in SYNC_OPTIONS.iter().rev() {
        if let Some((_, value)) = first(body, &[*key]) {
            options = parse(options, value.split(','), &format!("{object} ({key})"))?;
        }
    }
    Ok(options)
}

/// The options a live object carries (an unreadable annotation reads as
/// none: a live object cannot be refused, only reported).
pub fn of_live(app: Options, live: &Value) -> Options {
    of_object(app, live, "").unwrap_or(app)
}

/// `IgnoreExtraneous` on a live object.
pub fn ignores_extraneous(live: &Value) -> bool {
    COMPARE_OPTIONS.iter().any(|key| {
        first(live, &[*key]).is_some_and(|(_, v)| {
            v.split(',')
                .any(|o| o.trim().eq_ignore_ascii_case("IgnoreExtraneous"))
        })
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(annotations: Value) -> Value {
        json!({"metadata": {"name": "x", "annotations": annotations}})
    }

    #[test]
    fn application_options_are_read_and_checked() {
        let options = of_application(&[
            "CreateNamespace=true".into(),
            "PruneLast=true".into(),
            "ServerSideApply=true".into(),
            "PrunePropagationPolicy=background".into(),
        ])
        .unwrap();
        assert!(options.create_namespace);
        assert_eq!(options.propagation, Propagation::Background);
        let unknown = of_application(&["Prunelast=true".into()]).unwrap_err();
        assert!(
            unknown
                .to_string()
                .starts_with("spec.syncPolicy.syncOptions: unknown sync option \"Prunelast\""),
            "{unknown}"
        );
        assert!(matches!(
            of_application(&["CreateNamespace".into()]),
            Err(OptionsError::Malformed { .. })
        ));
        assert!(matches!(
            of_application(&["Replace=yes".into()]),
            Err(OptionsError::BadValue { .. })
        ));
    }

    #[test]
    fn the_object_wins_and_setpoint_wins_over_argo_cd() {
        let app = of_application(&["Validate=false".into()]).unwrap();
        let options = of_object(
            app,
            &body(json!({
                "argocd.argoproj.io/sync-options": "Prune=false,Replace=true",
                "setpoint.dev/sync-options": "Replace=false",
            })),
            "ConfigMap/x",
        )
        .unwrap();
        assert_eq!(options.prune, Prune::No);
        assert!(!options.replace, "Setpoint's annotation wins");
        assert!(
            !options.validate,
            "the Application's applies when the object says nothing"
        );
        let bad = of_object(
            app,
            &body(json!({"argocd.argoproj.io/sync-options": "Prune=never"})),
            "ConfigMap/x",
        )
        .unwrap_err();
        assert!(
            bad.to_string().starts_with(
                "ConfigMap/x (argocd.argoproj.io/sync-options): sync option Prune=\"never\""
            ),
            "{bad}"
        );
        assert_eq!(
            of_live(
                Options::default(),
                &body(json!({"argocd.argoproj.io/sync-options": "x"}))
            ),
            Options::default()
        );
    }

    #[test]
    fn helm_keep_is_delete_false_and_extraneous_is_read() {
        let keep = of_object(
            Options::default(),
            &body(json!({"helm.sh/resource-policy": "keep"})),
            "x",
        )
        .unwrap();
        assert!(!keep.delete);
        assert!(ignores_extraneous(&body(
            json!({"argocd.argoproj.io/compare-options": "IgnoreExtraneous"})
        )));
        assert!(!ignores_extraneous(&body(json!({}))));
    }
}
