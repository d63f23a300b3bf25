// Weight-only quantized linear layers with 8-bit activations: a weight tile is unpacked once per
// call and used for every row, so a pass over k rows streams the weights once (flat verification).
//
// Numerics (llama.cpp's Q x Q8_0 and Q x Q8_K recipes, made batch-invariant):
// - each input row is quantized as llama.cpp quantizes it for the weights' type (quantize_rows): to
//   8-bit codes xq with a scale d per block of 32 (shared by a super-block's 8 blocks for K-quants),
//   X = sum(xq) per block and per half block (16 inputs) — per row, never shared across rows;
// - weights: unsigned 4-, 6- or 8-bit codes u per block of 32 inputs and, per group of G = 32 or 16
//   inputs, a scale s and an offset c: w = s * u + c (affine), or w = s * (u - Z) (symmetric: u =
//   q + Z with Z = 8, 32 or 128). Per group the integer dot I = sum(u * xq) is exact;
// - per-block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: G = 32, s and c float16), per block in float32:
//   affine t = fma(s, I, c * X), symmetric t = s * (I - Z X); and acc = fma(t, d, acc);
// - super-block formats (Q2_K … Q6_K: s = D * sc and c = M * mn with integer codes sc, mn per group
//   and float16 D, M per super-block of 8 blocks), as llama.cpp sums them: per super-block the
//   integers S = sum over groups of sc * I and O = sum of mn * X (symmetric: sum of sc * X), exact
//   in int32, then in float32 affine t = fma(D, S, M * O), symmetric t = D * (S - Z O); and
//   acc = fma(t, d, acc) (d: the row's scale of that super-block);
// - blocks and super-blocks in ascending order.
// So every output of every row is computed by one recipe whatever the number of rows, the tile or
// the thread, and the AVX-512 VNNI, AVX2 and scalar paths give the same bits (the integer dots are
// exact however they are formed; the float steps are the same operations in the same order).
//
// Packed layout, one uint8 tensor [N / 16, units, unit bytes] (tiles of 16 outputs; a unit is a
// block of 32 inputs, or for super-block formats 8 blocks = 256 inputs). Within a chunk of 64 bytes
// output n's 4 bytes lie at 4n. Codes of a block:
// - 4-bit: 4 chunks (chunk j: low nibbles u[n, 4j .. 4j+3], high nibbles u[n, 16+4j .. 16+4j+3]);
// - 6-bit: the low 4 bits so, then 2 chunks of the high 2 bits (chunk p's byte holds, from bit 0,
//   those of inputs 4j + i, 16 + 4j + i for j = 2p, then for j = 2p + 1): 384 bytes.
// Formats (the unit size names the format), one per GGUF type, each holding the type's own numbers:
// - 8-bit: 8 chunks (chunk g: u[n, 4g .. 4g+3]);
// - per-block affine (Q4_1: 4-bit; Q5_1: 6-bit): codes, 16 float16 s, 16 float16 c: 320 / 448 bytes;
// - per-block symmetric (Q4_0: 4-bit, Q5_0: 6-bit, Q8_0: 8-bit): codes, 16 float16 s: 288 / 416 /
//   544 bytes — Q4_0's and Q8_0's the size of the file's blocks;
// - super-block affine: a header of 16 float16 d and 16 float16 m, then 8 blocks; s = d * sc and
//   c = m * mn, both exact in float32. Q4_K (4-bit, G 32: 2304 bytes, the size of the file's blocks)
//   and Q5_K (6-bit, G 32: 3328): the blocks' 6-bit sc and mn in the header (quant_formats.h,
//   header_scale_min), the blocks codes only; Q2_K (4-bit G 16: 2624): each block its codes and the
//   groups' int8 sc[16] and int8 mn[16] (group h at codes + 32h);
// - super-block symmetric (Q3_K, Q6_K): a header of 16 float16 d, then 8 blocks of codes and the
//   groups' int8 sc[16] (group h at codes + 16h): Q3_K 4-bit G 16 (2336 bytes), Q6_K 6-bit G 16
//   (3360, the size of the file's blocks).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#include "parallel.h"
#include "kernels.h"
#include "quant_formats.h"
#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define SPECDEC_QGEMM_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define SPECDEC_QGEMM_AVX2 1
#include <immintrin.h>
#endif
// Loops over the rows of a chunk (and a block's chunks) unrolled, so that each row's accumulators stay in registers.
#define SPECDEC_UNROLL _Pragma("GCC unroll 16")

namespace {

using specdec::kBlock;
using specdec::kTile;

struct Activations {  // x [M, K] quantized per row in blocks of 32
  int64_t rows = 0;            // M
  std::vector<int8_t> q;       // [K/32, M, 32] in [-127, 127]: block-major, so the R rows of a chunk
                               // lie side by side and a kernel reaches them at fixed offsets
  std::vector<float> scale;    // [M, K/32]
  std::vector<float> sum;      // [M, K/32], sum of the block's codes (an integer, exact in float)
  std::vector<int16_t> sum16;  // [M, K/32], the same sums as integers (|X| <= 32 * 127)
  std::vector<int16_t> half;   // [M, K/16], sums of each half block's codes

  const int8_t* codes(int64_t block, int64_t row) const { return q.data() + (block * rows + row) * kBlock; }
};

// Each row quantized as llama.cpp quantizes the rows its dot products take, so that the integer
// dots are the same as llama.cpp's on the same file:
// - for super-block weights (K-quants), Q8_K: per 256 inputs, `top` the input of largest magnitude
//   (the first such), iscale = -127 / top, xq = min(round(iscale * x), 127), and the block scale
//   d = 1 / iscale, shared by its 8 blocks of 32;
// - for per-block weights, Q8_0 as llama.cpp's x86 path forms it: per 32 inputs, amax = max|x|,
//   xq = round(x * (127 / amax)), d = amax / 127 rounded to float16.
// round: to nearest, ties to even. The block sums X are of the codes xq, exact. The vector paths
// compute the same numbers as the scalar loop (one product, one rounding, one min per input; the
// first input of largest magnitude; integer sums), so every path gives the same codes and scales.
inline float span_magnitude(const float* v, int n, float& top) {  // max |v| and the first v of that magnitude
  float amax = 0.f;
  int at = -1;
#if SPECDEC_QGEMM_AVX512
  __m512 m = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v + i)), m);  // NaN: ignored
  amax = _mm512_reduce_max_ps(m);
  const __m512 wanted = _mm512_set1_ps(amax);
  for (int i = 0; i < n && amax > 0.f; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(v + i)), wanted, _CMP_EQ_OQ);
    if (hit) {
      at = i + __builtin_ctz(hit);
      break;
    }
  }
#elif SPECDEC_QGEMM_AVX2
  const __m256 sign = _mm256_set1_ps(-0.f);
  __m256 m = _mm256_setzero_ps();
  for (int i = 0; i < n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)), m);  // NaN: ignored
  __m128 fold = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  fold = _mm_max_ps(fold, _mm_movehl_ps(fold, fold));
  amax = _mm_cvtss_f32(_mm_max_ss(fold, _mm_movehdup_ps(fold)));
  const __m256 wanted = _mm256_set1_ps(amax);
  for (int i = 0; i < n && amax > 0.f; i += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)), wanted, _CMP_EQ_OQ));
    if (hit) {
      at = i + __builtin_ctz(hit);
      break;
    }
  }
#else
  for (int i = 0; i < n; ++i)
    if (std::fabs(v[i]) > amax) {
      amax = std::fabs(v[i]);
      at = i;
    }
#endif
  top = at < 0 ? 0.f : v[at];
  return amax;
}

// Codes of one block of 32 inputs, min(round(v * mul), 127), and the sums of its two halves.
inline void quantize_block(const float* v, float mul, int8_t* q, int32_t halves[2]) {
#if SPECDEC_QGEMM_AVX512
  for (int h = 0; h < 2; ++h) {
    const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(v + 16 * h), _mm512_set1_ps(mul));
    const __m512 rounded = _mm512_min_ps(_mm512_roundscale_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                         _mm512_set1_ps(127.f));
    const __m512i codes = _mm512_cvtps_epi32(rounded);  // integers already: exact
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h), _mm512_cvtepi32_epi8(codes));
    halves[h] = _mm512_reduce_add_epi32(codes);
  }
#elif SPECDEC_QGEMM_AVX2
  for (int h = 0; h < 2; ++h) {
    __m256i codes[2];  // inputs 16 h .. 16 h + 7, 16 h + 8 .. 16 h + 15
    for (int e = 0; e < 2; ++e) {
      const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(v + 16 * h + 8 * e), _mm256_set1_ps(mul));
      const __m256 rounded = _mm256_min_ps(_mm256_round_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                           _mm256_set1_ps(127.f));
      codes[e] = _mm256_cvtps_epi32(rounded);  // integers already: exact
    }
    // packs works within 128-bit lanes: 64-bit quarters (0, 1 of codes[0]; 0, 1 of codes[1]) come out 0, 2, 1, 3
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(codes[0], codes[1]), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16 * h),
                     _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
    const __m256i both = _mm256_add_epi32(codes[0], codes[1]);
    __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(both), _mm256_extracti128_si256(both, 1));
    sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4E));
    halves[h] = _mm_cvtsi128_si32(_mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0xB1)));
  }
#else
  halves[0] = halves[1] = 0;
  for (int i = 0; i < kBlock; ++i) {
    q[i] = static_cast<int8_t>(std::min(std::nearbyint(v[i] * mul), 127.f));
    halves[i / 16] += q[i];
  }
#endif
}

Activations quantize_rows(const float* x, int64_t rows, int64_t k, bool super) {
  const int64_t blocks = k / kBlock;
  const int span = super ? specdec::kSuperBlocks * kBlock : kBlock;  // inputs per scale
  Activations a{rows, std::vector<int8_t>(rows * k), std::vector<float>(rows * blocks), std::vector<float>(rows * blocks),
                std::vector<int16_t>(rows * blocks), std::vector<int16_t>(rows * blocks * 2)};
  at::parallel_for(0, rows, specdec::grain_for(k), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t first = 0; first < k; first += span) {
        float top = 0.f;
        const float amax = span_magnitude(x + r * k + first, span, top);
        float mul = 0.f, d = 0.f;
        if (amax > 0.f && super) {
          mul = -127.f / top;
          d = 1.f / mul;
        } else if (amax > 0.f) {
          mul = 127.f / amax;
          d = static_cast<float>(static_cast<c10::Half>(amax / 127.f));
        }
        for (int64_t b = first / kBlock; b < (first + span) / kBlock; ++b) {
          int32_t halves[2];
          quantize_block(x + r * k + b * kBlock, mul, a.q.data() + (b * rows + r) * kBlock, halves);
          a.scale[r * blocks + b] = d;
          a.sum[r * blocks + b] = static_cast<float>(halves[0] + halves[1]);
          a.sum16[r * blocks + b] = static_cast<int16_t>(halves[0] + halves[1]);
          a.half[(r * blocks + b) * 2] = static_cast<int16_t>(halves[0]);
          a.half[(r * blocks + b) * 2 + 1] = static_cast<int16_t>(halves[1]);
        }
      }
  });
  return a;
}

using specdec::block_of;

// Where the super-block header of block b is (super-block formats).
template <class F>
inline const uint8_t* header_at(const uint8_t* tile, int64_t b) {
  return tile + (b / specdec::kSuperBlocks) * F::kUnitBytes;
}
inline void prefetch_unit(const uint8_t* ahead, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(ahead + line, 0, 3);
}

#if SPECDEC_QGEMM_AVX512 || SPECDEC_QGEMM_AVX2
// Block b's 6-bit sc and mn of 16 outputs from a super-block header (quant_formats.h,
// header_scale_min), outputs `first` .. first + 15 (AVX2 uses the low 8 of each).
inline void header_scales(const uint8_t* header, int64_t b, int first, __m128i& sc, __m128i& mn) {
  const int j = static_cast<int>(b % specdec::kSuperBlocks);
  const __m128i low = _mm_loadu_si128(reinterpret_cast<const __m128i*>(header + specdec::kScaleNibbles + 16 * j + first));
  __m128i high = _mm_loadu_si128(reinterpret_cast<const __m128i*>(header + specdec::kScaleHighBits + 16 * (j / 2) + first));
  if (j % 2) high = _mm_srli_epi16(high, 4);
  const __m128i nibble = _mm_set1_epi8(0x0F), two = _mm_set1_epi8(0x03);
  sc = _mm_or_si128(_mm_and_si128(low, nibble), _mm_slli_epi16(_mm_and_si128(high, two), 4));
  mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(low, 4), nibble),
                    _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(high, 2), two), 4));
}
#endif

#if SPECDEC_QGEMM_AVX512
template <typename T>
inline __m512i broadcast4(const T* p) {  // 4 bytes into every 32-bit lane
  return _mm512_broadcastd_epi32(_mm_loadu_si32(p));
}
inline __m512 half_to_ps(const uint8_t* p) {  // 16 float16 -> 16 float
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512i int8_to_epi32(const uint8_t* p) {  // 16 int8 -> 16 int32
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A block's codes against R rows (row r's 32 codes at x0 + 32 r): the integer dots of its two halves
// (inputs 0..15 in dot0, 16..31 in dot1; kSplit false: both in dot0). Each weight register is used
// by all R rows before the next is loaded (rows innermost: R independent chains in flight).
template <class F, int R, bool kSplit>
inline void block_dots(const uint8_t* blk, const int8_t* x0, __m512i* dot0, __m512i* dot1) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
  SPECDEC_UNROLL
  for (int r = 0; r < R; ++r) dot0[r] = dot1[r] = _mm512_setzero_si512();
  const auto accumulate = [&](int r, bool second, __m512i w, __m512i x) {
    if (kSplit && second) dot1[r] = _mm512_dpbusd_epi32(dot1[r], w, x);
    else dot0[r] = _mm512_dpbusd_epi32(dot0[r], w, x);
  };
  if constexpr (F::kBits == 8) {
    for (int g = 0; g < 8; ++g) {
      const __m512i w = _mm512_loadu_si512(blk + g * 64);
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) accumulate(r, g >= 4, w, broadcast4(x0 + r * kBlock + 4 * g));
    }
    return;
  }
  [[maybe_unused]] __m512i planes[2];
  if constexpr (F::kBits == 6) {
    planes[0] = _mm512_loadu_si512(blk + 256);
    planes[1] = _mm512_loadu_si512(blk + 320);
  }
  SPECDEC_UNROLL
  for (int j = 0; j < 4; ++j) {
    const __m512i raw = _mm512_loadu_si512(blk + j * 64);
    __m512i lo = _mm512_and_si512(raw, low4);                         // inputs 4j .. 4j+3
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);  // inputs 16+4j .. 16+4j+3
    if constexpr (F::kBits == 6) {  // the high 2 bits of both from plane j / 2
      const __m512i high = j % 2 ? _mm512_srli_epi16(planes[j / 2], 4) : planes[j / 2];
      lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(high, 4), top2));
      hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_slli_epi16(high, 2), top2));
    }
    SPECDEC_UNROLL
    for (int r = 0; r < R; ++r) {
      accumulate(r, false, lo, broadcast4(x0 + r * kBlock + 4 * j));
      accumulate(r, true, hi, broadcast4(x0 + r * kBlock + 16 + 4 * j));
    }
  }
}

// Rows [row0, row0 + R) against one tile of a per-block format: out[r, n0 .. n0+16). `ahead`: a
// later tile to prefetch while this one computes, or null.
template <class F, int R>
void block_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t row0, float* out,
                int64_t n, int64_t n0, const uint8_t* ahead) {
  __m512 acc[R];
  SPECDEC_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = block_of<F>(tile, b);
    if (ahead != nullptr && row0 == 0) prefetch_unit(block_of<F>(ahead, b), F::kBlockBytes);
    __m512i dot[R], unused[R];
    block_dots<F, R, false>(blk, a.codes(b, row0), dot, unused);
    const __m512 s = half_to_ps(blk + F::kCodeBytes);
    [[maybe_unused]] __m512 c;
    if constexpr (!F::kSym) c = half_to_ps(blk + F::kCodeBytes + 32);
    SPECDEC_UNROLL
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * blocks + b;
      __m512 t;
      if constexpr (F::kSym) {  // t = s (I - Z X), the integer exact
        const __m512i zero = _mm512_set1_epi32(F::kZero * static_cast<int32_t>(a.sum16[at]));
        t = _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(dot[r], zero)));
      } else {
        t = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(dot[r]), _mm512_mul_ps(c, _mm512_set1_ps(a.sum[at])));
      }
      acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(a.scale[at]), acc[r]);
    }
  }
  SPECDEC_UNROLL
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + (row0 + r) * n + n0, acc[r]);
}

// Block b's integer scale codes sc and offset codes mn of its groups (0, 1; one group: both the
// same) for 16 outputs; symmetric formats' offsets are their scales (see super_rows).
template <class F>
inline void group_codes(const uint8_t* header, const uint8_t* blk, int64_t b, __m512i* sc, __m512i* mn) {
  if constexpr (F::kHeaderScales) {
    __m128i sc8, mn8;
    header_scales(header, b, 0, sc8, mn8);
    sc[0] = sc[1] = _mm512_cvtepu8_epi32(sc8);
    mn[0] = mn[1] = _mm512_cvtepu8_epi32(mn8);
  } else {
    const uint8_t* params = blk + F::kCodeBytes;
    constexpr int kGroupBytes = F::kSym ? 16 : 32;  // sc[16] (and mn[16]) per group
    for (int h = 0; h < F::kHalves; ++h) {
      sc[h] = int8_to_epi32(params + kGroupBytes * h);
      mn[h] = F::kSym ? sc[h] : int8_to_epi32(params + kGroupBytes * h + 16);
    }
  }
}

// Rows [row0, row0 + R) against one tile of a super-block format (see the header: integer sums per
// super-block, then the float steps).
template <class F, int R>
void super_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t row0, float* out,
                int64_t n, int64_t n0, const uint8_t* ahead) {
  constexpr bool kSplit = F::kHalves == 2;
  constexpr int kPairs = specdec::kSuperBlocks * F::kHalves / 2;  // groups of a super-block, two by two
  const int16_t* group_sums = kSplit ? a.half.data() : a.sum16.data();  // X per group [M, K / G]
  const int64_t groups = blocks * F::kHalves;
  const __m512i low16 = _mm512_set1_epi32(0xFFFF);
  SPECDEC_UNROLL
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + (row0 + r) * n + n0, _mm512_setzero_ps());
  for (int64_t first = 0; first < blocks; first += specdec::kSuperBlocks) {
    const uint8_t* header = header_at<F>(tile, first);
    if (ahead != nullptr && row0 == 0) prefetch_unit(header_at<F>(ahead, first), F::kHeaderBytes);
    __m512i isum[R];  // sum over groups of sc * I
    SPECDEC_UNROLL
    for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
    __m512i pairs[kPairs];  // per output, int16 mn of groups 2p (low half) and 2p + 1
    __m512i even = _mm512_setzero_si512();
    for (int64_t b = first; b < first + specdec::kSuperBlocks; ++b) {
      const uint8_t* blk = block_of<F>(tile, b);
      if (ahead != nullptr && row0 == 0) prefetch_unit(block_of<F>(ahead, b), F::kBlockBytes);
      __m512i dot0[R], dot1[R];
      block_dots<F, R, kSplit>(blk, a.codes(b, row0), dot0, dot1);
      __m512i sc[2], mn[2];
      group_codes<F>(header, blk, b, sc, mn);
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) {
        isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot0[r], sc[0]));
        if constexpr (kSplit) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot1[r], sc[1]));
      }
      const int64_t i = b - first;
      if constexpr (kSplit) pairs[i] = _mm512_or_si512(_mm512_and_si512(mn[0], low16), _mm512_slli_epi32(mn[1], 16));
      else if (i % 2 == 0) even = mn[0];
      else pairs[i / 2] = _mm512_or_si512(_mm512_and_si512(even, low16), _mm512_slli_epi32(mn[0], 16));
    }
    const __m512 d = half_to_ps(header);
    [[maybe_unused]] __m512 m;
    if constexpr (!F::kSym) m = half_to_ps(header + 32);
    SPECDEC_UNROLL
    for (int r = 0; r < R; ++r) {
      const int64_t row = row0 + r;
      const int16_t* x_pairs = group_sums + row * groups + first * F::kHalves;
      __m512i osum = _mm512_setzero_si512();  // sum over groups of mn * X
      SPECDEC_UNROLL
      for (int p = 0; p < kPairs; ++p) osum = _mm512_dpwssd_epi32(osum, pairs[p], broadcast4(x_pairs + 2 * p));
      __m512 t;
      if constexpr (F::kSym) {
        t = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r], _mm512_mullo_epi32(osum, _mm512_set1_epi32(F::kZero)))));
      } else {
        t = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(m, _mm512_cvtepi32_ps(osum)));
      }
      float* o = out + row * n + n0;
      _mm512_storeu_ps(o, _mm512_fmadd_ps(t, _mm512_set1_ps(a.scale[row * blocks + first]), _mm512_loadu_ps(o)));
    }
  }
}

template <class F>
constexpr int kRowChunkOf = 8;

#elif SPECDEC_QGEMM_AVX2
inline __m256i broadcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
// An empty asm the compiler cannot see through: a running sum is formed step by step where it is
// written, in a register. Without it GCC reassociates a block's sums into one chain at the block's
// end, which keeps every product live at once and spills them to the stack.
inline void pin(__m256i& sum) { asm("" : "+x"(sum)); }
// Per 32-bit lane: 4 products u8 * s8, the two pairs' sums each times the lane's int16 `weight`, summed.
inline __m256i dot4(__m256i w, __m256i x, __m256i weight) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), weight);
}
inline __m256i int8_to_epi32(const uint8_t* p) {  // 8 int8 -> 8 int32
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 half_to_ps(const uint8_t* p) {  // 8 float16 -> 8 float
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A tile's 16 outputs are two sides of 8 (a 256-bit register each). A pass over a block takes both
// sides where the running sums fit the registers: each broadcast activation word then serves both,
// and the tile's bytes are read once, in order (docs/bench/avx2-quantize-sides: layers over 1–4
// rows 10–29% faster, with the vector row quantization). That is chunks of up to 4 rows; the per-block 4-bit formats (Q4_0, Q4_1: one sum per row
// and side, the float steps every block) take all rows so, in chunks of 4; the others take larger
// chunks (8 rows) one side at a time (8–21% faster than chunks of 4 at 5–16 rows,
// docs/bench/kernel-pins). Either way every output's integers and float steps are the same.
template <class F>
constexpr bool kBothSidesAlways = F::kBits == 4 && F::kHalves == 1 && !F::kSuper;
template <class F, int R>
constexpr int kSidesAtOnce = kBothSidesAlways<F> || R <= 4 ? 2 : 1;
template <class F>
constexpr int kRowChunkOf = kBothSidesAlways<F> ? 4 : 8;

// As the AVX-512 version, for the outputs of S sides from `side0` (8 side .. 8 side + 7 of the tile),
// each half block's dot times an int16 weight per output (`weight0[s]`, `weight1[s]`: 1, or a K-quant
// group's scale code, so that dot0 = sc * I, exact in int32, in the widening step itself). Pairs of
// u8 * s8 products stay within int16: codes are at most 63, and 8-bit codes are split into two nibbles.
template <class F, int R, bool kSplit, int S>
inline void block_dots(const uint8_t* blk, int side0, const int8_t* x0, const __m256i* weight0, const __m256i* weight1,
                       __m256i (*dot0)[R], __m256i (*dot1)[R]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
  const auto codes_at = [&](int64_t offset, int s) {  // 32 bytes of side side0 + s
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + offset + (side0 + s) * 32));
  };
  SPECDEC_UNROLL
  for (int s = 0; s < S; ++s) {
    SPECDEC_UNROLL
    for (int r = 0; r < R; ++r) dot0[s][r] = dot1[s][r] = _mm256_setzero_si256();
  }
  const auto accumulate = [&](int s, int r, bool second, __m256i products) {
    __m256i& sum = kSplit && second ? dot1[s][r] : dot0[s][r];
    sum = _mm256_add_epi32(sum, products);
    pin(sum);
  };
  const auto nibbles = [&](int64_t offset, __m256i* lo, __m256i* hi) {  // each side's 32 bytes at offset, split
    SPECDEC_UNROLL
    for (int s = 0; s < S; ++s) {
      const __m256i raw = codes_at(offset, s);
      lo[s] = _mm256_and_si256(raw, low4);
      hi[s] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    }
  };
  if constexpr (F::kBits == 8) {  // u = 16 h + l: two products of codes <= 15 (maddubs would saturate at 255)
    for (int g = 0; g < 8; ++g) {
      __m256i lo[S], hi[S];
      nibbles(g * 64, lo, hi);
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) {
        const __m256i x = broadcast4(x0 + r * kBlock + 4 * g);
        SPECDEC_UNROLL
        for (int s = 0; s < S; ++s) {
          const __m256i weight = g >= 4 ? weight1[s] : weight0[s];
          accumulate(s, r, g >= 4, _mm256_add_epi32(_mm256_slli_epi32(dot4(hi[s], x, weight), 4), dot4(lo[s], x, weight)));
        }
      }
    }
    return;
  }
  [[maybe_unused]] __m256i planes[S][2];
  if constexpr (F::kBits == 6) {
    SPECDEC_UNROLL
    for (int s = 0; s < S; ++s) {
      planes[s][0] = codes_at(256, s);
      planes[s][1] = codes_at(320, s);
    }
  }
  // 4-bit codes (u <= 15): a pair of products is at most 2 * 15 * 127 = 3810 in magnitude, so the 8
  // pairs of a lane over the block (4 chunks, low and high) sum exactly in int16 (<= 30480) and are
  // widened once per half block (`pending`); 6-bit codes (u <= 63, a pair <= 16002) sum two pairs in
  // int16 where both go to the same half block (not kSplit), and are widened per chunk otherwise.
  constexpr bool kNarrowSum = F::kBits == 4;
  [[maybe_unused]] __m256i pending0[S][R], pending1[S][R];
  if constexpr (kNarrowSum) {
    SPECDEC_UNROLL
    for (int s = 0; s < S; ++s) {
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) pending0[s][r] = pending1[s][r] = _mm256_setzero_si256();
    }
  }
  SPECDEC_UNROLL
  for (int j = 0; j < 4; ++j) {
    __m256i lo[S], hi[S];
    nibbles(j * 64, lo, hi);
    if constexpr (F::kBits == 6) {
      SPECDEC_UNROLL
      for (int s = 0; s < S; ++s) {
        const __m256i high = j % 2 ? _mm256_srli_epi16(planes[s][j / 2], 4) : planes[s][j / 2];
        lo[s] = _mm256_or_si256(lo[s], _mm256_and_si256(_mm256_slli_epi16(high, 4), top2));
        hi[s] = _mm256_or_si256(hi[s], _mm256_and_si256(_mm256_slli_epi16(high, 2), top2));
      }
    }
    SPECDEC_UNROLL
    for (int r = 0; r < R; ++r) {
      const __m256i x_low = broadcast4(x0 + r * kBlock + 4 * j), x_high = broadcast4(x0 + r * kBlock + 16 + 4 * j);
      SPECDEC_UNROLL
      for (int s = 0; s < S; ++s) {
        const __m256i low_pairs = _mm256_maddubs_epi16(lo[s], x_low);
        const __m256i high_pairs = _mm256_maddubs_epi16(hi[s], x_high);
        if constexpr (kNarrowSum && kSplit) {
          pending0[s][r] = _mm256_add_epi16(pending0[s][r], low_pairs);
          pending1[s][r] = _mm256_add_epi16(pending1[s][r], high_pairs);
          pin(pending0[s][r]);
          pin(pending1[s][r]);
        } else if constexpr (kNarrowSum) {
          pending0[s][r] = _mm256_add_epi16(pending0[s][r], _mm256_add_epi16(low_pairs, high_pairs));
          pin(pending0[s][r]);
        } else if constexpr (!kSplit) {
          accumulate(s, r, false, _mm256_madd_epi16(_mm256_add_epi16(low_pairs, high_pairs), weight0[s]));
        } else {
          accumulate(s, r, false, _mm256_madd_epi16(low_pairs, weight0[s]));
          accumulate(s, r, true, _mm256_madd_epi16(high_pairs, weight1[s]));
        }
      }
    }
  }
  if constexpr (kNarrowSum) {
    SPECDEC_UNROLL
    for (int s = 0; s < S; ++s) {
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) {
        dot0[s][r] = _mm256_madd_epi16(pending0[s][r], weight0[s]);
        if constexpr (kSplit) dot1[s][r] = _mm256_madd_epi16(pending1[s][r], weight1[s]);
      }
    }
  }
}

template <class F, int R>
void block_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t row0, float* out,
                int64_t n, int64_t n0, const uint8_t* ahead) {
  constexpr int S = kSidesAtOnce<F, R>;
  __m256i ones[S];
  SPECDEC_UNROLL
  for (int s = 0; s < S; ++s) ones[s] = _mm256_set1_epi16(1);
  for (int side0 = 0; side0 < 2; side0 += S) {  // outputs n0 + 8 * side0 .. + 8 S
    __m256 acc[S][R];
    SPECDEC_UNROLL
    for (int s = 0; s < S; ++s) {
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) acc[s][r] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = block_of<F>(tile, b);
      if (ahead != nullptr && row0 == 0 && side0 == 0) prefetch_unit(block_of<F>(ahead, b), F::kBlockBytes);
      __m256i dot[S][R], unused[S][R];
      block_dots<F, R, false, S>(blk, side0, a.codes(b, row0), ones, ones, dot, unused);
      __m256 scale[S];
      [[maybe_unused]] __m256 offset[S];
      SPECDEC_UNROLL
      for (int s = 0; s < S; ++s) {
        scale[s] = half_to_ps(blk + F::kCodeBytes + 16 * (side0 + s));
        if constexpr (!F::kSym) offset[s] = half_to_ps(blk + F::kCodeBytes + 32 + 16 * (side0 + s));
      }
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) {
        const int64_t at = (row0 + r) * blocks + b;
        SPECDEC_UNROLL
        for (int s = 0; s < S; ++s) {
          __m256 t;
          if constexpr (F::kSym) {
            const __m256i zero = _mm256_set1_epi32(F::kZero * static_cast<int32_t>(a.sum16[at]));
            t = _mm256_mul_ps(scale[s], _mm256_cvtepi32_ps(_mm256_sub_epi32(dot[s][r], zero)));
          } else {
            t = _mm256_fmadd_ps(scale[s], _mm256_cvtepi32_ps(dot[s][r]), _mm256_mul_ps(offset[s], _mm256_set1_ps(a.sum[at])));
          }
          acc[s][r] = _mm256_fmadd_ps(t, _mm256_set1_ps(a.scale[at]), acc[s][r]);
        }
      }
    }
    SPECDEC_UNROLL
    for (int s = 0; s < S; ++s) {
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + (row0 + r) * n + n0 + 8 * (side0 + s), acc[s][r]);
    }
  }
}

// Per 32-bit lane, int32 codes (|v| < 2^15) low and high -> the int16 pair (low, high) for `madd`.
inline __m256i int16_pairs(__m256i low, __m256i high) {
  return _mm256_or_si256(_mm256_and_si256(low, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(high, 16));
}

template <class F>
inline void group_codes(const uint8_t* header, const uint8_t* blk, int64_t b, int side, __m256i* sc, __m256i* mn) {
  if constexpr (F::kHeaderScales) {
    __m128i sc8, mn8;
    header_scales(header, b, 8 * side, sc8, mn8);
    sc[0] = sc[1] = _mm256_cvtepu8_epi32(sc8);
    mn[0] = mn[1] = _mm256_cvtepu8_epi32(mn8);
  } else {
    const uint8_t* params = blk + F::kCodeBytes;
    constexpr int kGroupBytes = F::kSym ? 16 : 32;
    for (int h = 0; h < F::kHalves; ++h) {
      sc[h] = int8_to_epi32(params + kGroupBytes * h + 8 * side);
      mn[h] = F::kSym ? sc[h] : int8_to_epi32(params + kGroupBytes * h + 16 + 8 * side);
    }
  }
}

template <class F, int R>
void super_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t row0, float* out,
                int64_t n, int64_t n0, const uint8_t* ahead) {
  constexpr int S = kSidesAtOnce<F, R>;
  constexpr bool kSplit = F::kHalves == 2;
  constexpr int kPairs = specdec::kSuperBlocks * F::kHalves / 2;
  const int16_t* group_sums = kSplit ? a.half.data() : a.sum16.data();
  const int64_t groups = blocks * F::kHalves;
  for (int side0 = 0; side0 < 2; side0 += S) {
    __m256 acc[S][R];
    SPECDEC_UNROLL
    for (int s = 0; s < S; ++s) {
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) acc[s][r] = _mm256_setzero_ps();
    }
    for (int64_t first = 0; first < blocks; first += specdec::kSuperBlocks) {
      const uint8_t* header = header_at<F>(tile, first);
      if (ahead != nullptr && row0 == 0 && side0 == 0) prefetch_unit(header_at<F>(ahead, first), F::kHeaderBytes);
      __m256i isum[S][R];
      SPECDEC_UNROLL
      for (int s = 0; s < S; ++s) {
        SPECDEC_UNROLL
        for (int r = 0; r < R; ++r) isum[s][r] = _mm256_setzero_si256();
      }
      __m256i pairs[S][kPairs];
      __m256i even[S];
      for (int64_t b = first; b < first + specdec::kSuperBlocks; ++b) {
        const uint8_t* blk = block_of<F>(tile, b);
        if (ahead != nullptr && row0 == 0 && side0 == 0) prefetch_unit(block_of<F>(ahead, b), F::kBlockBytes);
        __m256i sc[S][2], mn[S][2], weight0[S], weight1[S];
        SPECDEC_UNROLL
        for (int s = 0; s < S; ++s) {
          group_codes<F>(header, blk, b, side0 + s, sc[s], mn[s]);
          weight0[s] = int16_pairs(sc[s][0], sc[s][0]);
          weight1[s] = int16_pairs(sc[s][1], sc[s][1]);
        }
        __m256i dot0[S][R], dot1[S][R];  // sc * I of the block's groups
        block_dots<F, R, kSplit, S>(blk, side0, a.codes(b, row0), weight0, weight1, dot0, dot1);
        const int64_t i = b - first;
        SPECDEC_UNROLL
        for (int s = 0; s < S; ++s) {
          SPECDEC_UNROLL
          for (int r = 0; r < R; ++r) {
            isum[s][r] = _mm256_add_epi32(isum[s][r], dot0[s][r]);
            if constexpr (kSplit) isum[s][r] = _mm256_add_epi32(isum[s][r], dot1[s][r]);
          }
          if constexpr (kSplit) pairs[s][i] = int16_pairs(mn[s][0], mn[s][1]);
          else if (i % 2 == 0) even[s] = mn[s][0];
          else pairs[s][i / 2] = int16_pairs(even[s], mn[s][0]);
        }
      }
      __m256 d[S];
      [[maybe_unused]] __m256 m[S];
      SPECDEC_UNROLL
      for (int s = 0; s < S; ++s) {
        d[s] = half_to_ps(header + 16 * (side0 + s));
        if constexpr (!F::kSym) m[s] = half_to_ps(header + 32 + 16 * (side0 + s));
      }
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) {
        const int64_t row = row0 + r;
        const int16_t* x_pairs = group_sums + row * groups + first * F::kHalves;
        SPECDEC_UNROLL
        for (int s = 0; s < S; ++s) {
          __m256i osum = _mm256_setzero_si256();
          SPECDEC_UNROLL
          for (int p = 0; p < kPairs; ++p) osum = _mm256_add_epi32(osum, _mm256_madd_epi16(pairs[s][p], broadcast4(x_pairs + 2 * p)));
          __m256 t;
          if constexpr (F::kSym) {
            t = _mm256_mul_ps(d[s], _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[s][r], _mm256_mullo_epi32(osum, _mm256_set1_epi32(F::kZero)))));
          } else {
            t = _mm256_fmadd_ps(d[s], _mm256_cvtepi32_ps(isum[s][r]), _mm256_mul_ps(m[s], _mm256_cvtepi32_ps(osum)));
          }
          acc[s][r] = _mm256_fmadd_ps(t, _mm256_set1_ps(a.scale[row * blocks + first]), acc[s][r]);
        }
      }
    }
    SPECDEC_UNROLL
    for (int s = 0; s < S; ++s) {
      SPECDEC_UNROLL
      for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + (row0 + r) * n + n0 + 8 * (side0 + s), acc[s][r]);
    }
  }
}


#else
// The portable path: the same recipes one output at a time.
template <class F>
inline void scalar_block_dots(const uint8_t* blk, int lane, const int8_t* xb, int32_t dot[2]) {
  dot[0] = dot[1] = 0;
  for (int i = 0; i < kBlock; ++i) dot[i / 16] += specdec::affine_code<F::kBits>(blk, lane, i) * xb[i];
}

template <class F, int R>
void block_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t row0, float* out,
                int64_t n, int64_t n0, const uint8_t* ahead) {
  (void)ahead;  // no prefetching in the portable path
  for (int r = 0; r < R; ++r)
    for (int lane = 0; lane < kTile; ++lane) {
      float acc = 0.f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = block_of<F>(tile, b);
        int32_t dot[2];
        scalar_block_dots<F>(blk, lane, a.codes(b, row0 + r), dot);
        float s[2], c[2];
        specdec::affine_params<F>(tile, b, lane, s, c);
        const int64_t at = (row0 + r) * blocks + b;
        float t;
        if constexpr (F::kSym) t = s[0] * static_cast<float>(dot[0] + dot[1] - F::kZero * static_cast<int32_t>(a.sum16[at]));
        else t = std::fma(s[0], static_cast<float>(dot[0] + dot[1]), c[0] * a.sum[at]);
        acc = std::fma(t, a.scale[at], acc);
      }
      out[(row0 + r) * n + n0 + lane] = acc;
    }
}

template <class F, int R>
void super_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t row0, float* out,
                int64_t n, int64_t n0, const uint8_t* ahead) {
  (void)ahead;
  for (int r = 0; r < R; ++r)
    for (int lane = 0; lane < kTile; ++lane) {
      const int64_t row = row0 + r;
      float acc = 0.f;
      for (int64_t first = 0; first < blocks; first += specdec::kSuperBlocks) {
        int32_t isum = 0, osum = 0;
        float d = 0.f, m = 0.f;
        for (int64_t b = first; b < first + specdec::kSuperBlocks; ++b) {
          int32_t dot[2];
          scalar_block_dots<F>(block_of<F>(tile, b), lane, a.codes(b, row), dot);
          int sc[2], mn[2];
          specdec::super_params<F>(tile, b, lane, sc, mn, d, m);
          const int* offsets = F::kSym ? sc : mn;  // symmetric: sum of sc * X, taken Z times
          if constexpr (F::kHalves == 2) {
            isum += dot[0] * sc[0] + dot[1] * sc[1];
            osum += offsets[0] * a.half[(row * blocks + b) * 2] + offsets[1] * a.half[(row * blocks + b) * 2 + 1];
          } else {
            isum += (dot[0] + dot[1]) * sc[0];
            osum += offsets[0] * a.sum16[row * blocks + b];
          }
        }
        const float t = F::kSym ? d * static_cast<float>(isum - F::kZero * osum)
                                : std::fma(d, static_cast<float>(isum), m * static_cast<float>(osum));
        acc = std::fma(t, a.scale[row * blocks + first], acc);
      }
      out[row * n + n0 + lane] = acc;
    }
}

template <class F>
constexpr int kRowChunkOf = 1;
#endif

// Rows [row0, row0 + size) against one tile, 1 <= size <= R: the kernel unrolled for that many rows.
template <class F, int R>
void tile_rows(int size, const uint8_t* tile, int64_t blocks, const Activations& a, int64_t row0, float* out,
               int64_t n, int64_t n0, const uint8_t* ahead) {
  if (size == R) {
    if constexpr (F::kSuper) super_rows<F, R>(tile, blocks, a, row0, out, n, n0, ahead);
    else block_rows<F, R>(tile, blocks, a, row0, out, n, n0, ahead);
  } else if constexpr (R > 1) {
    tile_rows<F, R - 1>(size, tile, blocks, a, row0, out, n, n0, ahead);
  }
}

// All rows against one tile, in as few chunks of at most kRowChunkOf<F> rows as there can be, their sizes
// within one of each other (12 rows: 6 + 6, not 8 + 4; 3 rows: one chunk, not 2 + 1: a chunk unpacks
// the tile's weights once for its rows, and a small one pays for it with fewer rows). The per-row
// arithmetic is the same in every chunk.
template <class F>
void tile_all_rows(const uint8_t* tile, int64_t blocks, const Activations& a, int64_t rows, float* out, int64_t n,
                   int64_t n0, const uint8_t* ahead) {
  constexpr int kRowChunk = kRowChunkOf<F>;
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  int64_t row0 = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int size = static_cast<int>(rows / chunks + (c < rows % chunks));
    tile_rows<F, kRowChunk>(size, tile, blocks, a, row0, out, n, n0, ahead);
    row0 += size;
  }
}

// Outputs [col0, col0 + 16 tiles) of out [rows, n].
template <class F>
void multiply_all(const Activations& a, const uint8_t* pw, int64_t rows, int64_t tiles, int64_t blocks,
                  int64_t tile_bytes, float* po, int64_t n, int64_t col0) {
  constexpr int64_t kPrefetchTiles = 2;  // how far ahead the weights are fetched (measured best here)
  // a tile's work: its weight bytes, once per row
  at::parallel_for(0, tiles, specdec::grain_for(tile_bytes * rows), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const uint8_t* tile = pw + t * tile_bytes;
      const uint8_t* ahead = t + kPrefetchTiles < end ? tile + kPrefetchTiles * tile_bytes : nullptr;
      tile_all_rows<F>(tile, blocks, a, rows, po, n, col0 + t * kTile, ahead);
    }
  });
}

}  // namespace

// x: [M, K] float32; parts: packed weights [N_i/16, units, unit bytes] uint8 (see the header), each in
// its own format, stacked along the outputs (empty tensors are skipped) -> [M, sum N_i] float32. The
// rows are quantized once per kind of activation scale the parts take (Q8_K, Q8_0).
torch::Tensor quant_linear(torch::Tensor x, const std::vector<torch::Tensor>& parts) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.dim() == 2, "quant_linear wants float32 rows [M, K]");
  x = x.contiguous();
  const int64_t rows = x.size(0), k = x.size(1);
  int64_t n = 0;
  for (const torch::Tensor& part : parts) {
    if (!part.defined() || part.numel() == 0) continue;
    const specdec::Format format = specdec::format_of(part);
    TORCH_CHECK(part.size(1) * specdec::blocks_per_unit(format) * kBlock == k,
                "quant_linear: input size does not match the packing");
    n += part.size(0) * kTile;
  }
  TORCH_CHECK(n > 0, "quant_linear: no weights");
  auto out = torch::empty({rows, n}, x.options());
  if (rows == 0) return out;
  Activations per_block, per_super;  // quantized when a part needs them
  bool have_block = false, have_super = false;
  float* po = out.data_ptr<float>();
  int64_t col0 = 0;
  for (const torch::Tensor& part : parts) {
    if (!part.defined() || part.numel() == 0) continue;
    const specdec::Format format = specdec::format_of(part);
    const bool super = specdec::is_super(format);
    bool& have = super ? have_super : have_block;
    Activations& a = super ? per_super : per_block;
    if (!have) a = quantize_rows(x.data_ptr<float>(), rows, k, super);
    have = true;
    const int64_t tiles = part.size(0), blocks = part.size(1) * specdec::blocks_per_unit(format);
    const int64_t tile_bytes = part.size(1) * part.size(2);
    const uint8_t* pw = part.data_ptr<uint8_t>();
    specdec::dispatch_format(format, [&](auto tag) {
      using F = typename decltype(tag)::type;
      multiply_all<F>(a, pw, rows, tiles, blocks, tile_bytes, po, n, col0);
    });
    col0 += tiles * kTile;
  }
  return out;
}

// codes: [N, K] uint8 (4-bit, values 0..15) or int8 (8-bit); scales: [N, K/32] and, for 4-bit,
// offsets: [N, K/32], float32 holding float16 values -> the per-block 4-bit or the Q8_0 layout.
torch::Tensor pack_quant_weights(torch::Tensor codes, torch::Tensor scales, c10::optional<torch::Tensor> offsets) {
  const bool four = codes.dtype() == torch::kUInt8;
  TORCH_CHECK((four || codes.dtype() == torch::kInt8) && codes.dim() == 2, "pack: codes [N, K] uint8 or int8");
  TORCH_CHECK(four == offsets.has_value(), "pack: 4-bit codes take offsets, 8-bit codes none");
  codes = codes.contiguous();
  const int64_t n = codes.size(0), k = codes.size(1);
  TORCH_CHECK(n % kTile == 0 && k % kBlock == 0, "pack: N must be a multiple of 16 and K of 32");
  const int64_t blocks = k / kBlock;
  auto s16 = scales.to(torch::kHalf).contiguous();
  auto c16 = four ? offsets->to(torch::kHalf).contiguous() : s16;
  const uint8_t* pc = reinterpret_cast<const uint8_t*>(codes.data_ptr());
  const c10::Half* ps = s16.data_ptr<c10::Half>();
  const c10::Half* pm = c16.data_ptr<c10::Half>();
  specdec::RowSource source = [&](int64_t row, specdec::DecodedRow& out) {
    for (int64_t i = 0; i < k; ++i) out.codes[i] = pc[row * k + i];
    for (int64_t b = 0; b < blocks; ++b) {
      out.scale[b] = ps[row * blocks + b];
      out.offset[b] = pm[row * blocks + b];
    }
  };
  return specdec::pack_rows(four ? specdec::Format::kBlock4 : specdec::Format::kQ8, n, k, source);
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
