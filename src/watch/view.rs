//! Draws a [`Snapshot`] with ratatui: a header, the stories beside what runs now, the last
//! iterations, the budgets and hints, and a line of keys (or the hint being typed). Fits 80×24;
//! a bigger terminal shows more stories. Colour only when `color` is set (`NO_COLOR` unset).

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Direction, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Widget, Wrap};

use super::{LastEnd, RunState, Snapshot, StoryState};

/// What the view shows beside the snapshot: the hint being typed, the last key's result.
#[derive(Debug, Clone, Default)]
pub struct Ui {
    /// `Some` while the user types a hint (`h`).
    pub input: Option<String>,
    /// What the last key did, e.g. "hint 3 saved".
    pub message: Option<String>,
    /// Whether to use colour.
    pub color: bool,
}

impl Ui {
    fn style(&self, s: Style) -> Style {
        if self.color {
            s
        } else {
            Style::default()
        }
    }
}

/// `seconds` as `H:MM:SS` or `M:SS`.
pub fn clock(seconds: i64) -> String {
    let s = seconds.max(0);
    let (h, m, s) = (s / 3600, (s / 60) % 60, s % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// Draws `snap` into `area` of `buf`.
pub fn render(snap: &Snapshot, ui: &Ui, area: Rect, buf: &mut Buffer) {
    let recent_h = (snap.recent.len().max(1) as u16) + 2;
    let rows = Layout::default()
        .direction(Direction::Vertical)
        .constraints([
            Constraint::Length(1),
            Constraint::Min(5),
            Constraint::Length(recent_h),
            Constraint::Length(2),
            Constraint::Length(1),
        ])
        .split(area);
    header(snap, ui).render(rows[0], buf);
    let body = Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(45), Constraint::Percentage(55)])
        .split(rows[1]);
    stories(snap, ui).render(body[0], buf);
    now(snap, ui).render(body[1], buf);
    recent(snap, ui).render(rows[2], buf);
    Paragraph::new(vec![budget(snap), hints(snap)]).render(rows[3], buf);
    footer(ui, rows[4].width).render(rows[4], buf);
}

fn header<'a>(snap: &'a Snapshot, ui: &Ui) -> Paragraph<'a> {
    let bold = ui.style(Style::new().add_modifier(Modifier::BOLD));
    let mut spans = vec![Span::styled("ralph watch", bold)];
    let (state, color) = match &snap.run {
        RunState::Running { pid, .. } if snap.paused() => {
            (format!("PAUSED (pid {pid})"), Color::Yellow)
        }
        RunState::Running { pid, .. } if snap.pause_requested && !snap.others.is_empty() => (
            format!(
                "pausing: {} iterations finishing (pid {pid})",
                snap.others.len() + 1
            ),
            Color::Yellow,
        ),
        RunState::Running { pid, .. } if snap.pause_requested => (
            format!("pausing after this iteration (pid {pid})"),
            Color::Yellow,
        ),
        RunState::Running { pid, .. } => (format!("running (pid {pid})"), Color::Green),
        RunState::Ended(None) if snap.recent.is_empty() => {
            ("no run yet".to_owned(), Color::DarkGray)
        }
        RunState::Ended(_) => (
            match &snap.last_end {
                Some(LastEnd { what, at: Some(at) }) => {
                    format!("last run ended {} UTC: {what}", at.format("%H:%M"))
                }
                Some(LastEnd { what, at: None }) => format!("last run ended: {what}"),
                None => "no run active".to_owned(),
            },
            Color::DarkGray,
        ),
    };
    // The run's state first: on a narrow terminal the project and branch are what is cut.
    spans.push(Span::raw(" · "));
    spans.push(Span::styled(state, ui.style(Style::new().fg(color))));
    // A stop request left behind by an ended run stops nothing.
    if snap.stop_requested && matches!(snap.run, RunState::Running { .. }) {
        spans.push(Span::styled(
            " · stopping",
            ui.style(Style::new().fg(Color::Red)),
        ));
    }
    spans.push(Span::raw(format!(" · {}", snap.project)));
    if !snap.branch.is_empty() {
        spans.push(Span::raw(format!(" · {}", snap.branch)));
    }
    Paragraph::new(Line::from(spans))
}

fn stories<'a>(snap: &'a Snapshot, ui: &Ui) -> Paragraph<'a> {
    let passed = snap
        .stories
        .iter()
        .filter(|s| s.state == StoryState::Passed)
        .count();
    let mut lines: Vec<Line> = Vec::new();
    // A long list starts a line above the first story not passed yet.
    let mut first_open = None;
    for s in &snap.stories {
        let (mark, color, why) = match &s.state {
            StoryState::Passed => ("✓", Color::Green, None),
            StoryState::Open => ("·", Color::Reset, None),
            StoryState::InFlight => ("▶", Color::Cyan, None),
            StoryState::Blocked(why) => ("✗", Color::Red, Some(format!("blocked: {why}"))),
            StoryState::Waiting(deps) => (
                "…",
                Color::DarkGray,
                Some(format!("waits for {}", deps.join(", "))),
            ),
        };
        if s.state != StoryState::Passed && first_open.is_none() {
            first_open = Some(lines.len());
        }
        let style = ui.style(Style::new().fg(color));
        lines.push(Line::from(vec![
            Span::styled(format!("{mark} {}", s.id), style),
            Span::raw(format!(" {}", s.title)),
        ]));
        if let Some(why) = why {
            lines.push(Line::styled(format!("  ↳ {why}"), style));
        }
    }
    let scroll = first_open.unwrap_or(0).saturating_sub(1) as u16;
    Paragraph::new(lines).scroll((scroll, 0)).block(
        Block::default()
            .borders(Borders::ALL)
            .title(format!(" Stories {passed}/{} passed ", snap.stories.len())),
    )
}

/// `iteration 4 · US-003 · w2 · 1m12s` (the worker only in a `--parallel` run).
fn flight_line(snap: &Snapshot, f: &super::Flight) -> String {
    let worker = f.worker.map(|w| format!(" · w{w}")).unwrap_or_default();
    format!(
        "iteration {} · {}{worker} · {}",
        f.iteration,
        f.story_id,
        clock((snap.now - f.started_at).num_seconds())
    )
}

fn now<'a>(snap: &'a Snapshot, ui: &Ui) -> Paragraph<'a> {
    let dim = ui.style(Style::new().fg(Color::DarkGray));
    let mut lines: Vec<Line> = Vec::new();
    let title = match &snap.flight {
        Some(f) => {
            lines.push(Line::from(flight_line(snap, f)));
            if f.actions.is_empty() {
                lines.push(Line::styled("(no action yet)", dim));
            }
            for a in &f.actions {
                lines.push(Line::from(format!("› {a}")));
            }
            // `--parallel`: the other workers, one line each with their latest action.
            for other in &snap.others {
                lines.push(Line::from(flight_line(snap, other)));
                let last = other
                    .actions
                    .last()
                    .map_or("(no action yet)", String::as_str);
                lines.push(Line::styled(format!("› {last}"), dim));
            }
            if snap.others.is_empty() {
                " Running "
            } else {
                " Running (parallel) "
            }
        }
        None => {
            if let Some(until) = snap.wait_until {
                lines.push(Line::from(format!(
                    "usage limit: waits {} (until {} UTC)",
                    clock((until - snap.now).num_seconds()),
                    until.format("%H:%M")
                )));
            }
            if let Some(at) = snap.retry_at {
                lines.push(Line::from(format!(
                    "transient failure: tries again in {} (at {} UTC)",
                    clock((at - snap.now).num_seconds()),
                    at.format("%H:%M:%S")
                )));
            }
            match &snap.run {
                RunState::Running { .. } if snap.paused() => lines.push(Line::from(
                    "paused: `ralph resume` (p) goes on; prd.json and progress.txt are yours to edit",
                )),
                RunState::Running { .. } => lines.push(Line::styled("between iterations", dim)),
                RunState::Ended(Some(reason)) => {
                    lines.push(Line::from(format!("stopped: {reason}")))
                }
                RunState::Ended(None) => lines.push(Line::from("no run is active")),
            }
            " Now "
        }
    };
    Paragraph::new(lines)
        .wrap(Wrap { trim: true })
        .block(Block::default().borders(Borders::ALL).title(title))
}

fn recent<'a>(snap: &'a Snapshot, ui: &Ui) -> Paragraph<'a> {
    let lines: Vec<Line> = if snap.recent.is_empty() {
        vec![Line::styled(
            "(none yet)",
            ui.style(Style::new().fg(Color::DarkGray)),
        )]
    } else {
        snap.recent
            .iter()
            .map(|r| {
                let good = matches!(r.outcome.as_str(), "story_passed" | "progress");
                let color = if good { Color::Green } else { Color::Yellow };
                let cost = r.cost_usd.map(|c| format!(" ${c:.2}")).unwrap_or_default();
                let why = if r.why.is_empty() {
                    String::new()
                } else {
                    format!(" · {}", r.why)
                };
                Line::from(vec![
                    Span::raw(format!("#{} {} ", r.iteration, r.story_id)),
                    Span::styled(r.outcome.as_str(), ui.style(Style::new().fg(color))),
                    Span::raw(format!(" {}{cost}{why}", clock(r.duration_s as i64))),
                ])
            })
            .collect()
    };
    Paragraph::new(lines).block(
        Block::default()
            .borders(Borders::ALL)
            .title(" Last iterations "),
    )
}

fn budget(snap: &Snapshot) -> Line<'static> {
    let b = &snap.budget;
    let iters = match b.max_iter {
        Some(m) => format!("{}/{m}", b.iterations),
        None => b.iterations.to_string(),
    };
    let cost = match b.max_cost_usd {
        Some(m) => format!("${:.2}/${m:.2}", b.cost_usd),
        None => format!("${:.2}", b.cost_usd),
    };
    Line::from(format!(
        "iterations {iters} · cost {cost} · tokens {} in, {} out",
        b.tokens_in, b.tokens_out
    ))
}

fn hints(snap: &Snapshot) -> Line<'static> {
    if snap.hints.is_empty() {
        return Line::from("hints: none pending");
    }
    let list: Vec<String> = snap
        .hints
        .iter()
        .map(|h| match &h.story {
            Some(s) => format!("{} [{s}] {}", h.id, h.text),
            None => format!("{} {}", h.id, h.text),
        })
        .collect();
    match list.len() {
        1 => Line::from(format!("hints pending: {}", list[0])),
        n => Line::from(format!("hints pending ({n}): {}", list.join(" · "))),
    }
}

/// The keys, in full and in short (when a status message leaves too little room).
const KEYS: &str = "h hint · p pause/resume · s stop after this iteration · q quit";
const KEYS_SHORT: &str = "h hint · p pause · s stop · q quit";

/// The bottom line, at most `width` columns: the hint being typed (its end, so the cursor stays
/// in view), or the last key's message and the keys. A message that leaves no room for the
/// full keys gets the short ones, and is cut (`…`) when even those do not fit.
pub fn footer_text(ui: &Ui, width: usize) -> String {
    let line = match &ui.input {
        Some(text) => {
            let tail = "█  (Enter saves, Esc cancels)";
            let room = width.saturating_sub("hint> ".len() + tail.chars().count());
            let shown: String = if text.chars().count() > room {
                let skip = text.chars().count() - room.saturating_sub(1);
                format!("…{}", text.chars().skip(skip).collect::<String>())
            } else {
                text.clone()
            };
            format!("hint> {shown}{tail}")
        }
        None => match &ui.message {
            None => KEYS.to_owned(),
            Some(m) => {
                let full = format!("{m} · {KEYS}");
                if full.chars().count() <= width {
                    full
                } else {
                    let room = width.saturating_sub(KEYS_SHORT.chars().count() + 3);
                    format!("{} · {KEYS_SHORT}", cut(m, room))
                }
            }
        },
    };
    cut(&line, width)
}

/// `text` cut to `width` characters, the last one `…` when cut.
fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn footer(ui: &Ui, width: u16) -> Paragraph<'static> {
    Paragraph::new(Line::styled(
        footer_text(ui, usize::from(width)),
        ui.style(Style::new().add_modifier(Modifier::REVERSED)),
    ))
}

/// The snapshot as plain text, `width` columns wide: what `ralph watch` prints when stdout is not
/// a terminal. As tall as the content needs.
pub fn plain(snap: &Snapshot, width: u16) -> String {
    let story_lines = snap.stories.len()
        + snap
            .stories
            .iter()
            .filter(|s| matches!(s.state, StoryState::Blocked(_) | StoryState::Waiting(_)))
            .count();
    let now_lines = snap
        .flight
        .as_ref()
        .map_or(3, |f| f.actions.len().max(1) + 1)
        + 2 * snap.others.len();
    let body = story_lines.max(now_lines).max(3) + 2;
    let height = (1 + body + snap.recent.len().max(1) + 2 + 2 + 1) as u16;
    let area = Rect::new(0, 0, width, height);
    let mut buf = Buffer::empty(area);
    let ui = Ui {
        input: None,
        message: None,
        color: false,
    };
    render(snap, &ui, area, &mut buf);
    let mut lines = buffer_lines(&buf);
    // The key line means nothing without a terminal.
    lines.pop();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines.join("\n") + "\n"
}

/// Each row of `buf` as text, trailing spaces trimmed.
pub fn buffer_lines(buf: &Buffer) -> Vec<String> {
    let area = buf.area;
    (area.y..area.y + area.height)
        .map(|y| {
            let mut line = String::new();
            for x in area.x..area.x + area.width {
                line.push_str(buf[(x, y)].symbol());
            }
            line.trim_end().to_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_line_fits_its_width_whatever_the_message() {
        let ui = |message: Option<&str>, input: Option<&str>| Ui {
            message: message.map(str::to_owned),
            input: input.map(str::to_owned),
            color: false,
        };
        assert_eq!(footer_text(&ui(None, None), 80), KEYS);
        let short = footer_text(&ui(Some("resumed"), None), 80);
        assert_eq!(short, format!("resumed · {KEYS}"));
        let long = "cannot save the hint: cannot write /home/someone/project/.ralph/hints/0003.json: No space left on device";
        for width in [40, 80, 120] {
            let line = footer_text(&ui(Some(long), None), width);
            assert!(line.chars().count() <= width, "{width}: {line}");
            assert!(line.ends_with(KEYS_SHORT), "{width}: {line}");
            assert!(line.starts_with("ca"), "{line}");
            if width >= 80 {
                assert!(
                    line.starts_with("cannot save the hint: cannot write"),
                    "{line}"
                );
            }
        }
        let typed = "x".repeat(200) + "END";
        let line = footer_text(&ui(None, Some(&typed)), 80);
        assert!(line.chars().count() <= 80, "{line}");
        assert!(
            line.contains("END█"),
            "the cursor end stays in view: {line}"
        );
        assert!(line.ends_with("(Enter saves, Esc cancels)"), "{line}");
    }
}
