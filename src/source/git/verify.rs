//! Signed commits and tags (`spec.source.verify`): after a checkout resolved
//! its commit, git's own `verify-commit` (or `verify-tag`, for a tag) checks
//! its signature with gpg or ssh-keygen, against the keys of a Secret only.
//!
//! Each verification gets a throwaway `GNUPGHOME` (a temporary directory
//! under the cache, removed after), where the Secret's OpenPGP keys are
//! imported with `gpg --import`, and a temporary allowed signers file for
//! `gpg.ssh.allowedSignersFile`: no keyring, trust database or agent
//! outlives it, and no key of the machine's own is ever trusted. What
//! gpg and ssh-keygen print is decided by `status.rs` (pure). Verdicts are
//! kept per (object, keys digest): an object never changes, so a sweep over
//! an Application in sync runs no gpg at all.

mod keys;
mod status;

pub use keys::{Keys, KeysError};
pub use status::{SignatureKind, Signer, Verdict};

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::command::{Git, stderr_text};
use super::remote::Remote;
use super::revision::is_valid_ref_name;
use super::{Credentials, GitError, GitSource};

/// How many verdicts the cache keeps before it starts again.
const CACHE_LIMIT: usize = 10_000;

/// What to verify, once the checkout resolved `commit`.
#[derive(Clone, Copy, Debug)]
pub struct VerifyRequest<'a> {
    /// As the Application spells it, for the mirror.
    pub url: &'a str,
    pub credentials: Option<&'a Credentials>,
    /// The commit the checkout resolved to, and that will be applied.
    pub commit: &'a str,
    /// `mode: tag`: the tag named by `targetRevision`; it must point to
    /// `commit` and be signed. `None`: the commit must be signed.
    pub tag: Option<&'a str>,
    pub keys: &'a Keys,
}

/// A signature that holds, for the status's audit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub signer: Signer,
    /// The tag whose signature it is (`mode: tag`).
    pub tag: Option<String>,
}

/// Why an object is not applied, or why it could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("{}", refusal(&.0.subject, &.0.verdict))]
    Refused(Box<Refusal>),
    #[error(
        "targetRevision {revision:?} is not a tag of the repository; spec.source.verify mode tag requires a signed annotated tag"
    )]
    NotATag { revision: String },
    #[error(
        "tag {tag} is a lightweight tag, which cannot be signed; spec.source.verify mode tag requires a signed annotated tag"
    )]
    Lightweight { tag: String },
    #[error(
        "tag {tag} points to commit {}, not to {} that targetRevision resolved to (the tag moved, or a branch has its name)",
        short(now),
        short(commit)
    )]
    TagMoved {
        tag: String,
        commit: String,
        now: String,
    },
    #[error("gpg could not import the verification key {key}: {message}")]
    Import { key: String, message: String },
    #[error("failed to verify the signature of {subject}: {message}")]
    Tool { subject: Subject, message: String },
    #[error(transparent)]
    Git(#[from] GitError),
}

/// An object and the verdict that keeps it from being applied (boxed: an
/// error travels up every reconcile's `Result`).
#[derive(Debug)]
pub struct Refusal {
    pub subject: Subject,
    pub verdict: Verdict,
}

impl VerifyError {
    fn refused(subject: Subject, verdict: Verdict) -> VerifyError {
        VerifyError::Refused(Box::new(Refusal { subject, verdict }))
    }

    /// A refused object waits for a new commit or new keys; a tool that
    /// failed (gpg missing, a timeout) or a tag that moved is retried.
    pub fn is_transient(&self) -> bool {
        match self {
            VerifyError::Refused(_)
            | VerifyError::NotATag { .. }
            | VerifyError::Lightweight { .. }
            | VerifyError::Import { .. } => false,
            VerifyError::TagMoved { .. } | VerifyError::Tool { .. } => true,
            VerifyError::Git(e) => e.is_transient(),
        }
    }

    /// The condition's and the Event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            VerifyError::Refused(refusal) => match (&refusal.verdict, &refusal.subject) {
                (Verdict::Unsigned, Subject::Commit(_)) => "UnsignedCommit",
                (Verdict::Unsigned, Subject::Tag { .. }) => "UnsignedTag",
                (Verdict::UnknownKey { .. }, _) => "UnknownSigner",
                (Verdict::Bad { .. }, _) => "BadSignature",
                // Not refused: `Verified` never becomes an error.
                (Verdict::Verified(_), _) => "SignatureVerified",
            },
            VerifyError::Lightweight { .. } => "UnsignedTag",
            VerifyError::NotATag { .. } => "RevisionNotATag",
            VerifyError::Import { .. } => "VerificationKeysInvalid",
            VerifyError::TagMoved { .. } | VerifyError::Tool { .. } => "VerificationFailed",
            VerifyError::Git(_) => "VerificationFailed",
        }
    }
}

/// The object a verdict is about, as messages name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    Commit(String),
    Tag { name: String, commit: String },
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Commit(commit) => write!(f, "commit {}", short(commit)),
            Subject::Tag { name, commit } => write!(f, "tag {name} (commit {})", short(commit)),
        }
    }
}

fn short(id: &str) -> &str {
    id.get(..7).unwrap_or(id)
}

fn refusal(subject: &Subject, verdict: &Verdict) -> String {
    let required = match subject {
        Subject::Commit(_) => "spec.source.verify requires a signed commit",
        Subject::Tag { .. } => "spec.source.verify mode tag requires a signed annotated tag",
    };
    match verdict {
        Verdict::Unsigned => format!("{subject} is not signed; {required}"),
        Verdict::UnknownKey { kind, key, note } => {
            let note = note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default();
            format!(
                "{subject} is signed by an unknown {kind} key {key}{note}; no key of spec.source.verify.secretRef admits it"
            )
        }
        Verdict::Bad {
            kind,
            signer,
            key,
            why,
        } => {
            let by = match (signer, key) {
                (Some(signer), Some(key)) => format!(" by {signer} (key {key})"),
                (Some(signer), None) => format!(" by {signer}"),
                (None, Some(key)) => format!(" by key {key}"),
                (None, None) => String::new(),
            };
            format!("{subject} has a bad {kind} signature{by}: {why}; it is not applied")
        }
        Verdict::Verified(signer) => format!("{subject} is signed by {}", signer.signer),
    }
}

/// The tag `mode: tag` verifies: `targetRevision` as a tag name (`v1.2`
/// or `refs/tags/v1.2`); a commit id or an empty revision is none.
pub fn tag_name(target_revision: Option<&str>) -> Result<&str, VerifyError> {
    let revision = target_revision.map(str::trim).unwrap_or_default();
    let name = revision.strip_prefix("refs/tags/").unwrap_or(revision);
    let commit_id =
        (name.len() == 40 || name.len() == 64) && name.bytes().all(|b| b.is_ascii_hexdigit());
    if name.is_empty()
        || name == "HEAD"
        || commit_id
        || name.starts_with("refs/")
        || !is_valid_ref_name(name)
    {
        return Err(VerifyError::NotATag {
            revision: revision.to_string(),
        });
    }
    Ok(name)
}

/// Verdicts per (object id, keys digest).
#[derive(Default)]
pub(super) struct Verdicts(Mutex<HashMap<(String, String), Verdict>>);

impl Verdicts {
    fn get(&self, object: &str, digest: &str) -> Option<Verdict> {
        let verdicts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        verdicts
            .get(&(object.to_owned(), digest.to_owned()))
            .cloned()
    }

    fn insert(&self, object: &str, digest: &str, verdict: Verdict) {
        let mut verdicts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if verdicts.len() >= CACHE_LIMIT {
            verdicts.clear();
        }
        verdicts.insert((object.to_owned(), digest.to_owned()), verdict);
    }
}

impl GitSource {
    /// Whether the checkout's commit (or the tag) is signed by a key of
    /// `request.keys`. The mirror is the checkout's; nothing is fetched.
    pub async fn verify(&self, request: &VerifyRequest<'_>) -> Result<Verified, VerifyError> {
        let remote = Remote::new(request.url, request.credentials)?;
        let mirror = self.mirror(&remote.key);
        let git = Git {
            mirror: &mirror,
            remote: &remote,
            settings: &self.settings,
        };
        let (object, subject) = match request.tag {
            None => (
                request.commit.to_owned(),
                Subject::Commit(request.commit.to_owned()),
            ),
            Some(name) => {
                let tag_object = git.tag_object(name, request.commit).await?;
                let subject = Subject::Tag {
                    name: name.to_owned(),
                    commit: request.commit.to_owned(),
                };
                (tag_object, subject)
            }
        };
        let digest = &request.keys.digest;
        let verdict = match self.shared.verdicts.get(&object, digest) {
            Some(verdict) => verdict,
            None => {
                let verdict = self
                    .verify_signature(&git, &object, &subject, request.keys)
                    .await?;
                self.shared
                    .verdicts
                    .insert(&object, digest, verdict.clone());
                verdict
            }
        };
        match verdict {
            Verdict::Verified(signer) => Ok(Verified {
                signer,
                tag: request.tag.map(str::to_owned),
            }),
            verdict => Err(VerifyError::refused(subject, verdict)),
        }
    }

    /// One run of `git verify-commit` or `git verify-tag` in a throwaway
    /// GnuPG home holding only `keys`.
    async fn verify_signature(
        &self,
        git: &Git<'_>,
        object: &str,
        subject: &Subject,
        keys: &Keys,
    ) -> Result<Verdict, VerifyError> {
        let parent = self.shared.mirrors_dir.with_file_name("verify");
        tokio::fs::create_dir_all(&parent)
            .await
            .map_err(GitError::io(&parent))?;
        // 0700, as gpg wants its home; removed when dropped.
        let home = tempfile::Builder::new()
            .prefix("gnupg-")
            .tempdir_in(&parent)
            .map_err(GitError::io(&parent))?;
        for (name, key) in &keys.openpgp {
            import(home.path(), name, key, self.settings.local_timeout)
                .await
                .map_err(|failure| match failure {
                    Import::Refused(message) => VerifyError::Import {
                        key: name.clone(),
                        message,
                    },
                    Import::Failed(message) => VerifyError::Tool {
                        subject: subject.clone(),
                        message,
                    },
                })?;
        }
        let allowed_signers = home.path().join("allowed_signers");
        tokio::fs::write(&allowed_signers, &keys.allowed_signers)
            .await
            .map_err(GitError::io(&allowed_signers))?;
        let signers_config = format!("gpg.ssh.allowedSignersFile={}", allowed_signers.display());
        let command = match subject {
            Subject::Commit(_) => "verify-commit",
            Subject::Tag { .. } => "verify-tag",
        };
        let args = [
            "-c",
            &signers_config,
            "-c",
            "gpg.program=gpg",
            "-c",
            "gpg.ssh.program=ssh-keygen",
            command,
            "--raw",
            object,
        ];
        let output = git
            .run_unchecked_with(&args, &[("GNUPGHOME", home.path())], command)
            .await?;
        let raw = String::from_utf8_lossy(&output.stderr);
        status::decide(output.status.success(), &raw).map_err(|message| VerifyError::Tool {
            subject: subject.clone(),
            message: git.remote.scrub(&message),
        })
    }
}

/// Why a key did not make it into the keyring.
enum Import {
    /// gpg read it and refused it: the Secret's to fix.
    Refused(String),
    /// gpg did not run, or not in time.
    Failed(String),
}

/// One key of the Secret into the throwaway keyring. `--no-autostart`: a
/// private key put there by mistake must not start an agent that outlives
/// the directory.
async fn import(
    home: &Path,
    name: &str,
    key: &[u8],
    timeout: std::time::Duration,
) -> Result<(), Import> {
    let mut command = Command::new("gpg");
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LC_ALL", "C")
        .arg("--homedir")
        .arg(home)
        .args([
            "--batch",
            "--no-tty",
            "--no-autostart",
            "--quiet",
            "--import",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|e| Import::Failed(format!("cannot run gpg: {e}")))?;
    let mut stdin = child.stdin.take();
    let exchange = async {
        if let Some(stdin) = stdin.as_mut() {
            // A failed write shows as gpg's own error below.
            let _ = stdin.write_all(key).await;
        }
        drop(stdin);
        child.wait_with_output().await
    };
    let output = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| {
            Import::Failed(format!(
                "gpg --import of {name} timed out after {timeout:?}"
            ))
        })?
        .map_err(|e| Import::Failed(format!("cannot run gpg: {e}")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(Import::Refused(stderr_text(&output)))
}

impl Git<'_> {
    /// The tag object `refs/tags/<name>` names, when it is an annotated
    /// tag that points (through any tags) to `commit`. Remembered with the
    /// mirror's resolved revisions, until this process next changes its refs.
    async fn tag_object(&self, name: &str, commit: &str) -> Result<String, VerifyError> {
        let key = format!("tag object\n{name}");
        let answer = match self.mirror.resolved(&key) {
            Some(answer) => answer,
            None => {
                let input = format!("refs/tags/{name}\nrefs/tags/{name}^{{commit}}\n");
                let args = ["cat-file", "--batch-check=%(objectname) %(objecttype)"];
                let stdout = self
                    .run_checked(&args, Some(input.into_bytes()), "cat-file")
                    .await?;
                let answer = String::from_utf8_lossy(&stdout).into_owned();
                self.mirror.remember_resolved(key, answer.clone());
                answer
            }
        };
        let mut lines = answer
            .lines()
            .map(|line| line.rsplit_once(' ').unwrap_or((line, "")));
        let (tag, peeled) = (lines.next(), lines.next());
        match (tag, peeled) {
            (Some((object, "tag")), Some((peeled, "commit"))) if peeled == commit => {
                Ok(object.to_owned())
            }
            (Some((_, "tag")), Some((peeled, "commit"))) => Err(VerifyError::TagMoved {
                tag: name.to_owned(),
                commit: commit.to_owned(),
                now: peeled.to_owned(),
            }),
            (Some((_, "commit")), _) => Err(VerifyError::Lightweight {
                tag: name.to_owned(),
            }),
            _ => Err(VerifyError::NotATag {
                revision: name.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_tag_needs_a_tag_name() {
        assert_eq!(tag_name(Some("v1.2")).unwrap(), "v1.2");
        assert_eq!(tag_name(Some("refs/tags/v1.2")).unwrap(), "v1.2");
        for revision in [
            None,
            Some(""),
            Some("HEAD"),
            Some("0123456789abcdef0123456789abcdef01234567"),
            Some("refs/heads/main"),
            Some("v1..2"),
        ] {
            assert!(
                matches!(tag_name(revision), Err(VerifyError::NotATag { .. })),
                "{revision:?}"
            );
        }
    }

    #[test]
    fn refusals_name_the_object_and_the_signer_or_its_absence() {
        let commit = Subject::Commit("1a2b3c4d5e6f".into());
        let unsigned = VerifyError::refused(commit.clone(), Verdict::Unsigned);
        assert_eq!(unsigned.reason(), "UnsignedCommit");
        assert_eq!(
            unsigned.to_string(),
            "commit 1a2b3c4 is not signed; spec.source.verify requires a signed commit"
        );
        let unknown = VerifyError::refused(
            commit.clone(),
            Verdict::UnknownKey {
                kind: SignatureKind::Ssh,
                key: "SHA256:abc".into(),
                note: None,
            },
        );
        assert_eq!(unknown.reason(), "UnknownSigner");
        assert_eq!(
            unknown.to_string(),
            "commit 1a2b3c4 is signed by an unknown SSH key SHA256:abc; no key of spec.source.verify.secretRef admits it"
        );
        let tag = Subject::Tag {
            name: "v1".into(),
            commit: "1a2b3c4d5e6f".into(),
        };
        let bad = VerifyError::refused(
            tag.clone(),
            Verdict::Bad {
                kind: SignatureKind::Openpgp,
                signer: Some("Alice <a@e>".into()),
                key: Some("52AB".into()),
                why: "the signature does not match the signed content".into(),
            },
        );
        assert_eq!(bad.reason(), "BadSignature");
        assert_eq!(
            bad.to_string(),
            "tag v1 (commit 1a2b3c4) has a bad OpenPGP signature by Alice <a@e> (key 52AB): the signature does not match the signed content; it is not applied"
        );
        assert!(!bad.is_transient());
        let unsigned_tag = VerifyError::refused(tag, Verdict::Unsigned);
        assert_eq!(unsigned_tag.reason(), "UnsignedTag");
    }

    #[test]
    fn errors_stay_small() {
        // Every reconcile's `Result` carries one.
        assert!(std::mem::size_of::<VerifyError>() <= 80);
    }
}

#[cfg(test)]
mod io_tests;
