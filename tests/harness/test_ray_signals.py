"""Issue 51, item 9: Ctrl-C (SIGINT) or SIGTERM anywhere in the private Ray's start (from `import ray` to a watched
cluster) is held, the half-started Ray is shut down, and only then is the signal raised under the run's own handler
(the one `stopped:` line). In-process, with Ray's import and start stood in for: the signal arrives inside the
import, which the hold did not cover (SIGINT gave a 30-line traceback from the middle of the start)."""

from __future__ import annotations

import signal
import sys
import types

import pytest

import harness.run.distributed as distributed


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_import_is_held_until_the_private_ray_is_up_and_then_shut_down(monkeypatch, sig):
    events: list[str] = []
    fake = types.SimpleNamespace(is_initialized=lambda: "init" in events and "shutdown" not in events,
                                 shutdown=lambda: events.append("shutdown"))

    def importing(private: bool):
        signal.raise_signal(sig)  # the user's Ctrl-C / a SIGTERM, in the middle of `import ray`
        events.append("imported")
        monkeypatch.setitem(sys.modules, "ray", fake)
        return fake

    def starting(ray, num_cpus: int) -> None:
        events.append("init")

    def raised(signum, frame):
        events.append(f"raised {signal.Signals(signum).name}")
        raise KeyboardInterrupt

    monkeypatch.setattr(distributed, "_import_ray", importing)
    monkeypatch.setattr(distributed, "_start_private_ray", starting)
    old = {s: signal.signal(s, raised) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(KeyboardInterrupt):
            distributed._private_ray(2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    assert events == ["imported", "init", "shutdown", f"raised {signal.Signals(sig).name}"]
