//! `setpoint app list | get | diff | sync | history`, like `argocd app` and
//! `flux get`: kubectl-like tables, or the objects with `-o yaml|json`.

use std::collections::HashMap;

use clap::{Args, Subcommand, ValueEnum};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::operate;
use crate::api::{Application, ConditionType, OperationSummary};
use crate::cluster::Wanted;
use crate::event::AppKey;
use crate::reconcile::depends;
use crate::reconcile::status::short;
use crate::reconcile::{self, Request};
use crate::source::repo_url::display_url;

#[derive(Subcommand, Debug)]
pub enum AppCommand {
    /// Applications with their sync and health.
    List {
        #[command(flatten)]
        scope: Scope,
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short, long, value_enum)]
        output: Option<Format>,
    },
    /// One Application: source, policy, status, conditions and objects.
    Get {
        /// NAME or NAMESPACE/NAME.
        app: String,
        #[command(flatten)]
        scope: Scope,
        #[arg(short, long, value_enum)]
        output: Option<Format>,
    },
    /// What a sync would change; exit 1 when out of sync.
    Diff {
        app: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Sync now, whatever the sync policy says (a manual sync, from here).
    Sync {
        app: String,
        #[command(flatten)]
        scope: Scope,
        /// Sync inside a closed sync window.
        #[arg(long)]
        override_window: bool,
        /// Apply only these objects of the current render (KIND/NAME or
        /// GROUP/KIND/NAME), and prune nothing.
        #[arg(long, value_name = "KIND/NAME", num_args = 1..)]
        only: Vec<crate::operate::Selector>,
    },
    /// Put a past revision back and pin the Application to it (default: the
    /// last revision that was Synced and Healthy before the current one).
    Rollback {
        app: String,
        /// A history id (`setpoint app history`), a commit id, or a tag.
        revision: Option<String>,
        #[command(flatten)]
        scope: Scope,
        /// Remove the pin instead: follow `targetRevision` again.
        #[arg(long, conflicts_with = "revision")]
        unpin: bool,
        /// Roll back inside a closed sync window.
        #[arg(long)]
        override_window: bool,
    },
    /// Stop applying, pruning and correcting drift (drift is still shown).
    Suspend {
        app: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Undo `suspend` and a rollback's pin: converge to Git at once.
    Resume {
        app: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// The last syncs that changed the cluster, newest first.
    History {
        app: String,
        #[command(flatten)]
        scope: Scope,
        #[arg(short, long, value_enum)]
        output: Option<Format>,
    },
}

#[derive(Args, Debug, Clone)]
pub struct Scope {
    /// The namespace; default: the kubeconfig's.
    #[arg(short, long)]
    pub namespace: Option<String>,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

/// Runs an `app` command; the exit code.
pub async fn run(
    command: AppCommand,
    cache_dir: &std::path::Path,
    tenancy: &crate::tenancy::TenancyOptions,
) -> anyhow::Result<i32> {
    let config = kube::Config::infer().await?;
    let default_namespace = config.default_namespace.clone();
    let tenancy = tenancy.resolve(&default_namespace);
    let ctx = crate::context::Context::new(config, cache_dir.to_path_buf(), tenancy)?;
    super::cluster::load(&ctx, &default_namespace).await;
    let target = |app: &str, scope: &Scope| -> (String, String) {
        match app.split_once('/') {
            Some((ns, name)) => (ns.to_string(), name.to_string()),
            None => (
                scope.namespace.clone().unwrap_or(default_namespace.clone()),
                app.to_string(),
            ),
        }
    };
    let get = async |namespace: &str, name: &str| -> anyhow::Result<Application> {
        Api::<Application>::namespaced(ctx.client.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| anyhow::anyhow!("cannot read Application {namespace}/{name}: {e}"))
    };
    match command {
        AppCommand::List {
            scope,
            all_namespaces,
            output,
        } => {
            let api: Api<Application> = if all_namespaces {
                Api::all(ctx.client.clone())
            } else {
                let namespace = scope.namespace.unwrap_or(default_namespace.clone());
                Api::namespaced(ctx.client.clone(), &namespace)
            };
            let mut apps = api.list(&ListParams::default()).await?.items;
            apps.sort_by_key(|a| (a.namespace(), a.name_any()));
            match output {
                Some(format) => {
                    let apps: Vec<_> = apps.iter().map(without_secrets).collect();
                    print!("{}", encode(&apps, format)?)
                }
                None => print!("{}", list_table(&apps, all_namespaces)),
            }
            Ok(0)
        }
        AppCommand::Get { app, scope, output } => {
            let (namespace, name) = target(&app, &scope);
            let application = get(&namespace, &name).await?;
            match output {
                Some(format) => print!("{}", encode(&without_secrets(&application), format)?),
                None => print!("{}", describe(&application)),
            }
            Ok(0)
        }
        AppCommand::History { app, scope, output } => {
            let (namespace, name) = target(&app, &scope);
            let application = get(&namespace, &name).await?;
            let history = application.status.map(|s| s.history).unwrap_or_default();
            match output {
                Some(format) => print!("{}", encode(&history, format)?),
                None => print!("{}", history_table(&history)),
            }
            Ok(0)
        }
        AppCommand::Diff { app, scope } => {
            let (namespace, name) = target(&app, &scope);
            let application = get(&namespace, &name).await?;
            let request = Request {
                dry_run: true,
                ..Default::default()
            };
            match reconcile::reconcile(&ctx, &application, &request).await {
                Ok(outcome) => {
                    let plan = outcome.plan.as_ref().expect("a dry run plans");
                    println!(
                        "{namespace}/{name} at revision {}",
                        short(outcome.revision.as_deref())
                    );
                    print!("{}", super::render_plan(plan));
                    Ok(if plan.is_in_sync() { 0 } else { 1 })
                }
                Err(error) => {
                    eprintln!("error: {}", crate::report::events::error_chain(&error));
                    Ok(2)
                }
            }
        }
        AppCommand::Sync {
            app,
            scope,
            override_window,
            only,
        } => {
            let (namespace, name) = target(&app, &scope);
            let application = get(&namespace, &name).await?;
            operate::may_patch(&ctx.client, &namespace, &name).await?;
            if let Err(message) = operate::manual_sync_allowed(&application, override_window) {
                eprintln!("error: {message}");
                return Ok(2);
            }
            let request = Request {
                manual: true,
                override_window,
                only,
                by: operate::whoami(&ctx.client).await,
                ..Default::default()
            };
            operate::sync_now(&ctx, &application, &request).await
        }
        AppCommand::Rollback {
            app,
            revision,
            scope,
            unpin,
            override_window,
        } => {
            let (namespace, name) = target(&app, &scope);
            let application = get(&namespace, &name).await?;
            operate::rollback(
                &ctx,
                &application,
                revision.as_deref(),
                unpin,
                override_window,
            )
            .await
        }
        AppCommand::Suspend { app, scope } => {
            let (namespace, name) = target(&app, &scope);
            operate::suspend(&ctx, &namespace, &name).await
        }
        AppCommand::Resume { app, scope } => {
            let (namespace, name) = target(&app, &scope);
            let application = get(&namespace, &name).await?;
            operate::resume(&ctx, &application, &namespace, &name).await
        }
    }
}

pub(super) fn encode<T: serde::Serialize>(value: &T, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Yaml => serde_yaml::to_string(value)?,
        Format::Json => serde_json::to_string_pretty(value)? + "\n",
    })
}

/// The Application as `-o yaml|json` prints it: the user info of its
/// repository URL (a password, a token) removed wherever the URL appears
/// (the spec, kubectl's last-applied annotation, a message), as every
/// error and log line shows it.
pub fn without_secrets(app: &Application) -> serde_json::Value {
    let mut value = serde_json::to_value(app).expect("an Application serializes");
    let url = app.spec.source.repo_url.trim();
    let shown = display_url(url);
    if shown != url {
        // Also as it reads inside a JSON string (the annotation).
        let quoted = |s: &str| serde_json::to_string(s).expect("a string serializes");
        let (url_quoted, shown_quoted) = (quoted(url), quoted(&shown));
        let url_in_json = &url_quoted[1..url_quoted.len() - 1];
        let shown_in_json = &shown_quoted[1..shown_quoted.len() - 1];
        replace_in_strings(&mut value, &[(url, &shown), (url_in_json, shown_in_json)]);
    }
    value
}

fn replace_in_strings(value: &mut serde_json::Value, replacements: &[(&str, &str)]) {
    match value {
        serde_json::Value::String(text) => {
            for (from, to) in replacements {
                if text.contains(from) {
                    *text = text.replace(from, to);
                }
            }
        }
        serde_json::Value::Array(items) => items
            .iter_mut()
            .for_each(|item| replace_in_strings(item, replacements)),
        serde_json::Value::Object(fields) => fields
            .values_mut()
            .for_each(|field| replace_in_strings(field, replacements)),
        _ => {}
    }
}

/// Columns padded to their widest cell, two spaces apart, as kubectl prints.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len() - 1;
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

fn ready_message(app: &Application) -> String {
    app.status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ConditionType::Ready)
        })
        .map(|c| cut(&c.message, 60))
        .unwrap_or_default()
}

fn cut(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    if line.chars().count() <= max {
        line.to_string()
    } else {
        line.chars().take(max - 1).collect::<String>() + "…"
    }
}

pub fn list_table(apps: &[Application], with_namespace: bool) -> String {
    let mut headers = vec!["NAME", "SYNC", "HEALTH", "REVISION", "MESSAGE"];
    // Only when some Application has `spec.dependsOn`.
    let with_waiting = apps.iter().any(|a| !a.spec.depends_on.is_empty());
    if with_waiting {
        headers.insert(4, "WAITING-FOR");
    }
    // Only when some Application deploys to another cluster.
    let with_cluster = apps
        .iter()
        .any(|a| !Wanted::of(&a.spec.destination).is_local());
    if with_cluster {
        headers.insert(1, "CLUSTER");
    }
    if with_namespace {
        headers.insert(0, "NAMESPACE");
    }
    let listed: HashMap<AppKey, &Application> = apps
        .iter()
        .map(|a| {
            (
                AppKey::new(a.namespace().unwrap_or_default(), a.name_any()),
                a,
            )
        })
        .collect();
    let rows: Vec<Vec<String>> = apps
        .iter()
        .map(|app| {
            let status = app.status.clone().unwrap_or_default();
            let mut row = vec![
                app.name_any(),
                format!("{:?}", status.sync.status),
                format!("{:?}", status.health.status),
                short(status.sync.revision.as_deref()).to_string(),
                ready_message(app),
            ];
            if with_waiting {
                row.insert(4, waiting_for(app, &listed));
            }
            if with_cluster {
                row.insert(1, Wanted::of(&app.spec.destination).to_string());
            }
            if with_namespace {
                row.insert(0, app.namespace().unwrap_or_default());
            }
            row
        })
        .collect();
    table(&headers, &rows)
}

/// The dependencies an Application waits for (its Ready condition says it
/// waits): those not ready among the listed ones, and those not listed.
fn waiting_for(app: &Application, listed: &HashMap<AppKey, &Application>) -> String {
    let reason = app
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == ConditionType::Ready)
        })
        .map(|c| c.reason.as_str());
    let own = app.namespace().unwrap_or_default();
    match reason {
        Some(depends::NOT_READY) => {
            let names: Vec<String> = depends::dependencies(app)
                .into_iter()
                .filter(|d| {
                    listed
                        .get(d)
                        .is_none_or(|dep| depends::ready_revision(dep).is_none())
                })
                .map(|d| {
                    if d.namespace == own {
                        d.name
                    } else {
                        d.to_string()
                    }
                })
                .collect();
            names.join(",")
        }
        Some("DependencyCycle") => "(cycle)".into(),
        _ => "-".into(),
    }
}

pub fn describe(app: &Application) -> String {
    let spec = &app.spec;
    let status = app.status.clone().unwrap_or_default();
    let policy = match &spec.sync_policy.automated {
        Some(a) => format!("automated (prune: {}, selfHeal: {})", a.prune, a.self_heal),
        None => "manual".to_string(),
    };
    let method = if spec.source.helm.is_some() {
        "helm"
    } else if spec.source.kustomize.is_some() {
        "kustomize"
    } else if spec.source.directory.is_some() {
        "directory"
    } else {
        "detected from the path"
    };
    let mut out = String::new();
    let mut field = |name: &str, value: String| out.push_str(&format!("{name:<14}{value}\n"));
    field(
        "Name:",
        format!("{}/{}", app.namespace().unwrap_or_default(), app.name_any()),
    );
    field("Repo:", display_url(&spec.source.repo_url));
    field("Cluster:", Wanted::of(&spec.destination).to_string());
    field(
        "Target:",
        spec.source
            .target_revision
            .clone()
            .unwrap_or_else(|| "(default branch)".into()),
    );
    field(
        "Path:",
        spec.source.path.clone().unwrap_or_else(|| "(root)".into()),
    );
    field("Render:", method.to_string());
    field("Sync policy:", policy);
    if let Some(verify) = &spec.source.verify {
        let mode = match verify.mode {
            crate::api::VerifyMode::Head => "signed commits",
            crate::api::VerifyMode::Tag => "signed tags",
        };
        field(
            "Verify:",
            format!("{mode}, keys of Secret {}", verify.secret_ref.name),
        );
    }
    if let Some(operation) = &status.operation
        && let Some(signature) = &operation.signature
    {
        field("Signed by:", signed_by(signature, &operation.revision));
    }
    field(
        "Sync status:",
        format!(
            "{:?} at {}",
            status.sync.status,
            short(status.sync.revision.as_deref())
        ),
    );
    let health_message = status
        .health
        .message
        .as_deref()
        .map(|m| format!(" ({})", cut(m, 80)))
        .unwrap_or_default();
    field(
        "Health:",
        format!("{:?}{health_message}", status.health.status),
    );
    if spec.suspend {
        field("Suspended:", "yes".into());
    }
    if let Some(hold) = &status.hold {
        let until = hold
            .until
            .as_ref()
            .map(|u| format!(" (until {u})"))
            .unwrap_or_default();
        field(
            "Held:",
            format!("{}{until}: {}", hold.reason, cut(&hold.message, 100)),
        );
    }
    if let Some(pin) = &spec.pin {
        let by = pin
            .by
            .as_ref()
            .map(|b| format!(" by {b}"))
            .unwrap_or_default();
        let at = pin
            .at
            .as_ref()
            .map(|a| format!(" at {a}"))
            .unwrap_or_default();
        let newer = status
            .pinned
            .as_ref()
            .and_then(|p| p.newer_revision.as_deref())
            .map(|n| format!("; newer commit {} not applied", short(Some(n))))
            .unwrap_or_default();
        field(
            "Pinned:",
            format!("{}{by}{at}{newer}", short(Some(&pin.revision))),
        );
    }
    if !spec.sync_windows.is_empty() {
        let windows: Vec<String> = spec
            .sync_windows
            .iter()
            .map(|w| {
                format!(
                    "{} {:?} for {}{}",
                    if w.kind == crate::api::WindowKind::Deny {
                        "deny"
                    } else {
                        "allow"
                    },
                    w.schedule,
                    w.duration,
                    w.time_zone
                        .as_ref()
                        .map(|z| format!(" ({z})"))
                        .unwrap_or_default()
                )
            })
            .collect();
        field("Windows:", windows.join("; "));
    }
    if !spec.depends_on.is_empty() {
        let own = app.namespace().unwrap_or_default();
        let named: Vec<String> = depends::dependencies(app)
            .into_iter()
            .map(|d| {
                if d.namespace == own {
                    d.name
                } else {
                    d.to_string()
                }
            })
            .collect();
        field("Depends on:", named.join(", "));
    }
    if !status.source_inputs.is_empty() {
        // What the last render read: a push that changes none of it does
        // not reconcile this Application.
        out.push_str("\nINPUTS\n");
        for input in &status.source_inputs {
            let shown = if input.is_empty() { "(root)" } else { input };
            out.push_str(&format!("  {shown}\n"));
        }
    }
    if !status.conditions.is_empty() {
        out.push_str("\nCONDITIONS\n");
        let rows: Vec<Vec<String>> = status
            .conditions
            .iter()
            .map(|c| {
                vec![
                    format!("{:?}", c.type_),
                    format!("{:?}", c.status),
                    c.reason.clone(),
                    cut(&c.message, 80),
                ]
            })
            .collect();
        out.push_str(&table(&["TYPE", "STATUS", "REASON", "MESSAGE"], &rows));
    }
    if let Some(run) = &status.sync_run {
        out.push_str(&sync_run_section(run));
    }
    if !status.resources.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = status
            .resources
            .iter()
            .map(|r| {
                vec![
                    if r.group.is_empty() {
                        r.kind.clone()
                    } else {
                        format!("{}/{}", r.group, r.kind)
                    },
                    r.namespace.clone().unwrap_or_default(),
                    r.name.clone(),
                    format!("{:?}", r.sync),
                    format!("{:?}", r.health),
                    r.message.as_deref().map(|m| cut(m, 60)).unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(
            &["KIND", "NAMESPACE", "NAME", "SYNC", "HEALTH", "MESSAGE"],
            &rows,
        ));
    }
    out
}

/// Who signed the last applied revision: `bob@example.com (ssh key
/// SHA256:…) at 1a2b3c4d5e6f`, or `… (tag v1) at 1a2b3c4d5e6f` for a signed tag.
fn signed_by(signature: &crate::api::SignatureRecord, revision: &str) -> String {
    let kind = match signature.kind {
        crate::api::SignatureType::Openpgp => "openpgp",
        crate::api::SignatureType::Ssh => "ssh",
    };
    let tag = signature
        .tag
        .as_ref()
        .map(|t| format!(", tag {t}"))
        .unwrap_or_default();
    format!(
        "{} ({kind} key {}{tag}) at {}",
        signature.signer,
        signature.key,
        short(Some(revision))
    )
}

/// The last ordered sync: its phase, each wave and each hook with how long
/// it took (or `running`).
fn sync_run_section(run: &crate::api::SyncRun) -> String {
    use crate::reconcile::ordering::shown_ms;
    let took = |ms: Option<i64>| ms.map_or_else(|| "running".to_string(), shown_ms);
    let mut out = format!(
        "\nSYNC RUN  {:?} at {}{}\n",
        run.phase,
        short(Some(&run.revision)),
        run.message
            .as_deref()
            .map(|m| format!(" ({})", cut(m, 80)))
            .unwrap_or_default()
    );
    if !run.waves.is_empty() {
        let rows: Vec<Vec<String>> = run
            .waves
            .iter()
            .map(|w| {
                vec![
                    w.wave.to_string(),
                    w.objects.to_string(),
                    took(w.duration_ms),
                ]
            })
            .collect();
        out.push_str(&table(&["WAVE", "OBJECTS", "TOOK"], &rows));
    }
    if !run.hooks.is_empty() {
        let rows: Vec<Vec<String>> = run
            .hooks
            .iter()
            .map(|h| {
                vec![
                    format!("{:?}", h.phase),
                    h.kind.clone(),
                    h.name.clone(),
                    format!("{:?}", h.state),
                    took(h.duration_ms),
                ]
            })
            .collect();
        out.push_str(&table(&["HOOK", "KIND", "NAME", "STATE", "TOOK"], &rows));
    }
    out
}

pub fn history_table(history: &[OperationSummary]) -> String {
    let rows: Vec<Vec<String>> = history
        .iter()
        .map(|o| {
            vec![
                o.id.to_string(),
                o.finished_at.clone(),
                short(Some(&o.revision)).to_string(),
                o.applied.to_string(),
                o.pruned.to_string(),
                o.unchanged.to_string(),
                format!("{}ms", o.duration_ms),
                if o.healthy { "yes" } else { "no" }.to_string(),
                o.initiated_by.clone().unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "FINISHED",
            "REVISION",
            "APPLIED",
            "PRUNED",
            "UNCHANGED",
            "DURATION",
            "HEALTHY",
            "BY",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_columns_like_kubectl() {
        let out = table(
            &["NAME", "SYNC", "MESSAGE"],
            &[
                vec!["web".into(), "Synced".into(), "".into()],
                vec![
                    "payments-api".into(),
                    "OutOfSync".into(),
                    "2 objects differ".into(),
                ],
            ],
        );
        assert_eq!(
            out,
            "NAME          SYNC       MESSAGE\nweb           Synced\npayments-api  OutOfSync  2 objects differ\n"
        );
    }

    #[test]
    fn app_get_shows_the_waves_and_hooks_of_the_sync_run() {
        use crate::api::{HookPhase, HookRecord, HookState, RunPhase, SyncRun, WaveRecord};
        let run = SyncRun {
            revision: "0123456789abcdef".into(),
            phase: RunPhase::Sync,
            message: Some("waiting for wave 5 to be Healthy".into()),
            waves: vec![
                WaveRecord {
                    wave: 0,
                    objects: 2,
                    started_at: String::new(),
                    duration_ms: Some(1500),
                },
                WaveRecord {
                    wave: 5,
                    objects: 1,
                    started_at: String::new(),
                    duration_ms: None,
                },
            ],
            hooks: vec![HookRecord {
                phase: HookPhase::PreSync,
                kind: "Job".into(),
                name: "migrate".into(),
                state: HookState::Succeeded,
                duration_ms: Some(800),
                ..Default::default()
            }],
            ..Default::default()
        };
        let out = sync_run_section(&run);
        assert!(
            out.contains("SYNC RUN  Sync at 0123456789ab (waiting for wave 5 to be Healthy)"),
            "{out}"
        );
        let lines: Vec<String> = out
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        assert!(lines.contains(&"0 2 1.5s".to_string()), "{out}");
        assert!(lines.contains(&"5 1 running".to_string()), "{out}");
        assert!(
            lines.contains(&"PreSync Job migrate Succeeded 800ms".to_string()),
            "{out}"
        );
    }

    #[test]
    fn history_is_listed_newest_first_with_short_revisions() {
        let history = [OperationSummary {
            revision: "0123456789abcdef0123".into(),
            applied: 2,
            pruned: 1,
            unchanged: 3,
            duration_ms: 42,
            finished_at: "2026-12-02T20:00:00Z".into(),
            id: 4,
            initiated_by: Some("rollback by alice".into()),
            ..Default::default()
        }];
        let out = history_table(&history);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>()[..3],
            ["ID", "FINISHED", "REVISION"]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "4",
                "2026-12-02T20:00:00Z",
                "0123456789ab",
                "2",
                "1",
                "3",
                "42ms",
                "no",
                "rollback",
                "by",
                "alice"
            ]
        );
    }

    fn app_with(repo_url: &str) -> Application {
        let mut app = Application::new(
            "web",
            crate::api::ApplicationSpec {
                source: crate::api::Source {
                    repo_url: repo_url.into(),
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        app.metadata.namespace = Some("team".into());
        app
    }

    #[test]
    fn the_recorded_inputs_are_listed() {
        let mut app = app_with("https://git.example.com/org/repo.git");
        assert!(!describe(&app).contains("INPUTS"));
        app.status = Some(crate::api::ApplicationStatus {
            source_inputs: vec!["bases/web".into(), "envs/prod".into()],
            ..Default::default()
        });
        let out = describe(&app);
        assert!(
            out.contains("\nINPUTS\n  bases/web\n  envs/prod\n"),
            "{out}"
        );
    }

    #[test]
    fn app_get_shows_what_must_be_signed_and_who_signed_the_applied_revision() {
        use crate::api::{
            LocalSecretRef, OperationSummary, SignatureRecord, SignatureType, Verify, VerifyMode,
        };
        let mut app = app_with("https://git.example.com/org/repo.git");
        assert!(!describe(&app).contains("Signed by:"));
        app.spec.source.verify = Some(Verify {
            mode: VerifyMode::Tag,
            secret_ref: LocalSecretRef {
                name: "signers".into(),
            },
        });
        app.status = Some(crate::api::ApplicationStatus {
            operation: Some(OperationSummary {
                revision: "1a2b3c4d5e6f7a8b9c0d1a2b3c4d5e6f7a8b9c0d".into(),
                signature: Some(SignatureRecord {
                    signer: "bob@example.com".into(),
                    key: "SHA256:abc".into(),
                    kind: SignatureType::Ssh,
                    tag: Some("v1".into()),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let out = describe(&app);
        assert!(
            out.contains("Verify:       signed tags, keys of Secret signers\n"),
            "{out}"
        );
        assert!(
            out.contains(
                "Signed by:    bob@example.com (ssh key SHA256:abc, tag v1) at 1a2b3c4d5e6f\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn a_password_in_the_repository_url_is_never_printed() {
        let url = "https://bot:s3cr3t-pass@git.example.com/org/repo.git";
        let mut app = app_with(url);
        let last_applied = serde_json::json!({"spec": {"source": {"repoURL": url}}});
        app.metadata.annotations = Some(
            [(
                "kubectl.kubernetes.io/last-applied-configuration".to_string(),
                last_applied.to_string(),
            )]
            .into(),
        );
        let out = describe(&app);
        assert!(
            out.contains("Repo:         https://git.example.com/org/repo.git"),
            "{out}"
        );
        let printed = without_secrets(&app);
        assert_eq!(
            printed["spec"]["source"]["repoURL"],
            "https://git.example.com/org/repo.git"
        );
        for out in [
            out,
            encode(&printed, Format::Yaml).unwrap(),
            encode(&printed, Format::Json).unwrap(),
            encode(&std::slice::from_ref(&printed), Format::Yaml).unwrap(),
        ] {
            assert!(!out.contains("s3cr3t"), "{out}");
            assert!(!out.contains("bot:"), "{out}");
        }
    }

    #[test]
    fn urls_without_a_secret_are_printed_as_written() {
        for url in [
            "git@github.com:org/repo.git",
            "/srv/git/repo",
            "https://github.com/org/repo",
        ] {
            let app = app_with(url);
            assert!(describe(&app).contains(&format!("Repo:         {url}\n")));
            assert_eq!(without_secrets(&app)["spec"]["source"]["repoURL"], url);
        }
        // A token as the user name over https is a secret too.
        let app = app_with("https://ghp_token123@github.com/org/repo");
        assert!(!describe(&app).contains("ghp_token123"));
        // And a password over ssh.
        let app = app_with("ssh://deploy:hunter2@git.example.com/org/repo");
        assert!(!describe(&app).contains("hunter2"));
    }

    #[test]
    fn an_application_no_sync_has_assessed_is_unknown_not_healthy() {
        let app = app_with("https://git.example.com/org/repo.git");
        let out = list_table(std::slice::from_ref(&app), false);
        let row: Vec<&str> = out.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(row[..3], ["web", "Unknown", "Unknown"], "{out}");
        assert!(describe(&app).contains("Health:       Unknown"));
    }

    #[test]
    fn long_messages_are_cut_to_one_line() {
        assert_eq!(cut("first line\nsecond", 60), "first line");
        assert_eq!(cut(&"x".repeat(70), 10).chars().count(), 10);
    }

    #[test]
    fn list_shows_what_a_waiting_application_waits_for_and_get_its_dependencies() {
        use crate::api::{Condition, ConditionStatus, Dependency};
        let mut a = app_with("https://git.example.com/org/repo.git");
        a.metadata.name = Some("a".into());
        let mut b = app_with("https://git.example.com/org/repo.git");
        b.metadata.name = Some("b".into());
        b.spec.depends_on = vec![
            Dependency {
                name: "a".into(),
                namespace: None,
            },
            Dependency {
                name: "db".into(),
                namespace: Some("infra".into()),
            },
        ];
        b.status.get_or_insert_default().conditions = vec![Condition {
            type_: ConditionType::Ready,
            status: ConditionStatus::False,
            reason: depends::NOT_READY.into(),
            message: "waiting for dependencies: ns/a (Synced, Progressing)".into(),
            last_transition_time: "t".into(),
            observed_generation: None,
        }];
        let out = list_table(&[a, b.clone()], false);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].contains("WAITING-FOR"), "{out}");
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            row[..5],
            ["b", "Unknown", "Unknown", "unknown", "a,infra/db"],
            "{out}"
        );
        assert!(
            describe(&b).contains("Depends on:   a, infra/db\n"),
            "{}",
            describe(&b)
        );
    }
}
