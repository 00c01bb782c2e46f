"""The llama.cpp backend against bare llama-cpp-python, every ratio from one run (same GGUF, same settings):

1. greedy decode tokens/s: harness.run.decode.generate on the llamacpp backend vs bare llama-cpp-python
   (`Llama.generate` at temperature 0 on its own context); the tokens must agree.
2. TTFT at N tokens (default 512, 2,048, 8,192): graft (store.get with every byte verified + graft + one
   forward) vs recompute (prefill N in the n_batch schedule + the same forward); logits compared.
3. restore: verified (store.get with every byte re-hashed + graft: admission checks, the state rebuilt in
   the restore layout, llama_state_seq_set_data) vs llama.cpp's own unverified `llama_state_seq_set_data` of
   the state bytes it wrote (already in memory) and `llama_state_seq_load_file` of the same tokens; and
   whether llama.cpp's own restore gives the fresh logits (past the sliding window it restores the window's
   cells from cell 0, another layout than a fresh prefill's: see kvstore/backends/llamacpp/state.py).

    python -m scripts.bench.llamacpp --out runs/bench_llamacpp [--sizes 512,2048,8192] [--new-tokens 64]

OMP_WAIT_POLICY defaults to passive (set it to active to measure the default): on the shared 2-core machine
llama.cpp's and torch's OpenMP threads spinning between tokens made the harness 0.65-0.95x bare; passive:
22.23 vs 22.22 tokens/s (1.00x). Both sides of every ratio run under the same policy; it is recorded.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before llama_cpp / torch load libgomp

import argparse
import ctypes
import json
import statistics
import tempfile
import time
from pathlib import Path

from kvstore import Backend, LocalStore, backend_tools, compare_logits, load_backend
from kvstore.environment import cpu_name

PROMPT = "Problem: Let N be the number of positive integers less than 1000 that are divisible by 7. Find N.\n"


def bench_decode(be: Backend, new_tokens: int, repeats: int) -> dict:
    from harness.run.decode import generate

    alone = backend_tools("llamacpp").bare  # llama.cpp alone on the backend's own context
    ids = be.encode(PROMPT)
    ours, bare, toks_ours, toks_bare = [], [], None, None
    for _ in range(repeats):  # interleaved: the two sides see the same machine state
        t0 = time.perf_counter()
        g = generate(be, ids, max_new_tokens=new_tokens, eos=set())
        ours.append(len(g.token_ids) / (time.perf_counter() - t0))
        toks_ours = g.token_ids
        alone.reset(be)
        be.new_state()
        t0 = time.perf_counter()
        out = alone.greedy(be, ids, new_tokens)
        bare.append(len(out) / (time.perf_counter() - t0))
        toks_bare = out
        be.new_state()
    o, b = statistics.median(ours), statistics.median(bare)
    return {"harness_tokens_per_s": round(o, 2), "bare_tokens_per_s": round(b, 2), "ratio": round(o / b, 3),
            "same_tokens": toks_ours == toks_bare, "new_tokens": new_tokens, "repeats": repeats,
            "prompt_tokens": len(ids), "note": "each side prefills the prompt; tokens/s over prefill + decode"}


def bench_ttft(be: Backend, sizes: list[int], repeats: int, root: Path) -> list[dict]:
    alone = backend_tools("llamacpp").bare  # llama.cpp alone on the backend's own context
    store = LocalStore(root / "store")
    base = be.encode(PROMPT * 2000)
    rows = []
    for n in sizes:
        prefix, suffix = base[:n], be.encode(" So", add_bos=False)
        state, _ = be.prefill(prefix)
        aid = store.put(be.capture(state, prefix))
        blob = alone.state_bytes(be)
        state_file = root / f"state-{n}.bin"
        if not alone.save_file(be, state_file, prefix):
            raise SystemExit(f"llama_state_seq_save_file failed at {n} tokens")
        graft_s, recompute_s, verified_s, get_s, raw_s, file_s = [], [], [], [], [], []
        same, own_same = True, True
        for _ in range(repeats):
            t0 = time.perf_counter()
            st, _ = be.prefill(prefix)
            ref = be.forward(suffix, st)
            recompute_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            snap = store.get(aid)
            tg = time.perf_counter()
            st = be.graft(snap, prefix + suffix)
            t1 = time.perf_counter()
            get_s.append(tg - t0)
            got = be.forward(suffix, st)
            graft_s.append(time.perf_counter() - t0)
            verified_s.append(t1 - t0)
            same = same and compare_logits(ref, got).sha256_equal
            be.new_state()
            buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
            t0 = time.perf_counter()
            alone.set_data(be, buf, len(blob))
            raw_s.append(time.perf_counter() - t0)
            own = alone.restored_state(be, prefix)  # llama.cpp's own restore, then the same forward: fresh logits?
            own_same = own_same and compare_logits(ref, be.forward(suffix, own)).sha256_equal
            be.new_state()
            t0 = time.perf_counter()
            ok = alone.load_file(be, state_file, n)
            file_s.append(time.perf_counter() - t0)
            if not ok:
                raise SystemExit(f"llama_state_seq_load_file failed at {n} tokens")
            be.new_state()
        med = statistics.median
        rows.append({
            "tokens": n, "artifact_mb": round(store.info(aid).size / 1e6, 2), "state_mb": round(len(blob) / 1e6, 2),
            "graft_ttft_s": round(med(graft_s), 4), "recompute_ttft_s": round(med(recompute_s), 4),
            "speedup": round(med(recompute_s) / med(graft_s), 1), "logits_identical": same,
            "verified_restore_s": round(med(verified_s), 4), "store_get_s": round(med(get_s), 4),
            "graft_s": round(med(verified_s) - med(get_s), 4), "llama_set_data_s": round(med(raw_s), 4),
            "llama_own_restore_logits_identical": own_same,
            "llama_load_file_s": round(med(file_s), 4),
            "verified_vs_set_data": round(med(raw_s) / med(verified_s), 3),
            "verified_vs_load_file": round(med(file_s) / med(verified_s), 3),
        })
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="runs/bench_llamacpp")
    ap.add_argument("--sizes", default="512,2048,8192")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",") if x]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    be = load_backend("llamacpp", n_ctx=max(sizes) + 64, threads=a.threads)
    load0 = os.getloadavg()
    print(f"cpu {cpu_name()}, load average {load0}", flush=True)
    t0 = time.perf_counter()
    decode = bench_decode(be, a.new_tokens, a.repeats)
    print(json.dumps(decode), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        ttft = bench_ttft(be, sizes, a.repeats, Path(tmp))
    summary = {"cpu": cpu_name(), "settings": be.settings(), "decode": decode, "ttft_restore": ttft,
               "wall_s": round(time.perf_counter() - t0, 1), "load_average": {"start": load0, "end": os.getloadavg()},
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY")}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'summary.json'}")
    be.close()


if __name__ == "__main__":
    main()
