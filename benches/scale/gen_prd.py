#!/usr/bin/env python3
"""Writes a large prd.json for the scale benchmark and tests (issue 18, item 10).

    gen_prd.py OUT N [--passing K] [--deps] [--verify CMD]

N stories US-000001…, each with a title, a description, three acceptance criteria and notes,
priorities 1..N in file order. The first K (default 0) pass. With --deps, every story from the
second on depends on the story before it and on one ~N/2 stories back (a long chain: the shape
that made dependency lookups quadratic). With --verify CMD, every story carries that `verify`.
About 190 bytes per story (100,000 stories: about 19 MB).
"""

import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("n", type=int)
    ap.add_argument("--passing", type=int, default=0)
    ap.add_argument("--deps", action="store_true")
    ap.add_argument("--verify")
    ap.add_argument("--branch", default="ralph/scale")
    a = ap.parse_args()
    stories = []
    for i in range(a.n):
        sid = "US-%06d" % (i + 1)
        s = {
            "id": sid,
            "title": "Story %d" % (i + 1),
            "description": "As a user, I want item %d so that the list is complete." % (i + 1),
            "acceptanceCriteria": ["File item-%d.txt exists" % (i + 1), "It holds %d" % (i + 1),
                                   "Typecheck passes"],
            "priority": i + 1,
            "passes": i < a.passing,
            "notes": "",
        }
        if a.deps and i > 0:
            s["dependsOn"] = ["US-%06d" % i] + (["US-%06d" % (i // 2 + 1)] if i > 2 else [])
        if a.verify:
            s["verify"] = a.verify
        stories.append(s)
    doc = {"project": "scale", "branchName": a.branch, "description": "A PRD with %d stories." % a.n,
           "userStories": stories}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
