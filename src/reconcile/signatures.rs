//! `spec.source.verify` in a reconcile, right after the checkout resolved
//! its commit: the Secret of trusted keys (read as the Application's
//! identity), the Git source's verification of the commit or tag
//! (`source/git/verify.rs`), and the record the status keeps of who signed.
//! A namespace's default (`source.verify` in the configuration) stands in
//! for an Application that sets none.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Serialize};

use crate::api::{Application, SignatureRecord, SignatureType, Verify, VerifyMode};
use crate::context::Context;
use crate::source::git::Credentials;
use crate::source::git::verify::{self, Keys, SignatureKind, VerifyError, VerifyRequest};

use super::ReconcileError;

/// The variable `config.rs` writes `source.verify` to, as JSON.
pub const ENV: &str = "SETPOINT_VERIFY_DEFAULTS";

/// One namespace's default `spec.source.verify`; namespace `*` is every
/// namespace that has none of its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceDefault {
    pub namespace: String,
    #[serde(flatten)]
    pub verify: Verify,
}

static DEFAULTS: OnceLock<Vec<NamespaceDefault>> = OnceLock::new();

/// Reads `SETPOINT_VERIFY_DEFAULTS` once at start (the first call wins);
/// how many namespaces it covers.
pub fn configure_from_env() -> Result<usize, String> {
    let defaults = match std::env::var(ENV) {
        Ok(text) if !text.trim().is_empty() => {
            parse_defaults(&text).map_err(|e| format!("{ENV}: {e}"))?
        }
        _ => Vec::new(),
    };
    let count = defaults.len();
    let _ = DEFAULTS.set(defaults);
    Ok(count)
}

/// The defaults as `config.rs` and `configure_from_env` read them: a
/// namespace named twice, or an empty one, is an error.
pub fn parse_defaults(json: &str) -> Result<Vec<NamespaceDefault>, String> {
    let defaults: Vec<NamespaceDefault> = serde_json::from_str(json)
        .map_err(|e| format!("expected a list of {{namespace, mode, secretRef: {{name}}}}: {e}"))?;
    for (i, default) in defaults.iter().enumerate() {
        if default.namespace.trim().is_empty() || default.verify.secret_ref.name.trim().is_empty() {
            return Err(format!("entry {i} needs a namespace and secretRef.name"));
        }
        if defaults[..i]
            .iter()
            .any(|d| d.namespace == default.namespace)
        {
            return Err(format!("namespace {} is named twice", default.namespace));
        }
    }
    Ok(defaults)
}

/// The verification `app` asks for: its own, else its namespace's default,
/// else `*`'s.
pub fn effective<'a>(app: &'a Application, defaults: &'a [NamespaceDefault]) -> Option<&'a Verify> {
    if let Some(verify) = &app.spec.source.verify {
        return Some(verify);
    }
    let namespace = app.namespace().unwrap_or_default();
    defaults
        .iter()
        .find(|d| d.namespace == namespace)
        .or_else(|| defaults.iter().find(|d| d.namespace == "*"))
        .map(|d| &d.verify)
}

/// The tag whose signature counts, or `None` for the commit's own. A pin
/// (`setpoint app rollback`) names a commit: under `mode: tag` the tag it
/// was applied through (its history entry's) is verified again, and a pin
/// to a commit never applied through a tag must be signed itself.
pub fn tag_to_verify(verify: &Verify, app: &Application) -> Result<Option<String>, VerifyError> {
    if verify.mode == VerifyMode::Head {
        return Ok(None);
    }
    let Some(pin) = &app.spec.pin else {
        return verify::tag_name(app.spec.source.target_revision.as_deref())
            .map(|tag| Some(tag.to_owned()));
    };
    Ok(app
        .status
        .iter()
        .flat_map(|status| &status.history)
        .filter(|entry| entry.revision == pin.revision)
        .find_map(|entry| entry.signature.as_ref()?.tag.clone()))
}

/// Verifies the commit the checkout resolved to (or its tag) when `app`
/// asks for it; who signed it, for the status. A dry run under `mode: tag`
/// of a commit (a pull request's head: a preview) verifies nothing, as no
/// tag names it yet; it is verified once a tag is applied.
pub(super) async fn verify(
    ctx: &Context,
    app: &Application,
    client: &Client,
    credentials: Option<&Credentials>,
    commit: &str,
    dry_run: bool,
) -> Result<Option<SignatureRecord>, ReconcileError> {
    let defaults = DEFAULTS.get().map(Vec::as_slice).unwrap_or_default();
    let Some(verify) = effective(app, defaults) else {
        return Ok(None);
    };
    let tag = match tag_to_verify(verify, app) {
        Err(VerifyError::NotATag { revision })
            if dry_run && revision.eq_ignore_ascii_case(commit) =>
        {
            return Ok(None);
        }
        tag => tag?,
    };
    let keys = read_keys(app, client, &verify.secret_ref.name).await?;
    let verified = ctx
        .git
        .verify(&VerifyRequest {
            url: &app.spec.source.repo_url,
            credentials,
            commit,
            tag: tag.as_deref(),
            keys: &keys,
        })
        .await?;
    Ok(Some(SignatureRecord {
        signer: verified.signer.signer,
        key: verified.signer.key,
        kind: match verified.signer.kind {
            SignatureKind::Openpgp => SignatureType::Openpgp,
            SignatureKind::Ssh => SignatureType::Ssh,
        },
        tag: verified.tag,
    }))
}

/// The trusted keys of the Secret `name` of the Application's namespace.
async fn read_keys(app: &Application, client: &Client, name: &str) -> Result<Keys, ReconcileError> {
    let namespace = app.namespace().unwrap_or_else(|| "default".into());
    let error = |message: String| ReconcileError::VerifyKeys {
        namespace: namespace.clone(),
        name: name.to_owned(),
        message,
    };
    let secret = Api::<Secret>::namespaced(client.clone(), &namespace)
        .get(name)
        .await
        .map_err(|e| error(crate::report::events::truncate(&e.to_string(), 200)))?;
    let data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(key, value)| (key, value.0))
        .collect();
    Keys::from_secret(&data).map_err(|e| error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApplicationSpec, LocalSecretRef, OperationSummary, Pin, Source};

    fn app(namespace: &str, verify: Option<Verify>, revision: &str) -> Application {
        let mut app = Application::new(
            "web",
            ApplicationSpec {
                source: Source {
                    repo_url: "https://example.com/r.git".into(),
                    target_revision: Some(revision.into()),
                    verify,
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        app.metadata.namespace = Some(namespace.into());
        app
    }

    fn keys(name: &str, mode: VerifyMode) -> Verify {
        Verify {
            mode,
            secret_ref: LocalSecretRef { name: name.into() },
        }
    }

    #[test]
    fn an_applications_own_verify_wins_over_its_namespaces_and_every_namespaces() {
        let defaults = parse_defaults(
            r#"[{"namespace":"team-a","secretRef":{"name":"a-keys"}},
                {"namespace":"*","mode":"tag","secretRef":{"name":"all-keys"}}]"#,
        )
        .unwrap();
        let own = app("team-a", Some(keys("own", VerifyMode::Head)), "main");
        assert_eq!(effective(&own, &defaults).unwrap().secret_ref.name, "own");
        let team_a = app("team-a", None, "main");
        assert_eq!(
            effective(&team_a, &defaults),
            Some(&keys("a-keys", VerifyMode::Head))
        );
        let other = app("team-b", None, "main");
        assert_eq!(
            effective(&other, &defaults),
            Some(&keys("all-keys", VerifyMode::Tag))
        );
        assert_eq!(effective(&other, &[]), None);
    }

    #[test]
    fn defaults_name_each_namespace_once_with_a_secret() {
        assert!(parse_defaults("[]").unwrap().is_empty());
        assert!(parse_defaults(r#"[{"namespace":"a"}]"#).is_err());
        assert!(parse_defaults(r#"[{"namespace":"","secretRef":{"name":"k"}}]"#).is_err());
        let twice = parse_defaults(
            r#"[{"namespace":"a","secretRef":{"name":"k"}},{"namespace":"a","secretRef":{"name":"l"}}]"#,
        );
        assert!(twice.unwrap_err().contains("named twice"));
        // Flux's spellings of the modes.
        let flux = parse_defaults(r#"[{"namespace":"a","mode":"HEAD","secretRef":{"name":"k"}}]"#);
        assert_eq!(flux.unwrap()[0].verify.mode, VerifyMode::Head);
    }

    #[test]
    fn mode_tag_verifies_the_tag_a_pin_was_applied_through() {
        let tag = keys("k", VerifyMode::Tag);
        let head = keys("k", VerifyMode::Head);
        assert_eq!(tag_to_verify(&head, &app("a", None, "v1")).unwrap(), None);
        assert_eq!(
            tag_to_verify(&tag, &app("a", None, "v1"))
                .unwrap()
                .as_deref(),
            Some("v1")
        );
        assert!(tag_to_verify(&tag, &app("a", None, "main")).is_ok());
        assert!(tag_to_verify(&tag, &app("a", None, "")).is_err());

        let mut pinned = app("a", None, "0123456789abcdef0123456789abcdef01234567");
        pinned.spec.pin = Some(Pin {
            revision: "0123456789abcdef0123456789abcdef01234567".into(),
            ..Default::default()
        });
        assert_eq!(tag_to_verify(&tag, &pinned).unwrap(), None);
        pinned.status = Some(crate::api::ApplicationStatus {
            history: vec![OperationSummary {
                revision: "0123456789abcdef0123456789abcdef01234567".into(),
                signature: Some(SignatureRecord {
                    tag: Some("v1.1".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert_eq!(
            tag_to_verify(&tag, &pinned).unwrap().as_deref(),
            Some("v1.1")
        );
    }
}
