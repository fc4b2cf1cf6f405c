//! A preview on GitHub: the pull request's one comment (created once, then
//! edited in place), and a check run `setpoint/preview` on the head
//! commit: success, failure when a render or dry run failed because of the
//! pull request (with the file and line, as an annotation too), neutral
//! when it failed for another reason (the cluster unreachable).

use octocrab::params::checks::{
    CheckRunConclusion, CheckRunOutput, CheckRunOutputAnnotation, CheckRunOutputAnnotationLevel,
    CheckRunStatus,
};

use crate::event::PullRequest;
use crate::report::github::{CheckRun, GitHubError, PullRequests};

use super::body::{MARKER, Totals};
use super::render::AppPreview;

/// The check run's name.
pub const CHECK_NAME: &str = "setpoint/preview";
/// GitHub's limits on a check run's output text and summary.
const OUTPUT_LIMIT: usize = 65_535;
/// GitHub takes at most 50 annotations per request.
const MAX_ANNOTATIONS: usize = 50;

/// Posts the comment, then the check run. A pull request that touches no
/// Application gets no new comment (an earlier one is edited to say so).
/// A check run refused (a personal token may not create one: they need a
/// GitHub App) is logged, not an error: the comment went out.
pub async fn publish(
    client: &PullRequests,
    pull: &PullRequest,
    previews: &[AppPreview],
    text: &str,
) -> Result<(), GitHubError> {
    let (owner, repo) = pull.project.split_once('/').ok_or_else(|| {
        GitHubError::InvalidSettings(format!("{:?} is not owner/repo", pull.project))
    })?;
    let create = !previews.is_empty();
    match client
        .upsert_comment(owner, repo, pull.number, MARKER, text, create)
        .await?
    {
        Some(posted) => {
            tracing::info!(pull = %pull.key(), comment = posted.id, created = posted.created, "preview posted")
        }
        None => tracing::info!(pull = %pull.key(), "no Application touched: no comment"),
    }
    if let Err(error) = client
        .create_check_run(owner, repo, &check_run(pull, previews, text))
        .await
    {
        tracing::warn!(pull = %pull.key(), error = %crate::report::events::error_chain(&error), "check run not created (it needs a GitHub App installation token)");
    }
    Ok(())
}

/// The check run for `previews` (pure).
pub fn check_run(pull: &PullRequest, previews: &[AppPreview], text: &str) -> CheckRun {
    let totals = Totals::of(previews);
    let failures: Vec<_> = previews
        .iter()
        .filter_map(|p| p.result.as_ref().err().map(|f| (&p.app, f)))
        .collect();
    let conclusion = if failures.iter().any(|(_, f)| !f.transient) {
        CheckRunConclusion::Failure
    } else if !failures.is_empty() {
        CheckRunConclusion::Neutral
    } else {
        CheckRunConclusion::Success
    };
    let title = if failures.is_empty() {
        totals.summary()
    } else {
        format!(
            "{} of {} failed to render or dry-run",
            failures.len(),
            totals.apps
        )
    };
    let mut summary = format!("{}.\n", totals.summary());
    for (app, failure) in &failures {
        let at = match (&failure.file, failure.line) {
            (Some(file), Some(line)) => format!(" ({file}, line {line})"),
            (Some(file), None) => format!(" ({file})"),
            _ => String::new(),
        };
        summary.push_str(&format!(
            "\n- {app}: {}{at}: {}",
            failure.reason, failure.message
        ));
    }
    let annotations = failures
        .iter()
        .filter_map(|(app, failure)| {
            let file = failure.file.clone()?;
            let line = failure.line.unwrap_or(1) as u32;
            Some(CheckRunOutputAnnotation {
                path: file,
                start_line: line,
                end_line: line,
                start_column: None,
                end_column: None,
                annotation_level: CheckRunOutputAnnotationLevel::Failure,
                message: cut(&failure.message, 4_000),
                title: Some(format!("{app}: {}", failure.reason)),
                raw_details: None,
            })
        })
        .take(MAX_ANNOTATIONS)
        .collect();
    CheckRun {
        name: CHECK_NAME.into(),
        head_sha: pull.head_sha.clone(),
        status: CheckRunStatus::Completed,
        conclusion,
        output: CheckRunOutput {
            title,
            summary: cut(&summary, OUTPUT_LIMIT),
            text: Some(cut(text, OUTPUT_LIMIT)),
            annotations,
            images: Vec::new(),
        },
    }
}

fn cut(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_string();
    }
    let mut out: String = text.chars().take(limit.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::AppKey;
    use crate::preview::render::{Changes, Failure};

    fn pull() -> PullRequest {
        PullRequest {
            provider: "github".into(),
            delivery: String::new(),
            repo_urls: vec![],
            project: "acme/deploy".into(),
            number: 1,
            base_branch: "main".into(),
            default_branch: None,
            base_sha: Some("1".repeat(40)),
            head_sha: "2".repeat(40),
            head_ref: "refs/pull/1/head".into(),
            fork: false,
            updated_at: None,
            apps: vec![],
        }
    }

    fn failed(transient: bool) -> AppPreview {
        AppPreview {
            app: AppKey::new("team", "web"),
            input: None,
            result: Err(Failure {
                reason: "InvalidManifest".into(),
                message: "app/bad.yaml: document 0, line 4: mapping values are not allowed".into(),
                file: Some("app/bad.yaml".into()),
                line: Some(4),
                transient,
            }),
        }
    }

    fn json(run: &CheckRun) -> serde_json::Value {
        serde_json::to_value(run).unwrap()
    }

    #[test]
    fn a_clean_preview_succeeds() {
        let ok = AppPreview {
            app: AppKey::new("team", "web"),
            input: None,
            result: Ok(Changes::default()),
        };
        let run = json(&check_run(&pull(), &[ok], "text"));
        assert_eq!(run["name"], "setpoint/preview");
        assert_eq!(run["status"], "completed");
        assert_eq!(run["conclusion"], "success");
        assert_eq!(run["head_sha"], "2".repeat(40));
    }

    #[test]
    fn a_broken_render_fails_with_its_file_and_line() {
        let run = json(&check_run(&pull(), &[failed(false)], "text"));
        assert_eq!(run["conclusion"], "failure");
        let summary = run["output"]["summary"].as_str().unwrap();
        assert!(summary.contains("app/bad.yaml, line 4"), "{summary}");
        let annotation = &run["output"]["annotations"][0];
        assert_eq!(annotation["path"], "app/bad.yaml");
        assert_eq!(annotation["start_line"], 4);
        assert_eq!(annotation["annotation_level"], "failure");
    }

    #[test]
    fn a_failure_not_of_the_pull_requests_making_is_neutral() {
        let run = json(&check_run(&pull(), &[failed(true)], "text"));
        assert_eq!(run["conclusion"], "neutral");
    }
}
