// Weight-only 4-bit linear layers with 8-bit activations: a weight tile is unpacked once per call
// and used for every row, so a pass over k rows streams the weights once (flat verification).
//
// Numerics (llama.cpp's Q4 x Q8_0 recipe, made batch-invariant):
// - each input row is quantized in blocks of 32: d = max|x| / 127, xq = round(x / d) in [-127, 127],
//   X = sum(xq) — per row, never shared across rows;
// - 4-bit weights: codes q in [0, 15] per block of 32 inputs with a float16 scale s and offset c
//   (w = s * q + c; GGUF Q4_1 is s = d, c = m; Q4_0 is s = d, c = -8d). Per block the integer dot
//   I = sum(q * xq) is exact, then in float32: t = c * X; t = fma(s, I, t); acc = fma(t, d, acc);
// - 8-bit weights: codes q in [-128, 127] with a float16 scale s (GGUF Q8_0: w = s * q). I =
//   sum(q * xq) exact, then t = s * I; acc = fma(t, d, acc);
// - blocks in ascending order.
// So every output of every row is computed by one recipe whatever the number of rows, the tile or
// the thread, and the AVX-512 VNNI, AVX2 and scalar paths give the same bits (the integer dots are
// exact however they are formed; the float steps are the same operations in the same order).
//
// Packed layout, one uint8 tensor [N / 16, K / 32, bytes] (tiles of 16 outputs, blocks of 32
// inputs; within a chunk of 64 bytes output n's 4 bytes lie at 4n):
// - 4-bit: 4 chunks (chunk j: low nibbles q[n, 4j .. 4j+3], high nibbles q[n, 16+4j .. 16+4j+3]),
//   16 float16 scales, 16 float16 offsets: 320 bytes;
// - 8-bit: 8 chunks (chunk g: q[n, 4g .. 4g+3]), 16 float16 scales, 16 int32 128 * sum(q) (VNNI
//   multiplies unsigned by signed bytes, so it takes xq + 128 and subtracts this): 608 bytes.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SPECDEC_QGEMM_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECDEC_QGEMM_AVX2 1
#include <immintrin.h>
#endif

namespace {

constexpr int kTile = 16;   // outputs per tile
constexpr int kBlock = 32;  // inputs per block

template <int BITS>
constexpr int64_t kBlockBytes = BITS == 4 ? 256 + 32 + 32 : 512 + 32 + 64;

struct Activations {  // x [M, K] quantized per row in blocks of 32
  std::vector<int8_t> q;     // [M, K] in [-127, 127]
  std::vector<uint8_t> u;    // [M, K] q + 128 (VNNI's unsigned operand, for 8-bit weights), or empty
  std::vector<float> scale;  // [M, K/32]
  std::vector<float> sum;    // [M, K/32], sum of the block's codes (an integer, exact in float)
};

Activations quantize_rows(const float* x, int64_t rows, int64_t k, bool with_unsigned) {
  const int64_t blocks = k / kBlock;
  Activations a{std::vector<int8_t>(rows * k), std::vector<uint8_t>(with_unsigned ? rows * k : 0),
                std::vector<float>(rows * blocks), std::vector<float>(rows * blocks)};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* v = x + r * k + b * kBlock;
      float top = 0.f;
      for (int i = 0; i < kBlock; ++i) top = std::max(top, std::fabs(v[i]));
      const float d = top / 127.f;
      const float inv = d > 0.f ? 1.f / d : 0.f;
      const int64_t at = r * k + b * kBlock;
      int32_t total = 0;
      for (int i = 0; i < kBlock; ++i) {
        const int8_t q = static_cast<int8_t>(std::min(std::max(std::nearbyint(v[i] * inv), -127.f), 127.f));
        a.q[at + i] = q;
        if (with_unsigned) a.u[at + i] = static_cast<uint8_t>(q + 128);
        total += q;
      }
      a.scale[r * blocks + b] = d;
      a.sum[r * blocks + b] = static_cast<float>(total);
    }
  return a;
}

#if SPECDEC_QGEMM_AVX512
template <typename T>
inline __m512i broadcast4(const T* p) {  // 4 bytes into every 32-bit lane
  return _mm512_broadcastd_epi32(_mm_loadu_si32(p));
}

// Rows [row0, row0 + R) against one tile: out[r, n0 .. n0+16). Each weight register is used by
// all R rows before the next is loaded (rows innermost: R independent chains in flight). `ahead`:
// a later tile to prefetch while this one computes (streaming weights and multiplying overlap), or null.
template <int BITS, int R>
void tile_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t k, int64_t row0, float* out,
               int64_t n, int64_t n0, const uint8_t* ahead) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = tile + b * kBlockBytes<BITS>;
    if (ahead != nullptr && row0 == 0)  // the first rows fetch the same block of a later tile
      for (int64_t line = 0; line < kBlockBytes<BITS>; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + b * kBlockBytes<BITS> + line), _MM_HINT_T0);
    const int64_t first = row0 * k + b * kBlock;  // row0's block b in the activations
    __m512i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
    if constexpr (BITS == 4) {
      for (int j = 0; j < 4; ++j) {
        const __m512i raw = _mm512_loadu_si512(blk + j * 64);
        const __m512i lo = _mm512_and_si512(raw, low4);                         // inputs 4j .. 4j+3
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);  // inputs 16+4j .. 16+4j+3
        for (int r = 0; r < R; ++r) {
          const int8_t* xb = a.q.data() + first + r * k;
          dot[r] = _mm512_dpbusd_epi32(dot[r], lo, broadcast4(xb + 4 * j));
          dot[r] = _mm512_dpbusd_epi32(dot[r], hi, broadcast4(xb + 16 + 4 * j));
        }
      }
    } else {
      for (int g = 0; g < 8; ++g) {
        const __m512i w = _mm512_loadu_si512(blk + g * 64);
        for (int r = 0; r < R; ++r)
          dot[r] = _mm512_dpbusd_epi32(dot[r], broadcast4(a.u.data() + first + r * k + 4 * g), w);
      }
      const __m512i correction = _mm512_loadu_si512(blk + 512 + 32);  // 128 * sum(q) per output
      for (int r = 0; r < R; ++r) dot[r] = _mm512_sub_epi32(dot[r], correction);
    }
    const __m512 s = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * BITS)));
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * blocks + b;
      __m512 t;
      if constexpr (BITS == 4) {
        const __m512 c = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * BITS + 32)));
        t = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(c, _mm512_set1_ps(a.sum[at])));
      } else {
        t = _mm512_mul_ps(s, _mm512_cvtepi32_ps(dot[r]));
      }
      acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(a.scale[at]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + (row0 + r) * n + n0, acc[r]);
}
constexpr int kRowChunk = 8;
constexpr bool kUnsignedRows = true;  // 8-bit weights read the rows as unsigned bytes (Activations::u)

#elif SPECDEC_QGEMM_AVX2
inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256i dot4(__m256i w, __m256i x, __m256i ones) {  // per 32-bit lane: 4 products u8 * s8, summed
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones);
}

template <int BITS, int R>
void tile_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t k, int64_t row0, float* out,
               int64_t n, int64_t n0, const uint8_t* ahead) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int half = 0; half < 2; ++half) {  // outputs n0 + 8 * half .. + 8
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = tile + b * kBlockBytes<BITS>;
      if (ahead != nullptr && row0 == 0 && half == 0)
        for (int64_t line = 0; line < kBlockBytes<BITS>; line += 64)
          _mm_prefetch(reinterpret_cast<const char*>(ahead + b * kBlockBytes<BITS> + line), _MM_HINT_T0);
      const int8_t* x0 = a.q.data() + row0 * k + b * kBlock;
      __m256i dot[R];
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
      if constexpr (BITS == 4) {
        for (int j = 0; j < 4; ++j) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + j * 64 + half * 32));
          const __m256i lo = _mm256_and_si256(raw, low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
          for (int r = 0; r < R; ++r) {
            dot[r] = _mm256_add_epi32(dot[r], dot4(lo, broadcast4(x0 + r * k + 4 * j), ones));
            dot[r] = _mm256_add_epi32(dot[r], dot4(hi, broadcast4(x0 + r * k + 16 + 4 * j), ones));
          }
        }
      } else {  // |w| * (x with w's sign): pairs stay within int16 (2 * 128 * 127)
        for (int g = 0; g < 8; ++g) {
          const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + g * 64 + half * 32));
          const __m256i magnitude = _mm256_abs_epi8(w);
          for (int r = 0; r < R; ++r)
            dot[r] = _mm256_add_epi32(dot[r], dot4(magnitude, _mm256_sign_epi8(broadcast4(x0 + r * k + 4 * g), w), ones));
        }
      }
      const uint8_t* scales = blk + 64 * BITS + half * 16;
      const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
      for (int r = 0; r < R; ++r) {
        const int64_t at = (row0 + r) * blocks + b;
        __m256 t;
        if constexpr (BITS == 4) {
          const __m256 c = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32)));
          t = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot[r]), _mm256_mul_ps(c, _mm256_set1_ps(a.sum[at])));
        } else {
          t = _mm256_mul_ps(s, _mm256_cvtepi32_ps(dot[r]));
        }
        acc[r] = _mm256_fmadd_ps(t, _mm256_set1_ps(a.scale[at]), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + (row0 + r) * n + n0 + 8 * half, acc[r]);
  }
}
constexpr int kRowChunk = 4;
constexpr bool kUnsignedRows = false;

#else
template <int BITS>
inline int weight_code(const uint8_t* blk, int lane, int i) {  // output `lane`, input i of the block
  if constexpr (BITS == 4) {
    const int byte = blk[((i % 16) / 4) * 64 + lane * 4 + i % 4];
    return i < 16 ? byte & 0x0F : byte >> 4;
  } else {
    return static_cast<int8_t>(blk[(i / 4) * 64 + lane * 4 + i % 4]);
  }
}

template <int BITS, int R>
void tile_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t k, int64_t row0, float* out,
               int64_t n, int64_t n0, const uint8_t* ahead) {
  (void)ahead;  // no prefetching in the portable path
  for (int r = 0; r < R; ++r)
    for (int lane = 0; lane < kTile; ++lane) {
      float acc = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = tile + b * kBlockBytes<BITS>;
        const int8_t* xb = a.q.data() + (row0 + r) * k + b * kBlock;
        int32_t dot = 0;
        for (int i = 0; i < kBlock; ++i) dot += weight_code<BITS>(blk, lane, i) * xb[i];
        const c10::Half* sc = reinterpret_cast<const c10::Half*>(blk + 64 * BITS);
        const int64_t at = (row0 + r) * blocks + b;
        float t;
        if constexpr (BITS == 4) {
          t = std::fma(static_cast<float>(sc[lane]), static_cast<float>(dot), static_cast<float>(sc[kTile + lane]) * a.sum[at]);
        } else {
          t = static_cast<float>(sc[lane]) * static_cast<float>(dot);
        }
        acc = std::fma(t, a.scale[at], acc);
      }
      out[(row0 + r) * n + n0 + lane] = acc;
    }
}
constexpr int kRowChunk = 1;
constexpr bool kUnsignedRows = false;
#endif

// Rows [first, end) against one tile: chunks of R rows, then the rest in chunks of R/2, R/4, ...
// (the per-row arithmetic is the same in every chunk).
template <int BITS, int R = kRowChunk>
void tile_all_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t k, int64_t first, int64_t end,
                   float* out, int64_t n, int64_t n0, const uint8_t* ahead) {
  int64_t r = first;
  for (; r + R <= end; r += R) tile_rows<BITS, R>(tile, blocks, a, k, r, out, n, n0, ahead);
  if constexpr (R > 1) {
    if (r < end) tile_all_rows<BITS, R / 2>(tile, blocks, a, k, r, end, out, n, n0, ahead);
  }
}

int bits_of(const torch::Tensor& packed) {
  TORCH_CHECK(packed.dtype() == torch::kUInt8 && packed.dim() == 3 && packed.is_contiguous(), "quant_linear: bad packing");
  if (packed.size(2) == kBlockBytes<4>) return 4;
  TORCH_CHECK(packed.size(2) == kBlockBytes<8>, "quant_linear: bad packing");
  return 8;
}

}  // namespace

// x: [M, K] float32; packed: [N/16, K/32, bytes] uint8 (see the header) -> [M, N] float32.
torch::Tensor quant_linear(torch::Tensor x, torch::Tensor packed) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2, "quant_linear wants float32 rows [M, K]");
  const int bits = bits_of(packed);
  x = x.contiguous();
  const int64_t rows = x.size(0), k = x.size(1), tiles = packed.size(0), blocks = packed.size(1);
  TORCH_CHECK(blocks * kBlock == k, "quant_linear: input size does not match the packing");
  const int64_t n = tiles * kTile;
  auto out = torch::empty({rows, n}, x.options());
  if (rows == 0) return out;
  const Activations a = quantize_rows(x.data_ptr<float>(), rows, k, bits == 8 && kUnsignedRows);
  const uint8_t* pw = packed.data_ptr<uint8_t>();
  float* po = out.data_ptr<float>();
  const int64_t tile_bytes = blocks * packed.size(2);
  constexpr int64_t kPrefetchTiles = 2;  // how far ahead the weights are fetched (measured best here)
  at::parallel_for(0, tiles, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* tile = pw + t * tile_bytes;
      const uint8_t* ahead = t + kPrefetchTiles < end ? tile + kPrefetchTiles * tile_bytes : nullptr;
      if (bits == 4) tile_all_rows<4>(tile, blocks, a, k, 0, rows, po, n, t * kTile, ahead);
      else tile_all_rows<8>(tile, blocks, a, k, 0, rows, po, n, t * kTile, ahead);
    }
  });
  return out;
}

// codes: [N, K] uint8 (4-bit, values 0..15) or int8 (8-bit); scales: [N, K/32] and, for 4-bit,
// offsets: [N, K/32], float32 holding float16 values -> the packed layout above.
torch::Tensor pack_quant_weights(torch::Tensor codes, torch::Tensor scales, c10::optional<torch::Tensor> offsets) {
  const bool four = codes.dtype() == torch::kUInt8;
  TORCH_CHECK((four || codes.dtype() == torch::kInt8) && codes.dim() == 2, "pack: codes [N, K] uint8 or int8");
  TORCH_CHECK(four == offsets.has_value(), "pack: 4-bit codes take offsets, 8-bit codes none");
  codes = codes.contiguous();
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK(n % kTile == 0 && k % kBlock == 0, "pack: N must be a multiple of 16 and K of 32");
  const int64_t tiles = n / kTile, blocks = k / kBlock, bytes = four ? kBlockBytes<4> : kBlockBytes<8>;
  auto packed = torch::zeros({tiles, blocks, bytes}, torch::kUInt8);
  auto s16 = scales.to(torch::kHalf).contiguous();
  auto c16 = four ? offsets->to(torch::kHalf).contiguous() : s16;
  const uint8_t* pc = reinterpret_cast<const uint8_t*>(codes.data_ptr());
  const c10::Half* ps = s16.data_ptr<c10::Half>();
  const c10::Half* pm = c16.data_ptr<c10::Half>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* blk = out + (t * blocks + b) * bytes;
      const int64_t sc_at = four ? 256 : 512;
      c10::Half* sc = reinterpret_cast<c10::Half*>(blk + sc_at);
      for (int lane = 0; lane < kTile; ++lane) {
        const int64_t row = t * kTile + lane;
        const uint8_t* q = pc + row * k + b * kBlock;
        sc[lane] = ps[row * blocks + b];
        if (four) {
          sc[kTile + lane] = pm[row * blocks + b];
          for (int j = 0; j < 4; ++j)
            for (int i = 0; i < 4; ++i)
              blk[j * 64 + lane * 4 + i] = static_cast<uint8_t>((q[4 * j + i] & 0x0F) | (q[16 + 4 * j + i] << 4));
        } else {
          int32_t total = 0;
          for (int i = 0; i < kBlock; ++i) {
            blk[(i / 4) * 64 + lane * 4 + i % 4] = q[i];
            total += static_cast<int8_t>(q[i]);
          }
          const int32_t correction = 128 * total;
          std::memcpy(blk + sc_at + 32 + 4 * lane, &correction, 4);
        }
      }
    }
  return packed;
}

std::string quant_linear_path() {
#if SPECDEC_QGEMM_AVX512
  return "avx512-vnni";
#elif SPECDEC_QGEMM_AVX2
  return "avx2";
#else
  return "scalar";
#endif
}
