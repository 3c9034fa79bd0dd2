//! Archiving a finished feature's prd.json and progress.txt: `ralph archive` by hand, and the
//! start-up archive of `ralph run` when `branchName` changes (field case 21).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{prd_with_stories, text, TestEnv};

/// Today's local date as the archive folder names it.
fn today() -> String {
    chrono::Local::now().format("%Y-%m-%d").to_string()
}

/// Names of the entries directly inside `archive/`, sorted.
fn archive_entries(env: &TestEnv) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(env.path("archive"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A one-story PRD on `branch` whose story is `id`.
fn prd_on(branch: &str, id: &str) -> Value {
    let mut prd = prd_with_stories(1);
    prd["branchName"] = json!(branch);
    prd["userStories"][0]["id"] = json!(id);
    prd
}

/// One claude-dialect invocation that implements `id` and commits.
fn claude_story(id: &str, n: usize) -> Value {
    json!([
        {"claude_init": {}},
        {"write_file": {"path": format!("file-{n}.txt"), "content": format!("story {n}\n")}},
        {"set_passes": {"id": id, "passes": true}},
        {"git_commit": format!("feat: {id}")},
        {"claude_result": {"text": "Implemented it.", "is_error": false}}
    ])
}

#[test]
fn archive_by_hand_copies_both_files_into_a_flat_unique_folder_and_resets_progress() {
    let env = TestEnv::new(&prd_on("team/x/feature-b", "US-101"));
    let progress = "# Ralph Progress Log\nStarted: then\n---\n\n## Codebase Patterns\n- use pnpm\n\n## US-101 done\n---\n";
    env.write("progress.txt", progress);
    let prd = env.read("prd.json");
    let day = today();

    let out = env.ralph(&["archive"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let folder = format!("archive/{day}-team-x-feature-b");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{folder}/")) && stdout.contains("git commit"),
        "{stdout}"
    );
    assert_eq!(env.read(&format!("{folder}/prd.json")), prd);
    assert_eq!(env.read(&format!("{folder}/progress.txt")), progress);
    // Flat: no `team/` directory was created under archive/.
    assert_eq!(archive_entries(&env), [format!("{day}-team-x-feature-b")]);
    // prd.json stays; progress.txt starts over with ralph's header.
    assert_eq!(env.read("prd.json"), prd);
    let reset = env.read("progress.txt");
    assert!(
        reset.starts_with("# Ralph Progress Log\nStarted: "),
        "{reset}"
    );
    assert!(
        !reset.contains("pnpm") && !reset.contains("US-101"),
        "{reset}"
    );

    // The same day again: a new folder, the first one untouched; JSON says what happened.
    let out = env.ralph(&["archive", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["folder_rel"], format!("{folder}-2"));
    assert_eq!(doc["branch"], "team/x/feature-b");
    assert_eq!(doc["progress_had_entries"], false);
    assert_eq!(doc["progress_reset"], true);
    assert_eq!(doc["files"].as_array().map(Vec::len), Some(2));
    assert_eq!(env.read(&format!("{folder}/progress.txt")), progress);
    assert_eq!(
        archive_entries(&env),
        [
            format!("{day}-team-x-feature-b"),
            format!("{day}-team-x-feature-b-2")
        ]
    );
}

#[test]
fn archive_by_hand_of_a_prd_elsewhere_and_without_branch() {
    let env = TestEnv::new(&prd_with_stories(1));
    let mut prd = prd_with_stories(1);
    prd.as_object_mut().unwrap().remove("branchName");
    env.write(
        "plans/prd.json",
        &serde_json::to_string_pretty(&prd).unwrap(),
    );
    env.write("plans/progress.txt", "# Ralph Progress Log\n## notes\n");
    let out = env.ralph(&["archive", "--prd", "plans/prd.json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let folder = format!("plans/archive/{}-no-branch", today());
    assert_eq!(
        env.read(&format!("{folder}/progress.txt")),
        "# Ralph Progress Log\n## notes\n"
    );
    assert!(env.path(&format!("{folder}/prd.json")).exists());
    // The root PRD's progress.txt (none) is not involved.
    assert!(!env.path("archive").exists());

    let out = env.ralph(&["archive", "--prd", "missing/prd.json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nothing to archive"), "{stderr}");
}

#[test]
fn archive_by_hand_refuses_while_a_run_holds_the_lock() {
    let env = TestEnv::new(&prd_with_stories(1));
    env.script(&json!({"invocations": [[{"claude_init": {}}, {"sleep_ms": 3_600_000}]]}));
    let mut run = env.ralph_spawn(&["run", "--max-iter", "1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while env.agent_calls() == 0 {
        assert!(Instant::now() < deadline, "the run never started its agent");
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = env.read("progress.txt");

    let out = env.ralph(&["archive"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("`ralph run`") && stderr.contains(&format!("pid {}", run.id())),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: wait for the run to finish"),
        "{stderr}"
    );
    assert!(!env.path("archive").exists());
    assert_eq!(env.read("progress.txt"), before);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(130));
    // Once the run is gone, archiving works.
    let out = env.ralph(&["archive"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}

#[test]
fn case_21_branch_change_archives_the_old_prd_in_a_new_flat_unique_folder() {
    let env = TestEnv::new(&prd_on("team/x/feature-b", "US-101"));
    env.script(&json!({"invocations": [claude_story("US-101", 1), claude_story("US-201", 2)]}));
    let day = today();
    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // What the finished feature left: its prd.json (US-101 passing) and progress.txt.
    let old_prd = env.read("prd.json");
    assert_eq!(env.prd()["userStories"][0]["passes"], true);
    let old_progress = env.read("progress.txt");
    assert!(old_progress.contains("US-101"), "{old_progress}");

    // The user writes the next feature's prd.json; an archive of feature-b from today already
    // exists; both are committed (ralph refuses a dirty tree).
    env.write(
        "prd.json",
        &serde_json::to_string_pretty(&prd_on("team/x/feature-c", "US-201")).unwrap(),
    );
    let earlier = format!("archive/{day}-team-x-feature-b/prd.json");
    env.write(&earlier, "an earlier archive\n");
    env.git(&["add", "-A"]);
    env.git(&["commit", "-q", "-m", "next feature"]);

    let out = env.ralph(&["run", "--max-iter", "2"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    if today() != day {
        eprintln!("the date changed during the test; folder names cannot be checked");
        return;
    }
    let folder = format!("archive/{day}-team-x-feature-b-2");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains(&folder), "the run names the folder:\n{all}");
    // The OLD prd.json (feature-b, US-101 passing), not the new one, and the old progress.
    assert_eq!(env.read(&format!("{folder}/prd.json")), old_prd);
    assert_eq!(env.read(&format!("{folder}/progress.txt")), old_progress);
    // The existing folder is untouched, and nothing is nested.
    assert_eq!(env.read(&earlier), "an earlier archive\n");
    assert_eq!(
        archive_entries(&env),
        [
            format!("{day}-team-x-feature-b"),
            format!("{day}-team-x-feature-b-2")
        ]
    );
    // progress.txt was reset: the new run's entries only.
    let progress = env.read("progress.txt");
    assert!(progress.starts_with("# Ralph Progress Log\n"), "{progress}");
    assert!(
        !progress.contains("US-101") && progress.contains("US-201"),
        "{progress}"
    );
    assert_eq!(
        env.git(&["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
        "team/x/feature-c"
    );
    // The archive is committed, so the tree is clean.
    assert_eq!(env.git(&["status", "--porcelain"]), "");
}
