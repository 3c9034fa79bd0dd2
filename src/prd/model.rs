//! The prd.json data model: the single source of truth for the file's shape.
//!
//! The format is the original Ralph's (snarktank/ralph `prd.json.example`): `project`,
//! `branchName`, `description` and `userStories[]` with `id`, `title`, `description`,
//! `acceptanceCriteria`, `priority`, `passes` and `notes`. ralph adds three optional fields:
//! `$schema` (for editors), `baseBranch` (where a new `branchName` is created from) and per-story
//! `dependsOn` (ids of stories that must pass first).
//!
//! `prd.schema.json` is generated from these types (see [`crate::prd::schema`]), so the doc
//! comments on the fields below double as the schema's descriptions. Unknown fields are kept in
//! `extra` (in file order) so that tools which add their own fields do not lose them; ralph itself
//! never re-serializes prd.json (see [`crate::prd::store::set_passes`]).

use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A product requirements document: the whole content of a `prd.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(title = "prd.json")]
pub struct Prd {
    /// Path or URL of the JSON Schema this file follows (used by editors; ralph ignores it).
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Project name.
    pub project: String,
    /// Git branch the work happens on, e.g. "ralph/my-feature". ralph checks it out (creating it
    /// if needed) before the first iteration; when it changes, the previous run is archived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_name: Option<String>,
    /// Branch (or any commit-ish) that a missing `branchName` branch is created from; default:
    /// the current HEAD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_branch: Option<String>,
    /// What the feature is about.
    #[serde(default)]
    pub description: String,
    /// The stories, in document order (at least one). Each must be small enough for one agent
    /// iteration.
    #[schemars(length(min = 1))]
    pub user_stories: Vec<Story>,
    /// Fields ralph does not know, kept as they were (in file order).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
    /// Where each id is in `user_stories`, so that [`Prd::story`] is a hash lookup and not a
    /// scan (with 100,000 stories, a scan per story made `status` and an iteration quadratic).
    /// Not part of the file.
    #[serde(skip)]
    #[schemars(skip)]
    pub(crate) index: StoryIndex,
}

/// The id → position map of a [`Prd`]'s stories, built on the first lookup. A clone starts
/// empty (and is rebuilt when used), and two indexes always compare equal: it is derived data.
/// A lookup checks the position it finds and falls back to a scan, so an index that is stale
/// because `user_stories` was edited after it was built still gives the right story.
#[derive(Default)]
pub struct StoryIndex(OnceLock<HashMap<String, usize>>);

impl StoryIndex {
    /// The position of the first story with `id` according to the index (built from `stories`
    /// when it is not yet).
    fn position(&self, stories: &[Story], id: &str) -> Option<usize> {
        let map = self.0.get_or_init(|| {
            let mut map = HashMap::with_capacity(stories.len());
            for (i, story) in stories.iter().enumerate() {
                map.entry(story.id.clone()).or_insert(i);
            }
            map
        });
        map.get(id).copied()
    }
}

impl Clone for StoryIndex {
    fn clone(&self) -> StoryIndex {
        StoryIndex::default()
    }
}

impl PartialEq for StoryIndex {
    fn eq(&self, _: &StoryIndex) -> bool {
        true
    }
}

impl std::fmt::Debug for StoryIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoryIndex")
    }
}

/// One user story: a unit of work that a single agent iteration should finish.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Story {
    /// Unique, non-blank identifier, e.g. "US-001".
    #[schemars(regex(pattern = r"\S"))]
    pub id: String,
    /// Short name, used in commit messages.
    pub title: String,
    /// "As a [user], I want [feature] so that [benefit]".
    #[serde(default)]
    pub description: String,
    /// Verifiable checks that must hold before `passes` may be set to true.
    pub acceptance_criteria: Vec<String>,
    /// Order of work: the open story with the lowest number runs first (1 = first); ties go to
    /// the story that comes first in the file.
    pub priority: i64,
    /// Whether the story is done. `false` at creation; the agent sets it to `true`.
    pub passes: bool,
    /// Free-form notes, "" at creation.
    #[serde(default)]
    pub notes: String,
    /// Ids of stories that must pass before this one is picked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// A shell command (run with `bash -c` in the repository root) that must exit 0 for this
    /// story to count as passing; it replaces the run's `--verify` command for this story.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<String>,
    /// Fields ralph does not know, kept as they were (in file order).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Prd {
    /// The first story whose `id` is `id`, if any. A hash lookup (see [`StoryIndex`]); an id
    /// that names no story costs one scan.
    pub fn story(&self, id: &str) -> Option<&Story> {
        self.position(id).map(|i| &self.user_stories[i])
    }

    /// Where the first story whose `id` is `id` is in `user_stories` (0-based), if any. A hash
    /// lookup (see [`StoryIndex`]); an id that names no story costs one scan.
    pub fn position(&self, id: &str) -> Option<usize> {
        let found = self
            .index
            .position(&self.user_stories, id)
            .filter(|&i| self.user_stories.get(i).is_some_and(|story| story.id == id));
        found.or_else(|| self.user_stories.iter().position(|story| story.id == id))
    }

    /// Whether the dependency `id` is met: the first story with that id has `passes: true`. An id
    /// that names no story is never met (validation refuses such files). The one rule both
    /// [`Prd::next_story`] and the parallel scheduler (`run::policy::ready`) use.
    pub fn dependency_passes(&self, id: &str) -> bool {
        self.story(id).is_some_and(|story| story.passes)
    }

    /// True when every story has `passes: true` (vacuously true for an empty list): the only
    /// condition under which a run is complete.
    pub fn all_pass(&self) -> bool {
        self.user_stories.iter().all(|story| story.passes)
    }

    /// Stories with `passes: false`, in document order.
    pub fn open_stories(&self) -> Vec<&Story> {
        self.user_stories
            .iter()
            .filter(|story| !story.passes)
            .collect()
    }

    /// Number of stories with `passes: true`.
    pub fn passing_count(&self) -> usize {
        self.user_stories
            .iter()
            .filter(|story| story.passes)
            .count()
    }

    /// The story the next iteration should work on: among stories with `passes: false` whose id
    /// is not in `blocked` and whose every `dependsOn` id names a passing story, the one with the
    /// lowest `priority` number; ties go to the earlier story in the file. `None` when no story
    /// qualifies (all pass, or every open story is blocked or waiting on a dependency). A
    /// `dependsOn` id that names no story counts as unmet (validation rejects such files).
    ///
    /// Linear in the number of stories, their dependencies and `blocked`.
    pub fn next_story(&self, blocked: &[String]) -> Option<&Story> {
        let blocked: HashSet<&str> = blocked.iter().map(String::as_str).collect();
        self.user_stories
            .iter()
            .filter(|story| !story.passes)
            .filter(|story| !blocked.contains(story.id.as_str()))
            .filter(|story| {
                story
                    .depends_on
                    .iter()
                    .all(|dep| self.dependency_passes(dep))
            })
            // `min_by_key` returns the first of equal minima, which gives document order on ties.
            .min_by_key(|story| story.priority)
    }

    /// For each story, in `user_stories` order, the blocked story it waits for: the first story
    /// in `blocked` met walking its `dependsOn` (in order, depth first) through dependencies
    /// that do not pass. `None` for a story with no such dependency (the story's own blocked
    /// state does not count). A dependency that passes is met even when it is listed in
    /// `blocked`; an id that names no story leads nowhere; a cycle (which validation refuses)
    /// ends the walk. Linear in the stories and dependencies, without recursion.
    pub fn blocked_roots(&self, blocked: &[String]) -> Vec<Option<&Story>> {
        if blocked.is_empty() {
            return vec![None; self.user_stories.len()];
        }
        let blocked: HashSet<&str> = blocked.iter().map(String::as_str).collect();
        blocked_positions(self, &blocked)
            .into_iter()
            .map(|root| root.map(|i| &self.user_stories[i]))
            .collect()
    }
}

/// What the walk knows of a story.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Walk {
    /// Not reached yet.
    New,
    /// On the walk's path (reaching it again means a cycle, which validation refuses; the cycle
    /// counts as waiting, not blocked).
    OnPath,
    /// Walked: the position of the blocked story it waits for, if any.
    Done(Option<usize>),
}

/// For each story (by position), the position of the blocked story it waits for through its
/// open dependencies, if any. A depth-first walk with an explicit stack; a dependency that
/// passes is met and not followed, one that names no story is not followed.
fn blocked_positions(prd: &Prd, blocked: &HashSet<&str>) -> Vec<Option<usize>> {
    let stories = &prd.user_stories;
    let mut walk = vec![Walk::New; stories.len()];
    // The path: each story with the index of its next dependency to look at.
    let mut path: Vec<(usize, usize)> = Vec::new();
    for start in 0..stories.len() {
        if walk[start] != Walk::New {
            continue;
        }
        walk[start] = Walk::OnPath;
        path.push((start, 0));
        while let Some(top) = path.last_mut() {
            let (node, k) = *top;
            let Some(dep) = stories[node].depends_on.get(k) else {
                walk[node] = Walk::Done(None);
                path.pop();
                continue;
            };
            top.1 += 1;
            let Some(j) = prd.position(dep).filter(|&j| !stories[j].passes) else {
                continue;
            };
            let found = if blocked.contains(dep.as_str()) {
                Some(j)
            } else {
                match walk[j] {
                    Walk::Done(root) => root,
                    Walk::OnPath => None,
                    Walk::New => {
                        walk[j] = Walk::OnPath;
                        path.push((j, 0));
                        None
                    }
                }
            };
            if found.is_some() {
                // Every story on the path reached this one through its current dependency.
                for (on_path, _) in path.drain(..) {
                    walk[on_path] = Walk::Done(found);
                }
            }
        }
    }
    walk.into_iter()
        .map(|w| match w {
            Walk::Done(root) => root,
            Walk::New | Walk::OnPath => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn story(id: &str, priority: i64, passes: bool, depends_on: &[&str]) -> Value {
        let mut s = json!({
            "id": id,
            "title": format!("title of {id}"),
            "acceptanceCriteria": ["Typecheck passes"],
            "priority": priority,
            "passes": passes,
        });
        if !depends_on.is_empty() {
            s["dependsOn"] = json!(depends_on);
        }
        s
    }

    fn prd(stories: Vec<Value>) -> Prd {
        serde_json::from_value(json!({"project": "demo", "userStories": stories})).unwrap()
    }

    #[test]
    fn next_story_picks_lowest_priority_number_then_document_order() {
        let p = prd(vec![
            story("US-003", 2, false, &[]),
            story("US-001", 1, true, &[]),
            story("US-002", 2, false, &[]),
        ]);
        assert_eq!(p.next_story(&[]).unwrap().id, "US-003");
        let p = prd(vec![
            story("US-003", 3, false, &[]),
            story("US-002", 2, false, &[]),
        ]);
        assert_eq!(p.next_story(&[]).unwrap().id, "US-002");
    }

    #[test]
    fn next_story_skips_blocked_and_unmet_dependencies() {
        let p = prd(vec![
            story("US-001", 1, false, &[]),
            story("US-002", 2, false, &["US-001"]),
            story("US-003", 3, false, &[]),
        ]);
        assert_eq!(p.next_story(&[]).unwrap().id, "US-001");
        // US-001 blocked: US-002 waits on it, so US-003 is next.
        assert_eq!(p.next_story(&["US-001".into()]).unwrap().id, "US-003");
        assert!(p.next_story(&["US-001".into(), "US-003".into()]).is_none());

        let p = prd(vec![
            story("US-001", 1, true, &[]),
            story("US-002", 2, false, &["US-001"]),
        ]);
        assert_eq!(p.next_story(&[]).unwrap().id, "US-002");

        let p = prd(vec![story("US-002", 1, false, &["US-404"])]);
        assert!(p.next_story(&[]).is_none(), "unknown dependency is unmet");
    }

    #[test]
    fn blocked_roots_name_the_blocked_story_each_one_waits_for() {
        let p = prd(vec![
            story("US-001", 1, false, &[]),
            story("US-002", 2, false, &["US-001"]),
            story("US-003", 3, false, &["US-002"]),
            story("US-004", 4, true, &[]),
            story("US-005", 5, false, &["US-004"]),
        ]);
        let roots = |blocked: &[&str]| -> Vec<Option<String>> {
            let blocked: Vec<String> = blocked.iter().map(|s| s.to_string()).collect();
            p.blocked_roots(&blocked)
                .into_iter()
                .map(|r| r.map(|s| s.id.clone()))
                .collect()
        };
        let some = |id: &str| Some(id.to_string());
        assert_eq!(roots(&[]), [None, None, None, None, None]);
        // US-002 is blocked itself and also waits for US-001: both are said.
        assert_eq!(
            roots(&["US-001", "US-002"]),
            [None, some("US-001"), some("US-002"), None, None]
        );
        assert_eq!(
            roots(&["US-001"]),
            [None, some("US-001"), some("US-001"), None, None]
        );
        // A passing story in the list holds nothing back.
        assert_eq!(roots(&["US-004"]), [None, None, None, None, None]);
    }

    #[test]
    fn all_pass_open_and_passing_counts() {
        let p = prd(vec![
            story("US-001", 1, true, &[]),
            story("US-002", 2, false, &[]),
        ]);
        assert!(!p.all_pass());
        assert_eq!(p.passing_count(), 1);
        let open: Vec<&str> = p.open_stories().iter().map(|s| s.id.as_str()).collect();
        assert_eq!(open, ["US-002"]);
        assert_eq!(p.story("US-001").unwrap().priority, 1);
        assert!(p.story("US-999").is_none());

        let done = prd(vec![story("US-001", 1, true, &[])]);
        assert!(done.all_pass());
        assert!(done.next_story(&[]).is_none());
    }

    #[test]
    fn defaults_and_unknown_fields_are_kept() {
        let p: Prd = serde_json::from_value(json!({
            "$schema": "./prd.schema.json",
            "project": "demo",
            "owner": "team-a",
            "userStories": [{
                "id": "US-001", "title": "t", "acceptanceCriteria": [],
                "priority": 1, "passes": false, "estimate": 3
            }],
            "zzz": [1, 2]
        }))
        .unwrap();
        assert_eq!(p.schema.as_deref(), Some("./prd.schema.json"));
        assert_eq!(p.description, "");
        assert_eq!(p.branch_name, None);
        let keys: Vec<&str> = p.extra.keys().map(String::as_str).collect();
        assert_eq!(keys, ["owner", "zzz"]);
        let s = &p.user_stories[0];
        assert_eq!(s.notes, "");
        assert!(s.depends_on.is_empty());
        assert_eq!(s.extra["estimate"], json!(3));

        // camelCase on the wire, unknown fields written back, empty dependsOn omitted.
        let back = serde_json::to_value(&p).unwrap();
        assert_eq!(back["owner"], json!("team-a"));
        assert_eq!(back["userStories"][0]["acceptanceCriteria"], json!([]));
        assert_eq!(back["userStories"][0]["estimate"], json!(3));
        assert!(back["userStories"][0].get("dependsOn").is_none());
    }

    #[test]
    fn story_lookups_stay_right_after_the_stories_are_edited() {
        let mut p = prd(vec![
            story("US-001", 1, false, &[]),
            story("US-002", 2, false, &[]),
            story("US-001", 3, true, &[]),
        ]);
        // The first of duplicate ids, as before the index.
        assert_eq!(p.story("US-001").unwrap().priority, 1);
        // Edited after the index was built: replaced, removed, added.
        p.user_stories[1].id = "US-020".into();
        p.user_stories.remove(0);
        let added: Story = serde_json::from_value(story("US-030", 4, false, &[])).unwrap();
        p.user_stories.push(added);
        assert_eq!(p.story("US-001").unwrap().priority, 3);
        assert_eq!(p.story("US-020").unwrap().priority, 2);
        assert_eq!(p.story("US-030").unwrap().priority, 4);
        assert!(p.story("US-002").is_none());
        // A clone and its original compare equal whatever their indexes hold.
        assert_eq!(p.clone(), p);
    }

    #[test]
    fn next_story_is_linear_in_a_long_dependency_chain() {
        // 100,000 stories, each waiting on the one before: a scan per dependency made this
        // about 5 billion comparisons; an index makes it a few hundred thousand lookups.
        let n = 100_000;
        let stories: Vec<Story> = (0..n)
            .map(|i| Story {
                id: format!("US-{i:06}"),
                title: String::new(),
                description: String::new(),
                acceptance_criteria: Vec::new(),
                priority: i,
                passes: i < n / 2,
                notes: String::new(),
                depends_on: if i == 0 {
                    Vec::new()
                } else {
                    vec![format!("US-{:06}", i - 1)]
                },
                verify: None,
                extra: Map::new(),
            })
            .collect();
        let mut p = prd(vec![story("X", 1, false, &[])]);
        p.user_stories = stories;
        let started = std::time::Instant::now();
        for _ in 0..5 {
            assert_eq!(p.next_story(&[]).unwrap().id, "US-050000");
        }
        let took = started.elapsed();
        assert!(
            took < std::time::Duration::from_secs(10),
            "5 picks among 100,000 stories took {took:?}"
        );
    }
}
