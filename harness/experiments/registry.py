"""The replay registry (scripts/replay_registry.json) and the judgement of a recomputation against it: which
registration is this machine's check, which are measurements, and the verdict. harness/experiments/replay.py measures
and runs
it (`make replay`); this module needs neither torch nor the model.

The registry (scripts/replay_registry.json, committed), format "kvgraft-replay/2"::

    {"format": "kvgraft-replay/2",
     "params": {"model", "problems", "samples", "seed", "suffix_tokens", "decode_problems", "decode_tokens",
                "prompt"},                       # shared by every registration
     "profiles": {"<profile>": [registration, ...]}}

    registration = {"model_fingerprint", "tokenizer_fingerprint", "determinism", "environment", "numerics_sha256",
                    "samples": [{"index", "prefix_tokens", "suffix_tokens", "tokens_sha256", "logits_sha256",
                                 "graft_equal"}, ...],
                    "decode": [{"problem_id", "prompt_tokens", "prompt_sha256", "first_logits_sha256",
                                "token_ids"}, ...],
                    "seconds", "registered_at",
                    "numerics_former": [...]}    # optional: the same machine's fingerprints under earlier formats
                                                 # of the battery (the mode's: kvgraft-numerics-invariant/1)

A profile holds one registration per compute environment: two registrations of a profile never have equal
environments (`kvstore.environment.environment_differences` empty) and equal numerics fingerprints.

A registration of the batch-invariant mode made by another version of the mode's kernel (its `determinism` records
`batch_invariant_kernel`; one recorded before versions ran kvstore's UNVERSIONED_KERNEL) is never compared with the
recomputation: NOT COMPARABLE, never this machine's check, and --register keeps it beside this kernel's (issue 58).

In the batch-invariant mode (a `+batch_invariant` profile) a registration is this machine's check when the environment
agrees except for the CPU's names (kvstore.environment.CPU_IDENTITY) and the mode's numerics fingerprint is equal:
the mode's bits move between such CPUs (issue 52), so every such registration must reproduce. Registering still
keeps one registration per CPU (names compared), so a second machine kind adds its own beside the first.

`numerics_sha256` (kvstore.environment.numerics_fingerprint: a fixed battery of the model's kernels run in the
profile's settings) is what makes a registration this machine's: two machines whose environment records agree can
still compute other bits (issue 41: an AMD EPYC family 23 against an AMD EPYC registration, every recorded field
equal, native 49/55). A registration matches only when its environment AND its numerics fingerprint equal this
machine's; one registered before the fingerprint existed has none, so it cannot say whether this machine computes
its bits: it is a measurement, never the check (register this machine to get one). So a machine whose numerics
differ from every registration is told "no registration matches", never a hash mismatch under an environment
called equal. A registration recorded under an earlier format of the battery matches a machine whose fingerprint
under that format is the one recorded (`numerics_former` of the measurement). Format "kvgraft-replay/1" (the same, with
one registration per profile instead of a list) is read as a one-element list; writing always writes format 2.

--register computes this machine's hashes under the profile and REPLACES the profile's registration whose
environment matches this machine's, or APPENDS one; another machine's registration is never dropped.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_REGISTRY", "READ_FORMATS", "REGISTRY_FORMAT", "Outcome", "Replay", "compare", "print_outcome",
           "print_replay", "read_registry", "register", "register_command", "replay_profile", "source_of",
           "write_registry"]

DEFAULT_REGISTRY = Path(__file__).resolve().parents[2] / "scripts" / "replay_registry.json"
REGISTRY_FORMAT = "kvgraft-replay/2"
READ_FORMATS = ("kvgraft-replay/1", REGISTRY_FORMAT)  # 1: one registration per profile, read as a list of one


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
    from kvstore import both_invariant, environment_differences

    out = Outcome(profile, source=source_of(registered), registered_at=registered.get("registered_at"))
    for key in ("model_fingerprint", "tokenizer_fingerprint"):
        if registered.get(key) != measured.get(key):
            out.problems.append(f"{key} {str(registered.get(key))[:12]} registered, {str(measured.get(key))[:12]} now")
    kernel = _kernel_difference(registered, measured)
    if kernel:  # another kernel of the mode: not this machine's check, and none of its hashes is compared
        out.problems.append(kernel)
    reg_env, now_env = registered.get("environment", {}), measured.get("environment", {})
    reg_n, now_n = registered.get("numerics_sha256"), measured.get("numerics_sha256")
    if reg_n in measured.get("numerics_former", ()):
        reg_n = now_n  # this machine's under an earlier battery format (as _numerics_differences reads it)
    # CPU names not binding only on the mode's measured evidence, the same fingerprint on both sides (issue 61)
    mode = both_invariant(registered.get("determinism"), measured.get("determinism"), (reg_n, now_n))
    out.environment_differences = (environment_differences(reg_env, now_env, mode)
                                   + _numerics_differences(registered, measured) + ([kernel] if kernel else []))
    differing = {d.split(":", 1)[0].removeprefix("environment.") for d in out.environment_differences}
    for key in sorted(set(reg_env) | set(now_env)):
        out.environment.append((key, reg_env.get(key), now_env.get(key), key not in differing))
    reg_n, now_n = registered.get("numerics_sha256"), measured.get("numerics_sha256")
    out.environment.append(("numerics_sha256", (reg_n or "not recorded")[:16], (now_n or "not measured")[:16],
                            "numerics_sha256" not in differing))
    for s, m, same_input in _paired(registered, measured, "samples", "index", "tokens_sha256", out.problems,
                                    "sample {}: its tokens differ from the registered ones"):
        ok = bool(same_input and m["logits_sha256"] == s["logits_sha256"] and m["graft_equal"])
        out.rows.append({"kind": "graft", "name": f"sample {s['index']} ({s['prefix_tokens']}+{s['suffix_tokens']})",
                         "registered": s["logits_sha256"], "measured": m["logits_sha256"] if m else None,
                         "graft_equal": m["graft_equal"] if m else None, "reproduced": ok})
    for d, m, same_input in _paired(registered, measured, "decode", "problem_id", "prompt_sha256", out.problems,
                                    "decode {}: its prompt tokens differ from the registered ones"):
        ok = bool(same_input and m["first_logits_sha256"] == d["first_logits_sha256"]
                  and m["token_ids"] == d["token_ids"])
        out.rows.append({"kind": "decode", "name": f"decode {d['problem_id']} ({len(d['token_ids'])} tokens)",
                         "registered": d["first_logits_sha256"], "measured": m["first_logits_sha256"] if m else None,
                         "graft_equal": None, "reproduced": ok})
    if not out.rows:
        out.problems.append("the registry lists no samples for this profile")
    return out


def _kernel_difference(registered: dict[str, Any], measured: dict[str, Any]) -> str:
    """Why a registration of the batch-invariant mode was computed by another version of the mode's kernel than the
    recomputation (kvstore.recorded_kernel: one that records none ran UNVERSIONED_KERNEL), or "". Such a
    registration is never compared: its hashes are another kernel's bits (issue 58)."""
    from kvstore import KERNEL_RECORD, recorded_kernel

    reg, now = recorded_kernel(registered.get("determinism")), recorded_kernel(measured.get("determinism"))
    if reg is None or now is None or reg == now:
        return ""
    return (f"determinism.{KERNEL_RECORD}: registered {reg}, now {now} (another kernel of the mode computes other "
            "bits: register this one)")


def _numerics_differences(registered: dict[str, Any], measured: dict[str, Any]) -> list[str]:
    """Why the registration's numerics are not known to be this machine's: its fingerprint differs, or it has none
    (registered before the fingerprint existed). Empty when both have the same one, or the registration's is this
    machine's under an earlier format of the battery (`numerics_former`, kvstore's Backend.former_numerics)."""
    reg, now = registered.get("numerics_sha256"), measured.get("numerics_sha256")
    if reg is None:
        return ["numerics_sha256: not recorded by the registration (registered before numerics fingerprints), so it "
                "cannot say this machine computes its bits"]
    if reg != now and reg not in measured.get("numerics_former", ()):
        return [f"numerics_sha256: registered {reg[:16]}, this machine {str(now)[:16]}"]
    return []


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
            return (f"profile {p}: no registration matches this machine's environment and numerics fingerprint "
                    f"({self.here}; registered: "
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
    from kvstore import PORTABLE_PROFILES

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
    from kvstore import environment_differences

    registrations = reg.setdefault("profiles", {}).setdefault(profile, [])
    for i, old in enumerate(registrations):
        if not environment_differences(old.get("environment", {}), measured.get("environment", {})) and not (
                _numerics_differences(old, measured)) and not _kernel_difference(old, measured):
            # the CPU's names too: another CPU's registration is kept, and another kernel's of the mode
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
