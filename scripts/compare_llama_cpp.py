"""Plain greedy decoding on the same GGUF: llama.cpp (2 threads) vs specdec int4 (plain and ngram) vs specdec float32.

One Spec-Bench prompt per category (../shared/workloads), 128 new tokens, every method on each prompt in turn.
Needs `pip install llama-cpp-python` (a source build of about 10 minutes; not part of `make test`).
Run: .venv/bin/python scripts/compare_llama_cpp.py
"""
import json, time, statistics, sys
import torch
from llama_cpp import Llama
from specdec.runtime import load_model
from specdec.runtime.loading import builtin_gguf_path
from specdec.engine import Engine, GenerationConfig
from specdec.drafters import build_drafter
rows = [json.loads(l) for l in open('../shared/workloads/spec_bench_dev.jsonl')]
cats = {}
for r in rows: cats.setdefault(r['category'] if r['category'] in ('translation','summarization','qa','math_reasoning','rag') else 'mt_bench', []).append(r)
prompts = [v[0]['turns'][0] for v in cats.values()]
N = 128
llm = Llama(model_path=str(builtin_gguf_path('smollm2-135m')), n_threads=2, n_ctx=4096, verbose=False)
int4 = load_model('smollm2-135m'); f32 = load_model('smollm2-135m', weights='float32')
res = {}
def run_llama(ids):
    llm.reset(); t = time.perf_counter(); out = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(tok)
        if len(out) >= N or tok == 2: break
    return out, len(out) / (time.perf_counter() - t)
engines = {'specdec int4 plain': Engine(int4), 'specdec int4 ngram auto': Engine(int4, build_drafter('ngram', int4)),
           'specdec float32 plain': Engine(f32)}
cfg = GenerationConfig(max_new_tokens=N)
for p in prompts:
    ids = engines['specdec int4 plain'].encode(p)
    for name, e in engines.items():
        e.generate(ids, GenerationConfig(max_new_tokens=8))
        r = e.generate(ids, cfg)
        res.setdefault(name, []).append(r.stats.tokens_per_second)
        if name == 'specdec int4 plain': plain_ids = r.token_ids
        if name == 'specdec int4 ngram auto': print('  ngram identical to plain:', r.token_ids == plain_ids, 'MAT', round(r.stats.mean_accepted_tokens, 2))
    out, tps = run_llama(ids); res.setdefault('llama.cpp plain', []).append(tps)
    print('  llama.cpp tokens == specdec int4 plain tokens for the first', next((i for i,(a,b) in enumerate(zip(out, plain_ids)) if a!=b), min(len(out),len(plain_ids))), 'of', len(out))
for k, v in res.items(): print(f'{k:28s} median {statistics.median(v):7.1f} tok/s  ratio to llama.cpp (mean per prompt) {statistics.mean(a/b for a,b in zip(v, res["llama.cpp plain"])):.2f}')
