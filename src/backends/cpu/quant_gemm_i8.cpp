// The int8-activation GEMM for block-quantized weights (prefill and batches of >= 16 tokens):
// llama.cpp's scheme on whole tiles. The activations are quantized once per call to int8
// blocks of 32 (Q8Act: d = max|x| / 127, s = d * sum(q)); each thread packs a panel of 16
// weight rows per k-block into unsigned bytes with per-32-group scale and offset (the layout in
// quant_impl.h; the packer is portable and shared), then runs the micro-kernel over the tokens
// 8 at a time: integer u8 x i8 dots per group (vpdpbusd with AVX512-VNNI, vpmaddubsw with AVX2
// or AVX-512 BW), each group's sum scaled once in f32. The math is the int8 tile kernels' (so
// the scalar tile_dot reference checks it), only the f32 summation order differs.
//
// Accuracy: rounding x to int8 moves each element by <= max|x_blk| / 254, the same as the
// int8 decode kernels (docs/performance.md: logit errors on SmolLM2 against the f32 path).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/quant_impl.h"
#include "core/env.h"
#include "core/half.h"
#include "core/status.h"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace strata::cpu {

using quant_detail::GemmI8MicroFn;
using quant_detail::kGemmRows;
using quant_detail::kGemmTokens;
using quant_detail::load_u16;
using quant_detail::load_u32;

namespace {

constexpr uint64_t kLow4 = 0x0F0F0F0F0F0F0F0Full;
constexpr uint64_t kOnes = 0x0101010101010101ull;

inline float f16(const uint8_t* p) {
  return f16_to_f32(load_u16(p));
}
inline uint64_t load_u64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// kSpread.v[b]: byte i = bit i of b (the fifth bits of eight Q5 values).
struct Spread {
  uint64_t v[256];
};
constexpr Spread make_spread() {
  Spread s{};
  for (int b = 0; b < 256; ++b) {
    for (int i = 0; i < 8; ++i) s.v[b] |= static_cast<uint64_t>((b >> i) & 1) << (8 * i);
  }
  return s;
}
constexpr Spread kSpread = make_spread();

// The 32 unsigned values (u[0..3] as 8 bytes each), dw and cw of 32-group g of a row at w.
void unpack_group(DType dt, const uint8_t* w, int64_t g, uint64_t u[4], float* dw, float* cw) {
  auto nibbles = [&](const uint8_t* qs) {
    const uint64_t a0 = load_u64(qs), a1 = load_u64(qs + 8);
    u[0] = a0 & kLow4;
    u[1] = a1 & kLow4;
    u[2] = (a0 >> 4) & kLow4;
    u[3] = (a1 >> 4) & kLow4;
  };
  auto fifth = [&](uint32_t qh) {
    for (int i = 0; i < 4; ++i) u[i] |= kSpread.v[(qh >> (8 * i)) & 0xFF] << 4;
  };
  switch (dt) {
    case DType::kQ8_0: {
      const uint8_t* b = w + 34 * g;
      for (int i = 0; i < 4; ++i) u[i] = load_u64(b + 2 + 8 * i) ^ (kOnes * 0x80);
      *dw = f16(b);
      *cw = -128.0f * *dw;
      return;
    }
    case DType::kQ4_0: {
      const uint8_t* b = w + 18 * g;
      nibbles(b + 2);
      *dw = f16(b);
      *cw = -8.0f * *dw;
      return;
    }
    case DType::kQ4_1: {
      const uint8_t* b = w + 20 * g;
      nibbles(b + 4);
      *dw = f16(b);
      *cw = f16(b + 2);
      return;
    }
    case DType::kQ5_0: {
      const uint8_t* b = w + 22 * g;
      nibbles(b + 6);
      fifth(load_u32(b + 2));
      *dw = f16(b);
      *cw = -16.0f * *dw;
      return;
    }
    case DType::kQ5_1: {
      const uint8_t* b = w + 24 * g;
      nibbles(b + 8);
      fifth(load_u32(b + 4));
      *dw = f16(b);
      *cw = f16(b + 2);
      return;
    }
    case DType::kQ4_K:
    case DType::kQ5_K: {
      const bool five = dt == DType::kQ5_K;
      const uint8_t* b = w + (five ? 176 : 144) * (g / 8);
      const int j = static_cast<int>(g % 8);
      const uint8_t* qs = (five ? b + 48 : b + 16) + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int i = 0; i < 4; ++i) {
        u[i] = (load_u64(qs + 8 * i) >> shift) & kLow4;
        if (five) u[i] |= ((load_u64(b + 16 + 8 * i) >> j) & kOnes) << 4;
      }
      uint8_t sc = 0, m = 0;
      quant_detail::k_scale_min(b + 4, j, &sc, &m);
      *dw = f16(b) * static_cast<float>(sc);
      *cw = -(f16(b + 2) * static_cast<float>(m));
      return;
    }
    default:
      std::memset(u, 0, 32);
      *dw = *cw = 0.0f;
      return;
  }
}

// The reference micro-kernel: integer group sums, then the scalar tile kernels' f32 terms.
void micro_scalar(int64_t ng, const uint8_t* wq, const float* wd, const float* wc, const int8_t* aq,
                  int64_t a_stride, const float* ad, const float* as, int64_t ad_stride, float* c) {
  for (int64_t t = 0; t < kGemmTokens; ++t) {
    for (int64_t r = 0; r < kGemmRows; ++r) {
      float acc = 0.0f, cacc = 0.0f;
      for (int64_t g = 0; g < ng; ++g) {
        int32_t isum = 0;
        for (int64_t i = 0; i < 32; ++i) {
          const uint8_t u = wq[((g * 8 + i / 4) * kGemmRows + r) * 4 + i % 4];
          isum += u * aq[t * a_stride + 32 * g + i];
        }
        acc += wd[g * kGemmRows + r] * ad[t * ad_stride + g] * static_cast<float>(isum);
        cacc += wc[g * kGemmRows + r] * as[t * ad_stride + g];
      }
      c[t * kGemmRows + r] = acc + cacc;
    }
  }
}

// Values per k-block: the packed panel (16 kc bytes + 2 kc floats) stays in L1 / L2 while every
// token tile of the call passes over it.
constexpr int64_t kKcMax = 1024;

}  // namespace

namespace quant_detail {

int gemm_i8_max_u(DType dt) {
  switch (dt) {
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ4_K:
      return 15;
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ5_K:
      return 31;
    case DType::kQ8_0:
      return 255;
    default:
      return 0;
  }
}

void gemm_i8_pack(DType dt, const uint8_t* w, int64_t row_bytes, int64_t nr, int64_t k0, int64_t kc,
                  uint8_t* q, float* dw, float* cw) {
  const int64_t ng = kc / 32;
  for (int64_t r = 0; r < kGemmRows; ++r) {
    for (int64_t g = 0; g < ng; ++g) {
      uint64_t u[4] = {0, 0, 0, 0};
      float d = 0.0f, c = 0.0f;
      if (r < nr) unpack_group(dt, w + r * row_bytes, k0 / 32 + g, u, &d, &c);
      dw[g * kGemmRows + r] = d;
      cw[g * kGemmRows + r] = c;
      const auto* bytes = reinterpret_cast<const uint8_t*>(u);
      for (int64_t i = 0; i < 8; ++i) {
        std::memcpy(q + ((g * 8 + i) * kGemmRows + r) * 4, bytes + 4 * i, 4);
      }
    }
  }
}

GemmI8MicroFn gemm_i8_micro_scalar() {
  return micro_scalar;
}

}  // namespace quant_detail

bool quant_gemm_amx() {
#if defined(STRATA_QUANT_HAVE_AMX)
  static const bool amx =
      env_config().cpu_amx &&
      quant_detail::resolve_quant_isa(QuantIsa::kBest) == QuantIsa::kAvx512Vnni &&
      cpu_has_amx_int8() && quant_detail::amx::request_tile_data();
  return amx;
#else
  return false;
#endif
}

namespace quant_detail {

GemmI8MicroFn gemm_i8_micro(DType dt, QuantIsa isa) {
  const int max_u = quant_detail::gemm_i8_max_u(dt);
  if (max_u == 0) return nullptr;
  switch (quant_detail::resolve_quant_isa(isa)) {
    case QuantIsa::kBest:
    case QuantIsa::kScalar:
      break;
#if defined(STRATA_QUANT_HAVE_AVX512)
    case QuantIsa::kAvx512Vnni:
#if defined(STRATA_QUANT_HAVE_AMX)
      if (quant_gemm_amx()) return quant_detail::amx::gemm_i8_micro();
#endif
      return quant_detail::avx512_vnni::gemm_i8_micro(max_u);
    case QuantIsa::kAvx512:
      return quant_detail::avx512::gemm_i8_micro(max_u);
    case QuantIsa::kAvx2:
      return quant_detail::gemm_i8_micro_avx2(max_u);
#else
    case QuantIsa::kAvx2:
    case QuantIsa::kAvx512:
    case QuantIsa::kAvx512Vnni:
      break;
#endif
  }
  return quant_detail::gemm_i8_micro_scalar();
}

}  // namespace quant_detail

namespace {
// set_quant_prefill's choice (a QuantPrefill; kAuto: none).
std::atomic<int> g_prefill{static_cast<int>(QuantPrefill::kAuto)};
}  // namespace

void set_quant_prefill(QuantPrefill mode) {
  g_prefill.store(static_cast<int>(mode));
}

namespace {
// set_quant_decode's choice (a QuantDecode; kAuto: none).
std::atomic<int> g_decode{static_cast<int>(QuantDecode::kAuto)};
}  // namespace

void set_quant_decode(QuantDecode mode) {
  g_decode.store(static_cast<int>(mode));
}

bool quant_decode_int8() {
  switch (static_cast<QuantDecode>(g_decode.load())) {
    case QuantDecode::kInt16:
      return false;
    case QuantDecode::kInt8:
      return true;
    case QuantDecode::kAuto:
      break;
  }
  return env_config().cpu_decode == "int8";
}

namespace {
// The `cpu kernels` line's name of the int8 kernels of isa.
const char* int8_path(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kAvx512Vnni:
      return quant_gemm_amx() ? "int8 amx" : "int8 avx512-vnni";
    case QuantIsa::kAvx512:
      return "int8 avx512";
    case QuantIsa::kAvx2:
      return "int8 avx2";
    default:
      return "int8 scalar";
  }
}
}  // namespace

const char* quant_decode_path() {
  const QuantIsa isa = quant_best_isa();
  if (quant_decode_int8()) return int8_path(isa);
  // The int16 kernels: on AVX512-VNNI CPUs the 4-row kernel of Q4_0 / Q4_1 (four blocks per
  // register) and Q8_0 (two) (quant_detail::rows4_i16_for), AVX2's elsewhere and for the other
  // types.
  if (isa == QuantIsa::kScalar) return "f32 scalar";
  return isa == QuantIsa::kAvx512Vnni ? "int16 avx512-vnni (q4_0/q4_1/q8_0), avx2" : "int16 avx2";
}

bool quant_prefill_int8(const QuantLinearParams& p, QuantIsa isa) {
  if (!p.f32_activations) return true;
  QuantPrefill mode = p.prefill;
  if (mode == QuantPrefill::kAuto) mode = static_cast<QuantPrefill>(g_prefill.load());
  switch (mode) {
    case QuantPrefill::kF32:
      return false;
    case QuantPrefill::kInt8:
      return true;
    case QuantPrefill::kAuto:
      break;
  }
  const std::string& env = env_config().cpu_prefill;
  if (env == "f32") return false;
  if (env == "int8") return true;
  // The default: int8 where the int8 GEMM beats the f32 one. AVX2: measured (1.3-1.8x per
  // GEMM on Zen 3, docs/performance.md); AVX512-VNNI: one vpdpbusd per 64 multiply-adds against
  // four 16-lane FMAs. AVX-512 without VNNI keeps f32: its int8 kernel needs three instructions
  // per 64 multiply-adds, about the f32 GEMM's rate (not measured).
  const QuantIsa resolved = quant_detail::resolve_quant_isa(isa);
  return resolved == QuantIsa::kAvx2 || resolved == QuantIsa::kAvx512Vnni;
}

const char* quant_prefill_path() {
  QuantLinearParams p;
  const QuantIsa isa = quant_best_isa();
  if (quant_prefill_int8(p, isa)) return int8_path(isa);
  switch (isa) {
    case QuantIsa::kAvx512Vnni:
    case QuantIsa::kAvx512:
      return "f32 avx512";
    case QuantIsa::kAvx2:
      return "f32 avx2";
    default:
      return "f32 scalar";
  }
}

Status quant_gemm_i8(const QuantLinearParams& p, int64_t x_stride, int64_t out_stride,
                     int64_t row_bytes, QuantIsa isa) {
  const GemmI8MicroFn micro = quant_detail::gemm_i8_micro(p.weight_dtype, isa);
  if (micro == nullptr) {
    return errorf(StatusCode::kFailedPrecondition, "quant_gemm_i8: no {} kernel for {} weights",
                  quant_isa_name(isa), dtype_name(p.weight_dtype));
  }
  const int64_t k = p.in_features, n = p.n_tokens, m = p.out_features, nb = k / 32;
  const int64_t n_pad = (n + kGemmTokens - 1) / kGemmTokens * kGemmTokens;
  // Grow-only per calling thread; the padded tokens are zero (d = s = 0: they add nothing).
  thread_local std::vector<int8_t> qs_buf;
  thread_local std::vector<float> qd_buf, qsum_buf;
  qs_buf.resize(std::max(qs_buf.size(), static_cast<size_t>(n_pad * k)));
  qd_buf.resize(std::max(qd_buf.size(), static_cast<size_t>(n_pad * nb)));
  qsum_buf.resize(std::max(qsum_buf.size(), static_cast<size_t>(n_pad * nb)));
  int8_t* const qs = qs_buf.data();
  float* const qd = qd_buf.data();
  float* const qsum = qsum_buf.data();
  std::memset(qs + n * k, 0, static_cast<size_t>((n_pad - n) * k));
  std::fill(qd + n * nb, qd + n_pad * nb, 0.0f);
  std::fill(qsum + n * nb, qsum + n_pad * nb, 0.0f);

  const int64_t block = dtype_info(p.weight_dtype).block_size;
  const int64_t n_kb = (k + kKcMax - 1) / kKcMax;
  const int64_t kc = std::min(k, ((k + n_kb - 1) / n_kb + block - 1) / block * block);
  const int64_t n_panels = (m + kGemmRows - 1) / kGemmRows;
  const int64_t n_tiles = n_pad / kGemmTokens;
  int threads = 1;
#if defined(_OPENMP)
  threads = omp_get_max_threads();
#endif
  // Work items: a panel and a run of token tiles; the tiles split only where panels are too few
  // for about 4 items per thread (each item packs its panel itself).
  const int64_t n_chunks = std::min(n_tiles, std::max<int64_t>(1, 4 * threads / n_panels));
  const int64_t chunk_tiles = (n_tiles + n_chunks - 1) / n_chunks;
  const auto* w = static_cast<const uint8_t*>(p.weight);
  const QuantIsa qisa = p.force_scalar ? QuantIsa::kScalar : isa;

#pragma omp parallel
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      quantize_row_q8(p.x + t * x_stride, k, qs + t * k, qd + t * nb, qsum + t * nb, qisa);
    }
    thread_local std::vector<uint8_t> pq;
    thread_local std::vector<float> pdc;
    pq.resize(std::max(pq.size(), static_cast<size_t>(kGemmRows * kc)));
    pdc.resize(std::max(pdc.size(), static_cast<size_t>(2 * kGemmRows * (kc / 32))));
    uint8_t* const wq = pq.data();
    float* const wd = pdc.data();
    float* const wc = wd + kGemmRows * (kc / 32);
    alignas(64) float c[kGemmTokens * kGemmRows];
#pragma omp for schedule(static)
    for (int64_t item = 0; item < n_panels * n_chunks; ++item) {
      const int64_t r0 = item / n_chunks * kGemmRows;
      const int64_t nr = std::min(kGemmRows, m - r0);
      const int64_t tile0 = item % n_chunks * chunk_tiles;
      const int64_t tile1 = std::min(n_tiles, tile0 + chunk_tiles);
      for (int64_t k0 = 0; k0 < k; k0 += kc) {
        const int64_t kcb = std::min(kc, k - k0);
        quant_detail::gemm_i8_pack(p.weight_dtype, w + r0 * row_bytes, row_bytes, nr, k0, kcb, wq,
                                   wd, wc);
        for (int64_t tile = tile0; tile < tile1; ++tile) {
          const int64_t t0 = tile * kGemmTokens;
          micro(kcb / 32, wq, wd, wc, qs + t0 * k + k0, k, qd + t0 * nb + k0 / 32,
                qsum + t0 * nb + k0 / 32, nb, c);
          const int64_t nt = std::min(kGemmTokens, n - t0);
          for (int64_t t = 0; t < nt; ++t) {
            float* o = p.out + (t0 + t) * out_stride + r0;
            const float* ct = c + t * kGemmRows;
            if (k0 == 0) {
              for (int64_t r = 0; r < nr; ++r)
                o[r] = ct[r] + (p.bias != nullptr ? p.bias[r0 + r] : 0.0f);
            } else {
              for (int64_t r = 0; r < nr; ++r) o[r] += ct[r];
            }
          }
        }
      }
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
