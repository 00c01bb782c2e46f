"""Reasoning traces: a model that thinks before it answers (`<think> ... </think>`, DeepSeek-R1 distills, Qwen3,
QwQ) is scored on the text after its trace, and a row whose token budget ran out inside the trace is `overlong`:
no answer, told apart from a wrong one. `model.trace` names the delimiters (harness/config/schema.py):

    null     no trace (the default): the whole completion is scored, as before the setting existed
    think    <think> ... </think>
    model    read from the model's chat template: the known pair its template writes (an error when it names none)
    "A B"    a custom pair: the opening and the closing delimiter, separated by a space

    trace = resolve_trace("think", None)                    # Trace(open="<think>", close="</think>")
    s = score_traced(text, gold, stop_reason, trace.close)  # Score with overlong set

The rule (NeMo-Skills' `parse_reasoning`, `end_reasoning_string`): the answer is extracted from the text after the
LAST closing delimiter; a completion that ends inside a trace has no answer, and is `overlong` when it stopped at the
budget (stop reason "length"), else (the model ended, or a stop string cut it, inside the trace) it is only
unanswered. It ends inside a trace when no closing delimiter was written, or when the opening delimiter follows the
last closing one (the trace re-opened and never closed again: `<think>x</think> 324 <think> 7` has no answer, and cut
by the budget it is overlong; what it wrote after re-opening is reasoning, not an answer). A completion need not open
its trace (an R1 distill's template opens it in the prompt itself). The opening delimiter of a named pair follows
from its closing one (`opening_of`); a custom pair's is passed by whoever scores (the run, the audit from the run's
config.yaml). A row scored under a trace carries `trace_close` and `overlong` (RUN_FORMAT.md),
so its score is recomputed from the row alone.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.errors import ConfigError
from harness.task.answers import Score, score

__all__ = ["KNOWN_TRACES", "Trace", "after_trace", "opening_of", "resolve_trace", "score_traced"]

#: named delimiter pairs (`model.trace=<name>`); `model.trace=model` looks for each closing one in the chat template
KNOWN_TRACES: dict[str, tuple[str, str]] = {"think": ("<think>", "</think>")}


@dataclass(frozen=True)
class Trace:
    """The delimiters of a reasoning trace: the answer follows the last `close`."""

    open: str
    close: str

    def describe(self) -> dict[str, str]:
        return {"open": self.open, "close": self.close}


def resolve_trace(setting: str | None, chat_template: str | None) -> Trace | None:
    """The trace `model.trace` names (see the module doc); `chat_template` is the model's own template text
    (`backend.chat_template()`), read only for `model`. A value that names nothing is a ConfigError naming the key."""
    if setting is None:
        return None
    if setting in KNOWN_TRACES:
        return Trace(*KNOWN_TRACES[setting])
    if setting == "model":
        for open_, close in KNOWN_TRACES.values():
            if chat_template and close in chat_template:
                return Trace(open_, close)
        known = ", ".join(close for _, close in KNOWN_TRACES.values())
        raise ConfigError(f"model.trace=model: the model's chat template writes no trace delimiter ({known}); "
                          "name the pair (model.trace=think, or 'OPEN CLOSE') or set model.trace=null")
    parts = setting.split()
    if len(parts) != 2:
        raise ConfigError(f"model.trace={setting!r}: use null, model, {', '.join(KNOWN_TRACES)}, or the opening and "
                          "closing delimiter separated by one space ('<think> </think>')")
    return Trace(parts[0], parts[1])


def opening_of(close: str) -> str | None:
    """The opening delimiter of the named pair whose closing one is `close` (`</think>` -> `<think>`), else None."""
    return next((open_ for open_, c in KNOWN_TRACES.values() if c == close), None)


def after_trace(text: str, close: str, opening: str | None = None) -> str | None:
    """The text after the last `close` in `text`, or None when the completion ends inside a trace: never closed, or
    re-opened after its last close (`opening` there; default: the named pair's, `opening_of(close)`)."""
    at = text.rfind(close)
    if at < 0:
        return None
    rest = text[at + len(close):]
    opening = opening or opening_of(close)
    return None if opening and opening in rest else rest


def score_traced(text: str, gold: str | int, stop_reason: str, close: str | None, opening: str | None = None) -> Score:
    """`harness.task.answers.score` of the answer part: the whole text without a trace (`close` None: overlong
    stays None), else the text after the last `close`; a completion that ends inside a trace (never closed, or
    re-opened by `opening` after its last close) scores no answer and is overlong when the row stopped at its
    token budget. `opening` defaults to the named pair's (`opening_of`)."""
    if close is None:
        return score(text, gold)
    answer_part = after_trace(text, close, opening)
    if answer_part is None:
        empty = score("", gold)  # no answer; the gold is still checked
        return dataclasses.replace(empty, overlong=stop_reason == "length")
    return dataclasses.replace(score(answer_part, gold), overlong=False)
