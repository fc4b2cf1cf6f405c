//! The repository of one request as git, messages and the mirror key see it,
//! with the credentials that go with it and the secrets errors must not show.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::revision::Wanted;
use super::{Credentials, GitError};
use crate::source::repo_url::Location;

/// The repository of one request, in its three spellings.
pub(super) struct Remote {
    /// What git fetches from, so what its argv and the mirror's config hold:
    /// the URL as given (local paths made absolute) without secrets, i.e.
    /// without the user info of an http(s) URL or the password of another.
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
                let from_url = remote.user_and_password();
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
                if let Some((user, password)) = &from_url {
                    match password {
                        Some(password) => secrets.push(password.clone()),
                        None if http => secrets.push(user.clone()),
                        None => {}
                    }
                }
                // Over http(s) the user info is basic-auth credentials, sent
                // the way a credentialsSecret's are (a lone user name, often
                // a token, with an empty password, as curl sends it). A
                // credentialsSecret wins: the URL's user info is then dropped.
                let url_credentials = from_url
                    .filter(|_| http)
                    .filter(|(user, password)| !user.is_empty() || password.is_some())
                    .map(|(username, password)| Credentials {
                        username,
                        password: password.unwrap_or_default(),
                    });
                if let (true, Some(credentials)) = (http, credentials.or(url_credentials.as_ref()))
                {
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
                match remote.userinfo {
                    // Whatever git is given shows in /proc/<pid>/cmdline (of
                    // `remote add`, `remote set-url` and the remote helper)
                    // and in the mirror's config.
                    Some(_) if http => remote.with_userinfo(None),
                    Some(userinfo) if userinfo.contains(':') => {
                        // ssh has no use for a password in the URL; the user
                        // name is the account and stays.
                        let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
                        remote.with_userinfo(Some(user))
                    }
                    _ => url.to_owned(),
                }
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

    /// Who fetches: a digest of the credentials sent (empty without any),
    /// so that freshness is never shared between callers with different
    /// rights on the repository.
    pub(super) fn caller(&self) -> String {
        use sha2::{Digest, Sha256};
        match &self.auth {
            Some((key, value)) => hex::encode(Sha256::digest(format!("{key}\n{value}"))),
            None => String::new(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(username: &str, password: &str) -> String {
        format!(
            "Authorization: Basic {}",
            BASE64.encode(format!("{username}:{password}"))
        )
    }

    #[test]
    fn http_user_info_becomes_the_header_and_leaves_the_url() {
        for (url, username, password, git_url, header_key) in [
            (
                "https://bot:tok%40en@GitHub.com/org/repo.git",
                "bot",
                "tok@en",
                "https://GitHub.com/org/repo.git",
                "http.https://github.com/.extraHeader",
            ),
            (
                "http://ghp_token@127.0.0.1:8080/org/repo",
                "ghp_token",
                "",
                "http://127.0.0.1:8080/org/repo",
                "http.http://127.0.0.1:8080/.extraHeader",
            ),
        ] {
            let remote = Remote::new(url, None).unwrap();
            assert_eq!(remote.fetch_url, git_url, "{url}");
            assert_eq!(
                remote.auth,
                Some((header_key.to_owned(), basic(username, password))),
                "{url}"
            );
            let secret = if password.is_empty() {
                username
            } else {
                password
            };
            assert_eq!(remote.scrub(&format!("[{secret}]")), "[<redacted>]");
        }
    }

    #[test]
    fn callers_differ_by_their_credentials() {
        let anonymous = Remote::new("https://github.com/org/repo", None).unwrap();
        let bot = Remote::new("https://bot:one@github.com/org/repo", None).unwrap();
        let other = Remote::new("https://bot:two@github.com/org/repo", None).unwrap();
        assert_eq!(anonymous.caller(), "");
        assert_ne!(bot.caller(), anonymous.caller());
        assert_ne!(bot.caller(), other.caller());
        assert!(!bot.caller().contains("one"));
    }

    #[test]
    fn a_credentials_secret_wins_over_url_user_info() {
        let secret = Credentials {
            username: "bot".into(),
            password: "from-secret".into(),
        };
        let remote = Remote::new("https://me:from-url@github.com/org/repo", Some(&secret)).unwrap();
        assert_eq!(remote.fetch_url, "https://github.com/org/repo");
        let (_, header) = remote.auth.as_ref().unwrap();
        assert_eq!(header, &basic("bot", "from-secret"));
        assert_eq!(
            remote.scrub("from-url from-secret"),
            "<redacted> <redacted>"
        );
    }

    #[test]
    fn ssh_keeps_the_user_name_and_drops_a_password() {
        for (url, git_url) in [
            (
                "ssh://git@github.com/org/repo.git",
                "ssh://git@github.com/org/repo.git",
            ),
            ("git@github.com:org/repo.git", "git@github.com:org/repo.git"),
            (
                "ssh://git:hunter2@github.com:2222/org/repo",
                "ssh://git@github.com:2222/org/repo",
            ),
        ] {
            let remote = Remote::new(url, None).unwrap();
            assert_eq!(remote.fetch_url, git_url, "{url}");
            assert!(remote.auth.is_none(), "{url}");
            if url.contains("hunter2") {
                assert_eq!(remote.scrub("hunter2"), "<redacted>");
            }
        }
    }

    #[test]
    fn urls_without_secrets_reach_git_as_given() {
        for url in [
            "https://GitHub.com/Org/Repo.git",
            "http://[::1]:8080/org/repo",
            "git://example.com/org/repo",
        ] {
            let remote = Remote::new(url, None).unwrap();
            assert_eq!(remote.fetch_url, url);
            assert!(remote.auth.is_none(), "{url}");
        }
    }
}
