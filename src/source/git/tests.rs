//! The Git source's checkouts against real repositories made with the git
//! CLI, and against one-shot HTTP servers for credentials and timeouts.

use std::process::Command as StdCommand;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sha2::{Digest, Sha256};

use super::*;
use crate::source::repo_url::normalize_url;

/// A repository made with the git CLI, independent of the machine's config.
struct Origin {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl Origin {
    fn new() -> Origin {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("origin");
        let origin = Origin { _dir: dir, path };
        std::fs::create_dir(&origin.path).unwrap();
        origin.git(&["init", "--quiet", "--initial-branch=main"]);
        origin
    }

    fn url(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    fn git(&self, args: &[&str]) -> String {
        let output = StdCommand::new("git")
            .args(args)
            .current_dir(&self.path)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "Test")
            .env("GIT_AUTHOR_EMAIL", "test@example.com")
            .env("GIT_COMMITTER_NAME", "Test")
            .env("GIT_COMMITTER_EMAIL", "test@example.com")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }

    fn write(&self, path: &str, contents: &str) {
        let path = self.path.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, contents).unwrap();
    }

    fn commit(&self, message: &str) -> String {
        self.git(&["add", "--all"]);
        self.git(&["commit", "--quiet", "--allow-empty", "-m", message]);
        self.git(&["rev-parse", "HEAD"])
    }
}

struct Fixture {
    origin: Origin,
    _cache: tempfile::TempDir,
    source: GitSource,
}

impl Fixture {
    fn new() -> Fixture {
        let origin = Origin::new();
        let cache = tempfile::tempdir().unwrap();
        let source = GitSource::new(cache.path().to_owned());
        Fixture {
            origin,
            _cache: cache,
            source,
        }
    }

    async fn checkout(
        &self,
        revision: Option<&str>,
        path: Option<&str>,
    ) -> Result<Checkout, GitError> {
        let url = self.origin.url();
        self.source
            .checkout(&CheckoutRequest {
                url: &url,
                revision,
                path,
                ..Default::default()
            })
            .await
    }
}

fn names(checkout: &Checkout) -> Vec<&str> {
    checkout.files.iter().map(|f| f.path.as_str()).collect()
}

fn contents<'a>(checkout: &'a Checkout, path: &str) -> &'a str {
    let file = checkout.files.iter().find(|f| f.path == path).unwrap();
    std::str::from_utf8(&file.contents).unwrap()
}

#[test]
fn git_source_is_cheap_to_share() {
    fn shareable<T: Clone + Send + Sync + 'static>() {}
    shareable::<GitSource>();
}

#[tokio::test]
async fn default_branch() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "a: 1\n");
    let first = fx.origin.commit("first");
    fx.origin.git(&["checkout", "--quiet", "-b", "other"]);
    fx.origin.write("b.yaml", "b: 1\n");
    fx.origin.commit("on other");
    fx.origin.git(&["checkout", "--quiet", "main"]);

    for revision in [None, Some(""), Some("HEAD")] {
        let checkout = fx.checkout(revision, None).await.unwrap();
        assert_eq!(checkout.commit, first);
        assert_eq!(checkout.path, "");
        assert_eq!(names(&checkout), ["a.yaml"]);
        assert_eq!(contents(&checkout, "a.yaml"), "a: 1\n");
    }
}

#[tokio::test]
async fn branch() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "main\n");
    fx.origin.commit("first");
    fx.origin.git(&["checkout", "--quiet", "-b", "feature/x"]);
    fx.origin.write("a.yaml", "feature\n");
    let feature = fx.origin.commit("feature");
    fx.origin.git(&["checkout", "--quiet", "main"]);

    let checkout = fx.checkout(Some("feature/x"), None).await.unwrap();
    assert_eq!(checkout.commit, feature);
    assert_eq!(contents(&checkout, "a.yaml"), "feature\n");

    let full_ref = fx.checkout(Some("refs/heads/feature/x"), None).await;
    assert_eq!(full_ref.unwrap().commit, feature);
}

#[tokio::test]
async fn lightweight_and_annotated_tags_resolve_to_their_commit() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "v1\n");
    let v1 = fx.origin.commit("v1");
    fx.origin.git(&["tag", "v1"]);
    fx.origin.write("a.yaml", "v2\n");
    let v2 = fx.origin.commit("v2");
    fx.origin.git(&["tag", "-a", "v2", "-m", "release 2"]);
    fx.origin.write("a.yaml", "v3\n");
    fx.origin.commit("after");

    let checkout = fx.checkout(Some("v1"), None).await.unwrap();
    assert_eq!(checkout.commit, v1);
    assert_eq!(contents(&checkout, "a.yaml"), "v1\n");
    let checkout = fx.checkout(Some("v2"), None).await.unwrap();
    assert_eq!(checkout.commit, v2, "the commit, not the tag object");
    assert_eq!(contents(&checkout, "a.yaml"), "v2\n");
}

#[tokio::test]
async fn full_and_short_commit_ids() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "old\n");
    let old = fx.origin.commit("old");
    fx.origin.write("a.yaml", "new\n");
    fx.origin.commit("new");

    let checkout = fx.checkout(Some(&old), None).await.unwrap();
    assert_eq!(checkout.commit, old);
    assert_eq!(contents(&checkout, "a.yaml"), "old\n");

    let upper = old.to_ascii_uppercase();
    assert_eq!(fx.checkout(Some(&upper), None).await.unwrap().commit, old);

    let checkout = fx.checkout(Some(&old[..8]), None).await.unwrap();
    assert_eq!(checkout.commit, old);
}

/// A fork's pull request head is on no branch of the base repository:
/// only under `refs/pull/N/head` (GitHub) or `refs/merge-requests/N/head`
/// (GitLab). A checkout of its commit id finds it there.
#[tokio::test]
async fn a_commit_only_a_pull_request_ref_holds_is_fetched_from_it() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "base\n");
    fx.origin.commit("base");
    for head_ref in ["refs/pull/7/head", "refs/merge-requests/3/head"] {
        fx.origin.git(&["checkout", "--quiet", "--detach"]);
        fx.origin.write("a.yaml", &format!("{head_ref}\n"));
        let head = fx.origin.commit(head_ref);
        fx.origin.git(&["update-ref", head_ref, &head]);
        fx.origin.git(&["checkout", "--quiet", "main"]);
        let checkout = fx.checkout(Some(&head), None).await.unwrap();
        assert_eq!(checkout.commit, head);
        assert_eq!(contents(&checkout, "a.yaml"), format!("{head_ref}\n"));
    }
    // A commit nobody has is still not found.
    let error = fx.checkout(Some(&"e".repeat(40)), None).await.unwrap_err();
    assert!(
        matches!(error, GitError::RevisionNotFound { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn missing_revision() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "a\n");
    fx.origin.commit("first");

    let err = fx.checkout(Some("v9"), None).await.unwrap_err();
    assert!(matches!(err, GitError::RevisionNotFound { .. }), "{err:?}");
    assert!(!err.is_transient());
    let expected = format!(
        "revision v9 not found in file://{} (no branch, tag or commit by that name)",
        fx.origin.url()
    );
    assert_eq!(err.to_string(), expected);

    let missing_commit = "0123456789abcdef0123456789abcdef01234567";
    let err = fx.checkout(Some(missing_commit), None).await.unwrap_err();
    assert!(matches!(err, GitError::RevisionNotFound { .. }), "{err:?}");

    // Rev syntax is not a revision name, and does not cost a fetch.
    let fetches = fx.source.fetch_count();
    for revision in ["main~1", "main^{tree}", "-main", "main@{1}", "a..b"] {
        let err = fx.checkout(Some(revision), None).await.unwrap_err();
        assert!(matches!(err, GitError::RevisionNotFound { .. }), "{err:?}");
    }
    assert_eq!(fx.source.fetch_count(), fetches);
}

#[tokio::test]
async fn missing_path_and_a_file_as_path() {
    let fx = Fixture::new();
    fx.origin.write("apps/a/x.yaml", "x\n");
    let commit = fx.origin.commit("first");

    let err = fx.checkout(None, Some("apps/b")).await.unwrap_err();
    assert!(matches!(err, GitError::PathNotFound { .. }), "{err:?}");
    assert!(!err.is_transient());
    assert_eq!(
        err.to_string(),
        format!("path apps/b not found at commit {commit} (no files under it)")
    );
    // A prefix of a name is not a directory.
    let err = fx.checkout(None, Some("apps/a/x")).await.unwrap_err();
    assert!(matches!(err, GitError::PathNotFound { .. }), "{err:?}");

    let err = fx.checkout(None, Some("apps/a/x.yaml")).await.unwrap_err();
    assert!(matches!(err, GitError::NotADirectory { .. }), "{err:?}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("must be a directory"), "{err}");
}

#[tokio::test]
async fn files_under_path_nested_and_sorted() {
    let fx = Fixture::new();
    fx.origin.write("apps/a/z.yaml", "z\n");
    fx.origin.write("apps/a/sub/deeper/b.yaml", "b\n");
    fx.origin.write("apps/a/a.yaml", "a\n");
    fx.origin.write("apps/a-b/c.yaml", "other app\n");
    fx.origin.write("apps/ab/d.yaml", "other app\n");
    fx.origin.write("root.yaml", "root\n");
    std::os::unix::fs::symlink("../../root.yaml", fx.origin.path.join("apps/a/link.yaml")).unwrap();
    let commit = fx.origin.commit("first");

    for path in ["apps/a", "./apps/a/", "/apps/a", "apps//a"] {
        let checkout = fx.checkout(None, Some(path)).await.unwrap();
        assert_eq!(checkout.commit, commit);
        assert_eq!(checkout.path, "apps/a");
        assert_eq!(
            names(&checkout),
            ["apps/a/a.yaml", "apps/a/sub/deeper/b.yaml", "apps/a/z.yaml"]
        );
        assert_eq!(contents(&checkout, "apps/a/sub/deeper/b.yaml"), "b\n");
    }

    let root = fx.checkout(None, Some(".")).await.unwrap();
    assert_eq!(root.path, "");
    assert_eq!(root.files.len(), 6);
    assert!(root.files.windows(2).all(|w| w[0].path < w[1].path));
}

#[tokio::test]
async fn empty_tree_at_root_is_no_files() {
    let fx = Fixture::new();
    let commit = fx.origin.commit("empty");
    let checkout = fx.checkout(None, None).await.unwrap();
    assert_eq!(checkout.commit, commit);
    assert!(checkout.files.is_empty());
}

#[tokio::test]
async fn fetch_skipped_when_the_commit_is_known() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "a\n");
    let commit = fx.origin.commit("first");
    let url = fx.origin.url();

    fx.checkout(Some("main"), None).await.unwrap();
    assert_eq!(fx.source.fetch_count(), 1);

    for revision in [Some("main"), None] {
        let request = CheckoutRequest {
            url: &url,
            revision,
            known_commit: Some(&commit),
            ..Default::default()
        };
        let checkout = fx.source.checkout(&request).await.unwrap();
        assert_eq!(checkout.commit, commit);
    }
    // A commit id already in the mirror needs no fetch either.
    fx.checkout(Some(&commit), None).await.unwrap();
    assert_eq!(fx.source.fetch_count(), 1);

    // A known commit the mirror does not have yet is fetched.
    fx.origin.write("a.yaml", "b\n");
    let next = fx.origin.commit("second");
    let request = CheckoutRequest {
        url: &url,
        revision: Some("main"),
        known_commit: Some(&next),
        ..Default::default()
    };
    assert_eq!(fx.source.checkout(&request).await.unwrap().commit, next);
    assert_eq!(fx.source.fetch_count(), 2);
}

#[tokio::test]
async fn a_pushed_commit_already_resolved_is_checked_out_without_git_or_the_lock() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "a\n");
    let commit = fx.origin.commit("first");
    let url = fx.origin.url();
    let request = CheckoutRequest {
        url: &url,
        revision: Some("main"),
        known_commit: Some(&commit),
        ..Default::default()
    };
    fx.source.checkout(&request).await.unwrap();
    let mirror = fx.source.mirror(&Remote::new(&url, None).unwrap().key);
    let dir = mirror.dir.to_string_lossy().into_owned();
    let spawned = command::spawned::containing(&dir).len();
    assert!(spawned > 0, "the first checkout ran git in the mirror");
    // The lock held elsewhere: a checkout that needed it would wait.
    let held = mirror.lock().await.unwrap();
    for _ in 0..3 {
        let checkout = tokio::time::timeout(Duration::from_secs(10), fx.source.checkout(&request))
            .await
            .expect("no wait for the lock")
            .unwrap();
        assert_eq!(checkout.commit, commit);
        assert_eq!(contents(&checkout, "a.yaml"), "a\n");
    }
    assert_eq!(
        command::spawned::containing(&dir).len(),
        spawned,
        "no git command"
    );
    drop(held);

    // A new commit: the refs change, and what was resolved is asked again.
    fx.origin.write("a.yaml", "b\n");
    let next = fx.origin.commit("second");
    let request = CheckoutRequest {
        known_commit: Some(&next),
        ..request
    };
    assert_eq!(fx.source.checkout(&request).await.unwrap().commit, next);
    let stale = CheckoutRequest {
        known_commit: None,
        ..request
    };
    assert_eq!(fx.source.checkout(&stale).await.unwrap().commit, next);
}

#[tokio::test]
async fn incremental_fetch_picks_up_new_commits_and_deleted_branches() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "1\n");
    let first = fx.origin.commit("first");
    fx.origin.git(&["branch", "doomed"]);
    assert_eq!(fx.checkout(Some("main"), None).await.unwrap().commit, first);
    assert_eq!(
        fx.checkout(Some("doomed"), None).await.unwrap().commit,
        first
    );

    fx.origin.write("a.yaml", "2\n");
    let second = fx.origin.commit("second");
    fx.origin.git(&["branch", "--quiet", "-D", "doomed"]);

    let checkout = fx.checkout(Some("main"), None).await.unwrap();
    assert_eq!(checkout.commit, second);
    assert_eq!(contents(&checkout, "a.yaml"), "2\n");
    let err = fx.checkout(Some("doomed"), None).await.unwrap_err();
    assert!(matches!(err, GitError::RevisionNotFound { .. }), "{err:?}");
    // The earlier commit stays readable by id.
    let old = fx.checkout(Some(&first), None).await.unwrap();
    assert_eq!(contents(&old, "a.yaml"), "1\n");
}

#[tokio::test]
async fn concurrent_checkouts_share_the_mirror() {
    let fx = Fixture::new();
    for app in 0..8 {
        fx.origin
            .write(&format!("apps/{app}/deploy.yaml"), &format!("app: {app}\n"));
    }
    let commit = fx.origin.commit("apps");
    let url = fx.origin.url();

    let mut tasks = Vec::new();
    for app in 0..8 {
        let source = fx.source.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let path = format!("apps/{app}");
            let request = CheckoutRequest {
                url: &url,
                path: Some(&path),
                ..Default::default()
            };
            source.checkout(&request).await
        }));
    }
    for (app, task) in tasks.into_iter().enumerate() {
        let checkout = task.await.unwrap().unwrap();
        assert_eq!(checkout.commit, commit);
        let expected = format!("app: {app}\n");
        assert_eq!(
            contents(&checkout, &format!("apps/{app}/deploy.yaml")),
            expected
        );
    }
    let fetches = fx.source.fetch_count();
    assert!((1..8).contains(&fetches), "{fetches} fetches");
}

#[tokio::test]
async fn sources_in_two_processes_share_the_cache_dir() {
    // Two GitSources have separate in-process locks, as two processes
    // would; only the lock file keeps them apart.
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "a\n");
    let commit = fx.origin.commit("first");
    let url = fx.origin.url();
    let other = GitSource::new(fx._cache.path().to_owned());

    let mut tasks = Vec::new();
    for source in [&fx.source, &other, &fx.source, &other] {
        let source = source.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let request = CheckoutRequest {
                url: &url,
                ..Default::default()
            };
            source.checkout(&request).await
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().commit, commit);
    }
}

#[tokio::test]
async fn spellings_of_one_repository_share_a_mirror() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "a\n");
    let commit = fx.origin.commit("first");
    let url = fx.origin.url();
    let file_url = format!("file://{url}/");

    for spelling in [&url, &file_url] {
        let request = CheckoutRequest {
            url: spelling,
            revision: Some(&commit),
            ..Default::default()
        };
        fx.source.checkout(&request).await.unwrap();
    }
    assert_eq!(fx.source.fetch_count(), 1);

    let mirrors: Vec<String> = std::fs::read_dir(fx._cache.path().join("mirrors"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".lock"))
        .collect();
    let key = normalize_url(&url);
    let digest = hex::encode(Sha256::digest(key.as_bytes()));
    assert_eq!(mirrors, [format!("{}-origin", &digest[..16])]);
}

#[tokio::test]
async fn a_remote_head_naming_a_missing_branch_leaves_branches_usable() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "a\n");
    let commit = fx.origin.commit("first");
    fx.origin
        .git(&["symbolic-ref", "HEAD", "refs/heads/nothing"]);

    let checkout = fx.checkout(Some("main"), None).await.unwrap();
    assert_eq!(checkout.commit, commit);
    let err = fx.checkout(None, None).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "revision HEAD not found in file://{} (the repository has no default branch)",
            fx.origin.url()
        )
    );
}

#[tokio::test]
async fn a_killed_fetch_does_not_wedge_the_mirror() {
    let fx = Fixture::new();
    fx.origin.write("a.yaml", "1\n");
    fx.origin.commit("first");
    fx.checkout(Some("main"), None).await.unwrap();

    // What a fetch killed at its timeout leaves behind.
    let mirror = fx.source.mirror(&normalize_url(&fx.origin.url()));
    std::fs::write(mirror.dir.join("refs/heads/main.lock"), "").unwrap();
    std::fs::write(&mirror.changing_marker, "").unwrap();

    fx.origin.write("a.yaml", "2\n");
    let second = fx.origin.commit("second");
    let checkout = fx.checkout(Some("main"), None).await.unwrap();
    assert_eq!(checkout.commit, second);
    assert!(!mirror.changing_marker.exists());
}

#[tokio::test]
async fn invalid_urls_are_rejected_before_git_runs() {
    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned());
    for url in [
        "",
        "--upload-pack=touch /tmp/pwned",
        "ext::sh -c touch% /tmp/pwned",
        "ftp://example.com/repo",
        "https://",
    ] {
        let request = CheckoutRequest {
            url,
            ..Default::default()
        };
        let err = source.checkout(&request).await.unwrap_err();
        assert!(matches!(err, GitError::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(!err.is_transient());
    }
    assert_eq!(source.fetch_count(), 0);
}

#[test]
fn credentials_debug_redacts_the_password() {
    let credentials = Credentials {
        username: "bot".into(),
        password: "hunter2".into(),
    };
    let debug = format!("{credentials:?}");
    assert!(debug.contains("bot"), "{debug}");
    assert!(!debug.contains("hunter2"), "{debug}");
}

fn assert_no_secret(text: &str, credentials: &Credentials) {
    let token = BASE64.encode(format!("{}:{}", credentials.username, credentials.password));
    assert!(!text.contains(&credentials.password), "{text}");
    assert!(!text.contains(&token), "{text}");
}

#[tokio::test]
async fn credentials_never_appear_in_errors() {
    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned()).with_fetch_retry_budget(Duration::ZERO);
    let credentials = Credentials {
        username: "bot".into(),
        password: "s3cr3t-password".into(),
    };
    for url in [
        "http://127.0.0.1:1/org/repo.git",
        "http://bot:s3cr3t-password@127.0.0.1:1/org/repo.git",
    ] {
        let request = CheckoutRequest {
            url,
            credentials: Some(&credentials),
            ..Default::default()
        };
        let err = source.checkout(&request).await.unwrap_err();
        assert!(matches!(err, GitError::Fetch { .. }), "{err:?}");
        assert!(err.is_transient());
        let text = format!("{err} {err:?}");
        assert!(text.contains("http://127.0.0.1:1/org/repo.git"), "{text}");
        assert_no_secret(&text, &credentials);
    }
}

/// Accepts one HTTP request, returns its head, answers with `response`
/// (or nothing, holding the connection, when `None`).
fn one_shot_server(response: Option<&'static str>) -> (u16, std::sync::mpsc::Receiver<String>) {
    let (port, heads, _release) = held_server(response);
    (port, heads)
}

/// As [`one_shot_server`], but the answer waits until the returned sender
/// sends (or is dropped): until then the git that asked is still running.
fn held_server(
    response: Option<&'static str>,
) -> (
    u16,
    std::sync::mpsc::Receiver<String>,
    std::sync::mpsc::Sender<()>,
) {
    use std::io::{BufRead, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sender, receiver) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = io::BufReader::new(stream.try_clone().unwrap());
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        sender.send(head).unwrap();
        // Err when the sender was dropped: answer at once.
        let _ = released.recv();
        match response {
            Some(response) => {
                let mut stream = stream;
                let _ = stream.write_all(response.as_bytes());
            }
            // Hold the connection until the client gives up.
            None => while reader.read_line(&mut String::new()).unwrap_or(0) > 0 {},
        }
    });
    (port, receiver, release)
}

/// The command lines of this machine's processes that contain `needle`, as
/// any local user can read them.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process may end while it is read.
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(cmdline);
        }
    }
    found
}

/// Log lines written while it is alive, on this thread (a `#[tokio::test]`
/// runs its tasks on the test's thread).
struct CapturedLogs {
    lines: Arc<Mutex<Vec<u8>>>,
    _guard: tracing::subscriber::DefaultGuard,
}

impl CapturedLogs {
    fn start() -> CapturedLogs {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let writer = Arc::clone(&lines);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || LogWriter(Arc::clone(&writer)))
            .finish();
        CapturedLogs {
            lines,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    fn text(&self) -> String {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&lines).into_owned()
    }
}

struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lines.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn credentials_travel_as_a_header() {
    let (port, requests) = one_shot_server(Some(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ));
    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned()).with_fetch_retry_budget(Duration::ZERO);
    let credentials = Credentials {
        username: "bot".into(),
        password: "s3cr3t-password".into(),
    };
    let url = format!("http://127.0.0.1:{port}/org/repo.git");
    let request = CheckoutRequest {
        url: &url,
        credentials: Some(&credentials),
        ..Default::default()
    };
    let err = source.checkout(&request).await.unwrap_err();
    assert!(matches!(err, GitError::Fetch { .. }), "{err:?}");
    assert_no_secret(&format!("{err} {err:?}"), &credentials);

    let head = requests.recv().unwrap();
    let token = BASE64.encode("bot:s3cr3t-password");
    assert!(
        head.contains(&format!("Authorization: Basic {token}")),
        "{head}"
    );
}

#[tokio::test]
async fn a_stalled_fetch_times_out() {
    let (port, _requests) = one_shot_server(None);
    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned())
        .with_fetch_retry_budget(Duration::ZERO)
        .with_fetch_timeout(Duration::from_millis(500));
    let url = format!("http://127.0.0.1:{port}/org/repo.git");
    let request = CheckoutRequest {
        url: &url,
        ..Default::default()
    };
    let err = source.checkout(&request).await.unwrap_err();
    assert!(matches!(err, GitError::Timeout { .. }), "{err:?}");
    assert!(err.is_transient());
    assert_eq!(
        err.to_string(),
        format!("git fetch for {url} timed out after 500ms")
    );
}

/// Issue 10, item 8: `https://user:token@host/…` is a common way to give a
/// token; the token must still arrive (as the header `Credentials` use),
/// but never on a command line, in the mirror's config or in a log line.
#[tokio::test]
async fn url_user_info_travels_as_a_header_never_on_argv_or_in_the_mirror() {
    let logs = CapturedLogs::start();
    let (port, requests, release) = held_server(Some(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ));
    // Unique, so that no other process on the machine mentions it.
    let password = format!("url-s3cr3t-{port}-{}", std::process::id());
    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned()).with_fetch_retry_budget(Duration::ZERO);
    let url = format!("http://bot:{password}@127.0.0.1:{port}/org/repo.git");
    let checkout = tokio::spawn({
        let source = source.clone();
        async move {
            let request = CheckoutRequest {
                url: &url,
                ..Default::default()
            };
            source.checkout(&request).await
        }
    });

    // The server holds git's request: git and its remote helper are running.
    let head = tokio::task::spawn_blocking(move || requests.recv_timeout(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("git sent no request within 60s");
    let fetching = processes_mentioning(&format!("127.0.0.1:{port}"));
    let leaking = processes_mentioning(&password);
    release.send(()).unwrap();
    let err = checkout.await.unwrap().unwrap_err();

    assert!(
        !fetching.is_empty(),
        "no process fetching from 127.0.0.1:{port} was found in /proc"
    );
    assert!(leaking.is_empty(), "on a command line: {leaking:?}");
    // Every git command this test process ran, `remote add` and `remote
    // set-url` included, which end before the server sees a request.
    let recorded = command::spawned::containing(&format!("127.0.0.1:{port}"));
    assert!(!recorded.is_empty(), "no git command was recorded");
    let on_argv = command::spawned::containing(&password);
    assert!(on_argv.is_empty(), "on a command line: {on_argv:?}");

    let token = BASE64.encode(format!("bot:{password}"));
    assert!(
        head.contains(&format!("Authorization: Basic {token}")),
        "{head}"
    );
    // The header went through the environment, not `-c http.….extraHeader=…`.
    let on_argv = command::spawned::containing(&token);
    assert!(on_argv.is_empty(), "on a command line: {on_argv:?}");

    let mut configs = 0;
    for mirror in std::fs::read_dir(cache.path().join("mirrors")).unwrap() {
        let config = mirror.unwrap().path().join("config");
        if let Ok(config) = std::fs::read_to_string(&config) {
            configs += 1;
            assert!(config.contains(&format!("127.0.0.1:{port}")), "{config}");
            assert!(!config.contains(&password), "{config}");
            assert!(!config.contains(&token), "{config}");
        }
    }
    assert_eq!(configs, 1, "one mirror");

    assert!(matches!(err, GitError::Fetch { .. }), "{err:?}");
    let text = format!("{err} {err:?}");
    assert!(
        text.contains(&format!("http://127.0.0.1:{port}/org/repo.git")),
        "{text}"
    );
    assert!(!text.contains(&password), "{text}");
    assert!(!text.contains(&token), "{text}");
    let logs = logs.text();
    assert!(logs.contains(&format!("127.0.0.1:{port}")), "{logs}");
    assert!(!logs.contains(&password), "{logs}");
    assert!(!logs.contains(&token), "{logs}");
}
