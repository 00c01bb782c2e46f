"""kvstore/backends/llamacpp/state.py on hand-built layers (no llama.cpp needed): the state round trip is byte
exact, the restore layout puts position p in cell p of every cache with zero placeholders before a sliding
layer's window, and a state whose cells are not positions in order is refused naming the cell."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from kvstore.backends.llamacpp.state import _CELL, parse_state, serialize_state, state_layers
from kvstore.errors import IncompatibleError
from kvstore.format.artifact import LayerKV

T, N_SWA, HEADS, HEAD_DIM = 700, 512, 2, 8


def _layers(t: int = T) -> list[LayerKV]:
    g = torch.Generator().manual_seed(0)

    def kv(cells: int) -> torch.Tensor:
        return torch.randn(1, HEADS, cells, HEAD_DIM, generator=g).half()

    full = [LayerKV("full", None, t, kv(t), kv(t)) for _ in range(2)]
    held = min(t, N_SWA)
    return full + [LayerKV("sliding", N_SWA + 1, t, kv(held), kv(held)) for _ in range(3)]


@pytest.mark.parametrize("v_trans", [True, False])
def test_the_state_round_trips_byte_for_byte_through_the_layers(v_trans):
    layers = _layers()
    blob = serialize_state(layers, T, "float16", v_trans).tobytes()
    caches = parse_state(blob, T)
    assert [c.cells for c in caches] == [T, N_SWA] and all(c.v_trans == v_trans for c in caches)
    again = state_layers(caches, T, N_SWA, HEADS, "float16", "float16")
    for a, b in zip(layers, again, strict=True):
        assert (a.kind, a.window) == (b.kind, b.window)
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert serialize_state(again, T, "float16", v_trans).tobytes() == blob


@pytest.mark.parametrize("v_trans", [True, False])
def test_the_restore_layout_holds_every_position_in_its_own_cell_with_zero_placeholders(v_trans):
    layers = _layers()
    caches = parse_state(serialize_state(layers, T, "float16", v_trans, restore=True).tobytes(), T)
    assert [c.cells for c in caches] == [T, T]  # the sliding cache too: positions 0..T-1 (parse checks order)
    sliding, pad = caches[1], T - N_SWA
    for i, lyr in enumerate(lyr for lyr in layers if lyr.kind == "sliding"):
        k = sliding.k_rows[i].view(np.int16).reshape(T, HEADS, HEAD_DIM)
        assert not k[:pad].any()
        assert np.array_equal(k[pad:], lyr.keys[0].transpose(0, 1).view(torch.int16).numpy())
        v = sliding.v_rows[i].view(np.int16)
        v = v.reshape(HEADS, HEAD_DIM, T).transpose(2, 0, 1) if v_trans else v.reshape(T, HEADS, HEAD_DIM)
        assert not v[:pad].any()
        assert np.array_equal(v[pad:], lyr.values[0].transpose(0, 1).view(torch.int16).numpy())
    short = _layers(100)  # inside the window nothing is padded: the restore layout is llama.cpp's own
    assert (serialize_state(short, 100, "float16", v_trans, restore=True).tobytes()
            == serialize_state(short, 100, "float16", v_trans).tobytes())


def test_a_state_whose_cells_are_not_positions_in_order_is_refused_naming_the_cell():
    blob = bytearray(serialize_state(_layers(), T, "float16", True).tobytes())
    first_cell = 8 + 8 + 3 * _CELL.itemsize  # magic + seq, streams + count, then cell 3 of the full cache
    struct.pack_into("<i", blob, first_cell, 5)
    with pytest.raises(IncompatibleError, match="cache cell 3 holds position 5 .* positions 0..699 of sequence 0 "
                                                "in order; set it"):
        parse_state(bytes(blob), T, "; set it")
