"""The bundled problems as an lm-evaluation-harness task (kvgraft_original.yaml, kvgraft_task.py: the harness's prompt
and scorer), for clients of `make serve LIBRARY=...` (docs/vllm.md, "Any evaluation harness")."""
