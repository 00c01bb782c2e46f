"""Pre-registered replay: recompute committed logits hashes on this machine and say which reproduce.

Run from the repository root::

    python scripts/replay.py                          # every profile in the registry (make replay)
    python scripts/replay.py --profile portable       # one profile
    python scripts/replay.py --profile native --register    # (re)compute and write this machine's hashes
    python scripts/replay.py --speed                  # prefill/decode tokens/s, native vs portable

What is computed, per registration: under one determinism profile, with the model and tokenizer fingerprints,
the settings and the compute environment (kvstore.environment) that produced it,
  - the 50 verify-graft samples (scripts/verify_graft.py's choice of (prefix, suffix) pairs, seed 0): SHA-256
    of the fresh reference's suffix logits, through the engine's procedure `kvstore.check_graft` (the graft of
    the same prefix must equal it too);
  - a greedy decode of the first 5 bundled problems (the harness's default prompt): SHA-256 of the first
    logits after the prompt and the token ids of the first --decode-tokens steps.

The registry (scripts/replay_registry.json, committed), format "kvgraft-replay/2"::

    {"format": "kvgraft-replay/2",
     "params": {"model", "problems", "samples", "seed", "suffix_tokens", "decode_problems", "decode_tokens",
                "prompt"},                       # shared by every registration
     "profiles": {"<profile>": [registration, ...]}}

    registration = {"model_fingerprint", "tokenizer_fingerprint", "determinism", "environment",
                    "samples": [{"index", "prefix_tokens", "suffix_tokens", "tokens_sha256", "logits_sha256",
                                 "graft_equal"}, ...],
                    "decode": [{"problem_id", "prompt_tokens", "prompt_sha256", "first_logits_sha256",
                                "token_ids"}, ...],
                    "seconds", "registered_at"}

A profile holds one registration per compute environment: two registrations of a profile never have equal
environments (`kvstore.environment.environment_differences` empty). Format "kvgraft-replay/1" (the same, with
one registration per profile instead of a list) is read as a one-element list; writing always writes format 2.

--register computes this machine's hashes under the profile and REPLACES the profile's registration whose
environment matches this machine's, or APPENDS one; another machine's registration is never dropped.

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
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_REGISTRY = REPO / "scripts" / "replay_registry.json"
REGISTRY_FORMAT = "kvgraft-replay/2"
READ_FORMATS = ("kvgraft-replay/1", REGISTRY_FORMAT)  # 1: one registration per profile, read as a list of one
DEFAULT_PROMPT = "Problem: {problem}\nGive the answer as an integer from 0 to 999.\nFinal answer:"


# ----------------------------------------------------------------------------------------------- comparison
def source_of(registration: dict[str, Any]) -> str:
    """The machine a registration was computed on, in words: "AMD EPYC (AuthenticAMD)"."""
    env = registration.get("environment", {})
    return f"{env.get('device_name') or env.get('cpu_model') or '?'} ({env.get('cpu_vendor') or '?'})"


@dataclass
class Outcome:
    """The recomputation on this machine against one registration of a profile."""

    profile: str
    source: str = "?"  # the registration's machine (source_of)
    registered_at: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)  # kind, name, registered, measured, reproduced
    environment: list[tuple[str, Any, Any, bool]] = field(default_factory=list)  # field, registered, now, same
    environment_differences: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # inputs that differ: nothing is comparable then

    @property
    def reproduced(self) -> int:
        return sum(r["reproduced"] for r in self.rows)

    @property
    def all_reproduced(self) -> bool:
        """Comparable, and every registered hash recomputed equal here."""
        return not self.problems and bool(self.rows) and self.reproduced == len(self.rows)

    @property
    def matches_environment(self) -> bool:
        return not self.environment_differences

    def counted(self) -> str:
        """ "k/n reproduced", or why nothing is comparable."""
        if self.problems:
            return f"NOT COMPARABLE: {'; '.join(self.problems)}"
        return f"{self.reproduced}/{len(self.rows)} reproduced"

    def differing_facts(self) -> str:
        """ "3 facts differ: cpu_model 'AMD EPYC' -> 'Intel(R) Xeon(R) Processor', ..." (registered -> here)."""
        facts = [f"{key} {a!r} -> {b!r}" for key, a, b, same in self.environment if not same]
        return f"{len(facts)} facts differ: {', '.join(facts)}"


def compare(registered: dict[str, Any], measured: dict[str, Any], profile: str) -> Outcome:
    """Compare one registration of a profile with the same computation done now (both as `measure` returns)."""
    from kvstore.environment import environment_differences

    out = Outcome(profile, source=source_of(registered), registered_at=registered.get("registered_at"))
    for key in ("model_fingerprint", "tokenizer_fingerprint"):
        if registered.get(key) != measured.get(key):
            out.problems.append(f"{key} {str(registered.get(key))[:12]} registered, {str(measured.get(key))[:12]} now")
    reg_env, now_env = registered.get("environment", {}), measured.get("environment", {})
    out.environment_differences = environment_differences(reg_env, now_env)
    differing = {d.split(":", 1)[0].removeprefix("environment.") for d in out.environment_differences}
    for key in sorted(set(reg_env) | set(now_env)):
        out.environment.append((key, reg_env.get(key), now_env.get(key), key not in differing))
    for s, m, same_input in _paired(registered, measured, "samples", "index", "tokens_sha256", out.problems,
                                    "sample {}: its tokens differ from the registered ones"):  # fmt: skip
        ok = bool(same_input and m["logits_sha256"] == s["logits_sha256"] and m["graft_equal"])
        out.rows.append({"kind": "graft", "name": f"sample {s['index']} ({s['prefix_tokens']}+{s['suffix_tokens']})",
                         "registered": s["logits_sha256"], "measured": m["logits_sha256"] if m else None,
                         "graft_equal": m["graft_equal"] if m else None, "reproduced": ok})
    for d, m, same_input in _paired(registered, measured, "decode", "problem_id", "prompt_sha256", out.problems,
                                    "decode {}: its prompt tokens differ from the registered ones"):  # fmt: skip
        ok = bool(same_input and m["first_logits_sha256"] == d["first_logits_sha256"]
                  and m["token_ids"] == d["token_ids"])
        out.rows.append({"kind": "decode", "name": f"decode {d['problem_id']} ({len(d['token_ids'])} tokens)",
                         "registered": d["first_logits_sha256"], "measured": m["first_logits_sha256"] if m else None,
                         "graft_equal": None, "reproduced": ok})
    if not out.rows:
        out.problems.append("the registry lists no samples for this profile")
    return out


def _paired(registered: dict[str, Any], measured: dict[str, Any], field: str, key: str, input_hash: str,
            problems: list[str], differs: str) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None, bool]]:
    """(registered row, the measured row of the same `key` or None, whether both hashed the same input) for each
    registered row of `field`; a measured row with other input is also a problem (`differs`, formatted by key)."""
    now = {row[key]: row for row in measured.get(field, [])}
    for row in registered.get(field, []):
        m = now.get(row[key])
        same_input = m is not None and m[input_hash] == row[input_hash]
        if m is not None and not same_input:
            problems.append(differs.format(row[key]))
        yield row, m, same_input


def register_command(profile: str, registry: str | Path | None = None) -> str:
    """The command that registers this machine's hashes for `profile` (in `registry` when not the default)."""
    if registry is None or Path(registry).resolve() == DEFAULT_REGISTRY:
        return f"make replay PROFILE={profile} ARGS=--register"
    return f"make replay PROFILE={profile} ARGS='--register --registry {registry}'"


@dataclass
class Replay:
    """The replay of one profile: the recomputation here against each of the profile's registrations."""

    profile: str
    here: str  # this machine, in words (source_of the recomputation)
    registry: str | None = None  # where the registrations came from (named in the register command)
    checks: list[Outcome] = field(default_factory=list)  # registrations of this machine's environment (one)
    others: list[Outcome] = field(default_factory=list)  # every other registration: measurements
    portable: bool = False  # the profile promises the same bits on other machines (PORTABLE_PROFILES)

    @property
    def passed(self) -> bool:
        if not self.checks or not all(c.all_reproduced for c in self.checks):
            return False
        return not self.portable or all(o.all_reproduced for o in self.others)

    def measurement_line(self, o: Outcome) -> str:
        head = f"profile {self.profile}: against the registration from {o.source}: {o.counted()}; {o.differing_facts()}"
        if self.portable:
            return f"{head} (the profile promises portability) -> {'PASS' if o.all_reproduced else 'FAIL'}"
        return f"{head} (a portability measurement; it does not decide the exit status)"

    def verdict(self) -> str:
        p = self.profile
        if not self.checks:
            return (f"profile {p}: no registration matches this machine's environment ({self.here}; registered: "
                    f"{', '.join(o.source for o in self.others) or 'none'}); register it with "
                    f"`{register_command(p, self.registry)}` -> FAIL")
        check = self.checks[0] if len(self.checks) == 1 else None
        if check is None:
            head = f"profile {p}: {len(self.checks)} registrations match this machine's environment: " + ", ".join(
                c.counted() for c in self.checks)
        elif check.problems:
            head = f"profile {p}: {check.counted()}"
        else:
            head = f"profile {p}: {check.counted()}; environment matches the registered one"
        if self.portable and self.others:
            kept = sum(o.all_reproduced for o in self.others)
            head += (f"; the profile promises portability: {kept}/{len(self.others)} other registrations "
                     "reproduced in full")
        return f"{head} -> {'PASS' if self.passed else 'FAIL'}"


def replay_profile(registrations: list[dict[str, Any]], measured: dict[str, Any], profile: str,
                   registry: str | Path | None = None) -> Replay:
    """Compare the recomputation `measured` with every registration of `profile`: the one of this machine's
    environment is the check, the others are measurements (binding only for a profile in PORTABLE_PROFILES)."""
    from kvstore.environment import PORTABLE_PROFILES

    out = Replay(profile, here=source_of(measured), registry=None if registry is None else str(registry),
                 portable=profile in PORTABLE_PROFILES)
    for registration in registrations:
        o = compare(registration, measured, profile)
        (out.checks if o.matches_environment else out.others).append(o)
    return out


def register(reg: dict[str, Any], profile: str, measured: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """`reg` (format 2, as read_registry returns it) with `measured` as `profile`'s registration for its
    environment: it replaces the one whose environment matches (True), or is appended (False). Other
    environments' registrations are kept as they are."""
    from kvstore.environment import environment_differences

    registrations = reg.setdefault("profiles", {}).setdefault(profile, [])
    for i, old in enumerate(registrations):
        if not environment_differences(old.get("environment", {}), measured.get("environment", {})):
            registrations[i] = measured
            return reg, True
    registrations.append(measured)
    return reg, False


def print_outcome(out: Outcome, console) -> None:
    from rich.table import Table

    when = f", {out.registered_at[:10]}" if out.registered_at else ""
    t = Table(title=f"replay, profile {out.profile}: {out.source}{when}")  # the registration's machine and day
    for col in ("sample", "registered", "now", "graft = ref", "reproduced"):
        t.add_column(col)
    for r in out.rows:
        t.add_row(r["name"], (r["registered"] or "-")[:12], (r["measured"] or "-")[:12],
                  "-" if r["graft_equal"] is None else str(r["graft_equal"]), "yes" if r["reproduced"] else "NO")
    console.print(t)
    e = Table(title="environment: registered vs this machine")
    for col in ("field", "registered", "this machine", ""):
        e.add_column(col)
    for key, a, b, same in out.environment:
        e.add_row(key, str(a), str(b), "" if same else "DIFFERS")
    console.print(e)


def print_replay(r: Replay, console) -> None:
    """The check in full (per sample, environments side by side), then one line per measurement, then the
    profile's verdict. A measurement that decides the verdict (a portable profile) and fails is shown in full."""
    for c in r.checks:
        print_outcome(c, console)
    for o in r.others:
        if r.portable and not o.all_reproduced:
            print_outcome(o, console)
        console.print(r.measurement_line(o), soft_wrap=True, markup=False, highlight=False)
    console.print(r.verdict(), soft_wrap=True, markup=False, highlight=False)


# ----------------------------------------------------------------------------------------------- measuring
def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _ids_sha(ids: list[int]) -> str:
    return _sha(json.dumps(list(ids)).encode())


def measure(fm, params: dict[str, Any], progress: bool = True) -> dict[str, Any]:
    """The registered computations on this process's model: graft samples and greedy decodes."""
    import torch

    from harness.experiment_text import build_samples, prefix_lengths, problem_texts, read_problems
    from harness.prompts import render
    from kvstore import check_graft, environment_fingerprint, forward, logits_sha256, prefill
    from kvstore.model import smallest_window

    problems_path = REPO / params["problems"]
    window = smallest_window(fm.layer_layout)
    scale = window or 512
    lo, hi = max(4, scale // 32), max(60, scale * 7 // 4)
    lengths = prefix_lengths(params["samples"], params["seed"], lo, hi, window)
    samples = build_samples(fm, problem_texts(problems_path), lengths, params["suffix_tokens"], params["seed"])
    out: dict[str, Any] = {"model_fingerprint": fm.fingerprint, "tokenizer_fingerprint": fm.tokenizer_fingerprint,
                           "determinism": fm.determinism.to_dict(), "environment": environment_fingerprint(fm.device),
                           "samples": [], "decode": []}
    t0 = time.perf_counter()
    for s in samples:
        c = check_graft(fm, s.prefix, s.suffix)
        out["samples"].append({"index": s.index, "prefix_tokens": len(s.prefix), "suffix_tokens": len(s.suffix),
                               "tokens_sha256": _ids_sha(s.prefix + s.suffix), "logits_sha256": c.sha256_reference,
                               "graft_equal": c.equal})
        if progress:
            print(f"  sample {s.index + 1}/{len(samples)} ({len(s.prefix)} tokens) {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    for p in read_problems(problems_path)[: params["decode_problems"]]:
        ids = fm.encode(render(params["prompt"], problem=p.problem))
        cache, logits = prefill(fm, ids)
        first = logits_sha256(logits)
        tokens: list[int] = []
        for _ in range(params["decode_tokens"]):
            tok = int(torch.argmax(logits[0]))
            tokens.append(tok)
            logits = forward(fm, [tok], cache)[:, -1, :]
        out["decode"].append({"problem_id": p.id, "prompt_tokens": len(ids), "prompt_sha256": _ids_sha(ids),
                              "first_logits_sha256": first, "token_ids": tokens})
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def _load_model(model: str, profile: str):
    from kvstore import Determinism, load_frozen_model

    return load_frozen_model(model, determinism=Determinism(profile=profile))


# ----------------------------------------------------------------------------------------------- speed
def profile_speed(profile: str, model: str = "gemma3-270m", prefill_tokens: int = 512, decode_tokens: int = 32,
                  repeats: int = 3) -> dict[str, Any]:
    """Prefill and greedy-decode tokens/s of `model` under `profile`, measured in a fresh process (the kernel
    variables act only from the start of a process). Medians of `repeats`; for `make bench` and --speed."""
    cmd = [sys.executable, "-m", "harness.replay", "--speed-worker", "--profile", profile, "--model", model,
           "--prefill-tokens", str(prefill_tokens), "--decode-tokens", str(decode_tokens), "--repeats", str(repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if r.returncode != 0:
        raise RuntimeError(f"speed measurement under profile {profile} failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _speed_worker(args: argparse.Namespace) -> int:
    import statistics

    import torch

    from harness.experiment_text import joined_text
    from kvstore import environment_fingerprint, forward, prefill

    fm = _load_model(args.model, args.profile)
    ids = fm.encode(joined_text(REPO / "problems" / "kvgraft_original.jsonl"))[: args.prefill_tokens]
    pre, dec = [], []
    prefill(fm, ids[:32])  # warm-up
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        cache, logits = prefill(fm, ids)
        pre.append(len(ids) / (time.perf_counter() - t0))
        t1 = time.perf_counter()
        for _ in range(args.decode_tokens):
            logits = forward(fm, [int(torch.argmax(logits[0]))], cache)[:, -1, :]
        dec.append(args.decode_tokens / (time.perf_counter() - t1))
    env = environment_fingerprint(fm.device)
    print(json.dumps({"profile": args.profile, "model": args.model, "prefill_tokens": len(ids),
                      "decode_tokens": args.decode_tokens, "repeats": args.repeats,
                      "prefill_tok_s": round(statistics.median(pre), 1),
                      "decode_tok_s": round(statistics.median(dec), 2),
                      "prefill_tok_s_all": [round(x, 1) for x in pre], "decode_tok_s_all": [round(x, 2) for x in dec],
                      "aten_cpu_capability": env["aten_cpu_capability"], "mkl_cbwr": env["mkl_cbwr"],
                      "onednn_max_cpu_isa": env["onednn_max_cpu_isa"]}))
    return 0


# ----------------------------------------------------------------------------------------------- main
def read_registry(path: Path) -> dict[str, Any]:
    """The registry at `path` in format 2 (a list of registrations per profile; format 1's single registration
    read as a list of one), or {} when there is none."""
    try:
        reg = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise SystemExit(f"{path}: not valid JSON ({e}); restore it from git or register again with --register") from e
    if not reg:
        return {}
    if reg.get("format") not in READ_FORMATS:
        raise SystemExit(f"{path}: format {reg.get('format')!r}, expected one of {list(READ_FORMATS)}")
    profiles = reg.get("profiles", {})
    if reg["format"] == "kvgraft-replay/1":
        profiles = {name: [entry] for name, entry in profiles.items()}
    elif not all(isinstance(v, list) for v in profiles.values()):
        raise SystemExit(f"{path}: format {REGISTRY_FORMAT} holds a list of registrations per profile")
    return {**reg, "format": REGISTRY_FORMAT, "profiles": profiles}


def write_registry(path: Path, reg: dict[str, Any]) -> None:
    """Write `reg` (format 2) atomically, as the committed file is written: sorted keys, indent 1."""
    from kvstore import atomic_write

    atomic_write(path, (json.dumps({**reg, "format": REGISTRY_FORMAT}, indent=1, sort_keys=True) + "\n").encode())


def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {"model": args.model, "problems": args.problems, "samples": args.samples, "seed": args.seed,
            "suffix_tokens": args.suffix_tokens, "decode_problems": args.decode_problems,
            "decode_tokens": args.decode_tokens, "prompt": DEFAULT_PROMPT}


def run_profile(args: argparse.Namespace) -> int:
    """Replay (or register) one profile in this process; its kernel variables are entered first."""
    from rich.console import Console

    from kvstore.environment import enter_profile

    enter_profile(args.profile)  # re-executes this command with the profile's variables when they are not set
    console = Console(width=None if sys.stdout.isatty() else 130)
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
    fm = _load_model(params["model"], args.profile)
    measured = measure(fm, params)
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
    p.add_argument("--profile", default=None, help="one profile (default: every profile in the registry)")
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
        from kvstore.environment import enter_profile

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
        cmd = [sys.executable, "-m", "harness.replay", "--profile", profile, "--registry", args.registry]
        codes[profile] = subprocess.run(cmd, cwd=REPO).returncode
    print("replay: " + ", ".join(f"{p} {'PASS' if c == 0 else 'FAIL'}" for p, c in codes.items()))
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
