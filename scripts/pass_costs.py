"""T(k): a target pass over k tokens after 256 tokens of context, median of 15, for --weights auto and float32.

Run: .venv/bin/python scripts/pass_costs.py
"""
import time, torch
from specdec.runtime.loading import load_model
for w in ("auto", "float32"):
    t=time.perf_counter(); m = load_model("smollm2-135m", weights=w); print(w, 'load', time.perf_counter()-t, m.weights.summary())
    net = m.net
    ids = torch.randint(0, 49152, (1, 256))
    cache = net.new_cache(400)
    net.forward(ids, cache)
    for k in (1, 2, 4, 8, 16):
        ts=[]
        for r in range(15):
            cache.truncate(256)
            t=time.perf_counter(); net.forward(ids[:, :k], cache); ts.append(time.perf_counter()-t)
        ts.sort(); print(f'  T({k}) {ts[len(ts)//2]*1e3:.2f} ms')
