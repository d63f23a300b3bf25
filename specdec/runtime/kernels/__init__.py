"""specdec's C++ CPU kernels, compiled once per machine.

- `invariant.cpp`: RMSNorm, SiLU·up and attention over the static cache, every row by one fixed
  recipe, so a row of a k-token pass equals a one-token pass at the same position bit for bit;
- `quant_gemm.cpp`: linear layers on 4- and 8-bit weights with 8-bit rows, a weight tile
  unpacked once for all rows (flat verification), row-invariant too;
- `layer.cpp`: all decoder layers of a pass in one call, and an EAGLE-3 head's layer in one call.

They are compiled with the machine's compiler the first time they are needed (about a minute;
announced on stderr) and cached under the specdec cache folder, keyed by torch's version, the
instruction set, the sources, the flags, the CPU and the Python version: what the binary depends
on, not the tools on PATH, so a second shell or venv with another ninja loads the same build
(a build says why it is needed). `SPECDEC_KERNEL_ISA=generic` builds for plain x86-64 with AVX2
instead of this CPU's own instructions (tests use it to check the generic path);
`SPECDEC_KERNELS=off` or `switch_off_kernels()` (the command line's `--no-compile`) disables the kernels.

Without a compiler the runtime falls back to PyTorch's own operators and float32 weights, which
are slower and not batch-invariant (`invariant_kernels()` returns None and says why once).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
import warnings
from pathlib import Path

SOURCES = [Path(__file__).with_name(name) for name in
           ("invariant.cpp", "quant_gemm.cpp", "gguf_pack.cpp", "layer.cpp", "kernels.h", "quant_formats.h", "parallel.h")]
# no fused multiply-add contraction: a vectorised loop and its scalar tail must round alike.
# -fopenmp: at::parallel_for is inline OpenMP; without the flag it runs on one thread. The objects
# are not linked with -lgomp: their OpenMP calls bind to the runtime torch has loaded, so that
# torch.set_num_threads governs them too.
CFLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-fopenmp"]
ISA_FLAGS = {"native": ["-march=native"], "generic": ["-march=x86-64-v3"] if platform.machine() == "x86_64" else []}


def kernel_isa() -> str:
    isa = os.environ.get("SPECDEC_KERNEL_ISA", "native")
    if isa not in ISA_FLAGS:
        from specdec.errors import ConfigError

        raise ConfigError(f"SPECDEC_KERNEL_ISA={isa!r} is not one of {', '.join(ISA_FLAGS)}")
    return isa


def build_name(isa: str) -> str:
    """The build's name: the instruction set and a digest of what the binary depends on — the sources,
    the flags, the CPU (for `native`) and the Python ABI (torch's version names the folder). Not the
    tools found on PATH: a build made with one ninja or shell serves every other."""
    key = (b"".join(source.read_bytes() for source in SOURCES) + " ".join(CFLAGS + ISA_FLAGS[isa]).encode()
           + (_cpu_flags() if isa == "native" else b"") + f"python{sys.version_info[0]}.{sys.version_info[1]}".encode())
    return f"specdec_invariant_{isa}_{hashlib.sha256(key).hexdigest()[:12]}"


def kernels_build_id() -> str:
    """What the timings of a pass depend on: the name of the build this process runs, or "off" when
    the kernels are not used. Read from the loaded module, not worked out again from the sources on
    disk: a source edited while a process runs (a benchmark beside a change) must not give that
    process's cost table another name."""
    module = invariant_kernels()
    return module.__name__ if module is not None else "off"


@functools.cache
def _load(isa: str):
    import torch

    from specdec.announce import announce
    from specdec.cache_dir import cache_root

    name = build_name(isa)
    build = cache_root() / "kernels" / f"torch-{torch.__version__}-{platform.machine()}" / name
    library = build / f"{name}.so"
    built = _import_built(name, library)
    if built is not None:
        return built
    from torch.utils import cpp_extension  # imports setuptools: half a second, only to build

    reason = ("the build there could not be loaded (cut short?)" if library.exists() else
              "no build yet of these sources for this CPU, Python and torch")
    build.mkdir(parents=True, exist_ok=True)
    announce(f"compiling the batch-invariant CPU kernels once ({isa}; about a minute) into {build}: {reason}")
    return cpp_extension.load(
        name=name, sources=[str(source) for source in SOURCES if source.suffix == ".cpp"], build_directory=str(build),
        extra_cflags=CFLAGS + ISA_FLAGS[isa], verbose=False,
    )


def _import_built(name: str, library: Path):
    """The module of an earlier build (its name is a digest of the sources, flags and CPU, so it is
    this build), or None when there is none or it cannot be imported (a build cut short: build again)."""
    import importlib.util

    if not library.exists():
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, library)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    return module


def _cpu_flags() -> bytes:
    """This CPU's feature flags: a build for `-march=native` is only valid where they are the same."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor().encode()
    return next((line for line in text.splitlines() if line.startswith("flags")), "").encode()


_switched_off = False  # by `switch_off_kernels` (the command line's --no-compile)


def switch_off_kernels() -> None:
    """No compiled kernels in this process from now on (call it before a model is loaded)."""
    global _switched_off
    _switched_off = True


def kernels_switched_off() -> bool:
    return _switched_off or os.environ.get("SPECDEC_KERNELS", "on") == "off"


def invariant_kernels():
    """The compiled kernels module, or None when they are switched off or cannot be built here."""
    if kernels_switched_off():
        return None
    isa = kernel_isa()
    try:
        return _load(isa)
    except Exception as err:  # no compiler, no ninja, a failed build: fall back, loudly, once
        _warn_once(f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        return None


@functools.cache
def _warn_once(reason: str) -> None:
    warnings.warn(
        "specdec: the C++ CPU kernels could not be built (" + reason + "); using float32 weights and "
        "PyTorch's operators, which are several times slower and not batch-invariant (greedy speculation "
        "may then differ from plain decoding at near-ties). Install a C++ compiler (g++) and ninja to "
        "restore them.",
        RuntimeWarning, stacklevel=3,
    )
