//! The preview's text (pure): per Application, the objects to create (as
//! YAML), to update (each changed field, old → new, in a unified diff
//! block) and to prune, or the render or dry-run error with the renderer's
//! message. Secrets' values are masked. The whole is cut at a size cap
//! (GitHub refuses a comment over 65,536 characters) with a "diff
//! truncated" line, never inside an open code block.

use serde_json::Value;

use crate::event::PullRequest;
use crate::manifest::ObjectId;
use crate::reconcile::plan::Drift;

use super::render::{AppPreview, Changes, Failure};

/// Hidden in the comment, so the next preview finds it and edits it.
pub const MARKER: &str = "<!-- setpoint-preview -->";
/// Below GitHub's 65,536-character limit on a comment, with room to spare.
pub const DEFAULT_MAX_CHARS: usize = 60_000;
/// What a masked Secret value shows.
const MASK: &str = "********";
/// Labels and annotations Setpoint adds itself: noise in a preview.
const OWN_PREFIX: &str = "setpoint.dev/";

/// Counts over every Application of a preview.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub apps: usize,
    pub creates: usize,
    pub updates: usize,
    pub prunes: usize,
    pub failures: usize,
}

impl Totals {
    pub fn of(previews: &[AppPreview]) -> Totals {
        let mut totals = Totals {
            apps: previews.len(),
            ..Default::default()
        };
        for preview in previews {
            match &preview.result {
                Ok(changes) => {
                    totals.creates += changes.creates.len();
                    totals.updates += changes.updates.len();
                    totals.prunes += changes.prunes.len();
                }
                Err(_) => totals.failures += 1,
            }
        }
        totals
    }

    pub fn has_changes(&self) -> bool {
        self.creates + self.updates + self.prunes > 0
    }

    /// `2 Applications: 1 to create, 1 to update, 0 to prune, 1 error`.
    pub fn summary(&self) -> String {
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut text = format!(
            "{}: {} to create, {} to update, {} to prune",
            plural(self.apps, "Application", "Applications"),
            self.creates,
            self.updates,
            self.prunes
        );
        if self.failures > 0 {
            text.push_str(&format!(", {}", plural(self.failures, "error", "errors")));
        }
        text
    }
}

/// The comment for `pull`'s head: the marker, a heading, then each
/// Application; at most `max_chars` characters.
pub fn render(pull: &PullRequest, previews: &[AppPreview], max_chars: usize) -> String {
    let mut lines = vec![
        MARKER.to_string(),
        format!("### Setpoint preview of {}", short(&pull.head_sha)),
        String::new(),
    ];
    let totals = Totals::of(previews);
    if previews.is_empty() {
        lines.push("This pull request changes no Application's source.".into());
    } else {
        lines.push(format!(
            "{}. Dry run against the live cluster; nothing was changed.",
            totals.summary()
        ));
    }
    for preview in previews {
        lines.push(String::new());
        lines.extend(app_lines(preview));
    }
    cap(lines, max_chars)
}

/// The text of one Application, also what `setpoint diff --revision`
/// prints.
pub fn app_lines(preview: &AppPreview) -> Vec<String> {
    let mut lines = Vec::new();
    let why = preview
        .input
        .as_deref()
        .map(|input| format!(" (`{input}` changed)"))
        .unwrap_or_default();
    match &preview.result {
        Err(failure) => {
            lines.push(format!("#### ❌ {}{why}: {}", preview.app, failure.reason));
            lines.extend(failure_lines(failure));
        }
        Ok(changes) if changes.is_empty() => {
            lines.push(format!("#### {}{why}: no changes", preview.app));
        }
        Ok(changes) => {
            lines.push(format!(
                "#### {}{why}: {} to create, {} to update, {} to prune",
                preview.app,
                changes.creates.len(),
                changes.updates.len(),
                changes.prunes.len()
            ));
            lines.extend(change_lines(changes));
        }
    }
    lines
}

fn failure_lines(failure: &Failure) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(file) = &failure.file {
        let at = failure
            .line
            .map(|line| format!(", line {line}"))
            .unwrap_or_default();
        lines.push(format!("In `{file}`{at}:"));
    }
    lines.push("```".into());
    lines.extend(failure.message.lines().map(fence_safe));
    lines.push("```".into());
    lines
}

fn change_lines(changes: &Changes) -> Vec<String> {
    let mut lines = Vec::new();
    for manifest in &changes.creates {
        lines.push(format!("**Create** `{}`", manifest.id));
        lines.push("```diff".into());
        let shown = shown_manifest(&manifest.id, &manifest.body);
        let yaml = serde_yaml::to_string(&as_written(shown)).unwrap_or_default();
        lines.extend(yaml.lines().map(|l| format!("+{}", fence_safe(l))));
        lines.push("```".into());
    }
    for update in &changes.updates {
        lines.push(format!("**Update** `{}`", update.id));
        lines.push("```diff".into());
        lines.push(format!("@@ {} @@", update.id));
        if update.drift.is_empty() {
            lines.push(" (only Setpoint's own annotations change)".into());
        }
        for drift in &update.drift {
            let (old, new) = drift_values(&update.id, drift);
            if let Some(old) = old {
                lines.push(format!("-{}: {}", drift.path, fence_safe(&old)));
            }
            if let Some(new) = new {
                lines.push(format!("+{}: {}", drift.path, fence_safe(&new)));
            }
        }
        lines.push("```".into());
    }
    for id in &changes.prunes {
        lines.push(format!("**Prune** `{id}`"));
    }
    lines
}

fn is_secret(id: &ObjectId) -> bool {
    id.group.is_empty() && id.kind == "Secret"
}

/// The old and new values of a changed field as shown; a Secret's data
/// never appears, only that it changed.
fn drift_values(id: &ObjectId, drift: &Drift) -> (Option<String>, Option<String>) {
    let masked =
        is_secret(id) && (drift.path.starts_with("data") || drift.path.starts_with("stringData"));
    let show = |value: &Option<Value>| {
        value.as_ref().map(|v| match v {
            _ if masked => MASK.to_string(),
            Value::String(s) => serde_json::to_string(s).unwrap_or_default(),
            other => other.to_string(),
        })
    };
    let (old, mut new) = (show(&drift.live), show(&drift.desired));
    if masked && old.is_some() && new.is_some() {
        new = Some(format!("{MASK} (changed)"));
    }
    (old, new)
}

/// A manifest as a preview shows it: without Setpoint's own labels and
/// annotations, a Secret's values masked.
pub fn shown_manifest(id: &ObjectId, body: &Value) -> Value {
    let mut body = body.clone();
    for field in ["labels", "annotations"] {
        if let Some(map) = body
            .pointer_mut(&format!("/metadata/{field}"))
            .and_then(Value::as_object_mut)
        {
            map.retain(|key, _| !key.starts_with(OWN_PREFIX));
            if map.is_empty()
                && let Some(metadata) = body.get_mut("metadata").and_then(Value::as_object_mut)
            {
                metadata.remove(field);
            }
        }
    }
    if is_secret(id) {
        for field in ["data", "stringData"] {
            if let Some(map) = body.get_mut(field).and_then(Value::as_object_mut) {
                for value in map.values_mut() {
                    *value = Value::String(MASK.into());
                }
            }
        }
    }
    body
}

/// The fields in the order people write them: `apiVersion`, `kind`,
/// `metadata` first, then the rest (JSON objects here are sorted).
fn as_written(body: Value) -> serde_yaml::Value {
    let Value::Object(mut fields) = body else {
        return serde_yaml::to_value(body).unwrap_or_default();
    };
    let mut mapping = serde_yaml::Mapping::new();
    for key in ["apiVersion", "kind", "metadata"] {
        if let Some(value) = fields.remove(key) {
            mapping.insert(key.into(), serde_yaml::to_value(value).unwrap_or_default());
        }
    }
    for (key, value) in fields {
        mapping.insert(key.into(), serde_yaml::to_value(value).unwrap_or_default());
    }
    serde_yaml::Value::Mapping(mapping)
}

/// A line that cannot close the code block it is in.
fn fence_safe(line: &str) -> String {
    if line.trim_start().starts_with("```") {
        format!(" {}", line.replace("```", "`\u{200b}``"))
    } else {
        line.to_string()
    }
}

fn short(sha: &str) -> String {
    format!("`{}`", sha.get(..7).unwrap_or(sha))
}

/// Joins `lines`, keeping at most `max_chars` characters: past it, the
/// lines that fit, the open code block closed, and a line saying how much
/// was left out.
pub fn cap(lines: Vec<String>, max_chars: usize) -> String {
    let total: usize = lines.iter().map(|l| l.chars().count() + 1).sum();
    if total <= max_chars {
        return lines.join("\n") + "\n";
    }
    // Room for the closing fence and the truncation line.
    let reserve = 200;
    let budget = max_chars.saturating_sub(reserve);
    let mut out = String::new();
    let mut used = 0;
    let mut in_fence = false;
    let mut kept = 0;
    for line in &lines {
        let len = line.chars().count() + 1;
        if used + len > budget {
            break;
        }
        if line.starts_with("```") {
            in_fence = !in_fence;
        }
        out.push_str(line);
        out.push('\n');
        used += len;
        kept += 1;
    }
    if in_fence {
        out.push_str("```\n");
    }
    out.push_str(&format!(
        "\n**diff truncated**: {} more lines not shown (over {max_chars} characters); `setpoint diff NAMESPACE/NAME --revision <head>` prints them all.\n",
        lines.len() - kept
    ));
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::event::AppKey;
    use crate::manifest::Origin;
    use crate::preview::render::Update;

    fn pull() -> PullRequest {
        PullRequest {
            provider: "github".into(),
            delivery: String::new(),
            repo_urls: vec![],
            project: "acme/deploy".into(),
            number: 3,
            base_branch: "main".into(),
            default_branch: None,
            base_sha: Some("1".repeat(40)),
            head_sha: "abcdef0123456789abcdef0123456789abcdef01".into(),
            head_ref: "refs/pull/3/head".into(),
            fork: false,
            updated_at: None,
            apps: vec![],
        }
    }

    fn id(group: &str, kind: &str, name: &str) -> ObjectId {
        ObjectId {
            group: group.into(),
            version: "v1".into(),
            kind: kind.into(),
            namespace: Some("team".into()),
            name: name.into(),
        }
    }

    fn manifest(id: ObjectId, body: Value) -> crate::manifest::Manifest {
        crate::manifest::Manifest {
            id,
            origin: Origin {
                file: "app/x.yaml".into(),
                document: 0,
            },
            body,
        }
    }

    fn preview(changes: Changes) -> AppPreview {
        AppPreview {
            app: AppKey::new("team", "web"),
            input: Some("app/deploy.yaml".into()),
            result: Ok(changes),
        }
    }

    #[test]
    fn updates_are_unified_diff_blocks_with_old_and_new_values() {
        let changes = Changes {
            updates: vec![Update {
                id: id("apps", "Deployment", "web"),
                drift: vec![Drift {
                    path: "spec.replicas".into(),
                    live: Some(json!(1)),
                    desired: Some(json!(3)),
                    manager: None,
                }],
            }],
            creates: vec![manifest(
                id("", "ConfigMap", "settings"),
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "settings", "labels": {"setpoint.dev/app": "x"},
                                    "annotations": {"setpoint.dev/manifest-hash": "h"}},
                       "data": {"key": "v"}}),
            )],
            prunes: vec![id("", "Service", "old")],
            unchanged: 1,
        };
        let text = render(&pull(), &[preview(changes)], DEFAULT_MAX_CHARS);
        assert!(text.starts_with(MARKER), "{text}");
        assert!(text.contains("### Setpoint preview of `abcdef0`"), "{text}");
        assert!(
            text.contains("1 Application: 1 to create, 1 to update, 1 to prune"),
            "{text}"
        );
        assert!(
            text.contains(
                "**Update** `apps/Deployment team/web`\n```diff\n@@ apps/Deployment team/web @@\n-spec.replicas: 1\n+spec.replicas: 3\n```"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "**Create** `ConfigMap team/settings`\n```diff\n+apiVersion: v1\n+kind: ConfigMap\n+metadata:\n"
            ),
            "{text}"
        );
        assert!(text.contains("+data:\n+  key: v\n"), "{text}");
        // Setpoint's own labels and annotations are noise here.
        assert!(!text.contains("setpoint.dev/"), "{text}");
        assert!(text.contains("**Prune** `Service team/old`"), "{text}");
        assert!(text.contains("(`app/deploy.yaml` changed)"), "{text}");
    }

    #[test]
    fn secret_values_are_masked_in_creates_and_updates() {
        let secret = id("", "Secret", "db");
        let changes = Changes {
            creates: vec![manifest(
                secret.clone(),
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
                       "data": {"password": "aHVudGVyMg=="},
                       "stringData": {"token": "plain-token"}}),
            )],
            updates: vec![Update {
                id: secret,
                drift: vec![
                    Drift {
                        path: "data.password".into(),
                        live: Some(json!("b2xk")),
                        desired: Some(json!("bmV3")),
                        manager: None,
                    },
                    Drift {
                        path: "metadata.labels.tier".into(),
                        live: Some(json!("a")),
                        desired: Some(json!("b")),
                        manager: None,
                    },
                ],
            }],
            ..Default::default()
        };
        let text = render(&pull(), &[preview(changes)], DEFAULT_MAX_CHARS);
        for secret in ["aHVudGVyMg==", "plain-token", "b2xk", "bmV3"] {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
        assert!(text.contains("+  password: '********'"), "{text}");
        assert!(
            text.contains("-data.password: ********\n+data.password: ******** (changed)"),
            "{text}"
        );
        // Other fields of a Secret are shown.
        assert!(
            text.contains("-metadata.labels.tier: \"a\"\n+metadata.labels.tier: \"b\""),
            "{text}"
        );
    }

    #[test]
    fn failures_show_the_renderers_message_and_the_file() {
        let failed = AppPreview {
            app: AppKey::new("team", "broken"),
            input: None,
            result: Err(Failure {
                reason: "InvalidManifest".into(),
                message:
                    "invalid manifest: app/bad.yaml: document 0, line 3: did not find expected key"
                        .into(),
                file: Some("app/bad.yaml".into()),
                line: Some(3),
                transient: false,
            }),
        };
        let text = render(&pull(), &[failed], DEFAULT_MAX_CHARS);
        assert!(
            text.contains("#### ❌ team/broken: InvalidManifest"),
            "{text}"
        );
        assert!(text.contains("In `app/bad.yaml`, line 3:"), "{text}");
        assert!(text.contains("did not find expected key"), "{text}");
        assert!(text.contains("1 error"), "{text}");
    }

    #[test]
    fn a_long_preview_is_cut_at_the_cap_with_its_code_block_closed() {
        let creates = (0..500)
            .map(|i| {
                manifest(
                    id("", "ConfigMap", &format!("cm-{i}")),
                    json!({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": format!("cm-{i}")},
                           "data": {"a": "x".repeat(100)}}),
                )
            })
            .collect();
        let changes = Changes {
            creates,
            ..Default::default()
        };
        let whole = render(&pull(), &[preview(changes.clone())], usize::MAX);
        assert!(whole.chars().count() > 65_536);
        let text = render(&pull(), &[preview(changes)], 65_536);
        assert!(text.chars().count() <= 65_536, "{}", text.len());
        assert!(text.starts_with(MARKER));
        assert!(
            text.contains("**diff truncated**"),
            "{}",
            &text[text.len() - 300..]
        );
        // Every code block opened is closed.
        let fences = text.lines().filter(|l| l.starts_with("```")).count();
        assert_eq!(fences % 2, 0);
        assert!(!whole.contains("diff truncated"));
    }

    #[test]
    fn a_fence_inside_a_value_cannot_close_the_block() {
        assert_eq!(fence_safe("```bash"), " `\u{200b}``bash");
        assert_eq!(fence_safe("plain"), "plain");
    }
}
