//! A local stand-in for GitLab's REST API v4, the merge request notes a
//! preview keeps (list, create, edit) and the open merge requests the
//! ApplicationSet pull-request generator lists, and the commit statuses
//! of a sync (with GitLab's refusal of a transition to the state a status is
//! already in), each request checked against GitLab's documentation (the
//! `PRIVATE-TOKEN` header, JSON bodies with the documented fields only,
//! pages of at most 100) and recorded; what breaks it is kept as a violation
//! and answered 400. It can fail on purpose: an error status for the next
//! requests.
//!
//! Shared by the unit tests of `src/preview/gitlab.rs` (through `#[path]`,
//! with the fake GitHub as its `super::github`) and the integration tests.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::github::{Received, read_request};

/// The token the fake accepts.
pub const TOKEN: &str = "glpat-preview-notes-token";

#[derive(Default)]
pub struct GitLabState {
    pub received: Vec<Received>,
    pub violations: Vec<String>,
    /// Notes by `project/iid`, oldest first.
    pub notes: HashMap<String, Vec<Value>>,
    /// Open merge requests by project (its path or id, as set), in the order
    /// they are listed; a project never set answers 404.
    pub merge_requests: HashMap<String, Vec<Value>>,
    /// Commit statuses by `project/sha` (the project's path as decoded),
    /// oldest first; a status is updated in place while it is pending or
    /// running, as GitLab updates its job.
    pub statuses: HashMap<String, Vec<Value>>,
    /// The status each of the next requests is answered with.
    pub faults: VecDeque<u16>,
    next_id: u64,
}

type Reply = (u16, Vec<(&'static str, String)>, String);

pub struct FakeGitLab {
    /// The API URL: `http://127.0.0.1:PORT/api/v4`.
    pub url: String,
    state: Arc<Mutex<GitLabState>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitLab {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeGitLab {
    pub async fn start() -> FakeGitLab {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/api/v4", listener.local_addr().unwrap());
        let state = Arc::new(Mutex::new(GitLabState::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    while let Some(request) = read_request(&mut stream).await {
                        let (code, headers, body) = answer(&mut state.lock().unwrap(), request);
                        let mut head = format!(
                            "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
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
                });
            }
        });
        FakeGitLab { url, state, task }
    }

    /// Makes `project` (a `group/project` path, or a numeric id) a project
    /// whose open merge requests are `merge_requests` (see
    /// [`merge_request_json`]), listed in this order; their URLs are filled
    /// in for `project`.
    pub fn set_merge_requests(&self, project: &str, merge_requests: Vec<Value>) {
        let merge_requests = merge_requests
            .into_iter()
            .map(|mut merge_request| {
                let iid = merge_request["iid"].as_u64().unwrap_or_default();
                merge_request["web_url"] = json!(format!(
                    "https://gitlab.example.com/{project}/-/merge_requests/{iid}"
                ));
                merge_request["references"]["full"] = json!(format!("{project}!{iid}"));
                merge_request
            })
            .collect();
        self.state
            .lock()
            .unwrap()
            .merge_requests
            .insert(project.to_owned(), merge_requests);
    }

    pub fn notes(&self, project: &str, iid: u64) -> Vec<Value> {
        let state = self.state.lock().unwrap();
        state
            .notes
            .get(&format!("{project}/{iid}"))
            .cloned()
            .unwrap_or_default()
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// The commit statuses of `project` (its path) on `sha`, oldest first.
    pub fn statuses(&self, project: &str, sha: &str) -> Vec<Value> {
        let state = self.state.lock().unwrap();
        state
            .statuses
            .get(&format!("{project}/{sha}"))
            .cloned()
            .unwrap_or_default()
    }

    /// Answers each of the next requests with one of `codes`, in order.
    pub fn fail_next(&self, codes: impl IntoIterator<Item = u16>) {
        self.state.lock().unwrap().faults.extend(codes);
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }
}

fn note_body(request: &Received, violations: &mut Vec<String>) -> Option<String> {
    if request.header("content-type") != Some("application/json") {
        violations.push(format!(
            "content-type {:?}",
            request.headers("content-type")
        ));
    }
    match serde_json::from_slice::<Value>(&request.body) {
        Ok(Value::Object(body)) => {
            for key in body.keys().filter(|k| *k != "body") {
                violations.push(format!("unknown field {key}"));
            }
            body.get("body").and_then(Value::as_str).map(str::to_owned)
        }
        _ => {
            violations.push("the body is not a JSON object".into());
            None
        }
    }
}

fn not_found(what: &str) -> Reply {
    (
        404,
        vec![],
        json!({ "message": format!("404 {what} Not Found") }).to_string(),
    )
}

/// A project path segment as GitLab reads it: `group%2Fproject` is
/// `group/project`.
fn decode_segment(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                i += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

fn answer(state: &mut GitLabState, request: Received) -> Reply {
    state.received.push(request.clone());
    if let Some(code) = state.faults.pop_front() {
        let message = json!({ "message": format!("{code} failing on purpose") });
        return (code, vec![], message.to_string());
    }
    let mut violations = Vec::new();
    if request.header("private-token") != Some(TOKEN) {
        violations.push("PRIVATE-TOKEN is not the token".to_string());
    }
    if request.header("authorization").is_some() {
        violations.push("an Authorization header beside PRIVATE-TOKEN".to_string());
    }
    let segments: Vec<&str> = request.path.trim_start_matches('/').split('/').collect();
    let reply = match (request.method.as_str(), &segments[..]) {
        // https://docs.gitlab.com/api/notes/#list-all-merge-request-notes
        (
            "GET",
            [
                "api",
                "v4",
                "projects",
                project,
                "merge_requests",
                iid,
                "notes",
            ],
        ) => {
            let per_page = request
                .query("per_page")
                .and_then(|p| p.parse::<usize>().ok())
                .unwrap_or(20);
            if !(1..=100).contains(&per_page) {
                violations.push(format!("per_page {per_page}"));
            }
            let page = request
                .query("page")
                .and_then(|p| p.parse::<usize>().ok())
                .unwrap_or(1)
                .max(1);
            let all = state
                .notes
                .get(&format!("{project}/{iid}"))
                .cloned()
                .unwrap_or_default();
            let items: Vec<Value> = all
                .into_iter()
                .skip((page - 1) * per_page)
                .take(per_page)
                .collect();
            (200, vec![], Value::Array(items).to_string())
        }
        // https://docs.gitlab.com/api/merge_requests/#list-project-merge-requests
        ("GET", ["api", "v4", "projects", project, "merge_requests"]) => {
            list_merge_requests(state, &request, project, &mut violations)
        }
        // https://docs.gitlab.com/api/notes/#create-new-merge-request-note
        (
            "POST",
            [
                "api",
                "v4",
                "projects",
                project,
                "merge_requests",
                iid,
                "notes",
            ],
        ) => match note_body(&request, &mut violations) {
            Some(body) => {
                state.next_id += 1;
                let note = json!({"id": state.next_id, "body": body, "system": false,
                                      "noteable_type": "MergeRequest"});
                state
                    .notes
                    .entry(format!("{project}/{iid}"))
                    .or_default()
                    .push(note.clone());
                (201, vec![], note.to_string())
            }
            None => (
                400,
                vec![],
                json!({"message": "body is missing"}).to_string(),
            ),
        },
        // https://docs.gitlab.com/api/notes/#modify-existing-merge-request-note
        (
            "PUT",
            [
                "api",
                "v4",
                "projects",
                project,
                "merge_requests",
                iid,
                "notes",
                id,
            ],
        ) => match note_body(&request, &mut violations) {
            Some(body) => {
                let notes = state.notes.entry(format!("{project}/{iid}")).or_default();
                match notes
                    .iter_mut()
                    .find(|n| n["id"].as_u64() == id.parse().ok())
                {
                    Some(note) => {
                        note["body"] = Value::String(body);
                        (200, vec![], note.to_string())
                    }
                    None => not_found("Note"),
                }
            }
            None => (
                400,
                vec![],
                json!({"message": "body is missing"}).to_string(),
            ),
        },
        // https://docs.gitlab.com/api/commits/#set-the-pipeline-status-of-a-commit
        ("POST", ["api", "v4", "projects", project, "statuses", sha]) => {
            set_status(state, &request, project, sha, &mut violations)
        }
        _ => {
            violations.push("no such endpoint".into());
            (404, vec![], json!({"message": "404 Not found"}).to_string())
        }
    };
    if violations.is_empty() {
        return reply;
    }
    let message = violations.join("; ");
    state
        .violations
        .push(format!("{} {}: {message}", request.method, request.path));
    (400, vec![], json!({ "message": message }).to_string())
}

/// GitLab's commit status: one per name on a commit, updated in place while
/// it is pending or running (GitLab's `running_or_pending` scope), a new one
/// once it finished. A transition its state machine has not (`enqueue` from
/// pending or running, `run` from running) is refused with GitLab's 400.
fn set_status(
    state: &mut GitLabState,
    request: &Received,
    project: &str,
    sha: &str,
    violations: &mut Vec<String>,
) -> Reply {
    if request.header("content-type") != Some("application/json") {
        violations.push(format!(
            "content-type {:?}",
            request.headers("content-type")
        ));
    }
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&request.body) else {
        violations.push("the body is not a JSON object".into());
        return (
            400,
            vec![],
            json!({"message": "400 Bad request"}).to_string(),
        );
    };
    let known: HashSet<&str> = [
        "state",
        "ref",
        "name",
        "context",
        "target_url",
        "description",
        "coverage",
        "pipeline_id",
    ]
    .into();
    for key in body.keys().filter(|key| !known.contains(key.as_str())) {
        violations.push(format!("unknown field {key}"));
    }
    let text = |key: &str| body.get(key).and_then(Value::as_str);
    let new = text("state").unwrap_or_default().to_owned();
    if ![
        "pending", "running", "success", "failed", "canceled", "skipped",
    ]
    .contains(&new.as_str())
    {
        violations.push(format!("state {:?}", body.get("state")));
    }
    let name = text("name")
        .or(text("context"))
        .unwrap_or("default")
        .to_owned();
    for key in ["description", "target_url", "ref", "name"] {
        match body.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::String(value)) if value.chars().count() <= 255 => {}
            Some(other) => violations.push(format!("{key} {other}")),
        }
    }
    if let Some(url) = text("target_url")
        && !(url.starts_with("https://") || url.starts_with("http://"))
    {
        violations.push(format!("target_url {url:?} is not a URL"));
    }
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return not_found("Commit");
    }
    let statuses = state
        .statuses
        .entry(format!("{}/{sha}", decode_segment(project)))
        .or_default();
    let open = statuses.iter_mut().rev().find(|status| {
        status["name"] == name.as_str()
            && matches!(status["status"].as_str(), Some("pending" | "running"))
    });
    let now = jiff::Timestamp::now().to_string();
    let status = match open {
        Some(status) => {
            let from = status["status"].as_str().unwrap_or_default().to_owned();
            let event = match new.as_str() {
                "pending" => Some("enqueue"),
                "running" if from == "running" => Some("run"),
                _ => None,
            };
            if let Some(event) = event {
                let message = format!(
                    "Cannot transition status via :{event} from :{from} (Reason(s): Status cannot transition via \"{event}\")"
                );
                return (400, vec![], json!({ "message": message }).to_string());
            }
            status["status"] = json!(new);
            status
        }
        None => {
            state.next_id += 1;
            statuses.push(json!({
                "id": state.next_id,
                "sha": sha,
                "ref": text("ref").unwrap_or("main"),
                "status": new,
                "name": name,
                "created_at": now,
                "started_at": null,
                "finished_at": null,
                "allow_failure": false,
                "coverage": null,
                "author": {"id": 1, "username": "setpoint-bot", "name": "Setpoint", "state": "active"},
            }));
            statuses.last_mut().unwrap()
        }
    };
    status["description"] = body.get("description").cloned().unwrap_or(Value::Null);
    status["target_url"] = body.get("target_url").cloned().unwrap_or(Value::Null);
    if status["status"] == "running" {
        status["started_at"] = json!(now);
    }
    if !matches!(status["status"].as_str(), Some("pending" | "running")) {
        status["finished_at"] = json!(now);
    }
    (201, vec![], status.to_string())
}

/// A page of `project`'s open merge requests, with GitLab's offset
/// pagination headers (`x-next-page` empty on the last page) and `Link`.
fn list_merge_requests(
    state: &GitLabState,
    request: &Received,
    project: &str,
    violations: &mut Vec<String>,
) -> Reply {
    if !request.body.is_empty() {
        violations.push("a body where the API takes none".into());
    }
    let known: HashSet<&str> = [
        "state",
        "per_page",
        "page",
        "order_by",
        "sort",
        "labels",
        "with_labels_details",
        "milestone",
        "view",
        "scope",
        "author_id",
        "assignee_id",
        "source_branch",
        "target_branch",
        "search",
        "wip",
        "draft",
        "created_after",
        "created_before",
        "updated_after",
        "updated_before",
    ]
    .into();
    for (key, _) in &request.query {
        if !known.contains(key.as_str()) {
            violations.push(format!("unknown parameter {key}"));
        }
    }
    // GitLab lists every state without `state`; the fake keeps open ones
    // only, so it wants them asked for.
    if request.query("state") != Some("opened") {
        violations.push(format!("state is {:?}, not opened", request.query("state")));
    }
    let per_page = match request.query("per_page").map(str::parse::<usize>) {
        None => 20,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => {
            violations.push("per_page is not 1..=100".into());
            20
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
    let Some(all) = state.merge_requests.get(&decode_segment(project)) else {
        return not_found("Project");
    };
    let items: Vec<Value> = all
        .iter()
        .skip((page - 1) * per_page)
        .take(per_page)
        .cloned()
        .collect();
    let pages = all.len().div_ceil(per_page).max(1);
    let next = if page < pages {
        (page + 1).to_string()
    } else {
        String::new()
    };
    let prev = if page > 1 {
        (page - 1).to_string()
    } else {
        String::new()
    };
    let link = |page: usize, rel: &str| {
        format!(
            "<http://gitlab.example.com/api/v4/projects/{project}/merge_requests?page={page}&per_page={per_page}&state=opened>; rel=\"{rel}\""
        )
    };
    let mut links = Vec::new();
    if page > 1 {
        links.push(link(page - 1, "prev"));
    }
    if page < pages {
        links.push(link(page + 1, "next"));
    }
    links.push(link(1, "first"));
    links.push(link(pages, "last"));
    let headers = vec![
        ("x-page", page.to_string()),
        ("x-per-page", per_page.to_string()),
        ("x-next-page", next),
        ("x-prev-page", prev),
        ("x-total", all.len().to_string()),
        ("x-total-pages", pages.to_string()),
        ("link", links.join(", ")),
    ];
    (200, headers, Value::Array(items).to_string())
}

/// An open merge request as GitLab lists it (trimmed of the users), from
/// `source_branch` into `target_branch`, its head at `sha`. Its URLs are
/// filled in by [`FakeGitLab::set_merge_requests`].
pub fn merge_request_json(
    iid: u64,
    source_branch: &str,
    target_branch: &str,
    sha: &str,
    labels: &[&str],
) -> Value {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S.000Z")
        .to_string();
    let author = json!({"id": 1, "username": "admin", "name": "Administrator", "state": "active"});
    json!({
        "id": 1000 + iid,
        "iid": iid,
        "project_id": 14,
        "title": format!("Change {source_branch}"),
        "description": "",
        "state": "opened",
        "created_at": now,
        "updated_at": now,
        "merged_by": null,
        "merged_at": null,
        "closed_by": null,
        "closed_at": null,
        "target_branch": target_branch,
        "source_branch": source_branch,
        "user_notes_count": 0,
        "upvotes": 0,
        "downvotes": 0,
        "author": author,
        "assignees": [],
        "reviewers": [],
        "source_project_id": 14,
        "target_project_id": 14,
        "labels": labels,
        "draft": false,
        "work_in_progress": false,
        "milestone": null,
        "merge_when_pipeline_succeeds": false,
        "merge_status": "can_be_merged",
        "detailed_merge_status": "mergeable",
        "sha": sha,
        "merge_commit_sha": null,
        "squash_commit_sha": null,
        "discussion_locked": null,
        "should_remove_source_branch": null,
        "force_remove_source_branch": false,
        "reference": format!("!{iid}"),
        "references": {"short": format!("!{iid}"), "relative": format!("!{iid}"), "full": null},
        "web_url": null,
        "squash": false,
        "has_conflicts": false,
        "blocking_discussions_resolved": true,
    })
}
