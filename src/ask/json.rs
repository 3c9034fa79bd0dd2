//! Pulling the JSON document out of an agent's reply: agents wrap it in a Markdown fence, put a
//! sentence before it, or answer with nothing but the JSON.

use serde_json::Value;

/// The JSON object in `text`: the first candidate object that has the top-level field `key`,
/// else the first candidate object. Candidates, in order: the contents of fenced code blocks
/// (```` ```json ```` or a bare fence), then every object that starts at a `{` anywhere in the
/// text (the first complete JSON value from there; trailing text is ignored). `None` when no
/// object parses.
pub fn extract(text: &str, key: &str) -> Option<Value> {
    let mut candidates: Vec<Value> = Vec::new();
    for block in fenced_blocks(text) {
        if let Some(v) = first_object(block) {
            candidates.push(v);
        }
    }
    for (start, _) in text.match_indices('{') {
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        if let Some(Ok(v @ Value::Object(_))) = stream.next() {
            candidates.push(v);
        }
        if candidates.iter().any(|c| c.get(key).is_some()) {
            break;
        }
    }
    let keyed = candidates.iter().position(|c| c.get(key).is_some());
    match keyed {
        Some(i) => Some(candidates.swap_remove(i)),
        None => candidates.into_iter().next(),
    }
}

/// The first JSON object in `text` (which may have text around it).
fn first_object(text: &str) -> Option<Value> {
    let start = text.find('{')?;
    let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    match stream.next() {
        Some(Ok(v @ Value::Object(_))) => Some(v),
        _ => None,
    }
}

/// The bodies of the fenced code blocks (``` or ~~~) in `text`, in order.
fn fenced_blocks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```").or_else(|| rest.find("~~~")) {
        let fence = &rest[open..open + 3];
        let after = &rest[open + 3..];
        let Some(body_start) = after.find('\n') else {
            break;
        };
        let body = &after[body_start + 1..];
        match body.find(fence) {
            Some(close) => {
                out.push(&body[..close]);
                rest = &body[close + 3..];
            }
            None => {
                out.push(body);
                break;
            }
        }
    }
    out
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
        assert!(extract("{\"userStories\": [", "userStories").is_none());
    }
}
