"""Content-addressed stores: base.py (the Store interface, admission of bytes, index rows), objects.py (the one
ObjectStore every store runs: admit, verify, index), byte stores (directory.py, s3.py, memory.py), index.py and
sqlite_index.py, local.py (LocalStore: a folder), tier.py (host-memory tier), prefetch.py, verified_read.py, open.py
(open_store: a folder or an S3 prefix by name)."""
