// What each kernel source defines for the others and for the bindings (invariant.cpp): one declaration
// each, so that the compiler checks every definition against it.
#pragma once

#include <torch/extension.h>
#include <string>
#include <vector>

// invariant.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor silu_mul(torch::Tensor gate_up);
torch::Tensor gelu_tanh_mul(torch::Tensor gate_up);
torch::Tensor attention_segments(torch::Tensor q, const std::vector<torch::Tensor>& keys,
                                 const std::vector<torch::Tensor>& values, int64_t layer,
                                 const std::vector<int64_t>& pasts, const std::vector<int64_t>& tokens,
                                 const std::vector<torch::Tensor>& tree_masks, int64_t window);
// quant_gemm.cpp
torch::Tensor quant_linear(torch::Tensor x, const std::vector<torch::Tensor>& parts);
torch::Tensor pack_quant_weights(torch::Tensor codes, torch::Tensor scales, c10::optional<torch::Tensor> offsets);
std::string quant_linear_path();
// gguf_pack.cpp
torch::Tensor pack_gguf(const std::vector<torch::Tensor>& raws, const std::vector<std::string>& types,
                        const std::vector<torch::Tensor>& orders);
torch::Tensor dequantize_packed(torch::Tensor packed, torch::Tensor rows);
std::vector<std::string> packed_gguf_types();  // the GGUF type names pack_gguf takes (runtime/quant.py's list)
// layer.cpp
std::vector<torch::Tensor> decoder_layers(torch::Tensor x, const std::vector<torch::Tensor>& layer_weights,
                                          int64_t num_layers, torch::Tensor cos, torch::Tensor sin,
                                          const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
                                          const std::vector<int64_t>& pasts, const std::vector<int64_t>& tokens,
                                          const std::vector<torch::Tensor>& tree_masks, double eps, int64_t heads,
                                          int64_t kv_heads, const std::vector<int64_t>& capture, torch::Tensor cos_local,
                                          torch::Tensor sin_local, const std::vector<int64_t>& windows, bool gelu);
torch::Tensor eagle3_layer(torch::Tensor embeds, torch::Tensor hidden, const std::vector<torch::Tensor>& weights,
                           torch::Tensor cos, torch::Tensor sin, torch::Tensor keys, torch::Tensor values, int64_t past,
                           double eps, int64_t heads, int64_t kv_heads);
