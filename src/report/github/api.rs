//! The REST calls: requests through octocrab's raw API, the answers' status
//! and headers (rate limits, `Link` pagination), and the retry decision.

use super::*;

/// The `rel="next"` target of a `Link` header: `<url>; rel="next", …`.
pub(super) fn next_link(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(LINK)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|link| {
            let (target, params) = link.trim().strip_prefix('<')?.split_once('>')?;
            let next = params.split(';').any(|param| {
                let Some((name, value)) = param.split_once('=') else {
                    return false;
                };
                name.trim().eq_ignore_ascii_case("rel")
                    && value
                        .trim()
                        .trim_matches('"')
                        .split_ascii_whitespace()
                        .any(|rel| rel.eq_ignore_ascii_case("next"))
            });
            next.then(|| target.to_owned())
        })
}

/// The GitHub REST API, through octocrab, with our retries.
#[derive(Clone)]
pub(super) struct Api {
    pub(super) octocrab: Octocrab,
    /// As configured, without a trailing slash.
    pub(super) api_url: String,
    pub(super) base: Uri,
    pub(super) retry_initial: Duration,
    pub(super) retry_budget: Duration,
}

/// One request: the method, the path (and query) under the API URL, the
/// JSON body.
pub(super) struct Request<'a> {
    pub(super) method: Method,
    pub(super) path: &'a str,
    pub(super) body: Option<serde_json::Value>,
}

impl<'a> Request<'a> {
    pub(super) fn get(path: &'a str) -> Request<'a> {
        Request {
            method: Method::GET,
            path,
            body: None,
        }
    }

    pub(super) fn post(path: &'a str, body: &impl Serialize) -> Request<'a> {
        Request {
            method: Method::POST,
            path,
            // Serializing our own body types cannot fail.
            body: serde_json::to_value(body).ok(),
        }
    }

    pub(super) fn patch(path: &'a str, body: &impl Serialize) -> Request<'a> {
        Request {
            method: Method::PATCH,
            path,
            body: serde_json::to_value(body).ok(),
        }
    }

    pub(super) fn post_empty(path: &'a str) -> Request<'a> {
        Request {
            method: Method::POST,
            path,
            body: None,
        }
    }
}

/// A 2xx answer.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: String,
}

impl Api {
    pub(super) fn new(settings: &GitHubSettings) -> Result<Api, GitHubError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(GitHubError::NoRuntime);
        }
        let invalid = |reason: &str| GitHubError::InvalidSettings(reason.to_owned());
        // A token read from a file often ends with a newline.
        let token = settings.token.trim();
        if token.is_empty() {
            return Err(invalid("no token"));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "the token has characters an HTTP header cannot carry",
            ));
        }
        let api_url = settings.api_url.trim().trim_end_matches('/').to_owned();
        let base = api_url.parse::<Uri>().map_err(|_| {
            GitHubError::InvalidSettings(format!("api url {api_url:?} is not a URL"))
        })?;
        let authority = base.authority().map(|a| a.as_str()).unwrap_or("");
        if authority.contains('@') {
            // Not echoed: it would be a credential.
            return Err(invalid(
                "the api url carries credentials; the token is given on its own",
            ));
        }
        if !matches!(base.scheme_str(), Some("https" | "http"))
            || authority.is_empty()
            || base.query().is_some()
        {
            return Err(GitHubError::InvalidSettings(format!(
                "api url {api_url:?} is not an http(s) URL without a query"
            )));
        }
        let octocrab = Octocrab::builder()
            .base_uri(base.clone())
            .map_err(|source| GitHubError::Request {
                action: "configure the GitHub client".into(),
                source,
            })?
            .personal_token(token.to_owned())
            // octocrab sends `User-Agent: octocrab` and
            // `X-GitHub-Api-Version: 2022-11-28` itself.
            .add_header(ACCEPT, "application/vnd.github+json".into())
            .set_connect_timeout(Some(CONNECT_TIMEOUT))
            .set_read_timeout(Some(READ_TIMEOUT))
            .set_write_timeout(Some(WRITE_TIMEOUT))
            .build()
            .map_err(|source| GitHubError::Request {
                action: "build the GitHub client".into(),
                source,
            })?;
        Ok(Api {
            octocrab,
            api_url,
            base,
            retry_initial: settings.retry_initial,
            retry_budget: settings.retry_budget,
        })
    }

    /// Sends `request` until GitHub answers 2xx, a final error, or the retry
    /// budget is spent.
    pub(super) async fn send(
        &self,
        action: &str,
        request: Request<'_>,
    ) -> Result<Answer, GitHubError> {
        let policy = ExponentialBackoffBuilder::new()
            .with_initial_interval(self.retry_initial)
            .with_multiplier(2.0)
            .with_max_interval(MAX_RETRY_INTERVAL.max(self.retry_initial))
            .with_max_elapsed_time(Some(self.retry_budget))
            .build();
        let started = Instant::now();
        backoff::future::retry_notify(
            policy,
            || async {
                let answer = self.send_once(action, &request).await?;
                if answer.status.is_success() {
                    return Ok(answer);
                }
                let error = GitHubError::Status {
                    action: action.to_owned(),
                    code: answer.status.as_u16(),
                    message: github_message(&answer.body),
                };
                match retry_decision(&answer, &error, Timestamp::now()) {
                    Retry::No => Err(backoff::Error::permanent(error)),
                    Retry::Backoff => Err(backoff::Error::transient(error)),
                    Retry::After(wait) if started.elapsed() + wait <= self.retry_budget => {
                        Err(backoff::Error::retry_after(error, wait))
                    }
                    // Waiting for the rate limit would spend the budget.
                    Retry::After(_) => Err(backoff::Error::permanent(error)),
                }
            },
            |error: GitHubError, wait: Duration| {
                debug!(error = %error_chain(&error), retry_in = ?wait, "GitHub request failed, retrying");
            },
        )
        .await
    }

    pub(super) async fn send_once(
        &self,
        action: &str,
        request: &Request<'_>,
    ) -> Result<Answer, backoff::Error<GitHubError>> {
        let request_failed = |source: octocrab::Error| {
            let transient = matches!(
                source,
                octocrab::Error::Hyper { .. } | octocrab::Error::Service { .. }
            );
            let error = GitHubError::Request {
                action: action.to_owned(),
                source,
            };
            if transient {
                backoff::Error::transient(error)
            } else {
                backoff::Error::permanent(error)
            }
        };
        let response = match (&request.method, &request.body) {
            (&Method::GET, _) => self.octocrab._get(request.path).await,
            (&Method::PATCH, body) => self.octocrab._patch(request.path, body.as_ref()).await,
            (_, Some(body)) => self.octocrab._post(request.path, Some(body)).await,
            (_, None) => self.octocrab._post(request.path, None::<&()>).await,
        }
        .map_err(request_failed)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = self
            .octocrab
            .body_to_string(response)
            .await
            .map_err(request_failed)?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// The path and query of `url` when it is on the API's own origin: the
    /// token goes nowhere else.
    pub(super) fn same_origin(&self, url: &str, action: &str) -> Result<String, GitHubError> {
        let decode = |reason: String| GitHubError::Decode {
            action: action.to_owned(),
            reason,
        };
        let uri = url
            .parse::<Uri>()
            .map_err(|_| decode(format!("the next page {url:?} is not a URL")))?;
        let same = uri.authority().is_none()
            || (uri.scheme() == self.base.scheme() && uri.authority() == self.base.authority());
        if !same {
            return Err(decode(format!(
                "the next page {url:?} is not on {}",
                self.api_url
            )));
        }
        Ok(uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()))
    }
}

pub(super) enum Retry {
    No,
    Backoff,
    After(Duration),
}

/// Server errors and rate limits are retried; other answers are final. A
/// rate limit says when to come back: `Retry-After` (secondary limits) or
/// `X-RateLimit-Reset` once `X-RateLimit-Remaining` is 0 (primary limits,
/// which GitHub answers with 403 or 429).
pub(super) fn retry_decision(answer: &Answer, error: &GitHubError, now: Timestamp) -> Retry {
    let header = |name: &str| {
        answer
            .headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
    };
    let retry_after = header(RETRY_AFTER.as_str())
        .and_then(|seconds| seconds.parse::<u64>().ok())
        .map(Duration::from_secs);
    let exhausted = header("x-ratelimit-remaining") == Some("0");
    let reset = header("x-ratelimit-reset")
        .and_then(|epoch| epoch.parse::<i64>().ok())
        .map(|epoch| Duration::from_secs(epoch.saturating_sub(now.as_second()).max(1) as u64));
    let wait = retry_after.or(if exhausted { reset } else { None });
    let code = answer.status;
    let rate_limited = code == StatusCode::TOO_MANY_REQUESTS
        || (code == StatusCode::FORBIDDEN
            && (exhausted
                || retry_after.is_some()
                || error
                    .to_string()
                    .to_ascii_lowercase()
                    .contains("rate limit")));
    match wait {
        _ if !(rate_limited || code.is_server_error()) => Retry::No,
        Some(wait) => Retry::After(wait),
        None => Retry::Backoff,
    }
}

/// GitHub's `message` (and its validation `errors`), or the start of the
/// body, on one line.
pub(super) fn github_message(body: &str) -> String {
    #[derive(Deserialize)]
    struct ErrorBody {
        message: String,
        #[serde(default)]
        errors: Vec<serde_json::Value>,
    }
    let text = match serde_json::from_str::<ErrorBody>(body) {
        Ok(error) if error.errors.is_empty() => error.message,
        Ok(error) => format!(
            "{} ({})",
            error.message,
            serde_json::Value::Array(error.errors)
        ),
        Err(_) if body.trim().is_empty() => "no message".into(),
        Err(_) => body.to_owned(),
    };
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::report::events::truncate(&line, MESSAGE_LIMIT)
}
