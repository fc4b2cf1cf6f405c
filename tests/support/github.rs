//! A local stand-in for the GitHub REST API, for the tests of commit
//! statuses, webhook redelivery, pull request comments and check runs, and
//! the listing of open pull requests (GitHub itself cannot be reached from
//! here). Each request is checked against the documented API (headers, the
//! token, paths, bodies) and recorded; what breaks the documentation is kept
//! as a violation and answered 400, as GitHub would refuse it. It can fail
//! on purpose: an error status, rate limits, a dropped connection, a delay.
//!
//! Shared by the unit tests of `src/report/github/` (through `#[path]`)
//! and the integration tests, which run `setpoint` against it.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use jiff::Timestamp;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The token the fake accepts (`Authorization: Bearer <TOKEN>`).
pub const TOKEN: &str = "ghp_Test0123456789abcdefSECRET";
/// The REST API version every request must name.
pub const API_VERSION: &str = "2022-11-28";
/// GitHub rejects a longer status description.
const DESCRIPTION_LIMIT: usize = 140;
/// GitHub rejects a longer issue comment body.
const COMMENT_LIMIT: usize = 65_536;
/// GitHub rejects a longer check run output summary or text.
const OUTPUT_LIMIT: usize = 65_535;

/// One request as the local GitHub-API test server received it.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Received {
    pub fn headers(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
            .collect()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        match self.headers(name)[..] {
            [value] => Some(value),
            _ => None,
        }
    }

    pub fn query(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// How the local GitHub-API test server misbehaves on a request.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer this status with a GitHub-like error body.
    Status(u16),
    /// Answer this status with these headers (rate limits).
    StatusWith(u16, Vec<(&'static str, String)>),
    /// Close the connection without answering.
    Drop,
    /// Answer normally, this much later.
    Delay(Duration),
}

#[derive(Default)]
pub struct ServerState {
    pub received: Vec<Received>,
    /// Why a request would not pass GitHub's REST API as documented.
    pub violations: Vec<String>,
    /// One for each of the next requests.
    pub faults: VecDeque<Fault>,
    /// For every request once `faults` is empty.
    pub always: Option<Fault>,
    /// Each hook's deliveries (by hook path), a page each, newest first.
    pub hooks: HashMap<String, Vec<Vec<Value>>>,
    /// Issue (pull request) comments, oldest first, by `owner/repo#number`.
    pub comments: HashMap<String, Vec<Value>>,
    /// Check runs created, by `owner/repo`, oldest first.
    pub check_runs: HashMap<String, Vec<Value>>,
    /// The next comment id.
    pub next_comment: u64,
    /// Open pull requests by `owner/repo`, in the order they are listed; a
    /// repository never set answers 404.
    pub pulls: HashMap<String, Vec<Value>>,
}

/// A local stand-in for the GitHub REST API: it checks each request
/// against the documented API, records it and answers as GitHub does,
/// or fails on purpose.
pub struct FakeGitHub {
    pub url: String,
    state: Arc<Mutex<ServerState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitHub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeGitHub {
    pub async fn start() -> FakeGitHub {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(ServerState::default()));
        let task = tokio::spawn(serve(listener, state.clone(), url.clone()));
        FakeGitHub { url, state, task }
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, ServerState> {
        self.state.lock().unwrap()
    }

    pub fn fail_next(&self, faults: impl IntoIterator<Item = Fault>) {
        self.state().faults.extend(faults);
    }

    pub fn fail_always(&self, fault: Fault) {
        self.state().always = Some(fault);
    }

    pub fn received(&self) -> Vec<Received> {
        self.state().received.clone()
    }

    pub fn received_on(&self, method: &str, suffix: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.method == method && r.path.ends_with(suffix))
            .collect()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state().violations.clone()
    }

    /// The comments on `owner/repo#number`, oldest first.
    pub fn comments(&self, repo: &str, number: u64) -> Vec<Value> {
        self.state()
            .comments
            .get(&format!("{repo}#{number}"))
            .cloned()
            .unwrap_or_default()
    }

    /// Makes `repo` (`owner/name`) a repository whose open pull requests
    /// are `pulls` (see [`pull_json`]), listed in this order. Their URLs and
    /// base repository are filled in for `repo`, and the head repository
    /// too unless the pull request comes from a fork.
    pub fn set_pulls(&self, repo: &str, pulls: Vec<Value>) {
        let pulls = pulls
            .into_iter()
            .map(|pull| place_pull(pull, &self.url, repo))
            .collect();
        self.state().pulls.insert(repo.to_owned(), pulls);
    }

    /// The check runs created on `owner/repo`, oldest first.
    pub fn check_runs(&self, repo: &str) -> Vec<Value> {
        self.state()
            .check_runs
            .get(repo)
            .cloned()
            .unwrap_or_default()
    }
}

async fn serve(listener: TcpListener, state: Arc<Mutex<ServerState>>, url: String) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(connection(stream, state.clone(), url.clone()));
    }
}

async fn connection(stream: TcpStream, state: Arc<Mutex<ServerState>>, url: String) {
    let mut stream = BufReader::new(stream);
    while let Some(request) = read_request(&mut stream).await {
        let fault = {
            let mut state = state.lock().unwrap();
            state.faults.pop_front().or_else(|| state.always.clone())
        };
        // A slow request is taken in (recorded) only after its delay, as
        // a slow GitHub would: a later request that does not wait for
        // it would be recorded first.
        if let Some(Fault::Delay(delay)) = fault {
            tokio::time::sleep(delay).await;
        }
        let reply = {
            let mut state = state.lock().unwrap();
            answer(&mut state, &url, request, fault)
        };
        let Some((code, headers, body)) = reply else {
            return; // Fault::Drop
        };
        let mut head = format!(
            "HTTP/1.1 {code} {}\r\ncontent-type: application/json; charset=utf-8\r\n\
             content-length: {}\r\nx-github-media-type: github.v3; format=json\r\n",
            StatusCode::from_u16(code)
                .unwrap()
                .canonical_reason()
                .unwrap_or(""),
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let stream = stream.get_mut();
        if stream.write_all(head.as_bytes()).await.is_err()
            || stream.write_all(body.as_bytes()).await.is_err()
        {
            return;
        }
    }
}

/// One HTTP/1.1 request with a `Content-Length` body, or `None` at the
/// end of the connection.
pub async fn read_request(stream: &mut BufReader<TcpStream>) -> Option<Received> {
    let mut line = String::new();
    stream.read_line(&mut line).await.ok()?;
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_owned(), parts.next()?.to_owned());
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_owned(), value.trim().to_owned()));
    }
    let length = headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
        .map_or(0, |(_, value)| value.parse::<usize>().unwrap());
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.ok()?;
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let query = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key.to_owned(), value.to_owned())
        })
        .collect();
    Some(Received {
        method,
        path: path.to_owned(),
        query,
        headers,
        body,
    })
}

type Reply = Option<(u16, Vec<(&'static str, String)>, String)>;

fn error_body(message: &str) -> String {
    json!({
        "message": message,
        "documentation_url": "https://docs.github.com/rest",
    })
    .to_string()
}

/// Checks `request` against GitHub's REST API and answers it.
fn answer(state: &mut ServerState, url: &str, request: Received, fault: Option<Fault>) -> Reply {
    state.received.push(request.clone());
    let mut violations = Vec::new();
    if request.headers("authorization") != [format!("Bearer {TOKEN}")] {
        violations.push("authorization is not one `Bearer <token>`".to_owned());
    }
    if request.header("accept") != Some("application/vnd.github+json") {
        violations.push(format!("accept is {:?}", request.headers("accept")));
    }
    if request.header("x-github-api-version") != Some(API_VERSION) {
        violations.push(format!(
            "x-github-api-version is {:?}",
            request.headers("x-github-api-version")
        ));
    }
    if request.header("user-agent").is_none_or(str::is_empty) {
        violations.push("no single user-agent".to_owned());
    }
    if request.header("host").is_none() {
        violations.push("no host".to_owned());
    }
    let reply = match fault {
        Some(Fault::Drop) => None,
        Some(Fault::Status(code)) => {
            let message = match code {
                422 => "Validation Failed",
                500 => "Internal Server Error",
                _ => "Server Error",
            };
            Some((code, vec![], error_body(message)))
        }
        Some(Fault::StatusWith(code, headers)) => {
            Some((code, headers, error_body("API rate limit exceeded")))
        }
        Some(Fault::Delay(_)) | None => Some(route(state, url, &request, &mut violations)),
    };
    if violations.is_empty() {
        return reply;
    }
    let message = violations.join("; ");
    state
        .violations
        .push(format!("{} {}: {message}", request.method, request.path));
    Some((400, vec![], error_body(&message)))
}

fn route(
    state: &mut ServerState,
    url: &str,
    request: &Received,
    violations: &mut Vec<String>,
) -> (u16, Vec<(&'static str, String)>, String) {
    let segments: Vec<&str> = request.path.trim_start_matches('/').split('/').collect();
    let not_found = (404, vec![], error_body("Not Found"));
    match (request.method.as_str(), &segments[..]) {
        // https://docs.github.com/rest/commits/statuses#create-a-commit-status
        ("POST", ["repos", owner, repo, "statuses", sha]) => {
            check_status_body(request, violations);
            if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                return (422, vec![], error_body("No commit found for SHA"));
            }
            let body = request.json();
            let location = format!("{url}/repos/{owner}/{repo}/statuses/{sha}");
            let status = json!({
                "url": location,
                "avatar_url": "https://github.com/images/error/hubot_happy.gif",
                "id": state.received.len(),
                "node_id": "MDY6U3RhdHVzMQ==",
                "state": body["state"],
                "description": body["description"],
                "target_url": body.get("target_url").cloned().unwrap_or(Value::Null),
                "context": body["context"],
                "created_at": Timestamp::now().to_string(),
                "updated_at": Timestamp::now().to_string(),
            });
            (201, vec![("location", location)], status.to_string())
        }
        // https://docs.github.com/rest/repos/webhooks#list-deliveries-for-a-repository-webhook
        ("GET", [.., "hooks", _, "deliveries"]) => {
            check_empty_body(request, violations);
            if let Some(per_page) = request.query("per_page")
                && per_page
                    .parse::<u32>()
                    .ok()
                    .is_none_or(|n| n == 0 || n > 100)
            {
                violations.push(format!("per_page {per_page} is not 1..=100"));
            }
            let hook = request.path.trim_end_matches("/deliveries");
            let Some(pages) = state.hooks.get(hook) else {
                return not_found;
            };
            let page = match request.query("cursor") {
                None => 0,
                Some(cursor) => match cursor.strip_prefix("v1_").map(str::parse::<usize>) {
                    Some(Ok(page)) => page,
                    _ => return (400, vec![], error_body("Bad cursor")),
                },
            };
            let items = pages.get(page).cloned().unwrap_or_default();
            let mut headers = vec![];
            if page + 1 < pages.len() {
                let next = format!(
                    "<{url}{hook}/deliveries?per_page={}&cursor=v1_{}>; rel=\"next\"",
                    request.query("per_page").unwrap_or("30"),
                    page + 1
                );
                headers.push(("link", next));
            }
            (200, headers, Value::Array(items).to_string())
        }
        // https://docs.github.com/rest/repos/webhooks#redeliver-a-delivery-for-a-repository-webhook
        ("POST", [.., "hooks", _, "deliveries", id, "attempts"]) => {
            check_empty_body(request, violations);
            let hook = request.path.split("/deliveries/").next().unwrap();
            let known = state.hooks.get(hook).is_some_and(|pages| {
                pages
                    .iter()
                    .flatten()
                    .any(|delivery| delivery["id"].as_u64() == id.parse().ok())
            });
            if !known {
                return not_found;
            }
            (202, vec![], "{}".into())
        }
        // https://docs.github.com/rest/issues/comments#list-issue-comments
        ("GET", ["repos", owner, repo, "issues", number, "comments"]) => {
            check_empty_body(request, violations);
            let per_page = match request.query("per_page").map(str::parse::<usize>) {
                None => 30,
                Some(Ok(n)) if (1..=100).contains(&n) => n,
                Some(_) => {
                    violations.push("per_page is not 1..=100".into());
                    30
                }
            };
            let page = request
                .query("page")
                .and_then(|p| p.parse::<usize>().ok())
                .unwrap_or(1)
                .max(1);
            let key = format!("{owner}/{repo}#{number}");
            let all = state.comments.get(&key).cloned().unwrap_or_default();
            let items: Vec<Value> = all
                .iter()
                .skip((page - 1) * per_page)
                .take(per_page)
                .cloned()
                .collect();
            let mut headers = vec![];
            if page * per_page < all.len() {
                headers.push((
                    "link",
                    format!(
                        "<{url}/repos/{owner}/{repo}/issues/{number}/comments?per_page={per_page}&page={}>; rel=\"next\"",
                        page + 1
                    ),
                ));
            }
            (200, headers, Value::Array(items).to_string())
        }
        // https://docs.github.com/rest/issues/comments#create-an-issue-comment
        ("POST", ["repos", owner, repo, "issues", number, "comments"]) => {
            let Some(body) = check_comment_body(request, violations) else {
                return (422, vec![], error_body("Validation Failed"));
            };
            if number.parse::<u64>().is_err() {
                return not_found;
            }
            state.next_comment += 1;
            let id = state.next_comment;
            let comment = comment_json(url, owner, repo, number, id, &body);
            state
                .comments
                .entry(format!("{owner}/{repo}#{number}"))
                .or_default()
                .push(comment.clone());
            let location = comment["url"].as_str().unwrap_or_default().to_owned();
            (201, vec![("location", location)], comment.to_string())
        }
        // https://docs.github.com/rest/issues/comments#update-an-issue-comment
        ("PATCH", ["repos", owner, repo, "issues", "comments", id]) => {
            let Some(body) = check_comment_body(request, violations) else {
                return (422, vec![], error_body("Validation Failed"));
            };
            let prefix = format!("{owner}/{repo}#");
            let found = state
                .comments
                .iter_mut()
                .filter(|(key, _)| key.starts_with(&prefix))
                .flat_map(|(_, comments)| comments.iter_mut())
                .find(|c| c["id"].as_u64() == id.parse().ok());
            let Some(comment) = found else {
                return not_found;
            };
            comment["body"] = Value::String(body);
            comment["updated_at"] = Value::String(Timestamp::now().to_string());
            (200, vec![], comment.to_string())
        }
        // https://docs.github.com/rest/checks/runs#create-a-check-run
        ("POST", ["repos", owner, repo, "check-runs"]) => {
            check_check_run_body(request, violations);
            let body = request.json();
            if !body["head_sha"]
                .as_str()
                .is_some_and(|sha| sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                return (422, vec![], error_body("No commit found for SHA"));
            }
            let runs = state
                .check_runs
                .entry(format!("{owner}/{repo}"))
                .or_default();
            let mut run = body.clone();
            run["id"] = json!(runs.len() + 1);
            run["url"] = json!(format!(
                "{url}/repos/{owner}/{repo}/check-runs/{}",
                runs.len() + 1
            ));
            runs.push(run.clone());
            (201, vec![], run.to_string())
        }
        // https://docs.github.com/rest/pulls/pulls#list-pull-requests
        ("GET", ["repos", owner, repo, "pulls"]) => {
            check_empty_body(request, violations);
            let known: HashSet<&str> = [
                "state",
                "head",
                "base",
                "sort",
                "direction",
                "per_page",
                "page",
            ]
            .into();
            for (key, _) in &request.query {
                if !known.contains(key.as_str()) {
                    violations.push(format!("unknown parameter {key}"));
                }
            }
            // GitHub lists open ones without `state`; the fake keeps open
            // ones only, so it wants them asked for by name.
            if request.query("state") != Some("open") {
                violations.push(format!("state is {:?}, not open", request.query("state")));
            }
            let per_page = match request.query("per_page").map(str::parse::<usize>) {
                None => 30,
                Some(Ok(n)) if (1..=100).contains(&n) => n,
                Some(_) => {
                    violations.push("per_page is not 1..=100".into());
                    30
                }
            };
            let page = match request.query("page").map(str::parse::<usize>) {
                None => 1,
                Some(Ok(n)) if n >= 1 => n,
                Some(_) => {
                    violations.push("page is not a number from 1".into());
                    1
                }
            };
            let Some(all) = state.pulls.get(&format!("{owner}/{repo}")) else {
                return not_found;
            };
            let items: Vec<Value> = all
                .iter()
                .skip((page - 1) * per_page)
                .take(per_page)
                .cloned()
                .collect();
            let last = all.len().div_ceil(per_page).max(1);
            let link = |page: usize, rel: &str| {
                format!(
                    "<{url}/repos/{owner}/{repo}/pulls?state=open&per_page={per_page}&page={page}>; rel=\"{rel}\""
                )
            };
            // As GitHub does: prev and first from the second page on, next
            // and last before the last page.
            let mut links = Vec::new();
            if page > 1 {
                links.push(link(page - 1, "prev"));
            }
            if page < last {
                links.push(link(page + 1, "next"));
                links.push(link(last, "last"));
            }
            if page > 1 {
                links.push(link(1, "first"));
            }
            let headers = if links.is_empty() {
                vec![]
            } else {
                vec![("link", links.join(", "))]
            };
            (200, headers, Value::Array(items).to_string())
        }
        _ => {
            violations.push("no such endpoint".into());
            not_found
        }
    }
}

/// Stands for the repository in a [`pull_json`] until [`FakeGitHub::set_pulls`]
/// names it.
const SOME_REPO: &str = "OWNER/REPO";

/// An open pull request as GitHub lists it (trimmed of the many URLs and
/// of the users), from `branch` into `base`, its head at `head_sha`. Its
/// repository is filled in by [`FakeGitHub::set_pulls`]; for a pull request
/// from a fork, set `head.repo` after this.
pub fn pull_json(number: u64, branch: &str, base: &str, head_sha: &str, labels: &[&str]) -> Value {
    let now = Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let labels: Vec<Value> = labels
        .iter()
        .enumerate()
        .map(|(i, name)| {
            json!({
                "id": 208045946 + i,
                "node_id": "MDU6TGFiZWwyMDgwNDU5NDY=",
                "name": name,
                "description": null,
                "color": "f29513",
                "default": false,
            })
        })
        .collect();
    let user = json!({"login": "octocat", "id": 1, "type": "User", "site_admin": false});
    json!({
        "url": null,
        "id": 1000 + number,
        "node_id": "MDExOlB1bGxSZXF1ZXN0MQ==",
        "html_url": null,
        "diff_url": null,
        "patch_url": null,
        "number": number,
        "state": "open",
        "locked": false,
        "title": format!("Change {branch}"),
        "user": user,
        "body": null,
        "labels": labels,
        "milestone": null,
        "active_lock_reason": null,
        "created_at": now,
        "updated_at": now,
        "closed_at": null,
        "merged_at": null,
        "merge_commit_sha": null,
        "assignee": null,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "head": {
            "label": format!("octocat:{branch}"),
            "ref": branch,
            "sha": head_sha,
            "user": user,
            "repo": {"full_name": SOME_REPO},
        },
        "base": {
            "label": format!("octocat:{base}"),
            "ref": base,
            "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e",
            "user": user,
            "repo": {"full_name": SOME_REPO},
        },
        "author_association": "OWNER",
        "auto_merge": null,
        "draft": false,
    })
}

/// `pull` as a pull request of `repo` on the fake at `url`.
fn place_pull(mut pull: Value, url: &str, repo: &str) -> Value {
    let number = pull["number"].as_u64().unwrap_or_default();
    let (owner, name) = repo.split_once('/').unwrap_or((repo, repo));
    let repository = json!({
        "id": 1296269,
        "node_id": "MDEwOlJlcG9zaXRvcnkxMjk2MjY5",
        "name": name,
        "full_name": repo,
        "owner": {"login": owner, "id": 1, "type": "User"},
        "private": false,
        "html_url": format!("https://github.com/{repo}"),
        "url": format!("{url}/repos/{repo}"),
        "default_branch": "main",
    });
    pull["url"] = json!(format!("{url}/repos/{repo}/pulls/{number}"));
    pull["html_url"] = json!(format!("https://github.com/{repo}/pull/{number}"));
    pull["diff_url"] = json!(format!("https://github.com/{repo}/pull/{number}.diff"));
    pull["patch_url"] = json!(format!("https://github.com/{repo}/pull/{number}.patch"));
    pull["base"]["repo"] = repository.clone();
    if pull["head"]["repo"]["full_name"] == SOME_REPO {
        pull["head"]["repo"] = repository;
    }
    pull
}

/// An issue comment as GitHub returns it (trimmed to what clients read).
fn comment_json(url: &str, owner: &str, repo: &str, number: &str, id: u64, body: &str) -> Value {
    let now = Timestamp::now().to_string();
    json!({
        "id": id,
        "node_id": "MDEyOklzc3VlQ29tbWVudDE=",
        "url": format!("{url}/repos/{owner}/{repo}/issues/comments/{id}"),
        "html_url": format!("https://github.com/{owner}/{repo}/pull/{number}#issuecomment-{id}"),
        "issue_url": format!("{url}/repos/{owner}/{repo}/issues/{number}"),
        "body": body,
        "user": {"login": "setpoint[bot]", "id": 1, "type": "Bot"},
        "author_association": "NONE",
        "created_at": now,
        "updated_at": now,
    })
}

/// `{"body": "..."}`, the only field, at most 65,536 characters.
fn check_comment_body(request: &Received, violations: &mut Vec<String>) -> Option<String> {
    if request.header("content-type") != Some("application/json") {
        violations.push(format!(
            "content-type {:?}",
            request.headers("content-type")
        ));
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&request.body) else {
        violations.push("the body is not a JSON object".into());
        return None;
    };
    for key in body.keys() {
        if key != "body" {
            violations.push(format!("unknown field {key}"));
        }
    }
    match body.get("body").and_then(Value::as_str) {
        Some(text) if text.chars().count() <= COMMENT_LIMIT => Some(text.to_owned()),
        Some(text) => {
            violations.push(format!("body of {} characters", text.chars().count()));
            None
        }
        None => {
            violations.push("no body".into());
            None
        }
    }
}

fn check_check_run_body(request: &Received, violations: &mut Vec<String>) {
    if request.header("content-type") != Some("application/json") {
        violations.push(format!(
            "content-type {:?}",
            request.headers("content-type")
        ));
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&request.body) else {
        violations.push("the body is not a JSON object".into());
        return;
    };
    let known: HashSet<&str> = [
        "name",
        "head_sha",
        "details_url",
        "external_id",
        "status",
        "started_at",
        "conclusion",
        "completed_at",
        "output",
        "actions",
    ]
    .into();
    for key in body.keys() {
        if !known.contains(key.as_str()) {
            violations.push(format!("unknown field {key}"));
        }
    }
    if body
        .get("name")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        violations.push("no name".into());
    }
    let status = body.get("status").and_then(Value::as_str);
    if !matches!(status, None | Some("queued" | "in_progress" | "completed")) {
        violations.push(format!("status {status:?}"));
    }
    match body.get("conclusion").and_then(Value::as_str) {
        None => {
            if status == Some("completed") {
                violations.push("completed without a conclusion".into());
            }
        }
        Some(
            "action_required" | "cancelled" | "failure" | "neutral" | "success" | "skipped"
            | "stale" | "timed_out",
        ) => {}
        Some(other) => violations.push(format!("conclusion {other:?}")),
    }
    let Some(output) = body.get("output") else {
        return;
    };
    for field in ["title", "summary"] {
        if !output.get(field).is_some_and(Value::is_string) {
            violations.push(format!("output.{field} missing"));
        }
    }
    for field in ["summary", "text"] {
        if let Some(text) = output.get(field).and_then(Value::as_str)
            && text.chars().count() > OUTPUT_LIMIT
        {
            violations.push(format!("output.{field} over {OUTPUT_LIMIT} characters"));
        }
    }
    let annotations = output
        .get("annotations")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if annotations.len() > 50 {
        violations.push("more than 50 annotations".into());
    }
    for annotation in &annotations {
        let ok = annotation["path"].is_string()
            && annotation["start_line"].is_u64()
            && annotation["end_line"].is_u64()
            && annotation["message"].is_string()
            && matches!(
                annotation["annotation_level"].as_str(),
                Some("notice" | "warning" | "failure")
            );
        if !ok {
            violations.push(format!("annotation {annotation}"));
        }
    }
}

fn check_empty_body(request: &Received, violations: &mut Vec<String>) {
    if !request.body.is_empty() {
        violations.push("a body where the API takes none".into());
    }
}

fn check_status_body(request: &Received, violations: &mut Vec<String>) {
    if request.header("content-type") != Some("application/json") {
        violations.push(format!(
            "content-type {:?}",
            request.headers("content-type")
        ));
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&request.body) else {
        violations.push("the body is not a JSON object".into());
        return;
    };
    let known: HashSet<&str> = ["state", "target_url", "description", "context"].into();
    for key in body.keys() {
        if !known.contains(key.as_str()) {
            violations.push(format!("unknown field {key}"));
        }
    }
    match body.get("state").and_then(Value::as_str) {
        Some("pending" | "success" | "failure" | "error") => {}
        state => violations.push(format!("state {state:?}")),
    }
    match body.get("context").and_then(Value::as_str) {
        Some(context) if !context.is_empty() => {}
        context => violations.push(format!("context {context:?}")),
    }
    match body.get("description") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) if text.chars().count() <= DESCRIPTION_LIMIT => {}
        Some(other) => violations.push(format!("description {other}")),
    }
    match body.get("target_url") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(other) => violations.push(format!("target_url {other}")),
    }
}

/// One item of a hook's deliveries as GitHub lists them: `code` is what
/// the receiver answered (0: not reached), `minutes_ago` when.
pub fn delivery(id: u64, guid: &str, code: i64, minutes_ago: i64, redelivery: bool) -> Value {
    let at = Timestamp::now() - jiff::SignedDuration::from_mins(minutes_ago);
    json!({
        "id": id,
        "guid": guid,
        "delivered_at": at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "redelivery": redelivery,
        "duration": 0.27,
        "status": if code == 200 { "OK".to_owned() } else { format!("Invalid HTTP Response: {code}") },
        "status_code": code,
        "event": "push",
        "action": null,
        "installation_id": null,
        "repository_id": 1296269,
        "throttled_at": null,
    })
}
