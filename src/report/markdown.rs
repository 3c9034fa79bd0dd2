//! The report's summary as Markdown, for a CI step summary or a pull-request comment: the
//! numbers, why the run stopped, the stories table and one line per iteration (no diffs).

use std::fmt::Write as _;

use super::Report;
use crate::output::text::{short_secs, usd, usd_or_unknown};

/// Renders `report` as Markdown, secrets redacted (`crate::redact`: a step summary is often
/// public).
pub fn render(r: &Report) -> String {
    crate::output::text::readable(&render_raw(r))
}

fn render_raw(r: &Report) -> String {
    let mut out = String::new();
    let s = &r.summary;
    let _ = writeln!(out, "## ralph: {} ({})\n", r.project, r.scope);
    if let Some(why) = &s.stop_text {
        let _ = writeln!(out, "**Why it stopped:** {why}\n");
    }
    if let Some(at) = &s.resume_at {
        let _ = writeln!(
            out,
            "**Resumes at:** {at} (`ralph run` after it continues)\n"
        );
    }
    let tokens = match (s.tokens_in, s.tokens_out) {
        (None, None) => "not reported".to_owned(),
        (i, o) => format!("{} in / {} out", i.unwrap_or(0), o.unwrap_or(0)),
    };
    let _ = writeln!(
        out,
        "| stories passed | open | blocked | iterations | wall time | cost | tokens |\n|---|---|---|---|---|---|---|\n| {} of {} | {} | {} | {} | {} | {} | {} |\n",
        s.passed,
        s.stories,
        s.open,
        s.blocked,
        s.iterations,
        if r.source == "git" {
            "?".to_owned()
        } else {
            short_secs(s.wall_s)
        },
        s.cost_usd.map(usd).unwrap_or_else(|| "not reported".into()),
        tokens
    );
    if r.source == "git" {
        out.push_str("_From git history only: no durations, costs or reasons._\n\n");
    }
    out.push_str("### Stories\n\n| story | title | status | iterations | last outcome | cost | time to pass |\n|---|---|---|---|---|---|---|\n");
    for st in &r.stories {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            st.id,
            escape(&st.title),
            st.status,
            st.iterations,
            st.last_outcome.map(|o| o.as_str()).unwrap_or(""),
            usd_or_unknown(st.cost_usd),
            st.time_to_pass_s.map(short_secs).unwrap_or_default()
        );
    }
    out.push_str("\n### Iterations\n\n| # | story | outcome | time | cost | commits | files | why |\n|---|---|---|---|---|---|---|---|\n");
    for c in &r.iterations {
        let rec = &c.record;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            rec.iteration,
            rec.story_id,
            rec.outcome,
            c.duration,
            c.cost,
            crate::output::text::record_count(rec, rec.commits.len()),
            crate::output::text::record_count(rec, rec.files_changed.len()),
            escape(&c.reason)
        );
    }
    let refused: Vec<String> = r
        .iterations
        .iter()
        .filter(|c| !c.record.refused_hosts.is_empty())
        .map(|c| {
            format!(
                "- #{} (--sandbox {}): {}",
                c.record.iteration,
                c.record.sandbox.as_str(),
                c.record.refused_hosts.join(", ")
            )
        })
        .collect();
    if !refused.is_empty() {
        let _ = writeln!(out, "\n### Refused connections\n\n{}", refused.join("\n"));
    }
    if !r.patterns.is_empty() {
        let _ = writeln!(out, "\n### Codebase Patterns\n\n{}", r.patterns);
    }
    out
}

/// `text` safe inside a Markdown table cell.
fn escape(text: &str) -> String {
    // Redacted before escaping, which could split a secret.
    crate::output::text::readable(text)
        .replace('|', "\\|")
        .replace('\n', " ")
}
