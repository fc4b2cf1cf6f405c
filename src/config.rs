//! Configuration: `config/setpoint.yaml` documents every setting with its
//! default. A file given with `--config` (or `SETPOINT_CONFIG`) fills in the
//! `SETPOINT_…` environment variables that are not set already, before the
//! command line is read, so the order is: flags, then the environment, then
//! the file, then the defaults. Secrets are never values in the file: it
//! names files that hold them (`…File`), or they come from the environment.
//!
//! `setpoint config check FILE` validates a file and explains each error
//! with its key.

use std::fmt;

use serde_yaml::Value;

/// How a setting's value is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `500ms`, `30s`, `10m`, `1h`.
    Duration,
    /// A whole number in a range.
    Count {
        min: u64,
        max: u64,
    },
    /// `host:port`.
    Address,
    Text,
    /// A file's path (the file may not exist yet where the check runs).
    Path,
    Flag,
    /// A list of text values (the variable takes them comma-separated).
    List,
    OneOf(&'static [&'static str]),
    /// Custom health rules (`health.checks`): a list of `{apiVersion, kind,
    /// current, inProgress, failed}` whose CEL expressions must compile;
    /// the variable takes them as JSON.
    HealthChecks,
    /// Each namespace's default `spec.source.verify` (`source.verify`): a
    /// list of `{namespace, mode, secretRef: {name}}`; the variable takes
    /// them as JSON.
    VerifyDefaults,
}

/// One setting: its key in the file, its variable, its default.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub key: &'static str,
    pub env: &'static str,
    pub kind: Kind,
    /// As `config/setpoint.yaml` spells it; `""` is unset.
    pub default: &'static str,
}

const fn setting(
    key: &'static str,
    env: &'static str,
    kind: Kind,
    default: &'static str,
) -> Setting {
    Setting {
        key,
        env,
        kind,
        default,
    }
}

/// Every setting. `config/setpoint.yaml` must list each with its default
/// (a test holds them equal).
pub const SETTINGS: &[Setting] = &[
    setting("log.level", "SETPOINT_LOG", Kind::Text, "warn"),
    setting(
        "log.format",
        "SETPOINT_LOG_FORMAT",
        Kind::OneOf(&["text", "json"]),
        "text",
    ),
    setting("cacheDir", "SETPOINT_CACHE_DIR", Kind::Path, ""),
    setting(
        "watchNamespaces",
        "SETPOINT_WATCH_NAMESPACES",
        Kind::List,
        "",
    ),
    setting(
        "tenancy.adminNamespaces",
        "SETPOINT_ADMIN_NAMESPACES",
        Kind::List,
        "",
    ),
    setting(
        "tenancy.defaultServiceAccount",
        "SETPOINT_DEFAULT_SERVICE_ACCOUNT",
        Kind::Text,
        "default",
    ),
    setting(
        "tenancy.globalCredentialsFor",
        "SETPOINT_GLOBAL_CREDENTIALS_FOR",
        Kind::List,
        "",
    ),
    setting(
        "source.allowLocal",
        "SETPOINT_ALLOW_LOCAL_REPOS",
        Kind::Flag,
        "false",
    ),
    setting(
        "source.verify",
        crate::reconcile::signatures::ENV,
        Kind::VerifyDefaults,
        "",
    ),
    setting(
        "queue.amqpURLFile",
        "SETPOINT_AMQP_URL_FILE",
        Kind::Path,
        "",
    ),
    setting(
        "queue.queueType",
        "SETPOINT_AMQP_QUEUE_TYPE",
        Kind::OneOf(&["quorum", "classic"]),
        "quorum",
    ),
    setting(
        "queue.prefix",
        "SETPOINT_AMQP_PREFIX",
        Kind::Text,
        "setpoint",
    ),
    setting(
        "queue.shards",
        "SETPOINT_AMQP_SHARDS",
        Kind::Count { min: 1, max: 1024 },
        "16",
    ),
    setting(
        "queue.maxAttempts",
        "SETPOINT_MAX_ATTEMPTS",
        Kind::Count { min: 1, max: 1000 },
        "8",
    ),
    setting(
        "queue.maxDeliveries",
        "SETPOINT_MAX_DELIVERIES",
        Kind::Count { min: 1, max: 1000 },
        "5",
    ),
    setting(
        "queue.retryInitial",
        "SETPOINT_RETRY_INITIAL",
        Kind::Duration,
        "1s",
    ),
    setting(
        "queue.balanceInterval",
        "SETPOINT_BALANCE_INTERVAL",
        Kind::Duration,
        "5s",
    ),
    setting(
        "webhook.listen",
        "SETPOINT_LISTEN",
        Kind::Address,
        "0.0.0.0:8080",
    ),
    setting(
        "webhook.bodyLimit",
        "SETPOINT_WEBHOOK_BODY_LIMIT",
        Kind::Count {
            min: 1024,
            max: 1 << 30,
        },
        "26214400",
    ),
    setting(
        "webhook.gitlabBodyLimit",
        "SETPOINT_WEBHOOK_GITLAB_BODY_LIMIT",
        Kind::Count {
            min: 1024,
            max: 1 << 30,
        },
        "10485760",
    ),
    setting(
        "webhook.inFlightLimit",
        "SETPOINT_WEBHOOK_IN_FLIGHT_LIMIT",
        Kind::Count {
            min: 1024,
            max: 1 << 34,
        },
        "67108864",
    ),
    setting(
        "webhook.readTimeout",
        "SETPOINT_WEBHOOK_READ_TIMEOUT",
        Kind::Duration,
        "10s",
    ),
    setting(
        "webhook.replayWindow",
        "SETPOINT_WEBHOOK_REPLAY_WINDOW",
        Kind::Duration,
        "5m",
    ),
    setting(
        "webhook.githubSecretFiles",
        "SETPOINT_GITHUB_SECRET_FILES",
        Kind::List,
        "",
    ),
    setting(
        "webhook.gitlabTokenFiles",
        "SETPOINT_GITLAB_TOKEN_FILES",
        Kind::List,
        "",
    ),
    setting(
        "worker.concurrency",
        "SETPOINT_CONCURRENCY",
        Kind::Count { min: 1, max: 1024 },
        "16",
    ),
    setting(
        "worker.shutdownGrace",
        "SETPOINT_SHUTDOWN_GRACE",
        Kind::Duration,
        "30s",
    ),
    setting(
        "sweep.interval",
        "SETPOINT_SWEEP_INTERVAL",
        Kind::Duration,
        "10m",
    ),
    setting(
        "charts.pollInterval",
        "SETPOINT_CHART_POLL_INTERVAL",
        Kind::Duration,
        "5m",
    ),
    setting(
        "metrics.listen",
        "SETPOINT_METRICS_LISTEN",
        Kind::Address,
        "0.0.0.0:9090",
    ),
    setting("ui.listen", "SETPOINT_UI_LISTEN", Kind::Address, ""),
    setting(
        "ui.auth",
        "SETPOINT_UI_AUTH",
        Kind::OneOf(&["kubernetes", "none"]),
        "kubernetes",
    ),
    setting(
        "render.timeout",
        "SETPOINT_RENDER_TIMEOUT",
        Kind::Duration,
        "60s",
    ),
    setting(
        "render.maxOutput",
        "SETPOINT_RENDER_MAX_OUTPUT",
        Kind::Count {
            min: 1024,
            max: 1 << 32,
        },
        "33554432",
    ),
    setting(
        "render.maxManifestBytes",
        "SETPOINT_MAX_MANIFEST_BYTES",
        Kind::Count {
            min: 1024,
            max: 1 << 32,
        },
        "8388608",
    ),
    setting(
        "render.maxManifestAliases",
        "SETPOINT_MAX_MANIFEST_ALIASES",
        Kind::Count {
            min: 0,
            max: 1 << 32,
        },
        "10000",
    ),
    setting(
        "render.maxManifestNodes",
        "SETPOINT_MAX_MANIFEST_NODES",
        Kind::Count {
            min: 1000,
            max: 1 << 32,
        },
        "1000000",
    ),
    setting(
        "render.maxManifestExpandedBytes",
        "SETPOINT_MAX_MANIFEST_EXPANDED_BYTES",
        Kind::Count {
            min: 1024,
            max: 1 << 34,
        },
        "10485760",
    ),
    setting("render.kubectl", "SETPOINT_KUBECTL", Kind::Path, "kubectl"),
    setting("render.helm", "SETPOINT_HELM", Kind::Path, "helm"),
    setting("git.username", "SETPOINT_GIT_USERNAME", Kind::Text, "git"),
    setting(
        "git.passwordFile",
        "SETPOINT_GIT_PASSWORD_FILE",
        Kind::Path,
        "",
    ),
    setting(
        "github.apiURL",
        "SETPOINT_GITHUB_API_URL",
        Kind::Text,
        "https://api.github.com",
    ),
    setting(
        "github.tokenFile",
        "SETPOINT_GITHUB_TOKEN_FILE",
        Kind::Path,
        "",
    ),
    setting(
        "github.commitStatuses",
        "SETPOINT_GITHUB_COMMIT_STATUSES",
        Kind::Flag,
        "true",
    ),
    setting("github.hooks", "SETPOINT_GITHUB_HOOKS", Kind::List, ""),
    setting(
        "github.redeliveryInterval",
        "SETPOINT_GITHUB_REDELIVERY_INTERVAL",
        Kind::Duration,
        "5m",
    ),
    setting(
        "gitlab.apiURL",
        "SETPOINT_GITLAB_API_URL",
        Kind::Text,
        "https://gitlab.com/api/v4",
    ),
    setting(
        "gitlab.tokenFile",
        "SETPOINT_GITLAB_API_TOKEN_FILE",
        Kind::Path,
        "",
    ),
    setting(
        "gitlab.commitStatuses",
        "SETPOINT_GITLAB_COMMIT_STATUSES",
        Kind::Flag,
        "true",
    ),
    setting(
        "previews.concurrency",
        "SETPOINT_PREVIEW_CONCURRENCY",
        Kind::Count { min: 1, max: 64 },
        "2",
    ),
    setting(
        "previews.forks",
        "SETPOINT_PREVIEW_FORKS",
        Kind::Flag,
        "false",
    ),
    setting(
        "health.checks",
        crate::reconcile::health::cel::ENV,
        Kind::HealthChecks,
        "",
    ),
];

/// Keys that would put a secret in the file, and where it belongs instead.
const SECRET_KEYS: &[(&str, &str)] = &[
    ("queue.amqpURL", "queue.amqpURLFile or SETPOINT_AMQP_URL"),
    (
        "webhook.githubSecret",
        "webhook.githubSecretFiles or SETPOINT_GITHUB_SECRETS",
    ),
    (
        "webhook.githubSecrets",
        "webhook.githubSecretFiles or SETPOINT_GITHUB_SECRETS",
    ),
    (
        "webhook.gitlabToken",
        "webhook.gitlabTokenFiles or SETPOINT_GITLAB_TOKENS",
    ),
    (
        "webhook.gitlabTokens",
        "webhook.gitlabTokenFiles or SETPOINT_GITLAB_TOKENS",
    ),
    ("git.password", "git.passwordFile or SETPOINT_GIT_PASSWORD"),
    ("github.token", "github.tokenFile or SETPOINT_GITHUB_TOKEN"),
    (
        "gitlab.token",
        "gitlab.tokenFile or SETPOINT_GITLAB_API_TOKEN",
    ),
];

/// One problem in a file, by key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The dotted key (`queue.shards`), or `""` for the file as a whole.
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

/// The environment a file asks for: `(variable, value)` for every setting it
/// sets; or every error it has.
pub fn parse(text: &str) -> Result<Vec<(&'static str, String)>, Vec<ConfigError>> {
    let root: Value = match serde_yaml::from_str(text) {
        Ok(Value::Null) => return Ok(Vec::new()),
        Ok(value) => value,
        Err(e) => {
            return Err(vec![ConfigError {
                key: String::new(),
                message: format!(
                    "not YAML{}: {}",
                    e.location()
                        .map(|l| format!(" (line {})", l.line()))
                        .unwrap_or_default(),
                    e
                ),
            }]);
        }
    };
    let mut leaves = Vec::new();
    let mut errors = Vec::new();
    flatten("", &root, &mut leaves, &mut errors);
    let mut env = Vec::new();
    for (key, value) in leaves {
        if let Some((_, instead)) = SECRET_KEYS.iter().find(|(k, _)| *k == key) {
            errors.push(ConfigError {
                key,
                message: format!(
                    "secrets do not belong in the configuration file (the value is not shown): use {instead}"
                ),
            });
            continue;
        }
        let Some(setting) = SETTINGS.iter().find(|s| s.key == key) else {
            let hint = closest(&key)
                .map(|k| format!(" (did you mean {k}?)"))
                .unwrap_or_default();
            errors.push(ConfigError {
                message: format!("unknown setting{hint}"),
                key,
            });
            continue;
        };
        match check(setting, &value) {
            Ok(Some(text)) => env.push((setting.env, text)),
            Ok(None) => {}
            Err(message) => errors.push(ConfigError { key, message }),
        }
    }
    if errors.is_empty() {
        Ok(env)
    } else {
        Err(errors)
    }
}

/// Dotted keys and their values; a mapping where a value is expected is
/// walked into.
fn flatten(
    prefix: &str,
    value: &Value,
    out: &mut Vec<(String, Value)>,
    errors: &mut Vec<ConfigError>,
) {
    match value {
        Value::Mapping(map) => {
            for (key, value) in map {
                let Some(key) = key.as_str() else {
                    errors.push(ConfigError {
                        key: prefix.to_string(),
                        message: format!("keys must be text, found {key:?}"),
                    });
                    continue;
                };
                let full = if prefix.is_empty() {
                    key.to_string()
                } else {
                    format!("{prefix}.{key}")
                };
                // A section's value is a mapping; a setting's never is.
                if value.is_mapping() {
                    flatten(&full, value, out, errors);
                } else {
                    out.push((full, value.clone()));
                }
            }
        }
        _ if prefix.is_empty() => errors.push(ConfigError {
            key: String::new(),
            message: "the file must be a mapping of sections and settings".into(),
        }),
        other => out.push((prefix.to_string(), other.clone())),
    }
}

/// The variable's value for `value`, `None` when it leaves the default, or
/// why it is wrong.
fn check(setting: &Setting, value: &Value) -> Result<Option<String>, String> {
    let scalar = |value: &Value| -> Option<String> {
        match value {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    };
    if value.is_null() {
        return Ok(None);
    }
    if setting.kind == Kind::HealthChecks {
        return health_checks(value);
    }
    if setting.kind == Kind::VerifyDefaults {
        return verify_defaults(value);
    }
    let text = match (setting.kind, value) {
        (Kind::List, Value::Sequence(items)) => {
            let mut values = Vec::new();
            for item in items {
                match scalar(item) {
                    Some(text) if !text.contains(',') => values.push(text),
                    Some(_) => return Err("list items may not contain commas".into()),
                    None => return Err("expected a list of text values".into()),
                }
            }
            values.join(",")
        }
        (Kind::List, _) => return Err(format!("expected a list, found {}", describe(value))),
        (_, value) => scalar(value)
            .ok_or_else(|| format!("expected a single value, found {}", describe(value)))?,
    };
    match setting.kind {
        Kind::Duration => {
            crate::serve::parse_duration(&text)
                .map_err(|e| format!("{e} (e.g. 500ms, 30s, 10m)"))?;
        }
        Kind::Count { min, max } => {
            let n: u64 = text
                .trim()
                .parse()
                .map_err(|_| format!("expected a whole number, found {text:?}"))?;
            if n < min || n > max {
                return Err(format!("must be between {min} and {max}, found {n}"));
            }
        }
        Kind::Address => {
            text.parse::<std::net::SocketAddr>().map_err(|_| {
                format!("expected host:port with an IP address (e.g. 0.0.0.0:8080), found {text:?}")
            })?;
        }
        Kind::Flag => {
            if !matches!(text.as_str(), "true" | "false") {
                return Err(format!("expected true or false, found {text:?}"));
            }
        }
        Kind::OneOf(choices) => {
            if !choices.contains(&text.as_str()) {
                return Err(format!(
                    "expected one of {}, found {text:?}",
                    choices.join(", ")
                ));
            }
        }
        Kind::Text | Kind::Path | Kind::List | Kind::HealthChecks | Kind::VerifyDefaults => {}
    }
    if text.is_empty() && setting.default.is_empty() {
        return Ok(None);
    }
    Ok(Some(text))
}

/// `source.verify` as JSON, once each entry names a namespace (once) and a
/// Secret.
fn verify_defaults(value: &Value) -> Result<Option<String>, String> {
    let Value::Sequence(items) = value else {
        return Err(format!("expected a list, found {}", describe(value)));
    };
    if items.is_empty() {
        return Ok(None);
    }
    let json = serde_json::to_string(value).map_err(|e| e.to_string())?;
    let defaults = crate::reconcile::signatures::parse_defaults(&json)?;
    serde_json::to_string(&defaults)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// `health.checks` as JSON, once every expression compiles; an error names
/// the kind and the field of the first that does not.
fn health_checks(value: &Value) -> Result<Option<String>, String> {
    use crate::api::HealthCheck;
    let Value::Sequence(items) = value else {
        return Err(format!("expected a list, found {}", describe(value)));
    };
    if items.is_empty() {
        return Ok(None);
    }
    let checks: Vec<HealthCheck> = serde_yaml::from_value(value.clone()).map_err(|e| {
        format!("expected a list of {{apiVersion, kind, current, inProgress, failed}}: {e}")
    })?;
    crate::reconcile::health::Rules::compile(&checks).map_err(|e| e.to_string())?;
    serde_json::to_string(&checks)
        .map(Some)
        .map_err(|e| e.to_string())
}

fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// The known key nearest to a misspelled one (by edit distance), if close.
fn closest(key: &str) -> Option<&'static str> {
    SETTINGS
        .iter()
        .map(|s| {
            (
                distance(&key.to_ascii_lowercase(), &s.key.to_ascii_lowercase()),
                s.key,
            )
        })
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = if ca == *cb {
                previous
            } else {
                1 + previous.min(row[j]).min(row[j + 1])
            };
            previous = current;
        }
    }
    row[b.len()]
}

/// Reads `path` and sets the variables it asks for that are not set yet.
///
/// # Safety
/// Changes the process environment: call it before any other thread runs.
pub unsafe fn apply_file(path: &std::path::Path) -> Result<usize, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let env = parse(&text).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(|e| format!("  {e}")).collect();
        format!("{} is not valid:\n{}", path.display(), lines.join("\n"))
    })?;
    let mut set = 0;
    for (name, value) in env {
        if std::env::var_os(name).is_none() {
            // SAFETY: the caller guarantees no other thread runs yet.
            unsafe { std::env::set_var(name, value) };
            set += 1;
        }
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> Vec<String> {
        parse(text)
            .unwrap_err()
            .into_iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn a_file_becomes_the_variables_of_its_settings() {
        let env = parse(
            "queue:\n  shards: 32\n  prefix: prod\nworker:\n  shutdownGrace: 45s\nwebhook:\n  githubSecretFiles: [/s/a, /s/b]\nlog: {format: json}\n",
        )
        .unwrap();
        assert_eq!(
            env,
            [
                ("SETPOINT_AMQP_SHARDS", "32".to_string()),
                ("SETPOINT_AMQP_PREFIX", "prod".to_string()),
                ("SETPOINT_SHUTDOWN_GRACE", "45s".to_string()),
                ("SETPOINT_GITHUB_SECRET_FILES", "/s/a,/s/b".to_string()),
                ("SETPOINT_LOG_FORMAT", "json".to_string()),
            ]
        );
        assert_eq!(parse("").unwrap(), []);
    }

    #[test]
    fn each_error_names_its_key() {
        let found = errors(
            "queue:\n  shards: lots\n  sharsd: 3\nworker:\n  shutdownGrace: 30 seconds\nmetrics:\n  listen: localhost\nlog:\n  format: xml\nwebhook:\n  githubSecretFiles: /one/file\n",
        );
        assert_eq!(
            found,
            [
                "queue.shards: expected a whole number, found \"lots\"",
                "queue.sharsd: unknown setting (did you mean queue.shards?)",
                "worker.shutdownGrace: \"30 seconds\": the unit must be ms, s, m or h (e.g. 500ms, 30s, 10m)",
                "metrics.listen: expected host:port with an IP address (e.g. 0.0.0.0:8080), found \"localhost\"",
                "log.format: expected one of text, json, found \"xml\"",
                "webhook.githubSecretFiles: expected a list, found text",
            ]
        );
        assert_eq!(
            errors("queue:\n  shards: 0\n"),
            ["queue.shards: must be between 1 and 1024, found 0"]
        );
        assert_eq!(
            errors("- a\n"),
            ["the file must be a mapping of sections and settings"]
        );
        assert!(errors("queue: [\n")[0].starts_with("not YAML (line"));
    }

    #[test]
    fn secrets_in_the_file_are_refused_without_being_shown() {
        let found = errors(
            "queue:\n  amqpURL: amqp://admin:hunter2@rabbit/\ngithub:\n  token: ghp_secret\n",
        );
        assert_eq!(found.len(), 2);
        for line in &found {
            assert!(
                !line.contains("hunter2") && !line.contains("ghp_secret"),
                "{line}"
            );
        }
        assert!(
            found[0].starts_with("queue.amqpURL: secrets do not belong"),
            "{}",
            found[0]
        );
        assert!(found[0].contains("queue.amqpURLFile"), "{}", found[0]);
    }

    #[test]
    fn health_checks_become_json_once_their_expressions_compile() {
        let text = "health:\n  checks:\n    - apiVersion: example.com/v1\n      kind: Widget\n      current: \"self.status.phase == 'Ready'\"\n";
        let env = parse(text).unwrap();
        assert_eq!(env.len(), 1);
        assert_eq!(env[0].0, "SETPOINT_HEALTH_CHECKS");
        let checks: Vec<crate::api::HealthCheck> = serde_json::from_str(&env[0].1).unwrap();
        assert_eq!(checks[0].kind, "Widget");
        assert_eq!(checks[0].current, "self.status.phase == 'Ready'");

        let broken = "health:\n  checks:\n    - apiVersion: example.com/v1\n      kind: Widget\n      current: \"self.status.phase == 'Ready'\"\n      failed: \"self.status.phase ==\"\n";
        let errors = errors(broken);
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with(
                "health.checks: invalid health check for Widget (example.com/v1): failed: "
            ),
            "{errors:?}"
        );
    }

    #[test]
    fn namespace_verify_defaults_become_json_once_each_names_a_secret() {
        let text = "source:\n  verify:\n    - namespace: team-a\n      mode: tag\n      secretRef: {name: signers}\n";
        let env = parse(text).unwrap();
        assert_eq!(env, [("SETPOINT_VERIFY_DEFAULTS", env[0].1.clone())]);
        let defaults = crate::reconcile::signatures::parse_defaults(&env[0].1).unwrap();
        assert_eq!(defaults[0].namespace, "team-a");
        assert_eq!(defaults[0].verify.mode, crate::api::VerifyMode::Tag);

        let errors = errors("source:\n  verify:\n    - namespace: team-a\n");
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("source.verify: expected a list of {namespace, mode, secretRef"),
            "{errors:?}"
        );
    }

    #[test]
    fn the_documented_file_lists_every_setting_with_its_default() {
        let text = include_str!("../config/setpoint.yaml");
        let documented: Vec<(&str, String)> = parse(text).unwrap_or_else(|e| panic!("{e:?}"));
        for setting in SETTINGS {
            let key = setting.key.rsplit('.').next().unwrap();
            assert!(
                text.contains(&format!("{key}:")),
                "config/setpoint.yaml does not document {}",
                setting.key
            );
            let value = documented
                .iter()
                .find(|(env, _)| *env == setting.env)
                .map(|(_, v)| v.as_str())
                .unwrap_or("");
            assert_eq!(value, setting.default, "the default of {}", setting.key);
        }
    }
}
