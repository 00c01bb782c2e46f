"""The vocabulary-blocked LM head gives the whole product's bits and leaves the model's identity alone."""

import pytest
import torch

from kvstore.backends.transformers.lm_head import BLOCK_ROWS, MAX_ROWS, block_lm_head


class _Head(torch.nn.Module):
    def __init__(self, vocab: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=bias)

    def get_output_embeddings(self) -> torch.nn.Linear:
        return self.lm_head


@pytest.mark.parametrize("bias", [False, True])
def test_blocked_head_is_bit_identical(bias: bool) -> None:
    torch.manual_seed(0)
    vocab = 5 * BLOCK_ROWS + 123  # a ragged last block
    m = _Head(vocab, 64, bias)
    x = torch.randn(3, MAX_ROWS + 1, 64)
    wants = {shape: torch.nn.functional.linear(x.reshape(-1, 64)[: shape[0] * shape[1]].reshape(*shape, 64),
                                               m.lm_head.weight, m.lm_head.bias)
             for shape in [(1, 1), (8, 1), (1, 16), (2, 5), (1, MAX_ROWS + 1)]}
    assert block_lm_head(m)
    with torch.inference_mode():
        for shape, want in wants.items():
            got = m.lm_head(x.reshape(-1, 64)[: shape[0] * shape[1]].reshape(*shape, 64))
            assert got.shape == want.shape
            assert torch.equal(got, want), shape


def test_small_heads_and_parameters_untouched() -> None:
    small = _Head(BLOCK_ROWS, 16, False)
    assert not block_lm_head(small)  # fits the caches: left as it is
    big = _Head(4 * BLOCK_ROWS, 16, False)
    before = dict(big.state_dict())
    assert block_lm_head(big)
    after = big.state_dict()
    assert list(after) == list(before) and all(after[k] is before[k] or torch.equal(after[k], before[k]) for k in after)
