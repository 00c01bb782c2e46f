"""The `execution` config group (configs/execution/*.yaml): where the problems of one run are computed.

    execution=local                      (default) in this process
    execution=ray execution.workers=N    on N Ray actors (harness/run/distributed.py)

Its own module, importing nothing of the harness, so that harness/config/schema.py can hold it in the schema.
"""

from __future__ import annotations

from dataclasses import dataclass

EXECUTIONS = ("local", "ray")


@dataclass
class ExecutionConfig:
    """configs/execution/*.yaml."""

    name: str = "local"  # local | ray
    workers: int = 2  # ray: actors, each with the model loaded once
    address: str | None = None  # ray: join a running cluster (host:port, or auto: RAY_ADDRESS); None: a private Ray
    # of this run on 127.0.0.1 (RAY_ADDRESS alone is not joined: joining is explicit)
