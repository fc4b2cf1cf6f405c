//! What `targetRevision` asks for, and the commit it names in a mirror.

use std::fmt;

use super::command::Git;
use super::{DEFAULT_BRANCH_REF, GitError};

/// What `targetRevision` asks for.
#[derive(Debug)]
pub(super) enum Wanted {
    /// The remote's default branch.
    Default,
    /// A full commit id, lowercase.
    Commit(String),
    /// A branch, a tag, a short commit id or a full ref name.
    Name(String),
}

impl Wanted {
    pub(super) fn parse(revision: Option<&str>) -> Wanted {
        match revision.map(str::trim) {
            None | Some("") | Some("HEAD") => Wanted::Default,
            Some(id) if is_full_commit_id(id) => Wanted::Commit(id.to_ascii_lowercase()),
            Some(name) => Wanted::Name(name.to_owned()),
        }
    }

    /// The expressions to try, in order; the first that names a commit wins.
    /// What [`Mirror::resolved`](super::mirror::Mirror::resolved) keeps
    /// its answer under.
    pub(super) fn key(&self) -> String {
        self.candidates().join("\n")
    }

    fn candidates(&self) -> Vec<String> {
        match self {
            Wanted::Default => vec![format!("{DEFAULT_BRANCH_REF}^{{commit}}")],
            Wanted::Commit(id) => vec![format!("{id}^{{commit}}")],
            Wanted::Name(name) => {
                let mut candidates = vec![
                    format!("refs/heads/{name}^{{commit}}"),
                    format!("refs/tags/{name}^{{commit}}"),
                ];
                if name.starts_with("refs/") || (is_hex(name) && name.len() >= 4) {
                    candidates.push(format!("{name}^{{commit}}"));
                }
                candidates
            }
        }
    }
}

impl fmt::Display for Wanted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wanted::Default => f.write_str("HEAD"),
            Wanted::Commit(id) => f.write_str(id),
            Wanted::Name(name) => f.write_str(name),
        }
    }
}

fn is_hex(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// SHA-1 or SHA-256.
fn is_full_commit_id(text: &str) -> bool {
    (text.len() == 40 || text.len() == 64) && is_hex(text)
}

/// `git check-ref-format`'s rules, so a revision can never smuggle in rev
/// syntax (`main~1`, `v1^{tree}`, `@{yesterday}`) or an option.
pub(super) fn is_valid_ref_name(name: &str) -> bool {
    !name.is_empty()
        && name != "@"
        && !name.starts_with('-')
        && !name.ends_with('.')
        && !name.contains("..")
        && !name.contains("@{")
        && !name
            .chars()
            .any(|c| c.is_ascii_control() || " ~^:?*[\\".contains(c))
        && name
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.') && !part.ends_with(".lock"))
}

impl Git<'_> {
    /// The commit `wanted` names in the mirror as it is now, if any.
    pub(super) async fn resolve(&self, wanted: &Wanted) -> Result<Option<String>, GitError> {
        let key = wanted.key();
        if let Some(commit) = self.mirror.resolved(&key) {
            return Ok(Some(commit));
        }
        let candidates = wanted.candidates();
        let mut input = candidates.join("\n").into_bytes();
        input.push(b'\n');
        let args = ["cat-file", "--batch-check=%(objectname) %(objecttype)"];
        let stdout = self.run_checked(&args, Some(input), "cat-file").await?;
        let stdout = String::from_utf8_lossy(&stdout);
        // One line per candidate: `<id> commit`, or `<name> missing` /
        // `<name> ambiguous`.
        let commit = stdout.lines().find_map(|line| {
            let (id, kind) = line.rsplit_once(' ')?;
            (kind == "commit" && is_full_commit_id(id)).then(|| id.to_owned())
        });
        if let Some(commit) = &commit {
            self.mirror.remember_resolved(key, commit.clone());
        }
        Ok(commit)
    }
}

impl Git<'_> {
    /// Whether the mirror holds `commit` and it is `tip` or an ancestor of it.
    pub(super) async fn contains(&self, commit: &str, tip: &str) -> Result<bool, GitError> {
        if !is_full_commit_id(commit) || !is_full_commit_id(tip) {
            return Ok(false);
        }
        let args = ["merge-base", "--is-ancestor", commit, tip];
        let output = self.run_unchecked(&args, "merge-base").await?;
        // 0: an ancestor; 1: not one; anything else: `commit` is unknown.
        Ok(output.status.success())
    }
}
