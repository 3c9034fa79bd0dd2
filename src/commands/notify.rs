//! `ralph notify --test`: one sample notification of each kind to every configured target
//! (ralph.toml's `[notify]` and the `--notify-*` flags), through the same delivery and retries as
//! a run, and a line per target and kind saying what happened.

use chrono::Utc;

use crate::cli::{NotifyArgs, RunArgs};
use crate::config::RunConfig;
use crate::error::UserError;
use crate::notify::{Kind, Notification};
use crate::output::notify::deliver_with_retries;
use crate::protocol::ExitStatus;

/// Runs `ralph notify` (see the module docs). Exits 0 when every delivery worked, 1 otherwise.
///
/// # Errors
/// No `--test`, nothing configured, or an invalid ralph.toml.
pub fn run(args: &NotifyArgs) -> anyhow::Result<ExitStatus> {
    if !args.test {
        return Err(
            UserError::usage("ralph notify only sends test notifications for now")
                .with_hint("run `ralph notify --test`")
                .into(),
        );
    }
    let cwd = std::env::current_dir()?;
    let run_args = RunArgs {
        config: args.run.config.clone(),
        notify: args.run.notify.clone(),
        ..RunArgs::default()
    };
    let cfg = RunConfig::resolve_notify(&run_args, &cwd).map_err(|e| {
        let status = e.exit_status();
        UserError::new(e.to_string()).with_status(status)
    })?;
    if cfg.is_empty() {
        return Err(UserError::new("no notification is configured")
            .with_hint("add a [notify] table to ralph.toml (webhook = [\"https://…\"], command = \"…\", desktop = true), or pass --notify-webhook URL")
            .into());
    }
    let origin = match crate::workspace::locate_prd(None, &cwd) {
        Ok(p) => crate::notify::Origin::of_prd(&p),
        Err(_) => crate::notify::Origin {
            project: "ralph".into(),
            ..Default::default()
        },
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let mut failed = 0;
    for target in cfg.targets() {
        for kind in Kind::ALL.into_iter().filter(|k| cfg.wants(*k)) {
            let n = sample(kind, &origin);
            let (result, attempts) =
                runtime.block_on(deliver_with_retries(&client, &target, &n, &cfg, &cwd));
            match result {
                Ok(()) => println!("ok      {:<17} {target}", kind.as_str()),
                Err(why) => {
                    failed += 1;
                    println!(
                        "FAILED  {:<17} {target}: {why} ({attempts} attempt{})",
                        kind.as_str(),
                        if attempts == 1 { "" } else { "s" }
                    );
                }
            }
        }
    }
    Ok(if failed == 0 {
        ExitStatus::Success
    } else {
        ExitStatus::Failure
    })
}

/// A sample notification of `kind`, marked as a test.
fn sample(kind: Kind, origin: &crate::notify::Origin) -> Notification {
    let (text, details) = match kind {
        Kind::RunFinished => (
            "complete: every story passes (3 of 3)",
            serde_json::json!({"stop_reason": {"kind": "complete"}, "passed": 3, "open": []}),
        ),
        Kind::StoryPassed => (
            "US-001 passed in iteration 1",
            serde_json::json!({"story_id": "US-001", "iteration": 1}),
        ),
        Kind::StoryBlocked => (
            "US-002 is blocked after 3 attempts (last: verify_failed)",
            serde_json::json!({"story_id": "US-002", "attempts": 3}),
        ),
        Kind::UsageLimitWait => (
            "the agent hit a usage limit; ralph waits for the reset",
            serde_json::json!({"until": Utc::now()}),
        ),
        Kind::NeedsAttention => (
            "iteration 4 ended with auth_error; the run stops until a human fixes it",
            serde_json::json!({"outcome": "auth_error", "iteration": 4}),
        ),
    };
    Notification::new(
        kind,
        origin,
        &format!("[test] {text}"),
        "test",
        serde_json::json!({"test": true, "sample": details}),
    )
}
