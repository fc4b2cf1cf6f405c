//! Which Receiver an address is: `status.webhookPath` is
//! `/api/webhooks/receivers/<sha256 hex of token, name and namespace>` (as
//! Flux's), so the index maps that digest to the Receiver. A watch of the
//! Receivers feeds it, reading each one's Secret when it is seen or its spec
//! changes, and writes `status.webhookPath` and `Ready` (why not: the Secret
//! missing, no `token`, a bad spec) when they change. A rotated token is
//! picked up by a miss (an unknown digest re-reads every Secret, at most
//! once per `MISS_REFRESH`) and by a re-read of all of them every
//! `REFRESH_INTERVAL`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher::{self, Event as WatchEvent};
use kube::{Client, ResourceExt};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::{Kind, validate};
use crate::api::{
    Condition, ConditionStatus, ConditionType, Receiver, ReceiverSpec, set_condition,
};
use crate::event::AppKey;
use crate::ingest::watch::Scope;

/// Where every Receiver's address starts.
pub const PATH_PREFIX: &str = "/api/webhooks/receivers/";
/// The key of the Secret that holds the token.
pub const TOKEN_KEY: &str = "token";
/// An unknown digest re-reads the Secrets at most this often.
const MISS_REFRESH: Duration = Duration::from_secs(3);
/// Every Secret is read again this often, so a rotated token's new address
/// reaches the status without a request.
const REFRESH_INTERVAL: Duration = Duration::from_secs(60);

/// `PATH_PREFIX` and the digest of the token, the name and the namespace.
pub fn webhook_path(token: &str, name: &str, namespace: &str) -> String {
    format!("{PATH_PREFIX}{}", digest(token, name, namespace))
}

/// sha256 hex of `token + name + namespace`, as Flux computes it.
pub fn digest(token: &str, name: &str, namespace: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(token.as_bytes());
    hasher.update(name.as_bytes());
    hasher.update(namespace.as_bytes());
    hex::encode(hasher.finalize())
}

/// A Receiver the index serves.
pub struct Entry {
    /// `namespace/name`.
    pub key: AppKey,
    pub spec: ReceiverSpec,
    /// The type, or why the spec is refused (the request then answers 503).
    pub kind: Result<Kind, String>,
    token: crate::secret::Secret,
}

impl Entry {
    pub fn token(&self) -> &str {
        self.token.expose()
    }
}

#[derive(Default)]
struct State {
    /// digest → the Receiver it addresses.
    by_digest: HashMap<String, Arc<Entry>>,
    /// Receiver → its digest (to drop the old one when the token changes).
    digests: HashMap<AppKey, String>,
    /// The Receivers seen, with the generation last read.
    receivers: HashMap<AppKey, (Receiver, Option<i64>)>,
}

/// The digest index, fed by `run`.
pub struct ReceiverIndex {
    client: Client,
    state: Mutex<State>,
    /// When a miss last re-read the Secrets; one re-read at a time.
    refreshed: tokio::sync::Mutex<Option<Instant>>,
}

/// What the Secret gave, or why not: the `Ready` condition's reason and
/// message.
type Token = Result<String, (&'static str, String)>;

impl ReceiverIndex {
    pub fn new(client: Client) -> Arc<Self> {
        Arc::new(ReceiverIndex {
            client,
            state: Mutex::default(),
            refreshed: tokio::sync::Mutex::new(None),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("receiver index lock")
    }

    /// The Receiver at `digest`; on a miss the Secrets are read again
    /// (at most once per `MISS_REFRESH`), so a rotated token works at once.
    pub async fn find(&self, digest: &str) -> Option<Arc<Entry>> {
        if let Some(entry) = self.state().by_digest.get(digest) {
            return Some(Arc::clone(entry));
        }
        let mut refreshed = self.refreshed.lock().await;
        // A miss that waited for another's re-read looks again first.
        if let Some(entry) = self.state().by_digest.get(digest) {
            return Some(Arc::clone(entry));
        }
        if refreshed.is_some_and(|at| at.elapsed() < MISS_REFRESH) {
            return None;
        }
        self.refresh_all().await;
        *refreshed = Some(Instant::now());
        self.state().by_digest.get(digest).cloned()
    }

    /// Reads every known Receiver's Secret again.
    async fn refresh_all(&self) {
        let receivers: Vec<Receiver> = self
            .state()
            .receivers
            .values()
            .map(|(r, _)| r.clone())
            .collect();
        for receiver in receivers {
            self.observe(&receiver).await;
        }
    }

    /// Reads `receiver`'s Secret, serves its digest, writes its status.
    async fn observe(&self, receiver: &Receiver) {
        let namespace = receiver.namespace().unwrap_or_default();
        let name = receiver.name_any();
        let key = AppKey::new(&namespace, &name);
        let token = self
            .read_token(&namespace, &receiver.spec.secret_ref.name)
            .await;
        let kind = validate(&receiver.spec);
        {
            let mut state = self.state();
            state.receivers.insert(
                key.clone(),
                (receiver.clone(), receiver.metadata.generation),
            );
            if let Some(old) = state.digests.remove(&key) {
                state.by_digest.remove(&old);
            }
            if let Ok(token) = &token {
                let digest = digest(token, &name, &namespace);
                state.digests.insert(key.clone(), digest.clone());
                state.by_digest.insert(
                    digest,
                    Arc::new(Entry {
                        key: key.clone(),
                        spec: receiver.spec.clone(),
                        kind: kind.clone(),
                        token: crate::secret::Secret::new(token.clone()),
                    }),
                );
            }
        }
        self.write_status(receiver, &token, &kind).await;
    }

    /// Serves `spec` at the digest of `token`, without reading anything
    /// (the handler's tests).
    #[cfg(test)]
    pub(super) fn serve(&self, key: AppKey, spec: ReceiverSpec, token: &str) -> String {
        let digest = digest(token, &key.name, &key.namespace);
        let entry = Entry {
            key: key.clone(),
            kind: validate(&spec),
            spec,
            token: crate::secret::Secret::new(token),
        };
        let mut state = self.state();
        state.digests.insert(key, digest.clone());
        state.by_digest.insert(digest.clone(), Arc::new(entry));
        digest
    }

    fn forget(&self, key: &AppKey) {
        let mut state = self.state();
        state.receivers.remove(key);
        if let Some(old) = state.digests.remove(key) {
            state.by_digest.remove(&old);
        }
    }

    async fn read_token(&self, namespace: &str, secret: &str) -> Token {
        if secret.is_empty() {
            return Err(("InvalidSpec", "spec.secretRef.name is empty".into()));
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(secret).await {
            Ok(Some(found)) => {
                let token = found
                    .data
                    .as_ref()
                    .and_then(|d| d.get(TOKEN_KEY))
                    .map(|v| String::from_utf8_lossy(&v.0).trim().to_string())
                    .or_else(|| {
                        found
                            .string_data
                            .as_ref()
                            .and_then(|d| d.get(TOKEN_KEY))
                            .map(|v| v.trim().to_string())
                    })
                    .unwrap_or_default();
                if token.is_empty() {
                    Err((
                        "TokenMissing",
                        format!(
                            "Secret {namespace}/{secret} has no key {TOKEN_KEY:?} (or it is empty)"
                        ),
                    ))
                } else {
                    Ok(token)
                }
            }
            Ok(None) => Err((
                "SecretNotFound",
                format!("Secret {namespace}/{secret} not found"),
            )),
            Err(error) => Err((
                "SecretReadFailed",
                format!("failed to read Secret {namespace}/{secret}: {error}"),
            )),
        }
    }

    /// `status.webhookPath` and `Ready`, written only when they changed.
    async fn write_status(&self, receiver: &Receiver, token: &Token, kind: &Result<Kind, String>) {
        let namespace = receiver.namespace().unwrap_or_default();
        let name = receiver.name_any();
        let current = receiver.status.clone().unwrap_or_default();
        let path = token
            .as_ref()
            .ok()
            .map(|token| webhook_path(token, &name, &namespace));
        let (status, reason, message) = match (token, kind) {
            (_, Err(message)) => (ConditionStatus::False, "InvalidSpec", message.clone()),
            (Err((reason, message)), _) => (ConditionStatus::False, *reason, message.clone()),
            (Ok(_), Ok(_)) => (
                ConditionStatus::True,
                "Succeeded",
                format!("Receiver serves {}", path.as_deref().unwrap_or_default()),
            ),
        };
        let mut conditions = current.conditions.clone();
        set_condition(
            &mut conditions,
            Condition {
                type_: ConditionType::Ready,
                status,
                reason: reason.into(),
                message,
                last_transition_time: crate::reconcile::now(),
                observed_generation: receiver.metadata.generation,
            },
        );
        let generation = receiver.metadata.generation;
        if current.webhook_path == path
            && current.conditions == conditions
            && current.observed_generation == generation
        {
            return;
        }
        let api: Api<Receiver> = Api::namespaced(self.client.clone(), &namespace);
        let patch = json!({
            "status": {
                "webhookPath": path,
                "conditions": conditions,
                "observedGeneration": generation,
            }
        });
        if let Err(error) = api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(receiver = %format!("{namespace}/{name}"), %error, "failed to write the Receiver's status");
        }
    }

    /// Watches the Receivers of `scope` until the task is dropped.
    pub async fn run(self: Arc<Self>, scope: Scope) {
        let api: Api<Receiver> = match scope.single() {
            Some(namespace) => Api::namespaced(self.client.clone(), namespace),
            None => Api::all(self.client.clone()),
        };
        let stream = watcher::watcher(api, watcher::Config::default().timeout(60));
        futures::pin_mut!(stream);
        let mut relisted: Option<HashSet<AppKey>> = None;
        let mut failures = 0u32;
        let mut tick = tokio::time::interval(REFRESH_INTERVAL);
        tick.tick().await;
        loop {
            let event = tokio::select! {
                event = stream.next() => match event {
                    Some(event) => event,
                    None => return,
                },
                _ = tick.tick() => {
                    self.refresh_all().await;
                    continue;
                }
            };
            let event = match event {
                Ok(event) => {
                    failures = 0;
                    event
                }
                Err(error) => {
                    failures += 1;
                    // Without the CRD every list fails: say so once.
                    if failures == 1 {
                        tracing::warn!(%error, "Receiver watch failed (is the Receiver CRD installed?); retrying");
                    } else {
                        tracing::debug!(%error, "Receiver watch failed; retrying");
                    }
                    let pause = Duration::from_secs(2u64.saturating_pow(failures.min(6)).min(60));
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            match event {
                WatchEvent::Init => relisted = Some(HashSet::new()),
                WatchEvent::InitApply(receiver) | WatchEvent::Apply(receiver) => {
                    let namespace = receiver.namespace().unwrap_or_default();
                    if !scope.contains(&namespace) {
                        continue;
                    }
                    let key = AppKey::new(namespace, receiver.name_any());
                    if let Some(seen) = relisted.as_mut() {
                        seen.insert(key.clone());
                    }
                    // Its own status write comes back as an event of the
                    // same generation: the Secret is not read again for it.
                    let known = self.state().receivers.get(&key).map(|(_, g)| *g);
                    if known == Some(receiver.metadata.generation) {
                        if let Some((stored, _)) = self.state().receivers.get_mut(&key) {
                            *stored = receiver;
                        }
                        continue;
                    }
                    self.observe(&receiver).await;
                }
                WatchEvent::InitDone => {
                    if let Some(seen) = relisted.take() {
                        let gone: Vec<AppKey> = self
                            .state()
                            .receivers
                            .keys()
                            .filter(|k| !seen.contains(k))
                            .cloned()
                            .collect();
                        for key in gone {
                            self.forget(&key);
                        }
                    }
                }
                WatchEvent::Delete(receiver) => {
                    self.forget(&AppKey::new(
                        receiver.namespace().unwrap_or_default(),
                        receiver.name_any(),
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_is_the_digest_of_token_name_and_namespace() {
        // sha256("tokenwebteam")
        let expected = hex::encode(Sha256::digest(b"tokenwebteam"));
        assert_eq!(digest("token", "web", "team"), expected);
        assert_eq!(
            webhook_path("token", "web", "team"),
            format!("/api/webhooks/receivers/{expected}")
        );
        assert_ne!(digest("token2", "web", "team"), expected);
        assert_ne!(digest("token", "web", "team2"), expected);
    }
}
