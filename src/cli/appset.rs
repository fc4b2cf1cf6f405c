//! `setpoint appset list|get`: ApplicationSets with their Applications'
//! sync and health, from their status; no URL's user info is printed.

use clap::Subcommand;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use crate::api::{ApplicationSet, ConditionStatus, ConditionType};
use crate::source::repo_url::display_url;

use super::app::{Format, Scope, table};

#[derive(Subcommand, Debug)]
pub enum AppSetCommand {
    /// ApplicationSets: how many Applications, how many synced and healthy,
    /// and whether the last evaluation was Ready.
    List {
        #[command(flatten)]
        scope: Scope,
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short, long, value_enum)]
        output: Option<Format>,
    },
    /// One ApplicationSet: its generators, policy, conditions and each
    /// generated Application.
    Get {
        /// NAME or NAMESPACE/NAME.
        set: String,
        #[command(flatten)]
        scope: Scope,
        #[arg(short, long, value_enum)]
        output: Option<Format>,
    },
}

pub async fn run(command: AppSetCommand) -> anyhow::Result<i32> {
    let config = kube::Config::infer().await?;
    let default_namespace = config.default_namespace.clone();
    let client = kube::Client::try_from(config)?;
    match command {
        AppSetCommand::List {
            scope,
            all_namespaces,
            output,
        } => {
            let api: Api<ApplicationSet> = if all_namespaces {
                Api::all(client)
            } else {
                Api::namespaced(client, &scope.namespace.unwrap_or(default_namespace))
            };
            let mut sets = api.list(&ListParams::default()).await?.items;
            sets.sort_by_key(|s| (s.namespace(), s.name_any()));
            match output {
                Some(format) => {
                    let shown: Vec<_> = sets.iter().map(without_secrets).collect();
                    print!("{}", super::app::encode(&shown, format)?);
                }
                None => print!("{}", list_table(&sets, all_namespaces)),
            }
            Ok(0)
        }
        AppSetCommand::Get { set, scope, output } => {
            let (namespace, name) = match set.split_once('/') {
                Some((namespace, name)) => (namespace.to_string(), name.to_string()),
                None => (scope.namespace.unwrap_or(default_namespace), set),
            };
            let api: Api<ApplicationSet> = Api::namespaced(client, &namespace);
            let Some(set) = api.get_opt(&name).await? else {
                eprintln!("ApplicationSet {namespace}/{name} not found");
                return Ok(1);
            };
            match output {
                Some(format) => print!("{}", super::app::encode(&without_secrets(&set), format)?),
                None => print!("{}", describe(&set)),
            }
            Ok(0)
        }
    }
}

/// The set as `-o yaml|json` prints it: every URL without its user info.
pub fn without_secrets(set: &ApplicationSet) -> serde_json::Value {
    let mut value = serde_json::to_value(set).expect("an ApplicationSet serializes");
    hide_user_info(&mut value);
    value
}

fn hide_user_info(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::String(text) if text.contains("://") && text.contains('@') => {
            *text = display_url(text);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(hide_user_info),
        serde_json::Value::Object(fields) => fields.values_mut().for_each(hide_user_info),
        _ => {}
    }
}

fn ready(set: &ApplicationSet) -> (String, String) {
    let condition = set.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == ConditionType::Ready)
    });
    match condition {
        Some(c) => (
            match c.status {
                ConditionStatus::True => "True",
                ConditionStatus::False => "False",
                ConditionStatus::Unknown => "Unknown",
            }
            .to_string(),
            c.message.clone(),
        ),
        None => ("Unknown".into(), "not evaluated yet".into()),
    }
}

pub fn list_table(sets: &[ApplicationSet], with_namespace: bool) -> String {
    let mut headers = vec![
        "NAME",
        "APPLICATIONS",
        "SYNCED",
        "HEALTHY",
        "READY",
        "MESSAGE",
    ];
    if with_namespace {
        headers.insert(0, "NAMESPACE");
    }
    let rows: Vec<Vec<String>> = sets
        .iter()
        .map(|set| {
            let summary = set.status.clone().unwrap_or_default().summary;
            let (ready, message) = ready(set);
            let mut row = vec![
                set.name_any(),
                summary.applications.to_string(),
                summary.synced.to_string(),
                summary.healthy.to_string(),
                ready,
                crate::report::events::truncate(&message, 100),
            ];
            if with_namespace {
                row.insert(0, set.namespace().unwrap_or_default());
            }
            row
        })
        .collect();
    table(&headers, &rows)
}

pub fn describe(set: &ApplicationSet) -> String {
    let status = set.status.clone().unwrap_or_default();
    let mut out = String::new();
    out.push_str(&format!(
        "Name:          {}/{}\n",
        set.namespace().unwrap_or_default(),
        set.name_any()
    ));
    let generators: Vec<String> = set
        .spec
        .generators
        .iter()
        .map(|g| {
            let value = serde_json::to_value(g).unwrap_or_default();
            value
                .as_object()
                .and_then(|o| o.keys().next().cloned())
                .unwrap_or_else(|| "?".into())
        })
        .collect();
    out.push_str(&format!("Generators:    {}\n", generators.join(", ")));
    let policy = set.spec.sync_policy.applications_sync.unwrap_or_default();
    out.push_str(&format!(
        "Policy:        {} (at most {}% deleted at once)\n",
        serde_json::to_value(policy)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        set.spec.sync_policy.max_delete_percent.unwrap_or(50)
    ));
    out.push_str(&format!(
        "Template name: {}\n",
        set.spec.template.metadata.name
    ));
    out.push_str(&format!(
        "Applications:  {} ({} synced, {} healthy)\n",
        status.summary.applications, status.summary.synced, status.summary.healthy
    ));
    if !status.conditions.is_empty() {
        out.push_str("Conditions:\n");
        for c in &status.conditions {
            out.push_str(&format!(
                "  {:?}={:?} {}: {}\n",
                c.type_, c.status, c.reason, c.message
            ));
        }
    }
    if !status.applications.is_empty() {
        let rows: Vec<Vec<String>> = status
            .applications
            .iter()
            .map(|a| {
                vec![
                    a.name.clone(),
                    format!("{:?}", a.sync),
                    format!("{:?}", a.health),
                    a.revision
                        .as_deref()
                        .map(|r| r.chars().take(12).collect())
                        .unwrap_or_default(),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(
            &["APPLICATION", "SYNC", "HEALTH", "REVISION"],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{
        ApplicationSetSpec, ApplicationSetStatus, GeneratedApplication, Health, SetSummary, Sync,
    };

    fn set() -> ApplicationSet {
        let mut set: ApplicationSet = serde_json::from_value(serde_json::json!({
            "apiVersion": "setpoint.dev/v1alpha1",
            "kind": "ApplicationSet",
            "metadata": {"name": "fleet", "namespace": "team"},
            "spec": {
                "generators": [{"git": {
                    "repoURL": "https://bot:s3cr3t@git.example.com/acme/deploy.git",
                    "directories": [{"path": "apps/*"}]
                }}],
                "template": {"metadata": {"name": "{{ path.basename }}"}, "spec": {}}
            }
        }))
        .unwrap();
        set.status = Some(ApplicationSetStatus {
            applications: vec![GeneratedApplication {
                name: "web".into(),
                sync: Sync::Synced,
                health: Health::Healthy,
                revision: Some("0123456789abcdef".into()),
            }],
            summary: SetSummary {
                applications: 1,
                synced: 1,
                healthy: 1,
            },
            ..Default::default()
        });
        let _: &ApplicationSetSpec = &set.spec;
        set
    }

    #[test]
    fn tables_show_the_summary_and_no_password() {
        let set = set();
        let list = list_table(std::slice::from_ref(&set), true);
        assert!(list.contains("team"), "{list}");
        assert!(list.contains("not evaluated yet"), "{list}");
        let described = describe(&set);
        assert!(described.contains("Generators:    git"), "{described}");
        assert!(described.contains("web"), "{described}");
        assert!(described.contains("0123456789ab"), "{described}");
        let yaml = serde_yaml::to_string(&without_secrets(&set)).unwrap();
        assert!(!yaml.contains("s3cr3t"), "{yaml}");
        assert!(yaml.contains("git.example.com/acme/deploy"), "{yaml}");
    }
}
