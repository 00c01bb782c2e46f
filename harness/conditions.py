"""Conditions: how a problem is put to the frozen model. The registry `CONDITIONS` (config name -> class) is
the only place that knows condition names; `build_condition` makes one from the typed config pieces.

baseline  the model alone: prefill the query prompt, decode.
graft     retrieve a verified library entry, graft its artifact (read from the store, verified) at its own
          positions, prefill only the query prompt after it, decode with the same settings as baseline.

A condition is built once per run and turns (problem, sample) into a `harness.record.Completion`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from harness.config import DecodingConfig, LibraryConfig, PromptConfig
from harness.decode import Generation, generate
from harness.errors import ConfigError
from harness.library import Library, Match, open_library
from harness.problems import Problem
from harness.prompts import render
from harness.record import Completion, group_for
from kvstore import FrozenModel, graft_snapshot


def _completion(prompt: str, context_ids: list[int], gen: Generation, grafted: int, match: Match | None) -> Completion:
    return Completion(
        prompt=prompt, context_ids=context_ids, text=gen.text, token_ids=gen.token_ids, stop_reason=gen.stop_reason,
        prefill_tokens=gen.prefill_tokens, grafted_tokens=grafted, decode_tokens=gen.decode_tokens,
        first_logits_sha256=getattr(gen, "first_logits_sha256", None), ttft_s=getattr(gen, "ttft_s", None),
        entry_id=match.entry.entry_id if match else None, artifact_id=match.entry.artifact_id if match else None,
        similarity=match.similarity if match else None, match=match.kind if match else None,
    )  # fmt: skip


class Baseline:
    """The frozen model alone."""

    name: ClassVar[str] = "baseline"
    uses_library: ClassVar[bool] = False  # True: opened with a Library, and its rows fall into groups

    def __init__(self, fm: FrozenModel, prompt: PromptConfig, decoding: DecodingConfig) -> None:
        self.fm, self.prompt, self.decoding = fm, prompt, decoding

    def describe(self) -> dict[str, Any]:
        return {"condition": self.name}

    def group(self, completion: Completion) -> str | None:
        """recurring / held_out for conditions with a library (harness.record.group_for), else None."""
        return group_for(completion.match) if self.uses_library else None

    def _decode(self, context_ids: list[int], sample: int, cache=None) -> Generation:
        d = self.decoding
        return generate(
            self.fm, context_ids, max_new_tokens=d.max_new_tokens, stop=list(self.prompt.stop), strategy=d.strategy,
            temperature=d.temperature, top_p=d.top_p, seed=d.seed + sample, cache=cache,
        )  # fmt: skip

    def complete(self, problem: Problem, sample: int) -> Completion:
        prompt = render(self.prompt.template, problem=problem.problem)
        ids = self.fm.encode(prompt)
        return _completion(prompt, ids, self._decode(ids, sample), 0, None)


class Graft(Baseline):
    """A verified library entry grafted at its own positions before the query prompt."""

    name: ClassVar[str] = "graft"
    uses_library: ClassVar[bool] = True

    def __init__(self, fm: FrozenModel, prompt: PromptConfig, decoding: DecodingConfig, library: Library) -> None:
        super().__init__(fm, prompt, decoding)
        self.library = library

    def describe(self) -> dict[str, Any]:
        return {"condition": self.name, "library": self.library.describe()}

    def complete(self, problem: Problem, sample: int) -> Completion:
        match = self.library.retrieve(problem)  # exclude_self and retrieval were fixed when it was opened
        if match is None:  # nothing to graft: the query alone, recorded as such
            return super().complete(problem, sample)
        prompt = render(self.prompt.template, problem=problem.problem)
        snapshot = self.library.store.get(match.entry.artifact_id)  # verifies bytes and tensors
        context = snapshot.token_ids + self.fm.encode(prompt, add_bos=False)  # the entry ends in a blank line
        cache = graft_snapshot(snapshot, self.fm, token_ids=context)  # checks model, tokenizer, layout, token prefix
        return _completion(prompt, context, self._decode(context, sample, cache=cache), snapshot.token_count, match)


CONDITIONS: dict[str, type[Baseline]] = {"baseline": Baseline, "graft": Graft}


def condition_class(name: str) -> type[Baseline]:
    """The registered class for a config's `condition.name`; a ConfigError naming the choices otherwise."""
    try:
        return CONDITIONS[name]
    except KeyError:
        raise ConfigError(f"condition={name!r} is not one of {sorted(CONDITIONS)} (configs/condition/)") from None


def build_condition(
    name: str,
    fm: FrozenModel,
    prompt: PromptConfig,
    decoding: DecodingConfig,
    library: LibraryConfig,
    project_root: Path,
    build_library_if_missing: bool = False,
) -> Baseline:
    """The condition `name`, built once from the typed config pieces (its library opened if it uses one)."""
    cls = condition_class(name)
    if not cls.uses_library:
        return cls(fm, prompt, decoding)
    return cls(fm, prompt, decoding, open_library(library, fm, project_root, build_if_missing=build_library_if_missing))
