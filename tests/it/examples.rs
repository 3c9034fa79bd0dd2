//! Every prd.json shipped with ralph (the examples, the local-model measurement set and the
//! `ralph init` starter) is valid, and the README's exec agent script works under ralph.

use std::path::Path;

#[test]
fn shipped_prd_files_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(root.join("examples")).expect("examples/") {
        let prd = entry.expect("entry").path().join("prd.json");
        if prd.exists() {
            checked.push(prd);
        }
    }
    checked.push(root.join("templates/prd.json"));
    checked.push(root.join("benches/local-stories/prd.json"));
    assert!(checked.len() >= 2, "no example prd.json found: {checked:?}");
    for path in &checked {
        if let Err(e) = ralph::prd::store::load(path) {
            panic!("{} is not a valid prd.json:\n{e}", path.display());
        }
    }
}

/// The README's minimal exec agent (examples/exec-agent/agent.sh) fits ralph's exec contract: it
/// gets the prompt, its changes are committed, and the story's `verify` marks it passing. A stand-in
/// `aider` on PATH records its arguments and the message file, and writes the file the story asks
/// for.
#[test]
fn the_readme_exec_agent_script_runs_under_ralph() {
    use crate::common::{text, TestEnv};
    use std::os::unix::fs::PermissionsExt;

    let prd = serde_json::json!({
        "project": "demo", "branchName": "ralph/demo",
        "userStories": [{"id": "US-001", "title": "Create done.txt",
            "description": "Create done.txt in the repository root.",
            "acceptanceCriteria": ["done.txt exists"], "priority": 1, "passes": false,
            "notes": "", "verify": "test -f done.txt"}]
    });
    let env = TestEnv::new(&prd);
    let aider = env.bin.join("aider");
    std::fs::write(
        &aider,
        "#!/bin/sh\n\
         echo \"$@\" > \"$TMPDIR/aider-args\"\n\
         while [ $# -gt 0 ]; do [ \"$1\" = --message-file ] && cp \"$2\" \"$TMPDIR/aider-message\"; shift; done\n\
         echo done > done.txt\n\
         echo 'Created done.txt.'\n",
    )
    .unwrap();
    std::fs::set_permissions(&aider, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/exec-agent/agent.sh");
    let out = env
        .ralph_cmd(&[
            "run",
            "--agent",
            "exec",
            "--agent-cmd",
            script.to_str().unwrap(),
            "--verify-marks-passing",
            "true",
            "--max-iter",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let args = std::fs::read_to_string(env.tmp.join("aider-args")).unwrap();
    assert!(
        args.starts_with("--yes-always --no-auto-commits --message-file "),
        "{args}"
    );
    let message = std::fs::read_to_string(env.tmp.join("aider-message")).unwrap();
    assert!(
        message.contains("US-001") && message.contains("done.txt"),
        "{message}"
    );
    assert_eq!(env.prd()["userStories"][0]["passes"], true);
    assert!(
        env.git(&["show", "--stat", "HEAD"]).contains("done.txt"),
        "ralph commits what the agent left"
    );
    // The script removed its temporary message file.
    let left: Vec<_> = std::fs::read_dir(&env.tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tmp."))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
