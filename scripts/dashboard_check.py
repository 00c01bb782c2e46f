"""Look at the MLflow dashboard as a reviewer would: screenshots of its pages in headless Chromium (by hand, not CI).

    make aime-graft ARGS="dataset.limit=4 decoding.max_new_tokens=16"
    .venv/bin/python scripts/dashboard_check.py [--store runs/mlflow.db] [--out runs/dashboard] [--docs docs/img]
    .venv/bin/python scripts/dashboard_check.py --trace-cost 40     # logging time with and without traces

Starts ``mlflow ui`` on a free local port against the store, finds the newest compare job (parent run, tag
``job=compare``) and saves PNGs of what a reviewer reads: the runs table in the shared headline view
(``harness.tracking.log.view_url``), the parent run, a nested (held-out graft) run, the parent's per-problem table,
its summary page and the library run (``--docs docs/img`` copies them there); ``--all`` adds the page the
experiment opens on, the nested run's outputs table and traces, the experiment's traces and the accuracy plot.
Needs Debian's ``chromium`` (``apt-get install -y chromium``). The server is stopped at the end.
``--trace-cost N`` instead logs a hand-built N-row run folder to a temporary store twice (traces off, then on)
and prints both wall times.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"error: mlflow ui exited with status {proc.returncode}; see its output above")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"error: mlflow ui did not answer at {url} within {timeout_s:.0f} s")


def _shoot(chromium: str, url: str, png: Path, budget_ms: int) -> None:
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--no-first-run", "--hide-scrollbars", f"--screenshot={png}", "--window-size=1600,1000",
           f"--virtual-time-budget={budget_ms}", url]
    subprocess.run(cmd, check=False, capture_output=True, timeout=budget_ms / 1000 + 120)
    print(f"{png.name}: {url}" + ("" if png.is_file() else "  (no screenshot written)"))


def screenshots(store: Path, out: Path, budget_ms: int, docs: Path | None = None, full: bool = False) -> None:
    from mlflow import MlflowClient

    from harness.compare.mlflow_runs import view_url

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("error: chromium not found; install it with `apt-get install -y chromium`")
    uri = f"sqlite:///{store.resolve()}"
    client = MlflowClient(tracking_uri=uri)
    parents = [r for e in client.search_experiments() for r in client.search_runs(
        [e.experiment_id], "tags.job = 'compare'", order_by=["attributes.start_time DESC"], max_results=1)]
    if not parents:
        raise SystemExit(f"error: no compare run in {store}; run make aime-graft first")
    parent = max(parents, key=lambda r: r.info.start_time)
    eid = parent.info.experiment_id
    children = client.search_runs([eid], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    child = next((r for r in children if r.data.tags.get("group") == "held-out"), children[0] if children else parent)
    children = [*children, *client.search_runs([eid], f"tags.mlflow.parentRunId = '{parent.info.run_id}' and "
                                                     "tags.job = 'library'")]
    out.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                               "--host", "127.0.0.1", "--port", str(port)])
    try:
        _wait_up(base, server)
        run = f"{base}/#/experiments/{eid}/runs/{child.info.run_id}"
        top = f"{base}/#/experiments/{eid}/runs/{parent.info.run_id}"
        library = next((r for r in children if r.data.tags.get("job") == "library"), None)
        reviewer = {  # what docs/tracking.md shows (copied to docs/img/ with --docs)
            "a_runs_headline_view.png": f"{base}/{view_url(eid)}",
            "b_parent_run.png": top,
            "c_child_run.png": run,
            "d_per_problem_table.png": f"{top}/artifacts/per_problem_table.json",
            "e_summary_page.png": f"{top}/artifacts/summary.html",
            **({"f_library_run.png": f"{base}/#/experiments/{eid}/runs/{library.info.run_id}"} if library else {}),
        }
        for name, url in reviewer.items():
            _shoot(chromium, url, out / name, budget_ms)
        if docs is not None:
            docs.mkdir(parents=True, exist_ok=True)
            for name in reviewer:
                if (out / name).is_file():
                    shutil.copyfile(out / name, docs / name)
        if not full:
            return
        pages = {
            # MLflow 3.17's UI picks the view from a per-browser switch (GenAI | Model training, localStorage
            # "mlflow.workflowType", default GenAI), not from the experiment's mlflow.experimentKind tag; the
            # URL parameter sets it. 0: a fresh browser's default; 1: the link to give a reviewer.
            "0_experiment_default.png": f"{base}/#/experiments/{eid}",
            "1_runs_table.png": f"{base}/#/experiments/{eid}?workflowType=machine_learning",
            "2_run_overview.png": run,
            "3_run_table_artifact.png": f"{run}/artifacts/outputs_table.json",
            "4_run_traces.png": f"{run}/traces",
            "5_experiment_traces.png": f"{base}/#/experiments/{eid}/traces",
            "6_parent_comparison.png": f"{base}/#/experiments/{eid}/runs/{parent.info.run_id}",
            "7_parent_plot.png": f"{base}/#/experiments/{eid}/runs/{parent.info.run_id}/artifacts/plots/accuracy.png",
        }
        for name, url in pages.items():
            _shoot(chromium, url, out / name, budget_ms)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    print(f"parent {parent.info.run_name!r}, run {child.info.run_name!r}; screenshots in {out}")


def trace_cost(n_rows: int) -> None:
    """Log an n-row hand-built run folder with traces off, then on, to a fresh store; print both times."""
    from harness.record.folder import RunFolder
    from harness.record.rows import Completion, Group, Retrieval, Row, Summary
    from harness.task.answers import score
    from harness.tracking.log import log_run_dir
    from harness.tracking.store import default_tracking_uri

    with tempfile.TemporaryDirectory() as tmp:
        uri = default_tracking_uri(Path(tmp))
        from mlflow import MlflowClient

        MlflowClient(tracking_uri=uri).search_experiments()  # create the schema outside the timing
        times = {}
        for traces in (False, True):
            folder = RunFolder(Path(tmp) / f"run-{traces}")
            rows = []
            for i in range(n_rows):
                c = Completion(prompt=f"Problem {i}", context_ids=list(range(50)), text=f"Final answer: {i % 7}",
                               token_ids=[1, 2, 3], stop_reason="stop", prefill_tokens=10, grafted_tokens=40,
                               decode_tokens=3, ttft_s=0.1,
                               retrieval=Retrieval(f"p{i}", "f" * 64, 1.0, "exact"))
                rows.append(Row.scored(f"p{i}", 0, "graft", "recurring", c, "3", score(c.text, "3"), wall_s=0.4,
                                       cpu_s=0.4, energy_j=None, energy_status="unavailable:test"))
            summary = Summary.of(rows, condition="graft", model="toy", dataset="toy", run_dir=str(folder.path),
                                 comparable_key=None, run_wall_s=0.4 * n_rows, energy_status="unavailable:test",
                                 energy_j=None, group=Group.RECURRING)
            config = {"library": {"exclude_self": False}, "tracking": {"traces": traces}}
            folder.finish(config=config, problems=[{"id": r.problem_id} for r in rows], rows=rows, summary=summary,
                          prompt_template="{problem}", model_fingerprint="a" * 64, tokenizer_fingerprint="b" * 64,
                          determinism={}, environment={})
            t0 = time.perf_counter()
            log_run_dir(folder.path, tracking_uri=uri, experiment="trace-cost")
            times[traces] = time.perf_counter() - t0
        print(f"{n_rows} rows: logging {times[False]:.2f} s without traces, {times[True]:.2f} s with "
              f"(+{times[True] - times[False]:.2f} s, {(times[True] - times[False]) / n_rows * 1000:.0f} ms per trace)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", type=Path, default=REPO / "runs" / "mlflow.db")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "dashboard")
    p.add_argument("--budget-ms", type=int, default=20000, help="virtual time Chromium gives each page to render")
    p.add_argument("--docs", type=Path, default=None, help="also copy the reviewer's screenshots here (docs/img)")
    p.add_argument("--all", action="store_true", help="also the default page, outputs table, traces and plot")
    p.add_argument("--trace-cost", type=int, metavar="N", help="measure logging time with/without traces, N rows")
    args = p.parse_args()
    if args.trace_cost:
        trace_cost(args.trace_cost)
    else:
        screenshots(args.store, args.out, args.budget_ms, docs=args.docs, full=args.all)
    return 0


if __name__ == "__main__":
    sys.exit(main())
