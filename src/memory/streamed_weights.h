// The layers of a model that live off the device between forward passes (weight streaming,
// ZeRO-Inference; model/residency.h has the plan). Each streamed layer is one contiguous blob of
// its device layout (every tensor at a 256-byte aligned offset), so one copy moves a layer into a
// device slot; the layer's weight views point into its slot permanently (fixed addresses), slot =
// streamed index % n_slots. The blob lives in pinned host memory (host tier) or is rebuilt on
// every pass from O_DIRECT reads of the checkpoint file (disk tier).
// runtime/weight_streamer.h moves the bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "model/residency.h"
#include "strata/status.h"

namespace strata {

// One read of a checkpoint file: [offset, offset + bytes) (both multiples of the O_DIRECT
// alignment), landing at buf_offset of the layer's raw read buffer; `needed` bytes of it must
// exist (the file may end inside the last aligned block).
struct DiskRange {
  int file = 0;
  uint64_t offset = 0, bytes = 0, needed = 0, buf_offset = 0;
};

struct StreamedLayer {
  int64_t layer = 0;
  int slot = 0;
  size_t bytes = 0;  // the blob
  Buffer host;       // host tier: the blob (pinned on CUDA)
  // Disk tier: the reads, the raw buffer they need, and the conversion of the raw bytes (the
  // checkpoint's tensors) into the blob: the same host conversions the upload makes.
  std::vector<DiskRange> ranges;
  size_t read_bytes = 0;
  std::function<Status(const uint8_t* raw, uint8_t* blob)> pack;
};

struct StreamedWeights {
  LayerTier tier = LayerTier::kHost;
  ResidencyPlan plan;
  std::vector<std::string> files;  // disk tier: the checkpoint files ranges index
  size_t slot_bytes = 0;
  std::vector<void*> slots;           // device memory (kept by the model's WeightStore)
  std::vector<StreamedLayer> layers;  // in layer order
  std::vector<int> index_of_layer;    // per model layer: index into `layers`, -1 = resident
  size_t host_bytes() const {
    size_t b = 0;
    for (const StreamedLayer& l : layers) b += l.host.bytes();
    return b;
  }
  size_t bytes_per_pass() const {
    size_t b = 0;
    for (const StreamedLayer& l : layers) b += l.bytes;
    return b;
  }
};

}  // namespace strata
