//! Ordered sync: the I/O that follows `ordering.rs`'s decisions for an
//! Application whose objects carry sync waves or hooks. One call goes as far
//! as it can without waiting: it creates the hooks of a phase, applies a
//! wave, and ends with `End::Waiting` as soon as something must become
//! Healthy (or a hook must finish) first. The next reconcile, started by the
//! watch seeing that object's health change (or by the worker's re-check of
//! a Progressing Application), reads `status.syncRun` and goes on from there.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use kube::Client;
use kube::api::{DeleteParams, Preconditions, PropagationPolicy};
use serde_json::Value;

use crate::api::{Health, HookPhase, HookRecord, HookState, RunPhase, SyncRun, WaveRecord};
use crate::manifest::ObjectId;
use crate::reconcile::annotations;
use crate::reconcile::apply::{self, Applied, ApplyError};
use crate::reconcile::health::{self, Assessment};
use crate::reconcile::kinds::Kinds;
use crate::reconcile::live::api_for;
use crate::reconcile::ordering::{
    self, DeletePolicy, Member, NextHook, NextWave, Ordering, OrderingError,
};
use crate::reconcile::prepare::Desired;
use crate::reconcile::status::short;
use crate::report::events::Events;

/// How long the previous object of a hook may take to go away.
const HOOK_DELETE_TIMEOUT: Duration = Duration::from_secs(60);

pub(super) struct Input<'a> {
    pub client: &'a Client,
    pub kinds: &'a Kinds,
    pub events: &'a Events,
    pub revision: &'a str,
    /// `status.syncRun` as read.
    pub previous: Option<&'a SyncRun>,
    /// The policy lets this reconcile sync (automated, or asked for).
    pub may_sync: bool,
    pub manual: bool,
    pub wave_timeout: Duration,
    /// The ordinary objects, and the wave of each.
    pub desired: &'a mut [Desired],
    pub waves: &'a [i32],
    /// The hook objects, and the phase and delete policy of each.
    pub hooks: &'a mut [Desired],
    pub hook_orderings: &'a [Ordering],
    /// Indexes into `desired` the policy chose to apply.
    pub chosen: &'a [usize],
    /// Objects the policy left alone.
    pub skipped: &'a HashSet<ObjectId>,
    pub prune: &'a [ObjectId],
    /// The Application's sync options (prune propagation).
    pub app_options: crate::reconcile::sync_options::Options,
    pub live: &'a HashMap<ObjectId, Value>,
    /// Objects the server-side diff dry-ran in this reconcile already.
    pub dry_runs: &'a HashMap<ObjectId, Value>,
    /// Custom health rules (CEL) of the Application and the configuration.
    pub health_rules: &'a health::Rules,
}

#[derive(Debug, PartialEq)]
pub(super) enum End {
    Done,
    Waiting {
        reason: &'static str,
        message: String,
    },
    Failed {
        reason: &'static str,
        message: String,
    },
}

pub(super) struct Ordered {
    pub applied: Vec<Applied>,
    /// In the order they were deleted: highest wave first.
    pub pruned: Vec<ObjectId>,
    /// The `status.syncRun` to write.
    pub run: Option<SyncRun>,
    pub end: End,
    /// Objects the policy chose but this reconcile did not apply or prune
    /// yet, with the reason.
    pub held: HashMap<ObjectId, String>,
}

enum Step {
    Done,
    Waiting(String),
    Failed(OrderingError),
}

/// RFC 3339 with milliseconds: wave and hook durations.
pub fn stamp() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

pub(super) async fn sync(mut input: Input<'_>) -> Result<Ordered, ApplyError> {
    let previous = input.previous.filter(|r| r.revision == input.revision);
    let something_to_do = !input.chosen.is_empty() || !input.prune.is_empty();
    // A run starts with a sync to a new revision (never for a drift
    // correction), or when someone asks for a sync again.
    let start = input.may_sync
        && something_to_do
        && match previous {
            None => true,
            Some(run) => input.manual && run.phase.is_finished(),
        };
    let mut out = Ordered {
        applied: Vec::new(),
        pruned: Vec::new(),
        run: None,
        end: End::Done,
        held: HashMap::new(),
    };
    let mut run = if start {
        input
            .events
            .normal(
                "SyncStarted",
                "Sync",
                format!(
                    "sync of revision {} started (waves and hooks)",
                    short(Some(input.revision))
                ),
            )
            .await;
        SyncRun {
            revision: input.revision.to_string(),
            phase: RunPhase::PreSync,
            started_at: stamp(),
            ..Default::default()
        }
    } else {
        match previous {
            Some(run) => run.clone(),
            None => {
                // No run of this revision: drift corrections still follow
                // the waves, without hooks.
                steady(&mut input, &mut out).await?;
                out.run = input.previous.cloned();
                return Ok(out);
            }
        }
    };
    name_generated_hooks(&mut input, &run);
    match run.phase {
        RunPhase::Succeeded => {
            steady(&mut input, &mut out).await?;
            out.run = Some(run);
            return Ok(out);
        }
        RunPhase::Failed => {
            // Nothing more of this revision until a new one or a sync is
            // asked for; the SyncFail hooks are followed to their end.
            refresh_hooks(&input, &mut run, HookPhase::SyncFail).await?;
            start_sync_fail_hooks(&mut input, &mut run).await;
            let message = run.message.clone().unwrap_or_default();
            hold_all(
                &input,
                &mut out,
                "not applied: the sync of this revision failed",
            );
            out.end = End::Failed {
                reason: "SyncFailed",
                message,
            };
            out.run = Some(run);
            return Ok(out);
        }
        _ => {}
    }
    apply::dry_run(input.client, input.desired, input.chosen, input.dry_runs).await?;
    let mut applied_now: HashMap<usize, Value> = HashMap::new();
    loop {
        let step = match run.phase {
            RunPhase::PreSync => hooks_phase(&mut input, &mut run, HookPhase::PreSync).await?,
            RunPhase::Sync => {
                refresh_hooks(&input, &mut run, HookPhase::Sync).await?;
                match waves(&mut input, &mut run, true, &mut applied_now, &mut out).await? {
                    Step::Done => {
                        prune(&input, &mut out).await?;
                        Step::Done
                    }
                    other => other,
                }
            }
            RunPhase::PostSync => hooks_phase(&mut input, &mut run, HookPhase::PostSync).await?,
            RunPhase::Succeeded | RunPhase::Failed => break,
        };
        match step {
            Step::Done => {
                run.phase = match run.phase {
                    RunPhase::PreSync => RunPhase::Sync,
                    RunPhase::Sync => RunPhase::PostSync,
                    _ => {
                        let now = stamp();
                        let took = ordering::elapsed_ms(&run.started_at, &now).unwrap_or(0);
                        input
                            .events
                            .normal(
                                "SyncSucceeded",
                                "Sync",
                                format!(
                                    "sync of revision {} succeeded in {}",
                                    short(Some(input.revision)),
                                    ordering::shown_ms(took)
                                ),
                            )
                            .await;
                        run.finished_at = Some(now);
                        run.message = None;
                        RunPhase::Succeeded
                    }
                };
            }
            Step::Waiting(message) => {
                let reason = if run.phase == RunPhase::Sync {
                    "WaitingForWave"
                } else {
                    "WaitingForHook"
                };
                if run.phase == RunPhase::PreSync {
                    hold_all(
                        &input,
                        &mut out,
                        &format!("waits for the PreSync hooks: {message}"),
                    );
                }
                run.message = Some(message.clone());
                out.end = End::Waiting { reason, message };
                break;
            }
            Step::Failed(error) => {
                out.end = fail(&mut input, &mut run, error).await;
                hold_all(&input, &mut out, "not applied: the sync failed");
                break;
            }
        }
    }
    out.run = Some(run);
    Ok(out)
}

/// A sync with no run in progress: the waves are still followed, so a drift
/// correction of wave 5 waits for wave 0 to be Healthy; no hook runs.
async fn steady(input: &mut Input<'_>, out: &mut Ordered) -> Result<(), ApplyError> {
    if input.chosen.is_empty() && input.prune.is_empty() {
        return Ok(());
    }
    apply::dry_run(input.client, input.desired, input.chosen, input.dry_runs).await?;
    let mut scratch = SyncRun::default();
    let mut applied_now = HashMap::new();
    match waves(input, &mut scratch, false, &mut applied_now, out).await? {
        Step::Done => prune(input, out).await?,
        Step::Waiting(message) => {
            out.end = End::Waiting {
                reason: "WaitingForWave",
                message,
            }
        }
        // Without hooks and without a timeout nothing fails here.
        Step::Failed(error) => {
            out.end = End::Failed {
                reason: error.reason(),
                message: error.to_string(),
            }
        }
    }
    Ok(())
}

fn hold_all(input: &Input<'_>, out: &mut Ordered, why: &str) {
    for &i in input.chosen {
        out.held
            .entry(input.desired[i].manifest.id.clone())
            .or_insert_with(|| why.to_string());
    }
    for id in input.prune {
        out.held
            .entry(id.clone())
            .or_insert_with(|| why.to_string());
    }
}

/// Where a wave member comes from.
#[derive(Clone, Copy)]
enum Source {
    Object(usize),
    Hook(usize),
}

/// Applies the waves in ascending order as far as their health allows.
async fn waves(
    input: &mut Input<'_>,
    run: &mut SyncRun,
    tracking: bool,
    applied_now: &mut HashMap<usize, Value>,
    out: &mut Ordered,
) -> Result<Step, ApplyError> {
    let chosen: HashSet<usize> = input.chosen.iter().copied().collect();
    let index: HashMap<ObjectId, usize> = input
        .desired
        .iter()
        .enumerate()
        .map(|(i, d)| (d.manifest.id.clone(), i))
        .collect();
    loop {
        let mut members: Vec<(i32, (Member, Source))> = Vec::new();
        for (i, d) in input.desired.iter().enumerate() {
            let id = &d.manifest.id;
            if !chosen.contains(&i) && input.skipped.contains(id) {
                continue;
            }
            let live = applied_now
                .get(&i)
                .or_else(|| super::live_object(input.live, id));
            let assessment = match live {
                Some(object) => {
                    health::assess_with(input.health_rules, &id.group, &id.kind, object)
                }
                None => Assessment {
                    status: Health::Missing,
                    message: Some("not in the cluster".into()),
                },
            };
            let member = Member {
                id: id.clone(),
                pending: chosen.contains(&i) && !applied_now.contains_key(&i),
                health: assessment.status,
                message: assessment.message,
                hook: false,
            };
            members.push((input.waves[i], (member, Source::Object(i))));
        }
        if tracking {
            for (j, h) in input.hooks.iter().enumerate() {
                let ordering = input.hook_orderings[j];
                if ordering.hook.map(|(p, _)| p) != Some(HookPhase::Sync) {
                    continue;
                }
                let id = &h.manifest.id;
                let record = run
                    .hooks
                    .iter()
                    .find(|r| ordering::same_hook(r, HookPhase::Sync, id));
                let (health, message) = match record.map(|r| r.state) {
                    None => (Health::Missing, None),
                    Some(HookState::Running) => (Health::Progressing, Some("running".into())),
                    Some(HookState::Succeeded) => (Health::Healthy, None),
                    Some(HookState::Failed) => {
                        (Health::Degraded, record.and_then(|r| r.message.clone()))
                    }
                };
                let member = Member {
                    id: id.clone(),
                    pending: record.is_none(),
                    health,
                    message,
                    hook: true,
                };
                members.push((ordering.wave, (member, Source::Hook(j))));
            }
        } else if !members.iter().any(|(_, (m, _))| m.pending) {
            // Nothing to apply: no reason to wait for anything before the
            // prunes.
            return Ok(Step::Done);
        }
        let sources: HashMap<ObjectId, Source> = members
            .iter()
            .map(|(_, (m, s))| (m.id.clone(), *s))
            .collect();
        let grouped = ordering::group(members.into_iter().map(|(w, (m, _))| (w, m)));
        let next = ordering::next_wave(&grouped);
        let current = match &next {
            NextWave::Apply(w)
            | NextWave::Wait { wave: w, .. }
            | NextWave::HookFailed { wave: w, .. } => Some(*w),
            NextWave::Done => None,
        };
        if tracking {
            let now = stamp();
            for record in run
                .waves
                .iter_mut()
                .filter(|r| r.duration_ms.is_none() && current.is_none_or(|c| r.wave < c))
            {
                let took = ordering::elapsed_ms(&record.started_at, &now).unwrap_or(0);
                record.duration_ms = Some(took);
                input
                    .events
                    .normal(
                        "WaveHealthy",
                        "Sync",
                        format!(
                            "wave {} ({} objects) Healthy after {}",
                            record.wave,
                            record.objects,
                            ordering::shown_ms(took)
                        ),
                    )
                    .await;
            }
            if let Some(wave) = current
                && !run.waves.iter().any(|r| r.wave == wave)
            {
                let objects = grouped.get(&wave).map_or(0, Vec::len) as u32;
                run.waves.push(WaveRecord {
                    wave,
                    objects,
                    started_at: now,
                    duration_ms: None,
                });
                input
                    .events
                    .normal(
                        "WaveStarted",
                        "Sync",
                        format!("wave {wave} ({objects} objects) started"),
                    )
                    .await;
            }
        }
        match next {
            NextWave::Apply(wave) => {
                let pending: Vec<&Member> = grouped[&wave].iter().filter(|m| m.pending).collect();
                let mut objects = Vec::new();
                let mut hooks = Vec::new();
                for member in pending {
                    match sources[&member.id] {
                        Source::Object(i) => objects.push(i),
                        Source::Hook(j) => hooks.push(j),
                    }
                }
                let applied =
                    apply::apply_checked(input.client, input.kinds, input.desired, &objects)
                        .await?;
                for a in applied {
                    if let Some(&i) = index.get(&a.id) {
                        applied_now.insert(i, a.live.clone());
                    }
                    out.applied.push(a);
                }
                for j in hooks {
                    create_hook(input, run, HookPhase::Sync, j).await?;
                }
            }
            NextWave::Wait { wave, unhealthy } => {
                if tracking {
                    let started = run.waves.iter().find(|r| r.wave == wave);
                    let waited = started
                        .and_then(|r| ordering::elapsed_ms(&r.started_at, &stamp()))
                        .unwrap_or(0);
                    if waited > input.wave_timeout.as_millis() as i64 {
                        return Ok(Step::Failed(OrderingError::WaveTimeout {
                            wave,
                            timeout: input.wave_timeout,
                            objects: unhealthy,
                        }));
                    }
                }
                let why = format!("waits for wave {wave} to be Healthy");
                for (&w, members) in grouped.range(wave + 1..) {
                    debug_assert!(w > wave);
                    for m in members.iter().filter(|m| m.pending) {
                        out.held.insert(m.id.clone(), why.clone());
                    }
                }
                for id in input.prune {
                    out.held.insert(id.clone(), why.clone());
                }
                return Ok(Step::Waiting(format!(
                    "waiting for wave {wave} to be Healthy: {}",
                    unhealthy.join("; ")
                )));
            }
            NextWave::HookFailed { id, message, .. } => {
                return Ok(Step::Failed(OrderingError::HookFailed {
                    phase: HookPhase::Sync,
                    object: id.to_string(),
                    message,
                }));
            }
            NextWave::Done => return Ok(Step::Done),
        }
    }
}

/// Deletes the prune targets, highest wave first.
async fn prune(input: &Input<'_>, out: &mut Ordered) -> Result<(), ApplyError> {
    let targets: Vec<(i32, ObjectId)> = input
        .prune
        .iter()
        .map(|id| {
            let wave = super::live_object(input.live, id).map_or(0, ordering::live_wave);
            (wave, id.clone())
        })
        .collect();
    for wave in ordering::prune_order(targets) {
        let pruned = apply::prune(
            input.client,
            input.kinds,
            &wave,
            input.live,
            input.app_options,
        )
        .await?;
        out.pruned.extend(pruned);
    }
    Ok(())
}

fn hook_ids(input: &Input<'_>) -> Vec<(ObjectId, HookPhase, i32)> {
    input
        .hooks
        .iter()
        .zip(input.hook_orderings)
        .filter_map(|(h, o)| {
            o.hook
                .map(|(phase, _)| (h.manifest.id.clone(), phase, o.wave))
        })
        .collect()
}

/// Names the hooks that have only `metadata.generateName` (Argo CD's usual
/// hook Job): a name of this run's own, so each run creates a new object,
/// and the same name in every reconcile of the run. The prefix is kept in
/// an annotation, to find the objects of earlier runs.
fn name_generated_hooks(input: &mut Input<'_>, run: &SyncRun) {
    for (hook, order) in input.hooks.iter_mut().zip(input.hook_orderings) {
        let Some((phase, _)) = order.hook else {
            continue;
        };
        let Some(prefix) = annotations::generate_name(&hook.manifest.body).map(str::to_string)
        else {
            continue;
        };
        let name = annotations::generated_name(&prefix, &run.revision, &run.started_at, phase);
        let metadata = &mut hook.manifest.body["metadata"];
        metadata["name"] = Value::String(name.clone());
        if let Some(map) = metadata.as_object_mut() {
            map.remove("generateName");
        }
        crate::reconcile::prepare::set_entry(
            metadata,
            "annotations",
            annotations::GENERATED_FROM,
            &prefix,
        );
        hook.manifest.id.name = name;
    }
}

/// The PreSync or PostSync hooks: created once per run, then waited for.
async fn hooks_phase(
    input: &mut Input<'_>,
    run: &mut SyncRun,
    phase: HookPhase,
) -> Result<Step, ApplyError> {
    refresh_hooks(input, run, phase).await?;
    loop {
        let ids = hook_ids(input);
        let create = match ordering::next_hook(phase, &ids, &run.hooks) {
            NextHook::Create(create) => create,
            NextHook::Wait(running) => {
                let names: Vec<String> = running
                    .iter()
                    .map(|r| format!("{} {}", r.kind, r.name))
                    .collect();
                return Ok(Step::Waiting(format!(
                    "waiting for the {phase:?} hook{} {} to finish",
                    if names.len() == 1 { "" } else { "s" },
                    names.join(", ")
                )));
            }
            NextHook::Failed(record) => {
                return Ok(Step::Failed(OrderingError::HookFailed {
                    phase,
                    object: record_id(record).to_string(),
                    message: record.message.clone().unwrap_or_else(|| "failed".into()),
                }));
            }
            NextHook::Done => return Ok(Step::Done),
        };
        for i in create {
            // `ids` lists the hooks in `input.hooks` order, skipping none.
            create_hook(input, run, phase, i).await?;
        }
    }
}

fn record_id(record: &HookRecord) -> ObjectId {
    ObjectId {
        group: record.group.clone(),
        version: record.version.clone(),
        kind: record.kind.clone(),
        namespace: record.namespace.clone(),
        name: record.name.clone(),
    }
}

fn delete_policy(input: &Input<'_>, id: &ObjectId) -> DeletePolicy {
    input
        .hooks
        .iter()
        .zip(input.hook_orderings)
        .find(|(h, _)| h.manifest.id.same_object(id))
        .and_then(|(_, o)| o.hook.map(|(_, policy)| policy))
        .unwrap_or_default()
}

/// Creates hook `j` afresh: the object of an earlier run with its name is
/// deleted first (and waited for), since a Job's template cannot be changed.
async fn create_hook(
    input: &mut Input<'_>,
    run: &mut SyncRun,
    phase: HookPhase,
    j: usize,
) -> Result<(), ApplyError> {
    let id = input.hooks[j].manifest.id.clone();
    if let Some(kind) = &input.hooks[j].kind {
        let api = api_for(input.client, &kind.resource, id.namespace.as_deref());
        let existing = api
            .get_opt(&id.name)
            .await
            .map_err(|source| ApplyError::ApplyObject {
                id: id.clone(),
                source,
            })?;
        if delete_policy(input, &id).before_hook_creation {
            delete_earlier_runs(&api, &input.hooks[j].manifest.body, &id).await?;
        }
        if let Some(old) = existing {
            let uid = old.metadata.uid.clone();
            delete(&api, &id, uid.clone()).await?;
            let gone = kube::runtime::wait::await_condition(
                api.clone(),
                &id.name,
                kube::runtime::wait::conditions::is_deleted(uid.as_deref().unwrap_or_default()),
            );
            if tokio::time::timeout(HOOK_DELETE_TIMEOUT, gone)
                .await
                .is_err()
            {
                tracing::warn!(object = %id, "the previous hook object is still being deleted");
            }
        }
    }
    let applied = apply::apply(
        input.client,
        input.kinds,
        input.hooks,
        &[j],
        &HashMap::new(),
    )
    .await?;
    let live = applied
        .into_iter()
        .next()
        .map(|a| a.live)
        .unwrap_or(Value::Null);
    let mut record = HookRecord {
        phase,
        group: id.group.clone(),
        version: id.version.clone(),
        kind: id.kind.clone(),
        namespace: id.namespace.clone(),
        name: id.name.clone(),
        state: HookState::Running,
        started_at: stamp(),
        duration_ms: None,
        message: None,
    };
    tracing::info!(object = %id, ?phase, "hook created");
    input
        .events
        .normal(
            "HookStarted",
            "Hook",
            format!("{phase:?} hook {id} started"),
        )
        .await;
    let assessment = health::assess_with(input.health_rules, &id.group, &id.kind, &live);
    settle(input, &mut record, assessment).await?;
    run.hooks.push(record);
    Ok(())
}

/// A generated hook's objects of earlier runs (same prefix, same
/// Application, another name): deleted before this run's is created.
async fn delete_earlier_runs(
    api: &kube::Api<kube::api::DynamicObject>,
    body: &Value,
    id: &ObjectId,
) -> Result<(), ApplyError> {
    let annotation =
        |key: &'static str| annotations::first(body, &[key]).map(|(_, v)| v.to_string());
    let Some(prefix) = annotation(annotations::GENERATED_FROM) else {
        return Ok(());
    };
    let Some(app) = body
        .pointer("/metadata/labels")
        .and_then(|l| l.get(crate::reconcile::prepare::APP_LABEL))
        .and_then(Value::as_str)
    else {
        return Ok(());
    };
    let owner = annotation(crate::reconcile::prepare::APP_ANNOTATION);
    let selector = format!("{}={app}", crate::reconcile::prepare::APP_LABEL);
    let earlier = api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map_err(|source| ApplyError::ApplyObject {
            id: id.clone(),
            source,
        })?;
    for old in earlier.items {
        let old_annotations = old.metadata.annotations.as_ref();
        let same = |key: &str, want: Option<&str>| {
            old_annotations.and_then(|a| a.get(key)).map(String::as_str) == want
        };
        let name = old.metadata.name.clone().unwrap_or_default();
        if name != id.name
            && same(annotations::GENERATED_FROM, Some(&prefix))
            && same(crate::reconcile::prepare::APP_ANNOTATION, owner.as_deref())
        {
            tracing::info!(object = %id, earlier = %name, "deleting an earlier run's hook");
            let earlier_id = ObjectId { name, ..id.clone() };
            delete(api, &earlier_id, old.metadata.uid.clone()).await?;
        }
    }
    Ok(())
}

async fn delete(
    api: &kube::Api<kube::api::DynamicObject>,
    id: &ObjectId,
    uid: Option<String>,
) -> Result<(), ApplyError> {
    let params = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(&id.name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(source) => Err(ApplyError::Prune {
            id: id.clone(),
            source,
        }),
    }
}

/// Reads the running hooks of `phase` again and records those that finished.
async fn refresh_hooks(
    input: &Input<'_>,
    run: &mut SyncRun,
    phase: HookPhase,
) -> Result<(), ApplyError> {
    for record in run
        .hooks
        .iter_mut()
        .filter(|r| r.phase == phase && r.state == HookState::Running)
    {
        let id = record_id(record);
        let kind = input
            .kinds
            .resolve(input.client, &id.api_version(), &id.kind)
            .await
            .map_err(|source| ApplyError::Kind {
                id: id.clone(),
                source,
            })?;
        let api = api_for(input.client, &kind.resource, id.namespace.as_deref());
        let live = api
            .get_opt(&id.name)
            .await
            .map_err(|source| ApplyError::ApplyObject {
                id: id.clone(),
                source,
            })?;
        let assessment = match live {
            Some(object) => health::assess_with(
                input.health_rules,
                &id.group,
                &id.kind,
                &serde_json::to_value(&object).unwrap_or(Value::Null),
            ),
            None => Assessment {
                status: Health::Missing,
                message: Some("deleted before it finished".into()),
            },
        };
        settle(input, record, assessment).await?;
    }
    Ok(())
}

/// Records a hook's state from its health; a finished one is reported and,
/// by its delete policy, deleted.
async fn settle(
    input: &Input<'_>,
    record: &mut HookRecord,
    assessment: Assessment,
) -> Result<(), ApplyError> {
    let state = ordering::hook_state(assessment.status);
    if state == HookState::Running {
        return Ok(());
    }
    let id = record_id(record);
    let took = ordering::elapsed_ms(&record.started_at, &stamp()).unwrap_or(0);
    record.state = state;
    record.duration_ms = Some(took);
    record.message = assessment.message.clone();
    let note = format!(
        "{:?} hook {id} {} after {}{}",
        record.phase,
        if state == HookState::Succeeded {
            "succeeded"
        } else {
            "failed"
        },
        ordering::shown_ms(took),
        assessment
            .message
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    );
    if state == HookState::Succeeded {
        input.events.normal("HookSucceeded", "Hook", note).await;
    } else {
        input.events.warning("HookFailed", "Hook", note).await;
    }
    if ordering::delete_when_finished(delete_policy(input, &id), state) {
        let kind = input
            .kinds
            .resolve(input.client, &id.api_version(), &id.kind)
            .await
            .map_err(|source| ApplyError::Kind {
                id: id.clone(),
                source,
            })?;
        let api = api_for(input.client, &kind.resource, id.namespace.as_deref());
        delete(&api, &id, None).await?;
    }
    Ok(())
}

/// Marks the run Failed and starts the SyncFail hooks (not waited for).
async fn fail(input: &mut Input<'_>, run: &mut SyncRun, error: OrderingError) -> End {
    let message = error.to_string();
    let reason = error.reason();
    run.phase = RunPhase::Failed;
    run.message = Some(message.clone());
    run.finished_at = Some(stamp());
    input.events.warning(reason, "Sync", message.clone()).await;
    start_sync_fail_hooks(input, run).await;
    End::Failed { reason, message }
}

/// Creates the SyncFail hooks not yet created in this run; one that cannot
/// be created is reported and tried again by the next reconcile.
async fn start_sync_fail_hooks(input: &mut Input<'_>, run: &mut SyncRun) {
    let ids = hook_ids(input);
    if let NextHook::Create(create) = ordering::next_hook(HookPhase::SyncFail, &ids, &run.hooks) {
        for j in create {
            if let Err(error) = create_hook(input, run, HookPhase::SyncFail, j).await {
                tracing::warn!(%error, "failed to start a SyncFail hook");
                input
                    .events
                    .warning(
                        "HookFailed",
                        "Hook",
                        format!("SyncFail hook could not be created: {error}"),
                    )
                    .await;
            }
        }
    }
}
