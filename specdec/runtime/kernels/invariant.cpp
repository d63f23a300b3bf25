// Batch-invariant CPU kernels for the lean runtime (float32).
//
// Every output row is computed by the same recipe whatever the number of rows in the call, the
// cache length around it or the shape of the token tree: reductions run in a fixed order and
// nothing is split or blocked by row count. So row i of a pass over k tokens equals, bit for bit,
// a one-token pass at the same position over the same visible keys. Vector code is written with
// GCC's vector extensions (16 floats: AVX-512 registers, two AVX2 registers, or scalar code
// elsewhere) doing elementwise what the scalar recipe does, built with -ffp-contract=off so that no
// multiply and add are fused behind the source's back: lanes, tails and the generic build agree.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif
#include "kernels.h"
#include "parallel.h"

namespace {

constexpr int kLanes = 16;
using Vec = float __attribute__((vector_size(kLanes * sizeof(float))));
using IVec = int32_t __attribute__((vector_size(kLanes * sizeof(int32_t))));

inline Vec splat(float value) { return Vec{} + value; }
inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }
// the first n < 16 lanes (the rest 0), for the tail of a row
inline Vec load(const float* p, int64_t n) {
  if (n == kLanes) return load(p);
  Vec v = {};
  for (int64_t l = 0; l < n; ++l) v[l] = p[l];
  return v;
}
inline void store(float* p, Vec v, int64_t n) {
  if (n == kLanes) return store(p, v);
  for (int64_t l = 0; l < n; ++l) p[l] = v[l];
}

// A float16 cache's 16 values widened to float32: exact, so every instruction set gives the same bits.
using Half = at::Half;
inline Vec load(const Half* p) {
  Vec v;
#if defined(__AVX512F__)
  const __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  std::memcpy(&v, &wide, sizeof v);
#elif defined(__F16C__)
  const __m256 low = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256 high = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  std::memcpy(&v, &low, sizeof low);
  std::memcpy(reinterpret_cast<char*>(&v) + sizeof low, &high, sizeof high);
#else
  for (int l = 0; l < kLanes; ++l) v[l] = static_cast<float>(p[l]);
#endif
  return v;
}
inline Vec load(const Half* p, int64_t n) {
  if (n == kLanes) return load(p);
  Vec v = {};
  for (int64_t l = 0; l < n; ++l) v[l] = static_cast<float>(p[l]);
  return v;
}

// The sum of a vector's lanes, folded pairwise in a fixed order (8, 4, 2, 1).
inline float fold(Vec v) {
  float lanes[kLanes];
  store(lanes, v);
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int l = 0; l < width; ++l) lanes[l] += lanes[l + width];
  return lanes[0];
}

// sum_d a[d] * b[d] in a fixed order: lane l accumulates d = l (mod 16), then lanes are folded
// pairwise (8, 4, 2, 1).
inline float lane_dot(const float* a, const float* b, int64_t n) {
  Vec acc = {};
  for (int64_t d = 0; d < n; d += kLanes) {
    const int64_t width = std::min<int64_t>(kLanes, n - d);
    acc = acc + load(a + d, width) * load(b + d, width);
  }
  return fold(acc);
}

// e^x per lane from +, *, an exact floor and an exponent written into the bits (Cephes' expf
// polynomial, about 1 ulp): the same arithmetic in every lane, unlike libm's expf.
inline Vec fixed_exp(Vec x) {
  x = x < -87.0f ? splat(-87.0f) : x;
  x = x > 88.0f ? splat(88.0f) : x;
  const Vec y = x * 1.44269504088896341f + 0.5f;
  const Vec truncated = __builtin_convertvector(__builtin_convertvector(y, IVec), Vec);
  const Vec n = truncated + __builtin_convertvector(y < truncated, Vec);  // floor(y): -1 where y < trunc(y)
  Vec r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  Vec p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  return p * reinterpret_cast<const Vec&>(bits);
}

// 16 x 16 floats transposed in registers: four rounds, each swapping the off-diagonal blocks of
// size h (8, 4, 2, 1) between rows i and i + h.
template <int H, bool High>
constexpr int swap_lane(int c) {  // where lane c of row i (or, High, of row i + H) comes from in (a, b)
  return (c & H) == 0 ? (High ? c + H : c) : (High ? kLanes + c : kLanes + c - H);
}

template <int H, bool High, std::size_t... C>
constexpr IVec swap_mask(std::index_sequence<C...>) {
  return IVec{swap_lane<H, High>(static_cast<int>(C))...};
}

template <int H>
inline void transpose_round(Vec (&m)[kLanes]) {
  constexpr IVec low = swap_mask<H, false>(std::make_index_sequence<kLanes>{});
  constexpr IVec high = swap_mask<H, true>(std::make_index_sequence<kLanes>{});
  for (int i = 0; i < kLanes; ++i)
    if ((i & H) == 0) {
      const Vec a = m[i], b = m[i + H];
      m[i] = __builtin_shuffle(a, b, low);
      m[i + H] = __builtin_shuffle(a, b, high);
    }
}

inline void transpose(Vec (&m)[kLanes]) {
  transpose_round<8>(m);
  transpose_round<4>(m);
  transpose_round<2>(m);
  transpose_round<1>(m);
}

constexpr int kRowGroup = 4;  // attention rows processed together
constexpr int64_t kChunkTokens = 16;  // new tokens per attention work item: its rows share each transposed key block

// out[i] += sum over slots from <= s < past, in order, of weights[i][s] * values[s] (a multiply and an add
// per element) for kRowGroup rows whose D = 16 * DV values stay in registers throughout.
template <int DV, typename T>
void weigh_values(float* const* out, const float* const* weights, const T* values, int64_t from, int64_t past) {
  Vec acc[kRowGroup][DV];
  for (int i = 0; i < kRowGroup; ++i)
    for (int v = 0; v < DV; ++v) acc[i][v] = load(out[i] + v * kLanes);
  for (int64_t s = from; s < past; ++s) {
    Vec row[DV];
    for (int v = 0; v < DV; ++v) row[v] = load(values + s * DV * kLanes + v * kLanes);
    for (int i = 0; i < kRowGroup; ++i) {
      const float p = weights[i][s];
      for (int v = 0; v < DV; ++v) acc[i][v] = acc[i][v] + p * row[v];
    }
  }
  for (int i = 0; i < kRowGroup; ++i)
    for (int v = 0; v < DV; ++v) store(out[i] + v * kLanes, acc[i][v]);
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
  at::parallel_for(0, rows, specdec::grain_for(dim), [&](int64_t begin, int64_t end) {
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

// gate_up: [N, 2I] float32 (gate then up) -> [N, I]: act(gate) * up, element by element, where act is
// SiLU, g / (1 + e^-g), or (gelu) GELU's tanh form, 0.5 g (1 + tanh(z)) = g / (1 + e^-2z) with
// z = sqrt(2/pi) (g + 0.044715 g^3) (Gemma's gelu_pytorch_tanh).
torch::Tensor gated_mul(torch::Tensor gate_up, bool gelu) {
  TORCH_CHECK(gate_up.dtype() == torch::kFloat32, "gated_mul wants float32");
  gate_up = gate_up.contiguous();
  const int64_t width = gate_up.size(-1) / 2, rows = gate_up.numel() / (2 * width);
  auto sizes = gate_up.sizes().vec();
  sizes.back() = width;
  auto out = torch::empty(sizes, gate_up.options());
  const float* pg = gate_up.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, specdec::grain_for(width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* __restrict gate = pg + r * 2 * width;
      const float* __restrict up = gate + width;
      float* __restrict o = po + r * width;
      for (int64_t i = 0; i < width; i += kLanes) {
        const int64_t n = std::min<int64_t>(kLanes, width - i);
        const Vec g = load(gate + i, n);
        const Vec z = gelu ? (g + g * g * g * 0.044715f) * -1.5957691216057308f : -g;  // -2 sqrt(2/pi) (g + 0.044715 g^3)
        store(o + i, g / (1.f + fixed_exp(z)) * load(up + i, n), n);
      }
    }
  });
  return out;
}

torch::Tensor silu_mul(torch::Tensor gate_up) { return gated_mul(gate_up, false); }
torch::Tensor gelu_tanh_mul(torch::Tensor gate_up) { return gated_mul(gate_up, true); }

// Attention of new tokens over a static cache.
//
// The recipe of a row (sequence, query head h, new token t), whatever the number of new tokens T, the
// tree, or which other rows and sequences share the call:
// - score of slot s: sum over d = 0 .. D-1, in order from 0, of q[d] * k[d] (a multiply, then an
//   add), times 1/sqrt(D) — computed for 16 slots at once, one slot per lane (the sequence's keys
//   transposed, 16 by 16 in registers);
// - over its visible slots in ascending order: the max, e = exp(score - max), their sum (lane l of
//   a vector adds the l-th, (l+16)-th, ... visible slot's e in order, then the lanes are folded
//   pairwise), and out = sum of e * value (a multiply and an add per element, slots in order),
//   times 1/sum.
// So a row depends only on the keys and values it sees, not on their slot numbers or neighbours.
// A sliding window W (Gemma 3's local layers) hides the slots more than W - 1 positions back: a row
// at position p (past + its visible new tokens - 1; a tree's node sits at past + its depth) sees
// slots [p - W + 1, p] only; its sums start at the first of them, and the hidden slots weigh exactly
// 0 where rows are weighed together.
// The cache holds float32 or float16 (widened exactly as it is read, so a row's arithmetic is the
// same either way, on the values the cache holds). A work item is (sequence, KV head, a chunk of at most kChunkTokens new tokens): its rows, G = H / Hkv query
// heads times the chunk's tokens, are scored and weighted together, so each key and value is read
// once per chunk. `attention` (one cache, B sequences alike) and `attention_segments` (one cache per
// sequence, as `decoder_layers` runs them) both run `attend` below, so there is one copy of it.
namespace {

// One sequence's part of an attention call. Query row (t, h) lies at q + t * token_stride +
// h * head_stride, D floats, and its output at the same offset from out.
struct AttentionSegment {
  const float* q;
  float* out;
  int64_t token_stride, head_stride;
  const void* keys;    // [Hkv, S, D] float or Half: the layer's cache, the new tokens already at slots [past, past + T)
  const void* values;  // [Hkv, S, D], as keys
  int64_t max_len;      // S
  int64_t past, seq;    // the cached slots [0, past) every new token sees; T
  const bool* mask;     // [T, T] (new token t sees new token j), or nullptr for causal
  int64_t window;       // a row sees the last `window` positions only (0: all)
  float* keys_t;        // [Hkv, blocks, D, 16]: keys transposed beforehand, or nullptr: the item does it
  int64_t chunk, chunks;  // new tokens per work item (min(T, kChunkTokens)) and the items per KV head
};

// Keys [width <= 16, D] (consecutive cache slots) -> kt [D, 16]: one key per lane, zeros past width.
template <typename T>
void transpose_key_block(const T* src, int64_t width, int64_t dim, float* kt) {
  if (dim % kLanes == 0) {
    for (int64_t d0 = 0; d0 < dim; d0 += kLanes) {
      Vec tile[kLanes];
      for (int64_t l = 0; l < kLanes; ++l) tile[l] = l < width ? load(src + l * dim + d0) : Vec{};
      transpose(tile);
      for (int64_t j = 0; j < kLanes; ++j) store(kt + (d0 + j) * kLanes, tile[j]);
    }
  } else {
    if (width < kLanes) std::fill(kt, kt + dim * kLanes, 0.f);
    for (int64_t l = 0; l < width; ++l)
      for (int64_t d = 0; d < dim; ++d) kt[d * kLanes + l] = static_cast<float>(src[l * dim + d]);
  }
}

// The first block of 16 slots a segment's rows may see: with a window, no row sees a slot before
// past + 1 - window (its lowest row, one new token); the keys before it are never transposed.
int64_t first_visible_block(const AttentionSegment& seg) {
  return seg.window > 0 ? std::max<int64_t>(0, seg.past + 1 - seg.window) / kLanes : 0;
}

// A worker's buffers, grown as needed and reused from item to item.
struct AttentionScratch {
  std::vector<float> keys_t;       // [blocks, D, 16]: the item's KV head's keys, when it transposes them
  std::vector<float> scores, weights;  // [rows, padded] by slot; [rows, slots] by visible slot
  std::vector<int64_t> fresh;      // [rows, T]: each row's visible new slots, ascending
  std::vector<int64_t> fresh_count;  // [rows]
  std::vector<int64_t> lows;       // [rows]: each row's first visible slot (0 without a window)
  std::vector<float> totals;       // [rows]
  std::vector<float> padding;      // [kRowGroup, D]: outputs of padding rows, discarded
  std::vector<float> queries;      // [rows + kRowGroup, D]
};

// One work item: chunk c of segment seg's new tokens against KV head kvh; writes its rows' outputs.
// T: the cache's element type (float or Half).
template <typename T>
void attend(const AttentionSegment& seg, int64_t kvh, int64_t c, int64_t group, int64_t dim,
            AttentionScratch& scratch) {
  const int64_t seq = seg.seq, past = seg.past, slots = past + seq;
  const int64_t padded = (slots + kLanes - 1) / kLanes * kLanes, key_blocks = padded / kLanes;
  const float scale = 1.f / std::sqrt(static_cast<float>(dim));
  const int64_t t0 = c * seg.chunk, tokens = std::min(seg.chunk, seq - t0), rows = group * tokens;
  const T* vbase = static_cast<const T*>(seg.values) + kvh * seg.max_len * dim;  // [S, D]
  const bool causal = seg.mask == nullptr;
  auto offset = [&](int64_t r) {  // row r = (g, t): query head kvh * G + g, token t0 + t
    return (t0 + r % tokens) * seg.token_stride + (kvh * group + r / tokens) * seg.head_stride;
  };
  // the KV head's keys, transposed in blocks of 16 slots: [blocks, D, 16]
  const float* kvh_keys_t;
  if (seg.keys_t != nullptr) {
    kvh_keys_t = seg.keys_t + kvh * key_blocks * dim * kLanes;
  } else {
    scratch.keys_t.resize(key_blocks * dim * kLanes);
    const T* src = static_cast<const T*>(seg.keys) + kvh * seg.max_len * dim;
    for (int64_t block = first_visible_block(seg); block < key_blocks; ++block) {
      const int64_t s0 = block * kLanes;
      transpose_key_block(src + s0 * dim, std::min<int64_t>(kLanes, slots - s0), dim,
                          scratch.keys_t.data() + block * dim * kLanes);
    }
    kvh_keys_t = scratch.keys_t.data();
  }
  std::vector<float>& scores = scratch.scores;
  std::vector<float>& weights = scratch.weights;
  std::vector<float>& queries = scratch.queries;
  scores.resize(rows * padded);
  queries.assign((rows + kRowGroup) * dim, 0.f);  // the item's query rows, contiguous
  for (int64_t r = 0; r < rows; ++r) std::memcpy(queries.data() + r * dim, seg.q + offset(r), dim * sizeof(float));
  // Causal, the item's rows see slots [0, past + t0 + tokens) at most, and all of them see
  // [0, past + t0): the scores of later slots are not computed, and those shared slots' values are
  // weighed together for all rows (each output element still adds p * value slot by slot in
  // ascending order, whichever loop does it: the same bits as a one-token pass).
  const int64_t seen = causal ? past + t0 + tokens : slots, shared = causal ? past + t0 : past;
  // each row's visible new slots, and with a window its first visible slot (slots are positions up to past)
  scratch.fresh.resize(rows * seq);
  scratch.fresh_count.assign(rows, 0);
  scratch.lows.assign(rows, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = t0 + r % tokens;
    int64_t* vis = scratch.fresh.data() + r * seq;
    int64_t m = 0;
    for (int64_t j = 0; j < seq; ++j)
      if (causal ? j <= t : seg.mask[t * seq + j]) vis[m++] = past + j;
    scratch.fresh_count[r] = m;
    if (seg.window > 0) scratch.lows[r] = std::max<int64_t>(0, past + m - seg.window);
  }
  const int64_t first = *std::min_element(scratch.lows.begin(), scratch.lows.end()) / kLanes * kLanes;
  for (int64_t s0 = first; s0 < seen; s0 += kLanes) {
    const float* kt = kvh_keys_t + (s0 / kLanes) * dim * kLanes;
    for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {  // kRowGroup independent chains in flight
      const float* qg = queries.data() + r0 * dim;  // [kRowGroup, D], rows past the last padded
      Vec acc[kRowGroup] = {};
      for (int64_t d = 0; d < dim; ++d) {
        const Vec kd = load(kt + d * kLanes);
        for (int i = 0; i < kRowGroup; ++i) acc[i] = acc[i] + qg[i * dim + d] * kd;
      }
      for (int i = 0; i < kRowGroup && r0 + i < rows; ++i) store(scores.data() + (r0 + i) * padded + s0, acc[i] * scale);
    }
  }
  weights.resize(rows * slots);
  scratch.totals.assign(rows, 0.f);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* vis = scratch.fresh.data() + r * seq;  // the visible slots are [lo, past), then these
    const int64_t m = scratch.fresh_count[r], n = past + m, lo = scratch.lows[r];
    // (lo > past only causal, in a chunk longer than the window: there visible new slot i is slot past + i)
    const int64_t fresh_from = std::max(lo, past) - past;
    const float* sr = scores.data() + r * padded;
    float* e = weights.data() + r * slots;  // by visible index: slot i < past at i, new slot vis[i] at past + i
    float top = -INFINITY;  // the max is exact in any order: the cached slots a vector at a time
    Vec top_lanes = splat(-INFINITY);
    int64_t s = lo;
    for (; s + kLanes <= past; s += kLanes) {
      const Vec v = load(sr + s);
      top_lanes = v > top_lanes ? v : top_lanes;
    }
    for (int l = 0; l < kLanes; ++l) top = std::max(top, top_lanes[l]);
    for (; s < past; ++s) top = std::max(top, sr[s]);
    for (int64_t i = fresh_from; i < m; ++i) top = std::max(top, sr[vis[i]]);
    std::fill(e, e + lo, 0.f);  // hidden by the window: weigh nothing
    for (int64_t i = lo; i < past; ++i) e[i] = sr[i] - top;
    for (int64_t i = fresh_from; i < m; ++i) e[past + i] = sr[vis[i]] - top;
    Vec sum = {};  // lane l sums the weights of visible slots lo + l, lo + l + 16, ... in order; then a fixed fold
    for (int64_t i = lo; i < n; i += kLanes) {
      const int64_t width = std::min<int64_t>(kLanes, n - i);
      const Vec w = fixed_exp(load(e + i, width));
      store(e + i, w, width);
      sum = sum + (width == kLanes ? w : load(e + i, width));
    }
    scratch.totals[r] = fold(sum);
    std::memset(seg.out + offset(r), 0, dim * sizeof(float));
  }
  // the weighing below starts at the group's first visible slot: every row weighs the slots before its own by 0
  auto accumulate = [&](float* orow, float p, const T* vrow) {  // orow += p * vrow
    for (int64_t d = 0; d < dim; d += kLanes) {
      const int64_t width = std::min<int64_t>(kLanes, dim - d);
      store(orow + d, load(orow + d, width) + p * load(vrow + d, width), width);
    }
  };
  // the slots every row sees (in ascending order, its weights at the slots' own indices: the cached
  // ones, and causal, the new tokens before the chunk): each value row read once per row group
  scratch.padding.resize(kRowGroup * dim);
  for (int64_t r0 = 0; r0 < rows; r0 += kRowGroup) {
    const int64_t group_rows = std::min<int64_t>(kRowGroup, rows - r0);
    float* orows[kRowGroup];
    const float* weight_rows[kRowGroup];
    int64_t from = shared;  // the group's first visible slot
    for (int i = 0; i < kRowGroup; ++i) {  // a short group is padded with rows written to scratch
      const int64_t r = std::min<int64_t>(r0 + i, rows - 1);
      orows[i] = i < group_rows ? seg.out + offset(r) : scratch.padding.data() + i * dim;
      weight_rows[i] = weights.data() + r * slots;
      from = std::min(from, scratch.lows[r]);
    }
    if (dim == 64) {
      weigh_values<4>(orows, weight_rows, vbase, from, shared);
    } else {
      for (int64_t s = from; s < shared; ++s)
        for (int64_t i = 0; i < group_rows; ++i) accumulate(orows[i], weight_rows[i][s], vbase + s * dim);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* orow = seg.out + offset(r);
    const int64_t* vis = scratch.fresh.data() + r * seq;
    for (int64_t i = shared - past; i < scratch.fresh_count[r]; ++i)  // its own visible new slots past the shared ones
      accumulate(orow, weights[r * slots + past + i], vbase + vis[i] * dim);
    const float inv = 1.f / scratch.totals[r];
    for (int64_t d = 0; d < dim; ++d) orow[d] *= inv;
  }
}

// All the work items of a call. A segment of at most kChunkTokens new tokens is one item per KV head, which
// transposes its own keys into its worker's scratch (they stay in cache for the scores); the keys
// of longer segments, shared by several items, are transposed first, in one parallel pass, into
// `transposed`. Then one parallel pass over every (segment, KV head, chunk) item. `half`: every
// segment's cache holds Half (else float).
void attend_all(std::vector<AttentionSegment>& segments, int64_t heads, int64_t kv_heads, int64_t dim, bool half,
                std::vector<float>& transposed) {
  const int64_t group = heads / kv_heads, count = static_cast<int64_t>(segments.size());
  // the segments' first items, and first key blocks to transpose beforehand, in flat numbering
  std::vector<int64_t> first_item(count + 1, 0), first_block(count + 1, 0);
  for (int64_t b = 0; b < count; ++b) {
    AttentionSegment& seg = segments[b];
    TORCH_CHECK(seg.seq >= 1 && seg.past >= 0 && seg.past + seg.seq <= seg.max_len,
                "attention: the new tokens lie past the cache");
    TORCH_CHECK(seg.window >= 0 && (seg.window == 0 || seg.mask == nullptr || seg.seq <= seg.window),
                "attention: a tree wider than the sliding window");
    seg.chunk = std::min<int64_t>(seg.seq, kChunkTokens);
    seg.chunks = (seg.seq + seg.chunk - 1) / seg.chunk;
    const int64_t key_blocks = (seg.past + seg.seq + kLanes - 1) / kLanes;
    first_item[b + 1] = first_item[b] + kv_heads * seg.chunks;
    first_block[b + 1] = first_block[b] + (seg.chunks > 1 ? kv_heads * key_blocks : 0);
  }
  auto segment_of = [](const std::vector<int64_t>& first, int64_t item) {  // the b with first[b] <= item < first[b + 1]
    return static_cast<int64_t>(std::upper_bound(first.begin(), first.end(), item) - first.begin()) - 1;
  };
  if (first_block[count] > 0) {
    transposed.resize(first_block[count] * dim * kLanes);
    for (int64_t b = 0; b < count; ++b)  // [Hkv, blocks, D, 16] each
      if (first_block[b + 1] > first_block[b]) segments[b].keys_t = transposed.data() + first_block[b] * dim * kLanes;
    at::parallel_for(0, first_block[count], specdec::grain_for(dim * kLanes), [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t b = segment_of(first_block, item);
        const AttentionSegment& seg = segments[b];
        const int64_t slots = seg.past + seg.seq, key_blocks = (slots + kLanes - 1) / kLanes;
        const int64_t local = item - first_block[b], block = local % key_blocks, kvh = local / key_blocks;
        if (block < first_visible_block(seg)) continue;  // before every row's window
        const int64_t s0 = block * kLanes, offset = (kvh * seg.max_len + s0) * dim, width = std::min<int64_t>(kLanes, slots - s0);
        float* kt = seg.keys_t + local * dim * kLanes;
        if (half) transpose_key_block(static_cast<const Half*>(seg.keys) + offset, width, dim, kt);
        else transpose_key_block(static_cast<const float*>(seg.keys) + offset, width, dim, kt);
      }
    });
  }
  // an item's work: its rows (query heads × chunk tokens) against every slot they see
  int64_t work = 0;
  for (const AttentionSegment& seg : segments) work += kv_heads * group * seg.seq * (seg.past + seg.seq) * dim;
  const int64_t items = first_item[count];
  at::parallel_for(0, items, specdec::grain_for(work / std::max<int64_t>(items, 1)), [&](int64_t begin, int64_t end) {
    AttentionScratch scratch;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = segment_of(first_item, item);
      const AttentionSegment& seg = segments[b];
      const int64_t local = item - first_item[b];
      if (half) attend<Half>(seg, local / seg.chunks, local % seg.chunks, group, dim, scratch);
      else attend<float>(seg, local / seg.chunks, local % seg.chunks, group, dim, scratch);
    }
  });
}

// A tree mask as `attend` reads it: bool, contiguous; an empty one (causal) as it is.
torch::Tensor bool_mask(const torch::Tensor& tree_mask) {
  if (tree_mask.numel() == 0 || (tree_mask.scalar_type() == torch::kBool && tree_mask.is_contiguous())) return tree_mask;
  return tree_mask.to(torch::kBool).contiguous();
}

// Whether a cache (keys and values alike) holds float16; float32 otherwise, anything else refused.
bool half_cache(const torch::Tensor& keys, const torch::Tensor& values, const char* who) {
  TORCH_CHECK(keys.dtype() == values.dtype() && (keys.dtype() == torch::kFloat32 || keys.dtype() == torch::kFloat16),
              who, " wants a float32 or float16 cache (keys and values alike)");
  return keys.dtype() == torch::kFloat16;
}

const void* cache_data(const torch::Tensor& cache, int64_t offset) {  // element `offset` of a float or Half cache
  return static_cast<const char*>(cache.data_ptr()) + offset * static_cast<int64_t>(cache.element_size());
}

}  // namespace

// B sequences with one shared cache layout. q: [B, H, T, D]; keys, values: [B, Hkv, S_max, D]
// (the layer's cache, the new tokens already written at slots [past, past + T)); tree_mask: [T, T]
// bool (new token t sees new token j) or an empty tensor for causal. Every new token sees all
// slots [0, past), or with a sliding window (window > 0) the last `window` positions of them and of
// the new tokens. Returns [B, H, T, D].
torch::Tensor attention(torch::Tensor q, torch::Tensor keys, torch::Tensor values, int64_t past,
                        torch::Tensor tree_mask, int64_t window) {
  TORCH_CHECK(q.dtype() == torch::kFloat32, "attention wants float32 queries");
  const bool half = half_cache(keys, values, "attention");
  TORCH_CHECK(keys.is_contiguous() && values.is_contiguous(), "attention wants a contiguous cache");
  q = q.contiguous();
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), dim = q.size(3);
  const int64_t kv_heads = keys.size(1), max_len = keys.size(2);
  torch::Tensor mask = bool_mask(tree_mask);
  auto out = torch::empty_like(q);
  std::vector<AttentionSegment> segments(batch);
  for (int64_t b = 0; b < batch; ++b) {  // sequence b: its [H, T, D] block of q and out
    AttentionSegment& seg = segments[b];
    seg.q = q.data_ptr<float>() + b * heads * seq * dim;
    seg.out = out.data_ptr<float>() + b * heads * seq * dim;
    seg.token_stride = dim;
    seg.head_stride = seq * dim;
    seg.keys = cache_data(keys, b * kv_heads * max_len * dim);
    seg.values = cache_data(values, b * kv_heads * max_len * dim);
    seg.max_len = max_len;
    seg.past = past;
    seg.seq = seq;
    seg.mask = mask.numel() ? mask.data_ptr<bool>() : nullptr;
    seg.window = window;
    seg.keys_t = nullptr;
  }
  std::vector<float> transposed;
  attend_all(segments, heads, kv_heads, dim, half, transposed);
  return out;
}

// The segments of a pass, one per sequence, each with its own cache, in one call (see
// `decoder_layers`). q: [N, H, D], the new tokens of segment after segment (T_b = tokens[b] rows
// each); keys[b], values[b]: [L, 1, Hkv, S_b, D], of which layer `layer` is used, the new tokens
// already written at slots [pasts[b], pasts[b] + T_b); tree_masks[b]: [T_b, T_b] bool or empty for
// causal; window: as `attention`'s. Returns [N, H, D], each row as `attention` computes it for its sequence alone.
torch::Tensor attention_segments(torch::Tensor q, const std::vector<torch::Tensor>& keys,
                                 const std::vector<torch::Tensor>& values, int64_t layer,
                                 const std::vector<int64_t>& pasts, const std::vector<int64_t>& tokens,
                                 const std::vector<torch::Tensor>& tree_masks, int64_t window) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && q.dim() == 3, "attention_segments wants float32 q [N, H, D]");
  const size_t count = tokens.size();
  TORCH_CHECK(keys.size() == count && values.size() == count && pasts.size() == count && tree_masks.size() == count,
              "attention_segments: one cache, past and tree mask per segment");
  q = q.contiguous();
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  auto out = torch::empty_like(q);
  std::vector<torch::Tensor> masks(count);
  std::vector<AttentionSegment> segments(count);
  int64_t start = 0;
  int64_t kv_heads = 0;
  const bool half = count > 0 && half_cache(keys[0], values[0], "attention_segments");
  for (size_t b = 0; b < count; ++b) {  // segment b: rows [start, start + T_b) of q and out
    const torch::Tensor& k = keys[b];
    const torch::Tensor& v = values[b];
    TORCH_CHECK(k.dim() == 5 && k.size(1) == 1 && k.size(4) == dim && k.sizes() == v.sizes() &&
                half_cache(k, v, "attention_segments") == half && k.is_contiguous() &&
                v.is_contiguous() && layer >= 0 && layer < k.size(0),
                "attention_segments wants contiguous caches [L, 1, Hkv, S, D], all float32 or all float16");
    TORCH_CHECK(b == 0 || k.size(2) == kv_heads, "attention_segments: the caches' KV heads differ");
    kv_heads = k.size(2);
    masks[b] = bool_mask(tree_masks[b]);
    AttentionSegment& seg = segments[b];
    seg.q = q.data_ptr<float>() + start * heads * dim;
    seg.out = out.data_ptr<float>() + start * heads * dim;
    seg.token_stride = heads * dim;
    seg.head_stride = dim;
    seg.keys = cache_data(k, layer * k.stride(0));
    seg.values = cache_data(v, layer * v.stride(0));
    seg.max_len = k.size(3);
    seg.past = pasts[b];
    seg.seq = tokens[b];
    seg.mask = masks[b].numel() ? masks[b].data_ptr<bool>() : nullptr;
    TORCH_CHECK(seg.mask == nullptr || masks[b].numel() == seg.seq * seg.seq, "attention_segments: a tree mask is not [T_b, T_b]");
    seg.window = window;
    seg.keys_t = nullptr;
    start += tokens[b];
  }
  TORCH_CHECK(start == rows, "attention_segments: the segments' tokens do not add up to the rows");
  if (count == 0) return out;
  TORCH_CHECK(heads % kv_heads == 0, "attention_segments: the heads are not a multiple of the KV heads");
  std::vector<float> transposed;
  attend_all(segments, heads, kv_heads, dim, half, transposed);
  return out;
}

// Every kernel runs without the GIL (its arguments are converted before, its result after): a
// server's worker thread in a long pass leaves the event loop free to answer.
#define NO_GIL py::call_guard<py::gil_scoped_release>()

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rms_norm", &rms_norm, "row-wise RMSNorm in a fixed order", NO_GIL);
  m.def("silu_mul", &silu_mul, "silu(gate) * up", NO_GIL);
  m.def("gelu_tanh_mul", &gelu_tanh_mul, "gelu_tanh(gate) * up (Gemma's MLP)", NO_GIL);
  m.def("attention", &attention, "batch-invariant attention over a static cache", NO_GIL, py::arg("q"), py::arg("keys"),
        py::arg("values"), py::arg("past"), py::arg("tree_mask"), py::arg("window") = 0);
  m.def("attention_segments", &attention_segments, "batch-invariant attention of segments, one cache each, in one call", NO_GIL);
  m.def("quant_linear", &quant_linear, "quantized weights (parts stacked along the outputs) x 8-bit rows, every row by one recipe", NO_GIL);
  m.def("pack_quant_weights", &pack_quant_weights, "codes, scales (and 4-bit offsets) into quant_linear's layout", NO_GIL,
        py::arg("codes"), py::arg("scales"), py::arg("offsets") = py::none());
  m.def("pack_gguf", &pack_gguf, "GGUF blocks of one type as stored (one tensor, or several stacked along outputs) into its packed format, exactly", NO_GIL);
  m.def("packed_gguf_types", &packed_gguf_types, "the GGUF types pack_gguf packs, each into its own format", NO_GIL);
  m.def("dequantize_packed", &dequantize_packed, "the exact float32 weights of rows of a packed tensor (all rows when empty)", NO_GIL);
  m.def("quant_linear_path", &quant_linear_path, "the instruction set quant_linear was built for", NO_GIL);
  m.def("eagle3_layer", &eagle3_layer, "an EAGLE-3 head's decoder layer over new pairs of one sequence (quantized linears), in one call", NO_GIL);
  m.def("decoder_layers", &decoder_layers, "the decoder layers of one pass over segments of rows, each with its own cache (quantized linears), in one call; "
        "returns the stream after them and the streams entering the `capture` layers", NO_GIL);
}
