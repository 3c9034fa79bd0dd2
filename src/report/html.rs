//! The report as one self-contained HTML file: inline CSS, no script, no font, image or request
//! of any kind (a Content-Security-Policy of `default-src 'none'` says so to the browser), so it
//! opens offline, as a CI artifact or a mail attachment. The page is `templates/report.html`,
//! rendered with minijinja (auto-escaped); the timeline places each iteration's bar by its start
//! and end in percent of the covered span.

use minijinja::{context, Environment};

use super::Report;
use crate::output::text::{short_secs, usd};

/// The template, compiled into ralph.
const TEMPLATE: &str = include_str!("../../templates/report.html");

/// Renders `report` as HTML.
///
/// # Errors
/// A template error (a bug in ralph: the template is tested).
pub fn render(report: &Report) -> Result<String, minijinja::Error> {
    let mut env = Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.add_function("usd", |c: f64| usd(c));
    env.add_function("secs", |s: f64| short_secs(s));
    env.add_template("report.html", TEMPLATE)?;
    let s = &report.summary;
    let tokens = match (s.tokens_in, s.tokens_out) {
        (None, None) => "not reported".to_owned(),
        (i, o) => format!("{} / {}", i.unwrap_or(0), o.unwrap_or(0)),
    };
    let tokens_total = report
        .cumulative
        .last()
        .map(|c| format!("{} tokens", c.tokens))
        .unwrap_or_else(|| "no tokens".into());
    // Redacted before escaping, which could split a secret (crate::redact).
    let mut r = crate::redact::redacted_value(report);
    crate::output::text::strip_ansi_value(&mut r);
    env.get_template("report.html")?.render(context! {
        r => r,
        wall => if report.source == "git" { "?".to_owned() } else { short_secs(s.wall_s) },
        cost => s.cost_usd.map(usd).unwrap_or_else(|| "not reported".into()),
        tokens => tokens,
        tokens_total => tokens_total,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{History, Source};
    use crate::protocol::{LedgerRecord, Outcome, VerifyRecord};

    /// A record with every optional field absent, and a silent failed check (`test -f`), must
    /// render: the template may not assume any of them.
    #[test]
    fn a_sparse_history_renders() {
        let mut r = LedgerRecord::new("r1", 1, "US-001", Outcome::VerifyFailed, chrono::Utc::now());
        r.verify = vec![VerifyRecord {
            story_id: "US-001".into(),
            command: "test -f x".into(),
            passed: false,
            result: None,
            output_tail: String::new(),
            interrupted: false,
        }];
        let history = History {
            records: vec![
                r,
                LedgerRecord::new("r1", 2, "US-009", Outcome::Interrupted, chrono::Utc::now()),
            ],
            source: Source::Ledger,
        };
        let prd: crate::prd::model::Prd = serde_json::from_value(serde_json::json!({
            "project": "p", "userStories": [{"id": "US-001", "title": "t <b>", "acceptanceCriteria": [],
            "priority": 1, "passes": false}]})).unwrap();
        let report = crate::report::build(
            &history,
            &crate::report::Scope::All,
            &crate::report::Inputs {
                prd: &prd,
                state: None,
                repo: None,
                progress: "",
            },
        )
        .unwrap();
        let html = render(&report).unwrap();
        assert!(html.contains("(it printed nothing)"));
        assert!(html.contains("t &lt;b&gt;"), "titles are escaped");
        assert!(
            html.contains("data-story=\"US-009\""),
            "a story gone from prd.json keeps its row"
        );
    }
}
