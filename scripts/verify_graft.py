"""Prove the exactness claim on any backend: a grafted prefix gives byte-identical suffix logits to computing it fresh.

Run from the repository root (`--backend transformers | llamacpp`; vLLM, which decodes inside its engine, has its own
procedure: scripts/verify_vllm.py)::

    python -m scripts.verify_graft --samples 50 --out runs/verify_graft.json       # or: make verify-graft
    python -m scripts.verify_graft --samples 6 --model tiny-gemma3 --out /tmp/vg.json --problems P.jsonl
    python -m scripts.verify_graft --backend llamacpp --samples 50 --out runs/verify_llamacpp.json
    (make verify-llamacpp)

Options: --backend (transformers), --model (transformers: gemma3-270m, a tiny name or a checkpoint folder;
llamacpp: a packaged model name or a GGUF file, also as --gguf), the determinism flags (--dtype,
--attn-implementation, --threads, --prefill-chunk, ...: one per field of kvstore.Determinism; an error that names
one says which flag sets it), llama.cpp's --n-ctx / --n-batch / --no-swa-full, --problems
(problems/kvgraft_original.jsonl), --store DIR (a temporary store, removed afterwards, by default), --seed 0,
--suffix-tokens 16, --min/--max-prefix-tokens (default: scaled to the model's sliding window, from ~W/32 to
~1.75 W, so about a quarter of the prefixes outgrow the window).

A step-wise backend (kvstore.Stepwise: transformers, llama.cpp). For each of N (prefix, suffix) pairs cut from real
problem text (read by the harness's loader; problem + "\\n\\nSolution: " + solution, several problems joined when a
long prefix needs them), the engine's exactness procedure
``kvstore.check_graft(be, prefix, suffix, store, oneshot=True, restore=...)`` runs on the backend
``kvstore.load_backend`` gives:
  (a) fresh reference: ``prefill(prefix)`` in the backend's pinned schedule, then ``forward(suffix)``;
  (b) graft: the deposit put into a LocalStore by this process; the graft half
      (``kvstore.engine.verify.graft_logits``) runs in ONE separate process, the engine's second-process restorer
      (``kvstore.engine.restore_worker.RestoreWorker``, the same backend loaded once there): it gets each artifact
      back by id (``LocalStore.get`` re-hashes every byte), grafts it with ``token_ids=prefix+suffix``, runs
      ``forward(suffix)`` and hands the logits back as a safetensors file; compared with
      ``compare_logits(reference, graft)``;
  (c) one-shot: ``forward(prefix+suffix)`` in one pass on a fresh state, sliced to the suffix positions and
      compared with the reference. A different computation (other GEMM/attention shapes): information only.

With --batch-invariant (determinism.batch_invariant=true; the word `determinism.batch_invariant=true` is accepted
too) every forward is batch-invariant, and the reference becomes (d) the COLD ONE-PASS prefill of the whole prompt:
``forward(prefix+suffix)`` on a fresh cache in this process, the graft in the worker process; each graft must be
SHA-256-equal to it as well as to the split-schedule reference (a), which stays beside it (`batch_invariant_check`).

Writes the JSON report to --out, prints a table and a final verdict line. Exit status 0 when every graft is
SHA-256-equal to its reference, 1 otherwise (or when the worker fails), 2 when the run cannot start or a deposit is
refused (a model kvgraft cannot capture exactly, docs/exactness.md): one line `verify_graft: error: ...`, the full
traceback only with KVGRAFT_DEBUG=1.

OMP_WAIT_POLICY defaults to passive (OpenMP threads sleep instead of spinning between decodes): the wait policy moves
no bits, and with the reference process and the restore worker taking turns on a shared 2-core machine the spinning
side starved the working one (llama.cpp (measured: 1,431 s with the default policy, 668 s with passive,
the same 50 samples, load average 9-13).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch or llama_cpp loads libgomp (module docstring)

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

from rich.progress import (  # noqa: E402
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table  # noqa: E402

from harness.errors import console as terminal_console  # noqa: E402
from harness.experiments.text import DEFAULT_PROBLEMS, build_samples, prefix_lengths, problem_texts  # noqa: E402
from kvstore.determinism import add_arguments, from_arguments  # noqa: E402

BACKENDS = ("transformers", "llamacpp")  # the step-wise backends this procedure runs on (vLLM: verify_vllm.py)


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=BACKENDS, default="transformers", help="the engine (default transformers)")
    p.add_argument("--samples", type=int, default=50, help="number of (prefix, suffix) pairs")
    p.add_argument("--out", type=Path, required=False, help="JSON report path")
    p.add_argument("--model", default=None, help="transformers: gemma3-270m | tiny-gemma3 | tiny-llama | folder; "
                   "llamacpp: a packaged model name or a GGUF file (default gemma3-270m)")
    p.add_argument("--gguf", default=None, help="llamacpp: the same as --model")
    p.add_argument("--problems", type=Path, default=DEFAULT_PROBLEMS, help="jsonl with problem/solution fields")
    p.add_argument("--store", type=Path, default=None, help="artifact store dir (default: temporary, removed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prefix lengths and text choice")
    p.add_argument("--suffix-tokens", type=int, default=16)
    p.add_argument("--min-prefix-tokens", type=int, default=None)
    p.add_argument("--max-prefix-tokens", type=int, default=None)
    add_arguments(p)  # --threads, --dtype, --attn-implementation, --prefill-chunk, ...: kvstore.Determinism's fields
    p.add_argument("--n-ctx", type=int, default=1024, help="llamacpp: the context size")
    p.add_argument("--n-batch", type=int, default=512, help="llamacpp: the prefill schedule (and n_ubatch)")
    p.add_argument("--no-swa-full", action="store_true", help="llamacpp: keep only the window in sliding caches")
    p.add_argument("--phase", choices=("a", "b"), help=argparse.SUPPRESS)  # vllm: one engine of the two
    p.add_argument("--samples-file", help=argparse.SUPPRESS)
    p.add_argument("--logits-out", help=argparse.SUPPRESS)
    p.add_argument("--journal", help=argparse.SUPPRESS)
    argv = list(sys.argv[1:] if argv is None else argv)  # the harness's spelling is accepted too
    argv = ["--batch-invariant" if a.lower() in ("determinism.batch_invariant=true", "batch_invariant=true") else a
            for a in argv]
    args = p.parse_args(argv)
    if args.out is None and args.phase is None:
        p.error("--out is required")
    if args.samples < 1 or args.suffix_tokens < 1:
        p.error("--samples and --suffix-tokens must be >= 1")
    return args


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _g(x: float | None) -> str:
    return "-" if x is None else "0" if x == 0 else f"{x:.2g}"


def flag_settings(args: argparse.Namespace):
    """The settings of `args.backend` the flags give, built by its own Settings class (kvstore.settings_for): the
    model (--model; --gguf too for a GGUF-reading backend), the determinism flags, and the context flags a backend
    that has them takes (llama.cpp's n_ctx, n_batch = n_ubatch, threads, swa_full); a packaged model's file resolved
    once here, so the restore worker loads the same file from the same values."""
    from kvstore import ModelChoice, settings_for

    offered: dict = {"n_ctx": args.n_ctx, "n_batch": args.n_batch, "n_ubatch": args.n_batch,
                     "threads": args.threads or 2, "swa_full": not args.no_swa_full}
    if args.gguf:
        offered["gguf"] = args.gguf
    choice = ModelChoice(source=args.model or "gemma3-270m", determinism=from_arguments(args), offered=offered)
    return settings_for(args.backend, choice).resolved()


def main(argv: list[str] | None = None) -> int:
    return verify_stepwise(parse_args(argv))


def verify_stepwise(args: argparse.Namespace) -> int:
    """check_graft on a step-wise backend, the graft half in the engine's second-process restorer."""
    from kvstore import LocalStore, atomic_write, check_graft, load_backend
    from kvstore.engine.restore_worker import ModelSpec, RestoreWorker
    from kvstore.environment import cpu_name
    from kvstore.errors import RemoteGraftError

    settings = flag_settings(args)
    model = args.gguf or args.model or "gemma3-270m"

    def start_worker() -> RestoreWorker:  # JSON values, for the worker
        return RestoreWorker(ModelSpec.backend(args.backend, **settings.json_keywords()), store.root,
                             log_path=tmp / "worker.log")

    console = terminal_console(width=None if sys.stdout.isatty() else 150)
    err = terminal_console(stderr=True)
    t_start = time.perf_counter()
    texts = problem_texts(args.problems)

    tmp = Path(tempfile.mkdtemp(prefix="verify_graft."))
    store_dir = args.store if args.store is not None else tmp / "store"
    temporary_store = args.store is None
    store = LocalStore(store_dir)
    worker = None
    try:
        err.print(f"loading {model} ({args.backend}) ...")
        # The restoring process loads its own copy of the model alongside this one, except the bundled model on
        # transformers: its first load converts the GGUF into a cache, which one process should do alone.
        if model != "gemma3-270m":
            worker = start_worker()
        be = load_backend(args.backend, **settings.keywords())
        load_s = time.perf_counter() - t_start
        if worker is None:
            worker = start_worker()

        window = be.sliding_window()  # the prefix lengths are scaled to the model's smallest sliding window
        scale = window or 512
        lo = args.min_prefix_tokens or max(4, scale // 32)
        hi = args.max_prefix_tokens or max(60, scale * 7 // 4)
        if not 1 <= lo <= hi:
            raise SystemExit(f"prefix length range [{lo}, {hi}] is empty")
        lengths = prefix_lengths(args.samples, args.seed, lo, hi, window)
        samples = build_samples(be, texts, lengths, args.suffix_tokens, args.seed)

        hello = worker.ready()
        worker.check_model(be.fingerprint)

        per_sample, total_pos, agree_pos, oneshot_agree_pos = [], 0, 0, 0
        layers: list[dict] | None = None
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn())
        # A live bar on a terminal; one plain line per sample when stderr is a file or pipe (rich stays silent).
        with Progress(*columns, console=err, transient=False, disable=not err.is_terminal) as progress:
            task = progress.add_task("samples", total=len(samples))
            for s in samples:
                n, m = len(s.prefix), len(s.suffix)
                progress.update(task, description=f"sample {s.index + 1} (prefix {n} tokens)")
                t0 = time.perf_counter()
                given: list[str] = []

                def restore(aid: str, s=s, given=given):  # (b) the graft half, in the other process
                    given.append(aid)
                    return worker.restore(aid, s.prefix, s.suffix)

                row = {"index": s.index, "prefix_tokens": n, "suffix_tokens": m,
                       "crosses_window": bool(window and n >= window)}
                try:
                    c = check_graft(be, s.prefix, s.suffix, store, oneshot=not args.batch_invariant, restore=restore,
                                    tags=["verify_graft"], extra={"script": "verify_graft", "sample": s.index},
                                    keep_logits=bool(args.batch_invariant))
                    if args.batch_invariant:
                        c, onepass = batch_invariant_check(be, s.prefix, s.suffix, c)
                        row.update(onepass)
                except RemoteGraftError as e:
                    aid = given[0]
                    row.update(artifact_id=aid, artifact_bytes=store.info(aid).size, sources=list(s.source_ids),
                               sha256_reference=None, sha256_graft=None, equal=False, kl=None, max_abs_diff=None,
                               argmax_agreement=0.0, error=str(e), oneshot_sha256=None, oneshot_equal=False,
                               oneshot_max_abs_diff=None, oneshot_kl=None, oneshot_argmax_agreement=None,
                               timing_s={})
                    progress.console.print(f"[red]sample {s.index}: graft failed: {e}")
                else:
                    aid, o, t = c.artifact_id, c.oneshot, c.timing_s
                    row.update(artifact_id=aid, artifact_bytes=store.info(aid).size, sources=list(s.source_ids),
                               sha256_reference=c.sha256_reference, sha256_graft=c.sha256_graft, equal=c.equal,
                               kl=c.kl_max, max_abs_diff=c.max_abs_diff, argmax_agreement=c.argmax_agreement,
                               error=None, oneshot_sha256=o.sha256_b, oneshot_equal=o.sha256_equal,
                               oneshot_max_abs_diff=o.max_abs_diff, oneshot_kl=o.kl_max,
                               oneshot_argmax_agreement=o.argmax_agreement)
                    row["timing_s"] = {"deposit": t["deposit"] + t["put"], "reference": t["reference"],
                                       "oneshot": t["oneshot"], "graft_roundtrip": t["restore"],
                                       **{f"worker_{k}": t[k] for k in ("get", "graft", "forward")}}
                    agree_pos += round(c.argmax_agreement * m)
                    oneshot_agree_pos += round(o.argmax_agreement * m)
                total_pos += m
                per_sample.append(row)
                if layers is None:  # the model's layer layout as its artifacts record it, on every backend
                    layers = [{"kind": x.kind, "window": x.window} for x in store.get(aid).layers]
                if temporary_store:
                    store.remove(aid)
                progress.advance(task)
                if not err.is_terminal:
                    shot = "-" if row["oneshot_max_abs_diff"] is None else f"{row['oneshot_max_abs_diff']:.2g}"
                    err.print(f"sample {s.index + 1}/{len(samples)}: prefix {n} tokens, "
                              f"{'equal' if row['equal'] else 'NOT EQUAL'}, one-shot max |d| {shot}, "
                              f"{time.perf_counter() - t0:.1f} s", highlight=False)
    finally:
        if worker is not None:
            worker.close()

    ok = [r for r in per_sample if r["error"] is None]
    n_equal = sum(r["equal"] for r in per_sample)
    past = [r for r in per_sample if window and r["prefix_tokens"] > window]
    report = {
        "samples": len(per_sample),
        "sha256_equal": n_equal,
        "kl_max": max((r["kl"] for r in ok), default=None) if len(ok) == len(per_sample) else None,
        "argmax_agreement": agree_pos / total_pos,
        "max_abs_diff": max((r["max_abs_diff"] for r in ok), default=None) if len(ok) == len(per_sample) else None,
        "oneshot_max_abs_diff": max((r["oneshot_max_abs_diff"] for r in ok), default=None),
        "oneshot_kl_max": max((r["oneshot_kl"] for r in ok), default=None),
        "oneshot_argmax_agreement": oneshot_agree_pos / total_pos,
        "oneshot_sha256_equal": sum(r["oneshot_equal"] for r in per_sample),
        "graft_errors": len(per_sample) - len(ok),
        "crossing_window": sum(r["crosses_window"] for r in per_sample),
        **(batch_invariant_summary(per_sample, total_pos) if args.batch_invariant else {}),
        "notes": {
            "crosses_window": "prefix_tokens >= the smallest sliding window: those layers' artifact holds only "
                              "the last window-1 positions, plus how many tokens they have seen",
            "argmax_agreement": "fraction over all suffix positions of all samples",
            "oneshot": "one forward over prefix+suffix on a fresh cache vs the reference: a different "
                       "computation, reported for information, not part of the pass/fail",
        },
        "backend": args.backend,
        "model": be.model_name,
        "model_fingerprint": be.fingerprint,
        "tokenizer_fingerprint": be.tokenizer_fingerprint,
        "worker_model_fingerprint": hello["model_fingerprint"],
        "worker_pid": hello["pid"],
        "parent_pid": os.getpid(),
        "determinism": be.settings(),  # the backend's pinned settings (transformers: kvstore.Determinism's)
        "settings": be.settings(),
        "environment": be.environment(),
        "cpu": cpu_name(),
        "layer_layout": layers,  # as the artifacts record it (kind and window per layer)
        "sliding_window": window,
        "past_window": len(past), "past_window_equal": sum(r["equal"] for r in past),
        "argmax_agreement_min": min((r["argmax_agreement"] for r in per_sample), default=None),
        "restore_process": "separate (one worker)",
        "problems": {"path": str(args.problems), "sha256": _sha256_file(args.problems), "rows": len(texts)},
        "seed": args.seed,
        "suffix_tokens": args.suffix_tokens,
        "prefix_tokens": {"min": min(lengths), "max": max(lengths), "mean": sum(lengths) / len(lengths),
                          "range": [lo, hi]},
        "store": None if temporary_store else str(store.root),
        "timing_s": {"total": time.perf_counter() - t_start, "model_load": load_s,
                     "worker_model_load": hello["load_s"]},
        "per_sample": per_sample,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.out, (json.dumps(report, indent=2) + "\n").encode())
    shutil.rmtree(tmp, ignore_errors=True)

    table = Table(title=f"graft vs fresh reference — {be.model_name} ({args.backend}, {be.fingerprint[:12]}), "
                        f"sliding window {window}, worker pid {hello['pid']}")
    for col in ("#", "prefix", "suffix", "> window", "SHA-256 ref", "SHA-256 graft", "equal", "KL", "argmax",
                "one-shot max|d|", "one-shot KL"):
        table.add_column(col, justify="right")
    for r in per_sample:
        table.add_row(str(r["index"]), str(r["prefix_tokens"]), str(r["suffix_tokens"]),
                      "yes" if r["crosses_window"] else "", (r["sha256_reference"] or "-")[:12],
                      (r["sha256_graft"] or "-")[:12], "[green]yes" if r["equal"] else "[red]NO", _g(r["kl"]),
                      f"{r['argmax_agreement']:.3f}", _g(r["oneshot_max_abs_diff"]), _g(r["oneshot_kl"]))
    console.print(table)
    console.print(f"prefix tokens {min(lengths)}..{max(lengths)} (mean {sum(lengths) / len(lengths):.0f}), "
                  f"{report['crossing_window']} of {len(per_sample)} at or beyond the sliding window; "
                  f"total {report['timing_s']['total']:.0f} s; report {args.out}")
    verdict = (f"graft: {n_equal}/{len(per_sample)} SHA-256 equal, KL max {_g(report['kl_max'])}, argmax agreement "
               f"{report['argmax_agreement']:.3f}; one-shot: max |d| {_g(report['oneshot_max_abs_diff'])}, "
               f"KL max {_g(report['oneshot_kl_max'])}, argmax agreement {report['oneshot_argmax_agreement']:.3f}, "
               f"{report['oneshot_sha256_equal']}/{len(per_sample)} SHA-256 equal")
    print(f"{be.model_name}: {n_equal}/{len(per_sample)} SHA-256 equal ("
          + (f"past the {window}-token window: {report['past_window_equal']}/{len(past)}" if window
             else "no sliding window")
          + f"), KL max {report['kl_max']}, argmax min {report['argmax_agreement_min']}; restore in another process; "
          f"{report['timing_s']['total']:.1f} s -> {args.out}", flush=True)
    if args.batch_invariant:
        b = report["batch_invariant"]
        verdict += (f"; batch-invariant: graft vs cold one-pass {b['sha256_equal']}/{len(per_sample)} SHA-256 equal, "
                    f"KL max {_g(b['kl_max'])}, argmax agreement {b['argmax_agreement']:.3f}, "
                    f"{b['equal_past_window']} of them past the window")
    print(verdict, flush=True)
    passed = n_equal == len(per_sample)
    if args.batch_invariant:
        passed = passed and report["batch_invariant"]["sha256_equal"] == len(per_sample)
    return 0 if passed else 1


# ------------------------------------------------------------------------------------ batch-invariant mode
def batch_invariant_check(be, prefix: list[int], suffix: list[int], c):
    """(d) determinism.batch_invariant: the cold one-pass prefill of prefix+suffix on a fresh cache, in this process
    (the graft ran in the worker). Returns the check with its `oneshot` comparison (reference vs one-pass) filled,
    and the row fields of the graft vs the one-pass ("onepass_*")."""
    import dataclasses

    from kvstore.engine.verify import compare_logits, oneshot_logits

    t0 = time.perf_counter()
    cold = oneshot_logits(be, prefix, suffix)
    seconds = time.perf_counter() - t0
    g = compare_logits(cold, c.graft_logits)
    c = dataclasses.replace(c, oneshot=compare_logits(c.reference_logits, cold),
                            timing_s={**c.timing_s, "oneshot": seconds}, reference_logits=None, graft_logits=None)
    return c, {"onepass_sha256": g.sha256_a, "onepass_equal": g.sha256_equal, "onepass_kl": g.kl_max,
               "onepass_max_abs_diff": g.max_abs_diff, "onepass_argmax_agreement": g.argmax_agreement}


def batch_invariant_summary(per_sample: list[dict], total_pos: int) -> dict:
    """The report's `batch_invariant` section: every graft against the cold one-pass prefill of its prompt."""
    ok = [r for r in per_sample if r.get("onepass_sha256") is not None]
    agree = sum(round(r["onepass_argmax_agreement"] * r["suffix_tokens"]) for r in ok)
    return {"batch_invariant": {
        "reference": "the cold one-pass prefill of prefix+suffix on a fresh cache, in the parent process (the graft "
                     "runs in the worker); the split-schedule reference is checked beside it (sha256_equal above)",
        "sha256_equal": sum(bool(r.get("onepass_equal")) for r in per_sample),
        "equal_past_window": sum(bool(r.get("onepass_equal")) and r["crosses_window"] for r in per_sample),
        "kl_max": max((r["onepass_kl"] for r in ok), default=None) if len(ok) == len(per_sample) else None,
        "argmax_agreement": agree / total_pos,
    }}


def _one_line(text: str) -> str:
    lines = [x.strip() for x in str(text).strip().splitlines() if x.strip()]
    return " ".join(lines) if len(lines) <= 3 else lines[0] + " ..."


def run_cli(argv: list[str] | None = None) -> int:
    """main() with the failures a user meets as one line: a kvstore refusal or any other error exits 2, a
    worker that died or disagreed exits 1 ("graft: FAILED"); KVGRAFT_DEBUG=1 adds the traceback."""
    import traceback

    from kvstore import KVStoreError
    from kvstore.errors import RestoreWorkerError

    debug = os.environ.get("KVGRAFT_DEBUG", "") not in ("", "0")
    if not debug:  # transformers' progress bars and notes on fallback kernels are not this script's output
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        return main(argv)
    except RestoreWorkerError as e:  # the second process died or disagreed: say so on the last line
        if debug:
            traceback.print_exc()
        print(f"graft: FAILED — {_one_line(e)}", flush=True)
        return 1
    except KVStoreError as e:
        if debug:
            traceback.print_exc()
        print(f"verify_graft: error: {_one_line(e)}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:
        if debug:
            traceback.print_exc()
        print(f"verify_graft: error: {type(e).__name__}: {_one_line(e)} (run with KVGRAFT_DEBUG=1 for the "
              "traceback)", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(run_cli())
