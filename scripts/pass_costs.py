"""Where a target pass goes: T(k) for k = 1, 2, 4, 8, 16 and the parts of a pass, per weight form.

After 256 tokens of context, median of 25 passes each, the default model, this process only:
- T(k): `net.forward` over k new tokens (what `specdec costs` measures, with its ratios);
- the parts of a pass over k tokens: the linear layers alone (every layer's weights, streamed
  as in a pass), attention alone (30 layers), the decoder layers (one C++ call when the weights
  are quantized), the LM head; the rest of `forward` (embedding, RoPE table, Python) is T(k)
  minus the decoder layers and the head.

Run: .venv/bin/python scripts/pass_costs.py [--weights auto,float32]
"""
import argparse
import statistics
import time

import torch

from specdec.runtime import load_model
from specdec.runtime.kernels import invariant_kernels
from specdec.runtime.quant import QuantizedLinear

CONTEXT, SIZES, REPEATS = 256, (1, 2, 4, 8, 16), 25


def median_ms(fn) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--weights", default="auto,float32")
    args = parser.parse_args()
    kernels = invariant_kernels()
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, "
          f"quantized kernel path {kernels.quant_linear_path() if kernels else 'none'}")
    for weights in args.weights.split(","):
        model = load_model("smollm2-135m", weights=weights)
        net, config = model.net, model.net.config
        print(f"\n--weights {weights}: {model.weights.summary()}")
        ids = torch.randint(0, net.vocab_size, (1, CONTEXT + max(SIZES)), generator=torch.Generator().manual_seed(0))
        cache = net.new_cache(CONTEXT + max(SIZES))
        net.forward(ids[:, :CONTEXT], cache)
        linears = [lin for layer in net.layers for lin in (layer.attn.qkv, layer.attn.o, layer.mlp.gate_up, layer.mlp.down)]
        fused = net._fused_layer_weights() if kernels else None
        print("| k | T(k) ms | T(k)/T(1) | linears ms | attention ms | decoder layers ms | LM head ms | rest ms |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        first = None
        for k in SIZES:
            def full():
                cache.truncate(CONTEXT)
                net.forward(ids[:, CONTEXT:CONTEXT + k], cache)
            total = median_ms(full)
            first = first or total
            rows = {n: torch.randn(k, n) for n in {lin.in_features for lin in linears}}
            linear_ms = median_ms(lambda: [lin(rows[lin.in_features]) for lin in linears])
            head = median_ms(lambda: net.lm_head(torch.randn(1, k, config.hidden_size)))
            attention_ms = layers_ms = float("nan")
            if kernels is not None:
                q = torch.randn(1, config.num_heads, k, config.head_dim)
                none = torch.empty(0, dtype=torch.bool)
                attention_ms = median_ms(lambda: [kernels.attention(q, cache.keys[i], cache.values[i], CONTEXT, none)
                                                  for i in range(config.num_layers)])
            if fused:
                x = net.embed(ids[:, CONTEXT:CONTEXT + k])
                cos, sin = net._rope(torch.arange(CONTEXT, CONTEXT + k)[None])
                layers_ms = median_ms(lambda: kernels.decoder_layers(
                    x, fused, config.num_layers, cos[:, 0], sin[:, 0], cache.keys, cache.values, CONTEXT,
                    torch.empty(0, dtype=torch.bool), config.rms_norm_eps, config.num_heads, config.num_kv_heads))
            rest = total - layers_ms - head
            print(f"| {k} | {total:.2f} | {total / first:.2f} | {linear_ms:.2f} | {attention_ms:.2f} | "
                  f"{layers_ms:.2f} | {head:.2f} | {rest:.2f} |")
        if any(isinstance(lin, QuantizedLinear) for lin in linears):
            print("(linears: the 120 decoder linears alone; the LM head is its own column)")


if __name__ == "__main__":
    main()
