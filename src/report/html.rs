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
    env.get_template("report.html")?.render(context! {
        r => report,
        wall => short_secs(s.wall_s),
        cost => s.cost_usd.map(usd).unwrap_or_else(|| "not reported".into()),
        tokens => tokens,
        tokens_total => tokens_total,
    })
}
