"""`execution=ray` with vLLM workers: a Ray actor holding its own vLLM engine (model=gemma3_270m_vllm) gives the rows
of the single-process run of the same config, token for token, first-logits SHA-256 and all, and leaves no Ray
process behind. The case runs inside .venv-vllm (tests/harness/vllm_ray_cases.py, started in the background once the
suite is collected: tests/conftest.py); it skips, saying why, where .venv-vllm does not exist (`make setup-vllm`)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_cases(vllm_engine_cases) -> dict:  # noqa: ANN001  (tests/conftest.py)
    return vllm_engine_cases.result("harness/vllm_ray_cases.py")


@pytest.mark.integration
def test_a_ray_worker_with_its_own_vllm_engine_gives_the_single_process_rows(ray_cases: dict) -> None:
    local, ray = ray_cases["local"], ray_cases["ray"]
    assert len(local) == 4 and [(r["problem"], r["sample"]) for r in ray] == [(r["problem"], r["sample"]) for r in local]
    assert ray == local  # token ids, text, stop reason, first-logits SHA-256, score
    assert all(r["first_logits_sha256"] and r["tokens"] for r in ray)
    assert ray_cases["worker_pids"] and ray_cases["driver_pid"] not in ray_cases["worker_pids"]  # another process
    assert ray_cases["ray_backend"] == "vllm"
    assert ray_cases["worker_niceness"] == [ray_cases["driver_niceness"]]  # not Ray's default 15: it does the work


@pytest.mark.integration
def test_no_ray_or_vllm_process_outlives_the_ray_run(ray_cases: dict) -> None:
    assert ray_cases["worker_processes"] >= 2  # the Ray worker and its vLLM engine core were watched
    assert ray_cases["left_running"] == []
