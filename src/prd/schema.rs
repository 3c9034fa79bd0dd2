//! The JSON Schema of prd.json, generated from [`crate::prd::model`] with schemars.
//!
//! The same generated schema is (a) committed as `prd.schema.json` at the crate root, for editors
//! and for users' `"$schema"` field, and (b) compiled once into a `jsonschema` validator that
//! reports every violation with its JSON path. A drift test keeps (a) equal to the generated text;
//! `RALPH_UPDATE_SCHEMA=1 cargo test --features test-fakes schema` rewrites the file.
//!
//! The `jsonschema` dependency has its default features off, so nothing is ever fetched over the
//! network or from disk: the schema only refers to its own `definitions`.

use std::sync::LazyLock;

use crate::prd::model::Prd;

/// The built-in schema did not compile: a bug in ralph, not in the user's file.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the built-in prd.json schema failed to compile: {0} (this is a bug in ralph)")]
pub struct SchemaError(String);

/// The schema in draft-07, the draft every editor understands. Also the cheap one to compile:
/// `jsonschema` checks a schema against its draft's meta-schema before compiling it, and the
/// 2020-12 meta-schema (with `$dynamicRef`) made that cost about 30 MiB of memory for as long as
/// ralph runs, which every agent spawn then had to fork.
fn generated() -> schemars::Schema {
    schemars::generate::SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<Prd>()
}

/// The JSON Schema (draft-07) of prd.json as pretty-printed JSON with a trailing newline:
/// exactly the content of the committed `prd.schema.json`.
pub fn schema_json() -> String {
    let schema = generated();
    // Pretty-printing a `Value` cannot fail (its map keys are strings); fall back to the compact
    // form rather than panic.
    let value = schema.as_value();
    let mut text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    text.push('\n');
    text
}

static VALIDATOR: LazyLock<Result<jsonschema::Validator, String>> = LazyLock::new(|| {
    let schema = generated();
    jsonschema::validator_for(schema.as_value()).map_err(|err| err.to_string())
});

/// The compiled validator for [`schema_json`], built on first use and shared afterwards.
///
/// # Errors
/// [`SchemaError`] if the generated schema does not compile (a ralph bug; a unit test guards it).
pub fn validator() -> Result<&'static jsonschema::Validator, SchemaError> {
    VALIDATOR.as_ref().map_err(|msg| SchemaError(msg.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const REGENERATE: &str = "RALPH_UPDATE_SCHEMA=1 cargo test --features test-fakes schema";

    #[test]
    fn committed_schema_matches_the_model() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/prd.schema.json");
        let generated = schema_json();
        let value = std::env::var("RALPH_UPDATE_SCHEMA").ok();
        if crate::protocol::run_event::schema_update_requested(value.as_deref()) {
            std::fs::write(path, &generated).unwrap();
            return;
        }
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == generated,
            "prd.schema.json is out of date with src/prd/model.rs; regenerate it with `{REGENERATE}`"
        );
    }

    #[test]
    fn schema_requires_the_original_fields() {
        let schema: serde_json::Value = serde_json::from_str(&schema_json()).unwrap();
        assert_eq!(schema["required"], json!(["project", "userStories"]));
        assert_eq!(
            schema["definitions"]["Story"]["required"],
            json!(["id", "title", "acceptanceCriteria", "priority", "passes"])
        );
    }

    #[test]
    fn validator_accepts_a_minimal_prd_and_rejects_a_bad_one() {
        let v = validator().unwrap();
        let good = json!({"project": "p", "userStories": [{
            "id": "US-001", "title": "t", "acceptanceCriteria": [], "priority": 1, "passes": false
        }]});
        assert!(v.is_valid(&good));
        let bad = json!({"project": "p", "userStories": [{
            "id": " ", "title": "t", "acceptanceCriteria": [], "priority": "1", "passes": false
        }]});
        assert_eq!(v.iter_errors(&bad).count(), 2);
    }
}
