//! The repository of one request as git, messages and the mirror key see it,
//! with the credentials that go with it and the secrets errors must not show.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::revision::Wanted;
use super::{Credentials, GitError};
use crate::source::repo_url::Location;

/// The repository of one request, in its three spellings.
pub(super) struct Remote {
    /// What git fetches from: the URL as given (local paths made absolute).
    pub(super) fetch_url: String,
    /// What messages show: user info removed.
    pub(super) display_url: String,
    /// The mirror key, [`normalize_url`](crate::source::repo_url::normalize_url).
    pub(super) key: String,
    /// `(config key, value)` of the `http.extraHeader` carrying credentials.
    pub(super) auth: Option<(String, String)>,
    /// Strings that must never appear in an error.
    secrets: Vec<String>,
}

impl Remote {
    pub(super) fn new(url: &str, credentials: Option<&Credentials>) -> Result<Remote, GitError> {
        let url = url.trim();
        let location = Location::parse(url);
        let display_url = location.display();
        let invalid = |reason| GitError::InvalidUrl {
            url: display_url.clone(),
            reason,
        };
        if url.is_empty() {
            return Err(invalid("it is empty"));
        }
        if url.starts_with('-') {
            return Err(invalid("it must not start with '-'"));
        }
        if url.chars().any(|c| c.is_ascii_control()) {
            return Err(invalid("it contains control characters"));
        }
        if is_remote_helper_syntax(url) {
            return Err(invalid("the <transport>::<address> syntax is not allowed"));
        }
        let mut secrets = Vec::new();
        let mut auth = None;
        let fetch_url = match &location {
            Location::Local(path)
                if !url
                    .get(..7)
                    .is_some_and(|scheme| scheme.eq_ignore_ascii_case("file://")) =>
            {
                path.clone()
            }
            Location::Local(_) => url.to_owned(),
            Location::Remote(remote) => {
                if let Some(scheme) = &remote.scheme
                    && !matches!(
                        scheme.as_str(),
                        "http" | "https" | "ssh" | "git" | "git+ssh" | "ssh+git"
                    )
                {
                    return Err(invalid("the scheme must be http, https, ssh, git or file"));
                }
                if remote.host.is_empty() {
                    return Err(invalid("it names no host"));
                }
                let http = matches!(remote.scheme.as_deref(), Some("http" | "https"));
                if let Some(userinfo) = remote.userinfo {
                    // Over http(s) a lone user name is usually a token; over
                    // ssh it is just the account (`git@`).
                    if http {
                        secrets.push(userinfo.to_owned());
                    }
                    if let Some((_, password)) = userinfo.split_once(':') {
                        secrets.push(password.to_owned());
                    }
                }
                if let (true, Some(credentials)) = (http, credentials) {
                    let token =
                        BASE64.encode(format!("{}:{}", credentials.username, credentials.password));
                    // Scoped to the host, so a redirect to another host does
                    // not carry the credentials along.
                    let key = format!(
                        "http.{}://{}/.extraHeader",
                        remote.scheme.as_deref().unwrap_or("https"),
                        remote.authority()
                    );
                    let value = format!("Authorization: Basic {token}");
                    secrets.extend([value.clone(), token, credentials.password.clone()]);
                    auth = Some((key, value));
                }
                url.to_owned()
            }
        };
        // Longest first: the header contains the token.
        secrets.retain(|secret| !secret.is_empty());
        secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
        Ok(Remote {
            key: location.key(),
            fetch_url,
            display_url,
            auth,
            secrets,
        })
    }

    pub(super) fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "<redacted>");
        }
        text
    }

    pub(super) fn fetch_failed(&self, stderr: String) -> GitError {
        GitError::Fetch {
            url: self.display_url.clone(),
            stderr,
        }
    }

    pub(super) fn revision_not_found(&self, wanted: &Wanted) -> GitError {
        GitError::RevisionNotFound {
            url: self.display_url.clone(),
            revision: wanted.to_string(),
        }
    }
}

/// `ext::sh -c …` and friends run arbitrary commands.
fn is_remote_helper_syntax(url: &str) -> bool {
    url.split_once("::").is_some_and(|(transport, _)| {
        !transport.is_empty()
            && transport
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    })
}
