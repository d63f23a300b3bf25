"""The kernels' build is keyed by what the binary depends on, not by the environment's tools: a second
process whose PATH holds no compiler and no ninja at all loads the built kernels without compiling
(issue 29: the build used to be redone whenever the `ninja` found on PATH changed).

The build id the cost tables are keyed by names the build a process loaded, whatever the sources say
since.

Negative control: the same process pointed at a fresh cache folder (no build there) announces a
build with its reason and, with no compiler on PATH, falls back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specdec.runtime.kernels import invariant_kernels

LOAD = ("import warnings; warnings.simplefilter('always');"
        "from specdec.runtime.kernels import invariant_kernels; k = invariant_kernels();"
        "print('loaded' if k is not None else 'fell back')")


def run_without_tools(tmp_path, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    empty = tmp_path / "no-tools"
    empty.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(empty), **env_extra}
    return subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(invariant_kernels() is None, reason="the kernels cannot be built here")
def test_a_process_without_ninja_or_compiler_on_path_loads_the_built_kernels(tmp_path):
    done = run_without_tools(tmp_path, {})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "loaded"
    assert "compiling" not in done.stderr


@pytest.mark.skipif(invariant_kernels() is None, reason="the kernels cannot be built here")
def test_negative_control_a_fresh_cache_compiles_and_without_tools_falls_back(tmp_path):
    done = run_without_tools(tmp_path, {"SPECDEC_CACHE_DIR": str(tmp_path / "fresh-cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "compiling the batch-invariant CPU kernels once" in done.stderr
    assert "no build yet" in done.stderr
    assert done.stdout.strip() == "fell back"


@pytest.mark.skipif(invariant_kernels() is None, reason="the kernels cannot be built here")
def test_the_build_id_names_the_build_this_process_runs(monkeypatch):
    """The cost tables are keyed by `kernels_build_id`: the build loaded in this process. A kernel
    source edited after the load (a change made while a benchmark runs) leaves the id alone, so one
    process keeps one cost table. Control: the name worked out from the sources now is another."""
    from specdec.runtime import kernels

    loaded = kernels.kernels_build_id()
    assert loaded == invariant_kernels().__name__ == kernels.build_name(kernels.kernel_isa())  # the sources as loaded
    monkeypatch.setattr(kernels, "build_name", lambda isa: f"specdec_invariant_{isa}_edited000000")  # edited since
    assert kernels.build_name(kernels.kernel_isa()) != loaded
    assert kernels.kernels_build_id() == loaded
