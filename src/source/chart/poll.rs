//! Following new chart versions without a webhook: each distinct chart
//! repository (with its credentials) is fetched once per poll interval,
//! however many Applications use it, each at its own jittered moment; the
//! Applications whose picked version changed (or whose repository failed or
//! recovered) are enqueued, and only those.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::reflector::Store;

use super::{Auth, ChartSource, Repository};
use crate::api::{Application, ConditionStatus, ConditionType};
use crate::context::Context;
use crate::event::{AppKey, Cause, Event};
use crate::queue::Queue;

/// What a poll saw for one Application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The version its range picks.
    Version(String),
    /// No version could be picked: the reason (a condition's).
    Failed(&'static str),
}

/// Whether a poll that saw `now` for an Application enqueues it (pure).
/// The first poll that sees an Application enqueues it only when its status
/// says it runs another version than the one now picked (a version published
/// while no poller ran); later polls when what they see changed.
pub fn enqueue(previous: Option<&Seen>, now: &Seen, synced_version: Option<&str>) -> bool {
    match previous {
        Some(previous) => previous != now,
        None => match (now, synced_version) {
            (Seen::Version(version), Some(synced)) => version != synced,
            _ => false,
        },
    }
}

/// Whether `app`'s last reconcile stalled because its repository lacked the
/// chart or a version in its range: a poll that now picks a version enqueues
/// it whatever it saw before (level, not edge: a missed change cannot leave
/// it stalled).
pub fn stalled_on_absence(app: &Application) -> bool {
    app.status.as_ref().is_some_and(|status| {
        status.conditions.iter().any(|c| {
            c.type_ == ConditionType::Stalled
                && c.status == ConditionStatus::True
                && matches!(c.reason.as_str(), "ChartVersionNotFound" | "ChartNotFound")
        })
    })
}

/// The version part of `status.sync.revision` (`1.2.3` or `1.2.3@sha256:…`).
pub fn synced_version(app: &Application) -> Option<&str> {
    let revision = app.status.as_ref()?.sync.revision.as_deref()?;
    Some(revision.split_once('@').map_or(revision, |(v, _)| v))
}

/// One repository as polled: the URL and the credentials' Secret.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Group {
    repository: Repository,
    /// `namespace/secret`, read as the identity of the first Application.
    secret: Option<String>,
}

/// Polls every `interval` until the process ends.
pub async fn run(
    ctx: Context,
    store: Store<Application>,
    queue: Arc<dyn Queue>,
    interval: Duration,
) {
    let interval = interval.max(Duration::from_millis(200));
    let tick = (interval / 10).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut seen: HashMap<AppKey, Seen> = HashMap::new();
    let mut due: HashMap<Group, Instant> = HashMap::new();
    let random = std::collections::hash_map::RandomState::new();
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let mut groups: HashMap<Group, Vec<Arc<Application>>> = HashMap::new();
        for app in store.state() {
            let source = &app.spec.source;
            let Some(chart) = source.chart.as_deref() else {
                continue;
            };
            if app.spec.suspend {
                continue;
            }
            let Ok(repository) = Repository::parse(&source.repo_url, chart) else {
                continue;
            };
            let secret = source
                .credentials_secret
                .as_ref()
                .map(|s| format!("{}/{s}", app.namespace().unwrap_or_default()));
            groups
                .entry(Group { repository, secret })
                .or_default()
                .push(app);
        }
        let now = Instant::now();
        due.retain(|group, _| groups.contains_key(group));
        for (group, apps) in groups {
            let at = due
                .entry(group.clone())
                .or_insert_with(|| now + jittered(interval, &random, &group));
            if *at > now {
                continue;
            }
            *at = now + jittered(interval, &random, &group);
            poll(&ctx, &queue, &group, &apps, &mut seen).await;
        }
        let live: std::collections::HashSet<AppKey> = store
            .state()
            .iter()
            .map(|a| AppKey::new(a.namespace().unwrap_or_default(), a.name_any()))
            .collect();
        seen.retain(|key, _| live.contains(key));
    }
}

/// `interval` ± 10%, different for each repository and each time.
fn jittered(interval: Duration, random: &impl BuildHasher, group: &Group) -> Duration {
    let mut hasher = random.build_hasher();
    group.hash(&mut hasher);
    Instant::now().hash(&mut hasher);
    let fraction = (hasher.finish() % 2001) as f64 / 1000.0 - 1.0;
    interval.mul_f64(1.0 + 0.1 * fraction)
}

async fn poll(
    ctx: &Context,
    queue: &Arc<dyn Queue>,
    group: &Group,
    apps: &[Arc<Application>],
    seen: &mut HashMap<AppKey, Seen>,
) {
    let auth = match auth(ctx, &apps[0]).await {
        Ok(auth) => auth,
        Err(reason) => {
            tracing::debug!(repository = %group.repository.key(), reason, "chart poll: no credentials");
            return;
        }
    };
    let charts: &ChartSource = &ctx.charts;
    let listing = charts
        .listing(&group.repository, auth.as_ref(), Duration::ZERO, None)
        .await;
    if let Err(error) = &listing {
        tracing::info!(repository = %group.repository.key(), %error, "chart poll failed");
    }
    for app in apps {
        let key = AppKey::new(app.namespace().unwrap_or_default(), app.name_any());
        let source = &app.spec.source;
        let chart = source.chart.as_deref().unwrap_or_default();
        let now = match &listing {
            Ok(listing) => match ChartSource::choose(
                listing,
                &group.repository,
                chart,
                source.target_revision.as_deref(),
            ) {
                Ok(entry) => Seen::Version(entry.version),
                Err(error) => Seen::Failed(error.reason()),
            },
            Err(error) => Seen::Failed(error.reason()),
        };
        let picked_at_last = matches!(now, Seen::Version(_)) && stalled_on_absence(app);
        if enqueue(seen.get(&key), &now, synced_version(app)) || picked_at_last {
            let version = match &now {
                Seen::Version(version) => Some(version.clone()),
                Seen::Failed(_) => None,
            };
            tracing::info!(app = %key, repository = %group.repository.key(), ?version, "chart poll: enqueue");
            let event = Event::new(
                key.clone(),
                Cause::Chart {
                    repository: group.repository.key(),
                    version: version.clone(),
                },
            )
            .with_revision(version);
            if let Err(error) = queue.publish(&event).await {
                tracing::warn!(app = %key, %error, "chart poll could not enqueue");
                // Seen again next time: not recorded, so it is enqueued then.
                continue;
            }
        }
        seen.insert(key, now);
    }
}

/// The credentials of `app`'s chart repository, read as its identity.
async fn auth(ctx: &Context, app: &Application) -> Result<Option<Auth>, &'static str> {
    let identity = ctx.tenancy.identity(app).map_err(|e| e.reason())?;
    let client = ctx.client_for(&identity);
    crate::reconcile::chart_auth(app, &client)
        .await
        .map_err(|e| e.reason())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(v: &str) -> Seen {
        Seen::Version(v.into())
    }

    #[test]
    fn only_a_change_enqueues() {
        assert!(!enqueue(
            Some(&version("1.0.0")),
            &version("1.0.0"),
            Some("1.0.0")
        ));
        assert!(enqueue(
            Some(&version("1.0.0")),
            &version("1.1.0"),
            Some("1.0.0")
        ));
        let down = Seen::Failed("ChartRepositoryUnreachable");
        assert!(enqueue(Some(&version("1.0.0")), &down, Some("1.0.0")));
        assert!(!enqueue(Some(&down), &down, Some("1.0.0")));
        assert!(enqueue(Some(&down), &version("1.0.0"), Some("1.0.0")));
    }

    #[test]
    fn an_application_stalled_on_a_missing_version_is_waiting_for_one() {
        let mut app = Application::new("web", Default::default());
        assert!(!stalled_on_absence(&app));
        let condition = |type_, reason: &str| crate::api::Condition {
            type_,
            status: ConditionStatus::True,
            reason: reason.into(),
            message: String::new(),
            last_transition_time: String::new(),
            observed_generation: None,
        };
        let mut status = crate::api::ApplicationStatus::default();
        status
            .conditions
            .push(condition(ConditionType::Stalled, "ChartVersionNotFound"));
        app.status = Some(status.clone());
        assert!(stalled_on_absence(&app));
        status.conditions[0].reason = "ChartDigestMismatch".into();
        app.status = Some(status.clone());
        assert!(!stalled_on_absence(&app), "a poll cannot mend that");
        status.conditions[0] = condition(ConditionType::Ready, "ChartNotFound");
        app.status = Some(status);
        assert!(!stalled_on_absence(&app));
    }

    #[test]
    fn a_first_sight_enqueues_only_what_runs_another_version() {
        assert!(!enqueue(None, &version("1.0.0"), None));
        assert!(!enqueue(None, &version("1.0.0"), Some("1.0.0")));
        assert!(enqueue(None, &version("1.1.0"), Some("1.0.0")));
        assert!(!enqueue(
            None,
            &Seen::Failed("ChartNotFound"),
            Some("1.0.0")
        ));
    }
}
