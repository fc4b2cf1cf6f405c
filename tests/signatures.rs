//! Signed commits and tags (`spec.source.verify`) with a real `setpoint
//! run`, the local control plane, repositories made with the git CLI and
//! keys made here with `gpg --quick-gen-key` and `ssh-keygen`: commits
//! signed by an SSH key and by an OpenPGP key are applied; an unsigned
//! commit and one signed by a key the Secret does not hold are not (the
//! cluster stays at the signed one, the Application is Stalled with an
//! Event, the commit status is `failure`); a signed annotated tag is
//! applied through a namespace's default from the configuration; a pull
//! request's preview says whether its head would pass.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use setpoint::api::{
    Application, ConditionStatus, ConditionType, LocalSecretRef, SignatureType, Source, Verify,
    VerifyMode,
};
use support::app::{
    automated, condition, context, create_app_from, event_notes, get_app, install_crd, synced_at,
};
use support::github::{FakeGitHub, TOKEN};
use support::process::{Setpoint, free_port, github_push, post_github};
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const SECRET: &str = "webhook-secret-for-signature-tests";

/// Keys made for one test: an OpenPGP key in a GnuPG home of its own, and
/// SSH keys.
struct Keys {
    dir: tempfile::TempDir,
    gnupg: PathBuf,
}

impl Keys {
    fn new() -> Keys {
        let dir = tempfile::Builder::new()
            .prefix("setpoint-keys-")
            .tempdir()
            .unwrap();
        let gnupg = dir.path().join("gnupg");
        std::fs::create_dir(&gnupg).unwrap();
        std::fs::set_permissions(&gnupg, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        Keys { dir, gnupg }
    }

    fn run(&self, dir: &Path, program: &str, args: &[&str]) -> String {
        let out = Command::new(program)
            .args(args)
            .current_dir(dir)
            .env("GNUPGHOME", &self.gnupg)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .output()
            .unwrap_or_else(|e| {
                panic!("{program} is installed (Debian: gnupg, openssh-client): {e}")
            });
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// A new OpenPGP key: its fingerprint and armored public key.
    fn openpgp(&self, uid: &str) -> (String, String) {
        let here = self.dir.path();
        self.run(
            here,
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
        let listing = self.run(here, "gpg", &["--with-colons", "--list-keys", uid]);
        let fingerprint = listing
            .lines()
            .find_map(|line| line.strip_prefix("fpr:"))
            .and_then(|rest| rest.split(':').find(|f| f.len() == 40))
            .unwrap()
            .to_string();
        let public = self.run(here, "gpg", &["--armor", "--export", &fingerprint]);
        (fingerprint, public)
    }

    /// A new SSH key: its private key's path, its public key line and its
    /// fingerprint (`SHA256:…`).
    fn ssh(&self, name: &str) -> (PathBuf, String, String) {
        let path = self.dir.path().join(name);
        let shown = path.to_string_lossy().to_string();
        let here = self.dir.path();
        self.run(
            here,
            "ssh-keygen",
            &["-q", "-t", "ed25519", "-N", "", "-C", name, "-f", &shown],
        );
        let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
        let listing = self.run(here, "ssh-keygen", &["-l", "-f", &format!("{shown}.pub")]);
        let fingerprint = listing.split(' ').nth(1).unwrap().to_string();
        (path, public.trim().to_string(), fingerprint)
    }

    /// Commits everything in `repo`'s work tree signed as `signing` says
    /// (`-c` options; empty: unsigned) and pushes it.
    fn commit(&self, repo: &GitRepo, message: &str, signing: &[String]) -> String {
        let work = &repo.work;
        self.run(work, "git", &["add", "--all"]);
        let mut args: Vec<&str> = signing.iter().map(String::as_str).collect();
        args.extend(["commit", "--quiet", "--allow-empty", "-m", message]);
        if !signing.is_empty() {
            args.push("-S");
        }
        self.run(work, "git", &args);
        self.run(work, "git", &["push", "--quiet", "origin", &repo.branch]);
        repo.head()
    }

    /// An annotated tag of HEAD, signed as `signing` says, pushed.
    fn tag(&self, repo: &GitRepo, name: &str, signing: &[String]) {
        let work = &repo.work;
        let mut args: Vec<&str> = signing.iter().map(String::as_str).collect();
        args.push("tag");
        if !signing.is_empty() {
            args.push("-s");
        }
        args.extend(["-m", name, name]);
        self.run(work, "git", &args);
        self.run(work, "git", &["push", "--quiet", "origin", name]);
    }
}

impl Drop for Keys {
    /// Key generation started a gpg-agent for this home; it goes with it.
    fn drop(&mut self) {
        let _ = Command::new("gpgconf")
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

fn openpgp_signing(fingerprint: &str) -> Vec<String> {
    vec!["-c".into(), format!("user.signingkey={fingerprint}")]
}

fn configmap(value: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  key: \"{value}\"\n"
    )
}

/// The Secret of trusted keys: `entries` as its data.
async fn keys_secret(ns: &TestNamespace, name: &str, entries: &[(&str, &str)]) {
    let data: BTreeMap<String, ByteString> = entries
        .iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect();
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the keys Secret");
}

async fn live_value(ns: &TestNamespace) -> String {
    let live: ConfigMap = ns.api().get("settings").await.unwrap();
    live.data.unwrap()["key"].clone()
}

/// Waits until `app` is Stalled with `reason` and a message naming
/// `naming`; that message.
async fn stalled(ns: &TestNamespace, app: &str, reason: &str, naming: &str) -> String {
    wait_for(
        &format!("{app} Stalled with {reason} ({naming})"),
        DEADLINE,
        || async {
            let app = get_app(ns, app).await;
            let status = app.status.unwrap_or_default();
            match status
                .conditions
                .iter()
                .find(|c| c.type_ == ConditionType::Stalled)
            {
                Some(c)
                    if c.status == ConditionStatus::True
                        && c.reason == reason
                        && c.message.contains(naming) =>
                {
                    Ok(c.message.clone())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}

/// The (state, description) of the statuses posted on `sha`, in order.
fn statuses(github: &FakeGitHub, sha: &str) -> Vec<(String, String)> {
    github
        .received_on("POST", &format!("/statuses/{sha}"))
        .into_iter()
        .map(|r| r.json())
        .map(|body| {
            (
                body["state"].as_str().unwrap_or_default().to_string(),
                body["description"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_commits_are_applied_and_unsigned_or_unknown_ones_are_not() {
    let ns = TestNamespace::new("signatures").await;
    install_crd(&ns.client).await;
    let keys = Keys::new();
    let (alice_fpr, alice_public) = keys.openpgp("Alice <alice@example.com>");
    let (bob, bob_public, bob_fpr) = keys.ssh("bob");
    let (eve, _, eve_fpr) = keys.ssh("eve");
    keys_secret(
        &ns,
        "signers",
        &[
            ("alice.asc", &alice_public),
            (
                "allowed_signers",
                &format!("bob@example.com {bob_public}\n"),
            ),
        ],
    )
    .await;

    let repo = GitRepo::new();
    repo.write("app/cm.yaml", &configmap("1"));
    let by_bob = keys.commit(&repo, "bob's", &ssh_signing(&bob));
    let served = repo.serve_http("acme", "deploy");
    let source = Source {
        repo_url: served.url.clone(),
        path: Some("app".into()),
        verify: Some(Verify {
            mode: VerifyMode::Head,
            secret_ref: LocalSecretRef {
                name: "signers".into(),
            },
        }),
        ..Default::default()
    };
    create_app_from(&ns, "web", source, automated(true, true)).await;

    let github = FakeGitHub::start().await;
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--github-secret",
            SECRET,
            "--no-sweep",
        ],
        &[
            ("SETPOINT_GITHUB_API_URL", github.url.as_str()),
            ("SETPOINT_GITHUB_TOKEN", TOKEN),
        ],
        cache.path(),
    );
    setpoint.wait_http().await;
    let port = setpoint.port.unwrap();
    let push = |commit: &str| {
        let body = github_push(&served.url, commit, &["app/cm.yaml"]);
        let (code, reply) = post_github(port, Some(SECRET), &support::unique_name("d"), &body);
        assert_eq!(code, 200, "{reply}");
    };

    // Signed with an SSH key of the allowed signers: applied, and the
    // status says who signed it.
    wait_for("bob's commit synced", DEADLINE, || {
        synced_at(&ns, "web", &by_bob)
    })
    .await;
    assert_eq!(live_value(&ns).await, "1");
    let signature = get_app(&ns, "web").await.status.unwrap().operation.unwrap();
    let signature = signature.signature.expect("the signer recorded");
    assert_eq!(signature.signer, "bob@example.com");
    assert_eq!(signature.key, bob_fpr);
    assert_eq!(signature.kind, SignatureType::Ssh);

    // Signed with the OpenPGP key: applied.
    repo.write("app/cm.yaml", &configmap("2"));
    let by_alice = keys.commit(&repo, "alice's", &openpgp_signing(&alice_fpr));
    push(&by_alice);
    wait_for("alice's commit synced", DEADLINE, || {
        synced_at(&ns, "web", &by_alice)
    })
    .await;
    assert_eq!(live_value(&ns).await, "2");
    let status = get_app(&ns, "web").await.status.unwrap();
    let signature = status.operation.unwrap().signature.unwrap();
    assert_eq!(signature.signer, "Alice <alice@example.com>");
    assert_eq!(signature.key, alice_fpr);
    assert_eq!(signature.kind, SignatureType::Openpgp);
    assert_eq!(
        status.history[1].signature.as_ref().unwrap().signer,
        "bob@example.com"
    );

    // Unsigned, after the signed one: not applied. The Application keeps
    // its last applied revision and says why in a condition and an Event;
    // the commit status is a failure.
    repo.write("app/cm.yaml", &configmap("3"));
    let unsigned = keys.commit(&repo, "unsigned", &[]);
    push(&unsigned);
    let message = stalled(&ns, "web", "UnsignedCommit", &unsigned[..7]).await;
    assert_eq!(
        message,
        format!(
            "commit {} is not signed; spec.source.verify requires a signed commit",
            &unsigned[..7]
        )
    );
    let status = get_app(&ns, "web").await.status.unwrap();
    assert_eq!(status.last_applied_revision.as_deref(), Some(&*by_alice));
    assert_eq!(live_value(&ns).await, "2");
    let notes = wait_for("the UnsignedCommit Event", DEADLINE, || async {
        let notes = event_notes(&ns, "web", "UnsignedCommit").await;
        if notes.is_empty() {
            Err("none yet".to_string())
        } else {
            Ok(notes)
        }
    })
    .await;
    assert!(notes[0].contains(&unsigned[..7]), "{notes:?}");
    let posted = wait_for("failure on the unsigned commit", DEADLINE, || async {
        let posted = statuses(&github, &unsigned);
        match posted.last() {
            Some((state, _)) if state == "failure" => Ok(posted),
            _ => Err(format!("{posted:?}")),
        }
    })
    .await;
    let description = &posted.last().unwrap().1;
    assert!(
        description.starts_with("UnsignedCommit") && description.contains("is not signed"),
        "{description}"
    );

    // Signed by an SSH key no allowed signer admits: refused, naming it.
    repo.write("app/cm.yaml", &configmap("4"));
    let by_eve = keys.commit(&repo, "eve's", &ssh_signing(&eve));
    push(&by_eve);
    let message = stalled(&ns, "web", "UnknownSigner", &by_eve[..7]).await;
    assert!(
        message.starts_with(&format!(
            "commit {} is signed by an unknown SSH key {eve_fpr}",
            &by_eve[..7]
        )),
        "{message}"
    );
    assert_eq!(live_value(&ns).await, "2");

    // `setpoint app get` names who signed the applied revision.
    let out = Command::new(support::process::binary())
        .args(["app", "get", &format!("{}/web", ns.name)])
        .env("KUBECONFIG", support::kubeconfig_path())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains(&format!(
            "Signed by:    Alice <alice@example.com> (openpgp key {alice_fpr}) at {}",
            &by_alice[..12]
        )),
        "{shown}"
    );
    assert!(
        shown.contains("Verify:       signed commits, keys of Secret signers"),
        "{shown}"
    );
    assert!(github.violations().is_empty(), "{:?}", github.violations());
    drop(setpoint);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaces_default_applies_signed_tags_only() {
    let ns = TestNamespace::new("signed-tags").await;
    install_crd(&ns.client).await;
    let keys = Keys::new();
    let (bob, bob_public, bob_fpr) = keys.ssh("bob");
    keys_secret(
        &ns,
        "release-signers",
        &[(
            "team.allowed_signers",
            &format!("bob@example.com {bob_public}\n"),
        )],
    )
    .await;
    let repo = GitRepo::new();
    repo.write("app/cm.yaml", &configmap("1"));
    keys.commit(&repo, "v1", &[]);
    keys.tag(&repo, "v1", &ssh_signing(&bob));
    repo.write("app/cm.yaml", &configmap("2"));
    let second = keys.commit(&repo, "v2", &[]);
    keys.tag(&repo, "v2", &[]);
    repo.write("app/cm.yaml", &configmap("3"));
    keys.commit(&repo, "v3", &[]);
    repo.tag("v3");

    // No spec.source.verify: the namespace's default in the configuration.
    let source = Source {
        repo_url: repo.url(),
        path: Some("app".into()),
        target_revision: Some("v1".into()),
        ..Default::default()
    };
    create_app_from(&ns, "web", source, automated(true, true)).await;
    let defaults = format!(
        r#"[{{"namespace":"{}","mode":"tag","secretRef":{{"name":"release-signers"}}}}]"#,
        ns.name
    );
    let cache = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let mut setpoint = Setpoint::scoped(
        &ns.name,
        &["run", "--listen", &listen, "--no-sweep"],
        &[("SETPOINT_VERIFY_DEFAULTS", &defaults)],
        cache.path(),
    );
    setpoint.wait_http().await;

    let first = wait_for("v1 applied", DEADLINE, || async {
        let status = get_app(&ns, "web").await.status.unwrap_or_default();
        match (&status.last_applied_revision, &status.operation) {
            (Some(revision), Some(operation)) => Ok((revision.clone(), operation.clone())),
            other => Err(format!("{other:?} {:?}", status.conditions)),
        }
    })
    .await;
    let signature = first.1.signature.expect("the tag's signer recorded");
    assert_eq!(signature.signer, "bob@example.com");
    assert_eq!(signature.key, bob_fpr);
    assert_eq!(signature.tag.as_deref(), Some("v1"));
    assert_eq!(live_value(&ns).await, "1");

    // An annotated tag nobody signed, then a lightweight one: refused.
    let api = ns.api::<Application>();
    let follow = |tag: &str| serde_json::json!({"spec": {"source": {"targetRevision": tag}}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(follow("v2")))
        .await
        .unwrap();
    let message = stalled(&ns, "web", "UnsignedTag", "tag v2").await;
    assert_eq!(
        message,
        format!(
            "tag v2 (commit {}) is not signed; spec.source.verify mode tag requires a signed annotated tag",
            &second[..7]
        )
    );
    api.patch("web", &PatchParams::default(), &Patch::Merge(follow("v3")))
        .await
        .unwrap();
    let message = stalled(&ns, "web", "UnsignedTag", "tag v3").await;
    assert!(message.contains("tag v3 is a lightweight tag"), "{message}");
    let status = get_app(&ns, "web").await.status.unwrap();
    assert_eq!(status.last_applied_revision, Some(first.0));
    assert_eq!(live_value(&ns).await, "1");
    let stalled_condition = condition(&status, ConditionType::Stalled);
    assert_eq!(stalled_condition.status, ConditionStatus::True);
    drop(setpoint);
}

#[tokio::test]
async fn a_preview_says_whether_the_head_commit_would_pass() {
    let ns = TestNamespace::new("signed-preview").await;
    install_crd(&ns.client).await;
    let keys = Keys::new();
    let (bob, bob_public, _) = keys.ssh("bob");
    keys_secret(
        &ns,
        "signers",
        &[(
            "allowed_signers",
            &format!("bob@example.com {bob_public}\n"),
        )],
    )
    .await;
    let repo = GitRepo::new();
    repo.write("app/cm.yaml", &configmap("1"));
    keys.commit(&repo, "base", &ssh_signing(&bob));
    let source = Source {
        repo_url: repo.url(),
        path: Some("app".into()),
        verify: Some(Verify {
            mode: VerifyMode::Head,
            secret_ref: LocalSecretRef {
                name: "signers".into(),
            },
        }),
        ..Default::default()
    };
    let app = create_app_from(&ns, "web", source, Default::default()).await;
    let (ctx, _cache) = context().await;

    let unsigned = repo.pull_request(
        5,
        &[("app/cm.yaml", Some(&configmap("unsigned")))],
        "unsigned",
    );
    let preview = setpoint::preview::render::preview_app(&ctx, &app, &unsigned, None).await;
    let lines = setpoint::preview::body::app_lines(&preview).join("\n");
    assert!(
        lines.contains("❌") && lines.contains("UnsignedCommit"),
        "{lines}"
    );
    assert!(
        lines.contains(&format!("commit {} is not signed", &unsigned[..7])),
        "{lines}"
    );

    // The same change, signed by an allowed signer: previewed as a change.
    repo.write("app/cm.yaml", &configmap("signed"));
    let signed = keys.commit(&repo, "signed", &ssh_signing(&bob));
    let preview = setpoint::preview::render::preview_app(&ctx, &app, &signed, None).await;
    let lines = setpoint::preview::body::app_lines(&preview).join("\n");
    assert!(preview.result.is_ok(), "{lines}");
    assert!(lines.contains("1 to create"), "{lines}");
    // A preview writes nothing.
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("settings")
            .await
            .unwrap()
            .is_none()
    );
}
