//! Verification against real repositories, keys made with gpg and
//! ssh-keygen, and git's own `verify-commit`/`verify-tag`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;
use std::time::Instant;

use super::*;
use crate::source::git::CheckoutRequest;
use crate::source::git::command::spawned;

/// A repository, an OpenPGP key (in its own GNUPGHOME) and SSH keys.
struct Signing {
    dir: tempfile::TempDir,
    repo: PathBuf,
    gnupg: PathBuf,
}

impl Signing {
    fn new() -> Signing {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("origin");
        let gnupg = dir.path().join("gnupg");
        std::fs::create_dir(&repo).unwrap();
        std::fs::create_dir(&gnupg).unwrap();
        let signing = Signing { dir, repo, gnupg };
        signing.git(&["init", "--quiet", "--initial-branch=main"]);
        signing
    }

    fn url(&self) -> String {
        self.repo.to_string_lossy().into_owned()
    }

    fn run(&self, program: &str, args: &[&str]) -> String {
        let output = StdCommand::new(program)
            .args(args)
            .current_dir(&self.repo)
            .env("GNUPGHOME", &self.gnupg)
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
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }

    fn git(&self, args: &[&str]) -> String {
        self.run("git", args)
    }

    /// A new OpenPGP key for `uid`: its fingerprint and armored public key.
    fn openpgp_key(&self, uid: &str) -> (String, Vec<u8>) {
        self.run(
            "gpg",
            &[
                "--batch",
                "--passphrase",
                "",
                "--quick-gen-key",
                uid,
                "ed25519",
                "sign",
                "never",
            ],
        );
        let listing = self.run("gpg", &["--with-colons", "--list-keys", uid]);
        let fingerprint = listing
            .lines()
            .find_map(|line| line.strip_prefix("fpr:"))
            .and_then(|rest| rest.split(':').find(|f| f.len() == 40))
            .unwrap()
            .to_owned();
        let public = self.run("gpg", &["--armor", "--export", &fingerprint]);
        (fingerprint, public.into_bytes())
    }

    /// A new SSH key: its private key's path and public key line.
    fn ssh_key(&self, name: &str) -> (PathBuf, String) {
        let path = self.dir.path().join(name);
        let path_text = path.to_string_lossy().into_owned();
        self.run(
            "ssh-keygen",
            &[
                "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", &path_text,
            ],
        );
        let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
        (path, public.trim().to_owned())
    }

    /// A commit of a new file, unsigned.
    fn commit(&self, file: &str) -> String {
        self.commit_with(file, &[], false)
    }

    /// A commit of a new file signed as `config` (`-c` options) says.
    fn signed_commit(&self, file: &str, config: &[String]) -> String {
        self.commit_with(file, config, true)
    }

    fn commit_with(&self, file: &str, config: &[String], sign: bool) -> String {
        std::fs::write(self.repo.join(file), format!("{file}: 1\n")).unwrap();
        self.git(&["add", "--all"]);
        let mut args: Vec<&str> = config.iter().map(String::as_str).collect();
        args.extend(["commit", "--quiet", "-m", file]);
        if sign {
            args.push("-S");
        }
        self.git(&args);
        self.git(&["rev-parse", "HEAD"])
    }
}

/// `-c` options that sign with the OpenPGP key `fingerprint`.
fn openpgp_signing(fingerprint: &str) -> Vec<String> {
    vec!["-c".into(), format!("user.signingkey={fingerprint}")]
}

impl Drop for Signing {
    /// Key generation started a gpg-agent for this home; it goes with it.
    fn drop(&mut self) {
        let _ = StdCommand::new("gpgconf")
            .arg("--homedir")
            .arg(&self.gnupg)
            .args(["--kill", "all"])
            .output();
    }
}

fn ssh_signing(key: &Path) -> Vec<String> {
    vec![
        "-c".into(),
        "gpg.format=ssh".into(),
        "-c".into(),
        format!("user.signingkey={}", key.display()),
    ]
}

fn keys(entries: &[(&str, &[u8])]) -> Keys {
    let data: BTreeMap<String, Vec<u8>> = entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect();
    Keys::from_secret(&data).unwrap()
}

async fn check(
    source: &GitSource,
    url: &str,
    commit: &str,
    tag: Option<&str>,
    keys: &Keys,
) -> Result<Verified, VerifyError> {
    source
        .verify(&VerifyRequest {
            url,
            credentials: None,
            commit,
            tag,
            keys,
        })
        .await
}

fn verdict(result: Result<Verified, VerifyError>) -> Verdict {
    match result {
        Ok(verified) => Verdict::Verified(verified.signer),
        Err(VerifyError::Refused(refusal)) => refusal.verdict,
        Err(other) => panic!("not a verdict: {other}"),
    }
}

#[tokio::test]
async fn commits_signed_by_the_secrets_keys_pass_and_others_do_not() {
    let s = Signing::new();
    let (fingerprint, alice) = s.openpgp_key("Alice <alice@example.com>");
    let (mallory_fpr, _) = s.openpgp_key("Mallory <mallory@example.com>");
    let (bob_key, bob_public) = s.ssh_key("bob");
    let (eve_key, _) = s.ssh_key("eve");
    let signers = format!("bob@example.com {bob_public}\n");
    let trusted = keys(&[
        ("alice.asc", &alice),
        ("allowed_signers", signers.as_bytes()),
    ]);

    let by_ssh = s.signed_commit("ssh", &ssh_signing(&bob_key));
    let by_openpgp = s.signed_commit("pgp", &openpgp_signing(&fingerprint));
    let unsigned = s.commit("b");
    let by_mallory = s.signed_commit("m", &openpgp_signing(&mallory_fpr));
    let by_eve = s.signed_commit("e", &ssh_signing(&eve_key));
    // The signed commit's content changed, its signature kept.
    let tampered = {
        let object = s.git(&["cat-file", "commit", &by_openpgp]);
        let changed = object.replace("\n\npgp", "\n\npgp, changed");
        let path = s.dir.path().join("tampered");
        std::fs::write(&path, format!("{changed}\n")).unwrap();
        let id = s.git(&["hash-object", "-t", "commit", "-w", &path.to_string_lossy()]);
        // Reachable, so that the mirror fetches it.
        s.git(&["update-ref", "refs/heads/tampered", &id]);
        id
    };

    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned());
    let url = s.url();
    source
        .checkout(&CheckoutRequest {
            url: &url,
            ..Default::default()
        })
        .await
        .unwrap();

    assert_eq!(
        verdict(check(&source, &url, &by_ssh, None, &trusted).await),
        Verdict::Verified(Signer {
            kind: SignatureKind::Ssh,
            signer: "bob@example.com".into(),
            key: verdict_key_of(&s, &bob_key),
        })
    );
    assert_eq!(
        verdict(check(&source, &url, &by_openpgp, None, &trusted).await),
        Verdict::Verified(Signer {
            kind: SignatureKind::Openpgp,
            signer: "Alice <alice@example.com>".into(),
            key: fingerprint.clone(),
        })
    );
    assert_eq!(
        verdict(check(&source, &url, &unsigned, None, &trusted).await),
        Verdict::Unsigned
    );
    assert!(matches!(
        verdict(check(&source, &url, &by_mallory, None, &trusted).await),
        Verdict::UnknownKey { kind: SignatureKind::Openpgp, key, .. } if key == mallory_fpr
    ));
    assert!(matches!(
        verdict(check(&source, &url, &by_eve, None, &trusted).await),
        Verdict::UnknownKey { kind: SignatureKind::Ssh, key, .. } if key.starts_with("SHA256:")
    ));
    assert!(matches!(
        verdict(check(&source, &url, &tampered, None, &trusted).await),
        Verdict::Bad {
            kind: SignatureKind::Openpgp,
            ..
        }
    ));
    // Keys of one kind only: a signature of the other kind is unknown.
    let ssh_only = keys(&[("allowed_signers", signers.as_bytes())]);
    assert!(matches!(
        verdict(check(&source, &url, &by_openpgp, None, &ssh_only).await),
        Verdict::UnknownKey {
            kind: SignatureKind::Openpgp,
            ..
        }
    ));
    let openpgp_only = keys(&[("alice.asc", &alice)]);
    assert!(matches!(
        verdict(check(&source, &url, &by_ssh, None, &openpgp_only).await),
        Verdict::UnknownKey {
            kind: SignatureKind::Ssh,
            ..
        }
    ));
    // Every throwaway GnuPG home is gone.
    let left: Vec<_> = std::fs::read_dir(cache.path().join("verify"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// ssh-keygen's fingerprint of the key, as the verdict names it.
fn verdict_key_of(s: &Signing, key: &Path) -> String {
    let public = key.with_extension("pub");
    let line = s.run("ssh-keygen", &["-l", "-f", &public.to_string_lossy()]);
    line.split(' ').nth(1).unwrap().to_owned()
}

#[tokio::test]
async fn mode_tag_verifies_the_annotated_tag_that_points_to_the_commit() {
    let s = Signing::new();
    let (bob_key, bob_public) = s.ssh_key("bob");
    let signers = format!("bob@example.com {bob_public}\n");
    let trusted = keys(&[("allowed_signers", signers.as_bytes())]);
    let commit = s.commit("a");
    let bob = ssh_signing(&bob_key);
    let mut args: Vec<&str> = bob.iter().map(String::as_str).collect();
    args.extend(["tag", "-s", "-m", "signed", "v1"]);
    s.git(&args);
    s.git(&["tag", "-a", "-m", "not signed", "v1-plain"]);
    s.git(&["tag", "v1-light"]);
    let later = s.commit("b");

    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned());
    let url = s.url();
    source
        .checkout(&CheckoutRequest {
            url: &url,
            revision: Some("v1"),
            ..Default::default()
        })
        .await
        .unwrap();

    let verified = check(&source, &url, &commit, Some("v1"), &trusted)
        .await
        .unwrap();
    assert_eq!(verified.signer.signer, "bob@example.com");
    assert_eq!(verified.tag.as_deref(), Some("v1"));
    let unsigned = check(&source, &url, &commit, Some("v1-plain"), &trusted).await;
    assert!(
        matches!(&unsigned, Err(e) if e.reason() == "UnsignedTag" && e.to_string().starts_with("tag v1-plain (commit ")),
        "{unsigned:?}"
    );
    let light = check(&source, &url, &commit, Some("v1-light"), &trusted).await;
    assert!(
        matches!(&light, Err(VerifyError::Lightweight { .. })),
        "{light:?}"
    );
    let missing = check(&source, &url, &commit, Some("v2"), &trusted).await;
    assert!(
        matches!(&missing, Err(VerifyError::NotATag { .. })),
        "{missing:?}"
    );
    // The tag must name the commit to be applied.
    let elsewhere = check(&source, &url, &later, Some("v1"), &trusted).await;
    assert!(
        matches!(&elsewhere, Err(VerifyError::TagMoved { .. })),
        "{elsewhere:?}"
    );
}

#[tokio::test]
async fn a_verdict_is_kept_per_object_and_keys() {
    let s = Signing::new();
    let (bob_key, bob_public) = s.ssh_key("bob");
    let signers = format!("bob@example.com {bob_public}\n");
    let trusted = keys(&[("allowed_signers", signers.as_bytes())]);
    let commit = s.signed_commit("a", &ssh_signing(&bob_key));

    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned());
    let url = s.url();
    source
        .checkout(&CheckoutRequest {
            url: &url,
            ..Default::default()
        })
        .await
        .unwrap();
    let runs = || spawned::containing(&format!("verify-commit --raw {commit}")).len();
    check(&source, &url, &commit, None, &trusted).await.unwrap();
    check(&source, &url, &commit, None, &trusted).await.unwrap();
    assert_eq!(runs(), 1, "the second verification ran no git");
    // Other keys: verified again.
    let (_, carol_public) = s.ssh_key("carol");
    let more = format!("{signers}carol@example.com {carol_public}\n");
    let other = keys(&[("allowed_signers", more.as_bytes())]);
    check(&source, &url, &commit, None, &other).await.unwrap();
    assert_eq!(runs(), 2);
}

/// The cost of verification per reconcile: one uncached verification (a
/// new commit: a GnuPG home, one `gpg --import`, one `git verify-commit`)
/// and one cached (an Application in sync). Printed with `--nocapture`.
#[tokio::test]
async fn verification_cost() {
    let s = Signing::new();
    let (fingerprint, alice) = s.openpgp_key("Alice <alice@example.com>");
    let (bob_key, bob_public) = s.ssh_key("bob");
    let signers = format!("bob@example.com {bob_public}\n");
    let trusted = keys(&[
        ("alice.asc", &alice),
        ("allowed_signers", signers.as_bytes()),
    ]);
    let openpgp = s.signed_commit("a", &openpgp_signing(&fingerprint));
    let ssh = s.signed_commit("b", &ssh_signing(&bob_key));

    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned());
    let url = s.url();
    source
        .checkout(&CheckoutRequest {
            url: &url,
            ..Default::default()
        })
        .await
        .unwrap();
    let remote = Remote::new(&url, None).unwrap();
    let mirror = source.mirror(&remote.key);
    let git = Git {
        mirror: &mirror,
        remote: &remote,
        settings: &source.settings,
    };
    const RUNS: u32 = 20;
    for (name, commit) in [("openpgp", &openpgp), ("ssh", &ssh)] {
        let subject = Subject::Commit(commit.clone());
        let started = Instant::now();
        for _ in 0..RUNS {
            let verdict = source
                .verify_signature(&git, commit, &subject, &trusted)
                .await
                .unwrap();
            assert!(matches!(verdict, Verdict::Verified(_)), "{verdict:?}");
        }
        let uncached = started.elapsed() / RUNS;
        check(&source, &url, commit, None, &trusted).await.unwrap();
        let started = Instant::now();
        for _ in 0..1000 {
            check(&source, &url, commit, None, &trusted).await.unwrap();
        }
        let cached = started.elapsed() / 1000;
        println!(
            "verification of an {name}-signed commit: {uncached:?} uncached (mean of {RUNS}), {cached:?} cached (mean of 1000)"
        );
    }
}

#[tokio::test]
async fn a_key_gpg_cannot_read_is_the_secrets_error() {
    let s = Signing::new();
    let commit = s.commit("a");
    let cache = tempfile::tempdir().unwrap();
    let source = GitSource::new(cache.path().to_owned());
    let url = s.url();
    source
        .checkout(&CheckoutRequest {
            url: &url,
            ..Default::default()
        })
        .await
        .unwrap();
    let garbage = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nbm90IGEga2V5\n-----END PGP PUBLIC KEY BLOCK-----\n";
    let broken = keys(&[("alice.asc", garbage.as_bytes())]);
    let result = check(&source, &url, &commit, None, &broken).await;
    match result {
        Err(error @ VerifyError::Import { .. }) => {
            assert_eq!(error.reason(), "VerificationKeysInvalid");
            assert!(!error.is_transient());
            assert!(error.to_string().contains("alice.asc"), "{error}");
        }
        other => panic!("{other:?}"),
    }
}
