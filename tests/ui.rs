//! The dashboard (`setpoint run --ui-listen`) against the real control
//! plane, over plain HTTP (curl): who may see what (TokenReview and
//! SubjectAccessReview for real service-account tokens), the Sync button's
//! rules, Rollback, Suspend and Resume (issue 30), and a drift correction
//! reaching an open page's event stream.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams};
use setpoint::api::{Application, SyncPolicy};
use setpoint::appset::SET_LABEL;
use support::app::{
    automated, create_app, deployment_yaml, get_app, install_crd, settled_at, synced_at,
};
use support::process::{Setpoint, free_port, github_push, post, post_github};
use support::viewer::viewer;
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const SECRET: &str = "ui-webhook-secret";

/// `setpoint run` with the dashboard on a port of its own, handling the
/// Applications of `namespaces`.
fn run_with_ui(namespaces: &[&str], auth: &str, cache: &Path) -> (Setpoint, u16, u16) {
    let ui = free_port();
    let webhook = free_port();
    let listen = format!("127.0.0.1:{webhook}");
    let ui_listen = format!("127.0.0.1:{ui}");
    let scope = namespaces.join(",");
    let setpoint = Setpoint::spawn(
        &[
            "run",
            "--listen",
            &listen,
            "--no-sweep",
            "--ui-listen",
            &ui_listen,
            "--ui-auth",
            auth,
        ],
        &[
            ("SETPOINT_WATCH_NAMESPACES", &scope),
            ("POD_NAMESPACE", namespaces[0]),
            ("SETPOINT_GITHUB_SECRETS", SECRET),
        ],
        cache,
    );
    (setpoint, ui, webhook)
}

async fn wait_ui(setpoint: &mut Setpoint, port: u16) {
    let log = setpoint.log.clone();
    let child = &mut setpoint.child;
    wait_for("the dashboard to listen", Duration::from_secs(30), || {
        let exited = child.try_wait().ok().flatten();
        let log = log.clone();
        async move {
            if let Some(status) = exited {
                return Err(format!(
                    "setpoint exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                ));
            }
            match post(port, "/healthz", &[], "", "GET") {
                (200, _) => Ok(()),
                (code, body) => Err(format!("{code} {body}")),
            }
        }
    })
    .await;
}

fn get(port: u16, path: &str, token: Option<&str>) -> (u16, String) {
    let header = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = header
        .as_deref()
        .map(|h| vec![("Authorization", h)])
        .unwrap_or_default();
    post(port, path, &headers, "", "GET")
}

fn names(json: &str) -> Vec<String> {
    let value: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    value["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            format!(
                "{}/{}",
                item["namespace"].as_str().unwrap(),
                item["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Headers and body of a request, with curl (`-i`).
fn raw(port: u16, method: &str, path: &str, headers: &[&str], body: &str) -> String {
    let mut command = Command::new("curl");
    command
        .args(["-s", "-i", "-X", method])
        .arg(format!("http://127.0.0.1:{port}{path}"));
    for header in headers {
        command.arg("-H").arg(header);
    }
    if method == "POST" {
        command.arg("--data-raw").arg(body);
    }
    String::from_utf8_lossy(&command.output().unwrap().stdout).to_string()
}

#[tokio::test]
async fn viewers_see_only_what_their_token_may_read_and_sync_only_what_it_may_patch() {
    let team = TestNamespace::new("ui-team").await;
    let other = TestNamespace::new("ui-other").await;
    install_crd(&team.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write(
            "app/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: shown\ndata:\n  a: b\n",
        )
        .commit("one");
    // Manual sync policy: nothing is applied until someone asks.
    create_app(&team, "team-app", &repo.url(), "app", SyncPolicy::default()).await;
    create_app(
        &other,
        "other-app",
        &repo.url(),
        "app",
        SyncPolicy::default(),
    )
    .await;
    let reader = viewer(&team, "reader", &["get", "list", "watch"]).await;
    let editor = viewer(&team, "editor", &["get", "list", "watch", "patch"]).await;

    let cache = tempfile::tempdir().unwrap();
    let (mut setpoint, port, _) =
        run_with_ui(&[&team.name, &other.name], "kubernetes", cache.path());
    wait_ui(&mut setpoint, port).await;
    let team_app = format!("{}/team-app", team.name);
    let other_app = format!("{}/other-app", other.name);
    // The index holds both once the watch listed them (the editor may see one).
    wait_for(
        "the index to hold the team's Application",
        DEADLINE,
        || async {
            let (code, body) = get(port, "/api/v1/applications", Some(&editor));
            if code == 200 && names(&body) == vec![team_app.clone()] {
                Ok(())
            } else {
                Err(format!("{code} {body}"))
            }
        },
    )
    .await;

    // No token: 401 and no data, on every page and API path.
    let paths = [
        "/".to_string(),
        format!("/applications/{team_app}"),
        "/activity".to_string(),
        "/api/v1/applications".to_string(),
        format!("/api/v1/applications/{team_app}"),
        "/api/v1/deliveries".to_string(),
        "/api/v1/live".to_string(),
        "/api/v1/nothing-here".to_string(),
        "/nothing-here".to_string(),
    ];
    for path in &paths {
        for token in [None, Some("not-a-token")] {
            let (code, body) = get(port, path, token);
            assert_eq!(code, 401, "GET {path} with {token:?}: {body}");
            assert!(
                !body.contains("team-app") && !body.contains("other-app"),
                "GET {path}: {body}"
            );
        }
    }
    for path in [
        format!("/applications/{team_app}/sync"),
        format!("/api/v1/applications/{team_app}/sync"),
    ] {
        let (code, _) = post(port, &path, &[], "", "POST");
        assert_eq!(code, 401, "POST {path}");
    }
    let forged = raw(
        port,
        "GET",
        "/",
        &["Cookie: setpoint_token=not-a-token"],
        "",
    );
    assert!(forged.starts_with("HTTP/1.1 401"), "{forged}");

    // The reader: its namespace only, no Sync button, a sync refused.
    let (code, body) = get(port, "/api/v1/applications", Some(&reader));
    assert_eq!(code, 200, "{body}");
    assert_eq!(names(&body), vec![team_app.clone()]);
    let (code, _) = get(
        port,
        &format!("/api/v1/applications/{other_app}"),
        Some(&reader),
    );
    assert_eq!(code, 404, "another namespace's Application is not found");
    let (code, page) = get(port, &format!("/?namespace={}", other.name), Some(&reader));
    assert_eq!(code, 200);
    assert!(!page.contains("other-app"), "{page}");
    let (code, page) = get(port, &format!("/applications/{team_app}"), Some(&reader));
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains("team-app") && !page.contains(r#"id="sync""#),
        "{page}"
    );
    let header = format!("Bearer {reader}");
    let (code, body) = post(
        port,
        &format!("/api/v1/applications/{team_app}/sync"),
        &[("Authorization", &header)],
        "",
        "POST",
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("may not patch"), "{body}");

    // The login form sets an HttpOnly, SameSite=Strict cookie; a POST with
    // that cookie needs the page's CSRF token.
    let login = raw(
        port,
        "POST",
        "/login",
        &["Content-Type: application/x-www-form-urlencoded"],
        &format!("token={editor}"),
    );
    assert!(login.starts_with("HTTP/1.1 303"), "{login}");
    let set_cookie = login
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .expect("a cookie")
        .to_string();
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"),
        "{set_cookie}"
    );
    let cookie = format!("Cookie: setpoint_token={editor}");
    let page = raw(
        port,
        "GET",
        &format!("/applications/{team_app}"),
        &[&cookie],
        "",
    );
    assert!(
        page.starts_with("HTTP/1.1 200") && page.contains(r#"id="sync""#),
        "{page}"
    );
    let csrf = page
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the form")
        .to_string();
    let form = ["Content-Type: application/x-www-form-urlencoded", &cookie];
    let refused = raw(
        port,
        "POST",
        &format!("/applications/{team_app}/sync"),
        &form,
        "csrf=forged",
    );
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(
        synced_at(&team, "team-app", &commit).await.is_err(),
        "nothing synced yet"
    );
    let accepted = raw(
        port,
        "POST",
        &format!("/applications/{team_app}/sync"),
        &form,
        &format!("csrf={csrf}"),
    );
    assert!(accepted.starts_with("HTTP/1.1 303"), "{accepted}");
    wait_for("the Sync button's sync", DEADLINE, || {
        synced_at(&team, "team-app", &commit)
    })
    .await;
    let (code, body) = get(
        port,
        &format!("/api/v1/applications/{team_app}"),
        Some(&editor),
    );
    assert_eq!(code, 200);
    assert!(body.contains(r#""canPatch":true"#), "{body}");
    assert!(setpoint.logs().contains("requested from the dashboard"));

    // The label an ApplicationSet writes groups it: the list's filter (in
    // the API and on the page) and the Application's page name the set.
    team.api::<Application>()
        .patch(
            "team-app",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "labels": { SET_LABEL: "fleet" } } })),
        )
        .await
        .unwrap();
    wait_for(
        "the list to group team-app under fleet",
        DEADLINE,
        || async {
            let (code, body) = get(port, "/api/v1/applications?appset=fleet", Some(&reader));
            if code == 200 && names(&body) == vec![team_app.clone()] {
                Ok(())
            } else {
                Err(format!("{code} {body}"))
            }
        },
    )
    .await;
    for other_set in ["-", "other"] {
        let (code, body) = get(
            port,
            &format!("/api/v1/applications?appset={other_set}"),
            Some(&reader),
        );
        assert_eq!(code, 200, "{body}");
        assert!(names(&body).is_empty(), "appset={other_set}: {body}");
        assert!(body.contains(r#""applicationSets":["fleet"]"#), "{body}");
    }
    let (code, page) = get(port, "/?appset=fleet", Some(&reader));
    assert_eq!(code, 200);
    assert!(
        page.contains(r#"<option value="fleet" selected>"#) && page.contains("team-app"),
        "{page}"
    );
    let (_, page) = get(port, &format!("/applications/{team_app}"), Some(&reader));
    assert!(page.contains("Generated by ApplicationSet"), "{page}");
}

/// `curl -N` reading an event stream into a file.
struct Stream {
    child: Child,
    out: std::path::PathBuf,
}

impl Stream {
    fn open(port: u16, path: &str, out: std::path::PathBuf) -> Self {
        let file = std::fs::File::create(&out).unwrap();
        let child = Command::new("curl")
            .args(["-s", "-N"])
            .arg(format!("http://127.0.0.1:{port}{path}"))
            .stdout(file)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Self { child, out }
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_scale_by_kubectl_reaches_the_open_page_as_drift_with_field_values_and_manager() {
    let ns = TestNamespace::new("ui-drift").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write("web/deploy.yaml", &deployment_yaml("web", 1))
        .commit("web");
    create_app(&ns, "web", &repo.url(), "web", automated(true, true)).await;
    let cache = tempfile::tempdir().unwrap();
    let (mut setpoint, port, webhook) = run_with_ui(&[&ns.name], "none", cache.path());
    wait_ui(&mut setpoint, port).await;
    assert!(
        setpoint.logs().contains("--ui-auth none"),
        "a warning is logged"
    );
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &commit)).await;
    let app = format!("{}/web", ns.name);
    wait_for("the list to show web Synced", DEADLINE, || async {
        let (code, page) = get(port, "/", None);
        match code == 200
            && page.contains("/applications/")
            && page.contains(r#"<span class="badge synced">Synced</span>"#)
        {
            true => Ok(()),
            false => Err(format!("{code} {page}")),
        }
    })
    .await;

    let stream = Stream::open(
        port,
        &format!("/api/v1/live?namespace={}&name=web", ns.name),
        cache.path().join("live.txt"),
    );
    wait_for("the stream to open", Duration::from_secs(10), || async {
        match stream.text().contains(": connected") {
            true => Ok(()),
            false => Err(stream.text()),
        }
    })
    .await;
    let kubectl = PatchParams {
        field_manager: Some("kubectl".into()),
        ..Default::default()
    };
    ns.api::<Deployment>()
        .patch_scale(
            "web",
            &kubectl,
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    wait_for("the drift correction on the stream", DEADLINE, || async {
        match stream.text().contains(r#""reason":"DriftCorrected""#) {
            true => Ok(()),
            false => Err(stream.text()),
        }
    })
    .await;
    let (code, body) = get(port, &format!("/api/v1/applications/{app}"), None);
    assert_eq!(code, 200);
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let field = &view["drift"][0]["fields"][0];
    assert_eq!(field["field"], "spec.replicas", "{body}");
    assert_eq!(field["old"], "4", "{body}");
    assert_eq!(field["new"], "1", "{body}");
    assert_eq!(field["changedBy"], "kubectl", "{body}");
    let (_, page) = get(port, &format!("/applications/{app}"), None);
    assert!(
        page.contains("<code>spec.replicas</code>")
            && page.contains(r#"<td class="manager">kubectl</td>"#),
        "{page}"
    );

    // A push: the Activity page lists the delivery and where it went.
    let next = repo
        .write("web/deploy.yaml", &deployment_yaml("web", 2))
        .commit("two");
    let delivery = format!("ui-delivery-{}", ns.name);
    let (code, body) = post_github(
        webhook,
        Some(SECRET),
        &delivery,
        &github_push(&repo.url(), &next, &["web/deploy.yaml"]),
    );
    assert_eq!(code, 200, "{body}");
    let (code, body) = get(port, "/api/v1/deliveries", None);
    assert_eq!(code, 200);
    let deliveries: serde_json::Value = serde_json::from_str(&body).unwrap();
    let first = &deliveries[0];
    assert_eq!(first["delivery"], delivery.as_str(), "{body}");
    assert_eq!(first["provider"], "github");
    assert_eq!(first["outcome"], "accepted");
    assert_eq!(first["commit"], next.as_str());
    assert_eq!(first["applications"], serde_json::json!([app]));
    let (_, page) = get(port, "/activity", None);
    assert!(page.contains(&delivery) && page.contains(&app), "{page}");
    wait_for("the push synced", DEADLINE, || synced_at(&ns, "web", &next)).await;
}

/// A ConfigMap whose `version` tells which commit is applied.
fn config(version: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: release\ndata:\n  version: \"{version}\"\n"
    )
}

async fn config_is(ns: &support::TestNamespace, want: &str) -> Result<(), String> {
    let live = ns
        .api::<ConfigMap>()
        .get("release")
        .await
        .map_err(|e| e.to_string())?;
    let version = live.data.unwrap_or_default().remove("version");
    match version.as_deref() == Some(want) {
        true => Ok(()),
        false => Err(format!("version {version:?}")),
    }
}

fn bearer_post(port: u16, path: &str, token: &str) -> (u16, serde_json::Value) {
    let header = format!("Bearer {token}");
    let (code, body) = post(port, path, &[("Authorization", &header)], "", "POST");
    let json = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {code} {body}"));
    (code, json)
}

#[tokio::test]
async fn rollback_suspend_and_resume_from_the_dashboard_write_the_spec_for_those_who_may_patch() {
    let ns = TestNamespace::new("ui-operate").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let good = repo.write("app/cm.yaml", &config("1")).commit("good");
    create_app(&ns, "web", &repo.url(), "app", automated(true, true)).await;
    let reader = viewer(&ns, "reader", &["get", "list", "watch"]).await;
    let editor = viewer(&ns, "editor", &["get", "list", "watch", "patch"]).await;
    let cache = tempfile::tempdir().unwrap();
    let (mut setpoint, port, webhook) = run_with_ui(&[&ns.name], "kubernetes", cache.path());
    wait_ui(&mut setpoint, port).await;
    wait_for("the good revision Healthy", DEADLINE, || {
        settled_at(&ns, "web", &good)
    })
    .await;

    // The next commit is applied: the history holds both, the first healthy.
    let next = repo.write("app/cm.yaml", &config("2")).commit("next");
    let body = github_push(&repo.url(), &next, &["app/cm.yaml"]);
    let delivery = format!("ui-operate-{}", ns.name);
    assert_eq!(post_github(webhook, Some(SECRET), &delivery, &body).0, 200);
    wait_for("the next revision Healthy", DEADLINE, || {
        settled_at(&ns, "web", &next)
    })
    .await;
    let good_id = wait_for(
        "the good revision's history entry healthy",
        DEADLINE,
        || async {
            let history = get_app(&ns, "web").await.status.unwrap_or_default().history;
            match history.iter().find(|h| h.revision == good) {
                Some(h) if h.healthy && history.len() >= 2 => Ok(h.id),
                _ => Err(format!("{history:?}")),
            }
        },
    )
    .await;
    let app = format!("{}/web", ns.name);
    wait_for("the dashboard to show both entries", DEADLINE, || async {
        let (code, body) = get(port, &format!("/api/v1/applications/{app}"), Some(&reader));
        let view: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
        match code == 200 && view["rollback"]["historyId"] == good_id {
            true => Ok(()),
            false => Err(format!("{code} {body}")),
        }
    })
    .await;

    // The reader may do none of the three, and no button offers them.
    let (code, page) = get(port, &format!("/applications/{app}"), Some(&reader));
    assert_eq!(code, 200, "{page}");
    for id in ["rollback", "suspend", "resume"] {
        assert!(!page.contains(&format!(r#"id="{id}""#)), "{id}: {page}");
    }
    for action in ["rollback", "suspend", "resume"] {
        let (code, body) = bearer_post(
            port,
            &format!("/api/v1/applications/{app}/{action}"),
            &reader,
        );
        assert_eq!(code, 403, "{action}: {body}");
        let message = body["error"].as_str().unwrap();
        assert_eq!(
            message,
            format!(
                "system:serviceaccount:{}:reader may not patch applications.setpoint.dev in namespace {}",
                ns.name, ns.name
            )
        );
    }
    let spec = get_app(&ns, "web").await.spec;
    assert!(
        !spec.suspend && spec.pin.is_none(),
        "nothing written: {spec:?}"
    );

    // A branch name takes Git (400), an unknown history id has no entry (409).
    let (code, body) = bearer_post(
        port,
        &format!("/api/v1/applications/{app}/rollback?revision=main"),
        &editor,
    );
    assert_eq!(code, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("name a history id or a commit id"),
        "{body}"
    );
    let (code, body) = bearer_post(
        port,
        &format!("/api/v1/applications/{app}/rollback?revision=999"),
        &editor,
    );
    assert_eq!(code, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("no history entry 999"),
        "{body}"
    );
    assert!(get_app(&ns, "web").await.spec.pin.is_none());

    // The editor's Rollback: the last healthy revision, pinned with its
    // name, and applied from Git's render of that commit.
    let (code, body) = bearer_post(
        port,
        &format!("/api/v1/applications/{app}/rollback"),
        &editor,
    );
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["revision"], good.as_str(), "{body}");
    assert_eq!(body["historyId"], good_id, "{body}");
    assert!(body["event"].is_string(), "{body}");
    let pin = get_app(&ns, "web").await.spec.pin.expect("pinned");
    assert_eq!(pin.revision, good);
    assert_eq!(pin.history_id, Some(good_id));
    let editor_name = format!("system:serviceaccount:{}:editor", ns.name);
    assert_eq!(pin.by.as_deref(), Some(editor_name.as_str()));
    assert!(pin.at.is_some());
    wait_for("the good config back", DEADLINE, || config_is(&ns, "1")).await;
    wait_for("the rolled-back revision Synced", DEADLINE, || {
        synced_at(&ns, "web", &good)
    })
    .await;
    let log = setpoint.logs();
    assert!(
        log.lines()
            .any(|l| l.contains("requested from the dashboard")
                && l.contains("rollback")
                && l.contains(&editor_name)
                && l.contains(&good)),
        "{log}"
    );
    wait_for("the page to say pinned", DEADLINE, || async {
        let (code, page) = get(port, &format!("/applications/{app}"), Some(&reader));
        match code == 200
            && page.contains(r#"<p id="app-pinned" class="hold">Pinned to <code>"#)
            && page.contains(&format!("(history #{good_id}) by {editor_name}"))
            && !page.contains("not applied yet")
        {
            true => Ok(()),
            false => Err(page),
        }
    })
    .await;

    // Suspend from the page's form (cookie and CSRF token).
    let cookie = format!("Cookie: setpoint_token={editor}");
    let page = raw(port, "GET", &format!("/applications/{app}"), &[&cookie], "");
    assert!(
        page.contains(r#"id="suspend""#) && page.contains(r#"id="resume""#),
        "pinned: Suspend, and Resume to follow Git again: {page}"
    );
    let csrf = page
        .split(r#"name="csrf" value=""#)
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("a CSRF token in the form")
        .to_string();
    let form = ["Content-Type: application/x-www-form-urlencoded", &cookie];
    let path = format!("/applications/{app}/suspend");
    let refused = raw(port, "POST", &path, &form, "csrf=forged");
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(!get_app(&ns, "web").await.spec.suspend);
    let accepted = raw(port, "POST", &path, &form, &format!("csrf={csrf}"));
    assert!(accepted.starts_with("HTTP/1.1 303"), "{accepted}");
    assert!(accepted.contains("?notice=suspend"), "{accepted}");
    let spec = get_app(&ns, "web").await.spec;
    assert!(spec.suspend, "{spec:?}");
    assert_eq!(
        spec.pin.map(|p| p.revision),
        Some(good.clone()),
        "the pin stays"
    );
    wait_for("the page to say suspended", DEADLINE, || async {
        let (_, page) = get(port, &format!("/applications/{app}"), Some(&editor));
        match page.contains(r#"<p id="app-suspended" class="hold"><strong>Suspended</strong>"#)
            && !page.contains(r#"id="suspend""#)
            && page.contains(r#"id="resume""#)
        {
            true => Ok(()),
            false => Err(page),
        }
    })
    .await;

    // Resume: no suspension, no pin; the automated policy converges to Git.
    let (code, body) = bearer_post(port, &format!("/api/v1/applications/{app}/resume"), &editor);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body, serde_json::json!({ "action": "resume" }));
    let spec = get_app(&ns, "web").await.spec;
    assert!(!spec.suspend && spec.pin.is_none(), "{spec:?}");
    wait_for("the next config back after resume", DEADLINE, || {
        config_is(&ns, "2")
    })
    .await;
    wait_for("the next revision Synced again", DEADLINE, || {
        synced_at(&ns, "web", &next)
    })
    .await;
}
