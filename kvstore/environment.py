"""The compute environment a byte-exact graft depends on, as one value, and the determinism profiles that pin
its kernel paths.

Exactness is a property of (artifact, environment), not of the artifact alone (DESIGN.md, "Known facts, second
round"): the same model, tokens and settings give other logits bits on another processor, because torch's CPU
build picks ATen, MKL and oneDNN kernels by what the processor offers. `ComputeEnvironment` names everything we
know of that selects the arithmetic:

    device kind and name; machine; CPU vendor and model;
    the kernel paths in force: ATen's CPU capability, MKL_CBWR (MKL's conditional numerical reproducibility),
    ONEDNN_MAX_CPU_ISA (oneDNN's instruction-set cap);
    every other variable that moves MKL's, oneDNN's or ATen's bits, when set (`RECORDED_VARIABLES`:
    MKL_ENABLE_INSTRUCTIONS, MKL's thread and stripe counts, oneDNN's older DNNL_ names and fp32 math mode, ...);
    torch and transformers versions; torch's intra-op threads;
    on CUDA: GPU name and compute capability, CUDA, cuDNN, cuBLAS and driver versions.

It is recorded in every artifact (`Snapshot.environment`, kvstore.backends.transformers.capture), library and run
manifest, and
compared at graft (`environment_differences`, called by kvstore.engine.admission).

Profiles (`determinism.profile`): "native" runs the machine's own kernel paths (none of the three variables
set); "portable" pins them to AVX2 (`PROFILES`), a path every x86-64 machine of the last decade has, so that
machines of different vendors run the same kernel paths. It does not promise the same bits: an AMD EPYC
registration replayed on an Intel Xeon under it, every kernel-path field equal, reproduced 0/55 hashes (`make
replay`, which keeps measuring it; `PORTABLE_PROFILES` is empty). The variables only act when set before torch
is imported: `check_profile` refuses a process where they were not, and `enter_profile` (called by the entry
points) re-executes the process with them set.

This module imports torch only inside functions, so importing it changes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shlex
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from kvstore.errors import SettingsError

ENVIRONMENT_FORMAT = "kvgraft-env/1"
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_MAX_CPU_ISA")
PROFILES: dict[str, dict[str, str]] = {
    "native": {},
    "portable": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
# Profiles that promise the same bits on any machine running their kernel paths (harness/experiments/replay.py then
# requires
# every machine's registration to reproduce). None does: the AMD EPYC (AVX2) registration replayed on an Intel
# Xeon (AVX-512) under the portable profile, with ATen capability, MKL_CBWR, ONEDNN_MAX_CPU_ISA (all AVX2), torch,
# transformers and threads equal, reproduced 0/55 hashes (only cpu_vendor, cpu_model, device_name differed;
# docs/exactness.md, "Exactness that travels"). "portable" still pins the kernel paths; it promises nothing across
# vendors.
PORTABLE_PROFILES: tuple[str, ...] = ()
#: Every other variable that moves the bits MKL, oneDNN or ATen compute (or which of them computes a product), read
#: in the libraries torch 2.13's CPU wheel links (the names in libtorch_cpu.so; oneDNN reads ONEDNN_X, else DNNL_X).
#: No profile pins them: each is recorded in the environment when set (`ComputeEnvironment.variables`) and binds like
#: any recorded fact, so a run or an artifact made under one names it. Recorded only when set: a process without
#: any records what every environment recorded before they were (absent = unset). MKL_ENABLE_INSTRUCTIONS=AVX2 moved
#: the mode's numerics fingerprint on an Intel Xeon (DESIGN.md, seventh round); on AMD EPYC MKL runs its generic
#: path and none of them moved a bit (docs/exactness.md). OMP_NUM_THREADS is not here: torch's intra-op threads,
#: which it sets, are recorded (`torch_threads`), and Ray sets it per task.
RECORDED_VARIABLES = (
    "MKL_ENABLE_INSTRUCTIONS",  # the highest instruction set MKL dispatches to (AVX2, AVX512, ...)
    "MKL_DEBUG_CPU_TYPE",  # MKL < 2020.1: the CPU type MKL assumes (a known switch on AMD)
    "MKL_NUM_THREADS", "MKL_DYNAMIC", "MKL_NUM_STRIPES", "MKL_THREADING_LAYER",  # how MKL splits a product
    "MKL_DOMAIN_NUM_THREADS",
    "DNNL_MAX_CPU_ISA", "ONEDNN_CPU_ISA_HINTS", "DNNL_CPU_ISA_HINTS",  # oneDNN's instruction set (older names too)
    "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE",  # float32 products in bf16/tf32 arithmetic
    "TORCH_MKLDNN_MATMUL_MIN_DIM", "TORCH_MKLDNN_MATMUL_MIN_SIZE",  # which products ATen hands to oneDNN
    "TORCH_LINEAR_FLATTEN_3D",  # how ATen folds a 3-d input of a linear layer into one product
)

# Fields recorded for information only: they do not select the arithmetic.
_INFORMATIONAL = ("format", "python", "profile")
# Fields artifacts deposited before this value existed recorded under another name.
_LEGACY_NAMES = {"cpu_isa": "aten_cpu_capability"}
# Kernel-path fields an old artifact did not record: no code set those variables then, so they were unset
# unless the shell set them; compared as unset (a portable process is refused such an artifact).
_LEGACY_UNSET = ("mkl_cbwr", "onednn_max_cpu_isa")
# Fields that record wrote only on CUDA: absent from a CPU record of then, they were None (they do not apply)
_CUDA_ONLY = ("gpu_capability", "cuda", "cudnn", "cublas", "driver")
_REEXEC_MARK = "KVGRAFT_PROFILE_REEXEC"
_pinned_before_torch: dict[str, str] = {}


@dataclass(frozen=True)
class ComputeEnvironment:
    """The facts that select floating-point kernels, as captured in this process (`current_environment`).

    Values are JSON scalars; a fact that does not apply (CUDA fields on CPU) or cannot be read is None.
    """

    device_kind: str
    device_name: str
    machine: str
    cpu_vendor: str
    cpu_model: str
    aten_cpu_capability: str
    mkl_cbwr: str | None
    onednn_max_cpu_isa: str | None
    torch: str
    transformers: str
    torch_threads: int
    python: str
    profile: str
    gpu_capability: str | None = None
    cuda: str | None = None
    cudnn: str | None = None
    cublas: str | None = None
    driver: str | None = None
    variables: dict[str, str] | None = None  # RECORDED_VARIABLES set in this process (name -> value); None: none
    format: str = ENVIRONMENT_FORMAT

    def to_dict(self) -> dict[str, Any]:
        """The stable dict recorded in artifacts and manifests (sorted keys; `variables` only when one is set, so
        the record of a process without any is what it was before they were recorded)."""
        d = asdict(self)
        if not d["variables"]:
            del d["variables"]
        return dict(sorted(d.items()))

    @property
    def id(self) -> str:
        """A short id of the binding facts (16 hex digits): equal ids, same kernels."""
        return environment_id(self.to_dict())


def environment_id(env: dict[str, Any]) -> str:
    """16 hex digits of SHA-256 over the binding fields of a recorded environment (informational ones left out)."""
    binding = {k: v for k, v in _normalized(env).items() if k not in _INFORMATIONAL}
    return hashlib.sha256(json.dumps(binding, sort_keys=True).encode()).hexdigest()[:16]


def current_environment(device: Any = None) -> ComputeEnvironment:
    """The compute environment of this process for `device` (a torch.device or a string; default CPU)."""
    import torch
    import transformers

    dev = torch.device(device) if device is not None else torch.device("cpu")
    vendor, model = _cpu_info()
    kernel = _kernel_variables()
    cuda: dict[str, Any] = {}
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        cuda = {
            "gpu_capability": f"{major}.{minor}",
            "cuda": torch.version.cuda,
            "cudnn": str(cudnn) if cudnn is not None else None,
            "cublas": _package_version("nvidia-cublas-cu12", "nvidia-cublas-cu13", "nvidia-cublas"),
            "driver": _nvidia_driver(),
        }
    return ComputeEnvironment(
        device_kind=dev.type,
        device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else model,
        machine=platform.machine(),
        cpu_vendor=vendor,
        cpu_model=model,
        aten_cpu_capability=torch.backends.cpu.get_cpu_capability(),
        mkl_cbwr=kernel["MKL_CBWR"],
        onednn_max_cpu_isa=kernel["ONEDNN_MAX_CPU_ISA"],
        torch=torch.__version__,
        transformers=transformers.__version__,
        torch_threads=torch.get_num_threads(),
        python=platform.python_version(),
        profile=profile_of_variables(kernel),
        variables=recorded_variables(),
        **cuda,
    )


def recorded_variables() -> dict[str, str] | None:
    """The RECORDED_VARIABLES set in this process (name -> value, sorted), or None when none is."""
    found = {v: os.environ[v] for v in sorted(RECORDED_VARIABLES) if v in os.environ}
    return found or None


#: The facts that name the CPU rather than the bits its kernels compute. The batch-invariant mode is bound by its own
#: measured numerics fingerprint instead (kvstore/backends/transformers/invariant.py `numerics_fingerprint`: the
#: mode's kernels at the model's shapes), so between two CPUs whose fingerprints for the mode are equal its
#: artifacts graft and its replay registrations are checks (issue 52); the default mode stays bound to them all.
CPU_IDENTITY = ("cpu_vendor", "cpu_model", "aten_cpu_capability", "device_name")


#: Where a record of the batch-invariant mode (an artifact's `determinism`, a backend's `settings()`, a run's
#: manifest, a replay registration) names the version of the kernel that computed it (issue 58): a change that moves
#: the mode's bits is a new version, and a record of another version is refused by admission
#: (kvstore.engine.admission.settings_differences), never assumed. Recorded only when it is not UNVERSIONED_KERNEL.
KERNEL_RECORD = "batch_invariant_kernel"
#: The kernel every record of the mode made before versions were recorded ran (MKL's sgemm in fixed row tiles and the
#: block attention, issues 43-52): a record of the mode without KERNEL_RECORD names it, so those records keep their
#: bytes, ids and keys, and are told apart from a newer kernel's.
UNVERSIONED_KERNEL = "mkl-tiles/0"


def with_kernel(record: dict, kernel: str) -> dict:
    """`record` (a Determinism's dict, changed in place and returned) naming the mode's `kernel` when it records the
    mode and the kernel is not UNVERSIONED_KERNEL (what a record without it means)."""
    if record.get("batch_invariant") is True and kernel != UNVERSIONED_KERNEL:
        record[KERNEL_RECORD] = kernel
    return record


def recorded_kernel(record: Any) -> str | None:
    """The mode's kernel a recorded determinism names: None when it is not a record of the mode, its KERNEL_RECORD,
    else UNVERSIONED_KERNEL (recorded before kernel versions were)."""
    if not isinstance(record, dict) or record.get("batch_invariant") is not True:
        return None
    return str(record.get(KERNEL_RECORD, UNVERSIONED_KERNEL))


def both_invariant(recorded: Any, current: Any, numerics: tuple[Any, Any] = (None, None)) -> bool:
    """Whether the CPU's names (`CPU_IDENTITY`) may be left out of comparing two environments: both recorded settings
    (determinism dicts: an artifact's or a registration's, and the engine's or the recomputation's) are the
    batch-invariant mode AND `numerics` is a numerics fingerprint measured on both sides, the same one (the record's,
    and this engine's). The exemption is the mode's measured evidence, never a settings key (issue 61): an engine
    that measures none (vLLM, whose own VLLM_BATCH_INVARIANT is recorded as `batch_invariant`; llama.cpp) or a side
    with no record compares every identity field."""
    a, b = numerics
    measured = isinstance(a, str) and len(a) == 64 and a == b
    return measured and all(isinstance(d, dict) and d.get("batch_invariant") is True for d in (recorded, current))


def environment_differences(recorded: dict[str, Any], current: dict[str, Any],
                            batch_invariant: bool = False) -> list[str]:
    """Each binding fact that differs between a recorded environment (an artifact's) and `current`, as
    "environment.<field>: artifact X, this process Y" (empty when they agree). `batch_invariant` (both sides in
    the mode): the CPU's names (`CPU_IDENTITY`) are not compared; its numerics fingerprint, which the caller checks,
    is the evidence.

    A recorded environment without `format` was written before this value existed (kvstore/FORMAT.md,
    "Environment binding"): it is compared on the fields it has (`cpu_isa` read as `aten_cpu_capability`), its
    unrecorded MKL_CBWR / ONEDNN_MAX_CPU_ISA as unset, and facts it never recorded are not compared. A variable of
    RECORDED_VARIABLES one side does not record was unset there (recorded only when set), named
    "environment.variables.<NAME>: artifact None, this process 'AVX2'".
    """
    legacy = "format" not in recorded
    rec, cur = _normalized(recorded), _normalized(current)
    out = record_problems(recorded)  # the record's own format first (issue 61)
    if out:
        return out + [f"environment.{k}: artifact '<not recorded>', this process {v!r}" for k, v in sorted(cur.items())
                      if k not in _INFORMATIONAL and k not in rec]
    skip = set(_INFORMATIONAL) | (set(CPU_IDENTITY) if batch_invariant else set())
    required = {_LEGACY_NAMES.get(k, k) for k in _record_fields(recorded)}  # a field its format holds is never skipped
    for key in sorted((set(rec) | set(cur) | required) - skip):
        if key.startswith(_VARIABLE):  # recorded only when set: absent on one side means unset there
            a, b = rec.get(key), cur.get(key)
            if a != b:
                out.append(f"environment.{key}: artifact {a!r}, this process {b!r}")
            continue
        if key not in rec:  # a record of before kvgraft-env/1: its format says which it left unset (module note)
            unset = _LEGACY_UNSET + (_CUDA_ONLY if rec.get("device_kind") == "cpu" else ())
            a = None if legacy and key in unset else "<not recorded>"
        else:
            a = rec[key]
        b = cur.get(key, "<not recorded>")
        if a != b:
            out.append(f"environment.{key}: artifact {a!r}, this process {b!r}")
    return out


#: The binding fields each environment record format holds (issue 61: a record missing one is a difference, never
#: skipped). A record without `format` is one of those written before the format existed: the transformers record of
#: before kvgraft-env/1 (`_LEGACY_FIELDS`: only kvgraft-kv/1 artifacts can hold one) or a scripted engine's
#: {"backend": name} (kvstore.backends.fake, its whole record).
ENVIRONMENT_FIELDS: dict[str, tuple[str, ...]] = {
    ENVIRONMENT_FORMAT: ("aten_cpu_capability", "cpu_model", "cpu_vendor", "device_kind", "device_name", "machine",
                         "mkl_cbwr", "onednn_max_cpu_isa", "torch", "torch_threads", "transformers"),
}
_LEGACY_FIELDS = ("cpu_isa", "device_kind", "device_name", "machine", "torch", "transformers")


def _record_fields(recorded: dict[str, Any]) -> tuple[str, ...]:
    """The binding fields a record's own format holds (a record without `format`: module ENVIRONMENT_FIELDS note)."""
    fmt = recorded.get("format")
    if fmt is None:
        return () if set(recorded) == {"backend"} else _LEGACY_FIELDS
    return ENVIRONMENT_FIELDS.get(fmt, ())


def record_problems(recorded: Any) -> list[str]:
    """What makes an environment record unreadable as a record, as "environment.format: ..." lines (empty: it names
    a format this code knows, or is one written before formats existed): an empty record, not a mapping, or an
    unknown `format`. Its missing binding fields are differences of `environment_differences` (issue 61)."""
    if not isinstance(recorded, dict) or not recorded:
        got = "<empty record>" if isinstance(recorded, dict) else type(recorded).__name__
        return [f"environment.format: artifact {got}, this process {ENVIRONMENT_FORMAT!r} (an environment record names "
                "its format and its binding facts; deposit it again here)"]
    fmt = recorded.get("format")
    if fmt is not None and fmt not in ENVIRONMENT_FIELDS:
        return [f"environment.format: artifact {fmt!r}, this process {ENVIRONMENT_FORMAT!r} (a format this code does "
                "not know: deposit it again here)"]
    return []


_VARIABLE = "variables."  # a recorded variable's key in `_normalized`: "variables.MKL_ENABLE_INSTRUCTIONS"


def _normalized(env: dict[str, Any]) -> dict[str, Any]:
    """The record with legacy names read as today's, and `variables` as one key per variable (compared one by one;
    its absence is every variable unset)."""
    out = {_LEGACY_NAMES.get(k, k): v for k, v in env.items() if k != "variables"}
    variables = env.get("variables")
    if isinstance(variables, dict):
        out.update({_VARIABLE + str(k): v for k, v in variables.items()})
    elif variables is not None:  # not the recorded form: compared as it is, so it differs from any process's
        out[_VARIABLE.rstrip(".")] = variables
    return out


# ------------------------------------------------------------------------------------------------ numerics
NUMERICS_FORMAT = "kvgraft-numerics/1"  # the battery below; a change to it is a new format (and new fingerprints)
NUMERICS_TAG = "numerics:"  # a store tag "numerics:<sha256>": the numerics fingerprint an artifact was deposited under


def numerics_battery_dims(config: Any) -> dict[str, int]:
    """The shapes the battery runs, from a transformers config (its text config): hidden, intermediate, heads,
    kv heads, head dim, vocabulary (capped at 8192 rows: the lm_head GEMM's blocking, not its whole width)."""
    c = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config

    def num(name: str, default: int) -> int:  # a per-layer list (gemma3n's intermediate_size): its largest
        v = getattr(c, name, None) or default
        return int(max(v)) if isinstance(v, list | tuple) else int(v)

    hidden = num("hidden_size", 64)
    heads = num("num_attention_heads", 4)
    kv = num("num_key_value_heads", heads)
    return {"hidden": hidden, "intermediate": num("intermediate_size", 4 * hidden), "heads": heads,
            "kv_heads": kv if kv and heads % kv == 0 else heads,
            "head_dim": num("head_dim", hidden // heads),
            "vocab": min(num("vocab_size", 32000), 8192)}


def numerics_fingerprint(dims: dict[str, int], dtype: Any = None, device: Any = None) -> str:
    """SHA-256 of a fixed battery of kernels in this process's settings (threads, kernel variables, dtype): the
    model's GEMM shapes at 1, 7 and 64 rows (q/k/v-like, MLP up and down, a slice of lm_head), causal attention
    through torch's scaled_dot_product_attention, an RMS norm and a softmax, on fixed pseudo-random inputs.
    A measured fact where the environment record's fields are named ones: two machines whose records agree but
    whose BLAS blocks otherwise (cache sizes, code path) compute other bits here (issue 41, finding 0)."""
    import torch
    import torch.nn.functional as F

    dt = dtype if isinstance(dtype, torch.dtype) else getattr(torch, str(dtype or "float32"))
    dev = torch.device(device) if device is not None else torch.device("cpu")
    gen = torch.Generator(device="cpu").manual_seed(20261202)
    h = hashlib.sha256(NUMERICS_FORMAT.encode() + json.dumps(dims, sort_keys=True).encode() + str(dt).encode())

    def rand(*shape: int) -> Any:
        return (torch.randn(*shape, generator=gen, dtype=torch.float32) * 0.05).to(device=dev, dtype=dt)

    def eat(t: Any) -> None:
        h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())

    hid, inter, hd = dims["hidden"], dims["intermediate"], dims["head_dim"]
    heads, kv = dims["heads"], dims["kv_heads"]
    weights = [rand(heads * hd, hid), rand(inter, hid), rand(hid, inter), rand(dims["vocab"], hid)]
    with torch.inference_mode():
        for rows in (1, 7, 64):
            x = rand(rows, hid)
            eat(F.linear(x, weights[0]))
            up = F.linear(x, weights[1])
            eat(up)
            eat(F.linear(up, weights[2]))
            eat(F.linear(x, weights[3]))
            var = x.float().pow(2).mean(-1, keepdim=True)
            eat((x.float() * torch.rsqrt(var + 1e-6)).to(dt))  # RMS norm
            eat(torch.softmax(x.float() * 3.0, dim=-1))
            q, k, v = rand(1, heads, rows, hd), rand(1, kv, rows, hd), rand(1, kv, rows, hd)
            if kv != heads:
                k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
            eat(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    return h.hexdigest()


def numerics_differences(recorded: Any, current: str | None, what: str = "artifact") -> list[str]:
    """"numerics_sha256: artifact X, this process Y" when the fingerprints an artifact (or a registration) was
    made under are known and this process's is not among them (empty otherwise). `recorded`: one fingerprint, a
    list of them, or None. Only the comparison: what an absent or multiple record means is the caller's rule
    (kvstore.engine.admission.numerics_evidence_problem refuses both, issue 51)."""
    rec = [recorded] if isinstance(recorded, str) else [str(r) for r in (recorded or ())]
    if not rec or current is None or current in rec:
        return []
    return [f"numerics_sha256: {what} {' / '.join(r[:16] for r in rec)}, this process {current[:16]} (the same "
            "kernel battery computes other bits here)"]


def numerics_tag(sha: str) -> str:
    """The store tag recording the numerics fingerprint an artifact was deposited under."""
    return NUMERICS_TAG + sha


def numerics_of_tags(tags: Any) -> list[str]:
    """The numerics fingerprints a store's tags record for an artifact (empty: not recorded)."""
    return sorted(str(t)[len(NUMERICS_TAG):] for t in (tags or ()) if str(t).startswith(NUMERICS_TAG))


# ------------------------------------------------------------------------------------------------ profiles
def profile_variables(profile: str) -> dict[str, str]:
    """The kernel variables a profile sets (native: none; every other variable of KERNEL_VARIABLES unset)."""
    if profile not in PROFILES:
        raise SettingsError(f"determinism.profile={profile!r}: use one of {list(PROFILES)}")
    return dict(PROFILES[profile])


def profile_of_variables(kernel: dict[str, str | None]) -> str:
    """The profile whose variables are exactly `kernel` (name -> value or None), or "custom"."""
    for name, want in PROFILES.items():
        if all(kernel.get(v) == want.get(v) for v in KERNEL_VARIABLES):
            return name
    return "custom"


def _kernel_variables() -> dict[str, str | None]:
    return {v: os.environ.get(v) for v in KERNEL_VARIABLES}


def _startup_variables() -> dict[str, str | None] | None:
    """The kernel variables the process was started with (/proc/self/environ), None where unreadable."""
    try:
        raw = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {v: (env[v.encode()].decode() if v.encode() in env else None) for v in KERNEL_VARIABLES}


def profile_problems(profile: str) -> list[str]:
    """Why the kernel paths in force are not the profile's (empty when they are). A variable counts as in
    force when the process started with it, or when `enter_profile` set it before torch was imported."""
    want = profile_variables(profile)
    now, start = _kernel_variables(), _startup_variables()
    out = []
    for var in KERNEL_VARIABLES:
        value = want.get(var)
        if now[var] != value:
            out.append(f"{var} is {now[var]!r}, the profile needs {value!r}")
        elif value is not None and start is not None and start[var] != value and _pinned_before_torch.get(var) != value:
            out.append(f"{var}={value} was set after torch was imported, so it does not act")
    return out


def profile_command(profile: str) -> str:
    """The command line that starts this process again under the profile's variables."""
    want = profile_variables(profile)
    sets = [f"{v}={want[v]}" for v in KERNEL_VARIABLES if v in want]
    unsets = [f"-u {v}" for v in KERNEL_VARIABLES if v not in want and os.environ.get(v) is not None]
    argv = getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]
    prefix = "env " + " ".join(unsets + sets) + " " if sets or unsets else ""
    return prefix + shlex.join(argv)


def check_profile(profile: str) -> None:
    """Raise SettingsError when the process does not run the profile's kernel paths (Determinism.apply)."""
    problems = profile_problems(profile)
    if problems:
        raise SettingsError(
            f"determinism.profile={profile}: {'; '.join(problems)}. The kernel variables act only when set before "
            f"torch is imported: start the process as `{profile_command(profile)}` (the harness entry points and "
            "scripts/replay.py do this themselves)"
        )


def enter_profile(profile: str) -> None:
    """For entry points: make the process run the profile's kernel paths. Before torch is imported the
    variables are set here; after, the process re-executes itself (same command line) with them set."""
    if not profile_problems(profile):
        return
    want = profile_variables(profile)
    if "torch" not in sys.modules:
        for var in KERNEL_VARIABLES:
            if var in want:
                os.environ[var] = want[var]
                _pinned_before_torch[var] = want[var]
            else:
                os.environ.pop(var, None)
        return
    if os.environ.get(_REEXEC_MARK):
        check_profile(profile)  # re-executed once already (one profile per process, e.g. not a sweep): say why
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_VARIABLES}
    env.update(want)
    env[_REEXEC_MARK] = profile
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)


# ------------------------------------------------------------------------------------------------ machine facts
@functools.lru_cache(maxsize=1)
def _cpu_info() -> tuple[str, str]:
    """(vendor, model name) from /proc/cpuinfo, else from platform (read once per process: every graft asks)."""
    vendor, model = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "vendor_id" and not vendor:
                vendor = value
            elif key == "model name" and not model:
                model = value
            if vendor and model:
                break
    except OSError:
        pass
    return vendor or platform.machine() or "unknown", model or platform.processor() or "unknown"


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (else platform's): every benchmark's JSON names its machine."""
    return _cpu_info()[1]


def _package_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _nvidia_driver() -> str | None:
    try:
        return Path("/proc/driver/nvidia/version").read_text().split("Kernel Module", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
