//! A fresh Git repository for one test, driven by the git CLI: a bare
//! repository (what Setpoint fetches from) and a work tree that commits and
//! pushes to it.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct GitRepo {
    _dir: tempfile::TempDir,
    pub bare: PathBuf,
    pub work: PathBuf,
    pub branch: String,
}

impl GitRepo {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("setpoint-git-")
            .tempdir()
            .expect("a temporary directory");
        let bare = dir.path().join("origin.git");
        let work = dir.path().join("work");
        let branch = "main".to_string();
        git(
            dir.path(),
            &["init", "--quiet", "--bare", "-b", &branch, "origin.git"],
        );
        git(dir.path(), &["init", "--quiet", "-b", &branch, "work"]);
        git(&work, &["config", "user.name", "Setpoint Test"]);
        git(&work, &["config", "user.email", "test@setpoint.invalid"]);
        git(&work, &["config", "commit.gpgsign", "false"]);
        git(&work, &["remote", "add", "origin", bare.to_str().unwrap()]);
        Self {
            _dir: dir,
            bare,
            work,
            branch,
        }
    }

    /// The URL an Application names: `file://` and the bare repository.
    pub fn url(&self) -> String {
        format!("file://{}", self.bare.display())
    }

    /// Writes a file in the work tree (creating directories).
    pub fn write(&self, path: &str, contents: &str) -> &Self {
        let full = self.work.join(path);
        std::fs::create_dir_all(full.parent().unwrap()).unwrap();
        std::fs::write(&full, contents).unwrap();
        self
    }

    /// Removes a file from the work tree.
    pub fn remove(&self, path: &str) -> &Self {
        std::fs::remove_file(self.work.join(path)).unwrap();
        self
    }

    /// Commits everything in the work tree, pushes it to the bare repository
    /// and returns the commit id.
    pub fn commit(&self, message: &str) -> String {
        git(&self.work, &["add", "--all"]);
        git(
            &self.work,
            &["commit", "--quiet", "--allow-empty", "-m", message],
        );
        git(&self.work, &["push", "--quiet", "origin", &self.branch]);
        self.head()
    }

    pub fn head(&self) -> String {
        git(&self.work, &["rev-parse", "HEAD"])
    }

    /// A commit on pull request `number`'s branch (made from the base
    /// branch the first time) with `files` written (`None`: removed), pushed
    /// to `refs/pull/<number>/head` as GitHub keeps it in the base
    /// repository; the work tree is back on the base branch after. Returns
    /// the head commit.
    pub fn pull_request(
        &self,
        number: u64,
        files: &[(&str, Option<&str>)],
        message: &str,
    ) -> String {
        let (head_ref, branch) = (format!("refs/pull/{number}/head"), format!("pr-{number}"));
        self.review(&head_ref, &branch, files, message)
    }

    /// The same for GitLab merge request `iid`, pushed to
    /// `refs/merge-requests/<iid>/head`.
    pub fn merge_request(&self, iid: u64, files: &[(&str, Option<&str>)], message: &str) -> String {
        let (head_ref, branch) = (
            format!("refs/merge-requests/{iid}/head"),
            format!("mr-{iid}"),
        );
        self.review(&head_ref, &branch, files, message)
    }

    fn review(
        &self,
        head_ref: &str,
        branch: &str,
        files: &[(&str, Option<&str>)],
        message: &str,
    ) -> String {
        let exists = Command::new("git")
            .args(["rev-parse", "--verify", "--quiet", branch])
            .current_dir(&self.work)
            .output()
            .unwrap()
            .status
            .success();
        if exists {
            git(&self.work, &["checkout", "--quiet", branch]);
        } else {
            git(&self.work, &["checkout", "--quiet", "-b", branch]);
        }
        for (path, contents) in files {
            match contents {
                Some(contents) => {
                    self.write(path, contents);
                }
                None => {
                    self.remove(path);
                }
            }
        }
        git(&self.work, &["add", "--all"]);
        git(&self.work, &["commit", "--quiet", "-m", message]);
        let head = self.head();
        let refspec = format!("HEAD:{head_ref}");
        git(
            &self.work,
            &["push", "--quiet", "--force", "origin", &refspec],
        );
        git(&self.work, &["checkout", "--quiet", &self.branch]);
        head
    }

    pub fn tag(&self, name: &str) {
        git(&self.work, &["tag", name]);
        git(&self.work, &["push", "--quiet", "origin", name]);
    }
}

/// A repository served over plain ("dumb") HTTP on loopback as
/// `http://127.0.0.1:PORT/<owner>/<repo>.git`, the shape of a GitHub URL; the
/// server stops when this is dropped.
pub struct HttpGit {
    pub url: String,
    server: std::process::Child,
    _root: tempfile::TempDir,
}

impl Drop for HttpGit {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

impl GitRepo {
    /// Serves the bare repository over HTTP (python3's http.server) as
    /// `owner/repo`; each later push updates what the server offers.
    pub fn serve_http(&self, owner: &str, repo: &str) -> HttpGit {
        let hook = self.bare.join("hooks/post-update");
        std::fs::write(&hook, "#!/bin/sh\nexec git update-server-info\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        git(&self.bare, &["update-server-info"]);
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join(owner)).unwrap();
        std::os::unix::fs::symlink(
            &self.bare,
            root.path().join(owner).join(format!("{repo}.git")),
        )
        .unwrap();
        let port = super::process::free_port();
        let server = Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(root.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("python3 is installed");
        let url = format!("http://127.0.0.1:{port}/{owner}/{repo}.git");
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "python3 -m http.server did not listen on {port}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        HttpGit {
            url,
            server,
            _root: root,
        }
    }
}

impl Default for GitRepo {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs git in `dir`, panics with its stderr on failure, returns stdout trimmed.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .output()
        .expect("git is installed");
    assert!(
        out.status.success(),
        "git {} in {}: {}",
        args.join(" "),
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}
