//! One message, encoded for each Provider type in its documented format
//! (pure):
//!
//! - Slack: an incoming webhook's `text` (the fallback line) and one
//!   `attachments` entry (colour, title and its link, text in mrkdwn,
//!   `fields`), as Flux's Slack provider sends; `channel` and `username`
//!   when the Provider sets them.
//! - Microsoft Teams: a `message` whose attachment is an Adaptive Card
//!   (`application/vnd.microsoft.card.adaptive`, version 1.4: TextBlocks, a
//!   FactSet, an `Action.OpenUrl` to the commit), what a Teams workflow
//!   webhook takes.
//! - Discord: `content` and one of `embeds` (title, url, description,
//!   colour, `fields`, timestamp), within Discord's length limits.
//! - generic: Flux's event JSON (`involvedObject`, `severity`,
//!   `timestamp`, `message`, `reason`, `metadata` of strings,
//!   `reportingController`), plus the drift `changes`; `generic-hmac`
//!   signs that body: `X-Signature: sha256=<hex HMAC-SHA256>`.

use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::api::Severity;
use crate::notify::Notification;
use crate::notify::message::{Message, change_line};

/// Slack's and Discord's colours for a success and a failure.
const GOOD: &str = "#2eb886";
const DANGER: &str = "#d50000";

/// The body text of a chat message: the summary, the Event's note (unless
/// the changes say it all), each change, what to do.
fn body_lines(message: &Message, bullet: &str, bold: fn(&str) -> String) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(summary) = &message.summary {
        lines.push(bold(summary));
    }
    if message.changes.is_empty() {
        lines.push(message.text.clone());
    } else {
        lines.extend(
            message
                .changes
                .iter()
                .map(|change| format!("{bullet}{}", change_line(change))),
        );
    }
    if let Some(advice) = &message.advice {
        lines.push(advice.clone());
    }
    lines
}

/// Slack's mrkdwn needs `&`, `<` and `>` escaped.
fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn colour(severity: Severity) -> &'static str {
    match severity {
        Severity::Info => GOOD,
        Severity::Error => DANGER,
    }
}

/// A Slack incoming webhook's (or `chat.postMessage`'s) body.
pub fn slack(message: &Message, channel: Option<&str>, username: Option<&str>) -> Value {
    let text = body_lines(message, "• ", |s| format!("*{}*", slack_escape(s)))
        .iter()
        .map(|line| {
            if line.starts_with('*') {
                line.clone()
            } else {
                slack_escape(line)
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut fields: Vec<Value> = message
        .facts
        .iter()
        .map(|(name, value)| json!({"title": name, "value": slack_escape(value), "short": true}))
        .collect();
    if let Some((short, Some(link))) = &message.revision
        && let Some(field) = fields.iter_mut().find(|f| f["title"] == "Revision")
    {
        field["value"] = json!(format!("<{link}|{short}>"));
    }
    let mut attachment = json!({
        "color": colour(message.severity),
        "author_name": "setpoint",
        "title": message.title,
        "text": text,
        "mrkdwn_in": ["text"],
        "fields": fields,
    });
    if let Some((_, Some(link))) = &message.revision {
        attachment["title_link"] = json!(link);
    }
    let mut body = json!({
        "text": slack_escape(&message.title),
        "attachments": [attachment],
    });
    if let Some(channel) = channel {
        body["channel"] = json!(channel);
    }
    if let Some(username) = username {
        body["username"] = json!(username);
    }
    body
}

/// A Microsoft Teams workflow webhook's body: one Adaptive Card.
pub fn msteams(message: &Message) -> Value {
    let mut blocks = vec![json!({
        "type": "TextBlock",
        "text": message.title,
        "weight": "Bolder",
        "size": "Medium",
        "wrap": true,
        "color": match message.severity { Severity::Info => "Good", Severity::Error => "Attention" },
    })];
    for line in body_lines(message, "- ", |s| format!("**{s}**")) {
        blocks.push(json!({"type": "TextBlock", "text": line, "wrap": true}));
    }
    blocks.push(json!({
        "type": "FactSet",
        "facts": message.facts.iter().map(|(name, value)| json!({"title": name, "value": value})).collect::<Vec<_>>(),
    }));
    let mut card = json!({
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": blocks,
    });
    if let Some((_, Some(link))) = &message.revision {
        card["actions"] = json!([{"type": "Action.OpenUrl", "title": "View commit", "url": link}]);
    }
    json!({
        "type": "message",
        "attachments": [{
            "contentType": "application/vnd.microsoft.card.adaptive",
            "contentUrl": null,
            "content": card,
        }],
    })
}

/// Discord's limits: `content` 2000, an embed's description 4096, its
/// title 256, a field's value 1024, 25 fields.
fn cut(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(limit - 1).collect();
    cut.push('…');
    cut
}

/// A Discord webhook's body.
pub fn discord(message: &Message, username: Option<&str>, timestamp: &str) -> Value {
    let description = body_lines(message, "• ", |s| format!("**{s}**")).join("\n");
    let fields: Vec<Value> = message
        .facts
        .iter()
        .take(25)
        .map(|(name, value)| json!({"name": cut(name, 256), "value": cut(value, 1024), "inline": true}))
        .collect();
    let colour = u32::from_str_radix(&colour(message.severity)[1..], 16).unwrap_or_default();
    let mut embed = json!({
        "title": cut(&message.title, 256),
        "description": cut(&description, 4096),
        "color": colour,
        "fields": fields,
        "timestamp": timestamp,
        "footer": {"text": "setpoint"},
    });
    if let Some((_, Some(link))) = &message.revision {
        embed["url"] = json!(link);
    }
    let mut body = json!({
        "content": cut(&message.title, 2000),
        "embeds": [embed],
    });
    if let Some(username) = username {
        body["username"] = json!(username);
    }
    body
}

/// Flux's event JSON, as its `generic` provider posts it.
pub fn generic(notification: &Notification, message: &Message) -> Value {
    let occurrence = &notification.occurrence;
    let mut metadata = serde_json::Map::new();
    metadata.insert("kind".into(), json!(occurrence.kind.as_str()));
    if let Some(revision) = &occurrence.revision {
        metadata.insert("revision".into(), json!(revision));
    }
    if let Some(repository) = &occurrence.repository {
        metadata.insert("repository".into(), json!(repository));
    }
    if let Some((_, Some(link))) = &message.revision {
        metadata.insert("revisionUrl".into(), json!(link));
    }
    if let Some(summary) = &notification.summary {
        metadata.insert("summary".into(), json!(summary));
    }
    if let Some(advice) = &message.advice {
        metadata.insert("advice".into(), json!(advice));
    }
    for (key, value) in &notification.metadata {
        metadata.insert(key.clone(), json!(value));
    }
    let mut involved = json!({
        "kind": "Application",
        "apiVersion": "setpoint.dev/v1alpha1",
        "namespace": occurrence.app.namespace,
        "name": occurrence.app.name,
    });
    if !occurrence.app.uid.is_empty() {
        involved["uid"] = json!(occurrence.app.uid);
    }
    if !occurrence.app.resource_version.is_empty() {
        involved["resourceVersion"] = json!(occurrence.app.resource_version);
    }
    let mut body = json!({
        "involvedObject": involved,
        "severity": occurrence.severity.as_str(),
        "timestamp": occurrence.timestamp,
        "message": occurrence.message,
        "reason": occurrence.reason,
        "metadata": metadata,
        "reportingController": "setpoint",
    });
    if !occurrence.changes.is_empty() {
        body["changes"] = serde_json::to_value(&occurrence.changes).unwrap_or_default();
    }
    body
}

/// `sha256=<hex HMAC-SHA256 of body with key>`, the `X-Signature` of a
/// `generic-hmac` delivery.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::EventKind;
    use crate::notify::message::build;
    use crate::notify::{AppRef, Change, Occurrence};

    fn drift() -> Notification {
        Notification {
            id: "n-1".into(),
            namespace: "team".into(),
            alert: "ops".into(),
            provider: "chat".into(),
            summary: None,
            metadata: vec![("env".into(), "prod".into())],
            occurrence: Occurrence {
                kind: EventKind::DriftCorrected,
                reason: "DriftCorrected".into(),
                severity: Severity::Info,
                message: "apps/v1 Deployment team/web: spec.replicas 5→1 (changed by kubectl)"
                    .into(),
                app: AppRef {
                    namespace: "team".into(),
                    name: "web".into(),
                    uid: "u-1".into(),
                    resource_version: "42".into(),
                },
                revision: Some("0123456789abcdef0123456789abcdef01234567".into()),
                repository: Some("github.com/acme/deploy".into()),
                changes: vec![Change {
                    object: "apps/v1 Deployment team/web".into(),
                    field: "spec.replicas".into(),
                    from: "5".into(),
                    to: "1".into(),
                    by: Some("kubectl".into()),
                }],
                timestamp: "2026-01-01T00:00:00Z".into(),
            },
        }
    }

    const LINE: &str = "apps/v1 Deployment team/web spec.replicas: 5 → 1 (changed by kubectl)";
    const LINK: &str =
        "https://github.com/acme/deploy/commit/0123456789abcdef0123456789abcdef01234567";

    #[test]
    fn slack_has_text_and_an_attachment_with_fields() {
        let n = drift();
        let body = slack(&build(&n), Some("#ops"), Some("setpoint"));
        assert_eq!(body["text"], "Drift corrected: team/web");
        assert_eq!(body["channel"], "#ops");
        assert_eq!(body["username"], "setpoint");
        let attachment = &body["attachments"][0];
        assert_eq!(attachment["color"], GOOD);
        assert_eq!(attachment["title_link"], LINK);
        assert!(attachment["text"].as_str().unwrap().contains(LINE));
        assert_eq!(attachment["mrkdwn_in"], json!(["text"]));
        let fields = attachment["fields"].as_array().unwrap();
        assert!(
            fields
                .iter()
                .any(|f| f["title"] == "Application" && f["value"] == "team/web")
        );
        assert!(
            fields
                .iter()
                .any(|f| f["title"] == "Revision" && f["value"] == format!("<{LINK}|0123456>"))
        );
        let mut failed = drift();
        failed.occurrence.severity = Severity::Error;
        failed.occurrence.changes.clear();
        failed.occurrence.message = "a <b> & c".into();
        let body = slack(&build(&failed), None, None);
        assert_eq!(body["attachments"][0]["color"], DANGER);
        assert!(
            body["attachments"][0]["text"]
                .as_str()
                .unwrap()
                .contains("a &lt;b&gt; &amp; c")
        );
        assert!(body.get("channel").is_none());
    }

    #[test]
    fn teams_gets_an_adaptive_card() {
        let body = msteams(&build(&drift()));
        assert_eq!(body["type"], "message");
        let attachment = &body["attachments"][0];
        assert_eq!(
            attachment["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        let card = &attachment["content"];
        assert_eq!(card["type"], "AdaptiveCard");
        assert_eq!(card["version"], "1.4");
        let blocks = card["body"].as_array().unwrap();
        assert_eq!(blocks[0]["text"], "Drift corrected: team/web");
        assert!(
            blocks
                .iter()
                .any(|b| b["text"].as_str().is_some_and(|t| t.contains(LINE)))
        );
        let facts = blocks.iter().find(|b| b["type"] == "FactSet").unwrap();
        assert!(
            facts["facts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["title"] == "Revision")
        );
        assert_eq!(card["actions"][0]["url"], LINK);
    }

    #[test]
    fn discord_gets_content_and_an_embed_within_limits() {
        let mut n = drift();
        n.occurrence.changes = (0..200)
            .map(|i| Change {
                field: format!("spec.field{i}"),
                ..n.occurrence.changes[0].clone()
            })
            .collect();
        let body = discord(&build(&n), Some("bot"), "2026-01-01T00:00:00Z");
        assert_eq!(body["content"], "Drift corrected: team/web");
        assert_eq!(body["username"], "bot");
        let embed = &body["embeds"][0];
        assert_eq!(embed["url"], LINK);
        assert_eq!(embed["color"], 0x2eb886);
        assert!(embed["description"].as_str().unwrap().chars().count() <= 4096);
        assert!(
            embed["description"]
                .as_str()
                .unwrap()
                .contains("spec.field0: 5 → 1")
        );
        assert_eq!(embed["timestamp"], "2026-01-01T00:00:00Z");
    }

    #[test]
    fn generic_is_fluxs_event_shape() {
        let n = drift();
        let body = generic(&n, &build(&n));
        assert_eq!(
            body["involvedObject"],
            json!({"kind": "Application", "apiVersion": "setpoint.dev/v1alpha1", "namespace": "team", "name": "web", "uid": "u-1", "resourceVersion": "42"})
        );
        assert_eq!(body["severity"], "info");
        assert_eq!(body["reason"], "DriftCorrected");
        assert_eq!(body["timestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(
            body["metadata"]["revision"],
            "0123456789abcdef0123456789abcdef01234567"
        );
        assert_eq!(body["metadata"]["kind"], "driftCorrected");
        assert_eq!(body["metadata"]["env"], "prod");
        assert!(
            body["metadata"]
                .as_object()
                .unwrap()
                .values()
                .all(Value::is_string)
        );
        assert_eq!(body["changes"][0]["field"], "spec.replicas");
        assert_eq!(body["changes"][0]["by"], "kubectl");
    }

    #[test]
    fn signatures_are_hex_hmac_sha256() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
