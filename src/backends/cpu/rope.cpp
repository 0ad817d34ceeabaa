// Rotary position embedding on the CPU, in place. Per token the cos/sin table of its position
// is computed once (angle in double: position * inv_freq reaches 1e5+ radians, where an f32
// product would already be off by ~1e-2; the table is kept for the next calls with the same
// positions, below) and applied to every head. The pairs rotated are
// (i, i + rotary_dim/2) in neox style (HF rotate_half) and (2i, 2i + 1) otherwise (GPT-J);
// dims past rotary_dim pass through unchanged.
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

constexpr int64_t kMaxRotaryDim = 1024;

// The cos / sin tables of a call's positions, kept for the next calls with the same positions
// and frequencies: a step's q and k of every layer (2 x n_layers calls) share one table. Keyed
// by content, not by address (a freed inv_freq's address may come back with other values). Per
// calling thread; two entries, for models alternating two frequency sets (Gemma's local and
// global layers).
struct RopeTable {
  std::vector<float> inv_freq;
  float factor = 0.0f;
  std::vector<int32_t> positions;
  std::vector<float> cs;  // per token: cos[half], then sin[half]
};

const float* rope_table(const RopeKernelParams& p, int64_t half) {
  thread_local RopeTable tables[2];
  thread_local int next = 0;
  const size_t n = static_cast<size_t>(p.n_tokens);
  for (RopeTable& t : tables) {
    if (t.factor == p.attention_factor && t.inv_freq.size() == static_cast<size_t>(half) &&
        t.positions.size() == n &&
        std::memcmp(t.inv_freq.data(), p.inv_freq, sizeof(float) * half) == 0 &&
        std::memcmp(t.positions.data(), p.positions, sizeof(int32_t) * n) == 0) {
      return t.cs.data();
    }
  }
  RopeTable& t = tables[next];
  next = 1 - next;
  t.inv_freq.assign(p.inv_freq, p.inv_freq + half);
  t.factor = p.attention_factor;
  t.positions.assign(p.positions, p.positions + n);
  t.cs.resize(n * 2 * static_cast<size_t>(half));
  float* cs = t.cs.data();
#pragma omp parallel for schedule(static) if (p.n_tokens * half >= kParallelMinElems / 8)
  for (int64_t tok = 0; tok < p.n_tokens; ++tok) {
    float* c = cs + tok * 2 * half;
    const double pos = p.positions[tok];
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * static_cast<double>(p.inv_freq[i]);
      c[i] = static_cast<float>(std::cos(angle)) * p.attention_factor;
      c[half + i] = static_cast<float>(std::sin(angle)) * p.attention_factor;
    }
  }
  return cs;
}

}  // namespace

bool rotary_dim_ok(int64_t rotary_dim, int64_t head_dim) {
  return rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_dim &&
         rotary_dim <= kMaxRotaryDim;
}

namespace {

Status rotary_dim_error(int64_t rotary_dim, int64_t head_dim) {
  return errorf(StatusCode::kInvalidArgument,
                "rope: rotary_dim {} must be even, in (0, head_dim {}] and <= {}", rotary_dim,
                head_dim, kMaxRotaryDim);
}

}  // namespace

void rope_head(float* x, const float* cos_t, int64_t half, bool neox_style) {
  const float* sin_t = cos_t + half;
  if (neox_style) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i];
      const float b = x[i + half];
      x[i] = a * cos_t[i] - b * sin_t[i];
      x[i + half] = b * cos_t[i] + a * sin_t[i];
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[2 * i];
      const float b = x[2 * i + 1];
      x[2 * i] = a * cos_t[i] - b * sin_t[i];
      x[2 * i + 1] = b * cos_t[i] + a * sin_t[i];
    }
  }
}

Status rope(const RopeKernelParams& p) {
  if (!rotary_dim_ok(p.rotary_dim, p.head_dim)) return rotary_dim_error(p.rotary_dim, p.head_dim);
  const int64_t half = p.rotary_dim / 2;
  const float* table = rope_table(p, half);
#pragma omp parallel for schedule(static) if (p.n_tokens * p.n_heads * p.rotary_dim >= \
                                              kParallelMinElems)
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    for (int64_t h = 0; h < p.n_heads; ++h) {
      rope_head(p.x + t * p.token_stride + h * p.head_stride, table + t * 2 * half, half,
                p.neox_style);
    }
  }
  return ok_status();
}

void rope_kv_unit(const RopeKvAppendF32Params& p, const float* cos_sin, int64_t t, int64_t u) {
  const PagedKvParams& c = p.cache;
  const int64_t D = c.head_dim, hq = p.n_heads, hkv = c.n_heads_kv, half = p.rotary_dim / 2;
  const float* cs = half > 0 ? cos_sin + t * 2 * half : nullptr;
  float* row = p.qkv + t * p.qkv_stride;
  const auto head_norm = [&](const float* w, float* x) {
    RmsNormParams n;
    n.weight = w;
    n.weight_dtype = DType::kF32;
    n.n_tokens = 1;
    n.hidden = D;
    n.eps = p.norm_eps;
    n.weight_offset = p.norm_weight_offset;
    rms_norm_row(n, x, x);
  };
  const size_t head_bytes = sizeof(float) * static_cast<size_t>(D);
  if (u < hq) {
    float* qh = p.q_out + t * p.q_out_stride + u * D;
    std::memcpy(qh, row + u * D, head_bytes);
    if (p.q_norm != nullptr) head_norm(p.q_norm, qh);
    if (cs != nullptr) rope_head(qh, cs, half, p.neox_style);
    return;
  }
  const int64_t j = u - hq;
  float* kh = row + (hq + j) * D;
  if (p.k_norm != nullptr) head_norm(p.k_norm, kh);
  if (cs != nullptr) rope_head(kh, cs, half, p.neox_style);
  const int64_t pos = p.token_pos[t];
  const int64_t block = c.block_tables[p.token_seq[t] * c.max_blocks_per_seq + pos / c.block_size];
  const int64_t slot = block * c.block_size + pos % c.block_size;
  std::memcpy(c.k_cache + (slot * hkv + j) * D, kh, head_bytes);
  std::memcpy(c.v_cache + (slot * hkv + j) * D, row + (hq + hkv + j) * D, head_bytes);
}

const float* rope_kv_cos_sin(const RopeKvAppendF32Params& p) {
  if (p.rotary_dim == 0) return nullptr;
  RopeKernelParams r;
  r.n_tokens = p.n_tokens;
  r.head_dim = p.cache.head_dim;
  r.positions = p.token_pos;
  r.inv_freq = p.inv_freq;
  r.rotary_dim = p.rotary_dim;
  return rope_table(r, p.rotary_dim / 2);
}

Status rope_kv_append_f32(const RopeKvAppendF32Params& p) {
  const PagedKvParams& c = p.cache;
  if (p.rotary_dim != 0 && !rotary_dim_ok(p.rotary_dim, c.head_dim)) {
    return rotary_dim_error(p.rotary_dim, c.head_dim);
  }
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    STRATA_RETURN_IF_ERROR(check_kv_slot(c, "kv_append", t, p.token_seq[t], p.token_pos[t]));
  }
  const float* cs = rope_kv_cos_sin(p);
  const int64_t units = p.n_heads + c.n_heads_kv;
#pragma omp parallel for schedule(static) if (p.n_tokens * units * c.head_dim >= kParallelMinElems)
  for (int64_t i = 0; i < p.n_tokens * units; ++i) rope_kv_unit(p, cs, i / units, i % units);
  return ok_status();
}

}  // namespace strata::cpu
