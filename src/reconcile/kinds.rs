//! Kinds: which API resource serves a manifest's group/version/kind, and
//! whether it is namespaced. Resolved through API discovery one group-version
//! at a time, cached, and refreshed when a kind is missing from the cache (a
//! CRD may have just been installed).

use std::collections::HashMap;
use std::sync::RwLock;

use kube::Client;
use kube::core::GroupVersion;
use kube::discovery::{ApiCapabilities, ApiResource, Scope};

#[derive(Debug, thiserror::Error)]
pub enum KindError {
    #[error("unknown kind {kind} in {api_version}: the API server serves no such resource")]
    UnknownKind { api_version: String, kind: String },
    #[error("failed to discover {api_version}: {source}")]
    Discover {
        api_version: String,
        #[source]
        source: kube::Error,
    },
}

impl KindError {
    pub fn is_transient(&self) -> bool {
        matches!(self, KindError::Discover { .. })
    }
}

#[derive(Clone, Debug)]
pub struct Kind {
    pub resource: ApiResource,
    pub namespaced: bool,
}

/// The discovery cache shared by every reconcile of a process.
#[derive(Default)]
pub struct Kinds {
    /// group-version → kind → resource
    cache: RwLock<HashMap<String, HashMap<String, Kind>>>,
}

impl Kinds {
    fn cached(&self, api_version: &str, kind: &str) -> Option<Kind> {
        let cache = self.cache.read().expect("kinds cache lock");
        cache
            .get(api_version)
            .and_then(|kinds| kinds.get(kind))
            .cloned()
    }

    /// The resource behind `api_version`/`kind`; one discovery request on a miss.
    pub async fn resolve(
        &self,
        client: &Client,
        api_version: &str,
        kind: &str,
    ) -> Result<Kind, KindError> {
        if let Some(found) = self.cached(api_version, kind) {
            return Ok(found);
        }
        self.refresh(client, api_version).await?;
        self.cached(api_version, kind)
            .ok_or_else(|| KindError::UnknownKind {
                api_version: api_version.to_string(),
                kind: kind.to_string(),
            })
    }

    /// Re-reads one group-version from the API server.
    pub async fn refresh(&self, client: &Client, api_version: &str) -> Result<(), KindError> {
        let gv: GroupVersion = api_version.parse().map_err(|_| KindError::UnknownKind {
            api_version: api_version.to_string(),
            kind: String::new(),
        })?;
        let kinds = match kube::discovery::oneshot::pinned_group(client, &gv).await {
            Ok(group) => group
                .versioned_resources(&gv.version)
                .into_iter()
                .map(|(resource, caps): (ApiResource, ApiCapabilities)| {
                    let namespaced = caps.scope == Scope::Namespaced;
                    (
                        resource.kind.clone(),
                        Kind {
                            resource,
                            namespaced,
                        },
                    )
                })
                .collect(),
            // A group-version the server does not serve: no kinds.
            Err(kube::Error::Api(status)) if status.code == 404 => HashMap::new(),
            Err(source) => {
                return Err(KindError::Discover {
                    api_version: api_version.to_string(),
                    source,
                });
            }
        };
        self.cache
            .write()
            .expect("kinds cache lock")
            .insert(api_version.to_string(), kinds);
        Ok(())
    }
}
