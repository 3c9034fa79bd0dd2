#!/usr/bin/env python3
"""Writes BYTES (at least) of Claude Code `stream-json` output, shaped like what
`claude -p --output-format stream-json --verbose` prints for one long session:

- a `system`/`init` line;
- then turns until the size is reached: an assistant `text` line now and then, an assistant
  `tool_use` line (Bash or Read), and the `user` line with its `tool_result`, whose content is
  source-like text of 1 KB to 100 KB; like the real CLI, the `user` line repeats the output in
  `tool_use_result` (Bash: stdout/stderr; Read: the file), so most bytes are tool output;
- a final assistant `text` line and the `result` line with usage and cost.

    gen_stream.py OUT BYTES [--promise]

The result's usage reports `input_tokens` = 424242 and `output_tokens` = 31337, so a reader can
check that the whole stream was read (ralph's ledger record carries them). With --promise the
final text ends with `<promise>COMPLETE</promise>`. Deterministic: same arguments, same bytes.
"""

import json
import random
import sys

SESSION = "3f2a9c40-5b1e-4c2d-9a7f-bench0000001"
MODEL = "claude-opus-5-5"
# Tool output sizes in bytes, cycled: many small outputs, some big file reads.
SIZES = [900, 2_500, 6_000, 14_000, 30_000, 2_000, 60_000, 4_000, 100_000, 20_000]
INPUT_TOKENS, OUTPUT_TOKENS = 424242, 31337


def source_lines(rng, n):
    words = ["let", "fn", "match", "self", "iter", "map", "Ok", "Err", "return", "if", "else", "for",
             "in", "mut", "String", "Vec", "usize", "parse", "config", "path", "line", "value", "record",
             "=>", "&", "?", ";", "(", ")", "{", "}", "\"quoted \\\\ text\"", "\t", "é", "→"]
    out = []
    for i in range(n):
        indent = "    " * rng.randrange(0, 4)
        out.append("%s%s" % (indent, " ".join(rng.choice(words) for _ in range(rng.randrange(3, 12)))))
    return out


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: gen_stream.py OUT BYTES [--promise]")
    out_path, target = sys.argv[1], int(float(sys.argv[2]))
    promise = "--promise" in sys.argv[3:]
    rng = random.Random(13)
    pool = source_lines(rng, 4000)
    # Pre-build one text body per size (a window of the pool), numbered lines like Read prints.
    bodies = []
    for k, size in enumerate(SIZES):
        lines, total, j = [], 0, (k * 397) % len(pool)
        while total < size:
            line = "%6d\t%s" % (len(lines) + 1, pool[j % len(pool)])
            lines.append(line)
            total += len(line.encode()) + 1
            j += 1
        bodies.append("\n".join(lines))
    enc = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
    # Bodies are encoded once; each line is encoded with a placeholder that is then replaced.
    hole = "\x00BODY\x00"
    hole_json = enc.encode(hole)[1:-1]
    encoded = [enc.encode(b)[1:-1] for b in bodies]
    written = 0
    with open(out_path, "w", encoding="utf-8") as f:
        def emit(obj, body_json=None):
            nonlocal written
            s = enc.encode(obj) + "\n"
            if body_json is not None:
                s = s.replace(hole_json, body_json)
            f.write(s)
            written += len(s.encode())

        emit({"type": "system", "subtype": "init", "cwd": "/w/repo", "session_id": SESSION,
              "tools": ["Task", "Bash", "Glob", "Grep", "Read", "Edit", "Write", "TodoWrite"],
              "mcp_servers": [], "model": MODEL, "permissionMode": "bypassPermissions",
              "apiKeySource": "none", "claude_code_version": "2.1.332", "output_style": "default",
              "uuid": "00000000-0000-4000-8000-000000000000"})
        turn = 0
        while written < target:
            turn += 1
            msg_id = "msg_01bench%08d" % turn
            tool_id = "toolu_01bench%08d" % turn
            usage = {"input_tokens": 4, "cache_creation_input_tokens": 512, "cache_read_input_tokens": 40000 + turn,
                     "output_tokens": 120, "service_tier": "standard"}
            if turn % 5 == 1:
                emit({"type": "assistant", "message": {"id": msg_id, "type": "message", "role": "assistant",
                      "model": MODEL, "content": [{"type": "text", "text": "Let me look at the next part of the code (step %d)." % turn}],
                      "stop_reason": None, "stop_sequence": None, "usage": usage},
                      "parent_tool_use_id": None, "session_id": SESSION, "uuid": "a-%d" % turn})
            real_body = bodies[turn % len(bodies)]
            body = hole
            if turn % 2:
                tool_input = {"command": "cargo test --all 2>&1 | tail -n 400", "description": "Run the tests"}
                name, extra = "Bash", {"stdout": body, "stderr": "", "interrupted": False, "isImage": False}
            else:
                path = "/w/repo/src/module_%d.rs" % (turn % 97)
                tool_input = {"file_path": path}
                name = "Read"
                extra = {"type": "text", "file": {"filePath": path, "content": body,
                         "numLines": real_body.count("\n") + 1, "startLine": 1,
                         "totalLines": real_body.count("\n") + 1}}
            emit({"type": "assistant", "message": {"id": msg_id, "type": "message", "role": "assistant",
                  "model": MODEL, "content": [{"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}],
                  "stop_reason": None, "stop_sequence": None, "usage": usage},
                  "parent_tool_use_id": None, "session_id": SESSION, "uuid": "b-%d" % turn})
            emit({"type": "user", "message": {"role": "user", "content": [{"tool_use_id": tool_id, "type": "tool_result",
                  "content": body, "is_error": False}]},
                  "parent_tool_use_id": None, "session_id": SESSION, "uuid": "c-%d" % turn,
                  "tool_use_result": extra}, encoded[turn % len(bodies)])
        final = "Done for this iteration: the parser handles the new cases; tests pass."
        if promise:
            final += " <promise>COMPLETE</promise>"
        emit({"type": "assistant", "message": {"id": "msg_01benchfinal", "type": "message", "role": "assistant",
              "model": MODEL, "content": [{"type": "text", "text": final}], "stop_reason": "end_turn",
              "stop_sequence": None, "usage": {"input_tokens": 4, "output_tokens": 60}},
              "parent_tool_use_id": None, "session_id": SESSION, "uuid": "final"})
        emit({"type": "result", "subtype": "success", "is_error": False, "duration_ms": 3_600_000,
              "duration_api_ms": 2_900_000, "num_turns": turn + 1, "result": final, "session_id": SESSION,
              "total_cost_usd": 12.5, "usage": {"input_tokens": INPUT_TOKENS, "cache_creation_input_tokens": 20311,
              "cache_read_input_tokens": 401233, "output_tokens": OUTPUT_TOKENS, "service_tier": "standard"},
              "modelUsage": {MODEL: {"inputTokens": INPUT_TOKENS, "outputTokens": OUTPUT_TOKENS}},
              "permission_denials": [], "terminal_reason": "completed", "uuid": "result"})
    print(written)


if __name__ == "__main__":
    main()
