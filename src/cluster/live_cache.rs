//! Live state of one cluster, from its watches: every object of a watched
//! kind that carries Setpoint's label, as the last watch event or Setpoint's
//! own apply left it. A reconcile reads its live objects here instead of
//! sending a GET for each (Argo CD's controller keeps such a cache per
//! cluster too).
//!
//! The live-object watches (`ingest/watch.rs`) feed it, one scope at a time
//! (a kind cluster-wide, or a kind in one namespace). A scope answers only
//! while its watch is synced: after its first listing, and again after each
//! relist (410 Gone, an API server restart) or interruption. Until then an
//! object it would hold is [`Lookup::Unknown`] and the reconcile asks the
//! API server, as it does for a kind no watch covers yet. The objects carry
//! Setpoint's label, so an object that is not here under a synced scope does
//! not exist with that label; one made by hand without it is found by the
//! apply, which adopts it, as the GET path does.
//!
//! Writes go through: the answer of an apply replaces the cached copy at
//! once, so a reconcile never reads a copy older than its own write. A watch
//! event older than what is held (by `resourceVersion`) is ignored.
//!
//! Objects are held as JSON text, several times smaller than a parsed
//! `Value`, without `kubectl`'s last-applied annotation (nothing reads it);
//! `managedFields` stay, for the diff and drift attribution.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Mutex;

use serde_json::Value;

use crate::manifest::ObjectId;

/// A kind at one version.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvk {
    pub group: String,
    pub version: String,
    pub kind: String,
}

impl Gvk {
    pub fn new(group: &str, version: &str, kind: &str) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
        }
    }

    fn of(id: &ObjectId) -> Self {
        Self::new(&id.group, &id.version, &id.kind)
    }

    fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

/// What the cache knows of one object.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    /// A synced watch holds it.
    Found(Value),
    /// A synced watch covers it and has no such object (with Setpoint's
    /// label).
    Absent,
    /// No synced watch covers it: ask the API server.
    Unknown,
}

/// (namespace, name).
type Key = (Option<String>, String);

#[derive(Default)]
pub struct LiveCache {
    kinds: Mutex<HashMap<Gvk, KindCache>>,
}

#[derive(Default)]
struct KindCache {
    /// The watches of this kind: None is cluster-wide (or a cluster-scoped
    /// kind), Some a namespace.
    scopes: HashMap<Option<String>, ScopeState>,
    objects: HashMap<Key, Stored>,
}

#[derive(Default)]
struct ScopeState {
    synced: bool,
    /// During a (re)list: what it returned so far, and what Setpoint wrote
    /// meanwhile (newer than the list, so kept).
    listing: Option<(HashSet<Key>, HashSet<Key>)>,
}

struct Stored {
    resource_version: String,
    json: Box<[u8]>,
    /// Held from the answer to Setpoint's own apply (not yet from a watch).
    written: bool,
}

impl KindCache {
    /// Whether a synced scope covers `namespace` (None: a cluster-scoped
    /// object).
    fn covers(&self, namespace: Option<&str>) -> bool {
        let synced = |scope: &Option<String>| self.scopes.get(scope).is_some_and(|s| s.synced);
        synced(&None) || namespace.is_some_and(|ns| synced(&Some(ns.to_string())))
    }

    fn in_scope(scope: &Option<String>, key: &Key) -> bool {
        scope.is_none() || scope == &key.0
    }

    /// Holds `object` unless what is held is newer; false when it was not.
    fn put(&mut self, key: Key, object: &Value, written: bool) -> bool {
        let resource_version = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if let Some(held) = self.objects.get(&key)
            && newer(&held.resource_version, resource_version)
        {
            return false;
        }
        let Ok(json) = serde_json::to_vec(&slim(object)) else {
            return false;
        };
        self.objects.insert(
            key,
            Stored {
                resource_version: resource_version.to_string(),
                json: json.into_boxed_slice(),
                written,
            },
        );
        true
    }
}

/// Whether `held` is a later version than `incoming`. Resource versions are
/// opaque, but every API server backed by etcd writes them as increasing
/// integers; when either is not one, the incoming copy wins.
fn newer(held: &str, incoming: &str) -> bool {
    match (held.parse::<u64>(), incoming.parse::<u64>()) {
        (Ok(held), Ok(incoming)) => held > incoming,
        _ => false,
    }
}

/// The object without what nothing reads and much of it is.
fn slim(object: &Value) -> Value {
    let mut slim = object.clone();
    if let Some(annotations) = slim
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    slim
}

fn key_of(object: &Value) -> Option<Key> {
    let metadata = object.get("metadata")?;
    let name = metadata.get("name")?.as_str()?.to_string();
    let namespace = metadata
        .get("namespace")
        .and_then(Value::as_str)
        .map(String::from);
    Some((namespace, name))
}

impl LiveCache {
    fn kinds(&self) -> std::sync::MutexGuard<'_, HashMap<Gvk, KindCache>> {
        self.kinds.lock().expect("live cache lock")
    }

    /// The live copy of `id`, if a synced watch can say.
    pub fn get(&self, id: &ObjectId) -> Lookup {
        let kinds = self.kinds();
        let Some(kind) = kinds.get(&Gvk::of(id)) else {
            return Lookup::Unknown;
        };
        if !kind.covers(id.namespace.as_deref()) {
            return Lookup::Unknown;
        }
        let key = (id.namespace.clone(), id.name.clone());
        match kind.objects.get(&key) {
            Some(stored) => match serde_json::from_slice(&stored.json) {
                Ok(object) => Lookup::Found(object),
                Err(_) => Lookup::Unknown,
            },
            None => Lookup::Absent,
        }
    }

    /// Every object of `gvk` in `namespace` whose annotation `annotation`
    /// is `owner`, when a synced watch covers that scope (None otherwise).
    pub fn owned_by(
        &self,
        gvk: &Gvk,
        namespace: Option<&str>,
        annotation: &str,
        owner: &str,
    ) -> Option<Vec<(ObjectId, Value)>> {
        let kinds = self.kinds();
        let kind = kinds.get(gvk)?;
        if !kind.covers(namespace) {
            return None;
        }
        // The owner's key is in the text as the annotation's value: only
        // those objects are parsed.
        let needle = serde_json::to_string(owner).ok()?;
        let mut found = Vec::new();
        for ((ns, name), stored) in &kind.objects {
            if ns.as_deref() != namespace || !contains(&stored.json, needle.as_bytes()) {
                continue;
            }
            let Ok(object) = serde_json::from_slice::<Value>(&stored.json) else {
                continue;
            };
            let annotated = object
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(annotation))
                .and_then(Value::as_str)
                == Some(owner);
            if annotated {
                let id = ObjectId {
                    group: gvk.group.clone(),
                    version: gvk.version.clone(),
                    kind: gvk.kind.clone(),
                    namespace: ns.clone(),
                    name: name.clone(),
                };
                found.push((id, object));
            }
        }
        found.sort_by(|a, b| a.0.cmp(&b.0));
        Some(found)
    }

    /// What the API server answered to Setpoint's apply of `id`.
    pub fn written(&self, id: &ObjectId, object: &Value) {
        let mut kinds = self.kinds();
        let Some(kind) = kinds.get_mut(&Gvk::of(id)) else {
            return;
        };
        let key = (id.namespace.clone(), id.name.clone());
        if kind.put(key.clone(), object, true) {
            for (scope, state) in kind.scopes.iter_mut() {
                if let Some((_, written)) = state.listing.as_mut()
                    && KindCache::in_scope(scope, &key)
                {
                    written.insert(key.clone());
                }
            }
        }
    }

    /// Setpoint deleted `id` (a prune).
    pub fn deleted(&self, id: &ObjectId) {
        if let Some(kind) = self.kinds().get_mut(&Gvk::of(id)) {
            kind.objects
                .remove(&(id.namespace.clone(), id.name.clone()));
        }
    }

    /// A watch of `gvk` in `scope` (re)lists: the scope answers nothing
    /// until [`listed`](Self::listed).
    pub fn listing(&self, gvk: &Gvk, scope: Option<&str>) {
        let mut kinds = self.kinds();
        let state = kinds
            .entry(gvk.clone())
            .or_default()
            .scopes
            .entry(scope.map(String::from))
            .or_default();
        state.synced = false;
        state.listing = Some(Default::default());
    }

    /// An object a watch saw (listed or changed). True when it is the very
    /// version Setpoint's own apply answered (the same resource version):
    /// the reconcile that wrote it reports what it is.
    pub fn seen(&self, gvk: &Gvk, object: &Value) -> bool {
        let Some(key) = key_of(object) else {
            return false;
        };
        let mut object = object.clone();
        object["apiVersion"] = Value::String(gvk.api_version());
        object["kind"] = Value::String(gvk.kind.clone());
        let mut kinds = self.kinds();
        let kind = kinds.entry(gvk.clone()).or_default();
        for (scope, state) in kind.scopes.iter_mut() {
            if let Some((listed, _)) = state.listing.as_mut()
                && KindCache::in_scope(scope, &key)
            {
                listed.insert(key.clone());
            }
        }
        let own = kind.objects.get(&key).is_some_and(|held| {
            held.written
                && Some(held.resource_version.as_str())
                    == object
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
        });
        kind.put(key, &object, false);
        own
    }

    /// An object a watch saw deleted (or no longer labelled).
    pub fn gone(&self, gvk: &Gvk, object: &Value) {
        let Some(key) = key_of(object) else { return };
        let mut kinds = self.kinds();
        let Some(kind) = kinds.get_mut(gvk) else {
            return;
        };
        let incoming = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let held_newer = kind
            .objects
            .get(&key)
            .is_some_and(|held| newer(&held.resource_version, incoming));
        if !held_newer {
            kind.objects.remove(&key);
        }
    }

    /// The (re)list of `gvk` in `scope` is complete: what it did not return
    /// (and Setpoint did not write meanwhile) is gone, and the scope
    /// answers.
    pub fn listed(&self, gvk: &Gvk, scope: Option<&str>) {
        let mut kinds = self.kinds();
        let Some(kind) = kinds.get_mut(gvk) else {
            return;
        };
        let scope = scope.map(String::from);
        let Some(state) = kind.scopes.get_mut(&scope) else {
            return;
        };
        let (listed, written) = state.listing.take().unwrap_or_default();
        state.synced = true;
        kind.objects.retain(|key, _| {
            !KindCache::in_scope(&scope, key) || listed.contains(key) || written.contains(key)
        });
    }

    /// The watch of `gvk` in `scope` failed: it answers again after its
    /// next event (which a resumed watch sends from where it stopped).
    pub fn interrupted(&self, gvk: &Gvk, scope: Option<&str>) {
        if let Some(state) = self
            .kinds()
            .get_mut(gvk)
            .and_then(|kind| kind.scopes.get_mut(&scope.map(String::from)))
        {
            state.synced = false;
        }
    }

    /// The watch of `gvk` in `scope` delivered an event after an
    /// interruption: it is live again (a relist says so at its end instead).
    pub fn resumed(&self, gvk: &Gvk, scope: Option<&str>) {
        if let Some(state) = self
            .kinds()
            .get_mut(gvk)
            .and_then(|kind| kind.scopes.get_mut(&scope.map(String::from)))
            && state.listing.is_none()
        {
            state.synced = true;
        }
    }

    /// The watch of `gvk` in `scope` stopped: its objects go, but those
    /// another scope of the kind still covers.
    pub fn stopped(&self, gvk: &Gvk, scope: Option<&str>) {
        let mut kinds = self.kinds();
        let Some(kind) = kinds.get_mut(gvk) else {
            return;
        };
        let scope = scope.map(String::from);
        kind.scopes.remove(&scope);
        if kind.scopes.is_empty() {
            kinds.remove(gvk);
            return;
        }
        let remaining: BTreeSet<Option<String>> = kind.scopes.keys().cloned().collect();
        kind.objects.retain(|key, _| {
            !KindCache::in_scope(&scope, key)
                || remaining.iter().any(|s| KindCache::in_scope(s, key))
        });
    }

    /// Objects held, for the metrics and the benchmarks.
    pub fn len(&self) -> usize {
        self.kinds().values().map(|k| k.objects.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployments() -> Gvk {
        Gvk::new("apps", "v1", "Deployment")
    }

    fn id(namespace: &str, name: &str) -> ObjectId {
        ObjectId {
            group: "apps".into(),
            version: "v1".into(),
            kind: "Deployment".into(),
            namespace: Some(namespace.into()),
            name: name.into(),
        }
    }

    fn object(namespace: &str, name: &str, rv: &str, replicas: i64) -> Value {
        json!({
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv,
                         "annotations": {"setpoint.dev/app": format!("{namespace}/app"),
                                         "kubectl.kubernetes.io/last-applied-configuration": "{...}"}},
            "spec": {"replicas": replicas}
        })
    }

    fn replicas(lookup: Lookup) -> Option<i64> {
        match lookup {
            Lookup::Found(object) => object["spec"]["replicas"].as_i64(),
            other => panic!("{other:?}"),
        }
    }

    fn synced(cache: &LiveCache, scope: Option<&str>, objects: &[Value]) {
        cache.listing(&deployments(), scope);
        for object in objects {
            cache.seen(&deployments(), object);
        }
        cache.listed(&deployments(), scope);
    }

    #[test]
    fn a_scope_answers_only_once_its_listing_is_done() {
        let cache = LiveCache::default();
        assert_eq!(cache.get(&id("a", "web")), Lookup::Unknown, "no watch");
        cache.listing(&deployments(), None);
        cache.seen(&deployments(), &object("a", "web", "5", 1));
        assert_eq!(cache.get(&id("a", "web")), Lookup::Unknown, "still listing");
        cache.listed(&deployments(), None);
        let Lookup::Found(found) = cache.get(&id("a", "web")) else {
            panic!()
        };
        assert_eq!(found["kind"], "Deployment");
        assert_eq!(found["apiVersion"], "apps/v1");
        assert!(
            found["metadata"]["annotations"]
                .get("kubectl.kubernetes.io/last-applied-configuration")
                .is_none()
        );
        assert_eq!(cache.get(&id("a", "api")), Lookup::Absent);
        // Another version of the kind is not covered.
        let mut beta = id("a", "web");
        beta.version = "v1beta1".into();
        assert_eq!(cache.get(&beta), Lookup::Unknown);
    }

    #[test]
    fn a_namespace_scope_covers_its_namespace_only() {
        let cache = LiveCache::default();
        synced(&cache, Some("a"), &[object("a", "web", "5", 1)]);
        assert_eq!(replicas(cache.get(&id("a", "web"))), Some(1));
        assert_eq!(cache.get(&id("b", "web")), Lookup::Unknown);
    }

    #[test]
    fn a_write_is_read_back_at_once_and_an_older_event_does_not_undo_it() {
        let cache = LiveCache::default();
        synced(&cache, None, &[object("a", "web", "5", 1)]);
        cache.written(&id("a", "web"), &object("a", "web", "9", 5));
        assert_eq!(replicas(cache.get(&id("a", "web"))), Some(5));
        // The watch catches up with an event from before the write.
        cache.seen(&deployments(), &object("a", "web", "7", 3));
        assert_eq!(replicas(cache.get(&id("a", "web"))), Some(5));
        cache.gone(&deployments(), &object("a", "web", "8", 3));
        assert_eq!(replicas(cache.get(&id("a", "web"))), Some(5));
        // A later change by someone else wins.
        cache.seen(&deployments(), &object("a", "web", "10", 1));
        assert_eq!(replicas(cache.get(&id("a", "web"))), Some(1));
        cache.gone(&deployments(), &object("a", "web", "11", 1));
        assert_eq!(cache.get(&id("a", "web")), Lookup::Absent);
    }

    #[test]
    fn the_watch_tells_setpoints_own_write_from_a_later_one() {
        let cache = LiveCache::default();
        synced(&cache, None, &[object("a", "web", "5", 1)]);
        assert!(
            !cache.seen(&deployments(), &object("a", "web", "6", 1)),
            "someone else's"
        );
        cache.written(&id("a", "web"), &object("a", "web", "9", 5));
        assert!(
            cache.seen(&deployments(), &object("a", "web", "9", 5)),
            "the apply's own answer"
        );
        assert!(
            !cache.seen(&deployments(), &object("a", "web", "9", 5)),
            "only once"
        );
        cache.written(&id("a", "web"), &object("a", "web", "12", 4));
        assert!(
            !cache.seen(&deployments(), &object("a", "web", "13", 4)),
            "the controller's, after it"
        );
    }

    #[test]
    fn a_relist_forgets_what_it_no_longer_returns_but_keeps_what_setpoint_wrote_meanwhile() {
        let cache = LiveCache::default();
        synced(
            &cache,
            None,
            &[object("a", "old", "1", 1), object("a", "kept", "2", 1)],
        );
        cache.listing(&deployments(), None);
        assert_eq!(cache.get(&id("a", "kept")), Lookup::Unknown, "relisting");
        cache.seen(&deployments(), &object("a", "kept", "3", 2));
        cache.written(&id("a", "new"), &object("a", "new", "4", 1));
        cache.listed(&deployments(), None);
        assert_eq!(replicas(cache.get(&id("a", "kept"))), Some(2));
        assert_eq!(replicas(cache.get(&id("a", "new"))), Some(1));
        assert_eq!(cache.get(&id("a", "old")), Lookup::Absent);
    }

    #[test]
    fn an_interrupted_watch_answers_again_after_its_next_event() {
        let cache = LiveCache::default();
        synced(&cache, None, &[object("a", "web", "1", 1)]);
        cache.interrupted(&deployments(), None);
        assert_eq!(cache.get(&id("a", "web")), Lookup::Unknown);
        cache.resumed(&deployments(), None);
        assert_eq!(replicas(cache.get(&id("a", "web"))), Some(1));
    }

    #[test]
    fn a_stopped_watch_drops_what_no_other_scope_covers() {
        let cache = LiveCache::default();
        synced(&cache, Some("a"), &[object("a", "web", "1", 1)]);
        synced(&cache, Some("b"), &[object("b", "web", "2", 1)]);
        cache.stopped(&deployments(), Some("a"));
        assert_eq!(cache.get(&id("a", "web")), Lookup::Unknown);
        assert_eq!(replicas(cache.get(&id("b", "web"))), Some(1));
        assert_eq!(cache.len(), 1);
        cache.stopped(&deployments(), Some("b"));
        assert!(cache.is_empty());
    }

    #[test]
    fn the_objects_of_an_owner_are_found_by_its_annotation() {
        let cache = LiveCache::default();
        let mut other = object("a", "other", "3", 1);
        other["metadata"]["annotations"]["setpoint.dev/app"] = json!("a/app2");
        synced(
            &cache,
            None,
            &[
                object("a", "web", "1", 1),
                object("b", "web", "2", 1),
                other,
            ],
        );
        let owned = cache
            .owned_by(&deployments(), Some("a"), "setpoint.dev/app", "a/app")
            .unwrap();
        assert_eq!(
            owned.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(),
            [id("a", "web")]
        );
        assert_eq!(
            cache.owned_by(
                &Gvk::new("", "v1", "Service"),
                Some("a"),
                "setpoint.dev/app",
                "a/app"
            ),
            None
        );
    }
}
