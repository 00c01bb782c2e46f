"""The registered vLLM backend's cases, run by tests/kvstore/test_backend_vllm.py inside .venv-vllm (one engine):

    PYTHONPATH=. .venv-vllm/bin/python tests/kvstore/vllm_backend_cases.py OUT.json

`kvstore.load_backend("vllm")` (the bundled model, bf16, 2 threads, its connector in graft="marked" mode), then on an
entry of 200 tokens (one whole block and a partial one) and a short query:
  capture    the entry's artifact (all 200 tokens, as a library entry records them);
  twins      the harness's decode (harness.run.decode.generate_batch) of entry + query after a graft of the
             artifact, and after the entry prefilled alone (the in-context twin), greedy and 2 seeded samples;
  cold       the same prompt from a clean cache (another schedule: information only);
  foreign    the artifact with another model fingerprint offered to graft;
  refusal    `graft_refusal` for entries of 200, 552 and 640 tokens, and a real 552-token artifact offered to graft
             (more than the 511 positions a sliding layer keeps, not on a 128-token block: refused, same words);
  in_flight  two grafts of different artifacts and a cold prompt submitted together (harness.run.decode.
             generate_many: InEngineBatches.continue_many, problems in flight), beside each decoded alone;
  overflow   `context_size()` (the engine's max_model_len) and the harness's run.context_overflow=refuse on a
             prompt that does not fit beside decoding.max_new_tokens (harness.run.loop.fit_context).
OUT.json holds everything the test asserts on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

ENTRY = ("Problem: Find the number of ordered pairs of positive integers (a, b) with a * b = 2024. Solution: Write "
         "2024 = 2^3 * 11 * 23; every divisor a of 2024 fixes b, so the count is the number of divisors. ") * 8
QUERY = "Problem: How many divisors does 2024 have? Solution:"
ENTRY_B = ("Problem: Find the last two digits of 7^2024. Solution: The powers of 7 modulo 100 repeat with period 4: "
           "7, 49, 43, 1; since 2024 is a multiple of 4, 7^2024 ends in 01. ") * 8
QUERY_B = "Problem: What are the last two digits of 7^4? Solution:"


def main(out_path: str) -> int:
    import vllm

    import kvstore
    from harness.run.decode import Sampling, generate_batch
    from kvstore.backends.vllm import journal

    be = kvstore.load_backend("vllm", max_num_seqs=4)
    entry = be.encode(ENTRY)[:200]
    context = entry + be.encode(QUERY, add_bos=False)
    snap = be.capture(None, entry)
    result: dict = {
        "version": vllm.__version__, "is_backend": isinstance(be, kvstore.Backend), "settings": be.settings(),
        "entry": len(entry), "artifact_tokens": snap.token_count,
        "held": [lyr.keys.shape[2] for lyr in snap.layers], "kinds": [lyr.kind for lyr in snap.layers],
    }

    def rows(state_of, n: int, strategy: str) -> dict:
        before = len(journal(be.journal))
        gens = generate_batch(be, context, n, list(range(n)), Sampling(8, ("\n\n",), strategy, 0.8, 0.95),
                              cache=state_of())
        events = [e for e in journal(be.journal)[before:] if e["event"] != "deposit"]
        return {"rows": [dataclasses.asdict(g) | {"ttft_s": None} for g in gens], "events": events}

    for strategy, n in (("greedy", 1), ("sample", 2)):
        result[strategy] = {
            "graft": rows(lambda: be.graft(snap, context), n, strategy),
            "incontext": rows(lambda: be.prefill(entry)[0], n, strategy),
            "cold": rows(lambda: None, n, strategy),
        }
    foreign = dataclasses.replace(snap, model_fingerprint=hashlib.sha256(b"another model").hexdigest())
    before = len(journal(be.journal))
    try:
        be.graft(foreign, context)
        result["foreign"] = {"refused": None}
    except kvstore.IncompatibleError as e:
        result["foreign"] = {"refused": str(e)}
    result["foreign"]["events"] = journal(be.journal)[before:]
    long = (be.encode(ENTRY) * 3)[:552]
    result["refusal"] = {str(n): be.graft_refusal(n) for n in (200, 552, 640)}
    before = len(journal(be.journal))
    try:
        be.graft(be.capture(None, long), long + be.encode(QUERY, add_bos=False))
        result["refusal"]["graft_552"] = None
    except kvstore.IncompatibleError as e:
        result["refusal"]["graft_552"] = str(e)
    result["refusal"]["events"] = [e["event"] for e in journal(be.journal)[before:]]
    result["in_flight"] = in_flight(be, snap, context)
    result["overflow"] = overflow(be)
    Path(out_path).write_text(json.dumps(result, indent=1))
    return 0


def in_flight(be, snap, context: list[int]) -> dict:  # noqa: ANN001
    """Jobs of three contexts in one submission (two different grafts, one cold prompt) and each alone."""
    from harness.run.decode import Job, Sampling, generate_batch, generate_many
    from kvstore.backends.vllm import journal

    entry_b = be.encode(ENTRY_B)[:256]
    context_b = entry_b + be.encode(QUERY_B, add_bos=False)
    snap_b = be.capture(None, entry_b)
    cold = be.encode(QUERY)
    sampling = Sampling(8, ("\n\n",), "greedy")
    ga, gb = be.graft(snap, context), be.graft(snap_b, context_b)
    before = len(journal(be.journal))
    many = generate_many(be, [Job(context, [0], ga), Job(context_b, [0], gb), Job(cold, [0], None)], sampling)
    events = [e for e in journal(be.journal)[before:] if e["event"] != "deposit"]
    alone = [generate_batch(be, ids, 1, [0], sampling, cache=state())
             for ids, state in ((context, lambda: be.graft(snap, context)),
                                (context_b, lambda: be.graft(snap_b, context_b)), (cold, lambda: None))]

    def plain(gs):  # noqa: ANN001, ANN202
        return [dataclasses.asdict(g) | {"ttft_s": None} for g in gs]

    return {"many": [plain(gs) for gs in many], "alone": [plain(gs) for gs in alone], "events": events,
            "artifacts": [ga.graft[0], gb.graft[0]], "prompts": [len(context), len(context_b), len(cold)]}


def overflow(be) -> dict:  # noqa: ANN001
    """The engine's context and the refusal of a prompt that does not fit beside the decoding budget (the test builds
    the transformers line the same way and compares the two)."""
    from harness.config.schema import compose_config, typed
    from harness.errors import ConfigError
    from harness.run.loop import fit_context
    from harness.task.problems import Problem

    limit = be.context_size()
    c = typed(compose_config(["model=gemma3_270m_vllm", f"decoding.max_new_tokens={limit - 8}"]))
    long = Problem("long-1", " ".join(["seven"] * 200) + " What is 3+4?", "7")
    try:
        fit_context([long], be, c)
        refused = None
    except ConfigError as e:
        refused = str(e)
    return {"context_size": limit, "refused": refused}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
