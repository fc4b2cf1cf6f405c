//! Kustomize: `kubectl kustomize <path>` (the kustomize engine built into
//! kubectl, as Argo CD and Flux use the same library), or `kustomize build
//! <path>` when `SETPOINT_KUBECTL` names a program called `kustomize` (the
//! image's), on a copy of the repository's tree, so bases anywhere in the repository work. Renders
//! offline: git may only read the Application's own repository, from
//! Setpoint's mirror; a remote base on another host fails at once. Before
//! it runs, `check` walks the kustomizations it would load: no path they
//! name leaves the repository, generators read no symlink, and no KRM
//! function (exec or container) is asked for; kustomize itself runs with
//! its load restrictor and without plugins.

use std::collections::HashSet;
use std::ffi::OsString;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::budget::{self, ManifestLimits};
use super::confine::Tree;
use super::exec::{self, Invocation};
use super::{Job, KUSTOMIZATION_FILES, RenderError, RenderSettings, directory};
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
        args: arguments(&settings.kubectl, &dir),
        dir: root,
        env,
        stdin: vec![],
    };
    let output = exec::run(invocation, settings.limits)
        .await
        .map_err(explain_offline)?;
    let name = if job.path.is_empty() { "." } else { job.path };
    directory::rendered_objects(
        &SourceFile {
            path: format!("{name} (kustomize build)"),
            contents: output,
        },
        &mut settings.budget(),
    )
}

/// `kubectl kustomize DIR` (or `kustomize build DIR` for a program named
/// `kustomize`: the same engine, without kubectl) with files loaded only
/// from within each kustomization's own directory (the default, said
/// explicitly so a changed default cannot widen it), and no plugins, exec
/// functions or helm (their flags are off by default and never passed).
fn arguments(program: &Path, dir: &Path) -> Vec<OsString> {
    let command = if program.file_name().is_some_and(|name| name == "kustomize") {
        "build"
    } else {
        "kustomize"
    };
    vec![
        command.into(),
        "--load-restrictor=LoadRestrictionsRootOnly".into(),
        dir.into(),
    ]
}

/// How a kustomization uses a path it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// A file or a directory with a kustomization of its own.
    Resource,
    /// A file kustomize reads.
    File,
    /// A file a generator reads into a ConfigMap or a Secret: never a symlink.
    GeneratorFile,
    /// A generator, transformer or validator configuration: a file, a
    /// directory of them, or the configuration itself inline.
    Plugin,
}

/// One path a kustomization names.
#[derive(Debug, PartialEq, Eq)]
struct Reference {
    /// What the kustomization calls it: `resource`, `patch`, ...
    what: String,
    path: String,
    used: Use,
}

/// Checks, before kustomize runs, every kustomization it would load from
/// the Application's path: each path they name stays inside the repository
/// (after `..` and symlinks), files that generators read are not symlinks,
/// and no generator, transformer or validator runs a KRM function.
pub fn check(tree: &Tree, path: &str, limits: &ManifestLimits) -> Result<(), RenderError> {
    let mut seen = HashSet::new();
    let mut pending = vec![path.to_string()];
    while let Some(dir) = pending.pop() {
        if !seen.insert(dir.clone()) {
            continue;
        }
        let Some(file) = KUSTOMIZATION_FILES.iter().find_map(|name| {
            let resolved = tree.resolve(&dir, name).ok()?;
            tree.file(&resolved.path)
        }) else {
            // Not a kustomization: kustomize says so itself.
            continue;
        };
        let name = file.path.rsplit('/').next().unwrap_or(&file.path);
        let at = if dir.is_empty() { "." } else { dir.as_str() };
        let refuse =
            |message: String| RenderError::InvalidSource(format!("{name} in {at}: {message}"));
        let Some(kustomization) = load(file, limits)?.into_iter().next() else {
            continue;
        };
        for reference in references(&kustomization) {
            let Reference { what, path, used } = reference;
            if used == Use::Plugin && path.contains('\n') {
                // Inline configuration.
                let inline = SourceFile {
                    path: file.path.clone(),
                    contents: path.into_bytes(),
                };
                check_plugin(&load(&inline, limits)?, &format!("an inline {what}"))
                    .map_err(refuse)?;
                continue;
            }
            let resolved = tree
                .resolve(&dir, &path)
                .map_err(|escape| refuse(format!("{what} {path} {}", escape.describe())))?;
            if used == Use::GeneratorFile && resolved.hops > 0 {
                return Err(refuse(format!(
                    "{what} {path} is a symlink: generators read only regular files of the repository"
                )));
            }
            match used {
                Use::Resource if tree.is_dir(&resolved.path) => pending.push(resolved.path),
                Use::Plugin if tree.is_dir(&resolved.path) => pending.push(resolved.path),
                Use::Plugin => {
                    if let Some(config) = tree.file(&resolved.path) {
                        check_plugin(&load(config, limits)?, &format!("{what} {path}"))
                            .map_err(refuse)?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Every path the kustomization `file` names (inline configurations
/// included, for the caller to skip), each with whether it may be a
/// directory kustomize loads as a kustomization of its own. Called after
/// `check`, which bounded the file.
pub fn referenced(file: &SourceFile) -> Vec<(String, bool)> {
    let Some(kustomization) = serde_yaml::Deserializer::from_slice(&file.contents)
        .next()
        .and_then(|document| Value::deserialize(document).ok())
    else {
        return vec![];
    };
    references(&kustomization)
        .into_iter()
        .map(|r| (r.path, matches!(r.used, Use::Resource | Use::Plugin)))
        .collect()
}

/// The YAML documents of a kustomization or a plugin configuration, within
/// the manifest limits; one that does not parse is left to kustomize.
fn load(file: &SourceFile, limits: &ManifestLimits) -> Result<Vec<Value>, RenderError> {
    budget::scan(&file.contents, limits).map_err(|e| RenderError::ManifestTooLarge {
        file: file.path.clone(),
        document: Some(e.document),
        message: e.message,
    })?;
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_slice(&file.contents) {
        match Value::deserialize(document) {
            Ok(Value::Null) => {}
            Ok(value) => documents.push(value),
            Err(_) => break,
        }
    }
    Ok(documents)
}

/// A generator, transformer or validator that runs an exec or container
/// KRM function: refused (kustomize would need --enable-alpha-plugins).
fn check_plugin(documents: &[Value], what: &str) -> Result<(), String> {
    for document in documents {
        let annotations = &document["metadata"]["annotations"];
        for key in ["config.kubernetes.io/function", "config.k8s.io/function"] {
            if !annotations[key].is_null() {
                return Err(format!(
                    "{what} runs a KRM function ({key}): Setpoint runs no exec or container functions"
                ));
            }
        }
    }
    Ok(())
}

/// Every path a kustomization names, with how it is used.
fn references(kustomization: &Value) -> Vec<Reference> {
    let mut out = Vec::new();
    let mut add = |what: &str, value: &Value, used: Use| {
        if let Some(path) = value.as_str() {
            out.push(Reference {
                what: what.to_string(),
                path: path.to_string(),
                used,
            });
        }
    };
    let list = |key: &str| kustomization[key].as_array().cloned().unwrap_or_default();
    for (key, what) in [
        ("resources", "resource"),
        ("bases", "base"),
        ("components", "component"),
    ] {
        for entry in list(key) {
            add(what, &entry, Use::Resource);
        }
    }
    for entry in list("patchesStrategicMerge") {
        // A patch may be written inline.
        if entry.as_str().is_some_and(|p| !p.contains('\n')) {
            add("patch", &entry, Use::File);
        }
    }
    for (key, what) in [
        ("patches", "patch"),
        ("patchesJson6902", "patch"),
        ("replacements", "replacement"),
    ] {
        for entry in list(key) {
            add(what, &entry["path"], Use::File);
        }
    }
    for entry in list("configurations") {
        add("configuration", &entry, Use::File);
    }
    for entry in list("crds") {
        add("crd", &entry, Use::File);
    }
    add("openapi", &kustomization["openapi"]["path"], Use::File);
    add(
        "helm chart home",
        &kustomization["helmGlobals"]["chartHome"],
        Use::File,
    );
    for chart in list("helmCharts") {
        add("helm values file", &chart["valuesFile"], Use::File);
        for file in chart["additionalValuesFiles"]
            .as_array()
            .into_iter()
            .flatten()
        {
            add("helm values file", file, Use::File);
        }
    }
    for key in ["configMapGenerator", "secretGenerator"] {
        for generator in list(key) {
            let name = generator["name"].as_str().unwrap_or("?");
            for file in generator["files"].as_array().into_iter().flatten() {
                // `key=path` or `path`.
                if let Some(spec) = file.as_str() {
                    let path = spec.split_once('=').map_or(spec, |(_, p)| p);
                    add(
                        &format!("{key} {name}: file"),
                        &Value::String(path.to_string()),
                        Use::GeneratorFile,
                    );
                }
            }
            for env in generator["envs"].as_array().into_iter().flatten() {
                add(&format!("{key} {name}: env file"), env, Use::GeneratorFile);
            }
            add(
                &format!("{key} {name}: env file"),
                &generator["env"],
                Use::GeneratorFile,
            );
        }
    }
    for (key, what) in [
        ("generators", "generator"),
        ("transformers", "transformer"),
        ("validators", "validator"),
    ] {
        for entry in list(key) {
            add(what, &entry, Use::Plugin);
        }
    }
    out
}

/// Git configuration, as environment, that sends every spelling of the
/// Application's repository URL to the local mirror (`url.<mirror>.insteadOf`;
/// git takes the longest matching prefix), and checks out symlinks as plain
/// files (`core.symlinks=false`): a remote base at another commit cannot
/// reach outside its clone through one.
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
    let mut config: Vec<(String, String)> = prefixes
        .into_iter()
        .map(|prefix| (format!("url.{target}.insteadOf"), prefix))
        .collect();
    config.push(("core.symlinks".into(), "false".into()));
    let mut env = vec![("GIT_CONFIG_COUNT".into(), config.len().to_string().into())];
    for (i, (key, value)) in config.into_iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), key.into()));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), value.into()));
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
    use crate::source::render::confine::Symlink;

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
            .filter(|v| v != "false")
            .collect()
    }

    #[test]
    fn every_spelling_of_the_repository_goes_to_the_mirror() {
        let env = rewrites("https://git.example.com/org/config.git/");
        assert_eq!(env[0], ("GIT_CONFIG_COUNT".into(), "3".into()));
        assert_eq!(
            env[5..],
            [
                ("GIT_CONFIG_KEY_2".into(), "core.symlinks".into()),
                ("GIT_CONFIG_VALUE_2".into(), "false".into())
            ]
        );
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

    fn file(path: &str, contents: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            contents: contents.as_bytes().to_vec(),
        }
    }

    fn link(path: &str, target: &str) -> Symlink {
        Symlink {
            path: path.into(),
            target: target.into(),
        }
    }

    /// `check` of `envs/prod` in a repository with a base and `files`.
    fn check_prod(
        kustomization: &str,
        more: &[SourceFile],
        links: &[Symlink],
    ) -> Result<(), String> {
        let mut files = vec![
            file("base/kustomization.yaml", "resources: [cm.yaml]\n"),
            file("base/cm.yaml", "kind: ConfigMap\n"),
            file("envs/prod/kustomization.yaml", kustomization),
        ];
        files.extend_from_slice(more);
        let tree = Tree::new(&files, links);
        check(&tree, "envs/prod", &ManifestLimits::default()).map_err(|e| {
            assert_eq!(e.reason(), "InvalidSource", "{e}");
            e.to_string()
        })
    }

    #[test]
    fn paths_inside_the_repository_pass() {
        let ok = "resources:\n- ../../base\n- https://github.com/example/config//base?ref=main\n\
                  configMapGenerator:\n- name: settings\n  files: [app.conf, key=other.conf]\n  envs: [.env]\n\
                  patches:\n- path: patch.yaml\n- patch: |-\n    - op: remove\n      path: /x\n";
        assert_eq!(check_prod(ok, &[], &[]), Ok(()));
        // A symlink to a directory inside is followed like one.
        let via_link = "resources: [base]\n";
        assert_eq!(
            check_prod(via_link, &[], &[link("envs/prod/base", "../../base")]),
            Ok(())
        );
    }

    #[test]
    fn a_resource_that_climbs_out_is_refused_naming_the_kustomization() {
        let err = check_prod("resources:\n- ../../../etc\n", &[], &[]).unwrap_err();
        assert_eq!(
            err,
            "kustomization.yaml in envs/prod: resource ../../../etc climbs out of the repository"
        );
        let err = check_prod("resources: [/etc/ssh]\n", &[], &[]).unwrap_err();
        assert!(
            err.ends_with("resource /etc/ssh is an absolute path, outside the repository"),
            "{err}"
        );
        // Found in a base the overlay pulls in.
        let bad_base = [file("base2/kustomization.yaml", "components: [../../x]\n")];
        let err = check_prod("resources: [../../base2]\n", &bad_base, &[]).unwrap_err();
        assert_eq!(
            err,
            "kustomization.yaml in base2: component ../../x climbs out of the repository"
        );
    }

    #[test]
    fn every_kind_of_file_reference_is_checked() {
        for (kustomization, what) in [
            (
                "patchesStrategicMerge: [../../../p.yaml]\n",
                "patch ../../../p.yaml",
            ),
            (
                "patches:\n- path: ../../../p.yaml\n",
                "patch ../../../p.yaml",
            ),
            (
                "patchesJson6902:\n- path: ../../../p.yaml\n",
                "patch ../../../p.yaml",
            ),
            (
                "configurations: [../../../c.yaml]\n",
                "configuration ../../../c.yaml",
            ),
            ("crds: [../../../c.yaml]\n", "crd ../../../c.yaml"),
            (
                "replacements:\n- path: ../../../r.yaml\n",
                "replacement ../../../r.yaml",
            ),
            (
                "openapi:\n  path: ../../../o.json\n",
                "openapi ../../../o.json",
            ),
            ("bases: [../../../b]\n", "base ../../../b"),
            (
                "configMapGenerator:\n- name: s\n  files: [k=../../../etc/passwd]\n",
                "configMapGenerator s: file ../../../etc/passwd",
            ),
            (
                "secretGenerator:\n- name: s\n  envs: [../../../.env]\n",
                "secretGenerator s: env file ../../../.env",
            ),
            (
                "transformers: [../../../t.yaml]\n",
                "transformer ../../../t.yaml",
            ),
            (
                "helmCharts:\n- name: x\n  valuesFile: ../../../v.yaml\n",
                "helm values file ../../../v.yaml",
            ),
        ] {
            let err = check_prod(kustomization, &[], &[]).unwrap_err();
            assert_eq!(
                err,
                format!("kustomization.yaml in envs/prod: {what} climbs out of the repository"),
                "{kustomization}"
            );
        }
    }

    #[test]
    fn generators_read_no_symlink_even_inside() {
        let kustomization = "configMapGenerator:\n- name: settings\n  files: [app.conf]\n";
        let links = [link("envs/prod/app.conf", "../../base/cm.yaml")];
        let err = check_prod(kustomization, &[], &links).unwrap_err();
        assert_eq!(
            err,
            "kustomization.yaml in envs/prod: configMapGenerator settings: file app.conf is a symlink: generators read only regular files of the repository"
        );
    }

    #[test]
    fn krm_functions_are_refused_in_files_and_inline() {
        let function = "apiVersion: example.com/v1\nkind: Fn\nmetadata:\n  name: f\n  annotations:\n    config.kubernetes.io/function: |\n      exec: {path: /bin/sh}\n";
        let err = check_prod(
            "transformers: [fn.yaml]\n",
            &[file("envs/prod/fn.yaml", function)],
            &[],
        )
        .unwrap_err();
        assert!(
            err.starts_with("kustomization.yaml in envs/prod: transformer fn.yaml runs a KRM function (config.kubernetes.io/function)"),
            "{err}"
        );
        let inline = format!(
            "generators:\n- |-\n{}\n",
            function
                .lines()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let err = check_prod(&inline, &[], &[]).unwrap_err();
        assert!(
            err.contains("an inline generator runs a KRM function"),
            "{err}"
        );
        // A builtin transformer's configuration is fine.
        let builtin =
            "apiVersion: builtin\nkind: LabelTransformer\nmetadata: {name: l}\nlabels: {a: b}\n";
        assert_eq!(
            check_prod(
                "transformers: [l.yaml]\n",
                &[file("envs/prod/l.yaml", builtin)],
                &[]
            ),
            Ok(())
        );
    }

    #[test]
    fn kustomize_runs_with_its_load_restrictor_and_no_plugins() {
        let args = arguments(Path::new("kubectl"), Path::new("/tmp/r/repo/app"));
        assert_eq!(args[0], "kustomize");
        assert!(args.contains(&"--load-restrictor=LoadRestrictionsRootOnly".into()));
        for flag in [
            "--enable-alpha-plugins",
            "--enable-exec",
            "--enable-helm",
            "--network",
        ] {
            assert!(
                !args.iter().any(|a| a.to_string_lossy().starts_with(flag)),
                "{flag}"
            );
        }
    }

    #[test]
    fn a_kustomize_binary_is_asked_to_build() {
        for program in ["/usr/local/bin/kustomize", "kustomize"] {
            let args = arguments(Path::new(program), Path::new("/tmp/r/repo/app"));
            assert_eq!(
                args,
                [
                    "build",
                    "--load-restrictor=LoadRestrictionsRootOnly",
                    "/tmp/r/repo/app"
                ]
                .map(OsString::from)
            );
        }
        let kubectl = arguments(Path::new("/opt/kustomize/kubectl"), Path::new("app"));
        assert_eq!(kubectl[0], "kustomize");
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
