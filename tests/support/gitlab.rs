//! A local stand-in for GitLab's REST API v4, the merge request notes a
//! preview keeps (list, create, edit), each request checked against
//! GitLab's documentation (the `PRIVATE-TOKEN` header, JSON bodies with a
//! `body` only, pages of at most 100) and recorded; what breaks it is kept
//! as a violation and answered 400.
#![allow(dead_code)]

use std::collections::HashMap;
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
    next_id: u64,
}

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
                        let (code, body) = answer(&mut state.lock().unwrap(), request);
                        let head = format!(
                            "HTTP/1.1 {code} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                            body.len()
                        );
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

fn answer(state: &mut GitLabState, request: Received) -> (u16, String) {
    state.received.push(request.clone());
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
            (200, Value::Array(items).to_string())
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
                (201, note.to_string())
            }
            None => (400, json!({"message": "body is missing"}).to_string()),
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
                        (200, note.to_string())
                    }
                    None => (404, json!({"message": "404 Not found"}).to_string()),
                }
            }
            None => (400, json!({"message": "body is missing"}).to_string()),
        },
        _ => {
            violations.push("no such endpoint".into());
            (404, json!({"message": "404 Not found"}).to_string())
        }
    };
    if violations.is_empty() {
        return reply;
    }
    let message = violations.join("; ");
    state
        .violations
        .push(format!("{} {}: {message}", request.method, request.path));
    (400, json!({ "message": message }).to_string())
}
