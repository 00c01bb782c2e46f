"""The exactness claim on the llama.cpp backend: `kvstore.check_graft` with the graft half in another process.

    python scripts/verify_llamacpp.py --samples 50 --out runs/verify_llamacpp.json
    python scripts/verify_llamacpp.py --gguf qwen2.5-coder-1.5b-instruct --out runs/verify_llamacpp_1.5b.json

--gguf: a packaged model name (kvstore.backends.packaged: gemma3-270m, the default, or qwen2.5-coder-1.5b-instruct after
`make setup-models`) or a GGUF file path.

The same samples as scripts/verify_graft.py (its `prefix_lengths` / `build_samples`: real problem text, prefix
lengths from ~16 to ~1.75 x the 512-token window, window-1/window/window+1 included), on the bundled GGUF:
  (a) fresh reference: the backend's prefill of the prefix (chunks of n_batch), then the suffix;
  (b) graft: the deposit is put into a LocalStore here; ONE worker process (this script, --worker; llama.cpp
      loaded once) gets each artifact by id (every byte re-hashed), grafts it with token_ids=prefix+suffix,
      runs the suffix and writes its logits as safetensors; compared with compare_logits(reference, graft).
Exit status 0 when every graft's logits have the reference's SHA-256.

OMP_WAIT_POLICY defaults to passive here (llama.cpp's OpenMP threads sleep instead of spinning between
decodes): the wait policy moves no bits, and with the reference process and the restore worker taking turns
on a shared 2-core machine the spinning side starved the working one (measured: 1,431 s with the default
policy, 668 s with passive, same 50 samples, load average 9-13; the worker's suffix forwards 177 s -> 27 s).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before llama_cpp loads libgomp (see the docstring)

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file, save_file
from verify_graft import build_samples, prefix_lengths

from harness.experiments.text import DEFAULT_PROBLEMS, problem_texts
from kvstore import LocalStore, check_graft
from kvstore.backends.llamacpp.backend import LlamaCppBackend
from kvstore.backends.llamacpp.settings import LlamaCppSettings
from kvstore.backends.packaged import gguf_path, known_names
from kvstore.engine.verify import Restored, graft_logits


def _settings(a: argparse.Namespace) -> LlamaCppSettings:
    known = a.gguf in known_names()
    return LlamaCppSettings(gguf=str(gguf_path(a.gguf)) if known else a.gguf, n_ctx=a.n_ctx, n_batch=a.n_batch,
                            n_ubatch=a.n_batch, threads=a.threads, swa_full=not a.no_swa_full,
                            model_name=f"{a.gguf}-gguf" if known else Path(a.gguf).stem)


def worker(a: argparse.Namespace) -> int:
    """Read `aid prefix suffix out` requests (JSON lines) from stdin, answer "done" per request."""
    be = LlamaCppBackend(_settings(a))
    store = LocalStore(a.store)
    print("ready", flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        r = graft_logits(be, req["prefix"], req["suffix"], store=store, artifact_id=req["aid"])
        save_file({"logits": r.logits.contiguous()}, req["out"])
        print(json.dumps({"done": req["aid"], "timing_s": r.timing_s}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--gguf", default="gemma3-270m", help=f"a GGUF file or one of {known_names()}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--suffix-tokens", type=int, default=16)
    ap.add_argument("--min-prefix-tokens", type=int, default=16)
    ap.add_argument("--max-prefix-tokens", type=int, default=896)
    ap.add_argument("--n-ctx", type=int, default=1024)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-swa-full", action="store_true")
    ap.add_argument("--problems", type=Path, default=DEFAULT_PROBLEMS)
    ap.add_argument("--out", type=Path, default=Path("runs/verify_llamacpp.json"))
    ap.add_argument("--store", default="")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker(a)
    t_start = time.perf_counter()
    be = LlamaCppBackend(_settings(a))
    lengths = prefix_lengths(a.samples, a.seed, a.min_prefix_tokens, a.max_prefix_tokens, be.n_swa)
    samples = build_samples(be, problem_texts(a.problems), lengths, a.suffix_tokens, a.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store_root = a.store or f"{tmp}/store"
        store = LocalStore(store_root)
        cmd = [sys.executable, __file__, "--worker", "--gguf", a.gguf, "--store", store_root, "--n-ctx", str(a.n_ctx),
               "--n-batch", str(a.n_batch), "--threads", str(a.threads)] + (["--no-swa-full"] if a.no_swa_full else [])
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("the restore worker did not start")

        def restore_in_worker(aid: str, s) -> Restored:
            out = f"{tmp}/{aid}.safetensors"
            proc.stdin.write(json.dumps({"aid": aid, "prefix": s.prefix, "suffix": s.suffix, "out": out}) + "\n")
            proc.stdin.flush()
            reply = json.loads(proc.stdout.readline())
            return Restored(load_file(out)["logits"], {f"worker_{k}": v for k, v in reply["timing_s"].items()})

        for s in samples:
            c = check_graft(be, s.prefix, s.suffix, store=store, restore=lambda aid, s=s: restore_in_worker(aid, s))
            rows.append({"sample": s.index, **c.to_dict()})
            print(f"sample {s.index:2d}: prefix {len(s.prefix):4d} tokens  equal={c.equal}  kl={c.kl_max:.3g}  "
                  f"argmax={c.argmax_agreement:.3f}", flush=True)
        proc.stdin.close()
        proc.wait(timeout=60)
    equal = sum(r["equal"] for r in rows)
    past = [r for r in rows if be.n_swa and r["prefix_tokens"] > be.n_swa]
    summary = {
        "backend": "llamacpp", "model": be.model_name, "gguf_sha256": be.fingerprint, "settings": be.settings(),
        "samples": len(rows), "sha256_equal": equal,
        "kl_max": max(r["graft"]["kl_max"] for r in rows),
        "argmax_agreement_min": min(r["graft"]["argmax_agreement"] for r in rows),
        "past_window": len(past), "past_window_equal": sum(r["equal"] for r in past),
        "cpu": be.environment().get("cpu_model"),
        "restore_process": "separate (one worker)", "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "wall_s": round(time.perf_counter() - t_start, 1), "rows": rows,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(summary, indent=2) + "\n")
    window = (f"past the {be.n_swa}-token window: {summary['past_window_equal']}/{len(past)}" if be.n_swa
              else "no sliding window")
    print(f"{be.model_name}: {equal}/{len(rows)} SHA-256 equal ({window}), KL max {summary['kl_max']}, "
          f"argmax min {summary['argmax_agreement_min']}; "
          f"restore in another process; {summary['wall_s']} s -> {a.out}")
    return 0 if equal == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
