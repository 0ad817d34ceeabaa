#include "model/residency.h"

#include <algorithm>

#include <fmt/core.h>

#include "core/status.h"

namespace strata {

namespace {

constexpr int64_t kAlign = 256;  // every tensor of a layer blob starts on a 256-byte boundary

int64_t aligned(int64_t bytes) {
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// "12.50 GiB", "3.2 MiB", "512 bytes".
std::string size(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} bytes", bytes);
}

// A linear layer [rows, cols] in the device layout: the weight, its row scales when quantized,
// its bias.
int64_t linear_bytes(int64_t rows, int64_t cols, DType wdt, bool bias) {
  int64_t b = aligned(dtype_bytes(wdt, rows * cols));
  if (wdt != DType::kBF16) b += aligned(rows * 4);
  if (bias) b += aligned(rows * 4);
  return b;
}

}  // namespace

std::string_view to_string(LayerTier t) {
  switch (t) {
    case LayerTier::kResident:
      return "resident";
    case LayerTier::kHost:
      return "host";
    case LayerTier::kDisk:
      return "disk";
  }
  return "?";
}

int64_t device_layer_bytes(const ModelConfig& c, const ParallelConfig& par, DType wdt) {
  const int64_t tp = std::max(1, par.tp_size);
  const int64_t H = c.hidden, D = c.head_dim;
  const int64_t hq = std::max<int64_t>(1, c.n_heads / tp);
  const int64_t hkv = std::max<int64_t>(1, c.n_heads_kv / tp);
  const int64_t F = c.ffn_dim / tp;
  const int64_t norm = aligned(H * 4) * (c.norm == NormType::kLayerNorm ? 2 : 1);
  int64_t b = 2 * norm;  // input and post-attention norms
  if (c.qk_norm) b += 2 * aligned(D * 4);
  if (c.post_norms) b += 2 * norm;
  b += linear_bytes((hq + 2 * hkv) * D, H, wdt, c.qkv_bias);
  b += linear_bytes(H, hq * D, wdt, c.o_bias);
  b += linear_bytes(c.gated_mlp ? 2 * F : F, H, wdt, c.mlp_bias);
  b += linear_bytes(H, F, wdt, c.mlp_bias);
  return b;
}

int64_t device_nonlayer_bytes(const ModelConfig& c, const ParallelConfig& par, DType wdt) {
  const int64_t V = par.padded_chunk(c.vocab), H = c.hidden;
  int64_t b = aligned(V * H * 2);  // the embedding table stays bf16
  if (!(c.tie_word_embeddings && wdt == DType::kBF16)) b += linear_bytes(V, H, wdt, false);
  if (c.pos_embedding == PosEmbedding::kLearned) b += aligned(c.max_position_embeddings * H * 2);
  b += aligned(H * 4) * (c.norm == NormType::kLayerNorm ? 2 : 1);
  if (c.pos_embedding == PosEmbedding::kRope) b += 2 * aligned(c.rotary_dim / 2 * 4);
  return b;
}

Result<ResidencyPlan> plan_residency(const ModelConfig& c, const ParallelConfig& par, DType wdt,
                                     const ResidencyOptions& o, int64_t device_free,
                                     const std::string& device_name) {
  ResidencyPlan p;
  p.options = o;
  const int64_t L = c.n_layers;
  p.tier.assign(static_cast<size_t>(L), LayerTier::kResident);
  p.layer_bytes = device_layer_bytes(c, par, wdt);
  p.nonlayer_bytes = device_nonlayer_bytes(c, par, wdt);
  p.all_resident_bytes = p.nonlayer_bytes + L * p.layer_bytes;
  p.n_resident = L;
  if (!o.requested()) {
    p.reason = "every layer resident (no --gpu-weight-budget)";
    return p;
  }
  if (o.gpu_weight_budget < 0) {
    return errorf(StatusCode::kInvalidArgument, "--gpu-weight-budget {} must be >= 0",
                  o.gpu_weight_budget);
  }
  if (o.n_slots < 2) {
    return errorf(StatusCode::kInvalidArgument, "weight streaming needs at least 2 slots, not {}",
                  o.n_slots);
  }
  const LayerTier away = o.offload == WeightOffload::kDisk ? LayerTier::kDisk : LayerTier::kHost;
  const char* where = away == LayerTier::kDisk ? "streamed from the checkpoint file on disk"
                                               : "streamed from pinned host memory";
  int64_t resident = 0;
  if (o.gpu_weight_budget == 0) {
    // --offload-weights cpu|disk without a budget: stream every layer (ZeRO-Inference's choice:
    // the device memory goes to the KV cache).
    resident = 0;
    p.reason = fmt::format("--offload-weights {} without --gpu-weight-budget: every layer {}",
                           to_string(o.offload), where);
  } else if (o.gpu_weight_budget >= p.all_resident_bytes) {
    resident = L;
    p.reason = fmt::format("the whole model ({}) fits --gpu-weight-budget {}: every layer resident",
                           size(p.all_resident_bytes), size(o.gpu_weight_budget));
  } else {
    const int64_t min_bytes = p.nonlayer_bytes + o.n_slots * p.layer_bytes;
    if (o.gpu_weight_budget < min_bytes) {
      return errorf(StatusCode::kInvalidArgument,
                    "--gpu-weight-budget {} is too small for {}: the non-layer weights "
                    "(embeddings, LM head, norms) take {} and {} streaming slots of one "
                    "layer {} each, {} at least ({} weights; all {} layers "
                    "resident: {})",
                    size(o.gpu_weight_budget), c.architecture, size(p.nonlayer_bytes), o.n_slots,
                    size(p.layer_bytes), size(min_bytes), dtype_name(wdt), L,
                    size(p.all_resident_bytes));
    }
    resident = std::min(L, (o.gpu_weight_budget - min_bytes) / p.layer_bytes);
    p.reason = fmt::format(
        "--gpu-weight-budget {} holds the non-layer weights ({}), {} streaming "
        "slots ({}) and {} of {} layers ({} each); the rest are {}",
        size(o.gpu_weight_budget), size(p.nonlayer_bytes), o.n_slots,
        size(o.n_slots * p.layer_bytes), resident, L, size(p.layer_bytes), where);
  }
  if (o.max_resident_layers >= 0 && resident > o.max_resident_layers) {
    resident = o.max_resident_layers;
    p.reason += fmt::format("; at most {} resident layers, the rest {}", resident, where);
  }
  if (resident < L) {
    if (par.tp_size > 1 || par.pp_size > 1) {
      return Status(StatusCode::kUnimplemented,
                    "weight streaming (--gpu-weight-budget / --offload-weights) runs on one device "
                    "for now: not with tensor or pipeline parallelism");
    }
    if (c.is_moe()) {
      return Status(StatusCode::kUnimplemented,
                    "weight streaming of mixture-of-experts layers is not built yet");
    }
    p.n_slots = static_cast<int>(std::min<int64_t>(o.n_slots, L - resident));
    p.slot_bytes = p.layer_bytes;
  }
  for (int64_t l = resident; l < L; ++l) p.tier[static_cast<size_t>(l)] = away;
  p.n_resident = resident;
  p.n_streamed = L - resident;
  if (device_free > 0 && p.device_bytes() > device_free) {
    if (!p.streaming()) {
      return errorf(StatusCode::kOutOfMemory,
                    "the weights need {} ({}), but {} has {} free; lower "
                    "--gpu-weight-budget to stream layers, or quantize the weights",
                    size(p.device_bytes()), dtype_name(wdt), device_name, size(device_free));
    }
    return errorf(StatusCode::kOutOfMemory,
                  "{} cannot run even streamed on {}: the non-layer weights, {} resident layers "
                  "and {} slots need {} but {} is free; lower --gpu-weight-budget "
                  "or quantize the weights",
                  c.architecture, device_name, p.n_resident, p.n_slots, size(p.device_bytes()),
                  size(device_free));
  }
  return p;
}

std::vector<std::string> ResidencyPlan::describe() const {
  std::vector<std::string> out;
  out.push_back(reason);
  out.push_back(
      fmt::format("weights on the device {} (non-layer {}, {} resident layers, {} slots of "
                  "{}); streamed per forward pass {} ({} layers)",
                  size(device_bytes()), size(nonlayer_bytes), n_resident, n_slots, size(slot_bytes),
                  size(streamed_bytes_per_pass()), n_streamed));
  size_t i = 0;
  while (i < tier.size()) {
    size_t j = i;
    while (j + 1 < tier.size() && tier[j + 1] == tier[i]) ++j;
    const char* why = tier[i] == LayerTier::kResident ? "on the device: within the budget"
                      : tier[i] == LayerTier::kHost
                          ? "pinned host memory, copied into a slot before each use"
                          : "read from the checkpoint file (O_DIRECT) before each use";
    out.push_back(i == j ? fmt::format("layer {}: {} ({})", i, to_string(tier[i]), why)
                         : fmt::format("layers {}-{}: {} ({})", i, j, to_string(tier[i]), why));
    i = j + 1;
  }
  if (streaming() && !options.prefetch) out.push_back("prefetch off (--no-weight-prefetch)");
  return out;
}

}  // namespace strata
