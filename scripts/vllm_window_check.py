"""Do Gemma 3's global layers see past the 512-token window on vLLM's CPU backend (the bug vllm PR #51756 fixed)?
Run inside .venv-vllm:

    .venv-vllm/bin/python -m scripts.vllm_window_check

One prompt of ~1,060 tokens whose first sentence holds a number, then ~1,000 tokens of filler, then a question:
  (1) transformers, fp32: the last position's logits with the number 7391 vs 2468: how much a token outside
      every sliding window moves them (only the 3 full-attention layers can carry it);
  (2) vLLM, fp32, the same prompt (7391): its raw logits vs transformers' (max |diff|, argmax).
If vLLM's global layers lost context past the window, (2)'s difference would be of (1)'s size, not rounding's.
"""

from __future__ import annotations

import sys

import torch

FILLER = " ".join(f"Line {i}: the weather was mild and nothing happened." for i in range(80))


def prompt(code: str) -> str:
    return (f"Remember this: the secret number is {code}.\n{FILLER}\n"
            "Question: what is the secret number? Answer: the secret number is")


def main() -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams

    from kvstore import backend_tools
    from kvstore.environment import cpu_name

    engine = backend_tools("vllm")  # the engine's own launcher and settings
    folder = engine.model_folder(engine.VllmSettings())
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    ids = {code: tok(prompt(code))["input_ids"] for code in ("7391", "2468")}
    with torch.no_grad():
        hf = {code: model(torch.tensor([x])).logits[0, -1].float() for code, x in ids.items()}
    del model
    moved = float((hf["7391"] - hf["2468"]).abs().max())
    llm = engine.start_engine(engine.VllmSettings(dtype="float32", max_logprobs=-1, logprobs_mode="raw_logits",
                                    enable_prefix_caching=False))
    out = llm.generate([{"prompt_token_ids": ids["7391"]}], SamplingParams(max_tokens=1, temperature=0.0, logprobs=-1),
                       use_tqdm=False)[0]
    table = out.outputs[0].logprobs[0]
    vec = torch.empty(len(table))
    for t, lp in table.items():
        vec[t] = lp.logprob
    vec = vec[: hf["7391"].shape[0]]
    diff = float((vec - hf["7391"]).abs().max())
    same = int(vec.argmax()) == int(hf["7391"].argmax())
    print(f"vllm_window_check: {len(ids['7391'])} tokens, fp32, {cpu_name()}: a token >1,000 positions back moves "
          f"transformers' last logits by max |diff| {moved:.3g}; vLLM vs transformers max |diff| {diff:.3g}, "
          f"argmax {'equal' if same else 'DIFFERENT'}")
    return 0 if same and diff < moved / 100 else 1


if __name__ == "__main__":
    sys.exit(main())
