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

/// Most rows of the stories table (see [`more_stories`]).
pub const MAX_STORY_ROWS: usize = 100;

/// The line under a stories table that shows `shown` of `stories`: how many more, by status,
/// e.g. `… and 99,990 more stories (50,000 open, 49,990 passing): \`ralph status\` lists every one.`
fn more_stories(stories: &[super::StoryRow], shown: usize) -> String {
    let mut by_status: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut rest = 0usize;
    for st in stories.iter().filter(|st| st.iterations == 0) {
        rest += 1;
        // `waits for US-001 (blocked)` counts as waiting.
        let status = match st.status.split(' ').next().unwrap_or("") {
            "passes" => "passing",
            "waits" => "waiting",
            other => other,
        };
        *by_status.entry(status).or_default() += 1;
    }
    // Stories these runs worked on beyond the table's rows.
    let worked = stories.len() - shown - rest;
    let mut parts: Vec<String> = by_status
        .iter()
        .map(|(status, n)| format!("{} {status}", thousands(*n)))
        .collect();
    if worked > 0 {
        parts.insert(0, format!("{} more worked on", thousands(worked)));
    }
    format!(
        "… and {} more stories ({}): `ralph status` lists every one.",
        thousands(stories.len() - shown),
        parts.join(", ")
    )
}

/// `99990` as `99,990`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
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
    // A step summary has a 1 MiB limit on GitHub and a reader: past MAX_STORY_ROWS stories,
    // the ones these runs worked on, up to that many, and the count of the rest by status.
    let shown: Vec<&super::StoryRow> = if r.stories.len() <= MAX_STORY_ROWS {
        r.stories.iter().collect()
    } else {
        r.stories
            .iter()
            .filter(|st| st.iterations > 0)
            .take(MAX_STORY_ROWS)
            .collect()
    };
    for st in &shown {
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
    if shown.len() < r.stories.len() {
        let _ = writeln!(out, "\n{}", more_stories(&r.stories, shown.len()));
    }
    lanes(&mut out, &r.timeline.lanes);
    // `--parallel`: each iteration's worker and landing; a serial run's table is as it was.
    let parallel = !r.timeline.lanes.is_empty();
    if parallel {
        out.push_str("\n### Iterations\n\n| # | worker | story | outcome | landing | time | cost | commits | files | why |\n|---|---|---|---|---|---|---|---|---|---|\n");
    } else {
        out.push_str("\n### Iterations\n\n| # | story | outcome | time | cost | commits | files | why |\n|---|---|---|---|---|---|---|---|\n");
    }
    for c in &r.iterations {
        let rec = &c.record;
        // With fallback agents, the outcome names the agent that ran (`usage_limit · claude`).
        let outcome = match &rec.agent {
            Some(agent) => format!("{} · {}", rec.outcome, escape(agent)),
            None => rec.outcome.to_string(),
        };
        let (story, outcome) = if parallel {
            let worker = rec.worker.map(|w| format!("w{w}")).unwrap_or_default();
            let landing = c.landing.as_deref().map(escape).unwrap_or_default();
            (
                format!("{worker} | {}", rec.story_id),
                format!("{outcome} | {landing}"),
            )
        } else {
            (rec.story_id.clone(), outcome)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            rec.iteration,
            story,
            outcome,
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

/// `--parallel`: one row per worker with its iterations in time (start after the timeline's
/// start, wall time, outcome, landing), so that overlapping iterations read side by side.
fn lanes(out: &mut String, lanes: &[super::Lane]) {
    if lanes.is_empty() {
        return;
    }
    out.push_str("\n### Lanes\n\nOne lane per worker (`--parallel`); each iteration with its start after the first one's and its time.\n\n| worker | iterations |\n|---|---|\n");
    for lane in lanes {
        let bars: Vec<String> = lane
            .bars
            .iter()
            .map(|b| {
                let landing = b
                    .landing
                    .as_deref()
                    .map(|l| format!(", {l}"))
                    .unwrap_or_default();
                format!(
                    "#{} {} {} (+{}, {}{landing})",
                    b.bar.iteration,
                    b.story_id,
                    b.bar.outcome,
                    short_secs(b.offset_s),
                    short_secs(b.duration_s)
                )
            })
            .collect();
        let _ = writeln!(out, "| {} | {} |", lane.label, escape(&bars.join(" · ")));
    }
}

/// `text` safe inside a Markdown table cell.
fn escape(text: &str) -> String {
    // Redacted before escaping, which could split a secret.
    crate::output::text::readable(text)
        .replace('|', "\\|")
        .replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::StoryRow;

    fn row(i: usize, status: &str, iterations: usize) -> StoryRow {
        StoryRow {
            id: format!("US-{i:06}"),
            title: format!("Story {i}"),
            status: status.to_owned(),
            iterations,
            last_outcome: None,
            cost_usd: None,
            time_to_pass_s: None,
        }
    }

    #[test]
    fn a_stories_table_past_its_rows_says_how_many_more_by_status() {
        let mut stories: Vec<StoryRow> = (1..=50_000).map(|i| row(i, "passes", 0)).collect();
        stories.extend((50_001..=99_990).map(|i| row(i, "open", 0)));
        stories.push(row(99_991, "waits for US-099990 (blocked)", 0));
        stories.extend((99_992..=100_000).map(|i| row(i, "open", 1)));
        // The 9 stories worked on are the table's rows.
        assert_eq!(
            more_stories(&stories, 9),
            "… and 99,991 more stories (49,990 open, 50,000 passing, 1 waiting): `ralph status` lists every one."
        );
        // Worked on beyond the rows shown are counted apart.
        assert_eq!(
            more_stories(&stories, 5),
            "… and 99,995 more stories (4 more worked on, 49,990 open, 50,000 passing, 1 waiting): `ralph status` lists every one."
        );
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
