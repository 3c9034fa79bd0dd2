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
    let body = body_columns(rows[1]);
    stories(snap, ui).render(body[0], buf);
    now(snap, ui).render(body[1], buf);
    recent(snap, ui).render(rows[2], buf);
    Paragraph::new(vec![budget(snap), hints(snap)]).render(rows[3], buf);
    footer(snap, ui, rows[4].width).render(rows[4], buf);
}

/// The stories' column and the "Now" column of the body `area`.
fn body_columns(area: Rect) -> std::rc::Rc<[Rect]> {
    Layout::default()
        .direction(Direction::Horizontal)
        .constraints([Constraint::Percentage(45), Constraint::Percentage(55)])
        .split(area)
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
    lines.extend(agent_resets(snap));
    Paragraph::new(lines)
        .wrap(Wrap { trim: true })
        .block(Block::default().borders(Borders::ALL).title(title))
}

/// Fallback agents: one countdown per limited agent (`claude limited: resets in 0:56 (01:13
/// UTC)`), while the others work or while the run waits. A run with one agent waiting for it
/// says so once, in the run's wait line.
fn agent_resets(snap: &Snapshot) -> Vec<Line<'static>> {
    if snap.flight.is_none() && snap.wait_until.is_some() && snap.agent_resets.len() == 1 {
        return Vec::new();
    }
    snap.agent_resets
        .iter()
        .map(|(name, at)| {
            Line::from(format!(
                "{name} limited: resets in {} ({} UTC)",
                clock((*at - snap.now).num_seconds()),
                at.format("%H:%M")
            ))
        })
        .collect()
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
    // Iterations that do not count toward `--max-iter` (a usage limit, a login failure, as
    // after a fallback switch) still ran: "0/10" alone read as none.
    let iters = if b.ran > b.iterations {
        format!("{iters} counted ({} ran)", b.ran)
    } else {
        iters
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
/// The keys that act when no run holds the lock: a hint is kept for the next run; pause and stop
/// have nothing to act on.
const KEYS_ENDED: &str = "h hint for the next run · q quit";
const KEYS_ENDED_SHORT: &str = "h hint · q quit";
/// The same, with a pause left asked (a run that ended without clearing it): `p` takes it back.
const KEYS_ENDED_PAUSED: &str = "h hint for the next run · p take back the pause · q quit";
const KEYS_ENDED_PAUSED_SHORT: &str = "h hint · p resume · q quit";

/// The keys that act on `snap`'s run, in full and in short: pause and stop only while a run
/// holds the lock.
pub fn keys(snap: &Snapshot) -> (&'static str, &'static str) {
    match (&snap.run, snap.pause_requested) {
        (RunState::Running { .. }, _) => (KEYS, KEYS_SHORT),
        (RunState::Ended(_), true) => (KEYS_ENDED_PAUSED, KEYS_ENDED_PAUSED_SHORT),
        (RunState::Ended(_), false) => (KEYS_ENDED, KEYS_ENDED_SHORT),
    }
}

/// The bottom line, at most `width` columns: the hint being typed (its end, so the cursor stays
/// in view), or the last key's message and the keys (`keys`: in full and in short, see
/// [`keys`]). A message that leaves no room for the full keys gets the short ones, and is cut
/// (`…`) when even those do not fit.
pub fn footer_text(ui: &Ui, keys: (&str, &str), width: usize) -> String {
    let (full_keys, short_keys) = keys;
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
            None => full_keys.to_owned(),
            Some(m) => {
                let full = format!("{m} · {full_keys}");
                if full.chars().count() <= width {
                    full
                } else {
                    let room = width.saturating_sub(short_keys.chars().count() + 3);
                    format!("{} · {short_keys}", cut(m, room))
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

fn footer(snap: &Snapshot, ui: &Ui, width: u16) -> Paragraph<'static> {
    Paragraph::new(Line::styled(
        footer_text(ui, keys(snap), usize::from(width)),
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
    let ui = Ui {
        input: None,
        message: None,
        color: false,
    };
    // The "Now" panel wraps its long lines: as tall as its lines are once wrapped at its width
    // (counting its lines before wrapping cut the other lanes of a `--parallel` run off).
    let now_width = body_columns(Rect::new(0, 0, width, 1))[1].width;
    // ratatui 0.29's `line_count` wraps at the width it is given, borders included: the inner
    // width is given, and the borders' two rows taken off.
    let now_lines = now(snap, &ui)
        .line_count(now_width.saturating_sub(2))
        .saturating_sub(2);
    let body = story_lines.max(now_lines).max(3) + 2;
    let height = (1 + body + snap.recent.len().max(1) + 2 + 2 + 1) as u16;
    let area = Rect::new(0, 0, width, height);
    let mut buf = Buffer::empty(area);
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
        assert_eq!(footer_text(&ui(None, None), (KEYS, KEYS_SHORT), 80), KEYS);
        let short = footer_text(&ui(Some("resumed"), None), (KEYS, KEYS_SHORT), 80);
        assert_eq!(short, format!("resumed · {KEYS}"));
        let long = "cannot save the hint: cannot write /home/someone/project/.ralph/hints/0003.json: No space left on device";
        for width in [40, 80, 120] {
            let line = footer_text(&ui(Some(long), None), (KEYS, KEYS_SHORT), width);
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
        let line = footer_text(&ui(None, Some(&typed)), (KEYS, KEYS_SHORT), 80);
        assert!(line.chars().count() <= 80, "{line}");
        assert!(
            line.contains("END█"),
            "the cursor end stays in view: {line}"
        );
        assert!(line.ends_with("(Enter saves, Esc cancels)"), "{line}");
    }
}

#[cfg(test)]
mod plain_tests {
    use super::*;
    use crate::watch::{Budget, Flight};
    use chrono::{DateTime, TimeZone, Utc};

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, h, m, s).unwrap()
    }

    /// A `--parallel 2` run: two flights whose actions are long enough to wrap at 80 columns.
    fn two_lanes() -> Snapshot {
        let flight = |iteration: u32, story: &str, worker: u32| {
            Flight {
            iteration,
            story_id: story.into(),
            started_at: at(1, 0, 0),
            actions: vec![
                format!("“Reading the whole module tree of {story} before changing anything at all.”"),
                format!("Bash: cargo test --workspace --all-features -- {story} --nocapture --test-threads 1"),
                format!("Edit: the module of {story} and its many implementation details finally"),
            ],
            worker: Some(worker),
        }
        };
        Snapshot {
            project: "Demo".into(),
            branch: "ralph/demo".into(),
            run: RunState::Running {
                pid: 7,
                host: "box".into(),
            },
            pause_requested: false,
            stop_requested: false,
            stories: Vec::new(),
            flight: Some(flight(1, "US-001", 1)),
            others: vec![flight(2, "US-002", 2)],
            recent: Vec::new(),
            budget: Budget::default(),
            wait_until: None,
            retry_at: None,
            agent_resets: Vec::new(),
            hints: Vec::new(),
            last_end: None,
            now: at(1, 1, 0),
        }
    }

    #[test]
    fn the_plain_snapshot_shows_every_flight_even_when_its_lines_wrap() {
        let snap = two_lanes();
        for width in [60, 80, 100] {
            let shown = plain(&snap, width);
            for needle in ["iteration 1 · US-001 · w1", "iteration 2 · US-002 · w2"] {
                assert!(
                    shown.contains(needle),
                    "{width}: no {needle:?} in:\n{shown}"
                );
            }
            // Each lane's last action, whole (wrapped over its lines).
            assert_eq!(shown.matches("finally").count(), 2, "{width}:\n{shown}");
            assert!(
                shown.contains("Last iterations"),
                "{width}: the panel below was cut:\n{shown}"
            );
        }
    }

    #[test]
    fn each_limited_agent_counts_down_to_its_reset_beside_the_flights() {
        let mut snap = two_lanes();
        snap.agent_resets = vec![
            ("claude".into(), at(1, 13, 0)),
            ("codex".into(), at(1, 2, 30)),
        ];
        let shown = plain(&snap, 100);
        assert!(
            shown.contains("claude limited: resets in 12:00 (01:13 UTC)"),
            "{shown}"
        );
        assert!(
            shown.contains("codex limited: resets in 1:30 (01:02 UTC)"),
            "{shown}"
        );
        assert!(shown.contains("iteration 2 · US-002 · w2"), "{shown}");
    }
}
