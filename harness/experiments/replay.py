"""Pre-registered replay: recompute committed logits hashes on this machine and say which reproduce.

Run from the repository root::

    python -m scripts.replay                          # every profile in the registry (make replay)
    python -m scripts.replay --profile portable       # one profile
    python -m scripts.replay --profile native --register    # (re)compute and write this machine's hashes
    python -m scripts.replay --profile native+batch_invariant --register   # the same, determinism.batch_invariant
    python -m scripts.replay --speed                  # prefill/decode tokens/s, native vs portable

What is computed, per registration: under one determinism profile, with the model and tokenizer fingerprints,
the settings and the compute environment (kvstore.environment) that produced it,
  - the 50 verify-graft samples (scripts/verify_graft.py's choice of (prefix, suffix) pairs, seed 0): SHA-256
    of the fresh reference's suffix logits, through the engine's procedure `kvstore.check_graft` (the graft of
    the same prefix must equal it too);
  - a greedy decode of the first 5 bundled problems (the harness's default prompt): SHA-256 of the first
    logits after the prompt and the token ids of the first --decode-tokens steps.

The registry and how a recomputation is judged against it: harness/experiments/registry.py (its format is written
down there).

Replay recomputes under the profile (its kernel variables set before torch is imported: the process re-executes
itself with them) and compares with every registration of the profile:
  - the registration whose environment matches this machine's is the check: every sample must reproduce, and it
    is printed per sample with the environments side by side;
  - every other registration is a cross-environment portability measurement, printed as one line ("against the
    registration from AMD EPYC (AuthenticAMD): 0/55 reproduced; 3 facts differ: ..."). It does not change the
    exit status, unless the profile is in kvstore.environment.PORTABLE_PROFILES (a promise of the same bits on
    other machines; no profile makes it today): then every registration must reproduce.
Exit status, per profile: 0 when the check passes (and, for a portable profile, every measurement reproduced);
non-zero when no registration matches this machine's environment, with the command that registers it.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from harness.errors import console as terminal_console  # noqa: E402
from harness.experiments.registry import (  # noqa: E402
    DEFAULT_REGISTRY,
    REGISTRY_FORMAT,
    Replay,
    compare,
    print_replay,
    read_registry,
    register,
    register_command,
    replay_profile,
    source_of,
    write_registry,
)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROMPT = "Problem: {problem}\nGive the answer as an integer from 0 to 999.\nFinal answer:"


# ----------------------------------------------------------------------------------------------- measuring
def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _ids_sha(ids: list[int]) -> str:
    return _sha(json.dumps(list(ids)).encode())


def measure(be, params: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """The registered computations on this process's model (the transformers backend `_load_model` gives, its layer
    layout one of its facts): graft samples and greedy decodes, through the backend's verbs (the engine's own prefill
    and forward, so the bits are those registered)."""
    import torch

    from harness.experiments.text import build_samples, prefix_lengths, problem_texts, read_problems
    from harness.task.prompts import render
    from kvstore import check_graft, logits_sha256

    problems_path = REPO / params["problems"]
    window = be.sliding_window()
    scale = window or 512
    lo, hi = max(4, scale // 32), max(60, scale * 7 // 4)
    lengths = prefix_lengths(params["samples"], params["seed"], lo, hi, window)
    samples = build_samples(be, problem_texts(problems_path), lengths, params["suffix_tokens"], params["seed"])
    out: dict[str, Any] = {"model_fingerprint": be.fingerprint, "tokenizer_fingerprint": be.tokenizer_fingerprint,
                           "determinism": be.settings(), "environment": be.environment(),
                           "numerics_sha256": be.numerics(), "samples": [], "decode": []}
    former = be.former_numerics()  # the same machine's fingerprints under the battery's earlier formats
    if former:
        out["numerics_former"] = list(former)
    t0 = time.perf_counter()
    for s in samples:
        c = check_graft(be, s.prefix, s.suffix)
        out["samples"].append({"index": s.index, "prefix_tokens": len(s.prefix), "suffix_tokens": len(s.suffix),
                               "tokens_sha256": _ids_sha(s.prefix + s.suffix), "logits_sha256": c.sha256_reference,
                               "graft_equal": c.equal})
        if progress:
            print(f"  sample {s.index + 1}/{len(samples)} ({len(s.prefix)} tokens) {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    for p in read_problems(problems_path)[: params["decode_problems"]]:
        ids = be.encode(render(params["prompt"], problem=p.problem))
        cache, logits = be.prefill(ids)
        first = logits_sha256(logits)
        tokens: list[int] = []
        for _ in range(params["decode_tokens"]):
            tok = int(torch.argmax(logits[0]))
            tokens.append(tok)
            logits = be.forward([tok], cache)[:, -1, :]
        out["decode"].append({"problem_id": p.id, "prompt_tokens": len(ids), "prompt_sha256": _ids_sha(ids),
                              "first_logits_sha256": first, "token_ids": tokens})
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


# A registry key is a profile, or a profile + this suffix: the same kernel variables with
# determinism.batch_invariant=true (issue 43: "native+batch_invariant"), registered and replayed like any profile.
BATCH_INVARIANT = "+batch_invariant"


def registry_mode(key: str) -> tuple[str, bool]:
    """(the kernel profile, whether determinism.batch_invariant is on) of a registry key."""
    if key.endswith(BATCH_INVARIANT):
        return key[: -len(BATCH_INVARIANT)], True
    return key, False


def _load_model(model: str, profile: str, batch_invariant: bool = False):
    from kvstore import Determinism, load_backend

    mode = {"batch_invariant": True} if batch_invariant else {}  # the default mode's settings exactly as before
    return load_backend("transformers", source=model, determinism=Determinism(profile=profile, **mode))


# ----------------------------------------------------------------------------------------------- speed
def profile_speed(profile: str, model: str = "gemma3-270m", prefill_tokens: int = 512, decode_tokens: int = 32,
                  repeats: int = 3) -> dict[str, Any]:
    """Prefill and greedy-decode tokens/s of `model` under `profile`, measured in a fresh process (the kernel
    variables act only from the start of a process). Medians of `repeats`; for `make bench` and --speed."""
    cmd = [sys.executable, "-m", "harness.experiments.replay", "--speed-worker", "--profile", profile, "--model", model,
           "--prefill-tokens", str(prefill_tokens), "--decode-tokens", str(decode_tokens), "--repeats", str(repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        raise RuntimeError(f"speed measurement under profile {profile} failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _speed_worker(args: argparse.Namespace) -> int:
    import statistics

    import torch

    from harness.experiments.text import joined_text
    be = _load_model(args.model, args.profile)
    ids = be.encode(joined_text(REPO / "problems" / "kvgraft_original.jsonl"))[: args.prefill_tokens]
    pre, dec = [], []
    be.prefill(ids[:32])  # warm-up
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        cache, logits = be.prefill(ids)
        pre.append(len(ids) / (time.perf_counter() - t0))
        t1 = time.perf_counter()
        for _ in range(args.decode_tokens):
            logits = be.forward([int(torch.argmax(logits[0]))], cache)[:, -1, :]
        dec.append(args.decode_tokens / (time.perf_counter() - t1))
    env = be.environment()
    print(json.dumps({"profile": args.profile, "model": args.model, "prefill_tokens": len(ids),
                      "decode_tokens": args.decode_tokens, "repeats": args.repeats,
                      "prefill_tok_s": round(statistics.median(pre), 1),
                      "decode_tok_s": round(statistics.median(dec), 2),
                      "prefill_tok_s_all": [round(x, 1) for x in pre], "decode_tok_s_all": [round(x, 2) for x in dec],
                      "aten_cpu_capability": env["aten_cpu_capability"], "mkl_cbwr": env["mkl_cbwr"],
                      "onednn_max_cpu_isa": env["onednn_max_cpu_isa"]}))
    return 0


# ----------------------------------------------------------------------------------------------- main
def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": args.model, "problems": args.problems, "samples": args.samples, "seed": args.seed,
            "suffix_tokens": args.suffix_tokens, "decode_problems": args.decode_problems,
            "decode_tokens": args.decode_tokens, "prompt": DEFAULT_PROMPT}


def run_profile(args: argparse.Namespace) -> int:
    """Replay (or register) one profile in this process; its kernel variables are entered first."""

    from kvstore import enter_profile

    profile, batch_invariant = registry_mode(args.profile)
    enter_profile(profile)  # re-executes this command with the profile's variables when they are not set
    console = terminal_console(width=None if sys.stdout.isatty() else 130)
    registry_path = Path(args.registry)
    reg = read_registry(registry_path)
    params = reg.get("params") if reg and not args.register else _params(args)
    if reg and args.register and reg.get("params") != params:
        raise SystemExit(f"{registry_path}: registered with other parameters {reg.get('params')}; "
                         "register every profile again with the same options, or use another --registry")
    registrations = reg.get("profiles", {}).get(args.profile, [])
    if not args.register and not registrations:
        raise SystemExit(f"{registry_path}: no registered hashes for profile {args.profile!r}; "
                         f"register them with `{register_command(args.profile, registry_path)}`")
    be = _load_model(params["model"], profile, batch_invariant)
    measured = measure(be, params)
    if not args.register:
        result = replay_profile(registrations, measured, args.profile, registry_path)
        print_replay(result, console)
        return 0 if result.passed else 1
    measured["registered_at"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    others = [compare(r, measured, args.profile) for r in registrations]
    reg = reg or {"format": REGISTRY_FORMAT, "params": params, "profiles": {}}
    reg, replaced = register(reg, args.profile, measured)
    write_registry(registry_path, reg)
    bad = [s["index"] for s in measured["samples"] if not s["graft_equal"]]
    n = len(reg["profiles"][args.profile])
    how = "replaced this environment's registration" if replaced else "appended"
    console.print(f"registered profile {args.profile} for {source_of(measured)}: {len(measured['samples'])} graft "
                  f"samples, {len(measured['decode'])} decodes in {measured['seconds']} s; {how} "
                  f"({n} registration{'s' if n != 1 else ''} of the profile) -> {registry_path}"
                  + (f"; WARNING: grafts not exact at samples {bad}" if bad else ""),
                  soft_wrap=True, markup=False, highlight=False)
    measurement = Replay(args.profile, here=source_of(measured))
    for o in others:
        if not o.matches_environment:
            console.print(measurement.measurement_line(o), soft_wrap=True, markup=False, highlight=False)
    return 1 if bad else 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default=None, help="one profile (default: every profile in the registry); "
                   f"PROFILE{BATCH_INVARIANT} for the same with determinism.batch_invariant=true")
    p.add_argument("--registry", default=str(DEFAULT_REGISTRY))
    p.add_argument("--register", action="store_true",
                   help="compute and write this machine's hashes (replacing this environment's registration of the "
                        "profile, keeping every other machine's)")
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--problems", default="problems/kvgraft_original.jsonl", help="relative to the repository")
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--suffix-tokens", type=int, default=16)
    p.add_argument("--decode-problems", type=int, default=5)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--speed", action="store_true", help="prefill/decode tokens/s, native vs portable")
    p.add_argument("--speed-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--prefill-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.speed_worker:
        from kvstore import enter_profile

        enter_profile(args.profile)
        return _speed_worker(args)
    if args.speed:
        rows = [profile_speed(p, args.model, args.prefill_tokens, args.decode_tokens, args.repeats)
                for p in ("native", "portable")]
        for r in rows:
            print(json.dumps(r))
        n, q = rows
        print(f"portable vs native: prefill {q['prefill_tok_s']} vs {n['prefill_tok_s']} tokens/s "
              f"({q['prefill_tok_s'] / n['prefill_tok_s']:.2f}x), decode {q['decode_tok_s']} vs {n['decode_tok_s']} "
              f"tokens/s ({q['decode_tok_s'] / n['decode_tok_s']:.2f}x)")
        return 0
    if args.profile is not None:
        return run_profile(args)
    profiles = sorted(read_registry(Path(args.registry)).get("profiles", {}))
    if not profiles:
        raise SystemExit(f"{args.registry}: no registered profile; register with "
                         f"`{register_command('NAME', args.registry)}`")
    codes = {}
    for profile in profiles:  # each in its own process: kernel variables act only from a process's start
        cmd = [sys.executable, "-m", "harness.experiments.replay", "--profile", profile, "--registry", args.registry]
        codes[profile] = subprocess.run(cmd, cwd=REPO).returncode
    print("replay: " + ", ".join(f"{p} {'PASS' if c == 0 else 'FAIL'}" for p, c in codes.items()))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
