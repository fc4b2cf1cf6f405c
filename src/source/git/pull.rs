//! Pull requests' heads in the mirror, for previews: the head commit
//! fetched from the ref the Git host keeps for it in the base repository
//! (`refs/pull/N/head` on GitHub, `refs/merge-requests/N/head` on GitLab,
//! also for a fork's pull request), and the files it changes against its
//! base (`git diff base...head`, the three-dot form: from the merge base,
//! so commits the base branch gained since do not count).

use super::command::Git;
use super::remote::Remote;
use super::revision::{Wanted, is_valid_ref_name};
use super::{BRANCHES, Credentials, GitError, GitSource};

/// Where a pull request's head lands in the mirror: its own namespace, so
/// the branch and tag refspecs (and their `--prune`) never touch it.
const PULLS_PREFIX: &str = "refs/setpoint/pulls/";

/// Every pull request's head the hosts keep in the base repository, into
/// the same namespace as `fetch_pull_head`'s.
const PULL_HEADS: &str = "+refs/pull/*/head:refs/setpoint/pulls/pull/*/head";
const MERGE_REQUEST_HEADS: &str =
    "+refs/merge-requests/*/head:refs/setpoint/pulls/merge-requests/*/head";

impl GitSource {
    /// Fetches the heads of the remote's pull (merge) requests: a commit
    /// id that no branch or tag reaches may be a fork's pull request head
    /// (an ApplicationSet's pull request environment follows it by its
    /// `head_sha`), which the host keeps only under `refs/pull/N/head` or
    /// `refs/merge-requests/N/head`. Asked only when such a commit is
    /// missing after the usual fetch.
    pub(super) async fn fetch_pull_heads(&self, git: &Git<'_>) -> Result<(), GitError> {
        let output = self
            .run_fetch(git, &[PULL_HEADS, MERGE_REQUEST_HEADS])
            .await?;
        if !output.status.success() {
            let stderr = git.remote.scrub(&super::command::stderr_text(&output));
            return Err(git.remote.fetch_failed(stderr));
        }
        Ok(())
    }

    /// Makes sure the mirror of `url` holds `head` (the commit `head_ref`
    /// names on the remote) and the base branches; fetches only when the
    /// commit is missing. Without `head`, fetches and answers the commit
    /// `head_ref` names now (`setpoint diff --revision refs/pull/N/head`).
    pub async fn fetch_pull_head(
        &self,
        url: &str,
        credentials: Option<&Credentials>,
        head_ref: &str,
        head: Option<&str>,
    ) -> Result<String, GitError> {
        let remote = Remote::new(url, credentials)?;
        if !head_ref.starts_with("refs/") || !is_valid_ref_name(head_ref) {
            return Err(remote.revision_not_found(&Wanted::Name(head_ref.to_owned())));
        }
        let mirror = self.mirror(&remote.key);
        let _lock = mirror.lock().await?;
        mirror.prepare(&remote, &self.settings).await?;
        let git = Git {
            mirror: &mirror,
            remote: &remote,
            settings: &self.settings,
        };
        let local = format!("{PULLS_PREFIX}{}", head_ref.trim_start_matches("refs/"));
        let wanted = match head {
            Some(head) => Wanted::parse(Some(head)),
            None => Wanted::Name(local.clone()),
        };
        if head.is_some()
            && let Some(commit) = git.resolve(&wanted).await?
        {
            return Ok(commit);
        }
        let args = ["remote", "set-url", "origin", &remote.fetch_url];
        let output = git.run_changing(&args, "remote set-url", false).await?;
        git.checked(&args, output)?;
        let refspec = format!("+{head_ref}:{local}");
        let output = self.run_fetch(&git, &[BRANCHES, &refspec]).await?;
        if !output.status.success() {
            let stderr = remote.scrub(&super::command::stderr_text(&output));
            return Err(remote.fetch_failed(stderr));
        }
        git.resolve(&wanted)
            .await?
            .ok_or_else(|| remote.revision_not_found(&wanted))
    }

    /// The files `head` changes against `base` (a branch name, else the
    /// commit `base_sha`), from their merge base: added, modified, deleted,
    /// and both sides of a rename. Sorted.
    pub async fn changed_files(
        &self,
        url: &str,
        base_branch: &str,
        base_sha: Option<&str>,
        head: &str,
    ) -> Result<Vec<String>, GitError> {
        let remote = Remote::new(url, None)?;
        let mirror = self.mirror(&remote.key);
        let git = Git {
            mirror: &mirror,
            remote: &remote,
            settings: &self.settings,
        };
        let is_commit =
            |id: &str| matches!(id.len(), 40 | 64) && id.bytes().all(|b| b.is_ascii_hexdigit());
        if !is_commit(head) || base_sha.is_some_and(|sha| !is_commit(sha)) {
            return Err(GitError::Git {
                command: "diff".into(),
                stderr: "the base and head must be full commit ids".into(),
            });
        }
        let branch = match is_valid_ref_name(base_branch) {
            true => git.resolve(&Wanted::Name(base_branch.to_owned())).await?,
            false => None,
        };
        let base = branch
            .or_else(|| base_sha.map(str::to_owned))
            .ok_or_else(|| remote.revision_not_found(&Wanted::Name(base_branch.to_owned())))?;
        let range = format!("{base}...{head}");
        let args = [
            "diff",
            "--name-only",
            "--no-renames",
            "-z",
            range.as_str(),
            "--",
        ];
        let stdout = git.run_checked(&args, None, "diff").await?;
        let mut files: Vec<String> = stdout
            .split(|&b| b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| String::from_utf8_lossy(name).into_owned())
            .collect();
        files.sort();
        files.dedup();
        Ok(files)
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    fn git(dir: &std::path::Path, args: &[&str]) -> String {
        let output = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "Test")
            .env("GIT_AUTHOR_EMAIL", "test@example.com")
            .env("GIT_COMMITTER_NAME", "Test")
            .env("GIT_COMMITTER_EMAIL", "test@example.com")
            .output()
            .unwrap();
        assert!(output.status.success(), "git {args:?}: {output:?}");
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }

    fn commit(dir: &std::path::Path, files: &[(&str, &str)], message: &str) -> String {
        for (path, contents) in files {
            let path = dir.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, contents).unwrap();
        }
        git(dir, &["add", "--all"]);
        git(dir, &["commit", "--quiet", "-m", message]);
        git(dir, &["rev-parse", "HEAD"])
    }

    #[tokio::test]
    async fn a_pull_requests_head_is_fetched_and_its_changes_listed_from_the_merge_base() {
        let origin = tempfile::tempdir().unwrap();
        let dir = origin.path();
        git(dir, &["init", "--quiet", "--initial-branch=main"]);
        let base = commit(
            dir,
            &[("apps/a/x.yaml", "a: 1"), ("apps/b/x.yaml", "b: 1")],
            "base",
        );
        git(dir, &["checkout", "--quiet", "-b", "feature"]);
        commit(dir, &[("apps/a/x.yaml", "a: 2")], "change a");
        let head = commit(dir, &[("apps/c/new.yaml", "c: 1")], "add c");
        git(dir, &["update-ref", "refs/pull/7/head", &head]);
        // The base branch moves on meanwhile: its changes are not the pull
        // request's.
        git(dir, &["checkout", "--quiet", "main"]);
        commit(dir, &[("apps/b/x.yaml", "b: 2")], "main moves");
        git(dir, &["branch", "-D", "feature"]);

        let cache = tempfile::tempdir().unwrap();
        let source = GitSource::new(cache.path().to_owned());
        let url = dir.to_string_lossy().into_owned();
        // Not on any branch: only the pull request's ref brings it.
        let fetched = source
            .fetch_pull_head(&url, None, "refs/pull/7/head", Some(&head))
            .await
            .unwrap();
        assert_eq!(fetched, head);
        let fetches = source.fetch_count();
        // Known now: no second fetch; without a commit, the ref's tip.
        source
            .fetch_pull_head(&url, None, "refs/pull/7/head", Some(&head))
            .await
            .unwrap();
        assert_eq!(source.fetch_count(), fetches);
        let tip = source
            .fetch_pull_head(&url, None, "refs/pull/7/head", None)
            .await
            .unwrap();
        assert_eq!(tip, head);

        let changed = source
            .changed_files(&url, "main", Some(&base), &head)
            .await
            .unwrap();
        assert_eq!(changed, ["apps/a/x.yaml", "apps/c/new.yaml"]);
        // Without the branch in the mirror, the base commit serves.
        let changed = source
            .changed_files(&url, "gone", Some(&base), &head)
            .await
            .unwrap();
        assert_eq!(changed, ["apps/a/x.yaml", "apps/c/new.yaml"]);
        // Refs that are not refs, and ids that are not ids, are refused.
        assert!(
            source
                .fetch_pull_head(&url, None, "main", None)
                .await
                .is_err()
        );
        assert!(
            source
                .fetch_pull_head(&url, None, "refs/pull/7/head~1", None)
                .await
                .is_err()
        );
        assert!(
            source
                .changed_files(&url, "main", None, "--output=x")
                .await
                .is_err()
        );
    }
}
