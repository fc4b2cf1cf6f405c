//! Running a renderer (kustomize, helm) as a child process, bounded: a time
//! limit and an output size limit. The child runs in a process group of its
//! own, so a limit kills whatever it started too (kustomize runs git).

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use super::RenderError;

/// Kept of a renderer's stderr: enough for any error message.
const STDERR_KEPT: usize = 16 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub timeout: Duration,
    /// Largest stdout accepted, in bytes.
    pub max_output: usize,
}

/// One run of a renderer.
pub struct Invocation<'a> {
    /// What messages call it: `helm template`, `kustomize build`.
    pub tool: &'static str,
    pub program: &'a Path,
    pub args: Vec<OsString>,
    pub dir: &'a Path,
    /// The environment is cleared but for `PATH`; these are added.
    pub env: Vec<(String, OsString)>,
    /// Written to its stdin (empty: no stdin).
    pub stdin: Vec<u8>,
}

/// Runs it to the end; its stdout when it exits 0 within the limits.
/// The spawn error, and for a renderer that is not there what to do.
fn missing_hint(tool: &str, error: &std::io::Error) -> String {
    if error.kind() != std::io::ErrorKind::NotFound {
        return error.to_string();
    }
    let (variable, what) = match tool {
        "helm template" => ("SETPOINT_HELM", "helm (v4; `make helm-build` builds it)"),
        "kustomize build" => ("SETPOINT_KUBECTL", "kubectl (its built-in kustomize)"),
        _ => return error.to_string(),
    };
    format!("{error}: install {what} on PATH, or set {variable} to its path")
}

pub async fn run(invocation: Invocation<'_>, limits: Limits) -> Result<Vec<u8>, RenderError> {
    let tool = invocation.tool;
    let mut command = Command::new(invocation.program);
    command
        .args(&invocation.args)
        .current_dir(invocation.dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(invocation.env.iter().map(|(k, v)| (k, v)))
        .stdin(if invocation.stdin.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let mut child = command.spawn().map_err(|e| RenderError::Spawn {
        tool,
        program: invocation.program.display().to_string(),
        message: missing_hint(tool, &e),
    })?;
    let pid = child.id();
    if let Some(mut stdin) = child.stdin.take() {
        let input = invocation.stdin;
        // Written beside the reads: a child that answers as it reads would
        // block on a full stdout pipe otherwise.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(&input).await;
        });
    }
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let mut stderr_reader = Some(tokio::spawn(keep_head(
        child.stderr.take().expect("piped stderr"),
        Arc::clone(&stderr),
    )));
    let stderr_text = |stderr: &Arc<Mutex<Vec<u8>>>| {
        let bytes = stderr.lock().expect("stderr lock");
        String::from_utf8_lossy(&bytes).trim().to_string()
    };

    let outcome = tokio::time::timeout(limits.timeout, async {
        let output = read_capped(stdout, limits.max_output).await;
        match output {
            Ok(Some(output)) => Ok((output, child.wait().await)),
            Ok(None) => Err(RenderError::OutputTooLarge {
                tool,
                limit: limits.max_output,
            }),
            Err(error) => Err(RenderError::Failed {
                tool,
                message: format!("failed to read its output: {error}"),
            }),
        }
    })
    .await;
    let result = match outcome {
        Ok(Ok((output, Ok(status)))) => {
            // The pipes are closed: the reader has all there is.
            if let Some(reader) = stderr_reader.take() {
                let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
            }
            if status.success() {
                return Ok(output);
            }
            let stderr = stderr_text(&stderr);
            Err(RenderError::Failed {
                tool,
                message: if stderr.is_empty() {
                    format!("exited with {status}")
                } else {
                    stderr
                },
            })
        }
        Ok(Ok((_, Err(error)))) => Err(RenderError::Failed {
            tool,
            message: format!("failed to wait for it: {error}"),
        }),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(RenderError::TimedOut {
            tool,
            after: limits.timeout,
            stderr: String::new(),
        }),
    };
    // Over a limit (or unreadable): the whole group goes.
    if let Some(pid) = pid {
        kill_group(pid);
    }
    let _ = child.wait().await;
    if let Some(reader) = stderr_reader {
        let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
    }
    match result {
        Err(RenderError::TimedOut { tool, after, .. }) => Err(RenderError::TimedOut {
            tool,
            after,
            stderr: stderr_text(&stderr),
        }),
        other => other,
    }
}

fn kill_group(pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals that process group;
        // it touches no memory of ours.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

/// All of `reader`, or `None` once it exceeds `limit` bytes.
async fn read_capped(
    mut reader: impl AsyncRead + Unpin,
    limit: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut output = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut chunk).await?;
        if n == 0 {
            return Ok(Some(output));
        }
        if output.len() + n > limit {
            return Ok(None);
        }
        output.extend_from_slice(&chunk[..n]);
    }
}

/// Reads `reader` to its end, keeping the first `STDERR_KEPT` bytes.
async fn keep_head(mut reader: impl AsyncRead + Unpin, kept: Arc<Mutex<Vec<u8>>>) {
    let mut chunk = vec![0u8; 8 * 1024];
    while let Ok(n) = reader.read(&mut chunk).await {
        if n == 0 {
            break;
        }
        let mut kept = kept.lock().expect("stderr lock");
        let room = STDERR_KEPT.saturating_sub(kept.len());
        kept.extend_from_slice(&chunk[..n.min(room)]);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_renderer_says_what_to_do() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let hint = super::missing_hint("helm template", &missing);
        assert!(hint.ends_with("or set SETPOINT_HELM to its path"), "{hint}");
        assert!(super::missing_hint("kustomize build", &missing).contains("SETPOINT_KUBECTL"));
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(!super::missing_hint("helm template", &denied).contains("SETPOINT_HELM"));
    }

    use std::time::Instant;

    use super::*;

    fn sh(script: &str) -> Invocation<'static> {
        Invocation {
            tool: "sh",
            program: Path::new("/bin/sh"),
            args: vec!["-c".into(), script.into()],
            dir: Path::new("/"),
            env: vec![("GREETING".into(), "hello".into())],
            stdin: vec![],
        }
    }

    const LIMITS: Limits = Limits {
        timeout: Duration::from_secs(10),
        max_output: 1024,
    };

    #[tokio::test]
    async fn returns_stdout_with_only_the_given_environment() {
        let out = run(sh("echo \"$GREETING ${HOME:-no-home}\""), LIMITS)
            .await
            .unwrap();
        assert_eq!(out, b"hello no-home\n");
    }

    #[tokio::test]
    async fn a_failure_carries_its_stderr() {
        let err = run(
            sh("echo out; echo 'template: x.yaml:3: bad' >&2; exit 3"),
            LIMITS,
        )
        .await
        .unwrap_err();
        assert_eq!(err.to_string(), "sh failed: template: x.yaml:3: bad");
        let err = run(sh("exit 4"), LIMITS).await.unwrap_err();
        assert!(err.to_string().contains("exit status: 4"), "{err}");
    }

    #[tokio::test]
    async fn a_hang_is_killed_at_the_time_limit_with_its_children() {
        let limits = Limits {
            timeout: Duration::from_millis(300),
            ..LIMITS
        };
        let started = Instant::now();
        // The grandchild holds stdout open; only the group kill ends it.
        let err = run(sh("echo 'fetching base' >&2; sleep 30 & sleep 30"), limits)
            .await
            .unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(err, RenderError::TimedOut { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "sh did not finish within 300ms: fetching base"
        );
    }

    #[tokio::test]
    async fn output_over_the_limit_is_refused_and_the_renderer_stopped() {
        let started = Instant::now();
        let err = run(sh("yes manifest"), LIMITS).await.unwrap_err();
        assert!(
            matches!(err, RenderError::OutputTooLarge { limit: 1024, .. }),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        // At the limit exactly: accepted.
        let out = run(sh("head -c 1024 /dev/zero"), LIMITS).await.unwrap();
        assert_eq!(out.len(), 1024);
    }

    #[tokio::test]
    async fn stdin_is_given_when_there_is_one() {
        let invocation = Invocation {
            stdin: b"abc".to_vec(),
            ..sh("cat")
        };
        assert_eq!(run(invocation, LIMITS).await.unwrap(), b"abc");
        assert_eq!(run(sh("cat"), LIMITS).await.unwrap(), b"");
    }

    #[tokio::test]
    async fn a_missing_program_says_which() {
        let invocation = Invocation {
            program: Path::new("/nonexistent/helm"),
            ..sh("")
        };
        let err = run(invocation, LIMITS).await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot run sh (/nonexistent/helm): "),
            "{err}"
        );
    }
}
