//! One live-object watch: a kind, in one namespace or cluster-wide, on one
//! cluster. What someone else changed (or deleted, or whose health changed)
//! enqueues its Application; every object also feeds the cluster's live
//! cache (`cluster/live_cache.rs`), which the reconciles read instead of
//! the API server.

use super::*;

/// What the watch remembers of one object to tell a real change from a replay.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Seen {
    pub(super) owner: AppKey,
    pub(super) signature: Signature,
    pub(super) health: Health,
}

pub(super) type ObjectKey = (Option<String>, String);

/// Where one watch's objects go in its cluster's live cache; the scope
/// stops answering when the watch stops (its task aborted or ended).
pub(super) struct CacheFeed {
    pub(super) cluster: Arc<Cluster>,
    pub(super) gvk: Gvk,
    /// None: cluster-wide.
    pub(super) scope: Option<String>,
}

impl CacheFeed {
    fn live(&self) -> &crate::cluster::LiveCache {
        &self.cluster.live
    }

    fn scope(&self) -> Option<&str> {
        self.scope.as_deref()
    }
}

impl Drop for CacheFeed {
    fn drop(&mut self) {
        self.cluster.live.stopped(&self.gvk, self.scope());
    }
}

pub(super) async fn watch_kind(
    cluster: Arc<Cluster>,
    target: Target,
    queue: Arc<dyn Queue>,
    store: Store<Application>,
    scope: Scope,
) {
    let client = cluster.watch_client().clone();
    let gvk = GroupVersionKind::gvk(&target.group, &target.version, &target.kind);
    let mut retry = Retry::default();
    // `ApiResource::from_gvk` guesses the plural; discovery knows it. The
    // API server may be down now: ask again until it answers.
    let (resource, kind_scope) = loop {
        match kube::discovery::pinned_kind(&client, &gvk).await {
            Ok((resource, capabilities)) => break (resource, capabilities.scope),
            Err(error) => {
                let pause = retry.next(api_refused(&error), Instant::now());
                if pause.warn {
                    tracing::warn!(%target, %error, retry_in = ?pause.delay, "cannot discover a kind to watch");
                }
                tokio::time::sleep(pause.delay).await;
            }
        }
    };
    retry.reset();
    let (api, cached): (Api<DynamicObject>, _) = match (&target.namespace, kind_scope) {
        (Some(namespace), kube::discovery::Scope::Namespaced) => (
            Api::namespaced_with(client, namespace, &resource),
            Some(namespace.clone()),
        ),
        _ => (Api::all_with(client, &resource), None),
    };
    // The objects also feed the cluster's live cache, for the reconciles.
    let cache = CacheFeed {
        cluster: cluster.clone(),
        gvk: Gvk::new(&target.group, &target.version, &target.kind),
        scope: cached,
    };
    let mut interrupted = false;
    let stream = watcher::watcher(api, watch_config().labels(APP_LABEL));
    futures::pin_mut!(stream);
    let mut seen: HashMap<ObjectKey, Seen> = HashMap::new();
    // During a (re)list: the objects it returned so far.
    let mut listed: Option<BTreeSet<ObjectKey>> = None;
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => {
                if answered(&event) {
                    retry.reset();
                }
                if std::mem::take(&mut interrupted) {
                    cache.live().resumed(&cache.gvk, cache.scope());
                }
                event
            }
            Err(error) => {
                interrupted = true;
                cache.live().interrupted(&cache.gvk, cache.scope());
                let refusal = refused(&error);
                let pause = retry.next(refusal, Instant::now());
                if pause.warn && refusal {
                    tracing::warn!(%target, %error, retry_in = ?pause.delay, "cannot watch; drift of these objects waits for the sweep");
                } else if pause.warn {
                    tracing::warn!(%target, %error, retry_in = ?pause.delay, "watch interrupted; resuming");
                } else {
                    tracing::debug!(%target, %error, retry_in = ?pause.delay, "watch interrupted; resuming");
                }
                tokio::time::sleep(pause.delay).await;
                continue;
            }
        };
        let drift = match event {
            WatchEvent::Init => {
                cache.live().listing(&cache.gvk, cache.scope());
                listed = Some(BTreeSet::new());
                Vec::new()
            }
            WatchEvent::InitApply(object) => {
                if let Some(listed) = listed.as_mut() {
                    listed.insert((object.namespace(), object.name_any()));
                }
                let value = serde_json::to_value(&object).unwrap_or(Value::Null);
                cache.live().seen(&cache.gvk, &value);
                applied(&mut seen, &resource, &scope, &object, &value, Some(&store))
                    .into_iter()
                    .collect()
            }
            WatchEvent::Apply(object) => {
                let value = serde_json::to_value(&object).unwrap_or(Value::Null);
                let own_write = cache.live().seen(&cache.gvk, &value);
                let drift = applied(&mut seen, &resource, &scope, &object, &value, None);
                // Setpoint's own apply, seen back: the reconcile that sent
                // it records the health its answer shows (a Deployment
                // progressing), so it is no reason to reconcile again.
                drift.filter(|_| !own_write).into_iter().collect()
            }
            // A relist after the watch fell too far behind (410 Gone, as
            // after an API server restart) sends no deletes: what it no
            // longer returns was deleted meanwhile.
            WatchEvent::InitDone => {
                cache.live().listed(&cache.gvk, cache.scope());
                let listed = listed.take().unwrap_or_default();
                gone_from_listing(&mut seen, &listed)
                    .into_iter()
                    .map(|(key, before)| {
                        let object = format!("{} {} (deleted)", resource.kind, key.1);
                        (before.owner, object, "deleted")
                    })
                    .collect()
            }
            WatchEvent::Delete(object) => {
                let value = serde_json::to_value(&object).unwrap_or(Value::Null);
                cache.live().gone(&cache.gvk, &value);
                seen.remove(&(object.namespace(), object.name_any()));
                owner(&object)
                    .filter(|o| scope.contains(&o.namespace))
                    .map(|owner| {
                        let object = format!("{} {} (deleted)", resource.kind, object.name_any());
                        (owner, object, "deleted")
                    })
                    .into_iter()
                    .collect()
            }
        };
        for (owner, object, why) in drift {
            tracing::debug!(app = %owner, %object, why, "enqueue");
            publish(&queue, Event::drift(owner, object)).await;
        }
    }
}

/// The objects seen before that a (re)list did not return, forgotten.
pub(super) fn gone_from_listing(
    seen: &mut HashMap<ObjectKey, Seen>,
    listed: &BTreeSet<ObjectKey>,
) -> Vec<(ObjectKey, Seen)> {
    let gone: Vec<ObjectKey> = seen
        .keys()
        .filter(|key| !listed.contains(*key))
        .cloned()
        .collect();
    gone.into_iter()
        .filter_map(|key| seen.remove(&key).map(|before| (key, before)))
        .collect()
}

/// An object added or changed: remembered, and returned as drift of its
/// Application when someone else changed it or its health changed. An
/// object a listing shows for the first time has no earlier sighting: with
/// `statuses`, its health is compared with the one its Application's status
/// recorded (a watch of a kind starts after the reconcile that first applied
/// it, so a Deployment can turn ready before the watch's first listing).
pub(super) fn applied(
    seen: &mut HashMap<ObjectKey, Seen>,
    resource: &ApiResource,
    scope: &Scope,
    object: &DynamicObject,
    value: &Value,
    statuses: Option<&Store<Application>>,
) -> Option<(AppKey, String, &'static str)> {
    let owner = owner(object).filter(|o| scope.contains(&o.namespace))?;
    let now = Seen {
        owner: owner.clone(),
        signature: signature(value),
        health: assess(&resource.group, &resource.kind, value).status,
    };
    let why = match seen.insert((object.namespace(), object.name_any()), now.clone()) {
        Some(before) if before.health != now.health => "health changed",
        Some(before) if before.signature != now.signature && changed_by_others(value) => {
            "changed outside Setpoint"
        }
        Some(_) => return None,
        None if statuses
            .and_then(|store| recorded_health(store, &owner, resource, object))
            .is_some_and(|recorded| recorded != now.health) =>
        {
            "health changed"
        }
        None => return None,
    };
    Some((
        owner,
        format!("{} {}", resource.kind, object.name_any()),
        why,
    ))
}

/// The health `owner`'s status recorded for `object`.
pub(super) fn recorded_health(
    statuses: &Store<Application>,
    owner: &AppKey,
    resource: &ApiResource,
    object: &DynamicObject,
) -> Option<Health> {
    let app = statuses.get(&reflector::ObjectRef::new(&owner.name).within(&owner.namespace))?;
    let status = app.status.as_ref()?;
    let recorded = status.resources.iter().find(|r| {
        r.group == resource.group
            && r.kind == resource.kind
            && r.namespace == object.namespace()
            && r.name == object.name_any()
    });
    if let Some(recorded) = recorded {
        return Some(recorded.health);
    }
    // A hook of the sync in progress (a Job, mostly): the watch of its kind
    // starts after the reconcile that created it, and the hook may be done
    // by its first listing.
    let hook = status.sync_run.as_ref()?.hooks.iter().find(|h| {
        h.group == resource.group
            && h.kind == resource.kind
            && h.namespace == object.namespace()
            && h.name == object.name_any()
    })?;
    Some(match hook.state {
        crate::api::HookState::Running => Health::Progressing,
        crate::api::HookState::Succeeded => Health::Healthy,
        crate::api::HookState::Failed => Health::Degraded,
    })
}

pub(super) fn owner(object: &DynamicObject) -> Option<AppKey> {
    object
        .annotations()
        .get(APP_ANNOTATION)
        .and_then(|owner| AppKey::parse(owner))
}

/// A digest of what [`signature`] covers: 16 bytes per watched object
/// instead of its labels and annotations as text (a few hundred bytes each,
/// 40,000 objects at 10,000 Applications).
pub(super) type Signature = [u8; 16];

/// What changes when someone edits an object, but not when a controller
/// writes its status: the generation (or, for kinds without one, the
/// resource version), labels and annotations. Of an object Setpoint
/// applied, only the labels and annotations it owns: what a controller
/// adds beside them (a Deployment's `deployment.kubernetes.io/revision`)
/// is no drift, and no apply would change it.
pub(super) fn signature(object: &Value) -> Signature {
    let metadata = &object["metadata"];
    let version = match &metadata["generation"] {
        Value::Null => metadata["resourceVersion"].to_string(),
        generation => generation.to_string(),
    };
    let text = match metadata
        .as_object()
        .and_then(crate::reconcile::ownership::setpoint_labels_and_annotations)
    {
        Some([labels, annotations]) => format!("{version}|{labels:?}|{annotations:?}"),
        None => format!(
            "{version}|{}|{}",
            metadata["labels"], metadata["annotations"]
        ),
    };
    let digest = Sha256::digest(text.as_bytes());
    let mut signature = Signature::default();
    signature.copy_from_slice(&digest[..16]);
    signature
}

/// Whether the newest write recorded in `managedFields` (status writes
/// aside) came from someone other than Setpoint. Ties count as someone else:
/// at worst one reconcile too many, never a missed change.
pub(super) fn changed_by_others(object: &Value) -> bool {
    let Some(entries) = object["metadata"]["managedFields"].as_array() else {
        return true;
    };
    let writes: Vec<(&str, &str)> = entries
        .iter()
        .filter(|e| e["subresource"].as_str() != Some("status"))
        .filter_map(|e| Some((e["manager"].as_str()?, e["time"].as_str().unwrap_or(""))))
        .collect();
    let Some(newest) = writes.iter().map(|(_, time)| *time).max() else {
        return true;
    };
    writes
        .iter()
        .any(|(manager, time)| *time == newest && *manager != FIELD_MANAGER)
}
