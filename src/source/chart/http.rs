//! The chart sources' HTTP client: hyper with the rustls connector (ring,
//! the system's roots), GET only, a deadline per request, a size limit on
//! every body, redirects followed a few times (credentials dropped when the
//! host changes).

use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue, LOCATION, USER_AGENT};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

const MAX_REDIRECTS: usize = 5;

/// How a repository is authenticated.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Auth {
    Basic { username: String, password: String },
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Auth::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

impl Auth {
    pub fn header(&self) -> String {
        use base64::Engine;
        match self {
            Auth::Basic { username, password } => format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            ),
            Auth::Bearer(token) => format!("Bearer {token}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("invalid URL: {0}")]
    InvalidUrl(String),
    #[error("{0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("more than {MAX_REDIRECTS} redirects")]
    Redirects,
}

pub struct Response {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// The URL that answered (after redirects).
    pub url: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// The https-or-http connector of Setpoint's own HTTP clients (chart
/// sources, notifications): rustls with ring and the system's roots; without
/// roots, a warning naming `what` and https that fails.
pub(crate) fn https_connector(what: &str) -> HttpsConnector<HttpConnector> {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match builder.with_provider_and_native_roots(provider.clone()) {
        Ok(builder) => builder,
        Err(error) => {
            tracing::warn!(%error, "no system TLS roots: https {what} will fail");
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
    };
    builder.https_or_http().enable_http1().build()
}

#[derive(Clone)]
pub struct Http {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    timeout: Duration,
}

impl Http {
    pub fn new(timeout: Duration) -> Self {
        let connector = https_connector("chart repositories");
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Http { client, timeout }
    }

    /// GET `url` with `headers`, the body read up to `limit` bytes. Any
    /// status is an answer; only transport failures are errors.
    pub async fn get(
        &self,
        url: &str,
        headers: &[(HeaderName, String)],
        auth: Option<&Auth>,
        limit: usize,
    ) -> Result<Response, HttpError> {
        let deadline = self.timeout;
        tokio::time::timeout(deadline, self.get_following(url, headers, auth, limit))
            .await
            .map_err(|_| HttpError::TimedOut(deadline))?
    }

    async fn get_following(
        &self,
        url: &str,
        headers: &[(HeaderName, String)],
        auth: Option<&Auth>,
        limit: usize,
    ) -> Result<Response, HttpError> {
        let mut url = url.to_string();
        let first_host = authority(&url);
        for _ in 0..=MAX_REDIRECTS {
            let uri: http::Uri = url
                .parse()
                .map_err(|e: http::uri::InvalidUri| HttpError::InvalidUrl(e.to_string()))?;
            let mut request = Request::get(uri.clone()).header(USER_AGENT, "setpoint");
            for (name, value) in headers {
                request = request.header(name, value);
            }
            if let Some(auth) = auth
                && authority(&url) == first_host
            {
                let value = HeaderValue::from_str(&auth.header())
                    .map_err(|e| HttpError::InvalidUrl(e.to_string()))?;
                request = request.header(AUTHORIZATION, value);
            }
            let request = request
                .body(Empty::new())
                .map_err(|e| HttpError::InvalidUrl(e.to_string()))?;
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| HttpError::Connect(error_chain(&e)))?;
            let status = response.status();
            if status.is_redirection()
                && let Some(location) = response.headers().get(LOCATION)
            {
                let location = location.to_str().unwrap_or_default();
                url = join_location(&url, location);
                continue;
            }
            let headers = response.headers().clone();
            let body = Limited::new(response.into_body(), limit)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        HttpError::TooLarge(limit)
                    } else {
                        HttpError::Connect(e.to_string())
                    }
                })?
                .to_bytes();
            return Ok(Response {
                status,
                headers,
                body,
                url,
            });
        }
        Err(HttpError::Redirects)
    }
}

fn authority(url: &str) -> String {
    url.split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default()
        .to_string()
}

/// A `Location` against the URL that sent it.
fn join_location(base: &str, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    let host = rest.split('/').next().unwrap_or_default();
    if let Some(path) = location.strip_prefix('/') {
        return format!("{scheme}://{host}/{path}");
    }
    let dir = base.rsplit_once('/').map(|(d, _)| d).unwrap_or(base);
    format!("{dir}/{location}")
}

/// An error with its sources, as one line ("connection refused" is deep).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve_against_the_url_that_sent_them() {
        let base = "https://h:8/charts/index.yaml";
        assert_eq!(join_location(base, "https://cdn/x"), "https://cdn/x");
        assert_eq!(join_location(base, "/other/y"), "https://h:8/other/y");
        assert_eq!(join_location(base, "z.tgz"), "https://h:8/charts/z.tgz");
    }

    #[test]
    fn credentials_never_print() {
        let auth = Auth::Basic {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{auth:?}").contains("hunter2"));
        assert_eq!(auth.header(), "Basic dTpodW50ZXIy");
        assert!(!format!("{:?}", Auth::Bearer("t0k".into())).contains("t0k"));
    }
}
