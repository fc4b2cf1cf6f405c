//! What an ApplicationSet's generators read from outside (I/O): the files
//! of a Git repository at a revision, the registered clusters, the open
//! pull requests of a repository. Gathered once per evaluation, as the
//! pure `generate::needs` lists them, then handed to `generate::generate`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::api::{Application, ApplicationSet, ApplicationSpec, Source};
use crate::context::Context;
use crate::event::PullChange;
use crate::source::git::CheckoutRequest;

use super::AppSetError;
use super::generate::{ClusterFact, Facts, GitNeed, GitTree, Need, PullFact, PullSource};

/// The server the local cluster goes by, as Argo CD's `in-cluster`.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";
/// Its name.
pub const IN_CLUSTER_NAME: &str = "in-cluster";

/// Everything `needs` asks for. `pulls` are what pull request webhooks
/// said since, laid over the listings (a provider's list may not show a
/// pull request opened or closed a moment ago).
pub async fn gather(
    ctx: &Context,
    set: &ApplicationSet,
    needs: &[Need],
    fresh_since: Option<SystemTime>,
    pulls: &[PullChange],
) -> Result<Facts, AppSetError> {
    let mut facts = Facts::default();
    for need in needs {
        match need {
            Need::Git(git) => {
                let tree = git_tree(ctx, set, git, fresh_since).await?;
                facts
                    .git
                    .insert((git.repo_url.clone(), git.revision.clone()), tree);
            }
            Need::Clusters => facts.clusters = clusters(ctx, set).await,
            Need::Pulls(source) => {
                let listed = list_pulls(ctx, source).await?;
                facts
                    .pulls
                    .insert(source.clone(), overlay(listed, source, pulls));
            }
        }
    }
    Ok(facts)
}

/// The Application an ApplicationSet's Git reads are checked as: its own
/// namespace, the service account its template names (when the template
/// names one literally), the generator's repository and credentials. The
/// tenancy rules of Applications then hold for the set too: a tenant's set
/// reads no local repository and no global credentials it may not use.
fn reader(set: &ApplicationSet, git: &GitNeed) -> Application {
    let service_account_name = set
        .spec
        .template
        .spec
        .get("serviceAccountName")
        .and_then(|v| v.as_str())
        .filter(|name| !name.contains("{{"))
        .map(str::to_string);
    let mut app = Application::new(
        &set.metadata.name.clone().unwrap_or_default(),
        ApplicationSpec {
            source: Source {
                repo_url: git.repo_url.clone(),
                credentials_secret: git.credentials_secret.clone(),
                ..Default::default()
            },
            service_account_name,
            ..Default::default()
        },
    );
    app.metadata.namespace = set.metadata.namespace.clone();
    app
}

/// Every file under the need's prefixes at one commit: the first prefix
/// resolves the revision, the others are read at that commit.
async fn git_tree(
    ctx: &Context,
    set: &ApplicationSet,
    git: &GitNeed,
    fresh_since: Option<SystemTime>,
) -> Result<GitTree, AppSetError> {
    let reader = reader(set, git);
    let credentials = crate::reconcile::source_credentials(ctx, &reader)
        .await
        .map_err(|source| AppSetError::Credentials {
            repo: crate::source::repo_url::display_url(&git.repo_url),
            reason: crate::report::events::error_chain(&source),
        })?;
    let mut commit: Option<String> = None;
    let mut files = Vec::new();
    for prefix in &git.prefixes {
        let revision = commit.clone().unwrap_or_else(|| git.revision.clone());
        let request = CheckoutRequest {
            url: &git.repo_url,
            revision: Some(revision.as_str()).filter(|r| !r.is_empty()),
            path: Some(prefix.as_str()).filter(|p| !p.is_empty()),
            credentials: credentials.as_ref(),
            known_commit: commit.as_deref(),
            fresh_since,
        };
        match ctx.git.checkout(&request).await {
            Ok(checkout) => {
                commit.get_or_insert(checkout.commit);
                files.extend(checkout.files);
            }
            // A prefix that does not exist (yet) yields nothing, as an
            // empty directory would; the revision must still resolve.
            Err(crate::source::git::GitError::PathNotFound { .. }) if !prefix.is_empty() => {
                if commit.is_none() {
                    let root = CheckoutRequest {
                        path: None,
                        ..request
                    };
                    let checkout = ctx.git.checkout(&root).await?;
                    commit = Some(checkout.commit);
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files.dedup_by(|a, b| a.path == b.path);
    Ok(GitTree {
        commit: commit.unwrap_or_default(),
        files,
    })
}

/// The clusters the set's namespace may deploy to: the registered ones
/// whose Secret admits it and, for an admin namespace, the local one (as
/// Argo CD's cluster generator yields `in-cluster`).
async fn clusters(ctx: &Context, set: &ApplicationSet) -> Vec<ClusterFact> {
    let namespace = set.metadata.namespace.as_deref().unwrap_or_default();
    let admin = ctx.tenancy.is_admin_namespace(namespace);
    ctx.clusters.wait_listed().await;
    let mut clusters: Vec<ClusterFact> = ctx
        .clusters
        .clusters()
        .into_iter()
        .filter(|(entry, _)| entry.allowed.admits(namespace, admin))
        .map(|(entry, _)| ClusterFact {
            name: entry.name,
            server: entry.server,
            labels: entry.labels,
            annotations: entry
                .annotations
                .into_iter()
                // What Kubernetes and kubectl keep there is no parameter.
                .filter(|(key, _)| key != "kubectl.kubernetes.io/last-applied-configuration")
                .collect(),
        })
        .collect();
    if admin && !clusters.iter().any(|c| c.name == IN_CLUSTER_NAME) {
        clusters.insert(
            0,
            ClusterFact {
                name: IN_CLUSTER_NAME.into(),
                server: IN_CLUSTER_SERVER.into(),
                labels: BTreeMap::new(),
                annotations: BTreeMap::new(),
            },
        );
    }
    clusters
}

/// The open pull requests of `source`, from its provider's API with the
/// token Setpoint was given for it.
async fn list_pulls(ctx: &Context, source: &PullSource) -> Result<Vec<PullFact>, AppSetError> {
    let listed = match source {
        PullSource::GitHub { owner, repo } => {
            let Some(github) = &ctx.previews().github else {
                return Err(AppSetError::NoProvider {
                    provider: "GitHub",
                    fix: "set SETPOINT_GITHUB_TOKEN (or SETPOINT_GITHUB_TOKEN_FILE) on the worker",
                });
            };
            github
                .list_open(owner, repo)
                .await
                .map_err(|error| AppSetError::Pulls {
                    source_name: format!("GitHub {owner}/{repo}"),
                    transient: error
                        .status_code()
                        .is_none_or(|code| code >= 500 || code == 429),
                    reason: error.to_string(),
                })?
        }
        PullSource::GitLab { project } => {
            let Some(gitlab) = &ctx.previews().gitlab else {
                return Err(AppSetError::NoProvider {
                    provider: "GitLab",
                    fix: "set SETPOINT_GITLAB_API_TOKEN (or SETPOINT_GITLAB_API_TOKEN_FILE) on the worker",
                });
            };
            gitlab
                .list_open_merge_requests(project)
                .await
                .map_err(|error| AppSetError::Pulls {
                    source_name: format!("GitLab {project}"),
                    transient: true,
                    reason: error.to_string(),
                })?
        }
    };
    Ok(listed
        .into_iter()
        .map(|pull| PullFact {
            number: pull.number,
            branch: pull.branch,
            target_branch: pull.target_branch,
            head_sha: pull.head_sha,
            labels: pull.labels,
        })
        .collect())
}

/// The listing with what the webhooks said laid over it: a closed pull
/// request leaves, an open one is there with the head its event named.
pub fn overlay(
    mut listed: Vec<PullFact>,
    source: &PullSource,
    said: &[PullChange],
) -> Vec<PullFact> {
    for change in said.iter().filter(|c| concerns(source, c)) {
        listed.retain(|p| p.number != change.number);
        if change.open {
            listed.push(PullFact {
                number: change.number,
                branch: change.branch.clone(),
                target_branch: change.target_branch.clone(),
                head_sha: change.head_sha.clone(),
                labels: change.labels.clone(),
            });
        }
    }
    listed.sort_by_key(|p| p.number);
    listed
}

/// Whether a pull request event is of `source`'s repository.
pub fn concerns(source: &PullSource, change: &PullChange) -> bool {
    match source {
        PullSource::GitHub { owner, repo } => {
            change.provider == "github"
                && change
                    .project
                    .eq_ignore_ascii_case(&format!("{owner}/{repo}"))
        }
        PullSource::GitLab { project } => {
            change.provider == "gitlab"
                && (change.project.eq_ignore_ascii_case(project)
                    || change.project_id.as_deref() == Some(project.as_str()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(number: u64, head: &str) -> PullFact {
        PullFact {
            number,
            branch: format!("feature-{number}"),
            target_branch: "main".into(),
            head_sha: head.into(),
            labels: vec![],
        }
    }

    fn change(number: u64, open: bool, head: &str) -> PullChange {
        PullChange {
            provider: "github".into(),
            project: "Acme/Deploy".into(),
            project_id: None,
            number,
            open,
            branch: format!("feature-{number}"),
            target_branch: "main".into(),
            head_sha: head.into(),
            labels: vec![],
        }
    }

    #[test]
    fn webhooks_are_laid_over_the_listing() {
        let source = PullSource::GitHub {
            owner: "acme".into(),
            repo: "deploy".into(),
        };
        let listed = vec![fact(1, "a"), fact(2, "b")];
        let said = [
            change(1, false, "a"),
            change(3, true, "c"),
            change(2, true, "d"),
        ];
        let got = overlay(listed, &source, &said);
        let got: Vec<(u64, &str)> = got
            .iter()
            .map(|p| (p.number, p.head_sha.as_str()))
            .collect();
        assert_eq!(got, [(2, "d"), (3, "c")]);
        // Another repository's events change nothing.
        let other = PullSource::GitHub {
            owner: "acme".into(),
            repo: "web".into(),
        };
        assert_eq!(overlay(vec![fact(1, "a")], &other, &said).len(), 1);
    }
}
