//! Generate: an ApplicationSet's generators turned into parameter sets,
//! one per Application, before the template fills them in. Pure, in two
//! phases around the I/O: [`needs`] says what must be fetched (Git trees,
//! the registered clusters, pull requests), the I/O gathers it as
//! [`Facts`], and [`generate`] evaluates the generators on those facts, so
//! every case is a unit test on plain data.
//!
//! Both phases read the generators through one validation (`parse`), so a
//! generator that cannot be evaluated (two kinds set, a bad glob, a bad
//! regular expression, an unknown selector operator) is refused before any
//! repository or API is read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use globset::{GlobBuilder, GlobMatcher};
use regex::Regex;
use serde_json::Value;

use super::params::{Params, file_params, flatten, path_params, sanitize_name};
use crate::api::{
    ClusterGenerator, Combination, Generator, GitGenerator, GitPathPattern, LabelSelector,
    PullRequestGenerator,
};
use crate::source::git::SourceFile;
use crate::source::render::budget::{self, ManifestLimits};
use crate::source::repo_url::display_url;

/// How deep matrix and merge generators may nest (a matrix of a matrix of
/// a matrix): deeper is unreadable, and each level multiplies the sets.
const MAX_NESTING: usize = 3;

/// The most parameter sets one generator (a matrix, mostly) may yield: a
/// product of two large lists would otherwise be a fleet nobody meant.
const MAX_PARAM_SETS: usize = 10_000;

/// The generators' names, as an ApplicationSet spells them.
const KINDS: [&str; 6] = ["list", "git", "clusters", "pullRequest", "matrix", "merge"];

/// One thing the I/O must fetch before [`generate`] can run.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    Git(GitNeed),
    /// The registered clusters the set's namespace may deploy to.
    Clusters,
    Pulls(PullSource),
}

/// One repository at one revision, and the directories of it the
/// generators read.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GitNeed {
    /// As written in the generator: [`Facts::git`] is keyed by it.
    pub repo_url: String,
    /// A branch, a tag or a commit; `""` is the default branch.
    pub revision: String,
    pub credentials_secret: Option<String>,
    /// The literal leading directories of the generators' globs (`apps` of
    /// `apps/*/config.json`), none under another, sorted: the I/O reads
    /// only the files whose path is under one (starts with `prefix/`);
    /// `""` is the whole repository.
    pub prefixes: Vec<String>,
}

impl fmt::Debug for GitNeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GitNeed")
            .field("repo_url", &crate::secret::ShownUrl(&self.repo_url))
            .field("revision", &self.revision)
            .field("credentials_secret", &self.credentials_secret)
            .field("prefixes", &self.prefixes)
            .finish()
    }
}

/// Where a pull request generator's pull requests come from.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PullSource {
    GitHub {
        owner: String,
        repo: String,
    },
    /// A project id or path (`group/project`).
    GitLab {
        project: String,
    },
}

impl fmt::Display for PullSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PullSource::GitHub { owner, repo } => write!(f, "GitHub repository {owner}/{repo}"),
            PullSource::GitLab { project } => write!(f, "GitLab project {project}"),
        }
    }
}

/// What the I/O gathered for [`needs`], the only input of [`generate`]
/// besides the generators.
#[derive(Clone, Default)]
pub struct Facts {
    /// By (repository URL as written in the generator, revision).
    pub git: BTreeMap<(String, String), GitTree>,
    pub clusters: Vec<ClusterFact>,
    /// The open pull requests of each source; an entry with none is "no
    /// pull requests", a missing entry a bug.
    pub pulls: BTreeMap<PullSource, Vec<PullFact>>,
}

impl fmt::Debug for Facts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let git: Vec<_> = self
            .git
            .iter()
            .map(|((url, revision), tree)| {
                (display_url(url), revision, &tree.commit, tree.files.len())
            })
            .collect();
        f.debug_struct("Facts")
            .field("git", &git)
            .field("clusters", &self.clusters)
            .field("pulls", &self.pulls)
            .finish()
    }
}

/// A repository at the commit its revision resolved to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GitTree {
    pub commit: String,
    /// Every regular file under the need's prefixes, paths relative to the
    /// repository root.
    pub files: Vec<SourceFile>,
}

/// A registered cluster, as its cluster Secret describes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterFact {
    pub name: String,
    pub server: String,
    /// The Secret's labels, which the selector reads.
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// An open pull request (GitLab: merge request).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PullFact {
    pub number: u64,
    pub branch: String,
    pub target_branch: String,
    pub head_sha: String,
    pub labels: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("invalid generator at {at}: {reason}")]
    Invalid { at: String, reason: String },
    #[error("git generator file {path}: {reason}")]
    BadFile { path: String, reason: String },
    #[error("no facts were gathered for {need} (a bug: the I/O fetches what needs() lists)")]
    MissingFacts { need: String },
    #[error(
        "matrix: parameter {key:?} is {left:?} in the first generator's set and {right:?} in the second's"
    )]
    Conflict {
        key: String,
        left: String,
        right: String,
    },
    #[error("{at} yields {count} parameter sets, more than the {max} one generator may yield")]
    TooMany {
        at: String,
        count: usize,
        max: usize,
    },
}

fn invalid(at: &str, reason: impl Into<String>) -> GenerateError {
    GenerateError::Invalid {
        at: at.to_owned(),
        reason: reason.into(),
    }
}

/// What the I/O must fetch for `generators`, deduplicated and sorted; the
/// Git needs of one repository and revision merged into one.
pub fn needs(generators: &[Generator]) -> Result<Vec<Need>, GenerateError> {
    let nodes = parse_all(generators)?;
    let mut git: BTreeMap<(String, String), GitNeed> = BTreeMap::new();
    let mut others = BTreeSet::new();
    let mut pending: Vec<&Node> = nodes.iter().collect();
    while let Some(node) = pending.pop() {
        match &node.kind {
            Kind::List(_) => {}
            Kind::Git(spec) => {
                let key = (spec.repo_url.clone(), spec.revision.clone());
                let need = git.entry(key).or_insert_with(|| GitNeed {
                    repo_url: spec.repo_url.clone(),
                    revision: spec.revision.clone(),
                    credentials_secret: None,
                    prefixes: Vec::new(),
                });
                match (&need.credentials_secret, &spec.credentials_secret) {
                    (Some(a), Some(b)) if a != b => {
                        return Err(invalid(
                            &node.at,
                            format!(
                                "{} at {} is read with credentialsSecret {a:?} by another git generator and {b:?} by this one",
                                display_url(&spec.repo_url),
                                revision_name(&spec.revision),
                            ),
                        ));
                    }
                    (None, Some(b)) => need.credentials_secret = Some(b.clone()),
                    _ => {}
                }
                need.prefixes.extend(spec.patterns.prefixes.iter().cloned());
            }
            Kind::Clusters { .. } => {
                others.insert(Need::Clusters);
            }
            Kind::Pulls { source, .. } => {
                others.insert(Need::Pulls(source.clone()));
            }
            Kind::Matrix(children) | Kind::Merge { children, .. } => pending.extend(children),
        }
    }
    let mut all: BTreeSet<Need> = others;
    for (_, mut need) in git {
        need.prefixes = outermost(need.prefixes);
        all.insert(Need::Git(need));
    }
    Ok(all.into_iter().collect())
}

/// The prefixes no other one contains (`apps` covers `apps/team`, `""`
/// covers everything), sorted.
fn outermost(prefixes: Vec<String>) -> Vec<String> {
    let sorted: BTreeSet<String> = prefixes.into_iter().collect();
    let mut kept: Vec<String> = Vec::new();
    for prefix in sorted {
        let covered = kept
            .iter()
            .any(|outer| outer.is_empty() || prefix.starts_with(&format!("{outer}/")));
        if !covered {
            kept.push(prefix);
        }
    }
    kept
}

/// The parameter sets of `generators` on `facts`: each generator's in
/// order, a set that an earlier generator already yielded left out (the
/// union; two different sets that render the same Application name are the
/// plan's error).
pub fn generate(generators: &[Generator], facts: &Facts) -> Result<Vec<Params>, GenerateError> {
    let nodes = parse_all(generators)?;
    let mut seen = BTreeSet::new();
    let mut all = Vec::new();
    for node in &nodes {
        for params in evaluate(node, facts)? {
            if seen.insert(params.clone()) {
                all.push(params);
            }
        }
    }
    Ok(all)
}

// --- Validation: the generators as evaluable nodes -------------------------

/// A validated generator and where it is in the spec.
struct Node {
    at: String,
    kind: Kind,
}

enum Kind {
    List(Vec<Value>),
    Git(GitSpec),
    Clusters {
        selector: Selector,
        values: BTreeMap<String, String>,
    },
    Pulls {
        source: PullSource,
        labels: Vec<String>,
        filters: Vec<Filter>,
    },
    Matrix(Vec<Node>),
    Merge {
        children: Vec<Node>,
        keys: Vec<String>,
    },
}

struct GitSpec {
    repo_url: String,
    revision: String,
    credentials_secret: Option<String>,
    /// Files rather than directories.
    files: bool,
    patterns: Patterns,
}

struct Patterns {
    include: Vec<Include>,
    exclude: Vec<GlobMatcher>,
    prefixes: Vec<String>,
}

struct Include {
    glob: GlobMatcher,
    /// Its literal segments that start with `.`: a hidden directory is only
    /// generated by a pattern that names it.
    hidden: BTreeSet<String>,
}

struct Selector {
    labels: BTreeMap<String, String>,
    expressions: Vec<(String, Operator, BTreeSet<String>)>,
}

#[derive(Clone, Copy)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

struct Filter {
    branch: Option<Regex>,
    target_branch: Option<Regex>,
}

fn parse_all(generators: &[Generator]) -> Result<Vec<Node>, GenerateError> {
    generators
        .iter()
        .enumerate()
        .map(|(index, generator)| parse(generator, format!("generators[{index}]"), 0))
        .collect()
}

/// One generator of a matrix or merge, still raw JSON.
fn parse_nested(value: &Value, at: String, depth: usize) -> Result<Node, GenerateError> {
    let Value::Object(object) = value else {
        return Err(invalid(&at, "a generator is an object"));
    };
    if let Some(unknown) = object.keys().find(|key| !KINDS.contains(&key.as_str())) {
        return Err(invalid(
            &at,
            format!(
                "unknown field {unknown:?} (a generator is one of {})",
                KINDS.join(", ")
            ),
        ));
    }
    let generator: Generator =
        serde_json::from_value(value.clone()).map_err(|e| invalid(&at, e.to_string()))?;
    parse(&generator, at, depth)
}

/// `depth`: how many matrix or merge generators enclose this one.
fn parse(generator: &Generator, at: String, depth: usize) -> Result<Node, GenerateError> {
    let set: Vec<&str> = [
        generator.list.is_some(),
        generator.git.is_some(),
        generator.clusters.is_some(),
        generator.pull_request.is_some(),
        generator.matrix.is_some(),
        generator.merge.is_some(),
    ]
    .iter()
    .zip(KINDS)
    .filter_map(|(set, kind)| set.then_some(kind))
    .collect();
    match set.as_slice() {
        [] => return Err(invalid(&at, format!("sets none of {}", KINDS.join(", ")))),
        [_] => {}
        several => {
            return Err(invalid(
                &at,
                format!(
                    "sets {}: a generator is exactly one kind (combine them with matrix or merge)",
                    several.join(" and ")
                ),
            ));
        }
    }
    let kind = if let Some(list) = &generator.list {
        for (index, element) in list.elements.iter().enumerate() {
            if !element.is_object() {
                return Err(invalid(
                    &format!("{at}.list.elements[{index}]"),
                    format!("an element is an object, not {}", kind_of(element)),
                ));
            }
        }
        Kind::List(list.elements.clone())
    } else if let Some(git) = &generator.git {
        Kind::Git(parse_git(git, &format!("{at}.git"))?)
    } else if let Some(clusters) = &generator.clusters {
        parse_clusters(clusters, &format!("{at}.clusters"))?
    } else if let Some(pulls) = &generator.pull_request {
        parse_pulls(pulls, &format!("{at}.pullRequest"))?
    } else if let Some(matrix) = &generator.matrix {
        let at = format!("{at}.matrix");
        let children = parse_children(matrix, &at, depth)?;
        if children.len() != 2 {
            return Err(invalid(
                &at,
                format!(
                    "a matrix combines exactly 2 generators, not {}",
                    children.len()
                ),
            ));
        }
        return Ok(Node {
            at,
            kind: Kind::Matrix(children),
        });
    } else if let Some(merge) = &generator.merge {
        let at = format!("{at}.merge");
        let children = parse_children(merge, &at, depth)?;
        if children.len() < 2 {
            return Err(invalid(
                &at,
                format!(
                    "a merge combines 2 or more generators, not {}",
                    children.len()
                ),
            ));
        }
        if merge.merge_keys.is_empty() {
            return Err(invalid(
                &at,
                "mergeKeys is empty: a merge pairs parameter sets by the values of these parameters",
            ));
        }
        return Ok(Node {
            at,
            kind: Kind::Merge {
                children,
                keys: merge.merge_keys.clone(),
            },
        });
    } else {
        unreachable!("exactly one generator kind is set")
    };
    Ok(Node { at, kind })
}

fn parse_children(
    combination: &Combination,
    at: &str,
    depth: usize,
) -> Result<Vec<Node>, GenerateError> {
    if depth + 1 > MAX_NESTING {
        return Err(invalid(
            at,
            format!("matrix and merge generators nest at most {MAX_NESTING} deep"),
        ));
    }
    combination
        .generators
        .iter()
        .enumerate()
        .map(|(index, value)| parse_nested(value, format!("{at}.generators[{index}]"), depth + 1))
        .collect()
}

fn parse_git(git: &GitGenerator, at: &str) -> Result<GitSpec, GenerateError> {
    if git.repo_url.trim().is_empty() {
        return Err(invalid(at, "repoURL is empty"));
    }
    let (files, patterns, field) = match (git.directories.is_empty(), git.files.is_empty()) {
        (false, true) => (false, &git.directories, "directories"),
        (true, false) => (true, &git.files, "files"),
        (true, true) => return Err(invalid(at, "sets neither directories nor files")),
        (false, false) => {
            return Err(invalid(
                at,
                "sets both directories and files: a git generator is one or the other",
            ));
        }
    };
    Ok(GitSpec {
        repo_url: git.repo_url.clone(),
        revision: git.revision.clone().unwrap_or_default(),
        credentials_secret: git.credentials_secret.clone(),
        files,
        patterns: parse_patterns(patterns, files, &format!("{at}.{field}"))?,
    })
}

fn parse_patterns(
    patterns: &[GitPathPattern],
    files: bool,
    at: &str,
) -> Result<Patterns, GenerateError> {
    let mut parsed = Patterns {
        include: Vec::new(),
        exclude: Vec::new(),
        prefixes: Vec::new(),
    };
    for (index, pattern) in patterns.iter().enumerate() {
        let at = format!("{at}[{index}]");
        let path = pattern.path.as_str();
        if path.is_empty() {
            return Err(invalid(&at, "path is empty"));
        }
        if path.starts_with('/') || path == "." || path.starts_with("./") {
            return Err(invalid(
                &at,
                format!(
                    "{path:?}: paths are relative to the repository root, without a leading '/' or './'"
                ),
            ));
        }
        let glob = GlobBuilder::new(path)
            .literal_separator(true)
            .build()
            .map_err(|e| invalid(&at, format!("{path:?} is not a glob: {}", e.kind())))?
            .compile_matcher();
        if pattern.exclude {
            parsed.exclude.push(glob);
            continue;
        }
        let segments: Vec<&str> = path.split('/').collect();
        // A file pattern's last segment names files, not a directory.
        let directories = if files {
            &segments[..segments.len() - 1]
        } else {
            &segments[..]
        };
        let literal: Vec<&str> = directories
            .iter()
            .take_while(|segment| !is_glob(segment))
            .copied()
            .collect();
        parsed.prefixes.push(literal.join("/"));
        let hidden = segments
            .iter()
            .filter(|segment| segment.starts_with('.') && !is_glob(segment))
            .map(|segment| segment.to_string())
            .collect();
        parsed.include.push(Include { glob, hidden });
    }
    if parsed.include.is_empty() {
        return Err(invalid(
            at,
            "every pattern is an exclude: nothing would match",
        ));
    }
    Ok(parsed)
}

fn is_glob(segment: &str) -> bool {
    segment.contains(['*', '?', '[', '{'])
}

fn parse_clusters(clusters: &ClusterGenerator, at: &str) -> Result<Kind, GenerateError> {
    let selector = match &clusters.selector {
        Some(selector) => parse_selector(selector, &format!("{at}.selector"))?,
        None => Selector {
            labels: BTreeMap::new(),
            expressions: Vec::new(),
        },
    };
    Ok(Kind::Clusters {
        selector,
        values: clusters.values.clone(),
    })
}

fn parse_selector(selector: &LabelSelector, at: &str) -> Result<Selector, GenerateError> {
    let mut expressions = Vec::new();
    for (index, expression) in selector.match_expressions.iter().enumerate() {
        let at = format!("{at}.matchExpressions[{index}]");
        let operator = match expression.operator.as_str() {
            "In" => Operator::In,
            "NotIn" => Operator::NotIn,
            "Exists" => Operator::Exists,
            "DoesNotExist" => Operator::DoesNotExist,
            other => {
                return Err(invalid(
                    &at,
                    format!("unknown operator {other:?} (In, NotIn, Exists or DoesNotExist)"),
                ));
            }
        };
        match operator {
            Operator::In | Operator::NotIn if expression.values.is_empty() => {
                return Err(invalid(
                    &at,
                    format!("operator {} needs values", expression.operator),
                ));
            }
            Operator::Exists | Operator::DoesNotExist if !expression.values.is_empty() => {
                return Err(invalid(
                    &at,
                    format!("operator {} takes no values", expression.operator),
                ));
            }
            _ => {}
        }
        expressions.push((
            expression.key.clone(),
            operator,
            expression.values.iter().cloned().collect(),
        ));
    }
    Ok(Selector {
        labels: selector.match_labels.clone(),
        expressions,
    })
}

fn parse_pulls(pulls: &PullRequestGenerator, at: &str) -> Result<Kind, GenerateError> {
    let (source, labels) = match (&pulls.github, &pulls.gitlab) {
        (Some(github), None) => (
            PullSource::GitHub {
                owner: github.owner.clone(),
                repo: github.repo.clone(),
            },
            github.labels.clone(),
        ),
        (None, Some(gitlab)) => (
            PullSource::GitLab {
                project: gitlab.project.clone(),
            },
            gitlab.labels.clone(),
        ),
        (None, None) => return Err(invalid(at, "sets neither github nor gitlab")),
        (Some(_), Some(_)) => {
            return Err(invalid(
                at,
                "sets both github and gitlab: a pull request generator reads one",
            ));
        }
    };
    let regex = |pattern: &Option<String>, at: String| {
        pattern
            .as_deref()
            .map(|pattern| {
                Regex::new(pattern).map_err(|e| {
                    invalid(&at, format!("{pattern:?} is not a regular expression: {e}"))
                })
            })
            .transpose()
    };
    let filters = pulls
        .filters
        .iter()
        .enumerate()
        .map(|(index, filter)| {
            Ok(Filter {
                branch: regex(
                    &filter.branch_match,
                    format!("{at}.filters[{index}].branchMatch"),
                )?,
                target_branch: regex(
                    &filter.target_branch_match,
                    format!("{at}.filters[{index}].targetBranchMatch"),
                )?,
            })
        })
        .collect::<Result<_, GenerateError>>()?;
    Ok(Kind::Pulls {
        source,
        labels,
        filters,
    })
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn revision_name(revision: &str) -> String {
    if revision.is_empty() {
        "the default branch".to_owned()
    } else {
        format!("revision {revision:?}")
    }
}

// --- Evaluation -------------------------------------------------------------

fn evaluate(node: &Node, facts: &Facts) -> Result<Vec<Params>, GenerateError> {
    let sets = match &node.kind {
        Kind::List(elements) => elements.iter().map(flatten).collect(),
        Kind::Git(spec) => {
            let tree = facts
                .git
                .get(&(spec.repo_url.clone(), spec.revision.clone()))
                .ok_or_else(|| GenerateError::MissingFacts {
                    need: format!(
                        "git repository {} at {}",
                        display_url(&spec.repo_url),
                        revision_name(&spec.revision)
                    ),
                })?;
            if spec.files {
                git_files(&spec.patterns, tree)?
            } else {
                git_directories(&spec.patterns, tree)
            }
        }
        Kind::Clusters { selector, values } => clusters(selector, values, &facts.clusters),
        Kind::Pulls {
            source,
            labels,
            filters,
        } => {
            let pulls = facts
                .pulls
                .get(source)
                .ok_or_else(|| GenerateError::MissingFacts {
                    need: format!("the pull requests of {source}"),
                })?;
            pull_requests(pulls, labels, filters)
        }
        Kind::Matrix(children) => {
            let left = evaluate(&children[0], facts)?;
            let right = evaluate(&children[1], facts)?;
            let count = left.len().saturating_mul(right.len());
            if count > MAX_PARAM_SETS {
                return Err(too_many(node, count));
            }
            matrix(&left, &right)?
        }
        Kind::Merge { children, keys } => {
            let base = evaluate(&children[0], facts)?;
            let others = children[1..]
                .iter()
                .map(|child| Ok((child.at.as_str(), evaluate(child, facts)?)))
                .collect::<Result<Vec<_>, GenerateError>>()?;
            merge(&node.at, base, &others, keys)?
        }
    };
    if sets.len() > MAX_PARAM_SETS {
        return Err(too_many(node, sets.len()));
    }
    Ok(sets)
}

fn too_many(node: &Node, count: usize) -> GenerateError {
    GenerateError::TooMany {
        at: node.at.clone(),
        count,
        max: MAX_PARAM_SETS,
    }
}

/// Every directory that holds a file (at any depth), but the root, matched
/// as Argo CD matches: by any include pattern and by no exclude pattern.
fn git_directories(patterns: &Patterns, tree: &GitTree) -> Vec<Params> {
    let mut directories = BTreeSet::new();
    for file in &tree.files {
        let mut dir = file.path.as_str();
        while let Some((parent, _)) = dir.rsplit_once('/') {
            if !directories.insert(parent) {
                break;
            }
            dir = parent;
        }
    }
    directories
        .into_iter()
        .filter(|dir| {
            let hidden: Vec<&str> = dir.split('/').filter(|s| s.starts_with('.')).collect();
            patterns.include.iter().any(|include| {
                include.glob.is_match(dir) && hidden.iter().all(|s| include.hidden.contains(*s))
            }) && !patterns.exclude.iter().any(|glob| glob.is_match(dir))
        })
        .map(path_params)
        .collect()
}

/// Each matching file, in path order: one parameter set of its keys, or one
/// per element of a file holding a list, plus its path parameters (a key of
/// the file's own wins over a path parameter of the same name).
fn git_files(patterns: &Patterns, tree: &GitTree) -> Result<Vec<Params>, GenerateError> {
    let mut files: Vec<&SourceFile> = tree
        .files
        .iter()
        .filter(|file| {
            patterns.include.iter().any(|i| i.glob.is_match(&file.path))
                && !patterns
                    .exclude
                    .iter()
                    .any(|glob| glob.is_match(&file.path))
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    let mut sets = Vec::new();
    for file in files {
        let bad = |reason: String| GenerateError::BadFile {
            path: file.path.clone(),
            reason,
        };
        let objects = match parse_file(file).map_err(bad)? {
            Value::Object(object) => vec![Value::Object(object)],
            Value::Array(items) => {
                if let Some((index, item)) = items.iter().enumerate().find(|(_, i)| !i.is_object())
                {
                    return Err(bad(format!(
                        "element {index} of the list is {}, not an object",
                        kind_of(item)
                    )));
                }
                items
            }
            other => {
                return Err(bad(format!(
                    "it holds {}, not an object or a list of objects",
                    kind_of(&other)
                )));
            }
        };
        for object in &objects {
            let mut params = file_params(&file.path);
            params.extend(flatten(object));
            sets.push(params);
        }
    }
    Ok(sets)
}

/// A YAML or JSON file, refused before serde builds it when its aliases
/// would expand it past what a manifest may be.
fn parse_file(file: &SourceFile) -> Result<Value, String> {
    let limits = ManifestLimits::default();
    if file.contents.len() > limits.max_file_bytes {
        return Err(format!(
            "{} bytes, more than the {} a file may have",
            file.contents.len(),
            limits.max_file_bytes
        ));
    }
    budget::scan(&file.contents, &limits).map_err(|e| e.message)?;
    serde_yaml::from_slice(&file.contents).map_err(|e| format!("not YAML or JSON: {e}"))
}

fn clusters(
    selector: &Selector,
    values: &BTreeMap<String, String>,
    clusters: &[ClusterFact],
) -> Vec<Params> {
    let mut matching: Vec<&ClusterFact> = clusters
        .iter()
        .filter(|cluster| selects(selector, &cluster.labels))
        .collect();
    matching.sort_by(|a, b| a.name.cmp(&b.name));
    matching
        .into_iter()
        .map(|cluster| {
            let mut params = Params::new();
            params.insert("name".to_owned(), cluster.name.clone());
            params.insert("nameNormalized".to_owned(), sanitize_name(&cluster.name));
            params.insert("server".to_owned(), cluster.server.clone());
            for (key, value) in &cluster.labels {
                params.insert(format!("metadata.labels.{key}"), value.clone());
            }
            for (key, value) in &cluster.annotations {
                params.insert(format!("metadata.annotations.{key}"), value.clone());
            }
            for (key, value) in values {
                params.insert(format!("values.{key}"), value.clone());
            }
            params
        })
        .collect()
}

/// Kubernetes' label selector semantics: `NotIn` holds for a missing key.
fn selects(selector: &Selector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .labels
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
        && selector
            .expressions
            .iter()
            .all(|(key, operator, values)| match operator {
                Operator::In => labels.get(key).is_some_and(|v| values.contains(v)),
                Operator::NotIn => labels.get(key).is_none_or(|v| !values.contains(v)),
                Operator::Exists => labels.contains_key(key),
                Operator::DoesNotExist => !labels.contains_key(key),
            })
}

fn pull_requests(pulls: &[PullFact], labels: &[String], filters: &[Filter]) -> Vec<Params> {
    let mut kept: Vec<&PullFact> = pulls
        .iter()
        .filter(|pull| labels.iter().all(|label| pull.labels.contains(label)))
        .filter(|pull| {
            filters.is_empty()
                || filters.iter().any(|filter| {
                    filter
                        .branch
                        .as_ref()
                        .is_none_or(|r| r.is_match(&pull.branch))
                        && filter
                            .target_branch
                            .as_ref()
                            .is_none_or(|r| r.is_match(&pull.target_branch))
                })
        })
        .collect();
    kept.sort_by_key(|pull| pull.number);
    kept.into_iter()
        .map(|pull| {
            let short = |n: usize| pull.head_sha.chars().take(n).collect::<String>();
            Params::from([
                ("number".to_owned(), pull.number.to_string()),
                ("branch".to_owned(), pull.branch.clone()),
                ("branch_slug".to_owned(), slug(&pull.branch)),
                ("target_branch".to_owned(), pull.target_branch.clone()),
                ("target_branch_slug".to_owned(), slug(&pull.target_branch)),
                ("head_sha".to_owned(), pull.head_sha.clone()),
                ("head_short_sha".to_owned(), short(8)),
                ("head_short_sha_7".to_owned(), short(7)),
                ("labels".to_owned(), pull.labels.join(",")),
            ])
        })
        .collect()
}

/// A branch name as Argo CD's `branch_slug` makes it (gosimple/slug with a
/// 50-character limit): lowercase, each run of other characters than
/// letters and digits one `-`, no `-` at either end, and when longer than
/// 50, cut at the last `-` within the first 51 characters (at 50 when
/// there is none), so a slug keeps room for a suffix in a 63-character name.
fn slug(branch: &str) -> String {
    const MAX: usize = 50;
    let mut slug = String::with_capacity(branch.len());
    for c in branch.to_lowercase().chars() {
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug = slug.trim_end_matches('-');
    if slug.len() <= MAX {
        return slug.to_owned();
    }
    // Only ASCII remains, so any byte index is a character boundary.
    match slug[..=MAX].rfind('-') {
        Some(cut) => slug[..cut].to_owned(),
        None => slug[..MAX].to_owned(),
    }
}

/// Each pair of a left and a right set, together; a parameter both have
/// must have one value.
fn matrix(left: &[Params], right: &[Params]) -> Result<Vec<Params>, GenerateError> {
    let mut sets = Vec::with_capacity(left.len() * right.len());
    for a in left {
        for b in right {
            let mut combined = a.clone();
            for (key, value) in b {
                if let Some(existing) = combined.get(key)
                    && existing != value
                {
                    return Err(GenerateError::Conflict {
                        key: key.clone(),
                        left: existing.clone(),
                        right: value.clone(),
                    });
                }
                combined.insert(key.clone(), value.clone());
            }
            sets.push(combined);
        }
    }
    Ok(sets)
}

/// Argo CD's merge: the first generator's sets, each updated by every later
/// generator's set with the same values of the merge keys; a later set that
/// pairs with none is dropped. Two sets of one later generator with the
/// same merge key values are refused, as Argo CD does: which one wins would
/// be an accident of order.
fn merge(
    at: &str,
    mut base: Vec<Params>,
    others: &[(&str, Vec<Params>)],
    keys: &[String],
) -> Result<Vec<Params>, GenerateError> {
    for (index, set) in base.iter().enumerate() {
        if let Some(key) = keys.iter().find(|key| !set.contains_key(*key)) {
            return Err(invalid(
                at,
                format!(
                    "parameter set {index} of the first generator has no parameter {key:?}, a merge key"
                ),
            ));
        }
    }
    let key_of = |set: &Params| -> Option<Vec<String>> {
        keys.iter().map(|key| set.get(key).cloned()).collect()
    };
    for (child_at, sets) in others {
        let mut by_key: BTreeMap<Vec<String>, &Params> = BTreeMap::new();
        for set in sets {
            let Some(key) = key_of(set) else { continue };
            if by_key.insert(key.clone(), set).is_some() {
                return Err(invalid(
                    child_at,
                    format!(
                        "two parameter sets have the same merge key values {key:?}: each must pair with at most one"
                    ),
                ));
            }
        }
        for set in &mut base {
            let key = key_of(set).expect("every base set has every merge key");
            if let Some(update) = by_key.get(&key) {
                set.extend(update.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
    }
    Ok(base)
}

#[cfg(test)]
mod tests;
