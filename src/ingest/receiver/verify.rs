//! Who may call a Receiver, per type, as Flux checks it (pure): the address
//! itself (its digest covers the token) for `generic`, `dockerhub` and
//! `quay`; Harbor's `Authorization` header equal to the token; GitHub's
//! `X-Hub-Signature-256`; `X-Signature: <sha1|sha224|sha256|sha384|sha512>=<hex>`
//! for `generic-hmac`. The headers are judged before the body is read;
//! every comparison runs in constant time (`webhook::signature`).

use hmac::{Hmac, Mac};

use super::Kind;
use crate::ingest::webhook::signature::{self, GITHUB_HEADER, SignatureError};

/// Harbor's header: the token itself.
pub const HARBOR_HEADER: &str = "Authorization";
/// generic-hmac's header.
pub const HMAC_HEADER: &str = "X-Signature";

/// The request's headers a check reads.
#[derive(Clone, Copy, Debug, Default)]
pub struct Headers<'a> {
    pub authorization: Option<&'a str>,
    pub github_signature: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// One of the digests `X-Signature` may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Algorithm {
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

/// `algo=hex`, parsed; `Malformed` otherwise.
fn parse_signature(header: Option<&str>) -> Result<(Algorithm, Vec<u8>), SignatureError> {
    let header = header.ok_or(SignatureError::Missing {
        header: HMAC_HEADER,
    })?;
    let malformed = || SignatureError::Malformed {
        header: HMAC_HEADER,
    };
    let (algorithm, hex_digest) = header.trim().split_once('=').ok_or_else(malformed)?;
    let algorithm = match algorithm.to_ascii_lowercase().as_str() {
        "sha1" => Algorithm::Sha1,
        "sha224" => Algorithm::Sha224,
        "sha256" => Algorithm::Sha256,
        "sha384" => Algorithm::Sha384,
        "sha512" => Algorithm::Sha512,
        _ => return Err(malformed()),
    };
    let digest = hex::decode(hex_digest).map_err(|_| malformed())?;
    Ok((algorithm, digest))
}

/// The checks a request's headers allow before its body is read: Harbor's
/// token in full, and that a signature header is there and well formed.
pub fn check_head(kind: Kind, token: &str, headers: &Headers<'_>) -> Result<(), SignatureError> {
    match kind {
        Kind::Harbor => {
            let received = headers.authorization.ok_or(SignatureError::Missing {
                header: HARBOR_HEADER,
            })?;
            if signature::constant_time_eq(token.as_bytes(), received.as_bytes()) {
                Ok(())
            } else {
                Err(SignatureError::Mismatch {
                    header: HARBOR_HEADER,
                })
            }
        }
        Kind::GitHubPackages => {
            signature::GitHubVerifier::new(&[token.to_string()], headers.github_signature).map(drop)
        }
        Kind::GenericHmac => parse_signature(headers.signature).map(drop),
        Kind::Generic | Kind::DockerHub | Kind::Quay => Ok(()),
    }
}

/// The signature of the whole body, for the types that sign it.
pub fn check_body(
    kind: Kind,
    token: &str,
    headers: &Headers<'_>,
    body: &[u8],
) -> Result<(), SignatureError> {
    match kind {
        Kind::GitHubPackages => {
            signature::verify_github(&[token.to_string()], body, headers.github_signature)
        }
        Kind::GenericHmac => {
            let (algorithm, digest) = parse_signature(headers.signature)?;
            let key = token.as_bytes();
            // `verify_slice` compares in constant time and refuses a digest
            // of another length.
            let matched = match algorithm {
                Algorithm::Sha1 => mac_matches!(sha1::Sha1, key, body, &digest),
                Algorithm::Sha224 => mac_matches!(sha2::Sha224, key, body, &digest),
                Algorithm::Sha256 => mac_matches!(sha2::Sha256, key, body, &digest),
                Algorithm::Sha384 => mac_matches!(sha2::Sha384, key, body, &digest),
                Algorithm::Sha512 => mac_matches!(sha2::Sha512, key, body, &digest),
            };
            if matched {
                Ok(())
            } else {
                Err(SignatureError::Mismatch {
                    header: HMAC_HEADER,
                })
            }
        }
        Kind::Harbor | Kind::Generic | Kind::DockerHub | Kind::Quay => Ok(()),
    }
}

/// Whether `digest` is the HMAC of `body` under `key` with hash `$hash`.
macro_rules! mac_matches {
    ($hash:ty, $key:expr, $body:expr, $digest:expr) => {{
        let mut mac =
            <Hmac<$hash> as Mac>::new_from_slice($key).expect("HMAC accepts keys of any length");
        mac.update($body);
        mac.verify_slice($digest).is_ok()
    }};
}
use mac_matches;

/// `sha256=<hex>` of `body` under `token`, as a generic-hmac caller sends it.
pub fn hmac_signature(token: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(token.as_bytes())
        .expect("HMAC accepts keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The GitHub header's name, for the handler.
pub const GITHUB_SIGNATURE_HEADER: &str = GITHUB_HEADER;

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "s3cr3t-token";
    const BODY: &[u8] = br#"{"hello":"world"}"#;

    #[test]
    fn harbor_compares_the_authorization_header_with_the_token() {
        let ok = Headers {
            authorization: Some(TOKEN),
            ..Default::default()
        };
        assert_eq!(check_head(Kind::Harbor, TOKEN, &ok), Ok(()));
        let wrong = Headers {
            authorization: Some("nope"),
            ..Default::default()
        };
        assert_eq!(
            check_head(Kind::Harbor, TOKEN, &wrong),
            Err(SignatureError::Mismatch {
                header: HARBOR_HEADER
            })
        );
        assert_eq!(
            check_head(Kind::Harbor, TOKEN, &Headers::default()),
            Err(SignatureError::Missing {
                header: HARBOR_HEADER
            })
        );
    }

    #[test]
    fn generic_hmac_verifies_each_documented_digest() {
        let sha256 = hmac_signature(TOKEN, BODY);
        let headers = Headers {
            signature: Some(&sha256),
            ..Default::default()
        };
        assert_eq!(check_head(Kind::GenericHmac, TOKEN, &headers), Ok(()));
        assert_eq!(check_body(Kind::GenericHmac, TOKEN, &headers, BODY), Ok(()));
        assert_eq!(
            check_body(Kind::GenericHmac, TOKEN, &headers, b"{}"),
            Err(SignatureError::Mismatch {
                header: HMAC_HEADER
            })
        );
        assert_eq!(
            check_body(Kind::GenericHmac, "other", &headers, BODY),
            Err(SignatureError::Mismatch {
                header: HMAC_HEADER
            })
        );
        // sha1, as Flux's examples send it.
        let mut mac = <Hmac<sha1::Sha1> as Mac>::new_from_slice(TOKEN.as_bytes()).unwrap();
        mac.update(BODY);
        let sha1 = format!("sha1={}", hex::encode(mac.finalize().into_bytes()));
        let headers = Headers {
            signature: Some(&sha1),
            ..Default::default()
        };
        assert_eq!(check_body(Kind::GenericHmac, TOKEN, &headers, BODY), Ok(()));
        for bad in ["sha256", "md5=00", "sha256=zz", ""] {
            let headers = Headers {
                signature: Some(bad),
                ..Default::default()
            };
            assert_eq!(
                check_head(Kind::GenericHmac, TOKEN, &headers),
                Err(SignatureError::Malformed {
                    header: HMAC_HEADER
                }),
                "{bad:?}"
            );
        }
        assert_eq!(
            check_head(Kind::GenericHmac, TOKEN, &Headers::default()),
            Err(SignatureError::Missing {
                header: HMAC_HEADER
            })
        );
    }

    #[test]
    fn github_packages_are_signed_as_github_signs_deliveries() {
        let signed = signature::github_signature(TOKEN, BODY);
        let headers = Headers {
            github_signature: Some(&signed),
            ..Default::default()
        };
        assert_eq!(check_head(Kind::GitHubPackages, TOKEN, &headers), Ok(()));
        assert_eq!(
            check_body(Kind::GitHubPackages, TOKEN, &headers, BODY),
            Ok(())
        );
        assert!(check_body(Kind::GitHubPackages, TOKEN, &headers, b"x").is_err());
        assert!(check_head(Kind::GitHubPackages, TOKEN, &Headers::default()).is_err());
    }

    #[test]
    fn the_address_is_the_check_of_the_other_types() {
        for kind in [Kind::Generic, Kind::DockerHub, Kind::Quay] {
            assert_eq!(check_head(kind, TOKEN, &Headers::default()), Ok(()));
            assert_eq!(check_body(kind, TOKEN, &Headers::default(), BODY), Ok(()));
        }
    }
}
