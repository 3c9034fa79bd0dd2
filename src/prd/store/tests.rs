//! Unit tests of [`super`]: parsing, validation and byte-exact rewrites of prd.json.

use std::sync::Arc;

use super::*;
use serde_json::json;

fn valid_doc() -> Value {
    json!({
        "project": "demo",
        "userStories": [
            {"id": "US-001", "title": "a", "acceptanceCriteria": [], "priority": 1, "passes": false},
            {"id": "US-002", "title": "b", "acceptanceCriteria": [], "priority": 2, "passes": false,
             "dependsOn": ["US-001"]}
        ]
    })
}

fn paths(violations: &[Violation]) -> Vec<&str> {
    violations.iter().map(|v| v.json_path.as_str()).collect()
}

#[test]
fn a_valid_document_has_no_violations() {
    assert_eq!(validate_value(&valid_doc()), []);
}

#[test]
fn every_violation_is_reported_with_its_path() {
    let mut doc = valid_doc();
    doc["userStories"][0]
        .as_object_mut()
        .unwrap()
        .remove("passes");
    doc["userStories"][1]["priority"] = json!("high");
    doc["userStories"][1]["id"] = json!("US-001");
    doc.as_object_mut().unwrap().remove("project");
    let v = validate_value(&doc);
    assert_eq!(
        paths(&v),
        [
            "$.project",
            "$.userStories[0].passes",
            "$.userStories[1].priority",
            "$.userStories[1].id"
        ]
    );
    assert_eq!(v[0].message, "required field `project` is missing");
    assert_eq!(v[2].message, "expected an integer, got \"high\"");
    assert!(v[2].hint.contains("whole number"), "{}", v[2].hint);
    assert!(
        v[3].message.contains("duplicate id \"US-001\"")
            && v[3].message.contains("$.userStories[0]"),
        "{}",
        v[3].message
    );
}

#[test]
fn top_level_array_and_blank_id_and_fractional_priority() {
    let v = validate_value(&json!([1, 2]));
    assert_eq!(paths(&v), ["$"]);
    assert_eq!(v[0].message, "expected an object, got an array");

    let mut doc = valid_doc();
    doc["userStories"][0]["id"] = json!("  ");
    doc["userStories"][1]["priority"] = json!(1.5);
    doc["userStories"][1]["dependsOn"] = json!([]);
    let v = validate_value(&doc);
    assert_eq!(
        paths(&v),
        ["$.userStories[0].id", "$.userStories[1].priority"],
        "{v:#?}"
    );
    assert!(v[0].message.contains("empty or blank"));

    // 1.0 is an integer to JSON Schema but not to the model: reported once, by the rules.
    doc["userStories"][0]["id"] = json!("US-001");
    doc["userStories"][1]["priority"] = json!(1.0);
    let v = validate_value(&doc);
    assert_eq!(paths(&v), ["$.userStories[1].priority"], "{v:#?}");
    assert!(v[0].message.contains("got 1.0"), "{}", v[0].message);
}

#[test]
fn unknown_dependencies_and_cycles_are_reported() {
    let mut doc = valid_doc();
    doc["userStories"][1]["dependsOn"] = json!(["US-001", "US-404"]);
    let v = validate_value(&doc);
    assert_eq!(paths(&v), ["$.userStories[1].dependsOn[1]"]);
    assert_eq!(v[0].message, "unknown story id \"US-404\"");
    assert!(v[0].hint.contains("US-001, US-002"), "{}", v[0].hint);

    doc["userStories"][0]["dependsOn"] = json!(["US-002"]);
    doc["userStories"][1]["dependsOn"] = json!(["US-001"]);
    let v = validate_value(&doc);
    assert_eq!(paths(&v), ["$.userStories[0].dependsOn"]);
    assert_eq!(v[0].message, "dependency cycle: US-001 → US-002 → US-001");

    doc["userStories"][0]["dependsOn"] = json!(["US-001"]);
    doc["userStories"][1]["dependsOn"] = json!([]);
    let v = validate_value(&doc);
    assert_eq!(paths(&v), ["$.userStories[0].dependsOn[0]"]);
    assert_eq!(v[0].message, "story \"US-001\" depends on itself");
    assert_eq!(v[0].hint, "remove \"US-001\" from its own dependsOn");
}

#[test]
fn parse_bytes_accepts_bom_and_crlf_and_keeps_raw() {
    let text = "{\r\n  \"project\": \"demo\",\r\n  \"userStories\": [{\"id\": \"A\", \"title\": \"t\", \"acceptanceCriteria\": [], \"priority\": 1, \"passes\": false}]\r\n}\r\n";
    let mut bytes = BOM.to_vec();
    bytes.extend_from_slice(text.as_bytes());
    let loaded = parse_bytes(Path::new("prd.json"), &bytes).unwrap();
    assert_eq!(loaded.raw, bytes);
    assert!(loaded.path.is_absolute());
    assert!(loaded.path.ends_with("prd.json"));
    assert_eq!(loaded.prd.project, "demo");
}

#[test]
fn errors_name_the_file_path_and_fix() {
    let err = parse_bytes(Path::new("dir/prd.json"), b"{\"project\": }").unwrap_err();
    let PrdError::NotJson { line, column, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!((*line, *column), (1, 13));
    let shown = err.to_string();
    assert!(shown.starts_with("dir/prd.json:1:13: not valid JSON: expected value"));
    assert!(shown.contains("\nhint: "));

    let bad = br#"{"project": "p", "userStories": [{"id": "US-1", "title": "t",
        "acceptanceCriteria": [], "priority": "high", "passes": false}]}"#;
    let shown = parse_bytes(Path::new("prd.json"), bad)
        .unwrap_err()
        .to_string();
    assert!(
        shown.contains(
            "prd.json: $.userStories[0].priority: expected an integer, got \"high\"\n  hint: "
        ),
        "{shown}"
    );

    let err = load(Path::new("/nonexistent/prd.json")).unwrap_err();
    assert!(matches!(err, PrdError::Io { .. }));
    assert!(err.to_string().contains("/nonexistent/prd.json"));
    assert!(err.to_string().contains("ralph init"));
}

#[test]
fn odd_keys_are_quoted_in_paths() {
    assert_eq!(
        render_path(&[Seg::Key("$schema".into()), Seg::Key("a b".into())]),
        "$[\"$schema\"][\"a b\"]"
    );
    let doc = json!({"$schema": 3, "project": "p", "userStories": [
        {"id": "A", "title": "t", "acceptanceCriteria": [], "priority": 1, "passes": false}
    ]});
    assert_eq!(paths(&validate_value(&doc)), ["$[\"$schema\"]"]);
}

const MESSY: &str = "\u{FEFF}{\r\n  \"project\" : \"demo\",  \"extra\": {\"passes\": true},\r\n\
    \t\"userStories\": [\r\n    { \"id\": \"US-001\", \"title\": \"a \\\"passes\\\": false\",\r\n\
    \"acceptanceCriteria\": [\"x\"], \"priority\": 1,\"passes\":false , \"notes\": \"\" },\r\n\
    {\"passes\"  :  false,\"id\":\"US-002\",\"title\":\"b\",\"acceptanceCriteria\":[],\"priority\":2,\
    \"custom\": [1, {\"passes\": false}]}\r\n  ]\r\n}\r\n";

#[test]
fn set_passes_changes_only_that_value() {
    let out = set_passes(MESSY.as_bytes(), "US-002", true).unwrap();
    let expected = MESSY.replacen("{\"passes\"  :  false", "{\"passes\"  :  true", 1);
    assert_eq!(String::from_utf8(out).unwrap(), expected);

    let out = set_passes(MESSY.as_bytes(), "US-001", true).unwrap();
    let expected = MESSY.replacen("\"passes\":false ,", "\"passes\":true ,", 1);
    assert_eq!(String::from_utf8(out.clone()).unwrap(), expected);

    // And back, byte for byte.
    let back = set_passes(&out, "US-001", false).unwrap();
    assert_eq!(back, MESSY.as_bytes());
    // Setting the value it already has changes nothing.
    assert_eq!(
        set_passes(MESSY.as_bytes(), "US-001", false).unwrap(),
        MESSY.as_bytes()
    );
}

#[test]
fn set_passes_uses_decoded_keys_and_the_last_duplicate() {
    let raw = br#"{"userStories":[{"id":"A","pass\u0065s":false,"passes":false}],"project":"p"}"#;
    let out = set_passes(raw, "A", true).unwrap();
    assert_eq!(
        out,
        br#"{"userStories":[{"id":"A","pass\u0065s":false,"passes":true}],"project":"p"}"#
    );
    let parsed: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(parsed["userStories"][0]["passes"], json!(true));
}

#[test]
fn set_notes_replaces_or_appends_only_that_value() {
    let out = set_notes(MESSY.as_bytes(), "US-001", "line 1\nsaid \"hi\"").unwrap();
    let expected = MESSY.replacen(
        "\"notes\": \"\" }",
        "\"notes\": \"line 1\\nsaid \\\"hi\\\"\" }",
        1,
    );
    assert_eq!(String::from_utf8(out).unwrap(), expected);

    // US-002 has no notes: the member is added after its last value.
    let out = set_notes(MESSY.as_bytes(), "US-002", "n").unwrap();
    let expected = MESSY.replacen(
        "{\"passes\": false}]}",
        "{\"passes\": false}], \"notes\": \"n\"}",
        1,
    );
    assert_eq!(String::from_utf8(out.clone()).unwrap(), expected);
    let parsed: Value = serde_json::from_slice(&out[BOM.len()..]).unwrap();
    assert_eq!(parsed["userStories"][1]["notes"], json!("n"));

    let raw = br#"{"project":"p","userStories":[{ }]}"#;
    assert!(set_notes(raw, "A", "x").is_err());
    let raw = br#"{"project":"p","userStories":[{"id":"A"}, {"id":"B"}]}"#;
    assert_eq!(
        set_notes(raw, "A", "x").unwrap(),
        br#"{"project":"p","userStories":[{"id":"A", "notes": "x"}, {"id":"B"}]}"#
    );
    let err = set_notes(raw, "C", "x").unwrap_err();
    assert!(matches!(err, PrdError::RewriteNotes { .. }));
    assert!(
        err.to_string()
            .contains("cannot set `notes` of story \"C\""),
        "{err}"
    );
}

#[test]
fn set_passes_refuses_what_it_cannot_find() {
    let err = set_passes(MESSY.as_bytes(), "US-404", true).unwrap_err();
    assert!(matches!(err, PrdError::Rewrite { .. }));
    assert!(err.to_string().contains("US-404"));
    let raw = br#"{"project":"p","userStories":[{"id":"A"}]}"#;
    let err = set_passes(raw, "A", true).unwrap_err();
    assert!(err.to_string().contains("no `passes` field"), "{err}");
    assert!(matches!(
        set_passes(b"[", "A", true),
        Err(PrdError::NotJson { .. })
    ));
}

#[test]
fn a_prd_above_the_size_limits_gets_a_warning_naming_them() {
    let doc = |n: usize| {
        let stories: Vec<Value> = (0..n)
            .map(|i| {
                serde_json::json!({"id": format!("US-{i}"), "title": "t",
                    "acceptanceCriteria": [], "priority": 1, "passes": false})
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({"project": "p", "userStories": stories})).unwrap()
    };
    let small = parse_bytes(Path::new("prd.json"), &doc(PRD_WARN_STORIES)).unwrap();
    assert_eq!(size_warning(&small), None);
    let many = parse_bytes(Path::new("prd.json"), &doc(PRD_WARN_STORIES + 1)).unwrap();
    let warning = size_warning(&many).expect("more stories than the limit");
    assert!(warning.contains("1001 stories"), "{warning}");
    assert!(
        warning.contains("warns above 2.0 MiB or 1000 stories"),
        "{warning}"
    );
    let mut big = small.clone();
    big.raw = vec![b' '; PRD_WARN_BYTES + 1];
    let warning = size_warning(&big).expect("more bytes than the limit");
    assert!(warning.contains("2.0 MiB, 1000 stories"), "{warning}");
}

#[test]
fn a_dependency_chain_of_200000_stories_is_checked_without_recursion() {
    // Each story depends on the next one: a depth-first search 200,000 deep, which
    // overflowed the stack when it recursed. The last closes a cycle back to the first.
    let n = 200_000;
    let mut edges: Vec<Vec<usize>> = (0..n).map(|i| vec![i + 1]).collect();
    edges[n - 1] = vec![0];
    let cycles = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || find_cycles(&edges))
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert_eq!(cycles.len(), 1);
    assert_eq!(cycles[0].len(), n);
    assert_eq!(cycles[0][..3], [0, 1, 2]);
    // And the smaller shapes still come out as before.
    assert_eq!(find_cycles(&[vec![1], vec![2], vec![1]]), vec![vec![1, 2]]);
    assert!(find_cycles(&[vec![], vec![0], vec![0, 1]]).is_empty());
}

#[test]
fn set_passes_many_is_set_passes_for_each_story_in_one_pass() {
    let raw = "\u{feff}{\r\n  \"project\": \"p\",\r\n  \"userStories\": [\r\n    {\"id\": \"A\", \"passes\": false, \"x\": [1, {\"passes\": 3}]},\r\n    {\"id\": \"B\",\"passes\":true},\r\n    {\"id\": \"C\", \"passes\" : false }\r\n  ]\r\n}\r\n".as_bytes();
    let edits = [("C", true), ("A", true), ("B", false)];
    let mut one_by_one = raw.to_vec();
    for (id, passes) in edits {
        one_by_one = set_passes(&one_by_one, id, passes).unwrap();
    }
    assert_eq!(set_passes_many(raw, &edits, None).unwrap(), one_by_one);
    // With the parse of the same bytes given, the same result without parsing again.
    let body = &raw[BOM.len()..];
    let parsed = LoadedPrd {
        path: PathBuf::from("prd.json"),
        raw: raw.to_vec(),
        value: serde_json::from_slice(body).unwrap(),
        prd: crate::prd::model::Prd {
            schema: None,
            project: "p".into(),
            branch_name: None,
            base_branch: None,
            description: String::new(),
            user_stories: Vec::new(),
            extra: Default::default(),
            index: Default::default(),
        },
    };
    assert_eq!(
        set_passes_many(raw, &edits, Some(&parsed)).unwrap(),
        one_by_one
    );
    assert!(set_passes_many(raw, &[], None).unwrap() == raw);
    let err = set_passes_many(raw, &[("A", true), ("Z", true)], None).unwrap_err();
    assert!(err.to_string().contains('Z'), "{err}");
}

#[test]
fn a_shared_parse_is_reused_for_the_same_bytes_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prd.json");
    let doc = |passes: bool| {
        format!(
            "{{\"project\": \"p\", \"userStories\": [{{\"id\": \"A\", \"title\": \"a\", \"acceptanceCriteria\": [], \"priority\": 1, \"passes\": {passes}}}]}}\n"
        )
    };
    std::fs::write(&path, doc(false)).unwrap();
    let first = load_shared(&path).unwrap();
    let again = load_shared(&path).unwrap();
    assert!(Arc::ptr_eq(&first, &again), "same bytes: the same parse");
    std::fs::write(&path, doc(true)).unwrap();
    let edited = load_shared(&path).unwrap();
    assert!(!Arc::ptr_eq(&first, &edited), "an edit is always seen");
    assert!(edited.prd.user_stories[0].passes);
    // Put back as it was: the earlier parse is still kept.
    std::fs::write(&path, doc(false)).unwrap();
    assert!(Arc::ptr_eq(&first, &load_shared(&path).unwrap()));
    // Invalid bytes are an error, as with `load`.
    std::fs::write(&path, "{").unwrap();
    assert!(load_shared(&path).is_err());
}

#[test]
fn with_passes_is_what_a_parse_of_the_rewrite_gives() {
    let path = Path::new("prd.json");
    let prev = parse_bytes(path, MESSY.as_bytes()).unwrap();
    for edits in [
        vec![("US-002", true)],
        vec![("US-001", true), ("US-002", true)],
        vec![("US-001", false)],
    ] {
        let raw = set_passes_many(&prev.raw, &edits, Some(&prev)).unwrap();
        let parsed = parse_bytes(path, &raw).unwrap();
        // Held elsewhere too: that holder's parse is left as it was.
        let shared = Arc::new(prev.clone());
        let held = Arc::clone(&shared);
        let derived = with_passes(shared, raw.clone(), &edits);
        assert_eq!(derived.value, parsed.value, "{edits:?}");
        assert_eq!(derived.prd, parsed.prd, "{edits:?}");
        assert_eq!(derived.raw, parsed.raw);
        assert_eq!(held.raw, prev.raw);
        assert_eq!(held.prd, prev.prd);
        assert_eq!(held.value, prev.value);
        // Held by nobody else: updated in place, with the same result.
        let derived = with_passes(Arc::new(prev.clone()), raw, &edits);
        assert_eq!(derived.value, parsed.value, "{edits:?}");
        assert_eq!(derived.prd, parsed.prd, "{edits:?}");
    }
}
