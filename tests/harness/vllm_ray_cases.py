"""execution=ray with vLLM workers, run by tests/harness/test_ray_vllm.py inside .venv-vllm (two engine starts: the
driver's and one Ray actor's):

    PYTHONPATH=. .venv-vllm/bin/python tests/harness/vllm_ray_cases.py OUT.json

The graft condition on the bundled model on vLLM (model=gemma3_270m_vllm), 2 problems, 2 seeded samples of 8 tokens,
run twice from one driver engine: in this process (execution=local), then by a Ray actor holding its own vLLM engine
(execution=ray execution.workers=1, a private Ray on 127.0.0.1). OUT.json holds both runs' rows (token ids, text,
first-logits SHA-256, stop reason), the worker's process id and whether any Ray process outlived the run.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main(out_path: str) -> int:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = str(REPO)  # the actor imports this checkout's harness
    from harness.config.model import load_model
    from harness.config.schema import compose_config, typed
    from harness.run.loop import run_rows

    tmp = Path(tempfile.mkdtemp(prefix="kvgraft-ray-vllm-"))
    common = ["model=gemma3_270m_vllm", f"project_root={REPO}", f"runs_dir={tmp / 'runs'}", "tracking=off",
              "condition=graft", "dataset.limit=2", "library.dataset.limit=2", f"library.root={tmp / 'library'}",
              f"library.store={tmp / 'store'}", "decoding=sample", "decoding.n_samples=2", "decoding.batch_size=2",
              "decoding.max_new_tokens=8"]
    local_cfg = compose_config([*common, "execution=local"])
    be = load_model(typed(local_cfg))
    local, _ = run_rows(local_cfg, be=be, progress=False, build_library_if_missing=True)
    import psutil

    from harness.run import distributed

    pids: list[int] = []
    spawned: list[psutil.Process] = []
    niceness: list[int] = []  # the worker and what it started (its vLLM engine core)
    start = distributed.RayPool._start_actor

    def remember(self):  # noqa: ANN001, ANN202 - the pool's own start, its worker's processes noted
        actor = start(self)
        pids.append(self.pids[actor])
        worker = psutil.Process(self.pids[actor])
        spawned.extend([worker, *worker.children(recursive=True)])
        niceness.append(worker.nice())
        return actor

    distributed.RayPool._start_actor = remember
    ray_run, _ = run_rows(compose_config([*common, "execution=ray", "execution.workers=1"]), be=be, progress=False)

    def rows(finished) -> list[dict]:  # noqa: ANN001
        return [{"problem": r.problem_id, "sample": r.sample, "tokens": r.completion.token_ids,
                 "text": r.completion.text, "stop": r.completion.stop_reason,
                 "first_logits_sha256": r.completion.first_logits_sha256, "correct": r.correct}
                for r in finished.rows]

    import ray

    ray_procs = [p for p in psutil.Process().children(recursive=True)
                 if any(k in " ".join(p.cmdline()[:2]) for k in ("ray", "raylet", "gcs_server"))]
    ray.shutdown()
    # waited for (up to 60 s), not a fixed sleep: under load a process that is going takes longer than 5 s
    # (issue 41, finding 7: one failed CI run); a process still there after 60 s is a leak
    psutil.wait_procs([p for p in {*spawned, *ray_procs} if p.is_running()], timeout=60)
    left = [f"{p.pid} {' '.join(p.cmdline()[:1])}" for p in {*spawned, *ray_procs}
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    Path(out_path).write_text(json.dumps({
        "left_running": left, "worker_processes": len(spawned), "worker_niceness": niceness,
        "driver_niceness": psutil.Process().nice(),
        "driver_pid": os.getpid(), "worker_pids": pids, "local": rows(local), "ray": rows(ray_run),
        "ray_folder": str(ray_run.folder.path), "ray_backend": ray_run.manifest["inputs"]["determinism"]["backend"],
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
