//! Repository URLs as git reads them, and the normalized key that two
//! spellings of one repository share: the Git source keys its mirrors by it,
//! and webhooks and commit statuses match repositories to Applications with it.

/// A repository URL, taken apart the way git reads it.
pub(crate) enum Location<'a> {
    Remote(RemoteUrl<'a>),
    /// An absolute local path.
    Local(String),
}

pub(crate) struct RemoteUrl<'a> {
    /// Lowercase; `None` for the scp-like `[user@]host:path`.
    pub(crate) scheme: Option<String>,
    pub(crate) userinfo: Option<&'a str>,
    /// Lowercase.
    pub(crate) host: String,
    pub(crate) port: Option<&'a str>,
    pub(crate) path: &'a str,
    /// The host and port as the URL spells them.
    host_port: &'a str,
}

impl RemoteUrl<'_> {
    pub(crate) fn authority(&self) -> String {
        match self.port {
            Some(port) => format!("{}:{port}", self.host),
            None => self.host.clone(),
        }
    }

    /// The user name and the password of the user info, percent-decoded as
    /// git decodes them.
    pub(crate) fn user_and_password(&self) -> Option<(String, Option<String>)> {
        let userinfo = self.userinfo?;
        Some(match userinfo.split_once(':') {
            Some((user, password)) => (percent_decode(user), Some(percent_decode(password))),
            None => (percent_decode(userinfo), None),
        })
    }

    /// The URL with `userinfo` in place of the user info it had (none when
    /// `None`); host, port and path as given.
    pub(crate) fn with_userinfo(&self, userinfo: Option<&str>) -> String {
        let userinfo = userinfo.map(|userinfo| format!("{userinfo}@"));
        let userinfo = userinfo.as_deref().unwrap_or("");
        match &self.scheme {
            Some(scheme) => format!("{scheme}://{userinfo}{}{}", self.host_port, self.path),
            None => format!("{userinfo}{}:{}", self.host_port, self.path),
        }
    }

    fn default_port(&self) -> bool {
        let default = match self.scheme.as_deref() {
            Some("http") => "80",
            Some("https") => "443",
            Some("git") => "9418",
            _ => "22",
        };
        self.port.is_none_or(|port| port == default)
    }
}

impl<'a> Location<'a> {
    pub(crate) fn parse(url: &'a str) -> Location<'a> {
        let url = url.trim();
        if let Some((scheme, rest)) = url.split_once("://")
            && !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        {
            let scheme = scheme.to_ascii_lowercase();
            if scheme == "file" {
                let path = rest.strip_prefix("localhost").unwrap_or(rest);
                return Location::Local(absolute(path));
            }
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let (userinfo, host_port) = match authority.rsplit_once('@') {
                Some((userinfo, host_port)) => (Some(userinfo), host_port),
                None => (None, authority),
            };
            let (host, port) = split_host_port(host_port);
            return Location::Remote(RemoteUrl {
                scheme: Some(scheme),
                userinfo,
                host: host.to_ascii_lowercase(),
                port,
                path,
                host_port,
            });
        }
        // Git's rule: a colon before any slash makes it scp-like ssh.
        if let Some(colon) = url.find(':')
            && url.find('/').is_none_or(|slash| colon < slash)
        {
            let (authority, path) = (&url[..colon], &url[colon + 1..]);
            let (userinfo, host) = match authority.rsplit_once('@') {
                Some((userinfo, host)) => (Some(userinfo), host),
                None => (None, authority),
            };
            let host_port = host;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            return Location::Remote(RemoteUrl {
                scheme: None,
                userinfo,
                host: host.to_ascii_lowercase(),
                port: None,
                path,
                host_port,
            });
        }
        Location::Local(absolute(url))
    }

    pub(crate) fn key(&self) -> String {
        match self {
            Location::Local(path) => format!("file://{}", trim_trailing_slashes(path)),
            Location::Remote(remote) => {
                let mut path = trim_trailing_slashes(remote.path.trim_start_matches('/'));
                path = path.strip_suffix(".git").unwrap_or(path);
                path = path.trim_end_matches('/');
                let host = if remote.default_port() {
                    remote.host.clone()
                } else {
                    remote.authority()
                };
                if path.is_empty() {
                    host
                } else {
                    format!("{host}/{path}")
                }
            }
        }
    }

    pub(crate) fn display(&self) -> String {
        match self {
            Location::Local(path) => format!("file://{path}"),
            Location::Remote(remote) => match &remote.scheme {
                Some(scheme) => format!("{scheme}://{}{}", remote.authority(), remote.path),
                None => format!("{}:{}", remote.host, remote.path),
            },
        }
    }
}

fn split_host_port(host_port: &str) -> (&str, Option<&str>) {
    if host_port.starts_with('[')
        && let Some(end) = host_port.find(']')
    {
        let port = host_port[end + 1..].strip_prefix(':');
        return (&host_port[..=end], port.filter(|p| !p.is_empty()));
    }
    match host_port.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => {
            (host, Some(port).filter(|p| !p.is_empty()))
        }
        _ => (host_port, None),
    }
}

/// `%XX` escapes decoded; anything else, a malformed escape included, kept.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = match bytes.get(at..at + 3) {
            Some([b'%', high, low]) if high.is_ascii_hexdigit() && low.is_ascii_hexdigit() => {
                hex::decode([*high, *low]).ok()
            }
            _ => None,
        };
        match escaped {
            Some(byte) => {
                decoded.extend_from_slice(&byte);
                at += 3;
            }
            None => {
                decoded.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

fn trim_trailing_slashes(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() && path.starts_with('/') {
        "/"
    } else {
        trimmed
    }
}

fn absolute(path: &str) -> String {
    std::path::absolute(path)
        .map(|path| path.to_string_lossy().into_owned())
        .unwrap_or_else(|_| path.to_owned())
}

/// The key two spellings of one repository share, also used to match a
/// webhook's repository to Applications: `github.com/org/repo` for
/// `https://github.com/org/repo.git`, `git@github.com:org/repo` and
/// `ssh://git@github.com/org/repo`; `file:///abs/path` for a local repository.
pub fn normalize_url(url: &str) -> String {
    Location::parse(url).key()
}

/// The URL as a person reads it: when its user info holds a secret (what
/// `Remote::new` scrubs: a password, or any user info over http(s), a
/// token) without it, as every error of the Git source shows it; otherwise
/// as written (`git@host:org/repo` keeps its user).
pub fn display_url(url: &str) -> String {
    let location = Location::parse(url);
    let secret = match &location {
        Location::Remote(remote) => remote.userinfo.is_some_and(|userinfo| {
            userinfo.contains(':') || matches!(remote.scheme.as_deref(), Some("http" | "https"))
        }),
        Location::Local(_) => false,
    };
    if secret {
        location.display()
    } else {
        url.trim().to_owned()
    }
}

/// `./apps/a/`, `/apps/a` and `apps//a` all mean `apps/a`; `None`, `""`,
/// `"."` and `"/"` mean the root, `""`.
pub fn normalize_path(path: Option<&str>) -> String {
    path.unwrap_or("")
        .split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_normalization() {
        for (url, expected) in [
            ("https://github.com/org/repo", "github.com/org/repo"),
            ("https://github.com/org/repo.git", "github.com/org/repo"),
            ("https://github.com/org/repo.git/", "github.com/org/repo"),
            ("https://github.com/org/repo/", "github.com/org/repo"),
            ("HTTPS://GitHub.COM/org/Repo", "github.com/org/Repo"),
            ("http://github.com/org/repo", "github.com/org/repo"),
            ("ssh://git@github.com/org/repo.git", "github.com/org/repo"),
            ("git@github.com:org/repo.git", "github.com/org/repo"),
            ("git@GitHub.com:org/repo", "github.com/org/repo"),
            ("github.com:org/repo", "github.com/org/repo"),
            (
                "https://user:secret@github.com/org/repo",
                "github.com/org/repo",
            ),
            ("https://token@github.com/org/repo", "github.com/org/repo"),
            ("https://github.com:443/org/repo", "github.com/org/repo"),
            ("http://github.com:80/org/repo", "github.com/org/repo"),
            ("ssh://git@github.com:22/org/repo", "github.com/org/repo"),
            ("git://github.com:9418/org/repo", "github.com/org/repo"),
            (
                "https://git.example.com:8443/org/repo",
                "git.example.com:8443/org/repo",
            ),
            (
                "ssh://git@git.example.com:2222/org/repo",
                "git.example.com:2222/org/repo",
            ),
            ("http://[::1]:8080/org/repo", "[::1]:8080/org/repo"),
            (
                "https://gitlab.com/group/sub/repo.git",
                "gitlab.com/group/sub/repo",
            ),
            ("  https://github.com/org/repo  ", "github.com/org/repo"),
            ("/tmp/x/origin.git", "file:///tmp/x/origin.git"),
            ("/tmp/x/origin.git/", "file:///tmp/x/origin.git"),
            ("file:///tmp/x/origin.git", "file:///tmp/x/origin.git"),
            ("file:///tmp/x/origin/", "file:///tmp/x/origin"),
            ("file://localhost/tmp/x/origin", "file:///tmp/x/origin"),
        ] {
            assert_eq!(normalize_url(url), expected, "{url}");
        }
        let relative = normalize_url("./repo");
        assert!(relative.starts_with("file:///"), "{relative}");
        assert!(relative.ends_with("/repo"), "{relative}");
    }

    #[test]
    fn path_normalization() {
        for (input, expected) in [
            (None, ""),
            (Some(""), ""),
            (Some("."), ""),
            (Some("/"), ""),
            (Some("./"), ""),
            (Some("apps/a"), "apps/a"),
            (Some("./apps/a/"), "apps/a"),
            (Some("/apps/a"), "apps/a"),
            (Some("apps//a"), "apps/a"),
            (Some("apps/./a/."), "apps/a"),
        ] {
            assert_eq!(normalize_path(input), expected, "{input:?}");
        }
    }

    #[test]
    fn user_info_is_percent_decoded_and_replaced() {
        let Location::Remote(remote) =
            Location::parse("https://b%6Ft:p%40ss%2fw%zz@Host.example:8443/a/b")
        else {
            panic!("not remote");
        };
        assert_eq!(
            remote.user_and_password(),
            Some(("bot".to_owned(), Some("p@ss/w%zz".to_owned())))
        );
        assert_eq!(remote.with_userinfo(None), "https://Host.example:8443/a/b");
        assert_eq!(
            remote.with_userinfo(Some("git")),
            "https://git@Host.example:8443/a/b"
        );
        let Location::Remote(scp) = Location::parse("git@[::1]:org/repo") else {
            panic!("not remote");
        };
        assert_eq!(scp.user_and_password(), Some(("git".to_owned(), None)));
        assert_eq!(scp.with_userinfo(Some("git")), "git@[::1]:org/repo");
    }
}
