//! The rules Setpoint shares with Argo CD (Suspended, HPA, APIService, Pods
//! by restart policy, Ingress, CronJob) and the CEL rules, on recorded
//! objects from `testdata/`.

use serde_json::json;

use super::*;
use crate::api::HealthCheck;

fn recorded(text: &str) -> Value {
    serde_json::from_str(text).expect("testdata is JSON")
}

fn of(group: &str, kind: &str, live: &Value) -> (Health, Option<String>) {
    let assessment = assess(group, kind, live);
    (assessment.status, assessment.message)
}

fn said(health: Health, message: &str) -> (Health, Option<String>) {
    (health, Some(message.to_string()))
}

#[test]
fn a_paused_deployment_is_suspended_even_mid_rollout() {
    let live = recorded(include_str!("testdata/deployment-paused.json"));
    assert_eq!(
        of("apps", "Deployment", &live),
        said(Health::Suspended, "Deployment is paused")
    );
}

#[test]
fn cron_job_rules() {
    let suspended = recorded(include_str!("testdata/cronjob-suspended.json"));
    assert_eq!(
        of("batch", "CronJob", &suspended),
        said(Health::Suspended, "CronJob is suspended")
    );
    let failed = recorded(include_str!("testdata/cronjob-last-failed.json"));
    assert_eq!(of("batch", "CronJob", &failed).0, Health::Degraded);
    let mut running = failed.clone();
    running["status"]["active"] = json!([{"kind": "Job", "name": "report-29100180"}]);
    assert_eq!(
        of("batch", "CronJob", &running),
        said(Health::Healthy, "a job is running")
    );
    let mut succeeded = failed.clone();
    succeeded["status"]["lastSuccessfulTime"] = json!("2026-05-02T03:00:37Z");
    assert_eq!(of("batch", "CronJob", &succeeded), (Health::Healthy, None));
    let mut fresh = failed;
    fresh["status"] = json!({});
    assert_eq!(
        of("batch", "CronJob", &fresh),
        said(Health::Healthy, "not scheduled yet")
    );
}

#[test]
fn hpa_rules_follow_argo_cds_table() {
    let no_metrics = recorded(include_str!("testdata/hpa-no-metrics.json"));
    let (health, message) = of("autoscaling", "HorizontalPodAutoscaler", &no_metrics);
    assert_eq!(health, Health::Degraded);
    assert!(
        message
            .unwrap()
            .starts_with("the HPA was unable to compute")
    );

    let healthy = recorded(include_str!("testdata/hpa-healthy.json"));
    assert_eq!(
        of("autoscaling", "HorizontalPodAutoscaler", &healthy),
        said(
            Health::Healthy,
            "the desired count is within the acceptable range"
        )
    );

    let mut cannot_scale = healthy.clone();
    cannot_scale["status"]["conditions"] = json!([
        {"type": "AbleToScale", "status": "False", "reason": "FailedGetScale",
         "message": "deployments/scale.apps \"web\" not found"}
    ]);
    assert_eq!(
        of("autoscaling", "HorizontalPodAutoscaler", &cannot_scale),
        said(Health::Degraded, "deployments/scale.apps \"web\" not found")
    );

    // Scaled to zero by hand: Argo CD reads neither a failure nor a range.
    let mut disabled = healthy.clone();
    disabled["status"]["conditions"] = json!([
        {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
        {"type": "ScalingActive", "status": "False", "reason": "ScalingDisabled",
         "message": "scaling is disabled since the replica count of the target is zero"}
    ]);
    assert_eq!(
        of("autoscaling", "HorizontalPodAutoscaler", &disabled),
        said(Health::Progressing, "waiting to autoscale")
    );

    let mut fresh = healthy.clone();
    fresh["status"] = json!({"currentReplicas": 0, "desiredReplicas": 0});
    assert_eq!(
        of("autoscaling", "HorizontalPodAutoscaler", &fresh).0,
        Health::Progressing
    );

    // autoscaling/v1 carries its conditions in an annotation.
    let v1 = json!({
        "apiVersion": "autoscaling/v1", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "web", "annotations": {
            "autoscaling.alpha.kubernetes.io/conditions":
                "[{\"type\":\"AbleToScale\",\"status\":\"True\",\"reason\":\"SucceededRescale\",\"message\":\"the HPA controller was able to update the target scale to 4\"}]"
        }},
        "status": {"currentReplicas": 3, "desiredReplicas": 4}
    });
    assert_eq!(
        of("autoscaling", "HorizontalPodAutoscaler", &v1),
        said(
            Health::Healthy,
            "the HPA controller was able to update the target scale to 4"
        )
    );
}

#[test]
fn api_service_rules() {
    let unavailable = recorded(include_str!("testdata/apiservice-unavailable.json"));
    let (health, message) = of("apiregistration.k8s.io", "APIService", &unavailable);
    assert_eq!(health, Health::Progressing);
    assert!(message.unwrap().contains("have no addresses"));
    let mut available = unavailable;
    available["status"]["conditions"] =
        json!([{"type": "Available", "status": "True", "reason": "Passed"}]);
    assert_eq!(
        of("apiregistration.k8s.io", "APIService", &available),
        (Health::Healthy, None)
    );
}

#[test]
fn pods_by_restart_policy() {
    let failed = recorded(include_str!("testdata/pod-never-failed.json"));
    assert_eq!(
        of("", "Pod", &failed),
        said(
            Health::Degraded,
            "container \"migrate\" failed with exit code 3"
        )
    );
    // The same pod restarted on failure: it may still succeed.
    let mut on_failure = failed.clone();
    on_failure["spec"]["restartPolicy"] = json!("OnFailure");
    assert_eq!(
        of("", "Pod", &on_failure),
        said(
            Health::Progressing,
            "pod running (restartPolicy OnFailure): healthy once it completes"
        )
    );
    // A Never pod running, even Ready, is not done until it completes.
    let mut running = failed.clone();
    running["status"]["containerStatuses"][0]["state"] =
        json!({"running": {"startedAt": "2026-05-01T10:00:00Z"}});
    running["status"]["conditions"][0]["status"] = json!("True");
    assert_eq!(of("", "Pod", &running).0, Health::Progressing);
    let mut done = running.clone();
    done["status"]["phase"] = json!("Succeeded");
    assert_eq!(of("", "Pod", &done), said(Health::Healthy, "completed"));
    // A hook pod whose image cannot be pulled yet is not failed (Argo CD).
    let mut pulling = failed.clone();
    pulling["status"]["phase"] = json!("Pending");
    pulling["status"]["containerStatuses"][0]["state"] =
        json!({"waiting": {"reason": "ImagePullBackOff"}});
    assert_eq!(of("", "Pod", &pulling).0, Health::Progressing);
    // Failed as a whole: the failing container says why.
    let mut phase_failed = failed;
    phase_failed["status"]["phase"] = json!("Failed");
    assert_eq!(
        of("", "Pod", &phase_failed),
        said(
            Health::Degraded,
            "container \"migrate\" failed with exit code 3"
        )
    );
}

#[test]
fn ingress_waits_for_an_address() {
    let pending = recorded(include_str!("testdata/ingress-pending.json"));
    assert_eq!(
        of("networking.k8s.io", "Ingress", &pending).0,
        Health::Progressing
    );
    let mut assigned = pending;
    assigned["status"]["loadBalancer"]["ingress"] = json!([{"ip": "203.0.113.7"}]);
    assert_eq!(
        of("networking.k8s.io", "Ingress", &assigned),
        (Health::Healthy, None)
    );
}

fn widget_check() -> HealthCheck {
    HealthCheck {
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        current: "has(self.status) && self.status.phase == 'Ready'".into(),
        in_progress: Some("has(status.phase) && status.phase == 'Building'".into()),
        failed: Some("has(self.status) && self.status.phase == 'Failed'".into()),
    }
}

fn widget(status: Value) -> Value {
    json!({"apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": "w", "generation": 1}, "spec": {"size": 2}, "status": status})
}

#[test]
fn cel_rules_replace_the_built_in_rule() {
    let rules = Rules::compile(&[widget_check()]).unwrap();
    let with = |status: Value| {
        let a = assess_with(&rules, "example.com", "Widget", &widget(status));
        (a.status, a.message)
    };
    assert_eq!(with(json!({"phase": "Ready"})), (Health::Healthy, None));
    assert_eq!(
        with(json!({"phase": "Failed", "message": "disk full"})),
        said(Health::Degraded, "disk full")
    );
    assert_eq!(
        with(json!({"phase": "Building"})),
        said(Health::Progressing, "by its health check")
    );
    assert_eq!(
        with(json!({"phase": "Pending"})),
        said(Health::Progressing, "waiting for the health check to pass")
    );
    // The built-in rule would call a Ready=True condition Healthy.
    let ready = json!({"phase": "Failed", "conditions": [
        {"type": "Ready", "status": "True", "message": "all good"}]});
    assert_eq!(with(ready), said(Health::Degraded, "all good"));
    // Another kind keeps the built-in rules.
    let other = assess_with(&rules, "example.com", "Gadget", &widget(json!({})));
    assert_eq!(other.status, Health::Healthy);
    // An unobserved generation is Progressing before any expression.
    let mut stale = widget(json!({"phase": "Ready", "observedGeneration": 1}));
    stale["metadata"]["generation"] = json!(2);
    assert_eq!(
        assess_with(&rules, "example.com", "Widget", &stale).status,
        Health::Progressing
    );
}

#[test]
fn a_cel_expression_that_cannot_be_evaluated_is_unknown() {
    let mut check = widget_check();
    check.current = "self.status.phase == 'Ready'".into();
    check.in_progress = None;
    check.failed = None;
    let rules = Rules::compile(&[check]).unwrap();
    let live = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}});
    let assessment = assess_with(&rules, "example.com", "Widget", &live);
    assert_eq!(assessment.status, Health::Unknown);
    assert!(
        assessment
            .message
            .unwrap()
            .starts_with("health check current:")
    );
    let mut not_bool = widget_check();
    not_bool.in_progress = None;
    not_bool.failed = None;
    not_bool.current = "self.spec.size".into();
    let rules = Rules::compile(&[not_bool]).unwrap();
    let assessment = assess_with(&rules, "example.com", "Widget", &widget(json!({})));
    assert_eq!(assessment.status, Health::Unknown);
    assert!(assessment.message.unwrap().contains("expected a boolean"));
}

#[test]
fn a_broken_cel_expression_names_its_kind_and_field() {
    let mut broken = widget_check();
    broken.failed = Some("self.status.phase == ".into());
    let error = Rules::compile(&[broken]).unwrap_err().to_string();
    assert!(
        error.starts_with(
            "invalid health check for Widget (example.com/v1): failed: 1:22: Syntax error: "
        ) && !error.contains('\n'),
        "{error}"
    );
    let mut missing = widget_check();
    missing.current = " ".into();
    let error = Rules::compile(&[missing]).unwrap_err().to_string();
    assert_eq!(
        error,
        "invalid health check for Widget (example.com/v1): current: an expression is required"
    );
    let secret = HealthCheck {
        api_version: "v1".into(),
        kind: "Secret".into(),
        current: "has(self.data.password)".into(),
        ..Default::default()
    };
    assert_eq!(Rules::compile(&[secret]).unwrap_err(), CelError::Secret);
    let twice = Rules::compile(&[widget_check(), widget_check()]).unwrap_err();
    assert_eq!(
        twice.to_string(),
        "two health checks for Widget (example.com): keep one"
    );
}

#[test]
fn an_applications_rules_win_over_the_configurations() {
    let configured = Rules::compile(&[widget_check()]).unwrap();
    let mut own = widget_check();
    own.current = "true".into();
    own.in_progress = None;
    own.failed = None;
    let merged = configured.with_overrides(&[own]).unwrap();
    let live = widget(json!({"phase": "Failed"}));
    assert_eq!(
        assess_with(&configured, "example.com", "Widget", &live).status,
        Health::Degraded
    );
    assert_eq!(
        assess_with(&merged, "example.com", "Widget", &live).status,
        Health::Healthy
    );
}

#[test]
fn the_rule_cache_compiles_once_per_generation() {
    let cache = RuleCache::default();
    let mut app = crate::api::Application::new(
        "shop",
        crate::api::ApplicationSpec {
            health_checks: vec![widget_check()],
            ..Default::default()
        },
    );
    app.metadata.namespace = Some("team".into());
    app.metadata.generation = Some(1);
    let first = cache.for_app(&app).unwrap();
    let again = cache.for_app(&app).unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    app.metadata.generation = Some(2);
    app.spec.health_checks[0].current = "self.status.phase ==".into();
    let error = cache.for_app(&app).unwrap_err();
    assert!(error.to_string().contains("Widget"));
    app.spec.health_checks.clear();
    assert!(cache.for_app(&app).unwrap().is_empty());
}
