//! The trusted keys of `spec.source.verify.secretRef`, read from the
//! Secret's data (pure): as Flux's GitRepository, every key ending `.asc`
//! (or `.gpg`, binary) holds OpenPGP public keys; beside them, git's
//! `gpg.ssh.allowedSignersFile` format in `allowed_signers` or any key
//! ending `.allowed_signers`. Other keys are left alone.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// What the keys of a Secret are wrong about, for the condition's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeysError {
    #[error(
        "it has no OpenPGP key (a key ending .asc or .gpg) and no SSH allowed signers (allowed_signers)"
    )]
    Empty,
    #[error("its key {key} holds a private key; only public keys belong there")]
    Private { key: String },
    #[error("its key {key} is not an OpenPGP public key (armored, or binary in a key ending .gpg)")]
    NotOpenpgp { key: String },
}

/// The keys one verification trusts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keys {
    /// Each OpenPGP key's Secret key name and contents, as `gpg --import`
    /// takes them.
    pub openpgp: Vec<(String, Vec<u8>)>,
    /// The allowed signers lines, all Secret keys' joined.
    pub allowed_signers: String,
    /// A digest of both: verdicts are cached per object and digest, so a
    /// changed Secret is a new verification.
    pub digest: String,
}

const ARMORED_PUBLIC: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----";
/// `-----BEGIN PGP PRIVATE KEY BLOCK-----`, and OpenSSH's, PEM's.
const PRIVATE_MARKERS: &[&str] = &["PRIVATE KEY BLOCK-----", "PRIVATE KEY-----"];
/// The packet tag of a public key: a binary key in `.gpg` starts with one.
const OPENPGP_PUBLIC_KEY_TAG: u8 = 6;

impl Keys {
    pub fn from_secret(data: &BTreeMap<String, Vec<u8>>) -> Result<Keys, KeysError> {
        let mut keys = Keys::default();
        let mut digest = Sha256::new();
        for (name, value) in data {
            let openpgp = name.ends_with(".asc") || name.ends_with(".gpg");
            let ssh = name == "allowed_signers" || name.ends_with(".allowed_signers");
            if !openpgp && !ssh {
                continue;
            }
            let text = String::from_utf8_lossy(value);
            if PRIVATE_MARKERS.iter().any(|m| text.contains(m)) {
                return Err(KeysError::Private { key: name.clone() });
            }
            if openpgp {
                if !text.contains(ARMORED_PUBLIC) && !is_binary_public_key(value) {
                    return Err(KeysError::NotOpenpgp { key: name.clone() });
                }
                keys.openpgp.push((name.clone(), value.clone()));
            } else {
                keys.allowed_signers.push_str(text.trim_end());
                keys.allowed_signers.push('\n');
            }
            digest.update((name.len() as u64).to_be_bytes());
            digest.update(name.as_bytes());
            digest.update((value.len() as u64).to_be_bytes());
            digest.update(value);
        }
        if keys.openpgp.is_empty() && keys.allowed_signers.trim().is_empty() {
            return Err(KeysError::Empty);
        }
        keys.digest = hex::encode(digest.finalize());
        Ok(keys)
    }
}

/// An OpenPGP packet stream that starts with a public key packet (tag 6):
/// in the old format `10tttt ll`, in the new `11tttttt`.
fn is_binary_public_key(bytes: &[u8]) -> bool {
    let Some(&first) = bytes.first() else {
        return false;
    };
    if first & 0x80 == 0 {
        return false;
    }
    let tag = if first & 0x40 != 0 {
        first & 0x3f
    } else {
        (first >> 2) & 0x0f
    };
    tag == OPENPGP_PUBLIC_KEY_TAG
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARMORED: &str =
        "-----BEGIN PGP PUBLIC KEY BLOCK-----\n\nmDMEZ\n-----END PGP PUBLIC KEY BLOCK-----\n";

    fn data(entries: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
        entries
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect()
    }

    #[test]
    fn openpgp_keys_and_allowed_signers_are_taken_by_key_name() {
        let keys = Keys::from_secret(&data(&[
            ("alice.asc", ARMORED.as_bytes()),
            ("bob.gpg", &[0x99, 0x00, 0x33]),
            ("allowed_signers", b"bob@example.com ssh-ed25519 AAAA"),
            (
                "team.allowed_signers",
                b"carol@example.com ssh-ed25519 BBBB\n\n",
            ),
            ("README", b"ignored"),
        ]))
        .unwrap();
        assert_eq!(
            keys.openpgp
                .iter()
                .map(|(name, _)| name.as_str())
                .collect::<Vec<_>>(),
            ["alice.asc", "bob.gpg"]
        );
        assert_eq!(
            keys.allowed_signers,
            "bob@example.com ssh-ed25519 AAAA\ncarol@example.com ssh-ed25519 BBBB\n"
        );
        assert_eq!(keys.digest.len(), 64);
    }

    #[test]
    fn the_digest_changes_with_any_trusted_key_and_only_with_them() {
        let one = Keys::from_secret(&data(&[("a.asc", ARMORED.as_bytes())])).unwrap();
        let same =
            Keys::from_secret(&data(&[("a.asc", ARMORED.as_bytes()), ("notes", b"x")])).unwrap();
        let other = Keys::from_secret(&data(&[
            ("a.asc", ARMORED.as_bytes()),
            ("allowed_signers", b"x ssh-ed25519 AAAA"),
        ]))
        .unwrap();
        assert_eq!(one.digest, same.digest);
        assert_ne!(one.digest, other.digest);
    }

    #[test]
    fn a_secret_without_keys_a_private_key_or_garbage_is_refused() {
        assert_eq!(
            Keys::from_secret(&data(&[("token", b"x")])),
            Err(KeysError::Empty)
        );
        assert_eq!(
            Keys::from_secret(&data(&[("allowed_signers", b"\n\n")])),
            Err(KeysError::Empty)
        );
        assert_eq!(
            Keys::from_secret(&data(&[(
                "me.asc",
                b"-----BEGIN PGP PRIVATE KEY BLOCK-----\n..."
            )])),
            Err(KeysError::Private {
                key: "me.asc".into()
            })
        );
        assert_eq!(
            Keys::from_secret(&data(&[(
                "allowed_signers",
                b"-----BEGIN OPENSSH PRIVATE KEY-----\n..."
            )])),
            Err(KeysError::Private {
                key: "allowed_signers".into()
            })
        );
        assert_eq!(
            Keys::from_secret(&data(&[("me.asc", b"ssh-ed25519 AAAA")])),
            Err(KeysError::NotOpenpgp {
                key: "me.asc".into()
            })
        );
        // A binary secret key packet (tag 5) is not a public key.
        assert_eq!(
            Keys::from_secret(&data(&[("me.gpg", &[0x95, 0x01])])),
            Err(KeysError::NotOpenpgp {
                key: "me.gpg".into()
            })
        );
    }
}
