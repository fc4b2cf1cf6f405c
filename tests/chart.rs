//! The Helm chart, charts/setpoint: `helm lint --strict` passes, and for each
//! set of values below `helm template` renders objects that the local API
//! server accepts in a server-side dry run (`kubectl apply --server-side
//! --dry-run=server`, which validates and persists nothing), holding what the
//! values ask for; and Setpoint run under the chart's namespaced RBAC
//! corrects drift with its watches.
//!
//! helm is `$SETPOINT_HELM` (default: `helm` on PATH) and kubectl is
//! `$SETPOINT_KUBECTL` (default: `kubectl`); the Makefile exports both.

mod support;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde::Deserialize;
use serde_json::Value;
use support::TestNamespace;

/// The release name: the resources are `sp-setpoint` and `sp-setpoint-<role>`.
const RELEASE: &str = "sp";
const FULLNAME: &str = "sp-setpoint";
const ROLES: [&str; 4] = ["webhook", "worker", "watch", "sweep"];
const CONFIG_FILE: &str = "/etc/setpoint/setpoint.yaml";

fn chart() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("charts/setpoint")
}

fn program(variable: &str, default: &str) -> String {
    match std::env::var(variable) {
        Ok(path) if !path.is_empty() => path,
        _ => default.to_string(),
    }
}

/// Runs `program args` with `stdin` as its input and returns its stdout, or
/// panics with the command, its exit status, its stderr and its stdout.
fn run(program: &str, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let mut pipe = child.stdin.take().expect("a stdin pipe");
    let input = stdin.to_string();
    // Written from a thread of its own, so that a large input cannot block
    // while the output is not being read; dropping the pipe closes stdin.
    let writer = std::thread::spawn(move || {
        let _ = pipe.write_all(input.as_bytes());
    });
    let output = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("wait for {program}: {e}"));
    let _ = writer.join();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "`{program} {}` failed ({}):\n--- stderr ---\n{}\n--- stdout ---\n{stdout}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn helm(args: &[&str]) -> String {
    run(&program("SETPOINT_HELM", "helm"), args, "")
}

/// `helm template` of the chart into `namespace`, CRDs included, with
/// `values` as extra arguments (`--set ...`, `-f FILE`).
fn template(namespace: &str, values: &[&str]) -> String {
    let chart = chart().display().to_string();
    let mut args = vec![
        "template",
        RELEASE,
        chart.as_str(),
        "--namespace",
        namespace,
        "--include-crds",
    ];
    args.extend_from_slice(values);
    helm(&args)
}

/// The rendered objects, one per YAML document (empty documents left out).
fn objects(yaml: &str) -> Vec<Value> {
    let mut objects = Vec::new();
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let value = Value::deserialize(document)
            .unwrap_or_else(|e| panic!("the chart rendered invalid YAML: {e}\n{yaml}"));
        if !value.is_null() {
            objects.push(value);
        }
    }
    assert!(!objects.is_empty(), "the chart rendered nothing");
    objects
}

/// A server-side dry run of `yaml`: the API server validates every object
/// (schema, defaulting, admission) and stores none of them.
fn dry_run(yaml: &str, objects: &[Value]) {
    let kubeconfig = support::kubeconfig_path().display().to_string();
    let args = [
        "--kubeconfig",
        kubeconfig.as_str(),
        "apply",
        "--server-side",
        "--dry-run=server",
        "--force-conflicts",
        "--field-manager=setpoint-chart-test",
        "-f",
        "-",
    ];
    let out = run(&program("SETPOINT_KUBECTL", "kubectl"), &args, yaml);
    let applied = out
        .lines()
        .filter(|line| line.contains("(server dry run)"))
        .count();
    assert_eq!(
        applied,
        objects.len(),
        "kubectl applied {applied} of the {} objects ({}):\n{out}",
        objects.len(),
        summary(objects)
    );
}

/// Renders with `values`, dry-runs the result, returns the objects.
fn render_and_dry_run(namespace: &str, values: &[&str]) -> Vec<Value> {
    let yaml = template(namespace, values);
    let objects = objects(&yaml);
    dry_run(&yaml, &objects);
    assert_standard_labels(&objects);
    objects
}

fn kind_of(object: &Value) -> &str {
    object["kind"].as_str().unwrap_or("")
}

fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or("")
}

fn namespace_of(object: &Value) -> &str {
    object["metadata"]["namespace"].as_str().unwrap_or("")
}

fn summary(objects: &[Value]) -> String {
    objects
        .iter()
        .map(|o| format!("{} {}/{}", kind_of(o), namespace_of(o), name_of(o)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn all_of<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| kind_of(o) == kind).collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| kind_of(o) == kind && name_of(o) == name)
        .unwrap_or_else(|| panic!("no {kind} {name} among: {}", summary(objects)))
}

/// The name of a role's resources.
fn component(role: &str) -> String {
    format!("{FULLNAME}-{role}")
}

fn deployment<'a>(objects: &'a [Value], role: &str) -> &'a Value {
    find(objects, "Deployment", &component(role))
}

fn pod_spec(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]
}

/// The Setpoint container of a Deployment (its only one).
fn container(deployment: &Value) -> &Value {
    let containers = pod_spec(deployment)["containers"]
        .as_array()
        .unwrap_or_else(|| panic!("{} has no containers", name_of(deployment)));
    assert_eq!(
        containers.len(),
        1,
        "{}: {containers:?}",
        name_of(deployment)
    );
    &containers[0]
}

/// The pod volume mounted at `path` in the Deployment's container.
fn volume_at<'a>(deployment: &'a Value, path: &str) -> &'a Value {
    let what = name_of(deployment);
    let mount = container(deployment)["volumeMounts"]
        .as_array()
        .and_then(|mounts| mounts.iter().find(|m| m["mountPath"] == path))
        .unwrap_or_else(|| panic!("{what}: nothing is mounted at {path}"));
    pod_spec(deployment)["volumes"]
        .as_array()
        .and_then(|volumes| volumes.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("{what}: no volume {} for {path}", mount["name"]))
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn args(container: &Value) -> Vec<String> {
    strings(&container["args"])
}

/// The value of `--flag=VALUE` among the container's args.
fn flag(container: &Value, flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    args(container)
        .iter()
        .find_map(|arg| arg.strip_prefix(prefix.as_str()).map(String::from))
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .and_then(|vars| vars.iter().find(|var| var["name"] == name))
        .unwrap_or_else(|| {
            panic!(
                "container {} has no env {name}: {}",
                container["name"], container["env"]
            )
        })
}

fn has_env(container: &Value, name: &str) -> bool {
    container["env"]
        .as_array()
        .is_some_and(|vars| vars.iter().any(|var| var["name"] == name))
}

/// The Secret and key mounted at the file `path` in the Deployment's pods.
fn mounted_secret(deployment: &Value, path: &str) -> (String, String) {
    let (dir, file) = path.rsplit_once('/').expect("a file path");
    let mount = container(deployment)["volumeMounts"]
        .as_array()
        .and_then(|mounts| mounts.iter().find(|m| m["mountPath"] == dir))
        .unwrap_or_else(|| panic!("nothing is mounted at {dir} in {}", name_of(deployment)));
    let volume = pod_spec(deployment)["volumes"]
        .as_array()
        .and_then(|volumes| volumes.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("no volume {} in {}", mount["name"], name_of(deployment)));
    let secret = volume["secret"]["secretName"]
        .as_str()
        .unwrap_or_else(|| panic!("volume {volume} is not a Secret"));
    let key = volume["secret"]["items"]
        .as_array()
        .and_then(|items| items.iter().find(|item| item["path"] == file))
        .and_then(|item| item["key"].as_str())
        .unwrap_or_else(|| panic!("volume {volume} has no item {file}"));
    (secret.to_string(), key.to_string())
}

/// Every object (but the CRD from crds/) carries the standard labels.
fn assert_standard_labels(objects: &[Value]) {
    for object in objects {
        if kind_of(object) == "CustomResourceDefinition" {
            continue;
        }
        let labels = &object["metadata"]["labels"];
        for key in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ] {
            assert!(
                labels[key].is_string(),
                "{} {} lacks the label {key}: {labels}",
                kind_of(object),
                name_of(object)
            );
        }
        assert_eq!(labels["app.kubernetes.io/instance"], RELEASE);
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm");
    }
}

/// What every role's Deployment must have, whatever the values.
fn assert_roles(objects: &[Value]) {
    for role in ROLES {
        let deployment = deployment(objects, role);
        let what = name_of(deployment);
        assert_eq!(
            deployment["metadata"]["labels"]["app.kubernetes.io/component"], role,
            "{what}"
        );
        let selector = deployment["spec"]["selector"]["matchLabels"]
            .as_object()
            .unwrap_or_else(|| panic!("{what} has no selector"));
        let template = &deployment["spec"]["template"]["metadata"];
        for (key, value) in selector {
            assert_eq!(&template["labels"][key.as_str()], value, "{what}: {key}");
        }
        assert!(
            template["annotations"]["checksum/config"].is_string(),
            "{what}: no checksum/config annotation"
        );
        let pod = pod_spec(deployment);
        assert_eq!(pod["serviceAccountName"], FULLNAME, "{what}");

        let container = container(deployment);
        let args = args(container);
        assert_eq!(
            args.first().map(String::as_str),
            Some(role),
            "{what}: {args:?}"
        );
        assert_eq!(
            flag(container, "--config").as_deref(),
            Some(CONFIG_FILE),
            "{what}"
        );
        let config_mount = container["volumeMounts"]
            .as_array()
            .and_then(|mounts| mounts.iter().find(|m| m["mountPath"] == CONFIG_FILE))
            .unwrap_or_else(|| panic!("{what}: {CONFIG_FILE} is not mounted"));
        let config_volume = pod["volumes"]
            .as_array()
            .and_then(|volumes| volumes.iter().find(|v| v["name"] == config_mount["name"]))
            .unwrap_or_else(|| panic!("{what}: no config volume"));
        assert_eq!(
            config_volume["configMap"]["name"],
            format!("{FULLNAME}-config").as_str(),
            "{what}"
        );

        let ports = container["ports"].as_array().cloned().unwrap_or_default();
        assert!(
            ports
                .iter()
                .any(|p| p["name"] == "metrics" && p["containerPort"] == 9090),
            "{what}: no metrics port 9090: {ports:?}"
        );
        assert_eq!(
            env(container, "SETPOINT_METRICS_LISTEN")["value"],
            "0.0.0.0:9090"
        );
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            assert_eq!(container[probe]["httpGet"]["path"], path, "{what}: {probe}");
            assert_eq!(
                container[probe]["httpGet"]["port"], "metrics",
                "{what}: {probe}"
            );
        }

        let security = &container["securityContext"];
        assert_eq!(security["runAsNonRoot"].as_bool(), Some(true), "{what}");
        // The image's user (Containerfile `USER 65532:65532`).
        assert_eq!(security["runAsUser"].as_i64(), Some(65532), "{what}");
        assert_eq!(pod["securityContext"]["runAsUser"].as_i64(), Some(65532));
        assert_eq!(
            security["readOnlyRootFilesystem"].as_bool(),
            Some(true),
            "{what}"
        );
        assert_eq!(
            security["allowPrivilegeEscalation"].as_bool(),
            Some(false),
            "{what}"
        );
        assert!(
            contains(&strings(&security["capabilities"]["drop"]), "ALL"),
            "{what}: capabilities not dropped: {security}"
        );
        assert_eq!(
            security["seccompProfile"]["type"], "RuntimeDefault",
            "{what}"
        );
        // The root filesystem is read-only: the image writes only to these.
        for path in ["/tmp", "/var/cache/setpoint"] {
            let volume = volume_at(deployment, path);
            assert!(volume["emptyDir"].is_object(), "{what}: {path}: {volume}");
        }
        assert_eq!(
            env(container, "SETPOINT_CACHE_DIR")["value"],
            "/var/cache/setpoint",
            "{what}"
        );
        for resource in ["cpu", "memory"] {
            assert!(
                !container["resources"]["requests"][resource].is_null(),
                "{what}: no {resource} request"
            );
        }

        assert!(
            env(container, "SETPOINT_AMQP_URL")["valueFrom"]["secretKeyRef"].is_object(),
            "{what}: SETPOINT_AMQP_URL is not from a Secret"
        );
        assert_eq!(env(container, "SETPOINT_AMQP_PREFIX")["value"], "setpoint");
        assert_eq!(env(container, "SETPOINT_AMQP_SHARDS")["value"], "16");
        assert_eq!(
            env(container, "POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.namespace",
            "{what}"
        );
    }
    for role in ["watch", "sweep"] {
        let deployment = deployment(objects, role);
        assert_eq!(deployment["spec"]["replicas"].as_i64(), Some(1), "{role}");
    }
    let sweep = container(deployment(objects, "sweep"));
    assert_eq!(flag(sweep, "--sweep-interval").as_deref(), Some("10m"));

    let worker = deployment(objects, "worker");
    assert_eq!(
        pod_spec(worker)["terminationGracePeriodSeconds"].as_i64(),
        Some(60)
    );
    assert_eq!(
        volume_at(worker, "/var/cache/setpoint")["emptyDir"]["sizeLimit"],
        "2Gi",
        "the worker's Git mirrors get worker.cache"
    );
    let worker = container(worker);
    assert_eq!(flag(worker, "--concurrency").as_deref(), Some("16"));

    let webhook = container(deployment(objects, "webhook"));
    assert_eq!(flag(webhook, "--listen").as_deref(), Some("0.0.0.0:8080"));
    assert!(
        webhook["ports"].as_array().is_some_and(|ports| ports
            .iter()
            .any(|p| p["name"] == "http" && p["containerPort"] == 8080)),
        "the webhook has no http port 8080"
    );
    let service = find(objects, "Service", &component("webhook"));
    assert_eq!(
        service["spec"]["selector"],
        deployment(objects, "webhook")["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");

    // The chart never creates secret data.
    assert!(all_of(objects, "Secret").is_empty(), "{}", summary(objects));
}

/// setpoint.yaml of the ConfigMap, parsed.
fn rendered_config(objects: &[Value]) -> Value {
    let configmap = find(objects, "ConfigMap", &format!("{FULLNAME}-config"));
    let text = configmap["data"]["setpoint.yaml"]
        .as_str()
        .unwrap_or_else(|| panic!("no setpoint.yaml in the ConfigMap: {configmap}"));
    serde_yaml::from_str(text).unwrap_or_else(|e| panic!("setpoint.yaml is not YAML: {e}\n{text}"))
}

fn checksum(objects: &[Value], role: &str) -> String {
    deployment(objects, role)["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn rule_grants_everything(rule: &Value) -> bool {
    strings(&rule["apiGroups"]) == ["*"]
        && strings(&rule["resources"]) == ["*"]
        && strings(&rule["verbs"]) == ["*"]
}

fn contains(list: &[String], item: &str) -> bool {
    list.iter().any(|entry| entry == item)
}

#[test]
fn helm_lint_strict_passes() {
    let chart = chart().display().to_string();
    let out = helm(&["lint", "--strict", chart.as_str()]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

#[tokio::test]
async fn defaults_render_every_role_and_the_api_server_accepts_them() {
    let ns = TestNamespace::new("chart").await;
    let objects = render_and_dry_run(&ns.name, &[]);
    assert_roles(&objects);

    // The image `make image` builds and tags: setpoint:<the crate's version>.
    for role in ROLES {
        assert_eq!(
            container(deployment(&objects, role))["image"],
            format!("setpoint:{}", env!("CARGO_PKG_VERSION")).as_str(),
            "{role}"
        );
    }

    let worker = deployment(&objects, "worker");
    assert!(
        worker["spec"]["replicas"].is_null(),
        "the HPA owns the worker's replicas: {}",
        worker["spec"]
    );
    let hpa = find(&objects, "HorizontalPodAutoscaler", &component("worker"));
    assert_eq!(hpa["apiVersion"], "autoscaling/v2");
    assert_eq!(hpa["spec"]["scaleTargetRef"]["kind"], "Deployment");
    assert_eq!(
        hpa["spec"]["scaleTargetRef"]["name"],
        component("worker").as_str()
    );
    assert_eq!(hpa["spec"]["metrics"][0]["resource"]["name"], "cpu");

    for role in ["webhook", "worker"] {
        let pdb = find(&objects, "PodDisruptionBudget", &component(role));
        assert_eq!(pdb["apiVersion"], "policy/v1");
        assert_eq!(pdb["spec"]["maxUnavailable"].as_i64(), Some(1), "{role}");
        assert!(pdb["spec"]["minAvailable"].is_null(), "{role}");
        assert_eq!(
            pdb["spec"]["selector"]["matchLabels"],
            deployment(&objects, role)["spec"]["selector"]["matchLabels"],
            "{role}"
        );
    }

    let cluster_role = find(&objects, "ClusterRole", FULLNAME);
    let rules = cluster_role["rules"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        !rules.iter().any(rule_grants_everything),
        "Setpoint's own role does not write everything: {rules:?}"
    );
    assert!(
        rules
            .iter()
            .any(|rule| strings(&rule["resources"]) == ["serviceaccounts"]
                && strings(&rule["verbs"]) == ["impersonate"]),
        "tenant Applications are impersonated: {rules:?}"
    );
    let admin = find(
        &objects,
        "ClusterRole",
        &format!("{FULLNAME}-admin-applications"),
    );
    assert!(
        admin["rules"]
            .as_array()
            .is_some_and(|rules| rules.iter().any(rule_grants_everything)),
        "admin namespaces' Applications apply anything: {admin}"
    );
    let admin_binding = find(
        &objects,
        "ClusterRoleBinding",
        &format!("{FULLNAME}-admin-applications"),
    );
    assert_eq!(admin_binding["subjects"][0]["name"], FULLNAME);
    let binding = find(&objects, "ClusterRoleBinding", FULLNAME);
    assert_eq!(binding["roleRef"]["name"], FULLNAME);
    assert_eq!(binding["subjects"][0]["kind"], "ServiceAccount");
    assert_eq!(binding["subjects"][0]["name"], FULLNAME);
    assert_eq!(binding["subjects"][0]["namespace"], ns.name.as_str());
    find(&objects, "ServiceAccount", FULLNAME);
    let lease = find(&objects, "Role", &format!("{FULLNAME}-lease"));
    assert_eq!(namespace_of(lease), ns.name);
    assert_eq!(strings(&lease["rules"][0]["resources"]), vec!["leases"]);

    assert!(
        all_of(&objects, "Ingress").is_empty(),
        "no Ingress by default"
    );
    let webhook = container(deployment(&objects, "webhook"));
    assert_eq!(flag(webhook, "--github-secret-file"), None);
    assert_eq!(flag(webhook, "--gitlab-token-file"), None);
    let amqp = &env(webhook, "SETPOINT_AMQP_URL")["valueFrom"]["secretKeyRef"];
    assert_eq!(amqp["name"], format!("{FULLNAME}-amqp").as_str());
    assert_eq!(amqp["key"], "url");

    let values_text = std::fs::read_to_string(chart().join("values.yaml")).unwrap();
    let values: Value = serde_yaml::from_str(&values_text).unwrap();
    assert_eq!(rendered_config(&objects), values["config"]);
}

#[tokio::test]
async fn namespaced_rbac_leaves_no_cluster_wide_write_access() {
    let ns = TestNamespace::new("chart-rbac").await;
    let other = TestNamespace::new("chart-rbac-b").await;
    let listed = format!("rbac.namespaces=[\"{}\",\"{}\"]", ns.name, other.name);
    let objects = render_and_dry_run(&ns.name, &["--set-json", listed.as_str()]);
    assert_roles(&objects);

    let write_verbs = [
        "*",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    for role in all_of(&objects, "ClusterRole") {
        for rule in role["rules"].as_array().cloned().unwrap_or_default() {
            let verbs = strings(&rule["verbs"]);
            assert!(
                !verbs
                    .iter()
                    .any(|verb| write_verbs.contains(&verb.as_str())),
                "ClusterRole {} may write cluster-wide although rbac.namespaces is set: {rule}",
                name_of(role)
            );
            assert!(
                !contains(&strings(&rule["resources"]), "*"),
                "ClusterRole {} covers every resource: {rule}",
                name_of(role)
            );
        }
    }
    let discovery = find(&objects, "ClusterRole", &format!("{FULLNAME}-discovery"));
    let discovery_rules = discovery["rules"].as_array().cloned().unwrap_or_default();
    assert!(
        discovery_rules
            .iter()
            .any(|rule| contains(&strings(&rule["nonResourceURLs"]), "/apis")),
        "discovery needs /apis: {discovery_rules:?}"
    );
    assert!(
        discovery_rules
            .iter()
            .any(|rule| contains(&strings(&rule["resources"]), "customresourcedefinitions")),
        "discovery needs the CRDs: {discovery_rules:?}"
    );

    for namespace in [ns.name.as_str(), other.name.as_str()] {
        let role = objects
            .iter()
            .find(|o| {
                kind_of(o) == "Role" && namespace_of(o) == namespace && name_of(o) == FULLNAME
            })
            .unwrap_or_else(|| panic!("no Role in {namespace}: {}", summary(&objects)));
        assert!(
            role["rules"]
                .as_array()
                .is_some_and(|rules| rules.iter().any(rule_grants_everything)),
            "the Role in {namespace} grants everything there: {role}"
        );
        let binding = objects
            .iter()
            .find(|o| {
                kind_of(o) == "RoleBinding"
                    && namespace_of(o) == namespace
                    && name_of(o) == FULLNAME
            })
            .unwrap_or_else(|| panic!("no RoleBinding in {namespace}: {}", summary(&objects)));
        assert_eq!(binding["roleRef"]["kind"], "Role");
        assert_eq!(binding["roleRef"]["name"], FULLNAME);
        assert_eq!(binding["subjects"][0]["name"], FULLNAME);
        assert_eq!(binding["subjects"][0]["namespace"], ns.name.as_str());
    }
    let lease = find(&objects, "Role", &format!("{FULLNAME}-lease"));
    assert_eq!(namespace_of(lease), ns.name);

    // Setpoint handles only the Applications it may apply.
    let config = rendered_config(&objects);
    assert_eq!(
        strings(&config["watchNamespaces"]),
        vec![ns.name.clone(), other.name.clone()]
    );
    assert_eq!(config["log"]["format"], "json", "values.config is kept");
}

#[tokio::test]
async fn the_ingress_routes_the_webhook_paths_to_the_webhook_service() {
    let ns = TestNamespace::new("chart-ingress").await;
    let objects = render_and_dry_run(
        &ns.name,
        &[
            "--set",
            "webhook.ingress.enabled=true",
            "--set",
            "webhook.ingress.className=nginx",
            "--set",
            "webhook.ingress.hosts[0].host=hooks.example.test",
            "--set-json",
            r#"webhook.ingress.tls=[{"secretName":"hooks-tls","hosts":["hooks.example.test"]}]"#,
        ],
    );
    assert_roles(&objects);
    let ingress = find(&objects, "Ingress", &component("webhook"));
    assert_eq!(ingress["apiVersion"], "networking.k8s.io/v1");
    assert_eq!(ingress["spec"]["ingressClassName"], "nginx");
    assert_eq!(ingress["spec"]["tls"][0]["secretName"], "hooks-tls");
    let rule = &ingress["spec"]["rules"][0];
    assert_eq!(rule["host"], "hooks.example.test");
    let path = &rule["http"]["paths"][0];
    assert_eq!(path["path"], "/api/webhooks");
    assert_eq!(
        path["backend"]["service"]["name"],
        component("webhook").as_str()
    );
    assert_eq!(path["backend"]["service"]["port"]["name"], "http");
    let service = find(&objects, "Service", &component("webhook"));
    assert_eq!(service["spec"]["ports"][0]["name"], "http");
}

/// `ui.enabled`: the dashboard's Deployment (`setpoint ui` on its port),
/// Service and Ingress, and the RBAC to review its viewers' tokens.
#[tokio::test]
async fn the_dashboard_gets_a_deployment_a_service_an_ingress_and_review_rights() {
    let ns = TestNamespace::new("chart-ui").await;
    let objects = render_and_dry_run(
        &ns.name,
        &[
            "--set",
            "ui.enabled=true",
            "--set",
            "ui.ingress.enabled=true",
            "--set",
            "ui.ingress.hosts[0].host=setpoint.example.test",
        ],
    );
    let ui = container(deployment(&objects, "ui"));
    assert_eq!(args(ui)[0], "ui");
    assert_eq!(flag(ui, "--ui-listen").as_deref(), Some("0.0.0.0:8081"));
    assert_eq!(flag(ui, "--ui-auth").as_deref(), Some("kubernetes"));
    let service = find(&objects, "Service", &component("ui"));
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "http");
    let ingress = find(&objects, "Ingress", &component("ui"));
    let path = &ingress["spec"]["rules"][0]["http"]["paths"][0];
    assert_eq!(path["path"], "/");
    assert_eq!(path["backend"]["service"]["name"], component("ui").as_str());
    let rules: Vec<&Value> = all_of(&objects, "ClusterRole")
        .into_iter()
        .flat_map(|role| role["rules"].as_array().unwrap())
        .collect();
    for resource in ["tokenreviews", "subjectaccessreviews"] {
        assert!(
            rules.iter().any(
                |rule| strings(&rule["resources"]).iter().any(|r| r == resource)
                    && strings(&rule["verbs"]).iter().any(|v| v == "create")
            ),
            "Setpoint may create {resource}"
        );
    }
    let defaults = render_and_dry_run(&ns.name, &[]);
    assert!(
        !defaults.iter().any(|o| name_of(o) == component("ui")),
        "off by default"
    );
}

#[tokio::test]
async fn without_autoscaling_the_worker_has_its_replicas_and_no_hpa() {
    let ns = TestNamespace::new("chart-replicas").await;
    let config = r#"config={"log":{"format":"text","level":"debug"},"worker":{"maxAttempts":3}}"#;
    let objects = render_and_dry_run(
        &ns.name,
        &[
            "--set",
            "worker.autoscaling.enabled=false",
            "--set",
            "worker.replicas=3",
            "--set-json",
            config,
        ],
    );
    assert_roles(&objects);
    assert!(
        all_of(&objects, "HorizontalPodAutoscaler").is_empty(),
        "{}",
        summary(&objects)
    );
    assert_eq!(
        deployment(&objects, "worker")["spec"]["replicas"].as_i64(),
        Some(3)
    );
    let expected: Value = serde_json::from_str(config.trim_start_matches("config=")).unwrap();
    assert_eq!(rendered_config(&objects), expected);
}

#[tokio::test]
async fn named_secrets_reach_the_containers_as_files_and_env() {
    let ns = TestNamespace::new("chart-secrets").await;
    let values = "\
amqp:
  existingSecret: rabbitmq
  key: uri
github:
  webhookSecret:
    existingSecret: github-webhook
    key: hmac
  apiToken:
    existingSecret: github-api
    key: pat
gitlab:
  webhookToken:
    existingSecret: gitlab-webhook
    key: token
git:
  credentials:
    existingSecret: git-credentials
    passwordKey: password
    usernameKey: username
config:
  log:
    format: text
  sweep:
    interval: 5m
";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let file = file.display().to_string();
    let objects = render_and_dry_run(&ns.name, &["-f", file.as_str()]);
    assert_roles(&objects);

    let webhook_deployment = deployment(&objects, "webhook");
    let webhook = container(webhook_deployment);
    let github = flag(webhook, "--github-secret-file").expect("--github-secret-file");
    assert_eq!(github, "/etc/setpoint/secrets/github/hmac");
    assert_eq!(
        mounted_secret(webhook_deployment, &github),
        ("github-webhook".to_string(), "hmac".to_string())
    );
    let gitlab = flag(webhook, "--gitlab-token-file").expect("--gitlab-token-file");
    assert_eq!(
        mounted_secret(webhook_deployment, &gitlab),
        ("gitlab-webhook".to_string(), "token".to_string())
    );

    let worker_deployment = deployment(&objects, "worker");
    let worker = container(worker_deployment);
    for (deployment, container) in [(webhook_deployment, webhook), (worker_deployment, worker)] {
        let token = env(container, "SETPOINT_GITHUB_TOKEN_FILE")["value"]
            .as_str()
            .expect("a path")
            .to_string();
        assert_eq!(
            mounted_secret(deployment, &token),
            ("github-api".to_string(), "pat".to_string())
        );
    }
    let password = env(worker, "SETPOINT_GIT_PASSWORD_FILE")["value"]
        .as_str()
        .expect("a path")
        .to_string();
    assert_eq!(
        mounted_secret(worker_deployment, &password),
        ("git-credentials".to_string(), "password".to_string())
    );
    let username = &env(worker, "SETPOINT_GIT_USERNAME")["valueFrom"]["secretKeyRef"];
    assert_eq!(username["name"], "git-credentials");
    assert_eq!(username["key"], "username");
    // Only the workers fetch from Git.
    assert!(!has_env(webhook, "SETPOINT_GIT_PASSWORD_FILE"));

    for role in ROLES {
        let amqp = &env(container(deployment(&objects, role)), "SETPOINT_AMQP_URL")["valueFrom"]["secretKeyRef"];
        assert_eq!(amqp["name"], "rabbitmq", "{role}");
        assert_eq!(amqp["key"], "uri", "{role}");
    }

    let given: Value = serde_yaml::from_str(values).unwrap();
    assert_eq!(rendered_config(&objects), given["config"]);
    // A config change rolls the pods.
    let defaults = self::objects(&template(&ns.name, &[]));
    for role in ROLES {
        assert_ne!(
            checksum(&objects, role),
            checksum(&defaults, role),
            "{role}"
        );
    }
}

/// Cluster-scoped objects a test created, deleted when it ends (its
/// namespace's deletion does not take them).
struct ClusterScoped(Vec<(String, String)>);

impl Drop for ClusterScoped {
    fn drop(&mut self) {
        let kubeconfig = support::kubeconfig_path();
        for (kind, name) in &self.0 {
            let _ = Command::new(program("SETPOINT_KUBECTL", "kubectl"))
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["delete", kind, name, "--ignore-not-found", "--wait=false"])
                .output();
        }
    }
}

/// A kubeconfig for the local API server that authenticates with `token`.
fn token_kubeconfig(token: &str, namespace: &str) -> String {
    let admin = kube::config::Kubeconfig::read_from(support::kubeconfig_path())
        .expect("the admin kubeconfig");
    let cluster = admin.clusters[0].cluster.clone().expect("a cluster entry");
    let mut entry = serde_json::json!({ "server": cluster.server });
    if let Some(path) = &cluster.certificate_authority {
        entry["certificate-authority"] = path.clone().into();
    }
    if let Some(data) = &cluster.certificate_authority_data {
        entry["certificate-authority-data"] = data.clone().into();
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "local", "cluster": entry }],
        "users": [{ "name": "setpoint", "user": { "token": token } }],
        "contexts": [{ "name": "setpoint", "context": { "cluster": "local", "user": "setpoint", "namespace": namespace } }],
        "current-context": "setpoint",
    })
    .to_string()
}

/// Setpoint under the chart's namespaced RBAC (`rbac.namespaces`: a Role in
/// the namespace, no ClusterRole that reads Deployments), with its
/// ServiceAccount's token and `--watch-namespaces`: its live-object watches
/// are per namespace, so a scale is set back by a watch event, the sweep an
/// hour away. Cluster-wide, the watch would get 403 and only the sweep
/// would correct it.
#[tokio::test]
async fn under_namespaced_rbac_a_scale_is_corrected_by_a_watch_in_the_namespace() {
    use std::time::Duration;
    use support::app::{
        automated, create_app, deployment_yaml, install_crd, settled_at, time_scale_correction,
    };
    use support::process::{Setpoint, free_port};
    use support::{GitRepo, wait_for};

    let ns = TestNamespace::new("rbac-watch").await;
    install_crd(&ns.client).await;
    // A release of its own: the ClusterRole and its binding are this test's.
    let chart = chart().display().to_string();
    let listed = format!("rbac.namespaces=[\"{}\"]", ns.name);
    let args = [
        "template",
        ns.name.as_str(),
        chart.as_str(),
        "--namespace",
        ns.name.as_str(),
        "--set-json",
        listed.as_str(),
    ];
    let rbac: Vec<Value> = objects(&helm(&args))
        .into_iter()
        .filter(|o| {
            matches!(
                kind_of(o),
                "ServiceAccount" | "Role" | "RoleBinding" | "ClusterRole" | "ClusterRoleBinding"
            )
        })
        .collect();
    let _cleanup = ClusterScoped(
        rbac.iter()
            .filter(|o| kind_of(o).starts_with("Cluster"))
            .map(|o| (kind_of(o).to_string(), name_of(o).to_string()))
            .collect(),
    );
    assert!(
        all_of(&rbac, "ClusterRole")
            .iter()
            .flat_map(|role| role["rules"].as_array().cloned().unwrap_or_default())
            .all(|rule| !contains(&strings(&rule["resources"]), "deployments")),
        "no ClusterRole reads Deployments: {}",
        summary(&rbac)
    );
    let yaml: String = rbac
        .iter()
        .map(|o| format!("---\n{}", serde_yaml::to_string(o).unwrap()))
        .collect();
    let kubectl = program("SETPOINT_KUBECTL", "kubectl");
    let admin = support::kubeconfig_path().display().to_string();
    run(
        &kubectl,
        &["--kubeconfig", &admin, "apply", "--server-side", "-f", "-"],
        &yaml,
    );
    let account = name_of(all_of(&rbac, "ServiceAccount")[0]).to_string();
    let token = run(
        &kubectl,
        &[
            "--kubeconfig",
            &admin,
            "create",
            "token",
            &account,
            "--namespace",
            &ns.name,
            "--duration",
            "1h",
        ],
        "",
    );
    let cache = tempfile::tempdir().unwrap();
    let kubeconfig = cache.path().join("setpoint-kubeconfig");
    std::fs::write(&kubeconfig, token_kubeconfig(token.trim(), &ns.name)).unwrap();

    let repo = GitRepo::new();
    let commit = repo
        .write("web/deploy.yaml", &deployment_yaml("web", 3))
        .commit("web");
    create_app(&ns, "web", &repo.url(), "web", automated(true, true)).await;
    let listen = format!("127.0.0.1:{}", free_port());
    let args = ["run", "--listen", &listen, "--sweep-interval", "1h"];
    let env = [("KUBECONFIG", kubeconfig.to_str().unwrap())];
    let setpoint = Setpoint::scoped(&ns.name, &args, &env, cache.path());
    let deadline = Duration::from_secs(90);
    wait_for("the first sync", deadline, || {
        settled_at(&ns, "web", &commit)
    })
    .await;

    let took = time_scale_correction(&ns, "web", 1, 3, deadline).await;
    eprintln!("scale set back in {took:?}");
    assert!(
        took < Duration::from_secs(10),
        "the scale took {took:?} to be set back: not by a watch event\n{}",
        setpoint.logs()
    );
    let logs = setpoint.logs();
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "something was refused under the namespaced RBAC:\n{logs}"
    );
}

/// `clusters`: one Secret per cluster in the release namespace, labelled as
/// a cluster's, with the allowed namespaces; Setpoint may read Secrets there.
#[tokio::test]
async fn clusters_render_as_cluster_secrets_setpoint_may_read() {
    let ns = TestNamespace::new("chart-clusters").await;
    let objects = render_and_dry_run(
        &ns.name,
        &[
            "--set-json",
            r#"clusters=[{"name":"staging","server":"https://staging.example.test:6443","config":{"bearerToken":"t"},"allowedNamespaces":["team-a","team-b"]}]"#,
        ],
    );
    let secret = find(&objects, "Secret", &format!("{FULLNAME}-cluster-staging"));
    assert_eq!(namespace_of(secret), ns.name);
    assert_eq!(
        secret["metadata"]["labels"]["setpoint.dev/secret-type"],
        "cluster"
    );
    assert_eq!(
        secret["metadata"]["annotations"]["setpoint.dev/allowed-namespaces"],
        "team-a,team-b"
    );
    assert_eq!(
        secret["stringData"]["server"],
        "https://staging.example.test:6443"
    );
    assert_eq!(secret["stringData"]["config"], r#"{"bearerToken":"t"}"#);
    let lease = find(&objects, "Role", &format!("{FULLNAME}-lease"));
    let reads_secrets = lease["rules"].as_array().unwrap().iter().any(|rule| {
        strings(&rule["resources"]) == vec!["secrets"]
            && strings(&rule["verbs"]) == vec!["get", "list", "watch"]
    });
    assert!(reads_secrets, "{lease:?}");
}
