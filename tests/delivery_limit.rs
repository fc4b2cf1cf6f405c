//! A message that kills its worker must not loop: against the real control
//! plane and RabbitMQ, with real `setpoint worker` processes. One
//! Application's repository is a server that accepts and never answers, so
//! its reconcile hangs in the fetch; the test SIGKILLs the worker holding it
//! and starts another, as a crash or an OOM kill would. After
//! `--max-deliveries` such deliveries the event is parked with its reason,
//! while another Application keeps syncing; an event acknowledged normally
//! takes its count with it.

mod support;

use std::io::ErrorKind;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Patch, PatchParams};
use setpoint::api::Application;
use setpoint::event::{AppKey, Cause, Event};
use setpoint::queue::Queue;
use setpoint::queue::amqp::{AmqpQueue, AmqpSettings};
use support::app::{automated, create_app, install_crd, synced_at};
use support::process::Setpoint;
use support::{GitRepo, TestNamespace, amqp_prefix, amqp_url, wait_for};

const DEADLINE: Duration = Duration::from_secs(90);
const MAX_DELIVERIES: usize = 3;
const REASON: &str = "delivered 3 times without being acknowledged: the worker crashed or was \
                      killed while reconciling it";

/// A Git "server" that accepts connections and never answers: a fetch from
/// it hangs (for the fetch timeout, minutes), so the worker holding the
/// event is still in its reconcile when the test kills it.
struct Silent {
    port: u16,
    accepted: Arc<AtomicUsize>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Silent {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (count, held) = (accepted.clone(), open.clone());
        // Ends with the test process.
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        held.lock().unwrap().push(stream);
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(error) if error.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return,
                }
            }
        });
        Self {
            port,
            accepted,
            open,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/stuck.git", self.port)
    }

    /// Fetches that reached it: reconciles of the stuck Application.
    fn fetches(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Closes what it holds, so that the git of a killed worker (left
    /// behind by the SIGKILL) exits.
    fn hang_up(&self) {
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

/// Starts workers one after the other, each with a cache of its own.
struct Workers {
    namespace: String,
    prefix: String,
    cache: tempfile::TempDir,
    started: usize,
}

impl Workers {
    fn start(&mut self) -> Setpoint {
        self.started += 1;
        let cache = self.cache.path().join(format!("worker-{}", self.started));
        std::fs::create_dir_all(&cache).unwrap();
        let max = MAX_DELIVERIES.to_string();
        let args = [
            "worker",
            "--amqp-prefix",
            &self.prefix,
            "--max-deliveries",
            &max,
        ];
        let url = amqp_url();
        Setpoint::scoped(
            &self.namespace,
            &args,
            &[("SETPOINT_AMQP_URL", url.as_str())],
            &cache,
        )
    }
}

/// Waits until `worker` is in the stuck reconcile (the `fetches`th fetch
/// reached the silent server), then kills it as the OOM killer would.
async fn kill_while_reconciling(mut worker: Setpoint, silent: &Silent, fetches: usize) {
    wait_for(
        &format!("fetch {fetches} from the silent server"),
        DEADLINE,
        || async {
            match silent.fetches() {
                n if n >= fetches => Ok(()),
                n => Err(format!("{n} fetches")),
            }
        },
    )
    .await;
    assert_eq!(silent.fetches(), fetches, "one fetch per delivery");
    worker.kill();
    silent.hang_up();
}

async fn set_repo_url(ns: &TestNamespace, app: &str, url: &str) {
    let patch = serde_json::json!({ "spec": { "source": { "repoURL": url } } });
    ns.api::<Application>()
        .patch(app, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn config_map(name: &str, value: usize) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  v: \"{value}\"\n")
}

#[tokio::test]
async fn an_event_that_kills_its_workers_is_parked_while_others_sync() {
    let ns = TestNamespace::new("crashloop").await;
    install_crd(&ns.client).await;
    let repo = GitRepo::new();
    repo.write("apps/steady/cm.yaml", &config_map("steady", 0));
    repo.write("apps/stuck/cm.yaml", &config_map("stuck", 0));
    repo.commit("first");
    let silent = Silent::start();
    create_app(
        &ns,
        "steady",
        &repo.url(),
        "apps/steady",
        automated(true, true),
    )
    .await;
    create_app(
        &ns,
        "stuck",
        &silent.url(),
        "apps/stuck",
        automated(true, true),
    )
    .await;
    let (steady, stuck) = (
        AppKey::new(&ns.name, "steady"),
        AppKey::new(&ns.name, "stuck"),
    );

    let prefix = amqp_prefix("crashloop");
    let queue = AmqpQueue::connect(AmqpSettings {
        url: amqp_url(),
        queue_type: support::amqp_queue_type(),
        prefix: prefix.clone(),
        ..AmqpSettings::default()
    })
    .await;
    assert!(queue.wait_ready(DEADLINE).await, "RabbitMQ is up");
    let mut workers = Workers {
        namespace: ns.name.clone(),
        prefix,
        cache: tempfile::tempdir().unwrap(),
        started: 0,
    };
    let mut revision = 0;
    // A new commit for the steady Application, announced; synced by
    // whichever worker runs, next to the stuck one.
    let steady_syncs = async |revision: &mut usize| {
        *revision += 1;
        repo.write("apps/steady/cm.yaml", &config_map("steady", *revision));
        let commit = repo.commit(&format!("steady {revision}"));
        queue
            .publish(&Event::new(steady.clone(), Cause::Manual))
            .await
            .unwrap();
        wait_for("the steady Application synced", DEADLINE, || {
            synced_at(&ns, "steady", &commit)
        })
        .await;
    };

    // Three workers die in the stuck reconcile; the steady Application
    // syncs on each meanwhile.
    let poison = Event::new(stuck.clone(), Cause::Manual);
    queue.publish(&poison).await.unwrap();
    for fetches in 1..=MAX_DELIVERIES {
        let worker = workers.start();
        steady_syncs(&mut revision).await;
        kill_while_reconciling(worker, &silent, fetches).await;
    }

    // The fourth finds it delivered three times: parked, not reconciled.
    let mut survivor = workers.start();
    let parked = wait_for("the event parked", DEADLINE, || async {
        let parked = queue.parked().await.map_err(|e| e.to_string())?;
        match parked.iter().find(|(event, _)| event.id == poison.id) {
            Some(found) => Ok(found.clone()),
            None => Err(format!("parked: {parked:?}")),
        }
    })
    .await;
    assert_eq!(parked.1, REASON);
    assert_eq!(parked.0.app, stuck);
    steady_syncs(&mut revision).await;
    assert_eq!(silent.fetches(), MAX_DELIVERIES, "no fourth reconcile");
    assert!(survivor.child.try_wait().unwrap().is_none(), "alive");
    // Parked: the poison event only. A worker killed between publishing a
    // counted copy and acknowledging the original leaves both (the module
    // says so: a duplicate, never a loss), so it may be parked twice.
    let only_the_poison = |parked: &[(Event, String)]| {
        assert!(
            !parked.is_empty() && parked.iter().all(|(event, _)| event.id == poison.id),
            "only the first event is parked: {parked:?}"
        );
    };
    let parked_now = queue.parked().await.unwrap();
    only_the_poison(&parked_now);
    // What `parked` read is given back with a nack, which the broker applies
    // after the call returns (through Raft, on a quorum queue): a count
    // taken at once can miss it.
    let expected = (0, u32::try_from(parked_now.len()).unwrap());
    wait_for(
        "the parked events counted in the parking queue",
        DEADLINE,
        || async {
            match queue.depth().await {
                Ok(depth) if (depth.ready, depth.parked) == expected => Ok(()),
                other => Err(format!(
                    "{other:?}, expected (ready, parked) = {expected:?}"
                )),
            }
        },
    )
    .await;
    assert!(
        survivor.logs().contains("parking event"),
        "{}",
        survivor.logs()
    );

    // A count ends with its event: one killed twice, then reconciled, is
    // acknowledged, and the next event of the same Application starts
    // from zero, so it too survives two kills (a count that outlived its
    // event would park it at its first).
    let mut fetches = MAX_DELIVERIES;
    let mut worker = survivor;
    for round in 1..=2 {
        set_repo_url(&ns, "stuck", &silent.url()).await;
        repo.write("apps/stuck/cm.yaml", &config_map("stuck", round));
        let commit = repo.commit(&format!("stuck {round}"));
        queue
            .publish(&Event::new(stuck.clone(), Cause::Manual))
            .await
            .unwrap();
        for kill in 1..MAX_DELIVERIES {
            fetches += 1;
            kill_while_reconciling(worker, &silent, fetches).await;
            if kill + 1 == MAX_DELIVERIES {
                // Released: the Application names the real repository now,
                // and its copy counted twice syncs.
                set_repo_url(&ns, "stuck", &repo.url()).await;
            }
            worker = workers.start();
        }
        wait_for("the stuck Application synced", DEADLINE, || {
            synced_at(&ns, "stuck", &commit)
        })
        .await;
    }
    steady_syncs(&mut revision).await;
    let parked = queue.parked().await.unwrap();
    only_the_poison(&parked);
    assert_eq!(
        parked.len(),
        parked_now.len(),
        "nothing parked since: {parked:?}"
    );
    wait_for("nothing left on the shards", DEADLINE, || async {
        match queue.depth().await {
            Ok(depth) if depth.ready == 0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    drop(worker);
    queue.delete_topology().await.unwrap();
}
