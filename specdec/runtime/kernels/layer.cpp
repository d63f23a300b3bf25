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

// qkv: [B*T, (H + 2 Hkv) D] -> q [B, H, T, D] with RoPE; k (RoPE) and v written into the layer's
// cache at slots [past, past + T). RoPE as the Python layer computes it: x * cos + rotate_half(x) * sin
// (a multiply, a multiply, an add).
torch::Tensor rope_and_store(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                             torch::Tensor keys, torch::Tensor values, int64_t past, int64_t batch, int64_t seq,
                             int64_t heads, int64_t kv_heads, int64_t dim) {
  auto q = torch::empty({batch, heads, seq, dim}, qkv.options());
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
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < seq; ++t) {
      const float* row = src + (b * seq + t) * width;
      const float* c = pc + (b * seq + t) * dim;
      const float* s = ps + (b * seq + t) * dim;
      for (int64_t h = 0; h < heads; ++h) rotate(row + h * dim, c, s, pq + ((b * heads + h) * seq + t) * dim);
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t slot = ((b * kv_heads + h) * max_len + past + t) * dim;
        rotate(row + (heads + h) * dim, c, s, pk + slot);
        std::copy(row + (heads + kv_heads + h) * dim, row + (heads + kv_heads + h + 1) * dim, pv + slot);
      }
    }
  return q;
}

}  // namespace

// x: [B, T, hidden] float32; layer_weights: 7 tensors per layer (see kWeightsPerLayer), packed
// linears as `quant_linear` takes them; cos, sin: [B, T, D]; keys, values: the cache [L, B, Hkv,
// S_max, D]; the first `num_layers` layers run. Returns the residual stream after them, [B, T, hidden].
torch::Tensor decoder_layers(torch::Tensor x, const std::vector<torch::Tensor>& layer_weights, int64_t num_layers,
                             torch::Tensor cos, torch::Tensor sin, torch::Tensor keys, torch::Tensor values,
                             int64_t past, torch::Tensor tree_mask, double eps, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(static_cast<int64_t>(layer_weights.size()) >= num_layers * kWeightsPerLayer, "decoder_layers: weights missing");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "decoder_layers wants a contiguous cache");
  const int64_t batch = x.size(0), seq = x.size(1), hidden = x.size(2), dim = keys.size(4);
  cos = cos.contiguous();
  sin = sin.contiguous();
  torch::Tensor stream = x.reshape({batch * seq, hidden}).contiguous();  // [B*T, hidden]
  for (int64_t l = 0; l < num_layers; ++l) {
    const torch::Tensor* w = layer_weights.data() + l * kWeightsPerLayer;
    torch::Tensor qkv = quant_linear(rms_norm(stream, w[0], eps), w[1]);  // [B*T, (H + 2 Hkv) D]
    if (w[2].numel()) qkv.add_(w[2]);
    torch::Tensor layer_keys = keys.select(0, l), layer_values = values.select(0, l);
    torch::Tensor q = rope_and_store(qkv, cos, sin, layer_keys, layer_values, past, batch, seq, heads, kv_heads, dim);
    torch::Tensor mixed = attention(q, layer_keys, layer_values, past, tree_mask);  // [B, H, T, D]
    mixed = mixed.transpose(1, 2).reshape({batch * seq, heads * dim});
    stream = stream + quant_linear(mixed, w[3]);
    stream = stream + quant_linear(silu_mul(quant_linear(rms_norm(stream, w[4], eps), w[5])), w[6]);
  }
  return stream.reshape({batch, seq, hidden});
}
