// The packed weight formats of quant_gemm.cpp (its header describes the layout), what reads and
// writes them one output at a time, and the format of a packed tensor from its shape. Shared by the
// kernels (quant_gemm.cpp) and the packers (gguf_pack.cpp).
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <cstdint>
#include <atomic>
#include <cstring>
#include <functional>
#include <type_traits>
#include <vector>

namespace specdec {

constexpr int kTile = 16;   // outputs per tile
constexpr int kBlock = 32;  // inputs per block
constexpr int kSuperBlocks = 8;  // blocks per super-block (256 inputs, as K-quants)

// Format ids, stored in each packed tensor's header (gguf_pack.cpp's kTypes names the GGUF type of each,
// `packed_gguf_types()` lists them for Python): one per GGUF type, each the type's own
// numbers (codes, scales, offsets where the type has them).
enum class Format : int {
  kBlock4 = 0,        // 4-bit codes, float16 scale and offset per block (Q4_1)
  kBlock6 = 1,        // 6-bit codes, float16 scale and offset per block (Q5_1)
  kSuper4G32 = 2,     // 4-bit codes, super-block d and m, 6-bit sc and mn per 32 in the header (Q4_K)
  kSuper4G16 = 3,     // 4-bit codes, super-block d and m, int8 sc and mn per 16 in each block (Q2_K)
  kSuper6G32 = 4,     // 6-bit codes, as Q4_K's (Q5_K)
  kSuper6G16Sym = 5,  // 6-bit codes q + 32, super-block d, int8 sc per 16 (Q6_K)
  kQ8 = 6,            // 8-bit codes q + 128, float16 scale per block (Q8_0)
  kSuper4G16Sym = 7,  // 4-bit codes q + 8, super-block d, int8 sc per 16 (Q3_K)
  kSym4 = 8,          // 4-bit codes q + 8, float16 scale per block (Q4_0)
  kSym6 = 9,          // 6-bit codes q + 32, float16 scale per block (Q5_0)
};
constexpr int kLastFormat = 9;

// SYM: no stored offset; the codes are q + Z (Z = 2^(BITS-1)) and w = s (u - Z).
template <int BITS, int GROUP, bool SUPER, bool SYM = false>
struct Affine {
  static_assert(BITS == 4 || BITS == 6 || (BITS == 8 && !SUPER), "affine codes are 4 or 6 bits (8: per block)");
  static constexpr int kBits = BITS;
  static constexpr int kHalves = 32 / GROUP;  // scale groups per block
  static constexpr bool kSuper = SUPER;
  static constexpr bool kSym = SYM;
  static constexpr int kZero = SYM ? 1 << (BITS - 1) : 0;
  static constexpr int64_t kCodeBytes = BITS == 4 ? 256 : BITS == 6 ? 384 : 512;  // 6-bit: nibbles, then 2-bit planes
  // Super-blocks with a group per block (Q4_K, Q5_K) keep their 6-bit sc and mn in the header
  // (`header_scale_min`), as the file does: the header is 256 bytes and every block 64-byte aligned.
  static constexpr bool kHeaderScales = SUPER && !SYM && GROUP == 32;
  // per block: 16 float16 scales (and 16 offsets), or per group 16 int8 sc (and 16 int8 mn)
  static constexpr int64_t kParamBytes = kHeaderScales ? 0 : SUPER ? (SYM ? 16 : 32) * kHalves : SYM ? 32 : 64;
  static constexpr int64_t kBlockBytes = kCodeBytes + kParamBytes;
  // 16 float16 d (and 16 m; and the 6-bit sc and mn of the 8 blocks: 128 bytes of low nibbles, 64 of high bits)
  static constexpr int64_t kHeaderBytes = kHeaderScales ? 256 : SUPER ? (SYM ? 32 : 64) : 0;
  static constexpr int64_t kUnitBytes = SUPER ? kHeaderBytes + kSuperBlocks * kBlockBytes : kBlockBytes;
};
using Block4 = Affine<4, 32, false>;
using Block6 = Affine<6, 32, false>;
using Sym4 = Affine<4, 32, false, true>;
using Sym6 = Affine<6, 32, false, true>;
using Sym8 = Affine<8, 32, false, true>;
using Super4G32 = Affine<4, 32, true>;
using Super4G16 = Affine<4, 16, true>;
using Super6G32 = Affine<6, 32, true>;
using Super4G16Sym = Affine<4, 16, true, true>;
using Super6G16Sym = Affine<6, 16, true, true>;

template <class T>
struct Tag {
  using type = T;
};

// f(Tag<F>{}) with F the format's Affine type.
template <class Fn>
void dispatch_format(Format format, Fn&& f) {
  switch (format) {
    case Format::kBlock4: f(Tag<Block4>{}); break;
    case Format::kBlock6: f(Tag<Block6>{}); break;
    case Format::kSuper4G32: f(Tag<Super4G32>{}); break;
    case Format::kSuper4G16: f(Tag<Super4G16>{}); break;
    case Format::kSuper6G32: f(Tag<Super6G32>{}); break;
    case Format::kSuper6G16Sym: f(Tag<Super6G16Sym>{}); break;
    case Format::kQ8: f(Tag<Sym8>{}); break;
    case Format::kSuper4G16Sym: f(Tag<Super4G16Sym>{}); break;
    case Format::kSym4: f(Tag<Sym4>{}); break;
    case Format::kSym6: f(Tag<Sym6>{}); break;
  }
}

inline int64_t unit_bytes(Format format) {
  int64_t bytes = 0;
  dispatch_format(format, [&](auto tag) { bytes = decltype(tag)::type::kUnitBytes; });
  return bytes;
}

inline bool is_super(Format format) {
  bool super = false;
  dispatch_format(format, [&](auto tag) { super = decltype(tag)::type::kSuper; });
  return super;
}

inline int64_t blocks_per_unit(Format format) { return is_super(format) ? kSuperBlocks : 1; }

// The format of a packed tensor [N/16, units, unit bytes]: the unit size names it.
inline Format format_of(const torch::Tensor& packed) {
  TORCH_CHECK(packed.dtype() == torch::kUInt8 && packed.dim() == 3 && packed.is_contiguous(), "quant_linear: bad packing");
  for (int id = 0; id <= kLastFormat; ++id)
    if (unit_bytes(static_cast<Format>(id)) == packed.size(2)) return static_cast<Format>(id);
  TORCH_CHECK(false, "quant_linear: bad packing (unit of ", packed.size(2), " bytes)");
}

template <class F>
inline const uint8_t* block_of(const uint8_t* tile, int64_t b) {
  if constexpr (F::kSuper) return tile + (b / kSuperBlocks) * F::kUnitBytes + F::kHeaderBytes + (b % kSuperBlocks) * F::kBlockBytes;
  else return tile + b * F::kBlockBytes;
}

// Code of output `lane`, input i (0..31) of a block.
// 6-bit codes: the low 4 bits as 4-bit codes, then two 64-byte planes of the high 2 bits: plane p's
// byte at 4 lane + i holds, from bit 0, inputs 4j + i and 16 + 4j + i of j = 2p, then of j = 2p + 1.
// 8-bit codes: 8 chunks, chunk g holding inputs 4g .. 4g+3.
template <int BITS>
inline int affine_code(const uint8_t* blk, int lane, int i) {
  if constexpr (BITS == 8) return blk[(i / 4) * 64 + lane * 4 + i % 4];
  const int j = (i % 16) / 4;
  const int byte = blk[j * 64 + lane * 4 + i % 4];
  const int low = i < 16 ? byte & 0x0F : byte >> 4;
  if constexpr (BITS == 4) {
    return low;
  } else {
    const int shift = 4 * (j % 2) + (i < 16 ? 0 : 2);
    return low | (((blk[256 + (j / 2) * 64 + lane * 4 + i % 4] >> shift) & 3) << 4);
  }
}

// Header scales (kHeaderScales): block j's sc of the 16 outputs are the low nibbles of the 16 bytes
// at 64 + 16 j, its mn their high nibbles; the high 2 bits of both lie in the 16 bytes at
// 192 + 16 (j / 2), from bit 4 (j % 2): sc's, then mn's.
constexpr int kScaleNibbles = 64, kScaleHighBits = 192;
inline void header_scale_min(const uint8_t* header, int64_t b, int lane, int& sc, int& mn) {
  const int j = static_cast<int>(b % kSuperBlocks), shift = 4 * (j % 2);
  const int low = header[kScaleNibbles + 16 * j + lane], high = header[kScaleHighBits + 16 * (j / 2) + lane] >> shift;
  sc = (low & 15) | ((high & 3) << 4);
  mn = (low >> 4) | (((high >> 2) & 3) << 4);
}

// Super-block formats: output `lane`'s integer scale codes sc and offset codes mn of block b's groups
// h = 0, 1 (with one group per block both entries are that group's; symmetric formats: mn = 0), and
// the super-block's d and m (symmetric: m = 0): s = d * sc, c = m * mn.
template <class F>
inline void super_params(const uint8_t* tile, int64_t b, int lane, int* sc, int* mn, float& d, float& m) {
  static_assert(F::kSuper, "super_params reads super-block formats");
  const uint8_t* header = tile + (b / kSuperBlocks) * F::kUnitBytes;
  const c10::Half* scales = reinterpret_cast<const c10::Half*>(header);
  d = static_cast<float>(scales[lane]);
  m = F::kSym ? 0.f : static_cast<float>(scales[kTile + lane]);
  if constexpr (F::kHeaderScales) {
    header_scale_min(header, b, lane, sc[0], mn[0]);
    sc[1] = sc[0];
    mn[1] = mn[0];
  } else {
    const uint8_t* params = block_of<F>(tile, b) + F::kCodeBytes;
    constexpr int kGroupBytes = F::kSym ? 16 : 32;  // sc[16] (and mn[16]) per group
    for (int h = 0; h < 2; ++h) {
      const int g = F::kHalves == 2 ? h : 0;
      sc[h] = static_cast<int8_t>(params[kGroupBytes * g + lane]);
      mn[h] = F::kSym ? 0 : static_cast<int8_t>(params[kGroupBytes * g + 16 + lane]);
    }
  }
}

// Scales and offsets of output `lane` in block b (groups h = 0, 1; with one group per block both
// entries are that group's), exact in float32; symmetric formats' offsets are 0 (w = s (u - Z)).
template <class F>
inline void affine_params(const uint8_t* tile, int64_t b, int lane, float* s, float* c) {
  if constexpr (F::kSuper) {
    int sc[2], mn[2];
    float d, m;
    super_params<F>(tile, b, lane, sc, mn, d, m);
    for (int h = 0; h < 2; ++h) {
      s[h] = d * static_cast<float>(sc[h]);
      c[h] = F::kSym ? 0.f : m * static_cast<float>(mn[h]);
    }
  } else {
    const c10::Half* half = reinterpret_cast<const c10::Half*>(block_of<F>(tile, b) + F::kCodeBytes);
    s[0] = s[1] = static_cast<float>(half[lane]);
    c[0] = c[1] = F::kSym ? 0.f : static_cast<float>(half[kTile + lane]);
  }
}

// One output row in a format-neutral form, what a packer writes from.
struct DecodedRow {
  std::vector<uint8_t> codes;     // [K]: unsigned codes (symmetric formats: q + Z), or Q8_0's int8 codes as bytes
  std::vector<c10::Half> scale;   // [K/32] per-block scale (per-block formats)
  std::vector<c10::Half> offset;  // [K/32] per-block offset (per-block affine formats)
  std::vector<c10::Half> d, m;    // [K/256] super-block scales (super-block formats; m: affine ones)
  std::vector<int8_t> sc, mn;     // [K/16] group multipliers of d and m (super-block formats; mn: affine ones)
  explicit DecodedRow(int64_t k)
      : codes(k), scale(k / kBlock), offset(k / kBlock), d(k / 256 + 1), m(k / 256 + 1), sc(k / 16), mn(k / 16) {}
};
using RowSource = std::function<void(int64_t row, DecodedRow& out)>;

// Packs N rows of K inputs, each given by `source`, into `format`; tiles in parallel.
inline torch::Tensor pack_rows(Format format, int64_t n, int64_t k, const RowSource& source) {
  TORCH_CHECK(n % kTile == 0 && k % kBlock == 0, "pack: N must be a multiple of 16 and K of 32");
  const int64_t per_unit = blocks_per_unit(format) * kBlock;
  TORCH_CHECK(k % per_unit == 0, "pack: K must be a multiple of ", per_unit, " for this format");
  const int64_t tiles = n / kTile, units = k / per_unit, bytes = unit_bytes(format), blocks = k / kBlock;
  auto packed = torch::zeros({tiles, units, bytes}, torch::kUInt8);
  uint8_t* base = packed.data_ptr<uint8_t>();
  std::atomic<bool> uneven{false}, too_large{false};
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    std::vector<DecodedRow> rows(kTile, DecodedRow(k));
    for (int64_t t = begin; t < end; ++t) {
      for (int lane = 0; lane < kTile; ++lane) source(t * kTile + lane, rows[lane]);
      uint8_t* tile = base + t * units * bytes;
      dispatch_format(format, [&](auto tag) {
        using F = typename decltype(tag)::type;
        for (int64_t b = 0; b < blocks; ++b) {
          uint8_t* blk = const_cast<uint8_t*>(block_of<F>(tile, b));
          for (int lane = 0; lane < kTile; ++lane) {
            const DecodedRow& row = rows[lane];
            const uint8_t* q = row.codes.data() + b * kBlock;
            for (int i = 0; i < kBlock; ++i) {
              if constexpr (F::kBits == 8) {  // Q8_0's signed codes stored as q + 128
                blk[(i / 4) * 64 + lane * 4 + i % 4] = static_cast<uint8_t>(static_cast<int8_t>(q[i]) + 128);
                continue;
              }
              if (q[i] >= (1 << F::kBits)) too_large = true;
              const int j = (i % 16) / 4;
              blk[j * 64 + lane * 4 + i % 4] |= static_cast<uint8_t>(i < 16 ? q[i] & 0x0F : (q[i] & 0x0F) << 4);
              if constexpr (F::kBits == 6) {
                const int shift = 4 * (j % 2) + (i < 16 ? 0 : 2);
                blk[256 + (j / 2) * 64 + lane * 4 + i % 4] |= static_cast<uint8_t>(((q[i] >> 4) & 3) << shift);
              }
            }
            uint8_t* params = blk + F::kCodeBytes;
            if constexpr (F::kSuper) {
              if (b % kSuperBlocks == 0) {
                c10::Half* header = reinterpret_cast<c10::Half*>(tile + (b / kSuperBlocks) * F::kUnitBytes);
                header[lane] = row.d[b / kSuperBlocks];
                if constexpr (!F::kSym) header[kTile + lane] = row.m[b / kSuperBlocks];
              }
              if constexpr (F::kHeaderScales) {
                uint8_t* header = tile + (b / kSuperBlocks) * F::kUnitBytes;
                const int j = static_cast<int>(b % kSuperBlocks), shift = 4 * (j % 2);
                const int sc = row.sc[2 * b], mn = row.mn[2 * b];
                if (sc < 0 || sc > 63 || mn < 0 || mn > 63) too_large = true;
                header[kScaleNibbles + 16 * j + lane] = static_cast<uint8_t>((sc & 15) | ((mn & 15) << 4));
                header[kScaleHighBits + 16 * (j / 2) + lane] |= static_cast<uint8_t>((((sc >> 4) & 3) | (((mn >> 4) & 3) << 2)) << shift);
              }
              for (int g = 0; g < F::kHalves && !F::kHeaderScales; ++g) {
                if constexpr (F::kSym) {
                  params[16 * g + lane] = static_cast<uint8_t>(row.sc[2 * b + g]);
                } else {
                  params[32 * g + lane] = static_cast<uint8_t>(row.sc[2 * b + g]);
                  params[32 * g + 16 + lane] = static_cast<uint8_t>(row.mn[2 * b + g]);
                }
              }
              if (F::kHalves == 1 && (row.sc[2 * b] != row.sc[2 * b + 1] || row.mn[2 * b] != row.mn[2 * b + 1]))
                uneven = true;
            } else {
              reinterpret_cast<c10::Half*>(params)[lane] = row.scale[b];
              if constexpr (!F::kSym) reinterpret_cast<c10::Half*>(params)[kTile + lane] = row.offset[b];
            }
          }
        }
      });
    }
  });
  TORCH_CHECK(!too_large, "pack: a code exceeds the format's range (15 for 4-bit, 63 for 6-bit codes and K-quant scales)");
  TORCH_CHECK(!uneven, "pack: the weights have a scale per 16 inputs; this format holds one per 32");
  return packed;
}

}  // namespace specdec
