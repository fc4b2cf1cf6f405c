//! The pure half of signature verification: what `git verify-commit --raw`
//! or `git verify-tag --raw` printed (gpg's `[GNUPG:]` status lines, or
//! ssh-keygen's messages) and whether git accepted it, to one verdict.
//!
//! Only those status lines are read, never the signature or the object:
//! gpg and ssh-keygen did the cryptography, git decided its exit status,
//! and a signature is `Verified` only when both say so.

use std::fmt;

/// What kind of signature an object carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignatureKind {
    /// gpg (`gpg.format=openpgp`, git's default).
    Openpgp,
    /// ssh-keygen (`gpg.format=ssh`), checked against the allowed signers.
    Ssh,
}

impl SignatureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SignatureKind::Openpgp => "openpgp",
            SignatureKind::Ssh => "ssh",
        }
    }
}

impl fmt::Display for SignatureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SignatureKind::Openpgp => "OpenPGP",
            SignatureKind::Ssh => "SSH",
        })
    }
}

/// Who signed, as gpg or ssh-keygen named them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signer {
    pub kind: SignatureKind,
    /// The OpenPGP user id (`Alice <alice@example.com>`), or the SSH
    /// principal of the allowed signers line that matched.
    pub signer: String,
    /// The OpenPGP primary key's fingerprint, or the SSH key's
    /// (`SHA256:…`).
    pub key: String,
}

/// The answer for one commit or tag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Good, by a key of the Secret.
    Verified(Signer),
    /// No signature at all.
    Unsigned,
    /// A signature by a key the Secret does not hold (or whose allowed
    /// signers line does not admit it: `note` says why, when ssh-keygen did).
    UnknownKey {
        kind: SignatureKind,
        key: String,
        note: Option<String>,
    },
    /// A signature that does not hold: the object was changed after it was
    /// signed, or the key expired or was revoked.
    Bad {
        kind: SignatureKind,
        signer: Option<String>,
        key: Option<String>,
        why: String,
    },
}

/// gpg's status keywords that each say a signature is not good.
const GPG_NOT_GOOD: &[(&str, &str)] = &[
    ("BADSIG", "the signature does not match the signed content"),
    ("EXPKEYSIG", "the signing key has expired"),
    ("REVKEYSIG", "the signing key has been revoked"),
    ("EXPSIG", "the signature has expired"),
];

/// ssh-keygen's lines for a signature that does not verify.
const SSH_FAILED: &[&str] = &[
    "Signature verification failed",
    "Could not verify signature",
];

const SSH_GOOD_FOR: &str = "Good \"git\" signature for ";
const SSH_GOOD_WITHOUT_PRINCIPAL: &str = "Good \"git\" signature with ";

/// `success`: git's exit status; `raw`: what it printed (stderr, where
/// `--raw` sends the status). `Err` is output that says nothing about the
/// signature (gpg missing, a repository error): the text to report.
pub fn decide(success: bool, raw: &str) -> Result<Verdict, String> {
    let lines: Vec<&str> = raw.lines().map(str::trim_end).collect();
    let status: Vec<(&str, &str)> = lines
        .iter()
        .filter_map(|line| line.strip_prefix("[GNUPG:] "))
        .map(|rest| rest.split_once(' ').unwrap_or((rest, "")))
        .collect();
    if !status.is_empty() {
        return decide_openpgp(success, &status);
    }
    if let Some(verdict) = decide_ssh(success, &lines) {
        return Ok(verdict);
    }
    let said: Vec<&str> = lines.iter().copied().filter(|l| !l.is_empty()).collect();
    if !success && (said.is_empty() || said.contains(&"error: no signature found")) {
        return Ok(Verdict::Unsigned);
    }
    Err(said
        .last()
        .map(|line| line.to_string())
        .unwrap_or_else(|| "git verified the signature but printed no status".into()))
}

fn decide_openpgp(success: bool, status: &[(&str, &str)]) -> Result<Verdict, String> {
    let kind = SignatureKind::Openpgp;
    let field = |keyword: &str| status.iter().find(|(k, _)| *k == keyword).map(|(_, a)| *a);
    for (keyword, why) in GPG_NOT_GOOD {
        if let Some(args) = field(keyword) {
            let (key, user) = args.split_once(' ').unwrap_or((args, ""));
            return Ok(Verdict::Bad {
                kind,
                signer: (!user.is_empty()).then(|| unescape(user)),
                key: (!key.is_empty()).then(|| key.to_string()),
                why: why.to_string(),
            });
        }
    }
    if let Some(args) = field("ERRSIG") {
        // `<keyid> <pkalgo> <hashalgo> <class> <time> <rc> [<fpr>]`
        let fields: Vec<&str> = args.split(' ').collect();
        let key_id = fields.first().copied().unwrap_or_default();
        let fingerprint = fields
            .get(6)
            .copied()
            .filter(|f| !f.is_empty() && *f != "-");
        let key = fingerprint.unwrap_or(key_id).to_string();
        return Ok(match fields.get(5).copied() {
            Some("9") => Verdict::UnknownKey {
                kind,
                key,
                note: None,
            },
            _ if field("NO_PUBKEY").is_some() => Verdict::UnknownKey {
                kind,
                key,
                note: None,
            },
            Some("4") => Verdict::Bad {
                kind,
                signer: None,
                key: Some(key),
                why: "it uses an algorithm gpg does not support".into(),
            },
            _ => Verdict::Bad {
                kind,
                signer: None,
                key: Some(key),
                why: "gpg could not check it".into(),
            },
        });
    }
    let good = field("GOODSIG");
    let valid = field("VALIDSIG");
    match (good, valid) {
        (Some(good), Some(valid)) => {
            let signer = unescape(good.split_once(' ').map(|(_, user)| user).unwrap_or(""));
            // `<fpr> <date> <time> <expire> <version> <reserved> <pkalgo>
            // <hashalgo> <class> [<primary fpr>]`: a subkey signs, its
            // primary key is who the Secret names.
            let fields: Vec<&str> = valid.split(' ').collect();
            let key = fields
                .get(9)
                .or(fields.first())
                .copied()
                .unwrap_or_default()
                .to_string();
            if success {
                Ok(Verdict::Verified(Signer { kind, signer, key }))
            } else {
                Ok(Verdict::Bad {
                    kind,
                    signer: Some(signer),
                    key: Some(key),
                    why: "git did not accept it".into(),
                })
            }
        }
        _ => Err("gpg gave no verdict on the signature".into()),
    }
}

fn decide_ssh(success: bool, lines: &[&str]) -> Option<Verdict> {
    let kind = SignatureKind::Ssh;
    for line in lines {
        if let Some(rest) = line.strip_prefix(SSH_GOOD_FOR) {
            // `<principal> with <TYPE> key <fingerprint>`
            let (principal, key) = rest.rsplit_once(" with ")?;
            let key = key.split_once(" key ").map(|(_, fp)| fp).unwrap_or(key);
            return Some(if success {
                Verdict::Verified(Signer {
                    kind,
                    signer: principal.to_string(),
                    key: key.to_string(),
                })
            } else {
                Verdict::Bad {
                    kind,
                    signer: Some(principal.to_string()),
                    key: Some(key.to_string()),
                    why: "git did not accept it".into(),
                }
            });
        }
    }
    if let Some(failed) = lines
        .iter()
        .find(|line| SSH_FAILED.iter().any(|f| line.starts_with(f)))
    {
        // ssh-keygen names the file's line that refused the key before its
        // verdict; `incorrect signature` is the one that matters.
        let why = lines
            .iter()
            .rev()
            .find(|line| line.starts_with(SSH_FAILED[0]))
            .unwrap_or(failed);
        return Some(Verdict::Bad {
            kind,
            signer: None,
            key: None,
            why: why
                .strip_prefix("Signature verification failed: ")
                .unwrap_or(why)
                .trim_end_matches('.')
                .to_string(),
        });
    }
    let unknown = lines.iter().find_map(|line| {
        let rest = line.strip_prefix(SSH_GOOD_WITHOUT_PRINCIPAL)?;
        Some(rest.split_once(" key ").map(|(_, fp)| fp).unwrap_or(rest))
    })?;
    // ssh-keygen says why a line of the allowed signers did not admit the
    // key (`<file>:<n>: key has expired: …`); the file is ours, a temporary.
    let note = lines.iter().find_map(|line| {
        let (_, after_file) = line.split_once(':')?;
        let (number, message) = after_file.split_once(": ")?;
        number
            .parse::<u32>()
            .ok()
            .map(|n| format!("allowed signers line {n}: {message}"))
    });
    Some(Verdict::UnknownKey {
        kind,
        key: unknown.to_string(),
        note,
    })
}

/// gpg escapes `%`, control characters and non-UTF-8 in user ids as `%XX`.
fn unescape(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    let text = String::from_utf8_lossy(&out);
    // A user id is shown on one line of a message.
    text.chars().filter(|c| !c.is_control()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD_OPENPGP: &str = "\
[GNUPG:] NEWSIG
[GNUPG:] KEY_CONSIDERED C40FB1E10AE026EE84E1E46A52ABE190DE139B8E 0
[GNUPG:] SIG_ID 93Sqx91vBky2PtxPVLw53HB6EGM 2026-12-07 1796657573
[GNUPG:] GOODSIG 52ABE190DE139B8E Alice <alice@example.com>
[GNUPG:] VALIDSIG 1111111111111111111111111111111111111111 2026-12-07 1796657573 0 4 0 22 8 00 C40FB1E10AE026EE84E1E46A52ABE190DE139B8E
[GNUPG:] TRUST_UNDEFINED 0 pgp
";

    #[test]
    fn a_good_openpgp_signature_names_the_user_id_and_the_primary_key() {
        assert_eq!(
            decide(true, GOOD_OPENPGP),
            Ok(Verdict::Verified(Signer {
                kind: SignatureKind::Openpgp,
                signer: "Alice <alice@example.com>".into(),
                key: "C40FB1E10AE026EE84E1E46A52ABE190DE139B8E".into(),
            }))
        );
    }

    #[test]
    fn a_good_status_that_git_refused_is_not_verified() {
        let verdict = decide(false, GOOD_OPENPGP).unwrap();
        assert!(matches!(verdict, Verdict::Bad { .. }), "{verdict:?}");
    }

    #[test]
    fn a_signature_by_a_key_not_in_the_secret_is_an_unknown_key() {
        let raw = "[GNUPG:] NEWSIG\n\
            [GNUPG:] ERRSIG A9F708704905E64C 22 8 00 1796657582 9 5B0BDC2794B48EF93BF9143AA9F708704905E64C\n\
            [GNUPG:] NO_PUBKEY A9F708704905E64C\n";
        assert_eq!(
            decide(false, raw),
            Ok(Verdict::UnknownKey {
                kind: SignatureKind::Openpgp,
                key: "5B0BDC2794B48EF93BF9143AA9F708704905E64C".into(),
                note: None,
            })
        );
        // An older gpg gives no fingerprint: the long key id stands in.
        let raw = "[GNUPG:] ERRSIG A9F708704905E64C 22 8 00 1796657582 9\n";
        assert!(matches!(
            decide(false, raw),
            Ok(Verdict::UnknownKey { key, .. }) if key == "A9F708704905E64C"
        ));
    }

    #[test]
    fn a_changed_object_expired_or_revoked_key_is_a_bad_signature() {
        let raw = "[GNUPG:] NEWSIG\n[GNUPG:] BADSIG 52ABE190DE139B8E Alice <alice@example.com>\n";
        assert_eq!(
            decide(false, raw),
            Ok(Verdict::Bad {
                kind: SignatureKind::Openpgp,
                signer: Some("Alice <alice@example.com>".into()),
                key: Some("52ABE190DE139B8E".into()),
                why: "the signature does not match the signed content".into(),
            })
        );
        let raw = "[GNUPG:] EXPKEYSIG 52ABE190DE139B8E Alice <alice@example.com>\n\
            [GNUPG:] VALIDSIG C40F 2026-12-07 1796657573 0 4 0 22 8 00 C40F\n";
        assert!(matches!(
            decide(true, raw),
            Ok(Verdict::Bad { why, .. }) if why == "the signing key has expired"
        ));
        let raw = "[GNUPG:] REVKEYSIG 52ABE190DE139B8E Alice\n";
        assert!(matches!(
            decide(false, raw),
            Ok(Verdict::Bad { why, .. }) if why.contains("revoked")
        ));
    }

    #[test]
    fn a_good_ssh_signature_names_the_principal_and_the_fingerprint() {
        let raw = "Good \"git\" signature for bob@example.com with ED25519 key SHA256:Augnr7QVyxn2tiX8v0v4TuYsPCg4R4rRMcHaIK7/r3c\n";
        assert_eq!(
            decide(true, raw),
            Ok(Verdict::Verified(Signer {
                kind: SignatureKind::Ssh,
                signer: "bob@example.com".into(),
                key: "SHA256:Augnr7QVyxn2tiX8v0v4TuYsPCg4R4rRMcHaIK7/r3c".into(),
            }))
        );
        // A principal may hold " with ": the key is after the last one.
        let raw = "Good \"git\" signature for ops with care with RSA key SHA256:abc\n";
        assert!(matches!(
            decide(true, raw),
            Ok(Verdict::Verified(Signer { signer, key, .. })) if signer == "ops with care" && key == "SHA256:abc"
        ));
    }

    #[test]
    fn an_ssh_key_no_allowed_signer_admits_is_an_unknown_key() {
        let raw = "Good \"git\" signature with ED25519 key SHA256:uTxiCT/LOYeaVcp2fNg45EvJBSc2m+3fs6NgNjnNPs0\nNo principal matched.\n";
        assert_eq!(
            decide(false, raw),
            Ok(Verdict::UnknownKey {
                kind: SignatureKind::Ssh,
                key: "SHA256:uTxiCT/LOYeaVcp2fNg45EvJBSc2m+3fs6NgNjnNPs0".into(),
                note: None,
            })
        );
        let raw = "Good \"git\" signature with ED25519 key SHA256:Aug\n\
            /tmp/.tmpX1/allowed_signers:1: key has expired: verify time 2026-12-07T15:32:45 > valid-before 2020-01-01T00:00:00\n\
            No principal matched.\n";
        assert!(matches!(
            decide(false, raw),
            Ok(Verdict::UnknownKey { note: Some(note), .. })
                if note == "allowed signers line 1: key has expired: verify time 2026-12-07T15:32:45 > valid-before 2020-01-01T00:00:00"
        ));
    }

    #[test]
    fn a_changed_ssh_signed_object_is_a_bad_signature() {
        let raw =
            "Could not verify signature.\nSignature verification failed: incorrect signature\n";
        assert_eq!(
            decide(false, raw),
            Ok(Verdict::Bad {
                kind: SignatureKind::Ssh,
                signer: None,
                key: None,
                why: "incorrect signature".into(),
            })
        );
    }

    #[test]
    fn no_signature_is_unsigned_and_other_failures_are_not_a_verdict() {
        // verify-commit prints nothing for an unsigned commit.
        assert_eq!(decide(false, ""), Ok(Verdict::Unsigned));
        assert_eq!(
            decide(false, "error: no signature found\n"),
            Ok(Verdict::Unsigned)
        );
        assert_eq!(
            decide(false, "error: cannot run gpg: No such file or directory\n"),
            Err("error: cannot run gpg: No such file or directory".into())
        );
        // Success with nothing said is never taken as verified.
        assert!(decide(true, "").is_err());
        assert!(decide(true, "[GNUPG:] NEWSIG\n").is_err());
    }

    #[test]
    fn text_that_is_not_a_status_line_is_not_read_as_one() {
        let raw = "note: [GNUPG:] GOODSIG 1 Mallory\nerror: no signature found\n";
        assert_eq!(decide(false, raw), Ok(Verdict::Unsigned));
        let raw = "x Good \"git\" signature for root with ED25519 key SHA256:x\n";
        assert!(decide(true, raw).is_err());
    }

    #[test]
    fn user_ids_are_unescaped_onto_one_line() {
        assert_eq!(unescape("A%25B%0AC"), "A%BC");
        assert_eq!(unescape("Zo%C3%AB <z@e>"), "Zoë <z@e>");
        assert_eq!(unescape("50%"), "50%");
    }
}
