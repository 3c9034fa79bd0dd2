//! The native loop's tools, called through the library's dispatcher on temporary repositories:
//! confinement, edit semantics, read windows, listing and searching with .gitignore, command
//! output and timeouts, and ralph's own prd.json / progress.txt tools.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use ralph::native::tools::{ToolContext, ToolError, ToolOutput, ToolRegistry};
use serde_json::{json, Value};

/// A temporary repository (the directory is the root) and a context for it.
struct Repo {
    _dir: tempfile::TempDir,
    /// Holds the repository and, next to it, a directory that is "outside".
    ctx: ToolContext,
    outside: std::path::PathBuf,
}

impl Repo {
    fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let top = fs::canonicalize(dir.path()).unwrap();
        let root = top.join("repo");
        let outside = top.join("outside");
        fs::create_dir_all(&root).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(outside.join("secret.txt"), "top secret\n").unwrap();
        let ctx = ToolContext::new(
            root.clone(),
            root.join("prd.json"),
            root.join("progress.txt"),
        );
        Repo {
            _dir: dir,
            ctx,
            outside,
        }
    }

    fn root(&self) -> &Path {
        &self.ctx.repo_root
    }

    fn write(&self, rel: &str, content: &str) {
        let path = self.root().join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        fs::read_to_string(self.root().join(rel)).unwrap()
    }

    async fn call(&self, name: &str, args: Value) -> Result<ToolOutput, ToolError> {
        ToolRegistry::standard()
            .dispatch(name, &args, &self.ctx)
            .await
    }

    async fn ok(&self, name: &str, args: Value) -> ToolOutput {
        match self.call(name, args.clone()).await {
            Ok(out) => {
                assert!(out.summary.chars().count() <= 120, "{}", out.summary);
                assert!(!out.summary.contains('\n'), "{}", out.summary);
                out
            }
            Err(err) => panic!("{name} {args} failed: {err:?}"),
        }
    }

    /// The message of a call that must come back to the model as an error.
    async fn refused(&self, name: &str, args: Value) -> String {
        match self.call(name, args.clone()).await {
            Err(ToolError::RespondToModel(message)) => message,
            other => panic!("{name} {args}: expected an error for the model, got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Registry and arguments

#[tokio::test]
async fn unknown_tools_and_bad_arguments_go_back_to_the_model() {
    let repo = Repo::new();
    let names = ToolRegistry::standard().names();
    assert_eq!(
        names,
        [
            "read_file",
            "write_file",
            "edit_file",
            "list_files",
            "search",
            "run_command",
            "mark_story",
            "append_progress"
        ]
    );
    let message = repo.refused("delete_everything", json!({})).await;
    assert!(
        message.contains("unknown tool `delete_everything`"),
        "{message}"
    );
    assert!(message.contains("read_file, write_file"), "{message}");

    let message = repo.refused("write_file", json!({"path": "a.txt"})).await;
    assert!(message.contains("missing field `content`"), "{message}");
    assert!(message.contains(r#""content": string"#), "{message}");
    let message = repo
        .refused("write_file", json!({"path": 3, "content": "x"}))
        .await;
    assert!(message.contains("invalid type"), "{message}");
    assert!(!repo.root().join("3").exists());
}

#[tokio::test]
async fn specs_describe_every_tool_with_its_required_arguments() {
    let specs = ToolRegistry::standard().specs();
    let edit = specs.iter().find(|(name, ..)| name == "edit_file").unwrap();
    assert!(edit.1.contains("exactly once"), "{}", edit.1);
    assert_eq!(
        edit.2["required"],
        json!(["path", "old_string", "new_string"])
    );
    let mark = specs
        .iter()
        .find(|(name, ..)| name == "mark_story")
        .unwrap();
    assert_eq!(mark.2["properties"]["passes"]["type"], "boolean");
}

// ---------------------------------------------------------------------------------------------
// Confinement

#[tokio::test]
async fn absolute_paths_outside_and_dotdot_escapes_are_refused() {
    let repo = Repo::new();
    let secret = repo.outside.join("secret.txt");
    let secret = secret.to_str().unwrap();

    let message = repo.refused("read_file", json!({"path": secret})).await;
    assert!(message.contains("outside the repository"), "{message}");
    let message = repo
        .refused("read_file", json!({"path": "../outside/secret.txt"}))
        .await;
    assert!(message.contains("outside the repository"), "{message}");
    repo.refused(
        "read_file",
        json!({"path": "a/b/../../../outside/secret.txt"}),
    )
    .await;
    repo.refused("write_file", json!({"path": secret, "content": "pwned"}))
        .await;
    repo.refused(
        "write_file",
        json!({"path": "../outside/new.txt", "content": "pwned"}),
    )
    .await;
    repo.refused(
        "edit_file",
        json!({"path": "../outside/secret.txt", "old_string": "top", "new_string": "no"}),
    )
    .await;
    repo.refused("list_files", json!({"path": ".."})).await;
    repo.refused("search", json!({"pattern": "secret", "path": "../outside"}))
        .await;
    assert_eq!(
        fs::read_to_string(repo.outside.join("secret.txt")).unwrap(),
        "top secret\n"
    );
    assert!(!repo.outside.join("new.txt").exists());

    // An absolute path inside the repository is fine.
    let inside = repo.root().join("in.txt");
    repo.ok(
        "write_file",
        json!({"path": inside.to_str().unwrap(), "content": "ok\n"}),
    )
    .await;
    assert_eq!(repo.read("in.txt"), "ok\n");
}

#[tokio::test]
async fn symlinks_leaving_the_repository_are_refused_for_reading_and_writing() {
    let repo = Repo::new();
    std::os::unix::fs::symlink(&repo.outside, repo.root().join("escape")).unwrap();
    std::os::unix::fs::symlink(
        repo.outside.join("secret.txt"),
        repo.root().join("secret-link.txt"),
    )
    .unwrap();

    for path in ["escape/secret.txt", "secret-link.txt"] {
        let message = repo.refused("read_file", json!({"path": path})).await;
        assert!(message.contains("outside the repository"), "{message}");
        assert!(message.contains("resolves to"), "{message}");
        repo.refused("write_file", json!({"path": path, "content": "pwned"}))
            .await;
        repo.refused(
            "edit_file",
            json!({"path": path, "old_string": "top", "new_string": "no"}),
        )
        .await;
    }
    // A file that does not exist yet, under the escaping link.
    repo.refused(
        "write_file",
        json!({"path": "escape/sub/new.txt", "content": "pwned"}),
    )
    .await;
    repo.refused("list_files", json!({"path": "escape"})).await;
    // The link is listed by name, but search does not read through it.
    let found = repo.ok("search", json!({"pattern": "top secret"})).await;
    assert!(found.content.starts_with("No matches"), "{}", found.content);

    assert_eq!(
        fs::read_to_string(repo.outside.join("secret.txt")).unwrap(),
        "top secret\n"
    );
    assert!(!repo.outside.join("sub").exists());
    // The links themselves are untouched (not replaced by regular files).
    assert!(fs::symlink_metadata(repo.root().join("secret-link.txt"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[tokio::test]
async fn symlinks_within_the_repository_are_followed() {
    let repo = Repo::new();
    repo.write("real/file.txt", "one\n");
    std::os::unix::fs::symlink(repo.root().join("real"), repo.root().join("alias")).unwrap();
    let out = repo
        .ok("read_file", json!({"path": "alias/file.txt"}))
        .await;
    assert!(out.content.starts_with("    1\tone\n"), "{}", out.content);
    repo.ok(
        "write_file",
        json!({"path": "alias/file.txt", "content": "two\n"}),
    )
    .await;
    assert_eq!(repo.read("real/file.txt"), "two\n");
}

#[tokio::test]
async fn git_internals_can_be_read_but_not_written() {
    let repo = Repo::new();
    repo.write(".git/config", "[core]\n");
    let message = repo
        .refused(
            "write_file",
            json!({"path": ".git/config", "content": "[evil]\n"}),
        )
        .await;
    assert!(message.contains(".git"), "{message}");
    repo.refused(
        "edit_file",
        json!({"path": "./.git/config", "old_string": "core", "new_string": "x"}),
    )
    .await;
    assert_eq!(repo.read(".git/config"), "[core]\n");
    repo.ok("read_file", json!({"path": ".git/config"})).await;
}

// ---------------------------------------------------------------------------------------------
// read_file, write_file, edit_file

#[tokio::test]
async fn read_file_shows_a_numbered_window_and_how_to_read_on() {
    let repo = Repo::new();
    let text: String = (1..=12).map(|i| format!("line {i}\n")).collect();
    repo.write("notes.txt", &text);

    let out = repo
        .ok(
            "read_file",
            json!({"path": "notes.txt", "offset": 3, "limit": 2}),
        )
        .await;
    assert_eq!(
        out.content,
        "    3\tline 3\n    4\tline 4\n[lines 3-4 of 12; read on with offset=5]"
    );
    assert_eq!(out.summary, "read_file notes.txt: lines 3-4 of 12");

    let out = repo
        .ok("read_file", json!({"path": "notes.txt", "offset": 11}))
        .await;
    assert_eq!(
        out.content,
        "   11\tline 11\n   12\tline 12\n[lines 11-12 of 12; end of file]"
    );
    let out = repo.ok("read_file", json!({"path": "notes.txt"})).await;
    assert!(out.content.starts_with("    1\tline 1\n"));
    assert!(out
        .content
        .ends_with("   12\tline 12\n[end of file: 12 lines]"));

    let message = repo
        .refused("read_file", json!({"path": "notes.txt", "offset": 13}))
        .await;
    assert!(message.contains("past the end"), "{message}");
    assert!(message.contains("12 lines"), "{message}");
    let message = repo.refused("read_file", json!({"path": "nope.txt"})).await;
    assert!(message.contains("does not exist"), "{message}");

    fs::write(
        repo.root().join("image.png"),
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
    )
    .unwrap();
    let message = repo
        .refused("read_file", json!({"path": "image.png"}))
        .await;
    assert!(message.contains("binary file"), "{message}");
}

#[tokio::test]
async fn read_file_stays_within_the_output_cap() {
    let mut repo = Repo::new();
    repo.ctx.max_output_bytes = 100;
    let text: String = (1..=50)
        .map(|i| format!("a fairly long line {i}\n"))
        .collect();
    repo.write("long.txt", &text);
    let out = repo.ok("read_file", json!({"path": "long.txt"})).await;
    let (body, note) = out.content.rsplit_once('\n').unwrap();
    assert!(body.len() <= 100, "{}", out.content);
    assert!(
        note.starts_with("[lines 1-3 of 50 (output limit of 100 bytes)"),
        "{note}"
    );
    assert!(note.contains("offset=4"), "{note}");
}

#[tokio::test]
async fn write_file_creates_directories_and_keeps_permissions() {
    let repo = Repo::new();
    let out = repo
        .ok(
            "write_file",
            json!({"path": "deep/er/hello.txt", "content": "hi\nthere\n"}),
        )
        .await;
    assert_eq!(repo.read("deep/er/hello.txt"), "hi\nthere\n");
    assert!(out.content.contains("9 bytes (2 lines)"), "{}", out.content);
    assert!(out.content.contains("created"), "{}", out.content);

    repo.write("run.sh", "#!/bin/sh\necho old\n");
    let script = repo.root().join("run.sh");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    let out = repo
        .ok(
            "write_file",
            json!({"path": "run.sh", "content": "#!/bin/sh\necho new\n"}),
        )
        .await;
    assert!(out.content.contains("replaced"), "{}", out.content);
    assert_eq!(
        fs::metadata(&script).unwrap().permissions().mode() & 0o777,
        0o755
    );
    // No temporary files are left behind.
    let leftovers: Vec<_> = fs::read_dir(repo.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with(".ralph-write-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test]
async fn edit_file_replaces_exactly_one_match_or_says_what_to_do() {
    let repo = Repo::new();
    let original = "fn a() {}\nfn b() {}\nlet x = 1;\nlet x = 1;\n";
    repo.write("src/lib.rs", original);
    let edit =
        |old: &str, new: &str| json!({"path": "src/lib.rs", "old_string": old, "new_string": new});

    let message = repo
        .refused("edit_file", edit("fn c() {}", "fn d() {}"))
        .await;
    assert!(message.contains("not found"), "{message}");
    assert!(message.contains("read_file"), "{message}");

    let message = repo
        .refused("edit_file", edit("let x = 1;", "let x = 2;"))
        .await;
    assert!(message.contains("matches 2 places"), "{message}");
    assert!(message.contains("replace_all"), "{message}");
    assert_eq!(
        repo.read("src/lib.rs"),
        original,
        "a refused edit changes nothing"
    );

    let out = repo
        .ok("edit_file", edit("fn b() {}", "fn b() { todo() }"))
        .await;
    assert!(
        out.content.contains("1 occurrence at line 2"),
        "{}",
        out.content
    );
    assert_eq!(
        repo.read("src/lib.rs"),
        "fn a() {}\nfn b() { todo() }\nlet x = 1;\nlet x = 1;\n"
    );

    let mut all = edit("let x = 1;", "let y = 3;");
    all["replace_all"] = json!(true);
    let out = repo.ok("edit_file", all).await;
    assert!(out.content.contains("2 occurrences"), "{}", out.content);
    assert_eq!(
        repo.read("src/lib.rs"),
        "fn a() {}\nfn b() { todo() }\nlet y = 3;\nlet y = 3;\n"
    );

    repo.refused("edit_file", edit("", "x")).await;
    let message = repo
        .refused(
            "edit_file",
            json!({"path": "missing.rs", "old_string": "a", "new_string": "b"}),
        )
        .await;
    assert!(message.contains("write_file"), "{message}");
}

#[tokio::test]
async fn edit_file_matches_text_copied_from_a_crlf_file() {
    let repo = Repo::new();
    repo.write("win.txt", "one\r\ntwo\r\nthree\r\n");
    repo.ok(
        "edit_file",
        json!({"path": "win.txt", "old_string": "one\ntwo", "new_string": "uno\ndos"}),
    )
    .await;
    assert_eq!(repo.read("win.txt"), "uno\r\ndos\r\nthree\r\n");
}

// ---------------------------------------------------------------------------------------------
// list_files, search

#[tokio::test]
async fn list_files_honours_gitignore_and_skips_git() {
    let repo = Repo::new();
    repo.write(".gitignore", "target/\n*.log\n");
    repo.write("src/main.rs", "fn main() {}\n");
    repo.write("src/util/mod.rs", "\n");
    repo.write("README.md", "# hi\n");
    repo.write("build.log", "noise\n");
    repo.write("target/debug/app", "bin\n");
    repo.write(".git/HEAD", "ref: refs/heads/main\n");
    repo.write(".github/ci.yml", "on: push\n");

    let out = repo.ok("list_files", json!({})).await;
    assert_eq!(
        out.content,
        ".github/ci.yml\n.gitignore\nREADME.md\nsrc/main.rs\nsrc/util/mod.rs\n[5 files]"
    );
    let out = repo.ok("list_files", json!({"pattern": "*.rs"})).await;
    assert_eq!(out.content, "src/main.rs\nsrc/util/mod.rs\n[2 files]");
    let out = repo
        .ok("list_files", json!({"pattern": "*.rs", "path": "src/util"}))
        .await;
    assert_eq!(out.content, "src/util/mod.rs\n[1 files]");
    let out = repo.ok("list_files", json!({"pattern": "src/*.rs"})).await;
    assert_eq!(out.content, "src/main.rs\n[1 files]");
    let out = repo.ok("list_files", json!({"pattern": "*.py"})).await;
    assert!(
        out.content
            .starts_with("No files match `*.py` (files ignored"),
        "{}",
        out.content
    );
    let message = repo
        .refused("list_files", json!({"pattern": "src/[a"}))
        .await;
    assert!(message.contains("invalid glob"), "{message}");
}

#[tokio::test]
async fn list_files_caps_long_listings() {
    let repo = Repo::new();
    for i in 0..510 {
        repo.write(&format!("many/f{i:03}.txt"), "");
    }
    let out = repo.ok("list_files", json!({"path": "many"})).await;
    let lines: Vec<&str> = out.content.lines().collect();
    assert_eq!(lines.len(), 501);
    assert_eq!(lines[0], "many/f000.txt");
    assert_eq!(
        lines[500],
        "[500 of 510 files shown; narrow `pattern` or `path` to see the rest]"
    );
}

#[tokio::test]
async fn search_reports_path_line_and_text_and_skips_ignored_files() {
    let repo = Repo::new();
    repo.write(".gitignore", "generated/\n");
    repo.write("src/a.rs", "fn alpha() {}\nfn beta() {}\n");
    repo.write("src/b.txt", "alpha in text\n");
    repo.write("generated/c.rs", "fn alpha() {}\n");

    let out = repo.ok("search", json!({"pattern": r"fn \w+\(\)"})).await;
    assert_eq!(
        out.content,
        "src/a.rs:1: fn alpha() {}\nsrc/a.rs:2: fn beta() {}\n[2 matches in 1 files]"
    );
    let out = repo
        .ok("search", json!({"pattern": "alpha", "glob": "*.txt"}))
        .await;
    assert_eq!(
        out.content,
        "src/b.txt:1: alpha in text\n[1 matches in 1 files]"
    );
    let out = repo
        .ok("search", json!({"pattern": "beta", "path": "src/a.rs"}))
        .await;
    assert_eq!(
        out.content,
        "src/a.rs:2: fn beta() {}\n[1 matches in 1 files]"
    );

    let message = repo.refused("search", json!({"pattern": "fn main("})).await;
    assert!(
        message.contains("invalid regular expression `fn main(`"),
        "{message}"
    );
    assert!(message.contains("Escape"), "{message}");
}

#[tokio::test]
async fn search_stops_at_the_match_cap() {
    let repo = Repo::new();
    let text: String = (0..300).map(|i| format!("hit {i}\n")).collect();
    repo.write("big.txt", &text);
    let out = repo.ok("search", json!({"pattern": "hit"})).await;
    let lines: Vec<&str> = out.content.lines().collect();
    assert_eq!(lines.len(), 201);
    assert_eq!(lines[199], "big.txt:200: hit 199");
    assert!(
        lines[200].starts_with("[stopped after 200 matches"),
        "{}",
        lines[200]
    );
    assert!(out.summary.contains("200+ matches"), "{}", out.summary);
}

// ---------------------------------------------------------------------------------------------
// run_command

#[tokio::test]
async fn run_command_combines_streams_in_order_and_reports_the_exit_code() {
    let repo = Repo::new();
    repo.write("marker.txt", "");
    let out = repo
        .ok(
            "run_command",
            json!({"command": "echo one; echo two >&2; echo three; ls; exit 3"}),
        )
        .await;
    let (body, status) = out.content.rsplit_once('\n').unwrap();
    assert_eq!(body, "one\ntwo\nthree\nmarker.txt");
    assert_eq!(status, "[exit code 3]", "the model reads no duration");
    assert!(
        out.summary.starts_with("run_command (exit 3, "),
        "{}",
        out.summary
    );
}

#[tokio::test]
async fn run_command_keeps_head_and_tail_of_long_output_and_notes_the_size() {
    let mut repo = Repo::new();
    repo.ctx.max_output_bytes = 1000;
    // `seq 1 10000` prints 48,894 bytes.
    let out = repo
        .ok("run_command", json!({"command": "seq 1 10000"}))
        .await;
    assert!(out.content.starts_with("1\n2\n3\n"), "{}", out.content);
    assert!(
        out.content.contains("\n[… 47894 bytes omitted …]\n"),
        "{}",
        out.content
    );
    assert!(out
        .content
        .ends_with("9999\n10000\n[exit code 0; output was 48894 bytes]"));
    assert!(out.content.len() < 1100, "{}", out.content.len());
}

#[tokio::test]
async fn run_command_hides_the_variables_it_is_told_to_remove() {
    let mut repo = Repo::new();
    let show = json!({"command": "echo \"[${CARGO_MANIFEST_DIR:-unset}]\""});
    let out = repo.ok("run_command", show.clone()).await;
    assert!(!out.content.starts_with("[unset]"), "{}", out.content);
    repo.ctx.env_remove = vec!["CARGO_MANIFEST_DIR".into()];
    let out = repo.ok("run_command", show).await;
    assert!(out.content.starts_with("[unset]\n"), "{}", out.content);
}

/// `/proc/<pid>/stat`'s state letter, or `None` when the process is gone.
fn proc_state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.chars().next()
}

#[tokio::test]
async fn a_timed_out_command_takes_its_whole_process_group_with_it() {
    let repo = Repo::new();
    let started = Instant::now();
    let out = repo
        .ok(
            "run_command",
            json!({
                "command": "trap '' TERM; sleep 300 & echo \"pids $$ $!\"; wait",
                // Long enough for a login shell's start-up (a profile that runs pyenv or nvm
                // takes seconds on a loaded machine) to reach the trap before the timeout.
                "timeout_s": 5
            }),
        )
        .await;
    let elapsed = started.elapsed();
    assert!(
        out.content.contains("[timed out after 5 s"),
        "{}",
        out.content
    );
    assert!(
        out.summary.starts_with("run_command (timed out"),
        "{}",
        out.summary
    );
    // SIGTERM at 5 s is ignored, so only the SIGKILL after the 2 s grace period ends it.
    assert!(elapsed >= Duration::from_secs(7), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(120), "{elapsed:?}");

    let pids: Vec<i32> = out
        .content
        .lines()
        .find_map(|line| line.strip_prefix("pids "))
        .expect("the command printed its pids")
        .split(' ')
        .map(|p| p.parse().unwrap())
        .collect();
    let (shell, sleep) = (pids[0], pids[1]);
    assert!(
        ralph::process::group_members(shell).is_empty(),
        "group {shell} still has members"
    );
    for pid in [shell, sleep] {
        let state = proc_state(pid);
        assert!(
            matches!(state, None | Some('Z')),
            "pid {pid} is alive: {state:?}"
        );
    }
}

#[tokio::test]
async fn a_stop_request_ends_a_running_command() {
    let repo = Repo::new();
    let stop = repo.ctx.stop.stop.clone();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.cancel();
    });
    let started = Instant::now();
    let out = repo.ok("run_command", json!({"command": "sleep 60"})).await;
    canceller.await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        out.content.contains("[stopped: ralph is shutting down"),
        "{}",
        out.content
    );
}

// ---------------------------------------------------------------------------------------------
// mark_story, append_progress

const PRD: &str = "{\r\n  \"project\" : \"demo\",\r\n  \"custom\": {\"keep\": [1, 2]},\r\n  \
    \"userStories\": [\r\n    {\"passes\": false, \"id\": \"US-001\", \"title\": \"a\", \
    \"acceptanceCriteria\": [], \"priority\": 1, \"notes\": \"\", \"x-owner\": \"me\"},\r\n    \
    {\"id\": \"US-002\", \"title\": \"b\", \"acceptanceCriteria\": [\"c\"], \"priority\": 2,\
    \"passes\":false}\r\n  ]\r\n}\r\n";

#[tokio::test]
async fn mark_story_changes_only_the_story_status_bytes() {
    let repo = Repo::new();
    repo.write("prd.json", PRD);

    let out = repo
        .ok(
            "mark_story",
            json!({"id": "US-001", "passes": true, "notes": "done \"well\""}),
        )
        .await;
    assert!(
        out.content.contains("US-001 is now marked passing"),
        "{}",
        out.content
    );
    let expected = PRD
        .replacen("{\"passes\": false", "{\"passes\": true", 1)
        .replacen("\"notes\": \"\"", "\"notes\": \"done \\\"well\\\"\"", 1);
    assert_eq!(repo.read("prd.json"), expected);

    // A story without `notes` gets the field appended; nothing else moves.
    repo.ok(
        "mark_story",
        json!({"id": "US-002", "passes": "true", "notes": "ok"}),
    )
    .await;
    let expected = expected.replacen(
        "\"passes\":false}",
        "\"passes\":true, \"notes\": \"ok\"}",
        1,
    );
    assert_eq!(repo.read("prd.json"), expected);

    // And back, without notes.
    repo.ok("mark_story", json!({"id": "US-002", "passes": false}))
        .await;
    let expected = expected.replacen(
        "\"passes\":true, \"notes\"",
        "\"passes\":false, \"notes\"",
        1,
    );
    assert_eq!(repo.read("prd.json"), expected);
    let loaded = ralph::prd::store::load(&repo.root().join("prd.json")).unwrap();
    assert_eq!(loaded.value["custom"], json!({"keep": [1, 2]}));
    assert_eq!(loaded.value["userStories"][0]["x-owner"], "me");
}

#[tokio::test]
async fn mark_story_refuses_unknown_ids_and_broken_files() {
    let repo = Repo::new();
    repo.write("prd.json", PRD);
    let message = repo
        .refused("mark_story", json!({"id": "US-404", "passes": true}))
        .await;
    assert!(message.contains("no story with id `US-404`"), "{message}");
    assert!(message.contains("US-001, US-002"), "{message}");
    assert_eq!(repo.read("prd.json"), PRD);

    repo.write("prd.json", "{\"project\": ");
    let message = repo
        .refused("mark_story", json!({"id": "US-001", "passes": true}))
        .await;
    assert!(message.contains("not valid"), "{message}");

    fs::remove_file(repo.root().join("prd.json")).unwrap();
    let err = repo
        .call("mark_story", json!({"id": "US-001", "passes": true}))
        .await
        .unwrap_err();
    assert!(matches!(err, ToolError::Fatal(_)), "{err:?}");
}

#[tokio::test]
async fn append_progress_only_appends() {
    let repo = Repo::new();
    repo.write("progress.txt", "# log\nearlier entry");
    repo.ok(
        "append_progress",
        json!({"text": "did a thing\nlearned b\n\n"}),
    )
    .await;
    repo.ok("append_progress", json!({"text": "second"})).await;
    assert_eq!(
        repo.read("progress.txt"),
        "# log\nearlier entry\ndid a thing\nlearned b\nsecond\n"
    );
    repo.refused("append_progress", json!({"text": "  \n"}))
        .await;

    fs::remove_file(repo.root().join("progress.txt")).unwrap();
    repo.ok("append_progress", json!({"text": "fresh"})).await;
    let text = repo.read("progress.txt");
    assert!(text.starts_with("# Ralph Progress Log\n"), "{text}");
    assert!(text.ends_with("\n\nfresh\n"), "{text}");
}
