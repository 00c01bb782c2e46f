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
(graft only) runs the foreign-model prompt again. OUT.json holds everything the test asserts on. Before the second
engine, the faults of issue 41 finding 5 (a journal path that cannot be written, a store index that fails while the
engine runs): every request's finish reason after each.
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

    # issue 41, finding 5: a journal that cannot be written, then a store index that fails under the running
    # engine (the scheduler's SQLite lookup; as root a chmod would not stop it: the index file becomes a folder):
    # each costs at most its request, never the engine. Restored afterwards for the second engine.
    def alive(ids: list[int], params) -> str:  # noqa: ANN001
        try:
            return str(llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)[0].outputs[0].finish_reason)
        except Exception as e:  # noqa: BLE001 - EngineDeadError at a1b00c4
            return f"raised {type(e).__name__}"

    others = [tok(f"Question {i}: how many primes lie below {n}? Count them one by one. " * 8)["input_ids"][:200]
              for i, n in ((5, 97), (6, 211), (7, 503))]
    saved = jpath.read_bytes()
    jpath.unlink()
    jpath.mkdir()  # every journal write now fails (IsADirectoryError)
    faults = {"journal_deposit": alive(others[0], mark), "journal_next": alive(prompts[0] + suffix, last)}
    jpath.rmdir()
    jpath.write_bytes(saved)
    index = store_dir / "index.sqlite"
    aside = store_dir / "index-aside"
    aside.mkdir()
    for f in store_dir.glob("index.sqlite*"):
        f.rename(aside / f.name)
    index.mkdir()  # every index lookup now fails (IndexDatabaseError)
    before = len(journal(jpath))
    faults["store_lookup"] = alive(others[1] + suffix, last)
    faults["store_deposit"] = alive(others[2], mark)
    faults["store_events"] = journal(jpath)[before:]
    index.rmdir()
    for f in aside.iterdir():
        f.rename(store_dir / f.name)
    aside.rmdir()
    faults["after"] = alive(prompts[0] + suffix, last)
    result["faults"] = faults

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
