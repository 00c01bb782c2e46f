"""The vLLM connector's paged-KV layout, learned from a cache writer (kvstore.backends.vllm.paged.self_test): pure
torch, runs everywhere. Each ISA of vLLM's CPU attention has a synthetic writer transcribed from its
`reshape_and_cache` in csrc/cpu/ (docs/vllm.md has the table); with a random permutation, a pair-packed layout and the
GPU's NHD/HND, each is learned and read back / written back bit for bit. Writers that re-encode, drop, duplicate or
misplace an element are refused in one line naming the element and the ISA. vLLM's real writers (its compiled
`cpu_attn_reshape_and_cache`, every ISA this build has) are learned in tests/kvstore/vllm_kernel_cases.py, run inside
.venv-vllm by the last test here. No test reads a list of known layouts to decide what is learned.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kvstore.backends.vllm.paged import LearnedLayout, map_digest, self_test
from kvstore.errors import IncompatibleError

Offset = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]  # (token t, dim j, bs, d) -> offset


def region_writer(key_at: Offset, value_at: Offset, cast: Callable[[torch.Tensor], torch.Tensor] = lambda x: x):
    """A CPU_ATTN-style writer (do_kv_cache_update -> cpu_attn_reshape_and_cache): per (block, head) a region of
    2 * block * head_dim elements, key element (t, j) at key_at(t, j), value element at value_at(t, j) (offsets
    counted from the region's start, the value region's included), slot s = block * block_size + t."""
    def writer(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
        nb, heads, bs, two_d = cache.shape
        d = two_d // 2
        flat = cache.view(nb, heads, bs * two_d)
        j = torch.arange(d)
        for i, s in enumerate(slots.tolist()):
            b, t = divmod(s, bs)
            tt = torch.full_like(j, t)
            flat[b, :, key_at(tt, j, bs, d)] = cast(key[i])
            flat[b, :, value_at(tt, j, bs, d)] = cast(value[i])
    return writer


# cpu_attn_vec.hpp (ISA "vec"): "reshape K as column-major and V as row-major": key_cache_start_ptr = ... + block_offset,
# key_cache_start_ptr[i * block_size] = key[i]; value_cache_start_ptr = ... + block_offset * head_dim, memcpy.
def _vec_key(t, j, bs, d):  # noqa: ANN001, ANN202
    return j * bs + t


def _vec_value(t, j, bs, d):  # noqa: ANN001, ANN202
    return bs * d + t * d + j


# cpu_attn_amx.hpp (ISA "amx", bf16): keys as int32 quad-words (2 dims), 16-token groups: quad-word index
# group_idx * (16 * head_dim / 2) + group_offset + j_quad * 16; values: 16-dim groups (group size block * 16), tokens
# in pairs: (t // 2) * 2 * 16 + t % 2 + (j // 16) * block * 16 + (j % 16) * 2.
def _amx_key(t, j, bs, d):  # noqa: ANN001, ANN202
    quad = (t // 16) * 16 * (d // 2) + t % 16 + (j // 2) * 16
    return quad * 2 + j % 2


def _amx_value(t, j, bs, d):  # noqa: ANN001, ANN202
    return bs * d + (t // 2) * 2 * 16 + t % 2 + (j // 16) * bs * 16 + (j % 16) * 2


# cpu_attn_neon_bfmmla.hpp (ISA "neon" with BF16): K [block/8][head_dim/4][32]: (t // 8) * (d / 4) * 32 +
# (j // 4) * 32 + ((t % 8) // 2) * 8 + (t odd ? 4 : 0) + j % 4; V [head_dim/2][block/4][8]: (j // 2) * (bs / 4) * 8 +
# (t // 4) * 8 + t % 4 + (j odd ? 4 : 0).
def _bfmmla_key(t, j, bs, d):  # noqa: ANN001, ANN202
    return (t // 8) * (d // 4) * 32 + (j // 4) * 32 + ((t % 8) // 2) * 8 + (t % 2) * 4 + j % 4


def _bfmmla_value(t, j, bs, d):  # noqa: ANN001, ANN202
    return bs * d + (j // 2) * (bs // 4) * 8 + (t // 4) * 8 + t % 4 + (j % 2) * 4


# a pair-packed layout no kernel is known to use: keys and values with token pairs interleaved per dim
def _pair_key(t, j, bs, d):  # noqa: ANN001, ANN202
    return (t // 2) * 2 * d + j * 2 + t % 2


def _pair_value(t, j, bs, d):  # noqa: ANN001, ANN202
    return bs * d + (t // 2) * 2 * d + j * 2 + t % 2


def permutation_writer(seed: int):  # noqa: ANN201
    """Each block's whole (heads, block, 2 * head_dim) content under one fixed random permutation, across heads."""
    def writer(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
        nb, heads, bs, two_d = cache.shape
        d = two_d // 2
        perm = torch.randperm(heads * bs * two_d, generator=torch.Generator().manual_seed(seed))
        flat = cache.view(nb, -1)
        h, j = torch.arange(heads).view(heads, 1), torch.arange(d).view(1, d)
        for i, s in enumerate(slots.tolist()):
            b, t = divmod(s, bs)
            flat[b, perm[(h * bs + t) * two_d + j]] = key[i]
            flat[b, perm[(h * bs + t) * two_d + d + j]] = value[i]
    return writer


def flash_writer(key: torch.Tensor, value: torch.Tensor, cache: torch.Tensor, slots: torch.Tensor) -> None:
    """vLLM's GPU `reshape_and_cache_flash` as FlashAttention/Triton call it (vllm 0.32): the logical
    (B, H, N, 2*D) split into keys and values per token, whatever the stride order."""
    d = key.shape[-1]
    kc, vc = cache.transpose(1, 2).split(d, dim=-1)
    bs = cache.shape[2]
    for t, s in enumerate(slots.tolist()):
        kc[s // bs, s % bs] = key[t]
        vc[s // bs, s % bs] = value[t]


WRITERS = {
    "vec": (region_writer(_vec_key, _vec_value), "cpu_attn/blocks,heads[keys(head_dim,block);values(block,head_dim)]"),
    "vec16": (region_writer(_vec_key, _vec_value),  # cpu_attn_vec16.hpp inherits vec's reshape_and_cache
              "cpu_attn/blocks,heads[keys(head_dim,block);values(block,head_dim)]"),
    "neon": (region_writer(_vec_key, _vec_value),  # cpu_attn_neon.hpp, fp32/fp16 (and bf16 without BF16 support)
             "cpu_attn/blocks,heads[keys(head_dim,block);values(block,head_dim)]"),
    "amx": (region_writer(_amx_key, _amx_value),
            "cpu_attn/amx[keys(block/16,head_dim/2,16,2);values(head_dim/16,block/2,16,2)]"),
    "neon-bfmmla": (region_writer(_bfmmla_key, _bfmmla_value),
                    "cpu_attn/neon-bfmmla[keys(block/8,head_dim/4,4,2,4);values(head_dim/2,block/4,2,4)]"),
    "pair-packed": (region_writer(_pair_key, _pair_value), "learned/permutation"),
    "random-permutation": (permutation_writer(7), "learned/permutation"),
    "gpu-flash": (flash_writer, "interleaved/blocks,heads,block[key(head_dim)|value(head_dim)]"),
}


def _like(heads: int = 2, bs: int = 32, d: int = 16, dtype: torch.dtype = torch.bfloat16, order: str = "HND"):
    if order == "NHD":  # a GPU cache stored token-major: logical (blocks, heads, block, 2D), strides of (B, N, H, 2D)
        return torch.zeros(4, bs, heads, 2 * d, dtype=dtype).transpose(1, 2)
    return torch.zeros(4, heads, bs, 2 * d, dtype=dtype)


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.dtype.itemsize])


def _round_trip(layout: LearnedLayout, writer, like: torch.Tensor) -> None:  # noqa: ANN001
    """The writer's own bytes read back through the layout are its input; written back they are its bytes."""
    nb, heads, bs, two_d = like.shape
    d = two_d // 2
    block_ids, n = [3, 0, 2], 2 * bs + 5  # three blocks out of order, the last one partly
    gen = torch.Generator().manual_seed(1)
    k_in = torch.randn(n, heads, d, generator=gen).to(like.dtype)
    v_in = torch.randn(n, heads, d, generator=gen).to(like.dtype)
    slots = torch.tensor([block_ids[p // bs] * bs + p % bs for p in range(n)])
    cache = torch.zeros_like(like)
    writer(k_in, v_in, cache, slots)
    k, v = layout.read(cache, block_ids, 0, n)
    assert torch.equal(_bits(k[0].permute(1, 0, 2)), _bits(k_in))
    assert torch.equal(_bits(v[0].permute(1, 0, 2)), _bits(v_in))
    k5, v5 = layout.read(cache, block_ids, 5, n)  # any window of positions
    assert torch.equal(_bits(k5), _bits(k[:, :, 5:])) and torch.equal(_bits(v5), _bits(v[:, :, 5:]))
    blank = torch.zeros_like(like)
    layout.write(blank, block_ids, 0, k, v)
    assert torch.equal(_bits(blank), _bits(cache))  # every byte the writer wrote, and nothing else
    assert not blank[1].any()  # block 1 is not the request's: untouched


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("isa", sorted(WRITERS))
def test_every_isa_layout_is_learned_and_round_trips_bit_for_bit(isa: str, dtype: torch.dtype) -> None:
    writer, name = WRITERS[isa]
    like = _like(dtype=dtype)
    layout = self_test(writer, like, 32, isa)
    assert layout.name == name
    assert (layout.view is not None) == (isa in ("vec", "vec16", "neon", "gpu-flash"))  # the fast path where a view
    _round_trip(layout, writer, like)


@pytest.mark.parametrize("shape", [(1, 128, 256), (4, 64, 128), (2, 32, 64)], ids=lambda s: "x".join(map(str, s)))
def test_the_amx_layout_is_learned_at_the_block_sizes_and_head_dims_it_was_measured_at(shape) -> None:  # noqa: ANN001
    heads, bs, d = shape
    writer, name = WRITERS["amx"]
    like = _like(heads, bs, d)
    layout = self_test(writer, like, bs, "amx")
    assert layout.name == name and layout.view is None
    assert layout.recorded == f"{name} sha256:{layout.digest}"
    _round_trip(layout, writer, like)


@pytest.mark.parametrize("order", ["HND", "NHD"])
def test_the_gpu_layout_is_learned_whatever_the_stride_order(order: str) -> None:
    like = _like(order=order)
    layout = self_test(flash_writer, like, 32, "FLASH_ATTN")
    assert layout.view is not None and layout.view.interleaved
    cache = torch.randn(like.shape).to(torch.bfloat16)
    if order == "NHD":
        cache = cache.transpose(1, 2).contiguous().transpose(1, 2)
    assert cache.stride() == like.stride()
    _round_trip(layout, flash_writer, like)


def test_a_strided_cache_without_a_view_round_trips_through_the_index() -> None:
    # a permutation learned on an NHD-strided cache: no view applies, so reads and writes index 4-D coordinates
    like = _like(order="NHD")
    writer = permutation_writer(3)

    def strided(key, value, cache, slots):  # noqa: ANN001, ANN202  (the permutation in the logical order)
        logical = torch.zeros(cache.shape, dtype=cache.dtype)
        writer(key, value, logical, slots)
        cache.copy_(logical)

    layout = self_test(strided, like, 32)
    assert layout.view is None
    _round_trip(layout, strided, like)


def test_the_gather_path_and_the_fast_path_give_the_same_bytes() -> None:
    writer, _ = WRITERS["vec"]
    layout = self_test(writer, _like(), 32, "vec")
    assert layout.view is not None
    slow = LearnedLayout(layout.name, layout.index, layout.dtype, None)
    cache = torch.randn(4, 2, 32, 32).to(torch.bfloat16)
    fast_kv, slow_kv = layout.read(cache, [2, 1], 3, 60), slow.read(cache, [2, 1], 3, 60)
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(fast_kv, slow_kv))
    a, b = torch.zeros_like(cache), torch.zeros_like(cache)
    layout.write(a, [2, 1], 3, *fast_kv)
    slow.write(b, [2, 1], 3, *fast_kv)
    assert torch.equal(_bits(a), _bits(b))
    layout.zero(a, [2, 1], 0, 40)
    slow.zero(b, [2, 1], 0, 40)
    assert torch.equal(_bits(a), _bits(b))


def test_zero_clears_only_the_given_positions_on_a_learned_layout() -> None:
    writer, _ = WRITERS["amx"]
    layout = self_test(writer, _like(dtype=torch.float32), 32, "amx")
    cache = torch.randn(4, 2, 32, 32)
    keep = layout.read(cache, [0, 1], 40, 64)
    layout.zero(cache, [0, 1], 0, 40)
    k, v = layout.read(cache, [0, 1], 0, 40)
    assert not k.any() and not v.any()
    assert all(torch.equal(a, b) for a, b in zip(layout.read(cache, [0, 1], 40, 64), keep))


def test_recorded_names_of_views_are_the_names_artifacts_have_always_recorded() -> None:
    # artifacts deposited before the layout was learned recorded these strings as determinism.kv_layout: the same
    # kernel must record the same string, so they stay admitted and keep their ids
    vec = self_test(WRITERS["vec"][0], _like(), 32, "vec")
    assert vec.recorded == "cpu_attn/blocks,heads[keys(head_dim,block);values(block,head_dim)]"
    gpu = self_test(flash_writer, _like(), 32)
    assert gpu.recorded == "interleaved/blocks,heads,block[key(head_dim)|value(head_dim)]"


def test_the_map_digest_is_stable() -> None:
    # golden: the SHA-256 of the vec map at (1 head, block 32, head_dim 8, bf16) under kvgraft-paged-map/1, computed
    # once outside torch (JSON header, newline, the offsets (kv, token, dim) as struct "<q")
    layout = self_test(WRITERS["vec"][0], _like(1, 32, 8), 32, "vec")
    assert layout.digest == map_digest(layout.index, torch.bfloat16)
    assert layout.digest == "e1931eea9f0dc0ad3af4cb23d7cee0032d92fea663eedd1dd41943cc5f1a0edb"
    assert map_digest(layout.index, torch.float32) != layout.digest  # the dtype is part of what it describes


def test_positions_past_the_request_blocks_are_refused() -> None:
    layout = self_test(WRITERS["amx"][0], _like(), 32, "amx")
    with pytest.raises(IncompatibleError, match=r"do not fit the request's 1 blocks of 32 tokens"):
        layout.read(torch.zeros(4, 2, 32, 32, dtype=torch.bfloat16), [0], 0, 33)


def test_a_graft_never_converts_bytes_into_the_cache_dtype() -> None:
    layout = self_test(WRITERS["amx"][0], _like(), 32, "amx")
    kv = torch.zeros(1, 2, 4, 16, dtype=torch.float32)
    with pytest.raises(IncompatibleError, match="never re-encoded"):
        layout.write(torch.zeros(4, 2, 32, 32, dtype=torch.bfloat16), [0], 0, kv, kv)


# ------------------------------------------------------------------ refusals, one line each
def _refusal(writer, dtype: torch.dtype = torch.bfloat16) -> str:  # noqa: ANN001
    with pytest.raises(IncompatibleError) as e:
        self_test(writer, _like(dtype=dtype), 32, "amx")
    line = str(e.value)
    assert "\n" not in line and "attention ISA amx" in line and "kv_cache_dtype='auto'" in line
    return line


def test_a_writer_that_casts_through_float16_is_refused_naming_the_element() -> None:
    cast = region_writer(_vec_key, _vec_value, cast=lambda x: x.half().to(x.dtype))  # rounds or overflows some
    line = _refusal(cast)
    assert "re-encodes key element (token " in line and "input bits 0x" in line, line


def test_a_writer_that_quantises_to_fp8_is_refused_naming_the_first_element() -> None:
    quant = region_writer(_amx_key, _amx_value, cast=lambda x: x.to(torch.float8_e4m3fn).to(x.dtype))
    line = _refusal(quant)
    assert "could not be learned: key element (token 0, head 0, dim 1) is not stored unchanged: the writer " \
           "re-encodes it" in line, line


def test_a_writer_that_drops_an_element_is_refused_naming_it() -> None:
    def dropping(key, value, cache, slots):  # noqa: ANN001, ANN202  (value dim 5 of every token never stored)
        region_writer(_vec_key, _vec_value)(key, value, cache, slots)
        nb, heads, bs, two_d = cache.shape
        flat = cache.view(nb, heads, -1)
        for s in slots.tolist():
            flat[s // bs, :, _vec_value(torch.tensor(s % bs), torch.tensor(5), bs, two_d // 2)] = 0
    line = _refusal(dropping)
    assert "value element (token 0, head 0, dim 5) is not stored unchanged: the writer drops it" in line, line


def test_a_writer_that_duplicates_an_element_is_refused_naming_it() -> None:
    def duplicating(key, value, cache, slots):  # noqa: ANN001, ANN202  (key dim 2 of token 3 also into block 1)
        region_writer(_vec_key, _vec_value)(key, value, cache, slots)
        cache.view(cache.shape[0], -1)[1, 0] = key[3, 0, 2]
    line = _refusal(duplicating)
    assert "duplicates key element (token 3, head 0, dim 2): it is stored at 2 places" in line, line


def test_a_writer_that_stores_into_another_block_is_refused_naming_the_element() -> None:
    def shifting(key, value, cache, slots):  # noqa: ANN001, ANN202  (every token one block further)
        region_writer(_vec_key, _vec_value)(key, value, cache, (slots + cache.shape[2]) % (cache.shape[0] * 32))
    line = _refusal(shifting)
    assert "stores key element (token 0, head 0, dim 0) outside its own block" in line, line


def test_a_writer_whose_layout_depends_on_the_block_is_refused() -> None:
    vec, amx = region_writer(_vec_key, _vec_value), region_writer(_amx_key, _amx_value)

    def mixed(key, value, cache, slots):  # noqa: ANN001, ANN202  (block 0 "vec", every other block "amx")
        first = slots // cache.shape[2] == 0
        vec(key[first], value[first], cache, slots[first])
        amx(key[~first], value[~first], cache, slots[~first])
    line = _refusal(mixed)
    assert "lays block 0 out otherwise than block 2" in line, line


# ------------------------------------------------------------------ vLLM's own compiled writers
REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("KVGRAFT_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))


@pytest.mark.integration
def test_vllms_own_cache_writers_are_learned_for_every_isa_this_build_has(tmp_path: Path) -> None:
    if not ((REPO / ".venv-vllm" / ".setup-done").exists() or "KVGRAFT_VLLM_PYTHON" in os.environ) \
            or not VLLM_PYTHON.exists():
        pytest.skip(f"no vLLM environment at {VLLM_PYTHON.parent.parent} (`make setup-vllm` builds it)")
    out = tmp_path / "kernels.json"
    proc = subprocess.run([str(VLLM_PYTHON), str(REPO / "tests" / "kvstore" / "vllm_kernel_cases.py"), str(out)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    for case in got["cases"]:  # shown with -s: what this build's kernels lay out, and the probe's cost
        sys.stdout.write(json.dumps(case) + "\n")
    vec = "cpu_attn/blocks,heads[keys(head_dim,block);values(block,head_dim)]"
    for case in got["cases"]:
        assert case["round_trip"], case
        if case["isa"] in ("vec", "vec16"):
            assert case["name"] == vec and case["fast_path"], case
        if case["isa"] == "amx" and case["dtype"] == "bfloat16":  # the layout measured on an Intel Xeon with AMX
            assert case["name"].startswith("cpu_attn/amx[") and case["equals_source_formula"], case
    assert {c["isa"] for c in got["cases"]} >= {"vec", "vec16"}
    # start_engine's pre-flight: the ISA vLLM picks for the bundled model here, learned before the engine starts; a
    # writer that re-encodes stops the start with one line naming the ISA and what works instead
    pre = got["preflight"]
    assert pre["isa"] in ("vec", "vec16", "amx", "neon"), pre
    assert pre["refused"] and "\n" not in pre["refused"] and f"attention ISA {pre['isa']}" in pre["refused"], pre
    assert "re-encodes" in pre["refused"] and "--dtype float32" in pre["refused"], pre
