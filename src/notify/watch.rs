//! The Alerts' and Providers' reflector stores (I/O), watched over the
//! namespaces Setpoint handles (one namespace's through a namespaced API
//! when `watchNamespaces` names one, else all). Without the CRDs installed
//! every list fails: said once, then retried quietly, slower.

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// Keeps `writer`'s store of `K` until the task is dropped.
pub async fn run<K>(client: Client, namespace: Option<String>, writer: Writer<K>)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let kind = K::kind(&());
    let api: Api<K> = match &namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    let stream = reflector::reflector(
        writer,
        watcher::watcher(api, watcher::Config::default().timeout(60))
            .modify(|object| object.managed_fields_mut().clear()),
    );
    futures::pin_mut!(stream);
    let mut failures = 0u32;
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => {
                if crate::ingest::watch::retry::answered(&event) {
                    failures = 0;
                }
            }
            Err(error) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(%error, %kind, "watch failed (is its CRD installed?); retrying");
                } else {
                    tracing::debug!(%error, %kind, "watch failed; retrying");
                }
                let pause = Duration::from_secs(2u64.saturating_pow(failures.min(6)).min(60));
                tokio::time::sleep(pause).await;
            }
        }
    }
}
