//! Notifications out, end to end: `setpoint run` on RabbitMQ against the
//! real control plane, its Providers pointing at tiny HTTP receivers this
//! test starts, which record every request (and answer it, or hold it, or
//! are not listening at all).
//!
//! - a drift correction (`kubectl scale`) reaches Slack-, Teams-, Discord-
//!   and generic-shaped receivers in their documented formats, naming the
//!   field, the values and who changed it; the generic-hmac signature
//!   verifies with the Secret's key; an Alert naming a missing Provider
//!   says so on its status;
//! - a Provider down for 30 s gets every notification once it is back, none
//!   twice;
//! - a worker killed while the receiver holds its request open loses none
//!   and duplicates none (counted by event id, answered once each).

mod support;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, CustomResourceExt};
use serde_json::{Value, json};
use setpoint::api::{Alert, Provider};
use sha2::Sha256;
use support::app::{automated, create_app, deployment_yaml, install_crd, time_scale_correction};
use support::process::{Setpoint, free_port, sample, scrape};
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const DEADLINE: Duration = Duration::from_secs(60);
const HMAC_KEY: &str = "notify-hmac-key-5d1f";

/// One request a receiver got.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
    /// Answered 200 (else held open, and dropped with its connection).
    answered: bool,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn id(&self) -> String {
        self.headers
            .get("x-setpoint-event-id")
            .cloned()
            .unwrap_or_default()
    }
}

/// A local HTTP server that records what it gets: answers 200, or, while
/// holding, keeps each request open without an answer.
#[derive(Clone)]
struct Receiver {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    hold: Arc<Mutex<bool>>,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Self::serve(listener)
    }

    /// Listening on `port` (a port nobody listened on until now).
    fn start_on(port: u16) -> Self {
        Self::serve(TcpListener::bind(("127.0.0.1", port)).unwrap())
    }

    fn serve(listener: TcpListener) -> Self {
        let receiver = Receiver {
            port: listener.local_addr().unwrap().port(),
            received: Arc::default(),
            hold: Arc::default(),
            held: Arc::default(),
        };
        let server = receiver.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let server = server.clone();
                std::thread::spawn(move || server.handle(stream));
            }
        });
        receiver
    }

    fn handle(&self, stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line.is_empty() {
            return;
        }
        let path = line.split(' ').nth(1).unwrap_or_default().to_string();
        let mut headers = HashMap::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
            }
        }
        let length: usize = headers
            .get("content-length")
            .and_then(|l| l.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let hold = *self.hold.lock().unwrap();
        let index = {
            let mut received = self.received.lock().unwrap();
            received.push(Received {
                path,
                headers,
                body,
                answered: false,
            });
            received.len() - 1
        };
        if hold {
            self.held.lock().unwrap().push(stream);
            return;
        }
        let mut stream = stream;
        let answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
        if stream
            .write_all(answer)
            .and_then(|_| stream.flush())
            .is_ok()
        {
            self.received.lock().unwrap()[index].answered = true;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    fn all(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    fn at(&self, path: &str) -> Vec<Received> {
        let path = format!("/{path}");
        self.all().into_iter().filter(|r| r.path == path).collect()
    }

    /// How many times each id was answered 200.
    fn answered_ids(&self) -> BTreeMap<String, usize> {
        let mut ids = BTreeMap::new();
        for received in self.all().iter().filter(|r| r.answered) {
            *ids.entry(received.id()).or_default() += 1;
        }
        ids
    }
}

async fn apply_crd(client: &kube::Client, crd: CustomResourceDefinition) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap();
    api.patch(
        &name,
        &PatchParams::apply("setpoint-tests").force(),
        &Patch::Apply(&crd),
    )
    .await
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        await_condition(api, &name, conditions::is_crd_established()),
    )
    .await
    .unwrap()
    .unwrap();
}

/// The namespace, with the CRDs installed.
async fn setup(prefix: &str) -> TestNamespace {
    let ns = TestNamespace::new(prefix).await;
    install_crd(&ns.client).await;
    apply_crd(&ns.client, Provider::crd()).await;
    apply_crd(&ns.client, Alert::crd()).await;
    ns
}

/// A Secret with `entries`, a Provider of `type_` reading it, and an Alert
/// of the drift corrections of every Application to it.
async fn provider(
    ns: &TestNamespace,
    name: &str,
    type_: &str,
    entries: &[(&str, &str)],
    extra: Value,
) {
    let data: BTreeMap<String, String> = entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-hook")},
        "stringData": data,
    }))
    .unwrap();
    ns.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let mut spec = json!({"type": type_, "secretRef": {"name": format!("{name}-hook")}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let provider: Provider =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
    ns.api::<Provider>()
        .create(&PostParams::default(), &provider)
        .await
        .unwrap();
    alert(ns, name, name).await;
}

async fn alert(ns: &TestNamespace, name: &str, provider: &str) {
    let alert: Alert = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "providerRef": {"name": provider},
            "eventSources": [{"name": "*"}],
            "eventKinds": ["driftCorrected"],
            "summary": "test cluster",
        },
    }))
    .unwrap();
    ns.api::<Alert>()
        .create(&PostParams::default(), &alert)
        .await
        .unwrap();
}

/// A repository with one Deployment per name, one replica each, and a
/// self-healing Application of each; returns it and its commit.
async fn apps(ns: &TestNamespace, names: &[&str]) -> (GitRepo, String) {
    let repo = GitRepo::new();
    for name in names {
        repo.write(&format!("{name}/deploy.yaml"), &deployment_yaml(name, 1));
    }
    let commit = repo.commit("deployments");
    for name in names {
        create_app(ns, name, &repo.url(), name, automated(true, true)).await;
    }
    (repo, commit)
}

async fn synced(ns: &TestNamespace, names: &[&str], commit: &str) {
    for name in names {
        wait_for(&format!("{name} synced"), DEADLINE, || async {
            support::app::synced_at(ns, name, commit).await
        })
        .await;
    }
}

/// `setpoint run` on RabbitMQ under `prefix`, scoped to the namespace.
fn run(
    ns: &TestNamespace,
    prefix: &str,
    metrics: u16,
    cache: &std::path::Path,
    env: &[(&str, &str)],
) -> Setpoint {
    let listen = format!("127.0.0.1:{}", free_port());
    let metrics = format!("127.0.0.1:{metrics}");
    let url = amqp_url();
    let mut all = vec![("SETPOINT_AMQP_URL", url.as_str())];
    all.extend_from_slice(env);
    Setpoint::scoped(
        &ns.name,
        &[
            "run",
            "--amqp-prefix",
            prefix,
            "--listen",
            &listen,
            "--metrics-listen",
            &metrics,
            "--sweep-interval",
            "10m",
        ],
        &all,
        cache,
    )
}

/// `setpoint_notifications_total` of one Provider and outcome.
fn notified(port: u16, provider: &str, outcome: &str) -> f64 {
    let metrics = scrape(port).unwrap_or_default();
    sample(
        &metrics,
        &format!("setpoint_notifications_total{{provider=\"{provider}\",outcome=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

const LINE: &str = "spec.replicas: 3 → 1 (changed by kubectl)";

#[tokio::test(flavor = "multi_thread")]
async fn a_drift_correction_reaches_each_provider_in_its_format() {
    let ns = setup("notify-formats").await;
    let receiver = Receiver::start();
    for (name, type_) in [
        ("slack", "slack"),
        ("teams", "msteams"),
        ("discord", "discord"),
        ("generic", "generic"),
    ] {
        provider(
            &ns,
            name,
            type_,
            &[("address", &receiver.url(name))],
            json!({}),
        )
        .await;
    }
    provider(
        &ns,
        "signed",
        "generic-hmac",
        &[("address", &receiver.url("signed")), ("token", HMAC_KEY)],
        json!({}),
    )
    .await;
    alert(&ns, "ghost", "missing").await;
    let (_repo, commit) = apps(&ns, &["web"]).await;
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("notify-formats");
    let metrics = free_port();
    let setpoint = run(&ns, &prefix, metrics, cache.path(), &[]);
    wait_for("setpoint to serve metrics", DEADLINE, || async {
        scrape(metrics)
    })
    .await;
    synced(&ns, &["web"], &commit).await;
    time_scale_correction(&ns, "web", 3, 1, DEADLINE).await;
    let object = format!("apps/Deployment {}/web", ns.name);
    wait_for(
        "every receiver to get the drift correction",
        DEADLINE,
        || async {
            let got: Vec<usize> = ["slack", "teams", "discord", "generic", "signed"]
                .iter()
                .map(|path| receiver.at(path).len())
                .collect();
            if got.iter().all(|&n| n > 0) {
                Ok(())
            } else {
                Err(format!(
                    "requests per receiver: {got:?}; {}",
                    setpoint
                        .logs()
                        .lines()
                        .rfind(|l| l.contains("notif"))
                        .unwrap_or_default()
                ))
            }
        },
    )
    .await;

    let slack = receiver.at("slack")[0].json();
    assert_eq!(
        slack["text"],
        "Drift corrected: ".to_string() + &ns.name + "/web"
    );
    let attachment = &slack["attachments"][0];
    let text = attachment["text"].as_str().unwrap();
    assert!(text.contains(&format!("{object} {LINE}")), "{text}");
    assert!(text.contains("*test cluster*"), "{text}");
    assert!(
        attachment["fields"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["title"] == "Revision")
    );

    let teams = receiver.at("teams")[0].json();
    assert_eq!(teams["type"], "message");
    let card = &teams["attachments"][0];
    assert_eq!(
        card["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );
    assert_eq!(card["content"]["type"], "AdaptiveCard");
    let blocks = card["content"]["body"].as_array().unwrap();
    assert!(
        blocks
            .iter()
            .any(|b| b["text"].as_str().is_some_and(|t| t.contains(LINE))),
        "{blocks:?}"
    );

    let discord = receiver.at("discord")[0].json();
    assert!(
        discord["content"]
            .as_str()
            .unwrap()
            .starts_with("Drift corrected")
    );
    assert!(
        discord["embeds"][0]["description"]
            .as_str()
            .unwrap()
            .contains(LINE)
    );

    let generic = receiver.at("generic")[0].json();
    assert_eq!(generic["involvedObject"]["kind"], "Application");
    assert_eq!(generic["involvedObject"]["name"], "web");
    assert_eq!(generic["involvedObject"]["namespace"], ns.name.as_str());
    assert_eq!(generic["reason"], "DriftCorrected");
    assert_eq!(generic["severity"], "info");
    assert_eq!(generic["metadata"]["kind"], "driftCorrected");
    assert_eq!(generic["metadata"]["revision"].as_str().unwrap().len(), 40);
    assert_eq!(
        generic["changes"][0],
        json!({"object": object, "field": "spec.replicas", "from": "3", "to": "1", "by": "kubectl"})
    );

    let signed = &receiver.at("signed")[0];
    let mut mac = Hmac::<Sha256>::new_from_slice(HMAC_KEY.as_bytes()).unwrap();
    mac.update(&signed.body);
    let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(signed.headers.get("x-signature"), Some(&expected));
    for received in receiver.all() {
        assert_eq!(received.id().len(), 32, "{received:?}");
        assert_eq!(
            received.headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
    }

    // The Alert whose Provider does not exist says so; nothing failed.
    wait_for("the ghost Alert to be not Ready", DEADLINE, || async {
        let alert = ns
            .api::<Alert>()
            .get("ghost")
            .await
            .map_err(|e| e.to_string())?;
        let ready = alert.status.and_then(|s| s.conditions.into_iter().next());
        match ready {
            Some(c) if c.reason == "ProviderNotFound" && c.message.contains("missing") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let logs = setpoint.logs();
    assert!(
        !logs.contains(&receiver.url("slack")),
        "a webhook URL in the logs"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_provider_down_for_30_seconds_gets_every_notification_once_it_returns() {
    let ns = setup("notify-down").await;
    // A port nobody listens on: connections are refused until the receiver
    // starts on it.
    let port = free_port();
    let address = format!("http://127.0.0.1:{port}/hook");
    provider(&ns, "hook", "generic", &[("address", &address)], json!({})).await;
    let names = ["web-0", "web-1", "web-2"];
    let (_repo, commit) = apps(&ns, &names).await;
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("notify-down");
    let metrics = free_port();
    let provider_key = format!("{}/hook", ns.name);
    let _setpoint = run(
        &ns,
        &prefix,
        metrics,
        cache.path(),
        &[
            ("SETPOINT_RETRY_INITIAL", "150ms"),
            ("SETPOINT_MAX_ATTEMPTS", "12"),
        ],
    );
    wait_for("setpoint to serve metrics", DEADLINE, || async {
        scrape(metrics)
    })
    .await;
    synced(&ns, &names, &commit).await;
    for name in names {
        time_scale_correction(&ns, name, 3, 1, DEADLINE).await;
    }
    let down = Instant::now();
    wait_for("each notification to fail once", DEADLINE, || async {
        let failed = notified(metrics, &provider_key, "failed");
        if failed >= names.len() as f64 {
            Ok(())
        } else {
            Err(format!("{failed} failed"))
        }
    })
    .await;
    // The outage itself lasts 30 s: the scenario, not a wait for a state.
    tokio::time::sleep_until((down + Duration::from_secs(30)).into()).await;
    let receiver = Receiver::start_on(port);
    wait_for("every notification to arrive", DEADLINE, || async {
        let ids = receiver.answered_ids();
        let sent = notified(metrics, &provider_key, "sent");
        if ids.len() == names.len() && sent == names.len() as f64 {
            Ok(())
        } else {
            Err(format!("{} ids answered, {sent} sent", ids.len()))
        }
    })
    .await;
    let ids = receiver.answered_ids();
    assert!(ids.values().all(|&n| n == 1), "{ids:?}");
    assert_eq!(
        receiver.all().len(),
        names.len(),
        "no notification posted twice"
    );
    let bodies: Vec<String> = receiver
        .all()
        .iter()
        .map(|r| {
            r.json()["involvedObject"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for name in names {
        assert!(bodies.contains(&name.to_string()), "{bodies:?}");
    }
    assert_eq!(notified(metrics, &provider_key, "parked"), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_mid_delivery_loses_and_duplicates_none() {
    let ns = setup("notify-kill").await;
    let receiver = Receiver::start();
    *receiver.hold.lock().unwrap() = true;
    // Longer than the test: the worker is killed while waiting.
    provider(
        &ns,
        "hook",
        "generic",
        &[("address", &receiver.url("hook"))],
        json!({"timeout": "120s"}),
    )
    .await;
    let names = ["api-0", "api-1"];
    let (_repo, commit) = apps(&ns, &names).await;
    let cache = tempfile::tempdir().unwrap();
    let prefix = amqp_prefix("notify-kill");
    let (first_cache, second_cache) = (cache.path().join("first"), cache.path().join("second"));
    std::fs::create_dir_all(&first_cache).unwrap();
    std::fs::create_dir_all(&second_cache).unwrap();
    let metrics = free_port();
    let mut first = run(&ns, &prefix, metrics, &first_cache, &[]);
    wait_for("setpoint to serve metrics", DEADLINE, || async {
        scrape(metrics)
    })
    .await;
    synced(&ns, &names, &commit).await;
    for name in names {
        time_scale_correction(&ns, name, 3, 1, DEADLINE).await;
    }
    wait_for("the receiver to hold every request", DEADLINE, || async {
        let held = receiver.all().len();
        if held >= names.len() {
            Ok(())
        } else {
            Err(format!("{held} held"))
        }
    })
    .await;
    // Killed while the receiver holds the requests open: no answer came,
    // nothing was recorded as delivered, the deliveries were not acked.
    first.kill();
    for stream in receiver.held.lock().unwrap().drain(..) {
        let _ = stream.shutdown(std::net::Shutdown::Both);
    }
    *receiver.hold.lock().unwrap() = false;
    let held: Vec<String> = receiver.all().iter().map(Received::id).collect();
    let metrics = free_port();
    let _second = run(&ns, &prefix, metrics, &second_cache, &[]);
    wait_for("every notification to be answered", DEADLINE, || async {
        let ids = receiver.answered_ids();
        if held.iter().all(|id| ids.contains_key(id)) {
            Ok(())
        } else {
            Err(format!("answered {ids:?}, held {held:?}"))
        }
    })
    .await;
    let ids = receiver.answered_ids();
    assert_eq!(
        ids.len(),
        names.len(),
        "one notification per drift: {ids:?}"
    );
    assert!(
        ids.values().all(|&n| n == 1),
        "none answered twice: {ids:?}"
    );
    let apps: Vec<String> = receiver
        .all()
        .iter()
        .filter(|r| r.answered)
        .map(|r| {
            r.json()["involvedObject"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    for name in names {
        assert!(apps.contains(&name.to_string()), "{apps:?}");
    }
}
