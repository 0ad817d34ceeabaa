// Mixture-of-experts kernels on the CPU (the Params and the data flow: backends/moe_params.h):
// the router (top-k of the logits with the lower index winning ties, softmax weights over all
// experts, optional renormalisation), the per-expert count / offset table, the stable
// permutation that groups rows by expert, the grouped expert MLP of the device layout, the
// weighted combine back to token order, and the sigmoid-gated add of Qwen2-MoE's shared expert.
// f32 arithmetic; the permute copies f32 or bf16 rows unchanged, so the same kernels serve the
// reference and the bf16 layout, and each is the CPU twin of its CUDA kernel
// (backends/cuda/kernels/moe_*.cu).
//
// NOTE: the router picks the k largest logits and weights them by their softmax probabilities
// over all E experts. Mixtral's "top-k of the logits, then softmax over those k" is the same
// distribution: renormalising the k probabilities cancels the denominator over the others.
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/half.h"
#include "core/status.h"

namespace strata::cpu {

Status moe_route(const MoeRouteParams& p) {
  if (p.k < 1 || p.k > p.n_experts) {
    return errorf(StatusCode::kInvalidArgument, "moe_route: top-k {} outside [1, {} experts]", p.k,
                  p.n_experts);
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const float* l = p.logits + t * p.logits_stride;
    float m = -INFINITY;
    for (int64_t e = 0; e < p.n_experts; ++e) m = l[e] > m ? l[e] : m;
    double sum = 0.0;
    for (int64_t e = 0; e < p.n_experts; ++e) sum += static_cast<double>(std::exp(l[e] - m));
    const float inv = static_cast<float>(1.0 / sum);
    // Selection: pass j takes the largest logit ranked below pick j - 1 in the order (logit
    // descending, index ascending), NaN as -inf: no "taken" table, and the same comparisons as
    // the CUDA kernel.
    int32_t* ids = p.topk_ids + t * p.k;
    float* w = p.topk_w + t * p.k;
    float prev_v = INFINITY;
    int64_t prev_i = -1;
    float picked = 0.0f;
    for (int64_t j = 0; j < p.k; ++j) {
      float best_v = -INFINITY;
      int64_t best = -1;
      for (int64_t e = 0; e < p.n_experts; ++e) {
        const float v = std::isnan(l[e]) ? -INFINITY : l[e];
        const bool after = v < prev_v || (v == prev_v && e > prev_i);
        if (after && (best < 0 || v > best_v)) {
          best_v = v;
          best = e;
        }
      }
      prev_v = best_v;
      prev_i = best;
      ids[j] = static_cast<int32_t>(best);
      w[j] = std::exp(l[best] - m) * inv;
      picked += w[j];
    }
    if (p.renormalize) {
      for (int64_t j = 0; j < p.k; ++j) w[j] /= picked;
    }
  }
  return ok_status();
}

Status moe_offsets(const MoeOffsetsParams& p) {
  std::memset(p.offsets, 0, static_cast<size_t>(p.n_experts + 1) * sizeof(int32_t));
  for (int64_t s = 0; s < p.n_slots; ++s) {
    const int32_t e = p.topk_ids[s];
    if (e < 0 || e >= p.n_experts) {
      return errorf(StatusCode::kOutOfRange, "moe_offsets: slot {} routed to expert {} of {}", s, e,
                    p.n_experts);
    }
    ++p.offsets[e + 1];
  }
  for (int64_t e = 0; e < p.n_experts; ++e) p.offsets[e + 1] += p.offsets[e];
  return ok_status();
}

Status moe_permute(const MoePermuteParams& p) {
  const int64_t n_slots = p.n_tokens * p.k;
  if (p.offsets[0] != 0 || p.offsets[p.n_experts] != n_slots) {
    return errorf(StatusCode::kInvalidArgument,
                  "moe_permute: the offset table covers {} rows, not the {} slots",
                  p.offsets[p.n_experts], n_slots);
  }
  const int64_t row_bytes = dtype_bytes(p.dtype, p.hidden);
  std::vector<int32_t> next(p.offsets, p.offsets + p.n_experts);
  for (int64_t s = 0; s < n_slots; ++s) {
    const int32_t e = p.topk_ids[s];
    if (e < 0 || e >= p.n_experts) {
      return errorf(StatusCode::kOutOfRange, "moe_permute: slot {} routed to expert {} of {}", s, e,
                    p.n_experts);
    }
    p.perm[s] = next[static_cast<size_t>(e)]++;
  }
  const int64_t src_row_bytes = dtype_bytes(p.dtype, p.x_stride);
#pragma omp parallel for schedule(static)
  for (int64_t s = 0; s < n_slots; ++s) {
    const int64_t t = s / p.k;
    std::memcpy(static_cast<char*>(p.x_perm) + int64_t{p.perm[s]} * row_bytes,
                static_cast<const char*>(p.x) + t * src_row_bytes, static_cast<size_t>(row_bytes));
  }
  return ok_status();
}

Status moe_combine(const MoeCombineParams& p) {
  const int64_t n_slots = p.n_tokens * p.k;
  std::vector<char> seen(static_cast<size_t>(n_slots), 0);
  for (int64_t s = 0; s < n_slots; ++s) {
    const int32_t r = p.perm[s];
    if (r < 0 || r >= n_slots || seen[static_cast<size_t>(r)]) {
      return errorf(StatusCode::kInvalidArgument, "moe_combine: perm is not a permutation");
    }
    seen[static_cast<size_t>(r)] = 1;
  }
  if (p.y_dtype != DType::kF32 && p.y_dtype != DType::kBF16) {
    return errorf(StatusCode::kInvalidArgument, "moe_combine: y dtype {} (want f32 or bf16)",
                  dtype_name(p.y_dtype));
  }
  const bool y_bf16 = p.y_dtype == DType::kBF16;
  const auto* y_f32 = static_cast<const float*>(p.y_perm);
  const auto* y_b16 = static_cast<const uint16_t*>(p.y_perm);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    float* o = p.out + t * p.out_stride;
    for (int64_t i = 0; i < p.hidden; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < p.k; ++j) {
        const int64_t r = p.perm[t * p.k + j];
        const int64_t yi = r * p.hidden + i;
        acc += p.topk_w[t * p.k + j] * (y_bf16 ? bf16_to_f32(y_b16[yi]) : y_f32[yi]);
      }
      o[i] = p.accumulate ? o[i] + acc : acc;
    }
  }
  return ok_status();
}

Status moe_experts(const MoeExpertsParams& p) {
  if (p.n_experts < 1 || p.hidden < 1 || p.ffn < 1 || p.n_rows < 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "moe_experts: bad sizes ({} experts, hidden {}, ffn {}, {} rows)", p.n_experts,
                  p.hidden, p.ffn, p.n_rows);
  }
  const int32_t* off = p.offsets;
  // Rows past offsets[n_experts] are not touched (the fixed-capacity expert-parallel exchange
  // passes its whole buffer, as the CUDA kernels take n_rows as a bound).
  if (off[0] != 0 || off[p.n_experts] > p.n_rows) {
    return errorf(StatusCode::kInvalidArgument, "moe_experts: offsets cover {} rows, x_perm has {}",
                  off[p.n_experts], p.n_rows);
  }
  if (p.y_dtype != DType::kF32 && p.y_dtype != DType::kBF16) {
    return errorf(StatusCode::kInvalidArgument, "moe_experts: y dtype {} (want f32 or bf16)",
                  dtype_name(p.y_dtype));
  }
  const bool quantized = p.w_dtype != DType::kBF16;
  for (int64_t e = 0; e < p.n_experts; ++e) {
    const int64_t r0 = off[e], r1 = off[e + 1];
    if (r1 < r0 || r1 > p.n_rows) {
      return errorf(StatusCode::kInvalidArgument, "moe_experts: offsets are not a prefix sum");
    }
    if (r1 == r0) continue;
    // The twins of the kernels' two GEMMs: gate/up with SiLU * up in the epilogue, rounded to
    // bf16 once; down into f32 (or rounded to bf16 once).
    GpuLinearParams g;
    g.x = p.x_perm + r0 * p.hidden;
    g.x_stride = p.hidden;
    g.w = static_cast<const char*>(p.gate_up) + dtype_bytes(p.w_dtype, e * p.gate_up_expert_stride);
    g.w_dtype = p.w_dtype;
    g.w_stride = p.hidden;
    g.w_scale = quantized ? p.gate_up_scale + e * 2 * p.ffn : nullptr;
    g.out = p.act + r0 * p.ffn;
    g.out_dtype = DType::kBF16;
    g.out_stride = p.ffn;
    g.n_tokens = r1 - r0;
    g.in_features = p.hidden;
    g.out_features = p.ffn;
    g.gated_silu = true;
    STRATA_RETURN_IF_ERROR(gpu_linear(g).with_context("moe_experts gate/up"));
    GpuLinearParams d;
    d.x = p.act + r0 * p.ffn;
    d.x_stride = p.ffn;
    d.w = static_cast<const char*>(p.down) + dtype_bytes(p.w_dtype, e * p.down_expert_stride);
    d.w_dtype = p.w_dtype;
    d.w_stride = p.ffn;
    d.w_scale = quantized ? p.down_scale + e * p.hidden : nullptr;
    d.out = static_cast<char*>(p.y_perm) + dtype_bytes(p.y_dtype, r0 * p.hidden);
    d.out_dtype = p.y_dtype;
    d.out_stride = p.hidden;
    d.n_tokens = r1 - r0;
    d.in_features = p.ffn;
    d.out_features = p.hidden;
    STRATA_RETURN_IF_ERROR(gpu_linear(d).with_context("moe_experts down"));
  }
  return ok_status();
}

Status sigmoid_gate_add(const SigmoidGateAddParams& p) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const float g = 1.0f / (1.0f + std::exp(-p.gate[t * p.gate_stride]));
    const float* y = p.y + t * p.y_stride;
    float* o = p.out + t * p.out_stride;
    for (int64_t i = 0; i < p.hidden; ++i) o[i] += g * y[i];
  }
  return ok_status();
}

}  // namespace strata::cpu
