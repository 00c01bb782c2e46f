"""scripts/serve_concurrency.py (issue 60, item 7): the p50 of library requests one at a time and N at once, against
a stand-in server that answers each completion after a fixed delay and names its outcome; N requests in flight
overlap (the batch's wall is about one delay, not N)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from scripts.serve_concurrency import main

DELAY = 0.2


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self._send({"data": [{"id": "m"}, {"id": "m-incontext"}]})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["model"] == "m" and body["prompt"].startswith("Problem: ")
        time.sleep(DELAY)
        self._send({"choices": [{"text": " 7"}], "kv_transfer_params": {"kvgraft_library": {"outcome": "grafted"}}})

    def _send(self, data: dict) -> None:
        raw = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


def test_p50_at_one_and_at_n_and_the_outcomes(capsys) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert main(["--port", str(server.server_address[1]), "--requests", "8", "--concurrent", "8"]) == 0
    finally:
        server.shutdown()
    one, eight = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert (one["concurrency"], eight["concurrency"]) == (1, 8) and one["grafted"] == eight["grafted"] == 8
    assert one["p50_s"] >= DELAY and one["wall_s"] >= 8 * DELAY and eight["wall_s"] < 4 * DELAY
