//! Render: the files Git holds under an Application's path → the objects it
//! declares. The methods Argo CD has: a plain directory (pure,
//! `directory`), the same with `.jsonnet` files (`jsonnet`, evaluated in
//! process on a thread of its own, within the render time limit), Kustomize
//! (`kustomize build` through `kubectl kustomize`) and Helm (`helm
//! template`). The two external renderers run as bounded child processes
//! (`exec`) on a copy of the repository's tree. Every render but the plain
//! directory's is cached per (revision, path, render options): a sweep over
//! unchanged Applications runs none. A render of no object at all is an
//! error unless the Application allows it (`check_not_empty`).

pub mod budget;
pub mod confine;
pub mod directory;
pub mod exec;
pub mod helm;
pub mod inputs;
pub mod jsonnet;
pub mod kustomize;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::api::{HelmSource, JsonnetSource, Source};
use crate::manifest::{Manifest, ObjectId, Origin};
use crate::source::git::SourceFile;

pub use budget::ManifestLimits;
pub use exec::Limits;
pub use helm::Capabilities;

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("{file}: document {document}{}: {message}", line.map(|l| format!(", line {l}")).unwrap_or_default())]
    ParseManifest {
        file: String,
        document: usize,
        line: Option<usize>,
        message: String,
    },
    /// A manifest file, or one of its documents once its aliases are
    /// expanded, is over a limit (`budget`).
    #[error("{file}: {}{message}", document.map(|d| format!("document {d}: ")).unwrap_or_default())]
    ManifestTooLarge {
        file: String,
        document: Option<usize>,
        message: String,
    },
    #[error("{origin}: {message}")]
    InvalidObject { origin: Origin, message: String },
    #[error("{id} is declared twice: in {first} and in {second}")]
    DuplicateObject {
        id: Box<ObjectId>,
        first: Origin,
        second: Origin,
    },
    /// The source asks for something that cannot be rendered as written.
    #[error("{0}")]
    InvalidSource(String),
    #[error("cannot run {tool} ({program}): {message}")]
    Spawn {
        tool: &'static str,
        program: String,
        message: String,
    },
    #[error("{tool} failed: {message}")]
    Failed { tool: &'static str, message: String },
    #[error("{tool} did not finish within {after:?}{}", if stderr.is_empty() { String::new() } else { format!(": {stderr}") })]
    TimedOut {
        tool: &'static str,
        after: Duration,
        stderr: String,
    },
    #[error("{tool} wrote more than {limit} bytes of manifests")]
    OutputTooLarge { tool: &'static str, limit: usize },
    #[error("failed to read the symlinks of commit {commit}: {message}")]
    ReadTree { commit: String, message: String },
    #[error("failed to write the repository's files for rendering: {0}")]
    Scratch(std::io::Error),
    #[error("failed to read the cluster's version and API groups for helm: {0}")]
    Capabilities(kube::Error),
    /// A `.jsonnet` file (or what it imports) does not evaluate.
    #[error("{file}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Jsonnet {
        file: String,
        line: Option<usize>,
        message: String,
    },
    /// The path rendered to no object, and the Application does not allow
    /// that (`syncPolicy.allowEmpty`).
    #[error("no manifests found in {path}{}; set spec.syncPolicy.allowEmpty if the path is meant to be empty", if found.is_empty() { String::new() } else { format!(" ({found})") })]
    NoManifests { path: String, found: String },
}

impl RenderError {
    /// A manifest Git holds (or a renderer wrote) is itself wrong.
    pub fn is_manifest(&self) -> bool {
        matches!(
            self,
            RenderError::ParseManifest { .. }
                | RenderError::InvalidObject { .. }
                | RenderError::DuplicateObject { .. }
        )
    }

    /// Worth retrying: the next attempt may succeed without a change in Git.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            RenderError::TimedOut { .. }
                | RenderError::Scratch(_)
                | RenderError::Capabilities(_)
                | RenderError::ReadTree { .. }
        )
    }

    pub fn reason(&self) -> &'static str {
        match self {
            RenderError::ManifestTooLarge { .. } => "ManifestTooLarge",
            e if e.is_manifest() => "InvalidManifest",
            RenderError::InvalidSource(_) => "InvalidSource",
            RenderError::Capabilities(_) => "DiscoveryFailed",
            RenderError::Jsonnet { .. } => "InvalidJsonnet",
            RenderError::NoManifests { .. } => "NoManifests",
            _ => "RenderFailed",
        }
    }
}

/// How an Application's path becomes objects.
#[derive(Clone, Debug, PartialEq)]
pub enum Method {
    Directory,
    /// A directory holding `.jsonnet` files: its YAML and JSON files and
    /// what its Jsonnet evaluates to.
    Jsonnet(JsonnetSource),
    Kustomize,
    Helm(HelmSource),
}

/// The files that make a path a Kustomization, as kustomize looks for them.
pub const KUSTOMIZATION_FILES: [&str; 3] =
    ["kustomization.yaml", "kustomization.yml", "Kustomization"];

impl Method {
    /// The method the source names, or the one its files call for: a
    /// `Chart.yaml` is Helm, a kustomization is Kustomize, anything else a
    /// directory (Argo CD's detection), with Jsonnet when it holds a
    /// `.jsonnet` file (`files` are those under `path`).
    pub fn detect(
        source: &Source,
        path: &str,
        files: &[SourceFile],
    ) -> Result<Method, RenderError> {
        let named = [
            source.directory.is_some(),
            source.kustomize.is_some(),
            source.helm.is_some(),
        ];
        if named.iter().filter(|n| **n).count() > 1 {
            return Err(RenderError::InvalidSource(
                "spec.source sets more than one of directory, kustomize and helm".into(),
            ));
        }
        if let Some(helm) = &source.helm {
            return Ok(Method::Helm(helm.clone()));
        }
        if source.kustomize.is_some() {
            return Ok(Method::Kustomize);
        }
        let directory = || {
            let has_jsonnet = files
                .iter()
                .any(|f| jsonnet::is_jsonnet(&f.path) && inputs::covers(path, &f.path));
            match source.directory.as_ref().and_then(|d| d.jsonnet.as_ref()) {
                _ if !has_jsonnet => Method::Directory,
                Some(options) => Method::Jsonnet(options.clone()),
                None => Method::Jsonnet(JsonnetSource::default()),
            }
        };
        if source.directory.is_some() {
            return Ok(directory());
        }
        let at_top = |name: &str| files.iter().any(|f| f.path == join(path, name));
        Ok(if at_top("Chart.yaml") {
            Method::Helm(HelmSource::default())
        } else if KUSTOMIZATION_FILES.iter().any(|name| at_top(name)) {
            Method::Kustomize
        } else {
            directory()
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Method::Directory => "directory",
            Method::Jsonnet(_) => "jsonnet",
            Method::Kustomize => "kustomize",
            Method::Helm(_) => "helm",
        }
    }
}

/// `path` inside the repository joined with `name`; `""` is the root.
pub fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}/{name}")
    }
}

/// Everything an external render depends on: equal jobs give equal output.
pub struct Job<'a> {
    pub method: &'a Method,
    /// The repository as the Application spells it.
    pub repo_url: &'a str,
    /// Its bare mirror: a remote base in the same repository is read from it.
    pub mirror: &'a Path,
    pub commit: &'a str,
    /// Normalized; `""` is the root.
    pub path: &'a str,
    /// The destination namespace (helm's release namespace).
    pub namespace: &'a str,
    /// The Application's name (helm's default release name).
    pub app: &'a str,
    /// The cluster's version and API groups (helm only).
    pub capabilities: Option<&'a Capabilities>,
}

impl std::fmt::Debug for Job<'_> {
    /// The repository URL without its user info (a password, a token).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("method", &self.method)
            .field("repo_url", &crate::secret::ShownUrl(self.repo_url))
            .field("mirror", &self.mirror)
            .field("commit", &self.commit)
            .field("path", &self.path)
            .field("namespace", &self.namespace)
            .field("app", &self.app)
            .field("capabilities", &self.capabilities)
            .finish()
    }
}

impl Job<'_> {
    /// The cache key: a digest of every input but the mirror's location.
    pub fn key(&self) -> String {
        // Only helm's output depends on the namespace and the name (the
        // release's); kustomize apps that share a path share its render.
        let (options, namespace, app) = match self.method {
            Method::Helm(helm) => (
                serde_json::to_string(helm).unwrap_or_default(),
                self.namespace,
                self.app,
            ),
            Method::Jsonnet(jsonnet) => {
                (serde_json::to_string(jsonnet).unwrap_or_default(), "", "")
            }
            _ => (String::new(), "", ""),
        };
        let parts = [
            self.method.name(),
            &options,
            self.repo_url,
            self.commit,
            self.path,
            namespace,
            app,
            &self
                .capabilities
                .map(Capabilities::fingerprint)
                .unwrap_or_default(),
        ];
        let mut digest = Sha256::new();
        for part in parts {
            digest.update(part.len().to_le_bytes());
            digest.update(part.as_bytes());
        }
        hex::encode(digest.finalize())
    }
}

/// Where the renderers are and how far they may go. From the environment:
/// `SETPOINT_KUBECTL` (default `kubectl`, for `kubectl kustomize`),
/// `SETPOINT_HELM` (default `helm`), `SETPOINT_RENDER_TIMEOUT` (default 60s),
/// `SETPOINT_RENDER_MAX_OUTPUT` (bytes, default 32 MiB: a renderer's output,
/// and what a render's documents may expand to), and the limits of one
/// manifest: `SETPOINT_MAX_MANIFEST_BYTES` (a file, default 8 MiB),
/// `SETPOINT_MAX_MANIFEST_ALIASES` (per document, default 10,000),
/// `SETPOINT_MAX_MANIFEST_NODES` (per document once expanded, default
/// 1,000,000), `SETPOINT_MAX_MANIFEST_EXPANDED_BYTES` (per document once
/// expanded, default 10 MiB).
#[derive(Clone, Debug)]
pub struct RenderSettings {
    pub kubectl: PathBuf,
    pub helm: PathBuf,
    pub limits: Limits,
    pub manifest: ManifestLimits,
    /// Rendered outputs kept in memory.
    pub cache_entries: usize,
}

impl Default for RenderSettings {
    fn default() -> Self {
        RenderSettings {
            kubectl: "kubectl".into(),
            helm: "helm".into(),
            limits: Limits {
                timeout: Duration::from_secs(60),
                max_output: 32 * 1024 * 1024,
            },
            manifest: ManifestLimits::default(),
            cache_entries: 1024,
        }
    }
}

impl RenderSettings {
    /// The external renderers that cannot be found (a bare name on `PATH`,
    /// else the path itself), each with the setting that says where it is:
    /// warned about at start, so a missing helm is named once rather than
    /// discovered per Application.
    pub fn missing_tools(&self) -> Vec<String> {
        let found = |program: &Path| {
            if program.components().count() > 1 {
                return program.is_file();
            }
            std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|d| d.join(program).is_file())
            })
        };
        [
            (&self.helm, "helm", "Helm charts", "SETPOINT_HELM"),
            (&self.kubectl, "kubectl", "Kustomize", "SETPOINT_KUBECTL"),
        ]
        .into_iter()
        .filter(|(program, ..)| !found(program))
        .map(|(program, tool, what, variable)| {
            format!(
                "{tool} not found ({}): Applications rendered with {what} will fail until it is installed on PATH or {variable} names it",
                program.display()
            )
        })
        .collect()
    }

    pub fn from_env() -> Self {
        let mut settings = RenderSettings::default();
        if let Some(path) = std::env::var_os("SETPOINT_KUBECTL") {
            settings.kubectl = path.into();
        }
        if let Some(path) = std::env::var_os("SETPOINT_HELM") {
            settings.helm = path.into();
        }
        if let Some(timeout) = std::env::var("SETPOINT_RENDER_TIMEOUT")
            .ok()
            .and_then(|t| crate::serve::parse_duration(&t).ok())
        {
            settings.limits.timeout = timeout;
        }
        if let Some(max) = std::env::var("SETPOINT_RENDER_MAX_OUTPUT")
            .ok()
            .and_then(|m| m.trim().parse().ok())
        {
            settings.limits.max_output = max;
        }
        let number = |name: &str| -> Option<u64> {
            std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
        };
        let manifest = &mut settings.manifest;
        if let Some(max) = number("SETPOINT_MAX_MANIFEST_BYTES") {
            manifest.max_file_bytes = usize::try_from(max).unwrap_or(usize::MAX);
        }
        if let Some(max) = number("SETPOINT_MAX_MANIFEST_ALIASES") {
            manifest.max_aliases = max;
        }
        if let Some(max) = number("SETPOINT_MAX_MANIFEST_NODES") {
            manifest.max_nodes = max;
        }
        if let Some(max) = number("SETPOINT_MAX_MANIFEST_EXPANDED_BYTES") {
            manifest.max_expanded_bytes = max;
        }
        settings
    }

    /// What parsing one render's manifests may cost.
    pub fn budget(&self) -> directory::Budget {
        directory::Budget::new(self.manifest, self.limits.max_output)
    }
}

/// One external render's output and the repository paths it read (kept
/// together, so that a cached render still reports its inputs).
#[derive(Debug, Default)]
pub struct Rendered {
    pub manifests: Vec<Manifest>,
    pub inputs: inputs::Inputs,
}

/// The external renderers of one process, with their output cache.
pub struct Renderers {
    settings: RenderSettings,
    scratch: PathBuf,
    cache: Mutex<Cache>,
    runs: AtomicU64,
    /// Counted into the metrics too, when set.
    runs_counter: Option<
        prometheus_client::metrics::family::Family<
            crate::metrics::RenderLabels,
            prometheus_client::metrics::counter::Counter,
        >,
    >,
    /// Per cluster (by name): each has its own version and API groups.
    capabilities: tokio::sync::Mutex<HashMap<String, (Instant, Arc<Capabilities>)>>,
    /// Jsonnet evaluations (by job key) that outlived the time limit and
    /// still run: a thread cannot be stopped, so the same job is not
    /// started again until it ends.
    runaway: Arc<Mutex<HashSet<String>>>,
}

/// Capabilities are read again after this long (a CRD may have arrived).
const CAPABILITIES_TTL: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Cache {
    entries: HashMap<String, (u64, Arc<Rendered>)>,
    clock: u64,
}

impl Renderers {
    /// `scratch` holds the repository trees while a renderer runs.
    pub fn new(settings: RenderSettings, scratch: PathBuf) -> Self {
        Renderers {
            settings,
            scratch,
            cache: Mutex::default(),
            runs: AtomicU64::new(0),
            runs_counter: None,
            capabilities: tokio::sync::Mutex::default(),
            runaway: Arc::default(),
        }
    }

    /// Counts every renderer run into `metrics` as well.
    pub fn with_metrics(mut self, metrics: &crate::metrics::Metrics) -> Self {
        self.runs_counter = Some(metrics.render_runs.clone());
        self
    }

    pub fn settings(&self) -> &RenderSettings {
        &self.settings
    }

    /// External renderer runs so far (cache hits are not runs).
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// The output of an earlier equal job.
    pub fn cached(&self, key: &str) -> Option<Arc<Rendered>> {
        let mut cache = self.cache.lock().expect("render cache lock");
        cache.clock += 1;
        let now = cache.clock;
        let (used, rendered) = cache.entries.get_mut(key)?;
        *used = now;
        Some(Arc::clone(rendered))
    }

    /// Runs the job's renderer on `tree` (every file of the repository at
    /// the job's commit) and caches what it produced.
    pub async fn render(
        &self,
        job: &Job<'_>,
        key: String,
        tree: &[SourceFile],
    ) -> Result<Arc<Rendered>, RenderError> {
        // Nothing outside the repository may be read: the tree is checked
        // before anything is written or run.
        let links = confine::read_symlinks(job.mirror, job.commit, self.settings.limits).await?;
        let checked = confine::Tree::new(tree, &links);
        checked.check_symlinks()?;
        if let Method::Jsonnet(options) = job.method {
            return self.render_jsonnet(job, key, tree, links, options).await;
        }
        match job.method {
            Method::Directory | Method::Jsonnet(_) => {}
            Method::Kustomize => kustomize::check(&checked, job.path, &self.settings.manifest)?,
            Method::Helm(helm) => helm::check(&checked, job.path, helm)?,
        }
        let inputs = inputs::collect(&checked, job.path, job.method, inputs::MAX_INPUTS);
        std::fs::create_dir_all(&self.scratch).map_err(RenderError::Scratch)?;
        let dir = tempfile::Builder::new()
            .prefix("render-")
            .tempdir_in(&self.scratch)
            .map_err(RenderError::Scratch)?;
        let root = dir.path().join("repo");
        write_tree(&root, tree, &checked.inside_links()).map_err(RenderError::Scratch)?;
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).map_err(RenderError::Scratch)?;
        self.runs.fetch_add(1, Ordering::Relaxed);
        if let Some(counter) = &self.runs_counter {
            counter
                .get_or_create(&crate::metrics::RenderLabels {
                    method: job.method.name().to_string(),
                })
                .inc();
        }
        let started = Instant::now();
        let manifests = match job.method {
            Method::Directory | Method::Jsonnet(_) => {
                unreachable!("a directory is rendered in process")
            }
            Method::Kustomize => kustomize::render(&self.settings, job, &root, &home).await?,
            Method::Helm(helm) => helm::render(&self.settings, job, helm, &root, &home).await?,
        };
        check_unique(&manifests)?;
        tracing::debug!(
            method = job.method.name(),
            path = job.path,
            objects = manifests.len(),
            elapsed = ?started.elapsed(),
            "rendered"
        );
        let rendered = Arc::new(Rendered { manifests, inputs });
        self.insert(key, Arc::clone(&rendered));
        Ok(rendered)
    }

    /// Runs helm on a chart unpacked at `chart` (from a chart repository,
    /// confined as it was unpacked) and caches what it produced. Values
    /// files are a Git chart's: a repository's chart takes inline values.
    pub async fn render_chart(
        &self,
        job: &Job<'_>,
        key: String,
        chart: &Path,
    ) -> Result<Arc<Rendered>, RenderError> {
        let Method::Helm(helm) = job.method else {
            return Err(RenderError::InvalidSource(
                "a chart from a chart repository renders with helm only".into(),
            ));
        };
        if !helm.value_files.is_empty() {
            return Err(RenderError::InvalidSource(
                "spec.source.helm.valueFiles: a chart from a chart repository takes values and valuesObject, not values files".into(),
            ));
        }
        std::fs::create_dir_all(&self.scratch).map_err(RenderError::Scratch)?;
        let dir = tempfile::Builder::new()
            .prefix("render-chart-")
            .tempdir_in(&self.scratch)
            .map_err(RenderError::Scratch)?;
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).map_err(RenderError::Scratch)?;
        self.runs.fetch_add(1, Ordering::Relaxed);
        if let Some(counter) = &self.runs_counter {
            counter
                .get_or_create(&crate::metrics::RenderLabels {
                    method: job.method.name().to_string(),
                })
                .inc();
        }
        let manifests = helm::render(&self.settings, job, helm, chart, &home).await?;
        check_unique(&manifests)?;
        let rendered = Arc::new(Rendered {
            manifests,
            inputs: inputs::Inputs::default(),
        });
        self.insert(key, Arc::clone(&rendered));
        Ok(rendered)
    }

    /// Evaluates the job's Jsonnet on a thread of its own (with a stack
    /// for the parser's recursion), waiting at most the render time limit.
    async fn render_jsonnet(
        &self,
        job: &Job<'_>,
        key: String,
        tree: &[SourceFile],
        links: Vec<confine::Symlink>,
        options: &JsonnetSource,
    ) -> Result<Arc<Rendered>, RenderError> {
        let timeout = self.settings.limits.timeout;
        let timed_out = || RenderError::TimedOut {
            tool: "jsonnet",
            after: timeout,
            stderr: String::new(),
        };
        if self.runaway.lock().expect("runaway lock").contains(&key) {
            return Err(timed_out());
        }
        self.count_run(job.method);
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let files = tree.to_vec();
        let path = job.path.to_string();
        let options = options.clone();
        let mut budget = self.settings.budget();
        let runaway = Arc::clone(&self.runaway);
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread_done = Arc::clone(&done);
        let thread_key = key.clone();
        std::thread::Builder::new()
            .name("jsonnet".into())
            .stack_size(jsonnet::STACK_BYTES)
            .spawn(move || {
                let result = jsonnet::render(&files, &links, &path, &options, &mut budget);
                let mut runaway = runaway.lock().expect("runaway lock");
                thread_done.store(true, Ordering::Relaxed);
                runaway.remove(&thread_key);
                drop(runaway);
                let _ = sender.send(result);
            })
            .map_err(RenderError::Scratch)?;
        let started = Instant::now();
        let evaluated = match tokio::time::timeout(timeout, receiver).await {
            Ok(Ok(result)) => result?,
            Ok(Err(_)) => {
                return Err(RenderError::Failed {
                    tool: "jsonnet",
                    message: "the evaluation stopped unexpectedly".into(),
                });
            }
            Err(_) => {
                let mut runaway = self.runaway.lock().expect("runaway lock");
                // Unless it ended meanwhile: `done` is set under this lock.
                if !done.load(Ordering::Relaxed) {
                    runaway.insert(key);
                }
                return Err(timed_out());
            }
        };
        tracing::debug!(
            method = job.method.name(),
            path = job.path,
            objects = evaluated.manifests.len(),
            elapsed = ?started.elapsed(),
            "rendered"
        );
        let rendered = Arc::new(Rendered {
            manifests: evaluated.manifests,
            inputs: inputs::Inputs::from_paths(evaluated.read, inputs::MAX_INPUTS),
        });
        self.insert(key, Arc::clone(&rendered));
        Ok(rendered)
    }

    fn count_run(&self, method: &Method) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        if let Some(counter) = &self.runs_counter {
            counter
                .get_or_create(&crate::metrics::RenderLabels {
                    method: method.name().to_string(),
                })
                .inc();
        }
    }

    fn insert(&self, key: String, rendered: Arc<Rendered>) {
        let mut cache = self.cache.lock().expect("render cache lock");
        cache.clock += 1;
        let now = cache.clock;
        cache.entries.insert(key, (now, rendered));
        if cache.entries.len() > self.settings.cache_entries.max(1) {
            // The least recently used goes.
            if let Some(oldest) = cache
                .entries
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(key, _)| key.clone())
            {
                cache.entries.remove(&oldest);
            }
        }
    }

    /// Forgets a cluster's capabilities: the next helm render for it reads
    /// them again (a reconcile just applied a CRD there).
    pub async fn invalidate_capabilities(&self, cluster: &str) {
        self.capabilities.lock().await.remove(cluster);
    }

    /// The target cluster's version and API groups, as helm's
    /// `.Capabilities` should see them; read through discovery with
    /// `client` (the cluster named `cluster`), kept a minute.
    pub async fn capabilities(
        &self,
        cluster: &str,
        client: &kube::Client,
    ) -> Result<Arc<Capabilities>, RenderError> {
        let mut cached = self.capabilities.lock().await;
        if let Some((at, capabilities)) = cached.get(cluster)
            && at.elapsed() < CAPABILITIES_TTL
        {
            return Ok(Arc::clone(capabilities));
        }
        let capabilities = Arc::new(
            Capabilities::discover(client)
                .await
                .map_err(RenderError::Capabilities)?,
        );
        cached.insert(
            cluster.to_string(),
            (Instant::now(), Arc::clone(&capabilities)),
        );
        Ok(capabilities)
    }
}

/// Writes every file under `root`, and the symlinks `links` (ones whose
/// targets resolve inside the repository), skipping paths that would leave
/// it. A symlink pointing outside is never written: a renderer finds no
/// file there.
fn write_tree(root: &Path, tree: &[SourceFile], links: &[(&str, &str)]) -> std::io::Result<()> {
    std::fs::create_dir_all(root)?;
    let inside = |path: &str| {
        let relative = Path::new(path);
        !relative.is_absolute()
            && relative
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
    };
    let place = |path: &str| -> std::io::Result<PathBuf> {
        let target = root.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        Ok(target)
    };
    for file in tree.iter().filter(|f| inside(&f.path)) {
        std::fs::write(place(&file.path)?, &file.contents)?;
    }
    for (path, target) in links {
        if inside(path) && !target.starts_with('/') {
            std::os::unix::fs::symlink(target, place(path)?)?;
        }
    }
    Ok(())
}

/// A render of no object at all is an error (`NoManifests`, naming what the
/// path holds and what was skipped), unless the Application says an empty
/// path is intended (`allow_empty`): an emptied path, a wrong path or a
/// forgotten file type must not read as "Synced" with nothing applied.
/// `files` are those under `path`.
pub fn check_not_empty(
    source: &Source,
    path: &str,
    files: &[SourceFile],
    manifests: &[Manifest],
    allow_empty: bool,
) -> Result<(), RenderError> {
    if allow_empty || !manifests.is_empty() {
        return Ok(());
    }
    let shown = if path.is_empty() { "." } else { path };
    let found = match Method::detect(source, path, files) {
        Ok(Method::Kustomize) => "kustomize rendered no object".to_string(),
        Ok(Method::Helm(_)) => "helm rendered no object".to_string(),
        _ => describe_files(path, files),
    };
    Err(RenderError::NoManifests {
        path: shown.to_string(),
        found,
    })
}

/// What a directory holds, by file type: the types it renders that gave
/// no object, then the ones it skipped ("skipped 2 .md files").
fn describe_files(path: &str, files: &[SourceFile]) -> String {
    let mut rendered: BTreeMap<String, usize> = BTreeMap::new();
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    for file in files.iter().filter(|f| inputs::covers(path, &f.path)) {
        let name = file.path.rsplit('/').next().unwrap_or(&file.path);
        let kind = match name.rfind('.') {
            Some(dot) if dot > 0 => name[dot..].to_ascii_lowercase(),
            _ => name.to_string(),
        };
        let renders = matches!(kind.as_str(), ".yaml" | ".yml" | ".json" | ".jsonnet");
        *if renders { &mut rendered } else { &mut skipped }
            .entry(kind)
            .or_default() += 1;
    }
    let list = |kinds: BTreeMap<String, usize>| {
        let mut kinds: Vec<(String, usize)> = kinds.into_iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        kinds
            .iter()
            .map(|(kind, n)| format!("{n} {kind} file{}", if *n == 1 { "" } else { "s" }))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut parts = Vec::new();
    if !rendered.is_empty() {
        parts.push(format!("{} declare no object", list(rendered)));
    }
    if !skipped.is_empty() {
        parts.push(format!("skipped {}", list(skipped)));
    }
    if parts.is_empty() {
        "the path holds no file".to_string()
    } else {
        parts.join("; ")
    }
}

/// Two manifests for one object: an error, whatever their versions.
pub fn check_unique(manifests: &[Manifest]) -> Result<(), RenderError> {
    let mut seen: HashMap<(&str, &str, Option<&str>, &str), &Manifest> = HashMap::new();
    for manifest in manifests {
        let id = &manifest.id;
        let key = (
            id.group.as_str(),
            id.kind.as_str(),
            id.namespace.as_deref(),
            id.name.as_str(),
        );
        if let Some(first) = seen.insert(key, manifest) {
            return Err(RenderError::DuplicateObject {
                id: Box::new(id.clone()),
                first: first.origin.clone(),
                second: manifest.origin.clone(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn missing_renderers_are_named_with_their_setting() {
        let settings = RenderSettings {
            helm: "/nonexistent/helm".into(),
            kubectl: "sh".into(),
            ..Default::default()
        };
        let missing = settings.missing_tools();
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(
            missing[0].starts_with("helm not found (/nonexistent/helm)")
                && missing[0].contains("SETPOINT_HELM"),
            "{missing:?}"
        );
    }

    use super::*;

    fn file(path: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            contents: vec![],
        }
    }

    fn source() -> Source {
        Source {
            repo_url: "/repo".into(),
            ..Default::default()
        }
    }

    #[test]
    fn the_files_at_the_top_of_the_path_choose_the_method() {
        let detect = |files: &[SourceFile]| Method::detect(&source(), "apps/web", files).unwrap();
        assert_eq!(detect(&[file("apps/web/a.yaml")]), Method::Directory);
        assert_eq!(
            detect(&[file("apps/web/kustomization.yaml"), file("apps/web/a.yaml")]),
            Method::Kustomize
        );
        assert_eq!(detect(&[file("apps/web/Kustomization")]), Method::Kustomize);
        assert_eq!(
            detect(&[
                file("apps/web/Chart.yaml"),
                file("apps/web/templates/a.yaml")
            ]),
            Method::Helm(HelmSource::default())
        );
        // Deeper down it is only a file.
        assert_eq!(
            detect(&[file("apps/web/sub/kustomization.yaml")]),
            Method::Directory
        );
        let at_root = Method::detect(&source(), "", &[file("kustomization.yml")]).unwrap();
        assert_eq!(at_root, Method::Kustomize);
    }

    #[test]
    fn a_named_method_wins_and_two_are_an_error() {
        let kustomization = [file("kustomization.yaml")];
        let directory = Source {
            directory: Some(Default::default()),
            ..source()
        };
        assert_eq!(
            Method::detect(&directory, "", &kustomization).unwrap(),
            Method::Directory
        );
        let both = Source {
            kustomize: Some(Default::default()),
            helm: Some(Default::default()),
            ..source()
        };
        let err = Method::detect(&both, "", &kustomization).unwrap_err();
        assert_eq!(err.reason(), "InvalidSource");
        assert!(err.to_string().contains("more than one of"), "{err}");
    }

    #[test]
    fn a_directory_with_jsonnet_files_renders_with_jsonnet() {
        let files = [file("app/main.jsonnet"), file("app/lib.libsonnet")];
        assert_eq!(
            Method::detect(&source(), "app", &files).unwrap(),
            Method::Jsonnet(JsonnetSource::default())
        );
        let options = JsonnetSource {
            libs: vec!["vendor".into()],
            ..Default::default()
        };
        let named = Source {
            directory: Some(crate::api::DirectorySource {
                jsonnet: Some(options.clone()),
            }),
            ..source()
        };
        assert_eq!(
            Method::detect(&named, "app", &files).unwrap(),
            Method::Jsonnet(options.clone())
        );
        // Only libraries, or jsonnet options without jsonnet: a directory.
        let libs = [file("app/lib.libsonnet"), file("app/a.yaml")];
        assert_eq!(
            Method::detect(&named, "app", &libs).unwrap(),
            Method::Directory
        );
        // A kustomization wins, as Argo CD's detection has it.
        let both = [file("app/kustomization.yaml"), file("app/main.jsonnet")];
        assert_eq!(
            Method::detect(&source(), "app", &both).unwrap(),
            Method::Kustomize
        );
        // The options are part of the cache key.
        let plain = Method::Jsonnet(JsonnetSource::default());
        let with_libs = Method::Jsonnet(options);
        let job = |method| Job {
            method,
            repo_url: "/repo",
            mirror: Path::new("/m"),
            commit: "c",
            path: "app",
            namespace: "ns",
            app: "a",
            capabilities: None,
        };
        assert_ne!(job(&plain).key(), job(&with_libs).key());
    }

    #[test]
    fn an_empty_render_names_what_the_path_holds() {
        let files = [
            file("app/a.md"),
            file("app/b.md"),
            file("app/notes.txt"),
            file("app/lib.libsonnet"),
            file("app/sub/empty.yaml"),
            file("app/.gitkeep"),
        ];
        let err = check_not_empty(&source(), "app", &files, &[], false).unwrap_err();
        assert_eq!(err.reason(), "NoManifests");
        assert_eq!(
            err.to_string(),
            "no manifests found in app (1 .yaml file declare no object; skipped 2 .md files, \
             1 .gitkeep file, 1 .libsonnet file, 1 .txt file); set spec.syncPolicy.allowEmpty \
             if the path is meant to be empty"
        );
        assert!(!err.is_transient());
        // Allowed, or not empty: fine.
        assert!(check_not_empty(&source(), "app", &files, &[], true).is_ok());
        let root = check_not_empty(&source(), "", &[], &[], false).unwrap_err();
        assert!(
            root.to_string()
                .starts_with("no manifests found in . (the path holds no file)"),
            "{root}"
        );
        let chart = [file("chart/Chart.yaml")];
        let helm = check_not_empty(&source(), "chart", &chart, &[], false).unwrap_err();
        assert!(
            helm.to_string().contains("(helm rendered no object)"),
            "{helm}"
        );
    }

    #[tokio::test]
    async fn a_jsonnet_evaluation_over_the_time_limit_times_out_and_is_not_run_twice() {
        let renderers = Renderers::new(
            RenderSettings {
                limits: Limits {
                    timeout: Duration::from_millis(200),
                    max_output: 1 << 20,
                },
                ..Default::default()
            },
            PathBuf::from("/nonexistent"),
        );
        let method = Method::Jsonnet(JsonnetSource::default());
        let job = Job {
            method: &method,
            repo_url: "/repo",
            mirror: Path::new("/m"),
            commit: "c",
            path: "app",
            namespace: "ns",
            app: "a",
            capabilities: None,
        };
        // Millions of steps, little memory: seconds of work.
        let slow = SourceFile {
            path: "app/slow.jsonnet".into(),
            contents: b"std.foldl(function(a, x) std.foldl(function(b, y) b + 1, std.range(1, 1500), a), std.range(1, 1500), 0)".to_vec(),
        };
        let tree = [slow];
        let started = Instant::now();
        let options = JsonnetSource::default();
        let render = || renderers.render_jsonnet(&job, job.key(), &tree, vec![], &options);
        let err = render().await.unwrap_err();
        assert!(
            matches!(
                err,
                RenderError::TimedOut {
                    tool: "jsonnet",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.is_transient());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // Still running: the same job is refused at once, not started again.
        if renderers.runaway.lock().unwrap().contains(&job.key()) {
            let again = Instant::now();
            assert!(matches!(render().await, Err(RenderError::TimedOut { .. })));
            assert!(again.elapsed() < Duration::from_millis(100));
            assert_eq!(renderers.runs(), 1);
        }
        // It ends on its own, and forgets the job.
        let deadline = Instant::now() + Duration::from_secs(120);
        while renderers.runaway.lock().unwrap().contains(&job.key()) {
            assert!(Instant::now() < deadline, "the evaluation never ended");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[test]
    fn the_key_changes_with_every_input() {
        let helm = Method::Helm(HelmSource::default());
        let capabilities = Capabilities {
            kube_version: "v1.37.0".into(),
            api_versions: vec!["v1".into()],
        };
        let base = Job {
            method: &helm,
            repo_url: "/repo",
            mirror: Path::new("/cache/a"),
            commit: "c1",
            path: "charts/web",
            namespace: "prod",
            app: "web",
            capabilities: Some(&capabilities),
        };
        let key = base.key();
        // The mirror's location is not an input of the output.
        let moved = Job {
            mirror: Path::new("/elsewhere"),
            ..base
        };
        assert_eq!(moved.key(), key);
        let values = Method::Helm(HelmSource {
            values: Some("replicas: 2".into()),
            ..Default::default()
        });
        let other_caps = Capabilities {
            api_versions: vec!["v1".into(), "example.com/v1".into()],
            ..capabilities.clone()
        };
        for changed in [
            Job {
                commit: "c2",
                ..base
            },
            Job {
                path: "charts/api",
                ..base
            },
            Job {
                namespace: "staging",
                ..base
            },
            Job {
                app: "web2",
                ..base
            },
            Job {
                method: &values,
                ..base
            },
            Job {
                method: &Method::Kustomize,
                capabilities: None,
                ..base
            },
            Job {
                capabilities: Some(&other_caps),
                ..base
            },
        ] {
            assert_ne!(changed.key(), key, "{changed:?}");
        }
        // A kustomization renders the same for any app and namespace.
        let kustomize = Job {
            method: &Method::Kustomize,
            capabilities: None,
            ..base
        };
        assert_eq!(
            Job {
                app: "other",
                namespace: "other",
                ..kustomize
            }
            .key(),
            kustomize.key()
        );
    }

    #[test]
    fn the_tree_is_written_and_paths_that_leave_it_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        let tree = [
            SourceFile {
                path: "base/kustomization.yaml".into(),
                contents: b"resources: []\n".to_vec(),
            },
            SourceFile {
                path: "../outside".into(),
                contents: b"x".to_vec(),
            },
        ];
        let links = [
            confine::Symlink {
                path: "base/all.yaml".into(),
                target: "kustomization.yaml".into(),
            },
            confine::Symlink {
                path: "base/secret".into(),
                target: "../../../etc/passwd".into(),
            },
        ];
        let checked = confine::Tree::new(&tree, &links);
        write_tree(&root, &tree, &checked.inside_links()).unwrap();
        assert_eq!(
            std::fs::read(root.join("base/kustomization.yaml")).unwrap(),
            b"resources: []\n"
        );
        assert!(!dir.path().join("outside").exists());
        // The symlink inside is one; the one pointing outside is not there.
        assert_eq!(
            std::fs::read(root.join("base/all.yaml")).unwrap(),
            b"resources: []\n"
        );
        assert!(std::fs::symlink_metadata(root.join("base/secret")).is_err());
    }

    #[test]
    fn the_cache_forgets_the_least_recently_used() {
        let renderers = Renderers::new(
            RenderSettings {
                cache_entries: 2,
                ..Default::default()
            },
            PathBuf::from("/nonexistent"),
        );
        renderers.insert("a".into(), Arc::default());
        renderers.insert("b".into(), Arc::default());
        assert!(renderers.cached("a").is_some());
        renderers.insert("c".into(), Arc::default());
        assert!(renderers.cached("a").is_some());
        assert!(renderers.cached("b").is_none());
        assert!(renderers.cached("c").is_some());
    }
}
