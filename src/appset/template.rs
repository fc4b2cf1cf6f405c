//! Template: one parameter set fills in the ApplicationSet's Application
//! template, giving one desired Application (its name, labels, annotations
//! and spec) for the plan.
//!
//! The syntax is Argo CD's default one (fasttemplate): `{{ key }}` is
//! replaced by the value of the parameter named `key`, whitespace inside the
//! braces trimmed, nothing evaluated. It is written by hand rather than
//! with a template engine because keys such as `path[0]` or
//! `metadata.labels.app.kubernetes.io/name` are parameter names in Argo
//! CD's syntax but not valid Jinja or Go-template expressions (an index, a
//! division, a subtraction): an engine would change what an Argo CD user's
//! template means, or refuse it. Unlike Argo CD, an unknown parameter is an
//! error, never left as written or replaced by nothing: an Application
//! named `app-` or deploying path `{{ path }}` is a typo shipped to a fleet.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::params::Params;
use crate::api::{ApplicationSpec, Template};

/// How many parameter names an unknown-parameter error lists.
const LISTED_PARAMETERS: usize = 20;

/// One Application as the template and a parameter set make it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub spec: ApplicationSpec,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TemplateError {
    #[error("unknown parameter {parameter:?} in {field} (the generator yields: {available})")]
    UnknownParameter {
        parameter: String,
        field: String,
        /// The parameter names the set has, closest to `parameter` first
        /// when there are too many to list.
        available: String,
    },
    #[error("unterminated {{{{ in {field} at byte {offset}: every {{{{ needs a }}}}")]
    Unterminated { field: String, offset: usize },
    #[error("two keys of {field} both render to {key:?}")]
    DuplicateKey { field: String, key: String },
    #[error("the template renders Application {name:?}, not a valid spec: {reason}")]
    InvalidSpec { name: String, reason: String },
    #[error(
        "the template renders Application name {name:?}, not a Kubernetes object name: {reason}"
    )]
    InvalidName { name: String, reason: String },
    #[error("the template renders label {key:?}={value:?} on Application {name:?}: {reason}")]
    InvalidLabel {
        name: String,
        key: String,
        value: String,
        reason: String,
    },
    #[error("the template renders annotation {key:?} on Application {name:?}: {reason}")]
    InvalidAnnotation {
        name: String,
        key: String,
        reason: String,
    },
}

/// Every `{{ key }}` of `text` replaced by its parameter's value, in one
/// pass (a value holding `{{` is not expanded again).
pub fn substitute(text: &str, params: &Params) -> Result<String, TemplateError> {
    substitute_in(text, params, "the text")
}

fn substitute_in(text: &str, params: &Params, field: &str) -> Result<String, TemplateError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            return Err(TemplateError::Unterminated {
                field: field.to_owned(),
                offset: text.len() - rest.len() + start,
            });
        };
        let key = after[..end].trim();
        match params.get(key) {
            Some(value) => out.push_str(value),
            None => {
                return Err(TemplateError::UnknownParameter {
                    parameter: key.to_owned(),
                    field: field.to_owned(),
                    available: available(key, params),
                });
            }
        }
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The names a typo was probably meant to be: all of them when few, else
/// those sharing the longest start with it, listed in order.
fn available(wanted: &str, params: &Params) -> String {
    if params.is_empty() {
        return "no parameters".to_owned();
    }
    let mut names: Vec<&str> = params.keys().map(String::as_str).collect();
    let more = names.len().saturating_sub(LISTED_PARAMETERS);
    if more > 0 {
        let shared = |name: &str| {
            name.bytes()
                .zip(wanted.bytes())
                .take_while(|(a, b)| a == b)
                .count()
        };
        names.sort_by_key(|name| std::cmp::Reverse(shared(name)));
        names.truncate(LISTED_PARAMETERS);
        names.sort_unstable();
    }
    let mut listed = names.join(", ");
    if more > 0 {
        listed.push_str(&format!(" and {more} more"));
    }
    listed
}

/// The Application that `params` makes of `template`: every string of the
/// metadata and of the spec (object keys too) substituted, the spec read as
/// an Application spec, and the name and labels checked as the API server
/// will, so a bad parameter value is reported against the ApplicationSet
/// rather than as a failed create.
pub fn render(template: &Template, params: &Params) -> Result<Rendered, TemplateError> {
    let name = substitute_in(&template.metadata.name, params, "metadata.name")?;
    let labels = render_map(&template.metadata.labels, params, "metadata.labels")?;
    let annotations = render_map(
        &template.metadata.annotations,
        params,
        "metadata.annotations",
    )?;
    let spec = render_value(&template.spec, params, "spec")?;

    check_object_name(&name).map_err(|reason| TemplateError::InvalidName {
        name: name.clone(),
        reason,
    })?;
    for (key, value) in &labels {
        check_label_key(key)
            .and_then(|()| check_label_value(value))
            .map_err(|reason| TemplateError::InvalidLabel {
                name: name.clone(),
                key: key.clone(),
                value: value.clone(),
                reason,
            })?;
    }
    for key in annotations.keys() {
        check_label_key(key).map_err(|reason| TemplateError::InvalidAnnotation {
            name: name.clone(),
            key: key.clone(),
            reason,
        })?;
    }
    let spec: ApplicationSpec =
        serde_json::from_value(spec).map_err(|e| TemplateError::InvalidSpec {
            name: name.clone(),
            reason: e.to_string(),
        })?;
    Ok(Rendered {
        name,
        labels,
        annotations,
        spec,
    })
}

fn render_map(
    map: &BTreeMap<String, String>,
    params: &Params,
    field: &str,
) -> Result<BTreeMap<String, String>, TemplateError> {
    let mut rendered = BTreeMap::new();
    for (key, value) in map {
        let at = format!("{field}[{key}]");
        let new_key = substitute_in(key, params, &at)?;
        let new_value = substitute_in(value, params, &at)?;
        if rendered.insert(new_key.clone(), new_value).is_some() {
            return Err(TemplateError::DuplicateKey {
                field: field.to_owned(),
                key: new_key,
            });
        }
    }
    Ok(rendered)
}

fn render_value(value: &Value, params: &Params, field: &str) -> Result<Value, TemplateError> {
    Ok(match value {
        Value::String(text) => Value::String(substitute_in(text, params, field)?),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(index, item)| render_value(item, params, &format!("{field}[{index}]")))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(object) => {
            let mut rendered = Map::new();
            for (key, item) in object {
                let at = format!("{field}.{key}");
                let new_key = substitute_in(key, params, &at)?;
                let new_item = render_value(item, params, &at)?;
                if rendered.insert(new_key.clone(), new_item).is_some() {
                    return Err(TemplateError::DuplicateKey {
                        field: field.to_owned(),
                        key: new_key,
                    });
                }
            }
            Value::Object(rendered)
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => value.clone(),
    })
}

/// A DNS-1123 subdomain, what Kubernetes requires of most object names.
fn check_object_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".to_owned());
    }
    if name.len() > 253 {
        return Err(format!("it is {} characters long, at most 253", name.len()));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-' | '.'))
    {
        return Err(format!(
            "{c:?} is not allowed (lowercase letters, digits, '-' and '.' only)"
        ));
    }
    if !alphanumeric_ends(name) {
        return Err("it must start and end with a letter or a digit".to_owned());
    }
    Ok(())
}

/// A label (or annotation) key: an optional DNS subdomain prefix and `/`,
/// then a name of at most 63 characters.
fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        check_object_name(prefix).map_err(|reason| format!("its prefix {prefix:?}: {reason}"))?;
    }
    if name.is_empty() {
        return Err("the key's name is empty".to_owned());
    }
    check_label_value(name).map_err(|reason| format!("the key's name {name:?}: {reason}"))
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_` and `.`,
/// starting and ending with a letter or a digit.
fn check_label_value(value: &str) -> Result<(), String> {
    if value.len() > 63 {
        return Err(format!("{} characters long, at most 63", value.len()));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(format!(
            "{c:?} is not allowed (letters, digits, '-', '_' and '.' only)"
        ));
    }
    if !value.is_empty() && !alphanumeric_ends(value) {
        return Err("it must start and end with a letter or a digit".to_owned());
    }
    Ok(())
}

fn alphanumeric_ends(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::TemplateMetadata;
    use serde_json::json;

    fn params(pairs: &[(&str, &str)]) -> Params {
        pairs
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect()
    }

    fn template(name: &str, spec: Value) -> Template {
        Template {
            metadata: TemplateMetadata {
                name: name.to_owned(),
                ..Default::default()
            },
            spec,
        }
    }

    fn spec(path: &str) -> Value {
        json!({"source": {"repoURL": "https://git.example.com/org/apps.git", "path": path}})
    }

    #[test]
    fn keys_are_replaced_with_or_without_spaces() {
        let p = params(&[("path.basename", "web"), ("path[0]", "apps")]);
        assert_eq!(
            substitute("{{path.basename}}-{{ path.basename }}-{{  path[0]\t}}", &p).unwrap(),
            "web-web-apps"
        );
        assert_eq!(
            substitute("no braces } here", &p).unwrap(),
            "no braces } here"
        );
    }

    #[test]
    fn label_like_keys_are_names_not_expressions() {
        let p = params(&[("metadata.labels.app.kubernetes.io/name", "shop-api")]);
        assert_eq!(
            substitute("{{ metadata.labels.app.kubernetes.io/name }}", &p).unwrap(),
            "shop-api"
        );
    }

    #[test]
    fn a_value_is_not_expanded_again() {
        let p = params(&[("a", "{{ b }}"), ("b", "no")]);
        assert_eq!(substitute("{{a}}", &p).unwrap(), "{{ b }}");
    }

    #[test]
    fn an_unknown_parameter_is_an_error_listing_the_known_ones() {
        let p = params(&[("path", "apps/x"), ("path.basename", "x")]);
        let error = substitute("app-{{ path.basname }}", &p).unwrap_err();
        assert_eq!(
            error,
            TemplateError::UnknownParameter {
                parameter: "path.basname".to_owned(),
                field: "the text".to_owned(),
                available: "path, path.basename".to_owned(),
            }
        );
        assert_eq!(
            error.to_string(),
            "unknown parameter \"path.basname\" in the text (the generator yields: path, path.basename)"
        );
    }

    #[test]
    fn many_parameters_are_capped_closest_first() {
        let mut p: Params = (0..30)
            .map(|i| (format!("k{i:02}"), String::new()))
            .collect();
        p.insert("values.region".to_owned(), "eu".to_owned());
        let Err(TemplateError::UnknownParameter { available, .. }) =
            substitute("{{ values.regio }}", &p)
        else {
            panic!("expected an unknown parameter");
        };
        assert!(available.contains("values.region"), "{available}");
        assert!(available.ends_with(" and 11 more"), "{available}");
    }

    #[test]
    fn unterminated_braces_are_an_error() {
        let p = params(&[("a", "1")]);
        assert_eq!(
            substitute("x-{{a}}-{{ a", &p).unwrap_err(),
            TemplateError::Unterminated {
                field: "the text".to_owned(),
                offset: 8
            }
        );
    }

    #[test]
    fn render_fills_metadata_and_spec_keys_and_values() {
        let mut t = template(
            "{{ path.basename }}-{{ cluster }}",
            json!({
                "source": {
                    "repoURL": "https://git.example.com/org/apps.git",
                    "path": "{{ path }}",
                    "targetRevision": "main"
                },
                "destination": {"namespace": "{{ path.basename }}"},
                "ignoreDifferences": [{"kind": "Deployment", "jsonPointers": ["/spec/{{ field }}"]}]
            }),
        );
        t.metadata
            .labels
            .insert("team".to_owned(), "{{ team }}".to_owned());
        t.metadata.annotations.insert(
            "example.com/{{ cluster }}".to_owned(),
            "{{ path }}".to_owned(),
        );
        let p = params(&[
            ("path", "apps/web"),
            ("path.basename", "web"),
            ("cluster", "eu"),
            ("team", "shop"),
            ("field", "replicas"),
        ]);
        let rendered = render(&t, &p).unwrap();
        assert_eq!(rendered.name, "web-eu");
        assert_eq!(rendered.labels["team"], "shop");
        assert_eq!(rendered.annotations["example.com/eu"], "apps/web");
        assert_eq!(rendered.spec.source.path.as_deref(), Some("apps/web"));
        assert_eq!(rendered.spec.destination.namespace.as_deref(), Some("web"));
        assert_eq!(
            rendered.spec.ignore_differences[0].json_pointers,
            vec!["/spec/replicas"]
        );
    }

    #[test]
    fn render_names_the_field_of_an_unknown_parameter() {
        let p = params(&[("name", "web")]);
        let field_of = |t: &Template| match render(t, &p) {
            Err(TemplateError::UnknownParameter { field, .. }) => field,
            other => panic!("expected an unknown parameter, got {other:?}"),
        };
        assert_eq!(field_of(&template("{{ nme }}", spec("x"))), "metadata.name");
        assert_eq!(
            field_of(&template("{{ name }}", spec("{{ path }}"))),
            "spec.source.path"
        );
        let mut t = template("{{ name }}", spec("x"));
        t.metadata
            .labels
            .insert("team".to_owned(), "{{ team }}".to_owned());
        assert_eq!(field_of(&t), "metadata.labels[team]");
    }

    #[test]
    fn render_refuses_names_that_are_not_object_names() {
        for bad in ["Web", "web_1", "-web", "web.", ""] {
            let p = params(&[("n", bad)]);
            assert!(
                matches!(
                    render(&template("{{n}}", spec("x")), &p),
                    Err(TemplateError::InvalidName { .. })
                ),
                "{bad:?}"
            );
        }
        let long = "a".repeat(254);
        let p = params(&[("n", &long)]);
        assert!(matches!(
            render(&template("{{n}}", spec("x")), &p),
            Err(TemplateError::InvalidName { .. })
        ));
        let p = params(&[("n", "web.eu-1")]);
        assert!(render(&template("{{n}}", spec("x")), &p).is_ok());
    }

    #[test]
    fn render_refuses_bad_label_values() {
        let mut t = template("web", spec("x"));
        t.metadata
            .labels
            .insert("branch".to_owned(), "{{ branch }}".to_owned());
        for bad in ["feature/login", "-x", &"a".repeat(64)] {
            let p = params(&[("branch", bad)]);
            assert!(
                matches!(render(&t, &p), Err(TemplateError::InvalidLabel { .. })),
                "{bad:?}"
            );
        }
        for good in ["", "feature-login", "Feature_1.2"] {
            let p = params(&[("branch", good)]);
            assert!(render(&t, &p).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn render_reports_an_invalid_spec_with_the_application() {
        let p = params(&[]);
        let error = render(&template("web", json!({"destination": {}})), &p).unwrap_err();
        let TemplateError::InvalidSpec { name, reason } = &error else {
            panic!("expected an invalid spec, got {error:?}");
        };
        assert_eq!(name, "web");
        assert!(reason.contains("source"), "{reason}");
    }

    #[test]
    fn two_keys_rendering_to_one_are_an_error() {
        let mut t = template("web", spec("x"));
        t.metadata
            .labels
            .insert("{{ a }}".to_owned(), "1".to_owned());
        t.metadata.labels.insert("b".to_owned(), "2".to_owned());
        let p = params(&[("a", "b")]);
        assert_eq!(
            render(&t, &p).unwrap_err(),
            TemplateError::DuplicateKey {
                field: "metadata.labels".to_owned(),
                key: "b".to_owned()
            }
        );
    }
}
