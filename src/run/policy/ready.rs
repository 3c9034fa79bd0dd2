//! Which stories may start now: the scheduling rule of `ralph run --parallel N`, and the
//! "waits for a blocked story" rule every run shares. Pure: a function of prd.json (where
//! `passes: true` means the story landed: the dispatcher writes `passes` only at landing) and of
//! the run's lists of blocked, in-flight and held stories; it reads no file, clock or signal.
//!
//! A story is **ready** when it is open (`passes: false`), not blocked, not in flight, not held
//! (e.g. waiting for a retry's backoff) and every id in its `dependsOn` names a passing story
//! ([`Prd::dependency_passes`], the same rule [`Prd::next_story`] applies: the serial pick is
//! the first ready story). A story whose dependency, directly or through other open stories, is
//! blocked never starts: it waits for the blocked story ([`waits_for`] says so in words).
//!
//! Linear in the number of stories and dependencies; a dependency chain of 100,000 stories is
//! walked without recursion ([`Prd::blocked_roots`], which `ralph status` and the report can use
//! for the same words without depending on the run).

use std::collections::HashSet;

use crate::prd::model::Prd;

/// The open stories of a prd.json sorted by what they wait for. A story that is blocked, in
/// flight or held is in none of the lists (the caller accounts for those); a passing story
/// neither.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Stories that may start now, in the order to start them: the lowest `priority` number
    /// first, ties in prd.json order (the serial pick's order; with priorities that rise through
    /// the file, as ralph's tools write them, this is prd.json order).
    pub ready: Vec<String>,
    /// Open stories waiting for dependencies that do not pass yet (none of them blocked), in
    /// prd.json order, each with those dependencies in its `dependsOn` order. An id that names no
    /// story is listed here too (it never passes; validation refuses such a file).
    pub waiting: Vec<(String, Vec<String>)>,
    /// Open stories that wait, directly or transitively, for a blocked story, in prd.json order,
    /// each with that blocked story: the first blocked one met walking its `dependsOn` in order,
    /// depth first. They are never attempted until it passes (or is unblocked).
    pub blocked_by: Vec<(String, String)>,
}

/// The [`Readiness`] of `prd`'s stories given the `blocked` stories (after `--max-attempts`, or
/// `setup_failed` in a worktree), those `in_flight` (a worker runs them) and those `held` (not to
/// start now, e.g. waiting for a retry). Ids in these lists that name no story are ignored.
pub fn ready_set(
    prd: &Prd,
    blocked: &[String],
    in_flight: &[String],
    held: &[String],
) -> Readiness {
    let roots = prd.blocked_roots(blocked);
    let blocked: HashSet<&str> = blocked.iter().map(String::as_str).collect();
    let busy: HashSet<&str> = in_flight.iter().chain(held).map(String::as_str).collect();
    let mut out = Readiness::default();
    let mut ready = Vec::new();
    for (story, root) in prd.user_stories.iter().zip(roots) {
        let id = story.id.as_str();
        if story.passes || blocked.contains(id) || busy.contains(id) {
            continue;
        }
        if let Some(root) = root {
            out.blocked_by.push((story.id.clone(), root.id.clone()));
            continue;
        }
        let unmet: Vec<String> = story
            .depends_on
            .iter()
            .filter(|dep| !prd.dependency_passes(dep))
            .cloned()
            .collect();
        if unmet.is_empty() {
            ready.push(story);
        } else {
            out.waiting.push((story.id.clone(), unmet));
        }
    }
    // Stable: equal priorities keep prd.json order.
    ready.sort_by_key(|story| story.priority);
    out.ready = ready.into_iter().map(|story| story.id.clone()).collect();
    out
}

/// The open stories that wait, directly or transitively, for a blocked story, each with that
/// story ([`Readiness::blocked_by`]): what a run marks "waits for US-00x (blocked)" and never
/// attempts. Empty when nothing is blocked.
pub fn blocked_by_dependency(prd: &Prd, blocked: &[String]) -> Vec<(String, String)> {
    if blocked.is_empty() {
        return Vec::new();
    }
    ready_set(prd, blocked, &[], &[]).blocked_by
}

/// The reason shown for a story that waits for the blocked story `root`:
/// `waits for US-002 (blocked)`.
pub fn waits_for(root: &str) -> String {
    format!("waits for {root} (blocked)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prd.json from `(id, priority, passes, dependsOn)` rows.
    fn prd(rows: &[(&str, i64, bool, &[&str])]) -> Prd {
        let stories: Vec<serde_json::Value> = rows
            .iter()
            .map(|(id, priority, passes, deps)| {
                serde_json::json!({"id": id, "title": id, "acceptanceCriteria": ["x"],
                    "priority": priority, "passes": passes, "dependsOn": deps})
            })
            .collect();
        serde_json::from_value(serde_json::json!({"project": "p", "userStories": stories})).unwrap()
    }

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// One row: the stories, the blocked, in-flight and held lists, and the expected ready,
    /// waiting and blocked_by lists.
    struct Row {
        name: &'static str,
        stories: &'static [(&'static str, i64, bool, &'static [&'static str])],
        blocked: &'static [&'static str],
        in_flight: &'static [&'static str],
        held: &'static [&'static str],
        ready: &'static [&'static str],
        waiting: &'static [(&'static str, &'static [&'static str])],
        blocked_by: &'static [(&'static str, &'static str)],
    }

    const fn row(
        name: &'static str,
        stories: &'static [(&'static str, i64, bool, &'static [&'static str])],
        lists: [&'static [&'static str]; 3],
        ready: &'static [&'static str],
        waiting: &'static [(&'static str, &'static [&'static str])],
        blocked_by: &'static [(&'static str, &'static str)],
    ) -> Row {
        Row {
            name,
            stories,
            blocked: lists[0],
            in_flight: lists[1],
            held: lists[2],
            ready,
            waiting,
            blocked_by,
        }
    }

    const NONE: [&[&str]; 3] = [&[], &[], &[]];
    const CHAIN: &[(&str, i64, bool, &[&str])] = &[
        ("A", 1, false, &[]),
        ("B", 2, false, &["A"]),
        ("C", 3, false, &["B"]),
    ];
    const CHAIN_A_PASSED: &[(&str, i64, bool, &[&str])] = &[
        ("A", 1, true, &[]),
        ("B", 2, false, &["A"]),
        ("C", 3, false, &["B"]),
    ];
    const DIAMOND: &[(&str, i64, bool, &[&str])] = &[
        ("A", 1, false, &[]),
        ("B", 2, false, &["A"]),
        ("C", 3, false, &["A"]),
        ("D", 4, false, &["B", "C"]),
    ];
    const DIAMOND_A: &[(&str, i64, bool, &[&str])] = &[
        ("A", 1, true, &[]),
        ("B", 2, false, &["A"]),
        ("C", 3, false, &["A"]),
        ("D", 4, false, &["B", "C"]),
    ];
    const DIAMOND_AB: &[(&str, i64, bool, &[&str])] = &[
        ("A", 1, true, &[]),
        ("B", 2, true, &["A"]),
        ("C", 3, false, &["A"]),
        ("D", 4, false, &["B", "C"]),
    ];
    const FREE: &[(&str, i64, bool, &[&str])] = &[
        ("A", 1, false, &[]),
        ("B", 2, false, &[]),
        ("C", 3, false, &[]),
    ];

    #[rustfmt::skip]
    const ROWS: &[Row] = &[
        row("independent stories are all ready", FREE, NONE, &["A", "B", "C"], &[], &[]),
        row("chain: only its head is ready", CHAIN, NONE, &["A"], &[("B", &["A"]), ("C", &["B"])], &[]),
        row("chain: B once A passes", CHAIN_A_PASSED, NONE, &["B"], &[("C", &["B"])], &[]),
        row("chain: nothing while A is in flight", CHAIN, [&[], &["A"], &[]], &[], &[("B", &["A"]), ("C", &["B"])], &[]),
        row("diamond: its top", DIAMOND, NONE, &["A"], &[("B", &["A"]), ("C", &["A"]), ("D", &["B", "C"])], &[]),
        row("diamond: both sides once the top passes", DIAMOND_A, NONE, &["B", "C"], &[("D", &["B", "C"])], &[]),
        row("diamond: the bottom waits for the last side", DIAMOND_AB, NONE, &["C"], &[("D", &["C"])], &[]),
        row("diamond: one side blocked blocks the bottom", DIAMOND_A, [&["C"], &[], &[]], &["B"], &[], &[("D", "C")]),
        row("blocked dependency: transitive, with the root", CHAIN, [&["A"], &[], &[]], &[], &[], &[("B", "A"), ("C", "A")]),
        row("blocked middle: the nearest blocked story", CHAIN_A_PASSED, [&["B"], &[], &[]], &[], &[], &[("C", "B")]),
        row("in flight and held are not ready", FREE, [&[], &["B"], &["C"]], &["A"], &[], &[]),
        row("blocked but passing: its dependents go on", CHAIN_A_PASSED, [&["A"], &[], &[]], &["B"], &[("C", &["B"])], &[]),
        row("blocked itself, dependency passing: stays blocked",
            &[("A", 1, true, &[]), ("B", 2, false, &["A"])], [&["B"], &[], &[]], &[], &[], &[]),
        row("equal priorities keep prd.json order",
            &[("C", 1, false, &[]), ("A", 1, false, &[]), ("B", 1, false, &[])], NONE, &["C", "A", "B"], &[], &[]),
        row("lower priority number first, as the serial pick",
            &[("A", 3, false, &[]), ("B", 1, false, &[]), ("C", 2, false, &[])], NONE, &["B", "C", "A"], &[], &[]),
        row("an unknown id waits (validation refuses it)", &[("A", 1, false, &["X"])], NONE, &[], &[("A", &["X"])], &[]),
        row("a cycle waits and terminates", &[("A", 1, false, &["B"]), ("B", 2, false, &["A"])], NONE, &[],
            &[("A", &["B"]), ("B", &["A"])], &[]),
        row("a cycle behind a blocked story is blocked",
            &[("A", 1, false, &["B"]), ("B", 2, false, &["A", "C"]), ("C", 3, false, &[])], [&["C"], &[], &[]], &[], &[],
            &[("A", "C"), ("B", "C")]),
        row("all passing: nothing to do", &[("A", 1, true, &[]), ("B", 2, true, &["A"])], NONE, &[], &[], &[]),
        row("ids that name no story are ignored", FREE, [&["X"], &["Y"], &["Z"]], &["A", "B", "C"], &[], &[]),
    ];

    #[test]
    fn ready_set_table() {
        for r in ROWS {
            let p = prd(r.stories);
            let got = ready_set(&p, &ids(r.blocked), &ids(r.in_flight), &ids(r.held));
            let want = Readiness {
                ready: ids(r.ready),
                waiting: r
                    .waiting
                    .iter()
                    .map(|(s, d)| (s.to_string(), ids(d)))
                    .collect(),
                blocked_by: r
                    .blocked_by
                    .iter()
                    .map(|(s, b)| (s.to_string(), b.to_string()))
                    .collect(),
            };
            assert_eq!(got, want, "row: {}", r.name);
            // The serial pick is the first ready story when nothing is in flight or held.
            if r.in_flight.is_empty() && r.held.is_empty() {
                let next = p.next_story(&ids(r.blocked)).map(|s| s.id.clone());
                assert_eq!(
                    next,
                    got.ready.first().cloned(),
                    "row: {} (next_story)",
                    r.name
                );
            }
            assert_eq!(
                blocked_by_dependency(&p, &ids(r.blocked)),
                got.blocked_by,
                "row: {} (blocked_by_dependency)",
                r.name
            );
        }
    }

    #[test]
    fn a_long_chain_behind_a_blocked_story_is_walked_without_recursion() {
        // 100,000 stories, each waiting for the one before, the first blocked: recursion would
        // overflow a 2 MiB stack; the walk is linear.
        let n = 100_000;
        let stories: Vec<serde_json::Value> = (0..n)
            .map(|i| {
                let deps: Vec<String> = if i == 0 {
                    vec![]
                } else {
                    vec![format!("S{}", i - 1)]
                };
                serde_json::json!({"id": format!("S{i}"), "title": "t", "acceptanceCriteria": [],
                    "priority": i, "passes": false, "dependsOn": deps})
            })
            .collect();
        let p: Prd =
            serde_json::from_value(serde_json::json!({"project": "p", "userStories": stories}))
                .unwrap();
        let got = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || ready_set(&p, &["S0".to_string()], &[], &[]))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(got.blocked_by.len(), n - 1);
        assert!(got.blocked_by.iter().all(|(_, root)| root == "S0"));
        assert!(got.ready.is_empty() && got.waiting.is_empty());
    }

    #[test]
    fn the_reason_names_the_blocked_story() {
        assert_eq!(waits_for("US-002"), "waits for US-002 (blocked)");
    }
}
