"""Prove the exactness claim on any backend: a grafted prefix gives byte-identical suffix logits to computing it fresh.

Run from the repository root (one procedure, `--backend transformers | llamacpp | vllm`)::

    python scripts/verify_graft.py --samples 50 --out runs/verify_graft.json       # or: make verify-graft
    python scripts/verify_graft.py --samples 6 --model tiny-gemma3 --out /tmp/vg.json --problems P.jsonl
    python scripts/verify_graft.py --backend llamacpp --samples 50 --out runs/verify_llamacpp.json
    .venv-vllm/bin/python scripts/verify_graft.py --backend vllm --samples 50 --out runs/verify_vllm.json
    (make verify-llamacpp, make verify-vllm)

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

The one branch, vLLM (kvstore.InEngineDecoding: no step-wise forward; run inside .venv-vllm): a prefix grafted by
KvgraftConnector in another engine gives the same next-token logits, byte for byte, as vLLM's own prefix-cache hit
on the same blocks (`verify_in_engine`, below).

With --batch-invariant (determinism.batch_invariant=true; the word `determinism.batch_invariant=true` is accepted
too) every forward is batch-invariant, and the reference becomes (d) the COLD ONE-PASS prefill of the whole prompt:
``forward(prefix+suffix)`` on a fresh cache in this process, the graft in the worker process; each graft must be
SHA-256-equal to it as well as to the split-schedule reference (a), which stays beside it (`batch_invariant_check`).

Writes the JSON report to --out, prints a table and a final verdict line. Exit status 0 when every graft is
SHA-256-equal to its reference, 1 otherwise (or when the worker fails), 2 when the run cannot start or a deposit is
refused (a model kvgraft cannot capture exactly, docs/exactness.md): one line `verify_graft: error: ...`, the full
traceback only with KVGRAFT_DEBUG=1.

OMP_WAIT_POLICY defaults to passive on llama.cpp (its OpenMP threads sleep instead of spinning between decodes): the
wait policy moves no bits, and with the reference process and the restore worker taking turns on a shared 2-core
machine the spinning side starved the working one (measured: 1,431 s with the default policy, 668 s with passive,
the same 50 samples, load average 9-13).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
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

BACKENDS = ("transformers", "llamacpp", "vllm")


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


def backend_settings(args: argparse.Namespace) -> dict:
    """The keywords of `kvstore.load_backend(args.backend, ...)` the flags give (JSON values: the restore worker
    loads the same backend from them)."""
    if args.backend == "llamacpp":
        from kvstore.backends.packaged import gguf_path, known_names

        name = args.gguf or args.model or "gemma3-270m"
        known = name in known_names()
        return {"gguf": str(gguf_path(name)) if known else name, "n_ctx": args.n_ctx, "n_batch": args.n_batch,
                "n_ubatch": args.n_batch, "threads": args.threads or 2, "swa_full": not args.no_swa_full,
                "model_name": f"{name}-gguf" if known else Path(name).stem}
    return {"source": args.model or "gemma3-270m", "determinism": from_arguments(args).to_dict()}


def sliding_window(be) -> int | None:  # noqa: ANN001
    """The window the prefix lengths are scaled to: the smallest sliding window of the model's layers."""
    if hasattr(be, "n_swa"):  # llama.cpp: the positions its sliding cache keeps (the artifact's window - 1)
        return be.n_swa or None
    from kvstore.backends.transformers import smallest_window

    return smallest_window(be.fm.layer_layout)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend == "vllm":  # the one branch: the engine grafts inside itself, no step-wise forward
        return verify_in_engine(args)
    if args.backend == "llamacpp":
        os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before llama_cpp loads libgomp (module docstring)
    return verify_stepwise(args)


def verify_stepwise(args: argparse.Namespace) -> int:
    """check_graft on a step-wise backend, the graft half in the engine's second-process restorer."""
    from kvstore import Determinism, LocalStore, atomic_write, check_graft, load_backend
    from kvstore.backends.transformers.gguf import BUNDLED
    from kvstore.engine.restore_worker import ModelSpec, RestoreWorker
    from kvstore.environment import cpu_name
    from kvstore.errors import RemoteGraftError

    settings = backend_settings(args)  # JSON values, for the worker; the determinism dict made a Determinism here
    local = {**settings, "determinism": Determinism.from_dict(settings["determinism"])} \
        if "determinism" in settings else settings
    model = settings.get("source") or settings.get("model_name")

    def start_worker() -> RestoreWorker:
        return RestoreWorker(ModelSpec.backend(args.backend, **settings), store.root, log_path=tmp / "worker.log")

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
        if settings.get("source") != BUNDLED:
            worker = start_worker()
        be = load_backend(args.backend, **local)
        load_s = time.perf_counter() - t_start
        if worker is None:
            worker = start_worker()

        window = sliding_window(be)
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
        "layer_layout": getattr(getattr(be, "fm", None), "layer_layout", None),  # transformers' layer layout
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
def batch_invariant_check(fm, prefix: list[int], suffix: list[int], c):
    """(d) determinism.batch_invariant: the cold one-pass prefill of prefix+suffix on a fresh cache, in this process
    (the graft ran in the worker). Returns the check with its `oneshot` comparison (reference vs one-pass) filled,
    and the row fields of the graft vs the one-pass ("onepass_*")."""
    import dataclasses

    from kvstore.engine.verify import compare_logits, oneshot_logits

    t0 = time.perf_counter()
    cold = oneshot_logits(fm, prefix, suffix)
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


# ----------------------------------------------------------------------------------------------- vLLM
def _logits(output) -> list[float]:  # noqa: ANN001  (a vllm RequestOutput)
    """The whole-vocabulary raw logits of the first generated position (logprobs=-1, logprobs_mode raw_logits)."""
    table = output.outputs[0].logprobs[0]
    out = [0.0] * len(table)
    for token, lp in table.items():
        out[token] = lp.logprob
    return out


def phase(a: argparse.Namespace) -> int:
    """One vLLM engine (a or b): run the samples, write logits (safetensors) and timings."""
    import torch
    from safetensors.torch import save_file
    from vllm import SamplingParams

    from kvstore.backends.vllm import VllmSettings, start_engine

    samples = json.loads(Path(a.samples_file).read_text())
    role = "kv_producer" if a.phase == "a" else "kv_consumer"  # A never grafts: its cache is its own
    settings = VllmSettings(store=str(a.store), role=role, deposit="marked", journal=a.journal,
                            threads=a.threads or 2, max_logprobs=-1, logprobs_mode="raw_logits",
                            dtype=a.dtype or "bfloat16")
    t0 = time.perf_counter()
    llm = start_engine(settings)
    started = time.perf_counter() - t0
    last = SamplingParams(max_tokens=1, temperature=0.0, logprobs=-1)
    deposit = SamplingParams(max_tokens=1, temperature=0.0,
                             extra_args={"kv_transfer_params": {"kvgraft_deposit": True}})
    logits, seconds = {}, []
    oneshot = {}
    for s in samples:
        if a.phase == "a":  # the one-shot control first (cold cache), then the split schedule from a clean cache
            out = llm.generate([{"prompt_token_ids": s["prefix"] + s["suffix"]}], last, use_tqdm=False)[0]
            oneshot[str(s["index"])] = torch.tensor(_logits(out), dtype=torch.float32)
            llm.reset_prefix_cache()
            llm.generate([{"prompt_token_ids": s["prefix"]}], deposit, use_tqdm=False)
        t = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": s["prefix"] + s["suffix"]}], last, use_tqdm=False)[0]
        seconds.append(time.perf_counter() - t)
        if out.outputs[0].finish_reason == "error":
            print(f"sample {s['index']}: the request failed (see the connector's log line)", file=sys.stderr)
            continue
        logits[str(s["index"])] = torch.tensor(_logits(out), dtype=torch.float32)
    save_file(logits, a.logits_out)
    if oneshot:
        save_file(oneshot, a.logits_out + ".oneshot")
    Path(a.logits_out + ".json").write_text(json.dumps({"engine_start_s": started, "request_s": seconds}))
    return 0


def distinct_samples(enc, texts: list[tuple[str, str]], lengths: list[int], suffix_tokens: int,  # noqa: ANN001
                     seed: int) -> list:
    """harness.experiments.text.build_samples, with each sample's text opened by "Worked example N." so that no two
    samples share a first block. With 40 problems, samples i and i + 40 start at the same problem; sharing
    leading blocks, one sample's P + S would hit another's blocks (B's prefix cache, or a longer artifact in the
    store), computed under another sample's schedule: measured 3 of 50 SHA-256 different that way, each grafting
    or hitting blocks of the wrong sample (the journal showed it), none with its own artifact."""
    from harness.experiments.text import Sample

    rng = random.Random(seed + 1)
    order = list(range(len(texts)))
    rng.shuffle(order)
    samples = []
    for i, length in enumerate(lengths):
        start, parts, ids = order[i % len(order)], [], []
        while len(ids) < length + suffix_tokens:
            parts.append(texts[(start + len(parts)) % len(texts)])
            ids = enc.encode(f"Worked example {i + 1}.\n\n" + "\n\n".join(t for _, t in parts))
        samples.append(Sample(i, ids[:length], ids[length : length + suffix_tokens], tuple(p for p, _ in parts)))
    return samples


def verify_in_engine(a: argparse.Namespace) -> int:
    """The vLLM branch (run inside .venv-vllm): a prefix grafted by KvgraftConnector in another engine gives the same
    next-token logits, byte for byte, as vLLM's own prefix-cache hit on the same blocks.

    Samples: (prefix P, suffix S) pairs cut from real problem text, as for the step-wise backends, prefix lengths
    from one block (128) to ~2.7 x the 512-token window, each opened by "Worked example N." (`distinct_samples`);
    vLLM caches and loads whole blocks only, so what is deposited and grafted is P's first len(P) // 128 * 128
    tokens, and the engine computes the rest of P and S in both halves.
      (a) reference, engine A (its own process, connector role kv_producer: it deposits, never grafts; deposit
          "marked"): P alone with the deposit mark (the connector puts P's whole blocks into the store), then
          P + S, which hits A's own prefix cache on those blocks: the logits of S's last position (vLLM's raw
          logits over the whole vocabulary, float32);
      (b) graft, engine B (another process, a fresh engine, role kv_consumer): P + S; the connector finds the
          artifact by its tokens, re-hashes its bytes, checks it (the one admission: fingerprints, every binding
          setting, layout, environment) and writes it into B's blocks; the same logits.
      (c) information only, in engine A before (a), from a clean cache: P + S in one pass (no cache hit; samples
          that start at the same problem share leading blocks, and those still hit), another computation
          (DESIGN.md: a prefix-cache hit differs from the cold one-shot run).
    Compared with kvstore.engine.verify.compare_logits (SHA-256, KL, argmax). The connector's journal must show one
    graft per sample in B, of the expected token count, else the sample counts as not grafted. Exit status 0 when
    every sample is grafted and SHA-256 equal."""
    if a.phase:
        return phase(a)

    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from harness.experiments.text import DEFAULT_PROBLEMS, prefix_lengths, problem_texts
    from kvstore.backends.vllm import VllmSettings, model_folder
    from kvstore.backends.vllm.connector import journal
    from kvstore.engine.verify import compare_logits
    from kvstore.environment import cpu_name

    tmp = Path(tempfile.mkdtemp(prefix="verify_vllm-"))
    store = str(a.store) if a.store else str(tmp / "store")
    threads, dtype = a.threads or 2, a.dtype or "bfloat16"
    lo, hi = a.min_prefix_tokens or 128, a.max_prefix_tokens or 1400
    folder = model_folder(VllmSettings())
    tok = AutoTokenizer.from_pretrained(folder)

    class Enc:
        def encode(self, text: str) -> list[int]:
            return tok(text)["input_ids"]

    lengths = prefix_lengths(a.samples, a.seed, lo, hi, 512)
    samples = distinct_samples(Enc(), problem_texts(DEFAULT_PROBLEMS), lengths, a.suffix_tokens, a.seed)
    sfile = tmp / "samples.json"
    sfile.write_text(json.dumps([{"index": s.index, "prefix": s.prefix, "suffix": s.suffix} for s in samples]))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = {}
    for ph in ("a", "b"):
        jfile, lfile = str(tmp / f"journal-{ph}.jsonl"), str(tmp / f"logits-{ph}.safetensors")
        cmd = [sys.executable, __file__, "--backend", "vllm", "--phase", ph, "--samples-file", str(sfile),
               "--logits-out", lfile, "--journal", jfile, "--store", store, "--threads", str(threads), "--dtype", dtype]
        t = time.perf_counter()
        rc = subprocess.run(cmd, env=env, cwd=REPO).returncode
        if rc:
            print(f"verify_vllm: error: engine {ph} exited with status {rc}", file=sys.stderr)
            return 2
        runs[ph] = {"logits": load_file(lfile), "oneshot": load_file(lfile + ".oneshot") if ph == "a" else {},
                    "journal": journal(jfile), "wall_s": time.perf_counter() - t,
                    **json.loads(Path(lfile + ".json").read_text())}
    grafts = {e["request"]: e for e in runs["b"]["journal"] if e["event"] == "graft"}
    graft_tokens = sorted(e["tokens"] for e in grafts.values())
    rows, equal, grafted = [], 0, 0
    for s in samples:
        key = str(s.index)
        ref, got = runs["a"]["logits"].get(key), runs["b"]["logits"].get(key)
        want = len(s.prefix) // 128 * 128
        row = {"index": s.index, "prefix_tokens": len(s.prefix), "grafted_tokens": want, "sources": s.source_ids}
        if ref is None or got is None:
            row["error"] = "a request failed"
        else:
            c = compare_logits(ref[None], got[None])
            row.update(sha256_equal=c.sha256_equal, kl=c.kl_max, max_abs_diff=c.max_abs_diff,
                       argmax_agree=c.argmax_agreement == 1.0, sha256=c.sha256_a[:16])
            equal += c.sha256_equal
            one = runs["a"]["oneshot"].get(key)
            if one is not None:  # information: a different computation (no cache hit, other shapes)
                o = compare_logits(ref[None], one[None])
                row.update(oneshot_sha256_equal=o.sha256_equal, oneshot_max_abs_diff=o.max_abs_diff)
        rows.append(row)
    expected = sorted(len(s.prefix) // 128 * 128 for s in samples)
    grafted = sum(1 for t in graft_tokens if t > 0)
    grafts_ok = graft_tokens == expected
    report = {
        "backend": "vllm", "cpu": cpu_name(), "dtype": dtype, "threads": threads, "samples": len(samples),
        "sha256_equal": equal, "grafted": grafted, "grafts_match_expected_tokens": grafts_ok,
        "past_window": sum(1 for s in samples if len(s.prefix) // 128 * 128 > 512),
        "past_window_equal": sum(1 for r in rows if r["grafted_tokens"] > 512 and r.get("sha256_equal")),
        "oneshot_equal": sum(1 for r in rows if r.get("oneshot_sha256_equal")),
        "kl_max": max((r.get("kl", 0.0) for r in rows), default=0.0),
        "argmax_agreement": sum(1 for r in rows if r.get("argmax_agree")) / max(1, len(rows)),
        "engine_start_s": {ph: round(runs[ph]["engine_start_s"], 1) for ph in runs},
        "wall_s": {ph: round(runs[ph]["wall_s"], 1) for ph in runs},
        "rows": rows,
    }
    for r in rows:
        print(f"  #{r['index']:>2} prefix {r['prefix_tokens']:>5}  grafted {r['grafted_tokens']:>5}  "
              f"{'SHA equal' if r.get('sha256_equal') else 'DIFFERENT ' + str(r.get('max_abs_diff', r.get('error')))}")
    how = "as expected" if grafts_ok else f"NOT as expected: {graft_tokens} vs {expected}"
    print(f"verify_vllm: {equal}/{len(samples)} SHA-256 equal ({report['past_window_equal']}/{report['past_window']}"
          f" past the 512 window), {grafted} grafted in another engine ({how}), KL max {report['kl_max']:.3g}, "
          f"argmax {report['argmax_agreement']:.0%} (one-shot P+S on a cold cache, a different computation: "
          f"{report['oneshot_equal']}/{len(samples)} equal); {dtype}, {threads} threads, {report['cpu']}; "
          f"engine start {report['engine_start_s']} s")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(report, indent=1))
    return 0 if equal == len(samples) and grafts_ok else 1


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
