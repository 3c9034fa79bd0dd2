//! `ralph convert PRD.md [--out prd.json] [--force] [--agent …]`: turn a Markdown PRD into
//! prd.json (see [`crate::convert`]).
//!
//! Output: progress notices and warnings (lint findings) on stderr; on success one line on
//! stdout, `✓ wrote <out>: N stories from <input> (<how>)`, the archive line when a prd.json was
//! replaced, and the next step.

use std::path::Path;

use crate::cli::ConvertArgs;
use crate::convert::{self, Converted, Route};
use crate::output::{human::Human, Outputs};
use crate::process::StopSignals;
use crate::protocol::ExitStatus;

/// Runs `ralph convert`.
///
/// # Errors
/// Every error of [`convert::convert`]; the caller prints it.
pub fn run(args: &ConvertArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let out_path = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("prd.json").to_path_buf());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let stop = StopSignals::default();
        let _signals = crate::signals::install(stop.clone())?;
        let mut out = Outputs::new();
        out.add(Box::new(Human::new(false, args.session.verbose)));
        let req = convert::Request {
            input: &args.input,
            out: &out_path,
            force: args.force,
            attempts: args.attempts,
            strict: args.strict,
            session: &args.session,
        };
        let done = convert::convert(&req, None, &cwd, &mut out, &stop).await;
        out.close();
        print_converted(&done?, &args.input, &cwd);
        Ok(ExitStatus::Success)
    })
}

/// Prints what a conversion did (also used by `ralph plan --convert`).
pub fn print_converted(done: &Converted, input: &Path, cwd: &Path) {
    let count = done.prd.user_stories.len();
    let noun = if count == 1 { "story" } else { "stories" };
    let how = match done.route {
        Route::Layout => "ralph's PRD layout, no model".to_string(),
        Route::Agent { attempts } => format!(
            "converted by the agent in {attempts} attempt{}",
            if attempts == 1 { "" } else { "s" }
        ),
    };
    let shown = crate::workspace::display_rel(&done.out, cwd);
    for w in &done.warnings {
        eprintln!("warning: {shown}: {w}");
    }
    println!(
        "✓ wrote {shown}: {count} {noun} from {} ({how})",
        input.display()
    );
    match &done.replaced {
        convert::write::Replaced::Archived(a) => println!("{}", a.describe(cwd)),
        convert::write::Replaced::Identical => {
            println!("(it already held exactly this; nothing changed)")
        }
        _ => {}
    }
    println!(
        "next: review it, check it with `ralph validate {shown}`, then start the loop with `ralph run`"
    );
}
