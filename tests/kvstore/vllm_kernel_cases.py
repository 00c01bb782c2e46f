"""vLLM's own compiled cache writers, learned: run by tests/kvstore/test_vllm_paged.py inside .venv-vllm (no engine):

    PYTHONPATH=. .venv-vllm/bin/python tests/kvstore/vllm_kernel_cases.py OUT.json

For every attention ISA of vLLM's CPU backend (`vllm._custom_ops.cpu_attn_reshape_and_cache(..., isa)`, the op
`CPUAttentionBackendImpl.do_kv_cache_update` calls) and dtype this build compiles, at the 270M's shape (1 KV head,
block 128, head_dim 256) and a small one (2, 32, 64): the layout `paged.self_test` learns, whether it is a view (the
fast path), the map's SHA-256, whether the writer's bytes read back and write back bit for bit, and for "amx" whether
the map equals the formula read from csrc/cpu/cpu_attn_amx.hpp. The reshape is plain C++ (no AMX instruction), so the
"amx" writer runs on any x86 build that compiles it. A combination the build lacks is listed under "absent".
"""

from __future__ import annotations

import json
import sys
import time


def main(out_path: str) -> int:
    import torch
    from vllm import _custom_ops as ops

    from kvstore.backends.vllm.paged import named_maps, self_test

    cases, absent = [], []
    for dtype in (torch.bfloat16, torch.float32):
        for isa in ("vec", "vec16", "amx", "neon"):
            for heads, bs, d in ((1, 128, 256), (2, 32, 64)):
                like = torch.zeros(4, heads, bs, 2 * d, dtype=dtype)

                def writer(k, v, c, s, isa=isa):  # noqa: ANN001, ANN202  (as do_kv_cache_update calls it)
                    nb, h, b, _ = c.shape
                    kc, vc = c.view(nb, h, 2 * b, -1).chunk(2, dim=2)
                    ops.cpu_attn_reshape_and_cache(k, v, kc, vc, s, isa, k_scale=1.0, v_scale=1.0,
                                                   kv_cache_dtype="auto")
                try:
                    t0 = time.perf_counter()
                    layout = self_test(writer, like, bs, isa)
                    seconds = time.perf_counter() - t0
                except RuntimeError as e:  # this build has no kernel for the combination
                    absent.append({"isa": isa, "dtype": str(dtype), "shape": [heads, bs, d], "why": str(e)[:200]})
                    continue
                n = bs + 7
                gen = torch.Generator().manual_seed(2)
                k_in = torch.randn(n, heads, d, generator=gen).to(dtype)
                v_in = torch.randn(n, heads, d, generator=gen).to(dtype)
                cache = torch.zeros_like(like)
                slots = torch.tensor([3 * bs + p if p < bs else (p - bs) for p in range(n)])  # blocks 3, then 0
                writer(k_in, v_in, cache, slots)
                k, v = layout.read(cache, [3, 0], 0, n)
                blank = torch.zeros_like(like)
                layout.write(blank, [3, 0], 0, k, v)
                bits = {2: torch.int16, 4: torch.int32}[dtype.itemsize]
                ok = (torch.equal(k[0].permute(1, 0, 2).view(bits), k_in.view(bits))
                      and torch.equal(v[0].permute(1, 0, 2).view(bits), v_in.view(bits))
                      and torch.equal(blank.view(bits), cache.view(bits)))
                formula = named_maps(bs, d).get(
                    "cpu_attn/amx[keys(block/16,head_dim/2,16,2);values(head_dim/16,block/2,16,2)]")
                cases.append({"isa": isa, "dtype": str(dtype).removeprefix("torch."), "shape": [heads, bs, d],
                              "name": layout.name, "sha256": layout.digest, "fast_path": layout.view is not None,
                              "round_trip": ok, "probe_seconds": round(seconds, 3),
                              "equals_source_formula": formula is not None
                              and bool(torch.equal(formula(heads), layout.index.cpu()))})
    # the pre-flight probe start_engine runs before vLLM starts (the bundled model's shape, the ISA vLLM picks here),
    # then the same with vLLM's writer replaced by one that quantises to FP8: one IncompatibleError line
    from kvstore.backends.vllm import VllmSettings
    from kvstore.backends.vllm.launch import preflight_layout
    from kvstore.errors import IncompatibleError

    t0 = time.perf_counter()
    preflight = {"isa": preflight_layout(VllmSettings(store="unused")), "seconds": round(time.perf_counter() - t0, 3)}
    real = ops.cpu_attn_reshape_and_cache

    def quantising(key, value, key_cache, value_cache, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        q = [x.to(torch.float8_e4m3fn).to(x.dtype) for x in (key, value)]
        real(q[0], q[1], key_cache, value_cache, *args, **kwargs)

    ops.cpu_attn_reshape_and_cache = quantising
    try:
        preflight_layout(VllmSettings(store="unused"))
        preflight["refused"] = None
    except IncompatibleError as e:
        preflight["refused"] = str(e)
    finally:
        ops.cpu_attn_reshape_and_cache = real
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"cases": cases, "absent": absent, "preflight": preflight}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
