// Batch-invariant CPU kernels for the lean runtime (float32).
//
// Every output row is computed by the same scalar recipe whatever the number of rows in the call,
// the cache length around it or the shape of the token tree: reductions run in a fixed order
// (16 lanes, then a fixed pairwise sum), nothing is split or blocked by row count. So row i of a
// pass over k tokens equals, bit for bit, a one-token pass at the same position over the same
// visible keys. The compiler vectorises the lane loops; the order of the arithmetic is the source's
// (built with -ffp-contract=off, so a vectorised loop and its scalar tail round alike).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int kLanes = 16;

// sum_d a[d] * b[d] in a fixed order: lane l accumulates d = l (mod 16), then lanes are folded
// pairwise (8, 4, 2, 1).
inline float lane_dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {0.f};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[d + l] * b[d + l];
  for (; d < n; ++d) acc[d % kLanes] += a[d] * b[d];
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) acc[l] += acc[l + width];
  return acc[0];
}

// e^x from +, *, floor and an exponent written into the bits (Cephes' expf polynomial, about
// 1 ulp): the same arithmetic whether the compiler vectorises the call or not, unlike libm's expf.
inline float fixed_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace

// x: [N, D] float32; weight: [D] -> [N, D]: weight * (x * rsqrt(mean(x^2) + eps)), row by row.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && weight.dtype() == torch::kFloat32, "rms_norm wants float32");
  x = x.contiguous();
  weight = weight.contiguous();
  const int64_t dim = x.size(-1), rows = x.numel() / dim;
  auto out = torch::empty_like(x);
  const float* px = x.data_ptr<float>();
  const float* pw = weight.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = px + r * dim;
      const float mean = lane_dot(row, row, dim) / static_cast<float>(dim);
      const float scale = 1.f / std::sqrt(mean + static_cast<float>(eps));
      float* o = po + r * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = pw[d] * (row[d] * scale);
    }
  });
  return out;
}

// gate_up: [N, 2I] float32 (gate then up) -> [N, I]: silu(gate) * up, element by element.
torch::Tensor silu_mul(torch::Tensor gate_up) {
  TORCH_CHECK(gate_up.dtype() == torch::kFloat32, "silu_mul wants float32");
  gate_up = gate_up.contiguous();
  const int64_t width = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * width);
  auto sizes = gate_up.sizes().vec();
  sizes.back() = width;
  auto out = torch::empty(sizes, gate_up.options());
  const float* pg = gate_up.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = pg + r * 2 * width;
      const float* up = gate + width;
      float* o = po + r * width;
      for (int64_t i = 0; i < width; ++i) o[i] = gate[i] / (1.f + fixed_exp(-gate[i])) * up[i];
    }
  });
  return out;
}

// Attention of T new tokens over a static cache.
// q: [B, H, T, D]; keys, values: [B, Hkv, S_max, D] (the layer's cache, the new tokens already
// written at slots [past, past + T)); tree_mask: [T, T] bool (new token t sees new token j) or an
// empty tensor for causal. Every new token sees all slots [0, past). Returns [B, H, T, D].
// Row (b, h, t) visits its visible slots in ascending order: scores, max, exp, a sequential sum,
// and the weighted sum of values, so its result depends only on the keys and values it sees.
torch::Tensor attention(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t past,
                        torch::Tensor tree_mask) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && keys.dtype() == torch::kFloat32, "attention wants float32");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "attention wants a contiguous cache");
  q = q.contiguous();
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), dim = q.size(3);
  const int64_t kv_heads = keys.size(1), max_len = keys.size(2), group = heads / kv_heads;
  TORCH_CHECK(past + seq <= max_len, "attention: the new tokens lie past the cache");
  const bool causal = tree_mask.numel() == 0;
  torch::Tensor mask = causal ? tree_mask : tree_mask.to(torch::kBool).contiguous();
  const bool* pm = causal ? nullptr : mask.data_ptr<bool>();
  auto out = torch::empty_like(q);
  const float* pq = q.data_ptr<float>();
  const float* pk = keys.data_ptr<float>();
  const float* pv = values.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float scale = 1.f / std::sqrt(static_cast<float>(dim));
  at::parallel_for(0, batch * heads * seq, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(past + seq);
    std::vector<int64_t> slots(past + seq);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item % seq, h = (item / seq) % heads, b = item / (seq * heads);
      const float* qrow = pq + item * dim;
      const int64_t base = (b * kv_heads + h / group) * max_len * dim;
      int64_t n = 0;
      for (int64_t s = 0; s < past; ++s) slots[n++] = s;
      for (int64_t j = 0; j < seq; ++j)
        if (causal ? j <= t : pm[t * seq + j]) slots[n++] = past + j;
      float top = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        scores[i] = lane_dot(qrow, pk + base + slots[i] * dim, dim) * scale;
        top = std::max(top, scores[i]);
      }
      float* sc = scores.data();
      for (int64_t i = 0; i < n; ++i) sc[i] = fixed_exp(sc[i] - top);
      float total = 0.f;
      for (int64_t i = 0; i < n; ++i) total += sc[i];
      float* orow = po + item * dim;
      for (int64_t d = 0; d < dim; ++d) orow[d] = 0.f;
      for (int64_t i = 0; i < n; ++i) {
        const float* vrow = pv + base + slots[i] * dim;
        const float p = scores[i];
        for (int64_t d = 0; d < dim; ++d) orow[d] += p * vrow[d];
      }
      const float inv = 1.f / total;
      for (int64_t d = 0; d < dim; ++d) orow[d] *= inv;
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "row-wise RMSNorm in a fixed order");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("attention", &attention, "batch-invariant attention over a static cache");
}
