//! The handler in process, on the in-process queue behind a broker that can
//! be down: what a request enqueues, and that a failed publish answers 503
//! and leaves nothing queued. (The Kubernetes side is `tests/receivers.rs`.)

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix_web::App;
use actix_web::http::StatusCode;
use actix_web::test::{self, TestRequest};
use async_trait::async_trait;
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::Value;
use tokio::sync::mpsc;

use super::*;
use crate::api::{ApplicationSpec, LocalSecretRef, ReceiverResource, Source};
use crate::ingest::webhook::WebhookSettings;
use crate::queue::memory::MemoryQueue;
use crate::queue::{Delivery, QueueError, RetryPolicy};

const TOKEN: &str = "t0ken";

/// A broker that is down until told otherwise, in front of a real queue.
struct Broker {
    down: AtomicBool,
    queue: MemoryQueue,
}

#[async_trait]
impl Queue for Broker {
    async fn publish(&self, event: &Event) -> Result<(), crate::queue::QueueError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(QueueError::Unavailable("connection refused".into()));
        }
        self.queue.publish(event).await
    }

    async fn consume(&self, prefetch: u16) -> Result<mpsc::Receiver<Delivery>, QueueError> {
        self.queue.consume(prefetch).await
    }

    fn is_ready(&self) -> bool {
        !self.down.load(Ordering::SeqCst)
    }
}

fn app(name: &str, source: Source) -> Application {
    let mut app = Application::new(
        name,
        ApplicationSpec {
            source,
            ..Default::default()
        },
    );
    app.metadata.namespace = Some("team".into());
    app
}

struct Fixture {
    state: ReceiverState,
    broker: Arc<Broker>,
    deliveries: mpsc::Receiver<Delivery>,
}

impl Fixture {
    async fn new() -> Fixture {
        let broker = Arc::new(Broker {
            down: AtomicBool::new(false),
            queue: MemoryQueue::new(RetryPolicy::default()),
        });
        let deliveries = broker.consume(100).await.unwrap();
        let (store, mut writer) = reflector::store::<Application>();
        let chart = Source {
            repo_url: "oci://harbor.example.com/library".into(),
            chart: Some("web".into()),
            ..Default::default()
        };
        let git = Source {
            repo_url: "https://github.com/acme/deploy".into(),
            path: Some("api".into()),
            ..Default::default()
        };
        for app in [app("web", chart), app("api", git)] {
            writer.apply_watcher_event(&watcher::Event::Apply(app));
        }
        // No API server: the handler's lookups are the index's memory.
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let webhook =
            WebhookState::new(WebhookSettings::default(), broker.clone(), Arc::new(vec![]));
        let settings = ReceiverSettings {
            body_limit: 1024,
            read_timeout: Duration::from_secs(5),
        };
        let state = ReceiverState::new(settings, broker.clone(), store, client, &webhook);
        Fixture {
            state,
            broker,
            deliveries,
        }
    }

    fn serve(&self, name: &str, kind: &str, resources: &[&str]) -> String {
        let spec = ReceiverSpec {
            type_: kind.into(),
            secret_ref: LocalSecretRef {
                name: "token".into(),
            },
            resources: resources
                .iter()
                .map(|name| ReceiverResource {
                    name: Some(name.to_string()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let digest = self
            .state
            .0
            .index
            .serve(AppKey::new("team", name), spec, TOKEN);
        format!("{}{digest}", index::PATH_PREFIX)
    }

    async fn enqueued(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Ok(Some(delivery)) =
            tokio::time::timeout(Duration::from_millis(100), self.deliveries.recv()).await
        {
            events.push(delivery.event.clone());
            delivery.ack().await.unwrap();
        }
        events
    }
}

async fn call(state: &ReceiverState, request: TestRequest) -> (StatusCode, Value) {
    let app = test::init_service(App::new().configure(|cfg| configure(cfg, state.clone()))).await;
    let response = test::call_service(&app, request.to_request()).await;
    let status = response.status();
    let body = test::read_body(response).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

fn harbor(path: &str) -> TestRequest {
    TestRequest::post()
        .uri(path)
        .insert_header(("Content-Type", "application/json"))
        .insert_header(("Authorization", TOKEN))
        .set_payload(include_str!("testdata/harbor.json"))
}

#[actix_web::test]
async fn a_harbor_push_enqueues_its_chart_application_with_a_fresh_bound() {
    let mut fx = Fixture::new().await;
    let path = fx.serve("harbor", "harbor", &[]);
    let before = crate::event::unix_millis(std::time::SystemTime::now());
    let (status, reply) = call(&fx.state, harbor(&path)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(reply, serde_json::json!({ "enqueued": ["team/web"] }));
    let events = fx.enqueued().await;
    assert_eq!(events.len(), 1);
    assert_eq!(
        events[0].cause,
        Cause::Receiver {
            receiver: "team/harbor".into(),
            repository: Some("harbor.example.com/library/web".into()),
            tag: Some("1.1.0".into()),
        }
    );
    assert_eq!(events[0].revision, None);
    assert!(
        events[0].fresh_since.unwrap() >= before,
        "bounded by the request"
    );
}

#[actix_web::test]
async fn a_broker_that_is_down_answers_503_and_queues_nothing() {
    let mut fx = Fixture::new().await;
    let path = fx.serve("ci", "generic", &["api", "web"]);
    fx.broker.down.store(true, Ordering::SeqCst);
    let (status, reply) = call(&fx.state, TestRequest::post().uri(&path)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("queue unavailable"),
        "{reply}"
    );
    assert!(fx.enqueued().await.is_empty());

    fx.broker.down.store(false, Ordering::SeqCst);
    let (status, reply) = call(&fx.state, TestRequest::post().uri(&path)).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert_eq!(
        reply,
        serde_json::json!({ "enqueued": ["team/api", "team/web"] })
    );
    assert_eq!(fx.enqueued().await.len(), 2);
}

#[actix_web::test]
async fn a_refused_spec_answers_503_and_a_garbage_path_404() {
    let mut fx = Fixture::new().await;
    // generic without resources: refused, as its Ready condition says.
    let path = fx.serve("empty", "generic", &[]);
    let (status, reply) = call(&fx.state, TestRequest::post().uri(&path)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{reply}");
    assert!(
        reply["error"]
            .as_str()
            .unwrap()
            .contains("spec.resources is required"),
        "{reply}"
    );
    let (status, _) = call(
        &fx.state,
        TestRequest::post().uri("/api/webhooks/receivers/..%2F..%2Fetc"),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(fx.enqueued().await.is_empty());
}
