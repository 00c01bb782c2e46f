"""Sample by sample: lm-eval's completions through `make serve LIBRARY=... RETRIEVAL=...` against kvgraft's own run
of the same condition on vLLM (docs/vllm.md, "Any evaluation harness").

    .venv/bin/python -m scripts.lmeval_compare --lmeval runs/lmeval/recurring --run runs/graft/<stamp>-recurring

The run folder is audited first (harness.record.audit: hashes and scores re-checked; an edited folder is refused
naming its first finding). lm-eval's samples file (`samples_kvgraft_original_*.jsonl` under --lmeval, written with
--log_samples) gives each doc's response as the server answered it (vLLM cuts it before the stop string, "\\n");
the harness's row text is cut at the prompt's stop strings the same way (its rows keep the token that completed the
stop). Equal: those two texts, per problem. Prints one table row per differing sample, then
`identical N/M, accuracy lm-eval a/M, harness b/M`; exit status 0 only when every sample is identical and the
accuracies are equal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.errors import HarnessError, exit_on_error
from harness.record.audit import audited


def cut(text: str, stops: list[str]) -> str:
    """`text` before the first of `stops` (what vLLM's server returns for a stopped request)."""
    for s in stops:
        if s and s in text:
            text = text.split(s)[0]
    return text


def lmeval_samples(folder: Path) -> dict[str, tuple[str, float]]:
    """problem id -> (lm-eval's response, its metric) from the newest samples file under `folder`."""
    files = sorted(folder.rglob("samples_kvgraft_original_*.jsonl"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise HarnessError(f"{folder}: no samples_kvgraft_original_*.jsonl; run lm-eval with --log_samples "
                           f"--output_path {folder}")
    out = {}
    for line in files[-1].read_text(encoding="utf-8").splitlines():
        s = json.loads(line)
        resp = s["resps"][0][0] if isinstance(s["resps"][0], list) else s["resps"][0]
        out[str(s["doc"]["id"])] = (str(resp), float(s["correct"]))
    return out


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lmeval", required=True, help="lm-eval's --output_path of the run")
    p.add_argument("--run", required=True, help="the harness's run folder of the same condition")
    args = p.parse_args(argv)
    run = audited(Path(args.run), "lmeval_compare")  # the rows and config of the bytes audited (one read: issue 61)
    stops = list(run.config.get("prompt", {}).get("stop", ["\n"]))
    rows = run.rows
    theirs = lmeval_samples(Path(args.lmeval))
    same, differ, ours_correct, theirs_correct = 0, [], 0, 0.0
    for r in rows:
        mine = cut(r.completion.text, stops)
        got, metric = theirs.get(r.problem_id, (None, 0.0))
        ours_correct += int(r.correct)
        theirs_correct += metric
        if got == mine:
            same += 1
        else:
            differ.append((r.problem_id, mine, got))
    for pid, mine, got in differ:
        print(f"{pid}: harness {mine!r} | lm-eval {got!r}")
    missing = sorted(set(theirs) - {r.problem_id for r in rows})
    print(f"identical {same}/{len(rows)}, accuracy lm-eval {theirs_correct:.0f}/{len(theirs)}, harness "
          f"{ours_correct}/{len(rows)}" + (f"; lm-eval has {len(missing)} problems the run lacks" if missing else ""))
    if differ or missing or theirs_correct != ours_correct or len(theirs) != len(rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
