// Mixture-of-experts kernels on the CPU (the Params and the data flow: backends/moe_params.h):
// the router (softmax over all experts, top-k with the lower index winning ties, optional
// renormalisation), the per-expert count / offset table, the stable permutation that groups
// rows by expert, the weighted combine back to token order, and the sigmoid-gated add of
// Qwen2-MoE's shared expert. f32 arithmetic; the permute copies f32 or bf16 rows unchanged, so
// the same kernels serve the reference and the bf16 layout.
//
// NOTE: the router computes the softmax over all E logits and then picks the top k of the
// probabilities. Mixtral's "top-k of the logits, then softmax over those k" is the same
// distribution: softmax is monotone, and renormalising the k probabilities cancels the
// denominator over the other experts.
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
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
    std::vector<float> prob(static_cast<size_t>(p.n_experts));
    float m = l[0];
    for (int64_t e = 1; e < p.n_experts; ++e) m = l[e] > m ? l[e] : m;
    double sum = 0.0;
    for (int64_t e = 0; e < p.n_experts; ++e) {
      prob[static_cast<size_t>(e)] = std::exp(l[e] - m);
      sum += prob[static_cast<size_t>(e)];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (float& v : prob) v *= inv;
    // Selection: k passes, each taking the largest remaining probability (strictly greater
    // replaces, so the lowest index wins a tie); NaN never wins.
    std::vector<char> taken(static_cast<size_t>(p.n_experts), 0);
    int32_t* ids = p.topk_ids + t * p.k;
    float* w = p.topk_w + t * p.k;
    float picked = 0.0f;
    for (int64_t j = 0; j < p.k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < p.n_experts; ++e) {
        if (taken[static_cast<size_t>(e)]) continue;
        if (best < 0 || prob[static_cast<size_t>(e)] > prob[static_cast<size_t>(best)]) best = e;
      }
      taken[static_cast<size_t>(best)] = 1;
      ids[j] = static_cast<int32_t>(best);
      w[j] = prob[static_cast<size_t>(best)];
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
    const int32_t r = next[static_cast<size_t>(e)]++;
    p.perm[r] = static_cast<int32_t>(s);
  }
  const int64_t src_row_bytes = dtype_bytes(p.dtype, p.x_stride);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < n_slots; ++r) {
    const int64_t t = p.perm[r] / p.k;
    std::memcpy(static_cast<char*>(p.x_perm) + r * row_bytes,
                static_cast<const char*>(p.x) + t * src_row_bytes, static_cast<size_t>(row_bytes));
  }
  return ok_status();
}

Status moe_combine(const MoeCombineParams& p) {
  const int64_t n_slots = p.n_tokens * p.k;
  std::vector<int32_t> row_of(static_cast<size_t>(n_slots), -1);
  for (int64_t r = 0; r < n_slots; ++r) {
    const int32_t s = p.perm[r];
    if (s < 0 || s >= n_slots || row_of[static_cast<size_t>(s)] >= 0) {
      return errorf(StatusCode::kInvalidArgument, "moe_combine: perm is not a permutation");
    }
    row_of[static_cast<size_t>(s)] = static_cast<int32_t>(r);
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    float* o = p.out + t * p.out_stride;
    for (int64_t i = 0; i < p.hidden; ++i) {
      float acc = 0.0f;
      for (int64_t j = 0; j < p.k; ++j) {
        const int64_t r = row_of[static_cast<size_t>(t * p.k + j)];
        acc += p.topk_w[t * p.k + j] * p.y_perm[r * p.hidden + i];
      }
      o[i] = p.accumulate ? o[i] + acc : acc;
    }
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
