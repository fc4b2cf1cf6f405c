//! The command line: one binary, roles as subcommands.

pub mod app;
pub mod appset;
pub mod cluster;
pub mod import;
pub mod operate;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use kube::{Api, CustomResourceExt};

use crate::api::Application;
use crate::context::Context;
use crate::reconcile::plan::{Action, Cause, Plan};
use crate::reconcile::{self, Outcome, Request};
use crate::serve::{Roles, ServeOptions, serve};
use crate::tenancy::TenancyOptions;

#[derive(Parser, Debug)]
#[command(
    name = "setpoint",
    version,
    about = "Keeps a Kubernetes cluster equal to what Git holds"
)]
pub struct Cli {
    /// Where Git mirrors are kept.
    #[arg(long, global = true, env = "SETPOINT_CACHE_DIR", default_value_os_t = default_cache_dir())]
    pub cache_dir: PathBuf,
    /// A configuration file (see config/setpoint.yaml); the environment and
    /// flags override it.
    #[arg(long, global = true, env = "SETPOINT_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub tenancy: TenancyOptions,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Everything in one process: webhook, watch, sweep and workers, with the
    /// in-process queue unless --amqp-url is given.
    Run(#[command(flatten)] ServeOptions),
    /// Receive GitHub and GitLab push webhooks and enqueue (needs RabbitMQ).
    Webhook(#[command(flatten)] ServeOptions),
    /// Reconcile Applications from the queue (any number of processes).
    Worker(#[command(flatten)] ServeOptions),
    /// Watch live objects and Applications and enqueue what changed.
    Watch(#[command(flatten)] ServeOptions),
    /// Enqueue every Application at a slow interval (one active replica).
    Sweep(#[command(flatten)] ServeOptions),
    /// The web dashboard alone (`--ui-listen`), for scaled-out installs:
    /// Sync and Refresh publish on RabbitMQ.
    Ui(#[command(flatten)] ServeOptions),
    /// Print the Application CustomResourceDefinition as YAML (with
    /// `--applicationset`, the ApplicationSet's).
    Crd {
        #[arg(long)]
        applicationset: bool,
        /// The Receiver's CRD instead.
        #[arg(long)]
        receiver: bool,
        /// The (notification) Provider's CRD instead.
        #[arg(long)]
        provider: bool,
        /// The Alert's CRD instead.
        #[arg(long)]
        alert: bool,
    },
    /// Configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Applications: list, get, diff, sync, history.
    #[command(subcommand)]
    App(app::AppCommand),
    /// ApplicationSets: list and get.
    #[command(subcommand)]
    Appset(appset::AppSetCommand),
    /// Registered clusters: list.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Print Setpoint Applications for Argo CD and Flux objects (nothing is applied).
    ///
    /// Reads Argo CD Applications and Flux Kustomizations and HelmReleases
    /// (with the sources they name) from files, stdin or the cluster, and
    /// prints the equivalent Setpoint Applications as YAML, with a comment
    /// above each field that does not map.
    Import(import::ImportArgs),
    /// Reconcile one Application once; print the plan and the outcome.
    Reconcile {
        /// NAMESPACE/NAME
        app: String,
        /// Sync even where the sync policy would not (a manual sync).
        #[arg(long)]
        sync: bool,
    },
    /// Print what a reconcile would change; exit 1 when out of sync, 0 when in sync.
    Diff {
        /// NAMESPACE/NAME
        app: String,
        /// Preview another revision instead (a branch, a tag, a commit, or
        /// a pull request's ref such as refs/pull/12/head): the same text a
        /// pull request's preview posts; exit 0 no changes, 1 changes, 2 error.
        #[arg(long)]
        revision: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Validate a configuration file; each error is explained with its key.
    Check { file: PathBuf },
}

pub fn default_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("setpoint")
}

fn check_config(file: &std::path::Path) -> i32 {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{}: cannot read: {e}", file.display());
            return 2;
        }
    };
    match crate::config::parse(&text) {
        Ok(settings) => {
            println!(
                "{}: valid ({} settings set)",
                file.display(),
                settings.len()
            );
            0
        }
        Err(errors) => {
            for error in &errors {
                eprintln!("{}: {error}", file.display());
            }
            1
        }
    }
}

/// Runs the command; returns the process exit code.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let roles = |webhook, worker, watch, sweep| Roles {
        webhook,
        worker,
        watch,
        sweep,
        ui: false,
    };
    match cli.command {
        Command::Run(options) => {
            let mut roles = roles(true, true, !options.no_watch, !options.no_sweep);
            roles.ui = options.ui_listen.is_some();
            serve(options, roles, cli.cache_dir, &cli.tenancy).await?;
            Ok(0)
        }
        Command::Webhook(options) => {
            serve(
                options,
                roles(true, false, false, false),
                cli.cache_dir,
                &cli.tenancy,
            )
            .await?;
            Ok(0)
        }
        Command::Worker(options) => {
            let watch = options.watch;
            serve(
                options,
                roles(false, true, watch, false),
                cli.cache_dir,
                &cli.tenancy,
            )
            .await?;
            Ok(0)
        }
        Command::Watch(options) => {
            serve(
                options,
                roles(false, false, true, false),
                cli.cache_dir,
                &cli.tenancy,
            )
            .await?;
            Ok(0)
        }
        Command::Sweep(options) => {
            serve(
                options,
                roles(false, false, false, true),
                cli.cache_dir,
                &cli.tenancy,
            )
            .await?;
            Ok(0)
        }
        Command::Ui(options) => {
            if options.ui_listen.is_none() {
                anyhow::bail!("setpoint ui needs --ui-listen (or SETPOINT_UI_LISTEN)");
            }
            let mut roles = roles(false, false, false, false);
            roles.ui = true;
            serve(options, roles, cli.cache_dir, &cli.tenancy).await?;
            Ok(0)
        }
        Command::Crd {
            applicationset,
            receiver,
            provider,
            alert,
        } => {
            if provider {
                print!("{}", provider_crd_yaml());
            } else if alert {
                print!("{}", alert_crd_yaml());
            } else if receiver {
                print!("{}", receiver_crd_yaml());
            } else if applicationset {
                print!("{}", appset_crd_yaml());
            } else {
                print!("{}", crd_yaml());
            }
            Ok(0)
        }
        Command::Config(ConfigCommand::Check { file }) => Ok(check_config(&file)),
        Command::App(command) => app::run(command, &cli.cache_dir, &cli.tenancy).await,
        Command::Appset(command) => appset::run(command).await,
        Command::Cluster(command) => cluster::run(command, &cli.cache_dir, &cli.tenancy).await,
        Command::Import(args) => import::run(args).await,
        Command::Reconcile { app, sync } => {
            let (ctx, application) = load(&cli.cache_dir, &cli.tenancy, &app).await?;
            let request = Request {
                manual: sync,
                ..Default::default()
            };
            operate::sync_now(&ctx, &application, &request).await
        }
        Command::Diff {
            app,
            revision: Some(revision),
        } => {
            let (ctx, application) = load(&cli.cache_dir, &cli.tenancy, &app).await?;
            Ok(diff_revision(&ctx, &application, &revision).await)
        }
        Command::Diff {
            app,
            revision: None,
        } => {
            let (ctx, application) = load(&cli.cache_dir, &cli.tenancy, &app).await?;
            let request = Request {
                dry_run: true,
                ..Default::default()
            };
            match reconcile::reconcile(&ctx, &application, &request).await {
                Ok(outcome) => {
                    let plan = outcome.plan.as_ref().expect("a dry run plans");
                    println!(
                        "{app} at revision {}",
                        crate::reconcile::status::short(outcome.revision.as_deref())
                    );
                    print!("{}", render_plan(plan));
                    Ok(if plan.is_in_sync() { 0 } else { 1 })
                }
                Err(error) => {
                    eprintln!("error: {}", crate::report::events::error_chain(&error));
                    Ok(2)
                }
            }
        }
    }
}

/// `setpoint diff --revision`: the preview of `revision` for one
/// Application, as a pull request's comment shows it. A ref outside
/// branches and tags (`refs/pull/N/head`, `refs/merge-requests/N/head`) is
/// fetched from the Application's repository first.
async fn diff_revision(ctx: &Context, app: &Application, revision: &str) -> i32 {
    use crate::preview::render::{self, AppPreview, Failure};
    let special = revision.starts_with("refs/")
        && !revision.starts_with("refs/heads/")
        && !revision.starts_with("refs/tags/");
    let commit = if special {
        let fetched = async {
            let credentials = reconcile::source_credentials(ctx, app).await?;
            Ok::<_, reconcile::ReconcileError>(
                ctx.git
                    .fetch_pull_head(
                        &app.spec.source.repo_url,
                        credentials.as_ref(),
                        revision,
                        None,
                    )
                    .await?,
            )
        };
        match fetched.await {
            Ok(commit) => commit,
            Err(error) => {
                eprintln!("error: {}", crate::report::events::error_chain(&error));
                return 2;
            }
        }
    } else {
        revision.to_string()
    };
    let key = crate::event::AppKey::new(
        app.metadata.namespace.clone().unwrap_or_default(),
        app.metadata.name.clone().unwrap_or_default(),
    );
    let result = render::changes(ctx, app, &commit).await;
    let code = match &result {
        Ok(changes) if changes.is_empty() => 0,
        Ok(_) => 1,
        Err(_) => 2,
    };
    let preview = AppPreview {
        app: key,
        input: None,
        result: result.map_err(|error| Failure::from_error(&error)),
    };
    println!("{revision}:");
    for line in crate::preview::body::app_lines(&preview) {
        println!("{line}");
    }
    code
}

/// The ApplicationSet CRD, as committed beside the Application's.
pub fn appset_crd_yaml() -> String {
    let crd =
        serde_yaml::to_string(&crate::api::ApplicationSet::crd()).expect("the CRD serializes");
    format!("# Generated by `setpoint crd --applicationset` from src/api; do not edit.\n{crd}")
}

/// The Receiver CRD, as committed beside the Application's.
pub fn receiver_crd_yaml() -> String {
    let crd = serde_yaml::to_string(&crate::api::Receiver::crd()).expect("the CRD serializes");
    format!("# Generated by `setpoint crd --receiver` from src/api; do not edit.\n{crd}")
}

/// The notification Provider CRD, as committed beside the Application's.
pub fn provider_crd_yaml() -> String {
    let crd = serde_yaml::to_string(&crate::api::Provider::crd()).expect("the CRD serializes");
    format!("# Generated by `setpoint crd --provider` from src/api; do not edit.\n{crd}")
}

/// The Alert CRD, as committed beside the Application's.
pub fn alert_crd_yaml() -> String {
    let crd = serde_yaml::to_string(&crate::api::Alert::crd()).expect("the CRD serializes");
    format!("# Generated by `setpoint crd --alert` from src/api; do not edit.\n{crd}")
}

/// The CRD, as committed under config/crd/ and charts/setpoint/crds/.
pub fn crd_yaml() -> String {
    let crd = serde_yaml::to_string(&Application::crd()).expect("the CRD serializes");
    format!("# Generated by `setpoint crd` from src/api; do not edit.\n{crd}")
}

async fn load(
    cache_dir: &std::path::Path,
    tenancy: &TenancyOptions,
    app: &str,
) -> anyhow::Result<(Context, Application)> {
    let (namespace, name) = app
        .split_once('/')
        .ok_or_else(|| anyhow::anyhow!("expected NAMESPACE/NAME, got {app:?}"))?;
    let config = kube::Config::infer().await?;
    let tenancy = tenancy.resolve(&config.default_namespace);
    let default_namespace = config.default_namespace.clone();
    let ctx = Context::new(config, cache_dir.to_path_buf(), tenancy)?;
    cluster::load(&ctx, &default_namespace).await;
    let application = Api::<Application>::namespaced(ctx.client.clone(), namespace)
        .get(name)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read Application {app}: {e}"))?;
    Ok((ctx, application))
}

/// One line per object: what the plan does to it and why.
pub fn render_plan(plan: &Plan) -> String {
    let mut out = String::new();
    for step in &plan.steps {
        let (verb, detail) = match &step.action {
            Action::Create {
                deleted_live: false,
            } => ("create", String::new()),
            Action::Create { deleted_live: true } => {
                ("create", " (deleted outside Setpoint)".into())
            }
            Action::Update { cause, drift } => {
                let why = match cause {
                    Cause::GitChanged => "changed in Git",
                    Cause::Drift => "drift",
                };
                let fields: Vec<String> = drift.iter().map(|d| d.to_string()).collect();
                if fields.is_empty() {
                    ("update", format!(" ({why})"))
                } else {
                    ("update", format!(" ({why}: {})", fields.join(", ")))
                }
            }
            Action::Unchanged => ("unchanged", String::new()),
            Action::Prune => ("prune", " (not in Git)".into()),
        };
        out.push_str(&format!("  {verb:<9} {}{detail}\n", step.id));
    }
    out
}

pub(crate) fn print_outcome(app: &str, outcome: &Outcome) {
    println!(
        "{app} at revision {}",
        crate::reconcile::status::short(outcome.revision.as_deref())
    );
    if let Some(plan) = &outcome.plan {
        print!("{}", render_plan(plan));
    }
    let status = &outcome.status;
    println!(
        "outcome: applied {}, pruned {}, left alone {}; {:?}, {:?}{}",
        outcome.applied.len(),
        outcome.pruned.len(),
        outcome.skipped.len(),
        status.sync.status,
        status.health.status,
        status
            .health
            .message
            .as_deref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default()
    );
}
