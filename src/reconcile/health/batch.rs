//! Jobs and CronJobs, as Argo CD reads them (its CronJob rule is a Lua
//! script in its resource customizations: the same decisions here).

use serde_json::Value;

use super::{Assessment, condition, count, explain, flag, int, is_true, text};

/// Complete is Healthy, Failed (or FailureTarget, a failure cleaning up)
/// Degraded; a Job suspended on purpose is Suspended; else Progressing.
pub(super) fn job(live: &Value) -> Assessment {
    if condition(live, "Complete").is_some_and(is_true) {
        return Assessment::healthy();
    }
    for failure in ["Failed", "FailureTarget"] {
        if let Some(failed) = condition(live, failure)
            && is_true(failed)
        {
            return Assessment::degraded(explain(failed, "job failed"));
        }
    }
    if flag(live, "/spec/suspend") {
        return Assessment::suspended("Job is suspended");
    }
    let succeeded = count(live, "/status/succeeded");
    match int(live, "/spec/completions") {
        Some(completions) => {
            Assessment::progressing(format!("{succeeded} of {completions} completions"))
        }
        None => Assessment::progressing("running"),
    }
}

/// Suspended when `spec.suspend`; Degraded when its last scheduled Job did
/// not succeed (nothing running, and the last success older than the last
/// schedule); otherwise Healthy: a CronJob not scheduled yet, or whose Job
/// runs, cannot be told apart from a healthy one by its status.
pub(super) fn cron_job(live: &Value) -> Assessment {
    if flag(live, "/spec/suspend") {
        return Assessment::suspended("CronJob is suspended");
    }
    let Some(scheduled) = text(live, "/status/lastScheduleTime") else {
        return Assessment::healthy_because("not scheduled yet");
    };
    let Some(succeeded) = text(live, "/status/lastSuccessfulTime") else {
        return Assessment::healthy_because("no run has succeeded yet");
    };
    let running = live
        .pointer("/status/active")
        .and_then(Value::as_array)
        .is_some_and(|active| !active.is_empty());
    if running {
        return Assessment::healthy_because("a job is running");
    }
    // RFC 3339 times in UTC, as the API server writes them, sort as text.
    if succeeded < scheduled {
        return Assessment::degraded(format!(
            "the job scheduled at {scheduled} did not succeed (last success {succeeded})"
        ));
    }
    Assessment::healthy()
}
