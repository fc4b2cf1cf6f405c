//! Kustomize: `kubectl kustomize <path>` (the kustomize engine built into
//! kubectl, as Argo CD and Flux use the same library) on a copy of the
//! repository's tree, so bases anywhere in the repository work. Renders
//! offline: git may only read the Application's own repository, from
//! Setpoint's mirror; a remote base on another host fails at once.

use std::ffi::OsString;
use std::path::Path;

use super::exec::{self, Invocation};
use super::{Job, RenderError, RenderSettings, directory};
use crate::manifest::Manifest;
use crate::source::git::SourceFile;

const TOOL: &str = "kustomize build";

pub async fn render(
    settings: &RenderSettings,
    job: &Job<'_>,
    root: &Path,
    home: &Path,
) -> Result<Vec<Manifest>, RenderError> {
    let dir = if job.path.is_empty() {
        root.to_path_buf()
    } else {
        root.join(job.path)
    };
    let mut env: Vec<(String, OsString)> = vec![
        ("HOME".into(), home.into()),
        ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("GIT_ALLOW_PROTOCOL".into(), "file".into()),
    ];
    env.extend(git_rewrites(job.repo_url, job.mirror));
    let invocation = Invocation {
        tool: TOOL,
        program: &settings.kubectl,
        args: vec!["kustomize".into(), dir.into()],
        dir: root,
        env,
    };
    let output = exec::run(invocation, settings.limits)
        .await
        .map_err(explain_offline)?;
    let name = if job.path.is_empty() { "." } else { job.path };
    directory::objects(&SourceFile {
        path: format!("{name} (kustomize build)"),
        contents: output,
    })
}

/// Git configuration, as environment, that sends every spelling of the
/// Application's repository URL to the local mirror (`url.<mirror>.insteadOf`;
/// git takes the longest matching prefix).
pub fn git_rewrites(repo_url: &str, mirror: &Path) -> Vec<(String, OsString)> {
    let target = format!("file://{}", mirror.display());
    let url = repo_url.trim().trim_end_matches('/');
    let bare = url.strip_suffix(".git").unwrap_or(url);
    let mut prefixes = vec![format!("{bare}.git"), bare.to_string()];
    if bare.starts_with('/') {
        prefixes.push(format!("file://{bare}.git"));
        prefixes.push(format!("file://{bare}"));
    } else if let Some((user_host, repo)) = bare.split_once(':')
        && !bare.contains("://")
        && user_host.contains('@')
    {
        // scp-like `git@host:org/repo` is `ssh://git@host/org/repo` too.
        let ssh = format!("ssh://{user_host}/{repo}");
        prefixes.push(format!("{ssh}.git"));
        prefixes.push(ssh);
    }
    let mut env = vec![("GIT_CONFIG_COUNT".into(), prefixes.len().to_string().into())];
    for (i, prefix) in prefixes.into_iter().enumerate() {
        env.push((
            format!("GIT_CONFIG_KEY_{i}"),
            format!("url.{target}.insteadOf").into(),
        ));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), prefix.into()));
    }
    env
}

/// A remote base on another host is refused by git before any network use;
/// say why.
fn explain_offline(error: RenderError) -> RenderError {
    match error {
        RenderError::Failed { tool, message } if message.contains("not allowed") => {
            RenderError::Failed {
                tool,
                message: format!(
                    "{message} (Setpoint renders offline: a remote base must be in the Application's own repository)"
                ),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewrites(url: &str) -> Vec<(String, String)> {
        git_rewrites(url, Path::new("/cache/mirrors/m1"))
            .into_iter()
            .map(|(k, v)| (k, v.to_string_lossy().into_owned()))
            .collect()
    }

    fn prefixes(url: &str) -> Vec<String> {
        rewrites(url)
            .into_iter()
            .filter(|(k, _)| k.starts_with("GIT_CONFIG_VALUE_"))
            .map(|(_, v)| v)
            .collect()
    }

    #[test]
    fn every_spelling_of_the_repository_goes_to_the_mirror() {
        let env = rewrites("https://git.example.com/org/config.git/");
        assert_eq!(env[0], ("GIT_CONFIG_COUNT".into(), "2".into()));
        assert_eq!(
            env[1],
            (
                "GIT_CONFIG_KEY_0".into(),
                "url.file:///cache/mirrors/m1.insteadOf".into()
            )
        );
        assert_eq!(
            prefixes("https://git.example.com/org/config.git/"),
            [
                "https://git.example.com/org/config.git",
                "https://git.example.com/org/config"
            ]
        );
        assert_eq!(
            prefixes("git@github.com:org/config"),
            [
                "git@github.com:org/config.git",
                "git@github.com:org/config",
                "ssh://git@github.com/org/config.git",
                "ssh://git@github.com/org/config"
            ]
        );
        assert_eq!(
            prefixes("/srv/git/config.git"),
            [
                "/srv/git/config.git",
                "/srv/git/config",
                "file:///srv/git/config.git",
                "file:///srv/git/config"
            ]
        );
    }

    #[test]
    fn a_refused_transport_is_explained() {
        let err = explain_offline(RenderError::Failed {
            tool: TOOL,
            message: "fatal: transport 'https' not allowed".into(),
        });
        assert!(err.to_string().contains("renders offline"), "{err}");
    }
}
