//! What parsing a manifest may cost. YAML anchors and aliases let a small
//! file describe a huge tree (`b: [*a, *a, …]` with `a` a long list): serde
//! expands every alias while it builds the value, so a 98 KiB file can ask
//! for gigabytes. Each YAML file is first read as a stream of events (the
//! same libyaml parser serde_yaml uses, without building anything), counting
//! per document its aliases and the size it would have once expanded (an
//! alias weighs what its anchored node weighs); a document over a limit is
//! refused before any value is built.

use std::collections::HashMap;
use std::mem::MaybeUninit;

/// The limits, per manifest file and per document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ManifestLimits {
    /// Largest manifest file, in bytes.
    pub max_file_bytes: usize,
    /// Aliases (`*name`) in one document.
    pub max_aliases: u64,
    /// Nodes (scalars, lists, maps) of one document once its aliases are
    /// expanded.
    pub max_nodes: u64,
    /// Bytes of one document once its aliases are expanded: its scalars'
    /// bytes plus one per node.
    pub max_expanded_bytes: u64,
}

impl Default for ManifestLimits {
    fn default() -> Self {
        ManifestLimits {
            max_file_bytes: 8 * 1024 * 1024,
            max_aliases: 10_000,
            max_nodes: 1_000_000,
            max_expanded_bytes: 10 * 1024 * 1024,
        }
    }
}

/// The size of a node, or of a document so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Size {
    pub nodes: u64,
    pub bytes: u64,
}

impl Size {
    fn add(&mut self, other: Size) {
        self.nodes = self.nodes.saturating_add(other.nodes);
        self.bytes = self.bytes.saturating_add(other.bytes);
    }

    fn since(self, start: Size) -> Size {
        Size {
            nodes: self.nodes - start.nodes,
            bytes: self.bytes - start.bytes,
        }
    }
}

/// A document over a limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded {
    pub document: usize,
    pub message: String,
}

/// What a YAML stream's documents would expand to: each document's size,
/// or the first document over a limit. A syntax error ends the scan without
/// an error: serde_yaml reports it, with its position, when it parses.
pub fn scan(yaml: &[u8], limits: &ManifestLimits) -> Result<Vec<Size>, Exceeded> {
    let mut parser = Parser::new(yaml);
    let mut documents = Vec::new();
    let mut document: Option<Document> = None;
    while let Some(event) = parser.next() {
        match event {
            Event::DocumentStart => document = Some(Document::default()),
            Event::DocumentEnd => {
                if let Some(done) = document.take() {
                    documents.push(done.total);
                }
            }
            Event::StreamEnd => break,
            Event::StreamStart => {}
            event => {
                let Some(current) = document.as_mut() else {
                    continue;
                };
                current.event(event, limits).map_err(|message| Exceeded {
                    document: documents.len(),
                    message,
                })?;
            }
        }
    }
    Ok(documents)
}

/// One document being scanned.
#[derive(Default)]
struct Document {
    /// Every node so far, aliases expanded.
    total: Size,
    aliases: u64,
    /// The open lists and maps: their anchor and the total when they began.
    open: Vec<(Option<Vec<u8>>, Size)>,
    /// Each anchor's expanded size (a later anchor of the same name wins,
    /// as in YAML).
    anchors: HashMap<Vec<u8>, Size>,
}

impl Document {
    fn event(&mut self, event: Event, limits: &ManifestLimits) -> Result<(), String> {
        match event {
            Event::Scalar { anchor, length } => {
                let size = Size {
                    nodes: 1,
                    bytes: length.saturating_add(1),
                };
                self.total.add(size);
                if let Some(anchor) = anchor {
                    self.anchors.insert(anchor, size);
                }
            }
            Event::CollectionStart { anchor } => {
                let start = self.total;
                self.total.add(Size { nodes: 1, bytes: 1 });
                self.open.push((anchor, start));
            }
            Event::CollectionEnd => {
                if let Some((Some(anchor), start)) = self.open.pop() {
                    self.anchors.insert(anchor, self.total.since(start));
                }
            }
            Event::Alias { anchor } => {
                self.aliases += 1;
                if self.aliases > limits.max_aliases {
                    return Err(format!(
                        "has more than {} aliases (limit SETPOINT_MAX_MANIFEST_ALIASES)",
                        limits.max_aliases
                    ));
                }
                if self
                    .open
                    .iter()
                    .any(|(open, _)| open.as_ref() == Some(&anchor))
                {
                    return Err(format!(
                        "alias *{} refers to a node that contains it",
                        String::from_utf8_lossy(&anchor)
                    ));
                }
                // An unknown anchor is serde_yaml's error to report.
                let size = self
                    .anchors
                    .get(&anchor)
                    .copied()
                    .unwrap_or(Size { nodes: 1, bytes: 1 });
                self.total.add(size);
            }
            Event::StreamStart | Event::DocumentStart | Event::DocumentEnd | Event::StreamEnd => {}
        }
        let through = if self.aliases > 0 {
            " through aliases"
        } else {
            ""
        };
        if self.total.nodes > limits.max_nodes {
            return Err(format!(
                "expands to more than {} nodes{through} (limit SETPOINT_MAX_MANIFEST_NODES)",
                limits.max_nodes
            ));
        }
        if self.total.bytes > limits.max_expanded_bytes {
            return Err(format!(
                "expands to more than {} bytes{through} (limit SETPOINT_MAX_MANIFEST_EXPANDED_BYTES)",
                limits.max_expanded_bytes
            ));
        }
        Ok(())
    }
}

/// The events the scan needs, owned.
#[derive(Debug)]
enum Event {
    StreamStart,
    DocumentStart,
    DocumentEnd,
    StreamEnd,
    Scalar {
        anchor: Option<Vec<u8>>,
        length: u64,
    },
    CollectionStart {
        anchor: Option<Vec<u8>>,
    },
    CollectionEnd,
    Alias {
        anchor: Vec<u8>,
    },
}

/// libyaml's event parser over a byte slice.
struct Parser<'input> {
    /// Boxed: libyaml keeps pointers into its own state, so it must not move.
    state: Box<MaybeUninit<unsafe_libyaml::yaml_parser_t>>,
    _input: std::marker::PhantomData<&'input [u8]>,
    done: bool,
}

impl<'input> Parser<'input> {
    fn new(input: &'input [u8]) -> Self {
        let mut state = Box::new(MaybeUninit::<unsafe_libyaml::yaml_parser_t>::uninit());
        // SAFETY: the parser is initialized in place before any other use;
        // it reads `input`, which outlives it (the lifetime `'input`), and
        // `Drop` deletes it.
        unsafe {
            let parser = state.as_mut_ptr();
            if unsafe_libyaml::yaml_parser_initialize(parser).fail {
                panic!("libyaml could not allocate a parser");
            }
            unsafe_libyaml::yaml_parser_set_encoding(parser, unsafe_libyaml::YAML_UTF8_ENCODING);
            unsafe_libyaml::yaml_parser_set_input_string(
                parser,
                input.as_ptr(),
                input.len() as u64,
            );
        }
        Parser {
            state,
            _input: std::marker::PhantomData,
            done: false,
        }
    }

    /// The next event; `None` at the end of the stream or at an error.
    fn next(&mut self) -> Option<Event> {
        if self.done {
            return None;
        }
        let mut raw = MaybeUninit::<unsafe_libyaml::yaml_event_t>::uninit();
        // SAFETY: the parser was initialized in `new`; a successful
        // `yaml_parser_parse` initializes the event, whose union is read
        // only as its `type_` says, and which is deleted before returning.
        unsafe {
            let parser = self.state.as_mut_ptr();
            if unsafe_libyaml::yaml_parser_parse(parser, raw.as_mut_ptr()).fail {
                self.done = true;
                return None;
            }
            let raw = raw.as_mut_ptr();
            let event = match (*raw).type_ {
                unsafe_libyaml::YAML_DOCUMENT_START_EVENT => Event::DocumentStart,
                unsafe_libyaml::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
                unsafe_libyaml::YAML_STREAM_END_EVENT => {
                    self.done = true;
                    Event::StreamEnd
                }
                unsafe_libyaml::YAML_SCALAR_EVENT => Event::Scalar {
                    anchor: c_bytes((*raw).data.scalar.anchor),
                    length: (*raw).data.scalar.length,
                },
                unsafe_libyaml::YAML_SEQUENCE_START_EVENT => Event::CollectionStart {
                    anchor: c_bytes((*raw).data.sequence_start.anchor),
                },
                unsafe_libyaml::YAML_MAPPING_START_EVENT => Event::CollectionStart {
                    anchor: c_bytes((*raw).data.mapping_start.anchor),
                },
                unsafe_libyaml::YAML_SEQUENCE_END_EVENT
                | unsafe_libyaml::YAML_MAPPING_END_EVENT => Event::CollectionEnd,
                unsafe_libyaml::YAML_ALIAS_EVENT => Event::Alias {
                    anchor: c_bytes((*raw).data.alias.anchor).unwrap_or_default(),
                },
                unsafe_libyaml::YAML_STREAM_START_EVENT => Event::StreamStart,
                // No event: libyaml has nothing more to say.
                _ => {
                    self.done = true;
                    unsafe_libyaml::yaml_event_delete(raw);
                    return None;
                }
            };
            unsafe_libyaml::yaml_event_delete(raw);
            Some(event)
        }
    }
}

/// A NUL-terminated string libyaml owns, copied; `None` for a null pointer.
///
/// # Safety
/// `ptr` is null or points at a NUL-terminated string.
unsafe fn c_bytes(ptr: *const u8) -> Option<Vec<u8>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    let text = unsafe { std::ffi::CStr::from_ptr(ptr.cast()) };
    Some(text.to_bytes().to_vec())
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: initialized in `new`, deleted once, here.
        unsafe { unsafe_libyaml::yaml_parser_delete(self.state.as_mut_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// `a: &a [x, x, …]` with `items` items, then `b: [*a, *a, …]` with
    /// `aliases` aliases: the shape that killed the workers.
    pub fn alias_bomb(items: usize, aliases: usize) -> String {
        format!(
            "a: &a [{}]\nb: [{}]\n",
            vec!["x"; items].join(","),
            vec!["*a"; aliases].join(",")
        )
    }

    #[test]
    fn the_alias_bomb_is_refused_quickly() {
        let bomb = alias_bomb(20_000, 20_000);
        assert!(bomb.len() < 100 * 1024, "{}", bomb.len());
        let started = Instant::now();
        let err = scan(bomb.as_bytes(), &ManifestLimits::default()).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(err.document, 0);
        assert_eq!(
            err.message,
            "expands to more than 1000000 nodes through aliases (limit SETPOINT_MAX_MANIFEST_NODES)"
        );
        // Fewer aliases than the limit, each of them large: the same.
        let few = alias_bomb(20_000, 100);
        assert!(scan(few.as_bytes(), &ManifestLimits::default()).is_err());
    }

    #[test]
    fn nested_aliases_multiply_and_are_counted_without_being_built() {
        // The billion laughs: ten levels of ten aliases each.
        let mut text = String::from("l0: &l0 [lol]\n");
        for level in 1..10 {
            let previous = format!("*l{}", level - 1);
            text.push_str(&format!(
                "l{level}: &l{level} [{}]\n",
                [previous.as_str(); 10].join(",")
            ));
        }
        let err = scan(text.as_bytes(), &ManifestLimits::default()).unwrap_err();
        assert!(err.message.contains("through aliases"), "{}", err.message);
    }

    #[test]
    fn too_many_aliases_and_too_many_expanded_bytes_are_refused() {
        let limits = ManifestLimits {
            max_aliases: 10,
            ..Default::default()
        };
        let err = scan(alias_bomb(1, 11).as_bytes(), &limits).unwrap_err();
        assert_eq!(
            err.message,
            "has more than 10 aliases (limit SETPOINT_MAX_MANIFEST_ALIASES)"
        );
        // A long string aliased: few nodes, many bytes.
        let long = format!(
            "a: &a {}\nb: [{}]\n",
            "y".repeat(100_000),
            vec!["*a"; 200].join(",")
        );
        let err = scan(long.as_bytes(), &ManifestLimits::default()).unwrap_err();
        assert_eq!(
            err.message,
            "expands to more than 10485760 bytes through aliases (limit SETPOINT_MAX_MANIFEST_EXPANDED_BYTES)"
        );
    }

    #[test]
    fn ordinary_anchors_and_aliases_pass_with_their_expanded_size() {
        let text = "\
defaults: &defaults {image: web:1, replicas: 2}
web:
  <<: *defaults
  name: web
---
apiVersion: v1
kind: ConfigMap
metadata: {name: a}
data: {x: *not_defined_here}
";
        let sizes = scan(text.as_bytes(), &ManifestLimits::default()).unwrap();
        // Document 0: the root map, the key defaults, its map (1 + 4
        // scalars), the key web, its map, `<<`, the alias (5 nodes), name
        // and web. Document 1's unknown alias is serde's to report.
        assert_eq!(sizes.len(), 2);
        assert_eq!(sizes[0].nodes, 1 + 1 + 5 + 1 + 1 + 1 + 5 + 2);
    }

    #[test]
    fn the_document_over_the_limit_is_named() {
        let text = format!("a: 1\n---\n{}", alias_bomb(2_000, 1_000));
        let err = scan(text.as_bytes(), &ManifestLimits::default()).unwrap_err();
        assert_eq!(err.document, 1);
    }

    #[test]
    fn a_recursive_alias_is_refused() {
        let err = scan(b"a: &a [1, *a]\n", &ManifestLimits::default()).unwrap_err();
        assert_eq!(err.message, "alias *a refers to a node that contains it");
    }

    #[test]
    fn a_syntax_error_is_left_to_serde() {
        assert!(scan(b"a: [1\n", &ManifestLimits::default()).is_ok());
    }
}
