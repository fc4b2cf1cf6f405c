//! One cache per chart repository (and credentials): its listing, fetched
//! again only when older than the poll interval, after a failure, or when an
//! event names a version it lacks, with `If-None-Match` /
//! `If-Modified-Since`; concurrent reconciles of one repository wait for
//! one fetch. Archives are verified against the index's (or the OCI
//! manifest's) digest and kept on disk by digest.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::header::{IF_MODIFIED_SINCE, IF_NONE_MATCH};

use super::http::{Auth, Http, HttpError};
use super::index::{self, Listing};
use super::oci::{self, Registry};
use super::{ChartError, ChartSettings, Repository};

/// What one chart request asks for.
#[derive(Debug)]
pub struct ChartRequest<'a> {
    pub repository: &'a Repository,
    pub chart: &'a str,
    /// Empty or absent: the newest release.
    pub range: Option<&'a str>,
    pub auth: Option<&'a Auth>,
    /// A version an event announced: the listing is fetched again when it
    /// does not have it yet.
    pub known_version: Option<&'a str>,
    /// A registry announced a push (a Receiver): a listing fetched before
    /// this moment is not served, whatever its age.
    pub fresh_since: Option<SystemTime>,
}

/// The chosen version and its verified archive.
#[derive(Clone, Debug)]
pub struct Resolved {
    pub version: String,
    /// `sha256:<hex>`: of the archive (Helm repository), of the manifest (OCI).
    pub digest: String,
    /// `status.sync.revision`: the version, and for OCI `@<digest>`.
    pub revision: String,
    pub archive: Bytes,
}

/// A repository's key and the credentials it is read with: a listing read
/// with one tenant's credentials is never served to another.
type SlotKey = (String, Option<Auth>);

#[derive(Default)]
struct Slot {
    listing: Option<Arc<Listing>>,
    etag: Option<String>,
    last_modified: Option<String>,
    /// When the last fetch succeeded; None after a failure.
    fresh_at: Option<Instant>,
    /// When that fetch started, on the clock events are stamped with.
    fetch_started: Option<SystemTime>,
    /// OCI: tag → (manifest digest, chart layer digest), for this listing.
    manifests: HashMap<String, (String, String)>,
}

pub struct ChartSource {
    settings: ChartSettings,
    http: Http,
    dir: PathBuf,
    slots: Mutex<HashMap<SlotKey, Arc<tokio::sync::Mutex<Slot>>>>,
    /// One download per archive digest at a time.
    downloads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    tokens: oci::Tokens,
    listing_fetches: AtomicU64,
}

impl ChartSource {
    /// Archives are kept under `cache_dir/charts`.
    pub fn new(settings: ChartSettings, cache_dir: PathBuf) -> Self {
        ChartSource {
            http: Http::new(settings.timeout),
            settings,
            dir: cache_dir.join("charts"),
            slots: Mutex::default(),
            downloads: Mutex::default(),
            tokens: oci::Tokens::default(),
            listing_fetches: AtomicU64::new(0),
        }
    }

    pub fn settings(&self) -> &ChartSettings {
        &self.settings
    }

    /// Listing requests sent so far (index.yaml GETs, OCI tag lists).
    pub fn listing_fetches(&self) -> u64 {
        self.listing_fetches.load(Ordering::Relaxed)
    }

    fn slot(&self, repository: &Repository, auth: Option<&Auth>) -> Arc<tokio::sync::Mutex<Slot>> {
        let mut slots = self.slots.lock().expect("chart slots lock");
        slots
            .entry((repository.key(), auth.cloned()))
            .or_default()
            .clone()
    }

    fn registry<'a>(&'a self, registry: &'a str, auth: Option<&'a Auth>) -> Registry<'a> {
        let plain = self
            .settings
            .insecure_registries
            .iter()
            .any(|h| h == registry);
        Registry {
            http: &self.http,
            base: format!("{}://{registry}", if plain { "http" } else { "https" }),
            auth,
            tokens: &self.tokens,
            max_bytes: self.settings.max_index_bytes,
        }
    }

    /// The repository's listing: the cached one while it is younger than
    /// `max_age` (and has `wanted`, when given), else fetched (conditionally).
    pub async fn listing(
        &self,
        repository: &Repository,
        auth: Option<&Auth>,
        max_age: Duration,
        wanted: Option<(&str, &str)>,
    ) -> Result<Arc<Listing>, ChartError> {
        self.listing_since(repository, auth, max_age, wanted, None)
            .await
    }

    /// `listing`, refusing a cached one whose fetch started before
    /// `fresh_since`: one fetch serves every event stamped before it.
    async fn listing_since(
        &self,
        repository: &Repository,
        auth: Option<&Auth>,
        max_age: Duration,
        wanted: Option<(&str, &str)>,
        fresh_since: Option<SystemTime>,
    ) -> Result<Arc<Listing>, ChartError> {
        let slot = self.slot(repository, auth);
        let mut slot = slot.lock().await;
        if let (Some(listing), Some(at)) = (&slot.listing, slot.fresh_at)
            && at.elapsed() < max_age
            && wanted.is_none_or(|(chart, version)| has_version(listing, chart, version))
            && fresh_since.is_none_or(|since| slot.fetch_started.is_some_and(|at| at >= since))
        {
            return Ok(Arc::clone(listing));
        }
        self.listing_fetches.fetch_add(1, Ordering::Relaxed);
        let started = SystemTime::now();
        let fetched = match repository {
            Repository::Http { url } => self.fetch_index(url, auth, &slot).await,
            Repository::Oci { registry, name } => {
                let chart = name.rsplit('/').next().unwrap_or(name);
                self.registry(registry, auth)
                    .tags(name)
                    .await
                    .map(|tags| Some((Listing::from_tags(chart, &tags), None, None)))
            }
        };
        match fetched {
            Ok(Some((listing, etag, last_modified))) => {
                slot.listing = Some(Arc::new(listing));
                slot.etag = etag;
                slot.last_modified = last_modified;
                slot.manifests.clear();
            }
            // 304: the cached listing still holds.
            Ok(None) => {}
            Err(error) => {
                slot.fresh_at = None;
                slot.fetch_started = None;
                return Err(error);
            }
        }
        slot.fresh_at = Some(Instant::now());
        slot.fetch_started = Some(started);
        Ok(Arc::clone(
            slot.listing.as_ref().expect("a listing after a fetch"),
        ))
    }

    /// `index.yaml`, or None when the server says the cached one is current.
    async fn fetch_index(
        &self,
        url: &str,
        auth: Option<&Auth>,
        slot: &Slot,
    ) -> Result<Option<(Listing, Option<String>, Option<String>)>, ChartError> {
        let index_url = format!("{url}/index.yaml");
        let mut headers = Vec::new();
        if slot.listing.is_some() {
            if let Some(etag) = &slot.etag {
                headers.push((IF_NONE_MATCH, etag.clone()));
            }
            if let Some(modified) = &slot.last_modified {
                headers.push((IF_MODIFIED_SINCE, modified.clone()));
            }
        }
        let response = self
            .http
            .get(&index_url, &headers, auth, self.settings.max_index_bytes)
            .await
            .map_err(|e| transport(&index_url, "index.yaml", e))?;
        match response.status.as_u16() {
            304 if slot.listing.is_some() => return Ok(None),
            200 => {}
            status => {
                return Err(ChartError::Status {
                    url: index_url,
                    status,
                    message: short_body(&response.body),
                });
            }
        }
        let listing = Listing::parse_index(&response.body).map_err(|message| {
            ChartError::InvalidResponse {
                what: "index.yaml",
                url: index_url.clone(),
                message,
            }
        })?;
        Ok(Some((
            listing,
            response.header("etag").map(str::to_string),
            response.header("last-modified").map(str::to_string),
        )))
    }

    /// The version `range` picks from the listing of `chart`.
    pub fn choose(
        listing: &Listing,
        repository: &Repository,
        chart: &str,
        range: Option<&str>,
    ) -> Result<index::Entry, ChartError> {
        let requirement = index::parse_range(range.unwrap_or_default())
            .map_err(|e| ChartError::InvalidSource(format!("spec.source.targetRevision: {e}")))?;
        let entries = listing
            .entries
            .get(chart)
            .filter(|e| !e.is_empty())
            .ok_or_else(|| ChartError::ChartNotFound {
                repository: repository.key(),
                chart: chart.to_string(),
            })?;
        let chosen = index::choose(entries.iter().map(|e| e.version.as_str()), &requirement)
            .ok_or_else(|| ChartError::VersionNotFound {
                repository: repository.key(),
                chart: chart.to_string(),
                range: range.unwrap_or("*").to_string(),
                available: available(entries),
            })?;
        Ok(entries
            .iter()
            .find(|e| e.version == chosen)
            .cloned()
            .expect("the chosen version is listed"))
    }

    /// The version the request's range picks, with its verified archive.
    pub async fn resolve(&self, request: &ChartRequest<'_>) -> Result<Resolved, ChartError> {
        let listing = self
            .listing_since(
                request.repository,
                request.auth,
                // The poller refreshes the listing every interval ± 10%
                // (jitter, and its tick); a reconcile between a late poll
                // and the next refetches only when no poll came for half an
                // interval more (no poller in this process). An event
                // naming a version the listing lacks fetches at once.
                self.settings.poll_interval.mul_f64(1.5),
                request.known_version.map(|v| (request.chart, v)),
                request.fresh_since,
            )
            .await?;
        let entry = match Self::choose(&listing, request.repository, request.chart, request.range) {
            Ok(entry) => entry,
            // An absence is confirmed against the repository itself (one
            // conditional request, a 304 when nothing changed), never
            // concluded from a cached listing: a version published since
            // the last poll is then picked now, not one poll later.
            Err(ChartError::VersionNotFound { .. } | ChartError::ChartNotFound { .. }) => {
                let fresh = self
                    .listing(request.repository, request.auth, Duration::ZERO, None)
                    .await?;
                Self::choose(&fresh, request.repository, request.chart, request.range)?
            }
            Err(error) => return Err(error),
        };
        match request.repository {
            Repository::Http { url } => {
                let archive_url =
                    index::archive_url(url, &entry).ok_or_else(|| ChartError::InvalidResponse {
                        what: "index.yaml",
                        url: format!("{url}/index.yaml"),
                        message: format!("{} {} has no urls", request.chart, entry.version),
                    })?;
                let expected = entry
                    .digest
                    .as_deref()
                    .map(|d| d.trim_start_matches("sha256:").to_ascii_lowercase());
                let archive = self
                    .archive(
                        request,
                        &entry.version,
                        &archive_url,
                        expected.as_deref(),
                        None,
                    )
                    .await?;
                let digest = format!("sha256:{}", super::archive::sha256_hex(&archive));
                Ok(Resolved {
                    revision: entry.version.clone(),
                    version: entry.version,
                    digest,
                    archive,
                })
            }
            Repository::Oci { registry, name } => {
                let tag = entry.version.replace('+', "_");
                let (manifest, layer) = self.manifest(request, registry, name, &tag).await?;
                let registry = self.registry(registry, request.auth);
                let blob_url = registry.blob_url(name, &layer);
                let hex = layer.trim_start_matches("sha256:").to_string();
                let archive = self
                    .archive(
                        request,
                        &entry.version,
                        &blob_url,
                        Some(&hex),
                        Some(&registry),
                    )
                    .await?;
                Ok(Resolved {
                    revision: format!("{}@{manifest}", entry.version),
                    version: entry.version,
                    digest: manifest,
                    archive,
                })
            }
        }
    }

    /// The credentials go with an archive download only to the repository's
    /// own host (as Helm without `--pass-credentials`): an index may list
    /// archives anywhere.
    fn archive_auth<'a>(&self, request: &ChartRequest<'a>, url: &str) -> Option<&'a Auth> {
        let host = |u: &str| {
            u.split_once("://")
                .map(|(_, rest)| rest.split('/').next().unwrap_or_default().to_string())
        };
        match request.repository {
            Repository::Http { url: repository } if host(repository) == host(url) => request.auth,
            _ => None,
        }
    }

    /// The manifest digest and chart layer of `tag`, kept with the listing.
    async fn manifest(
        &self,
        request: &ChartRequest<'_>,
        registry: &str,
        name: &str,
        tag: &str,
    ) -> Result<(String, String), ChartError> {
        let slot = self.slot(request.repository, request.auth);
        if let Some(known) = slot.lock().await.manifests.get(tag) {
            return Ok(known.clone());
        }
        let found = self
            .registry(registry, request.auth)
            .manifest(name, tag, request.chart)
            .await?;
        slot.lock()
            .await
            .manifests
            .insert(tag.to_string(), found.clone());
        Ok(found)
    }

    /// The archive at `url`, from the disk cache when its digest is known
    /// and kept, else downloaded and checked against `expected`.
    async fn archive(
        &self,
        request: &ChartRequest<'_>,
        version: &str,
        url: &str,
        expected: Option<&str>,
        registry: Option<&Registry<'_>>,
    ) -> Result<Bytes, ChartError> {
        let lock_key = expected.unwrap_or(url).to_string();
        let lock = {
            let mut downloads = self.downloads.lock().expect("chart downloads lock");
            downloads.entry(lock_key).or_default().clone()
        };
        let _held = lock.lock().await;
        let path = expected.map(|hex| self.dir.join("archives").join(format!("{hex}.tgz")));
        if let Some(path) = &path
            && let Ok(bytes) = tokio::fs::read(path).await
        {
            return Ok(Bytes::from(bytes));
        }
        let limit = self.settings.max_archive_bytes;
        let response = match registry {
            Some(registry) => registry.get(url, &[], limit).await,
            None => self
                .http
                .get(url, &[], self.archive_auth(request, url), limit)
                .await
                .map_err(|e| transport(url, "the chart archive", e)),
        }?;
        if response.status.as_u16() != 200 {
            return Err(ChartError::Status {
                url: url.to_string(),
                status: response.status.as_u16(),
                message: short_body(&response.body),
            });
        }
        let actual = super::archive::sha256_hex(&response.body);
        if let Some(expected) = expected
            && actual != expected
        {
            return Err(ChartError::DigestMismatch {
                chart: request.chart.to_string(),
                version: version.to_string(),
                url: url.to_string(),
                expected: expected.to_string(),
                actual,
            });
        }
        if let Some(path) = &path {
            let dir = path.parent().expect("archives have a directory");
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(ChartError::Cache)?;
            let partial = path.with_extension(format!("tgz.{}", std::process::id()));
            tokio::fs::write(&partial, &response.body)
                .await
                .map_err(ChartError::Cache)?;
            tokio::fs::rename(&partial, path)
                .await
                .map_err(ChartError::Cache)?;
        }
        Ok(response.body)
    }
}

/// A chart unpacked for one render; removed when dropped.
pub struct Unpacked {
    _dir: tempfile::TempDir,
    pub chart: PathBuf,
}

impl ChartSource {
    /// Unpacks the resolved archive (confined, within the limits) under the
    /// cache directory.
    pub async fn unpack(&self, chart: &str, resolved: &Resolved) -> Result<Unpacked, ChartError> {
        let scratch = self.dir.join("unpacked");
        std::fs::create_dir_all(&scratch).map_err(ChartError::Cache)?;
        let dir = tempfile::Builder::new()
            .prefix("chart-")
            .tempdir_in(&scratch)
            .map_err(ChartError::Cache)?;
        let archive = resolved.archive.clone();
        let into = dir.path().to_path_buf();
        let limits = self.settings.unpack;
        let unpacked =
            tokio::task::spawn_blocking(move || super::archive::unpack(&archive, &into, limits))
                .await
                .map_err(|e| ChartError::Cache(std::io::Error::other(e.to_string())))?;
        let chart_dir = unpacked.map_err(|message| ChartError::InvalidArchive {
            chart: chart.to_string(),
            version: resolved.version.clone(),
            message,
        })?;
        Ok(Unpacked {
            _dir: dir,
            chart: chart_dir,
        })
    }
}

fn has_version(listing: &Listing, chart: &str, version: &str) -> bool {
    listing
        .entries
        .get(chart)
        .is_some_and(|entries| entries.iter().any(|e| e.version == version))
}

/// The newest few versions, for the VersionNotFound message.
fn available(entries: &[index::Entry]) -> String {
    let mut versions: Vec<(Option<semver::Version>, &str)> = entries
        .iter()
        .map(|e| (semver::Version::parse(&e.version).ok(), e.version.as_str()))
        .collect();
    versions.sort_by(|a, b| b.0.cmp(&a.0));
    let shown: Vec<&str> = versions.iter().take(5).map(|(_, v)| *v).collect();
    let more = versions.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

pub(super) fn transport(url: &str, what: &'static str, error: HttpError) -> ChartError {
    match error {
        HttpError::TooLarge(limit) => ChartError::TooLarge {
            what,
            url: url.to_string(),
            limit,
        },
        HttpError::InvalidUrl(message) => ChartError::InvalidSource(format!("{url}: {message}")),
        other => ChartError::Unreachable {
            url: url.to_string(),
            message: other.to_string(),
        },
    }
}

/// The start of an error body, one line.
pub(super) fn short_body(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_go_only_to_the_repository_host() {
        let dir = tempfile::tempdir().unwrap();
        let source = ChartSource::new(ChartSettings::default(), dir.path().to_path_buf());
        let repository = Repository::Http {
            url: "https://charts.example.com/stable".into(),
        };
        let auth = Auth::Bearer("t".into());
        let request = ChartRequest {
            repository: &repository,
            chart: "web",
            range: None,
            auth: Some(&auth),
            known_version: None,
            fresh_since: None,
        };
        let same = "https://charts.example.com/stable/web-1.0.0.tgz";
        assert_eq!(source.archive_auth(&request, same), Some(&auth));
        let elsewhere = "https://cdn.example.net/web-1.0.0.tgz";
        assert_eq!(source.archive_auth(&request, elsewhere), None);
    }

    #[test]
    fn the_version_not_found_message_lists_the_newest() {
        let entries: Vec<index::Entry> = ["1.0.0", "2.0.0", "1.5.0", "0.1.0", "3.0.0", "2.5.0"]
            .iter()
            .map(|v| index::Entry {
                version: v.to_string(),
                ..Default::default()
            })
            .collect();
        assert_eq!(
            available(&entries),
            "3.0.0, 2.5.0, 2.0.0, 1.5.0, 1.0.0 and 1 more"
        );
    }
}
