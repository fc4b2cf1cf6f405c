//! `make bench`: routing one push against 10,000 Applications with recorded
//! inputs (`status.sourceInputs`), as the webhook does it: the Applications
//! read from the in-memory reflector store (`StoreIndex`), then matched.
//! No cluster: the store is filled in memory. Reports p50/p99/max.

use std::time::{Duration, Instant};

use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use setpoint::api::{Application, ApplicationSpec, ApplicationStatus, Source};
use setpoint::ingest::StoreIndex;
use setpoint::ingest::webhook::AppIndex;
use setpoint::ingest::webhook::route::{Push, RouteIndex};

const APPS: usize = 10_000;
const RUNS: usize = 300;
/// The target.
const P99_TARGET: Duration = Duration::from_millis(10);

/// `APPS` Applications over `repos` repositories: overlays `envs/app-N` over
/// one of 20 bases, each reading a shared values file too.
fn store(repos: usize) -> StoreIndex {
    let mut writer: Writer<Application> = Writer::new(());
    for i in 0..APPS {
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
                format!("bases/web-{}", i % 20),
                format!("envs/app-{i}"),
                "values/common.yaml".into(),
            ],
            ..Default::default()
        });
        writer.apply_watcher_event(&watcher::Event::Apply(app));
    }
    StoreIndex::new(writer.as_reader())
}

fn push(changed: Vec<String>) -> Push {
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
        changed_files: Some(changed),
    }
}

/// Times `RUNS` routings of `push` through `index`; returns the count routed.
/// Warm: the index is reused while no Application changed (the store's
/// fingerprint is still computed per push). Cold: rebuilt, as after a change.
fn measure(what: &str, index: &StoreIndex, push: &Push) -> Duration {
    let warm = time(&format!("{what}, warm index"), || index.route(push).len());
    time(&format!("{what}, index rebuilt"), || {
        RouteIndex::new(index.apps()).route_why(push).len()
    });
    warm
}

fn time(what: &str, mut route: impl FnMut() -> usize) -> Duration {
    let mut times = Vec::with_capacity(RUNS);
    let mut routed = 0;
    for _ in 0..RUNS {
        let started = Instant::now();
        routed = route();
        times.push(started.elapsed());
    }
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    println!(
        "  {what}: {routed} routed; p50 {:?}, p99 {:?}, max {:?}",
        at(0.5),
        at(0.99),
        times[times.len() - 1]
    );
    at(0.99)
}

fn main() {
    println!(
        "routing benchmark: one push against {APPS} Applications with recorded inputs ({RUNS} runs each)"
    );
    let mut worst = Duration::ZERO;
    for repos in [1, 100] {
        let index = store(repos);
        println!(
            "{APPS} Applications over {repos} repositor{}",
            if repos == 1 { "y" } else { "ies" }
        );
        // Twenty files under one overlay, one in a base shared by 1/20th.
        let mut files: Vec<String> = (0..19).map(|f| format!("envs/app-0/f{f}.yaml")).collect();
        files.push("bases/web-3/deploy.yaml".into());
        worst = worst.max(measure(
            "a base and an overlay changed",
            &index,
            &push(files),
        ));
        worst = worst.max(measure(
            "a file nothing reads",
            &index,
            &push(vec!["docs/README.md".into()]),
        ));
        let mut all = push(vec![]);
        all.changed_files = None;
        worst = worst.max(measure(
            "no file list (every app of the branch)",
            &index,
            &all,
        ));
    }
    println!(
        "worst p99 with a warm index {worst:?} (target < {P99_TARGET:?}): {}",
        if worst < P99_TARGET { "ok" } else { "OVER" }
    );
}
