"""Exactness on vLLM (`make verify-vllm`; run inside .venv-vllm): a prefix grafted by KvgraftConnector in another
engine gives the same next-token logits, byte for byte, as vLLM's own prefix-cache hit on the same blocks.

    .venv-vllm/bin/python -m scripts.verify_vllm --samples 50 --out runs/verify_vllm.json

The step-wise backends' procedure (transformers, llama.cpp: the engine's check_graft with the graft in a second
process) is scripts/verify_graft.py; vLLM decodes inside its engine (kvstore.InEngineDecoding: no step-wise
forward), so its graft is checked through two engines, each in its own process (`main`, below). Options: --samples,
--seed 0, --suffix-tokens 16, --min/--max-prefix-tokens (128 and 1400 by default), --threads 2, --dtype bfloat16,
--store DIR (a temporary store by default), --out. Exit status 0 when every sample is grafted and SHA-256 equal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=int, default=50, help="number of (prefix, suffix) pairs")
    p.add_argument("--out", type=Path, required=False, help="JSON report path")
    p.add_argument("--store", type=Path, default=None, help="artifact store dir (default: temporary)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prefix lengths and text choice")
    p.add_argument("--suffix-tokens", type=int, default=16)
    p.add_argument("--min-prefix-tokens", type=int, default=None)
    p.add_argument("--max-prefix-tokens", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="the engine's CPU threads (default 2)")
    p.add_argument("--dtype", default=None, help="the engine's dtype (default bfloat16)")
    p.add_argument("--phase", choices=("a", "b"), help=argparse.SUPPRESS)  # one engine of the two
    p.add_argument("--samples-file", help=argparse.SUPPRESS)
    p.add_argument("--logits-out", help=argparse.SUPPRESS)
    p.add_argument("--journal", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.out is None and args.phase is None:
        p.error("--out is required")
    if args.samples < 1 or args.suffix_tokens < 1:
        p.error("--samples and --suffix-tokens must be >= 1")
    return args


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

    from kvstore import backend_tools

    samples = json.loads(Path(a.samples_file).read_text())
    role = "kv_producer" if a.phase == "a" else "kv_consumer"  # A never grafts: its cache is its own
    engine = backend_tools("vllm")  # the engine's own launcher and settings
    settings = engine.VllmSettings(store=str(a.store), role=role, deposit="marked", journal=a.journal,
                                   threads=a.threads or 2, max_logprobs=-1, logprobs_mode="raw_logits",
                                   dtype=a.dtype or "bfloat16")
    t0 = time.perf_counter()
    llm = engine.start_engine(settings)
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


def main(argv: list[str] | None = None) -> int:
    """The procedure (run inside .venv-vllm): a prefix grafted by KvgraftConnector in another engine gives the same
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
    a = parse_args(argv)
    if a.phase:
        return phase(a)

    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from harness.experiments.text import DEFAULT_PROBLEMS, prefix_lengths, problem_texts
    from kvstore import backend_tools
    from kvstore.engine.verify import compare_logits
    from kvstore.environment import cpu_name

    tmp = Path(tempfile.mkdtemp(prefix="verify_vllm-"))
    store = str(a.store) if a.store else str(tmp / "store")
    threads, dtype = a.threads or 2, a.dtype or "bfloat16"
    lo, hi = a.min_prefix_tokens or 128, a.max_prefix_tokens or 1400
    engine = backend_tools("vllm")  # the engine's own launcher, settings and connector journal
    folder = engine.model_folder(engine.VllmSettings())
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
        cmd = [sys.executable, "-m", "scripts.verify_vllm", "--phase", ph, "--samples-file", str(sfile),
               "--logits-out", lfile, "--journal", jfile, "--store", store, "--threads", str(threads), "--dtype", dtype]
        t = time.perf_counter()
        rc = subprocess.run(cmd, env=env, cwd=REPO).returncode
        if rc:
            print(f"verify_vllm: error: engine {ph} exited with status {rc}", file=sys.stderr)
            return 2
        runs[ph] = {"logits": load_file(lfile), "oneshot": load_file(lfile + ".oneshot") if ph == "a" else {},
                    "journal": engine.journal(jfile), "wall_s": time.perf_counter() - t,
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


if __name__ == "__main__":
    sys.exit(main())
