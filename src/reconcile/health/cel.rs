//! Custom health in CEL, as Flux's `healthCheckExprs`: per API group and
//! kind, `current`, `inProgress` and `failed` expressions that see the live
//! object as `self` (and its top-level fields by name, as Flux's do:
//! `status.phase == 'Ready'` and `self.status.phase == 'Ready'` both work).
//! Declared in the configuration (`health.checks`) and per Application
//! (`spec.healthChecks`, which wins for the same group and kind); compiled
//! once (at start, or once per Application generation), evaluated per
//! object. A rule replaces the built-in one of its kind.
//!
//! CEL is `cel` (cel-rust, the maintained successor of `cel-interpreter`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cel::{Program, Value as CelValue};
use serde_json::Value;

use super::Assessment;
use crate::api::{Application, Health, HealthCheck};

/// The variable the configuration's rules reach the process by (JSON, as
/// `config.rs` writes it from `health.checks`).
pub const ENV: &str = "SETPOINT_HEALTH_CHECKS";

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    #[error("invalid health check for {kind} ({api_version}): {field}: {message}")]
    Compile {
        api_version: String,
        kind: String,
        field: &'static str,
        message: String,
    },
    #[error("invalid health check: kind {kind:?}, apiVersion {api_version:?}: both are required")]
    Target { api_version: String, kind: String },
    #[error(
        "invalid health check for Secret: a Secret has no health, and its values stay out of expressions and messages"
    )]
    Secret,
    #[error("two health checks for {kind} ({group}): keep one")]
    Duplicate { group: String, kind: String },
    #[error("{ENV} is not a JSON list of health checks: {0}")]
    Env(String),
}

/// One kind's compiled expressions.
pub struct Rule {
    current: Program,
    in_progress: Option<Program>,
    failed: Option<Program>,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rule")
    }
}

/// Compiled rules by (group, kind).
#[derive(Clone, Debug, Default)]
pub struct Rules {
    by_kind: HashMap<(String, String), Arc<Rule>>,
}

fn group_of(api_version: &str) -> &str {
    api_version
        .rsplit_once('/')
        .map_or("", |(group, _version)| group)
}

fn compile_one(check: &HealthCheck) -> Result<Rule, CelError> {
    let field = |field: &'static str, source: &str| {
        Program::compile(source).map_err(|e| CelError::Compile {
            api_version: check.api_version.clone(),
            kind: check.kind.clone(),
            field,
            message: first_line(&e.to_string()),
        })
    };
    if check.current.trim().is_empty() {
        return Err(CelError::Compile {
            api_version: check.api_version.clone(),
            kind: check.kind.clone(),
            field: "current",
            message: "an expression is required".into(),
        });
    }
    let optional = |name: &'static str, source: &Option<String>| {
        source
            .as_deref()
            .filter(|s| !s.trim().is_empty())
            .map(|s| field(name, s))
            .transpose()
    };
    Ok(Rule {
        current: field("current", &check.current)?,
        in_progress: optional("inProgress", &check.in_progress)?,
        failed: optional("failed", &check.failed)?,
    })
}

/// A parse error's first line, without the parser's `ERROR: <input>:`
/// prefix: `1:21: Syntax error: mismatched input '<EOF>' …`.
fn first_line(error: &str) -> String {
    let line = error.trim().lines().next().unwrap_or_default();
    line.trim_start_matches("ERROR: ")
        .trim_start_matches("<input>:")
        .to_string()
}

impl Rules {
    /// Compiles every check; the first broken one is the error, naming its
    /// kind and field.
    pub fn compile(checks: &[HealthCheck]) -> Result<Rules, CelError> {
        Rules::default().with_overrides(checks)
    }

    /// These rules with `checks` compiled on top: theirs win for the same
    /// group and kind.
    pub fn with_overrides(&self, checks: &[HealthCheck]) -> Result<Rules, CelError> {
        let mut rules = self.clone();
        let mut seen = std::collections::HashSet::new();
        for check in checks {
            if check.kind.is_empty() || check.api_version.is_empty() {
                return Err(CelError::Target {
                    api_version: check.api_version.clone(),
                    kind: check.kind.clone(),
                });
            }
            let key = (group_of(&check.api_version).to_string(), check.kind.clone());
            // An evaluation error may quote the values it read.
            if key.0.is_empty() && key.1 == "Secret" {
                return Err(CelError::Secret);
            }
            if !seen.insert(key.clone()) {
                return Err(CelError::Duplicate {
                    group: key.0,
                    kind: key.1,
                });
            }
            rules.by_kind.insert(key, Arc::new(compile_one(check)?));
        }
        Ok(rules)
    }

    pub fn get(&self, group: &str, kind: &str) -> Option<&Rule> {
        self.by_kind
            .get(&(group.to_string(), kind.to_string()))
            .map(Arc::as_ref)
    }

    pub fn is_empty(&self) -> bool {
        self.by_kind.is_empty()
    }
}

impl Rule {
    /// Flux's order: `inProgress`, then `failed`, then `current`; none true
    /// is Progressing. An expression that cannot be evaluated on this object
    /// (a field it reads is absent: guard it with `has()`) is Unknown.
    pub fn assess(&self, live: &Value) -> Assessment {
        let context = match context_for(live) {
            Ok(context) => context,
            Err(message) => return Assessment::with(Health::Unknown, message),
        };
        let steps = [
            ("inProgress", self.in_progress.as_ref(), Health::Progressing),
            ("failed", self.failed.as_ref(), Health::Degraded),
            ("current", Some(&self.current), Health::Healthy),
        ];
        for (name, program, health) in steps {
            let Some(program) = program else { continue };
            match program.execute(&context) {
                Ok(CelValue::Bool(true)) => return outcome(health, live),
                Ok(CelValue::Bool(false)) => {}
                Ok(other) => {
                    return Assessment::with(
                        Health::Unknown,
                        format!(
                            "health check {name}: expected a boolean, got {:?}",
                            other.type_of()
                        ),
                    );
                }
                Err(e) => {
                    return Assessment::with(Health::Unknown, format!("health check {name}: {e}"));
                }
            }
        }
        match message(live) {
            Some(message) => Assessment::progressing(message),
            None => Assessment::progressing("waiting for the health check to pass"),
        }
    }
}

fn context_for(live: &Value) -> Result<cel::Context<'static, 'static>, String> {
    let object = cel::to_value(live).map_err(|e| format!("object not readable by CEL: {e}"))?;
    let mut context = cel::Context::default();
    // Its top-level fields by name too, converted once with the object.
    if let CelValue::Map(fields) = &object {
        for (name, value) in fields.map.iter() {
            if let cel::objects::Key::String(name) = name {
                context.add_variable_from_value(name.as_str(), value.clone());
            }
        }
    }
    context.add_variable_from_value("self", object);
    Ok(context)
}

fn outcome(health: Health, live: &Value) -> Assessment {
    match (health, message(live)) {
        (Health::Healthy, None) => Assessment::healthy(),
        (health, Some(message)) => Assessment::with(health, message),
        (health, None) => Assessment::with(health, "by its health check"),
    }
}

/// The object's own words: its Ready condition's message, else
/// `status.message`.
fn message(live: &Value) -> Option<String> {
    super::condition(live, "Ready")
        .and_then(|ready| super::text_of(ready, "message"))
        .or_else(|| super::text(live, "/status/message"))
        .filter(|m| !m.is_empty())
        .map(str::to_string)
}

static CONFIGURED: OnceLock<Arc<Rules>> = OnceLock::new();

/// The configuration's rules; none until `configure_from_env`.
pub fn configured() -> Arc<Rules> {
    CONFIGURED.get().cloned().unwrap_or_default()
}

/// Compiles `SETPOINT_HEALTH_CHECKS` and keeps the rules for the process
/// (the first call wins); the number of rules.
pub fn configure_from_env() -> Result<usize, CelError> {
    let checks: Vec<HealthCheck> = match std::env::var(ENV) {
        Ok(text) if !text.trim().is_empty() => {
            serde_json::from_str(&text).map_err(|e| CelError::Env(e.to_string()))?
        }
        _ => Vec::new(),
    };
    let rules = Rules::compile(&checks)?;
    let count = checks.len();
    let _ = CONFIGURED.set(Arc::new(rules));
    Ok(count)
}

/// Each Application's rules (the configuration's with its own on top),
/// compiled once per generation of its spec.
#[derive(Default)]
pub struct RuleCache {
    entries: Mutex<HashMap<AppKey, Compiled>>,
}

/// An Application's namespace and name.
type AppKey = (String, String);

/// The generation its rules were compiled at, and what came of it.
type Compiled = (Option<i64>, Result<Arc<Rules>, CelError>);

impl RuleCache {
    pub fn for_app(&self, app: &Application) -> Result<Arc<Rules>, CelError> {
        let checks = &app.spec.health_checks;
        if checks.is_empty() {
            return Ok(configured());
        }
        let key = (
            app.metadata.namespace.clone().unwrap_or_default(),
            app.metadata.name.clone().unwrap_or_default(),
        );
        let generation = app.metadata.generation;
        let mut entries = self.entries.lock().expect("health rule cache lock");
        if let Some((cached, rules)) = entries.get(&key)
            && *cached == generation
            && generation.is_some()
        {
            return rules.clone();
        }
        let rules = configured().with_overrides(checks).map(Arc::new);
        entries.insert(key, (generation, rules.clone()));
        rules
    }
}
