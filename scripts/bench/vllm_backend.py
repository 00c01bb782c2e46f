"""The vLLM backend against bare vLLM, every ratio from one run (one engine, the bundled model, bf16, 2 threads):

1. decode tokens/s: the harness's decode (harness.run.decode.generate_batch on kvstore's vllm backend) vs bare
   `LLM.generate` on the same prompts and sampling (greedy, and n seeded samples), every budget run out (EOS
   ignored on both sides), interleaved so both sides see the same machine state. The harness's side also makes
   the first request that returns the whole-vocabulary logits (the row's first-logits SHA-256).
2. TTFT at N tokens (default 512, 2,048, 8,192): graft (the artifact read from a store with every byte re-hashed,
   admitted, loaded by the connector, and the suffix computed: one request, max_tokens=1) vs recompute (the same
   prompt from a clean prefix cache); and whether the graft's logits equal vLLM's own split schedule (the prefix
   alone, then the prompt: a prefix-cache hit), SHA-256.

Run inside .venv-vllm:

    .venv-vllm/bin/python -m scripts.bench.vllm_backend --out runs/bench_vllm [--sizes 512,2048,8192] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from kvstore import backend_tools

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [
    "Problem: Let N be the number of positive integers less than 1000 that are divisible by 7. Find N.\nSolution:",
    "Problem: Find the remainder when 2^100 is divided by 13.\nSolution:",
]


def bench_decode(be, new_tokens: int, n: int, strategy: str, repeats: int) -> dict:  # noqa: ANN001
    from vllm import SamplingParams

    from harness.run.decode import Sampling, generate_batch

    alone = backend_tools("vllm").bare  # vLLM alone on the backend's own engine
    ours, bare = [], []
    for _ in range(repeats):
        for text in PROMPTS:
            ids = be.encode(text)
            be.new_state()
            t0 = time.perf_counter()
            gens = generate_batch(be, ids, n, list(range(n)), Sampling(new_tokens, (), strategy, 0.7, 0.95), eos=set())
            ours.append(sum(g.decode_tokens for g in gens) / (time.perf_counter() - t0))
            be.new_state()
            if strategy == "greedy":
                params = [SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)]
            else:
                params = [SamplingParams(max_tokens=new_tokens, temperature=0.7, top_p=0.95, seed=s, ignore_eos=True)
                          for s in range(n)]
            t0 = time.perf_counter()
            outs = alone.generate(be, [ids] * n, params)
            bare.append(sum(len(o.outputs[0].token_ids) for o in outs) / (time.perf_counter() - t0))
    return {"strategy": strategy, "rows": n, "new_tokens": new_tokens, "harness_tokens_per_s": statistics.median(ours),
            "bare_tokens_per_s": statistics.median(bare),
            "ratio": statistics.median(ours) / statistics.median(bare), "repeats": len(ours)}


def bench_ttft(be, store, ids: list[int], suffix: list[int], repeats: int) -> dict:  # noqa: ANN001
    from kvstore import logits_sha256

    alone = backend_tools("vllm").bare  # vLLM alone on the backend's own engine
    prompt = ids + suffix
    aid = str(store.put(be.capture(None, ids)))
    one = {"max_tokens": 1, "temperature": 0.0, "detokenize": False}
    graft, cold = [], []
    for _ in range(repeats):
        be.new_state()
        t0 = time.perf_counter()
        state = be.graft(store.get(aid), prompt)  # every byte re-hashed on read, admitted
        alone.request(be, prompt, state, **one)
        graft.append(time.perf_counter() - t0)
        be.new_state()
        t0 = time.perf_counter()
        alone.request(be, prompt, None, **one)
        cold.append(time.perf_counter() - t0)
    state, _ = be.prefill(ids)
    _, ref = be.prefill(suffix, state)  # vLLM's own split schedule: the prefix alone, then a prefix-cache hit
    _, got = be.prefill(suffix, be.graft(store.get(aid), prompt))
    g, c = statistics.median(graft), statistics.median(cold)
    return {"tokens": len(ids), "grafted_blocks_tokens": len(ids) // alone.block_size(be) * alone.block_size(be),
            "graft_s": g, "recompute_s": c, "speedup": c / g, "repeats": repeats,
            "sha256_equal_to_split_reference": logits_sha256(got) == logits_sha256(ref)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/bench_vllm")
    ap.add_argument("--sizes", default="512,2048,8192")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    import torch
    import vllm

    import kvstore
    from harness.experiments.text import problem_texts
    from kvstore import LocalStore
    from kvstore.environment import cpu_name

    sizes = [int(s) for s in a.sizes.split(",")]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    longest = max(sizes) + 128
    be = kvstore.load_backend("vllm", max_model_len=longest, max_num_batched_tokens=longest, max_num_seqs=a.samples)
    start_s = time.perf_counter() - t0
    out: dict = {"cpu": cpu_name(), "cores": os.cpu_count(), "vllm": vllm.__version__, "torch": torch.__version__,
                 "dtype": be.dtype, "settings": be.settings(), "engine_start_s": start_s, "load_average_start": load0}
    out["decode"] = [bench_decode(be, a.new_tokens, 1, "greedy", a.repeats),
                     bench_decode(be, a.new_tokens, a.samples, "sample", a.repeats)]
    print(json.dumps(out["decode"], indent=1), flush=True)
    text = "\n\n".join(t for _, t in problem_texts(REPO / "problems" / "kvgraft_original.jsonl"))
    body = be.encode("\n\n" + text, add_bos=False)
    stream = be.encode(text)
    while len(stream) < max(sizes):
        stream += body
    suffix = be.encode("\n\nProblem: Find the answer.", add_bos=False)
    store = LocalStore(tempfile.mkdtemp(prefix="bench-vllm-store-"))
    out["ttft"] = []
    for n in sizes:
        out["ttft"].append(bench_ttft(be, store, stream[:n], suffix, a.repeats))
        print(json.dumps(out["ttft"][-1]), flush=True)
    out["load_average_end"] = os.getloadavg()
    path = Path(a.out)
    path.mkdir(parents=True, exist_ok=True)
    (path / "summary.json").write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(f"{path / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
