"""Peak memory of one method's runs.

CUDA: the peak of memory allocated by torch on the device. CPU on Linux: the process's peak
resident set size (VmHWM), which the kernel resets when "5" is written to /proc/self/clear_refs;
it counts everything the process holds (every loaded model, the Python heap), so on CPU the
differences between methods are what each adds on top. Elsewhere: not measured (None).
"""

from __future__ import annotations

from pathlib import Path

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _resident_peak_bytes() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        return None
    return None


class PeakMemory:
    """reset() before a method's run, peak() after it; peak() is None where it cannot be measured."""

    def __init__(self, device: torch.device):
        self.device = device
        self.kind = "cuda" if device.type == "cuda" else ("rss" if self._can_reset_rss() else None)

    @staticmethod
    def _can_reset_rss() -> bool:
        try:
            _CLEAR_REFS.write_text("5")
        except OSError:
            return False
        return _resident_peak_bytes() is not None

    def reset(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.kind == "rss":
            _CLEAR_REFS.write_text("5")

    def peak(self) -> int | None:
        if self.kind == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        if self.kind == "rss":
            return _resident_peak_bytes()
        return None

    @property
    def description(self) -> str:
        return {"cuda": "peak memory allocated by torch on the GPU during the method's runs",
                "rss": "the process's peak resident memory during the method's runs (all loaded models included; a "
                       "baseline's: its own process's)",
                None: "not measured on this platform"}[self.kind]
