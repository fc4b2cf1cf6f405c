//! Which Applications a pull request touches (pure): those following its
//! base repository and branch whose path or recorded inputs (Kustomize
//! bases, Helm chart and values files: `status.sourceInputs`) hold one of
//! the files `git diff base...head` lists. The same matching as a push's
//! routing (`ingest/webhook/route.rs`), asked as if the diff were a push
//! to the base branch.

use crate::event::PullRequest;
use crate::ingest::webhook::AppSource;
use crate::ingest::webhook::route::{Push, Routed, route_why};

/// The Applications `changed` touches, sorted, each with the first changed
/// file that reaches it.
pub fn select(pull: &PullRequest, changed: &[String], apps: &[AppSource]) -> Vec<Routed> {
    if changed.is_empty() {
        return Vec::new();
    }
    let push = Push {
        repo_urls: pull.repo_urls.clone(),
        git_ref: format!("refs/heads/{}", pull.base_branch),
        commit: pull.head_sha.clone(),
        case_insensitive: true,
        default_branch: pull.default_branch.clone(),
        deleted: false,
        changed_files: Some(changed.to_vec()),
    };
    route_why(&push, apps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::AppKey;

    const URL: &str = "https://github.com/acme/deploy.git";

    fn pull() -> PullRequest {
        PullRequest {
            provider: "github".into(),
            delivery: "d".into(),
            repo_urls: vec![URL.into()],
            project: "acme/deploy".into(),
            number: 7,
            base_branch: "main".into(),
            default_branch: Some("main".into()),
            base_sha: Some("1".repeat(40)),
            head_sha: "2".repeat(40),
            head_ref: "refs/pull/7/head".into(),
            fork: false,
            updated_at: None,
            apps: Vec::new(),
        }
    }

    fn app(name: &str, revision: Option<&str>, path: &str, inputs: &[&str]) -> AppSource {
        AppSource {
            key: AppKey::new("team", name),
            repo_url: URL.into(),
            target_revision: revision.map(Into::into),
            path: Some(path.into()),
            inputs: inputs.iter().map(|i| i.to_string()).collect(),
        }
    }

    fn names(routed: &[Routed]) -> Vec<&str> {
        routed.iter().map(|r| r.key.name.as_str()).collect()
    }

    fn files(list: &[&str]) -> Vec<String> {
        list.iter().map(|f| f.to_string()).collect()
    }

    #[test]
    fn a_change_under_an_apps_path_selects_it_alone() {
        let apps = [
            app("web", Some("main"), "apps/web", &[]),
            app("api", Some("main"), "apps/api", &[]),
        ];
        let routed = select(&pull(), &files(&["apps/web/deploy.yaml"]), &apps);
        assert_eq!(names(&routed), ["web"]);
        assert_eq!(routed[0].input.as_deref(), Some("apps/web/deploy.yaml"));
    }

    #[test]
    fn kustomize_bases_and_helm_values_select_every_reader() {
        let apps = [
            app(
                "prod",
                Some("main"),
                "envs/prod",
                &["envs/prod", "bases/web"],
            ),
            app(
                "staging",
                Some("main"),
                "envs/staging",
                &["envs/staging", "bases/web"],
            ),
            app(
                "chart",
                Some("main"),
                "charts/web",
                &["charts/web", "values/prod.yaml"],
            ),
        ];
        let routed = select(&pull(), &files(&["bases/web/deploy.yaml"]), &apps);
        assert_eq!(names(&routed), ["prod", "staging"]);
        let routed = select(&pull(), &files(&["values/prod.yaml"]), &apps);
        assert_eq!(names(&routed), ["chart"]);
    }

    #[test]
    fn only_apps_following_the_base_branch_are_selected() {
        let apps = [
            app("main", Some("main"), "apps/web", &[]),
            app("default", None, "apps/web", &[]),
            app("release", Some("release"), "apps/web", &[]),
        ];
        // `default` follows the default branch, which is the base here.
        let routed = select(&pull(), &files(&["apps/web/a.yaml"]), &apps);
        assert_eq!(names(&routed), ["default", "main"]);
        let mut other = pull();
        other.base_branch = "release".into();
        assert_eq!(
            names(&select(&other, &files(&["apps/web/a.yaml"]), &apps)),
            ["release"]
        );
    }

    #[test]
    fn nothing_changed_or_elsewhere_selects_nothing() {
        let apps = [app("web", Some("main"), "apps/web", &[])];
        assert!(select(&pull(), &[], &apps).is_empty());
        assert!(select(&pull(), &files(&["README.md", "apps/webby/x.yaml"]), &apps).is_empty());
        let mut other_repo = pull();
        other_repo.repo_urls = vec!["https://github.com/acme/other.git".into()];
        assert!(select(&other_repo, &files(&["apps/web/x.yaml"]), &apps).is_empty());
    }
}
