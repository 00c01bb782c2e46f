"""Conditions: how a problem is put to the frozen model. A registry maps the config name to a class.

baseline  the model alone: prefill the query prompt, decode.
graft     retrieve a verified library entry, graft its artifact (read from the store, verified) at its own
          positions, prefill only the query prompt after it, decode with the same settings as baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from harness.decode import Generation, generate
from harness.library import Library, open_library
from harness.problems import Problem
from harness.prompts import render
from kvstore import FrozenModel, graft_snapshot


@dataclass
class Attempt:
    """What a condition produced for one (problem, sample)."""

    prompt: str
    context_ids: list[int]  # every token the model saw before decoding (grafted + prefilled)
    grafted_tokens: int
    generation: Generation
    entry_id: str | None = None
    artifact_id: str | None = None
    similarity: float | None = None
    match: str | None = None


class Baseline:
    name = "baseline"

    def __init__(self, cfg, fm: FrozenModel, project_root: Path) -> None:
        self.cfg, self.fm = cfg, fm

    def describe(self) -> dict:
        return {"condition": self.name}

    def _decode(self, context_ids: list[int], sample: int, cache=None) -> Generation:
        d = self.cfg.decoding
        return generate(
            self.fm,
            context_ids,
            max_new_tokens=d.max_new_tokens,
            stop=list(self.cfg.prompt.stop),
            strategy=d.strategy,
            temperature=d.temperature,
            top_p=d.top_p,
            seed=d.seed + sample,
            cache=cache,
        )

    def attempt(self, problem: Problem, sample: int) -> Attempt:
        prompt = render(self.cfg.prompt.template, problem=problem.problem)
        ids = self.fm.encode(prompt)
        return Attempt(prompt, ids, 0, self._decode(ids, sample))


class Graft(Baseline):
    name = "graft"

    def __init__(self, cfg, fm: FrozenModel, project_root: Path) -> None:
        super().__init__(cfg, fm, project_root)
        self.library: Library = open_library(cfg.library, fm, project_root)

    def describe(self) -> dict:
        return {
            "condition": self.name,
            "library": self.library.describe(),
            "exclude_self": bool(self.cfg.library.exclude_self),
        }

    def attempt(self, problem: Problem, sample: int) -> Attempt:
        lib = self.cfg.library
        match = self.library.retrieve(problem, exclude_self=lib.exclude_self, retrieval=lib.retrieval)
        if match is None:  # nothing to graft: the query alone, recorded as such
            return super().attempt(problem, sample)
        prompt = render(self.cfg.prompt.template, problem=problem.problem)
        snapshot = self.library.store.get(match.entry.artifact_id)  # verifies bytes and tensors
        context = snapshot.token_ids + self.fm.encode(prompt, add_bos=False)  # the entry ends in a blank line
        cache = graft_snapshot(snapshot, self.fm, token_ids=context)  # checks model, tokenizer, layout, token prefix
        gen = self._decode(context, sample, cache=cache)
        return Attempt(
            prompt,
            context,
            snapshot.token_count,
            gen,
            match.entry.entry_id,
            match.entry.artifact_id,
            match.similarity,
            match.kind,
        )


CONDITIONS: dict[str, type[Baseline]] = {"baseline": Baseline, "graft": Graft}
