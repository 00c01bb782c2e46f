"""TTFT through `vllm serve`: a graft vs computing the prompt, and the graft vs the plain server it must equal, in one
run, with the openai client (docs/vllm.md, "vllm serve").

Two servers of `python -m kvstore.backends.vllm.serve` (the bundled model, bf16, 2 threads; VLLM_SERVER_DEV_MODE=1
for POST /reset_prefix_cache), one after the other:

  reference  `--reference`: no connector, the hybrid KV cache manager off. P alone, then P + S (a prefix-cache hit:
             16 tokens with their logprobs and top-5, the reference), then TTFT of Q + S from a clean prefix cache.
  kvgraft    the connector, a new store. P deposited (a marked request), the prefix cache reset, P + S grafted (16
             tokens, compared with the reference), then TTFT of P + S grafted and of Q + S computed, each from a clean
             prefix cache, interleaved.

P and Q are ~2,000-token prompts with different first blocks (nothing of Q is in the store); S a short suffix. TTFT
is the time to the first streamed chunk of a max_tokens=1 request, client side.

    .venv-vllm/bin/python -m scripts.bench.vllm_serve --out runs/bench_serve [--tokens 2000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

MODEL = "gemma3-270m"
S = " Therefore the answer is"


def text_of(about: str, tokens: int) -> str:
    unit = (f"{about}: a careful proof checks every case, writes each step, and verifies the final count twice "
            "before stating it. ")
    return unit * max(1, tokens // 22)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reset(url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url.removesuffix("/v1") + "/reset_prefix_cache",
                                                       method="POST"), timeout=60) as r:
        assert r.status == 200, r.status


def ttft(client, prompt: str) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    for _ in client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0.0, stream=True):
        return time.perf_counter() - t0
    raise RuntimeError("no chunk streamed")


def sixteen(client, prompt: str, **extra) -> dict:  # noqa: ANN001
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0.0, logprobs=5,
                                  extra_body={"return_tokens_as_token_ids": True, **extra})
    lp = r.choices[0].logprobs
    return {"tokens": lp.tokens, "logprobs": lp.token_logprobs, "top": lp.top_logprobs,
            "prompt_tokens": r.usage.prompt_tokens,
            "kv_transfer_params": (r.model_extra or {}).get("kv_transfer_params")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/bench_serve")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()
    from openai import OpenAI

    from kvstore import backend_tools

    Server = backend_tools("vllm").Server  # the vLLM server with kvgraft's connector

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    p, q = text_of("Lemma A", a.tokens), text_of("Claim B", a.tokens)
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    t_run = time.monotonic()
    res: dict = {"tokens_asked": a.tokens, "load_start": os.getloadavg()[0]}
    with Server(["--port", str(free_port()), "--reference"], out / "reference.log", env=env) as ref_server:
        res["start_reference_s"] = ref_server.started_s
        c = OpenAI(base_url=ref_server.url, api_key="none", max_retries=0, timeout=600)
        c.completions.create(model=MODEL, prompt=p, max_tokens=1, temperature=0.0)  # P alone: its blocks cached
        res["reference"] = sixteen(c, p + S)  # the prefix-cache hit
        reset(ref_server.url)
        res["reference_compute_ttft_s"] = ttft(c, q + S)
    store, journal = tmp / "store", tmp / "journal.jsonl"
    with Server(["--port", str(free_port()), "--store", str(store), "--new-store", "--journal", str(journal)],
                out / "kvgraft.log", env=env) as server:
        res["start_kvgraft_s"] = server.started_s
        c = OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=600)
        t0 = time.perf_counter()
        c.completions.create(model=MODEL, prompt=p, max_tokens=1, temperature=0.0,
                             extra_body={"kv_transfer_params": {"kvgraft_deposit": True}})
        res["deposit_request_s"] = time.perf_counter() - t0
        reset(server.url)
        res["graft"] = sixteen(c, p + S)
        graft_ttft, compute_ttft = [], []
        for _ in range(a.repeats):
            reset(server.url)
            graft_ttft.append(ttft(c, p + S))
            reset(server.url)
            compute_ttft.append(ttft(c, q + S))
        res.update(graft_ttft_s=graft_ttft, compute_ttft_s=compute_ttft)
    res["journal"] = [json.loads(line) for line in journal.read_text().splitlines()]
    ref, graft = res["reference"], res["graft"]
    res["graft_equals_reference"] = {k: graft[k] == ref[k] for k in ("tokens", "logprobs", "top")}
    g, comp = statistics.median(graft_ttft), statistics.median(compute_ttft)
    res.update(graft_ttft_median_s=g, compute_ttft_median_s=comp, speedup=comp / g, run_s=time.monotonic() - t_run,
               load_end=os.getloadavg()[0])
    (out / "summary.json").write_text(json.dumps(res, indent=1))
    grafted = [e for e in res["journal"] if e["event"] == "graft"]
    print(f"prompt {graft['prompt_tokens']} tokens; grafted {grafted[0]['tokens'] if grafted else 0} "
          f"({len(grafted)} grafts); graft = plain reference server: {res['graft_equals_reference']}")
    print(f"TTFT graft {[round(x, 3) for x in graft_ttft]} s, compute {[round(x, 3) for x in compute_ttft]} s "
          f"(reference server {res['reference_compute_ttft_s']:.3f} s): {comp / g:.1f}x; server starts "
          f"{res['start_reference_s']:.0f} s / {res['start_kvgraft_s']:.0f} s; run {res['run_s']:.0f} s; load "
          f"{res['load_start']:.1f} -> {res['load_end']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
