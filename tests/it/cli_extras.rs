//! The command line's extras: shell completions (checked in a real bash), the man page
//! (rendered by `man -l`), `--version` naming the build's commit, the exit-code table in
//! `ralph run --help`, and an unknown ralph.toml key answered with "did you mean".

use std::process::Command;

use crate::common::{prd_with_stories, ralph_bin, text, TestEnv};

fn ralph(args: &[&str]) -> std::process::Output {
    Command::new(ralph_bin()).args(args).output().unwrap()
}

/// Fails with the install command (never skips) when `program` is missing.
fn require(program: &str, package: &str) {
    assert!(
        which::which(program).is_ok(),
        "`{program}` is missing: install it with `apt-get install -y {package}` (the test needs the real one)"
    );
}

#[test]
fn completions_are_generated_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "_ralph()"),
        ("zsh", "#compdef ralph"),
        ("fish", "complete -c ralph"),
    ] {
        let out = ralph(&["completions", shell]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        for sub in ["run", "status", "doctor", "completions"] {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
        assert!(
            !script.contains("__native-agent"),
            "{shell} offers the hidden command"
        );
    }
}

#[test]
fn bash_completes_ralph_ru_to_run() {
    require("bash", "bash");
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("ralph.bash");
    std::fs::write(&script, ralph(&["completions", "bash"]).stdout).unwrap();
    // What bash does on `ralph ru<TAB>`: the completion function registered for `ralph`
    // is called with the words so far, and offers COMPREPLY.
    let probe = format!(
        "source {script}\n\
         spec=$(complete -p ralph) || exit 3\n\
         fn=$(sed -E 's/.*-F ([^ ]+).*/\\1/' <<<\"$spec\")\n\
         COMP_WORDS=(ralph ru); COMP_CWORD=1; COMP_LINE='ralph ru'; COMP_POINT=${{#COMP_LINE}}\n\
         \"$fn\" ralph ru ralph\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n\
         COMP_WORDS=(ralph run --max-i); COMP_CWORD=2; COMP_LINE='ralph run --max-i'; COMP_POINT=${{#COMP_LINE}}\n\
         \"$fn\" ralph --max-i run\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        script = script.display()
    );
    let out = Command::new("bash").arg("-c").arg(probe).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let offered = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = offered.lines().collect();
    assert!(words.contains(&"run"), "ralph ru<TAB> offered {words:?}");
    assert!(
        !words.contains(&"status"),
        "ralph ru<TAB> offered {words:?}"
    );
    assert!(
        words.contains(&"--max-iter"),
        "ralph run --max-i<TAB> offered {words:?}"
    );
}

#[test]
fn the_man_page_renders_with_man() {
    require("man", "man-db");
    let dir = tempfile::tempdir().unwrap();
    let out = ralph(&["man", "--out", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for page in ["ralph.1", "ralph-run.1", "ralph-status.1"] {
        let path = dir.path().join(page);
        let shown = Command::new("man")
            .args(["-l", path.to_str().unwrap()])
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        assert_eq!(shown.status.code(), Some(0), "{page}: {}", text(&shown));
        let rendered = String::from_utf8_lossy(&shown.stdout);
        assert!(rendered.contains("NAME"), "{page}: {rendered}");
        if page == "ralph-run.1" {
            assert!(rendered.contains("--max-iter"), "{rendered}");
        }
    }
    let main = ralph(&["man"]);
    assert!(
        String::from_utf8_lossy(&main.stdout).starts_with(".ie"),
        "roff on stdout"
    );
}

#[test]
fn version_names_the_commit_and_run_help_lists_exit_codes() {
    let out = ralph(&["--version"]);
    let version = String::from_utf8_lossy(&out.stdout);
    // Built from this git checkout: `ralph 0.1.0 (<12 hex> <date>)`.
    let re = regex::Regex::new(r"^ralph \d+\.\d+\.\d+ \([0-9a-f]{12} \d{4}-\d{2}-\d{2}\)").unwrap();
    assert!(re.is_match(&version), "{version}");
    let help = String::from_utf8_lossy(&ralph(&["run", "--help"]).stdout).into_owned();
    for line in [
        "Exit codes:",
        "  0  complete",
        "  3  --max-iter reached",
        "130  interrupted",
    ] {
        assert!(help.contains(line), "{line} missing in:\n{help}");
    }
}

#[test]
fn an_unknown_ralph_toml_key_gets_a_did_you_mean() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "max_iters = 3\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-qm", "config"]);
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did you mean `max_iter`?"), "{err}");
    assert!(
        !err.contains("`agent_program`"),
        "the whole key list is printed:\n{err}"
    );
    assert!(err.contains("README.md, section Configuration"), "{err}");
}

#[test]
fn status_stop_and_archive_find_prd_json_from_a_subdirectory() {
    let env = TestEnv::new(&prd_with_stories(1));
    std::fs::create_dir_all(env.path("src/deep")).unwrap();
    let status = env
        .ralph_cmd(&["status"])
        .current_dir(env.path("src/deep"))
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(0), "{}", text(&status));
    assert!(String::from_utf8_lossy(&status.stdout).contains("US-001"));
    let stop = env
        .ralph_cmd(&["stop"])
        .current_dir(env.path("src/deep"))
        .output()
        .unwrap();
    // No run is active, but it looked in the repository (not in src/deep).
    assert!(
        String::from_utf8_lossy(&stop.stderr).contains(&format!(
            "no `ralph run` is active in {}",
            env.repo.display()
        )),
        "{}",
        text(&stop)
    );
    // Outside any prd.json: one clear error, no OS error after the hint.
    std::fs::remove_file(env.path("prd.json")).unwrap();
    let missing = env
        .ralph_cmd(&["status"])
        .current_dir(env.path("src/deep"))
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1), "{}", text(&missing));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("no prd.json in"), "{err}");
    assert!(!err.contains("os error"), "{err}");
    assert!(
        err.trim_end().lines().last().unwrap().starts_with("hint:"),
        "{err}"
    );
}

/// `ralph status | head -2` and the like: a reader that closes the pipe early ends ralph
/// quietly (SIGPIPE, as `git log` or `ls`), never with a panic (exit 101) and a backtrace.
#[test]
fn a_closed_stdout_ends_the_printing_commands_quietly() {
    use std::os::unix::process::ExitStatusExt as _;
    let env = TestEnv::new(&prd_with_stories(3));
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["validate"],
        &["report", "--json"],
        &["doctor"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = env
            .ralph_cmd(args)
            .env("RUST_BACKTRACE", "1")
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(out.status.code(), Some(101), "{args:?}: {stderr}");
        assert!(
            out.status.signal() == Some(13) || out.status.code().is_some(),
            "{args:?}: {:?}",
            out.status
        );
    }
}

/// The commit command `ralph init` prints works as printed in a fresh repository.
#[test]
fn the_commit_step_ralph_init_prints_works() {
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", text(&out));
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["config", "user.name", "t"]);
    git(&["config", "user.email", "t@example.com"]);
    let out = Command::new(ralph_bin())
        .arg("init")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let step = stdout
        .lines()
        .find_map(|l| {
            l.split_once("commit the files: ")
                .map(|(_, c)| c.to_owned())
        })
        .unwrap_or_else(|| panic!("no commit step in {stdout}"));
    let run = Command::new("sh")
        .args(["-c", &step])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(run.status.success(), "`{step}`: {}", text(&run));
}

/// A bad value from a `RALPH_*` variable: clap names only the flag, ralph adds the variable.
#[test]
fn a_bad_value_from_the_environment_names_the_variable() {
    let env = TestEnv::new(&prd_with_stories(1));
    let out = env
        .ralph_cmd(&["run"])
        .env("RALPH_MAX_ITER", "abc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid value 'abc' for '--max-iter <N>'"),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: the value comes from the environment (RALPH_MAX_ITER=abc)"),
        "{stderr}"
    );
}

/// `ralph validate` in a subdirectory checks the prd.json the other commands find upward.
#[test]
fn validate_in_a_subdirectory_finds_the_prd_upward() {
    let env = TestEnv::new(&prd_with_stories(2));
    std::fs::create_dir_all(env.path("src/deep")).unwrap();
    let out = env
        .ralph_cmd(&["validate"])
        .current_dir(env.path("src/deep"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is valid: 2 stories"),
        "{}",
        text(&out)
    );
}
