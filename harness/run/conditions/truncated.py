"""truncated: the retrieved entry read as plain text, cut to its first `settings.tokens` tokens, then the query;
no graft (everything is prefilled). It asks how much of a verified entry the model needs to answer: the entry
starts with the problem and its verified answer (library.entry_template), so a few dozen tokens carry the
answer and none of the solution.

Retrieval is graft's (the same library, exclude_self and ranker), so its runs have a group like graft's; the
entry's tokens are the artifact's own token ids (read from the store, verified), cut, then the query prompt.
Each row records the tokens it kept (`extra.kept_entry_tokens`). Config: configs/condition/truncated.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from harness.run.conditions import Baseline, Context, Graft
from harness.task.chat import encode_query
from harness.task.problems import Problem


@dataclass(frozen=True)
class TruncatedSettings:
    tokens: int = 32  # how many of the entry's first tokens the prompt keeps (its BOS included)

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            raise ValueError(f"tokens={self.tokens!r}: must be an integer >= 1")


class Truncated(Graft):
    """The retrieved entry's first `settings.tokens` tokens in context (no graft), then the query."""

    name: ClassVar[str] = "truncated"
    Settings: ClassVar[type | None] = TruncatedSettings

    def context(self, problem: Problem) -> Context:
        found = self._entry(problem)
        if found is None:
            return Baseline.context(self, problem)
        prompt, match, snapshot = found
        kept = list(snapshot.token_ids[: self.settings.tokens])
        context = kept + encode_query(self.be, self.frame, prompt)  # with a chat template: closes the turn
        return Context(prompt, context, match=match, extra={"kept_entry_tokens": len(kept)})
