// CPU twins of the GPU executor's fused bf16 kernels (src/backends/cuda/kernels/norm_bf16.cu,
// act_bf16.cu, rope_kv_append.cu): plain loops that round at the same points as the CUDA
// kernels, so the CUDA tests can ask for bit-equal results (or 1 bf16 ulp where the GPU's sum
// order or transcendental functions differ). Each twin is itself checked against the f32
// reference ops (rms_norm, add, gated_act, rope, kv_append) followed by a bf16 rounding
// (tests/ops/test_fused_bf16_twin.cpp), so the formulas here are exactly those ops':
//   - f32 arithmetic written as the reference ops write it (same operation order; the host
//     build has no FMA contraction, and the CUDA kernels use __fmul_rn/__fadd_rn to match);
//   - one rounding to bf16 (nearest even) of the final f32 value; the f32 residual stream
//     (x += residual) is never rounded.
#include <cmath>
#include <cstdint>

#include "backends/cpu/activation_impl.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/half.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

constexpr int64_t kMaxRotaryDim = 1024;  // as cpu::rope and cuda::rope_kv_append
constexpr int64_t kMaxNormHeadDim = 1024;  // q/k norms: head_dim limit of the scratch row
template <Activation A>
inline float apply(float x) {
  return apply_activation<A>(x);
}

template <Activation A>
void gated_rows(const GatedActBf16Params& p) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.n_tokens; ++r) {
    uint16_t* out = p.out + r * p.out_stride;
    if (!p.gated) {
      if (p.in_bf16 != nullptr) {
        const uint16_t* in = p.in_bf16 + r * p.in_stride;
        for (int64_t i = 0; i < p.ffn_dim; ++i) out[i] = f32_to_bf16(apply<A>(bf16_to_f32(in[i])));
      } else {
        const float* in = p.in + r * p.in_stride;
        for (int64_t i = 0; i < p.ffn_dim; ++i) out[i] = f32_to_bf16(apply<A>(in[i]));
      }
      continue;
    }
    if (p.in_bf16 != nullptr) {
      const uint16_t* gate = p.in_bf16 + r * p.in_stride;
      const uint16_t* up = gate + p.ffn_dim;
      for (int64_t i = 0; i < p.ffn_dim; ++i) {
        out[i] = f32_to_bf16(apply<A>(bf16_to_f32(gate[i])) * bf16_to_f32(up[i]));
      }
      continue;
    }
    const float* gate = p.in + r * p.in_stride;
    const float* up = gate + p.ffn_dim;
    for (int64_t i = 0; i < p.ffn_dim; ++i) out[i] = f32_to_bf16(apply<A>(gate[i]) * up[i]);
  }
}

// The cache slot (block * block_size + offset) of position `pos` of sequence `seq`, or -1 when
// the sequence, the position or the block it maps to is invalid (the token then writes nothing:
// the CUDA kernel cannot report it, so the twin does not either).
int64_t kv_slot(const PagedKvBf16Params& c, int64_t seq, int64_t pos) {
  if (seq < 0 || seq >= c.n_seqs || pos < 0 || pos / c.block_size >= c.max_blocks_per_seq) {
    return -1;
  }
  const int64_t block = c.block_tables[seq * c.max_blocks_per_seq + pos / c.block_size];
  if (block < 0 || block >= c.n_blocks) return -1;
  return block * c.block_size + pos % c.block_size;
}

// head = head * rsqrt(mean(head^2) + eps) * (w + offset), as cpu::rms_norm computes a row (sum of
// squares in double, the rest in f32), into dst [head_dim] f32.
void norm_head(const float* head, const float* w, float offset, float eps, int64_t head_dim,
               float* dst) {
  double ss = 0.0;
  for (int64_t i = 0; i < head_dim; ++i) ss += static_cast<double>(head[i]) * head[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(head_dim)) + eps);
  for (int64_t i = 0; i < head_dim; ++i) dst[i] = head[i] * inv * (w[i] + offset);
}

// Writes head x [head_dim] (f32) rotated by the cos/sin table, as bf16, to dst [head_dim].
void rotate_head(const float* x, uint16_t* dst, int64_t head_dim, int64_t rotary_dim, bool neox,
                 const float* cos_t, const float* sin_t) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const int64_t ia = neox ? i : 2 * i;  // pair (ia, ib) as cpu::rope
    const int64_t ib = neox ? i + half : 2 * i + 1;
    const float a = x[ia];
    const float b = x[ib];
    dst[ia] = f32_to_bf16(a * cos_t[i] - b * sin_t[i]);
    dst[ib] = f32_to_bf16(b * cos_t[i] + a * sin_t[i]);
  }
  for (int64_t j = rotary_dim; j < head_dim; ++j) dst[j] = f32_to_bf16(x[j]);
}

}  // namespace

Status norm_bf16(const NormBf16Params& p) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < p.n_tokens; ++r) {
    float* x = p.x + r * p.x_stride;
    uint16_t* out = p.out + r * p.out_stride;
    if (p.residual != nullptr) {
      const float* res = p.residual + r * p.residual_stride;
      for (int64_t i = 0; i < p.hidden; ++i) x[i] = x[i] + res[i];
    }
    switch (p.kind) {
      case NormKind::kRms: {
        // As cpu::rms_norm: sum of squares in double, the rest in f32.
        double ss = 0.0;
        for (int64_t i = 0; i < p.hidden; ++i) ss += static_cast<double>(x[i]) * x[i];
        const float inv =
            1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(p.hidden)) + p.eps);
        for (int64_t i = 0; i < p.hidden; ++i) {
          const float w = load_as_f32(p.weight, p.weight_dtype, i) + p.weight_offset;
          out[i] = f32_to_bf16(x[i] * inv * w);
        }
        break;
      }
      case NormKind::kLayer: {
        // As cpu::layer_norm: mean and centred variance in double, the output in f32.
        double sum = 0.0;
        for (int64_t i = 0; i < p.hidden; ++i) sum += x[i];
        const double mean = sum / static_cast<double>(p.hidden);
        double ss = 0.0;
        for (int64_t i = 0; i < p.hidden; ++i) {
          const double d = x[i] - mean;
          ss += d * d;
        }
        const double var = ss / static_cast<double>(p.hidden);
        const float inv = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(p.eps)));
        const float mean_f = static_cast<float>(mean);
        for (int64_t i = 0; i < p.hidden; ++i) {
          const float b = p.bias ? load_as_f32(p.bias, p.bias_dtype, i) : 0.0f;
          out[i] = f32_to_bf16((x[i] - mean_f) * inv * load_as_f32(p.weight, p.weight_dtype, i) + b);
        }
        break;
      }
    }
  }
  return ok_status();
}

Status gated_act_bf16(const GatedActBf16Params& p) {
  switch (p.act) {
    case Activation::kSilu:
      gated_rows<Activation::kSilu>(p);
      return ok_status();
    case Activation::kGeluTanh:
      gated_rows<Activation::kGeluTanh>(p);
      return ok_status();
    case Activation::kGeluErf:
      gated_rows<Activation::kGeluErf>(p);
      return ok_status();
    case Activation::kRelu:
      gated_rows<Activation::kRelu>(p);
      return ok_status();
  }
  return errorf(StatusCode::kInvalidArgument, "gated_act_bf16: unknown activation {}",
                static_cast<int>(p.act));
}

Status rope_kv_append(const RopeKvAppendParams& p) {
  const PagedKvBf16Params& c = p.cache;
  if (p.rotary_dim < 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > c.head_dim ||
      p.rotary_dim > kMaxRotaryDim) {
    return errorf(StatusCode::kInvalidArgument,
                  "rope_kv_append: rotary_dim {} must be even, in [0, head_dim {}] and <= {}",
                  p.rotary_dim, c.head_dim, kMaxRotaryDim);
  }
  if ((p.q_norm != nullptr || p.k_norm != nullptr) && c.head_dim > kMaxNormHeadDim) {
    return errorf(StatusCode::kInvalidArgument, "rope_kv_append: q/k norms need head_dim <= {}, not {}",
                  kMaxNormHeadDim, c.head_dim);
  }
  const int64_t d = c.head_dim;
  const int64_t half = p.rotary_dim / 2;
  const int64_t slot_elems = c.n_heads_kv * d;  // bf16 per cache slot, K or V
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    // The table as cpu::rope builds it: angle and cos/sin in double, then f32.
    float cos_t[kMaxRotaryDim / 2];
    float sin_t[kMaxRotaryDim / 2];
    const double pos = p.token_pos[t];
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * static_cast<double>(p.inv_freq[i]);
      cos_t[i] = static_cast<float>(std::cos(angle)) * p.attention_factor;
      sin_t[i] = static_cast<float>(std::sin(angle)) * p.attention_factor;
    }
    const float* q = p.qkv + t * p.qkv_stride;  // [n_heads, d]
    const float* k = q + p.n_heads * d;         // [n_heads_kv, d]
    const float* v = k + c.n_heads_kv * d;      // [n_heads_kv, d]
    float normed[kMaxNormHeadDim];
    for (int64_t h = 0; h < p.n_heads; ++h) {
      const float* src = q + h * d;
      if (p.q_norm != nullptr) {
        norm_head(src, p.q_norm, p.norm_weight_offset, p.norm_eps, d, normed);
        src = normed;
      }
      rotate_head(src, p.q_out + t * p.q_out_stride + h * d, d, p.rotary_dim, p.neox_style,
                  cos_t, sin_t);
    }
    const int64_t slot = kv_slot(c, p.token_seq[t], p.token_pos[t]);
    if (slot < 0) continue;
    uint16_t* k_dst = c.k_cache + slot * slot_elems;
    uint16_t* v_dst = c.v_cache + slot * slot_elems;
    for (int64_t h = 0; h < c.n_heads_kv; ++h) {
      const float* src = k + h * d;
      if (p.k_norm != nullptr) {
        norm_head(src, p.k_norm, p.norm_weight_offset, p.norm_eps, d, normed);
        src = normed;
      }
      rotate_head(src, k_dst + h * d, d, p.rotary_dim, p.neox_style, cos_t, sin_t);
    }
    for (int64_t j = 0; j < slot_elems; ++j) v_dst[j] = f32_to_bf16(v[j]);
  }
  return ok_status();
}

}  // namespace strata::cpu
