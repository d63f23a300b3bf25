"""What a target pass and a draft step cost on this machine, measured once and cached.

    T(k)      seconds of one target pass that scores k new tokens after a few hundred cached ones
              (k = 1 is a plain decoding step; a round that drafted γ tokens verifies k = γ + 1)
    D_d(γ)    seconds for drafter d to propose γ tokens, fitted as per_call + per_token · γ
    T(B, N)   seconds of a pass over B rows (sequences of a batch) holding N tokens in all:
              T(N) plus what B separate rows cost beyond one row of B tokens (each row attends to
              its own cache), measured as T(B rows × 1 token) − T(1 row × B tokens) for B = 2..32

By role: `model.py` holds the numbers and their arithmetic (interpolation, calibration by the rounds
actually run, the predicted speed-up), `measure.py` times them (and `load_or_measure` measures only
what the cache lacks, checks each measurement's spread and drops a table that real rounds say has
drifted), `cache.py` keeps them in a JSON file per machine and model.
"""

from specdec.control.cost_model.cache import cost_key, costs_dir, machine_description
from specdec.control.cost_model.measure import drop_if_drifted, load_or_measure
from specdec.control.cost_model.model import BATCH_SIZES, CostModel, DraftCost, best_batch, covers, largest_pass

__all__ = ["BATCH_SIZES", "CostModel", "DraftCost", "best_batch", "cost_key", "costs_dir", "covers", "drop_if_drifted",
           "largest_pass", "load_or_measure", "machine_description"]
