//! The `git` runner: one command against one mirror, with a clean
//! environment, a timeout, its stdin fed while its output is read, and its
//! stderr scrubbed and cut to a readable size.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::process::{Output, Stdio};
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::process::{ChildStdin, Command};

use super::mirror::Mirror;
use super::remote::Remote;
use super::{GitError, Settings};

/// Enough of git's stderr to say what went wrong, not enough to flood an Event.
const MAX_STDERR: usize = 4096;

/// Inherited `GIT_*` variables that only say where git, ssh or TLS live; every
/// other one (`GIT_DIR`, `GIT_CONFIG_*`, `GIT_TRACE*`, `GIT_ASKPASS`, …) would
/// change what a command does, or print secrets, so it is removed.
const KEPT_GIT_VARS: &[&str] = &[
    "GIT_EXEC_PATH",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_SSH_VARIANT",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "GIT_PROXY_COMMAND",
    "GIT_HTTP_USER_AGENT",
];

/// Commands against one mirror, with the environment every one of them gets.
pub(super) struct Git<'a> {
    pub(super) mirror: &'a Mirror,
    pub(super) remote: &'a Remote,
    pub(super) settings: &'a Settings,
}

impl Git<'_> {
    /// Runs a command that must succeed; its stdout on success.
    pub(super) async fn run_checked(
        &self,
        args: &[&str],
        input: Option<Vec<u8>>,
        operation: &'static str,
    ) -> Result<Vec<u8>, GitError> {
        let output = self
            .run(args, input, operation, self.settings.local_timeout, false)
            .await?;
        self.checked(args, output)
    }

    /// Runs a command that only reads the mirror; its exit status is the answer.
    pub(super) async fn run_unchecked(
        &self,
        args: &[&str],
        operation: &'static str,
    ) -> Result<Output, GitError> {
        self.run(args, None, operation, self.settings.local_timeout, false)
            .await
    }

    /// Runs a command that only reads the mirror, with `envs` added to the
    /// clean environment (a verification's own `GNUPGHOME`).
    pub(super) async fn run_unchecked_with(
        &self,
        args: &[&str],
        envs: &[(&str, &Path)],
        operation: &'static str,
    ) -> Result<Output, GitError> {
        let mut command = self.command(&self.mirror.dir, args, false);
        for (name, value) in envs {
            command.env(name, value);
        }
        self.spawn(command, None, operation, self.settings.local_timeout)
            .await
    }

    pub(super) async fn run_in(
        &self,
        git_dir: &Path,
        args: &[&str],
        operation: &'static str,
    ) -> Result<Vec<u8>, GitError> {
        let command = self.command(git_dir, args, false);
        let output = self
            .spawn(command, None, operation, self.settings.local_timeout)
            .await?;
        self.checked(args, output)
    }

    pub(super) fn checked(&self, args: &[&str], output: Output) -> Result<Vec<u8>, GitError> {
        if output.status.success() {
            Ok(output.stdout)
        } else {
            Err(GitError::Git {
                command: self.remote.scrub(&args.join(" ")),
                stderr: self.remote.scrub(&stderr_text(&output)),
            })
        }
    }

    /// Runs a command that writes refs or config, marked so that a kill at
    /// its timeout is noticed and git's stale `*.lock` files are removed.
    pub(super) async fn run_changing(
        &self,
        args: &[&str],
        operation: &'static str,
        network: bool,
    ) -> Result<Output, GitError> {
        let timeout = if network {
            self.settings.fetch_timeout
        } else {
            self.settings.local_timeout
        };
        self.mirror.begin_change().await?;
        let output = self.run(args, None, operation, timeout, network).await?;
        // Not reached when the command was killed at its timeout: the marker
        // stays for the next holder of the lock.
        self.mirror.end_change().await?;
        Ok(output)
    }

    async fn run(
        &self,
        args: &[&str],
        input: Option<Vec<u8>>,
        operation: &'static str,
        timeout: Duration,
        network: bool,
    ) -> Result<Output, GitError> {
        let command = self.command(&self.mirror.dir, args, network);
        self.spawn(command, input, operation, timeout).await
    }

    fn command(&self, git_dir: &Path, args: &[&str], network: bool) -> Command {
        let mut command = Command::new("git");
        // An auto gc left running in the background would be a second git
        // operation on the mirror, outside its lock and its timeout.
        command
            .arg("--git-dir")
            .arg(git_dir)
            .args(["-c", "gc.autoDetach=false"])
            .args(args);
        for (name, _) in std::env::vars_os() {
            let name = name.to_string_lossy();
            if name.starts_with("GIT_") && !KEPT_GIT_VARS.contains(&name.as_ref()) {
                command.env_remove(name.as_ref());
            }
        }
        command
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            // Behaviour comes from the arguments, never from whoever's
            // ~/.gitconfig happens to be on the machine.
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_COUNT", "0")
            .env("GIT_LITERAL_PATHSPECS", "1")
            .env("GIT_ALLOW_PROTOCOL", "file:git:http:https:ssh")
            .env("LC_ALL", "C")
            // Killing git at its timeout leaves its transport helper behind;
            // this makes a stalled one give up on its own.
            .env("GIT_HTTP_LOW_SPEED_LIMIT", "1")
            .env(
                "GIT_HTTP_LOW_SPEED_TIME",
                self.settings
                    .fetch_timeout
                    .as_secs()
                    .clamp(1, 60)
                    .to_string(),
            );
        if std::env::var_os("GIT_SSH_COMMAND").is_none() && std::env::var_os("GIT_SSH").is_none() {
            // A password or passphrase prompt would hang until the timeout.
            command.env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes");
        }
        if network && let Some((key, value)) = &self.remote.auth {
            command
                .env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", key)
                .env("GIT_CONFIG_VALUE_0", value);
        }
        // The mirrors directory always exists; the process's own working
        // directory might not.
        if let Some(parent) = git_dir.parent() {
            command.current_dir(parent);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    async fn spawn(
        &self,
        mut command: Command,
        input: Option<Vec<u8>>,
        operation: &'static str,
        timeout: Duration,
    ) -> Result<Output, GitError> {
        if input.is_some() {
            command.stdin(Stdio::piped());
        }
        #[cfg(test)]
        spawned::record(&command);
        let mut child = command
            .spawn()
            .map_err(|source| GitError::Spawn { source })?;
        let stdin = child.stdin.take();
        // Written while stdout is read: git answers `cat-file --batch` as it
        // reads, and both pipes would fill up otherwise.
        let feed = async move {
            match (stdin, input) {
                (Some(mut stdin), Some(input)) => write_all(&mut stdin, &input).await,
                _ => Ok(()),
            }
        };
        let exchange = async { tokio::join!(feed, child.wait_with_output()) };
        // On timeout the child is dropped, and kill_on_drop kills it.
        let (fed, output) =
            tokio::time::timeout(timeout, exchange)
                .await
                .map_err(|_| GitError::Timeout {
                    url: self.remote.display_url.clone(),
                    operation,
                    after: timeout,
                })?;
        let output = output.map_err(|source| GitError::Spawn { source })?;
        match fed {
            // A git that failed stops reading; its stderr says why.
            Err(err) if output.status.success() => Err(GitError::Git {
                command: operation.to_owned(),
                stderr: format!("failed to write to git's stdin: {err}"),
            }),
            _ => Ok(output),
        }
    }
}

async fn write_all(stdin: &mut ChildStdin, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let written = std::future::poll_fn(|cx| Pin::new(&mut *stdin).poll_write(cx, buf)).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        buf = &buf[written..];
    }
    Ok(())
}

pub(super) fn stderr_text(output: &Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr);
    let text = text.trim();
    if text.is_empty() {
        return format!("git exited with {}", output.status);
    }
    if text.len() <= MAX_STDERR {
        return text.to_owned();
    }
    let mut end = MAX_STDERR;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Test seam: the argv of every git command this process spawned, so a test
/// can check that no secret was ever on one (a process's argv is readable by
/// every local user in `/proc/<pid>/cmdline`).
#[cfg(test)]
pub(super) mod spawned {
    use std::sync::{Mutex, PoisonError};

    static ARGV: Mutex<Vec<String>> = Mutex::new(Vec::new());

    pub(in super::super) fn record(command: &tokio::process::Command) {
        let command = command.as_std();
        let argv = std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(|arg| arg.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        ARGV.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(argv);
    }

    /// Every recorded command line that contains `needle`.
    pub(in super::super) fn containing(needle: &str) -> Vec<String> {
        let argv = ARGV.lock().unwrap_or_else(PoisonError::into_inner);
        argv.iter()
            .filter(|argv| argv.contains(needle))
            .cloned()
            .collect()
    }
}
