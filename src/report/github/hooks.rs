//! The webhooks Setpoint recovers: which hook (a repository's or an
//! organization's), and the redelivery of the deliveries GitHub gave up on.

use super::api::*;
use super::*;

/// Whose webhook: a repository's or an organization's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum HookScope {
    Repo { owner: String, repo: String },
    Org(String),
}

/// One webhook, spelled `owner/repo:12345` for a repository's and
/// `orgs/org:12345` for an organization's (the id is in the hook's settings
/// URL on GitHub).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HookRef {
    pub scope: HookScope,
    pub id: u64,
}

impl HookRef {
    /// The hook's API path, without the base URL.
    pub(super) fn path(&self) -> String {
        match &self.scope {
            HookScope::Repo { owner, repo } => format!("/repos/{owner}/{repo}/hooks/{}", self.id),
            HookScope::Org(org) => format!("/orgs/{org}/hooks/{}", self.id),
        }
    }
}

impl FromStr for HookRef {
    type Err = GitHubError;

    fn from_str(text: &str) -> Result<HookRef, GitHubError> {
        let invalid = |reason| GitHubError::InvalidHook {
            hook: text.to_owned(),
            reason,
        };
        let (scope, id) = text.trim().rsplit_once(':').ok_or(invalid("no :id"))?;
        let id = id
            .parse::<u64>()
            .ok()
            .filter(|id| *id > 0)
            .ok_or(invalid("the id is not a positive number"))?;
        let scope = match scope.split('/').collect::<Vec<_>>()[..] {
            ["orgs", org] if is_name(org) => HookScope::Org(org.to_owned()),
            [owner, repo] if is_name(owner) && is_name(repo) => HookScope::Repo {
                owner: owner.to_owned(),
                repo: repo.to_owned(),
            },
            _ => return Err(invalid("not a GitHub owner/repo or orgs/org")),
        };
        Ok(HookRef { scope, id })
    }
}

impl fmt::Display for HookRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            HookScope::Repo { owner, repo } => write!(f, "{owner}/{repo}:{}", self.id),
            HookScope::Org(org) => write!(f, "orgs/{org}:{}", self.id),
        }
    }
}

/// Asks GitHub to deliver again the webhook deliveries that failed: GitHub
/// does not retry them, and a push that never reached Ingest would wait for
/// the next sweep.
pub struct Redelivery {
    api: Api,
    hooks: Vec<HookRef>,
    interval: Duration,
    lookback: Duration,
    /// The (hook, guid) already asked for in this process, and when that
    /// delivery first happened, so that they are asked for once and
    /// forgotten once past the lookback.
    asked: Mutex<HashMap<(HookRef, String), Timestamp>>,
}

/// What one [`Redelivery::run_once`] saw and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedeliveryReport {
    /// Deliveries listed within the lookback, over all hooks.
    pub listed: usize,
    /// Deliveries (by guid) with no successful attempt.
    pub failed: usize,
    /// The guids GitHub was asked, in this run, to deliver again.
    pub redelivered: Vec<String>,
    /// The guids whose redelivery GitHub refused or could not be reached
    /// for; the next run asks again.
    pub not_redelivered: Vec<String>,
}

/// One item of `GET …/hooks/{id}/deliveries`. Every attempt of one event
/// has its own `id` and shares the event's `guid`.
#[derive(Clone, Debug, Deserialize)]
pub(super) struct Delivery {
    pub(super) id: u64,
    pub(super) guid: String,
    pub(super) delivered_at: String,
    #[serde(default)]
    pub(super) redelivery: bool,
    #[serde(default)]
    pub(super) status: String,
    /// What Setpoint's webhook answered; 0 when it was not reached.
    #[serde(default)]
    pub(super) status_code: i64,
    #[serde(default)]
    pub(super) event: String,
    #[serde(default)]
    pub(super) action: Option<String>,
}

impl Delivery {
    pub(super) fn succeeded(&self) -> bool {
        (200..300).contains(&self.status_code)
    }
}

/// The latest attempt of each event none of whose attempts succeeded,
/// oldest event first: what to ask GitHub to deliver again.
pub(super) fn failed_deliveries(deliveries: &[(Timestamp, Delivery)]) -> Vec<&Delivery> {
    struct Event<'a> {
        succeeded: bool,
        first: Timestamp,
        latest: (Timestamp, &'a Delivery),
    }
    let mut events: HashMap<&str, Event<'_>> = HashMap::new();
    for (at, delivery) in deliveries {
        let event = events.entry(delivery.guid.as_str()).or_insert(Event {
            succeeded: false,
            first: *at,
            latest: (*at, delivery),
        });
        event.succeeded |= delivery.succeeded();
        event.first = event.first.min(*at);
        if (*at, delivery.id) > (event.latest.0, event.latest.1.id) {
            event.latest = (*at, delivery);
        }
    }
    let mut failed: Vec<Event<'_>> = events
        .into_values()
        .filter(|event| !event.succeeded)
        .collect();
    failed.sort_by_key(|event| (event.first, event.latest.1.id));
    failed.into_iter().map(|event| event.latest.1).collect()
}

impl Redelivery {
    /// Must be called inside a Tokio runtime (octocrab starts a task).
    pub fn new(settings: &GitHubSettings) -> Result<Redelivery, GitHubError> {
        if settings.hooks.is_empty() {
            return Err(GitHubError::InvalidSettings(
                "no webhooks to recover the deliveries of".into(),
            ));
        }
        if settings.redelivery_interval.is_zero() {
            return Err(GitHubError::InvalidSettings(
                "the redelivery interval must be positive".into(),
            ));
        }
        Ok(Redelivery {
            api: Api::new(settings)?,
            hooks: settings.hooks.clone(),
            interval: settings.redelivery_interval,
            lookback: settings.lookback,
            asked: Mutex::default(),
        })
    }

    /// Runs once at once, then once per interval, until `shutdown` turns
    /// true (or its sender is gone). Errors are logged: the next run tries
    /// again.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !*shutdown.borrow() {
            tokio::select! {
                _ = ticks.tick() => {}
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
            }
            tokio::select! {
                result = self.run_once() => log_report(result),
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Lists each hook's deliveries back to the lookback, and asks GitHub to
    /// deliver again the latest attempt of each event that never succeeded
    /// and that this process has not asked for yet. A hook that cannot be
    /// listed does not stop the others; the first such error is returned.
    pub async fn run_once(&self) -> Result<RedeliveryReport, GitHubError> {
        let cutoff = Timestamp::now()
            .saturating_sub(self.lookback)
            .unwrap_or(Timestamp::MIN);
        self.asked().retain(|_, first| *first >= cutoff);
        let mut report = RedeliveryReport::default();
        let mut first_error = None;
        for hook in &self.hooks {
            if let Err(error) = self.recover(hook, cutoff, &mut report).await {
                warn!(%hook, error = %error_chain(&error), "failed to recover a webhook's deliveries");
                first_error.get_or_insert(error);
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(report),
        }
    }

    pub(super) async fn recover(
        &self,
        hook: &HookRef,
        cutoff: Timestamp,
        report: &mut RedeliveryReport,
    ) -> Result<(), GitHubError> {
        let deliveries = self.list(hook, cutoff).await?;
        report.listed += deliveries.len();
        let failed = failed_deliveries(&deliveries);
        report.failed += failed.len();
        for latest in failed {
            let key = (hook.clone(), latest.guid.clone());
            if self.asked().contains_key(&key) {
                continue;
            }
            match self.redeliver(hook, latest).await {
                Ok(()) => {
                    let first = deliveries
                        .iter()
                        .filter(|(_, delivery)| delivery.guid == latest.guid)
                        .map(|(at, _)| *at)
                        .min()
                        .unwrap_or(cutoff);
                    self.asked().insert(key, first);
                    report.redelivered.push(latest.guid.clone());
                }
                Err(error) => {
                    warn!(%hook, guid = %latest.guid, error = %error_chain(&error), "failed to ask for a redelivery");
                    report.not_redelivered.push(latest.guid.clone());
                }
            }
        }
        Ok(())
    }

    /// The hook's deliveries no older than `cutoff`. GitHub lists the newest
    /// first, a page at a time, each page naming the next in its `Link`
    /// header; the listing stops at the first page that reaches the cutoff.
    pub(super) async fn list(
        &self,
        hook: &HookRef,
        cutoff: Timestamp,
    ) -> Result<Vec<(Timestamp, Delivery)>, GitHubError> {
        let action = format!("list the deliveries of webhook {hook}");
        let mut path = format!("{}/deliveries?per_page={PER_PAGE}", hook.path());
        let mut deliveries = Vec::new();
        for _ in 0..MAX_PAGES {
            let answer = self
                .api
                .send(&action, Request::get(&path))
                .await
                .map_err(|error| match error {
                    GitHubError::Status { code: 404, .. } => GitHubError::HookNotFound {
                        hook: hook.to_string(),
                    },
                    error => error,
                })?;
            let page: Vec<Delivery> =
                serde_json::from_str(&answer.body).map_err(|error| GitHubError::Decode {
                    action: action.clone(),
                    reason: error.to_string(),
                })?;
            let mut reached_cutoff = page.is_empty();
            for delivery in page {
                let at = delivery
                    .delivered_at
                    .parse::<Timestamp>()
                    .map_err(|error| GitHubError::Decode {
                        action: action.clone(),
                        reason: format!(
                            "delivery {} has delivered_at {:?}: {error}",
                            delivery.id, delivery.delivered_at
                        ),
                    })?;
                if at < cutoff {
                    reached_cutoff = true;
                } else {
                    deliveries.push((at, delivery));
                }
            }
            if reached_cutoff {
                return Ok(deliveries);
            }
            match next_link(&answer.headers) {
                Some(next) => path = self.api.same_origin(&next, &action)?,
                None => return Ok(deliveries),
            }
        }
        warn!(%hook, pages = MAX_PAGES, "stopped listing deliveries before the lookback");
        Ok(deliveries)
    }

    pub(super) async fn redeliver(
        &self,
        hook: &HookRef,
        delivery: &Delivery,
    ) -> Result<(), GitHubError> {
        let action = format!(
            "redeliver delivery {} ({} {}) of webhook {hook}",
            delivery.id, delivery.event, delivery.guid
        );
        let path = format!("{}/deliveries/{}/attempts", hook.path(), delivery.id);
        debug!(
            %hook,
            guid = %delivery.guid,
            id = delivery.id,
            status = %delivery.status,
            code = delivery.status_code,
            redelivery = delivery.redelivery,
            action = ?delivery.action,
            "asking for a redelivery"
        );
        self.api.send(&action, Request::post_empty(&path)).await?;
        Ok(())
    }

    pub(super) fn asked(&self) -> std::sync::MutexGuard<'_, HashMap<(HookRef, String), Timestamp>> {
        self.asked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

pub(super) fn log_report(result: Result<RedeliveryReport, GitHubError>) {
    match result {
        Ok(report) if report.redelivered.is_empty() && report.not_redelivered.is_empty() => {
            debug!(
                listed = report.listed,
                failed = report.failed,
                "no webhook delivery to redeliver"
            );
        }
        Ok(report) => info!(
            listed = report.listed,
            failed = report.failed,
            redelivered = ?report.redelivered,
            not_redelivered = ?report.not_redelivered,
            "asked GitHub to redeliver failed webhook deliveries"
        ),
        Err(error) => warn!(
            error = %error_chain(&error),
            "failed to recover webhook deliveries; trying again at the next interval"
        ),
    }
}
