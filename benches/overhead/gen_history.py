#!/usr/bin/env python3
"""A long night's history, generated: a git repository whose branch `ralph/bench` holds RUNS x
PER_RUN ralph commits (message and `Ralph-*` trailers as ralph writes them, each touching one of
200 small files), written with one `git fast-import` (so the objects are in one pack), and a
matching `.ralph/ledger.jsonl` with one record per commit.

    gen_history.py REPO [--runs 10] [--per-run 1000] [--complete [--packed-refs]]

Without --complete this is exactly what `scripts/bench-history.sh` has always measured (issue 12):
prd.json is written but not committed, the ledger records carry the fields `ralph log` reads.

With --complete the repository looks as `ralph run` leaves it after that many iterations, so
`ralph run` can start in it (clean tree) and `ralph status` reads what it would read in the
morning:
- prd.json (50 stories) and progress.txt (one entry per iteration) are in the first commit;
- each iteration has `refs/ralph/<run>/<n>/start` and `.../end`: loose refs, as ralph writes them
  today, or with --packed-refs all in `.git/packed-refs` (as `git pack-refs --all` leaves them);
- each commit has the `Ralph-Feature` trailer; ledger records have every field ralph writes;
- `.ralph/state.json` names the last run, as a run that stopped at --max-iter leaves it.

REPO must not exist or be empty. Deterministic: same arguments, same commits (fixed dates).
"""

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone

BASE_TIME = 1764540000  # 2025-11-30T22:00:00Z; iteration n is committed at BASE_TIME + 60 n
STORIES = 50
FILES = 200


def iso(seconds):
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def run_id(run):
    return "202612%02dT220000-%04x" % (run + 1, run)


def story(n):
    return "US-%03d" % (n % STORIES + 1)


def outcome(n):
    return "story_passed" if n % 7 == 0 else "progress"


def prd_json():
    stories = [{"id": "US-%03d" % k, "title": "Story %d" % k, "description": "", "acceptanceCriteria": ["x"],
                "priority": k, "passes": k % 3 == 0} for k in range(1, STORIES + 1)]
    return json.dumps({"project": "Bench", "branchName": "ralph/bench", "userStories": stories})


def progress_txt(total):
    """progress.txt after `total` iterations: the header, a Codebase Patterns section, and per
    iteration an agent-written entry (with learnings) followed by ralph's own entry."""
    out = ["# Ralph Progress Log\nStarted: Sun Nov 30 22:00:00 UTC 2025\n---\n",
           "## Codebase Patterns\n- Run `cargo test` before committing; the suite takes 40 s.\n"
           "- Fixtures live in tests/fixtures; never edit them by hand.\n---\n"]
    for n in range(1, total + 1):
        when = datetime.fromtimestamp(BASE_TIME + 60 * n, timezone.utc).strftime("%Y-%m-%d %H:%M:%S +00:00")
        out.append("## %s - %s\n- Implemented part %d of the story; touched file-%d.txt\n"
                   "- **Learnings for future iterations:**\n  - the parser rejects trailing commas\n---\n"
                   % (when, story(n), n, n % FILES))
        out.append("## %s - %s: Story %d (ralph, iteration %d)\n- Outcome: %s\n- Agent commit: none "
                   "(ralph checkpoints the changes)\n- Summary: 0 agent commits, 1 file changed\n---\n"
                   % (when, story(n), n % STORIES + 1, n, outcome(n)))
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--per-run", type=int, default=1000)
    ap.add_argument("--complete", action="store_true")
    ap.add_argument("--packed-refs", action="store_true")
    a = ap.parse_args()
    repo = os.path.abspath(a.repo)
    os.makedirs(os.path.join(repo, ".ralph"), exist_ok=True)
    git = lambda *args, **kw: subprocess.run(["git", *args], cwd=repo, check=True, **kw)
    git("init", "-q", "-b", "ralph/bench")

    total = a.runs * a.per_run
    stream = []
    for idx in range(total):
        n = idx + 1
        mark = n
        rid = run_id(idx // a.per_run)
        msg = "ralph: iteration %d (%s)\n\nRalph-Run: %s\nRalph-Iteration: %d\nRalph-Story: %s\nRalph-Outcome: %s\n" % (
            n, story(n), rid, n, story(n), outcome(n))
        if a.complete:
            msg += "Ralph-Feature: ralph/bench\n"
        data = ("line %d\n" % n) * 3
        stream.append("commit refs/heads/ralph/bench\nmark :%d\ncommitter b <b@b> %d +0000\ndata %d\n%s" % (
            mark, BASE_TIME + n * 60, len(msg.encode()), msg))
        if mark > 1:
            stream.append("from :%d\n" % (mark - 1))
        if a.complete and n == 1:
            for name, text in (("prd.json", prd_json() + "\n"), ("progress.txt", progress_txt(total))):
                stream.append("M 644 inline %s\ndata %d\n%s\n" % (name, len(text.encode()), text))
        stream.append("M 644 inline file-%d.txt\ndata %d\n%s\n" % (n % FILES, len(data), data))
    iteration_refs = []  # (name, mark)
    if a.complete:
        for idx in range(total):
            n = idx + 1
            rid = run_id(idx // a.per_run)
            if n > 1:
                iteration_refs.append(("refs/ralph/%s/%d/start" % (rid, n), n - 1))
            iteration_refs.append(("refs/ralph/%s/%d/end" % (rid, n), n))
    if not a.packed_refs:
        stream += ["reset %s\nfrom :%d\n\n" % ref for ref in iteration_refs]
    marks = os.path.join(repo, ".git", "bench-marks")
    git("fast-import", "--quiet", "--export-marks=" + marks, input="".join(stream).encode())
    git("checkout", "-q", "-f", "ralph/bench")
    shas = git("rev-list", "--reverse", "HEAD", capture_output=True, text=True).stdout.split()
    if a.packed_refs:
        sha_of = {}
        with open(marks) as f:
            for line in f:
                mark, sha = line.split()
                sha_of[int(mark[1:])] = sha
        lines = ["%s %s\n" % (sha_of[m], name) for name, m in iteration_refs]
        lines.append("%s refs/heads/ralph/bench\n" % shas[-1])
        with open(os.path.join(repo, ".git", "packed-refs"), "w") as f:
            f.write("# pack-refs with: peeled fully-peeled sorted \n")
            f.writelines(sorted(lines, key=lambda l: l.split(" ", 1)[1]))
        os.unlink(os.path.join(repo, ".git", "refs", "heads", "ralph", "bench"))
        os.rmdir(os.path.join(repo, ".git", "refs", "heads", "ralph"))
    os.unlink(marks)

    if not a.complete:
        with open(os.path.join(repo, "prd.json"), "w") as f:
            f.write(prd_json())
    with open(os.path.join(repo, ".ralph", "ledger.jsonl"), "w") as f:
        for idx, sha in enumerate(shas):
            n = idx + 1
            rid = run_id(idx // a.per_run)
            t = BASE_TIME + n * 60
            rec = {"run_id": rid, "iteration": n, "story_id": story(n), "story_title": "Story",
                   "backend": "claude", "started_at": iso(t - 50), "ended_at": iso(t - 5), "duration_s": 45.0,
                   "outcome": outcome(n), "tokens_in": 1000, "tokens_out": 200,
                   "cost_usd": 0.05, "cost_source": "agent", "head_before": shas[idx - 1] if idx else None,
                   "head_after": sha, "commits": [], "checkpoint_commit": sha,
                   "files_changed": ["file-%d.txt" % (n % FILES)],
                   "message": "made progress on the story, one file at a time" if n % 7 else None}
            if a.complete:
                rec = {"run_id": rid, "iteration": n, "story_id": story(n), "story_title": "Story %d" % (n % STORIES + 1),
                       "backend": "claude", "model": "claude-opus-5-5", "agent_version": "2.1.332 (Claude Code)",
                       "started_at": iso(t - 50), "ended_at": iso(t - 5), "duration_s": 45.0,
                       "outcome": outcome(n), "exit_code": 0, "signal": None, "tokens_in": 1000, "tokens_out": 200,
                       "cache_read_tokens": 40000, "cache_creation_tokens": 2000, "cost_usd": 0.05,
                       "cost_source": "agent", "head_before": shas[idx - 1] if idx else None, "head_after": sha,
                       "commits": [], "checkpoint_commit": sha, "files_changed": ["file-%d.txt" % (n % FILES)],
                       "promise_seen": False, "passes_flipped": [], "passes_reverted": [],
                       "session_id": "3f2a9c40-%04d" % n,
                       "transcript": ".ralph/runs/%s/iter-%03d.jsonl" % (rid, n), "feature": "ralph/bench",
                       "message": "made progress on the story, one file at a time" if n % 7 else None}
            f.write(json.dumps(rec) + "\n")
    with open(os.path.join(repo, ".ralph", ".gitignore"), "w") as f:
        f.write("*\n")
    if a.complete:
        last_run = run_id(a.runs - 1)
        attempts = {}
        for n in range(total - a.per_run + 1, total + 1):
            attempts[story(n)] = attempts.get(story(n), 0) + 1
        state = {"version": 1, "run_id": last_run, "iteration": total, "attempts": dict(sorted(attempts.items())),
                 "blocked": [], "last_outcome": outcome(total), "in_flight": None, "resume_at": None,
                 "feature": "ralph/bench",
                 "stop_reason": {"kind": "max_iterations", "max_iter": a.per_run,
                                 "open": ["US-%03d" % k for k in range(1, STORIES + 1) if k % 3]}}
        with open(os.path.join(repo, ".ralph", "state.json"), "w") as f:
            json.dump(state, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
