"""`specdec export`: a trained head written as the folder an inference engine loads.

    source.py  the head folder (or shipped name) and the target it was trained for
    eagle3.py  EAGLE-3 → SpecForge's layout (vLLM, SGLang, llama.cpp's converter), d2t/t2d invariants
    medusa.py  Medusa → vLLM's MedusaModel layout (with the target's LM head rows)
    tables.py  the tensors each engine reads, pinned from its source at a recorded commit
    gamma.py   the draft length written into the launch file
    launch.py  launch.sh: the engine's command line
    folder.py  config.json + model.safetensors + launch.sh
    exporter.py export_head: read, refuse or map, check, write
    command.py the command line

An EAGLE-1 head is refused: no engine runs its layout (see `exporter.refuse_eagle`).
"""

FORMATS = ("vllm", "sglang", "llama.cpp")
