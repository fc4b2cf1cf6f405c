//! POSTs to Providers: hyper with the rustls connector (ring, the system's
//! roots), as the chart sources' client (`source/chart/http.rs`), but with
//! a body; a deadline per request, no redirects (a webhook that redirects
//! would be handed the body again elsewhere), a small limit on the answer
//! read. Errors never carry the URL: a Slack or Discord webhook URL is a
//! secret.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, USER_AGENT};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// The part of an answer kept (for an error message).
const ANSWER_LIMIT: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum PostError {
    #[error("the address is not an http(s) URL")]
    InvalidUrl,
    #[error("invalid header {0}")]
    InvalidHeader(String),
    #[error("failed to connect: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// What a Provider answered.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

#[derive(Clone)]
pub struct Poster {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Default for Poster {
    fn default() -> Self {
        Self::new()
    }
}

impl Poster {
    pub fn new() -> Self {
        let connector = crate::source::chart::http::https_connector("providers");
        Poster {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    /// POSTs `body` as JSON to `url` with `headers`, within `timeout`. Any
    /// status is an answer; only transport failures are errors.
    pub async fn post(
        &self,
        url: &str,
        headers: &[(String, String)],
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Answer, PostError> {
        let uri: http::Uri = url.trim().parse().map_err(|_| PostError::InvalidUrl)?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(PostError::InvalidUrl);
        }
        let mut request = Request::post(uri)
            .header(USER_AGENT, "setpoint")
            .header(CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| PostError::InvalidHeader(name.clone()))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| PostError::InvalidHeader(name.to_string()))?;
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| PostError::InvalidUrl)?;
        let call = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| PostError::Connect(scrubbed_cause(&e)))?;
            let status = response.status();
            // The answer is read only so far: a body past the limit is
            // cut, not an error.
            let body = match Limited::new(response.into_body(), ANSWER_LIMIT)
                .collect()
                .await
            {
                Ok(collected) => collected.to_bytes(),
                Err(_) => Bytes::new(),
            };
            Ok(Answer { status, body })
        };
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| PostError::TimedOut(timeout))?
    }
}

/// The causes of a transport error, without the URL hyper may put in
/// them (the innermost causes name the socket error).
fn scrubbed_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut causes = Vec::new();
    let mut source = error.source();
    while let Some(cause) = source {
        causes.push(cause.to_string());
        source = cause.source();
    }
    let text = if causes.is_empty() {
        error.to_string()
    } else {
        causes.join(": ")
    };
    // A URL among them loses all but its scheme.
    text.split(' ')
        .map(|word| match word.split_once("://") {
            Some((scheme, _)) => format!("{scheme}://…"),
            None => word.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_connection_is_an_error_that_names_no_url() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = format!("http://127.0.0.1:{port}/services/T000/B000/XXXXSECRET");
        let error = Poster::new()
            .post(&url, &[], b"{}".to_vec(), Duration::from_secs(5))
            .await
            .unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("failed to connect"), "{text}");
        assert!(!text.contains("XXXXSECRET"), "{text}");
        assert!(matches!(
            Poster::new()
                .post("ftp://x/y", &[], vec![], Duration::from_secs(1))
                .await,
            Err(PostError::InvalidUrl)
        ));
    }
}
