//! Authentication of a webhook delivery, the first thing done with its body:
//! GitHub signs the raw bytes with HMAC-SHA256 (`X-Hub-Signature-256`),
//! GitLab sends a shared token (`X-Gitlab-Token`). Both accept any of several
//! configured values, so a secret can be rotated without dropping deliveries:
//! add the new one, change it on the Git host, remove the old one.
//!
//! Every comparison runs in constant time, so response timing does not tell
//! an attacker how much of a forged signature or token was right. Messages
//! never contain the secrets, the tokens or the received values.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// The prefix GitHub puts before the hex digest.
const GITHUB_PREFIX: &str = "sha256=";

/// Why a delivery was not authenticated. All of them answer 401.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignatureError {
    /// Nothing is configured: rejecting is the only safe answer, since an
    /// empty secret would make every signature forgeable.
    #[error("no {provider} webhook secret is configured")]
    NotConfigured { provider: &'static str },
    #[error("missing {header} header")]
    Missing { header: &'static str },
    #[error("malformed {header} header")]
    Malformed { header: &'static str },
    #[error("{header} does not match")]
    Mismatch { header: &'static str },
}

/// The header GitHub's signature arrives in.
pub const GITHUB_HEADER: &str = "X-Hub-Signature-256";
/// The header GitLab's token arrives in.
pub const GITLAB_HEADER: &str = "X-Gitlab-Token";

/// Checks `header` (`sha256=<hex>`) against the HMAC-SHA256 of `body` under
/// each of `secrets`; empty secrets are skipped.
pub fn verify_github(
    secrets: &[String],
    body: &[u8],
    header: Option<&str>,
) -> Result<(), SignatureError> {
    let mut verifier = GitHubVerifier::new(secrets, header)?;
    verifier.update(body);
    verifier.verify()
}

/// A GitHub signature checked while the body arrives. The header comes
/// before the body, so a delivery with no secret configured, or without a
/// well-formed signature, is refused before a byte of its body is read; the
/// HMACs then take each chunk as it is read, and nothing is read twice.
pub struct GitHubVerifier {
    /// One per configured secret: every one is computed to the end, so the
    /// time taken does not depend on which one matches.
    macs: Vec<HmacSha256>,
    digest: Vec<u8>,
}

impl GitHubVerifier {
    pub fn new(secrets: &[String], header: Option<&str>) -> Result<Self, SignatureError> {
        let header_name = GITHUB_HEADER;
        let macs: Vec<HmacSha256> = secrets
            .iter()
            .filter(|s| !s.is_empty())
            .map(|secret| {
                HmacSha256::new_from_slice(secret.as_bytes())
                    .expect("HMAC accepts keys of any length")
            })
            .collect();
        if macs.is_empty() {
            return Err(SignatureError::NotConfigured { provider: "GitHub" });
        }
        let header = header.ok_or(SignatureError::Missing {
            header: header_name,
        })?;
        let digest = header
            .trim()
            .strip_prefix(GITHUB_PREFIX)
            .and_then(|hex_digest| hex::decode(hex_digest).ok())
            .ok_or(SignatureError::Malformed {
                header: header_name,
            })?;
        Ok(Self { macs, digest })
    }

    /// The next bytes of the body.
    pub fn update(&mut self, chunk: &[u8]) {
        for mac in &mut self.macs {
            mac.update(chunk);
        }
    }

    /// Whether the whole body, as fed, matches the header.
    pub fn verify(self) -> Result<(), SignatureError> {
        let mut matched = false;
        for mac in self.macs {
            // `verify_slice` compares in constant time and rejects a digest
            // of the wrong length (a truncated signature) outright.
            matched |= mac.verify_slice(&self.digest).is_ok();
        }
        if matched {
            Ok(())
        } else {
            Err(SignatureError::Mismatch {
                header: GITHUB_HEADER,
            })
        }
    }
}

/// Checks `header` against each of `tokens`; empty tokens are skipped.
pub fn verify_gitlab(tokens: &[String], header: Option<&str>) -> Result<(), SignatureError> {
    let tokens: Vec<&String> = tokens.iter().filter(|t| !t.is_empty()).collect();
    if tokens.is_empty() {
        return Err(SignatureError::NotConfigured { provider: "GitLab" });
    }
    let header = header.ok_or(SignatureError::Missing {
        header: GITLAB_HEADER,
    })?;
    let mut matched = false;
    for token in tokens {
        matched |= constant_time_eq(token.as_bytes(), header.as_bytes());
    }
    if matched {
        Ok(())
    } else {
        Err(SignatureError::Mismatch {
            header: GITLAB_HEADER,
        })
    }
}

/// Equality whose time depends on neither the contents nor the lengths: both
/// sides are hashed first, so even a length mismatch costs a full compare.
pub fn constant_time_eq(expected: &[u8], received: &[u8]) -> bool {
    let expected = Sha256::digest(expected);
    let received = Sha256::digest(received);
    expected.ct_eq(&received).into()
}

/// `sha256=<hex>` for `body` under `secret`, as GitHub computes it; for tests
/// and for tools that send test deliveries.
pub fn github_signature(secret: &str, body: &[u8]) -> String {
    let mut mac =
        HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC accepts keys of any length");
    mac.update(body);
    format!(
        "{GITHUB_PREFIX}{}",
        hex::encode(mac.finalize().into_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GitHub's documented example ("Validating webhook deliveries").
    const SECRET: &str = "It's a Secret to Everybody";
    const PAYLOAD: &[u8] = b"Hello, World!";
    const EXPECTED: &str =
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    fn secrets(values: &[&str]) -> Vec<String> {
        values.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn github_documented_vector() {
        assert_eq!(github_signature(SECRET, PAYLOAD), EXPECTED);
        assert_eq!(
            verify_github(&secrets(&[SECRET]), PAYLOAD, Some(EXPECTED)),
            Ok(())
        );
    }

    #[test]
    fn github_accepts_uppercase_hex_and_surrounding_space() {
        let upper = format!(
            "sha256={}",
            EXPECTED["sha256=".len()..].to_ascii_uppercase()
        );
        assert_eq!(
            verify_github(&secrets(&[SECRET]), PAYLOAD, Some(&upper)),
            Ok(())
        );
        let spaced = format!(" {EXPECTED} ");
        assert_eq!(
            verify_github(&secrets(&[SECRET]), PAYLOAD, Some(&spaced)),
            Ok(())
        );
    }

    #[test]
    fn github_rotation_accepts_any_configured_secret() {
        let both = secrets(&["the-old-secret", SECRET]);
        assert_eq!(verify_github(&both, PAYLOAD, Some(EXPECTED)), Ok(()));
        let old = github_signature("the-old-secret", PAYLOAD);
        assert_eq!(verify_github(&both, PAYLOAD, Some(&old)), Ok(()));
        // Once the old secret is removed its signatures stop working.
        assert_eq!(
            verify_github(&secrets(&[SECRET]), PAYLOAD, Some(&old)),
            Err(SignatureError::Mismatch {
                header: GITHUB_HEADER
            })
        );
    }

    #[test]
    fn github_rejects_wrong_missing_and_malformed_signatures() {
        let configured = secrets(&[SECRET]);
        let mismatch = Err(SignatureError::Mismatch {
            header: GITHUB_HEADER,
        });
        let malformed = Err(SignatureError::Malformed {
            header: GITHUB_HEADER,
        });
        // Another body, another secret.
        assert_eq!(
            verify_github(&configured, b"Hello, World?", Some(EXPECTED)),
            mismatch
        );
        let other = github_signature("another secret", PAYLOAD);
        assert_eq!(verify_github(&configured, PAYLOAD, Some(&other)), mismatch);
        // A truncated digest is not a prefix match.
        assert_eq!(
            verify_github(&configured, PAYLOAD, Some(&EXPECTED[..31])),
            mismatch
        );
        assert_eq!(
            verify_github(&configured, PAYLOAD, Some("sha256=")),
            mismatch
        );
        // The legacy SHA-1 header's format, no prefix, not hex.
        let sha1 = format!("sha1={}", &EXPECTED[7..47]);
        assert_eq!(verify_github(&configured, PAYLOAD, Some(&sha1)), malformed);
        assert_eq!(
            verify_github(&configured, PAYLOAD, Some(&EXPECTED[7..])),
            malformed
        );
        assert_eq!(
            verify_github(&configured, PAYLOAD, Some("sha256=xyz")),
            malformed
        );
        assert_eq!(
            verify_github(&configured, PAYLOAD, None),
            Err(SignatureError::Missing {
                header: GITHUB_HEADER
            })
        );
    }

    #[test]
    fn a_body_fed_in_chunks_verifies_as_a_whole() {
        let configured = secrets(&["the-old-secret", SECRET]);
        for split in 0..=PAYLOAD.len() {
            let mut verifier = GitHubVerifier::new(&configured, Some(EXPECTED)).unwrap();
            let (head, tail) = PAYLOAD.split_at(split);
            verifier.update(head);
            verifier.update(tail);
            assert_eq!(verifier.verify(), Ok(()), "split at {split}");
        }
        let mut short = GitHubVerifier::new(&configured, Some(EXPECTED)).unwrap();
        short.update(&PAYLOAD[..5]);
        assert!(short.verify().is_err());
    }

    #[test]
    fn the_header_is_judged_before_any_body() {
        assert_eq!(
            GitHubVerifier::new(&secrets(&[SECRET]), None).err(),
            Some(SignatureError::Missing {
                header: GITHUB_HEADER
            })
        );
        assert_eq!(
            GitHubVerifier::new(&secrets(&[SECRET]), Some("sha256=zz")).err(),
            Some(SignatureError::Malformed {
                header: GITHUB_HEADER
            })
        );
        assert_eq!(
            GitHubVerifier::new(&secrets(&[""]), Some(EXPECTED)).err(),
            Some(SignatureError::NotConfigured { provider: "GitHub" })
        );
    }

    #[test]
    fn empty_secrets_never_authenticate() {
        let unsigned = github_signature("", PAYLOAD);
        for configured in [secrets(&[]), secrets(&[""])] {
            assert_eq!(
                verify_github(&configured, PAYLOAD, Some(&unsigned)),
                Err(SignatureError::NotConfigured { provider: "GitHub" })
            );
            assert_eq!(
                verify_gitlab(&configured, Some("")),
                Err(SignatureError::NotConfigured { provider: "GitLab" })
            );
        }
    }

    #[test]
    fn gitlab_tokens_with_rotation() {
        let tokens = secrets(&["old-token", "new-token"]);
        assert_eq!(verify_gitlab(&tokens, Some("old-token")), Ok(()));
        assert_eq!(verify_gitlab(&tokens, Some("new-token")), Ok(()));
        let mismatch = Err(SignatureError::Mismatch {
            header: GITLAB_HEADER,
        });
        assert_eq!(verify_gitlab(&tokens, Some("new-toke")), mismatch);
        assert_eq!(verify_gitlab(&tokens, Some("new-token ")), mismatch);
        assert_eq!(verify_gitlab(&tokens, Some("")), mismatch);
        assert_eq!(
            verify_gitlab(&tokens, None),
            Err(SignatureError::Missing {
                header: GITLAB_HEADER
            })
        );
    }

    #[test]
    fn constant_time_eq_compares_contents_and_lengths() {
        assert!(constant_time_eq(b"token", b"token"));
        assert!(!constant_time_eq(b"token", b"tokem"));
        assert!(!constant_time_eq(b"token", b"token2"));
        assert!(!constant_time_eq(b"token", b""));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn messages_never_contain_the_secret_or_the_received_value() {
        let configured = secrets(&[SECRET]);
        let forged = "sha256=00112233";
        for err in [
            verify_github(&configured, PAYLOAD, Some(forged)).unwrap_err(),
            verify_github(&configured, PAYLOAD, Some("garbage")).unwrap_err(),
            verify_gitlab(&configured, Some("guess")).unwrap_err(),
        ] {
            let text = format!("{err} {err:?}");
            assert!(!text.contains(SECRET), "{text}");
            assert!(!text.contains("00112233"), "{text}");
            assert!(!text.contains("garbage"), "{text}");
            assert!(!text.contains("guess"), "{text}");
        }
    }
}
