// The decoder layers of one pass in one call: the same kernels the Python layer calls (RMSNorm,
// the quantized linears, RoPE, attention over the static cache, SiLU·up), in the same order and
// with the same arithmetic, without a Python round trip per operation. A one-token pass runs some
// 20 operations per layer; called one by one from Python they cost more than their arithmetic.
#include <torch/extension.h>
#include <cstdint>
#include <vector>

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor attention(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t past, torch::Tensor tree_mask);
torch::Tensor quant_linear(torch::Tensor x, torch::Tensor packed);

namespace {

constexpr int kWeightsPerLayer = 7;  // attn norm, qkv, qkv bias (or empty), o, mlp norm, gate_up, down

// One segment: qkv [T, (H + 2 Hkv) D] -> q [1, H, T, D] with RoPE; k (RoPE) and v written into the
// segment's layer cache [1, Hkv, S, D] at slots [past, past + T). RoPE as the Python layer computes it: x * cos + rotate_half(x) * sin
// (a multiply, a multiply, an add).
torch::Tensor rope_and_store(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                             torch::Tensor keys, torch::Tensor values, int64_t past, int64_t seq,
                             int64_t heads, int64_t kv_heads, int64_t dim) {
  auto q = torch::empty({1, heads, seq, dim}, qkv.options());
  const int64_t width = (heads + 2 * kv_heads) * dim, max_len = keys.size(2), half = dim / 2;
  const float* src = qkv.data_ptr<float>();
  const float* pc = cos.data_ptr<float>();
  const float* ps = sin.data_ptr<float>();
  float* pq = q.data_ptr<float>();
  float* pk = keys.data_ptr<float>();
  float* pv = values.data_ptr<float>();
  auto rotate = [&](const float* in, const float* c, const float* s, float* out) {
    for (int64_t d = 0; d < dim; ++d) {
      const float rotated = d < half ? -in[d + half] : in[d - half];
      const float a = in[d] * c[d];
      const float b = rotated * s[d];
      out[d] = a + b;
    }
  };
  for (int64_t t = 0; t < seq; ++t) {
    const float* row = src + t * width;
    const float* c = pc + t * dim;
    const float* s = ps + t * dim;
    for (int64_t h = 0; h < heads; ++h) rotate(row + h * dim, c, s, pq + (h * seq + t) * dim);
    for (int64_t h = 0; h < kv_heads; ++h) {
      const int64_t slot = (h * max_len + past + t) * dim;
      rotate(row + (heads + h) * dim, c, s, pk + slot);
      std::copy(row + (heads + kv_heads + h) * dim, row + (heads + kv_heads + h + 1) * dim, pv + slot);
    }
  }
  return q;
}

}  // namespace

// The rows of a pass are segments, one per sequence: segment b has tokens [start_b, start_b + T_b) of
// the flat pass, its own cache (keys[b], values[b]: [L, 1, Hkv, S_b, D]) whose slots [0, past_b) it
// sees, and its own tree mask ([T_b, T_b] bool, or empty for causal). The linear layers run over all
// N = Σ T_b rows at once (each weight read once per pass); attention runs segment by segment.
// x: [N, hidden] float32; layer_weights: 7 tensors per layer (see kWeightsPerLayer), packed linears
// as `quant_linear` takes them; cos, sin: [N, D]; the first `num_layers` layers run. Returns the
// residual stream after them, [N, hidden].
torch::Tensor decoder_layers(torch::Tensor x, const std::vector<torch::Tensor>& layer_weights, int64_t num_layers,
                             torch::Tensor cos, torch::Tensor sin, const std::vector<torch::Tensor>& keys,
                             const std::vector<torch::Tensor>& values, const std::vector<int64_t>& pasts,
                             const std::vector<int64_t>& tokens, const std::vector<torch::Tensor>& tree_masks,
                             double eps, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(static_cast<int64_t>(layer_weights.size()) >= num_layers * kWeightsPerLayer, "decoder_layers: weights missing");
  const size_t segments = tokens.size();
  TORCH_CHECK(keys.size() == segments && values.size() == segments && pasts.size() == segments &&
              tree_masks.size() == segments, "decoder_layers: one cache, past and tree mask per segment");
  std::vector<int64_t> starts(segments + 1, 0);
  for (size_t b = 0; b < segments; ++b) {
    TORCH_CHECK(keys[b].is_contiguous() && values[b].is_contiguous(), "decoder_layers wants contiguous caches");
    starts[b + 1] = starts[b] + tokens[b];
  }
  const int64_t rows = x.size(0), hidden = x.size(1);
  TORCH_CHECK(starts[segments] == rows, "decoder_layers: the segments' tokens do not add up to the rows");
  cos = cos.contiguous();
  sin = sin.contiguous();
  torch::Tensor stream = x.contiguous();  // [N, hidden]
  std::vector<torch::Tensor> mixed(segments);
  for (int64_t l = 0; l < num_layers; ++l) {
    const torch::Tensor* w = layer_weights.data() + l * kWeightsPerLayer;
    torch::Tensor qkv = quant_linear(rms_norm(stream, w[0], eps), w[1]);  // [N, (H + 2 Hkv) D]
    if (w[2].numel()) qkv.add_(w[2]);
    for (size_t b = 0; b < segments; ++b) {
      const int64_t start = starts[b], seq = tokens[b], dim = keys[b].size(4);
      torch::Tensor layer_keys = keys[b].select(0, l), layer_values = values[b].select(0, l);  // [1, Hkv, S_b, D]
      torch::Tensor q = rope_and_store(qkv.narrow(0, start, seq), cos.narrow(0, start, seq), sin.narrow(0, start, seq),
                                       layer_keys, layer_values, pasts[b], seq, heads, kv_heads, dim);
      mixed[b] = attention(q, layer_keys, layer_values, pasts[b], tree_masks[b])  // [1, H, T_b, D]
                     .transpose(1, 2).reshape({seq, heads * dim});
    }
    torch::Tensor attended = segments == 1 ? mixed[0] : torch::cat(mixed);  // [N, H D]
    stream = stream + quant_linear(attended, w[3]);
    stream = stream + quant_linear(silu_mul(quant_linear(rms_norm(stream, w[4], eps), w[5])), w[6]);
  }
  return stream;
}
