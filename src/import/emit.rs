//! The imported Applications as multi-document YAML (pure), each note a
//! comment above the line of the field it concerns. serde_yaml writes no
//! comments, so they go into its output: the lines are walked once,
//! following the indentation of mapping keys, to find where each field of
//! the Application starts.

use std::collections::HashMap;

use super::{Imported, Note};

/// Every Application, `---` between them, a comment naming the object it
/// came from at the top of each.
pub fn render(imported: &[Imported]) -> String {
    let mut out = String::new();
    for (index, one) in imported.iter().enumerate() {
        if index > 0 {
            out.push_str("---\n");
        }
        out.push_str(&format!("# Imported from {}.\n", one_line(&one.from)));
        let yaml = serde_yaml::to_string(&one.application)
            .unwrap_or_else(|error| format!("# cannot write this Application: {error}\n"));
        out.push_str(&with_comments(&yaml, &one.notes));
    }
    out
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `yaml` with each note as a comment above the line of its field (or of
/// the nearest parent present, or the document's first line).
fn with_comments(yaml: &str, notes: &[Note]) -> String {
    let lines: Vec<&str> = yaml.lines().collect();
    let keys = key_lines(&lines);
    let mut above: HashMap<usize, Vec<&str>> = HashMap::new();
    for note in notes {
        let mut at = note.at.as_str();
        let line = loop {
            if let Some(line) = keys.get(at) {
                break *line;
            }
            match at.rsplit_once('.') {
                Some((parent, _)) => at = parent,
                None if !at.is_empty() => at = "",
                None => break 0,
            }
        };
        above.entry(line).or_default().push(&note.text);
    }
    let mut out = String::new();
    for (index, line) in lines.iter().enumerate() {
        if let Some(texts) = above.get(&index) {
            let indent = line.len() - line.trim_start().len();
            for text in texts {
                out.push_str(&" ".repeat(indent));
                out.push_str("# ");
                out.push_str(&one_line(text));
                out.push('\n');
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The line each mapping key starts on, by its dotted path
/// (`spec.source.helm`); keys inside sequences are left out (their path
/// has a `[]`), as are the lines of block scalars.
fn key_lines(lines: &[&str]) -> HashMap<String, usize> {
    let mut keys = HashMap::new();
    // (indent, key) of the keys that enclose the current line.
    let mut stack: Vec<(usize, String)> = Vec::new();
    // The indent of a block scalar's key while its lines go on.
    let mut block: Option<usize> = None;
    for (index, line) in lines.iter().enumerate() {
        let content = line.trim_start();
        let indent = line.len() - content.len();
        if content.is_empty() {
            continue;
        }
        if let Some(key_indent) = block {
            if indent > key_indent {
                continue;
            }
            block = None;
        }
        if content.starts_with('#') {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        let (item, rest) = match content.strip_prefix("- ") {
            Some(rest) => (true, rest),
            None if content == "-" => (true, ""),
            None => (false, content),
        };
        if item {
            stack.push((indent, "[]".into()));
        }
        let key_indent = if item { indent + 2 } else { indent };
        let Some((key, value)) = split_key(rest) else {
            if is_block_scalar(rest) {
                block = Some(indent);
            }
            continue;
        };
        if is_block_scalar(value) {
            block = Some(key_indent);
        }
        let mut path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
        path.push(&key);
        keys.entry(path.join(".")).or_insert(index);
        stack.push((key_indent, key));
    }
    keys
}

/// `key: value` or `key:` (the key unquoted).
fn split_key(text: &str) -> Option<(String, &str)> {
    let (key, value) = if let Some(quoted) = text.strip_prefix('\'') {
        let end = quoted.find("':")?;
        (quoted[..end].replace("''", "'"), &quoted[end + 2..])
    } else if let Some(quoted) = text.strip_prefix('"') {
        let end = quoted.find("\":")?;
        (quoted[..end].to_string(), &quoted[end + 2..])
    } else if let Some(key) = text.strip_suffix(':') {
        (key.to_string(), "")
    } else {
        let at = text.find(": ")?;
        (text[..at].to_string(), &text[at + 1..])
    };
    if !value.is_empty() && !value.starts_with(' ') {
        return None;
    }
    Some((key, value.trim()))
}

/// `|`, `|-`, `>+`, `|2` …: the value goes on in the lines below.
fn is_block_scalar(value: &str) -> bool {
    let mut chars = value.trim().chars();
    matches!(chars.next(), Some('|' | '>'))
        && chars.all(|c| matches!(c, '-' | '+') || c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "\
apiVersion: setpoint.dev/v1alpha1
kind: Application
metadata:
  finalizers:
  - resources-finalizer.argocd.argoproj.io
  name: web
spec:
  ignoreDifferences:
  - group: apps
    kind: Deployment
    source: not-a-key-of-spec
  source:
    helm:
      values: |-
        source:
          helm: 1
    repoURL: https://example.com/r
  syncPolicy: {}
";

    fn note(at: &str, text: &str) -> Note {
        Note {
            at: at.into(),
            text: text.into(),
        }
    }

    #[test]
    fn keys_are_found_outside_sequences_and_block_scalars() {
        let lines: Vec<&str> = YAML.lines().collect();
        let keys = key_lines(&lines);
        assert_eq!(keys["metadata.finalizers"], 3);
        assert_eq!(keys["metadata.name"], 5);
        assert_eq!(keys["spec.ignoreDifferences"], 7);
        assert_eq!(keys["spec.source"], 11);
        assert_eq!(keys["spec.source.helm"], 12);
        assert_eq!(keys["spec.source.repoURL"], 16);
        assert_eq!(keys["spec.syncPolicy"], 17);
        assert!(!keys.contains_key("spec.source.helm.values.source"));
        assert!(!keys.contains_key("spec.source.helm.values.source.helm"));
    }

    #[test]
    fn a_note_goes_above_its_field_or_the_nearest_parent_present() {
        let out = with_comments(
            YAML,
            &[
                note("spec.source.helm", "not mapped: a"),
                note("spec.destination.namespace", "not mapped: b"),
                note("", "top"),
                note("spec.source.helm", "not mapped: c"),
            ],
        );
        assert!(out.starts_with("# top\napiVersion:"), "{out}");
        assert!(
            out.contains("  source:\n    # not mapped: a\n    # not mapped: c\n    helm:\n"),
            "{out}"
        );
        assert!(out.contains("# not mapped: b\nspec:\n"), "{out}");
        let parsed: serde_yaml::Value = serde_yaml::from_str(&out).unwrap();
        let original: serde_yaml::Value = serde_yaml::from_str(YAML).unwrap();
        assert_eq!(parsed, original);
    }

    #[test]
    fn quoted_keys_and_scalars_that_look_like_keys() {
        assert_eq!(
            split_key("a: b").map(|(k, v)| (k, v.to_string())),
            Some(("a".into(), "b".into()))
        );
        assert_eq!(split_key("'a: b': c").map(|(k, _)| k), Some("a: b".into()));
        assert_eq!(split_key("http://x").map(|(k, _)| k), None);
        assert!(is_block_scalar("|-"));
        assert!(is_block_scalar(">2"));
        assert!(!is_block_scalar("|x"));
    }
}
