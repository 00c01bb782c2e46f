"""What the tests and benchmarks use that a user may too: fuzz.py (the seeded store fuzz), local_s3.py (a SeaweedFS
S3 server on 127.0.0.1), random_models.py (random-weight checkpoints in published configurations)."""
