// Weight residency (ZeRO-Inference, issue 13): which layers of the device layout stay on the
// device and which are streamed into a few fixed device slots before they run, from pinned host
// memory or from the checkpoint file on disk. The plan is computed from the config alone (the
// bytes of the device layout), so `strata info` can print it without a GPU; the runner builds the
// layout it describes (model/device_layout.cpp) and streams with runtime/weight_streamer.h.
//
// Policy: the non-layer weights (embeddings, LM head, final norm, rope tables) are always
// resident; layers are resident in order while they fit --gpu-weight-budget next to the
// streaming slots (each as large as one layer), the rest are streamed. Following ZeRO-Inference,
// the device memory the budget leaves free goes to the KV cache (a larger batch), not to more
// resident layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "parallel/parallel_config.h"
#include "strata/engine.h"
#include "strata/status.h"
#include "strata/types.h"

namespace strata {

enum class LayerTier : uint8_t { kResident, kHost, kDisk };
std::string_view to_string(LayerTier t);

struct ResidencyOptions {
  int64_t gpu_weight_budget = 0;  // bytes; 0: no budget
  WeightOffload offload = WeightOffload::kAuto;
  bool prefetch = true;  // copy the next streamed layer while one computes
  int n_slots = 2;       // device slots streamed layers rotate through (>= 2)
  // At most this many resident layers (-1: as many as the budget holds). Lets the tests mix
  // resident and streamed layers in the tiny fixtures, whose embeddings dwarf their layers.
  int64_t max_resident_layers = -1;
  // Partitioned fetch (data-parallel replicas, runtime/weight_streamer.h): the slots are padded
  // to a multiple of fetch_parts x 256 bytes, so every replica's part of a layer (the blob split
  // into fetch_parts 256-byte aligned parts, the last one shorter) has room in an all-gather.
  int fetch_parts = 1;
  // Partitioned fetch: the most pieces a layer is fetched in, each copied and then all-gathered
  // while the next one is copied (runtime/weight_streamer.h). 0: STRATA_FETCH_PIECES, else 4.
  int fetch_pieces = 0;
  bool requested() const { return gpu_weight_budget > 0 || offload != WeightOffload::kAuto; }
};

struct ResidencyPlan {
  ResidencyOptions options;
  std::vector<LayerTier> tier;  // per model layer
  int64_t n_resident = 0, n_streamed = 0;
  int n_slots = 0;             // slots allocated (0 without streaming)
  int64_t nonlayer_bytes = 0;  // embeddings, LM head, final norm, rope tables
  int64_t layer_bytes = 0;     // one layer's device layout (the largest)
  int64_t slot_bytes = 0;      // one slot (== layer_bytes)
  int64_t all_resident_bytes = 0;
  std::string reason;  // why the layers are where they are (one line)

  bool streaming() const { return n_streamed > 0; }
  // Weight bytes on the device: non-layer + resident layers + slots.
  int64_t device_bytes() const {
    return nonlayer_bytes + n_resident * layer_bytes + n_slots * slot_bytes;
  }
  int64_t streamed_bytes_per_pass() const { return n_streamed * layer_bytes; }
  // The plan as lines for `strata info` and the startup log: a summary, then runs of layers.
  std::vector<std::string> describe() const;
};

// Bytes of one layer / of the non-layer weights in the device layout of `wdt` (each tensor
// rounded up to 256 bytes, as the streamed layer blobs pack them).
int64_t device_layer_bytes(const ModelConfig& c, const ParallelConfig& par, DType wdt);
int64_t device_nonlayer_bytes(const ModelConfig& c, const ParallelConfig& par, DType wdt);

// The plan for `c` in the device layout of `wdt` under `o`. `device_free`: bytes free on the
// device (0: unknown), `device_name` for messages. Errors are one line with the numbers: a budget
// too small for the non-layer weights and two slots, a device too small for them, streaming with
// tensor / pipeline parallelism or mixture-of-experts layers (not built).
Result<ResidencyPlan> plan_residency(const ModelConfig& c, const ParallelConfig& par, DType wdt,
                                     const ResidencyOptions& o, int64_t device_free = 0,
                                     const std::string& device_name = "the device");

}  // namespace strata
