"""llama.cpp's own quantizer (`llama_model_quantize`), run by a python that has llama-cpp-python
installed: specdec's environment does not hold it (a source build, kept out of `make test`).
Shared by scripts/llama_cpp_agreement.py and scripts/dear_twin.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

FTYPES = {"Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "Q8_0": 7}  # llama.cpp's LLAMA_FTYPE_MOSTLY_* numbers

QUANTIZE = """
import sys, llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = int(sys.argv[3])
params.allow_requantize = True  # a quantized source (a twin of the Q4_1 default model) is requantized
params.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), params))
"""


def quantize(llama_python: str | Path, source: Path, out: Path, file_type: str) -> None:
    """Write `source` quantized to `file_type` (a key of FTYPES) as `out`; CalledProcessError if
    llama.cpp's quantizer fails."""
    subprocess.run([str(llama_python), "-c", QUANTIZE, str(source), str(out), str(FTYPES[file_type])], check=True)
