"""The recurring-case factor (issue 21 item 5): what answering a recurring problem by graft saves against the model
answering it alone under a long budget, measured on one backend (configs/experiment/recurring_factor.yaml: llama.cpp,
the first K problems of the public AIME 1983-2023 file, prompt=cot, 8 seeded samples of up to 4,096 tokens).

    make recurring-factor                                   # python -m scripts.recurring_factor (this module)
    python -m scripts.recurring_factor dataset.limit=4 library.dataset.limit=4    # more problems (Hydra overrides)
    make recurring-factor ARGS="+experiment=recurring_factor_vllm --first-unsolved=8 --graft-decoding=greedy"
                                                            # the full-size table on vLLM (another experiment file)

1. opens (or builds) the library of exactly those problems' verified solutions (library.dataset.limit = K);
2. runs the graft condition (recurring: the library holds each evaluated problem) with the answer prompt, the
   query format the library's entries are written in (they restate the problem as the answer prompt asks it, then
   "Final answer: N" and the solution), so a recalled problem continues at "Final answer:", as in the seed's
   table; `--graft-prompt=cot` grafts under the baseline's prompt instead; `--graft-decoding=greedy` answers
   each problem once, greedily (default: the baseline's decoding); `--incontext` also runs the graft's in-context
   twin and checks every graft row is identical to it;
3. reuses the newest complete baseline run with the same comparable key that re-scores (harness.compare.job's rule),
   or runs it (resumable: re-running the command after an interruption continues it in its folder);
4. with `--first-unsolved=N`, keeps the first N problems in file order that no baseline sample solved and whose
   verified entry the library holds (`first_unsolved`; the selection and what it skipped are recorded);
5. prints and writes runs/recurring_factor/<stamp>/factor.json: per problem and in total, samples, correct, decode
   tokens, wall and CPU seconds (sums over rows), energy where a meter exists, and the baseline / graft factors.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, PairingError, exit_on_error, plain


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


def first_unsolved(baseline: list[Any], n: int, held: set[str], skipped: dict[str, str]) -> dict[str, Any]:
    """The selection rule: the first `n` problems, in the order the baseline ran them (the dataset file's order),
    of which no baseline sample is correct and whose verified entry the library holds (`held`; `skipped`: the
    library build's reason for each one it left out, e.g. an entry the backend cannot graft)."""
    ids = list(dict.fromkeys(r.problem_id for r in baseline))
    solved = [p for p in ids if any(r.correct for r in baseline if r.problem_id == p)]
    not_held = {p: skipped.get(p, "not in the library") for p in ids if p not in held}
    never = [p for p in ids if p not in solved and p not in not_held]
    return {"rule": f"the first {n} problems in file order that no baseline sample solves, whose verified entry the "
                    f"library holds", "considered": len(ids), "solved_skipped": solved, "not_held_skipped": not_held,
            "chosen": never[:n]}


def print_table(result: dict[str, Any]) -> None:
    head = (f"{'problem':<10} {'samples':>7} {'base ok':>7} {'graft ok':>8} {'base tok':>9} {'graft tok':>9} "
            f"{'tok x':>8} {'base wall s':>11} {'graft wall s':>12} {'wall x':>7} {'base cpu s':>10} "
            f"{'graft cpu s':>11} {'cpu x':>7}")
    print(head)
    print("-" * len(head))
    for pid, e in [*result["problems"].items(), ("total", result["total"])]:
        b, g, f = e["baseline"], e["graft"], e["factor"]
        print(f"{plain(pid):<10} {b['rows']:>7} {b['correct']:>7} {g['correct']:>8} {b['decode_tokens']:>9,} "
              f"{g['decode_tokens']:>9,} {f['decode_tokens'] or 0:>8,.1f} {b['wall_s']:>11,.1f} {g['wall_s']:>12,.1f} "
              f"{f['wall_s'] or 0:>7,.1f} {b['cpu_s']:>10,.1f} {g['cpu_s']:>11,.1f} {f['cpu_s'] or 0:>7,.1f}")
    t = result["total"]
    budget = result.get("baseline_budget_tokens")
    if budget:
        g, rows = t["graft"]["decode_tokens"], t["baseline"]["rows"]
        print(f"baseline budget {budget:,} tokens ({rows} samples x {budget // max(1, rows):,}), "
              f"{t['baseline']['decode_tokens']:,} decoded; graft {g:,} decode tokens: budget / graft "
              f"{budget / g if g else 0:,.1f}x")
    if result.get("selection"):
        sel = result["selection"]
        print(plain(f"selection: {sel['rule']}: {len(sel['chosen'])} of the first {sel['considered']}; skipped "
                    f"(solved): {', '.join(sel['solved_skipped']) or 'none'}; skipped (no entry): "
                    f"{', '.join(sel['not_held_skipped']) or 'none'}"))
    print(f"baseline stops eos/stop/length {t['baseline']['stops']}; graft {t['graft']['stops']}")
    e = t["factor"]["energy_j"]
    print(f"energy: x{e:.1f}" if e else f"energy: {t['baseline']['energy_status']}")


@exit_on_error
def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = list(sys.argv[1:] if argv is None else argv)
    if {"-h", "--help"} & set(args):
        print("usage: recurring_factor.py [--incontext] [--graft-prompt=PROMPT] [--graft-decoding=DECODING] "
              "[--first-unsolved=N] [HYDRA_OVERRIDE ...]\n\n" + __doc__)
        raise SystemExit(0)
    with_incontext = "--incontext" in args
    graft_prompt = next((a.split("=", 1)[1] for a in args if a.startswith("--graft-prompt=")), "answer")
    unsolved_arg = next((a.split("=", 1)[1] for a in args if a.startswith("--first-unsolved=")), None)
    if unsolved_arg is not None and not (unsolved_arg.isdigit() and int(unsolved_arg) >= 1):
        raise ConfigError(f"--first-unsolved={unsolved_arg}: give how many problems to keep, a whole number >= 1")
    unsolved = int(unsolved_arg) if unsolved_arg is not None else None
    graft_decoding = next((a.split("=", 1)[1] for a in args if a.startswith("--graft-decoding=")), None)
    flags = ("--graft-prompt=", "--first-unsolved=", "--graft-decoding=")
    overrides = [a for a in args if a != "--incontext" and not a.startswith(flags)]
    # the experiment: configs/experiment/recurring_factor.yaml unless an override names another (+experiment=NAME)
    experiment = next((a for a in overrides if a.startswith("+experiment=")), "+experiment=recurring_factor")
    overrides = [a for a in overrides if a != experiment]

    from harness.compare.job import find_baseline, with_changes
    from harness.compare.pairing import pair
    from harness.config.identity import BATCH_DEPENDENT
    from harness.config.model import load_model
    from harness.config.schema import compose_config, typed
    from harness.library.build import open_library
    from harness.record.folder import RunFolder, claim, stamp
    from harness.record.hashing import write_json
    from harness.run.loop import comparable_key, console, rows_depend_on_batch, run_rows
    from harness.task.chat import chat_frame
    from harness.task.problems import check_problem_sets

    cfg = compose_config([experiment, *overrides])
    c = typed(cfg)
    root = Path(c.project_root)
    runs = root / c.runs_dir
    t0, load0 = time.perf_counter(), os.getloadavg()
    check_problem_sets(c, root)  # a missing or bad problem file refuses here, before the model and the library
    be = load_model(c)
    if with_incontext and rows_depend_on_batch(be, c.run.in_flight):
        raise ConfigError(f"--incontext with run.in_flight={c.run.in_flight} on the {be.name} backend: "
                          f"{BATCH_DEPENDENT}, so the twin check could not be made under one schedule; use "
                          "run.in_flight=1 for it")
    t_lib = time.perf_counter()
    lib = open_library(c.library, be, root, build_if_missing=True, chat=chat_frame(be, c.model.chat))
    lib_s = time.perf_counter() - t_lib
    console.print(f"library {lib.manifest['name']}: {len(lib.entries)} verified entries "
                  f"({lib.manifest['tokens_total']} tokens) in {lib.path} ({lib_s:.1f} s to open or build)")
    recall = compose_config([experiment, *overrides, f"prompt={graft_prompt}",
                             *([f"decoding={graft_decoding}"] if graft_decoding else []),
                             *(["decoding.n_samples=1", "decoding.batch_size=1"] if graft_decoding == "greedy"
                               else [])])
    graft_cfg = with_changes(recall, condition__name="graft", library__exclude_self=False)
    g_run, _ = run_rows(graft_cfg, RunFolder.new(runs, "graft", "recurring"), be=be)
    g_folder, g_rows = g_run.folder, g_run.rows
    runs_used = {"graft": str(g_folder.path)}
    i_rows: list[Any] = []
    if with_incontext:
        i_cfg = with_changes(recall, condition__name="incontext", library__exclude_self=False)
        i_run, _ = run_rows(i_cfg, RunFolder.new(runs, "incontext", "recurring"), be=be)
        i_folder, i_rows = i_run.folder, i_run.rows
        runs_used["incontext"] = str(i_folder.path)
    found = find_baseline(runs, comparable_key(c, be), say=lambda why: console.print(f"[yellow]{why}[/]"))
    if found is not None:
        console.print(f"matching baseline run: {found.path} (reused)")
        b_rows, runs_used["baseline"] = found.read_rows(), str(found.path)
    else:
        b_run, _ = run_rows(with_changes(cfg, condition__name="baseline"), be=be)
        b_folder, b_rows = b_run.folder, b_run.rows
        runs_used["baseline"] = str(b_folder.path)
    selection = None
    if unsolved is not None:
        selection = first_unsolved(b_rows, unsolved, {e.problem_id for e in lib.entries},
                                   {k["problem_id"]: k["reason"] for k in lib.manifest.get("skipped", [])})
        if len(selection["chosen"]) < unsolved:
            console.print(f"[yellow]warning:[/] only {len(selection['chosen'])} of the first {selection['considered']} "
                          f"problems are never solved by the baseline; the rule asks for {unsolved}: raise "
                          f"dataset.limit and library.dataset.limit to consider more")
        keep = set(selection["chosen"])
        b_rows = [r for r in b_rows if r.problem_id in keep]
        g_rows = [r for r in g_rows if r.problem_id in keep]
        i_rows = [r for r in i_rows if r.problem_id in keep]
    differing = pair(g_rows, i_rows).differences if with_incontext else []
    result = {
        "experiment": experiment.split("=", 1)[1], "overrides": overrides, "backend": be.name,
        "settings": be.settings(),
        "dataset": c.dataset.name, "limit": c.dataset.limit, "prompt": c.prompt.name, "graft_prompt": graft_prompt,
        "graft_decoding": {k: getattr(typed(recall).decoding, k) for k in ("strategy", "max_new_tokens", "n_samples")},
        "decoding": {k: getattr(c.decoding, k) for k in ("strategy", "max_new_tokens", "n_samples", "temperature",
                                                         "top_p", "seed")},
        "selection": selection,
        "baseline_budget_tokens": len(b_rows) * c.decoding.max_new_tokens,
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
