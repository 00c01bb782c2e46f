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
  digests    the first-logits SHA-256 the engine hashes itself (kvstore.backends.vllm.digest, what continue_rows and
             continue_many record) against `logits_sha256` of the whole-vocabulary logits the logprobs path returns
             for the same request (it asks for both): a cold prompt, a graft, and three long prompts together whose
             8,700 tokens exceed the engine's 8,192-token prefill budget; the row alone against `prefill`; and the
             logits processor on vLLM's own BatchUpdate (adds, swaps, moves, removals) without an engine; a greedy
             row of 24 tokens (one request) against `prefill` of its prompt.
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
    result["digests"] = digests(be, snap, entry, context)
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


def digests(be, snap, entry: list[int], context: list[int]) -> dict:  # noqa: ANN001
    """Engine-hashed first-logits digests (kvstore.backends.vllm.digest) beside the logprobs path's whole-vocabulary
    logits of the same request (a request can ask for both), and beside `prefill` for a row decoded alone."""
    import uuid

    from kvstore.engine.verify import logits_sha256

    def both(prompts: list[list[int]], state=None) -> dict:  # noqa: ANN001
        keys = [uuid.uuid4().hex for _ in prompts]
        n0 = len(Path(be.digests.path).read_text().splitlines())
        params = [be.sampling_params(state, digest=k, max_tokens=1, temperature=0.0, logprobs=-1, flat_logprobs=True,
                                     detokenize=False) for k in keys]
        outs = be.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        lines = Path(be.digests.path).read_text().splitlines()[n0:]
        got = be.digests.take(keys)
        logits = [be.logits_of(o) for o in outs]
        return {"engine": [got[k][0] for k in keys], "logprobs": [logits_sha256(x) for x in logits],
                "argmax": [got[k][1] for k in keys], "logits_argmax": [int(x[0].argmax()) for x in logits],
                "sampled": [list(o.outputs[0].token_ids) for o in outs], "lines": len(lines),
                "keys": keys, "line_keys": [json.loads(line)["key"] for line in lines]}

    cold = be.encode(QUERY)
    be.new_state()
    out: dict = {"cold": {"engine": be.continue_rows(None, cold, [0], max_new_tokens=1)[0].first_logits_sha256,
                          "prefill": logits_sha256(be.prefill(cold)[1]), "both": both([cold])}}
    grafted = be.continue_rows(be.graft(snap, context), context, [0], max_new_tokens=1)[0].first_logits_sha256
    out["graft"] = {"engine": grafted,
                    "prefill": logits_sha256(be.prefill(context[len(entry):], be.graft(snap, context))[1]),
                    "both": both([context], be.graft(snap, context))}
    be.new_state()  # a greedy row of 24 tokens is one request: its digest is of the position its first token is from
    row = be.continue_rows(None, cold, [0], max_new_tokens=24, stop=())[0]
    first = be.prefill(cold)[1]
    out["row"] = {"engine": row.first_logits_sha256, "prefill": logits_sha256(first), "first": row.token_ids[0],
                  "argmax": int(first[0].argmax()), "tokens": len(row.token_ids), "reason": row.stop_reason,
                  "ttft": row.ttft_s, "schedule": be.row_schedule()}
    be.new_state()
    out["long"] = both([be.encode(f"Note {i}. " + ENTRY_B * 12)[:2900] for i in range(3)])
    out["processor"] = digest_processor()
    return out


def digest_processor() -> dict:
    """The logits processor alone, on vLLM's own BatchUpdate: requests added, moved, swapped, given an output token
    and removed, and the lines it writes (which rows, which bytes)."""
    import tempfile

    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from kvstore.backends.vllm.digest import DIGEST, DigestReader, FirstLogitsDigest
    from kvstore.engine.verify import logits_sha256

    path = tempfile.mktemp(suffix=".jsonl")
    reader = DigestReader(path)

    def ask(key: str) -> SamplingParams:
        return SamplingParams(max_tokens=1, extra_args={DIGEST: {"key": key, "journal": path}})

    proc = FirstLogitsDigest(None, torch.device("cpu"), False)
    out_a, out_c = [], []
    proc.update_state(BatchUpdate(3, [], [(0, ask("a"), [1], out_a), (1, SamplingParams(), [1], []),
                                          (2, ask("c"), [1], out_c)], []))
    x = torch.randn(3, 50)
    same = proc.apply(x) is x
    step1 = reader.take(["a", "c"])
    out_a.append(7)  # a sampled its token: no more lines for it
    proc.update_state(BatchUpdate(3, [], [], [(0, 2, MoveDirectionality.SWAP)]))  # a <-> c
    y = torch.randn(3, 50)
    proc.apply(y)
    step2 = reader.take(["c"])
    proc.update_state(BatchUpdate(2, [1, 2], [], [(0, 1, MoveDirectionality.UNIDIRECTIONAL)]))  # a goes, c to 1
    z = torch.randn(2, 50)
    proc.apply(z)
    step3 = reader.take(["c"])
    try:
        FirstLogitsDigest.validate_params(SamplingParams(extra_args={DIGEST: "no dict"}))
        refused = None
    except ValueError as e:
        refused = str(e)
    return {"unchanged": same,
            "step1": {k: v[0] == logits_sha256(x[i][None]) and v[1] == int(x[i].argmax())
                      for k, v, i in (("a", step1["a"], 0), ("c", step1["c"], 2))},
            "step2_c_row0": step2["c"][0] == logits_sha256(y[0][None]),
            "step3_c_row1": step3["c"][0] == logits_sha256(z[1][None]),
            "a_after_output": "a" in reader.seen, "refused": refused}


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
