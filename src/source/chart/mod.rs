//! Charts from Helm repositories and OCI registries (`spec.source.chart`):
//! which version a range picks (`index`), the repository's listing and the
//! archives, cached per repository and by digest (`cache`), the OCI
//! distribution API (`oci`), the unpacking of an archive for `helm template`
//! (`archive`), and the poller that follows new versions (`poll`).

pub mod archive;
pub mod cache;
pub mod http;
pub mod index;
pub mod oci;
pub mod poll;

use std::time::Duration;

pub use cache::{ChartSource, Resolved};
pub use http::Auth;

/// Where a chart comes from, parsed from `repoURL` and `chart`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Repository {
    /// A Helm repository: `<url>/index.yaml` lists its charts.
    Http { url: String },
    /// An OCI repository holding one chart: `<registry>/<name>`.
    Oci { registry: String, name: String },
}

impl Repository {
    pub fn parse(repo_url: &str, chart: &str) -> Result<Repository, ChartError> {
        let repo_url = repo_url.trim();
        let invalid = |message: &str| ChartError::InvalidSource(format!("{message}: {repo_url}"));
        if chart.is_empty() || chart.contains(['/', '\\']) && !repo_url.starts_with("oci://") {
            return Err(ChartError::InvalidSource(format!(
                "spec.source.chart {chart:?} is not a chart name"
            )));
        }
        if let Some(rest) = repo_url.strip_prefix("oci://") {
            let rest = rest.trim_end_matches('/');
            let (registry, path) = rest.split_once('/').unwrap_or((rest, ""));
            if registry.is_empty() || path.split('/').any(|s| s == ".." || s == ".") {
                return Err(invalid("not an oci://registry/path URL"));
            }
            let name = if path.is_empty() {
                chart.to_string()
            } else {
                format!("{path}/{chart}")
            };
            return Ok(Repository::Oci {
                registry: registry.to_string(),
                name,
            });
        }
        if repo_url.starts_with("http://") || repo_url.starts_with("https://") {
            if repo_url.contains('@') {
                return Err(invalid(
                    "a chart repository URL carries no credentials (use credentialsSecret)",
                ));
            }
            return Ok(Repository::Http {
                url: repo_url.trim_end_matches('/').to_string(),
            });
        }
        Err(invalid(
            "a chart's repoURL is an http(s):// Helm repository or an oci:// registry",
        ))
    }

    /// One cache and one poll per key.
    pub fn key(&self) -> String {
        match self {
            Repository::Http { url } => url.clone(),
            Repository::Oci { registry, name } => format!("oci://{registry}/{name}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    #[error("{0}")]
    InvalidSource(String),
    #[error("chart repository {url} is unreachable: {message}")]
    Unreachable { url: String, message: String },
    #[error("chart repository {url} answered HTTP {status}{}", if message.is_empty() { String::new() } else { format!(": {message}") })]
    Status {
        url: String,
        status: u16,
        message: String,
    },
    #[error("chart {chart} is not in {repository}")]
    ChartNotFound { repository: String, chart: String },
    #[error(
        "no version of chart {chart} in {repository} matches {range:?} (versions: {available})"
    )]
    VersionNotFound {
        repository: String,
        chart: String,
        range: String,
        available: String,
    },
    #[error(
        "chart {chart} {version} from {url}: digest mismatch: expected sha256:{expected}, got sha256:{actual}"
    )]
    DigestMismatch {
        chart: String,
        version: String,
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{what} from {url} is larger than {limit} bytes")]
    TooLarge {
        what: &'static str,
        url: String,
        limit: usize,
    },
    #[error("invalid {what} from {url}: {message}")]
    InvalidResponse {
        what: &'static str,
        url: String,
        message: String,
    },
    #[error("chart {chart} {version} is not a valid chart archive: {message}")]
    InvalidArchive {
        chart: String,
        version: String,
        message: String,
    },
    #[error("failed to write the chart cache: {0}")]
    Cache(std::io::Error),
}

impl ChartError {
    /// Worth retrying with backoff: the next attempt may succeed with no
    /// change to the Application (a repository back up, a download no
    /// longer corrupted).
    pub fn is_transient(&self) -> bool {
        match self {
            ChartError::Unreachable { .. }
            | ChartError::DigestMismatch { .. }
            | ChartError::Cache(_) => true,
            ChartError::Status { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            ChartError::InvalidSource(_) => "InvalidSource",
            ChartError::Unreachable { .. } => "ChartRepositoryUnreachable",
            ChartError::Status {
                status: 401 | 403, ..
            } => "ChartRepositoryUnauthorized",
            ChartError::Status { .. } => "ChartRepositoryError",
            ChartError::ChartNotFound { .. } => "ChartNotFound",
            ChartError::VersionNotFound { .. } => "ChartVersionNotFound",
            ChartError::DigestMismatch { .. } => "ChartDigestMismatch",
            ChartError::TooLarge { .. } => "ChartTooLarge",
            ChartError::InvalidResponse { .. } => "ChartRepositoryError",
            ChartError::InvalidArchive { .. } => "InvalidChart",
            ChartError::Cache(_) => "FetchFailed",
        }
    }
}

/// How the chart sources fetch. From the environment:
/// `SETPOINT_CHART_POLL_INTERVAL` (default 5m; a listing younger than this
/// is reused), `SETPOINT_CHART_TIMEOUT` (per request, default 30s),
/// `SETPOINT_CHART_MAX_INDEX_BYTES` (default 64 MiB),
/// `SETPOINT_CHART_MAX_ARCHIVE_BYTES` (default 32 MiB, and what it may
/// unpack to, twice that), `SETPOINT_CHART_INSECURE_REGISTRIES` (comma-
/// separated `host:port` of OCI registries spoken to over plain HTTP, as
/// `helm push --plain-http`).
#[derive(Clone, Debug)]
pub struct ChartSettings {
    pub poll_interval: Duration,
    pub timeout: Duration,
    pub max_index_bytes: usize,
    pub max_archive_bytes: usize,
    pub unpack: archive::UnpackLimits,
    pub insecure_registries: Vec<String>,
}

impl Default for ChartSettings {
    fn default() -> Self {
        ChartSettings {
            poll_interval: Duration::from_secs(300),
            timeout: Duration::from_secs(30),
            max_index_bytes: 64 * 1024 * 1024,
            max_archive_bytes: 32 * 1024 * 1024,
            unpack: archive::UnpackLimits::default(),
            insecure_registries: vec![],
        }
    }
}

impl ChartSettings {
    pub fn from_env() -> Self {
        let mut settings = ChartSettings::default();
        let duration = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|t| crate::serve::parse_duration(&t).ok())
        };
        let number = |name: &str| -> Option<usize> {
            std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
        };
        if let Some(interval) = duration("SETPOINT_CHART_POLL_INTERVAL") {
            settings.poll_interval = interval;
        }
        if let Some(timeout) = duration("SETPOINT_CHART_TIMEOUT") {
            settings.timeout = timeout;
        }
        if let Some(max) = number("SETPOINT_CHART_MAX_INDEX_BYTES") {
            settings.max_index_bytes = max;
        }
        if let Some(max) = number("SETPOINT_CHART_MAX_ARCHIVE_BYTES") {
            settings.max_archive_bytes = max;
            settings.unpack.max_bytes = 2 * max as u64;
        }
        if let Ok(hosts) = std::env::var("SETPOINT_CHART_INSECURE_REGISTRIES") {
            settings.insecure_registries = hosts
                .split(',')
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect();
        }
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_parse_from_the_url_and_the_chart() {
        assert_eq!(
            Repository::parse("https://charts.example.com/stable/", "web").unwrap(),
            Repository::Http {
                url: "https://charts.example.com/stable".into()
            }
        );
        let oci = Repository::parse("oci://127.0.0.1:5000/charts", "web").unwrap();
        assert_eq!(
            oci,
            Repository::Oci {
                registry: "127.0.0.1:5000".into(),
                name: "charts/web".into()
            }
        );
        assert_eq!(oci.key(), "oci://127.0.0.1:5000/charts/web");
        for (url, chart) in [
            ("git@github.com:a/b", "web"),
            ("https://u:p@h/charts", "web"),
            ("https://h/charts", ""),
            ("https://h/charts", "../web"),
            ("oci://h/../x", "web"),
        ] {
            let error = Repository::parse(url, chart).unwrap_err();
            assert_eq!(error.reason(), "InvalidSource", "{url} {chart}");
        }
    }

    #[test]
    fn each_failure_has_its_reason_and_retry() {
        let unreachable = ChartError::Unreachable {
            url: "u".into(),
            message: "refused".into(),
        };
        assert_eq!(unreachable.reason(), "ChartRepositoryUnreachable");
        assert!(unreachable.is_transient());
        let missing = ChartError::VersionNotFound {
            repository: "r".into(),
            chart: "c".into(),
            range: "9.x".into(),
            available: "1.0.0".into(),
        };
        assert_eq!(missing.reason(), "ChartVersionNotFound");
        assert!(!missing.is_transient());
        let status = |status| ChartError::Status {
            url: "u".into(),
            status,
            message: String::new(),
        };
        assert!(status(503).is_transient());
        assert!(!status(404).is_transient());
        assert_eq!(status(401).reason(), "ChartRepositoryUnauthorized");
    }
}
