//! One notification delivered (I/O): looked up among those delivered
//! already, its Provider and Secret read, its message built and encoded for
//! the Provider, POSTed with `X-Setpoint-Event-Id` (and, for
//! `generic-hmac`, `X-Signature`), recorded once the Provider answered 2xx.
//!
//! What is no Provider's fault goes nowhere: a missing Provider or Secret,
//! a Secret without the key the type needs, a suspended Provider are a
//! warning, `dropped` in the metrics and the Alert's `Ready=False` (with a
//! Warning Event on it); never a failed reconcile. What may pass (a refused
//! connection, a timeout, a 5xx or 429, a 4xx too: a webhook being set up)
//! is an error the dispatcher sends back to the queue's backoff.
//!
//! No address or token reaches an error, a log line or a metric label:
//! every error text is scrubbed of both.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::Reporter;
use kube::{Api, Resource};

use crate::api::{
    Alert, Condition, ConditionStatus, ConditionType, EventKind, Provider, ProviderType, Severity,
};
use crate::notify::http::PostError;
use crate::notify::message::{self, Message};
use crate::notify::payload;
use crate::notify::sent::SentError;
use crate::notify::tap::provider_key;
use crate::notify::{Notification, Notifier};

/// The header that carries the notification's id: a receiver may drop a
/// second delivery of one id (the only duplicate left: a worker killed
/// after the Provider's answer, before the record).
pub const EVENT_ID_HEADER: &str = "X-Setpoint-Event-Id";

#[derive(Debug, thiserror::Error)]
pub enum DeliverError {
    #[error("failed to read the Secret {namespace}/{name}: {message}")]
    ReadSecret {
        namespace: String,
        name: String,
        message: String,
    },
    #[error(transparent)]
    Store(#[from] SentError),
    #[error("the provider {provider} could not be reached: {message}")]
    Post { provider: String, message: String },
    #[error("the provider {provider} answered {status}: {answer}")]
    Answer {
        provider: String,
        status: u16,
        answer: String,
    },
    #[error("the commit status for {provider} failed: {message}")]
    CommitStatus { provider: String, message: String },
}

/// What became of a delivery that is not to be tried again.
#[derive(Debug, PartialEq, Eq)]
pub enum Delivered {
    Sent,
    /// Delivered before (a redelivery).
    Duplicate,
    /// Nowhere to send it; why.
    Dropped(String),
}

/// Where and how to send, from the Provider and its Secret.
struct Target {
    address: Option<String>,
    token: Option<String>,
    headers: Vec<(String, String)>,
}

impl Target {
    /// `text` without the address or the token.
    fn scrub(&self, text: &str) -> String {
        let mut text = text.to_string();
        for secret in [&self.address, &self.token].into_iter().flatten() {
            if secret.len() >= 4 {
                text = text.replace(secret.as_str(), "<redacted>");
            }
        }
        text
    }
}

/// Delivers `notification`; `published_ms` is when it was queued (for the
/// latency histogram).
pub async fn deliver(
    notifier: &Notifier,
    notification: &Notification,
    published_ms: Option<u64>,
) -> Result<Delivered, DeliverError> {
    let inner = &notifier.0;
    let namespace = &notification.namespace;
    let key = provider_key(namespace, &notification.provider);
    if inner.sent.delivered(&notification.id).await? {
        return Ok(Delivered::Duplicate);
    }
    let Some(provider) = notifier.provider(namespace, &notification.provider) else {
        let message = format!("the Provider {key} does not exist");
        alert_not_ready(
            notifier,
            namespace,
            &notification.alert,
            "ProviderNotFound",
            &message,
        );
        return Ok(Delivered::Dropped(message));
    };
    if provider.spec.suspend {
        return Ok(Delivered::Dropped(format!(
            "the Provider {key} is suspended"
        )));
    }
    let secret_name = &provider.spec.secret_ref.name;
    let secrets: Api<Secret> = Api::namespaced(inner.client.clone(), namespace);
    let secret = match secrets.get_opt(secret_name).await {
        Ok(Some(secret)) => secret,
        Ok(None) => {
            let message = format!(
                "the Secret {namespace}/{secret_name} of the Provider {key} does not exist"
            );
            alert_not_ready(
                notifier,
                namespace,
                &notification.alert,
                "SecretNotFound",
                &message,
            );
            return Ok(Delivered::Dropped(message));
        }
        Err(error) => {
            return Err(DeliverError::ReadSecret {
                namespace: namespace.clone(),
                name: secret_name.clone(),
                message: error.to_string(),
            });
        }
    };
    let target = target_of(&secret);
    let message = message::build(notification);
    let timeout = provider
        .spec
        .timeout
        .as_deref()
        .and_then(|t| crate::serve::parse_duration(t).ok())
        .unwrap_or(inner.settings.timeout);
    let result = match provider.spec.type_ {
        ProviderType::Github | ProviderType::Gitlab => {
            commit_status(notifier, &provider, &target, notification, &message).await
        }
        _ => {
            post(
                notifier,
                &provider,
                &target,
                notification,
                &message,
                timeout,
            )
            .await
        }
    };
    let delivered = match result {
        Ok(delivered) => delivered,
        Err(Invalid(message)) => {
            alert_not_ready(
                notifier,
                namespace,
                &notification.alert,
                "InvalidProvider",
                &message,
            );
            return Ok(Delivered::Dropped(message));
        }
        Err(Failed(error)) => return Err(error),
    };
    if delivered == Delivered::Sent {
        if let Err(error) = inner.sent.record(&notification.id).await {
            // Delivered all the same; a redelivery would post it again.
            tracing::warn!(provider = %key, id = %notification.id, %error, "a delivered notification could not be recorded");
        }
        if let Some(published) = published_ms {
            let now = crate::event::unix_millis(std::time::SystemTime::now());
            inner
                .metrics
                .notify_seconds
                .observe(now.saturating_sub(published) as f64 / 1000.0);
        }
        alert_ready(notifier, namespace, &notification.alert);
    }
    Ok(delivered)
}

/// A delivery that is not to be retried (the Provider's configuration is
/// wrong), or one that is.
enum Outcome {
    Invalid(String),
    Failed(DeliverError),
}
use Outcome::{Failed, Invalid};

fn text_of(secret: &Secret, key: &str) -> Option<String> {
    let bytes = secret.data.as_ref()?.get(key)?;
    let text = String::from_utf8(bytes.0.clone()).ok()?;
    let text = text.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn target_of(secret: &Secret) -> Target {
    let headers = text_of(secret, "headers")
        .and_then(|text| {
            serde_yaml::from_str::<std::collections::BTreeMap<String, String>>(&text).ok()
        })
        .map(|map| map.into_iter().collect())
        .unwrap_or_default();
    Target {
        address: text_of(secret, "address"),
        token: text_of(secret, "token"),
        headers,
    }
}

/// The chat and webhook types: one POST.
async fn post(
    notifier: &Notifier,
    provider: &Provider,
    target: &Target,
    notification: &Notification,
    message: &Message,
    timeout: Duration,
) -> Result<Delivered, Outcome> {
    let key = provider_key(&notification.namespace, &notification.provider);
    let spec = &provider.spec;
    let secret = &spec.secret_ref.name;
    let missing = |what: &str| {
        Invalid(format!(
            "the Secret {}/{secret} of the Provider {key} has no `{what}` key, which a {} Provider needs",
            notification.namespace,
            spec.type_.as_str()
        ))
    };
    let mut headers = vec![(EVENT_ID_HEADER.to_string(), notification.id.clone())];
    let timestamp = &notification.occurrence.timestamp;
    let (url, body) = match spec.type_ {
        ProviderType::Slack => {
            let body = payload::slack(message, spec.channel.as_deref(), spec.username.as_deref());
            match (&target.address, &target.token) {
                (Some(address), _) if target.token.is_none() => (address.clone(), body),
                (address, Some(token)) => {
                    headers.push(("Authorization".into(), format!("Bearer {token}")));
                    let url = address
                        .clone()
                        .unwrap_or_else(|| "https://slack.com/api/chat.postMessage".into());
                    (url, body)
                }
                _ => return Err(missing("address")),
            }
        }
        ProviderType::Msteams => (
            target.address.clone().ok_or_else(|| missing("address"))?,
            payload::msteams(message),
        ),
        ProviderType::Discord => (
            target.address.clone().ok_or_else(|| missing("address"))?,
            payload::discord(message, spec.username.as_deref(), timestamp),
        ),
        ProviderType::Generic | ProviderType::GenericHmac => {
            headers.extend(target.headers.iter().cloned());
            (
                target.address.clone().ok_or_else(|| missing("address"))?,
                payload::generic(notification, message),
            )
        }
        ProviderType::Github | ProviderType::Gitlab => unreachable!("commit statuses"),
    };
    let body = serde_json::to_vec(&body).expect("payloads serialize");
    if spec.type_ == ProviderType::GenericHmac {
        let key = target.token.as_deref().ok_or_else(|| missing("token"))?;
        headers.push((
            "X-Signature".into(),
            payload::signature(key.as_bytes(), &body),
        ));
    }
    let answer = notifier
        .0
        .poster
        .post(&url, &headers, body, timeout)
        .await
        .map_err(|error| match error {
            PostError::InvalidUrl | PostError::InvalidHeader(_) => Invalid(format!(
                "the Provider {key}: {}",
                target.scrub(&error.to_string())
            )),
            error => Failed(DeliverError::Post {
                provider: key.clone(),
                message: target.scrub(&error.to_string()),
            }),
        })?;
    if !answer.status.is_success() {
        let text = String::from_utf8_lossy(&answer.body);
        let text: String = text.chars().take(200).collect();
        return Err(Failed(DeliverError::Answer {
            provider: key,
            status: answer.status.as_u16(),
            answer: target.scrub(text.trim()),
        }));
    }
    Ok(Delivered::Sent)
}

/// `github` and `gitlab`: a commit status on the revision the event names,
/// context `setpoint/<namespace>/<app>`: success for the info kinds,
/// failure for the errors.
async fn commit_status(
    notifier: &Notifier,
    provider: &Provider,
    target: &Target,
    notification: &Notification,
    message: &Message,
) -> Result<Delivered, Outcome> {
    let key = provider_key(&notification.namespace, &notification.provider);
    let occurrence = &notification.occurrence;
    let (Some(revision), Some(repository)) = (&occurrence.revision, &occurrence.repository) else {
        return Ok(Delivered::Dropped("no commit to set a status on".into()));
    };
    if occurrence.kind == EventKind::PreviewPosted || !is_commit(revision) {
        return Ok(Delivered::Dropped("no commit to set a status on".into()));
    }
    let Some(token) = target.token.clone() else {
        return Err(Invalid(format!(
            "the Secret {}/{} of the Provider {key} has no `token` key",
            notification.namespace, provider.spec.secret_ref.name
        )));
    };
    let repo_url = format!("https://{repository}");
    let context =
        crate::report::github::status_context(&occurrence.app.namespace, &occurrence.app.name);
    let description = format!("{}: {}", message.title, message.text);
    let settings = &notifier.0.settings;
    let failed = |message: String| {
        Failed(DeliverError::CommitStatus {
            provider: key.clone(),
            message: target.scrub(&message),
        })
    };
    if provider.spec.type_ == ProviderType::Github {
        use crate::report::github::{CommitStatus, CommitStatuses, GitHubSettings, State};
        let api_url = target
            .address
            .clone()
            .unwrap_or_else(|| settings.github_api_url.clone());
        let Some((owner, repo)) = crate::report::github::github_repo(&repo_url, &api_url) else {
            return Ok(Delivered::Dropped(format!(
                "{repository} is not on the GitHub of {api_url}"
            )));
        };
        let client = CommitStatuses::new(&GitHubSettings {
            api_url: api_url.trim_end_matches('/').to_string(),
            token,
            // The queue retries, with its backoff.
            retry_budget: Duration::ZERO,
            ..GitHubSettings::default()
        })
        .map_err(|e| Invalid(target.scrub(&e.to_string())))?;
        let state = match occurrence.severity {
            Severity::Info => State::Success,
            Severity::Error => State::Failure,
        };
        client
            .post(&CommitStatus {
                owner,
                repo,
                sha: revision.clone(),
                state,
                context,
                description,
                target_url: None,
            })
            .await
            .map_err(|e| failed(e.to_string()))?;
    } else {
        use crate::report::gitlab::{Client, State, gitlab_project, post_status};
        let api_url = target
            .address
            .clone()
            .unwrap_or_else(|| settings.gitlab_api_url.clone());
        let Some(project) = gitlab_project(&repo_url, &api_url) else {
            return Ok(Delivered::Dropped(format!(
                "{repository} is not on the GitLab of {api_url}"
            )));
        };
        let client =
            Client::new(&api_url, &token).map_err(|e| Invalid(target.scrub(&e.to_string())))?;
        let state = match occurrence.severity {
            Severity::Info => State::Success,
            Severity::Error => State::Failed,
        };
        post_status(
            &client,
            &project,
            revision,
            state,
            &context,
            &description,
            None,
        )
        .await
        .map_err(|e| failed(e.to_string()))?;
    }
    Ok(Delivered::Sent)
}

fn is_commit(revision: &str) -> bool {
    matches!(revision.len(), 40 | 64) && revision.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The Alert cannot deliver: `Ready=False` with `reason`, and a Warning
/// Event on it, written in the background once per change.
pub fn alert_not_ready(
    notifier: &Notifier,
    namespace: &str,
    alert: &str,
    reason: &str,
    message: &str,
) {
    tracing::warn!(alert = %format!("{namespace}/{alert}"), reason, "{message}");
    set_ready(notifier, namespace, alert, false, reason, message);
}

/// The Alert delivered: `Ready=True` (written once per change).
fn alert_ready(notifier: &Notifier, namespace: &str, alert: &str) {
    set_ready(
        notifier,
        namespace,
        alert,
        true,
        "Delivered",
        "notifications are delivered",
    );
}

fn set_ready(
    notifier: &Notifier,
    namespace: &str,
    alert: &str,
    ready: bool,
    reason: &str,
    message: &str,
) {
    let key = format!("{namespace}/{alert}");
    {
        let mut conditions = notifier.0.conditions.lock().expect("conditions lock");
        if conditions.get(&key) == Some(&(ready, reason.to_string())) {
            return;
        }
        conditions.insert(key.clone(), (ready, reason.to_string()));
    }
    let client = notifier.0.client.clone();
    let (namespace, alert, reason, message) = (
        namespace.to_string(),
        alert.to_string(),
        reason.to_string(),
        message.to_string(),
    );
    tokio::spawn(async move {
        let api: Api<Alert> = Api::namespaced(client.clone(), &namespace);
        let condition = Condition {
            type_: ConditionType::Ready,
            status: if ready {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason: reason.clone(),
            message: message.clone(),
            last_transition_time: crate::reconcile::now(),
            observed_generation: None,
        };
        let patch = serde_json::json!({"status": {"conditions": [condition]}});
        match api
            .patch_status(&alert, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) if !ready => {
                let reporter = Reporter {
                    controller: "setpoint".into(),
                    instance: None,
                };
                let events =
                    crate::report::events::Events::on(client, reporter, written.object_ref(&()));
                events.warning(&reason, "Notify", message).await;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::debug!(alert = %format!("{namespace}/{}", alert.as_str()), %error, "the Alert's status could not be written");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(entries: &[(&str, &str)]) -> Secret {
        Secret {
            data: Some(
                entries
                    .iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_target_reads_flux_s_keys_and_scrubs_them_from_text() {
        let target = target_of(&secret(&[
            (
                "address",
                "https://hooks.slack.com/services/T0/B0/SECRETPART\n",
            ),
            ("token", "s3cr3t-token"),
            ("headers", "X-Team: web\nX-Env: prod\n"),
        ]));
        assert_eq!(
            target.address.as_deref(),
            Some("https://hooks.slack.com/services/T0/B0/SECRETPART")
        );
        assert_eq!(target.headers.len(), 2);
        let text = target.scrub(
            "error sending request for url (https://hooks.slack.com/services/T0/B0/SECRETPART) with s3cr3t-token",
        );
        assert!(
            !text.contains("SECRETPART") && !text.contains("s3cr3t"),
            "{text}"
        );
        assert!(target_of(&secret(&[("address", "  ")])).address.is_none());
    }
}
