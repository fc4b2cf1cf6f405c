//! What a render reads: the repository paths whose change can change an
//! Application's objects, recorded on its status (`status.sourceInputs`) so
//! that the webhook routes a push by them without rendering. Pure: the same
//! walk over the tree as the confinement checks (`kustomize::check`,
//! `helm::check`), collecting where they refuse.
//!
//! A directory stands for everything under it. Paths under another recorded
//! path are dropped; past `MAX_INPUTS` the set is the repository root (every
//! push concerns the Application) and `capped` says so.

use std::collections::BTreeSet;

use super::confine::{Tree, parent};
use super::{KUSTOMIZATION_FILES, Method, helm, kustomize};

/// Paths kept on a status; more and the inputs become the repository root.
pub const MAX_INPUTS: usize = 64;

/// The repository paths one render read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inputs {
    /// Repository-relative, `/`-separated, sorted; `""` is the root.
    pub paths: Vec<String>,
    /// There were more than `MAX_INPUTS`: `paths` is the root alone.
    pub capped: bool,
}

impl Inputs {
    /// What a plain directory reads: itself.
    pub fn directory(path: &str) -> Self {
        Self::from_paths([path.to_string()], MAX_INPUTS)
    }

    /// `paths` with those under another dropped, capped at `max`.
    pub fn from_paths(paths: impl IntoIterator<Item = String>, max: usize) -> Self {
        let sorted: BTreeSet<String> = paths.into_iter().collect();
        let mut kept: Vec<String> = Vec::new();
        for path in sorted {
            // Sorted, so a directory comes before everything under it
            // (`a` < `a/b`; `a-b` sorts between them but is not under `a`).
            if kept.iter().any(|dir| covers(dir, &path)) {
                continue;
            }
            kept.retain(|other| !covers(&path, other));
            kept.push(path);
        }
        if kept.len() > max {
            return Inputs {
                paths: vec![String::new()],
                capped: true,
            };
        }
        kept.sort();
        Inputs {
            paths: kept,
            capped: false,
        }
    }
}

/// Whether the directory `dir` is `path` or holds it; the root holds all.
pub fn covers(dir: &str, path: &str) -> bool {
    dir.is_empty()
        || path
            .strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The inputs of rendering `path` with `method` from `tree`, capped at `max`.
pub fn collect(tree: &Tree, path: &str, method: &Method, max: usize) -> Inputs {
    let paths = match method {
        // Jsonnet's imports are known once evaluated (`jsonnet::Evaluated`).
        Method::Directory | Method::Jsonnet(_) => vec![path.to_string()],
        Method::Kustomize => kustomize_inputs(tree, path),
        Method::Helm(source) => helm_inputs(tree, path, &source.value_files),
    };
    Inputs::from_paths(paths, max)
}

/// Every kustomization directory followed from `path` (through resources,
/// bases, components and plugin directories), and every file they name
/// outside those directories.
fn kustomize_inputs(tree: &Tree, path: &str) -> Vec<String> {
    let mut out = vec![path.to_string()];
    let mut seen = BTreeSet::new();
    let mut pending = vec![path.to_string()];
    while let Some(dir) = pending.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        out.push(dir.clone());
        let Some(file) = KUSTOMIZATION_FILES.iter().find_map(|name| {
            let resolved = tree.resolve(&dir, name).ok()?;
            tree.file(&resolved.path)
        }) else {
            continue;
        };
        // A kustomization reached through a symlink is read where it is.
        out.push(parent(&file.path).to_string());
        for (reference, directory) in kustomize::referenced(file) {
            // Remote bases and anything outside were refused by `check`.
            if reference.contains("://") || reference.contains('\n') {
                continue;
            }
            let Ok(resolved) = tree.resolve(&dir, &reference) else {
                continue;
            };
            if directory && tree.is_dir(&resolved.path) {
                pending.push(resolved.path);
            } else {
                out.push(resolved.path);
            }
        }
    }
    out
}

/// The chart's directory, its values files and its `file://` dependencies
/// (of the chart and of its subcharts).
fn helm_inputs(tree: &Tree, chart_path: &str, value_files: &[String]) -> Vec<String> {
    let mut out = vec![chart_path.to_string()];
    for file in value_files {
        if let Ok(resolved) = tree.resolve(chart_path, file) {
            out.push(resolved.path);
        }
    }
    let mut pending = vec![chart_path.to_string()];
    let mut seen = BTreeSet::new();
    while let Some(chart) = pending.pop() {
        if !seen.insert(chart.clone()) {
            continue;
        }
        out.push(chart.clone());
        for dependency in helm::local_dependencies(tree, &chart) {
            pending.push(dependency);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::HelmSource;
    use crate::source::git::SourceFile;
    use crate::source::render::confine::Symlink;

    fn file(path: &str, contents: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            contents: contents.as_bytes().to_vec(),
        }
    }

    fn paths(inputs: &Inputs) -> Vec<&str> {
        inputs.paths.iter().map(String::as_str).collect()
    }

    #[test]
    fn nested_kustomize_bases_and_components_are_followed() {
        let files = [
            file(
                "envs/prod/kustomization.yaml",
                "resources: [../../bases/web, extra.yaml]\ncomponents: [../../components/tls]\n\
                 patches:\n- path: ../../patches/replicas.yaml\n\
                 configMapGenerator:\n- name: s\n  files: [k=../../config/app.conf]\n\
                 configurations: [../../conf/names.yaml]\n",
            ),
            file("envs/prod/extra.yaml", "kind: ConfigMap\n"),
            // A base with a base of its own, in yet another directory.
            file(
                "bases/web/kustomization.yaml",
                "resources: [deploy.yaml, ../../common/labels]\n",
            ),
            file("bases/web/deploy.yaml", "kind: Deployment\n"),
            file("common/labels/kustomization.yml", "resources: [cm.yaml]\n"),
            file("common/labels/cm.yaml", "kind: ConfigMap\n"),
            file(
                "components/tls/kustomization.yaml",
                "kind: Component\npatches:\n- path: ../../patches/tls.yaml\n",
            ),
            file("patches/replicas.yaml", ""),
            file("patches/tls.yaml", ""),
            file("patches/unused.yaml", ""),
            file("config/app.conf", ""),
            file("conf/names.yaml", ""),
            file(
                "envs/staging/kustomization.yaml",
                "resources: [../../bases/web]\n",
            ),
            file("unrelated/x.yaml", ""),
        ];
        let tree = Tree::new(&files, &[]);
        let inputs = collect(&tree, "envs/prod", &Method::Kustomize, MAX_INPUTS);
        assert_eq!(
            paths(&inputs),
            [
                "bases/web",
                "common/labels",
                "components/tls",
                "conf/names.yaml",
                "config/app.conf",
                "envs/prod",
                "patches/replicas.yaml",
                "patches/tls.yaml",
            ]
        );
        assert!(!inputs.capped);
        // The other overlay reads the same base, not the prod overlay.
        let staging = collect(&tree, "envs/staging", &Method::Kustomize, MAX_INPUTS);
        assert_eq!(
            paths(&staging),
            ["bases/web", "common/labels", "envs/staging"]
        );
    }

    #[test]
    fn a_base_reached_through_a_symlink_is_recorded_where_it_is() {
        let files = [
            file("envs/prod/kustomization.yaml", "resources: [base]\n"),
            file("bases/web/kustomization.yaml", "resources: [d.yaml]\n"),
            file("bases/web/d.yaml", ""),
        ];
        let links = [Symlink {
            path: "envs/prod/base".into(),
            target: "../../bases/web".into(),
        }];
        let tree = Tree::new(&files, &links);
        let inputs = collect(&tree, "envs/prod", &Method::Kustomize, MAX_INPUTS);
        assert_eq!(paths(&inputs), ["bases/web", "envs/prod"]);
    }

    #[test]
    fn helm_reads_its_chart_values_files_and_local_dependencies() {
        let files = [
            file(
                "charts/web/Chart.yaml",
                "apiVersion: v2\nname: web\ndependencies:\n- name: lib\n  repository: file://../../libs/lib\n",
            ),
            file("charts/web/templates/cm.yaml", ""),
            file("libs/lib/Chart.yaml", "apiVersion: v2\nname: lib\n"),
            file("values/prod.yaml", ""),
        ];
        let tree = Tree::new(&files, &[]);
        let helm = Method::Helm(HelmSource {
            value_files: vec!["../../values/prod.yaml".into(), "values.yaml".into()],
            ..Default::default()
        });
        let inputs = collect(&tree, "charts/web", &helm, MAX_INPUTS);
        assert_eq!(
            paths(&inputs),
            ["charts/web", "libs/lib", "values/prod.yaml"]
        );
    }

    #[test]
    fn a_directory_reads_itself_and_the_root_reads_everything() {
        let tree = Tree::new(&[], &[]);
        assert_eq!(
            paths(&collect(&tree, "apps/a", &Method::Directory, MAX_INPUTS)),
            ["apps/a"]
        );
        let root = Inputs::from_paths(["".into(), "a/b".into(), "c".into()], MAX_INPUTS);
        assert_eq!(paths(&root), [""]);
    }

    #[test]
    fn paths_under_another_are_dropped_but_siblings_kept() {
        let inputs = Inputs::from_paths(
            ["a/b/c.yaml", "a/b", "a-b", "a/bc", "a/b/d/e"].map(String::from),
            MAX_INPUTS,
        );
        assert_eq!(paths(&inputs), ["a-b", "a/b", "a/bc"]);
    }

    #[test]
    fn too_many_inputs_fall_back_to_the_repository_root() {
        let mut files = vec![];
        let mut resources = vec![];
        for i in 0..5 {
            files.push(file(&format!("parts/p{i}/x.yaml"), ""));
            resources.push(format!("../parts/p{i}/x.yaml"));
        }
        files.push(file(
            "app/kustomization.yaml",
            &format!("resources: [{}]\n", resources.join(", ")),
        ));
        let tree = Tree::new(&files, &[]);
        let within = collect(&tree, "app", &Method::Kustomize, 6);
        assert_eq!(within.paths.len(), 6);
        assert!(!within.capped);
        let over = collect(&tree, "app", &Method::Kustomize, 5);
        assert_eq!(
            over,
            Inputs {
                paths: vec![String::new()],
                capped: true
            }
        );
    }
}
