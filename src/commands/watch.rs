//! `ralph watch [--prd PATH]`: a live view of the `ralph run` in this repository (or of the last
//! run when none is active), from any terminal. It reads files only ([`crate::watch`]); its keys
//! write the same request files as the commands: `h` a hint (`ralph hint`), `p` a pause or its
//! removal (`ralph pause` / `ralph resume`), `s` a stop request (`ralph stop`). `q` quits the
//! view and never stops the run. When stdout is not a terminal it prints one plain snapshot and
//! exits. Honours `NO_COLOR`.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{cursor, execute, terminal};

use crate::cli::StopArgs;
use crate::protocol::ExitStatus;
use crate::watch::view::{self, Ui};
use crate::watch::{Probe, RunState, Snapshot};
use crate::workspace::RunPaths;

/// How often the files are read again.
const REFRESH: Duration = Duration::from_millis(500);

/// Runs `ralph watch`.
///
/// # Errors
/// No prd.json found, prd.json invalid at the start, or the terminal cannot be set up.
pub fn run(args: &StopArgs) -> anyhow::Result<ExitStatus> {
    let cwd = std::env::current_dir()?;
    let prd = crate::workspace::locate_prd(args.prd.as_deref(), &cwd)?;
    let paths = RunPaths::of_prd(&prd);
    let snap = Snapshot::load(&paths, &Probe::real(&paths.ralph_dir))?;
    if !std::io::stdout().is_terminal() {
        let width = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse::<u16>().ok())
            .unwrap_or(100)
            .clamp(40, 400);
        print!("{}", view::plain(&snap, width));
        return Ok(ExitStatus::Success);
    }
    let color = std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let _screen = Screen::enter()?;
    let backend = ratatui::backend::CrosstermBackend::new(std::io::stdout());
    let mut term = ratatui::Terminal::new(backend)?;
    let mut ui = Ui {
        color,
        ..Ui::default()
    };
    let mut snap = snap;
    let mut loaded = Instant::now();
    loop {
        if loaded.elapsed() >= REFRESH {
            // prd.json mid-rewrite: keep the last good picture.
            if let Ok(s) = Snapshot::load(&paths, &Probe::real(&paths.ralph_dir)) {
                snap = s;
            }
            snap.now = chrono::Utc::now();
            loaded = Instant::now();
        }
        term.draw(|f| view::render(&snap, &ui, f.area(), f.buffer_mut()))?;
        if !event::poll(Duration::from_millis(200))? {
            continue;
        }
        let Event::Key(key) = event::read()? else {
            continue;
        };
        if key.kind != KeyEventKind::Press {
            continue;
        }
        let ctrl_c =
            key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c');
        if let Some(text) = ui.input.as_mut() {
            match key.code {
                _ if ctrl_c => ui.input = None,
                KeyCode::Esc => ui.input = None,
                KeyCode::Enter => {
                    let text = std::mem::take(text);
                    ui.input = None;
                    ui.message = Some(save_hint(&paths, text.trim()));
                    loaded -= REFRESH;
                }
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => {}
            }
            continue;
        }
        match key.code {
            _ if ctrl_c => break,
            KeyCode::Char('q') | KeyCode::Esc => break,
            KeyCode::Char('h') => {
                ui.input = Some(String::new());
                ui.message = None;
            }
            KeyCode::Char('p') => ui.message = Some(toggle_pause(&paths, &snap)),
            KeyCode::Char('s') => ui.message = Some(ask_stop(&paths, &snap)),
            _ => {}
        }
        loaded -= REFRESH;
    }
    Ok(ExitStatus::Success)
}

fn save_hint(paths: &RunPaths, text: &str) -> String {
    if text.is_empty() {
        return "empty hint not saved".to_owned();
    }
    match crate::hints::add(&paths.ralph_dir, text, None) {
        Ok(h) => format!("hint {} saved for the next iteration", h.id),
        Err(e) => format!("cannot save the hint: {e}"),
    }
}

fn toggle_pause(paths: &RunPaths, snap: &Snapshot) -> String {
    if crate::pause_request::pending(&paths.ralph_dir).is_some() {
        crate::pause_request::clear(&paths.ralph_dir);
        return "resumed".to_owned();
    }
    if !matches!(snap.run, RunState::Running { .. }) {
        return "no run to pause".to_owned();
    }
    match crate::pause_request::request(&paths.ralph_dir) {
        Ok(()) => "pause asked: the run holds after this iteration".to_owned(),
        Err(e) => format!("cannot ask for a pause: {e}"),
    }
}

fn ask_stop(paths: &RunPaths, snap: &Snapshot) -> String {
    if !matches!(snap.run, RunState::Running { .. }) {
        return "no run to stop".to_owned();
    }
    match crate::stop_request::request(&paths.ralph_dir) {
        Ok(()) => "stop asked: the run stops after this iteration".to_owned(),
        Err(e) => format!("cannot ask for a stop: {e}"),
    }
}

/// The terminal in raw mode on the alternate screen, put back when dropped (also on an error).
struct Screen;

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        terminal::enable_raw_mode()?;
        let screen = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            terminal::LeaveAlternateScreen,
            cursor::Show
        );
        let _ = terminal::disable_raw_mode();
    }
}
