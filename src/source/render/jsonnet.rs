//! Jsonnet in a directory source, as Argo CD renders it: every `.jsonnet`
//! file under the path is evaluated (a `.libsonnet` only when imported), with
//! the source's external variables and, when the file is a function, its
//! top-level arguments; an object is one manifest, an array many (a `List`
//! flattened as in a YAML file). Pure: a function of the repository's tree.
//!
//! Imports are read from that tree, never from the filesystem: a path is
//! looked up from the importing file's directory, then the Application's
//! path, then each of `libs` (relative to the repository's root), resolved
//! as the filesystem would (symlinks included) and refused when it climbs
//! out of the repository. Errors name the file and the line.

use std::collections::{BTreeSet, HashMap};

use rsjsonnet_lang::arena::Arena;
use rsjsonnet_lang::lexer::LexError;
use rsjsonnet_lang::parser::ParseError;
use rsjsonnet_lang::program::{
    AnalyzeError, Callbacks, EvalError, EvalErrorKind, EvalStackTraceItem, ImportError, LoadError,
    NativeError, Program, Thunk, Value,
};
use rsjsonnet_lang::span::{SpanContextId, SpanId};

use super::confine::{Symlink, Tree, parent};
use super::directory::{self, Budget};
use super::inputs::covers;
use super::{RenderError, check_unique};
use crate::api::{JsonnetSource, JsonnetVar};
use crate::manifest::Manifest;
use crate::source::git::SourceFile;

/// Jsonnet's call depth: deeper recursion is an error naming the file, not
/// a crash (the evaluator keeps its own stack; the thread that runs it has
/// `STACK_BYTES` for the parser's recursion).
pub const MAX_DEPTH: usize = 500;

/// The stack of the thread an evaluation runs on (reserved, not used:
/// only the pages a deep parse touches are ever mapped).
pub const STACK_BYTES: usize = 256 * 1024 * 1024;

/// Brackets, braces and parentheses one source may nest: the parser and
/// the analyzer recurse on them, and a file of 8 MiB could otherwise nest
/// deep enough to overflow any stack (an abort, not an error).
pub const MAX_NESTING: usize = 1000;

/// Whether `path` is a file the directory source evaluates.
pub fn is_jsonnet(path: &str) -> bool {
    path.to_ascii_lowercase().ends_with(".jsonnet")
}

/// What rendering a path with Jsonnet produced, and what it read.
#[derive(Debug)]
pub struct Evaluated {
    pub manifests: Vec<Manifest>,
    /// Every repository path the render read: the path's own files, each
    /// import, and the libs directories.
    pub read: Vec<String>,
}

/// The objects of `path` (its YAML and JSON files and its `.jsonnet`
/// files) in the repository `files` / `links`, within `budget`.
pub fn render(
    files: &[SourceFile],
    links: &[Symlink],
    path: &str,
    options: &JsonnetSource,
    budget: &mut Budget,
) -> Result<Evaluated, RenderError> {
    let tree = Tree::new(files, links);
    let mut libs = Vec::new();
    for lib in &options.libs {
        let resolved = tree.resolve("", lib).map_err(|escape| {
            RenderError::InvalidSource(format!(
                "spec.source.directory.jsonnet.libs: {lib} {}",
                escape.describe()
            ))
        })?;
        libs.push(resolved.path);
    }
    let mut under: Vec<&SourceFile> = files.iter().filter(|f| covers(path, &f.path)).collect();
    under.sort_by(|a, b| a.path.cmp(&b.path));
    let plain: Vec<SourceFile> = under
        .iter()
        .filter(|f| !is_jsonnet(&f.path))
        .map(|f| (*f).clone())
        .collect();
    let mut manifests = directory::render(&plain, budget)?;
    let mut read: BTreeSet<String> = libs.iter().cloned().collect();
    read.insert(path.to_string());
    for file in under.iter().filter(|f| is_jsonnet(&f.path)) {
        if file.contents.len() > budget.limits.max_file_bytes {
            return Err(RenderError::ManifestTooLarge {
                file: file.path.clone(),
                document: None,
                message: format!(
                    "{} bytes, more than the {} a manifest file may have (limit SETPOINT_MAX_MANIFEST_BYTES)",
                    file.contents.len(),
                    budget.limits.max_file_bytes
                ),
            });
        }
        let json = evaluate(&tree, path, &libs, options, file, budget, &mut read)?;
        manifests.extend(directory::json_objects(&file.path, &json, budget)?);
    }
    check_unique(&manifests)?;
    Ok(Evaluated {
        manifests,
        read: read.into_iter().collect(),
    })
}

/// A source the program loaded: where its spans point.
struct Loaded<'a> {
    name: String,
    text: &'a [u8],
}

/// The import resolver and the map from spans to files.
struct Session<'t, 'a> {
    tree: &'t Tree<'a>,
    /// The Application's path, then the libs, after the importer's directory.
    search: Vec<String>,
    sources: HashMap<SpanContextId, Loaded<'t>>,
    imported: HashMap<String, Thunk<'t>>,
    read: BTreeSet<String>,
    max_file_bytes: usize,
    /// Why the last import failed, said better than "import failed".
    failure: Option<RenderError>,
}

/// Evaluates one `.jsonnet` file to its JSON text.
fn evaluate(
    tree: &Tree<'_>,
    path: &str,
    libs: &[String],
    options: &JsonnetSource,
    file: &SourceFile,
    budget: &Budget,
    read: &mut BTreeSet<String>,
) -> Result<String, RenderError> {
    let arena = Arena::new();
    let mut program = Program::new(&arena);
    program.set_max_stack(MAX_DEPTH);
    let mut search = vec![path.to_string()];
    search.extend(libs.iter().cloned());
    let mut session = Session {
        tree,
        search,
        sources: HashMap::new(),
        imported: HashMap::new(),
        read: BTreeSet::new(),
        max_file_bytes: budget.limits.max_file_bytes,
        failure: None,
    };
    let codes: Vec<(String, &JsonnetVar)> = options
        .ext_vars
        .iter()
        .map(|v| (format!("<extVar:{}>", v.name), v))
        .chain(
            options
                .tlas
                .iter()
                .map(|v| (format!("<tla:{}>", v.name), v)),
        )
        .collect();
    let mut thunks = Vec::new();
    for (name, var) in &codes {
        let thunk = if var.code {
            session.load(&mut program, name, var.value.as_bytes())?
        } else {
            program.value_to_thunk(&Value::string(&var.value))
        };
        thunks.push(thunk);
    }
    let (ext_thunks, tla_thunks) = thunks.split_at(options.ext_vars.len());
    for (var, thunk) in options.ext_vars.iter().zip(ext_thunks) {
        let name = program.intern_str(&var.name);
        program.add_ext_var(name, thunk);
    }
    let main = session.load(&mut program, &file.path, &file.contents)?;
    let value = program
        .eval_value(&main, &mut session)
        .map_err(|e| session.eval_error(&program, &file.path, e))?;
    // Top-level arguments apply to a file that is a function, as the
    // jsonnet CLI applies them; any other file ignores them.
    let value = if value.is_function() {
        let named: Vec<_> = options
            .tlas
            .iter()
            .zip(tla_thunks)
            .map(|(var, thunk)| (program.intern_str(&var.name), thunk.clone()))
            .collect();
        let function = program.value_to_thunk(&value);
        program
            .eval_call(&function, &[], &named, &mut session)
            .map_err(|e| session.eval_error(&program, &file.path, e))?
    } else {
        value
    };
    let json = program
        .manifest_json(&value, false)
        .map_err(|e| session.eval_error(&program, &file.path, e))?;
    read.extend(std::mem::take(&mut session.read));
    Ok(json)
}

impl<'t, 'a> Session<'t, 'a> {
    /// Loads `text` as the source `name`; a syntax error names its line.
    fn load(
        &mut self,
        program: &mut Program<'t>,
        name: &str,
        text: &'t [u8],
    ) -> Result<Thunk<'t>, RenderError> {
        if let Some(line) = too_deep(text) {
            return Err(RenderError::Jsonnet {
                file: name.to_string(),
                line: Some(line),
                message: format!("nested deeper than {MAX_NESTING} brackets"),
            });
        }
        let (context, _) = program.span_manager_mut().insert_source_context(text.len());
        self.sources.insert(
            context,
            Loaded {
                name: name.to_string(),
                text,
            },
        );
        program
            .load_source(context, text, true, name)
            .map_err(|e| self.load_error(program, name, e))
    }

    /// The repository file an import names from the file at `from`.
    fn find(
        &mut self,
        program: &Program<'t>,
        from: SpanId,
        path: &str,
    ) -> Result<&'a SourceFile, ImportError> {
        let (file, line) = self.locate(program, from).unwrap_or_default();
        // Code given in the spec (`<extVar:…>`) imports from the search path.
        let importer = (!file.is_empty() && !file.starts_with('<')).then(|| file.clone());
        let refuse = |message: String| {
            RenderError::InvalidSource(format!(
                "{file}{}: import \"{path}\" {message}: jsonnet may only import files of the repository",
                line.map(|l| format!(":{l}")).unwrap_or_default()
            ))
        };
        let mut bases: Vec<String> = importer.iter().map(|f| parent(f).to_string()).collect();
        bases.extend(self.search.iter().cloned());
        for (index, base) in bases.iter().enumerate() {
            match self.tree.resolve(base, path) {
                Ok(resolved) => {
                    if let Some(found) = self.tree.file(&resolved.path) {
                        if found.contents.len() > self.max_file_bytes {
                            self.failure = Some(RenderError::ManifestTooLarge {
                                file: found.path.clone(),
                                document: None,
                                message: format!(
                                    "imported from {file}: more than the {} bytes a manifest file may have",
                                    self.max_file_bytes
                                ),
                            });
                            return Err(ImportError);
                        }
                        self.read.insert(found.path.clone());
                        return Ok(found);
                    }
                }
                // Climbing out from where the import is written is refused
                // outright; from a search path it only is not found there.
                Err(escape) if index == 0 || path.starts_with('/') => {
                    self.failure = Some(refuse(escape.describe().to_string()));
                    return Err(ImportError);
                }
                Err(_) => {}
            }
        }
        self.failure = Some(RenderError::Jsonnet {
            file: file.clone(),
            line,
            message: format!(
                "import \"{path}\": no such file (looked in {})",
                bases
                    .iter()
                    .map(|b| if b.is_empty() { "." } else { b.as_str() })
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
        Err(ImportError)
    }

    /// The file and line a span points at.
    fn locate(&self, program: &Program<'t>, span: SpanId) -> Option<(String, Option<usize>)> {
        let (context, start, _) = program.span_manager().get_span(span);
        let source = self.sources.get(&context)?;
        let before = &source.text[..start.min(source.text.len())];
        let line = before.iter().filter(|b| **b == b'\n').count() + 1;
        Some((source.name.clone(), Some(line)))
    }

    fn load_error(&self, program: &Program<'t>, name: &str, error: LoadError) -> RenderError {
        let (span, message) = match &error {
            LoadError::Lex(e) => (lex_span(e), format!("syntax error: {}", describe(e))),
            LoadError::Parse(ParseError::Expected {
                span,
                expected,
                instead,
            }) => (
                *span,
                format!(
                    "syntax error: expected {}, found {}",
                    expected
                        .iter()
                        .map(|t| words(&format!("{t:?}")))
                        .collect::<Vec<_>>()
                        .join(" or "),
                    words(&format!("{instead:?}"))
                ),
            ),
            LoadError::Analyze(e) => (analyze_span(e), describe(e)),
        };
        let (file, line) = self
            .locate(program, span)
            .unwrap_or((name.to_string(), None));
        RenderError::Jsonnet {
            file,
            line,
            message,
        }
    }

    fn eval_error(&mut self, program: &Program<'t>, main: &str, error: EvalError) -> RenderError {
        if matches!(error.kind, EvalErrorKind::ImportFailed { .. })
            && let Some(failure) = self.failure.take()
        {
            return failure;
        }
        let spans = kind_span(&error.kind)
            .into_iter()
            .chain(error.stack_trace.iter().filter_map(trace_span));
        let (file, line) = spans
            .filter_map(|span| self.locate(program, span))
            .next()
            .unwrap_or((main.to_string(), None));
        let message = match &error.kind {
            EvalErrorKind::ExplicitError { message, .. } => format!("error: {message}"),
            EvalErrorKind::AssertFailed {
                message: Some(message),
                ..
            } => format!("assertion failed: {message}"),
            EvalErrorKind::UnknownObjectField { field_name, .. } => {
                format!("field does not exist: {field_name}")
            }
            EvalErrorKind::UnknownExtVar { name } => {
                format!(
                    "undefined external variable: {name} (spec.source.directory.jsonnet.extVars)"
                )
            }
            EvalErrorKind::CallParamNotBound { param_name, .. } => format!(
                "missing argument: {param_name} (a top-level argument is set in spec.source.directory.jsonnet.tlas)"
            ),
            EvalErrorKind::StackOverflow | EvalErrorKind::InfiniteRecursion => {
                format!("too deep: more than {MAX_DEPTH} nested calls (an endless recursion?)")
            }
            kind => describe(kind),
        };
        RenderError::Jsonnet {
            file,
            line,
            message,
        }
    }
}

impl<'t> Callbacks<'t> for Session<'t, '_> {
    fn import(
        &mut self,
        program: &mut Program<'t>,
        from: SpanId,
        path: &str,
    ) -> Result<Thunk<'t>, ImportError> {
        let found = self.find(program, from, path)?;
        if let Some(thunk) = self.imported.get(&found.path) {
            return Ok(thunk.clone());
        }
        let found: &'t SourceFile = found;
        match self.load(program, &found.path, &found.contents) {
            Ok(thunk) => {
                self.imported.insert(found.path.clone(), thunk.clone());
                Ok(thunk)
            }
            Err(error) => {
                self.failure = Some(error);
                Err(ImportError)
            }
        }
    }

    fn import_str(
        &mut self,
        program: &mut Program<'t>,
        from: SpanId,
        path: &str,
    ) -> Result<String, ImportError> {
        let found = self.find(program, from, path)?;
        String::from_utf8(found.contents.clone()).map_err(|_| {
            self.failure = Some(RenderError::Jsonnet {
                file: found.path.clone(),
                line: None,
                message: "importstr of a file that is not UTF-8 (importbin reads bytes)".into(),
            });
            ImportError
        })
    }

    fn import_bin(
        &mut self,
        program: &mut Program<'t>,
        from: SpanId,
        path: &str,
    ) -> Result<Vec<u8>, ImportError> {
        Ok(self.find(program, from, path)?.contents.clone())
    }

    fn trace(&mut self, _: &mut Program<'t>, message: &str, _: &[EvalStackTraceItem]) {
        tracing::debug!(message, "std.trace in jsonnet");
    }

    fn native_call(
        &mut self,
        _: &mut Program<'t>,
        _: rsjsonnet_lang::interner::InternedStr<'t>,
        _: &[Value<'t>],
    ) -> Result<Value<'t>, NativeError> {
        // No native function is registered.
        Err(NativeError)
    }
}

/// The line where `text` nests brackets deeper than `MAX_NESTING`, if it
/// does; strings, text blocks and comments are skipped.
fn too_deep(text: &[u8]) -> Option<usize> {
    let mut depth = 0usize;
    let mut line = 1;
    let mut i = 0;
    // Moves `i` to the next `end` (not past it), counting lines.
    let until = |i: &mut usize, line: &mut usize, end: &[u8]| {
        while *i < text.len() && !text[*i..].starts_with(end) {
            *line += usize::from(text[*i] == b'\n');
            *i += 1;
        }
    };
    while i < text.len() {
        let c = text[i];
        match c {
            b'\n' => line += 1,
            b'[' | b'{' | b'(' => {
                depth += 1;
                if depth > MAX_NESTING {
                    return Some(line);
                }
            }
            b']' | b'}' | b')' => depth = depth.saturating_sub(1),
            b'#' => until(&mut i, &mut line, b"\n"),
            b'/' if text.get(i + 1) == Some(&b'/') => until(&mut i, &mut line, b"\n"),
            b'/' if text.get(i + 1) == Some(&b'*') => {
                i += 2;
                until(&mut i, &mut line, b"*/");
                i += 2;
                continue;
            }
            b'|' if text[i..].starts_with(b"|||") => {
                i += 3;
                until(&mut i, &mut line, b"|||");
                i += 3;
                continue;
            }
            b'"' | b'\'' => {
                // A verbatim string (`@'…'`) doubles its quote: read as two
                // strings side by side, the same skip.
                let verbatim = i > 0 && text[i - 1] == b'@';
                i += 1;
                while i < text.len() && text[i] != c {
                    if text[i] == b'\\' && !verbatim {
                        i += 1;
                    }
                    line += usize::from(text.get(i) == Some(&b'\n'));
                    i += 1;
                }
            }
            _ => {}
        }
        // A comment stops before its newline, which the next turn counts.
        if !matches!(c, b'#' | b'/') || text.get(i) != Some(&b'\n') {
            i += 1;
        }
    }
    None
}

fn lex_span(error: &LexError) -> SpanId {
    match error {
        LexError::InvalidChar { span, .. }
        | LexError::InvalidUtf8 { span, .. }
        | LexError::UnfinishedMultilineComment { span }
        | LexError::LeadingZeroInNumber { span }
        | LexError::MissingFracDigits { span }
        | LexError::MissingExpDigits { span }
        | LexError::MissingDigitAfterUnderscore { span }
        | LexError::ExpOverflow { span }
        | LexError::InvalidEscapeInString { span, .. }
        | LexError::IncompleteUnicodeEscape { span }
        | LexError::InvalidUtf16EscapeSequence { span, .. }
        | LexError::UnfinishedString { span }
        | LexError::MissingLineBreakAfterTextBlockStart { span }
        | LexError::MissingWhitespaceTextBlockStart { span }
        | LexError::InvalidTextBlockTermination { span } => *span,
    }
}

fn analyze_span(error: &AnalyzeError) -> SpanId {
    match error {
        AnalyzeError::UnknownVariable { span, .. }
        | AnalyzeError::TextBlockAsImportPath { span }
        | AnalyzeError::ComputedImportPath { span }
        | AnalyzeError::PositionalArgAfterNamed { arg_span: span }
        | AnalyzeError::SelfOutsideObject { self_span: span }
        | AnalyzeError::SuperOutsideObject { super_span: span }
        | AnalyzeError::DollarOutsideObject { dollar_span: span }
        | AnalyzeError::RepeatedLocalName {
            repeated_span: span,
            ..
        }
        | AnalyzeError::RepeatedFieldName {
            repeated_span: span,
            ..
        }
        | AnalyzeError::RepeatedParamName {
            repeated_span: span,
            ..
        } => *span,
    }
}

/// Where an evaluation error happened, when its kind says.
fn kind_span(kind: &EvalErrorKind) -> Option<SpanId> {
    use EvalErrorKind as K;
    match kind {
        K::InvalidIndexedType { span, .. }
        | K::InvalidSlicedType { span, .. }
        | K::SliceIndexOrStepIsNotNumber { span, .. }
        | K::StringIndexIsNotNumber { span, .. }
        | K::ArrayIndexIsNotNumber { span, .. }
        | K::NumericIndexIsNotValid { span, .. }
        | K::NumericIndexOutOfRange { span, .. }
        | K::ObjectIndexIsNotString { span, .. }
        | K::RepeatedFieldName { span, .. }
        | K::FieldNameIsNotString { span, .. }
        | K::UnknownObjectField { span, .. }
        | K::FieldOfNonObject { span }
        | K::SuperWithoutSuperObject { span }
        | K::ForSpecValueIsNotArray { span, .. }
        | K::CondIsNotBool { span, .. }
        | K::InvalidUnaryOpType { span, .. }
        | K::AssertFailed { span, .. }
        | K::ExplicitError { span, .. }
        | K::ImportFailed { span, .. } => Some(*span),
        K::CalleeIsNotFunction { span, .. }
        | K::TooManyCallArgs { span, .. }
        | K::UnknownCallParam { span, .. }
        | K::RepeatedCallParam { span, .. }
        | K::CallParamNotBound { span, .. }
        | K::InvalidBinaryOpTypes { span, .. }
        | K::NumberNotBitwiseSafe { span }
        | K::NumberOverflow { span }
        | K::NumberNan { span }
        | K::DivByZero { span }
        | K::ShiftByNegative { span }
        | K::Other { span, .. } => *span,
        _ => None,
    }
}

fn trace_span(item: &EvalStackTraceItem) -> Option<SpanId> {
    match item {
        EvalStackTraceItem::Expr { span }
        | EvalStackTraceItem::Variable { span, .. }
        | EvalStackTraceItem::Import { span } => Some(*span),
        EvalStackTraceItem::Call { span, .. }
        | EvalStackTraceItem::ArrayItem { span, .. }
        | EvalStackTraceItem::ObjectField { span, .. } => *span,
        _ => None,
    }
}

/// An error value's `Debug` as words: its variant name lowercased, its
/// fields without the spans (the location is said apart).
fn describe(error: &impl std::fmt::Debug) -> String {
    words(&format!("{error:?}"))
}

fn words(debug: &str) -> String {
    static SPAN: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(
            r"\w*span: (?:Some\()?(?:Inline \{ offset: \d+, len: \d+ \}|Interned\(\d+\)|None)\)?(?:, )?",
        )
        .expect("a valid pattern")
    });
    let text = SPAN.replace_all(debug, "");
    let text = text.replace(" {  }", "").replace(" { }", "");
    let (name, rest) = match text.find([' ', '(']) {
        Some(at) => text.split_at(at),
        None => (text.as_str(), ""),
    };
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.extend(c.to_lowercase());
    }
    let rest = rest.trim();
    let rest = rest
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .map(str::trim)
        .unwrap_or(rest);
    if rest.is_empty() {
        out
    } else {
        format!("{out} ({rest})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::render::ManifestLimits;

    fn file(path: &str, contents: &str) -> SourceFile {
        SourceFile {
            path: path.into(),
            contents: contents.as_bytes().to_vec(),
        }
    }

    fn budget() -> Budget {
        Budget::new(ManifestLimits::default(), 32 << 20)
    }

    fn run(
        files: &[SourceFile],
        links: &[Symlink],
        options: &JsonnetSource,
    ) -> Result<Evaluated, RenderError> {
        render(files, links, "app", options, &mut budget())
    }

    fn names(evaluated: &Evaluated) -> Vec<&str> {
        evaluated
            .manifests
            .iter()
            .map(|m| m.id.name.as_str())
            .collect()
    }

    fn var(name: &str, value: &str, code: bool) -> JsonnetVar {
        JsonnetVar {
            name: name.into(),
            value: value.into(),
            code,
        }
    }

    const LIB: &str = "{ cm(name, data):: { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: name }, data: data } }";

    #[test]
    fn a_function_gets_its_tlas_and_reads_ext_vars_and_libs() {
        let files = [
            file("vendor/k.libsonnet", LIB),
            file(
                "app/main.jsonnet",
                "local k = import 'k.libsonnet';\n\
                 function(replicas, name='web') [\n\
                   k.cm(name, { replicas: std.toString(replicas), env: std.extVar('env') }),\n\
                   k.cm(name + '-' + std.extVar('region').zone, {}),\n\
                 ]\n",
            ),
            file(
                "app/plain.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: plain}\n",
            ),
            file(
                "app/helpers.libsonnet",
                "error 'never evaluated on its own'",
            ),
            file("unrelated/x.jsonnet", "error 'outside the path'"),
        ];
        let options = JsonnetSource {
            ext_vars: vec![
                var("env", "prod", false),
                var("region", "{zone: 'eu'}", true),
            ],
            tlas: vec![var("replicas", "3", true), var("name", "api", false)],
            libs: vec!["vendor".into()],
        };
        let evaluated = run(&files, &[], &options).unwrap();
        assert_eq!(names(&evaluated), ["plain", "api", "api-eu"]);
        let data = &evaluated.manifests[1].body["data"];
        assert_eq!(data["replicas"], "3");
        assert_eq!(data["env"], "prod");
        assert_eq!(evaluated.manifests[1].origin.file, "app/main.jsonnet");
        assert_eq!(evaluated.read, ["app", "vendor", "vendor/k.libsonnet"]);
    }

    #[test]
    fn an_object_is_one_manifest_and_a_list_is_flattened() {
        let files = [
            file(
                "app/one.jsonnet",
                "{ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'one' } }",
            ),
            file(
                "app/list.jsonnet",
                "{ apiVersion: 'v1', kind: 'List', items: [\
                 { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'a' } },\
                 { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'b' } }] }",
            ),
            file("app/empty.jsonnet", "[]"),
        ];
        let evaluated = run(&files, &[], &JsonnetSource::default()).unwrap();
        assert_eq!(names(&evaluated), ["a", "b", "one"]);
        // A non-function ignores top-level arguments.
        let options = JsonnetSource {
            tlas: vec![var("unused", "1", false)],
            ..Default::default()
        };
        assert_eq!(run(&files, &[], &options).unwrap().manifests.len(), 3);
    }

    #[test]
    fn a_nested_array_or_a_scalar_is_not_a_manifest() {
        let nested = [file("app/x.jsonnet", "[[{ kind: 'ConfigMap' }]]")];
        let err = run(&nested, &[], &JsonnetSource::default()).unwrap_err();
        assert!(err.to_string().contains("app/x.jsonnet"), "{err}");
        assert!(err.to_string().contains("expected an object"), "{err}");
        let scalar = [file("app/x.jsonnet", "'text'")];
        let err = run(&scalar, &[], &JsonnetSource::default()).unwrap_err();
        assert!(err.to_string().contains("expected an object"), "{err}");
    }

    #[test]
    fn imports_that_leave_the_repository_are_refused() {
        for import in ["../../etc/passwd", "/etc/passwd", "../../../x.libsonnet"] {
            let files = [file(
                "app/main.jsonnet",
                &format!("local x = import '{import}';\nx\n"),
            )];
            let err = run(&files, &[], &JsonnetSource::default()).unwrap_err();
            let message = err.to_string();
            assert_eq!(err.reason(), "InvalidSource", "{message}");
            assert!(
                message.starts_with("app/main.jsonnet:1: import"),
                "{message}"
            );
            assert!(
                message.contains("may only import files of the repository"),
                "{message}"
            );
        }
        // A symlink inside the repository is followed; the file must exist.
        let files = [
            file("shared/k.libsonnet", LIB),
            file("app/main.jsonnet", "(import 'lib/k.libsonnet').cm('x', {})"),
        ];
        let links = [Symlink {
            path: "app/lib".into(),
            target: "../shared".into(),
        }];
        let evaluated = run(&files, &links, &JsonnetSource::default()).unwrap();
        assert_eq!(names(&evaluated), ["x"]);
        assert!(evaluated.read.contains(&"shared/k.libsonnet".to_string()));
        // A lib outside the repository is refused before anything runs.
        let options = JsonnetSource {
            libs: vec!["../vendor".into()],
            ..Default::default()
        };
        let err = run(&files, &links, &options).unwrap_err();
        assert!(
            err.to_string().contains("libs: ../vendor climbs out"),
            "{err}"
        );
    }

    #[test]
    fn errors_name_the_file_and_the_line() {
        let cases = [
            (
                "{\n  a: 1,\n  b: ,\n}\n",
                "app/main.jsonnet:3: syntax error",
            ),
            (
                "local x = 1;\n{ a: y }\n",
                "app/main.jsonnet:2: unknown variable",
            ),
            (
                "{}\n+ { a: error 'boom' }.a\n",
                "app/main.jsonnet:2: error: boom",
            ),
            ("local f(n) = f(n + 1);\nf(0)\n", "too deep"),
            (
                "std.extVar('missing')",
                "undefined external variable: missing",
            ),
            ("function(replicas) {}", "missing argument: replicas"),
            (
                "import 'nope.libsonnet'",
                "app/main.jsonnet:1: import \"nope.libsonnet\": no such file",
            ),
        ];
        for (source, expected) in cases {
            let files = [file("app/main.jsonnet", source)];
            let err = run(&files, &[], &JsonnetSource::default()).unwrap_err();
            assert!(err.to_string().contains(expected), "{source}: {err}");
        }
        // A syntax error in a library names the library.
        let files = [
            file("app/lib.libsonnet", "{\n a: }"),
            file("app/main.jsonnet", "import 'lib.libsonnet'"),
        ];
        let err = run(&files, &[], &JsonnetSource::default()).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("app/lib.libsonnet:2: syntax error"),
            "{err}"
        );
    }

    #[test]
    fn deep_nesting_is_an_error_never_a_crash() {
        let nested = |open: &str, close: &str, depth: usize| {
            format!("{}1{}", open.repeat(depth), close.repeat(depth))
        };
        let sources = [
            nested("[", "]", 200_000),
            nested("{a:", "}", 50_000),
            nested("(", ")", 200_000),
            // Nesting built by calls, not written: Jsonnet's depth limit.
            format!(
                "local f(n) = if n == 0 then [] else [f(n - 1)];\nf({})",
                MAX_DEPTH * 4
            ),
            format!(
                "local f(n) = if n == 0 then {{}} else {{ a: f(n - 1) }};\nf({})",
                MAX_DEPTH * 4
            ),
            // Built in a loop, then manifested.
            "std.foldl(function(acc, _) { a: acc }, std.range(1, 100000), {})".into(),
            "std.foldl(function(acc, _) [acc], std.range(1, 100000), [])".into(),
        ];
        for source in sources {
            // On a thread with the stack the renderer gives evaluations.
            let outcome = std::thread::Builder::new()
                .stack_size(STACK_BYTES)
                .spawn(move || {
                    let files = [file("app/deep.jsonnet", &source)];
                    run(&files, &[], &JsonnetSource::default())
                        .map(|e| e.manifests.len())
                        .map_err(|e| e.to_string())
                })
                .unwrap()
                .join()
                .expect("no panic, no overflow");
            let err = outcome.unwrap_err();
            assert!(err.contains("app/deep.jsonnet"), "{err}");
        }
    }

    #[test]
    fn nesting_is_counted_outside_strings_and_comments() {
        let deep = "[".repeat(MAX_NESTING + 1);
        assert_eq!(too_deep(format!("// {deep}\n{{}}").as_bytes()), None);
        assert_eq!(too_deep(format!("# {deep}\n{{}}").as_bytes()), None);
        assert_eq!(too_deep(format!("/* {deep} */ {{}}").as_bytes()), None);
        assert_eq!(
            too_deep(format!("'{deep}' + \"{deep}\\\"\"").as_bytes()),
            None
        );
        assert_eq!(
            too_deep(format!("@'{deep}''' + |||\n  {deep}\n|||").as_bytes()),
            None
        );
        assert_eq!(
            too_deep(format!("{{\n// x\n# y\n/* z\n */\n{deep}").as_bytes()),
            Some(6)
        );
        assert_eq!(too_deep(b"{ a: [1, (2)] }"), None);
    }

    #[test]
    fn an_output_over_the_budget_is_refused() {
        let files = [file(
            "app/big.jsonnet",
            "{ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'big' }, data: { x: std.join('', std.repeat(['x'], 5000)) } }",
        )];
        let mut small = Budget::new(ManifestLimits::default(), 1000);
        let err = render(&files, &[], "app", &JsonnetSource::default(), &mut small).unwrap_err();
        assert_eq!(err.reason(), "ManifestTooLarge", "{err}");
    }

    #[test]
    fn debug_text_becomes_words_without_spans() {
        assert_eq!(
            words(
                "InvalidBinaryOpTypes { span: Some(Inline { offset: 3, len: 5 }), op: Add, lhs_type: String, rhs_type: Number }"
            ),
            "invalid binary op types (op: Add, lhs_type: String, rhs_type: Number)"
        );
        assert_eq!(words("DivByZero { span: None }"), "div by zero");
        assert_eq!(words("ManifestFunction"), "manifest function");
    }
}
