//! Helm: `helm template` of the chart at the Application's path, as Argo CD
//! renders charts: the release namespace is the destination, the release
//! name defaults to the Application's, `.Capabilities` is the target
//! cluster's version and API groups, and the chart's `crds/` come out first
//! (applied first and waited for, like any CRD). Test hooks are left out;
//! other hooks are rendered as plain objects. No repository or network is
//! used: dependencies must be vendored under the chart's `charts/`.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use super::exec::{self, Invocation};
use super::{Job, RenderError, RenderSettings, directory, join};
use crate::api::HelmSource;
use crate::manifest::Manifest;
use crate::source::git::SourceFile;

const TOOL: &str = "helm template";

/// What `.Capabilities` says in the chart's templates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// `--kube-version`, e.g. `v1.37.2`.
    pub kube_version: String,
    /// `--api-versions`: every `group/version` and `group/version/Kind`.
    pub api_versions: Vec<String>,
}

impl Capabilities {
    pub async fn discover(client: &kube::Client) -> Result<Self, kube::Error> {
        let version = client.apiserver_version().await?;
        let discovery = kube::Discovery::new(client.clone()).run().await?;
        let mut api_versions = Vec::new();
        for group in discovery.groups() {
            for version in group.versions() {
                let group_version = if group.name().is_empty() {
                    version.to_string()
                } else {
                    format!("{}/{version}", group.name())
                };
                for (resource, _) in group.versioned_resources(version) {
                    api_versions.push(format!("{group_version}/{}", resource.kind));
                }
                api_versions.push(group_version);
            }
        }
        api_versions.sort();
        api_versions.dedup();
        Ok(Capabilities {
            kube_version: kube_version(&version.git_version, &version.major, &version.minor),
            api_versions,
        })
    }

    pub fn fingerprint(&self) -> String {
        let mut digest = Sha256::new();
        digest.update(self.kube_version.as_bytes());
        for api_version in &self.api_versions {
            digest.update(b"\n");
            digest.update(api_version.as_bytes());
        }
        hex::encode(&digest.finalize()[..8])
    }
}

/// The server's `gitVersion` when it is `v<major>.<minor>.<patch>`; else
/// (a build without version stamps, a vendor's `1.30+`) `v<major>.<minor>.0`.
pub fn kube_version(git_version: &str, major: &str, minor: &str) -> String {
    let digits = |s: &str| {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
    };
    let (major, minor) = (digits(major), digits(minor));
    let prefix = format!("v{major}.{minor}.");
    match git_version.strip_prefix(&prefix) {
        Some(rest) if rest.chars().next().is_some_and(|c| c.is_ascii_digit()) => {
            let patch = digits(rest);
            format!("{prefix}{patch}")
        }
        _ => format!("{prefix}0"),
    }
}

pub async fn render(
    settings: &RenderSettings,
    job: &Job<'_>,
    helm: &HelmSource,
    root: &Path,
    home: &Path,
) -> Result<Vec<Manifest>, RenderError> {
    let chart = if job.path.is_empty() {
        root.to_path_buf()
    } else {
        root.join(job.path)
    };
    let capabilities = job
        .capabilities
        .expect("helm jobs carry the cluster's capabilities");
    let release = helm.release_name.as_deref().unwrap_or(job.app);
    let mut args: Vec<OsString> = vec![
        "template".into(),
        release.into(),
        chart.clone().into(),
        "--namespace".into(),
        job.namespace.into(),
        "--kube-version".into(),
        capabilities.kube_version.clone().into(),
        "--skip-tests".into(),
        if helm.skip_crds {
            "--skip-crds".into()
        } else {
            "--include-crds".into()
        },
    ];
    if !capabilities.api_versions.is_empty() {
        args.push("--api-versions".into());
        args.push(capabilities.api_versions.join(",").into());
    }
    for file in &helm.value_files {
        let relative = values_path(job.path, file)?;
        let path = root.join(&relative);
        if !path.is_file() {
            return Err(RenderError::InvalidSource(format!(
                "values file {file} ({}) is not in the repository at {}",
                relative.display(),
                short(job.commit)
            )));
        }
        args.push("--values".into());
        args.push(path.into());
    }
    if let Some(values) = &helm.values {
        let path = home.join("values-inline.yaml");
        std::fs::write(&path, values).map_err(RenderError::Scratch)?;
        args.push("--values".into());
        args.push(path.into());
    }
    if let Some(values) = &helm.values_object {
        // JSON is YAML.
        let path = home.join("values-object.yaml");
        std::fs::write(&path, values.to_string()).map_err(RenderError::Scratch)?;
        args.push("--values".into());
        args.push(path.into());
    }
    let env: Vec<(String, OsString)> = vec![
        ("HOME".into(), home.into()),
        ("HELM_CACHE_HOME".into(), home.join("cache").into()),
        ("HELM_CONFIG_HOME".into(), home.join("config").into()),
        ("HELM_DATA_HOME".into(), home.join("data").into()),
    ];
    let invocation = Invocation {
        tool: TOOL,
        program: &settings.helm,
        args,
        dir: &chart,
        env,
    };
    let output = exec::run(invocation, settings.limits).await?;
    let mut manifests = Vec::new();
    for file in split_by_source(job.path, &output) {
        manifests.extend(directory::objects(&file)?);
    }
    Ok(manifests)
}

/// A values file named relative to the chart, as a path relative to the
/// repository's root; it may not leave the repository.
pub fn values_path(chart_path: &str, file: &str) -> Result<PathBuf, RenderError> {
    let escapes = || {
        RenderError::InvalidSource(format!(
            "values file {file} is outside the repository: values files must come from the Application's repository"
        ))
    };
    if file.contains("://") || Path::new(file).is_absolute() {
        return Err(escapes());
    }
    let mut parts: Vec<&str> = chart_path.split('/').filter(|p| !p.is_empty()).collect();
    for component in Path::new(file).components() {
        match component {
            Component::Normal(part) => parts.push(part.to_str().ok_or_else(escapes)?),
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop().ok_or_else(escapes)?;
            }
            Component::RootDir | Component::Prefix(_) => return Err(escapes()),
        }
    }
    if parts.is_empty() {
        return Err(escapes());
    }
    Ok(parts.iter().collect())
}

/// `helm template` marks each document with `# Source: <chart>/<file>`; the
/// documents of one template become one file named as the repository names
/// it, so errors point at the template.
pub fn split_by_source(chart_path: &str, output: &[u8]) -> Vec<SourceFile> {
    let text = String::from_utf8_lossy(output);
    let mut files: Vec<SourceFile> = Vec::new();
    let mut current = String::new();
    let mut source: Option<String> = None;
    let mut flush = |source: &Option<String>, current: &mut String| {
        if current.trim().is_empty() {
            current.clear();
            return;
        }
        let path = match source {
            Some(source) => {
                // The first component is the chart's name, not a directory.
                let within = source.split_once('/').map_or(source.as_str(), |(_, r)| r);
                join(chart_path, within)
            }
            None => join(chart_path, "(helm template)"),
        };
        match files.last_mut() {
            Some(last) if last.path == path => {
                last.contents.extend_from_slice(b"---\n");
                last.contents.extend_from_slice(current.as_bytes());
            }
            _ => files.push(SourceFile {
                path,
                contents: current.clone().into_bytes(),
            }),
        }
        current.clear();
    };
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "---" {
            flush(&source, &mut current);
            source = None;
            continue;
        }
        if let Some(name) = line.trim_end().strip_prefix("# Source: ") {
            source = Some(name.trim().to_string());
        }
        current.push_str(line);
    }
    flush(&source, &mut current);
    files
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_version_comes_from_the_server_or_its_major_and_minor() {
        assert_eq!(kube_version("v1.37.2", "1", "37"), "v1.37.2");
        assert_eq!(kube_version("v1.37.2-gke.100", "1", "37"), "v1.37.2");
        assert_eq!(
            kube_version("v0.0.0-master+$Format:%H$", "1", "37"),
            "v1.37.0"
        );
        assert_eq!(kube_version("v1.30.4-eks", "1", "30+"), "v1.30.4");
    }

    #[test]
    fn values_files_are_relative_to_the_chart_and_stay_in_the_repository() {
        let ok = |chart: &str, file: &str| values_path(chart, file).unwrap();
        assert_eq!(
            ok("charts/web", "values-prod.yaml"),
            PathBuf::from("charts/web/values-prod.yaml")
        );
        assert_eq!(
            ok("charts/web", "../../env/prod.yaml"),
            PathBuf::from("env/prod.yaml")
        );
        assert_eq!(ok("", "./values.yaml"), PathBuf::from("values.yaml"));
        for escaping in [
            "../../../etc/passwd",
            "/etc/passwd",
            "https://example.com/v.yaml",
        ] {
            let err = values_path("charts/web", escaping).unwrap_err();
            assert_eq!(err.reason(), "InvalidSource");
            assert!(err.to_string().contains("outside the repository"), "{err}");
        }
    }

    #[test]
    fn output_is_split_by_template() {
        let output = "---\n# Source: web/crds/crd.yaml\nkind: A\n---\n# Source: web/templates/all.yaml\nkind: B\n---\n# Source: web/templates/all.yaml\nkind: C\n---\n# Source: web/charts/db/templates/db.yaml\nkind: D\n";
        let files = split_by_source("charts/web", output.as_bytes());
        let paths: Vec<_> = files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "charts/web/crds/crd.yaml",
                "charts/web/templates/all.yaml",
                "charts/web/charts/db/templates/db.yaml"
            ]
        );
        assert_eq!(
            String::from_utf8_lossy(&files[1].contents),
            "# Source: web/templates/all.yaml\nkind: B\n---\n# Source: web/templates/all.yaml\nkind: C\n"
        );
        // Documents of one template keep their index within it.
        let docs = serde_yaml::Deserializer::from_slice(&files[1].contents).count();
        assert_eq!(docs, 2);
    }
}
