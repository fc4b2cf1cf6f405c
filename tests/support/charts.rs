//! Chart repositories for the chart-source tests, all real: a Helm
//! repository is a directory that `helm package` and `helm repo index`
//! write, served over HTTP by a small static file server (actix-web; strong
//! ETags and `If-None-Match`, requests counted per path, stopped and started
//! again on the same port to play a repository that is down); an OCI
//! registry is CNCF distribution's `registry` (built by
//! tests/tools/registry/build.sh) on a free loopback port with its own
//! storage, charts pushed with `helm push --plain-http`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use sha2::{Digest, Sha256};

use super::process::free_port;
use super::wait_for;

/// `$SETPOINT_HELM`, else `helm` on PATH.
pub fn helm() -> PathBuf {
    std::env::var_os("SETPOINT_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|| "helm".into())
}

/// Runs helm with its homes in `home`; panics with its output on failure.
pub fn run_helm(home: &Path, args: &[&str]) -> String {
    let output = Command::new(helm())
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("HOME", home)
        .output()
        .expect("run helm");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "helm {args:?}: {text}");
    text
}

/// A chart `name` at `version` whose one ConfigMap `<release>-config` says
/// its version and `.Values.greeting`; packaged into `into`, path returned.
pub fn package_chart(work: &Path, name: &str, version: &str, into: &Path) -> PathBuf {
    let chart = work.join(format!("src-{name}-{version}")).join(name);
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(
        chart.join("Chart.yaml"),
        format!("apiVersion: v2\nname: {name}\nversion: {version}\n"),
    )
    .unwrap();
    std::fs::write(chart.join("values.yaml"), "greeting: hello\n").unwrap();
    std::fs::write(
        chart.join("templates/configmap.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-config\ndata:\n  \
         version: {{ .Chart.Version | quote }}\n  greeting: {{ .Values.greeting | quote }}\n",
    )
    .unwrap();
    std::fs::create_dir_all(into).unwrap();
    run_helm(
        work,
        &[
            "package",
            chart.to_str().unwrap(),
            "--destination",
            into.to_str().unwrap(),
        ],
    );
    into.join(format!("{name}-{version}.tgz"))
}

/// A Helm repository: a directory served over HTTP.
pub struct HelmRepo {
    pub dir: tempfile::TempDir,
    pub port: u16,
    requests: Arc<Mutex<HashMap<String, u64>>>,
    server: Mutex<Option<actix_web::dev::ServerHandle>>,
}

impl HelmRepo {
    pub async fn start() -> HelmRepo {
        let repo = HelmRepo {
            dir: tempfile::Builder::new()
                .prefix("helm-repo-")
                .tempdir()
                .unwrap(),
            port: free_port(),
            requests: Arc::default(),
            server: Mutex::new(None),
        };
        repo.up().await;
        repo
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/charts", self.port)
    }

    /// The served directory (`/charts/…`).
    pub fn root(&self) -> PathBuf {
        self.dir.path().join("charts")
    }

    /// Packages `name` `version` and indexes the repository again; the
    /// archive and the index reach the served directory only when both are
    /// written (a poll never sees one without the other). With `corrupt`,
    /// the index has the archive's digest but the served archive is other
    /// bytes. Returns the archive's path and its true bytes.
    pub fn publish_with(&self, name: &str, version: &str, corrupt: bool) -> (PathBuf, Vec<u8>) {
        let staging = self.dir.path().join(format!("staging-{name}-{version}"));
        std::fs::create_dir_all(&staging).unwrap();
        std::fs::create_dir_all(self.root()).unwrap();
        for entry in std::fs::read_dir(self.root()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "tgz") {
                std::fs::copy(&path, staging.join(path.file_name().unwrap())).unwrap();
            }
        }
        let built = package_chart(self.dir.path(), name, version, &staging);
        run_helm(
            self.dir.path(),
            &["repo", "index", staging.to_str().unwrap()],
        );
        let bytes = std::fs::read(&built).unwrap();
        let served = self.root().join(built.file_name().unwrap());
        let contents = if corrupt {
            let mut other = bytes.clone();
            let middle = other.len() / 2;
            other[middle] ^= 0xff;
            other
        } else {
            bytes.clone()
        };
        std::fs::write(&served, contents).unwrap();
        std::fs::rename(staging.join("index.yaml"), self.root().join("index.yaml")).unwrap();
        std::fs::remove_dir_all(&staging).unwrap();
        (served, bytes)
    }

    pub fn publish(&self, name: &str, version: &str) -> PathBuf {
        self.publish_with(name, version, false).0
    }

    /// Requests for `path` (e.g. `/charts/index.yaml`) so far, 304s included.
    pub fn requests(&self, path: &str) -> u64 {
        self.requests
            .lock()
            .unwrap()
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// Serves the directory on `port` (again).
    pub async fn up(&self) {
        let root = self.dir.path().to_path_buf();
        let requests = self.requests.clone();
        let server = actix_web::HttpServer::new(move || {
            let root = root.clone();
            let requests = requests.clone();
            actix_web::App::new().default_service(web::to(move |request: HttpRequest| {
                serve(root.clone(), requests.clone(), request)
            }))
        })
        .workers(1)
        .disable_signals()
        .bind(("127.0.0.1", self.port))
        .expect("bind the Helm repository's port")
        .run();
        *self.server.lock().unwrap() = Some(server.handle());
        tokio::spawn(server);
        let port = self.port;
        wait_for(
            "the Helm repository to listen",
            Duration::from_secs(10),
            || async move {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await;
    }

    /// Stops serving: connections are refused until `up`.
    pub async fn down(&self) {
        let handle = self.server.lock().unwrap().take();
        if let Some(handle) = handle {
            handle.stop(false).await;
        }
    }
}

async fn serve(
    root: PathBuf,
    requests: Arc<Mutex<HashMap<String, u64>>>,
    request: HttpRequest,
) -> HttpResponse {
    let path = request.path().to_string();
    *requests.lock().unwrap().entry(path.clone()).or_default() += 1;
    let relative = path.trim_start_matches('/');
    if relative.split('/').any(|s| s == ".." || s.is_empty()) {
        return HttpResponse::NotFound().finish();
    }
    let Ok(contents) = std::fs::read(root.join(relative)) else {
        return HttpResponse::NotFound().body(format!("{path} not found"));
    };
    let etag = format!("\"{}\"", hex::encode(&Sha256::digest(&contents)[..12]));
    let matches = request
        .headers()
        .get("if-none-match")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    if matches {
        return HttpResponse::NotModified()
            .insert_header(("etag", etag))
            .finish();
    }
    HttpResponse::Ok()
        .insert_header(("etag", etag))
        .content_type(if path.ends_with(".yaml") {
            "text/yaml"
        } else {
            "application/gzip"
        })
        .body(contents)
}

/// The registry binary: `$SETPOINT_REGISTRY`, else the one
/// tests/tools/registry/build.sh builds for the pin in its go.mod.
pub fn registry_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SETPOINT_REGISTRY") {
        return path.into();
    }
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/tools/registry");
    let go_mod = std::fs::read_to_string(here.join("go.mod")).unwrap();
    let version = go_mod
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("github.com/distribution/distribution/v3"))
                .then(|| words.next().map(str::to_string))
                .flatten()
        })
        .expect("the registry's pin in tests/tools/registry/go.mod");
    let cache = std::env::var_os("SETPOINT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/setpoint"));
    cache.join(format!("registry-{version}/bin/registry"))
}

/// A real OCI registry on a free loopback port; killed when dropped.
pub struct OciRegistry {
    pub dir: tempfile::TempDir,
    pub port: u16,
    child: Child,
}

impl OciRegistry {
    pub async fn start() -> OciRegistry {
        let binary = registry_binary();
        assert!(
            binary.is_file(),
            "{} is missing: build it with `make registry-build`",
            binary.display()
        );
        let dir = tempfile::Builder::new()
            .prefix("oci-registry-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  \
                 delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n",
                dir.path().join("storage").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(&binary)
            .args(["serve", config.to_str().unwrap()])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start the registry");
        wait_for(
            "the registry to listen",
            Duration::from_secs(20),
            || async move {
                std::net::TcpStream::connect(("127.0.0.1", port))
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await;
        OciRegistry { dir, port, child }
    }

    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `oci://127.0.0.1:PORT/charts`
    pub fn url(&self) -> String {
        format!("oci://{}/charts", self.host())
    }

    /// Packages and pushes `name` `version`; returns the manifest digest
    /// helm reports.
    pub fn push(&self, name: &str, version: &str) -> String {
        let work = self.dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let archive = package_chart(&work, name, version, &work.join("out"));
        let output = run_helm(
            &work,
            &[
                "push",
                archive.to_str().unwrap(),
                &self.url(),
                "--plain-http",
            ],
        );
        output
            .lines()
            .find_map(|l| l.strip_prefix("Digest: "))
            .unwrap_or_else(|| panic!("no digest in helm push's output: {output}"))
            .trim()
            .to_string()
    }
}

impl Drop for OciRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
