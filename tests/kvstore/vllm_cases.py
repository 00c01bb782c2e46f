"""The vLLM connector cases, run by tests/kvstore/test_backend_vllm.py inside .venv-vllm (one engine for all):

    PYTHONPATH=. .venv-vllm/bin/python tests/kvstore/vllm_cases.py OUT.json

One engine (the bundled model, bf16, KvgraftConnector kv_both, deposit "marked", kv_load_failure_policy "fail")
and one store. Five prompts, each its own token prefix; each is deposited (a marked request), then:
  good       P0 + S on the engine's own prefix cache (the reference), then again after reset_prefix_cache, when
             only the connector can supply P0's blocks (the graft): both logits' SHA-256;
  tampered   P1's artifact file corrupted in the store (one byte of a tensor flipped);
  model      P2's artifact replaced by a copy with another model fingerprint;
  settings   P3's artifact replaced by a copy deposited under batch_invariant=true;
  layout     P4's artifact replaced by a copy whose layer 0 is full attention instead of a 512 window.
For the four, P + S after reset_prefix_cache: the finish reason, the output's kv_transfer_params (the refusal the
connector reports) and the connector's journal lines. Then a second engine with kv_load_failure_policy "recompute"
(graft only) runs the foreign-model prompt again. OUT.json holds
everything the test asserts on.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import json
import sys
import tempfile
from pathlib import Path

TEXTS = [
    (f"Problem {i}: Find the number of ordered pairs of positive integers (a, b) with a * b = {n}. "
     f"Solution: Write {n} as a product of primes and count the divisors; each divisor a fixes b. ") * 6
    for i, n in ((0, 2024), (1, 360), (2, 1001), (3, 4096), (4, 7777))
]


def main(out_path: str) -> int:
    import torch
    from vllm import SamplingParams

    from kvstore.backends.vllm import VllmSettings, journal, start_engine
    from kvstore.format.artifact import LayerKV
    from kvstore.store.local import LocalStore

    tmp = Path(tempfile.mkdtemp(prefix="vllm-cases-"))
    store_dir, jpath = tmp / "store", tmp / "journal.jsonl"
    llm = start_engine(VllmSettings(store=str(store_dir), role="kv_both", deposit="marked", journal=str(jpath),
                                    max_logprobs=-1, logprobs_mode="raw_logits"))
    tok = llm.get_tokenizer()
    prompts = [tok(t)["input_ids"][:200] for t in TEXTS]
    assert len({tuple(p[:128]) for p in prompts}) == len(prompts), "each prompt must have its own first block"
    suffix = tok(" The answer is")["input_ids"][1:]
    mark = SamplingParams(max_tokens=1, temperature=0.0, extra_args={"kv_transfer_params": {"kvgraft_deposit": True}})
    last = SamplingParams(max_tokens=1, temperature=0.0, logprobs=-1)

    told: dict = {}

    def logits_sha(ids: list[int]) -> tuple[str | None, str]:
        out = llm.generate([{"prompt_token_ids": ids}], last, use_tqdm=False)[0]
        reason = str(out.outputs[0].finish_reason)
        told["last"] = out.kv_transfer_params  # what the connector reports in the request's output
        if reason == "error":
            return None, reason
        table = out.outputs[0].logprobs[0]
        vec = torch.empty(len(table), dtype=torch.float32)
        for t, lp in table.items():
            vec[t] = lp.logprob
        return hashlib.sha256(vec.numpy().tobytes()).hexdigest(), reason

    for p in prompts:
        llm.generate([{"prompt_token_ids": p}], mark, use_tqdm=False)
    deposits = [e for e in journal(jpath) if e["event"] == "deposit"]
    store = LocalStore(store_dir)
    result: dict = {"deposits": deposits, "cases": {}}

    ref, _ = logits_sha(prompts[0] + suffix)  # P0's blocks from the engine's own prefix cache
    aids = [e["artifact"] for e in deposits]

    # the foreign copies (each replaces its prompt's good artifact, so it is the only candidate)
    def replace(i: int, change) -> None:  # noqa: ANN001
        snap = store.get(aids[i])
        store.remove(aids[i])
        store.put(change(snap))

    replace(2, lambda s: dataclasses.replace(s, model_fingerprint=hashlib.sha256(b"another model").hexdigest()))
    replace(3, lambda s: dataclasses.replace(s, determinism={**s.determinism, "batch_invariant": True}))
    replace(4, lambda s: dataclasses.replace(s, layers=[LayerKV("full", None, s.layers[0].cumulative_length,
                                                                s.layers[0].keys, s.layers[0].values),
                                                        *s.layers[1:]]))
    path = store.path(aids[1])  # tampered: one byte of a tensor flipped in place, the id unchanged
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))

    llm.reset_prefix_cache()
    before = len(journal(jpath))
    graft, reason = logits_sha(prompts[0] + suffix)
    result["cases"]["good"] = {"reference": ref, "graft": graft, "finish": reason,
                               "events": journal(jpath)[before:], "told": told["last"]}
    for i, name in ((1, "tampered"), (2, "model"), (3, "settings"), (4, "layout")):
        llm.reset_prefix_cache()
        before = len(journal(jpath))
        sha, reason = logits_sha(prompts[i] + suffix)
        result["cases"][name] = {"sha": sha, "finish": reason, "events": journal(jpath)[before:],
                                 "told": told["last"]}

    # a second engine, kv_load_failure_policy "recompute": the foreign-model prompt is refused and computed
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    llm = start_engine(VllmSettings(store=str(store_dir), role="kv_consumer", on_refused="recompute",
                                    journal=str(jpath), max_logprobs=-1, logprobs_mode="raw_logits"))
    before = len(journal(jpath))
    sha, reason = logits_sha(prompts[2] + suffix)
    result["cases"]["recompute"] = {"sha": sha, "finish": reason, "events": journal(jpath)[before:],
                                    "told": told["last"]}
    Path(out_path).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
