//! What a chart repository offers, and which version an Application gets
//! (pure). A Helm repository's `index.yaml` lists every chart with its
//! versions, archive URLs and digests; an OCI repository's tags are the
//! versions of its one chart (`+` written `_`, as Helm pushes them). The
//! range is Helm's (Masterminds) syntax read with the `semver` crate:
//! comparators separated by spaces or commas all apply, `||` separates
//! alternatives, a bare version is exact, and a prerelease matches only
//! when the range names one.

use std::collections::BTreeMap;

use semver::{Version, VersionReq};
use serde::Deserialize;

/// The versions of the charts of one repository.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Listing {
    #[serde(default)]
    pub entries: BTreeMap<String, Vec<Entry>>,
}

/// One version of one chart.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Entry {
    pub version: String,
    /// `sha256` of the archive (hex), when the index gives it.
    #[serde(default)]
    pub digest: Option<String>,
    /// Where the archive is: absolute, or relative to the repository URL.
    #[serde(default)]
    pub urls: Vec<String>,
}

impl Listing {
    /// A Helm repository's `index.yaml`.
    pub fn parse_index(text: &[u8]) -> Result<Listing, String> {
        serde_yaml::from_slice(text).map_err(|e| e.to_string())
    }

    /// An OCI repository's tags: the versions of `chart`.
    pub fn from_tags(chart: &str, tags: &[String]) -> Listing {
        let entries = tags
            .iter()
            .map(|tag| Entry {
                version: tag.replace('_', "+"),
                ..Default::default()
            })
            .collect();
        Listing {
            entries: BTreeMap::from([(chart.to_string(), entries)]),
        }
    }
}

/// A range that does not parse.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid version range {range:?}: {message}")]
pub struct RangeError {
    pub range: String,
    pub message: String,
}

/// Helm's range syntax as alternatives of `semver` requirements.
pub fn parse_range(range: &str) -> Result<Vec<VersionReq>, RangeError> {
    let fail = |message: String| RangeError {
        range: range.to_string(),
        message,
    };
    let range = range.trim();
    if range.is_empty() || range == "latest" {
        return Ok(vec![VersionReq::STAR]);
    }
    let mut alternatives = Vec::new();
    for alternative in range.split("||") {
        let mut comparators: Vec<String> = Vec::new();
        let mut pending_operator = String::new();
        for token in alternative
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|t| !t.is_empty())
        {
            if token.chars().all(|c| "<>=~^!".contains(c)) {
                pending_operator.push_str(token);
                continue;
            }
            let token = format!("{pending_operator}{token}");
            pending_operator.clear();
            let token = token.replacen("=v", "=", 1).replacen("^v", "^", 1);
            let token = token.strip_prefix('v').unwrap_or(&token).to_string();
            // A bare version is exact, as in Helm; a wildcard stays one.
            let bare = token.starts_with(|c: char| c.is_ascii_digit());
            let wildcard = token.contains(['x', 'X', '*']);
            comparators.push(if bare && !wildcard {
                format!("={token}")
            } else {
                token
            });
        }
        if !pending_operator.is_empty() {
            return Err(fail(format!(
                "{pending_operator:?} is not followed by a version"
            )));
        }
        if comparators.is_empty() {
            return Err(fail("an empty alternative".into()));
        }
        let requirement =
            VersionReq::parse(&comparators.join(", ")).map_err(|e| fail(e.to_string()))?;
        alternatives.push(requirement);
    }
    Ok(alternatives)
}

/// The newest of `versions` that `range` accepts (versions that are not
/// semver are never chosen).
pub fn choose<'a>(
    versions: impl IntoIterator<Item = &'a str>,
    range: &[VersionReq],
) -> Option<&'a str> {
    versions
        .into_iter()
        .filter_map(|text| {
            let version = Version::parse(text.strip_prefix('v').unwrap_or(text)).ok()?;
            range
                .iter()
                .any(|req| req.matches(&version))
                .then_some((version, text))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, text)| text)
}

/// The archive URL of `entry`, resolved against the repository's URL.
pub fn archive_url(repository: &str, entry: &Entry) -> Option<String> {
    let url = entry.urls.first()?;
    if url.contains("://") {
        return Some(url.clone());
    }
    let base = repository.trim_end_matches('/');
    Some(match url.strip_prefix('/') {
        // Absolute path: on the repository's host.
        Some(path) => {
            let (scheme, rest) = base.split_once("://")?;
            let host = rest.split('/').next()?;
            format!("{scheme}://{host}/{path}")
        }
        None => format!("{base}/{url}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VERSIONS: [&str; 7] = [
        "0.9.0",
        "1.0.0",
        "1.1.0",
        "1.2.0-rc.1",
        "2.0.0",
        "not-semver",
        "v1.0.5",
    ];

    fn pick(range: &str) -> Option<&'static str> {
        choose(VERSIONS, &parse_range(range).unwrap())
    }

    #[test]
    fn the_newest_matching_version_wins() {
        assert_eq!(pick("1.x"), Some("1.1.0"));
        assert_eq!(pick("1.*"), Some("1.1.0"));
        assert_eq!(pick(">=1.0.1 <2"), Some("1.1.0"));
        assert_eq!(pick(">= 1.0.1, < 2"), Some("1.1.0"));
        assert_eq!(pick("*"), Some("2.0.0"));
        assert_eq!(pick(""), Some("2.0.0"));
        assert_eq!(pick("~1.0"), Some("v1.0.5"));
        assert_eq!(pick("^0.9"), Some("0.9.0"));
        assert_eq!(pick("<1 || >=2"), Some("2.0.0"));
        assert_eq!(pick("3.x"), None);
    }

    #[test]
    fn a_bare_version_is_exact() {
        assert_eq!(pick("1.0.0"), Some("1.0.0"));
        assert_eq!(pick("v1.0.0"), Some("1.0.0"));
        assert_eq!(pick("=1.0.0"), Some("1.0.0"));
        assert_eq!(pick("1.0.1"), None);
    }

    #[test]
    fn prereleases_only_when_the_range_names_one() {
        assert_eq!(pick(">=1.1.0 <2"), Some("1.1.0"));
        assert_eq!(pick("1.2.0-rc.1"), Some("1.2.0-rc.1"));
        assert_eq!(pick(">=1.2.0-rc.0 <2"), Some("1.2.0-rc.1"));
    }

    #[test]
    fn an_invalid_range_says_why() {
        let error = parse_range(">=").unwrap_err();
        assert!(
            error.to_string().contains("not followed by a version"),
            "{error}"
        );
        assert!(parse_range("one.two").is_err());
        assert!(parse_range("1.x ||").is_err());
    }

    #[test]
    fn an_index_parses_and_urls_resolve() {
        let index = br#"
apiVersion: v1
entries:
  web:
    - version: 1.0.0
      digest: abc
      urls: [web-1.0.0.tgz]
    - version: 1.1.0
      urls: ["https://cdn.example.com/web-1.1.0.tgz"]
generated: "2026-01-01T00:00:00Z"
"#;
        let listing = Listing::parse_index(index).unwrap();
        let web = &listing.entries["web"];
        assert_eq!(web[0].digest.as_deref(), Some("abc"));
        assert_eq!(
            archive_url("http://h:1/charts/", &web[0]).unwrap(),
            "http://h:1/charts/web-1.0.0.tgz"
        );
        assert_eq!(
            archive_url("http://h:1/charts", &web[1]).unwrap(),
            "https://cdn.example.com/web-1.1.0.tgz"
        );
        let absolute = Entry {
            urls: vec!["/dl/web.tgz".into()],
            ..Default::default()
        };
        assert_eq!(
            archive_url("https://h/charts", &absolute).unwrap(),
            "https://h/dl/web.tgz"
        );
        assert!(Listing::parse_index(b"entries: [").is_err());
    }

    #[test]
    fn oci_tags_are_versions_with_plus_written_underscore() {
        let listing = Listing::from_tags("web", &["1.0.0".into(), "1.0.0_build.1".into()]);
        let versions: Vec<&str> = listing.entries["web"]
            .iter()
            .map(|e| e.version.as_str())
            .collect();
        assert_eq!(versions, ["1.0.0", "1.0.0+build.1"]);
    }
}
