//! Ordering inside one Application (pure): sync waves and hooks.
//!
//! `setpoint.dev/sync-wave: "<integer>"` (default 0) puts an object in a
//! wave; waves are applied in ascending order, and a wave starts only when
//! every object of the earlier ones is Healthy. `setpoint.dev/hook` makes an
//! object a hook: created only at that phase of the sync of a new revision
//! (PreSync before the first wave, Sync with its wave, PostSync after the
//! last wave, SyncFail when the sync fails), never pruned as an ordinary
//! object and never drift. The I/O that follows these decisions is
//! `ordered_sync.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::annotations::{self, HookAnnotation};
use crate::api::{Health, HookPhase, HookRecord, HookState};
use crate::manifest::{Manifest, ObjectId};

pub const WAVE_ANNOTATION: &str = annotations::WAVE[0];
pub const HOOK_ANNOTATION: &str = annotations::HOOK[0];
pub const HOOK_DELETE_POLICY_ANNOTATION: &str = annotations::DELETE_POLICY[0];

/// `spec.syncPolicy.waveTimeout` when it is not set.
pub const DEFAULT_WAVE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, thiserror::Error)]
pub enum OrderingError {
    #[error("{object} ({origin}): the annotation {annotation} is {value:?}, not an integer")]
    InvalidWave {
        object: String,
        origin: String,
        annotation: &'static str,
        value: String,
    },
    #[error(
        "{object} ({origin}): the annotation {annotation} is {value:?}, not {}",
        if *.annotation == "helm.sh/hook" {
            "a list of pre-install, pre-upgrade, post-install, post-upgrade, crd-install, pre-delete, post-delete, pre-rollback, post-rollback, test"
        } else {
            "a list of PreSync, Sync, PostSync, SyncFail, Skip, PreDelete, PostDelete"
        }
    )]
    InvalidHook {
        object: String,
        origin: String,
        annotation: &'static str,
        value: String,
    },
    #[error(
        "{object} ({origin}): the annotation {annotation} is {value:?}, not a list of BeforeHookCreation, HookSucceeded, HookFailed (or Helm's before-hook-creation, hook-succeeded, hook-failed)"
    )]
    InvalidDeletePolicy {
        object: String,
        origin: String,
        annotation: &'static str,
        value: String,
    },
    #[error(
        "{object} ({origin}): metadata.name is missing; metadata.generateName is allowed only on hooks (a setpoint.dev/hook, argocd.argoproj.io/hook or helm.sh/hook annotation), which get a new name each sync"
    )]
    GenerateNameNotHook { object: String, origin: String },
    #[error("spec.syncPolicy.waveTimeout {value:?} is not a duration like 30s, 10m or 1h")]
    InvalidWaveTimeout { value: String },
    #[error("wave {wave} was not Healthy within {}: {}", humantime(*.timeout), .objects.join("; "))]
    WaveTimeout {
        wave: i32,
        timeout: Duration,
        objects: Vec<String>,
    },
    #[error("the {phase:?} hook {object} failed: {message}")]
    HookFailed {
        phase: HookPhase,
        object: String,
        message: String,
    },
}

impl OrderingError {
    /// The condition and Event reason.
    pub fn reason(&self) -> &'static str {
        match self {
            OrderingError::InvalidWave { .. } => "InvalidSyncWave",
            OrderingError::InvalidHook { .. } | OrderingError::InvalidDeletePolicy { .. } => {
                "InvalidHook"
            }
            OrderingError::GenerateNameNotHook { .. } => "InvalidObject",
            OrderingError::InvalidWaveTimeout { .. } => "InvalidWaveTimeout",
            OrderingError::WaveTimeout { .. } => "WaveTimeout",
            OrderingError::HookFailed { .. } => "HookFailed",
        }
    }
}

fn humantime(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else if d.subsec_millis() == 0 {
        format!("{secs}s")
    } else {
        format!("{}ms", d.as_millis())
    }
}

pub use super::annotations::DeletePolicy;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ordering {
    pub wave: i32,
    pub hook: Option<(HookPhase, DeletePolicy)>,
}

/// Where one manifest goes in a sync.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// An ordinary object, in this wave.
    Object(i32),
    /// A hook: one entry per phase it runs at (Argo CD allows
    /// `PreSync,PostSync`), each with the hook's wave and delete policy.
    Hooks(Vec<Ordering>),
    /// Never applied (`Skip`, deletion hooks, Helm's test hooks).
    Skip,
}

/// The wave and hook annotations of one manifest (Setpoint's, Argo CD's or
/// Helm's: `annotations.rs`).
pub fn placement(manifest: &Manifest) -> Result<Placement, OrderingError> {
    let body = &manifest.body;
    let object = || manifest.id.to_string();
    let origin = || manifest.origin.to_string();
    let wave = match annotations::wave(body) {
        None => 0,
        Some((annotation, value)) => {
            value
                .trim()
                .parse()
                .map_err(|_| OrderingError::InvalidWave {
                    object: object(),
                    origin: origin(),
                    annotation,
                    value: value.to_string(),
                })?
        }
    };
    let phases = match annotations::hook(body) {
        Ok(HookAnnotation::None) => Vec::new(),
        Ok(HookAnnotation::Skip) => return Ok(Placement::Skip),
        Ok(HookAnnotation::Phases(phases)) => phases,
        Err(unknown) => {
            return Err(OrderingError::InvalidHook {
                object: object(),
                origin: origin(),
                annotation: unknown.annotation,
                value: unknown.value,
            });
        }
    };
    if phases.is_empty() {
        if annotations::generate_name(body).is_some() {
            return Err(OrderingError::GenerateNameNotHook {
                object: object(),
                origin: origin(),
            });
        }
        return Ok(Placement::Object(wave));
    }
    let policy =
        annotations::delete_policy(body).map_err(|unknown| OrderingError::InvalidDeletePolicy {
            object: object(),
            origin: origin(),
            annotation: unknown.annotation,
            value: unknown.value,
        })?;
    Ok(Placement::Hooks(
        phases
            .into_iter()
            .map(|phase| Ordering {
                wave,
                hook: Some((phase, policy)),
            })
            .collect(),
    ))
}

/// Whether a live object is a hook: hooks are never pruned as ordinary
/// objects, and their changes are not drift.
pub fn is_hook(live: &Value) -> bool {
    annotations::is_hook(live)
}

/// The wave a live object was applied in (for the prune order); an
/// unreadable annotation counts as wave 0.
pub fn live_wave(live: &Value) -> i32 {
    annotations::wave(live)
        .and_then(|(_, w)| w.trim().parse().ok())
        .unwrap_or(0)
}

/// `spec.syncPolicy.waveTimeout`: `30s`, `10m`, `1h` (jiff's friendly
/// format, or ISO 8601).
pub fn wave_timeout(value: Option<&str>) -> Result<Duration, OrderingError> {
    let Some(value) = value else {
        return Ok(DEFAULT_WAVE_TIMEOUT);
    };
    value
        .trim()
        .parse::<jiff::SignedDuration>()
        .ok()
        .and_then(|d| Duration::try_from(d).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| OrderingError::InvalidWaveTimeout {
            value: value.to_string(),
        })
}

/// One object of a wave, as the sync sees it now.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    pub id: ObjectId,
    /// Chosen to be applied (or, for a hook, to be created) and not yet done.
    pub pending: bool,
    pub health: Health,
    pub message: Option<String>,
    /// A Sync hook: its failure fails the sync.
    pub hook: bool,
}

/// What the sync does next with its waves.
#[derive(Debug, PartialEq)]
pub enum NextWave {
    /// Apply the pending members of this wave: every earlier wave is Healthy.
    Apply(i32),
    /// This wave is applied but not yet Healthy: the named objects.
    Wait { wave: i32, unhealthy: Vec<String> },
    /// A Sync hook of this wave failed.
    HookFailed {
        wave: i32,
        id: ObjectId,
        message: String,
    },
    /// Every wave is applied and Healthy.
    Done,
}

/// Groups `(wave, item)` pairs by wave, ascending; items keep their order.
pub fn group<T>(items: impl IntoIterator<Item = (i32, T)>) -> BTreeMap<i32, Vec<T>> {
    let mut waves: BTreeMap<i32, Vec<T>> = BTreeMap::new();
    for (wave, item) in items {
        waves.entry(wave).or_default().push(item);
    }
    waves
}

/// The lowest wave with something to do: pending members are applied first;
/// then a wave is waited for until every member is Healthy.
pub fn next_wave(waves: &BTreeMap<i32, Vec<Member>>) -> NextWave {
    for (&wave, members) in waves {
        if members.iter().any(|m| m.pending) {
            return NextWave::Apply(wave);
        }
        if let Some(failed) = members
            .iter()
            .find(|m| m.hook && matches!(m.health, Health::Degraded | Health::Missing))
        {
            return NextWave::HookFailed {
                wave,
                id: failed.id.clone(),
                message: failed
                    .message
                    .clone()
                    .unwrap_or_else(|| format!("{:?}", failed.health)),
            };
        }
        let unhealthy: Vec<String> = members
            .iter()
            .filter(|m| m.health != Health::Healthy)
            .map(|m| match &m.message {
                Some(message) => format!("{} is {:?}: {message}", m.id, m.health),
                None => format!("{} is {:?}", m.id, m.health),
            })
            .collect();
        if !unhealthy.is_empty() {
            return NextWave::Wait { wave, unhealthy };
        }
    }
    NextWave::Done
}

/// Prune targets grouped by wave, highest wave first (the reverse of the
/// apply order); within a wave, the apply module's kind order.
pub fn prune_order(targets: Vec<(i32, ObjectId)>) -> Vec<Vec<ObjectId>> {
    group(targets).into_values().rev().collect()
}

/// What the hooks of one phase need next.
#[derive(Debug, PartialEq)]
pub enum NextHook<'a> {
    /// Create these (indexes into the hooks given): not yet created in this
    /// run. The hooks of one phase run side by side.
    Create(Vec<usize>),
    /// Created and still running.
    Wait(Vec<&'a HookRecord>),
    Failed(&'a HookRecord),
    /// Every hook of the phase succeeded (or it has none).
    Done,
}

/// Is `record` the run's record of this hook object?
pub fn same_hook(record: &HookRecord, phase: HookPhase, id: &ObjectId) -> bool {
    record.phase == phase
        && record.group == id.group
        && record.kind == id.kind
        && record.namespace == id.namespace
        && record.name == id.name
}

/// The hooks of `phase` among `hooks` (each its object, phase and wave),
/// given the run's records of the hooks it created. The waves of a phase run
/// in ascending order (Argo CD's `sync-wave`, Helm's `hook-weight`); the
/// hooks of one wave side by side.
pub fn next_hook<'a>(
    phase: HookPhase,
    hooks: &[(ObjectId, HookPhase, i32)],
    records: &'a [HookRecord],
) -> NextHook<'a> {
    let mut waves: Vec<i32> = hooks
        .iter()
        .filter(|(_, p, _)| *p == phase)
        .map(|(_, _, w)| *w)
        .collect();
    waves.sort_unstable();
    waves.dedup();
    for wave in waves {
        let members = || {
            hooks
                .iter()
                .enumerate()
                .filter(move |(_, (_, p, w))| *p == phase && *w == wave)
        };
        let create: Vec<usize> = members()
            .filter(|(_, (id, _, _))| !records.iter().any(|r| same_hook(r, phase, id)))
            .map(|(i, _)| i)
            .collect();
        if !create.is_empty() {
            return NextHook::Create(create);
        }
        let of_wave: Vec<&HookRecord> = records
            .iter()
            .filter(|r| members().any(|(_, (id, _, _))| same_hook(r, phase, id)))
            .collect();
        if let Some(failed) = of_wave.iter().find(|r| r.state == HookState::Failed) {
            return NextHook::Failed(failed);
        }
        let running: Vec<&HookRecord> = of_wave
            .into_iter()
            .filter(|r| r.state == HookState::Running)
            .collect();
        if !running.is_empty() {
            return NextHook::Wait(running);
        }
    }
    // Hooks of the run that the render no longer has still count.
    let of_phase: Vec<&HookRecord> = records.iter().filter(|r| r.phase == phase).collect();
    if let Some(failed) = of_phase.iter().find(|r| r.state == HookState::Failed) {
        return NextHook::Failed(failed);
    }
    let running: Vec<&HookRecord> = of_phase
        .into_iter()
        .filter(|r| r.state == HookState::Running)
        .collect();
    if running.is_empty() {
        NextHook::Done
    } else {
        NextHook::Wait(running)
    }
}

/// A hook's state from its live object's health: a Job is done when
/// Complete and failed when Failed; an object of another kind is done once
/// Healthy.
pub fn hook_state(health: Health) -> HookState {
    match health {
        Health::Healthy => HookState::Succeeded,
        Health::Degraded | Health::Missing => HookState::Failed,
        // As gitops-engine: a Suspended hook (a suspended Job) has not finished.
        Health::Suspended | Health::Progressing | Health::Unknown => HookState::Running,
    }
}

/// Whether the finished hook is deleted now, by its delete policy.
pub fn delete_when_finished(policy: DeletePolicy, state: HookState) -> bool {
    match state {
        HookState::Succeeded => policy.hook_succeeded,
        HookState::Failed => policy.hook_failed,
        HookState::Running => false,
    }
}

/// Milliseconds between two RFC 3339 times; None when one does not parse.
pub fn elapsed_ms(from: &str, to: &str) -> Option<i64> {
    let from: jiff::Timestamp = from.parse().ok()?;
    let to: jiff::Timestamp = to.parse().ok()?;
    Some(to.duration_since(from).as_millis() as i64)
}

/// `1.2s`, `340ms`, `2m05s`: a duration as status messages and Events show it.
pub fn shown_ms(ms: i64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::Origin;
    use serde_json::json;

    fn id(kind: &str, name: &str) -> ObjectId {
        ObjectId {
            group: String::new(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: Some("ns".into()),
            name: name.into(),
        }
    }

    /// The wave and the first phase of a manifest's placement.
    fn ordering(manifest: &Manifest) -> Result<Ordering, OrderingError> {
        Ok(match placement(manifest)? {
            Placement::Object(wave) => Ordering { wave, hook: None },
            Placement::Hooks(hooks) => hooks[0],
            Placement::Skip => Ordering::default(),
        })
    }

    fn manifest(annotations: Value) -> Manifest {
        Manifest {
            id: id("ConfigMap", "c"),
            origin: Origin {
                file: "apps/c.yaml".into(),
                document: 1,
            },
            body: json!({"metadata": {"name": "c", "annotations": annotations}}),
        }
    }

    #[test]
    fn waves_default_to_zero_and_may_be_negative() {
        assert_eq!(ordering(&manifest(json!({}))).unwrap().wave, 0);
        assert_eq!(
            ordering(&manifest(json!({WAVE_ANNOTATION: "-1"})))
                .unwrap()
                .wave,
            -1
        );
        assert_eq!(
            ordering(&manifest(json!({WAVE_ANNOTATION: " 5 "})))
                .unwrap()
                .wave,
            5
        );
    }

    #[test]
    fn a_bad_wave_names_the_object_its_file_and_the_value() {
        let error = ordering(&manifest(json!({WAVE_ANNOTATION: "early"}))).unwrap_err();
        assert_eq!(error.reason(), "InvalidSyncWave");
        assert_eq!(
            error.to_string(),
            "ConfigMap ns/c (apps/c.yaml (document 1)): the annotation setpoint.dev/sync-wave is \"early\", not an integer"
        );
    }

    #[test]
    fn hooks_and_their_delete_policies_are_read() {
        let plain = ordering(&manifest(json!({}))).unwrap();
        assert_eq!(plain.hook, None);
        let pre = ordering(&manifest(json!({HOOK_ANNOTATION: "PreSync"}))).unwrap();
        assert_eq!(
            pre.hook,
            Some((HookPhase::PreSync, DeletePolicy::default()))
        );
        let fail = ordering(&manifest(json!({
            HOOK_ANNOTATION: "SyncFail",
            HOOK_DELETE_POLICY_ANNOTATION: "HookSucceeded",
        })))
        .unwrap();
        let (phase, policy) = fail.hook.unwrap();
        assert_eq!(phase, HookPhase::SyncFail);
        assert!(policy.hook_succeeded && !policy.before_hook_creation);
        let bad = ordering(&manifest(json!({HOOK_ANNOTATION: "PreSink"}))).unwrap_err();
        assert_eq!(bad.reason(), "InvalidHook");
        assert!(bad.to_string().contains("\"PreSink\""), "{bad}");
        let bad_policy = ordering(&manifest(json!({
            HOOK_ANNOTATION: "PostSync",
            HOOK_DELETE_POLICY_ANNOTATION: "Never",
        })))
        .unwrap_err();
        assert_eq!(bad_policy.reason(), "InvalidHook");
    }

    #[test]
    fn argo_cd_and_helm_placements() {
        let helm = placement(&manifest(json!({
            "helm.sh/hook": "pre-install,post-upgrade",
            "helm.sh/hook-weight": "-2",
            "helm.sh/hook-delete-policy": "hook-succeeded",
        })))
        .unwrap();
        let Placement::Hooks(hooks) = helm else {
            panic!("{helm:?}")
        };
        assert_eq!(hooks.len(), 2);
        assert!(hooks.iter().all(|h| h.wave == -2));
        assert_eq!(hooks[0].hook.unwrap().0, HookPhase::PreSync);
        assert_eq!(hooks[1].hook.unwrap().0, HookPhase::PostSync);
        assert_eq!(
            placement(&manifest(json!({"argocd.argoproj.io/hook": "Skip"}))).unwrap(),
            Placement::Skip
        );
        assert_eq!(
            placement(&manifest(json!({"argocd.argoproj.io/sync-wave": "3"}))).unwrap(),
            Placement::Object(3)
        );
        let bad = placement(&manifest(json!({"argocd.argoproj.io/sync-wave": "x"}))).unwrap_err();
        assert!(
            bad.to_string()
                .contains("argocd.argoproj.io/sync-wave is \"x\""),
            "{bad}"
        );
        // generateName: a hook's is fine, an ordinary object's is refused.
        let mut nameless = manifest(json!({}));
        nameless.body = json!({"metadata": {"generateName": "job-"}});
        let refused = placement(&nameless).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("generateName is allowed only on hooks")
        );
        nameless.body["metadata"]["annotations"] = json!({"argocd.argoproj.io/hook": "PreSync"});
        assert!(matches!(placement(&nameless).unwrap(), Placement::Hooks(_)));
    }

    #[test]
    fn the_wave_timeout_defaults_to_ten_minutes_and_reads_durations() {
        assert_eq!(wave_timeout(None).unwrap(), Duration::from_secs(600));
        assert_eq!(wave_timeout(Some("30s")).unwrap(), Duration::from_secs(30));
        assert_eq!(wave_timeout(Some("2m")).unwrap(), Duration::from_secs(120));
        assert_eq!(wave_timeout(Some("1h")).unwrap(), Duration::from_secs(3600));
        assert!(wave_timeout(Some("soon")).is_err());
        assert!(wave_timeout(Some("0s")).is_err());
    }

    fn member(name: &str, pending: bool, health: Health) -> Member {
        Member {
            id: id("ConfigMap", name),
            pending,
            health,
            message: None,
            hook: false,
        }
    }

    #[test]
    fn waves_are_grouped_ascending() {
        let waves = group([(5, "c"), (0, "a"), (-1, "crd"), (0, "b")]);
        let order: Vec<(i32, Vec<&str>)> = waves.into_iter().collect();
        assert_eq!(
            order,
            vec![(-1, vec!["crd"]), (0, vec!["a", "b"]), (5, vec!["c"])]
        );
    }

    #[test]
    fn the_next_wave_waits_for_every_earlier_object_to_be_healthy() {
        // Nothing applied yet: the lowest wave first.
        let mut waves = group([
            (0, member("deploy", true, Health::Missing)),
            (5, member("config", true, Health::Missing)),
        ]);
        assert_eq!(next_wave(&waves), NextWave::Apply(0));
        // Wave 0 applied, still progressing: wave 5 waits.
        waves.get_mut(&0).unwrap()[0] = member("deploy", false, Health::Progressing);
        assert_eq!(
            next_wave(&waves),
            NextWave::Wait {
                wave: 0,
                unhealthy: vec!["ConfigMap ns/deploy is Progressing".into()]
            }
        );
        // Healthy: wave 5 may go.
        waves.get_mut(&0).unwrap()[0] = member("deploy", false, Health::Healthy);
        assert_eq!(next_wave(&waves), NextWave::Apply(5));
        waves.get_mut(&5).unwrap()[0] = member("config", false, Health::Healthy);
        assert_eq!(next_wave(&waves), NextWave::Done);
    }

    #[test]
    fn a_failed_sync_hook_stops_the_waves() {
        let mut hook = member("migrate", false, Health::Degraded);
        hook.hook = true;
        hook.message = Some("BackoffLimitExceeded".into());
        let waves = group([(0, hook), (1, member("after", true, Health::Missing))]);
        assert_eq!(
            next_wave(&waves),
            NextWave::HookFailed {
                wave: 0,
                id: id("ConfigMap", "migrate"),
                message: "BackoffLimitExceeded".into()
            }
        );
    }

    #[test]
    fn prunes_go_highest_wave_first() {
        let order = prune_order(vec![
            (0, id("Deployment", "web")),
            (5, id("ConfigMap", "late")),
            (-1, id("CustomResourceDefinition", "crd")),
        ]);
        let names: Vec<Vec<&str>> = order
            .iter()
            .map(|w| w.iter().map(|i| i.name.as_str()).collect())
            .collect();
        assert_eq!(names, vec![vec!["late"], vec!["web"], vec!["crd"]]);
    }

    fn record(phase: HookPhase, name: &str, state: HookState) -> HookRecord {
        let id = id("Job", name);
        HookRecord {
            phase,
            group: id.group,
            version: id.version,
            kind: id.kind,
            namespace: id.namespace,
            name: id.name,
            state,
            ..Default::default()
        }
    }

    #[test]
    fn the_hooks_of_a_phase_are_created_once_then_waited_for() {
        let hooks = vec![
            (id("Job", "migrate"), HookPhase::PreSync, 0),
            (id("Job", "notify"), HookPhase::PostSync, 0),
            (id("Job", "page"), HookPhase::SyncFail, 0),
        ];
        assert_eq!(
            next_hook(HookPhase::PreSync, &hooks, &[]),
            NextHook::Create(vec![0])
        );
        let running = [record(HookPhase::PreSync, "migrate", HookState::Running)];
        assert!(matches!(
            next_hook(HookPhase::PreSync, &hooks, &running),
            NextHook::Wait(r) if r.len() == 1
        ));
        let failed = [record(HookPhase::PreSync, "migrate", HookState::Failed)];
        assert!(matches!(
            next_hook(HookPhase::PreSync, &hooks, &failed),
            NextHook::Failed(r) if r.name == "migrate"
        ));
        let done = [record(HookPhase::PreSync, "migrate", HookState::Succeeded)];
        assert_eq!(next_hook(HookPhase::PreSync, &hooks, &done), NextHook::Done);
        // A phase without hooks is done at once; the next phase's hooks are
        // still to create.
        assert_eq!(next_hook(HookPhase::Sync, &hooks, &done), NextHook::Done);
        assert_eq!(
            next_hook(HookPhase::PostSync, &hooks, &done),
            NextHook::Create(vec![1])
        );
    }

    #[test]
    fn the_waves_of_a_phase_run_in_order() {
        let hooks = vec![
            (id("Job", "second"), HookPhase::PreSync, 5),
            (id("Job", "first-a"), HookPhase::PreSync, -1),
            (id("Job", "first-b"), HookPhase::PreSync, -1),
        ];
        assert_eq!(
            next_hook(HookPhase::PreSync, &hooks, &[]),
            NextHook::Create(vec![1, 2])
        );
        let one_running = [
            record(HookPhase::PreSync, "first-a", HookState::Succeeded),
            record(HookPhase::PreSync, "first-b", HookState::Running),
        ];
        assert!(matches!(
            next_hook(HookPhase::PreSync, &hooks, &one_running),
            NextHook::Wait(r) if r.len() == 1 && r[0].name == "first-b"
        ));
        let first_done = [
            record(HookPhase::PreSync, "first-a", HookState::Succeeded),
            record(HookPhase::PreSync, "first-b", HookState::Succeeded),
        ];
        assert_eq!(
            next_hook(HookPhase::PreSync, &hooks, &first_done),
            NextHook::Create(vec![0])
        );
    }

    #[test]
    fn hook_states_and_delete_policies() {
        assert_eq!(hook_state(Health::Healthy), HookState::Succeeded);
        assert_eq!(hook_state(Health::Degraded), HookState::Failed);
        assert_eq!(hook_state(Health::Progressing), HookState::Running);
        let only = |succeeded, failed| DeletePolicy {
            before_hook_creation: false,
            hook_succeeded: succeeded,
            hook_failed: failed,
        };
        assert!(delete_when_finished(
            only(true, false),
            HookState::Succeeded
        ));
        assert!(!delete_when_finished(only(true, false), HookState::Failed));
        assert!(delete_when_finished(only(false, true), HookState::Failed));
        assert!(delete_when_finished(only(true, true), HookState::Failed));
        assert!(!delete_when_finished(
            DeletePolicy::default(),
            HookState::Succeeded
        ));
    }

    #[test]
    fn durations_between_status_times() {
        assert_eq!(
            elapsed_ms("2026-12-03T16:00:00.250Z", "2026-12-03T16:00:01.750Z"),
            Some(1500)
        );
        assert_eq!(shown_ms(340), "340ms");
        assert_eq!(shown_ms(1500), "1.5s");
        assert_eq!(shown_ms(125_000), "2m05s");
    }
}
