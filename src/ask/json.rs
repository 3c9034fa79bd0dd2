//! Pulling the JSON document out of an agent's reply: agents wrap it in a Markdown fence, put a
//! sentence before it, print log lines before it (an exec agent's whole stdout), pretty-print it
//! over many lines, or answer with nothing but the JSON.

use serde_json::Value;

/// The JSON object in `text`: the last top-level object that has the field `key`, else the
/// last top-level object (the document an agent settles on comes after its chatter, its log
/// lines and any example it quotes). A top-level object is the first complete JSON value from a
/// `{` (over any number of lines, inside a ```` ```json ```` fence or not) that is not inside
/// an object found before it. `None` when no object parses.
pub fn extract(text: &str, key: &str) -> Option<Value> {
    let mut candidates = top_level_objects(text);
    match candidates.iter().rposition(|c| c.get(key).is_some()) {
        Some(i) => Some(candidates.swap_remove(i)),
        None => candidates.pop(),
    }
}

/// Every JSON object in `text` that starts at a `{` outside an object found before it, in
/// order. A `{` that starts no complete object (a brace in a log line) is skipped.
fn top_level_objects(text: &str) -> Vec<Value> {
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = text[at..].find('{') {
        let start = at + offset;
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(v @ Value::Object(_))) => {
                found.push(v);
                at = start + stream.byte_offset();
            }
            _ => at = start + 1,
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_object_in_every_usual_wrapping() {
        let bare = r#"{"userStories": [], "project": "p"}"#;
        assert_eq!(extract(bare, "userStories").unwrap()["project"], "p");
        let fenced = "Here it is:\n```json\n{\"userStories\": [1]}\n```\nDone.";
        assert_eq!(
            extract(fenced, "userStories").unwrap(),
            json!({"userStories": [1]})
        );
        let chatty = "An example {\"a\": 1} and the real one: {\"userStories\": [2]} ok";
        assert_eq!(
            extract(chatty, "userStories").unwrap(),
            json!({"userStories": [2]})
        );
        let unterminated = "```json\n{\"userStories\": [3]}\n";
        assert_eq!(
            extract(unterminated, "userStories").unwrap(),
            json!({"userStories": [3]})
        );
        assert_eq!(
            extract("{\"a\": 1}", "userStories").unwrap(),
            json!({"a": 1})
        );
        assert!(extract("no json here", "userStories").is_none());
        // Pretty-printed after log lines, a log line that is JSON too, braces in plain text.
        let logged = "starting agent {pid 12}\n{\"level\": \"info\"}\n{\n  \"userStories\": [\n    {\"id\": \"US-001\"}\n  ]\n}\nbye";
        assert_eq!(
            extract(logged, "userStories").unwrap(),
            json!({"userStories": [{"id": "US-001"}]})
        );
        // A draft, then the corrected document: the last one is the answer.
        let twice = "draft: {\"userStories\": [1]}\nfinal:\n```json\n{\"userStories\": [2]}\n```";
        assert_eq!(
            extract(twice, "userStories").unwrap(),
            json!({"userStories": [2]})
        );
        assert!(extract("{\"userStories\": [", "userStories").is_none());
    }
}
