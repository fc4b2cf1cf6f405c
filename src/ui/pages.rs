//! The dashboard's HTML, rendered on the server from the views (`view.rs`):
//! every page works without JavaScript; `assets/live.js` only swaps in a
//! fresh copy of `<main>` when the page's event stream says something
//! changed.

use std::fmt::Write as _;

use super::view::{AppView, ListQuery, ListView, NO_SET, PinView, encode_component};
use super::{Delivery, QueueState};

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// The frame every page shares; `live` is the page's event stream.
fn layout(title: &str, viewer: Option<&str>, live: Option<&str>, main: &str) -> String {
    let nav = match viewer {
        Some(viewer) => format!(
            r#"<nav><a href="/">Applications</a> <a href="/activity">Activity</a>
<span class="viewer">{}</span>
<form method="post" action="/logout" class="inline"><button type="submit">Log out</button></form></nav>"#,
            escape(viewer)
        ),
        None => String::new(),
    };
    let live_attr = live
        .map(|url| format!(r#" data-live="{}""#, escape(url)))
        .unwrap_or_default();
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · Setpoint</title>
<link rel="stylesheet" href="/assets/style.css">
<script src="/assets/live.js" defer></script>
</head><body>
<header><a class="brand" href="/">Setpoint</a>{nav}</header>
<main id="main"{live_attr}>
{main}
</main>
</body></html>
"#,
        title = escape(title),
    )
}

fn badge(value: &str) -> String {
    format!(
        r#"<span class="badge {}">{}</span>"#,
        escape(&value.to_ascii_lowercase()),
        escape(value)
    )
}

/// A filter's select: "any", the `extra` (value, label) choices, then
/// `options`.
fn select(name: &str, current: Option<&str>, extra: &[(&str, &str)], options: &[String]) -> String {
    let mut html =
        format!(r#"<select name="{name}" id="filter-{name}"><option value="">any</option>"#);
    let choices = extra
        .iter()
        .copied()
        .chain(options.iter().map(|o| (o.as_str(), o.as_str())));
    for (value, label) in choices {
        let selected = if current == Some(value) {
            " selected"
        } else {
            ""
        };
        let _ = write!(
            html,
            r#"<option value="{}"{selected}>{}</option>"#,
            escape(value),
            escape(label)
        );
    }
    html.push_str("</select>");
    html
}

/// The list of Applications.
pub fn list(view: &ListView, query: &ListQuery, viewer: &str) -> String {
    let mut main = String::new();
    let _ = write!(
        main,
        r#"<h1>Applications</h1><section class="counts"><span class="count total">{} Applications</span>"#,
        view.counts.total
    );
    for (sync, count) in &view.counts.sync {
        let _ = write!(
            main,
            r#" <span class="count">{} {count}</span>"#,
            badge(sync)
        );
    }
    main.push_str(" ·");
    for (health, count) in &view.counts.health {
        let _ = write!(
            main,
            r#" <span class="count">{} {count}</span>"#,
            badge(health)
        );
    }
    main.push_str("</section>");
    let syncs: Vec<String> = ["Synced", "OutOfSync", "Unknown"]
        .map(String::from)
        .to_vec();
    let healths: Vec<String> = [
        "Healthy",
        "Suspended",
        "Progressing",
        "Unknown",
        "Missing",
        "Degraded",
    ]
    .map(String::from)
    .to_vec();
    let _ = write!(
        main,
        r#"<form method="get" action="/" class="filters">
<label>Namespace {}</label> <label>Cluster {}</label> <label>ApplicationSet {}</label> <label>Sync {}</label> <label>Health {}</label>
<button type="submit">Filter</button></form>"#,
        select(
            "namespace",
            query.namespace.as_deref(),
            &[],
            &view.namespaces
        ),
        select("cluster", query.cluster.as_deref(), &[], &view.clusters),
        select(
            "appset",
            query.appset.as_deref(),
            &[(NO_SET, "no set")],
            &view.application_sets
        ),
        select("sync", query.sync.as_deref(), &[], &syncs),
        select("health", query.health.as_deref(), &[], &healths),
    );
    main.push_str(
        r#"<table id="applications"><thead><tr><th>Namespace</th><th>Name</th><th>Cluster</th><th>Set</th><th>Sync</th><th>Health</th><th>Revision</th><th>Last sync</th><th>Message</th></tr></thead><tbody>"#,
    );
    for row in &view.items {
        let revision = match (&row.revision, &row.revision_url) {
            (Some(rev), Some(url)) => format!(
                r#"<a href="{}"><code>{}</code></a>"#,
                escape(url),
                escape(rev)
            ),
            (Some(rev), None) => format!("<code>{}</code>", escape(rev)),
            _ => String::new(),
        };
        let set = row
            .application_set
            .as_deref()
            .map(|set| {
                format!(
                    r#"<a href="/?namespace={}&amp;appset={}">{}</a>"#,
                    encode_component(&row.namespace),
                    encode_component(set),
                    escape(set)
                )
            })
            .unwrap_or_default();
        let _ = write!(
            main,
            r#"<tr data-app="{ns}/{name}"><td>{ns}</td><td><a href="/applications/{ens}/{ename}">{name}</a></td><td class="cluster">{cluster}</td><td class="set">{set}</td><td class="sync">{sync}{marks}</td><td class="health">{health}</td><td>{revision}</td><td>{last}</td><td class="message">{message}</td></tr>"#,
            ns = escape(&row.namespace),
            name = escape(&row.name),
            cluster = escape(&row.cluster),
            ens = encode_component(&row.namespace),
            ename = encode_component(&row.name),
            sync = badge(&row.sync),
            marks = held(row.suspended, row.pinned.as_deref()),
            health = badge(&row.health),
            last = escape(row.last_sync.as_deref().unwrap_or("")),
            message = escape(&row.message),
        );
    }
    if view.items.is_empty() {
        main.push_str(r#"<tr><td colspan="9" class="empty">No Application to show.</td></tr>"#);
    }
    main.push_str("</tbody></table>");
    let _ = write!(
        main,
        r#"<nav class="pages">{} of {} matching · page {} of {}"#,
        view.items.len(),
        view.matching,
        view.page,
        view.pages
    );
    if view.page > 1 {
        let _ = write!(
            main,
            r#" <a rel="prev" href="/?{}">← previous</a>"#,
            escape(&query.on_page(view.page - 1))
        );
    }
    if view.page < view.pages {
        let _ = write!(
            main,
            r#" <a rel="next" href="/?{}">next →</a>"#,
            escape(&query.on_page(view.page + 1))
        );
    }
    main.push_str("</nav>");
    layout("Applications", Some(viewer), Some("/api/v1/live"), &main)
}

/// One Application.
pub fn app(view: &AppView, viewer: &str, csrf: &str, notice: Option<&str>) -> String {
    let mut main = String::new();
    let (ns, name) = (escape(&view.namespace), escape(&view.name));
    let base = format!(
        "/applications/{}/{}",
        encode_component(&view.namespace),
        encode_component(&view.name)
    );
    let _ = write!(
        main,
        r#"<h1><span class="muted">{ns}/</span>{name} <span id="app-sync">{}</span> <span id="app-health">{}</span></h1>"#,
        badge(&view.sync),
        badge(&view.health)
    );
    if let Some(set) = &view.application_set {
        let _ = write!(
            main,
            r#"<p id="app-set">Generated by ApplicationSet <a href="/?namespace={}&amp;appset={}">{}</a></p>"#,
            encode_component(&view.namespace),
            encode_component(set),
            escape(set)
        );
    }
    if let Some(notice) = notice {
        let _ = write!(
            main,
            r#"<p class="notice" role="status">{}</p>"#,
            escape(notice)
        );
    }
    if view.can_patch {
        main.push_str(&actions(view, &base, csrf));
    }
    main.push_str(&operation(view));
    let revision = match (&view.revision, &view.revision_url) {
        (Some(rev), Some(url)) => format!(
            r#"<a href="{}"><code>{}</code></a>"#,
            escape(url),
            escape(rev)
        ),
        (Some(rev), None) => format!("<code>{}</code>", escape(rev)),
        _ => "—".into(),
    };
    let policy = if view.automated {
        format!(
            "automated (prune: {}, selfHeal: {})",
            view.prune, view.self_heal
        )
    } else {
        "manual".to_string()
    };
    let _ = write!(
        main,
        r#"<section><h2>Source and policy</h2><dl>
<dt>Repository</dt><dd><code>{}</code></dd>
<dt>Target revision</dt><dd>{}</dd>
<dt>Path</dt><dd><code>{}</code></dd>
<dt>Revision</dt><dd>{revision}</dd>
<dt>Sync policy</dt><dd>{}{}{}</dd>
<dt>Health</dt><dd>{}</dd>
</dl></section>"#,
        escape(&view.repo_url),
        escape(
            view.target_revision
                .as_deref()
                .unwrap_or("(default branch)")
        ),
        escape(view.path.as_deref().unwrap_or("/")),
        escape(&policy),
        if view.allow_empty { ", allowEmpty" } else { "" },
        if view.suspend { ", suspended" } else { "" },
        escape(view.health_message.as_deref().unwrap_or("")),
    );
    main.push_str(r#"<section><h2>Conditions</h2><table id="conditions"><thead><tr><th>Type</th><th>Status</th><th>Reason</th><th>Message</th><th>Since</th></tr></thead><tbody>"#);
    for condition in &view.conditions {
        let _ = write!(
            main,
            "<tr><td>{:?}</td><td>{:?}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            condition.type_,
            condition.status,
            escape(&condition.reason),
            escape(&condition.message),
            escape(&condition.last_transition_time)
        );
    }
    main.push_str("</tbody></table></section>");
    main.push_str(r#"<section><h2>Objects</h2><ul class="tree" id="objects">"#);
    for group in &view.objects {
        let _ = write!(
            main,
            r#"<li><strong>{}</strong> ({})<ul>"#,
            escape(&group.kind),
            group.objects.len()
        );
        for object in &group.objects {
            let place = match &object.namespace {
                Some(ns) => format!("{ns}/{}", object.name),
                None => object.name.clone(),
            };
            let _ = write!(
                main,
                r#"<li>{} {} {} <span class="message">{}</span></li>"#,
                escape(&place),
                badge(&format!("{:?}", object.sync)),
                badge(&format!("{:?}", object.health)),
                escape(object.message.as_deref().unwrap_or(""))
            );
        }
        main.push_str("</ul></li>");
    }
    main.push_str("</ul></section>");
    main.push_str(r#"<section><h2>Drift history</h2><table id="drift"><thead><tr><th>When</th><th>Object</th><th>Field</th><th>Drifted value → set back to</th><th>Changed by</th></tr></thead><tbody>"#);
    for record in &view.drift {
        if record.fields.is_empty() {
            let _ = write!(
                main,
                r#"<tr><td>{}</td><td>{}</td><td colspan="3">{}</td></tr>"#,
                escape(&record.time),
                escape(&record.object),
                escape(&record.note)
            );
        }
        for field in &record.fields {
            let _ = write!(
                main,
                r#"<tr class="drift"><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code> → <code>{}</code></td><td class="manager">{}</td></tr>"#,
                escape(&record.time),
                escape(&record.object),
                escape(&field.field),
                escape(&field.old),
                escape(&field.new),
                escape(&field.changed_by)
            );
        }
    }
    if view.drift.is_empty() {
        main.push_str(r#"<tr><td colspan="5" class="empty">No drift corrected since this process started.</td></tr>"#);
    }
    main.push_str("</tbody></table></section>");
    main.push_str(&operations(view, &base, csrf));
    main.push_str(r#"<section><h2>Events</h2><table id="events"><thead><tr><th>When</th><th>Type</th><th>Reason</th><th>Note</th></tr></thead><tbody>"#);
    for event in &view.events {
        let _ = write!(
            main,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&event.time),
            escape(&event.type_),
            escape(&event.reason),
            escape(&event.note)
        );
    }
    main.push_str("</tbody></table></section>");
    let live = format!(
        "/api/v1/live?namespace={}&name={}",
        encode_component(&view.namespace),
        encode_component(&view.name)
    );
    layout(
        &format!("{}/{}", view.namespace, view.name),
        Some(viewer),
        Some(&live),
        &main,
    )
}

/// A list row's marks: suspended, pinned to a revision.
fn held(suspended: bool, pinned: Option<&str>) -> String {
    let mut marks = String::new();
    if suspended {
        marks.push_str(r#" <span class="badge held">suspended</span>"#);
    }
    if let Some(revision) = pinned {
        let _ = write!(
            marks,
            r#" <span class="badge held">pinned {}</span>"#,
            escape(revision)
        );
    }
    marks
}

/// One button of the actions, a form of its own (with the CSRF token, and
/// Rollback's revision).
fn button(
    base: &str,
    csrf: &str,
    action: &str,
    id: &str,
    label: &str,
    revision: Option<&str>,
) -> String {
    let revision = revision
        .map(|r| {
            format!(
                r#"<input type="hidden" name="revision" value="{}">"#,
                escape(r)
            )
        })
        .unwrap_or_default();
    format!(
        r#"<form method="post" action="{base}/{action}" class="inline"><input type="hidden" name="csrf" value="{}">{revision}<button type="submit" id="{id}">{}</button></form>"#,
        escape(csrf),
        escape(label)
    )
}

/// Sync, Refresh, Rollback (to the revision it would pick, named on the
/// button, so the one pressed is the one pinned), Suspend or Resume.
fn actions(view: &AppView, base: &str, csrf: &str) -> String {
    let mut html = String::from(r#"<div class="actions">"#);
    html.push_str(&button(base, csrf, "sync", "sync", "Sync", None));
    html.push_str(&button(base, csrf, "refresh", "refresh", "Refresh", None));
    match (&view.rollback.history_id, &view.rollback.revision) {
        (Some(id), Some(revision)) => html.push_str(&button(
            base,
            csrf,
            "rollback",
            "rollback",
            &format!("Roll back to #{id} ({})", short(revision)),
            Some(&id.to_string()),
        )),
        _ => {
            let why = view.rollback.refused.as_deref().unwrap_or("");
            let _ = write!(
                html,
                r#"<button type="button" id="rollback" disabled title="{}">Roll back</button>"#,
                escape(why)
            );
        }
    }
    if !view.suspend {
        html.push_str(&button(base, csrf, "suspend", "suspend", "Suspend", None));
    }
    if view.suspend || view.pin.is_some() {
        html.push_str(&button(base, csrf, "resume", "resume", "Resume", None));
    }
    html.push_str("</div>");
    html
}

fn short(revision: &str) -> String {
    revision.chars().take(7).collect()
}

fn revision_code(revision: &str, url: Option<&str>) -> String {
    match url {
        Some(url) => format!(
            r#"<a href="{}"><code>{}</code></a>"#,
            escape(url),
            escape(&short(revision))
        ),
        None => format!("<code>{}</code>", escape(&short(revision))),
    }
}

/// Pinned: the revision, who and when, a newer commit not applied.
pub fn pin_line(pin: &PinView) -> String {
    let mut line = format!(
        "Pinned to {}",
        revision_code(&pin.revision, pin.revision_url.as_deref())
    );
    if let Some(id) = pin.history_id {
        let _ = write!(line, " (history #{id})");
    }
    if let Some(by) = &pin.by {
        let _ = write!(line, " by {}", escape(by));
    }
    if let Some(at) = &pin.at {
        let _ = write!(line, " at {}", escape(at));
    }
    if !pin.followed {
        line.push_str(" · not applied yet");
    }
    if let Some(newer) = &pin.newer_revision {
        let _ = write!(
            line,
            " · newer commit <code>{}</code> not applied",
            escape(&short(newer))
        );
    }
    line.push_str(" · Resume follows the target revision again");
    line
}

/// Whether the Application is held back (suspended, a sync window) or
/// pinned, and until when; nothing when it is neither.
fn operation(view: &AppView) -> String {
    let mut lines = Vec::new();
    if view.suspend {
        let message = view
            .hold
            .as_ref()
            .filter(|h| h.reason == crate::operate::SUSPENDED)
            .map(|h| h.message.clone())
            .unwrap_or_else(|| "nothing is applied, pruned or corrected until Resume".into());
        lines.push(format!(
            r#"<p id="app-suspended" class="hold"><strong>Suspended</strong>: {}</p>"#,
            escape(&message)
        ));
    }
    if let Some(hold) = view
        .hold
        .as_ref()
        .filter(|h| h.reason != crate::operate::SUSPENDED)
    {
        let until = hold
            .until
            .as_deref()
            .map(|u| format!(" (until {})", escape(u)))
            .unwrap_or_default();
        lines.push(format!(
            r#"<p id="app-hold" class="hold"><strong>Held</strong> ({}): {}{until}</p>"#,
            escape(&hold.reason),
            escape(&hold.message)
        ));
    }
    if let Some(pin) = &view.pin {
        lines.push(format!(
            r#"<p id="app-pinned" class="hold">{}</p>"#,
            pin_line(pin)
        ));
    }
    lines.concat()
}

/// The history (`status.history`): id, revision, whether it became
/// healthy, who asked; with patch rights, a Roll back button on each entry
/// of another revision than the one applied.
fn operations(view: &AppView, base: &str, csrf: &str) -> String {
    let mut html = String::from(
        r#"<section><h2>Last operations</h2><table id="operations"><thead><tr><th>#</th><th>Finished</th><th>Revision</th><th>Healthy</th><th>Initiated by</th><th>Applied</th><th>Pruned</th><th>Unchanged</th><th>Duration</th>"#,
    );
    if view.can_patch {
        html.push_str("<th></th>");
    }
    html.push_str("</tr></thead><tbody>");
    for op in &view.operations {
        let _ = write!(
            html,
            r#"<tr data-history="{}"><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{} ms</td>"#,
            op.id,
            op.id,
            escape(&op.finished_at),
            escape(&short(&op.revision)),
            if op.healthy { "yes" } else { "" },
            escape(op.initiated_by.as_deref().unwrap_or("")),
            op.applied,
            op.pruned,
            op.unchanged,
            op.duration_ms
        );
        if view.can_patch {
            html.push_str("<td>");
            if view.revision.as_deref() != Some(op.revision.as_str()) {
                html.push_str(&button(
                    base,
                    csrf,
                    "rollback",
                    &format!("rollback-{}", op.id),
                    "Roll back",
                    Some(&op.id.to_string()),
                ));
            }
            html.push_str("</td>");
        }
        html.push_str("</tr>");
    }
    if view.operations.is_empty() {
        let columns = if view.can_patch { 10 } else { 9 };
        let _ = write!(
            html,
            r#"<tr><td colspan="{columns}" class="empty">No operation recorded yet.</td></tr>"#
        );
    }
    html.push_str("</tbody></table></section>");
    html
}

/// The last webhook deliveries and the queue.
pub fn activity(deliveries: &[Delivery], queue: &QueueState, viewer: &str) -> String {
    let mut main = String::from("<h1>Activity</h1>");
    let _ = write!(
        main,
        r#"<section><h2>Queue</h2><dl><dt>Kind</dt><dd>{}</dd><dt>Reconciles at once in this process</dt><dd>{}</dd></dl></section>"#,
        escape(&queue.kind),
        queue.concurrency,
    );
    main.push_str(r#"<section><h2>Webhook deliveries</h2><table id="deliveries"><thead><tr><th>Received</th><th>Provider</th><th>Repository</th><th>Commit</th><th>Delivery</th><th>Outcome</th><th>Applications</th></tr></thead><tbody>"#);
    for delivery in deliveries {
        let _ = write!(
            main,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            escape(&delivery.received_at),
            escape(&delivery.provider),
            escape(&delivery.repository),
            escape(&delivery.commit.chars().take(7).collect::<String>()),
            escape(&delivery.delivery),
            escape(&delivery.outcome),
            escape(&delivery.applications.join(", "))
        );
    }
    if deliveries.is_empty() {
        main.push_str(r#"<tr><td colspan="7" class="empty">No delivery since this process started (or this process runs no webhook).</td></tr>"#);
    }
    main.push_str("</tbody></table></section>");
    layout(
        "Activity",
        Some(viewer),
        Some("/api/v1/live?activity=1"),
        &main,
    )
}

/// The login form; `error` says why the last token was refused.
pub fn login(error: Option<&str>) -> String {
    let error = error
        .map(|e| format!(r#"<p class="error" role="alert">{}</p>"#, escape(e)))
        .unwrap_or_default();
    let main = format!(
        r#"<h1>Log in</h1>{error}
<p>Paste a Kubernetes bearer token, e.g. from <code>kubectl create token NAME -n NAMESPACE</code>.</p>
<form method="post" action="/login"><label for="token">Token</label>
<input type="password" id="token" name="token" autocomplete="off" required>
<button type="submit" id="login">Log in</button></form>"#
    );
    layout("Log in", None, None, &main)
}

/// A short page for an error (401 links to the login form).
pub fn error(status: u16, message: &str) -> String {
    let main = format!(
        r#"<h1>{status}</h1><p class="error">{}</p>{}"#,
        escape(message),
        if status == 401 {
            r#"<p><a href="/login">Log in</a></p>"#
        } else {
            ""
        }
    );
    layout("Error", None, None, &main)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ui::view::{Counts, Row};

    fn row(name: &str, set: Option<&str>) -> Row {
        Row {
            namespace: "team".into(),
            name: name.into(),
            cluster: "in-cluster".into(),
            application_set: set.map(str::to_string),
            sync: "Synced".into(),
            health: "Healthy".into(),
            revision: None,
            revision_url: None,
            last_sync: None,
            message: String::new(),
            suspended: false,
            pinned: None,
        }
    }

    #[test]
    fn the_list_has_a_set_column_and_filter_kept_across_pages() {
        let view = ListView {
            counts: Counts::default(),
            matching: 120,
            page: 1,
            per_page: 50,
            pages: 3,
            namespaces: vec!["team".into()],
            clusters: vec!["in-cluster".into()],
            application_sets: vec!["api".into(), "web".into()],
            items: vec![row("one", Some("web")), row("two", None)],
        };
        let query = ListQuery {
            appset: Some("web".into()),
            ..Default::default()
        };
        let page = list(&view, &query, "me");
        assert!(page.contains("<th>Set</th>"), "{page}");
        assert!(
            page.contains(
                r#"<td class="set"><a href="/?namespace=team&amp;appset=web">web</a></td>"#
            ),
            "{page}"
        );
        assert!(page.contains(r#"<td class="set"></td>"#), "{page}");
        assert!(page.contains(r#"<select name="appset" id="filter-appset"><option value="">any</option><option value="-">no set</option><option value="api">api</option><option value="web" selected>web</option></select>"#), "{page}");
        assert!(page.contains(r#"href="/?appset=web&amp;page=2""#), "{page}");
    }

    /// An Application after a bad revision 2, with 1 the healthy one.
    fn operated(can_patch: bool, edit: impl FnOnce(&mut crate::api::Application)) -> AppView {
        use crate::api::{Application, ApplicationSpec, ApplicationStatus, OperationSummary};
        let mut app = Application::new("web", ApplicationSpec::default());
        app.metadata.namespace = Some("team".into());
        app.spec.source.repo_url = "https://github.com/org/repo.git".into();
        let mut status = ApplicationStatus::default();
        status.sync.revision = Some("b".repeat(40));
        status.history = vec![
            OperationSummary {
                id: 2,
                revision: "b".repeat(40),
                initiated_by: Some("<script>".into()),
                ..Default::default()
            },
            OperationSummary {
                id: 1,
                revision: "a".repeat(40),
                healthy: true,
                ..Default::default()
            },
        ];
        app.status = Some(status);
        edit(&mut app);
        crate::ui::view::app(&app, vec![], vec![], can_patch)
    }

    #[test]
    fn the_buttons_are_for_those_who_may_patch_and_rollback_names_its_revision() {
        let page = app(&operated(true, |_| {}), "me", "tok", None);
        assert!(
            page.contains(r#"action="/applications/team/web/rollback""#),
            "{page}"
        );
        assert!(
            page.contains(r#"<input type="hidden" name="csrf" value="tok"><input type="hidden" name="revision" value="1"><button type="submit" id="rollback">Roll back to #1 (aaaaaaa)</button>"#),
            "{page}"
        );
        assert!(page.contains(r#"id="suspend""#) && !page.contains(r#"id="resume""#));
        // One Roll back per entry of another revision than the current one.
        assert!(page.contains(r#"id="rollback-1""#) && !page.contains(r#"id="rollback-2""#));
        assert!(
            page.contains("<th>Healthy</th><th>Initiated by</th>"),
            "{page}"
        );
        assert!(page.contains("<td>&lt;script&gt;</td>") && !page.contains("<td><script>"));
        let read_only = app(&operated(false, |_| {}), "me", "tok", None);
        for id in ["rollback", "suspend", "resume", "sync"] {
            assert!(
                !read_only.contains(&format!(r#"id="{id}""#)),
                "{id}: {read_only}"
            );
        }
        assert!(!read_only.contains("/rollback\""), "{read_only}");
        // No healthy entry to go back to: the button says why, disabled.
        let none = app(
            &operated(true, |a| a.status.as_mut().unwrap().history.truncate(1)),
            "me",
            "tok",
            None,
        );
        assert!(
            none.contains(
                r#"<button type="button" id="rollback" disabled title="no earlier revision"#
            ),
            "{none}"
        );
    }

    #[test]
    fn suspended_and_pinned_say_so_with_the_hold_and_the_newer_commit() {
        let view = operated(true, |a| {
            a.spec.suspend = true;
            a.spec.pin = Some(crate::api::Pin {
                revision: "a".repeat(40),
                by: Some("alice".into()),
                at: Some("2026-12-07T12:00:00Z".into()),
                history_id: Some(1),
            });
            let status = a.status.as_mut().unwrap();
            status.hold = Some(crate::api::HoldStatus {
                reason: "Suspended".into(),
                message: "spec.suspend is true: nothing is applied".into(),
                until: None,
            });
            status.pinned = Some(crate::api::PinnedStatus {
                revision: "a".repeat(40),
                newer_revision: Some("c".repeat(40)),
                ..Default::default()
            });
        });
        let page = app(&view, "me", "tok", None);
        assert!(
            page.contains(r#"<p id="app-suspended" class="hold"><strong>Suspended</strong>: spec.suspend is true: nothing is applied</p>"#),
            "{page}"
        );
        let line = pin_line(view.pin.as_ref().unwrap());
        assert_eq!(
            line,
            format!(
                r#"Pinned to <a href="https://github.com/org/repo/commit/{a}"><code>aaaaaaa</code></a> (history #1) by alice at 2026-12-07T12:00:00Z · newer commit <code>ccccccc</code> not applied · Resume follows the target revision again"#,
                a = "a".repeat(40)
            )
        );
        assert!(page.contains(&line));
        assert!(page.contains(r#"id="resume""#) && !page.contains(r#"id="suspend""#));

        // A closed window: the hold's reason, message and until.
        let window = operated(true, |a| {
            a.status.as_mut().unwrap().hold = Some(crate::api::HoldStatus {
                reason: "SyncWindow".into(),
                message: "syncs wait: inside the deny window".into(),
                until: Some("2026-12-07T13:00:00Z".into()),
            });
        });
        let page = app(&window, "me", "tok", None);
        assert!(
            page.contains(r#"<p id="app-hold" class="hold"><strong>Held</strong> (SyncWindow): syncs wait: inside the deny window (until 2026-12-07T13:00:00Z)</p>"#),
            "{page}"
        );
        assert!(!page.contains("app-suspended") && !page.contains("app-pinned"));
    }

    #[test]
    fn list_rows_mark_suspended_and_pinned() {
        assert_eq!(held(false, None), "");
        assert_eq!(
            held(true, Some("abc1234")),
            r#" <span class="badge held">suspended</span> <span class="badge held">pinned abc1234</span>"#
        );
    }

    #[test]
    fn text_from_the_cluster_is_escaped() {
        assert_eq!(
            escape(r#"<script>alert("x")</script> & 'y'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;y&#39;"
        );
        let page = error(403, "<b>no</b>");
        assert!(page.contains("&lt;b&gt;no&lt;/b&gt;"));
        assert!(!page.contains("<b>no</b>"));
    }
}
