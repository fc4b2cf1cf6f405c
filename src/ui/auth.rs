//! Who is looking, and what they may see: the viewer's bearer token is
//! checked with a TokenReview, then each namespace with a
//! SubjectAccessReview on `applications.setpoint.dev` for that user. Both
//! answers are kept for a few seconds, so a page and its live stream cost
//! no API call per request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use sha2::{Digest, Sha256};

use super::UiError;

/// How long a TokenReview or SubjectAccessReview answer is reused.
pub const REVIEW_TTL: Duration = Duration::from_secs(10);

/// The cookie the login form sets.
pub const TOKEN_COOKIE: &str = "setpoint_token";

/// `--ui-auth`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuthMode {
    /// Bearer tokens checked by TokenReview, namespaces by SubjectAccessReview.
    #[default]
    Kubernetes,
    /// Anyone who reaches the listener sees and may sync everything (local use).
    None,
}

/// A viewer the API server vouched for (or anyone, without auth).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Viewer {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: Vec<(String, Vec<String>)>,
    /// The session the CSRF token is bound to: a digest of the token.
    pub session: String,
    /// `--ui-auth none`: every check allows.
    pub anonymous: bool,
}

/// What a viewer asks to do with Applications.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verb {
    Get,
    List,
    Patch,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Patch => "patch",
        }
    }
}

/// TokenReview answers by the token's digest: when asked, and who (none: refused).
type TokenCache = HashMap<[u8; 32], (Instant, Option<Viewer>)>;
/// SubjectAccessReview answers by (session, namespace, verb): when asked, and the answer.
type AccessCache = HashMap<(String, String, Verb), (Instant, bool)>;

pub struct Authorizer {
    client: Client,
    mode: AuthMode,
    /// Signs CSRF tokens; new at every start.
    key: [u8; 32],
    tokens: Mutex<TokenCache>,
    access: Mutex<AccessCache>,
}

/// The token a request carries: `Authorization: Bearer`, else the cookie.
pub fn token_of(req: &actix_web::HttpRequest) -> Option<String> {
    if let Some(value) = req.headers().get(actix_web::http::header::AUTHORIZATION)
        && let Ok(value) = value.to_str()
        && let Some(token) = value.strip_prefix("Bearer ")
    {
        let token = token.trim();
        return (!token.is_empty()).then(|| token.to_string());
    }
    cookie(req, TOKEN_COOKIE).filter(|t| !t.is_empty())
}

/// Whether the token came from the cookie (then writes need the CSRF token).
pub fn from_cookie(req: &actix_web::HttpRequest) -> bool {
    !req.headers()
        .contains_key(actix_web::http::header::AUTHORIZATION)
}

pub fn cookie(req: &actix_web::HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get_all(actix_web::http::header::COOKIE)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_string())
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn random_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    if let Ok(mut file) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        if file.read_exact(&mut key).is_ok() {
            return key;
        }
    }
    // No /dev/urandom: time and process, hashed; still unknown to a page
    // on another origin.
    let seed = format!("{:?}{}", std::time::SystemTime::now(), std::process::id());
    Sha256::digest(seed.as_bytes()).into()
}

impl Authorizer {
    pub fn new(client: Client, mode: AuthMode) -> Self {
        Self {
            client,
            mode,
            key: random_key(),
            tokens: Mutex::new(HashMap::new()),
            access: Mutex::new(HashMap::new()),
        }
    }

    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// The viewer of a request: 401 without a token or with one the API
    /// server does not know.
    pub async fn viewer(&self, req: &actix_web::HttpRequest) -> Result<Viewer, UiError> {
        if self.mode == AuthMode::None {
            return Ok(Viewer {
                username: "anonymous".into(),
                uid: String::new(),
                groups: Vec::new(),
                extra: Vec::new(),
                session: "anonymous".into(),
                anonymous: true,
            });
        }
        let token = token_of(req).ok_or(UiError::NoToken)?;
        self.authenticate(&token).await
    }

    /// A TokenReview of `token`, or its answer of the last seconds.
    pub async fn authenticate(&self, token: &str) -> Result<Viewer, UiError> {
        let key = digest(token);
        let now = Instant::now();
        if let Some((at, viewer)) = self.tokens.lock().expect("token cache").get(&key).cloned()
            && now.duration_since(at) < REVIEW_TTL
        {
            return viewer.ok_or(UiError::InvalidToken);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(UiError::Review)?;
        let status = answer.status.unwrap_or_default();
        let viewer = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => Some(Viewer {
                username: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default().into_iter().collect(),
                session: hex::encode(&key[..16]),
                anonymous: false,
            }),
            _ => None,
        };
        let mut tokens = self.tokens.lock().expect("token cache");
        tokens.retain(|_, (at, _)| now.duration_since(*at) < REVIEW_TTL);
        tokens.insert(key, (now, viewer.clone()));
        viewer.ok_or(UiError::InvalidToken)
    }

    /// Whether `viewer` may `verb` Applications in `namespace` (`""`: in
    /// every namespace), by SubjectAccessReview, or its answer of the last
    /// seconds.
    pub async fn allowed(
        &self,
        viewer: &Viewer,
        namespace: &str,
        verb: Verb,
    ) -> Result<bool, UiError> {
        if viewer.anonymous {
            return Ok(true);
        }
        let key = (viewer.session.clone(), namespace.to_string(), verb);
        let now = Instant::now();
        if let Some((at, allowed)) = self.access.lock().expect("access cache").get(&key).copied()
            && now.duration_since(at) < REVIEW_TTL
        {
            return Ok(allowed);
        }
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(viewer.username.clone()),
                uid: (!viewer.uid.is_empty()).then(|| viewer.uid.clone()),
                groups: Some(viewer.groups.clone()),
                extra: Some(viewer.extra.iter().cloned().collect()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("setpoint.dev".into()),
                    resource: Some("applications".into()),
                    namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
                    verb: Some(verb.as_str().into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(UiError::Review)?;
        let allowed = answer
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true));
        let mut access = self.access.lock().expect("access cache");
        access.retain(|_, (at, _)| now.duration_since(*at) < REVIEW_TTL);
        access.insert(key, (now, allowed));
        Ok(allowed)
    }

    /// The namespaces among `namespaces` where `viewer` may `verb`: all of
    /// them when it may cluster-wide, else one review per namespace (a few
    /// at once).
    pub async fn readable(
        &self,
        viewer: &Viewer,
        namespaces: Vec<String>,
        verb: Verb,
    ) -> Result<Vec<String>, UiError> {
        if self.allowed(viewer, "", verb).await? {
            return Ok(namespaces);
        }
        use futures::StreamExt;
        let answers: Vec<Result<(String, bool), UiError>> = futures::stream::iter(namespaces)
            .map(|ns| async move {
                let allowed = self.allowed(viewer, &ns, verb).await?;
                Ok((ns, allowed))
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let mut readable = Vec::new();
        for answer in answers {
            let (ns, allowed) = answer?;
            if allowed {
                readable.push(ns);
            }
        }
        readable.sort();
        Ok(readable)
    }

    /// The CSRF token of a viewer's session: an HMAC of the session, so a
    /// page on another origin (which cannot read ours) cannot forge it.
    pub fn csrf_token(&self, viewer: &Viewer) -> String {
        csrf(&self.key, &viewer.session)
    }

    pub fn check_csrf(&self, viewer: &Viewer, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        let expected = self.csrf_token(viewer);
        expected.as_bytes().ct_eq(presented.as_bytes()).into()
    }
}

fn csrf(key: &[u8], session: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(b"setpoint-ui-csrf\0");
    mac.update(session.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_tokens_are_bound_to_the_key_and_the_session() {
        let a = csrf(b"key-one", "session-a");
        assert_eq!(a, csrf(b"key-one", "session-a"));
        assert_ne!(a, csrf(b"key-one", "session-b"));
        assert_ne!(a, csrf(b"key-two", "session-a"));
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn the_bearer_header_wins_over_the_cookie() {
        let req = actix_web::test::TestRequest::default()
            .insert_header(("Authorization", "Bearer abc"))
            .insert_header(("Cookie", "other=1; setpoint_token=cookie"))
            .to_http_request();
        assert_eq!(token_of(&req).as_deref(), Some("abc"));
        assert!(!from_cookie(&req));
        let req = actix_web::test::TestRequest::default()
            .insert_header(("Cookie", "other=1; setpoint_token=cookie"))
            .to_http_request();
        assert_eq!(token_of(&req).as_deref(), Some("cookie"));
        assert!(from_cookie(&req));
        let req = actix_web::test::TestRequest::default().to_http_request();
        assert_eq!(token_of(&req), None);
    }
}
