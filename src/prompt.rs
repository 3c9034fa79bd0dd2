//! The per-iteration prompt: `templates/prompt.md` (embedded) or a user template, rendered with
//! minijinja in strict mode so that a misspelt variable is an error, never an empty string.

use std::path::{Path, PathBuf};

use minijinja::{Environment, UndefinedBehavior};
use serde::Serialize;

use crate::completion::PROMISE;
use crate::prd::model::{Prd, Story};
use crate::workspace::RunPaths;

/// The built-in template, `templates/prompt.md`.
pub const BUILTIN_TEMPLATE: &str = include_str!("../templates/prompt.md");
/// The built-in template for small local models, `templates/prompt_local.md`: only the story,
/// its criteria and the feedback, because a 0.5B model follows the last instructions it read
/// and a long prompt costs seconds of prompt processing per request on a CPU.
pub const BUILTIN_LOCAL_TEMPLATE: &str = include_str!("../templates/prompt_local.md");

/// Errors loading or rendering a template.
#[derive(Debug, thiserror::Error)]
pub enum PromptError {
    /// The user's template file could not be read.
    #[error("cannot read the prompt template {path}: {source}\nhint: fix `template` in ralph.toml (or --template), or remove it to use the built-in prompt")]
    Read {
        /// The template path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The template has a syntax error or uses an undefined variable.
    #[error("prompt template {name}: {message}\nhint: the variables available are listed in README.md (Prompt template)")]
    Render {
        /// The template's name or path.
        name: String,
        /// minijinja's message, with line number.
        message: String,
    },
}

/// Rendered prompt size above which ralph warns (once per run): 256 KiB, about 64,000 tokens, a
/// third of a 200,000-token context window before the agent has read a single file.
pub const PROMPT_WARN_BYTES: usize = 256 * 1024;

/// A warning when a rendered prompt of `bytes` is unreasonably large (above
/// [`PROMPT_WARN_BYTES`]): its size, the limit and the fix. `None` otherwise.
pub fn size_warning(bytes: usize) -> Option<String> {
    (bytes > PROMPT_WARN_BYTES).then(|| {
        format!(
            "the rendered prompt is unreasonably large: {} (ralph warns above {}, about 64,000 \
             tokens); most of it is likely the list of other stories. Split prd.json into one PRD \
             per feature, or use a template (--template) that does not list `other_stories`",
            crate::prd::store::human_bytes(bytes),
            crate::prd::store::human_bytes(PROMPT_WARN_BYTES)
        )
    })
}

/// A story as the template sees it.
#[derive(Debug, Clone, Serialize)]
pub struct StoryView {
    /// Story id (`US-001`).
    pub id: String,
    /// Title.
    pub title: String,
    /// Description (may be empty).
    pub description: String,
    /// Acceptance criteria.
    pub acceptance_criteria: Vec<String>,
    /// Priority (1 = first).
    pub priority: i64,
    /// Whether it passes.
    pub passes: bool,
    /// Notes (may be empty).
    pub notes: String,
    /// The story's own `verify` command, or empty.
    pub verify: String,
    /// The file paths the story names (title, description, acceptance criteria, `verify`), in
    /// order of first mention, relative to the repository root as written: see [`story_files`].
    pub files: Vec<String>,
}

impl From<&Story> for StoryView {
    fn from(s: &Story) -> Self {
        StoryView {
            id: s.id.clone(),
            title: s.title.clone(),
            description: s.description.clone(),
            acceptance_criteria: s.acceptance_criteria.clone(),
            priority: s.priority,
            passes: s.passes,
            notes: s.notes.clone(),
            verify: s.verify.clone().unwrap_or_default(),
            files: story_files(s),
        }
    }
}

/// Most paths [`story_files`] lists for one story.
const MAX_STORY_FILES: usize = 8;

/// The file paths a story names, so a compact prompt can state them plainly: words of its
/// title, description, acceptance criteria and `verify` command that look like a relative path
/// to a file (`hello.py`, `src/app.js`, `docs/notes.md`, `VERSION`, `Makefile`), without quotes,
/// backticks, a leading `./` or sentence punctuation; in order of first mention, each once, at
/// most 8. A word counts when its last part has a known file extension or is a well-known bare
/// file name; absolute paths, `..`, URLs, options and words with shell syntax are left out.
pub fn story_files(story: &Story) -> Vec<String> {
    let texts = std::iter::once(story.title.as_str())
        .chain(std::iter::once(story.description.as_str()))
        .chain(story.acceptance_criteria.iter().map(String::as_str))
        .chain(story.verify.as_deref());
    let mut files: Vec<String> = Vec::new();
    for text in texts {
        for word in text.split(|c: char| c.is_whitespace() || c == '`') {
            if let Some(path) = crate::prd::files::file_word(word) {
                if !files.contains(&path) && files.len() < MAX_STORY_FILES {
                    files.push(path);
                }
            }
        }
    }
    // A bare name that the story also names with an extension ("Add a CHANGELOG" and
    // `CHANGELOG.md`) is that file, not a second one without an extension.
    let named = files.clone();
    files.retain(|f| {
        let bare = !f.rsplit('/').next().unwrap_or(f).contains('.');
        !(bare
            && named.iter().any(|g| {
                g.strip_prefix(f.as_str())
                    .is_some_and(|rest| rest.starts_with('.'))
            }))
    });
    files
}

/// One of the files the current story names ([`StoryView::files`]), as it is in the repository
/// when the prompt is rendered.
#[derive(Debug, Clone, Serialize)]
pub struct FileView {
    /// The path, relative to the repository root.
    pub path: String,
    /// Whether it exists as a file inside the repository (a symlink leaving it does not count).
    pub exists: bool,
}

/// The current story's files as they are under `root` (see [`FileView`]).
fn file_views(root: &Path, files: &[String]) -> Vec<FileView> {
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    files
        .iter()
        .map(|path| FileView {
            path: path.clone(),
            exists: std::fs::canonicalize(root.join(path))
                .is_ok_and(|p| p.starts_with(&root) && p.is_file()),
        })
        .collect()
}

/// The built-in template of a `--resolve-conflicts` iteration: the agent resolves an earlier
/// landing's conflict; the conflict's files and both sides' summaries come as its `feedback`.
pub const BUILTIN_RESOLVE_TEMPLATE: &str = include_str!("../templates/resolve.md");

/// Everything a template can use. Field names are the template variable names.
#[derive(Debug, Clone, Serialize)]
pub struct PromptContext {
    /// Iteration number (continues across runs).
    pub iteration: u32,
    /// Last iteration number this run may reach.
    pub max_iter: u32,
    /// Absolute repository root.
    pub repo_root: String,
    /// `project` from prd.json.
    pub project: String,
    /// `description` from prd.json.
    pub description: String,
    /// `branchName` from prd.json, or empty.
    pub branch_name: String,
    /// Absolute path of prd.json.
    pub prd_path: String,
    /// Absolute path of progress.txt.
    pub progress_path: String,
    /// The current story.
    pub story: StoryView,
    /// Every other story, in file order.
    pub other_stories: Vec<StoryView>,
    /// The files the current story names (`story.files`) and whether each exists now (the
    /// compact local prompt says which are still to be created).
    pub files: Vec<FileView>,
    /// Bounded excerpt of progress.txt (Codebase Patterns + tail).
    pub progress_excerpt: String,
    /// Feedback lines from the previous iteration (may be empty), with the repository's
    /// absolute path and measured durations taken out ([`crate::prd::files::steady_text`]).
    pub feedback: Vec<String>,
    /// The completion promise, `<promise>COMPLETE</promise>`.
    pub promise: String,
    /// The user's notes for this iteration (`ralph hint`), oldest first (may be empty); shown
    /// in a "From the user" block apart from ralph's feedback.
    pub hints: Vec<String>,
    /// `--parallel`: the agent works in a git worktree of its own (detached HEAD, started from
    /// the run branch) while other stories run in others; `false` in a serial run.
    pub worktree: bool,
}

impl PromptContext {
    /// Builds the context for `story` of `prd`, iteration `iteration` of a run that may reach
    /// `max_iter`, with the workspace's paths, a progress.txt excerpt and feedback lines.
    pub fn new(
        prd: &Prd,
        story: &Story,
        (iteration, max_iter): (u32, u32),
        paths: &RunPaths,
        progress_excerpt: String,
        feedback: Vec<String>,
    ) -> Self {
        PromptContext {
            iteration,
            max_iter,
            repo_root: paths.repo_root.display().to_string(),
            project: prd.project.clone(),
            description: prd.description.clone(),
            branch_name: prd.branch_name.clone().unwrap_or_default(),
            prd_path: paths.prd.display().to_string(),
            progress_path: paths.progress.display().to_string(),
            files: file_views(&paths.repo_root, &story_files(story)),
            story: StoryView::from(story),
            other_stories: prd
                .user_stories
                .iter()
                .filter(|s| s.id != story.id)
                .map(StoryView::from)
                .collect(),
            progress_excerpt,
            // A check's output in the feedback names files by the repository's absolute path
            // (a traceback) and says how long its tests took; without them the same attempt
            // reads the same wherever the repository lies and however busy the machine is.
            feedback: feedback
                .iter()
                .map(|f| crate::prd::files::steady_text(f, &paths.repo_root))
                .collect(),
            promise: PROMISE.to_string(),
            hints: Vec::new(),
            worktree: false,
        }
    }

    /// The same context carrying the user's `hints` (texts, oldest first).
    pub fn with_hints(mut self, hints: Vec<String>) -> Self {
        self.hints = hints;
        self
    }

    /// The same context for an agent working in a worktree of its own (`--parallel`).
    pub fn in_worktree(mut self, worktree: bool) -> Self {
        self.worktree = worktree;
        self
    }
}

/// How many stories besides the first the template check renders (see [`PromptTemplate::check`]).
pub const CHECK_OTHERS: usize = 3;

/// A loaded template, ready to render.
#[derive(Debug, Clone)]
pub struct PromptTemplate {
    name: String,
    source: String,
}

impl PromptTemplate {
    /// Loads `path`, or the built-in template when `None`, and checks that it parses.
    ///
    /// # Errors
    /// [`PromptError::Read`] when the file cannot be read, [`PromptError::Render`] on a syntax error.
    pub fn load(path: Option<&Path>) -> Result<PromptTemplate, PromptError> {
        Self::load_with_default(path, false)
    }

    /// Like [`PromptTemplate::load`], with the compact built-in template for small local models
    /// when `compact` is set and no path is given.
    ///
    /// # Errors
    /// As [`PromptTemplate::load`].
    pub fn load_with_default(
        path: Option<&Path>,
        compact: bool,
    ) -> Result<PromptTemplate, PromptError> {
        if path.is_none() && compact {
            let template = PromptTemplate {
                name: "templates/prompt_local.md".to_string(),
                source: BUILTIN_LOCAL_TEMPLATE.to_string(),
            };
            template.environment()?;
            return Ok(template);
        }
        let (name, source) = match path {
            Some(p) => (
                p.display().to_string(),
                std::fs::read_to_string(p).map_err(|source| PromptError::Read {
                    path: p.to_path_buf(),
                    source,
                })?,
            ),
            None => (
                "templates/prompt.md".to_string(),
                BUILTIN_TEMPLATE.to_string(),
            ),
        };
        let template = PromptTemplate { name, source };
        template.environment()?;
        Ok(template)
    }

    /// The built-in template of a conflict's resolution ([`BUILTIN_RESOLVE_TEMPLATE`]).
    ///
    /// # Errors
    /// [`PromptError::Render`] if the built-in template does not parse (a build defect).
    pub fn resolve() -> Result<PromptTemplate, PromptError> {
        let template = PromptTemplate {
            name: "templates/resolve.md".to_string(),
            source: BUILTIN_RESOLVE_TEMPLATE.to_string(),
        };
        template.environment()?;
        Ok(template)
    }

    fn environment(&self) -> Result<Environment<'_>, PromptError> {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(true);
        env.add_template(&self.name, &self.source)
            .map_err(|e| self.error(&e))?;
        Ok(env)
    }

    fn error(&self, e: &minijinja::Error) -> PromptError {
        let mut message = e.to_string();
        if let Some(line) = e.line() {
            message = format!("line {line}: {message}");
        }
        // minijinja's "undefined value" does not name the variable; the source line does.
        let source_line = e
            .line()
            .and_then(|line| self.source.lines().nth(line.saturating_sub(1)));
        if let Some(text) = source_line {
            message = format!("{message}\n  in: {}", text.trim());
        }
        PromptError::Render {
            name: self.name.clone(),
            message,
        }
    }

    /// Renders the template once with a complete sample context for `prd` (its first story, up
    /// to [`CHECK_OTHERS`] others, a feedback line and a progress excerpt), so that an undefined
    /// variable in any branch of the template is reported before an agent starts. The sample
    /// stops at a few stories: a template's loop over `other_stories` fails on the first as on
    /// the last, and the prompt of a 100,000-story prd.json is rendered once, by the iteration.
    ///
    /// # Errors
    /// [`PromptError::Render`] naming the template, line and variable.
    pub fn check(&self, prd: &Prd, paths: &RunPaths) -> Result<(), PromptError> {
        let Some(story) = prd.user_stories.first() else {
            return Ok(());
        };
        let sample = Prd {
            schema: prd.schema.clone(),
            project: prd.project.clone(),
            branch_name: prd.branch_name.clone(),
            base_branch: prd.base_branch.clone(),
            description: prd.description.clone(),
            user_stories: prd.user_stories[..prd.user_stories.len().min(1 + CHECK_OTHERS)].to_vec(),
            extra: prd.extra.clone(),
            index: Default::default(),
        };
        let ctx = PromptContext::new(
            &sample,
            story,
            (1, 1),
            paths,
            "## Codebase Patterns\n- (sample)\n".to_string(),
            vec!["(sample feedback from a previous iteration)".to_string()],
        )
        .with_hints(vec!["(sample hint from the user)".to_string()]);
        self.render(&ctx).map(|_| ())
    }

    /// Renders the template with `ctx`.
    ///
    /// # Errors
    /// [`PromptError::Render`] when the template uses a variable that `ctx` lacks.
    pub fn render(&self, ctx: &PromptContext) -> Result<String, PromptError> {
        let env = self.environment()?;
        let template = env.get_template(&self.name).map_err(|e| self.error(&e))?;
        template.render(ctx).map_err(|e| self.error(&e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prd() -> Prd {
        serde_json::from_value(serde_json::json!({
            "project": "Demo",
            "branchName": "ralph/demo",
            "description": "A demo",
            "userStories": [
                {"id": "US-001", "title": "First", "description": "Do one", "acceptanceCriteria": ["a", "b"], "priority": 1, "passes": true, "notes": ""},
                {"id": "US-002", "title": "Second \"quoted\" $(rm -rf ~)", "description": "", "acceptanceCriteria": ["c"], "priority": 2, "passes": false, "notes": "careful"}
            ]
        }))
        .unwrap()
    }

    fn ctx(feedback: Vec<String>) -> PromptContext {
        let prd = prd();
        let story = prd.user_stories[1].clone();
        PromptContext::new(
            &prd,
            &story,
            (3, 10),
            &RunPaths::new(Path::new("/repo"), Path::new("/repo/prd.json")),
            "## Codebase Patterns\n- use x\n".into(),
            feedback,
        )
    }

    #[test]
    fn builtin_prompt_has_story_paths_rules_and_feedback() {
        let t = PromptTemplate::load(None).unwrap();
        let out = t
            .render(&ctx(vec![
                "your completion claim was premature: US-002 still has passes=false".into(),
            ]))
            .unwrap();
        for needle in [
            "Story ID: US-002",
            "Title: Second \"quoted\" $(rm -rf ~)",
            "- c",
            "Notes: careful",
            "US-001 [passes] (priority 1) First",
            "PRD file: `/repo/prd.json`",
            "Progress log: `/repo/progress.txt`",
            "## Codebase Patterns\n- use x",
            "premature: US-002 still has passes=false",
            "<promise>COMPLETE</promise>",
            "Implement the current story (US-002) only",
        ] {
            assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
        }
        // The prompt must never end on the promise: an agent that echoes it must not complete.
        assert!(!out.trim_end().ends_with(PROMISE));
    }

    fn story(title: &str, description: &str, criteria: &[&str], verify: Option<&str>) -> Story {
        serde_json::from_value(serde_json::json!({
            "id": "US-001", "title": title, "description": description,
            "acceptanceCriteria": criteria, "priority": 1, "passes": false, "notes": "",
            "verify": verify,
        }))
        .unwrap()
    }

    #[test]
    fn story_files_are_the_paths_the_story_names() {
        let s = story(
            "Create hello.py",
            "Create `hello.py` in the repository root that prints Hello. See docs/usage.md.",
            &[
                "running ./hello.py prints Hello",
                "mathutil.add(2, 3) returns 5; VERSION holds 0.1.0",
                "(src/app.js) is unchanged, as is \"config.toml\"",
            ],
            Some("python3 hello.py | grep -q Hello && test -f VERSION && grep -q 'def add' mathutil.py"),
        );
        assert_eq!(
            story_files(&s),
            [
                "hello.py",
                "docs/usage.md",
                "VERSION",
                "src/app.js",
                "config.toml",
                "mathutil.py"
            ]
        );
        for not_a_file in [
            "mathutil.add",
            "0.1.0",
            "e.g.",
            "/etc/passwd.txt",
            "../up.py",
            "https://x.io/a.py",
            "--out=a.txt",
            "$HOME/a.py",
            "a*.py",
            "src/",
            ".py",
        ] {
            assert_eq!(
                crate::prd::files::file_word(not_a_file),
                None,
                "{not_a_file}"
            );
        }
        let s = story(
            "Add a CHANGELOG",
            "Create CHANGELOG.md in the repository root; README stays as it is.",
            &[],
            Some("test -f CHANGELOG.md"),
        );
        assert_eq!(story_files(&s), ["CHANGELOG.md", "README"]);
        let many: Vec<String> = (0..20).map(|i| format!("f{i}.txt")).collect();
        let s = story("t", &many.join(" "), &[], None);
        assert_eq!(story_files(&s).len(), MAX_STORY_FILES);
    }

    #[test]
    fn the_local_prompt_states_the_root_the_files_and_the_check() {
        let mut prd = prd();
        prd.user_stories[1] = story(
            "Create hello.py",
            "Create hello.py that prints Hello, and keep src/util.py.",
            &["python3 hello.py prints Hello"],
            Some("python3 hello.py | grep -q Hello"),
        );
        let story = prd.user_stories[1].clone();
        let ctx = PromptContext::new(
            &prd,
            &story,
            (1, 10),
            &RunPaths::new(Path::new("/repo"), Path::new("/repo/prd.json")),
            String::new(),
            vec!["verify failed for US-001: File \"/repo/hello.py\", line 1".into()],
        );
        let out = PromptTemplate::load_with_default(None, true)
            .unwrap()
            .render(&ctx)
            .unwrap();
        for needle in [
            "Story US-001: Create hello.py",
            "- python3 hello.py prints Hello",
            "The repository root is the current directory: every path is relative to it.",
            "hello.py (in the repository root, not in a folder), src/util.py.",
            "`python3 hello.py | grep -q Hello`",
            "hello.py does not exist yet.",
            // The repository's absolute path is taken out of the feedback.
            "Note from the previous attempt: verify failed for US-001: File \"hello.py\", line 1",
        ] {
            assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
        }
        // Without files or a check, neither line appears.
        let out = PromptTemplate::load_with_default(None, true)
            .unwrap()
            .render(&ctx_for_second_story())
            .unwrap();
        assert!(!out.contains("Files for this story"), "{out}");
        assert!(!out.contains("ralph checks this story"), "{out}");
    }

    #[test]
    fn the_story_files_say_whether_they_exist() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("config.py"), "MAX = 3\n").unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("link.txt"))
            .unwrap();
        let files: Vec<String> = ["config.py", "src", "new.py", "link.txt"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let shown: Vec<(String, bool)> = file_views(root, &files)
            .into_iter()
            .map(|v| (v.path, v.exists))
            .collect();
        let expected = [
            ("config.py", true),
            ("src", false),
            ("new.py", false),
            ("link.txt", false),
        ];
        let expected: Vec<(String, bool)> =
            expected.iter().map(|(p, e)| (p.to_string(), *e)).collect();
        assert_eq!(shown, expected);

        let mut prd = prd();
        prd.user_stories[1] = story("Add new.py", "Create new.py next to config.py.", &[], None);
        let story = prd.user_stories[1].clone();
        let ctx = PromptContext::new(
            &prd,
            &story,
            (1, 10),
            &RunPaths::new(root, &root.join("prd.json")),
            String::new(),
            vec![],
        );
        let out = PromptTemplate::load_with_default(None, true)
            .unwrap()
            .render(&ctx)
            .unwrap();
        assert!(out.contains("new.py does not exist yet.\n"), "{out}");
        assert!(!out.contains("config.py does not exist"), "{out}");
    }

    fn ctx_for_second_story() -> PromptContext {
        ctx(vec![])
    }

    #[test]
    fn no_feedback_section_without_feedback() {
        let out = PromptTemplate::load(None)
            .unwrap()
            .render(&ctx(vec![]))
            .unwrap();
        assert!(!out.contains("Feedback from the previous iteration"));
    }

    #[test]
    fn undefined_variable_is_an_error_naming_the_template() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.md");
        std::fs::write(&path, "Story {{ story.id }} {{ no_such_thing }}\n").unwrap();
        let t = PromptTemplate::load(Some(&path)).unwrap();
        let err = t.render(&ctx(vec![])).unwrap_err().to_string();
        assert!(err.contains("p.md") && err.contains("undefined"), "{err}");
    }

    #[test]
    fn missing_template_file_is_a_clear_error() {
        let err = PromptTemplate::load(Some(Path::new("/nonexistent/prompt.md")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/prompt.md"), "{err}");
    }

    #[test]
    fn a_prompt_above_the_limit_gets_a_warning_naming_it() {
        assert_eq!(size_warning(PROMPT_WARN_BYTES), None);
        let warning = size_warning(3 * 1024 * 1024).expect("above the limit");
        assert!(warning.contains("3.0 MiB"), "{warning}");
        assert!(warning.contains("warns above 256.0 KiB"), "{warning}");
    }
}
