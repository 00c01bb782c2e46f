"""One harness run: problems -> condition -> decode -> score -> run folder (outputs, summary, manifest) ->
MLflow. `run(cfg)` takes a composed config and returns (RunFolder, Summary); `python -m harness`
(harness/__main__.py) is the Hydra entry; the graft-vs-baseline comparison is harness/compare/job.py.

The run folder format is harness/RUN_FORMAT.md. Everything is written locally before tracking is tried,
so an unreachable MLflow never loses a run.

The lifecycle (docs/reliability.md): the config is checked before the model loads (harness.config.schema.validate),
prompts against the model's context once the tokenizer is there (`fit_context`); a run killed (kill -9, power)
is resumed by the next run of the same config (same resume key: resolved config, problem rows, model and
tokenizer fingerprints, library manifest) from its outputs.partial.jsonl, in the same folder, with the same
seeds (`run.fresh=true` starts over), each resumed row checked first (its context recomputed, its completion
re-decoded from its token ids, its score recomputed: a row that does not check is recomputed, and the run
says so) and then re-decoded (its job recomputed with its seeds: the partial rows are unsigned input, kept
only when the recomputation reproduces them, else replaced by it, and the run says so); Ctrl-C and SIGTERM
stop between rows with one line (harness.errors.RunInterrupted) and leave the folder resumable; a run that
fails before its first row removes its folder.

Length: ~430 lines, one unit on purpose: the row loop, its resume, interruption and context-fit rules share the
run's state (folder, partial rows, seeds, meters), and splitting them would pass that state through every call;
the pieces that stand alone already live elsewhere (decode, run_folder, manifest, energy, tracking).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omegaconf import DictConfig
from rich.markup import escape
from rich.table import Table
from tqdm import tqdm

from harness.config.identity import RunIdentity
from harness.config.model import check_given_backend, load_model
from harness.config.schema import Config, recorded, typed
from harness.errors import ConfigError, RunFolderError, RunInterrupted, Terminated
from harness.errors import console as terminal_console
from harness.record.folder import FinishedRun, RunFolder
from harness.record.rows import STOP_REASONS, Row, Summary, group_note, run_label
from harness.run.conditions import CONDITIONS, build_condition
from harness.run.distributed import completer
from harness.run.energy import make_meter
from harness.task.chat import chat_frame, encode_prompt
from harness.task.problems import Problem, load_problems
from harness.task.prompts import render
from harness.task.trace import Trace, resolve_trace, score_traced
from harness.tracking.log import try_log_run_dir
from harness.tracking.store import default_tracking_uri
from kvstore import Backend, check_weights

__all__ = [
    "check_condition", "comparable_key", "cpu_seconds", "fit_context", "in_flight_record",
    "job_waves", "print_summary", "resume_key", "rows_depend_on_batch", "run", "run_rows",
]

# logs and pipes get full tables (140 columns) unless COLUMNS says how wide the reader is
console = terminal_console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 140)  # data escaped
NOT_EXACT = ("not guaranteed exact: determinism.allow_environment_mismatch=true lets grafts of artifacts deposited "
             "in another compute environment through")


def comparable_key(c: Config, be: Backend) -> str:
    """Runs with the same key differ only in condition/library (harness.config.identity.RunIdentity owns it, with
    every setting's "absent in runs made before it existed" rule)."""
    return RunIdentity(be, c.run.in_flight).comparable_key(c)


def rows_depend_on_batch(be: Backend, in_flight: int) -> bool:
    """Whether rows decoded with `in_flight` problems together may differ in their bits from the same rows decoded
    one problem at a time (the backend's fact, `Backend.rows_depend_on_batch`)."""
    return RunIdentity(be, in_flight).rows_depend_on_batch()


def in_flight_record(be: Backend, in_flight: int) -> dict[str, Any] | None:
    """The manifest's `inputs.in_flight` (None at 1: recorded as before the setting existed; RunIdentity)."""
    return RunIdentity(be, in_flight).in_flight_record()


def check_condition(name: str) -> None:
    """A ConfigError naming condition.name, with the near miss, when the registry has no such condition: raised
    before the model loads."""
    if name not in CONDITIONS:
        near = difflib.get_close_matches(name, list(CONDITIONS), n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise ConfigError(f"condition.name={name!r}: {hint}use one of {', '.join(CONDITIONS)} (configs/condition/)")


def resume_key(config: dict[str, Any], problems: list[Problem], be: Backend,
               library: str | None) -> str:
    """What an interrupted run must share with this one to be resumed by it (RunIdentity.resume_key): the recorded
    config (run.fresh left out), the problem rows, the model and tokenizer fingerprints, the backend and the library
    manifest."""
    return RunIdentity(be).resume_key(config, problems, library)


def fit_context(problems: list[Problem], be: Backend, c: Config) -> list[Problem]:
    """Every problem whose prompt plus decoding.max_new_tokens exceeds the model's context: refused (a ConfigError
    naming it, run.context_overflow=refuse) or its text cut to fit (truncate: said on screen and recorded in the
    problem row's source as {"context_overflow": {"prompt_tokens", "kept_problem_tokens"}}). Checked after the
    tokenizer loads and before any prefill; a library condition's grafted entry adds to the prompt (not counted)."""
    limit = be.context_size()  # transformers: max_position_embeddings; llama.cpp: n_ctx; vLLM: max_model_len
    if limit is None:
        return problems
    frame = chat_frame(be, c.model.chat)
    budget = limit - c.decoding.max_new_tokens
    out = []
    for p in problems:
        n = len(encode_prompt(be, frame, render(c.prompt.template, problem=p.problem)))
        if n <= budget:
            out.append(p)
            continue
        if budget <= 0 or c.run.context_overflow == "refuse":
            raise ConfigError(
                f"problem {p.id}: its prompt is {n:,} tokens, and with decoding.max_new_tokens="
                f"{c.decoding.max_new_tokens} exceeds the model's context of {limit:,}; drop the problem, lower "
                "decoding.max_new_tokens, or set run.context_overflow=truncate to cut its text to fit"
            )
        ids = be.encode(p.problem, add_bos=False)
        keep = len(ids) - (n - budget)
        while keep > 0:
            text = be.decode(ids[:keep])
            if len(encode_prompt(be, frame, render(c.prompt.template, problem=text))) <= budget:
                break
            keep -= max(1, keep // 100)
        if keep <= 0:
            raise ConfigError(f"problem {p.id}: the prompt template alone exceeds the model's context of {limit:,}")
        console.print(f"[yellow]problem {p.id}: prompt of {n:,} tokens > context {limit:,} - "
                      f"{c.decoding.max_new_tokens} new tokens: text cut to its first {keep:,} tokens "
                      "(run.context_overflow=truncate)[/]")
        source = {**p.source, "context_overflow": {"prompt_tokens": n, "kept_problem_tokens": keep}}
        out.append(dataclasses.replace(p, problem=text, source=source))
    return out


def run(cfg: DictConfig, *args: Any, **kwargs: Any) -> tuple[RunFolder, Summary]:
    """Run the configured condition over the configured problems, write the run folder (a new one under
    `runs_dir` unless `folder` is given), log it to MLflow if tracking is on; return the folder and summary.
    An interrupted run of the same config is resumed instead (unless run.fresh): the one in `folder` itself, or
    the newest one under `resume_from` (default, when `folder` is None: runs_dir/<condition>/). The arguments
    are `run_rows`'s: folder, be, progress, build_library_if_missing, resume_from, exact_default."""
    finished, _ = run_rows(cfg, *args, **kwargs)
    return finished.folder, finished.summary


def _open_folder(
    folder: RunFolder | str | Path | None, search: Path | None, runs: Path, condition: str, key: str, fresh: bool
) -> tuple[RunFolder, list[Row], str | None]:
    """The folder this run writes (locked) and the rows an interrupted attempt left there (resume), plus the
    attempt's start time. A given folder nobody resumes into is discarded when it holds nothing yet."""
    given = None if folder is None else folder if isinstance(folder, RunFolder) else RunFolder(folder)
    if not fresh:
        found = None
        if given is not None and given.path.is_dir() and given.resume_info().get("resume_key") == key:
            found = given if given.lock() and not given.is_complete() else None
        if found is None and search is not None:
            found = RunFolder.find_resumable(search, key)
        if found is not None:
            done = found.resume()
            if given is not None and given != found:
                given.discard()  # Hydra's fresh folder for this attempt: the run continues in the old one
            return found, done, found.resume_info().get("started_at")
    return (given or RunFolder.new(runs, condition)), [], None


def _done_prefix(rows: list[Row], jobs: list[tuple[Problem, list[int]]], folder: RunFolder) -> list[Row]:
    """The rows of an interrupted attempt that this run keeps: the longest prefix covering whole jobs (a batch is
    redone whole: its bits depend on the batch), each row the (problem, sample) the plan has at its place."""
    expected = [(p.id, s) for p, samples in jobs for s in samples]
    for i, r in enumerate(rows):
        if i >= len(expected) or (r.problem_id, r.sample) != expected[i]:
            want = f"{expected[i][0]} sample {expected[i][1]}" if i < len(expected) else "no more rows"
            raise RunFolderError(
                f"{folder.file('outputs.partial.jsonl')}, line {i + 1}: {r.problem_id} sample {r.sample} where this "
                f"run's plan has {want}; start over with run.fresh=true"
            )
    keep, n = 0, 0
    for _, samples in jobs:
        if n + len(samples) > len(rows):
            break
        n += len(samples)
        keep = n
    return rows[:keep]


def _row_problem(row: Row, problem: Problem, condition: Any, be: Backend, stop: tuple[str, ...],
                 contexts: dict[str, Any], close: str | None = None, opening: str | None = None) -> str | None:
    """What is wrong with a resumed row of `problem`, or None when it checks: its condition and group, its prompt
    and context token ids (the condition's context, recomputed without the model), its completion re-decoded from
    its token ids and cut at the first stop string, its token count, and its score recomputed from that text."""
    c = row.completion
    if (row.condition, row.group) != (condition.name, getattr(condition.group, "value", condition.group)):
        return f"condition/group {row.condition}/{row.group}, this run's {condition.name}/{condition.group}"
    if problem.id not in contexts:
        contexts[problem.id] = condition.context(problem)
    ctx = contexts[problem.id]
    if c.prompt != ctx.prompt or list(c.context_ids) != list(ctx.context_ids):
        return "its prompt or context token ids are not this condition's for the problem"
    if ctx.match is not None and (c.retrieval is None or (c.retrieval.entry_id, c.retrieval.artifact_id) != (
            ctx.match.entry.entry_id, ctx.match.entry.artifact_id)):
        return "its retrieval is not the library entry this run retrieves"
    text = be.decode(list(c.token_ids))
    hits = [text.find(s) for s in stop if s and s in text]
    if hits:
        text = text[: min(hits)]
    if text != c.text:
        return "its completion text is not the decoding of its token ids"
    if c.stop_reason not in STOP_REASONS or c.decode_tokens != len(c.token_ids) + (c.stop_reason == "eos"):
        return f"stop reason {c.stop_reason!r} / decode_tokens {c.decode_tokens} disagree with its token ids"
    s = score_traced(text, problem.answer, c.stop_reason, close, opening)
    if row.trace_close != close or (row.overlong is not None and row.overlong != s.overlong):
        return f"its trace (closing {row.trace_close!r}, overlong {row.overlong}) is not this run's ({close!r})"
    if (row.gold, row.extracted, row.answer, row.correct) != (problem.answer, s.extracted, s.answer, s.correct):
        return (f"its score (gold {row.gold!r}, extracted {row.extracted!r}, correct {row.correct}) is not the "
                f"score of its completion (gold {problem.answer!r}, {s.extracted!r}, {s.correct})")
    return None


def _checked_rows(rows: list[Row], jobs: list[tuple[Problem, list[int]]], condition: Any, be: Backend,
                  stop: tuple[str, ...], folder: RunFolder, close: str | None = None,
                  opening: str | None = None) -> tuple[list[Row], str | None]:
    """The resumed rows up to the first whole job holding a row that does not check (`_row_problem`), and a line
    saying which row failed and how many rows are recomputed (None when all check)."""
    by_id = {p.id: p for p, _ in jobs}
    contexts: dict[str, Any] = {}
    n = 0
    for _, samples in jobs:
        job = rows[n:n + len(samples)]
        for r in job:
            why = _row_problem(r, by_id[r.problem_id], condition, be, stop, contexts, close, opening)
            if why is not None:
                return rows[:n], (f"{folder.file('outputs.partial.jsonl')}: {r.problem_id} sample {r.sample} does "
                                  f"not check ({why}): it and the {len(rows) - n - 1} rows after it are dropped "
                                  "and recomputed")
        n += len(job)
        if n >= len(rows):
            break
    return rows, None


def same_computation(recorded: Row, recomputed: Row) -> bool:
    """Whether a recomputed row reproduces a recorded one: everything computed (context, tokens, text, stop,
    first-logits hash, seed, retrieval, score) equal; the measured costs (wall, CPU, energy, TTFT) may differ."""
    def computed(r: Row) -> Row:
        c = dataclasses.replace(r.completion, ttft_s=None)
        return dataclasses.replace(r, completion=c, wall_s=0.0, cpu_s=0.0, energy_j=None, energy_status="")
    return computed(recorded) == computed(recomputed)


def cpu_seconds() -> float:
    """CPU seconds of this process and of its live child processes: an engine that computes in a child of its own
    (vLLM's engine core) counts, as its energy estimate does. A child that ends in between takes its seconds with it
    (the row's figure is then a lower bound; never below 0)."""
    import psutil

    total = time.process_time()
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return total
    for child in children:
        try:
            t = child.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            continue
    return total


def run_rows(
    cfg: DictConfig,
    folder: RunFolder | str | Path | None = None,
    be: Backend | None = None,
    progress: bool = True,
    build_library_if_missing: bool = False,
    resume_from: str | Path | None = None,
    exact_default: str | None = None,
) -> tuple[FinishedRun, str | None]:
    """`run`, returning the records it wrote (the compare job pairs rows and logs its comparison from them) and
    the MLflow run id (None when tracking is off or logging is pending). `exact_default`: the one line the entry
    point printed when the exact default was set off for this run (harness.config.exact.resolve), recorded in
    summary.json and the manifest so the folder says why its rows were not computed in the mode."""
    c = typed(cfg)
    check_condition(c.condition.name)
    root = Path(c.project_root)
    runs = root / c.runs_dir
    d = c.dataset
    problems = load_problems(
        str(root / d.path) if d.path else None, d.hub_id, d.subset, d.split, dict(d.columns), d.limit
    )
    if be is None:
        be = load_model(c)
    else:
        check_given_backend(c, be)  # the rows are the given model's: the config must record its settings
    identity = RunIdentity(be, c.run.in_flight)
    problems = fit_context(problems, be, c)
    frame = chat_frame(be, c.model.chat)  # the model's chat template around every prompt (model.chat=model)
    trace = resolve_trace(c.model.trace, be.chat_template() if c.model.trace == "model" else None)
    condition = build_condition(
        c.condition.name, be, c.prompt, c.decoding, c.library, root, build_library_if_missing=build_library_if_missing,
        settings=c.condition.settings, chat=frame,
    )
    desc = condition.describe()
    config = recorded(cfg)
    key = identity.resume_key(config, problems, desc.get("library", {}).get("manifest_sha256"))
    search = Path(resume_from) if resume_from is not None else (runs / c.condition.name if folder is None else None)
    n, bs = c.decoding.n_samples, c.decoding.batch_size
    jobs = [(p, list(range(s, min(s + bs, n)))) for p in problems for s in range(0, n, bs)]
    try:
        folder, done, first_started = _open_folder(folder, search, runs, c.condition.name, key, c.run.fresh)
    except BaseException:
        condition.close()
        raise
    rows: list[Row] = []
    try:
        if done:
            rows, dropped = _checked_rows(_done_prefix(done, jobs, folder), jobs, condition, be,
                                          tuple(c.prompt.stop), folder, trace.close if trace else None,
                                          trace.open if trace else None)
            if len(rows) != len(done):
                folder.keep_rows(rows)
            if dropped:
                console.print(f"[yellow]warning:[/] {escape(dropped)}")
            console.print(f"resuming the interrupted run in {folder.path}: {len(rows)} of {len(problems) * n} rows "
                          "already done (outputs.partial.jsonl), same seeds; each is re-decoded and kept only if "
                          "reproduced; run.fresh=true starts over")
        else:
            folder.begin(key, datetime.now(UTC).isoformat())
        # scale-out hook: execution=ray computes the remaining jobs on Ray actors, handed back in job order
        rows, run_energy, t_run, started_at = _decode(
            c, condition, jobs, folder, rows, progress,
            lambda remaining: completer(c, condition, be, problems, remaining, build_library_if_missing),
            guard=lambda: check_weights(be), trace=trace)
    except KeyboardInterrupt as exc:
        condition.close()
        signum = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        folder.release()
        kept = folder.has_rows()
        if not kept:
            folder.discard()
        where = (f"{folder.path} keeps them: re-run the same command to resume (run.fresh=true starts over)" if kept
                 else "nothing to resume, the empty folder was removed")
        raise RunInterrupted(f"{signal.Signals(signum).name}: the run stopped after {len(rows)} of "
                             f"{len(problems) * n} rows; {where}", signum) from None
    except BaseException:
        condition.close()
        folder.release()
        folder.discard()  # only when it holds no rows: a run with rows stays resumable
        raise
    started_at = first_started or started_at

    summary = Summary.of(
        rows, condition=condition.name, model=be.model_name, dataset=d.name, run_dir=str(folder.path),
        comparable_key=identity.comparable_key(c), run_wall_s=time.perf_counter() - t_run,
        energy_status=run_energy.status, energy_j=run_energy.joules, group=condition.group,
        started_at=started_at, finished_at=datetime.now(UTC).isoformat(),
    )
    exactness = NOT_EXACT if be.allows_environment_mismatch() else None
    if exactness:
        summary = dataclasses.replace(summary, exactness=exactness)
    if exact_default and not be.batch_invariant():  # the note of the run that was set off (never of one in the mode)
        summary = dataclasses.replace(summary, exact_default=exact_default)
    try:
        finished = folder.finish(
            config=config,
            problems=[p.to_row() for p in problems],
            rows=rows,
            summary=summary,
            prompt_template=c.prompt.template if frame is None else frame.prefix + c.prompt.template + frame.suffix,
            model_fingerprint=be.fingerprint,
            tokenizer_fingerprint=be.tokenizer_fingerprint,
            determinism=be.settings(),  # transformers: the Determinism's dict; llama.cpp: "backend" + settings
            environment=be.environment(),
            library={k: desc["library"][k] for k in ("name", "version", "manifest_sha256")} if "library" in desc
            else None,
            exactness=exactness,
            exact_default=summary.exact_default,
            **identity.manifest_inputs(),  # in_flight, row_schedule
        )
    finally:
        folder.release()  # a finish that failed (disk full) leaves the rows in outputs.partial.jsonl: resumable
    run_id = None
    if c.tracking.enabled:
        uri = c.tracking.uri or default_tracking_uri((root / c.runs_dir).resolve())
        run_id = _track(finished, uri, c.tracking.experiment, None)  # named by condition, group, data, model
    print_summary(summary, folder, c.decoding.max_new_tokens, config)
    return finished, run_id


def job_waves(jobs: list[tuple[Problem, list[int]]], in_flight: int) -> list[list[int]]:
    """The job indices decoded together, in order: each wave the next jobs of at most `in_flight` problems (1: one
    job at a time). Fixed by the plan alone, so a resumed run recomputes the same waves (same batch composition)."""
    waves: list[list[int]] = []
    seen: set[str] = set()
    for i, (problem, _) in enumerate(jobs):
        if not waves or in_flight <= 1 or (problem.id not in seen and len(seen) >= in_flight):
            waves.append([])
            seen = set()
        waves[-1].append(i)
        seen.add(problem.id)
    return waves


def _decode(
    c: Config, condition: Any, jobs: list[tuple[Problem, list[int]]], folder: RunFolder, rows: list[Row],
    progress: bool, completer_for: Callable[[list[tuple[Problem, list[int]]]], Callable[..., Any]] | None = None,
    guard: Callable[[], None] | None = None, trace: Trace | None = None,
) -> tuple[list[Row], Any, float, str]:
    """Decode every job past the rows already done, appending each row to the folder as it finishes (scored after
    the `trace`'s closing delimiter when there is one); returns all rows (`rows` itself, extended as rows finish),
    the run's energy reading, its start (perf counter) and start time."""
    close, opening = (trace.close, trace.open) if trace else (None, None)
    meter, run_meter = make_meter(c.energy.meter), make_meter(c.energy.meter)
    t_run, started_at = time.perf_counter(), datetime.now(UTC).isoformat()
    run_meter.start()
    n_total = sum(len(samples) for _, samples in jobs)
    bar = tqdm(total=n_total, initial=0, desc=f"{condition.name} {c.dataset.name}", unit="sample",
               disable=not progress)
    tokens = tqdm(total=n_total * c.decoding.max_new_tokens, desc="tokens (at most)", unit="tok",
                  disable=not progress, leave=False)
    skip, first = len(rows), 0
    while first < len(jobs) and skip >= len(jobs[first][1]):  # whole jobs the interrupted attempt finished
        skip -= len(jobs[first][1])
        first += 1
    # the rows an interrupted attempt left are unsigned input: every one is re-decoded (its job recomputed, same
    # seeds) and kept only when the recomputation reproduces it; one that does not is replaced by the recomputed
    # row, and the run says so (issue 41, finding 1)
    done, rows[:] = list(rows), []
    complete = completer_for(jobs) if completer_for is not None else condition.complete_samples
    replaced: list[str] = []
    in_flight = c.run.in_flight
    waves = job_waves(jobs, in_flight)
    try:
        for w, wave in enumerate(waves):
            ahead = {jobs[i][0].id: jobs[i][0] for i in (waves[w + 1] if w + 1 < len(waves) else [])}
            for i in wave:
                ahead.pop(jobs[i][0].id, None)
            for problem in ahead.values():
                condition.upcoming(problem)  # its artifact is read while this wave decodes
            w0, c0 = time.perf_counter(), cpu_seconds()
            meter.start()
            if in_flight > 1:  # the wave's problems in flight together (the engine batches every row)
                results = condition.complete_jobs([jobs[i] for i in wave], on_token=tokens.update)
            else:
                results = [complete(jobs[i][0], jobs[i][1], on_token=tokens.update) for i in wave]
            energy = meter.stop()
            if guard is not None:
                guard()  # the model's files are the ones fingerprinted, or no row of this wave is written
            # a batch's cost (a wave's, with problems in flight) is shared evenly by its rows
            k = sum(len(r) for r in results)
            wall, cpu = (time.perf_counter() - w0) / k, max(0.0, cpu_seconds() - c0) / k
            joules = energy.joules / k if energy.joules is not None else None
            for i, completions in zip(wave, results, strict=True):
                problem, samples = jobs[i]
                new = [Row.scored(
                    problem.id, sample, condition.name, condition.group, completion, problem.answer,
                    score_traced(completion.text, problem.answer, completion.stop_reason, close, opening),
                    wall_s=round(wall, 6), cpu_s=round(cpu, 6), energy_j=joules, energy_status=energy.status,
                    trace_close=close,
                ) for sample, completion in zip(samples, completions, strict=True)]
                if i < first:  # a job the interrupted attempt finished: its recorded rows against their recomputation
                    old = done[len(rows):len(rows) + len(new)]
                    bad = [o for o, r in zip(old, new, strict=True) if not same_computation(o, r)]
                    if not bad and not replaced:
                        rows.extend(old)  # reproduced, already on disk as they were (their recorded costs kept)
                    else:
                        if not replaced:
                            folder.keep_rows(rows)  # the rows up to here were reproduced; the rest are rewritten
                        replaced += [f"{o.problem_id} sample {o.sample}" for o in bad]
                        keep = old if not bad else new
                        for row in keep:
                            rows.append(row)
                            folder.append(row)
                else:
                    for row in new:
                        rows.append(row)
                        folder.append(row)  # nothing lost if the run is interrupted: rows so far stay on disk
                if i + 1 == first and replaced:
                    note = (f"{len(replaced)} of the {len(done)} resumed rows were not reproduced by re-decoding "
                            f"them ({', '.join(replaced[:5])}{', ...' if len(replaced) > 5 else ''}): the recomputed "
                            f"rows replace them in {folder.file('outputs.partial.jsonl')}")
                    console.print(f"[yellow]warning:[/] {escape(note)}")
                bar.update(len(new))
            bar.set_postfix(correct=f"{sum(r.correct for r in rows)}/{len(rows)}")
    finally:
        tokens.close()
        bar.close()
    condition.close()
    return rows, run_meter.stop(), t_run, started_at


def _track(finished: FinishedRun, uri: str, experiment: str, run_name: str | None) -> str | None:
    """Log the run from the records it just wrote (harness.tracking.log: nothing read back)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_id = try_log_run_dir(finished, tracking_uri=uri, experiment=experiment, run_name=run_name)
    for w in caught:
        if issubclass(w.category, RuntimeWarning):
            console.print(f"[yellow]warning:[/] {w.message}")
    if run_id:
        console.print(f"MLflow: run {run_id} in {uri} (experiment {experiment})")
    return run_id


def stops_text(stop_reasons: dict[str, int] | None) -> str:
    """"eos/stop/length" counts, e.g. "0/5/1"; "n/a" for a summary written before stop reasons were counted."""
    if not stop_reasons:
        return "n/a"
    return "/".join(str(stop_reasons.get(k, 0)) for k in STOP_REASONS)


def print_summary(summary: Summary, folder: RunFolder, budget: int | None = None,
                  config: dict[str, Any] | None = None) -> None:
    """The run's figures in one terminal table, titled with the condition (its group, a random-entry control:
    `run_label`), data, model and token budget."""
    s, t, e = summary.scores, summary.tokens, summary.energy
    name = run_label(summary, config)
    maj = s.maj()
    cells = {
        "problems": str(s.n_problems),
        "accuracy [95% CI]": f"{s.accuracy:.3f} [{s.accuracy_ci_low:.3f}, {s.accuracy_ci_high:.3f}]",
        **({f"maj@{maj[0]}": f"{maj[1]:.3f}"} if maj and maj[0] > 1 else {}),
        **({"overlong": f"{s.overlong} ({s.overlong_rate or 0.0:.0%})"} if s.overlong is not None else {}),
        "prompt tok": str(t.prompt), "prefill tok": str(t.prefill), "grafted tok": str(t.grafted),
        "decode tok": str(t.decode), "TTFT s (mean)": f"{(summary.time.ttft_s or 0.0) / max(s.n_rows, 1):.3f}",
        "stops eos/stop/length": stops_text(summary.stop_reasons), "wall s": f"{summary.time.wall_s:.1f}",
        "cpu s": f"{summary.time.cpu_s:.1f}", "energy": e.text(),
    }
    title = f"{name} on {summary.dataset} ({summary.model})" + (f" | {budget} tokens" if budget else "")
    # one row when every value fits the terminal whole (3 columns of padding and rule per cell); else one line per
    # figure, so a narrow terminal (80 columns) shows every value instead of cutting each to an ellipsis
    wide = 1 + sum(max(len(k), len(v)) + 3 for k, v in cells.items())
    if wide <= console.width:
        table = Table(title=title)
        for col in cells:
            table.add_column(col, no_wrap=True)
        table.add_row(*cells.values())
    else:
        table = Table(title=title, show_header=False)
        table.add_column("figure", no_wrap=True)
        table.add_column("value", overflow="fold")
        for k, v in cells.items():
            table.add_row(k, v)
    console.print(table)
    hit = (summary.stop_reasons or {}).get("length", 0)
    if hit:
        console.print(f"[yellow]{hit} of {s.n_rows} rows hit the token budget (decoding.max_new_tokens): their "
                      "answers were cut off[/]")
    if group_note(summary):
        console.print(f"[yellow]{group_note(summary)}[/]")
    console.print(f"energy: {e.label}")
    if summary.exactness:
        console.print(f"[yellow]{summary.exactness}[/]")
    console.print(f"run folder: {folder.path}   (re-check: make rescore RUN={folder.path})")
