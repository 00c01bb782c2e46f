"""Artifacts (+ opaque attachments) between stores as one file: bundle.py (export_bundle / import_bundle, every
member verified before anything is written), ustar.py (the tar framing, hostile names refused)."""
