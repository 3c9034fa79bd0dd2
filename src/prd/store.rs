//! Reading, validating and minimally editing prd.json.
//!
//! Validation runs the generated JSON Schema ([`crate::prd::schema`]) *and* the rules a schema
//! cannot express (unique ids, `dependsOn` naming existing stories, no dependency cycles, whole
//! number priorities), and reports every violation at once with a JSON path (`$.userStories[1].id`)
//! and a hint saying how to fix it, so a user fixes the file in one pass.
//!
//! prd.json belongs to the user and the agent: ralph never re-serializes it. The one edit ralph
//! makes, [`set_passes`], replaces the bytes of a single `passes` value and keeps every other byte
//! (formatting, key order, unknown fields, BOM, CRLF line endings).
//!
//! Accepted input: UTF-8 with or without a byte order mark, LF or CRLF line endings.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::ValidationError;
use serde::{Deserialize as _, Serialize};
use serde_json::Value;

use crate::prd::model::Prd;
use crate::prd::schema;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// A prd.json that was read, parsed and validated.
#[derive(Debug, Clone)]
pub struct LoadedPrd {
    /// Absolute path of the file (made absolute lexically; symlinks are not resolved).
    pub path: PathBuf,
    /// The exact bytes read, BOM included: the snapshot used to restore a file an agent broke.
    pub raw: Vec<u8>,
    /// The parsed document, unknown fields and key order included.
    pub value: Value,
    /// The typed model.
    pub prd: Prd,
}

/// One problem in a prd.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Violation {
    /// Where the problem is, as a JSONPath: `$` for the document, `$.userStories[1].id` for a
    /// field (for a missing field, the path it should have).
    pub json_path: String,
    /// What is wrong, e.g. `expected an integer, got "high"`.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

/// Why a prd.json could not be used. `Display` names the file, every problem's JSON path and the
/// fix (a `hint:` line).
#[derive(Debug, thiserror::Error)]
pub enum PrdError {
    /// The file could not be read (missing, unreadable).
    #[error("cannot read {}: {source}\nhint: {}", path.display(), io_hint(source))]
    Io {
        /// The file, as given.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not JSON at all. `line` and `column` are 1-based (from serde_json).
    #[error(
        "{}:{line}:{column}: not valid JSON: {message}\nhint: fix the JSON syntax at line {line}, \
         column {column} (often a missing comma or quote, or a trailing comma), then run `ralph \
         validate`",
        path.display()
    )]
    NotJson {
        /// The file, as given.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's description, without its position.
        message: String,
    },
    /// The file is JSON but breaks the schema or the semantic rules.
    #[error("{}", render_invalid(path, violations))]
    Invalid {
        /// The file, as given.
        path: PathBuf,
        /// Every problem found, in document order of the stories.
        violations: Vec<Violation>,
    },
    /// [`set_notes`] could not locate the story to edit.
    #[error(
        "cannot set `notes` of story {story_id:?} in prd.json: {reason}\nhint: run `ralph \
         validate` and fix the file"
    )]
    RewriteNotes {
        /// The story whose `notes` was to be set.
        story_id: String,
        /// What was missing.
        reason: String,
    },
    /// [`set_passes`] could not locate the value to rewrite.
    #[error(
        "cannot set `passes` of story {story_id:?} in prd.json: {reason}\nhint: run `ralph \
         validate` and fix the file"
    )]
    Rewrite {
        /// The story whose `passes` was to be set.
        story_id: String,
        /// What was missing.
        reason: String,
    },
}

impl PrdError {
    /// The problems as [`Violation`]s: the list for `Invalid`, one entry at `$` for the others
    /// (used by `ralph validate --json`).
    pub fn violations(&self) -> Vec<Violation> {
        match self {
            PrdError::Invalid { violations, .. } => violations.clone(),
            PrdError::Io { source, .. } => vec![Violation {
                json_path: "$".into(),
                message: format!("cannot read the file: {source}"),
                hint: io_hint(source).into(),
            }],
            PrdError::NotJson {
                line,
                column,
                message,
                ..
            } => vec![Violation {
                json_path: "$".into(),
                message: format!("not valid JSON at line {line}, column {column}: {message}"),
                hint: "fix the JSON syntax there (often a missing comma or quote, or a trailing \
                       comma)"
                    .into(),
            }],
            PrdError::Rewrite { reason, .. } | PrdError::RewriteNotes { reason, .. } => {
                vec![Violation {
                    json_path: "$".into(),
                    message: reason.clone(),
                    hint: "run `ralph validate` and fix the file".into(),
                }]
            }
        }
    }
}

fn io_hint(err: &std::io::Error) -> &'static str {
    match err.kind() {
        std::io::ErrorKind::NotFound => {
            "create one with `ralph init`, or pass the path of your prd.json"
        }
        std::io::ErrorKind::PermissionDenied => "make the file readable by this user",
        _ => "check that the path names a readable file",
    }
}

/// The problems as a list, each with its own indented `  hint:` line (the fix belongs to the
/// problem above it). The error printer keeps such a list whole, and takes a lone hint (one
/// problem) out to print it last, like any other (see `crate::error::split_hint`).
fn render_invalid(path: &Path, violations: &[Violation]) -> String {
    let file = path.display();
    let count = violations.len();
    let noun = if count == 1 { "problem" } else { "problems" };
    let mut out = format!("{file} is not a valid PRD ({count} {noun}):");
    for v in violations {
        // Writing into a String cannot fail.
        let _ = write!(
            out,
            "\n{file}: {}: {}\n  hint: {}",
            v.json_path, v.message, v.hint
        );
    }
    out
}

/// prd.json sizes above which ralph warns at the start of a run: 2 MiB of JSON, or 1,000
/// stories. ralph stays linear past them, but every iteration reads, validates and snapshots the
/// whole file, and the built-in prompt lists every story.
pub const PRD_WARN_BYTES: usize = 2 * 1024 * 1024;
/// See [`PRD_WARN_BYTES`].
pub const PRD_WARN_STORIES: usize = 1_000;

/// A warning when `loaded` is unreasonably large (above [`PRD_WARN_BYTES`] or
/// [`PRD_WARN_STORIES`]): its size, the limits, what it costs and the fix. `None` otherwise.
pub fn size_warning(loaded: &LoadedPrd) -> Option<String> {
    let bytes = loaded.raw.len();
    let stories = loaded.prd.user_stories.len();
    if bytes <= PRD_WARN_BYTES && stories <= PRD_WARN_STORIES {
        return None;
    }
    Some(format!(
        "{} is unreasonably large: {}, {stories} stories (ralph warns above {} or {} stories). \
         Every iteration reads, validates and snapshots the whole file, and the built-in prompt \
         lists every story; split the work into one PRD per feature",
        loaded.path.display(),
        human_bytes(bytes),
        human_bytes(PRD_WARN_BYTES),
        PRD_WARN_STORIES
    ))
}

/// `512 B`, `3.4 KiB`, `41.7 MiB`.
pub fn human_bytes(bytes: usize) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if b < KIB {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else {
        format!("{:.1} MiB", b / KIB / KIB)
    }
}

/// Read and validate the prd.json at `path`.
///
/// # Errors
/// [`PrdError::Io`] if it cannot be read, [`PrdError::NotJson`] if it is not JSON,
/// [`PrdError::Invalid`] (with every violation) if it breaks the schema or the semantic rules.
pub fn load(path: &Path) -> Result<LoadedPrd, PrdError> {
    let bytes = std::fs::read(path).map_err(|source| PrdError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_bytes(path, &bytes)
}

/// The last two prd.json parses of [`load_shared`] and [`parse_shared`], newest last, for the
/// next call with the same file and the same bytes. Two: an iteration's start and what the
/// agent made of it (ralph often puts the file back to the first).
static LAST: std::sync::Mutex<Vec<Arc<LoadedPrd>>> = std::sync::Mutex::new(Vec::new());

/// How many parses [`LAST`] keeps.
const SHARED_PARSES: usize = 2;

/// Like [`load`], shared: when the file's bytes are those of the prd.json this process parsed
/// last (at the same absolute path), that parse is returned again instead of a new one. A run
/// reads prd.json at every stage boundary (start, each iteration, after the agent, the end);
/// with 100,000 stories a parse costs about a second, a read and a comparison of the bytes a few
/// milliseconds. The bytes are always read: an edit, by anyone, is always seen.
///
/// # Errors
/// As [`load`].
pub fn load_shared(path: &Path) -> Result<Arc<LoadedPrd>, PrdError> {
    let bytes = std::fs::read(path).map_err(|source| PrdError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_shared(path, bytes)
}

/// Like [`parse_bytes`] for content read from `path`, shared as [`load_shared`] is: the last
/// parse is returned when `bytes` are the same, and a new parse becomes the last one.
///
/// # Errors
/// As [`parse_bytes`].
pub fn parse_shared(path: &Path, bytes: Vec<u8>) -> Result<Arc<LoadedPrd>, PrdError> {
    let abs = std::path::absolute(path).map_err(|source| PrdError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let kept = LAST.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(hit) = kept.into_iter().find(|l| l.path == abs && l.raw == bytes) {
        return Ok(hit);
    }
    Ok(remember(Arc::new(parse_owned(path, bytes)?)))
}

/// What [`parse_shared`] would return for `raw`, when `raw` is [`set_passes_many`]'s rewrite of
/// `prev.raw` with `edits`: `prev` with those `passes` set, without parsing the file again (a
/// parse of 100,000 stories is a third of a second). `prev` is updated in place when nothing but
/// the shared parses holds it (it leaves them), else copied. The result becomes the last shared
/// parse, as [`parse_shared`]'s do. An id `prev` does not have is left out, as
/// [`set_passes_many`] refuses it.
pub fn with_passes(prev: Arc<LoadedPrd>, raw: Vec<u8>, edits: &[(&str, bool)]) -> Arc<LoadedPrd> {
    let wanted: HashMap<&str, bool> = edits.iter().copied().collect();
    LAST.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|kept| !Arc::ptr_eq(kept, &prev));
    let mut next = Arc::try_unwrap(prev).unwrap_or_else(|shared| (*shared).clone());
    next.raw = raw;
    let mut seen = HashSet::new();
    for story in &mut next.prd.user_stories {
        if let Some(&passes) = wanted.get(story.id.as_str()) {
            if seen.insert(story.id.clone()) {
                story.passes = passes;
            }
        }
    }
    seen.clear();
    if let Some(stories) = next
        .value
        .get_mut("userStories")
        .and_then(Value::as_array_mut)
    {
        for story in stories {
            let hit = story
                .get("id")
                .and_then(Value::as_str)
                .and_then(|id| wanted.get(id).map(|&passes| (id.to_owned(), passes)));
            if let Some((id, passes)) = hit {
                if seen.insert(id) {
                    story["passes"] = Value::Bool(passes);
                }
            }
        }
    }
    remember(Arc::new(next))
}

/// Makes `loaded` the newest of the shared parses ([`LAST`]) and returns it.
fn remember(loaded: Arc<LoadedPrd>) -> Arc<LoadedPrd> {
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    last.push(Arc::clone(&loaded));
    let excess = last.len().saturating_sub(SHARED_PARSES);
    last.drain(..excess);
    loaded
}

/// Parse and validate prd.json content that was read from `path` (used in messages and made
/// absolute for [`LoadedPrd::path`]). A leading UTF-8 BOM is skipped; CRLF is plain whitespace.
///
/// # Errors
/// [`PrdError::NotJson`] if the bytes are not JSON (including invalid UTF-8),
/// [`PrdError::Invalid`] with every violation otherwise, [`PrdError::Io`] only if the current
/// directory is needed to make `path` absolute and cannot be read.
pub fn parse_bytes(path: &Path, bytes: &[u8]) -> Result<LoadedPrd, PrdError> {
    parse_owned(path, bytes.to_vec())
}

/// [`parse_bytes`] keeping `bytes` as [`LoadedPrd::raw`] (no copy of a large file).
fn parse_owned(path: &Path, bytes: Vec<u8>) -> Result<LoadedPrd, PrdError> {
    let body = bytes.strip_prefix(BOM).unwrap_or(&bytes);
    let value: Value = serde_json::from_slice(body).map_err(|err| PrdError::NotJson {
        path: path.to_path_buf(),
        line: err.line(),
        column: err.column(),
        message: strip_position(&err.to_string()),
    })?;
    // Fast path for a valid file (every iteration reads prd.json several times, and running the
    // JSON Schema over 100,000 stories costs more than parsing them): the typed model accepts
    // exactly what the schema accepts except blank ids and an empty story list, checked here, so
    // the schema only runs when something is wrong, to say what. Deserialized from the borrowed
    // document: no copy of a file that may hold 100,000 stories.
    let typed = Prd::deserialize(&value)
        .ok()
        .filter(|p| {
            !p.user_stories.is_empty() && p.user_stories.iter().all(|s| !s.id.trim().is_empty())
        })
        .filter(|_| semantic_violations(&value).is_empty());
    let prd = match typed {
        Some(prd) => prd,
        None => validated(path, &value)?,
    };
    let abs = std::path::absolute(path).map_err(|source| PrdError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(LoadedPrd {
        path: abs,
        raw: bytes,
        value,
        prd,
    })
}

/// The slow path of [`parse_bytes`]: every violation of the schema and the semantic rules, or
/// the typed model when there is none.
fn validated(path: &Path, value: &Value) -> Result<Prd, PrdError> {
    let violations = validate_value(value);
    if !violations.is_empty() {
        return Err(PrdError::Invalid {
            path: path.to_path_buf(),
            violations,
        });
    }
    // The schema and the checks above cover every way the model can fail to deserialize; this
    // only guards against the two drifting apart.
    Prd::deserialize(value).map_err(|err| PrdError::Invalid {
        path: path.to_path_buf(),
        violations: vec![Violation {
            json_path: "$".into(),
            message: err.to_string(),
            hint: "fix the field named in the message (see prd.schema.json)".into(),
        }],
    })
}

/// serde_json appends " at line L column C" to its messages; the position is reported separately.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

/// Every problem in a parsed prd.json document: JSON Schema violations first, then the semantic
/// rules (unique non-blank ids, `dependsOn` ids that exist, no dependency cycles, priorities that
/// fit a 64-bit integer), ordered by story. Empty when the document is valid.
pub fn validate_value(value: &Value) -> Vec<Violation> {
    let mut found: Vec<(Option<usize>, Violation)> = Vec::new();
    match schema::validator() {
        Ok(validator) => {
            for err in validator.iter_errors(value) {
                let segments = segments_of(value, err.instance_path.as_str());
                found.push((story_index(&segments), schema_violation(&err, segments)));
            }
        }
        Err(err) => found.push((
            None,
            Violation {
                json_path: "$".into(),
                message: err.to_string(),
                hint: "report this bug; validation is impossible until it is fixed".into(),
            },
        )),
    }
    found.extend(semantic_violations(value));
    // Stable: keeps the validator's order within one story.
    found.sort_by_key(|(story, _)| story.map_or(0, |i| i + 1));
    found.into_iter().map(|(_, v)| v).collect()
}

/// A step in a JSON path.
#[derive(Debug, Clone, PartialEq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn render_path(segments: &[Seg]) -> String {
    let mut out = String::from("$");
    for seg in segments {
        match seg {
            Seg::Index(i) => {
                let _ = write!(out, "[{i}]");
            }
            Seg::Key(k) if is_identifier(k) => {
                let _ = write!(out, ".{k}");
            }
            Seg::Key(k) => {
                let quoted = serde_json::to_string(k).unwrap_or_else(|_| format!("{k:?}"));
                let _ = write!(out, "[{quoted}]");
            }
        }
    }
    out
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Turn a JSON Pointer into path segments, using the document to tell array indices from object
/// keys that look like numbers.
fn segments_of(root: &Value, pointer: &str) -> Vec<Seg> {
    let mut segments = Vec::new();
    let mut current = Some(root);
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        match (current, token.parse::<usize>()) {
            (Some(Value::Array(items)), Ok(i)) => {
                current = items.get(i);
                segments.push(Seg::Index(i));
            }
            (Some(Value::Object(map)), _) => {
                current = map.get(&token);
                segments.push(Seg::Key(token));
            }
            _ => {
                current = None;
                segments.push(Seg::Key(token));
            }
        }
    }
    segments
}

/// `Some(i)` when the path is inside `userStories[i]`.
fn story_index(segments: &[Seg]) -> Option<usize> {
    match segments {
        [Seg::Key(k), Seg::Index(i), ..] if k == "userStories" => Some(*i),
        _ => None,
    }
}

fn schema_violation(err: &ValidationError<'_>, mut segments: Vec<Seg>) -> Violation {
    let message = match &err.kind {
        ValidationErrorKind::Required { property } => {
            let name = property
                .as_str()
                .map_or_else(|| property.to_string(), str::to_string);
            segments.push(Seg::Key(name.clone()));
            format!("required field `{name}` is missing")
        }
        ValidationErrorKind::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => article(&t.to_string()),
                TypeKind::Multiple(set) => set
                    .iter()
                    .map(|t| article(&t.to_string()))
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            format!("expected {expected}, got {}", describe(&err.instance))
        }
        ValidationErrorKind::Pattern { .. } if last_key(&segments) == Some("id") => {
            format!("id is empty or blank ({})", describe(&err.instance))
        }
        _ => err.to_string(),
    };
    let hint = hint_for(&segments);
    Violation {
        json_path: render_path(&segments),
        message,
        hint,
    }
}

fn article(json_type: &str) -> String {
    match json_type {
        "integer" | "array" | "object" => format!("an {json_type}"),
        "null" => "null".to_string(),
        other => format!("a {other}"),
    }
}

/// A short description of a JSON value for messages: scalars verbatim, containers by kind.
fn describe(value: &Value) -> String {
    match value {
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
        Value::String(s) if s.chars().count() > 40 => {
            let head: String = s.chars().take(40).collect();
            format!("{}…", serde_json::Value::String(head))
        }
        scalar => scalar.to_string(),
    }
}

fn last_key(segments: &[Seg]) -> Option<&str> {
    segments.iter().rev().find_map(|seg| match seg {
        Seg::Key(k) => Some(k.as_str()),
        Seg::Index(_) => None,
    })
}

/// How to fix a problem at `segments`, by the field it concerns.
fn hint_for(segments: &[Seg]) -> String {
    let in_story = story_index(segments).is_some();
    let hint = match segments {
        [] => {
            "a prd.json is one JSON object with `project` and `userStories` (see prd.schema.json)"
        }
        [Seg::Key(k), Seg::Index(_)] if k == "userStories" => {
            "each story is an object with `id`, `title`, `acceptanceCriteria`, `priority` and \
             `passes`"
        }
        _ => match (in_story, last_key(segments)) {
            (false, Some("project")) => "set `project` to the project's name, e.g. \"My App\"",
            (false, Some("userStories")) => {
                "set `userStories` to an array of at least one story object (`ralph init` writes a starter, `ralph plan` drafts them)"
            }
            (false, Some("branchName" | "baseBranch")) => {
                "use a branch name string such as \"ralph/my-feature\", or remove the field"
            }
            (false, Some("$schema")) => {
                "use the path or URL of prd.schema.json, or remove the field"
            }
            (_, Some("description" | "notes")) => {
                "use a string (\"\" when there is nothing to say)"
            }
            (true, Some("id")) => {
                "give every story a unique, non-blank string id such as \"US-001\""
            }
            (true, Some("title")) => "give the story a short `title` string",
            (true, Some("acceptanceCriteria")) => {
                "list verifiable checks as an array of strings, e.g. [\"Typecheck passes\"]"
            }
            (true, Some("priority")) => {
                "set `priority` to a whole number without quotes; 1 runs first"
            }
            (true, Some("passes")) => {
                "set `passes` to false (without quotes) until the story is done"
            }
            (true, Some("dependsOn")) => {
                "list the ids of stories that must pass first as strings, e.g. [\"US-001\"]"
            }
            _ => "see prd.schema.json for the expected shape",
        },
    };
    hint.to_string()
}

/// The rules the schema cannot express, checked on the raw document so they are reported even
/// when other fields are broken.
fn semantic_violations(value: &Value) -> Vec<(Option<usize>, Violation)> {
    let mut out = Vec::new();
    let Some(stories) = value.get("userStories").and_then(Value::as_array) else {
        return out;
    };
    let path = |i: usize, rest: &[Seg]| {
        let mut segs = vec![Seg::Key("userStories".into()), Seg::Index(i)];
        segs.extend_from_slice(rest);
        render_path(&segs)
    };

    // First occurrence of each id; later ones are duplicates.
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, story) in stories.iter().enumerate() {
        if let Some(p) = story.get("priority") {
            // JSON Schema counts 1.0 and 2^63 as integers; the model needs an i64. Fractions are
            // already reported by the schema.
            let integral = p.is_u64() || p.as_f64().is_some_and(|f| f.fract() == 0.0);
            if p.as_i64().is_none() && integral {
                out.push((
                    Some(i),
                    Violation {
                        json_path: path(i, &[Seg::Key("priority".into())]),
                        message: format!(
                            "expected a whole number without a decimal point that fits in 64 \
                             bits, got {p}"
                        ),
                        hint: hint_for(&[
                            Seg::Key("userStories".into()),
                            Seg::Index(i),
                            Seg::Key("priority".into()),
                        ]),
                    },
                ));
            }
        }
        // Blank ids are reported by the schema; they name nothing a dependency could point at.
        let Some(id) = story
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.trim().is_empty())
        else {
            continue;
        };
        match first.get(id) {
            Some(&earlier) => out.push((
                Some(i),
                Violation {
                    json_path: path(i, &[Seg::Key("id".into())]),
                    message: format!(
                        "duplicate id {:?}, already used by {}",
                        id,
                        path(earlier, &[])
                    ),
                    hint: "give every story a unique id, e.g. the next free US-NNN number".into(),
                },
            )),
            None => {
                first.insert(id, i);
            }
        }
    }

    // The ids in file order, for the hint of an unknown dependency only (sorting 100,000 ids
    // on every parse of a valid file was a tenth of the parse).
    let known = std::cell::OnceCell::new();
    let known = || -> &Vec<&str> {
        known.get_or_init(|| {
            let mut ids: Vec<(&str, usize)> = first.iter().map(|(k, v)| (*k, *v)).collect();
            ids.sort_by_key(|(_, i)| *i);
            ids.into_iter().map(|(k, _)| k).collect()
        })
    };
    // Edges from a story (by index) to the stories it depends on (by index of first occurrence).
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); stories.len()];
    for (i, story) in stories.iter().enumerate() {
        let Some(deps) = story.get("dependsOn").and_then(Value::as_array) else {
            continue;
        };
        for (j, dep) in deps.iter().enumerate() {
            let Some(dep) = dep.as_str() else { continue };
            match first.get(dep) {
                // A story waiting for itself would never start: said as such, not as a cycle.
                Some(&target) if target == i => out.push((
                    Some(i),
                    Violation {
                        json_path: path(i, &[Seg::Key("dependsOn".into()), Seg::Index(j)]),
                        message: format!("story {dep:?} depends on itself"),
                        hint: format!("remove {dep:?} from its own dependsOn"),
                    },
                )),
                Some(&target) => edges[i].push(target),
                None => out.push((
                    Some(i),
                    Violation {
                        json_path: path(i, &[Seg::Key("dependsOn".into()), Seg::Index(j)]),
                        message: format!("unknown story id {dep:?}"),
                        hint: format!("use the id of a story in this file ({})", list_ids(known())),
                    },
                )),
            }
        }
    }

    for cycle in find_cycles(&edges) {
        let start = cycle.iter().copied().min().unwrap_or(0);
        let ids: Vec<String> = cycle
            .iter()
            .chain(cycle.first())
            .map(|&i| {
                stories[i]
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("#{i}"), str::to_string)
            })
            .collect();
        out.push((
            Some(start),
            Violation {
                json_path: path(start, &[Seg::Key("dependsOn".into())]),
                message: format!("dependency cycle: {}", ids.join(" → ")),
                hint: "remove one of these dependsOn entries so the stories can run in some order"
                    .into(),
            },
        ));
    }
    out
}

fn list_ids(ids: &[&str]) -> String {
    const SHOWN: usize = 10;
    if ids.is_empty() {
        return "there are none yet".into();
    }
    let mut out = format!("known ids: {}", ids[..ids.len().min(SHOWN)].join(", "));
    if ids.len() > SHOWN {
        let _ = write!(out, ", … ({} in all)", ids.len());
    }
    out
}

/// Every elementary cycle that a depth-first search meets, each once, rotated to start at its
/// lowest index and listed in dependency order. Nodes in a cycle are not revisited, so a tangle
/// of overlapping cycles is reported through at least one cycle per strongly connected part.
///
/// Iterative, with an explicit stack: a dependency chain of 100,000 stories would overflow the
/// thread's stack as recursion. The path's positions are kept in a map, so closing a cycle costs
/// the cycle's length, not the path's.
fn find_cycles(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    let mut marks = vec![Mark::New; edges.len()];
    let mut cycles = Vec::new();
    let mut seen: HashSet<Vec<usize>> = HashSet::new();
    // The current path, each node with the index of its next edge to follow.
    let mut path: Vec<(usize, usize)> = Vec::new();
    let mut position: HashMap<usize, usize> = HashMap::new();
    for root in 0..edges.len() {
        if marks[root] != Mark::New {
            continue;
        }
        marks[root] = Mark::OnStack;
        position.insert(root, 0);
        path.push((root, 0));
        while let Some(&mut (node, ref mut next_edge)) = path.last_mut() {
            let Some(&next) = edges[node].get(*next_edge) else {
                path.pop();
                position.remove(&node);
                marks[node] = Mark::Done;
                continue;
            };
            *next_edge += 1;
            match marks[next] {
                Mark::New => {
                    marks[next] = Mark::OnStack;
                    position.insert(next, path.len());
                    path.push((next, 0));
                }
                Mark::OnStack => {
                    if let Some(&pos) = position.get(&next) {
                        let mut cycle: Vec<usize> = path[pos..].iter().map(|&(n, _)| n).collect();
                        if let Some(min_at) = cycle
                            .iter()
                            .enumerate()
                            .min_by_key(|&(_, n)| *n)
                            .map(|(at, _)| at)
                        {
                            cycle.rotate_left(min_at);
                        }
                        if seen.insert(cycle.clone()) {
                            cycles.push(cycle);
                        }
                    }
                }
                Mark::Done => {}
            }
        }
    }
    cycles
}

/// Where story `story_id` is in `raw`: the BOM offset and the byte range of the story's object
/// in the text after it. The document is parsed to find the story's index, then the original text
/// is scanned, so nothing is re-serialized. `rewrite` builds the caller's error for a reason.
fn locate_story(
    raw: &[u8],
    story_id: &str,
    rewrite: &dyn Fn(&str) -> PrdError,
) -> Result<(usize, Range<usize>), PrdError> {
    let offset = if raw.starts_with(BOM) { BOM.len() } else { 0 };
    let body = &raw[offset..];
    let value: Value = serde_json::from_slice(body).map_err(|err| PrdError::NotJson {
        path: PathBuf::from("prd.json"),
        line: err.line(),
        column: err.column(),
        message: strip_position(&err.to_string()),
    })?;
    let index = value
        .get("userStories")
        .and_then(Value::as_array)
        .and_then(|stories| {
            stories
                .iter()
                .position(|s| s.get("id").and_then(Value::as_str) == Some(story_id))
        })
        .ok_or_else(|| rewrite("no story has this id"))?;
    // The text is valid JSON (checked above), so the scan below only fails on a logic error.
    let scan_failed = |_: ScanError| rewrite("the file could not be scanned");
    let stories_span = Scanner::at(body, 0)
        .object_member("userStories")
        .map_err(scan_failed)?
        .ok_or_else(|| rewrite("`userStories` not found"))?;
    let story_span = Scanner::at(body, stories_span.start)
        .array_element(index)
        .map_err(scan_failed)?
        .ok_or_else(|| rewrite("the story was not found in the text"))?;
    Ok((offset, story_span))
}

/// Return `raw` with the `passes` value of the first story whose `id` is `story_id` replaced by
/// `true` or `false`, every other byte unchanged (BOM, whitespace, CRLF, key order, unknown
/// fields). The document is parsed to find the story's index; the bytes of its `passes` value are
/// then located by scanning the original text, since re-serializing would reformat the file.
/// When a key appears twice in one object, the last occurrence is the one edited, matching what
/// the parser keeps.
///
/// # Errors
/// [`PrdError::NotJson`] (path `prd.json`) if `raw` is not JSON; [`PrdError::Rewrite`] if there is
/// no such story or the story has no `passes` field.
pub fn set_passes(raw: &[u8], story_id: &str, passes: bool) -> Result<Vec<u8>, PrdError> {
    let rewrite = |reason: &str| PrdError::Rewrite {
        story_id: story_id.to_string(),
        reason: reason.to_string(),
    };
    let (offset, story_span) = locate_story(raw, story_id, &rewrite)?;
    let body = &raw[offset..];
    let scan_failed = |_: ScanError| rewrite("the file could not be scanned");
    let passes_span = Scanner::at(body, story_span.start)
        .object_member("passes")
        .map_err(scan_failed)?
        .ok_or_else(|| rewrite("the story has no `passes` field"))?;

    let literal: &[u8] = if passes { b"true" } else { b"false" };
    let mut out = Vec::with_capacity(raw.len() + 1);
    out.extend_from_slice(&raw[..offset + passes_span.start]);
    out.extend_from_slice(literal);
    out.extend_from_slice(&raw[offset + passes_span.end..]);
    Ok(out)
}

/// [`set_passes`] for several stories at once: `raw` with each story's `passes` set, every other
/// byte unchanged. The document is parsed and its story list scanned once, whatever the number
/// of stories (one [`set_passes`] per story would read the whole file each time).
/// `parsed`, when given and parsed from these very bytes, saves the parse.
///
/// # Errors
/// As [`set_passes`], naming the first story that cannot be edited.
pub fn set_passes_many(
    raw: &[u8],
    edits: &[(&str, bool)],
    parsed: Option<&LoadedPrd>,
) -> Result<Vec<u8>, PrdError> {
    let Some(&(first_id, _)) = edits.first() else {
        return Ok(raw.to_vec());
    };
    let rewrite = |story_id: &str, reason: &str| PrdError::Rewrite {
        story_id: story_id.to_string(),
        reason: reason.to_string(),
    };
    let offset = if raw.starts_with(BOM) { BOM.len() } else { 0 };
    let body = &raw[offset..];
    let fresh;
    let value: &Value = match parsed.filter(|p| p.raw == raw) {
        Some(p) => &p.value,
        None => {
            fresh = serde_json::from_slice::<Value>(body).map_err(|err| PrdError::NotJson {
                path: PathBuf::from("prd.json"),
                line: err.line(),
                column: err.column(),
                message: strip_position(&err.to_string()),
            })?;
            &fresh
        }
    };
    // The first story with each id, as `set_passes` finds it.
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, s) in value
        .get("userStories")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if let Some(id) = s.get("id").and_then(Value::as_str) {
            index.entry(id).or_insert(i);
        }
    }
    // Story index -> the literal its `passes` gets (a later edit of the same story wins).
    let mut wanted: HashMap<usize, (&str, bool)> = HashMap::new();
    for &(id, passes) in edits {
        let i = *index
            .get(id)
            .ok_or_else(|| rewrite(id, "no story has this id"))?;
        wanted.insert(i, (id, passes));
    }
    let scan_failed = |_: ScanError| rewrite(first_id, "the file could not be scanned");
    let mut spans: Vec<(Range<usize>, bool)> = Vec::with_capacity(wanted.len());
    let mut failed: Option<PrdError> = None;
    let mut edit = |i: usize, story_start: usize| {
        let Some(&(id, passes)) = wanted.get(&i) else {
            return;
        };
        match Scanner::at(body, story_start).object_member("passes") {
            Ok(Some(span)) => spans.push((span, passes)),
            Ok(None) => {
                failed.get_or_insert_with(|| rewrite(id, "the story has no `passes` field"));
            }
            Err(_) => {
                failed.get_or_insert_with(|| rewrite(id, "the file could not be scanned"));
            }
        }
    };
    // Where each story starts, from serde_json's parser (it borrows each story's text, whose
    // place in `body` is its offset); the byte scanner below only when that fails (say two
    // `userStories` keys, where the last one counts).
    #[derive(serde::Deserialize)]
    struct Stories<'a> {
        #[serde(rename = "userStories", borrow)]
        user_stories: Vec<&'a serde_json::value::RawValue>,
    }
    match serde_json::from_slice::<Stories<'_>>(body) {
        Ok(doc) => {
            for (i, story) in doc.user_stories.iter().enumerate() {
                edit(i, story.get().as_ptr() as usize - body.as_ptr() as usize);
            }
        }
        Err(_) => {
            let stories_span = Scanner::at(body, 0)
                .object_member("userStories")
                .map_err(scan_failed)?
                .ok_or_else(|| rewrite(first_id, "`userStories` not found"))?;
            Scanner::at(body, stories_span.start)
                .elements(|i, story| edit(i, story.start))
                .map_err(scan_failed)?;
        }
    }
    if let Some(e) = failed {
        return Err(e);
    }
    spans.sort_by_key(|(span, _)| span.start);
    let mut out = Vec::with_capacity(raw.len() + spans.len());
    let mut at = 0;
    for (span, passes) in spans {
        out.extend_from_slice(&raw[at..offset + span.start]);
        out.extend_from_slice(if passes { b"true" } else { b"false" });
        at = offset + span.end;
    }
    out.extend_from_slice(&raw[at..]);
    Ok(out)
}

/// Return `raw` with the `notes` of the first story whose `id` is `story_id` set to `notes` (a
/// JSON string, escaped by serde_json), every other byte unchanged, like [`set_passes`]. A story
/// without a `notes` field gets one appended as its last member (`, "notes": "…"` right after the
/// last value, so the closing brace keeps its line); an existing value of any type is replaced.
///
/// # Errors
/// [`PrdError::NotJson`] (path `prd.json`) if `raw` is not JSON; [`PrdError::RewriteNotes`] if
/// there is no such story or it is not an object.
pub fn set_notes(raw: &[u8], story_id: &str, notes: &str) -> Result<Vec<u8>, PrdError> {
    let rewrite = |reason: &str| PrdError::RewriteNotes {
        story_id: story_id.to_string(),
        reason: reason.to_string(),
    };
    let (offset, story_span) = locate_story(raw, story_id, &rewrite)?;
    let body = &raw[offset..];
    let scan_failed = |_: ScanError| rewrite("the file could not be scanned");
    if body.get(story_span.start) != Some(&b'{') {
        return Err(rewrite("the story is not a JSON object"));
    }
    // Display of a JSON string value is its escaped literal, quotes included.
    let literal = Value::String(notes.to_string()).to_string();
    let (at, end, insert) = match Scanner::at(body, story_span.start)
        .object_member("notes")
        .map_err(scan_failed)?
    {
        Some(span) => (span.start, span.end, literal),
        None => {
            // Right after the last non-blank byte before the closing brace.
            let close = story_span.end - 1;
            let mut at = close;
            while at > story_span.start && matches!(body[at - 1], b' ' | b'\t' | b'\n' | b'\r') {
                at -= 1;
            }
            let member = if body[at - 1] == b'{' {
                format!("\"notes\": {literal}")
            } else {
                format!(", \"notes\": {literal}")
            };
            (at, at, member)
        }
    };
    let mut out = Vec::with_capacity(raw.len() + insert.len());
    out.extend_from_slice(&raw[..offset + at]);
    out.extend_from_slice(insert.as_bytes());
    out.extend_from_slice(&raw[offset + end..]);
    Ok(out)
}

/// Return `to` with the value of member `key` of story `story_id` replaced by the bytes that
/// member has in `from` (another version of the same prd.json), every other byte of `to`
/// unchanged, like [`set_passes`]. `None` when the story or the member is missing from either
/// side (a member added or removed cannot be put back byte for byte).
///
/// # Errors
/// [`PrdError::NotJson`] (path `prd.json`) if either is not JSON.
pub fn copy_member(
    from: &[u8],
    to: &[u8],
    story_id: &str,
    key: &str,
) -> Result<Option<Vec<u8>>, PrdError> {
    let rewrite = |reason: &str| PrdError::Rewrite {
        story_id: story_id.to_string(),
        reason: reason.to_string(),
    };
    let member = |raw: &[u8]| -> Result<Option<(usize, Range<usize>)>, PrdError> {
        let (offset, story_span) = match locate_story(raw, story_id, &rewrite) {
            Ok(found) => found,
            Err(PrdError::Rewrite { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let body = &raw[offset..];
        if body.get(story_span.start) != Some(&b'{') {
            return Ok(None);
        }
        Ok(Scanner::at(body, story_span.start)
            .object_member(key)
            .ok()
            .flatten()
            .map(|span| (offset, span)))
    };
    let (Some((from_offset, from_span)), Some((to_offset, to_span))) = (member(from)?, member(to)?)
    else {
        return Ok(None);
    };
    let value = &from[from_offset + from_span.start..from_offset + from_span.end];
    let mut out = Vec::with_capacity(to.len() + value.len());
    out.extend_from_slice(&to[..to_offset + to_span.start]);
    out.extend_from_slice(value);
    out.extend_from_slice(&to[to_offset + to_span.end..]);
    Ok(Some(out))
}

/// The scanner met something that is not JSON where it expected JSON.
#[derive(Debug)]
struct ScanError;

/// A minimal JSON scanner over bytes that finds the byte range of values without building them.
struct Scanner<'a> {
    text: &'a [u8],
    pos: usize,
}

impl<'a> Scanner<'a> {
    fn at(text: &'a [u8], pos: usize) -> Self {
        Scanner { text, pos }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Result<(), ScanError> {
        self.skip_ws();
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(ScanError)
        }
    }

    /// Skip a string starting at the current `"`; returns its span, quotes included.
    fn string(&mut self) -> Result<Range<usize>, ScanError> {
        self.skip_ws();
        let start = self.pos;
        self.eat(b'"')?;
        loop {
            // To the next quote or backslash at once (memchr): prd.json is mostly strings.
            let rest = self.text.get(self.pos..).ok_or(ScanError)?;
            self.pos += memchr::memchr2(b'"', b'\\', rest).ok_or(ScanError)?;
            match self.peek().ok_or(ScanError)? {
                b'\\' => self.pos += 2,
                _ => {
                    self.pos += 1;
                    return Ok(start..self.pos);
                }
            }
        }
    }

    /// Skip any value; returns its span.
    fn value(&mut self) -> Result<Range<usize>, ScanError> {
        self.skip_ws();
        let start = self.pos;
        match self.peek().ok_or(ScanError)? {
            b'"' => return self.string(),
            b'{' => {
                self.members(|_, _| {})?;
            }
            b'[' => {
                self.elements(|_, _| {})?;
            }
            _ => {
                // Number or literal: runs until a structural character or whitespace.
                while let Some(b) = self.peek() {
                    if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.pos += 1;
                }
                if self.pos == start {
                    return Err(ScanError);
                }
            }
        }
        Ok(start..self.pos)
    }

    /// Walk an object, calling `each(key_span, value_span)` per member.
    fn members(
        &mut self,
        mut each: impl FnMut(Range<usize>, Range<usize>),
    ) -> Result<(), ScanError> {
        self.eat(b'{')?;
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            let value = self.value()?;
            each(key, value);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(ScanError),
            }
        }
    }

    /// Walk an array, calling `each(index, value_span)` per element.
    fn elements(&mut self, mut each: impl FnMut(usize, Range<usize>)) -> Result<(), ScanError> {
        self.eat(b'[')?;
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(());
        }
        let mut index = 0;
        loop {
            let value = self.value()?;
            each(index, value);
            index += 1;
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(ScanError),
            }
        }
    }

    /// Span of the value of the last member named `name` of the object here. Keys are decoded
    /// (escapes included) before comparing.
    fn object_member(mut self, name: &str) -> Result<Option<Range<usize>>, ScanError> {
        let text = self.text;
        let mut found = None;
        self.members(|key, value| {
            if serde_json::from_slice::<String>(&text[key]).is_ok_and(|k| k == name) {
                found = Some(value);
            }
        })?;
        Ok(found)
    }

    /// Span of element `index` of the array here.
    fn array_element(mut self, index: usize) -> Result<Option<Range<usize>>, ScanError> {
        let mut found = None;
        self.elements(|i, value| {
            if i == index {
                found = Some(value);
            }
        })?;
        Ok(found)
    }
}

#[cfg(test)]
mod tests;
