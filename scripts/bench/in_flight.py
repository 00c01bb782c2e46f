"""Problems in flight (run.in_flight, issue 42): the harness's tokens/s with N problems in one engine batch against
one problem at a time, and on vLLM against bare `LLM.generate` given every prompt at once (the ceiling), every ratio
measured in one invocation on one loaded engine per backend.

vLLM (runs in .venv-vllm; this script starts itself there): greedy over the first P problems (default 40) at a B-token
budget (default 256), chain-of-thought prompt, then avg@n sampling (n=8 over the first S problems, default 5):
    bare all      LLM.generate with every row's prompt at once (the same token ids the harness's rows read, the same
                  stop strings and EOS), the engine's continuous batching doing the rest
    bare one      the same, one prompt (greedy) or one problem's n rows (sampling) at a time
    harness N     `python -m harness ... run.in_flight=P` in-process on the same engine: decode tokens / run wall
    harness 1     run.in_flight=1
and prints harness N / bare all (goal >= 0.9) and (harness N / harness 1) / (bare all / bare one) (goal >= 0.9).
The harness's side also records each context's first-logits SHA-256 (hashed inside the engine: greedy rows take it
in their own request, sampled rows in a first-logits request per problem).

transformers (this venv), determinism.batch_invariant=true: a greedy baseline over the first P problems with
run.in_flight=N (default 8) and with 1, rows compared (token ids and first-logits SHA-256) and the speed-up printed.

llama.cpp decodes one context at a time (run.in_flight=1; a larger value is refused in one line): nothing to measure.

    python -m scripts.bench.in_flight --out runs/bench [--engines vllm,transformers] [--problems 40] \
        [--max-new-tokens 256] [--n 8] [--sample-problems 5] [--dtype bfloat16] [--tf-problems 40] [--tf-in-flight 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvstore import backend_tools

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
GOAL = 0.9


def cpu_line() -> str:
    """The CPU by name and vector width (AVX-512 or AVX2), cores, and the load average now."""
    name, flags = "unknown CPU", ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name") and name == "unknown CPU":
            name = line.split(":", 1)[1].strip()
        if line.startswith("flags") and not flags:
            flags = line
    width = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    fam = next((ln.split(":")[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("cpu family")), "?")
    return f"{name} (family {fam}, {width}), {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}"


def _overrides(model: str, runs: Path, limit: int, budget: int, *extra: str) -> list[str]:
    return [f"model={model}", "condition=baseline", "prompt=cot", f"dataset.limit={limit}",
            f"decoding.max_new_tokens={budget}", "tracking=off", "energy=none", f"runs_dir={runs}",
            f"project_root={REPO}", "run.fresh=true", *extra]


def _harness(be, overrides: list[str]) -> dict:  # noqa: ANN001
    from harness.config.schema import compose_config
    from harness.run.loop import run_rows

    load0 = os.getloadavg()[0]
    finished, _ = run_rows(compose_config(overrides), be=be, progress=False)
    s = finished.summary.to_json()
    decode, wall = s["tokens"]["decode"], s["time"]["run_wall_s"]
    return {"rows": len(finished.rows), "decode_tokens": decode, "wall_s": round(wall, 2),
            "tokens_per_s": round(decode / wall, 2), "load": [round(load0, 2), round(os.getloadavg()[0], 2)],
            "folder": str(finished.folder.path), "_rows": finished.rows}


def _bare(be, prompts: list[list[int]], params: list, groups: list[list[int]]) -> dict:  # noqa: ANN001
    """LLM.generate over `groups` of prompt indices, one call per group (one group of all: all at once)."""
    load0 = os.getloadavg()[0]
    alone = backend_tools("vllm").bare  # vLLM alone on the backend's own engine
    be.new_state()  # an empty prefix cache, as the harness's runs start from
    t0, tokens = time.perf_counter(), 0
    for g in groups:
        outs = alone.generate(be, [prompts[i] for i in g], [params[i] for i in g])
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    wall = time.perf_counter() - t0
    return {"rows": len(prompts), "decode_tokens": tokens, "wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 2), "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}


def _first_logits(be, contexts: list[list[int]]) -> None:  # noqa: ANN001
    """The contexts' first-logits requests alone, through the backend's own verb (one token each: no second
    submission), on an empty prefix cache."""
    from kvstore import RowsRequest

    be.continue_many([RowsRequest(None, ids, [0]) for ids in contexts], max_new_tokens=1)


def bench_vllm(args: argparse.Namespace) -> dict:
    from vllm import SamplingParams

    from harness.config.model import load_model
    from harness.config.schema import compose_config, typed

    runs = Path(tempfile.mkdtemp(prefix="kvgraft-inflight-"))
    engine = [f"model.vllm.dtype={args.dtype}", f"model.vllm.max_num_seqs={args.max_num_seqs}"]
    base = _overrides("gemma3_270m_vllm", runs, args.problems, args.max_new_tokens, *engine)
    be = load_model(typed(compose_config(base)))
    stop_ids = sorted(be.eos_ids())
    warm = [be.encode(f"Problem: {i} + {i} = ?\nSolution:") for i in range(8)]  # the engine's first steps, untimed
    backend_tools("vllm").bare.generate(be, warm, SamplingParams(max_tokens=32, temperature=0.0))
    # and the whole-vocabulary first-logits path (its first use costs ~3 s more than later ones, measured here)
    _first_logits(be, warm)
    out: dict = {"dtype": args.dtype, "max_num_seqs": args.max_num_seqs}
    for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
        if kind == "greedy":
            common, limit = base, args.problems
        else:
            common = _overrides("gemma3_270m_vllm", runs, args.sample_problems, args.max_new_tokens, *engine,
                                "decoding=sample", f"decoding.n_samples={args.n}", f"decoding.batch_size={args.n}")
            limit = args.sample_problems
        print(f"vllm {kind}: {limit} problems x {1 if kind == 'greedy' else args.n} rows x {args.max_new_tokens} "
              "tokens ...", flush=True)
        h_many = _harness(be, [*common, f"run.in_flight={limit}"])
        h_one = _harness(be, [*common, "run.in_flight=1"])
        rows = h_many.pop("_rows")
        h_one.pop("_rows")
        stop = [s for s in ("\nProblem:",) if s]
        prompts, params, groups = [], [], {}
        for r in rows:  # the very token ids each row read, its own seed
            groups.setdefault(r.problem_id, []).append(len(prompts))
            prompts.append(list(r.completion.context_ids))
            params.append(SamplingParams(max_tokens=args.max_new_tokens, stop=stop, stop_token_ids=stop_ids,
                                         **({"temperature": 0.0} if kind == "greedy" else
                                            {"temperature": 0.7, "top_p": 0.95, "seed": int(r.completion.seed)})))
        b_all = _bare(be, prompts, params, [list(range(len(prompts)))])
        # the contexts' first-logits requests alone (max_tokens=1, digest hashed in the engine): a sampled run's extra
        # submission; a greedy row takes its digest in its own request
        t0 = time.perf_counter()
        _first_logits(be, [prompts[g[0]] for g in groups.values()])
        first_s = round(time.perf_counter() - t0, 2)
        b_one = _bare(be, prompts, params, list(groups.values()))
        fig = {"harness_in_flight": h_many, "harness_one_at_a_time": h_one, "bare_all_at_once": b_all,
               "bare_one_at_a_time": b_one}
        engine_ratio = b_all["tokens_per_s"] / b_one["tokens_per_s"]
        harness_ratio = h_many["tokens_per_s"] / h_one["tokens_per_s"]
        fig["ratios"] = {"harness_in_flight_vs_bare_all": round(h_many["tokens_per_s"] / b_all["tokens_per_s"], 3),
                         "engine_all_vs_one": round(engine_ratio, 3), "harness_n_vs_1": round(harness_ratio, 3),
                         "harness_gain_vs_engine_gain": round(harness_ratio / engine_ratio, 3)}
        fig["first_logits_requests_s"] = first_s  # the rows' contexts once more, max_tokens=1, digest in the engine
        out[kind] = fig
        print_vllm(kind, fig, flush=True)
    return out


def print_vllm(kind: str, fig: dict, flush: bool = False) -> None:
    print(f"  {'side':<24} {'rows':>5} {'tokens':>7} {'wall s':>8} {'tok/s':>8}  load")
    for name in ("bare_all_at_once", "harness_in_flight", "bare_one_at_a_time", "harness_one_at_a_time"):
        r = fig[name]
        print(f"  {name:<24} {r['rows']:>5} {r['decode_tokens']:>7} {r['wall_s']:>8} {r['tokens_per_s']:>8}  "
              f"{r['load'][0]} -> {r['load'][1]}")
    q = fig["ratios"]
    print(f"  {kind}: harness in flight / bare all at once = {q['harness_in_flight_vs_bare_all']:.3f} "
          f"(goal >= {GOAL}); engine all/one = {q['engine_all_vs_one']:.2f}x, "
          f"harness N/1 = {q['harness_n_vs_1']:.2f}x, "
          f"their ratio {q['harness_gain_vs_engine_gain']:.3f} (goal >= {GOAL})", flush=flush)
    if "first_logits_requests_s" in fig:
        print(f"  {kind}: the first-logits requests alone (every context, max_tokens=1, hashed in the engine): "
              f"{fig['first_logits_requests_s']} s", flush=flush)


def bench_transformers(args: argparse.Namespace) -> dict:
    from harness.config.model import load_model
    from harness.config.schema import compose_config, typed

    runs = Path(tempfile.mkdtemp(prefix="kvgraft-inflight-"))
    base = _overrides("gemma3_270m", runs, args.tf_problems, args.tf_max_new_tokens,
                      "determinism.batch_invariant=true", "prompt=answer")
    be = load_model(typed(compose_config(base)))
    print(f"transformers (batch-invariant, fp32): {args.tf_problems} problems x {args.tf_max_new_tokens} tokens, "
          f"run.in_flight={args.tf_in_flight} vs 1 ...", flush=True)
    many = _harness(be, [*base, f"run.in_flight={args.tf_in_flight}"])
    one = _harness(be, [*base, "run.in_flight=1"])

    def key(r):  # noqa: ANN001, ANN202
        return (r.problem_id, r.sample, tuple(r.completion.token_ids), r.completion.first_logits_sha256)

    same = sum(key(a) == key(b) for a, b in zip(many.pop("_rows"), one.pop("_rows"), strict=True))
    fig = {"in_flight": args.tf_in_flight, "harness_in_flight": many, "harness_one_at_a_time": one,
           "identical_rows": same, "rows": many["rows"],
           "speedup": round(many["tokens_per_s"] / one["tokens_per_s"], 3)}
    print(f"  in flight {many['tokens_per_s']} tok/s vs one at a time {one['tokens_per_s']} tok/s: "
          f"{fig['speedup']:.2f}x; rows identical (token ids + first-logits SHA-256): {same}/{many['rows']}")
    return fig


def vllm_half(args: argparse.Namespace) -> dict:
    """The vLLM half: this module again inside .venv-vllm (`--vllm-json`, which runs `bench_vllm` there)."""
    if not VLLM_PYTHON.exists():
        raise SystemExit(f"vllm: {VLLM_PYTHON} does not exist; build it with make setup-vllm")
    part = args.out / "in_flight_vllm.json"
    done = subprocess.run([str(VLLM_PYTHON), "-m", "scripts.bench.in_flight", *sys.argv[1:], "--vllm-json", str(part)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise SystemExit(f"vllm: the in-flight bench exited {done.returncode} (its lines are above)")
    return json.loads(part.read_text())


HALVES = {"vllm": vllm_half, "transformers": bench_transformers}  # --engines: each engine's half of the bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for in_flight.json")
    ap.add_argument("--engines", default="vllm,transformers")
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--sample-problems", type=int, default=5)
    ap.add_argument("--kinds", default="greedy,sample", help="vLLM's decodings to measure (greedy,sample)")
    ap.add_argument("--dtype", default="bfloat16", help="vLLM's dtype (bfloat16 | float32)")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="vLLM's max_num_seqs for both sides")
    ap.add_argument("--tf-problems", type=int, default=40)
    ap.add_argument("--tf-max-new-tokens", type=int, default=32)
    ap.add_argument("--tf-in-flight", type=int, default=8)
    ap.add_argument("--vllm-json", help=argparse.SUPPRESS)  # the vLLM half, run in .venv-vllm by the parent
    args = ap.parse_args()
    if args.vllm_json:
        Path(args.vllm_json).write_text(json.dumps(bench_vllm(args), indent=1))
        return
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in HALVES]
    if unknown:
        raise SystemExit(f"--engines: {unknown} unknown; choose from {sorted(HALVES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"cpu": cpu_line(), "problems": args.problems, "max_new_tokens": args.max_new_tokens,
                    "n": args.n, "sample_problems": args.sample_problems}
    print(f"problems in flight: {result['cpu']}", flush=True)
    t0 = time.perf_counter()
    for engine in engines:
        result[engine] = HALVES[engine](args)
    result["llamacpp"] = "decodes one context at a time: run.in_flight=1 (a larger value is refused in one line)"
    result["runtime_s"] = round(time.perf_counter() - t0, 1)
    out = args.out / "in_flight.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out} ({result['runtime_s']} s)")


if __name__ == "__main__":
    main()
