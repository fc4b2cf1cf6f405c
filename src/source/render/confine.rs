//! Renderers stay inside the repository. Kustomize and Helm read files by
//! path, so before either runs the repository's tree at the commit is
//! checked as the filesystem would resolve it: every symlink must point
//! inside the repository, and every path a kustomization or a chart names
//! must stay inside once its `..` and symlinks are resolved. Pure: the tree
//! is the regular files and the symlinks Git holds, nothing on disk.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::Path;

use super::RenderError;
use super::exec::{self, Invocation, Limits};
use crate::source::git::SourceFile;

/// One symlink as Git holds it (mode 120000): its path and its target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symlink {
    pub path: String,
    pub target: String,
}

/// Symlinks followed while resolving one path before it is called a loop
/// (Linux's own limit).
const MAX_HOPS: usize = 40;

/// The repository's tree at one commit: its regular files, the directories
/// that hold them and its symlinks.
pub struct Tree<'a> {
    files: HashMap<&'a str, &'a SourceFile>,
    dirs: HashSet<String>,
    links: HashMap<&'a str, &'a str>,
}

/// Where a path leads.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Relative to the repository's root, `/`-separated; `""` is the root.
    pub path: String,
    /// Symlinks followed on the way.
    pub hops: usize,
}

/// Why a path leads nowhere inside the repository.
#[derive(Debug, PartialEq, Eq)]
pub enum Escape {
    /// It climbs above the root with `..`, or a symlink on the way does.
    ClimbsOut,
    /// It is absolute, or a symlink on the way is.
    Absolute,
    /// Symlinks point at each other.
    Loop,
}

impl Escape {
    pub fn describe(&self) -> &'static str {
        match self {
            Escape::ClimbsOut => "climbs out of the repository",
            Escape::Absolute => "is an absolute path, outside the repository",
            Escape::Loop => "is a loop of symlinks",
        }
    }
}

impl<'a> Tree<'a> {
    pub fn new(files: &'a [SourceFile], links: &'a [Symlink]) -> Self {
        let mut dirs = HashSet::from([String::new()]);
        let paths = files
            .iter()
            .map(|f| f.path.as_str())
            .chain(links.iter().map(|l| l.path.as_str()));
        for path in paths {
            let mut end = path.len();
            while let Some(slash) = path[..end].rfind('/') {
                if !dirs.insert(path[..slash].to_string()) {
                    break;
                }
                end = slash;
            }
        }
        Tree {
            files: files.iter().map(|f| (f.path.as_str(), f)).collect(),
            dirs,
            links: links
                .iter()
                .map(|l| (l.path.as_str(), l.target.as_str()))
                .collect(),
        }
    }

    /// Every regular file.
    pub fn files(&self) -> impl Iterator<Item = &'a SourceFile> + '_ {
        self.files.values().copied()
    }

    pub fn file(&self, path: &str) -> Option<&'a SourceFile> {
        self.files.get(path).copied()
    }

    pub fn is_dir(&self, path: &str) -> bool {
        self.dirs.contains(path)
    }

    /// `relative` (as a kustomization or a chart names it) from the
    /// directory `base`, resolved as the filesystem would: `..` after a
    /// symlink climbs from where the symlink points.
    pub fn resolve(&self, base: &str, relative: &str) -> Result<Resolved, Escape> {
        if relative.starts_with('/') {
            return Err(Escape::Absolute);
        }
        let mut pending: Vec<String> = relative.split('/').rev().map(str::to_string).collect();
        let mut resolved: Vec<String> = base
            .split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            match part.as_str() {
                "" | "." => {}
                ".." => {
                    resolved.pop().ok_or(Escape::ClimbsOut)?;
                }
                _ => {
                    resolved.push(part);
                    let here = resolved.join("/");
                    if let Some(target) = self.links.get(here.as_str()) {
                        hops += 1;
                        if hops > MAX_HOPS {
                            return Err(Escape::Loop);
                        }
                        if target.starts_with('/') {
                            return Err(Escape::Absolute);
                        }
                        // The target replaces the link, from its directory.
                        resolved.pop();
                        pending.extend(target.split('/').rev().map(str::to_string));
                    }
                }
            }
        }
        Ok(Resolved {
            path: resolved.join("/"),
            hops,
        })
    }

    /// Where the symlink at `path` leads.
    fn resolve_link(&self, path: &str) -> Result<Resolved, Escape> {
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
        self.resolve(parent, name)
    }

    /// Every symlink of the repository points inside it (as Argo CD
    /// requires of a repository, used or not).
    pub fn check_symlinks(&self) -> Result<(), RenderError> {
        let mut links: Vec<(&&str, &&str)> = self.links.iter().collect();
        links.sort();
        for (path, target) in links {
            if let Err(escape) = self.resolve_link(path) {
                return Err(RenderError::InvalidSource(format!(
                    "symlink {path} -> {target} {}: symlinks must point inside the repository",
                    match escape {
                        Escape::Loop => escape.describe(),
                        _ => "points outside the repository",
                    }
                )));
            }
        }
        Ok(())
    }

    /// The symlinks whose targets stay inside the repository: the ones the
    /// copy a renderer reads may hold.
    pub fn inside_links(&self) -> Vec<(&'a str, &'a str)> {
        let mut inside: Vec<(&str, &str)> = self
            .links
            .iter()
            .filter(|(path, _)| self.resolve_link(path).is_ok())
            .map(|(path, target)| (*path, *target))
            .collect();
        inside.sort();
        inside
    }
}

/// The symlinks of the tree at `commit` in the bare repository `mirror`
/// (the checkout leaves them out of its files).
pub async fn read_symlinks(
    mirror: &Path,
    commit: &str,
    limits: Limits,
) -> Result<Vec<Symlink>, RenderError> {
    let git = |args: Vec<OsString>, stdin: Vec<u8>| {
        let mut all: Vec<OsString> = vec!["--git-dir".into(), mirror.into()];
        all.extend(args);
        Invocation {
            tool: "git",
            program: Path::new("git"),
            args: all,
            dir: mirror,
            env: vec![
                ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
                ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
            ],
            stdin,
        }
    };
    let unreadable = |error: RenderError| RenderError::ReadTree {
        commit: commit.to_string(),
        message: error.to_string(),
    };
    let listing = exec::run(
        git(
            ["ls-tree", "-r", "-z", "--full-tree", commit]
                .map(OsString::from)
                .to_vec(),
            vec![],
        ),
        limits,
    )
    .await
    .map_err(unreadable)?;
    let mut paths = Vec::new();
    let mut ids = Vec::new();
    for entry in listing.split(|b| *b == 0).filter(|e| !e.is_empty()) {
        let entry = String::from_utf8_lossy(entry);
        let Some((meta, path)) = entry.split_once('\t') else {
            continue;
        };
        let mut fields = meta.split(' ');
        if let (Some("120000"), Some("blob"), Some(id)) =
            (fields.next(), fields.next(), fields.next())
        {
            paths.push(path.to_string());
            ids.extend_from_slice(id.as_bytes());
            ids.push(b'\n');
        }
    }
    if paths.is_empty() {
        return Ok(Vec::new());
    }
    let batch = exec::run(git(vec!["cat-file".into(), "--batch".into()], ids), limits)
        .await
        .map_err(unreadable)?;
    let targets = parse_batch(&batch, paths.len()).ok_or_else(|| RenderError::ReadTree {
        commit: commit.to_string(),
        message: "unexpected git cat-file output".into(),
    })?;
    Ok(paths
        .into_iter()
        .zip(targets)
        .map(|(path, target)| Symlink { path, target })
        .collect())
}

/// `<id> SP <type> SP <size> LF <contents> LF`, once per object.
fn parse_batch(mut batch: &[u8], expected: usize) -> Option<Vec<String>> {
    let mut contents = Vec::with_capacity(expected);
    for _ in 0..expected {
        let newline = batch.iter().position(|b| *b == b'\n')?;
        let header = std::str::from_utf8(&batch[..newline]).ok()?;
        let size: usize = header.rsplit(' ').next()?.parse().ok()?;
        let body = batch.get(newline + 1..newline + 1 + size)?;
        contents.push(String::from_utf8_lossy(body).into_owned());
        batch = batch.get(newline + 1 + size + 1..)?;
    }
    Some(contents)
}

/// The directory part of a repository path (`""` for the root).
pub fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            contents: vec![],
        }
    }

    fn link(path: &str, target: &str) -> Symlink {
        Symlink {
            path: path.into(),
            target: target.into(),
        }
    }

    #[test]
    fn paths_resolve_through_dot_dot_and_symlinks() {
        let files = [file("base/cm.yaml"), file("envs/prod/kustomization.yaml")];
        let links = [
            link("envs/prod/base", "../../base"),
            link("envs/prod/cm.yaml", "base/cm.yaml"),
            link("up", "envs/prod"),
        ];
        let tree = Tree::new(&files, &links);
        let resolve = |base, relative| tree.resolve(base, relative);
        assert_eq!(
            resolve("envs/prod", "../../base/cm.yaml").unwrap(),
            Resolved {
                path: "base/cm.yaml".into(),
                hops: 0
            }
        );
        assert_eq!(
            resolve("envs/prod", "cm.yaml").unwrap(),
            Resolved {
                path: "base/cm.yaml".into(),
                hops: 2
            }
        );
        // `..` after a symlink climbs from where it points: up -> envs/prod,
        // so up/../.. is the root, and one more climbs out.
        assert_eq!(resolve("", "up/../..").unwrap().path, "");
        assert_eq!(resolve("", "up/../../..").unwrap_err(), Escape::ClimbsOut);
        assert_eq!(resolve("envs", "../../etc").unwrap_err(), Escape::ClimbsOut);
        assert_eq!(
            resolve("envs", "/etc/passwd").unwrap_err(),
            Escape::Absolute
        );
        assert!(tree.is_dir("envs/prod") && tree.is_dir("") && !tree.is_dir("base/cm.yaml"));
    }

    #[test]
    fn a_symlink_out_of_the_repository_is_refused_naming_it() {
        let files = [file("apps/a.yaml")];
        for (target, _) in [("../../../etc/passwd", ()), ("/etc/passwd", ())] {
            let links = [link("apps/ok", "a.yaml"), link("apps/secret", target)];
            let tree = Tree::new(&files, &links);
            let err = tree.check_symlinks().unwrap_err();
            assert_eq!(err.reason(), "InvalidSource");
            assert_eq!(
                err.to_string(),
                format!(
                    "symlink apps/secret -> {target} points outside the repository: symlinks must point inside the repository"
                )
            );
            assert_eq!(tree.inside_links(), [("apps/ok", "a.yaml")]);
        }
        // A directory symlink to the root, then up: outside, though each
        // step alone looks inside.
        let links = [link("d/root", ".."), link("d/t", "root/..")];
        let tree = Tree::new(&files, &links);
        assert!(tree.check_symlinks().is_err());
        let looped = [link("a", "b"), link("b", "a")];
        let err = Tree::new(&files, &looped).check_symlinks().unwrap_err();
        assert!(err.to_string().contains("is a loop of symlinks"), "{err}");
        assert!(
            Tree::new(&files, &[link("x", "apps/a.yaml")])
                .check_symlinks()
                .is_ok()
        );
    }
}
