"""The recurring-case factor (issue 21 item 5): what answering a recurring problem by graft saves against the model
answering it alone under a long budget, measured on one backend (configs/experiment/recurring_factor.yaml: llama.cpp,
the first K problems of the public AIME 1983-2023 file, prompt=cot, 8 seeded samples of up to 4,096 tokens).

    make recurring-factor                                   # python scripts/recurring_factor.py (this module)
    python scripts/recurring_factor.py dataset.limit=4 library.dataset.limit=4    # more problems (Hydra overrides)

1. opens (or builds) the library of exactly those problems' verified solutions (library.dataset.limit = K);
2. runs the graft condition (recurring: the library holds each evaluated problem) with the answer prompt, the
   query format the library's entries are written in (they restate the problem as the answer prompt asks it, then
   "Final answer: N" and the solution), so a recalled problem continues at "Final answer:", as in the seed's
   table; `--graft-prompt=cot` grafts under the baseline's prompt instead; `--incontext` also runs the graft's
   in-context twin and checks every graft row is identical to it;
3. reuses the newest complete baseline run with the same comparable key that re-scores (harness.compare.job's rule),
   or runs it (resumable: re-running the command after an interruption continues it in its folder);
4. prints and writes runs/recurring_factor/<stamp>/factor.json: per problem and in total, samples, correct, decode
   tokens, wall and CPU seconds (sums over rows), energy where a meter exists, and the baseline / graft factors.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from harness.errors import PairingError, exit_on_error


def _totals(rows: list[Any]) -> dict[str, Any]:
    joules = [r.energy_j for r in rows]
    return {
        "rows": len(rows),
        "correct": sum(bool(r.correct) for r in rows),
        "decode_tokens": sum(r.completion.decode_tokens for r in rows),
        "prefill_tokens": sum(r.completion.prefill_tokens for r in rows),
        "grafted_tokens": sum(r.completion.grafted_tokens for r in rows),
        "stops": {k: sum(r.completion.stop_reason == k for r in rows) for k in ("eos", "stop", "length")},
        "wall_s": round(sum(r.wall_s for r in rows), 3),
        "cpu_s": round(sum(r.cpu_s for r in rows), 3),
        "energy_j": round(sum(joules), 3) if rows and all(j is not None for j in joules) else None,
        "energy_status": rows[0].energy_status if rows else None,
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def factor_table(baseline: list[Any], graft: list[Any]) -> dict[str, Any]:
    """Per problem and in total: the baseline's and the graft's totals and the baseline / graft factors."""
    out: dict[str, Any] = {"problems": {}, "total": {}}
    ids = list(dict.fromkeys(r.problem_id for r in baseline))
    for pid in [*ids, None]:
        b = [r for r in baseline if pid is None or r.problem_id == pid]
        g = [r for r in graft if pid is None or r.problem_id == pid]
        tb, tg = _totals(b), _totals(g)
        entry = {"baseline": tb, "graft": tg, "factor": {
            k: _ratio(tb[k], tg[k]) for k in ("decode_tokens", "wall_s", "cpu_s", "energy_j")}}
        if pid is None:
            out["total"] = entry
        else:
            out["problems"][pid] = entry
    return out


def print_table(result: dict[str, Any]) -> None:
    head = (f"{'problem':<10} {'samples':>7} {'base ok':>7} {'graft ok':>8} {'base tok':>9} {'graft tok':>9} "
            f"{'tok x':>8} {'base wall s':>11} {'graft wall s':>12} {'wall x':>7} {'base cpu s':>10} "
            f"{'graft cpu s':>11} {'cpu x':>7}")
    print(head)
    print("-" * len(head))
    for pid, e in [*result["problems"].items(), ("total", result["total"])]:
        b, g, f = e["baseline"], e["graft"], e["factor"]
        print(f"{pid:<10} {b['rows']:>7} {b['correct']:>7} {g['correct']:>8} {b['decode_tokens']:>9,} "
              f"{g['decode_tokens']:>9,} {f['decode_tokens'] or 0:>8,.1f} {b['wall_s']:>11,.1f} {g['wall_s']:>12,.1f} "
              f"{f['wall_s'] or 0:>7,.1f} {b['cpu_s']:>10,.1f} {g['cpu_s']:>11,.1f} {f['cpu_s'] or 0:>7,.1f}")
    t = result["total"]
    print(f"baseline stops eos/stop/length {t['baseline']['stops']}; graft {t['graft']['stops']}")
    e = t["factor"]["energy_j"]
    print(f"energy: x{e:.1f}" if e else f"energy: {t['baseline']['energy_status']}")


@exit_on_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        print("usage: recurring_factor.py [--incontext] [--graft-prompt=PROMPT] [HYDRA_OVERRIDE ...]\n\n" + __doc__)
        raise SystemExit(0)
    with_incontext = "--incontext" in args
    graft_prompt = next((a.split("=", 1)[1] for a in args if a.startswith("--graft-prompt=")), "answer")
    overrides = [a for a in args if a != "--incontext" and not a.startswith("--graft-prompt=")]

    from harness.compare.job import find_baseline, with_changes
    from harness.compare.pairing import pair
    from harness.config.model import load_model
    from harness.config.schema import compose_config, typed
    from harness.library.build import open_library
    from harness.record.folder import RunFolder, claim, stamp
    from harness.record.hashing import write_json
    from harness.run.loop import comparable_key, console, run_rows
    from harness.task.chat import chat_frame

    cfg = compose_config(["+experiment=recurring_factor", *overrides])
    c = typed(cfg)
    root = Path(c.project_root)
    runs = root / c.runs_dir
    t0, load0 = time.perf_counter(), os.getloadavg()
    be = load_model(c)
    t_lib = time.perf_counter()
    lib = open_library(c.library, be, root, build_if_missing=True, chat=chat_frame(be, c.model.chat))
    lib_s = time.perf_counter() - t_lib
    console.print(f"library {lib.manifest['name']}: {len(lib.entries)} verified entries "
                  f"({lib.manifest['tokens_total']} tokens) in {lib.path} ({lib_s:.1f} s to open or build)")
    recall = compose_config(["+experiment=recurring_factor", *overrides, f"prompt={graft_prompt}"])
    graft_cfg = with_changes(recall, condition__name="graft", library__exclude_self=False)
    g_folder, _, g_rows = run_rows(graft_cfg, RunFolder.new(runs, "graft", "recurring"), fm=be)
    runs_used = {"graft": str(g_folder.path)}
    differing: list[str] = []
    if with_incontext:
        i_cfg = with_changes(recall, condition__name="incontext", library__exclude_self=False)
        i_folder, _, i_rows = run_rows(i_cfg, RunFolder.new(runs, "incontext", "recurring"), fm=be)
        runs_used["incontext"] = str(i_folder.path)
        differing = pair(g_rows, i_rows).differences
    found = find_baseline(runs, comparable_key(c, be), say=lambda why: console.print(f"[yellow]{why}[/]"))
    if found is not None:
        console.print(f"matching baseline run: {found.path} (reused)")
        b_rows, runs_used["baseline"] = found.read_rows(), str(found.path)
    else:
        b_folder, _, b_rows = run_rows(with_changes(cfg, condition__name="baseline"), fm=be)
        runs_used["baseline"] = str(b_folder.path)
    result = {
        "experiment": "recurring_factor", "overrides": overrides, "backend": be.name, "settings": be.settings(),
        "dataset": c.dataset.name, "limit": c.dataset.limit, "prompt": c.prompt.name, "graft_prompt": graft_prompt,
        "decoding": {k: getattr(c.decoding, k) for k in ("strategy", "max_new_tokens", "n_samples", "temperature",
                                                         "top_p", "seed")},
        "runs": runs_used, "library": {"path": str(lib.path), "entries": len(lib.entries), "seconds": round(lib_s, 1)},
        "graft_rows_differing_from_incontext": differing if with_incontext else None,
        "load_average": {"start": [round(x, 2) for x in load0], "end": [round(x, 2) for x in os.getloadavg()]},
        "cpu": _cpu_name(), "job_wall_s": round(time.perf_counter() - t0, 1),
        **factor_table(b_rows, g_rows),
    }
    out = claim(runs / "recurring_factor", stamp()) / "factor.json"
    write_json(out, result)
    print_table(result)
    print(f"load average 1/5/15 min: start {result['load_average']['start']}, end {result['load_average']['end']} "
          f"({os.cpu_count()} cores, {result['cpu']}); job {result['job_wall_s']} s -> {out}")
    if differing:
        raise PairingError(f"{len(differing)} graft row(s) differ from their incontext twin: {'; '.join(differing)}")
    return result


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
