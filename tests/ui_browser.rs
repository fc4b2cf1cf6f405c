//! The dashboard in a real headless Chromium (Debian's `chromium`, driven
//! over WebDriver by its `chromedriver`), against `setpoint run` on the
//! real control plane: the list with sync and health, a `kubectl scale`
//! showing up as drift on an open Application page without a reload, the
//! Sync button for a viewer allowed to patch and none for a read-only one.
//! It takes the README's screenshot (docs/dashboard.png with `make
//! screenshot`; otherwise beside the build).
//!
//! `make test-ui` installs Chromium and runs it (Cargo `test = false`).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Patch, PatchParams};
use setpoint::api::SyncPolicy;
use support::app::{automated, create_app, deployment_yaml, install_crd, synced_at};
use support::process::{Setpoint, free_port, post};
use support::viewer::viewer;
use support::{GitRepo, TestNamespace, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);

fn program(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// chromedriver on a port of its own; killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    async fn start() -> Self {
        let port = free_port();
        let child = Command::new(program("SETPOINT_CHROMEDRIVER", "chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is installed (make browser-deps)");
        wait_for(
            "chromedriver to answer",
            Duration::from_secs(20),
            || async move {
                match post(port, "/status", &[], "", "GET") {
                    (200, body) if body.contains("ready") => Ok(()),
                    (code, body) => Err(format!("{code} {body}")),
                }
            },
        )
        .await;
        Self { child, port }
    }

    async fn browser(&self) -> Client {
        let capabilities = serde_json::json!({
            "goog:chromeOptions": {
                "binary": program("SETPOINT_CHROMIUM", "/usr/bin/chromium"),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,860"],
            }
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn text_of(browser: &Client, css: &str) -> Result<String, String> {
    let element = browser
        .find(Locator::Css(css))
        .await
        .map_err(|e| e.to_string())?;
    element.text().await.map_err(|e| e.to_string())
}

/// Logs in with `token` and waits until the page names the viewer `who`:
/// the login's redirect has landed and its cookie is set, so the next
/// navigation cannot cancel it.
async fn log_in(browser: &Client, port: u16, token: &str, who: &str) {
    browser
        .goto(&format!("http://127.0.0.1:{port}/login"))
        .await
        .unwrap();
    browser
        .find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(token)
        .await
        .unwrap();
    browser
        .find(Locator::Id("login"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(
        &format!("the dashboard to name {who}"),
        Duration::from_secs(20),
        || async {
            let viewer = text_of(browser, "span.viewer").await?;
            match viewer.ends_with(&format!(":{who}")) {
                true => Ok(()),
                false => Err(viewer),
            }
        },
    )
    .await;
}

/// Logs out and waits for the login form (the cookie is cleared).
async fn log_out(browser: &Client) {
    browser
        .find(Locator::Css("header form button"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for(
        "the login form after logging out",
        Duration::from_secs(20),
        || async {
            browser
                .find(Locator::Id("token"))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

#[tokio::test]
async fn the_dashboard_in_chromium_shows_state_drift_live_and_syncs_for_those_who_may() {
    let ns = TestNamespace::new("ui-browser").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    let commit = repo
        .write("web/deploy.yaml", &deployment_yaml("web", 1))
        .write("api/deploy.yaml", &deployment_yaml("api", 2))
        .write(
            "settings/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  level: info\n",
        )
        .commit("three apps");
    create_app(&ns, "web", &repo.url(), "web", automated(true, true)).await;
    create_app(&ns, "api", &repo.url(), "api", automated(true, true)).await;
    // Manual: synced only when someone presses Sync.
    create_app(
        &ns,
        "settings",
        &repo.url(),
        "settings",
        SyncPolicy::default(),
    )
    .await;
    let reader = viewer(&ns, "reader", &["get", "list", "watch"]).await;
    let editor = viewer(&ns, "editor", &["get", "list", "watch", "patch"]).await;

    let cache = tempfile::tempdir().unwrap();
    let port = free_port();
    let ui_listen = format!("127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{}", free_port());
    let _setpoint = Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--listen",
            &listen,
            "--no-sweep",
            "--ui-listen",
            &ui_listen,
        ],
        &[],
        cache.path(),
    );
    wait_for("web synced", DEADLINE, || synced_at(&ns, "web", &commit)).await;
    wait_for("api synced", DEADLINE, || synced_at(&ns, "api", &commit)).await;

    let driver = Driver::start().await;
    let browser = driver.browser().await;

    // The read-only viewer: the list with sync and health.
    log_in(&browser, port, &reader, "reader").await;
    wait_for("the list to show web and api Synced", DEADLINE, || async {
        browser
            .goto(&format!("http://127.0.0.1:{port}/"))
            .await
            .map_err(|e| e.to_string())?;
        let web = text_of(&browser, &format!(r#"tr[data-app="{}/web"]"#, ns.name)).await?;
        let api = text_of(&browser, &format!(r#"tr[data-app="{}/api"]"#, ns.name)).await?;
        match web.contains("Synced") && api.contains("Synced") && web.contains("Healthy") {
            true => Ok(()),
            false => Err(format!("web: {web}; api: {api}")),
        }
    })
    .await;
    let settings = text_of(&browser, &format!(r#"tr[data-app="{}/settings"]"#, ns.name))
        .await
        .unwrap();
    assert!(settings.contains("OutOfSync"), "{settings}");

    // The Application page, open while kubectl scales: the drift shows up
    // without a reload (the marker set on the page survives).
    browser
        .goto(&format!(
            "http://127.0.0.1:{port}/applications/{}/web",
            ns.name
        ))
        .await
        .unwrap();
    assert!(
        browser.find(Locator::Id("sync")).await.is_err(),
        "a read-only viewer gets no Sync button"
    );
    wait_for(
        "the page's event stream to connect",
        Duration::from_secs(20),
        || async {
            let connected = browser
                .execute(
                    "return document.getElementById('main').dataset.connected || ''",
                    vec![],
                )
                .await
                .map_err(|e| e.to_string())?;
            match connected.as_str() == Some("true") {
                true => Ok(()),
                false => Err(format!("{connected}")),
            }
        },
    )
    .await;
    browser
        .execute("window.notReloaded = true; return null", vec![])
        .await
        .unwrap();
    let kubectl = PatchParams {
        field_manager: Some("kubectl".into()),
        ..Default::default()
    };
    ns.api::<Deployment>()
        .patch_scale(
            "web",
            &kubectl,
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    wait_for("the drift on the open page", DEADLINE, || async {
        let drift = text_of(&browser, "#drift").await?;
        match drift.contains("spec.replicas")
            && drift.contains("3 → 1")
            && drift.contains("kubectl")
        {
            true => Ok(()),
            false => Err(drift),
        }
    })
    .await;
    let kept = browser
        .execute("return window.notReloaded === true", vec![])
        .await
        .unwrap();
    assert_eq!(
        kept,
        serde_json::Value::Bool(true),
        "the page was not reloaded"
    );
    // A sync asked by the read-only viewer from the page is refused.
    let refused = browser
        .execute_async(
            &format!(
                "const done = arguments[arguments.length - 1]; fetch('/api/v1/applications/{}/settings/sync', {{method: 'POST', headers: {{'Authorization': 'Bearer ' + arguments[0]}}}}).then(r => done(r.status));",
                ns.name
            ),
            vec![serde_json::Value::String(reader.clone())],
        )
        .await
        .unwrap();
    assert_eq!(refused, serde_json::json!(403));

    // The viewer allowed to patch: the Sync button syncs.
    log_out(&browser).await;
    log_in(&browser, port, &editor, "editor").await;
    browser
        .goto(&format!(
            "http://127.0.0.1:{port}/applications/{}/settings",
            ns.name
        ))
        .await
        .unwrap();
    assert!(synced_at(&ns, "settings", &commit).await.is_err());
    browser
        .find(Locator::Id("sync"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for("the Sync button's sync", DEADLINE, || {
        synced_at(&ns, "settings", &commit)
    })
    .await;
    wait_for("the page to show settings Synced", DEADLINE, || async {
        let sync = text_of(&browser, "#app-sync").await?;
        match sync == "Synced" {
            true => Ok(()),
            false => Err(sync),
        }
    })
    .await;

    // The README's screenshot: the list.
    browser
        .goto(&format!("http://127.0.0.1:{port}/"))
        .await
        .unwrap();
    wait_for("all three Synced on the list", DEADLINE, || async {
        let table = text_of(&browser, "#applications").await?;
        match table.matches("Synced").count() >= 3 && !table.contains("OutOfSync") {
            true => Ok(()),
            false => Err(table),
        }
    })
    .await;
    let png = browser.screenshot().await.unwrap();
    assert!(
        png.len() < 200 * 1024,
        "the screenshot is {} bytes",
        png.len()
    );
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    // Into the checkout only when asked (`make screenshot`), so that a test
    // run leaves the tree clean; else beside the build.
    let path = match std::env::var_os("SETPOINT_SCREENSHOT") {
        Some(path) => std::path::PathBuf::from(path),
        None => std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png"),
    };
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, png).unwrap();
    browser.close().await.unwrap();
}
