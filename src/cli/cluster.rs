//! `setpoint cluster list`: each registered cluster (and the local one),
//! whether it answers, its version and how many Applications deploy to it.
//! No credential is printed: only names, URLs and errors.

use std::collections::BTreeMap;

use clap::Subcommand;
use kube::Api;
use kube::api::ListParams;

use crate::api::Application;
use crate::cluster::{Cluster, IN_CLUSTER, Wanted};
use crate::context::Context;

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// The registered clusters: name, server, reachability, version and
    /// Application count.
    List {
        /// Count only the Applications of this namespace (default: all).
        #[arg(short, long)]
        namespace: Option<String>,
    },
}

/// Reads the cluster Secrets of Setpoint's namespace (`POD_NAMESPACE`, else
/// `default_namespace`) into the context's registry, once; a failure is
/// reported, and Applications of other clusters then say "not found".
pub async fn load(ctx: &Context, default_namespace: &str) {
    let namespace = cluster_namespace(default_namespace);
    if let Err(error) = ctx.clusters.load(&ctx.client, &namespace).await {
        eprintln!("cannot read the cluster Secrets of namespace {namespace}: {error}");
    }
}

fn cluster_namespace(default_namespace: &str) -> String {
    std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| default_namespace.to_string())
}

pub async fn run(
    command: ClusterCommand,
    cache_dir: &std::path::Path,
    tenancy: &crate::tenancy::TenancyOptions,
) -> anyhow::Result<i32> {
    let ClusterCommand::List { namespace } = command;
    let config = kube::Config::infer().await?;
    let default_namespace = config.default_namespace.clone();
    let tenancy = tenancy.resolve(&default_namespace);
    let ctx = Context::new(config, cache_dir.to_path_buf(), tenancy)?;
    load(&ctx, &default_namespace).await;
    let api: Api<Application> = match &namespace {
        Some(namespace) => Api::namespaced(ctx.client.clone(), namespace),
        None => Api::all(ctx.client.clone()),
    };
    let apps = api.list(&ListParams::default()).await?.items;
    let registered = ctx.clusters.clusters();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for app in &apps {
        let wanted = Wanted::of(&app.spec.destination);
        let name = match &wanted {
            Wanted::Local => IN_CLUSTER.to_string(),
            other => registered
                .iter()
                .find(|(entry, _)| other.matches(entry))
                .map(|(entry, _)| entry.name.clone())
                .unwrap_or_else(|| format!("{other} (not registered)")),
        };
        *counts.entry(name).or_default() += 1;
    }
    let mut rows = vec![row(ctx.local(), &counts).await];
    for (entry, cluster) in &registered {
        rows.push(match cluster {
            Some(cluster) => row(cluster, &counts).await,
            None => vec![
                entry.name.clone(),
                entry.server.clone(),
                "Refused".into(),
                String::new(),
                counts.get(&entry.name).copied().unwrap_or(0).to_string(),
                entry
                    .access
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "cannot build a client".into()),
            ],
        });
    }
    for (name, count) in counts
        .iter()
        .filter(|(n, _)| n.ends_with("(not registered)"))
    {
        rows.push(vec![
            name.clone(),
            String::new(),
            "NotFound".into(),
            String::new(),
            count.to_string(),
            String::new(),
        ]);
    }
    let headers = ["NAME", "SERVER", "STATUS", "VERSION", "APPS", "MESSAGE"];
    print!("{}", super::app::table(&headers, &rows));
    Ok(0)
}

async fn row(cluster: &Cluster, counts: &BTreeMap<String, usize>) -> Vec<String> {
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        cluster.client().apiserver_version(),
    )
    .await;
    let (status, version, message) = match answer {
        Ok(Ok(info)) => ("Reachable", info.git_version, String::new()),
        Ok(Err(error)) => (
            "Unreachable",
            String::new(),
            crate::cluster::unreachable_cause(&error).unwrap_or_else(|| error.to_string()),
        ),
        Err(_) => ("Unreachable", String::new(), "no answer within 5s".into()),
    };
    vec![
        cluster.name.clone(),
        cluster.server.clone(),
        status.into(),
        version,
        counts.get(&cluster.name).copied().unwrap_or(0).to_string(),
        message,
    ]
}
