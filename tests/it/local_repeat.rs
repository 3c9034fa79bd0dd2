//! The local model is asked the same thing for the same story and the same repository, however
//! busy the machine is: `ralph run --agent local` against the scripted OpenAI server from two
//! repositories at different temporary paths, where the commands the model runs take a
//! different time and print a different test time, sends the same request bytes, request for
//! request (the compact prompt, the tool results, the next attempt's feedback). With
//! temperature 0 and a fixed seed, the real model's end-to-end tests are then repeatable.

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};
use crate::support_llm::{RecordedRequest, ScriptedLlm, ScriptedReply};

/// Every request of a two-iteration `ralph run --agent local` on one story whose check fails.
/// The scripted model runs a command (which takes `sleep` seconds and prints `took` as its test
/// time), calls mark_story (the check fails, printing `took` and the repository's absolute
/// path), then gives up; the second iteration gets the first one's feedback.
fn requests(sleep: &str, took: &str) -> (Vec<RecordedRequest>, TestEnv) {
    let mut prd = prd_with_stories(1);
    prd["userStories"][0]["verify"] = json!(
        "echo \"FAILED (failures=1): Ran 1 test in $(cat \"$HOME/took\")s at $PWD/t.py\"; exit 1"
    );
    let env = TestEnv::new(&prd);
    std::fs::write(env.home.join("took"), took).unwrap();
    std::fs::write(env.home.join("sleep"), sleep).unwrap();
    let call = |name: &str, arguments: Value| {
        ScriptedReply::text(json!({"name": name, "arguments": arguments}).to_string())
    };
    let mut replies = vec![
        call(
            "run_command",
            json!({"command": "sleep \"$(cat \"$HOME/sleep\")\"; echo \"Ran 3 tests in $(cat \"$HOME/took\")s\"; echo OK"}),
        ),
        call("mark_story", json!({"id": "US-001", "passes": true})),
    ];
    replies.extend(vec![ScriptedReply::text("I stop here.").stop("stop"); 12]);
    let llm = ScriptedLlm::sequence(ralph::protocol::ProviderKind::Openai, replies);
    let out = env
        .ralph_cmd(&[
            "run",
            "--agent",
            "local",
            "--base-url",
            &llm.base_url(),
            "--max-iter",
            "2",
        ])
        .output()
        .unwrap();
    let requests = llm.requests();
    assert!(
        requests.len() >= 4,
        "{} requests: {}",
        requests.len(),
        text(&out)
    );
    assert_eq!(env.ledger().len(), 2, "two iterations: {}", text(&out));
    (requests, env)
}

#[test]
fn the_local_model_gets_the_same_bytes_however_long_its_commands_take() {
    let (a, env_a) = requests("0", "0.002");
    let (b, env_b) = requests("1.3", "0.871");
    assert_eq!(a.len(), b.len(), "the same number of requests");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(
            x.body_text(),
            y.body_text(),
            "request {} differs between the two runs",
            x.n
        );
    }
    // What made them equal: the command's result reads no duration, the test time and the
    // repository's path are taken out of what the model reads.
    let all: String = a.iter().map(|r| r.body_text()).collect();
    assert!(all.contains("Ran 3 tests in [time]"), "{all}");
    assert!(all.contains("OK\\n[exit code 0]"), "{all}");
    assert!(all.contains("Ran 1 test in [time] at t.py"), "{all}");
    for env in [&env_a, &env_b] {
        let repo = std::fs::canonicalize(&env.repo).unwrap();
        assert!(!all.contains(&repo.display().to_string()), "{all}");
    }
    // The user still sees what the command printed, as it printed it (`ralph show`).
    let show = env_b.ralph(&["show", "1", "--no-pager"]);
    let shown = String::from_utf8_lossy(&show.stdout);
    assert!(
        shown.contains("Ran 3 tests in 0.871s") && shown.contains("[exit code 0]"),
        "{}",
        text(&show)
    );
}
