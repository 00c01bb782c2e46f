"""The graft condition behind an OpenAI-compatible endpoint: `make serve LIBRARY=<library folder>
RETRIEVAL=recurring|held-out|random` (docs/vllm.md, "Any evaluation harness").

    library.py     ServedLibrary: a built library opened and audited for the served model (edited, another model's,
                   artifacts missing: one line, no start), the rule that finds a request's problem, and the request
                   composed by the graft condition's own code (harness.run.conditions: retrieve_entry,
                   query_prompt, graft_context)
    middleware.py  LibraryMiddleware: ASGI middleware in vLLM's API server that applies it to every completion and
                   chat request, names the entry in the response's kv_transfer_params and journals it
    supervise.py   supervise: the server run under a subreaper, so its engine ends with it whatever signal ends it
    __main__.py    `python -m harness.serve --library FOLDER --retrieval MODE --backend B --server MODULE [server
                   args]`: the audit, then the backend's server with the middleware (what `make serve LIBRARY=` runs)

kvstore knows no library: the middleware reaches the connector only through what it already offers, an artifact id
and token ids (`kvgraft_graft`, `kvgraft_tokens`, the prompt as token ids).
"""
