//! What a registry's push payload announces, per Receiver type (pure): the
//! repository pushed to (`host/path`) and the tag. Each provider's payload
//! is read as it documents it; a field it always sends that is missing is
//! an error naming the field, never a guess.

use serde::Deserialize;
use serde_json::Value;

use super::Kind;

/// A repository of a registry: `host` (lowercased, Docker Hub's aliases as
/// `docker.io`) and `path` (`library/web`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistryRepo {
    /// None when the payload does not say (Harbor without resources).
    pub host: Option<String>,
    pub path: String,
}

impl RegistryRepo {
    /// `host/path` or `path`, as events and logs name it.
    pub fn display(&self) -> String {
        match &self.host {
            Some(host) => format!("{host}/{}", self.path),
            None => self.path.clone(),
        }
    }

    /// `host/path[:tag|@digest]` (an image or chart reference), split.
    pub fn from_reference(reference: &str) -> Option<(RegistryRepo, Option<String>)> {
        let reference = reference.trim();
        let reference = reference
            .strip_prefix("https://")
            .or_else(|| reference.strip_prefix("http://"))
            .or_else(|| reference.strip_prefix("oci://"))
            .unwrap_or(reference);
        let (name, tag) = match reference.split_once('@') {
            Some((name, _digest)) => (name, None),
            None => match reference.rsplit_once(':') {
                // A colon after the last slash is a tag; before it, a port.
                Some((name, tag)) if !tag.contains('/') => (name, Some(tag.to_string())),
                _ => (reference, None),
            },
        };
        let (host, path) = name.split_once('/')?;
        let path = path.trim_matches('/');
        if host.is_empty() || path.is_empty() {
            return None;
        }
        Some((
            RegistryRepo {
                host: Some(normalize_host(host)),
                path: path.to_ascii_lowercase(),
            },
            tag.filter(|t| !t.is_empty()),
        ))
    }
}

/// Lowercase, and Docker Hub's several names as one.
pub fn normalize_host(host: &str) -> String {
    let host = host.trim().to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io"
        | "registry-1.docker.io"
        | "registry.hub.docker.com"
        | "hub.docker.com" => "docker.io".to_string(),
        _ => host,
    }
}

/// One push a payload announces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Announcement {
    pub repository: RegistryRepo,
    pub tag: Option<String>,
}

/// What a registry type's payload says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Pushes, at least one.
    Pushes(Vec<Announcement>),
    /// GitHub's check that the hook is set up: answered, nothing enqueued.
    Ping,
}

#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("invalid {provider} payload: {message}")]
    Invalid {
        provider: &'static str,
        message: String,
    },
    #[error("GitHub event {0} is not a package event (package, registry_package)")]
    NotAPackageEvent(String),
}

/// The event name the type's `spec.events` filters on: GitHub's
/// `X-GitHub-Event`, Harbor's `type`. None for types that have none.
pub fn event_name(kind: Kind, github_event: Option<&str>, body: &Value) -> Option<String> {
    match kind {
        Kind::GitHubPackages => github_event.map(str::to_string),
        Kind::Harbor => body.get("type").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// The pushes a registry type's payload announces. `github_event` is the
/// `X-GitHub-Event` header.
pub fn parse(kind: Kind, github_event: Option<&str>, body: &Value) -> Result<Parsed, PayloadError> {
    match kind {
        Kind::Harbor => harbor(body),
        Kind::DockerHub => dockerhub(body),
        Kind::Quay => quay(body),
        Kind::GitHubPackages => github(github_event.unwrap_or_default(), body),
        // No payload of their own: the request is the news.
        Kind::Generic | Kind::GenericHmac => Ok(Parsed::Pushes(Vec::new())),
    }
}

fn invalid(provider: &'static str, message: impl Into<String>) -> PayloadError {
    PayloadError::Invalid {
        provider,
        message: message.into(),
    }
}

fn typed<T: for<'de> Deserialize<'de>>(
    provider: &'static str,
    body: &Value,
) -> Result<T, PayloadError> {
    T::deserialize(body).map_err(|e| invalid(provider, e.to_string()))
}

/// Harbor: `event_data.resources[].resource_url` (`host/project/repo:tag`),
/// else `event_data.repository.repo_full_name` (no host).
fn harbor(body: &Value) -> Result<Parsed, PayloadError> {
    #[derive(Deserialize)]
    struct Payload {
        event_data: EventData,
    }
    #[derive(Deserialize)]
    struct EventData {
        #[serde(default)]
        resources: Vec<Resource>,
        repository: Option<Repository>,
    }
    #[derive(Deserialize)]
    struct Resource {
        tag: Option<String>,
        resource_url: Option<String>,
    }
    #[derive(Deserialize)]
    struct Repository {
        repo_full_name: Option<String>,
    }
    let payload: Payload = typed("Harbor", body)?;
    let mut pushes = Vec::new();
    for resource in &payload.event_data.resources {
        let Some(url) = resource.resource_url.as_deref() else {
            continue;
        };
        let (repository, url_tag) = RegistryRepo::from_reference(url).ok_or_else(|| {
            invalid(
                "Harbor",
                "event_data.resources[].resource_url is not host/repository:tag",
            )
        })?;
        let tag = resource.tag.clone().filter(|t| !t.is_empty()).or(url_tag);
        pushes.push(Announcement { repository, tag });
    }
    if pushes.is_empty() {
        let name = payload
            .event_data
            .repository
            .and_then(|r| r.repo_full_name)
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| {
                invalid(
                    "Harbor",
                    "neither event_data.resources[].resource_url nor event_data.repository.repo_full_name",
                )
            })?;
        let tag = payload
            .event_data
            .resources
            .iter()
            .find_map(|r| r.tag.clone());
        pushes.push(Announcement {
            repository: RegistryRepo {
                host: None,
                path: name.trim_matches('/').to_ascii_lowercase(),
            },
            tag,
        });
    }
    Ok(Parsed::Pushes(pushes))
}

/// Docker Hub: `repository.repo_name` (`namespace/name`; an official image
/// is `library/name`) on `docker.io`, `push_data.tag`.
fn dockerhub(body: &Value) -> Result<Parsed, PayloadError> {
    #[derive(Deserialize)]
    struct Payload {
        push_data: Option<PushData>,
        repository: Repository,
    }
    #[derive(Deserialize)]
    struct PushData {
        tag: Option<String>,
    }
    #[derive(Deserialize)]
    struct Repository {
        repo_name: String,
    }
    let payload: Payload = typed("Docker Hub", body)?;
    let name = payload.repository.repo_name.trim().trim_matches('/');
    if name.is_empty() {
        return Err(invalid("Docker Hub", "repository.repo_name is empty"));
    }
    let path = if name.contains('/') {
        name.to_ascii_lowercase()
    } else {
        format!("library/{}", name.to_ascii_lowercase())
    };
    Ok(Parsed::Pushes(vec![Announcement {
        repository: RegistryRepo {
            host: Some("docker.io".into()),
            path,
        },
        tag: payload
            .push_data
            .and_then(|p| p.tag)
            .filter(|t| !t.is_empty()),
    }]))
}

/// Quay: `docker_url` (`quay.io/namespace/name`), else `repository` on
/// quay.io; one announcement per tag of `updated_tags`.
fn quay(body: &Value) -> Result<Parsed, PayloadError> {
    #[derive(Deserialize)]
    struct Payload {
        docker_url: Option<String>,
        repository: Option<String>,
        #[serde(default)]
        updated_tags: Vec<String>,
    }
    let payload: Payload = typed("Quay", body)?;
    let repository = match (&payload.docker_url, &payload.repository) {
        (Some(url), _) if !url.trim().is_empty() => RegistryRepo::from_reference(url)
            .map(|(repo, _)| repo)
            .ok_or_else(|| invalid("Quay", "docker_url is not host/repository"))?,
        (_, Some(name)) if !name.trim().is_empty() => RegistryRepo {
            host: Some("quay.io".into()),
            path: name.trim_matches('/').to_ascii_lowercase(),
        },
        _ => return Err(invalid("Quay", "neither docker_url nor repository")),
    };
    let tags: Vec<Option<String>> = if payload.updated_tags.is_empty() {
        vec![None]
    } else {
        payload.updated_tags.into_iter().map(Some).collect()
    };
    Ok(Parsed::Pushes(
        tags.into_iter()
            .map(|tag| Announcement {
                repository: repository.clone(),
                tag,
            })
            .collect(),
    ))
}

/// GitHub's `package` and `registry_package` events: the version's
/// `package_url` (`ghcr.io/owner/name:tag`), else `ghcr.io/<namespace>/<name>`
/// and `container_metadata.tag.name`.
fn github(event: &str, body: &Value) -> Result<Parsed, PayloadError> {
    #[derive(Deserialize)]
    struct Package {
        name: String,
        namespace: Option<String>,
        owner: Option<Owner>,
        package_version: Option<Version>,
    }
    #[derive(Deserialize)]
    struct Owner {
        login: String,
    }
    #[derive(Deserialize)]
    struct Version {
        package_url: Option<String>,
        container_metadata: Option<Metadata>,
    }
    #[derive(Deserialize)]
    struct Metadata {
        tag: Option<Tag>,
    }
    #[derive(Deserialize)]
    struct Tag {
        name: Option<String>,
    }
    let field = match event {
        "ping" => return Ok(Parsed::Ping),
        "package" => "package",
        "registry_package" => "registry_package",
        other => return Err(PayloadError::NotAPackageEvent(other.to_string())),
    };
    let package = body
        .get(field)
        .ok_or_else(|| invalid("GitHub", format!("missing field `{field}`")))?;
    let package: Package = typed("GitHub", package)?;
    let version = package.package_version.as_ref();
    let tag = version
        .and_then(|v| v.container_metadata.as_ref())
        .and_then(|m| m.tag.as_ref())
        .and_then(|t| t.name.clone())
        .filter(|t| !t.is_empty());
    let from_url = version
        .and_then(|v| v.package_url.as_deref())
        .and_then(RegistryRepo::from_reference);
    let (repository, url_tag) = match from_url {
        Some(found) => found,
        None => {
            let owner = package
                .namespace
                .or(package.owner.map(|o| o.login))
                .filter(|o| !o.is_empty())
                .ok_or_else(|| invalid("GitHub", format!("{field} has no namespace or owner")))?;
            let path = format!("{owner}/{}", package.name).to_ascii_lowercase();
            (
                RegistryRepo {
                    host: Some("ghcr.io".into()),
                    path,
                },
                None,
            )
        }
    };
    Ok(Parsed::Pushes(vec![Announcement {
        repository,
        tag: tag.or(url_tag),
    }]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(name: &str) -> Value {
        let text = match name {
            "harbor" => include_str!("testdata/harbor.json"),
            "dockerhub" => include_str!("testdata/dockerhub.json"),
            "quay" => include_str!("testdata/quay.json"),
            "package" => include_str!("testdata/github-package.json"),
            "registry_package" => include_str!("testdata/github-registry-package.json"),
            _ => unreachable!(),
        };
        serde_json::from_str(text).unwrap()
    }

    fn pushes(parsed: Parsed) -> Vec<(String, Option<String>)> {
        match parsed {
            Parsed::Pushes(pushes) => pushes
                .into_iter()
                .map(|p| (p.repository.display(), p.tag))
                .collect(),
            Parsed::Ping => panic!("a ping"),
        }
    }

    fn one(repo: &str, tag: &str) -> Vec<(String, Option<String>)> {
        vec![(repo.to_string(), Some(tag.to_string()))]
    }

    #[test]
    fn harbor_names_the_resource_url_and_its_tag() {
        let body = sample("harbor");
        assert_eq!(
            pushes(parse(Kind::Harbor, None, &body).unwrap()),
            one("harbor.example.com/library/web", "1.1.0")
        );
        assert_eq!(
            event_name(Kind::Harbor, None, &body).as_deref(),
            Some("PUSH_ARTIFACT")
        );
        // Without resources: the repository's full name, on no known host.
        let bare = serde_json::json!({
            "type": "PUSH_ARTIFACT",
            "event_data": { "repository": { "repo_full_name": "library/web" } }
        });
        assert_eq!(
            pushes(parse(Kind::Harbor, None, &bare).unwrap()),
            vec![("library/web".to_string(), None)]
        );
        let error = parse(Kind::Harbor, None, &serde_json::json!({"type": "x"})).unwrap_err();
        assert!(
            error.to_string().contains("event_data"),
            "names the field: {error}"
        );
    }

    #[test]
    fn dockerhub_is_docker_io_and_official_images_are_library() {
        assert_eq!(
            pushes(parse(Kind::DockerHub, None, &sample("dockerhub")).unwrap()),
            one("docker.io/svendowideit/testhook", "latest")
        );
        let official = serde_json::json!({
            "push_data": { "tag": "1.2" },
            "repository": { "repo_name": "nginx" }
        });
        assert_eq!(
            pushes(parse(Kind::DockerHub, None, &official).unwrap()),
            one("docker.io/library/nginx", "1.2")
        );
        let error = parse(Kind::DockerHub, None, &serde_json::json!({})).unwrap_err();
        assert!(error.to_string().contains("repository"), "{error}");
    }

    #[test]
    fn quay_reads_docker_url_and_each_updated_tag() {
        assert_eq!(
            pushes(parse(Kind::Quay, None, &sample("quay")).unwrap()),
            one("quay.io/mynamespace/repository", "latest")
        );
        let two = serde_json::json!({ "repository": "ns/app", "updated_tags": ["1.0", "stable"] });
        assert_eq!(
            pushes(parse(Kind::Quay, None, &two).unwrap()),
            vec![
                ("quay.io/ns/app".to_string(), Some("1.0".to_string())),
                ("quay.io/ns/app".to_string(), Some("stable".to_string())),
            ]
        );
    }

    #[test]
    fn github_package_events_name_ghcr_repositories() {
        assert_eq!(
            pushes(parse(Kind::GitHubPackages, Some("package"), &sample("package")).unwrap()),
            one("ghcr.io/acme/web", "2.3.0")
        );
        assert_eq!(
            pushes(
                parse(
                    Kind::GitHubPackages,
                    Some("registry_package"),
                    &sample("registry_package")
                )
                .unwrap()
            ),
            one("ghcr.io/acme/web", "2.4.0")
        );
        // No package_url: the owner (lowercased) and the name on ghcr.io.
        let bare = serde_json::json!({ "package": {
            "name": "Chart", "owner": { "login": "Acme" },
            "package_version": { "container_metadata": { "tag": { "name": "0.1.0" } } }
        }});
        assert_eq!(
            pushes(parse(Kind::GitHubPackages, Some("package"), &bare).unwrap()),
            one("ghcr.io/acme/chart", "0.1.0")
        );
        assert_eq!(
            parse(Kind::GitHubPackages, Some("ping"), &serde_json::json!({})).unwrap(),
            Parsed::Ping
        );
        let push = parse(Kind::GitHubPackages, Some("push"), &serde_json::json!({})).unwrap_err();
        assert!(matches!(push, PayloadError::NotAPackageEvent(_)), "{push}");
        assert_eq!(
            event_name(Kind::GitHubPackages, Some("package"), &Value::Null).as_deref(),
            Some("package")
        );
    }

    #[test]
    fn references_split_host_path_tag_and_digest() {
        let split =
            |r: &str| RegistryRepo::from_reference(r).map(|(repo, tag)| (repo.display(), tag));
        assert_eq!(
            split("127.0.0.1:5000/charts/web:1.0.0"),
            Some(("127.0.0.1:5000/charts/web".into(), Some("1.0.0".into())))
        );
        assert_eq!(
            split("127.0.0.1:5000/charts/web"),
            Some(("127.0.0.1:5000/charts/web".into(), None))
        );
        assert_eq!(
            split("Registry-1.Docker.io/Library/Web@sha256:abc"),
            Some(("docker.io/library/web".into(), None))
        );
        assert_eq!(split("web"), None);
        assert_eq!(split("/web"), None);
    }
}
