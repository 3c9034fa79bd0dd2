//! `ralph plan "<description>" | --from FILE [--yes] [--convert]`: write a Markdown PRD through
//! an agent session (see [`crate::plan`]).
//!
//! On a terminal (stdin and stdout both), unless `--yes`, the agent first returns clarifying
//! questions, which ralph asks one by one (a letter picks an option, text is your own answer,
//! Enter lets the agent decide); then the agent writes the PRD from the answers. Otherwise the
//! agent writes its assumptions into the PRD. The PRD goes to `tasks/prd-<slug>.md` at the
//! repository root (or `--out`); `--convert` then converts it into prd.json as `ralph convert`
//! does, with the same agent session settings.
//!
//! Output: notices and warnings on stderr; the questions on stdout; on success `✓ wrote <path>:
//! N stories` on stdout, then the next step (or the conversion's lines).

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::Path;

use crate::ask::{self, Asker, Loop, PromptStyle};
use crate::cli::PlanArgs;
use crate::error::UserError;
use crate::output::{human::Human, Outputs};
use crate::plan::{self, Decision, PlanDoc};
use crate::process::StopSignals;
use crate::protocol::ExitStatus;

/// Runs `ralph plan`.
///
/// # Errors
/// An unreadable `--from` file or empty description; an existing PRD file without `--force`;
/// agent failures (naming the saved draft when no usable PRD came back); the errors of `ralph
/// convert` with `--convert`.
pub fn run(args: &PlanArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let description = description(args)?;
    let interactive =
        !args.yes && std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let stop = StopSignals::default();
        let _signals = crate::signals::install(stop.clone())?;
        let mut out = Outputs::new();
        out.add(Box::new(Human::new(false, args.session.verbose)));
        let asker = Asker::open(&args.session, &cwd, &mut out, stop.clone()).await?;
        let result = plan_with(
            &asker,
            args,
            &description,
            interactive,
            &cwd,
            &mut out,
            &stop,
        )
        .await;
        asker.close().await;
        out.close();
        result
    })
}

async fn plan_with(
    asker: &Asker,
    args: &PlanArgs,
    description: &str,
    interactive: bool,
    cwd: &Path,
    out: &mut Outputs,
    stop: &StopSignals,
) -> anyhow::Result<ExitStatus> {
    let root = asker.root().to_path_buf();
    let tasks = root.join("tasks");
    if let Some(path) = &args.out {
        refuse_existing(path, args.force)?;
    }
    let decisions = if interactive {
        clarify(asker, description, &tasks, out).await?
    } else {
        Vec::new()
    };
    let test_command = ask::facts::test_command(&root);
    // Rendered for each session's agent: a fallback agent after a limit gets its own prompt.
    let prompt = |style: PromptStyle| {
        plan::plan_prompt(description, &decisions, test_command.as_deref(), style)
    };
    let schema = plan::plan_schema();
    let settings = Loop {
        prompt: &prompt,
        schema: &schema,
        key: "userStories",
        max_attempts: args.attempts,
        draft_path: tasks.join(format!(
            "prd-{}.draft.json",
            crate::convert::markdown::kebab(description)
        )),
        what: "PRD",
    };
    let settled =
        ask::ask_until_valid(asker, &settings, out, |v| plan::check_plan(v, &decisions)).await?;
    let warnings = settled.warnings;
    let doc: PlanDoc = settled.value;
    let path = args
        .out
        .clone()
        .unwrap_or_else(|| tasks.join(format!("prd-{}.md", plan::slug(&doc.title))));
    refuse_existing(&path, args.force)?;
    let text = plan::render(&doc, &decisions);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| {
            UserError::new(format!("cannot create {}: {e}", parent.display()))
                .with_hint("choose another place with --out PATH")
        })?;
    }
    crate::fsutil::write_atomic(&path, text.as_bytes()).map_err(|e| {
        UserError::new(format!("cannot write {}: {e}", path.display()))
            .with_hint("check the directory's permissions, or choose another place with --out PATH")
    })?;
    let shown = crate::workspace::display_rel(&path, cwd);
    for w in &warnings {
        eprintln!("warning: {shown}: {w}");
    }
    let count = doc.user_stories.len();
    println!(
        "✓ wrote {shown}: {count} {} ({})",
        if count == 1 { "story" } else { "stories" },
        if decisions.is_empty() {
            "no questions asked; the agent's assumptions are in it"
        } else {
            "from your answers"
        }
    );
    if !args.convert {
        println!(
            "next: review and edit it, then `ralph convert {shown}` writes prd.json (no model \
             needed)"
        );
        return Ok(ExitStatus::Success);
    }
    let prd_out = cwd.join("prd.json");
    let req = crate::convert::Request {
        input: &path,
        out: &prd_out,
        force: args.force,
        attempts: args.attempts,
        strict: false,
        session: &args.session,
    };
    let done = crate::convert::convert(&req, Some(asker), cwd, out, stop).await?;
    crate::commands::convert::print_converted(&done, Path::new(&shown), cwd);
    Ok(ExitStatus::Success)
}

/// The clarifying round: the agent's questions, asked on the terminal one by one.
async fn clarify(
    asker: &Asker,
    description: &str,
    tasks: &Path,
    out: &mut Outputs,
) -> anyhow::Result<Vec<Decision>> {
    let prompt = |style: PromptStyle| plan::questions_prompt(description, style);
    let schema = plan::questions_schema();
    let settings = Loop {
        prompt: &prompt,
        schema: &schema,
        key: "questions",
        max_attempts: 2,
        draft_path: tasks.join("questions.draft.json"),
        what: "clarifying questions",
    };
    let questions = ask::ask_until_valid(asker, &settings, out, plan::check_questions)
        .await?
        .value;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(
        stdout,
        "\nA few questions first (a letter picks an option, or type your own answer; Enter lets \
         the agent decide):\n"
    );
    let mut decisions = Vec::new();
    let stdin = std::io::stdin();
    for (i, q) in questions.iter().enumerate() {
        let _ = write!(stdout, "{}> ", plan::show_question(i + 1, q));
        let _ = stdout.flush();
        let mut input = String::new();
        let read = stdin.lock().read_line(&mut input)?;
        if read == 0 {
            // End of input: the remaining questions are the agent's to decide.
            let _ = writeln!(stdout);
        }
        decisions.push(Decision {
            question: q.question.clone(),
            answer: plan::answer_from_input(q, &input),
        });
        let _ = writeln!(stdout);
    }
    Ok(decisions)
}

fn description(args: &PlanArgs) -> anyhow::Result<String> {
    let text = match (&args.description, &args.from) {
        (_, Some(file)) => std::fs::read_to_string(file).map_err(|e| {
            UserError::new(format!("cannot read {}: {e}", file.display()))
                .with_hint("pass the path of a text file describing the feature, or the description itself in quotes")
        })?,
        (Some(d), None) => d.clone(),
        (None, None) => String::new(),
    };
    if text.trim().is_empty() {
        return Err(UserError::usage("the feature description is empty")
            .with_hint("describe the feature in a sentence or a few: ralph plan \"add a --reverse flag to the CLI\"")
            .into());
    }
    Ok(text)
}

/// Refuses to write over `path` without `--force`.
fn refuse_existing(path: &Path, force: bool) -> anyhow::Result<()> {
    if !force && path.exists() {
        return Err(UserError::new(format!(
            "{} already exists; refusing to overwrite it",
            path.display()
        ))
        .with_hint("pass --force to overwrite it, or choose another file with --out PATH")
        .into());
    }
    Ok(())
}
