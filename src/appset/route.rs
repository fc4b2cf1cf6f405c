//! Which ApplicationSets an event concerns (pure), as pushes are routed to
//! Applications: a push to a repository and branch one of a set's git
//! generators reads (when the push lists its files, one under a directory
//! the generator reads); a pull request event of a repository its pull
//! request generator lists; a cluster change, for the sets with a cluster
//! generator.

use crate::api::{ApplicationSet, Generator};
use crate::event::{AppKey, PullChange};
use crate::ingest::webhook::route::{Push, comparable, repository_keys, revision_matches};

use super::facts::concerns;
use super::generate::{self, Need};

/// The sets whose git generators `push` moves.
pub fn sets_for_push<'a>(
    push: &Push,
    sets: impl IntoIterator<Item = &'a ApplicationSet>,
) -> Vec<AppKey> {
    if push.deleted {
        return Vec::new();
    }
    let pushed = repository_keys(push);
    let mut keys: Vec<AppKey> = sets
        .into_iter()
        .filter(|set| {
            needs(set).iter().any(|need| match need {
                Need::Git(git) => {
                    pushed.contains(&comparable(&git.repo_url, push.case_insensitive))
                        && revision_matches(
                            Some(git.revision.as_str()),
                            &push.git_ref,
                            push.default_branch.as_deref(),
                        )
                        && touches(push.changed_files.as_deref(), &git.prefixes)
                }
                _ => false,
            })
        })
        .map(key_of)
        .collect();
    keys.sort();
    keys
}

/// The sets whose pull request generators list `change`'s repository.
pub fn sets_for_pull<'a>(
    change: &PullChange,
    sets: impl IntoIterator<Item = &'a ApplicationSet>,
) -> Vec<AppKey> {
    let mut keys: Vec<AppKey> = sets
        .into_iter()
        .filter(|set| {
            needs(set).iter().any(|need| match need {
                Need::Pulls(source) => concerns(source, change),
                _ => false,
            })
        })
        .map(key_of)
        .collect();
    keys.sort();
    keys
}

/// Whether a set has a cluster generator (at any depth).
pub fn reads_clusters(set: &ApplicationSet) -> bool {
    needs(set).contains(&Need::Clusters)
}

fn needs(set: &ApplicationSet) -> Vec<Need> {
    // An invalid set is evaluated by its spec change, not by pushes.
    generate::needs(&set.spec.generators).unwrap_or_default()
}

pub fn key_of(set: &ApplicationSet) -> AppKey {
    AppKey::set(
        set.metadata.namespace.clone().unwrap_or_default(),
        set.metadata.name.as_deref().unwrap_or_default(),
    )
}

/// A changed file under one of the directories read; an unknown list (or
/// a generator reading the whole repository) is a change.
fn touches(changed: Option<&[String]>, prefixes: &[String]) -> bool {
    let Some(changed) = changed else {
        return true;
    };
    prefixes.iter().any(|prefix| {
        prefix.is_empty()
            || changed.iter().any(|file| {
                file.strip_prefix(prefix.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            })
    })
}

/// Whether any generator of `generators` is a git generator (for docs and
/// the CLI).
pub fn has_git(generators: &[Generator]) -> bool {
    generate::needs(generators)
        .unwrap_or_default()
        .iter()
        .any(|n| matches!(n, Need::Git(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ApplicationSetSpec, GitGenerator, GitPathPattern};

    fn set(name: &str, repo: &str, revision: Option<&str>, path: &str) -> ApplicationSet {
        let mut set = ApplicationSet::new(
            name,
            ApplicationSetSpec {
                generators: vec![Generator {
                    git: Some(GitGenerator {
                        repo_url: repo.into(),
                        revision: revision.map(Into::into),
                        directories: vec![GitPathPattern {
                            path: path.into(),
                            exclude: false,
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        set.metadata.namespace = Some("team".into());
        set
    }

    fn push(changed: Option<Vec<&str>>) -> Push {
        Push {
            repo_urls: vec!["https://github.com/Acme/Deploy.git".into()],
            git_ref: "refs/heads/main".into(),
            commit: "a".repeat(40),
            case_insensitive: true,
            default_branch: Some("main".into()),
            deleted: false,
            changed_files: changed.map(|c| c.into_iter().map(String::from).collect()),
        }
    }

    #[test]
    fn a_push_reaches_the_sets_reading_its_repository_branch_and_directories() {
        let sets = [
            set("apps", "https://github.com/acme/deploy", None, "apps/*"),
            set(
                "pinned",
                "https://github.com/acme/deploy",
                Some("release"),
                "apps/*",
            ),
            set("other", "https://github.com/acme/web", None, "apps/*"),
            set(
                "infra",
                "git@github.com:acme/deploy.git",
                Some("main"),
                "infra/*",
            ),
        ];
        let keys = sets_for_push(&push(None), &sets);
        assert_eq!(
            keys,
            [AppKey::set("team", "apps"), AppKey::set("team", "infra")]
        );
        // With the changed files listed, only the directories read count.
        let keys = sets_for_push(&push(Some(vec!["apps/new/deploy.yaml"])), &sets);
        assert_eq!(keys, [AppKey::set("team", "apps")]);
        assert!(sets_for_push(&push(Some(vec!["README.md"])), &sets).is_empty());
        let mut deleted = push(None);
        deleted.deleted = true;
        assert!(sets_for_push(&deleted, &sets).is_empty());
    }
}
