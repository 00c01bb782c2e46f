"""What the library-aware server did, from its journal (`make serve LIBRARY=... ARGS="--journal FILE"`, issue 60):
one JSON line of counts over its `library` lines.

    python -m scripts.serve_journal FILE

requests: library lines; outcomes: how many of each (`grafted`, `not grafted`, `refused`, ...); own_entry: responses
whose entry is the request's own problem's (the problem found); in_request: whose entry is any library problem found
in the request (the own one, few-shot examples', near duplicates: what held-out and random never retrieve);
graft_lines: library responses whose entry's artifact the connector's own `graft` line records for that response
(request `<response id>-...`: the record of a graft the response could not confirm, outcome `unconfirmed`, a stop
string having ended it first); problems / entries: distinct problems found and entries named. Under held-out and
random own_entry and in_request are 0 by the rule; under recurring own_entry counts the problems the library holds.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def summary(path: Path) -> dict:
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    lib = [x for x in lines if x.get("event") == "library"]
    grafts = {(str(x.get("request", "")).rsplit("-", 2)[0], x.get("artifact")) for x in lines
              if x.get("event") == "graft"}
    own = in_request = recorded = 0
    problems, entries = set(), set()
    for x in lib:
        problem = x.get("problem") or {}
        entry = (x.get("entry") or {}).get("problem_id")
        problems.add(problem.get("problem_id"))
        if entry is None:
            continue
        entries.add((x.get("entry") or {}).get("entry"))
        response = str(x.get("response") or "").replace("chatcmpl-", "cmpl-", 1)  # a chat answer's id (middleware)
        recorded += (response, (x.get("entry") or {}).get("artifact")) in grafts
        own += entry == problem.get("problem_id")
        in_request += entry in (problem.get("in_request") or [])
    return {"requests": len(lib), "outcomes": dict(Counter(str(x.get("outcome")) for x in lib)),
            "retrieval": sorted({str(x.get("retrieval")) for x in lib}), "own_entry": own,
            "in_request": in_request, "graft_lines": recorded, "problems": len(problems - {None}),
            "entries": len(entries)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m scripts.serve_journal JOURNAL", file=sys.stderr)
        return 2
    print(json.dumps(summary(Path(args[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
