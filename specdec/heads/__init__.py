"""Drafting heads trained on the target's own features: EAGLE (`eagle.py`) and Medusa (`medusa.py`),
saved as safetensors plus a JSON config (`files.py`)."""
