//! Jsonnet directories as Argo CD renders them (`.jsonnet` files, `libs`,
//! `extVars`, `tlas`), applied to the real local control plane; imports that
//! leave the repository and syntax errors are conditions; a path that
//! renders to no object is an error unless `allowEmpty`.

mod support;

use k8s_openapi::api::core::v1::ConfigMap;
use setpoint::api::{
    ConditionStatus, ConditionType, DirectorySource, JsonnetSource, JsonnetVar, Source, Sync,
    SyncPolicy,
};
use setpoint::reconcile::Request;
use support::app::{
    automated, context, create_app, create_app_from, get_app, install_crd, reconcile_app,
};
use support::{GitRepo, TestNamespace};

const GUESTBOOK_LIB: &str = "{
  configMap(name, data):: {
    apiVersion: 'v1',
    kind: 'ConfigMap',
    metadata: { name: name, labels: { tier: 'frontend' } },
    data: data,
  },
}
";

const GUESTBOOK: &str = "local k = import 'guestbook.libsonnet';
function(replicas, image='guestbook:1') [
  k.configMap('guestbook-ui', {
    replicas: std.toString(replicas),
    image: image,
    env: std.extVar('env'),
  }),
  k.configMap('guestbook-settings', { greeting: std.extVar('greeting') }),
]
";

fn var(name: &str, value: &str, code: bool) -> JsonnetVar {
    JsonnetVar {
        name: name.into(),
        value: value.into(),
        code,
    }
}

fn jsonnet_source(repo: &GitRepo, path: &str, options: JsonnetSource) -> Source {
    Source {
        repo_url: repo.url(),
        path: Some(path.into()),
        directory: Some(DirectorySource {
            jsonnet: Some(options),
        }),
        ..Default::default()
    }
}

async fn data(ns: &TestNamespace, name: &str) -> std::collections::BTreeMap<String, String> {
    ns.api::<ConfigMap>()
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .data
        .unwrap_or_default()
}

/// The Stalled condition's reason and message.
async fn stalled(ns: &TestNamespace, app: &str) -> (String, String) {
    let status = get_app(ns, app).await.status.expect("a status");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == ConditionType::Stalled && c.status == ConditionStatus::True)
        .unwrap_or_else(|| panic!("no Stalled condition: {:?}", status.conditions));
    (condition.reason.clone(), condition.message.clone())
}

#[tokio::test]
async fn a_guestbook_in_jsonnet_renders_applies_and_follows_its_library() {
    let ns = TestNamespace::new("jsonnet").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let first = repo
        .write("lib/guestbook.libsonnet", GUESTBOOK_LIB)
        .write("apps/guestbook/guestbook.jsonnet", GUESTBOOK)
        .write("apps/guestbook/README.md", "# guestbook\n")
        .commit("guestbook in jsonnet");
    let options = JsonnetSource {
        ext_vars: vec![
            var("env", "prod", false),
            var("greeting", "'hello ' + 'there'", true),
        ],
        tlas: vec![var("replicas", "3", true)],
        libs: vec!["lib".into()],
    };
    create_app_from(
        &ns,
        "guestbook",
        jsonnet_source(&repo, "apps/guestbook", options),
        automated(true, true),
    )
    .await;
    let outcome = reconcile_app(&ctx, &ns, "guestbook", &Request::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.status.sync.status, Sync::Synced);
    assert_eq!(outcome.revision.as_deref(), Some(first.as_str()));
    let ui = data(&ns, "guestbook-ui").await;
    assert_eq!(ui["replicas"], "3");
    assert_eq!(ui["image"], "guestbook:1");
    assert_eq!(ui["env"], "prod");
    assert_eq!(
        data(&ns, "guestbook-settings").await["greeting"],
        "hello there"
    );
    // The library is an input: a push changing only it routes here.
    let inputs = &outcome.status.source_inputs;
    assert!(
        inputs.contains(&"apps/guestbook".to_string())
            && inputs
                .iter()
                .any(|i| i == "lib" || i == "lib/guestbook.libsonnet"),
        "{inputs:?}"
    );

    // A push changing only the library changes the live object.
    let second = repo
        .write(
            "lib/guestbook.libsonnet",
            &GUESTBOOK_LIB.replace("tier: 'frontend'", "tier: 'web'"),
        )
        .commit("the library labels differently");
    let outcome = reconcile_app(&ctx, &ns, "guestbook", &Request::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.revision.as_deref(), Some(second.as_str()));
    assert_eq!(outcome.status.sync.status, Sync::Synced);
    let live = ns.api::<ConfigMap>().get("guestbook-ui").await.unwrap();
    let labels = live.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("tier").map(String::as_str), Some("web"));
}

#[tokio::test]
async fn an_import_leaving_the_repository_and_a_syntax_error_are_conditions() {
    let ns = TestNamespace::new("jsonnet-bad").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    repo.write(
        "escape/main.jsonnet",
        "local passwd = importstr '../../etc/passwd';\n{ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'x' }, data: { p: passwd } }\n",
    )
    .write(
        "climb/main.jsonnet",
        "(import '../../../outside.libsonnet')\n",
    )
    .write("broken/main.jsonnet", "{\n  apiVersion: 'v1',\n  kind: ,\n}\n")
    .commit("bad jsonnet");
    for (app, path) in [
        ("escape", "escape"),
        ("climb", "climb"),
        ("broken", "broken"),
    ] {
        create_app(&ns, app, &repo.url(), path, automated(true, true)).await;
        let err = reconcile_app(&ctx, &ns, app, &Request::default())
            .await
            .expect_err(app);
        assert!(!err.is_transient(), "{app}: {err}");
    }
    for app in ["escape", "climb"] {
        let (reason, message) = stalled(&ns, app).await;
        assert_eq!(reason, "InvalidSource", "{app}: {message}");
        assert!(
            message.starts_with(&format!("{app}/main.jsonnet:1: import")),
            "{app}: {message}"
        );
        assert!(
            message.contains("climbs out of the repository")
                && message.contains("may only import files of the repository"),
            "{app}: {message}"
        );
        assert!(!message.contains("root:"), "{app}: {message}");
    }
    let (reason, message) = stalled(&ns, "broken").await;
    assert_eq!(reason, "InvalidJsonnet", "{message}");
    assert!(
        message.starts_with("broken/main.jsonnet:3: syntax error"),
        "{message}"
    );
    // Nothing was applied by any of them.
    let configmaps = ns
        .api::<ConfigMap>()
        .list(&Default::default())
        .await
        .unwrap();
    assert!(
        configmaps
            .items
            .iter()
            .all(|c| c.metadata.name.as_deref() == Some("kube-root-ca.crt")),
        "{:?}",
        configmaps
            .items
            .iter()
            .map(|c| &c.metadata.name)
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn an_empty_path_is_an_error_unless_allow_empty_and_prunes_nothing() {
    let ns = TestNamespace::new("jsonnet-empty").await;
    install_crd(&ns.client).await;
    let (ctx, _cache) = context().await;
    let repo = GitRepo::new();
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: keep\ndata: {a: '1'}\n";
    repo.write("app/cm.yaml", cm)
        .write("docs/README.md", "# docs\n")
        .write("docs/notes.txt", "notes\n")
        .write("docs/more.txt", "more\n")
        .commit("an app and a docs directory");
    create_app(&ns, "app", &repo.url(), "app", automated(true, true)).await;
    reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(data(&ns, "keep").await["a"], "1");

    // The path loses its only manifest: an error, and nothing is pruned.
    repo.remove("app/cm.yaml")
        .write("app/NOTES.md", "moved elsewhere\n")
        .commit("emptied");
    let err = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "NoManifests", "{err}");
    assert!(!err.is_transient());
    let (reason, message) = stalled(&ns, "app").await;
    assert_eq!(reason, "NoManifests");
    assert!(
        message.starts_with("no manifests found in app (skipped 1 .md file)"),
        "{message}"
    );
    assert_eq!(data(&ns, "keep").await["a"], "1", "nothing pruned");

    // A path of documents only names what it skipped.
    create_app(&ns, "docs", &repo.url(), "docs", automated(true, true)).await;
    reconcile_app(&ctx, &ns, "docs", &Request::default())
        .await
        .unwrap_err();
    let (_, message) = stalled(&ns, "docs").await;
    assert!(
        message.starts_with("no manifests found in docs (skipped 2 .txt files, 1 .md file)"),
        "{message}"
    );

    // With allowEmpty the empty path is intended: Synced, and the prune
    // that follows an empty render is allowed.
    let mut app = get_app(&ns, "app").await;
    app.spec.sync_policy = SyncPolicy {
        allow_empty: true,
        ..automated(true, true)
    };
    ns.api::<setpoint::api::Application>()
        .replace("app", &Default::default(), &app)
        .await
        .unwrap();
    let outcome = reconcile_app(&ctx, &ns, "app", &Request::default())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcome.status.sync.status, Sync::Synced);
    assert_eq!(outcome.pruned.len(), 1, "{:?}", outcome.pruned);
    assert!(
        ns.api::<ConfigMap>()
            .get_opt("keep")
            .await
            .unwrap()
            .is_none()
    );
}
