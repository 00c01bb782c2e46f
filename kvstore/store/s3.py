"""`S3Store`: the artifact store in an S3 bucket that many machines share (an ObjectStore over `S3Bytes`).

    store = S3Store("s3://kvgraft/library", endpoint_url="http://127.0.0.1:8333")
    aid = store.put(snapshot)          # conditional PUT (If-None-Match: *): created if absent, atomically
    snap = store.get(aid)              # every byte re-hashed to the id before a tensor is returned

Admission, verification and the index (rows beside the objects, in the bucket, so every reader finds them) are
kvstore/store/objects.py's, the same for every byte store. Here only the five verbs, on boto3:
- create: `put_object(..., IfNoneMatch="*")`; 412 PreconditionFailed means the key exists (another writer won
  the race, with the same bytes since keys are content ids), 409 ConditionalRequestConflict (AWS, a concurrent
  conditional write in flight) is retried. A single PUT is atomic: a writer killed mid-upload leaves no object.
- get / contains / list / delete: get_object, head_object, list_objects_v2 (paginated), delete_object.
Endpoint and credentials come from the arguments, else from boto3's usual chain (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, ~/.aws). The bucket is checked when the store is opened, with short connect timeouts and one
retry, so a server that is down is one line (StoreUnavailableError) in about a second, not a hang.
"""

from __future__ import annotations

import time
from urllib.parse import urlparse

from kvstore.errors import KVStoreError, NotFoundError, StoreUnavailableError
from kvstore.store.byte_store import ByteStore, check_key
from kvstore.store.objects import ObjectStore

CONNECT_TIMEOUT_S = 2.0
READ_TIMEOUT_S = 120.0


def parse_s3_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket[/prefix]`; the prefix has no leading or trailing '/'."""
    p = urlparse(str(url))
    if p.scheme != "s3" or not p.netloc or p.query or p.fragment:
        raise KVStoreError(f"{url!r} is not an S3 store URL; write s3://BUCKET or s3://BUCKET/PREFIX")
    prefix = p.path.strip("/")
    if prefix:
        check_key(prefix)
    return p.netloc, prefix


class S3Bytes(ByteStore):
    """The five byte-store verbs on an S3 bucket (any S3 API: AWS, SeaweedFS, Ceph RGW, MinIO), under a prefix."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, client=None,
                 connect_timeout: float = CONNECT_TIMEOUT_S, read_timeout: float = READ_TIMEOUT_S) -> None:
        self.bucket, self.prefix = parse_s3_url(url)
        self.url = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        if client is None:
            try:
                import boto3
                from botocore.config import Config
            except ImportError:
                raise KVStoreError("an s3:// store needs boto3: pip install -c constraints.txt 'kvgraft[s3]'") from None
            client = boto3.client(
                "s3", endpoint_url=endpoint_url,
                config=Config(connect_timeout=connect_timeout, read_timeout=read_timeout,
                              retries={"max_attempts": 2, "mode": "standard"}, s3={"addressing_style": "path"},
                              request_checksum_calculation="when_required",
                              response_checksum_validation="when_required"))
        self.client = client
        self.endpoint = str(client.meta.endpoint_url)
        self.where = f"S3 store {self.url} at {self.endpoint}"
        self._call("open the bucket", lambda: client.head_bucket(Bucket=self.bucket))

    def _key(self, key: str) -> str:
        key = check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, doing: str, fn, missing_ok: bool = False):
        """Run one S3 request; connection failures and refusals become one StoreUnavailableError line."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            return fn()
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if missing_ok and (code in ("404", "NoSuchKey", "NotFound") or status == 404):
                raise NotFoundError(f"{doing}: not found in {self.where}") from None
            hint = {"NoSuchBucket": "create the bucket first", "404": "create the bucket first",
                    "AccessDenied": "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and policy",
                    "403": "check the credentials (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and policy",
                    "InvalidAccessKeyId": "check AWS_ACCESS_KEY_ID",
                    "SignatureDoesNotMatch": "check AWS_SECRET_ACCESS_KEY"}.get(code, "check the server's log")
            raise StoreUnavailableError(f"{self.where}: could not {doing}: {code or status} "
                                        f"({e.response.get('Error', {}).get('Message', '')}); {hint}") from None
        except NoCredentialsError as e:  # a BotoCoreError too: no request was sent, the server is not the issue
            raise StoreUnavailableError(f"{self.where}: could not {doing}: {e} (boto3 found no access key in "
                                        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws/credentials or "
                                        "AWS_PROFILE). Set the credentials of the S3 server, then run again") from None
        except BotoCoreError as e:
            raise StoreUnavailableError(f"{self.where}: could not {doing}: {type(e).__name__}: {e}. Start the S3 "
                                        "server or fix the endpoint (endpoint_url / AWS_ENDPOINT_URL)") from None

    def create(self, key: str, data: bytes | memoryview) -> bool:
        from botocore.exceptions import ClientError

        k = self._key(key)
        body = bytes(data) if isinstance(data, memoryview) else data
        for attempt in range(5):
            try:
                self._call(f"create {k}", lambda: _raise_client_errors(
                    lambda: self.client.put_object(Bucket=self.bucket, Key=k, Body=body, IfNoneMatch="*")))
                return True
            except _Conditional as c:
                e: ClientError = c.error
                status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                if status == 412:
                    return False  # the key exists: a content id, so the same bytes (verified on every read)
                time.sleep(0.05 * (attempt + 1))  # 409: a concurrent conditional write is in flight; ask again
        raise StoreUnavailableError(f"{self.where}: could not create {k}: 409 five times (concurrent conditional "
                                    "writes); run again")

    def get(self, key: str) -> bytes:
        k = self._key(key)

        def read() -> bytes:
            return self.client.get_object(Bucket=self.bucket, Key=k)["Body"].read()

        return self._call(f"read {k}", read, missing_ok=True)

    def contains(self, key: str) -> bool:
        k = self._key(key)
        try:
            self._call(f"look up {k}", lambda: self.client.head_object(Bucket=self.bucket, Key=k), missing_ok=True)
            return True
        except NotFoundError:
            return False

    def size(self, key: str) -> int:
        k = self._key(key)
        head = self._call(f"look up {k}", lambda: self.client.head_object(Bucket=self.bucket, Key=k), missing_ok=True)
        return int(head["ContentLength"])

    def list(self, prefix: str = "") -> list[str]:
        full = (f"{self.prefix}/" if self.prefix else "") + prefix
        cut = len(self.prefix) + 1 if self.prefix else 0

        def pages() -> list[str]:
            out = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                out += [o["Key"][cut:] for o in page.get("Contents", [])]
            return out

        return sorted(self._call(f"list {full or '/'}", pages))

    def delete(self, key: str) -> bool:
        if not self.contains(key):
            return False
        k = self._key(key)
        self._call(f"delete {k}", lambda: self.client.delete_object(Bucket=self.bucket, Key=k))
        return True


class _Conditional(Exception):
    """A conditional PUT refused (412: the key exists; 409: a concurrent conditional write): not a failure."""

    def __init__(self, error) -> None:
        self.error = error


def _raise_client_errors(fn):
    from botocore.exceptions import ClientError

    try:
        return fn()
    except ClientError as e:
        if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412):
            raise _Conditional(e) from None
        raise


class S3Store(ObjectStore):
    """Artifacts, their index rows and tags in an S3 bucket under a prefix; see the module docstring."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, client=None, **timeouts: float) -> None:
        super().__init__(S3Bytes(url, endpoint_url=endpoint_url, client=client, **timeouts))
        self.root = self.blobs.url  # what messages and manifests name the store by

    def __repr__(self) -> str:
        return f"S3Store({self.blobs.url!r}, endpoint_url={self.blobs.endpoint!r})"
