// One layer's device layout as a contiguous blob (weight streaming, memory/streamed_weights.h):
// the fixed order and offsets of its tensors, and the host-side packing of a blob from the layer
// as stored (the same conversions Model::to_device makes before its upload).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "model/weights.h"
#include "strata/status.h"

namespace strata {

// Where a device-layout tensor's values come from in the layer as stored.
struct BlobSource {
  enum Kind : uint8_t {
    kRowsBf16,   // linear weight: the parts' rows converted to bf16, stacked
    kBiasF32,    // linear bias: each part's bias as f32 (zeros where a part has none)
    kVectorF32,  // norm weight / bias as f32, or `fill` when the stored tensor is undefined
    kDevice,     // made on the device (int8 / fp8 weights and their scales): no host packing
  };
  Kind kind = kDevice;
  const ops::LinearWeight* linear = nullptr;
  const Tensor* vector = nullptr;
  float fill = 0.0f;
};

struct BlobLayout {
  std::vector<size_t> offsets;  // per visited tensor
  size_t bytes = 0;
};

// fn(tensor, source) for every defined tensor of the device layer `d` in the blob's fixed order;
// `stored` is the layer as stored (null: the sources point nowhere).
void visit_layer_blob(LayerWeights& d, const LayerWeights* stored,
                      const std::function<void(Tensor&, const BlobSource&)>& fn);
BlobLayout layer_blob_layout(LayerWeights& d);
// Points every tensor of `d` at base + its offset.
void rebase_layer(LayerWeights& d, const BlobLayout& layout, void* base);
// Fills `blob` (layout.bytes) from the stored layer, on the host. bf16 device layouts only
// (kUnimplemented for a tensor made on the device).
Status pack_layer_blob(LayerWeights d, const LayerWeights& stored, const BlobLayout& layout,
                       uint8_t* blob);
// Every defined tensor of a layer as stored (norms, linear parts, their biases and scales).
void for_each_stored_tensor(LayerWeights& stored, const std::function<void(Tensor&)>& fn);

}  // namespace strata
