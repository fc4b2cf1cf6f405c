//! `make bench`: routing one push against 10,000 Applications with recorded
//! inputs (`status.sourceInputs`), as the webhook does it: through the route
//! index (`StoreIndex`) the Application watch keeps, event by event. No
//! cluster: the reflector's store and the index are fed watch events in
//! memory. Reports p50/p99/max of every case, and fails when a p99 is not
//! under the 10 ms.

use std::time::{Duration, Instant};

use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use setpoint::api::{Application, ApplicationSpec, ApplicationStatus, Source};
use setpoint::ingest::StoreIndex;
use setpoint::ingest::webhook::AppIndex;
use setpoint::ingest::webhook::route::Push;

const APPS: usize = 10_000;
const RUNS: usize = 300;
/// The target.
const P99_TARGET: Duration = Duration::from_millis(10);

/// Application `i` of `APPS` over `repos` repositories: overlay `envs/app-i`
/// over one of 20 bases (`base`), reading a shared values file too.
fn application(i: usize, repos: usize, base: usize) -> Application {
    let mut app = Application::new(
        &format!("app-{i}"),
        ApplicationSpec {
            source: Source {
                repo_url: format!("https://github.com/example/deploy-{}.git", i % repos),
                path: Some(format!("envs/app-{i}")),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    app.metadata.namespace = Some(format!("team-{}", i % 50));
    app.status = Some(ApplicationStatus {
        source_inputs: vec![
            format!("bases/web-{}", base % 20),
            format!("envs/app-{i}"),
            "values/common.yaml".into(),
        ],
        ..Default::default()
    });
    app
}

/// The store and the webhook's index, fed the same events as the watch
/// feeds them (`AppReflector`).
struct Watched {
    writer: Writer<Application>,
    index: StoreIndex,
}

impl Watched {
    fn new(repos: usize) -> Self {
        let writer: Writer<Application> = Writer::new(());
        let index = StoreIndex::new(writer.as_reader());
        let mut watched = Watched { writer, index };
        watched.event(watcher::Event::Init);
        for i in 0..APPS {
            watched.event(watcher::Event::InitApply(application(i, repos, i)));
        }
        watched.event(watcher::Event::InitDone);
        watched
    }

    fn event(&mut self, event: watcher::Event<Application>) {
        self.writer.apply_watcher_event(&event);
        self.index.apply_watcher_event(&event);
    }
}

fn push(changed: Option<Vec<String>>) -> Push {
    Push {
        repo_urls: vec![
            "https://github.com/example/deploy-0.git".into(),
            "git@github.com:example/deploy-0.git".into(),
            "https://github.com/example/deploy-0".into(),
        ],
        git_ref: "refs/heads/main".into(),
        commit: "0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c".into(),
        case_insensitive: true,
        default_branch: Some("main".into()),
        deleted: false,
        changed_files: changed,
    }
}

/// Times `RUNS` calls of `route` (each returning how many it routed);
/// prints the figures and returns the p99.
fn time(what: &str, mut route: impl FnMut(usize) -> usize) -> Duration {
    let mut times = Vec::with_capacity(RUNS);
    let mut routed = 0;
    for run in 0..RUNS {
        let started = Instant::now();
        routed = route(run);
        times.push(started.elapsed());
    }
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    let p99 = at(0.99);
    println!(
        "  {what}: {routed} routed; p50 {:?}, p99 {p99:?}, max {:?}{}",
        at(0.5),
        times[times.len() - 1],
        if p99 < P99_TARGET { "" } else { "  OVER" }
    );
    p99
}

fn main() {
    println!(
        "routing benchmark: one push against {APPS} Applications with recorded inputs ({RUNS} runs each, p99 target < {P99_TARGET:?})"
    );
    let mut worst: Vec<(String, Duration)> = Vec::new();
    for repos in [1, 100] {
        let started = Instant::now();
        let mut watched = Watched::new(repos);
        println!(
            "{APPS} Applications over {repos} repositor{} (listed into the index in {:?}, off the webhook's path)",
            if repos == 1 { "y" } else { "ies" },
            started.elapsed()
        );
        let mut case = |what: &str, p99: Duration| worst.push((format!("{what} ({repos})"), p99));
        // Twenty files under one overlay, one in a base shared by 1/20th.
        let mut files: Vec<String> = (0..19).map(|f| format!("envs/app-0/f{f}.yaml")).collect();
        files.push("bases/web-3/deploy.yaml".into());
        let base_and_overlay = push(Some(files));
        case(
            "a base and an overlay changed",
            time("a base and an overlay changed", |_| {
                watched.index.route(&base_and_overlay).len()
            }),
        );
        let nothing = push(Some(vec!["docs/README.md".into()]));
        case(
            "a file nothing reads",
            time("a file nothing reads", |_| {
                watched.index.route(&nothing).len()
            }),
        );
        let shared = push(Some(vec!["values/common.yaml".into()]));
        case(
            "a file every app reads",
            time("a file every app reads", |_| {
                watched.index.route(&shared).len()
            }),
        );
        let all = push(None);
        case(
            "no file list (every app of the branch)",
            time("no file list (every app of the branch)", |_| {
                watched.index.route(&all).len()
            }),
        );
        // The first push after an Application changed: one Application of
        // the pushed repository moves to another base (its status's inputs
        // changed), the watch's event reaches the index, then a push to that
        // base routes it.
        let changed = time(
            "first push after an Application changed (event applied, then routed)",
            |run| {
                let i = (run * repos) % APPS;
                let base = run % 20;
                watched.event(watcher::Event::Apply(application(i, repos, base)));
                let push = push(Some(vec![format!("bases/web-{base}/deploy.yaml")]));
                watched.index.route(&push).len()
            },
        );
        worst.push((format!("first push after a change ({repos})"), changed));
        let deleted = time(
            "first push after an Application was deleted and re-created",
            |run| {
                let i = (run * repos) % APPS;
                let app = application(i, repos, i);
                watched.event(watcher::Event::Delete(app.clone()));
                watched.event(watcher::Event::Apply(app));
                watched.index.route(&base_and_overlay).len()
            },
        );
        worst.push((format!("first push after a delete ({repos})"), deleted));
    }
    let over: Vec<&(String, Duration)> =
        worst.iter().filter(|(_, p99)| *p99 >= P99_TARGET).collect();
    let (slowest, p99) = worst
        .iter()
        .max_by_key(|(_, p99)| *p99)
        .expect("cases were measured");
    println!("worst p99 {p99:?}, {slowest} (target < {P99_TARGET:?})");
    if !over.is_empty() {
        println!("OVER the target: {over:?}");
        std::process::exit(1);
    }
    println!("every case under the target");
}
