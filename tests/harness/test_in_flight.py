"""Problems in flight (run.in_flight=N, issue 42): the jobs of up to N problems decode in one engine batch, rows are
written in problem order, a kill at any point resumes to the rows of an uninterrupted run, and the manifest says
whether the rows depend on the batch's composition.

On transformers with determinism.batch_invariant=true the rows with N > 1 are the rows of N = 1 bit for bit (token
ids, first-logits SHA-256, seeds), greedy and seeded sampling; in the default mode the manifest records that rows
depend on batch composition and the comparable key moves with N. The fake backend's two capabilities (RaggedRows,
step-wise; InEngineBatches, in-engine) give the rows of one problem at a time. On the tiny random-weight Gemma 3
(sliding windows of 64 keys, prompts of different lengths, so the joined rows are really left-padded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config.model import load_model
from harness.config.schema import compose_config, typed, validate
from harness.errors import ConfigError, RunInterrupted
from harness.record.folder import RunFolder
from harness.run.loop import comparable_key, job_waves, run
from harness.task.problems import Problem
from kvstore import Determinism, InEngineBatches, RaggedRows, load_backend

REPO = Path(__file__).resolve().parents[2]
COMPUTED = ("problem_id", "sample", "completion_token_ids", "first_logits_sha256", "seed", "stop_reason",
            "completion", "correct")


@pytest.fixture(scope="module")
def invariant():
    return load_backend("transformers", source="tiny-gemma3", determinism=Determinism(batch_invariant=True))


@pytest.fixture(scope="module")
def default():
    return load_backend("transformers", source="tiny-gemma3")


def _cfg(tmp: Path, name: str, *extra: str):
    return compose_config(["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp}/{name}", "dataset.limit=6",
                           "decoding.max_new_tokens=10", "prompt.stop=[]", "tracking=off", "energy=none", *extra])


def _rows(folder) -> list[tuple]:
    path = Path(folder.path if hasattr(folder, "path") else folder)
    return [tuple(json.dumps(r.get(k)) for k in COMPUTED) for r in map(json.loads, open(path / "outputs.jsonl"))]


def _manifest(folder) -> dict:
    return json.loads((folder.path / "manifest.json").read_text())


def test_waves_are_consecutive_jobs_of_at_most_n_problems() -> None:
    p = [Problem(f"p{i}", "x", "1") for i in range(5)]
    jobs = [(p[0], [0, 1]), (p[0], [2]), (p[1], [0, 1]), (p[1], [2]), (p[2], [0, 1]), (p[3], [0]), (p[4], [0])]
    assert job_waves(jobs, 1) == [[i] for i in range(7)]
    assert job_waves(jobs, 2) == [[0, 1, 2, 3], [4, 5], [6]]
    assert job_waves(jobs, 9) == [list(range(7))]


@pytest.mark.parametrize("decoding", [["decoding=greedy"],
                                      ["decoding=sample", "decoding.n_samples=3", "decoding.batch_size=3"]],
                         ids=["greedy", "sample-3"])
def test_batch_invariant_rows_in_flight_equal_one_problem_at_a_time(tmp_path: Path, invariant, decoding) -> None:
    folders = {}
    for n in (1, 4):
        cfg = _cfg(tmp_path, f"n{n}", "determinism.batch_invariant=true", f"run.in_flight={n}", *decoding)
        folders[n], _ = run(cfg, be=invariant, progress=False)
    one, four = _rows(folders[1]), _rows(folders[4])
    assert len(one) == len(four) >= 6 and one == four  # problem order, every computed field, bit for bit
    record = _manifest(folders[4])["inputs"]["in_flight"]
    assert record == {"problems": 4, "rows_depend_on_batch_composition": False,
                      "note": "rows equal one problem at a time (determinism.batch_invariant)"}
    assert "in_flight" not in _manifest(folders[1])["inputs"]
    assert "in_flight" not in (folders[1].path / "config.yaml").read_text()  # N=1 records as before the setting
    assert "in_flight: 4" in (folders[4].path / "config.yaml").read_text()
    keys = {n: comparable_key(typed(_cfg(tmp_path, "k", "determinism.batch_invariant=true", f"run.in_flight={n}",
                                         *decoding)), invariant) for n in (1, 4)}
    assert keys[1] == keys[4]  # the same bits: comparable


def test_prompts_of_different_lengths_are_really_joined(tmp_path: Path, invariant) -> None:
    calls = []
    join = type(invariant).join_rows

    def counting(self, states):
        calls.append([int(s.get_seq_length()) for s in states])
        return join(self, states)

    type(invariant).join_rows = counting
    try:
        run(_cfg(tmp_path, "j", "determinism.batch_invariant=true", "run.in_flight=4"), be=invariant, progress=False)
    finally:
        type(invariant).join_rows = join
    assert calls and len(calls[0]) == 4 and len(set(calls[0])) > 1, calls  # 4 contexts of different lengths


def test_default_mode_records_that_rows_depend_on_the_batch(tmp_path: Path, default) -> None:
    folder, _ = run(_cfg(tmp_path, "d", "run.in_flight=3", "determinism.batch_invariant=false"), be=default,
                    progress=False)
    record = _manifest(folder)["inputs"]["in_flight"]
    assert record["problems"] == 3 and record["rows_depend_on_batch_composition"] is True
    assert record["note"] == "rows depend on batch composition"
    keys = {n: comparable_key(typed(_cfg(tmp_path, "k", f"run.in_flight={n}", "determinism.batch_invariant=false")),
                              default) for n in (1, 3)}
    assert keys[1] != keys[3]  # other bits: never compared as if they were one computation


def _kill_then_resume(tmp_path: Path, cfg, fm, stop_after: int, monkeypatch) -> tuple:
    """An uninterrupted run of `cfg("whole")`; `cfg("killed")` stopped (KeyboardInterrupt) right after writing its
    `stop_after`-th row, then run again. Returns (whole, the partial file's row count, its folder, resumed)."""
    whole, _ = run(cfg("whole"), be=fm, progress=False)
    append, calls = RunFolder.append, []

    def append_then_stop(self, row):
        append(self, row)
        calls.append(row)
        if len(calls) == stop_after:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunFolder, "append", append_then_stop)
    with pytest.raises(RunInterrupted):
        run(cfg("killed"), be=fm, progress=False)
    monkeypatch.setattr(RunFolder, "append", append)
    [partial] = (tmp_path / "killed").glob("*/*/outputs.partial.jsonl")
    written = len(partial.read_text().splitlines())
    resumed, _ = run(cfg("killed"), be=fm, progress=False)
    return whole, written, partial.parent, resumed


def test_a_kill_during_an_in_flight_run_resumes_to_the_uninterrupted_rows(tmp_path: Path, invariant,
                                                                           monkeypatch) -> None:
    extra = ("determinism.batch_invariant=true", "run.in_flight=4", "decoding=sample", "decoding.n_samples=2",
             "decoding.batch_size=2")
    # killed in the middle of writing the second wave's rows
    whole, written, folder, resumed = _kill_then_resume(
        tmp_path, lambda name: _cfg(tmp_path, name, *extra), invariant, 9, monkeypatch)
    assert written == 9
    assert resumed.path == folder and _rows(resumed) == _rows(whole)


@pytest.mark.parametrize("in_engine", [False, True], ids=["ragged-rows", "in-engine-batches"])
def test_a_kill_during_an_in_flight_run_on_the_fake_backend_resumes_to_the_uninterrupted_rows(
        tmp_path: Path, in_engine: bool, monkeypatch) -> None:
    script = "+model.fake.script.answer=': 42 and then some more'"
    flag = f"model.fake.in_engine={str(in_engine).lower()}"
    be = load_model(typed(compose_config(["model=fake", script, flag])))

    def cfg(name: str):
        return compose_config(["model=fake", script, flag, "dataset.limit=7", "tracking=off", "energy=none",
                               "decoding=sample", "decoding.n_samples=3", "decoding.batch_size=3",
                               "decoding.max_new_tokens=12", f"project_root={REPO}", f"runs_dir={tmp_path}/{name}",
                               "run.in_flight=3"])

    # killed inside the second wave (row 10 of 21: its first problem's first row)
    whole, written, folder, resumed = _kill_then_resume(tmp_path, cfg, be, 10, monkeypatch)
    assert written == 10
    assert resumed.path == folder and _rows(resumed) == _rows(whole) and len(_rows(whole)) == 21


@pytest.mark.parametrize("in_engine", [False, True], ids=["ragged-rows", "in-engine-batches"])
def test_the_fake_backends_in_flight_rows_equal_one_at_a_time(tmp_path: Path, in_engine: bool) -> None:
    script = "+model.fake.script.answer=': 42 and then some more'"
    flag = f"model.fake.in_engine={str(in_engine).lower()}"
    be = load_model(typed(compose_config(["model=fake", script, flag])))
    assert isinstance(be, InEngineBatches) if in_engine else isinstance(be, RaggedRows)
    folders = {}
    for n in (1, 3):
        cfg = compose_config(["model=fake", script, flag, "dataset.limit=5", "tracking=off", "energy=none",
                              "decoding.max_new_tokens=12", f"project_root={REPO}", f"runs_dir={tmp_path}/n{n}",
                              f"run.in_flight={n}"])
        folders[n], _ = run(cfg, be=be, progress=False)
    assert _rows(folders[1]) == _rows(folders[3]) and len(_rows(folders[3])) == 5
    assert be.calls["continue_many" if in_engine else "joins"] >= 2  # two waves (3 + 2 problems) went through it


def test_in_flight_is_refused_with_ray_and_below_one() -> None:
    with pytest.raises(ConfigError, match=r"run.in_flight=2 with execution=ray"):
        validate(typed(compose_config(["model=fake", "execution=ray", "run.in_flight=2"])))
    with pytest.raises(ConfigError, match=r"run.in_flight"):
        validate(typed(compose_config(["model=fake", "run.in_flight=0"])))


def test_the_compare_job_says_it_cannot_check_twins_whose_rows_depend_on_the_batch(tmp_path: Path, capsys) -> None:
    from harness.compare.job import main

    with pytest.raises(SystemExit):
        main(["model=tiny_gemma3", f"project_root={REPO}", f"runs_dir={tmp_path}", "dataset.limit=2", "tracking=off",
              "run.in_flight=2", "determinism.batch_invariant=false"])  # the mode whose rows depend on the batch
    err = capsys.readouterr().err
    assert "twin check could not be made" in err and "run.in_flight=1" in err
    assert not (tmp_path / "compare").exists()  # refused before any run


def test_llama_cpp_decodes_one_context_at_a_time_and_says_so(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="needs llama-cpp-python: make setup")
    cfg = compose_config(["model=gemma3_270m_llamacpp", f"project_root={REPO}", f"runs_dir={tmp_path}",
                          "dataset.limit=2", "tracking=off", "run.in_flight=2"])
    with pytest.raises(ConfigError, match=r"run.in_flight=2: the llamacpp backend decodes one context at a time"):
        run(cfg, progress=False)
    assert not list(tmp_path.glob("baseline/*"))  # refused before any folder or row
