"""A backend that cannot graft some of its own deposits (the vLLM backend: an entry of more than window - 1 tokens
not ending on a block boundary) says so through the optional `graft_refusal` verb (kvstore.engine.protocol), and a
library built on it leaves such entries out, each recorded under `skipped` with the backend's reason, instead of
depositing artifacts no query could graft. Tiny random-weight model behind a backend that refuses long entries."""

from __future__ import annotations

from pathlib import Path

from harness.config.model import load_model
from harness.config.schema import compose_config, typed
from harness.library.build import open_library
from kvstore import InEngineDecoding

REPO = Path(__file__).resolve().parents[2]


def refusing_long(be, limit: int):  # noqa: ANN001, ANN201
    """The tiny model's backend, declaring InEngineDecoding (graft_refusal's home) and refusing to graft artifacts of
    more than `limit` tokens: a subclass of its class (capabilities are nominal), holding the same loaded model."""

    class RefusesLong(type(be), InEngineDecoding):
        def graft_refusal(self, token_count: int) -> str | None:
            return f"entries of at most {limit} tokens graft here" if token_count > limit else None

        def continue_rows(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
            raise NotImplementedError("a library build never decodes")

    out = RefusesLong.__new__(RefusesLong)
    out.__dict__.update(vars(be))
    return out


def test_entries_the_backend_cannot_graft_are_skipped_with_its_reason(tmp_path: Path) -> None:
    cfg = typed(compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"library.root={tmp_path / 'lib'}",
                                f"library.store={tmp_path / 'store'}", "library.dataset.limit=3"]))
    be = load_model(cfg)
    whole = open_library(cfg.library, be, REPO, build_if_missing=True)
    sizes = sorted(e.tokens for e in whole.entries)
    assert len(sizes) == 3 and sizes[0] < sizes[-1]
    limit = sizes[0]  # only the shortest entry grafts
    refusing = refusing_long(be, limit)
    lib = open_library(typed(compose_config(["model=tiny_gemma3", f"project_root={REPO}",
                                             f"library.root={tmp_path / 'lib2'}", f"library.store={tmp_path / 'store'}",
                                             "library.dataset.limit=3"])).library, refusing, REPO,
                       build_if_missing=True)
    assert [e.tokens for e in lib.entries] == [t for t in sizes if t <= limit]
    skipped = lib.manifest["skipped"]
    assert len(skipped) == sum(t > limit for t in sizes)
    assert all("cannot graft its" in s["reason"] and f"at most {limit} tokens" in s["reason"] for s in skipped)
    held = {e.problem_id for e in lib.entries}
    assert not held & {s["problem_id"] for s in skipped}
