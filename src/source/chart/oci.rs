//! Helm charts in an OCI registry, through the distribution API: the tags of
//! a repository (`/v2/<name>/tags/list`, paged by `Link`), a tag's manifest
//! (`/v2/<name>/manifests/<tag>`, its digest checked against
//! `Docker-Content-Digest`), the chart layer's blob (checked against its
//! digest by the cache). A 401 with a `Bearer` challenge goes through the
//! registry's token service (with the credentials, when there are any) and
//! the token is kept per scope; a `Basic` challenge gets the credentials.

use std::collections::HashMap;
use std::sync::Mutex;

use http::header::{ACCEPT, HeaderName};
use serde::Deserialize;

use super::ChartError;
use super::cache::{short_body, transport};
use super::http::{Auth, Http, Response};

pub const MANIFEST_TYPES: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CHART_LAYER: &str = "application/vnd.cncf.helm.chart.content.v1.tar+gzip";

/// Bearer tokens by registry and scope.
#[derive(Default)]
pub struct Tokens(Mutex<HashMap<String, String>>);

pub struct Registry<'a> {
    pub http: &'a Http,
    /// `https://host:port` (or `http://` for an insecure registry).
    pub base: String,
    pub auth: Option<&'a Auth>,
    pub tokens: &'a Tokens,
    pub max_bytes: usize,
}

#[derive(Deserialize)]
struct TagList {
    #[serde(default)]
    tags: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    media_type: String,
    digest: String,
}

#[derive(Deserialize)]
struct Token {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    access_token: Option<String>,
}

impl Registry<'_> {
    fn repository(&self, name: &str) -> String {
        format!(
            "oci://{}/{name}",
            self.base.split("://").nth(1).unwrap_or("")
        )
    }

    pub fn blob_url(&self, name: &str, digest: &str) -> String {
        format!("{}/v2/{name}/blobs/{digest}", self.base)
    }

    /// Every tag of `name`.
    pub async fn tags(&self, name: &str) -> Result<Vec<String>, ChartError> {
        let mut tags = Vec::new();
        let mut url = format!("{}/v2/{name}/tags/list?n=1000", self.base);
        for _ in 0..100 {
            let response = self.get(&url, &[], self.max_bytes).await?;
            match response.status.as_u16() {
                200 => {}
                404 => {
                    let chart = name.rsplit('/').next().unwrap_or(name);
                    let parent = name.rsplit_once('/').map(|(p, _)| p).unwrap_or("");
                    return Err(ChartError::ChartNotFound {
                        repository: self.repository(parent).trim_end_matches('/').to_string(),
                        chart: chart.to_string(),
                    });
                }
                status => {
                    return Err(ChartError::Status {
                        url,
                        status,
                        message: short_body(&response.body),
                    });
                }
            }
            let page: TagList = serde_json::from_slice(&response.body).map_err(|e| {
                ChartError::InvalidResponse {
                    what: "tag list",
                    url: url.clone(),
                    message: e.to_string(),
                }
            })?;
            tags.extend(page.tags.unwrap_or_default());
            match response.header("link").and_then(next_link) {
                Some(next) if next.starts_with('/') => url = format!("{}{next}", self.base),
                Some(next) => url = next,
                None => return Ok(tags),
            }
        }
        Ok(tags)
    }

    /// The digest of `tag`'s manifest and of its chart layer.
    pub async fn manifest(
        &self,
        name: &str,
        tag: &str,
        chart: &str,
    ) -> Result<(String, String), ChartError> {
        let url = format!("{}/v2/{name}/manifests/{tag}", self.base);
        let response = self
            .get(
                &url,
                &[(ACCEPT, MANIFEST_TYPES.to_string())],
                4 * 1024 * 1024,
            )
            .await?;
        if response.status.as_u16() != 200 {
            return Err(ChartError::Status {
                url,
                status: response.status.as_u16(),
                message: short_body(&response.body),
            });
        }
        let digest = format!("sha256:{}", super::archive::sha256_hex(&response.body));
        if let Some(announced) = response.header("docker-content-digest")
            && announced.starts_with("sha256:")
            && announced != digest
        {
            return Err(ChartError::DigestMismatch {
                chart: chart.to_string(),
                version: tag.to_string(),
                url,
                expected: announced.trim_start_matches("sha256:").to_string(),
                actual: digest.trim_start_matches("sha256:").to_string(),
            });
        }
        let manifest: Manifest =
            serde_json::from_slice(&response.body).map_err(|e| ChartError::InvalidResponse {
                what: "manifest",
                url: url.clone(),
                message: e.to_string(),
            })?;
        let layer = manifest
            .layers
            .into_iter()
            .find(|l| l.media_type == CHART_LAYER)
            .ok_or_else(|| ChartError::InvalidResponse {
                what: "manifest",
                url: url.clone(),
                message: format!("no {CHART_LAYER} layer: not a Helm chart"),
            })?;
        if !layer.digest.starts_with("sha256:") {
            return Err(ChartError::InvalidResponse {
                what: "manifest",
                url,
                message: format!("unsupported layer digest {}", layer.digest),
            });
        }
        Ok((digest, layer.digest))
    }

    /// GET with the registry's authentication: a kept token first; on a
    /// challenge, a new token (Bearer) or the credentials (Basic), once.
    pub async fn get(
        &self,
        url: &str,
        headers: &[(HeaderName, String)],
        limit: usize,
    ) -> Result<Response, ChartError> {
        let scope_key = format!("{}|{}", self.base, scope_of(url));
        let kept = self
            .tokens
            .0
            .lock()
            .expect("registry tokens lock")
            .get(&scope_key)
            .cloned()
            .map(Auth::Bearer);
        let first = kept.as_ref();
        let response = self
            .http
            .get(url, headers, first, limit)
            .await
            .map_err(|e| transport(url, "registry response", e))?;
        if response.status.as_u16() != 401 {
            return Ok(response);
        }
        let challenge = response.header("www-authenticate").unwrap_or_default();
        let auth = if challenge.to_ascii_lowercase().starts_with("bearer") {
            let token = self.token(challenge, url).await?;
            self.tokens
                .0
                .lock()
                .expect("registry tokens lock")
                .insert(scope_key, token.clone());
            Auth::Bearer(token)
        } else {
            match self.auth {
                Some(auth) => auth.clone(),
                None => return Ok(response),
            }
        };
        self.http
            .get(url, headers, Some(&auth), limit)
            .await
            .map_err(|e| transport(url, "registry response", e))
    }

    /// A token from the realm of a `Bearer realm=…,service=…,scope=…`
    /// challenge, asked with the credentials when there are any.
    async fn token(&self, challenge: &str, url: &str) -> Result<String, ChartError> {
        let params = challenge_params(challenge);
        let realm = params
            .get("realm")
            .ok_or_else(|| ChartError::InvalidResponse {
                what: "authentication challenge",
                url: url.to_string(),
                message: format!("no realm in {challenge:?}"),
            })?;
        let mut query = Vec::new();
        for key in ["service", "scope"] {
            if let Some(value) = params.get(key) {
                query.push(format!("{key}={}", encode(value)));
            }
        }
        let token_url = if query.is_empty() {
            realm.clone()
        } else {
            format!("{realm}?{}", query.join("&"))
        };
        let basic = self.auth.filter(|a| matches!(a, Auth::Basic { .. }));
        let response = self
            .http
            .get(&token_url, &[], basic, 1024 * 1024)
            .await
            .map_err(|e| transport(&token_url, "registry token", e))?;
        if response.status.as_u16() != 200 {
            return Err(ChartError::Status {
                url: token_url,
                status: response.status.as_u16(),
                message: short_body(&response.body),
            });
        }
        let token: Token =
            serde_json::from_slice(&response.body).map_err(|e| ChartError::InvalidResponse {
                what: "registry token",
                url: token_url.clone(),
                message: e.to_string(),
            })?;
        token
            .token
            .or(token.access_token)
            .ok_or_else(|| ChartError::InvalidResponse {
                what: "registry token",
                url: token_url,
                message: "neither token nor access_token".into(),
            })
    }
}

/// The repository part of a `/v2/<name>/…` URL: one token per repository.
fn scope_of(url: &str) -> &str {
    let path = url.split("/v2/").nth(1).unwrap_or_default();
    ["/tags/", "/manifests/", "/blobs/"]
        .iter()
        .find_map(|marker| path.split_once(marker).map(|(name, _)| name))
        .unwrap_or(path)
}

/// `key="value"` pairs of a challenge.
fn challenge_params(challenge: &str) -> HashMap<String, String> {
    let rest = challenge.split_once(' ').map(|(_, r)| r).unwrap_or("");
    let mut params = HashMap::new();
    let mut remaining = rest;
    while let Some((key, after)) = remaining.split_once('=') {
        let key = key
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"').unwrap_or(quoted.len());
            (&quoted[..end], quoted.get(end + 1..).unwrap_or(""))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        params.insert(key, value.to_string());
        remaining = next;
    }
    params
}

/// `<url>; rel="next"` of a `Link` header.
fn next_link(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params.contains("rel=\"next\"").then(|| {
            target
                .trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string()
        })
    })
}

/// Percent-encoding for a query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_challenge_gives_its_parameters() {
        let params = challenge_params(
            r#"Bearer realm="https://auth.example.com/token",service="registry.example.com",scope="repository:charts/web:pull""#,
        );
        assert_eq!(params["realm"], "https://auth.example.com/token");
        assert_eq!(params["service"], "registry.example.com");
        assert_eq!(params["scope"], "repository:charts/web:pull");
        assert_eq!(
            encode("repository:charts/web:pull"),
            "repository%3Acharts%2Fweb%3Apull"
        );
    }

    #[test]
    fn pages_and_scopes() {
        assert_eq!(
            next_link(r#"</v2/charts/web/tags/list?last=1.0.0&n=1000>; rel="next""#).as_deref(),
            Some("/v2/charts/web/tags/list?last=1.0.0&n=1000")
        );
        assert_eq!(next_link(r#"</x>; rel="prev""#), None);
        assert_eq!(
            scope_of("http://h/v2/charts/web/manifests/1.0.0"),
            "charts/web"
        );
        assert_eq!(scope_of("http://h/v2/a/b/c/blobs/sha256:x"), "a/b/c");
    }
}
