//! How ralph reports an error (src/error.rs): `error: <message>`, each cause not printed yet,
//! then the hints; exit 2 for a usage error on the command line, 1 for everything else
//! (README.md, "Exit codes").

use crate::common::{prd_with_stories, text, TestEnv};

/// stderr of `out`, as lines.
fn stderr_lines(out: &std::process::Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn hint_lines(out: &std::process::Output) -> usize {
    stderr_lines(out)
        .iter()
        .filter(|l| l.starts_with("hint:") || l.trim_start().starts_with("hint:"))
        .count()
}

#[test]
fn max_iter_zero_is_a_usage_error_with_one_hint() {
    let env = TestEnv::new(&prd_with_stories(1));
    let out = env.ralph(&["run", "--max-iter", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(
        stderr_lines(&out),
        [
            "error: --max-iter must be at least 1 (got 0)",
            "hint: pass --max-iter N with N ≥ 1, or leave it out for the default of 10",
        ],
        "{}",
        text(&out)
    );
    assert_eq!(hint_lines(&out), 1);
    assert_eq!(env.agent_calls(), 0);
}

#[test]
fn every_refused_flag_value_exits_2_and_says_how_to_fix_it() {
    let env = TestEnv::new(&prd_with_stories(1));
    let cases: &[(&[&str], &str)] = &[
        (
            &["--max-attempts", "0"],
            "--max-attempts must be at least 1",
        ),
        (
            &["--max-failures", "0"],
            "--max-failures must be at least 1",
        ),
        (
            &["--max-no-progress", "0"],
            "--max-no-progress must be at least 1",
        ),
        (
            &["--timeout", "0s"],
            "--timeout must be longer than 0 seconds",
        ),
        (
            &["--idle-timeout", "0s"],
            "--idle-timeout must be longer than 0 seconds",
        ),
        (&["--max-cost=-1"], "--max-cost must be a positive amount"),
        (&["--max-steps", "0"], "--max-steps must be at least 1"),
        (
            &[
                "--agent",
                "native",
                "--model",
                "m",
                "--tool-mode",
                "json",
                "--provider",
                "anthropic",
            ],
            "--tool-mode json needs --provider openai",
        ),
        (
            &["--agent", "native"],
            "--agent native needs the model name",
        ),
        (
            &["--agent", "exec"],
            "--agent exec needs the command to run",
        ),
    ];
    for (flags, message) in cases {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        let out = env.ralph(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        let lines = stderr_lines(&out);
        assert!(
            lines[0].starts_with(&format!("error: {message}")),
            "{args:?}: {}",
            text(&out)
        );
        assert_eq!(hint_lines(&out), 1, "{args:?}: {}", text(&out));
        assert!(lines.last().unwrap().starts_with("hint: "), "{args:?}");
    }
    // The same value through the flag's environment variable is still the command line.
    let out = env
        .ralph_cmd(&["run"])
        .env("RALPH_MAX_ITER", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(env.agent_calls(), 0);
}

#[test]
fn a_cause_that_was_printed_twice_is_printed_once_with_the_hint_last() {
    // PromptError::Read puts the OS error in its message and also returns it as its source:
    // `{err:#}` printed it a second time, after the hint.
    let env = TestEnv::new(&prd_with_stories(1));
    let out = env.ralph(&["run", "--template", "missing.md"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let template = env.path("missing.md");
    assert_eq!(
        stderr_lines(&out),
        [
            format!(
                "error: cannot read the prompt template {}: No such file or directory (os error 2)",
                template.display()
            ),
            "hint: fix `template` in ralph.toml (or --template), or remove it to use the \
             built-in prompt"
                .to_owned(),
        ],
        "{}",
        text(&out)
    );
    assert_eq!(env.agent_calls(), 0);
}

#[test]
fn a_broken_ralph_toml_is_a_config_error_exit_1() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.write("ralph.toml", "max_iters = 3\n");
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let lines = stderr_lines(&out);
    let toml = env.path("ralph.toml");
    assert!(
        lines[0].starts_with(&format!(
            "error: {} is not a valid ralph configuration",
            toml.display()
        )),
        "{}",
        text(&out)
    );
    assert!(
        lines.iter().any(|l| l.contains("max_iters")),
        "{}",
        text(&out)
    );
    assert_eq!(
        lines.last().unwrap(),
        "hint: every key and its default is in the ralph.toml that `ralph init` writes, and in README.md, section Configuration"
    );
    assert_eq!(hint_lines(&out), 1);

    // A value ralph refuses is a config error too when it is written in ralph.toml, and the
    // message names the key and the file instead of the flag.
    env.write("ralph.toml", "max_iter = 0\n");
    let out = env.ralph(&["run"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert_eq!(
        stderr_lines(&out),
        [
            format!(
                "error: `max_iter` in {} must be at least 1 (got 0)",
                toml.display()
            ),
            "hint: set max_iter to N with N ≥ 1, or remove it for the default of 10".to_owned(),
        ]
    );
    // The flag wins over the file, and then it is the command line that is wrong.
    let out = env.ralph(&["run", "--max-iter", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(env.agent_calls(), 0);
}
