"""Acceptance check of the MLflow dashboard as a reviewer reads it: the rendered text in headless Chromium.

    make aime-graft ARGS="dataset.limit=4 decoding.max_new_tokens=16"
    .venv/bin/python -m scripts.dashboard_check [--store runs/mlflow.db] [--out runs/dashboard] [--docs docs/img]
    .venv/bin/python -m scripts.dashboard_check --trace-cost 40     # logging time with and without traces

Starts ``mlflow ui`` on a free local port against the store, finds the newest compare job (parent run, tag
``job=compare``) and opens, in a 1400x900 Chromium window driven over the DevTools protocol:

- the address ``make mlflow-ui`` prints (``harness.tracking.server.dashboard_address``). Within the first
  viewport the text must hold the newest job's baseline and recurring-graft accuracy, its identical-twin count
  (``twin.identical_rows`` of the recurring graft) and no "-" in a headline column
  (``harness.tracking.views.HEADLINE_COLUMNS``);
- the parent run's page: its headline (the description's table) must come before its tags.

Prints one line per check (``ok`` / ``FAILED``) and exits 1 when one fails. It saves PNGs of what a reviewer reads
(the first screen, the parent run, a nested run, the parent's per-problem table, its summary page, the library run;
``--docs docs/img`` copies them there). Needs Debian's ``chromium`` (``apt-get install -y chromium``). The server
and the browser are stopped at the end. ``--trace-cost N`` instead logs a hand-built N-row run folder to a
temporary store twice (traces off, then on) and prints both wall times.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 1400, 900

# The page's text nodes with their boxes (document order); a node is in the viewport when its box meets it.
_TEXT_JS = """(() => {
  const out = [];
  if (!document.body) return '[]';
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walk.nextNode(); n; n = walk.nextNode()) {
    const t = n.textContent.trim();
    if (!t) continue;
    const el = n.parentElement, st = el && getComputedStyle(el);
    if (!st || st.visibility === 'hidden' || st.display === 'none') continue;
    const range = document.createRange(); range.selectNodeContents(n);
    const r = range.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    // covered: another element (MLflow's assistant panel) is drawn over the node's visible start (a long name is
    // cut by its cell with an ellipsis, so the middle of its full text box may lie over the next cell)
    const box = el.getBoundingClientRect();
    const left = Math.max(r.left, box.left), right = Math.min(r.right, box.right);
    const hit = document.elementFromPoint(left + Math.min(8, Math.max(0, right - left) / 2), r.top + r.height / 2);
    const covered = !!hit && !(hit === el || el.contains(hit) || hit.contains(el));
    const cell = el.closest('[col-id]');
    out.push({t, x: r.left, y: r.top + window.scrollY, w: r.width, h: r.height,
              col: cell ? cell.getAttribute('col-id') : null, header: !!el.closest('.ag-header'), covered});
  }
  return JSON.stringify(out);
})()"""


@dataclass(frozen=True)
class Text:
    t: str
    x: float
    y: float
    w: float
    h: float
    col: str | None
    header: bool
    covered: bool = False

    @property
    def visible(self) -> bool:
        """In the first viewport and not under another element."""
        return (not self.covered and self.x < WIDTH and self.x + self.w > 0 and self.y < HEIGHT
                and self.y + self.h > 0)


class Browser:
    """Headless Chromium on a free local port, one page, driven over the DevTools protocol (aiohttp's websocket)."""

    def __init__(self, chromium: str, profile: Path) -> None:
        from harness.tracking.server import free_port

        self.port = free_port()
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--remote-debugging-port={self.port}", "--remote-allow-origins=*",
             f"--window-size={WIDTH},{HEIGHT}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._id = 0

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def _page_ws(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=5) as r:
                    pages = [t for t in json.load(r) if t.get("type") == "page"]
                if pages:
                    return pages[0]["webSocketDebuggerUrl"]
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit("error: chromium's DevTools endpoint did not answer within 60 s")

    async def _call(self, ws, method: str, **params) -> dict:
        self._id += 1
        await ws.send_json({"id": self._id, "method": method, "params": params})
        while True:
            msg = await ws.receive_json(timeout=120)
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def _texts(self, ws) -> list[Text]:
        result = await self._call(ws, "Runtime.evaluate", expression=_TEXT_JS, returnByValue=True)
        value = result.get("result", {}).get("value")
        return [Text(**t) for t in json.loads(value)] if isinstance(value, str) else []

    async def _visit(self, url: str, wait_for: str, timeout_s: float, png: Path | None) -> list[Text]:
        import aiohttp

        async with aiohttp.ClientSession() as session, session.ws_connect(self._page_ws(), max_msg_size=0) as ws:
            await self._call(ws, "Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT,
                             deviceScaleFactor=1, mobile=False)
            await self._call(ws, "Page.enable")
            await self._call(ws, "Page.navigate", url="about:blank")
            await self._call(ws, "Page.navigate", url=url)
            deadline, texts = time.monotonic() + timeout_s, []
            while time.monotonic() < deadline:
                await asyncio.sleep(1.0)
                texts = await self._texts(ws)
                if wait_for in " ".join(t.t for t in texts):
                    await asyncio.sleep(2.0)  # let the rest of the page settle (metric cells load after names)
                    texts = await self._texts(ws)
                    break
            if png is not None:
                png.with_suffix(".txt").write_text("\n".join(
                    f"{t.y:6.0f} {t.x:6.0f} {'*' if t.visible else ' '} {t.col or '':40.40} {t.t}" for t in texts))
                shot = await self._call(ws, "Page.captureScreenshot", format="png")
                png.write_bytes(base64.b64decode(shot["data"]))
            return texts

    def visit(self, url: str, wait_for: str, timeout_s: float = 90, png: Path | None = None) -> list[Text]:
        """The page's text nodes once `wait_for` is in its text (or after `timeout_s`); a screenshot to `png`."""
        return asyncio.run(self._visit(url, wait_for, timeout_s, png))


def _shown(value: float) -> set[str]:
    """How the runs table may print a metric (it rounds to at most 4 decimals; 0.75 as 0.75, 1 as 1)."""
    return {f"{value:.{d}f}".rstrip("0").rstrip(".") or "0" for d in range(0, 5)} | {f"{value:.3f}"}


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


def _top_row(seen: list[Text], name: str) -> list[Text]:
    """The name cell of the topmost row named `name` (the newest: the view sorts newest first), or none."""
    cells = [t for t in seen if t.t == name and t.col and "Run Name" in t.col]
    return sorted(cells, key=lambda t: t.y)[:1]


def _first_screen_checks(texts: list[Text], runs: dict[str, object]) -> list[tuple[bool, str]]:
    """The first screen: the newest job's baseline and recurring-graft accuracy and twin count, no "-" in a
    headline column, all within the viewport."""
    from harness.tracking.views import HEADLINE_COLUMNS

    seen = [t for t in texts if t.visible]
    checks = []
    for who in ("baseline", "graft recurring"):
        run = runs.get(who)
        if run is None:
            checks.append((False, f"the newest compare job has no {who} run"))
            continue
        acc = run.data.metrics.get("accuracy")
        row = _top_row(seen, run.info.run_name)
        # the row's cells share the name cell's line (MLflow's grid: same top within a few pixels)
        cells = {t.t for t in seen for r in row if abs(t.y - r.y) < 8 and t.col and "accuracy" in t.col
                 and "ci" not in t.col}
        ok = bool(row) and acc is not None and bool(cells & _shown(acc))
        checks.append((ok, f"first screen: {who} row {run.info.run_name!r} with accuracy {acc}"
                           + ("" if ok else f" (name seen: {bool(row)}, accuracy cells on its line: {sorted(cells)})")))
    graft = runs.get("graft recurring")
    if graft is not None:
        k, n = graft.data.metrics.get("twin.identical_rows"), graft.data.metrics.get("twin.paired_rows")
        row = _top_row(seen, graft.info.run_name)
        cells = {t.t for t in seen for r in row if abs(t.y - r.y) < 8 and t.col and "twin.identical_rows" in t.col}
        ok = k is not None and bool(cells & _shown(k))
        checks.append((ok, f"first screen: recurring graft identical to its twin in {k} of {n} rows"
                           + ("" if ok else f" (twin cells on its line: {sorted(cells)})")))
    columns = {t.col for t in seen if t.header and t.col}
    missing = [c for c in HEADLINE_COLUMNS if not any(f"`{c}`" in col or col.endswith(c) for col in columns)]
    print("note    first screen: headline columns beyond the viewport (scroll right, or close MLflow's assistant "
          f"panel): {', '.join(missing)}" if missing else "note    first screen: every headline column in view")
    dashes = sorted({t.col for t in seen if not t.header and t.col and t.t in ("-", "—", "–")
                     and any(c in t.col for c in HEADLINE_COLUMNS)})
    checks.append((not dashes, "first screen: no '-' in a headline column" + (f" (in {dashes})" if dashes else "")))
    return checks


def _parent_page_check(texts: list[Text], parent: object) -> tuple[bool, str]:
    """The parent run's page: its headline (the name's accuracies and twins, or the description's table) above its
    tags."""
    marks = ("accuracy [95% CI]", "; twins identical")
    headline = [t.y for t in texts if any(m in t.t for m in marks)]
    tags = [t.y for t in texts if t.t == "Tags"]
    ok = bool(headline) and bool(tags) and min(headline) < min(tags)
    where = f"headline at y={min(headline):.0f}" if headline else "no headline"
    where += f", tags at y={min(tags):.0f}" if tags else ", no tags"
    return ok, f"parent run page: the headline precedes the tags ({where}): {parent.info.run_name!r}"


def check(store: Path, out: Path, docs: Path | None = None, full: bool = False) -> int:
    from mlflow import MlflowClient

    from harness.tracking.server import dashboard_address, free_port, ui_command
    from harness.tracking.views import run_url

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
    eid, pid = parent.info.experiment_id, parent.info.run_id
    nested = [*client.search_runs([eid], f"tags.compare_run = '{pid}'"),
              *client.search_runs([eid], f"tags.mlflow.parentRunId = '{pid}'")]
    runs = {" ".join(filter(None, [r.data.tags.get("condition"), r.data.tags.get("group")])): r for r in nested}
    child = runs.get("graft held-out") or next(iter(runs.values()), parent)
    library = runs.get("library")
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    address = dashboard_address(base, uri, client.get_experiment(eid).name)
    server = subprocess.Popen(ui_command(store.resolve().parent, port), stdout=subprocess.DEVNULL)
    checks: list[tuple[bool, str]] = []
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(chromium, Path(profile))
        try:
            _wait_up(base, server)
            print(f"the printed address: {address}")
            first = browser.visit(address, wait_for=runs["baseline"].info.run_name[:20] if "baseline" in runs
                                  else "accuracy", png=out / "a_first_screen.png")
            checks += _first_screen_checks(first, runs)
            def page(run_id: str, tail: str = "") -> str:
                return f"{base}/{run_url(eid, run_id, tail)}"

            parent_page = browser.visit(page(pid), wait_for="Tags", png=out / "b_parent_run.png")
            checks.append(_parent_page_check(parent_page, parent))
            shots = {"c_child_run.png": (page(child.info.run_id), "Tags"),
                     "d_per_problem_table.png": (page(pid, "/artifacts/per_problem_table.json"), "gold"),
                     "e_summary_page.png": (page(pid, "/artifacts/summary.html"), "graft"),
                     **({"f_library_run.png": (page(library.info.run_id), "entries")} if library else {})}
            if full:
                shots |= {"g_experiment_default.png": (f"{base}/#/experiments/{eid}", "kvgraft"),
                          "h_run_traces.png": (f"{base}/#/experiments/{eid}/runs/{child.info.run_id}/traces", "Trace")}
            for name, (url, wait_for) in shots.items():
                browser.visit(url, wait_for=wait_for, png=out / name)
        finally:
            browser.close()
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
    if docs is not None:
        docs.mkdir(parents=True, exist_ok=True)
        for png in sorted(out.glob("[a-f]_*.png")):
            shutil.copyfile(png, docs / png.name)
    for ok, line in checks:
        print(("ok      " if ok else "FAILED  ") + line)
    print(f"parent {parent.info.run_name!r}; screenshots in {out}")
    return 0 if all(ok for ok, _ in checks) else 1


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", type=Path, default=REPO / "runs" / "mlflow.db")
    p.add_argument("--out", type=Path, default=REPO / "runs" / "dashboard")
    p.add_argument("--docs", type=Path, default=None, help="also copy the reviewer's screenshots here (docs/img)")
    p.add_argument("--all", action="store_true", help="also the experiment's default page and a run's traces")
    p.add_argument("--trace-cost", type=int, metavar="N", help="measure logging time with/without traces, N rows")
    args = p.parse_args(argv)
    if args.trace_cost:
        trace_cost(args.trace_cost)
        return 0
    return check(args.store, args.out, docs=args.docs, full=args.all)


if __name__ == "__main__":
    sys.exit(main())
