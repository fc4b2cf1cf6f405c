//! Setpoint itself as a process (`setpoint run`, `worker`, `webhook`), the
//! way an operator runs it, plus webhook deliveries signed as GitHub and
//! GitLab sign them, posted over real HTTP.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{kubeconfig_path, wait_for};

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `setpoint` binary cargo built for these tests, or `SETPOINT_TEST_BIN`:
/// worktrees that share one cargo target directory overwrite each other's
/// `target/debug/setpoint`, so a copy of one's own can be named instead.
pub fn binary() -> PathBuf {
    std::env::var_os("SETPOINT_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_setpoint")))
}

/// A running `setpoint` process; killed when dropped. Its output goes to a
/// log file that failing tests print.
pub struct Setpoint {
    pub child: Child,
    pub log: PathBuf,
    pub port: Option<u16>,
}

impl Setpoint {
    /// `setpoint <args>` with the test cluster's kubeconfig and `cache` for Git.
    pub fn spawn(args: &[&str], env: &[(&str, &str)], cache: &Path) -> Self {
        Self::spawn_without(args, env, &[], cache)
    }

    /// `setpoint <args>` handling only the Applications of `namespace`
    /// (`SETPOINT_WATCH_NAMESPACES`), its sweep Lease there too: tests run
    /// side by side, and a process must not reconcile other tests'
    /// Applications.
    pub fn scoped(namespace: &str, args: &[&str], env: &[(&str, &str)], cache: &Path) -> Self {
        let mut all = vec![
            ("SETPOINT_WATCH_NAMESPACES", namespace),
            ("POD_NAMESPACE", namespace),
        ];
        all.extend_from_slice(env);
        Self::spawn(args, &all, cache)
    }

    /// The same, with the variables in `unset` removed from its environment
    /// (to see what a configuration file sets).
    pub fn spawn_without(
        args: &[&str],
        env: &[(&str, &str)],
        unset: &[&str],
        cache: &Path,
    ) -> Self {
        let log = cache.join(format!("setpoint-{}.log", super::unique_name("p")));
        let out = std::fs::File::create(&log).unwrap();
        let port = args
            .iter()
            .position(|a| *a == "--listen")
            .and_then(|i| args.get(i + 1))
            .and_then(|l| l.rsplit(':').next())
            .and_then(|p| p.parse().ok());
        let mut command = Command::new(binary());
        command
            .args(args)
            .env("KUBECONFIG", kubeconfig_path())
            .env("SETPOINT_CACHE_DIR", cache)
            .env("SETPOINT_LOG", "info,setpoint=debug")
            // Tests run side by side: any free port unless a test names one.
            .env("SETPOINT_METRICS_LISTEN", "127.0.0.1:0")
            // The tests' repositories are local, and their Applications act
            // with Setpoint's rights unless a test says otherwise (the
            // tenancy tests).
            .env("SETPOINT_ALLOW_LOCAL_REPOS", "true")
            .env("SETPOINT_ADMIN_NAMESPACES", "*")
            .envs(env.iter().copied())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .stdin(Stdio::null());
        for name in unset {
            command.env_remove(name);
        }
        let child = command.spawn().expect("start setpoint");
        Self { child, log, port }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the webhook answers /healthz.
    pub async fn wait_http(&mut self) {
        let port = self.port.expect("a --listen port");
        let log = self.log.clone();
        let child = &mut self.child;
        wait_for("the webhook to listen", Duration::from_secs(30), || {
            let exited = child.try_wait().ok().flatten();
            let log = log.clone();
            async move {
                if let Some(status) = exited {
                    return Err(format!(
                        "setpoint exited ({status}): {}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    ));
                }
                match post(port, "/healthz", &[], "", "GET") {
                    (200, _) => Ok(()),
                    (code, body) => Err(format!("{code} {body}")),
                }
            }
        })
        .await;
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Setpoint {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("--- {} ---\n{}", self.log.display(), self.logs());
        }
    }
}

/// An HTTP request with curl; returns (status, body).
pub fn post(
    port: u16,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
    method: &str,
) -> (u16, String) {
    let mut command = Command::new("curl");
    command
        .args(["-s", "-o", "-", "-w", "\n%{http_code}", "-X", method])
        .arg(format!("http://127.0.0.1:{port}{path}"));
    for (name, value) in headers {
        command.arg("-H").arg(format!("{name}: {value}"));
    }
    if method != "GET" {
        command.arg("--data-binary").arg("@-");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl is installed");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The value of the first sample line that starts with `prefix`.
pub fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// The `/metrics` text of the process whose metrics listen on `port`.
pub fn scrape(port: u16) -> Result<String, String> {
    match post(port, "/metrics", &[], "", "GET") {
        (200, body) => Ok(body),
        (code, body) => Err(format!("{code} {body}")),
    }
}

/// Waits until each worker whose metrics listen on `ports` is the active
/// consumer of `fair` shards (`setpoint_queue_shards_active`): the workers
/// share the shards as a fleet that has been running does.
pub async fn wait_for_shared_shards(ports: &[u16], fair: usize) {
    wait_for(
        "the workers to share the shards",
        Duration::from_secs(120),
        || async {
            let mut active = Vec::new();
            for port in ports {
                let text = scrape(*port)?;
                active.push(sample(&text, "setpoint_queue_shards_active").unwrap_or(-1.0));
            }
            if active.iter().all(|a| *a == fair as f64) {
                Ok(())
            } else {
                Err(format!("active shards per worker: {active:?}"))
            }
        },
    )
    .await;
}

/// `sha256=<hex>` of the body, as GitHub signs it.
pub fn github_signature(secret: &str, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body.as_bytes());
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// A GitHub push event for `url`, branch `main`, the given commit and files.
pub fn github_push(url: &str, commit: &str, changed: &[&str]) -> String {
    serde_json::json!({
        "ref": "refs/heads/main",
        "before": "0000000000000000000000000000000000000001",
        "after": commit,
        "created": false,
        "deleted": false,
        "forced": false,
        "repository": {
            "full_name": "example/deploy",
            "clone_url": url,
            "default_branch": "main"
        },
        "commits": [{ "id": commit, "added": changed, "modified": [], "removed": [] }],
        "head_commit": { "id": commit, "added": changed, "modified": [], "removed": [] }
    })
    .to_string()
}

/// Posts a signed GitHub push; returns (status, body).
pub fn post_github(port: u16, secret: Option<&str>, delivery: &str, body: &str) -> (u16, String) {
    let signature = secret.map(|s| github_signature(s, body));
    let mut headers = vec![
        ("Content-Type", "application/json"),
        ("X-GitHub-Event", "push"),
        ("X-GitHub-Delivery", delivery),
    ];
    if let Some(signature) = &signature {
        headers.push(("X-Hub-Signature-256", signature));
    }
    post(port, "/api/webhooks/github", &headers, body, "POST")
}

/// A GitHub `pull_request` delivery: pull request `number` of `acme/deploy`
/// (served at `url`), from `head` onto `main` at `base`.
pub fn github_pull_request(url: &str, action: &str, number: u64, base: &str, head: &str) -> String {
    serde_json::json!({
        "action": action,
        "number": number,
        "pull_request": {
            "number": number,
            "state": "open",
            "head": {"ref": format!("pr-{number}"), "sha": head, "repo": {"full_name": "acme/deploy"}},
            "base": {"ref": "main", "sha": base, "repo": {"full_name": "acme/deploy"}}
        },
        "repository": {
            "full_name": "acme/deploy",
            "clone_url": url,
            "default_branch": "main"
        }
    })
    .to_string()
}

/// Posts a signed GitHub delivery of `event`; returns (status, body).
pub fn post_github_event(
    port: u16,
    secret: &str,
    event: &str,
    delivery: &str,
    body: &str,
) -> (u16, String) {
    let signature = github_signature(secret, body);
    let headers = [
        ("Content-Type", "application/json"),
        ("X-GitHub-Event", event),
        ("X-GitHub-Delivery", delivery),
        ("X-Hub-Signature-256", signature.as_str()),
    ];
    post(port, "/api/webhooks/github", &headers, body, "POST")
}

/// A GitLab push hook for `url`, branch `main`.
pub fn gitlab_push(url: &str, commit: &str, changed: &[&str]) -> String {
    serde_json::json!({
        "object_kind": "push",
        "ref": "refs/heads/main",
        "before": "0000000000000000000000000000000000000001",
        "after": commit,
        "checkout_sha": commit,
        "project": { "git_http_url": url, "default_branch": "main", "path_with_namespace": "example/deploy" },
        "commits": [{ "id": commit, "added": changed, "modified": [], "removed": [] }],
        "total_commits_count": 1
    })
    .to_string()
}

/// A GitLab `Merge Request Hook` delivery: merge request `iid` of project 14
/// (served at `url`) onto `main`, its head `head`.
pub fn gitlab_merge_request(url: &str, action: &str, iid: u64, head: &str) -> String {
    serde_json::json!({
        "object_kind": "merge_request",
        "event_type": "merge_request",
        "project": {"id": 14, "git_http_url": url, "default_branch": "main",
                    "path_with_namespace": "example/deploy"},
        "object_attributes": {
            "iid": iid, "target_branch": "main", "source_branch": format!("mr-{iid}"),
            "source_project_id": 14, "target_project_id": 14, "state": "opened",
            "action": action,
            "oldrev": if action == "update" { Some("0000000000000000000000000000000000000001") } else { None },
            "last_commit": {"id": head}
        }
    })
    .to_string()
}

/// Posts a GitLab delivery of `event` with the secret `token`.
pub fn post_gitlab_event(port: u16, token: &str, event: &str, body: &str) -> (u16, String) {
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Gitlab-Event", event),
        ("X-Gitlab-Token", token),
    ];
    post(port, "/api/webhooks/gitlab", &headers, body, "POST")
}

pub fn post_gitlab(port: u16, token: &str, body: &str) -> (u16, String) {
    let headers = [
        ("Content-Type", "application/json"),
        ("X-Gitlab-Event", "Push Hook"),
        ("X-Gitlab-Token", token),
    ];
    post(port, "/api/webhooks/gitlab", &headers, body, "POST")
}
