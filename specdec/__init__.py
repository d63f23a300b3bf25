"""specdec: lossless speculative decoding for causal language models.

Start with `specdec.runtime.load_model`, a drafter from `specdec.drafters`, and
`specdec.decode.engine.Engine`; docs/ARCHITECTURE.md describes the layout.
"""

__version__ = "0.1.0"
