"""A library served behind the endpoint: opened and audited once, then one entry per request, chosen and composed by
the graft condition's own code (harness.run.conditions.retrieve_entry / query_prompt / graft_context).

The rule that finds a request's problem (docs/vllm.md, "Any evaluation harness"):

1. the text: a completion's `prompt` when it is one string (or a list of exactly one string); a chat request's last
   `user` message when its content is one string (or a list of text parts, joined). Anything else (token ids,
   several prompts, no user message) has no problem: it is served as sent, without a graft, and says so;
2. the problem: when the text is the prompt template (prompt.template, the harness's `answer` prompt by default)
   rendered around some text X, exactly (the template's text before `{problem}` and after it), X; otherwise the
   whole text, stripped of surrounding whitespace (an empty text has no problem);
3. the request's problem id: the library entry's own when the problem's fingerprint (whitespace-collapsed,
   lower-cased text) is one of the library's problems, else `request-<fingerprint[:12]>`; its gold answer is the
   entry's (a request carries none; nothing is scored on the server).

Then the retrieval (RETRIEVAL: recurring = library.exclude_self false, BM25 for a problem not in the library;
held-out = exclude_self true, BM25; random = exclude_self true, a random other entry) and the composition (the
entry's tokens, then the query prompt's) are the graft condition's, called here, not copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, LibraryError
from harness.library.build import Library, Match
from harness.run.conditions import graft_context, query_prompt, retrieve_entry
from harness.task.problems import Problem, problem_fingerprint
from kvstore import KVStoreError, open_store

#: RETRIEVAL -> (library.exclude_self, library.retrieval), the harness's own settings for each condition group
RETRIEVAL_MODES: dict[str, tuple[bool, str]] = {
    "recurring": (False, "bm25"),
    "held-out": (True, "bm25"),
    "random": (True, "random"),
}
CONDITIONS = ("graft", "incontext")


@dataclass
class Composed:
    """What a request becomes: the problem found, the entry chosen, the context's token ids (entry + query)."""

    problem: Problem
    prompt: str
    match: Match
    context_ids: list[int]
    entry_tokens: int

    def describe(self) -> dict[str, Any]:
        e = self.match.entry
        return {"entry": e.entry_id, "problem_id": e.problem_id, "artifact": e.artifact_id, "tokens": e.tokens,
                "match": self.match.kind, "similarity": round(float(self.match.similarity), 6)}


def retrieval_settings(mode: str) -> tuple[bool, str]:
    """(exclude_self, retrieval) of a RETRIEVAL name; a ConfigError naming the choices otherwise."""
    try:
        return RETRIEVAL_MODES[mode]
    except KeyError:
        raise ConfigError(f"RETRIEVAL={mode!r} is not one of {[*RETRIEVAL_MODES, 'none']} (none: the server without "
                          "a library)") from None


class ServedLibrary:
    """A library folder opened for the served model `text` (kvstore.load_text_model) and audited (`audit`)."""

    def __init__(self, path: str | Path, store: str, mode: str, text: Any, template: str) -> None:
        exclude_self, retrieval = retrieval_settings(mode)
        folder = Path(path)
        if not (folder / "manifest.json").is_file():
            raise LibraryError(f"LIBRARY={path}: no manifest.json there; give a library folder (one that `make "
                               "library` built, under library.root)")
        try:
            store_obj = open_store(store)
        except KVStoreError as e:
            raise LibraryError(f"LIBRARY={path}: its store {store} cannot be opened ({e}); give STORE= the store the "
                               "library was built into") from e
        self.library = Library(folder, store_obj, exclude_self=exclude_self, retrieval=retrieval)
        self.mode, self.text, self.template = mode, text, template
        self._own = {e.problem_fingerprint: e for e in self.library.entries}
        head, sep, tail = template.partition("{problem}")
        self._around = (head, tail) if sep else None

    def audit(self) -> None:
        """LibraryError in one line unless the library (its manifest and index already checked against their hashes
        when opened) was built for the served model and tokenizer, and every entry's artifact is in the store, reads
        back to its id and holds exactly the entry's tokens."""
        m, lib = self.library.manifest, self.library
        for key, mine in (("model_fingerprint", self.text.fingerprint),
                          ("tokenizer_fingerprint", self.text.tokenizer_fingerprint)):
            if m.get(key) != mine:
                raise LibraryError(f"library {lib.path}: built for another model ({key} {str(m.get(key))[:12]}, the "
                                   f"served model's {mine[:12]}); serve its model (MODEL=) or build the library for "
                                   "this one (`make library ARGS=\"model=...\"`)")
        backend = (m.get("determinism") or {}).get("backend") if isinstance(m.get("determinism"), dict) else None
        if backend != self.text.name:
            raise LibraryError(f"library {lib.path}: its artifacts were computed on backend {backend!r}, the server "
                               f"runs {self.text.name!r}; build it with model=<name>_{self.text.name}")
        for e in lib.entries:
            try:
                snap = lib.store.get(e.artifact_id)
            except KVStoreError as err:
                raise LibraryError(f"library {lib.path}, entry {e.entry_id} (problem {e.problem_id}): artifact "
                                   f"{e.artifact_id[:16]} {type(err).__name__}: {err}; rebuild the library "
                                   "(`make library`) or give STORE= its store") from err
            lib.check_artifact(e, snap)

    def problem(self, text: str) -> Problem | None:
        """The request's problem by the module's rule (None for an empty text)."""
        body = text
        if self._around is not None:
            head, tail = self._around
            if len(text) >= len(head) + len(tail) and text.startswith(head) and text.endswith(tail):
                body = text[len(head): len(text) - len(tail)]
        body = body.strip()
        if not body:
            return None
        fp = problem_fingerprint(body)
        own = self._own.get(fp)
        if own is not None:
            return Problem(id=own.problem_id, problem=body, answer=own.answer)
        return Problem(id=f"request-{fp[:12]}", problem=body, answer="0")

    def query(self, problem: Problem) -> str:
        """The query prompt alone (what the graft condition serves when it has no entry)."""
        return query_prompt(self.template, problem)

    def compose(self, problem: Problem, match: Match | None = None) -> Composed | None:
        """The graft condition's entry and context for `problem` (None when retrieval finds no entry; `match` when
        it was retrieved already); a KVStoreError or LibraryError when the entry's artifact cannot be read or does
        not hold its tokens."""
        found = retrieve_entry(self.library, problem, match=match)
        if found is None:
            return None
        match, snapshot = found
        prompt = query_prompt(self.template, problem)
        return Composed(problem, prompt, match, graft_context(self.text, None, snapshot, prompt),
                        int(snapshot.token_count))
