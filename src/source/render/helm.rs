//! Helm: `helm template` of the chart at the Application's path, as Argo CD
//! renders charts: the release namespace is the destination, the release
//! name defaults to the Application's, `.Capabilities` is the target
//! cluster's version and API groups, and the chart's `crds/` come out first
//! (applied first and waited for, like any CRD). Test hooks are left out;
//! the other hooks are rendered with their annotations, and the sync runs
//! them as Argo CD does (`reconcile::annotations`). No repository or network is
//! used: dependencies must be vendored under the chart's `charts/`, and
//! `check` refuses, before helm runs, values files and `file://`
//! dependencies that leave the repository, and values files that are
//! symlinks. Helm gets no kubeconfig: nothing reaches a cluster.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

use serde::Deserialize;

use super::confine::{Tree, parent};
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
    let invocation = Invocation {
        tool: TOOL,
        program: &settings.helm,
        args,
        dir: &chart,
        env: environment(home),
        stdin: vec![],
    };
    let output = exec::run(invocation, settings.limits).await?;
    let mut manifests = Vec::new();
    let mut budget = settings.budget();
    for file in split_by_source(job.path, &output) {
        manifests.extend(directory::rendered_objects(&file, &mut budget)?);
    }
    Ok(manifests)
}

/// Helm's environment (the rest is cleared): every directory it may read or
/// write is in the render's own `home`, and its kubeconfig is a file that
/// does not exist, so neither `lookup` nor anything else reaches a cluster.
fn environment(home: &Path) -> Vec<(String, OsString)> {
    vec![
        ("HOME".into(), home.into()),
        ("HELM_CACHE_HOME".into(), home.join("cache").into()),
        ("HELM_CONFIG_HOME".into(), home.join("config").into()),
        ("HELM_DATA_HOME".into(), home.join("data").into()),
        ("HELM_PLUGINS".into(), home.join("plugins").into()),
        ("KUBECONFIG".into(), home.join("no-kubeconfig").into()),
    ]
}

/// Checks, before helm runs, what the chart at `chart_path` would read
/// beyond its own files: values files stay inside the repository and are
/// regular files, and `file://` dependencies (of the chart and of its
/// subcharts) stay inside the repository.
pub fn check(tree: &Tree, chart_path: &str, helm: &HelmSource) -> Result<(), RenderError> {
    for file in &helm.value_files {
        values_path(chart_path, file)?;
        let resolved = tree.resolve(chart_path, file).map_err(|escape| {
            RenderError::InvalidSource(format!("values file {file} {}", escape.describe()))
        })?;
        if resolved.hops > 0 {
            return Err(RenderError::InvalidSource(format!(
                "values file {file} is a symlink: values files must be regular files of the repository"
            )));
        }
    }
    let prefix = if chart_path.is_empty() {
        String::new()
    } else {
        format!("{chart_path}/")
    };
    for file in tree.files() {
        let name = file.path.rsplit('/').next().unwrap_or_default();
        if !file.path.starts_with(&prefix) || !matches!(name, "Chart.yaml" | "requirements.yaml") {
            continue;
        }
        let dir = parent(&file.path);
        for (dependency, repository) in file_dependencies(&file.contents) {
            let relative = repository.trim_start_matches("file://");
            if let Err(escape) = tree.resolve(dir, relative) {
                return Err(RenderError::InvalidSource(format!(
                    "{name} in {}: dependency {dependency} ({repository}) {}",
                    if dir.is_empty() { "." } else { dir },
                    escape.describe()
                )));
            }
        }
    }
    Ok(())
}

/// The directories of the `file://` dependencies the chart at `chart_dir`
/// lists (in its Chart.yaml or requirements.yaml), inside the repository.
pub fn local_dependencies(tree: &Tree, chart_dir: &str) -> Vec<String> {
    let mut out = Vec::new();
    for name in ["Chart.yaml", "requirements.yaml"] {
        let Some(file) = tree.file(&super::join(chart_dir, name)) else {
            continue;
        };
        for (_, repository) in file_dependencies(&file.contents) {
            let relative = repository.trim_start_matches("file://");
            if let Ok(resolved) = tree.resolve(chart_dir, relative) {
                out.push(resolved.path);
            }
        }
    }
    out
}

/// The `(name, repository)` of each `file://` dependency a Chart.yaml (or a
/// v1 chart's requirements.yaml) lists; one that does not parse is helm's to
/// report.
fn file_dependencies(contents: &[u8]) -> Vec<(String, String)> {
    #[derive(Deserialize)]
    struct Chart {
        #[serde(default)]
        dependencies: Vec<Dependency>,
    }
    #[derive(Deserialize)]
    struct Dependency {
        #[serde(default)]
        name: String,
        #[serde(default)]
        repository: String,
    }
    let Ok(chart) = serde_yaml::from_slice::<Chart>(contents) else {
        return vec![];
    };
    chart
        .dependencies
        .into_iter()
        .filter(|d| d.repository.starts_with("file://"))
        .map(|d| (d.name, d.repository))
        .collect()
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
    use crate::source::render::confine::Symlink;

    fn file(path: &str, contents: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            contents: contents.as_bytes().to_vec(),
        }
    }

    fn values(files: &[&str]) -> HelmSource {
        HelmSource {
            value_files: files.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn values_files_that_are_symlinks_or_climb_out_are_refused() {
        let files = [
            file(
                "charts/web/Chart.yaml",
                "apiVersion: v2\nname: web\nversion: 0.1.0\n",
            ),
            file("env/prod.yaml", "replicas: 2\n"),
        ];
        let links = [Symlink {
            path: "charts/web/prod.yaml".into(),
            target: "../../env/prod.yaml".into(),
        }];
        let tree = Tree::new(&files, &links);
        assert!(check(&tree, "charts/web", &values(&["../../env/prod.yaml"])).is_ok());
        let err = check(&tree, "charts/web", &values(&["prod.yaml"])).unwrap_err();
        assert_eq!(err.reason(), "InvalidSource");
        assert_eq!(
            err.to_string(),
            "values file prod.yaml is a symlink: values files must be regular files of the repository"
        );
        let err = check(&tree, "charts/web", &values(&["../../../outside.yaml"])).unwrap_err();
        assert!(err.to_string().contains("outside the repository"), "{err}");
    }

    #[test]
    fn file_dependencies_outside_the_repository_are_refused() {
        let chart = |repository: &str| {
            format!(
                "apiVersion: v2\nname: web\nversion: 0.1.0\ndependencies:\n- name: common\n  version: 1.0.0\n  repository: {repository}\n"
            )
        };
        let check_with = |repository: &str, subchart: bool| {
            let path = if subchart {
                "charts/web/charts/db/Chart.yaml"
            } else {
                "charts/web/Chart.yaml"
            };
            let files = [
                file(path, &chart(repository)),
                file("charts/common/Chart.yaml", ""),
            ];
            check(
                &Tree::new(&files, &[]),
                "charts/web",
                &HelmSource::default(),
            )
        };
        assert!(check_with("file://../common", false).is_ok());
        assert!(check_with("https://charts.example.com", false).is_ok());
        let err = check_with("file://../../../common", false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Chart.yaml in charts/web: dependency common (file://../../../common) climbs out of the repository"
        );
        let err = check_with("file:///opt/charts/common", true).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Chart.yaml in charts/web/charts/db: dependency common (file:///opt/charts/common) is an absolute path, outside the repository"
        );
    }

    #[test]
    fn helm_gets_no_cluster_and_only_its_own_directories() {
        let home = Path::new("/scratch/render-1/home");
        let env = environment(home);
        for (name, value) in &env {
            assert!(
                Path::new(value).starts_with(home),
                "{name}={value:?} is outside the render's home"
            );
        }
        let kubeconfig = env.iter().find(|(n, _)| n == "KUBECONFIG").unwrap();
        assert!(!Path::new(&kubeconfig.1).exists());
    }

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
