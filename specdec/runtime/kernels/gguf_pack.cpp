// GGUF's quantized blocks, read as they are stored, into the kernels' packed formats — exactly: the
// weights the kernel multiplies by are the file's (w = s * u + c, or s * (u - Z), with s and c exact
// in float32, see quant_gemm.cpp), and `dequantize_packed` gives them back as gguf's dequantization
// computes them.
//
// Block layouts follow ggml's (ggml-common.h): each decoder below turns one GGUF block of a row into
// its format's numbers in a DecodedRow (codes, and per-block or super-block scales). Each type has a
// format of its own (quant_formats.h), holding what the type stores and nothing more: symmetric types
// (Q4_0, Q5_0, Q3_K, Q6_K: w = d (q - Z)) keep no offset, the others their mins.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>
#include "kernels.h"
#include "quant_formats.h"

namespace {

using specdec::DecodedRow;
using specdec::Format;
using specdec::kBlock;

inline c10::Half half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::Half(bits, c10::Half::from_bits());
}

inline c10::Half negated_half_at(const uint8_t* p) {  // -x: the sign bit flipped, exact
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::Half(static_cast<uint16_t>(bits ^ 0x8000), c10::Half::from_bits());
}

// K-quants' 6-bit scale and min of sub-block j (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

struct GgufType {
  const char* name;
  int64_t block_inputs;  // inputs per GGUF block
  int64_t block_bytes;
  Format format;         // the packed format that holds it
  // decodes one GGUF block (of block_inputs inputs) at `src` into `row`, its first input at `at`
  void (*decode)(const uint8_t* src, int64_t at, DecodedRow& row);
};

void decode_q4_0(const uint8_t* s, int64_t at, DecodedRow& row) {  // u = q + 8, as stored
  for (int i = 0; i < 16; ++i) {
    row.codes[at + i] = s[2 + i] & 0x0F;
    row.codes[at + 16 + i] = s[2 + i] >> 4;
  }
  row.scale[at / kBlock] = half_at(s);
}

void decode_q4_1(const uint8_t* s, int64_t at, DecodedRow& row) {
  for (int i = 0; i < 16; ++i) {
    row.codes[at + i] = s[4 + i] & 0x0F;
    row.codes[at + 16 + i] = s[4 + i] >> 4;
  }
  row.scale[at / kBlock] = half_at(s);
  row.offset[at / kBlock] = half_at(s + 2);
}

// Q5_x's 5-bit codes (0..31) plus `shift`.
void five_bit_codes(const uint8_t* qh_bytes, const uint8_t* qs, int64_t at, DecodedRow& row, int shift) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    row.codes[at + j] = static_cast<uint8_t>(((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10)) + shift);
    row.codes[at + 16 + j] = static_cast<uint8_t>(((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10)) + shift);
  }
}

void decode_q5_0(const uint8_t* s, int64_t at, DecodedRow& row) {  // w = d (q5 - 16) = d (u - 32), u = q5 + 16
  five_bit_codes(s + 2, s + 6, at, row, 16);
  row.scale[at / kBlock] = half_at(s);
}

void decode_q5_1(const uint8_t* s, int64_t at, DecodedRow& row) {
  five_bit_codes(s + 4, s + 8, at, row, 0);
  row.scale[at / kBlock] = half_at(s);
  row.offset[at / kBlock] = half_at(s + 2);
}

void decode_q8_0(const uint8_t* s, int64_t at, DecodedRow& row) {
  std::memcpy(row.codes.data() + at, s + 2, 32);
  row.scale[at / kBlock] = half_at(s);
}

void decode_q2_k(const uint8_t* s, int64_t at, DecodedRow& row) {
  const uint8_t* scales = s;
  const uint8_t* qs = s + 16;
  for (int e = 0; e < 256; ++e) {
    const int c = e / 128, j = (e % 128) / 32, half = (e % 32) / 16, l = e % 16;
    row.codes[at + e] = (qs[c * 32 + half * 16 + l] >> (2 * j)) & 3;
  }
  for (int g = 0; g < 16; ++g) {
    row.sc[at / 16 + g] = static_cast<int8_t>(scales[g] & 0x0F);
    row.mn[at / 16 + g] = static_cast<int8_t>(scales[g] >> 4);
  }
  row.d[at / 256] = half_at(s + 80);
  row.m[at / 256] = negated_half_at(s + 82);
}

void decode_q3_k(const uint8_t* s, int64_t at, DecodedRow& row) {  // w = d sc q, q = low - 4 (1 - high); u = q + 8
  const uint8_t* hmask = s;
  const uint8_t* qs = s + 32;
  for (int e = 0; e < 256; ++e) {
    const int c = e / 128, j = (e % 128) / 32, half = (e % 32) / 16, l = e % 16;
    const int low = (qs[c * 32 + half * 16 + l] >> (2 * j)) & 3;
    const int high = (hmask[half * 16 + l] >> (c * 4 + j)) & 1;
    row.codes[at + e] = static_cast<uint8_t>(low + 4 * high + 4);
  }
  uint32_t aux[4];
  std::memcpy(aux, s + 96, 12);
  const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f, tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
  aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
  aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
  aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
  const uint8_t* six = reinterpret_cast<const uint8_t*>(aux);
  for (int g = 0; g < 16; ++g) row.sc[at / 16 + g] = static_cast<int8_t>(six[g] - 32);
  row.d[at / 256] = half_at(s + 108);
}

void k4_scales(const uint8_t* s, int64_t at, DecodedRow& row) {
  for (int j = 0; j < 8; ++j) {
    int scale, min;
    scale_min_k4(j, s + 4, scale, min);
    row.sc[at / 16 + 2 * j] = row.sc[at / 16 + 2 * j + 1] = static_cast<int8_t>(scale);
    row.mn[at / 16 + 2 * j] = row.mn[at / 16 + 2 * j + 1] = static_cast<int8_t>(min);
  }
  row.d[at / 256] = half_at(s);
  row.m[at / 256] = negated_half_at(s + 2);
}

void decode_q4_k(const uint8_t* s, int64_t at, DecodedRow& row) {
  const uint8_t* qs = s + 16;
  for (int b = 0; b < 8; ++b)
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = qs[(b / 2) * 32 + l];
      row.codes[at + b * 32 + l] = b % 2 ? byte >> 4 : byte & 0x0F;
    }
  k4_scales(s, at, row);
}

void decode_q5_k(const uint8_t* s, int64_t at, DecodedRow& row) {
  const uint8_t* qh = s + 16;
  const uint8_t* qs = s + 48;
  for (int b = 0; b < 8; ++b)
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = qs[(b / 2) * 32 + l];
      const int low = b % 2 ? byte >> 4 : byte & 0x0F;
      row.codes[at + b * 32 + l] = static_cast<uint8_t>(low + 16 * ((qh[l] >> b) & 1));
    }
  k4_scales(s, at, row);
}

void decode_q6_k(const uint8_t* s, int64_t at, DecodedRow& row) {  // w = d sc (u - 32), u as stored
  const uint8_t* ql = s;
  const uint8_t* qh = s + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(s + 192);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t byte = ql[n * 64 + (k % 2) * 32 + l];
    const int low = k < 2 ? byte & 0x0F : byte >> 4;
    const int high = (qh[n * 32 + l] >> (2 * k)) & 3;
    row.codes[at + e] = static_cast<uint8_t>(low | (high << 4));
  }
  for (int g = 0; g < 16; ++g) row.sc[at / 16 + g] = scales[g];
  row.d[at / 256] = half_at(s + 208);
}

const GgufType kTypes[] = {
    {"Q4_0", 32, 18, Format::kSym4, decode_q4_0},         {"Q4_1", 32, 20, Format::kBlock4, decode_q4_1},
    {"Q5_0", 32, 22, Format::kSym6, decode_q5_0},         {"Q5_1", 32, 24, Format::kBlock6, decode_q5_1},
    {"Q8_0", 32, 34, Format::kQ8, decode_q8_0},           {"Q2_K", 256, 84, Format::kSuper4G16, decode_q2_k},
    {"Q3_K", 256, 110, Format::kSuper4G16Sym, decode_q3_k}, {"Q4_K", 256, 144, Format::kSuper4G32, decode_q4_k},
    {"Q5_K", 256, 176, Format::kSuper6G32, decode_q5_k},  {"Q6_K", 256, 210, Format::kSuper6G16Sym, decode_q6_k},
};

const GgufType& gguf_type(const std::string& name) {
  for (const GgufType& type : kTypes)
    if (name == type.name) return type;
  TORCH_CHECK(false, "pack_gguf: no packing for GGUF type ", name);
}

}  // namespace

std::vector<std::string> packed_gguf_types() {
  std::vector<std::string> names;
  for (const GgufType& type : kTypes) names.emplace_back(type.name);
  return names;
}

// Packs tensors of one GGUF type stacked along their outputs (a fused q/k/v or gate/up, or one
// tensor) into that type's packed format (quant_formats.h). raws[i]: [rows_i, bytes per row] uint8,
// the GGUF tensor's blocks as stored; types[i]: its GGUF type name; orders[i]: [rows_i] int64, which
// stored row becomes output row r of the part (an un-permutation), or empty for the stored order.
torch::Tensor pack_gguf(const std::vector<torch::Tensor>& raws, const std::vector<std::string>& types,
                        const std::vector<torch::Tensor>& orders) {
  TORCH_CHECK(!raws.empty() && raws.size() == types.size() && raws.size() == orders.size(),
              "pack_gguf: one type and one order per tensor");
  const GgufType& type = gguf_type(types[0]);
  std::vector<int64_t> starts{0};
  std::vector<torch::Tensor> order_list;
  int64_t k = -1;
  for (size_t p = 0; p < raws.size(); ++p) {
    TORCH_CHECK(types[p] == types[0], "pack_gguf: the stacked tensors are of different types (", types[0], ", ",
                types[p], "); pack each type apart");
    TORCH_CHECK(raws[p].dtype() == torch::kUInt8 && raws[p].dim() == 2 && raws[p].is_contiguous(),
                "pack_gguf: raw blocks [rows, bytes] uint8, contiguous");
    TORCH_CHECK(raws[p].size(1) % type.block_bytes == 0, "pack_gguf: a row of ", types[p], " is whole blocks");
    const int64_t inputs = raws[p].size(1) / type.block_bytes * type.block_inputs;
    TORCH_CHECK(k < 0 || inputs == k, "pack_gguf: the fused tensors have different input sizes");
    k = inputs;
    const torch::Tensor order = orders[p].numel() ? orders[p].to(torch::kLong).contiguous() : orders[p];
    TORCH_CHECK(!order.numel() || order.numel() == raws[p].size(0), "pack_gguf: an order per row");
    order_list.push_back(order);
    starts.push_back(starts.back() + raws[p].size(0));
  }
  specdec::RowSource source = [&](int64_t row, DecodedRow& out) {
    size_t p = 0;
    while (row >= starts[p + 1]) ++p;
    int64_t stored = row - starts[p];
    if (order_list[p].numel()) stored = order_list[p].data_ptr<int64_t>()[stored];
    TORCH_CHECK(stored >= 0 && stored < raws[p].size(0), "pack_gguf: an order names a row that is not there");
    const uint8_t* src = raws[p].data_ptr<uint8_t>() + stored * raws[p].size(1);
    for (int64_t at = 0; at < k; at += type.block_inputs) type.decode(src + at / type.block_inputs * type.block_bytes, at, out);
  };
  return specdec::pack_rows(type.format, starts.back(), k, source);
}

// The weights of a packed tensor, rows `rows` ([R] int64; every output when empty), as float32
// [R, K]: w = s * u + c (or s * (u - Z)) computed exactly and rounded once — what gguf's dequantization
// computes from the same blocks. Also the embedding lookup of a quantized token table.
torch::Tensor dequantize_packed(torch::Tensor packed, torch::Tensor rows) {
  const Format format = specdec::format_of(packed);
  const int64_t n = packed.size(0) * specdec::kTile;
  const int64_t blocks = packed.size(1) * specdec::blocks_per_unit(format), k = blocks * kBlock;
  const int64_t tile_bytes = packed.size(1) * packed.size(2);
  rows = rows.numel() ? rows.to(torch::kLong).contiguous() : torch::arange(n, torch::kLong);
  const int64_t* index = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.numel(); ++i) TORCH_CHECK(index[i] >= 0 && index[i] < n, "dequantize_packed: row ", index[i], " is not there");
  auto out = torch::empty({rows.numel(), k}, torch::kFloat32);
  float* po = out.data_ptr<float>();
  const uint8_t* base = packed.data_ptr<uint8_t>();
  at::parallel_for(0, rows.numel(), 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t row = index[i];
      const int lane = static_cast<int>(row % specdec::kTile);
      const uint8_t* tile = base + (row / specdec::kTile) * tile_bytes;
      float* w = po + i * k;
      specdec::dispatch_format(format, [&](auto tag) {
        using F = typename decltype(tag)::type;
        for (int64_t b = 0; b < blocks; ++b) {
          const uint8_t* blk = specdec::block_of<F>(tile, b);
          float s[2], c[2];
          specdec::affine_params<F>(tile, b, lane, s, c);
          for (int j = 0; j < kBlock; ++j) {
            const int u = specdec::affine_code<F::kBits>(blk, lane, j) - F::kZero;
            w[b * kBlock + j] = static_cast<float>(static_cast<double>(s[j / 16]) * u + static_cast<double>(c[j / 16]));
          }
        }
      });
    }
  });
  return out;
}
