// The decoder layers of one pass in one call: the same kernels the Python layer calls (RMSNorm,
// the quantized linears, RoPE, attention over the static cache, SiLU·up), in the same order and
// with the same arithmetic, without a Python round trip per operation. A one-token pass runs some
// 20 operations per layer; called one by one from Python they cost more than their arithmetic.
#include <torch/extension.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels.h"

namespace {

// A linear layer is its parts, packed weights stacked along the outputs, one per GGUF type (a fused
// q/k/v of Q4_K beside a Q6_K v is two parts), in a fixed number of slots (unused slots empty).
constexpr int kQkvSlots = 3, kGateUpSlots = 2;
// attn norm, qkv (3 slots), qkv bias (or empty), o, mlp norm, gate_up (2 slots), down, q norm and k norm
// (Qwen3's and Gemma 3's, over each head's D; or empty), post-attention norm and post-MLP norm (Gemma's
// norms of each branch's output before it joins the stream; or empty)
constexpr int kWeightsPerLayer = 14;

// What differs between the families' layers beyond their weights.
struct LayerForm {
  const torch::Tensor* post_norms = nullptr;  // [post-attention, post-MLP] norms (each may be empty), or none
  bool gelu = false;    // the MLP's gate through GELU's tanh form (Gemma) instead of SiLU
  int64_t window = 0;   // attention over the last `window` positions only (Gemma 3's local layers); 0: all
};

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor* slots, int count) {
  return quant_linear(x, std::vector<torch::Tensor>(slots, slots + count));
}

// A key or value row into a cache of float32 (copied) or float16 (rounded to nearest even, as
// torch's conversion does).
void store_row(const float* in, float* out, int64_t n) { std::copy(in, in + n, out); }
void store_row(const float* in, at::Half* out, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] = at::Half(in[d]);
}

// Qwen3's q and k norms: each head's row of q and of k in qkv [N, (H + 2 Hkv) D] RMS-normed over its D
// with its own weight [D], in place, by `rms_norm`'s recipe (the Python layer's `Attention.normed`).
void normalize_qk(torch::Tensor& qkv, const torch::Tensor& q_norm, const torch::Tensor& k_norm, double eps,
                  int64_t heads, int64_t kv_heads, int64_t dim) {
  const int64_t rows = qkv.size(0);
  torch::Tensor q = qkv.narrow(1, 0, heads * dim), k = qkv.narrow(1, heads * dim, kv_heads * dim);
  q.copy_(rms_norm(q.view({rows, heads, dim}), q_norm, eps).view({rows, heads * dim}));
  k.copy_(rms_norm(k.view({rows, kv_heads, dim}), k_norm, eps).view({rows, kv_heads * dim}));
}

// All segments of layer `layer`: qkv [N, (H + 2 Hkv) D] -> q [N, H, D] with RoPE; segment b's k (RoPE)
// and v of its token t written into its cache (keys[b], values[b]: [L, 1, Hkv, S_b, D], float32 or
// float16: T) at layer `layer`, slot past_b + t. RoPE as the Python layer computes it: over the first R
// dimensions x * cos + rotate_half(x) * sin (a multiply, a multiply, an add), the other D - R copied
// (R < D: Phi-4-mini's partial RoPE); cos, sin: [N, R].
template <typename T>
void rope_and_store(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& q,
                    const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values, int64_t layer,
                    const std::vector<int64_t>& pasts, const std::vector<int64_t>& starts,
                    int64_t heads, int64_t kv_heads, int64_t dim) {
  const int64_t width = (heads + 2 * kv_heads) * dim, turned = cos.size(1), half = turned / 2;
  const float* src = qkv.data_ptr<float>();
  const float* pc = cos.data_ptr<float>();
  const float* ps = sin.data_ptr<float>();
  float* pq = q.data_ptr<float>();
  auto rotate = [&](const float* in, const float* c, const float* s, float* out) {
    for (int64_t d = 0; d < turned; ++d) {
      const float rotated = d < half ? -in[d + half] : in[d - half];
      const float a = in[d] * c[d];
      const float b = rotated * s[d];
      out[d] = a + b;
    }
    for (int64_t d = turned; d < dim; ++d) out[d] = in[d];
  };
  std::vector<float> key(dim);  // one rotated key row
  for (size_t b = 0; b + 1 < starts.size(); ++b) {  // segment b: rows [starts[b], starts[b + 1])
    const int64_t max_len = keys[b].size(3);
    T* pk = keys[b].data_ptr<T>() + layer * keys[b].stride(0);  // [Hkv, S_b, D]
    T* pv = values[b].data_ptr<T>() + layer * values[b].stride(0);
    for (int64_t n = starts[b]; n < starts[b + 1]; ++n) {
      const int64_t t = n - starts[b];
      const float* row = src + n * width;
      const float* c = pc + n * turned;
      const float* s = ps + n * turned;
      for (int64_t h = 0; h < heads; ++h) rotate(row + h * dim, c, s, pq + (n * heads + h) * dim);
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t slot = (h * max_len + pasts[b] + t) * dim;
        rotate(row + (heads + h) * dim, c, s, key.data());
        store_row(key.data(), pk + slot, dim);
        store_row(row + (heads + kv_heads + h) * dim, pv + slot, dim);
      }
    }
  }
}

// The rest of a decoder layer once its qkv [N, (H + 2 Hkv) D] is computed: RoPE and the cache
// writes, attention, the output projection (post-normed, where the form has the norm) onto the
// residual `stream` [N, hidden], then the MLP with its norm (and post-norm). w: o (packed), mlp norm,
// gate_up (2 slots), down (packed). Returns the new stream.
torch::Tensor attend_and_mix(const torch::Tensor& stream, const torch::Tensor& qkv, const torch::Tensor* w,
                             const torch::Tensor& cos, const torch::Tensor& sin, torch::Tensor& q,
                             const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                             int64_t layer, const std::vector<int64_t>& pasts, const std::vector<int64_t>& starts,
                             const std::vector<int64_t>& tokens, const std::vector<torch::Tensor>& masks, double eps,
                             int64_t heads, int64_t kv_heads, int64_t dim, const LayerForm& form) {
  const int64_t rows = stream.size(0);
  if (keys[0].dtype() == torch::kFloat16) rope_and_store<at::Half>(qkv, cos, sin, q, keys, values, layer, pasts, starts, heads, kv_heads, dim);
  else rope_and_store<float>(qkv, cos, sin, q, keys, values, layer, pasts, starts, heads, kv_heads, dim);
  torch::Tensor attended = attention_segments(q, keys, values, layer, pasts, tokens, masks, form.window)  // [N, H, D]
                               .view({rows, heads * dim});
  auto post_norm = [&](torch::Tensor branch, int which) {  // [N, hidden]
    const bool normed = form.post_norms != nullptr && form.post_norms[which].numel();
    return normed ? rms_norm(branch, form.post_norms[which], eps) : branch;
  };
  torch::Tensor mixed = stream + post_norm(linear(attended, w, 1), 0);
  torch::Tensor gate_up = linear(rms_norm(mixed, w[1], eps), w + 2, kGateUpSlots);  // [N, 2 I]
  return mixed + post_norm(linear(form.gelu ? gelu_tanh_mul(gate_up) : silu_mul(gate_up), w + 2 + kGateUpSlots, 1), 1);
}

}  // namespace

// The rows of a pass are segments, one per sequence: segment b has tokens [start_b, start_b + T_b) of
// the flat pass, its own cache (keys[b], values[b]: [L, 1, Hkv, S_b, D]) whose slots [0, past_b) it
// sees, and its own tree mask ([T_b, T_b] bool, or empty for causal). The linear layers run over all
// N = Σ T_b rows at once (each weight read once per pass); RoPE and the cache writes run over all
// segments in one loop, and attention over all of them in one call (`attention_segments`: one
// parallel pass over every (segment, KV head, token chunk), each row by `attention`'s recipe).
// x: [N, hidden] float32; layer_weights: 12 tensors per layer (see kWeightsPerLayer), packed linears
// as `quant_linear` takes them; cos, sin: [N, R] (R ≤ D: the dimensions RoPE turns); the first `num_layers` layers run. Returns the
// residual stream after them, [N, hidden], followed by the stream entering each layer of `capture`
// (ascending layer indices below num_layers; what EAGLE-3 heads read), [N, hidden] each. Gemma 3:
// windows (one per layer, or empty for none) gives each layer's sliding window, 0 for a global layer;
// the windowed layers turn by cos_local, sin_local [N, R] (their own RoPE base); gelu: the MLPs' gate
// through GELU's tanh form.
std::vector<torch::Tensor> decoder_layers(torch::Tensor x, const std::vector<torch::Tensor>& layer_weights,
                                          int64_t num_layers, torch::Tensor cos, torch::Tensor sin,
                                          const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                                          const std::vector<int64_t>& pasts, const std::vector<int64_t>& tokens,
                                          const std::vector<torch::Tensor>& tree_masks, double eps, int64_t heads,
                                          int64_t kv_heads, const std::vector<int64_t>& capture, torch::Tensor cos_local,
                                          torch::Tensor sin_local, const std::vector<int64_t>& windows, bool gelu) {
  TORCH_CHECK(static_cast<int64_t>(layer_weights.size()) >= num_layers * kWeightsPerLayer, "decoder_layers: weights missing");
  for (size_t c = 0; c < capture.size(); ++c)
    TORCH_CHECK(capture[c] >= 0 && capture[c] < num_layers && (c == 0 || capture[c] > capture[c - 1]),
                "decoder_layers: capture wants ascending layers below num_layers");
  const size_t segments = tokens.size();
  TORCH_CHECK(segments > 0, "decoder_layers: no segments");
  TORCH_CHECK(keys.size() == segments && values.size() == segments && pasts.size() == segments &&
              tree_masks.size() == segments, "decoder_layers: one cache, past and tree mask per segment");
  const int64_t dim = keys[0].size(4);
  std::vector<int64_t> starts(segments + 1, 0);
  std::vector<torch::Tensor> masks(segments);  // bool and contiguous once, for every layer
  for (size_t b = 0; b < segments; ++b) {
    TORCH_CHECK(keys[b].is_contiguous() && values[b].is_contiguous(), "decoder_layers wants contiguous caches");
    TORCH_CHECK(keys[b].dim() == 5 && keys[b].size(0) >= num_layers && keys[b].size(2) == kv_heads &&
                keys[b].size(4) == dim && values[b].sizes() == keys[b].sizes(),
                "decoder_layers wants caches [L, 1, Hkv, S, D]");
    TORCH_CHECK(keys[b].dtype() == keys[0].dtype() && values[b].dtype() == keys[0].dtype() &&
                (keys[0].dtype() == torch::kFloat32 || keys[0].dtype() == torch::kFloat16),
                "decoder_layers wants caches all float32 or all float16");
    TORCH_CHECK(pasts[b] >= 0 && pasts[b] + tokens[b] <= keys[b].size(3), "decoder_layers: the new tokens lie past a cache");
    starts[b + 1] = starts[b] + tokens[b];
    masks[b] = tree_masks[b].numel() ? tree_masks[b].to(torch::kBool).contiguous() : tree_masks[b];
  }
  const int64_t rows = x.size(0);
  TORCH_CHECK(starts[segments] == rows, "decoder_layers: the segments' tokens do not add up to the rows");
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == rows && cos.size(1) <= dim && cos.size(1) % 2 == 0 &&
              sin.sizes() == cos.sizes(), "decoder_layers wants cos and sin [N, R], R even and at most D");
  cos = cos.contiguous();
  sin = sin.contiguous();
  const bool windowed = !windows.empty();
  TORCH_CHECK(!windowed || (static_cast<int64_t>(windows.size()) >= num_layers && cos_local.sizes() == cos.sizes() &&
                            sin_local.sizes() == cos.sizes()),
              "decoder_layers: windows want one entry per layer and cos_local, sin_local shaped as cos");
  if (windowed) {
    cos_local = cos_local.contiguous();
    sin_local = sin_local.contiguous();
  }
  torch::Tensor stream = x.contiguous();  // [N, hidden]
  torch::Tensor q = torch::empty({rows, heads, dim}, stream.options());  // [N, H, D], rewritten every layer
  std::vector<torch::Tensor> out{stream};  // out[0] becomes the stream after the last layer
  size_t next_capture = 0;
  for (int64_t l = 0; l < num_layers; ++l) {
    if (next_capture < capture.size() && capture[next_capture] == l) {  // each layer makes a new stream: no copy needed
      out.push_back(stream);
      ++next_capture;
    }
    const torch::Tensor* w = layer_weights.data() + l * kWeightsPerLayer;
    torch::Tensor qkv = linear(rms_norm(stream, w[0], eps), w + 1, kQkvSlots);  // [N, (H + 2 Hkv) D]
    if (w[4].numel()) qkv.add_(w[4]);
    if (w[10].numel()) normalize_qk(qkv, w[10], w[11], eps, heads, kv_heads, dim);
    LayerForm form;
    form.post_norms = w + 12;
    form.gelu = gelu;
    form.window = windowed ? windows[l] : 0;
    const bool local = form.window > 0;
    stream = attend_and_mix(stream, qkv.contiguous(), w + 5, local ? cos_local : cos, local ? sin_local : sin, q, keys,
                            values, l, pasts, starts, tokens, masks, eps, heads, kv_heads, dim, form);
  }
  out[0] = stream;
  return out;
}

// The EAGLE-3 head's layer (heads/eagle3.py, Eagle3Layer) over n new pairs of one sequence, causal
// among them, after the `past` pairs in its cache (keys, values: [1, 1, Hkv, S, D]): q, k and v from
// [input_layernorm(embeds) ; hidden_norm(hidden)] (2 H wide), the residual is `hidden`; then the
// attention, post-attention norm and MLP as a decoder layer's. embeds, hidden: [n, H] float32;
// weights: input_layernorm, hidden_norm, qkv (3 slots), qkv bias (or empty), o (packed),
// post_attention_layernorm, gate_up (2 slots), down (packed); cos, sin: [n, D]. Returns the layer's
// output h [n, H] (before the head's final norm). The Python layer's operations in its order, on the
// kernels (its RMSNorm and attention are this file's, not PyTorch's), in one call instead of some 40.
torch::Tensor eagle3_layer(torch::Tensor embeds, torch::Tensor hidden, const std::vector<torch::Tensor>& weights,
                           torch::Tensor cos, torch::Tensor sin, torch::Tensor keys, torch::Tensor values, int64_t past,
                           double eps, int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(weights.size() == 11, "eagle3_layer wants 11 weights");
  TORCH_CHECK(embeds.dim() == 2 && hidden.sizes() == embeds.sizes(), "eagle3_layer wants embeds and hidden [n, H]");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous() && keys.dim() == 5 && keys.size(2) == kv_heads &&
              values.sizes() == keys.sizes(), "eagle3_layer wants a contiguous cache [1, 1, Hkv, S, D]");
  const int64_t rows = embeds.size(0), dim = keys.size(4);
  TORCH_CHECK(past >= 0 && past + rows <= keys.size(3), "eagle3_layer: the new pairs lie past the cache");
  TORCH_CHECK(cos.dim() == 2 && cos.size(0) == rows && cos.size(1) == dim && sin.sizes() == cos.sizes(),
              "eagle3_layer wants cos and sin [n, D]");
  const std::vector<torch::Tensor> key_list{keys}, value_list{values}, masks{torch::empty({0}, torch::kBool)};  // causal
  const std::vector<int64_t> pasts{past}, tokens{rows}, starts{0, rows};
  torch::Tensor x = torch::cat({rms_norm(embeds, weights[0], eps), rms_norm(hidden, weights[1], eps)}, 1);  // [n, 2H]
  torch::Tensor qkv = linear(x, weights.data() + 2, kQkvSlots);  // [n, (H + 2 Hkv) D]
  if (weights[5].numel()) qkv.add_(weights[5]);
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * dim, "eagle3_layer: qkv is not (H + 2 Hkv) D wide");
  torch::Tensor q = torch::empty({rows, heads, dim}, hidden.options());  // [n, H, D]
  return attend_and_mix(hidden.contiguous(), qkv.contiguous(), weights.data() + 6, cos.contiguous(), sin.contiguous(),
                        q, key_list, value_list, 0, pasts, starts, tokens, masks, eps, heads, kv_heads, dim, LayerForm{});
}
