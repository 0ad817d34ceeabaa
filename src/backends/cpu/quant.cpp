// Block-quantized weights on the CPU: dequantization, the scalar reference dot kernels, ISA
// dispatch, and quant_linear (quantize the activations once, then OpenMP over weight rows).
// Layouts are listed in quant_impl.h; the AVX2 kernels live in quant_avx2.cpp, the AVX-512 ones
// in quant_avx512.cpp.
#include "backends/cpu/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant_impl.h"
#include "core/half.h"
#include "core/status.h"

namespace strata::cpu {

using quant_detail::k_scale_min;
using quant_detail::kQK;
using quant_detail::load_u16;
using quant_detail::load_u32;
using quant_detail::TileDotFn;

namespace {

inline float f16(const uint8_t* p) {
  return f16_to_f32(load_u16(p));
}

// ---- dequantization (same operation order as ggml / gguf-py, so results are bit-exact) ------

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int i = 0; i < 32; ++i) y[i] = static_cast<float>(q[i]) * d;
}

// 4-bit values of a 32-block into q[32] (plus the fifth bit from qh when given).
void unpack_q4(const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0F;
    q[j + 16] = qs[j] >> 4;
  }
}
void unpack_q5(const uint8_t* qs, uint32_t qh, uint8_t* q) {
  unpack_q4(qs, q);
  for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(q[j] | (((qh >> j) & 1u) << 4));
}

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  uint8_t q[32];
  unpack_q4(b + 2, q);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(q[i] - 8);
}
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = f16(b);
  const float m = f16(b + 2);
  uint8_t q[32];
  unpack_q4(b + 4, q);
  for (int i = 0; i < 32; ++i) {
    const float p = d * static_cast<float>(q[i]);
    y[i] = p + m;
  }
}
void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = f16(b);
  uint8_t q[32];
  unpack_q5(b + 6, load_u32(b + 2), q);
  for (int i = 0; i < 32; ++i) y[i] = d * static_cast<float>(q[i] - 16);
}
void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = f16(b);
  const float m = f16(b + 2);
  uint8_t q[32];
  unpack_q5(b + 8, load_u32(b + 4), q);
  for (int i = 0; i < 32; ++i) {
    const float p = d * static_cast<float>(q[i]);
    y[i] = p + m;
  }
}
void dequant_q4_k(const uint8_t* b, float* y, bool five_bit) {
  const float d = f16(b);
  const float dmin = f16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = five_bit ? b + 48 : b + 16;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc = 0;
    uint8_t m = 0;
    k_scale_min(scales, j, &sc, &m);
    const float dl = d * static_cast<float>(sc);
    const float ml = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0x0F;
      if (five_bit) v |= ((qh[l] >> j) & 1) << 4;
      const float p = dl * static_cast<float>(v);
      y[32 * j + l] = p - ml;
    }
  }
}
// The 256 values of a Q6_K super-block (before scales), each in [-32, 31]: element
// 128 h + 32 t + l takes its low 4 bits from ql[64 h + 32 (t & 1) + l] (nibble t >> 1) and
// its high 2 bits from bits 2t, 2t + 1 of qh[32 h + l].
void unpack_q6(const uint8_t* b, int8_t* q) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo0 = ql[64 * h + l];
      const uint8_t lo1 = ql[64 * h + 32 + l];
      const uint8_t hi = qh[32 * h + l];
      int8_t* o = q + 128 * h + l;
      o[0] = static_cast<int8_t>(((lo0 & 0x0F) | ((hi & 3) << 4)) - 32);
      o[32] = static_cast<int8_t>(((lo1 & 0x0F) | (((hi >> 2) & 3) << 4)) - 32);
      o[64] = static_cast<int8_t>(((lo0 >> 4) | (((hi >> 4) & 3) << 4)) - 32);
      o[96] = static_cast<int8_t>(((lo1 >> 4) | (((hi >> 6) & 3) << 4)) - 32);
    }
  }
}
void dequant_q6_k(const uint8_t* b, float* y) {
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16(b + 208);
  int8_t q[256];
  unpack_q6(b, q);
  for (int e = 0; e < 256; ++e) {
    const float dl = d * static_cast<float>(scales[e / 16]);
    y[e] = dl * static_cast<float>(q[e]);
  }
}

// ---- scalar dot kernels ------------------------------------------------------------------------
// Same formulas as the AVX2 kernels (see quant.h), integer sums per block, f32 accumulation.

// 32-value block types: isum = sum(q_w * q_a) with q_w unsigned (or signed for Q8_0); the block
// adds d_w d_a isum + c_w s_a.
template <DType kT>
void row_dot_blk32(const uint8_t* w, int64_t n, const Q8Act& a, int nt, float* out) {
  constexpr int64_t kBytes = kT == DType::kQ8_0   ? 34
                             : kT == DType::kQ4_0 ? 18
                             : kT == DType::kQ4_1 ? 20
                             : kT == DType::kQ5_0 ? 22
                                                  : 24;
  const int64_t nb = n / 32;
  for (int t = 0; t < nt; ++t) {
    const int8_t* aq = a.qs + t * n;
    const float* ad = a.d + t * nb;
    const float* as = a.s + t * nb;
    float acc = 0.0f;
    float cacc = 0.0f;
    for (int64_t j = 0; j < nb; ++j) {
      const uint8_t* b = w + j * kBytes;
      const int8_t* q8 = aq + 32 * j;
      const float dw = f16(b);
      int32_t isum = 0;
      float cw = 0.0f;
      if constexpr (kT == DType::kQ8_0) {
        const auto* qw = reinterpret_cast<const int8_t*>(b + 2);
        for (int i = 0; i < 32; ++i) isum += qw[i] * q8[i];
      } else {
        uint8_t q[32];
        if constexpr (kT == DType::kQ4_0) {
          unpack_q4(b + 2, q);
          cw = -8.0f * dw;
        } else if constexpr (kT == DType::kQ4_1) {
          unpack_q4(b + 4, q);
          cw = f16(b + 2);
        } else if constexpr (kT == DType::kQ5_0) {
          unpack_q5(b + 6, load_u32(b + 2), q);
          cw = -16.0f * dw;
        } else {
          unpack_q5(b + 8, load_u32(b + 4), q);
          cw = f16(b + 2);
        }
        for (int i = 0; i < 32; ++i) isum += q[i] * q8[i];
      }
      acc += dw * ad[j] * static_cast<float>(isum);
      cacc += cw * as[j];
    }
    out[t] = acc + cacc;
  }
}

template <bool kFiveBit>
void row_dot_q45_k(const uint8_t* w, int64_t n, const Q8Act& a, int nt, float* out) {
  constexpr int64_t kBytes = kFiveBit ? 176 : 144;
  const int64_t nsb = n / kQK;
  const int64_t nb = n / 32;
  for (int t = 0; t < nt; ++t) {
    const int8_t* aq = a.qs + t * n;
    const float* ad = a.d + t * nb;
    const float* as = a.s + t * nb;
    float acc = 0.0f;
    float cacc = 0.0f;
    for (int64_t sb = 0; sb < nsb; ++sb) {
      const uint8_t* b = w + sb * kBytes;
      const float d = f16(b);
      const float dmin = f16(b + 2);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = kFiveBit ? b + 48 : b + 16;
      for (int j = 0; j < 8; ++j) {
        uint8_t sc = 0;
        uint8_t m = 0;
        k_scale_min(b + 4, j, &sc, &m);
        const uint8_t* q = qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        const int8_t* q8 = aq + sb * kQK + 32 * j;
        int32_t isum = 0;
        for (int l = 0; l < 32; ++l) {
          int v = (q[l] >> shift) & 0x0F;
          if (kFiveBit) v |= ((qh[l] >> j) & 1) << 4;
          isum += v * q8[l];
        }
        const int64_t ab = sb * 8 + j;
        acc += d * static_cast<float>(sc) * ad[ab] * static_cast<float>(isum);
        cacc += dmin * static_cast<float>(m) * as[ab];
      }
    }
    out[t] = acc - cacc;
  }
}

void row_dot_q6_k(const uint8_t* w, int64_t n, const Q8Act& a, int nt, float* out) {
  const int64_t nsb = n / kQK;
  const int64_t nb = n / 32;
  for (int t = 0; t < nt; ++t) out[t] = 0.0f;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* b = w + sb * 210;
    const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16(b + 208);
    int8_t q[256];
    unpack_q6(b, q);
    for (int t = 0; t < nt; ++t) {
      for (int g = 0; g < 8; ++g) {  // activation block g covers elements [32g, 32g + 32)
        const int8_t* q8 = a.qs + t * n + sb * kQK + 32 * g;
        int32_t isum = 0;
        for (int half = 0; half < 2; ++half) {
          int32_t part = 0;
          for (int l = 16 * half; l < 16 * half + 16; ++l) part += q[32 * g + l] * q8[l];
          isum += part * scales[2 * g + half];
        }
        out[t] += d * a.d[t * nb + sb * 8 + g] * static_cast<float>(isum);
      }
    }
  }
}

using RowFn = void (*)(const uint8_t* w, int64_t n, const Q8Act& a, int nt, float* out);

// A tile of rows from a one-row kernel.
template <RowFn kFn>
void tile_rows(const uint8_t* w, int64_t row_bytes, int nr, int64_t n, const Q8Act& a, int nt,
               float* out) {
  for (int r = 0; r < nr; ++r) kFn(w + r * row_bytes, n, a, nt, out + r * nt);
}

TileDotFn tile_dot(DType dt, QuantIsa isa) {
  switch (quant_detail::resolve_quant_isa(isa)) {
    case QuantIsa::kBest:
    case QuantIsa::kScalar:
      break;
#if defined(STRATA_QUANT_HAVE_AVX2)
    case QuantIsa::kAvx512Vnni:
      return quant_detail::avx512_vnni::tile_dot(dt);
    case QuantIsa::kAvx512:
      return quant_detail::avx512::tile_dot(dt);
    case QuantIsa::kAvx2:
      return quant_detail::tile_dot_avx2(dt);
#else
    case QuantIsa::kAvx2:
    case QuantIsa::kAvx512:
    case QuantIsa::kAvx512Vnni:
      break;
#endif
  }
  return quant_detail::tile_dot_scalar(dt);
}

void quantize_rows(const float* x, int64_t n, int8_t* qs, float* d, float* s, QuantIsa isa) {
  switch (quant_detail::resolve_quant_isa(isa)) {
    case QuantIsa::kBest:
    case QuantIsa::kScalar:
      break;
#if defined(STRATA_QUANT_HAVE_AVX2)
    case QuantIsa::kAvx512Vnni:
      return quant_detail::avx512_vnni::quantize_row_q8(x, n, qs, d, s);
    case QuantIsa::kAvx512:
      return quant_detail::avx512::quantize_row_q8(x, n, qs, d, s);
    case QuantIsa::kAvx2:
      return quant_detail::quantize_row_q8_avx2(x, n, qs, d, s);
#else
    case QuantIsa::kAvx2:
    case QuantIsa::kAvx512:
    case QuantIsa::kAvx512Vnni:
      break;
#endif
  }
  quant_detail::quantize_row_q8_scalar(x, n, qs, d, s);
}

constexpr size_t kAlign = 64;
size_t align_up(size_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

namespace quant_detail {

TileDotFn tile_dot_isa(DType dt, QuantIsa isa) {
  return tile_dot(dt, isa);
}

QuantIsa resolve_quant_isa(QuantIsa isa) {
  QuantIsa best = QuantIsa::kScalar;
#if defined(STRATA_QUANT_HAVE_AVX2)
  // Detected once (cpu_features.cpp): avx2 + fma + f16c; avx512f/bw/dq/vl; avx512_vnni.
  if (cpu_supports(CpuIsa::kAvx2)) best = QuantIsa::kAvx2;
  if (cpu_supports(CpuIsa::kAvx512)) best = QuantIsa::kAvx512;
  if (cpu_has_avx512_vnni()) best = QuantIsa::kAvx512Vnni;
#endif
  if (isa == QuantIsa::kBest) return best;
  return static_cast<int>(isa) < static_cast<int>(best) ? isa : best;
}

TileDotFn tile_dot_scalar(DType dt) {
  switch (dt) {
    case DType::kQ8_0:
      return tile_rows<row_dot_blk32<DType::kQ8_0>>;
    case DType::kQ4_0:
      return tile_rows<row_dot_blk32<DType::kQ4_0>>;
    case DType::kQ4_1:
      return tile_rows<row_dot_blk32<DType::kQ4_1>>;
    case DType::kQ5_0:
      return tile_rows<row_dot_blk32<DType::kQ5_0>>;
    case DType::kQ5_1:
      return tile_rows<row_dot_blk32<DType::kQ5_1>>;
    case DType::kQ4_K:
      return tile_rows<row_dot_q45_k<false>>;
    case DType::kQ5_K:
      return tile_rows<row_dot_q45_k<true>>;
    case DType::kQ6_K:
      return tile_rows<row_dot_q6_k>;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI8:
    case DType::kFP8E4M3:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      return nullptr;
  }
  return nullptr;
}

void quantize_row_q8_scalar(const float* x, int64_t n, int8_t* qs, float* d, float* s) {
  for (int64_t j = 0; j < n / 32; ++j) {
    const float* xb = x + 32 * j;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float dj = amax / 127.0f;
    const float id = dj != 0.0f ? 1.0f / dj : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float r = std::nearbyint(xb[i] * id);  // default rounding: to nearest even
      const int q = static_cast<int>(std::clamp(r, -127.0f, 127.0f));
      qs[32 * j + i] = static_cast<int8_t>(q);
      sum += q;
    }
    d[j] = dj;
    s[j] = dj * static_cast<float>(sum);
  }
}

}  // namespace quant_detail

// ---- public API --------------------------------------------------------------------------------

QuantIsa quant_best_isa() {
  return quant_detail::resolve_quant_isa(QuantIsa::kBest);
}

bool quant_isa_supported(QuantIsa isa) {
  return isa == QuantIsa::kBest || quant_detail::resolve_quant_isa(isa) == isa;
}

const char* quant_isa_name(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kBest:
      return "best";
    case QuantIsa::kScalar:
      return "scalar";
    case QuantIsa::kAvx2:
      return "avx2";
    case QuantIsa::kAvx512:
      return "avx512";
    case QuantIsa::kAvx512Vnni:
      return "avx512-vnni";
  }
  return "?";
}

bool quant_supported(DType dt) {
  return quant_detail::tile_dot_scalar(dt) != nullptr;
}

Status dequantize_row(DType dt, const void* src, float* dst, int64_t n) {
  const DTypeInfo& info = dtype_info(dt);
  if (n < 0 || n % info.block_size != 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "dequantize_row: {} values of {} is not a whole number of {}-value blocks", n,
                  info.name, info.block_size);
  }
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / info.block_size;
  switch (dt) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return ok_status();
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(b + 2 * i));
      return ok_status();
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(b + 2 * i));
      return ok_status();
    case DType::kQ8_0:
      for (int64_t j = 0; j < nb; ++j) dequant_q8_0(b + 34 * j, dst + 32 * j);
      return ok_status();
    case DType::kQ4_0:
      for (int64_t j = 0; j < nb; ++j) dequant_q4_0(b + 18 * j, dst + 32 * j);
      return ok_status();
    case DType::kQ4_1:
      for (int64_t j = 0; j < nb; ++j) dequant_q4_1(b + 20 * j, dst + 32 * j);
      return ok_status();
    case DType::kQ5_0:
      for (int64_t j = 0; j < nb; ++j) dequant_q5_0(b + 22 * j, dst + 32 * j);
      return ok_status();
    case DType::kQ5_1:
      for (int64_t j = 0; j < nb; ++j) dequant_q5_1(b + 24 * j, dst + 32 * j);
      return ok_status();
    case DType::kQ4_K:
      for (int64_t j = 0; j < nb; ++j) dequant_q4_k(b + 144 * j, dst + kQK * j, false);
      return ok_status();
    case DType::kQ5_K:
      for (int64_t j = 0; j < nb; ++j) dequant_q4_k(b + 176 * j, dst + kQK * j, true);
      return ok_status();
    case DType::kQ6_K:
      for (int64_t j = 0; j < nb; ++j) dequant_q6_k(b + 210 * j, dst + kQK * j);
      return ok_status();
    case DType::kI8:
    case DType::kFP8E4M3:
    case DType::kI32:
    case DType::kI64:
    case DType::kU8:
      break;
  }
  return errorf(StatusCode::kUnimplemented, "dequantize_row: dtype {} is not supported", info.name);
}

void quantize_row_q8(const float* x, int64_t n, int8_t* qs, float* d, float* s, QuantIsa isa) {
  quantize_rows(x, n, qs, d, s, isa);
}

float vec_dot_q8(DType dt, const void* w, const Q8Act& a, int64_t n, QuantIsa isa) {
  TileDotFn fn = tile_dot(dt, isa);
  if (fn == nullptr) return 0.0f;
  float out = 0.0f;
  fn(static_cast<const uint8_t*>(w), 0, 1, n, a, 1, &out);
  return out;
}

size_t quant_linear_scratch_bytes(int64_t n_tokens, int64_t in_features) {
  const auto n = static_cast<size_t>(std::max<int64_t>(n_tokens, 0));
  const auto k = static_cast<size_t>(std::max<int64_t>(in_features, 0));
  return align_up(n * k) + 2 * align_up(n * (k / 32) * sizeof(float)) + kAlign;
}

Status quant_linear(const QuantLinearParams& p) {
  const DTypeInfo& info = dtype_info(p.weight_dtype);
  const QuantIsa isa = p.force_scalar ? QuantIsa::kScalar : p.isa;
  TileDotFn fn = tile_dot(p.weight_dtype, isa);
  if (fn == nullptr) {
    return errorf(StatusCode::kUnimplemented,
                  "quant_linear: weight dtype {} is not block-quantized", info.name);
  }
  const int64_t k = p.in_features;
  if (k <= 0 || k % info.block_size != 0 || p.n_tokens < 0 || p.out_features < 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "quant_linear: in_features {} must be a positive multiple of the {} block ({}); "
                  "n_tokens {}, out_features {}",
                  k, info.name, info.block_size, p.n_tokens, p.out_features);
  }
  const int64_t x_stride = p.x_stride != 0 ? p.x_stride : k;
  const int64_t out_stride = p.out_stride != 0 ? p.out_stride : p.out_features;
  const int64_t row_blocks = p.weight_row_blocks != 0 ? p.weight_row_blocks : k / info.block_size;
  if (x_stride < k || out_stride < p.out_features || row_blocks < k / info.block_size) {
    return errorf(StatusCode::kInvalidArgument,
                  "quant_linear: strides too small (x {}, out {}, weight row {} blocks) for "
                  "in_features {}, out_features {}",
                  x_stride, out_stride, row_blocks, k, p.out_features);
  }
  if (p.n_tokens == 0 || p.out_features == 0) return ok_status();
  if (p.x == nullptr || p.weight == nullptr || p.out == nullptr) {
    return errorf(StatusCode::kInvalidArgument, "quant_linear: null x, weight or out");
  }
  // Prefill and larger batches with int8 activations: the tiled int8 GEMM (quant_gemm_i8.cpp)
  // where this ISA has one for the type; the scalar variant keeps the tile kernels below (the
  // reference).
  constexpr int64_t kGemmMinTokens = 16;
  if (p.n_tokens >= kGemmMinTokens && quant_detail::resolve_quant_isa(isa) != QuantIsa::kScalar &&
      quant_prefill_int8(p, isa) && quant_detail::gemm_i8_micro(p.weight_dtype, isa) != nullptr) {
    return quant_gemm_i8(p, x_stride, out_stride, row_blocks * info.block_bytes, isa);
  }
  // Decode with f32 activations stays f32 / int16 unless the int8 decode is chosen
  // (set_quant_decode, STRATA_CPU_DECODE=int8): then the int8 tiles below, as without
  // f32_activations.
  if (p.f32_activations && !(p.n_tokens < kGemmMinTokens && quant_decode_int8())) {
    return quant_linear_f32(p, x_stride, out_stride, row_blocks * info.block_bytes);
  }

  const size_t need = quant_linear_scratch_bytes(p.n_tokens, k);
  std::vector<uint8_t> own;
  uint8_t* base = static_cast<uint8_t*>(p.scratch);
  if (base == nullptr || p.scratch_bytes < need) {
    own.resize(need);
    base = own.data();
  }
  base = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(base)));
  const int64_t nb = k / 32;
  auto* qs = reinterpret_cast<int8_t*>(base);
  auto* d = reinterpret_cast<float*>(base + align_up(static_cast<size_t>(p.n_tokens * k)));
  float* s = d + align_up(static_cast<size_t>(p.n_tokens * nb) * sizeof(float)) / sizeof(float);

  const auto* w = static_cast<const uint8_t*>(p.weight);
  const int64_t row_bytes = row_blocks * info.block_bytes;
  // One token (decode): tiles of 4 weight rows share each activation block load. Several
  // tokens: each weight row is unpacked once per tile of up to 4 tokens.
  constexpr int64_t kTile = 4;
  const int64_t row_tile = p.n_tokens == 1 ? kTile : 1;
  const int64_t tok_tile = p.n_tokens == 1 ? 1 : kTile;
  const int64_t n_row_tiles = (p.out_features + row_tile - 1) / row_tile;
  const int64_t n_tok_tiles = (p.n_tokens + tok_tile - 1) / tok_tile;

#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < p.n_tokens; ++t) {
      quantize_rows(p.x + t * x_stride, k, qs + t * k, d + t * nb, s + t * nb, isa);
    }
    // Rows outer (each thread streams a contiguous slab of W once), token tiles inner.
#pragma omp for schedule(static)
    for (int64_t rt = 0; rt < n_row_tiles; ++rt) {
      const int64_t r0 = rt * row_tile;
      const int nr = static_cast<int>(std::min(row_tile, p.out_features - r0));
      for (int64_t tt = 0; tt < n_tok_tiles; ++tt) {
        const int64_t t0 = tt * tok_tile;
        const int nt = static_cast<int>(std::min(tok_tile, p.n_tokens - t0));
        const Q8Act a{qs + t0 * k, d + t0 * nb, s + t0 * nb};
        float res[kTile * kTile];
        fn(w + r0 * row_bytes, row_bytes, nr, k, a, nt, res);
        for (int r = 0; r < nr; ++r) {
          const float bias = p.bias != nullptr ? p.bias[r0 + r] : 0.0f;
          for (int i = 0; i < nt; ++i)
            p.out[(t0 + i) * out_stride + r0 + r] = res[r * nt + i] + bias;
        }
      }
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
