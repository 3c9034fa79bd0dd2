//! Small readers shared by the stream parsers: a string field, and the one-line summary of a
//! tool call's input that the live line, `--verbose` and the transcript show.

use serde_json::Value;

/// Longest tool-call summary, in characters.
pub const SUMMARY_MAX_CHARS: usize = 200;

/// `v[key]` when it is a string.
pub fn str_field(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// A one-line description of a tool call's input, whichever CLI's spelling it uses: the command
/// (`command`, amp's `cmd`), the file (`file_path`, opencode's `filePath`, `notebook_path`, gemini's
/// `dir_path`), the search pattern and where (`pattern` in `path`), else a path, URL, query,
/// description, prompt or skill, a todo count, or the compact JSON. Whitespace is collapsed and
/// the result cut at [`SUMMARY_MAX_CHARS`] characters (with `…`).
pub fn summarize_tool_input(input: &Value) -> String {
    summarize_with(
        |key| input.get(key).and_then(Value::as_str),
        input.get("todos").and_then(Value::as_array).map(Vec::len),
        || match input {
            Value::Null => String::new(),
            other => other.to_string(),
        },
    )
}

/// [`summarize_tool_input`] over an input read some other way: `get(key)` is the input's
/// string field `key` (`None` when missing or not a string), `todos` the length of its `todos`
/// array, and `compact()` the input as compact JSON (empty for `null`), asked for only when no
/// field says more.
pub fn summarize_with<'a>(
    get: impl Fn(&str) -> Option<&'a str>,
    todos: Option<usize>,
    compact: impl FnOnce() -> String,
) -> String {
    let text = if let Some(command) = get("command").or_else(|| get("cmd")) {
        command.to_owned()
    } else if let Some(path) = ["file_path", "filePath", "notebook_path", "dir_path"]
        .iter()
        .find_map(|k| get(k))
    {
        path.to_owned()
    } else if let Some(pattern) = get("pattern") {
        match get("path") {
            Some(path) => format!("{pattern} in {path}"),
            None => pattern.to_owned(),
        }
    } else if let Some(s) = ["path", "url", "query", "description", "prompt", "skill"]
        .iter()
        .find_map(|k| get(k))
    {
        s.to_owned()
    } else if let Some(todos) = todos {
        format!("{todos} todos")
    } else {
        compact()
    };
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    truncate_chars(&one_line, SUMMARY_MAX_CHARS)
}

/// Most of a tool's output kept in an event, in bytes (head and tail halves).
pub const TOOL_OUTPUT_KEEP_BYTES: usize = 4096;

/// `text` cut to [`TOOL_OUTPUT_KEEP_BYTES`]: its head and tail, with the size of what was left
/// out noted between them.
pub fn bounded_output(text: &str) -> String {
    if text.len() <= TOOL_OUTPUT_KEEP_BYTES {
        return text.to_owned();
    }
    let half = TOOL_OUTPUT_KEEP_BYTES / 2;
    let mut head_end = half;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - half;
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    format!(
        "{}\n… ({} of {} bytes left out) …\n{}",
        &text[..head_end],
        tail_start - head_end,
        text.len(),
        &text[tail_start..]
    )
}

/// `s` cut to at most `max` characters, with `…` marking a cut.
pub fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((cut, _)) => format!("{}…", &s[..cut]),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_clis_spelling_gives_one_short_line() {
        assert_eq!(
            summarize_tool_input(&json!({"command": "cargo  test\n-q"})),
            "cargo test -q"
        );
        assert_eq!(summarize_tool_input(&json!({"cmd": "ls"})), "ls");
        assert_eq!(
            summarize_tool_input(&json!({"filePath": "/r/a.rs"})),
            "/r/a.rs"
        );
        assert_eq!(summarize_tool_input(&json!({"dir_path": "src"})), "src");
        assert_eq!(
            summarize_tool_input(&json!({"pattern": "fn main", "path": "src"})),
            "fn main in src"
        );
        assert_eq!(summarize_tool_input(&json!({"todos": [1, 2]})), "2 todos");
        assert_eq!(summarize_tool_input(&Value::Null), "");
        assert_eq!(summarize_tool_input(&json!({"x": 1})), r#"{"x":1}"#);
        let long = summarize_tool_input(&json!({"command": "é".repeat(500)}));
        assert_eq!(long.chars().count(), SUMMARY_MAX_CHARS + 1);
        assert!(long.ends_with('…'));
        assert_eq!(
            str_field(&json!({"a": "b", "n": 1}), "a").as_deref(),
            Some("b")
        );
        assert_eq!(str_field(&json!({"n": 1}), "n"), None);
    }
}
