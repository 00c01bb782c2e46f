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
    """problem id -> (lm-eval's response, its metric) from the one samples file under `folder` (several: a
    HarnessError, never the newest by mtime)."""
    files = sorted(folder.rglob("samples_kvgraft_original_*.jsonl"))
    if not files:
        raise HarnessError(f"{folder}: no samples_kvgraft_original_*.jsonl; run lm-eval with --log_samples "
                           f"--output_path {folder}")
    if len(files) > 1:
        raise HarnessError(f"{folder}: {len(files)} samples files ({files[0].name}, {files[1].name}, ...); give the "
                           "--output_path of one lm-eval run")
    out = {}
    for line in files[0].read_text(encoding="utf-8").splitlines():
        s = json.loads(line)
        resp = s["resps"][0][0] if isinstance(s["resps"][0], list) else s["resps"][0]
        out[str(s["doc"]["id"])] = (str(resp), float(s["correct"]))
    return out


def journal_entries(path: Path, retrieval: str, library_sha256: str) -> dict[str, set[str]]:
    """problem id -> the entries the server's journal says it retrieved for that problem (`library` lines); a
    HarnessError when a line names another retrieval or library than the run's."""
    out: dict[str, set[str]] = {}
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        row = json.loads(line) if line.strip() else {}
        if row.get("event") != "library":
            continue
        if row.get("retrieval") != retrieval:
            raise HarnessError(f"{path}, line {i}: the server ran RETRIEVAL={row.get('retrieval')}, the run is "
                               f"{retrieval}; compare lm-eval against the run of the same retrieval")
        if library_sha256 and row.get("library") not in (None, library_sha256):
            raise HarnessError(f"{path}, line {i}: the server served library {str(row.get('library'))[:12]}, the run "
                               f"read {library_sha256[:12]}; serve the run's library")
        pid = (row.get("problem") or {}).get("problem_id")
        entry = (row.get("entry") or {}).get("entry")
        if pid and entry:
            out.setdefault(str(pid), set()).add(str(entry))
    return out


@exit_on_error
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lmeval", required=True, help="lm-eval's --output_path of the run")
    p.add_argument("--run", required=True, help="the harness's run folder of the same condition")
    p.add_argument("--journal", default="", help="the server's journal (make serve ARGS=\"--journal FILE\"): each "
                   "sample paired by the entry the server retrieved for its problem")
    args = p.parse_args(argv)
    run = audited(Path(args.run), "lmeval_compare")  # the rows and config of the bytes audited (one read: issue 61)
    stops = list(run.config.get("prompt", {}).get("stop", ["\n"]))
    rows = run.rows
    theirs = lmeval_samples(Path(args.lmeval))
    unknown = sorted(set(theirs) - {r.problem_id for r in rows})
    if unknown:
        raise HarnessError(f"{args.lmeval}: its samples name {len(unknown)} problem(s) the run lacks ({unknown[0]}, "
                           "...): not this run's samples")
    if args.journal:
        cfg = run.read_config().get("library", {}) or {}
        mode = (("random" if cfg.get("retrieval") == "random" else "held-out") if cfg.get("exclude_self")
                else "recurring")
        sealed = str((run.read_manifest().get("library") or {}).get("manifest_sha256") or "")
        served = journal_entries(Path(args.journal), mode, sealed)
        for r in rows:
            mine = r.completion.retrieval.entry_id if r.completion.retrieval else None
            if r.problem_id in theirs and served.get(r.problem_id, set()) != ({mine} if mine else set()):
                raise HarnessError(f"{args.journal}: problem {r.problem_id}: the server retrieved "
                                   f"{sorted(served.get(r.problem_id, set()))}, the run's row read {mine}; not the "
                                   "same condition")
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
