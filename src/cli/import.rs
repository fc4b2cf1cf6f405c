//! `setpoint import`: reads Argo CD and Flux objects from files, stdin or
//! the cluster, and prints the Setpoint Applications they map to (the
//! mapping itself is `crate::import`, pure). Nothing is applied.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::PathBuf;

use clap::Args;
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client};

use crate::import::{self, AppNamespace, ImportError, Options, SourceObject};

const AFTER_HELP: &str = "\
What maps (see the comments in the output for what does not):
  Argo CD Application      spec.source (repoURL, targetRevision, path, chart, helm, kustomize,
                           directory with jsonnet), spec.destination, syncPolicy.automated
                           (prune, selfHeal, allowEmpty), syncPolicy.syncOptions,
                           ignoreDifferences, the resources finalizer; spec.sources only its
                           first rendering source; spec.project as a comment.
  Flux Kustomization       with its GitRepository: url, ref, path, prune, suspend,
                           targetNamespace, dependsOn, serviceAccountName, secretRef →
                           credentialsSecret; kubeConfig → destination.name (a cluster Secret).
  Flux HelmRelease         with its HelmRepository, OCIRepository or GitRepository: chart,
                           version, values → helm.valuesObject, releaseName, install.
Each Application goes to its destination namespace (Argo CD's destination.namespace, Flux's
targetNamespace) unless --app-namespace says otherwise.

Exit status: 0 when at least one Application was printed, 1 when none could be read.

Examples:
  setpoint import -f argocd-apps.yaml > setpoint-apps.yaml
  kubectl get applications -n argocd -o yaml | setpoint import -f -
  setpoint import --from-cluster --namespace flux-system --app-namespace source";

/// The kinds `--from-cluster` lists, by API group.
const CLUSTER_KINDS: [(&str, &str); 6] = [
    ("argoproj.io", "Application"),
    ("kustomize.toolkit.fluxcd.io", "Kustomization"),
    ("helm.toolkit.fluxcd.io", "HelmRelease"),
    ("source.toolkit.fluxcd.io", "GitRepository"),
    ("source.toolkit.fluxcd.io", "HelmRepository"),
    ("source.toolkit.fluxcd.io", "OCIRepository"),
];

#[derive(Args, Debug)]
#[command(after_long_help = AFTER_HELP)]
pub struct ImportArgs {
    /// A file of Argo CD Applications or Flux objects (multi-document YAML,
    /// or a List as `kubectl get -o yaml` prints it); `-` reads stdin. May
    /// be given more than once.
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        required_unless_present = "from_cluster"
    )]
    pub files: Vec<PathBuf>,
    /// Read the objects from the cluster of the kubeconfig instead (the
    /// kinds whose CRDs it serves).
    #[arg(long, conflicts_with = "files")]
    pub from_cluster: bool,
    /// With --from-cluster: only this namespace (default: every namespace).
    #[arg(short, long, requires = "from_cluster")]
    pub namespace: Option<String>,
    /// Where each Setpoint Application is to live: `destination` (the
    /// namespace its objects go to, else the object's own), `source` (the
    /// object's own namespace, e.g. argocd or flux-system), or a namespace.
    #[arg(
        long,
        value_name = "destination|source|NAMESPACE",
        default_value = "destination"
    )]
    pub app_namespace: String,
    /// Rename a namespace of the output (after --app-namespace), for the
    /// Applications and their dependsOn, e.g. `argocd=gitops`. May be given
    /// more than once.
    #[arg(long = "namespace-map", value_name = "FROM=TO", value_parser = parse_mapping)]
    pub namespace_map: Vec<(String, String)>,
}

fn parse_mapping(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((from, to)) if !from.is_empty() && !to.is_empty() => Ok((from.into(), to.into())),
        _ => Err(format!("expected FROM=TO, got {text:?}")),
    }
}

/// Runs `setpoint import`; the exit code.
pub async fn run(args: ImportArgs) -> anyhow::Result<i32> {
    let mut objects = Vec::new();
    let mut problems: Vec<ImportError> = Vec::new();
    let mut read_anything = false;
    if args.from_cluster {
        let client = Client::try_default().await?;
        objects = from_cluster(&client, args.namespace.as_deref()).await?;
        read_anything = true;
    } else {
        for file in &args.files {
            let (origin, text) = match read(file) {
                Ok(read) => read,
                Err(error) => {
                    eprintln!("{}: cannot read: {error}", file.display());
                    continue;
                }
            };
            read_anything = true;
            let (found, errors) = import::parse_documents(&origin, &text);
            objects.extend(found);
            problems.extend(errors);
        }
    }
    let options = Options {
        app_namespace: AppNamespace::parse(&args.app_namespace),
        namespace_map: args.namespace_map.into_iter().collect::<BTreeMap<_, _>>(),
    };
    let outcome = import::import(&objects, &options);
    problems.extend(outcome.problems);
    for problem in &problems {
        eprintln!("{problem}");
    }
    if outcome.imported.is_empty() {
        if read_anything {
            eprintln!(
                "error: no Argo CD Application, Flux Kustomization or HelmRelease could be imported"
            );
        }
        return Ok(1);
    }
    print!("{}", import::render(&outcome.imported));
    Ok(0)
}

/// A file's name (for messages) and text; `-` is stdin.
fn read(file: &std::path::Path) -> std::io::Result<(String, String)> {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text)?;
        return Ok(("stdin".into(), text));
    }
    Ok((file.display().to_string(), std::fs::read_to_string(file)?))
}

/// Every object of the importable kinds the cluster serves, in
/// `namespace` or everywhere; a kind it does not serve is skipped with a
/// note on stderr.
async fn from_cluster(
    client: &Client,
    namespace: Option<&str>,
) -> anyhow::Result<Vec<SourceObject>> {
    let mut objects = Vec::new();
    let mut groups: BTreeMap<&str, Option<kube::discovery::ApiGroup>> = BTreeMap::new();
    for (group, kind) in CLUSTER_KINDS {
        if !groups.contains_key(group) {
            let found = match kube::discovery::group(client, group).await {
                Ok(found) => Some(found),
                Err(kube::Error::Discovery(_)) => None,
                Err(error) => anyhow::bail!("cannot discover the API group {group}: {error}"),
            };
            groups.insert(group, found);
        }
        let Some((resource, _)) = groups[group]
            .as_ref()
            .and_then(|g| g.recommended_kind(kind))
        else {
            eprintln!("{kind}.{group}: not served by the cluster (no CRD); skipped");
            continue;
        };
        let listed = match list(client, &resource, namespace).await {
            Ok(listed) => listed,
            Err(kube::Error::Api(status)) if status.code == 403 || status.code == 404 => {
                eprintln!("{kind}.{group}: cannot list ({}); skipped", status.message);
                continue;
            }
            Err(error) => anyhow::bail!("cannot list {kind}.{group}: {error}"),
        };
        for item in listed {
            let mut value = serde_json::to_value(&item)?;
            value["apiVersion"] = resource.api_version.clone().into();
            value["kind"] = resource.kind.clone().into();
            objects.push(SourceObject {
                origin: "the cluster".into(),
                document: objects.len() + 1,
                value,
            });
        }
    }
    Ok(objects)
}

/// All objects of one kind, page by page.
async fn list(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Result<Vec<DynamicObject>, kube::Error> {
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}
