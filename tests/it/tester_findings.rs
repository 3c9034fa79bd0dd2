//! What a new-user tester found against issue 18 ("Keep the promise off the happy path"), each
//! through the real binary:
//! - untracked secret-looking files (`.env`, `*.pem`, `id_rsa`, …) never reach a checkpoint,
//!   `--allow-dirty` or not, and the run says which it left out;

use std::path::PathBuf;

use serde_json::Value;

use crate::common::{prd_with_stories, text, TestEnv};

/// Writes an executable script outside the repository and returns its path.
fn script(env: &TestEnv, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = env.root.path().join(name);
    std::fs::write(&path, format!("#!/bin/bash\n{body}")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The files of every commit on the current branch.
fn committed_files(env: &TestEnv) -> String {
    env.git(&["log", "--name-only", "--format=", "HEAD"])
}

#[test]
fn allow_dirty_never_commits_an_untracked_secret_file() {
    let env = TestEnv::new(&prd_with_stories(1));
    // The user's own untracked work (--allow-dirty includes it), and their keys (never).
    env.write("notes.md", "my notes\n");
    env.write(".env", "OPENAI_API_KEY=sk-proj-0123456789abcdefABCDEF\n");
    env.write("certs/server.pem", "-----BEGIN PRIVATE KEY-----\nMIIE\n");
    env.write(".env.example", "OPENAI_API_KEY=\n");
    // The agent does the work, writes a key of its own and stages another secret file itself.
    let agent = script(
        &env,
        "agent.sh",
        "echo done > file-1.txt\n\
         echo 'PRIVATE' > id_rsa\n\
         echo 'TOKEN=abc' > .env.production\n\
         git add .env.production\n\
         exit 0\n",
    );
    let out = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        &agent.display().to_string(),
        "--max-iter",
        "1",
        "--allow-dirty",
    ]);
    let ledger = env.ledger();
    assert_eq!(ledger.len(), 1, "{}", text(&out));
    let files = committed_files(&env);
    for kept in ["file-1.txt", "notes.md", ".env.example"] {
        assert!(
            files.lines().any(|l| l == kept),
            "{kept} should be committed:\n{files}\n{}",
            text(&out)
        );
    }
    for secret in [".env", "certs/server.pem", "id_rsa", ".env.production"] {
        assert!(
            !files.lines().any(|l| l == secret),
            "{secret} was committed:\n{files}\n{}",
            text(&out)
        );
        assert!(env.path(secret).exists(), "{secret} was removed");
    }
    // The run says so at the start and in the iteration's record.
    let all = text(&out);
    assert!(
        all.contains("not committed (secret-looking, untracked): .env"),
        "{all}"
    );
    let findings = ledger[0]["findings"].to_string();
    for secret in [".env", ".env.production", "id_rsa"] {
        assert!(findings.contains(secret), "{secret} not named: {findings}");
    }
    // `git status` still shows them as the user's untracked files.
    let status = env.git(&["status", "--porcelain"]);
    assert!(status.contains("?? .env\n"), "{status}");
    assert!(status.contains("?? .env.production"), "{status}");
}

#[test]
fn an_untracked_env_file_alone_does_not_refuse_the_run() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write(".env", "DB_PASSWORD=hunter2hunter2\n");
    let agent = script(&env, "agent.sh", "echo done > file-1.txt\n");
    let out = env.ralph(&[
        "run",
        "--agent",
        "exec",
        "--agent-cmd",
        &agent.display().to_string(),
        "--max-iter",
        "1",
    ]);
    assert_eq!(env.ledger().len(), 1, "{}", text(&out));
    let files = committed_files(&env);
    assert!(files.lines().any(|l| l == "file-1.txt"), "{files}");
    assert!(!files.lines().any(|l| l == ".env"), "{files}");
    // Any other untracked file still refuses the run without --allow-dirty.
    env.write("scratch.txt", "mine\n");
    let refused = env.ralph(&["run", "--agent", "exec", "--agent-cmd", "true"]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("scratch.txt"), "{}", text(&refused));
}
