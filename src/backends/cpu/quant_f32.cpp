// Block-quantized linear with f32 activations: out[t, r] = sum_i x[t, i] * W[r, i] with W
// dequantized block by block in registers, so the result equals the f32 product over the
// dequantized weights up to f32 summation order (the int8-activation path of quant.cpp
// rounds x to 8 bits per element, which moved SmolLM2's logits by up to ~1.5).
//
// Variants:
//   n_tokens < 16 (decode), AVX2 or better: the fused unpack-and-FMA kernels of quant_avx2.cpp
//     (row_dot_f32_avx2, row_dot_f32_tokens_avx2) for all eight block types, with the
//     activation's per-32 block sums computed once per call for the offset / min terms.
//     Threads split the rows into contiguous slabs and read them row after row; with 2..15
//     tokens each row is unpacked once per group of up to 4 tokens. The int16 decode kernels
//     of the 32-value types have AVX-512 variants (quant_avx512.cpp), run only when p.isa
//     asks for them (they lost to AVX2 on the AVX-512 CPU measured).
//   n_tokens >= 16 (prefill, batched decode): the f32 GEMM of linear.cpp (linear_quant_gemm),
//     whose packer dequantizes each panel of weight rows with the AVX2 dequantizers.
//   force_scalar, or no AVX2: dequantize_row + dot per row (the reference the AVX2 kernels
//     are tested against).
#include <immintrin.h>

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/phase_clock.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/quant_impl.h"
#include "backends/cpu/spin_pool.h"
#include "core/half.h"
#include "core/status.h"

namespace strata::cpu {

namespace {

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

float dot_scalar(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = 0.0f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (float v : acc) s += v;
  return s;
}

STRATA_AVX2 float hsum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// xsum[b] = sum of x[32 b, 32 b + 32) for b < nb.
STRATA_AVX2 void block_sums32_avx2(const float* x, int64_t nb, float* xsum) {
  for (int64_t b = 0; b < nb; ++b, x += 32) {
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                                   _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
    xsum[b] = hsum(s);
  }
}

}  // namespace

Status quant_linear_f32(const QuantLinearParams& p, int64_t x_stride, int64_t out_stride,
                        int64_t row_bytes) {
  const int64_t k = p.in_features;
  const QuantIsa isa = quant_detail::resolve_quant_isa(p.force_scalar ? QuantIsa::kScalar : p.isa);
  const bool avx2 = isa != QuantIsa::kScalar;  // AVX2 or better
  const bool avx512 = isa == QuantIsa::kAvx512 || isa == QuantIsa::kAvx512Vnni;
  const int64_t block = dtype_info(p.weight_dtype).block_size;
  const int64_t info_bytes = dtype_info(p.weight_dtype).block_bytes;
  const auto* w = static_cast<const uint8_t*>(p.weight);
  // Measured on an AVX2 Zen 3 core (bench_quant, 1536 x 576 Q4_1): the fused kernels take
  // 143 us at 4 tokens (~36 us per token); the GEMM 405 us at 8 and 527 us at 16 (its packing,
  // ~0.3 ns per weight, is paid once per call). So the fused kernels serve up to 15 tokens.
  constexpr int64_t kGemmTokens = 16;

  if (avx2 && p.n_tokens < kGemmTokens) {
    const int64_t n = p.n_tokens;
    const int64_t nb32 = k / 32;
    // The int16 kernels: AVX2, but for one token on an AVX512-VNNI CPU the 4-row kernel of
    // Q4_0 / Q4_1 (four blocks per register, the quad layout) and Q8_0 (two) (rows4_i16_for),
    // unless a caller asks
    // for the AVX-512 ones (p.isa; tests). Those (one 32-value block per 512-bit multiply) lost
    // on the one AVX-512 CPU measured (Xeon with VNNI/AMX, SmolLM2 Q4_1 tg128: 155 t/s vs
    // AVX2's 202 at 2 threads, 246 vs 300 at 16;
    // bench/results/cpu-smollm2-vs-llamacpp-h100host-isa-ab.md): the same instruction count per
    // block on fewer 512-bit ports.
    quant_detail::RowDotI16Fn i16 = nullptr;
    quant_detail::RowsI16Fn rows4 = nullptr;
    const bool asked512 = p.isa == QuantIsa::kAvx512 || p.isa == QuantIsa::kAvx512Vnni;
    if (p.int16_decode) {
      if (!asked512) {
        i16 = quant_detail::row_dot_i16_avx2(p.weight_dtype);
        rows4 = quant_detail::rows4_i16_for(p.weight_dtype, isa);
      } else if (isa == QuantIsa::kAvx512Vnni) {
        i16 = quant_detail::avx512_vnni::row_dot_i16(p.weight_dtype);
        rows4 = quant_detail::avx512_vnni::rows4_i16(p.weight_dtype);
      } else if (isa == QuantIsa::kAvx512) {
        i16 = quant_detail::avx512::row_dot_i16(p.weight_dtype);
        rows4 = quant_detail::avx512::rows4_i16(p.weight_dtype);
      } else {
        i16 = quant_detail::row_dot_i16_avx2(p.weight_dtype);
        rows4 = quant_detail::rows4_i16_avx2(p.weight_dtype);
      }
    }
    if (i16 != nullptr) {
      // int16 activations: x quantized once per call, then each thread streams its slab of
      // rows, each row unpacked once per group of <= 4 tokens.
      // Grow-only, per calling thread: a decode step allocates nothing.
      // One token on an AVX-512 4-row kernel also takes the quad layout.
      const bool quad = n == 1 && (asked512 ? avx512 : quant_detail::rows4_reads_quad(isa));
      thread_local std::vector<int16_t> qs, qq;
      thread_local std::vector<float> qd, qsum;
      qs.resize(std::max(qs.size(), static_cast<size_t>(n * k)));
      if (quad) qq.resize(std::max(qq.size(), static_cast<size_t>(k)));
      qd.resize(std::max(qd.size(), static_cast<size_t>(n * nb32)));
      qsum.resize(std::max(qsum.size(), static_cast<size_t>(n * nb32)));
      for (int64_t t = 0; t < n; ++t) {
        quant_detail::quantize_row_q16_avx2(p.x + t * x_stride, k, qs.data() + t * k,
                                            qd.data() + t * nb32, qsum.data() + t * nb32,
                                            quad ? qq.data() : nullptr);
      }
      const int64_t n_groups = (n + 3) / 4;
      const int64_t group = (n + n_groups - 1) / n_groups;
      // NOTE: pointers, not the thread_local vectors, inside the parallel region (the other
      // threads would see their own, empty, vectors).
      const int16_t* const aq = qs.data();
      const float* const ad = qd.data();
      const float* const as = qsum.data();
      const int16_t* const aqq = quad ? qq.data() : nullptr;
      if (n == 1) {
        // One token: each thread's contiguous slab of 4-row tiles, striped (rows4_striped),
        // then the last < 4 rows one at a time.
        const quant_detail::Q16Act a{aq, ad, as, aqq};
        const int64_t tiles = p.out_features / 4;
        const auto emit = [&](int64_t r, float v) {
          p.out[r] = v + (p.bias != nullptr ? p.bias[r] : 0.0f);
        };
        parallel_ranges(tiles, [&](int64_t t0, int64_t t1) {
          quant_detail::rows4_striped(rows4, w, row_bytes, 4 * t0, t1 - t0, k, a, emit);
        });
        for (int64_t r = 4 * tiles; r < p.out_features; ++r) {
          float v;
          i16(w + r * row_bytes, k, a, 1, &v);
          emit(r, v);
        }
        return ok_status();
      }
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < p.out_features; ++r) {
        const float bias = p.bias != nullptr ? p.bias[r] : 0.0f;
        for (int64_t t0 = 0; t0 < n; t0 += group) {
          const int nt = static_cast<int>(std::min(group, n - t0));
          const quant_detail::Q16Act a{aq + t0 * k, ad + t0 * nb32, as + t0 * nb32};
          float res[4];
          i16(w + r * row_bytes, k, a, nt, res);
          for (int i = 0; i < nt; ++i) p.out[(t0 + i) * out_stride + r] = res[i] + bias;
        }
      }
      return ok_status();
    }
    std::vector<float> xsum(static_cast<size_t>(n * nb32));
    for (int64_t t = 0; t < n; ++t) {
      block_sums32_avx2(p.x + t * x_stride, nb32, xsum.data() + t * nb32);
    }
    if (n == 1) {
      // Each thread streams its contiguous slab of rows, one row per kernel call.
      const quant_detail::RowDotF32Fn row = quant_detail::row_dot_f32_avx2(p.weight_dtype);
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < p.out_features; ++r) {
        const float bias = p.bias != nullptr ? p.bias[r] : 0.0f;
        p.out[r] = row(w + r * row_bytes, p.x, xsum.data(), k) + bias;
      }
      return ok_status();
    }
    // 2..15 tokens: each row is unpacked once per group of <= 4 tokens; the groups split the
    // tokens evenly (5 = 3 + 2, 7 = 4 + 3, 9 = 3 + 3 + 3, ...).
    const quant_detail::RowDotF32TokensFn rows =
        quant_detail::row_dot_f32_tokens_avx2(p.weight_dtype);
    const int64_t n_groups = (n + 3) / 4;
    const int64_t group = (n + n_groups - 1) / n_groups;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < p.out_features; ++r) {
      const float bias = p.bias != nullptr ? p.bias[r] : 0.0f;
      for (int64_t t0 = 0; t0 < n; t0 += group) {
        const int nt = static_cast<int>(std::min(group, n - t0));
        float res[4];
        rows(w + r * row_bytes, k, p.x + t0 * x_stride, x_stride, xsum.data() + t0 * nb32, nt, res);
        for (int i = 0; i < nt; ++i) p.out[(t0 + i) * out_stride + r] = res[i] + bias;
      }
    }
    return ok_status();
  }

  // Prefill and larger batches: the GEMM of linear.cpp, its packer dequantizing each panel of
  // weights (every weight is unpacked once per call, the multiply is register-blocked).
  if (avx2) {
    return linear_quant_gemm({.x = p.x,
                              .x_stride = x_stride,
                              .w = p.weight,
                              .w_dtype = p.weight_dtype,
                              .w_stride = row_bytes / info_bytes * block,
                              .bias = p.bias,
                              .bias_dtype = DType::kF32,
                              .out = p.out,
                              .out_stride = out_stride,
                              .n_tokens = p.n_tokens,
                              .in_features = k,
                              .out_features = p.out_features},
                             avx512 ? CpuIsa::kAvx512 : CpuIsa::kAvx2);
  }

  // The reference path (force_scalar, or no AVX2): dequantize each row, then scalar dots.
  Status status = ok_status();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(k));
    Status local = ok_status();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < p.out_features; ++r) {
      if (!local.ok()) continue;
      local = dequantize_row(p.weight_dtype, w + r * row_bytes, row.data(), k);
      if (!local.ok()) continue;
      const float bias = p.bias != nullptr ? p.bias[r] : 0.0f;
      for (int64_t t = 0; t < p.n_tokens; ++t) {
        p.out[t * out_stride + r] = dot_scalar(p.x + t * x_stride, row.data(), k) + bias;
      }
    }
    if (!local.ok()) {
#pragma omp critical
      status = local;
    }
  }
  return status;
}

namespace quant_detail {

RowsI16Fn rows4_i16_for(DType dt, QuantIsa isa) {
#if defined(STRATA_QUANT_HAVE_AVX512)
  if (isa == QuantIsa::kAvx512Vnni &&
      (dt == DType::kQ4_0 || dt == DType::kQ4_1 || dt == DType::kQ8_0)) {
    return avx512_vnni::rows4_i16(dt);
  }
#else
  (void)isa;
#endif
  return rows4_i16_avx2(dt);
}

}  // namespace quant_detail

namespace {

// The 4-row tiles of every part in one OpenMP region: tile(i, w, nr, res) computes rows
// [r0, r0 + nr) of part i (nr <= 4) into res.
template <typename TileFn>
void run_part_tiles(const DecodePart* parts, const int64_t* tile_end, int64_t tiles,
                    bool accumulate, const TileFn& tile) {
  parallel_for_static(tiles, [&](int64_t t) {
    int i;
    int64_t r0, nr;
    quant_detail::locate_tile(tile_end, t, &i, &r0, &nr, parts);
    const DecodePart& part = parts[i];
    float res[4];
    tile(i, static_cast<const uint8_t*>(part.weight) + r0 * part.row_bytes, nr, res);
    quant_detail::store_tile(part, r0, nr, res, accumulate);
  });
}

}  // namespace

bool quant_decode_parts(const float* x, int64_t in_features, const DecodePart* parts, int n_parts,
                        bool accumulate) {
  constexpr int kMaxParts = quant_detail::DecodeTilesI16::kMaxParts;
  const int64_t k = in_features;
  const QuantIsa isa = quant_detail::resolve_quant_isa(QuantIsa::kBest);
  if (n_parts < 1 || n_parts > kMaxParts || k % 32 != 0 || isa == QuantIsa::kScalar) {
    return false;
  }
  if (!quant_decode_int8()) {  // int16 activations, x quantized once by the calling thread
    quant_detail::DecodeTilesI16 tiles;
    if (!tiles.init(parts, n_parts, k, isa)) return false;
    const quant_detail::Q16Act a =
        quant_detail::thread_scratch(0, k, quant_detail::rows4_reads_quad(isa)).quantize(x, k);
    parallel_ranges(tiles.tiles, [&](int64_t t0, int64_t t1) { tiles.run(t0, t1, a, accumulate); });
    return true;
  }
  quant_detail::TileDotFn tile8[kMaxParts];
  int64_t tile_end[kMaxParts];  // prefix sums of each part's 4-row tiles
  int64_t tiles = 0;
  for (int i = 0; i < n_parts; ++i) {
    const DType dt = parts[i].weight_dtype;
    tile8[i] = quant_detail::tile_dot_isa(dt, isa);
    if (tile8[i] == nullptr || k % dtype_info(dt).block_size != 0) return false;
    tiles += (parts[i].rows + 3) / 4;
    tile_end[i] = tiles;
  }
  // The same grow-only per-thread activation buffers as quant_linear_f32.
  // NOTE: pointers, not the thread_local vectors, inside the parallel region.
  const int64_t nb32 = k / 32;
  thread_local std::vector<float> qd, qsum;
  qd.resize(std::max(qd.size(), static_cast<size_t>(nb32)));
  qsum.resize(std::max(qsum.size(), static_cast<size_t>(nb32)));
  // x rounded to int8 per 32 values as quant_linear's int8 tiles round it (the same quantizer,
  // the same 4-row tiles: bit-identical to quant_linear on each part).
  thread_local std::vector<int8_t> q8;
  q8.resize(std::max(q8.size(), static_cast<size_t>(k)));
  quantize_row_q8(x, k, q8.data(), qd.data(), qsum.data(), isa);
  const Q8Act a{q8.data(), qd.data(), qsum.data()};
  run_part_tiles(parts, tile_end, tiles, accumulate,
                 [&](int i, const uint8_t* w, int64_t nr, float* res) {
                   tile8[i](w, parts[i].row_bytes, static_cast<int>(nr), k, a, 1, res);
                 });
  return true;
}

namespace quant_detail {

bool DecodeTilesI16::init(const DecodePart* ps, int n, int64_t in, QuantIsa isa) {
  if (n < 1 || n > kMaxParts) return false;
  parts = ps;
  n_parts = n;
  k = in;
  tiles = 0;
  for (int i = 0; i < n; ++i) {
    const DType dt = ps[i].weight_dtype;
    i16[i] = row_dot_i16_avx2(dt);
    rows4[i] = rows4_i16_for(dt, isa);
    if (i16[i] == nullptr || rows4[i] == nullptr || in % dtype_info(dt).block_size != 0) {
      return false;
    }
    tiles += (ps[i].rows + 3) / 4;
    tile_end[i] = tiles;
  }
  return true;
}

void DecodeTilesI16::run(int64_t t0, int64_t t1, const Q16Act& a, bool accumulate) const {
  int64_t start = 0;  // part i's first tile
  for (int i = 0; i < n_parts && start < t1; start = tile_end[i], ++i) {
    const int64_t tb = std::max(t0, start), te = std::min(t1, tile_end[i]);
    if (tb >= te) continue;
    const DecodePart& part = parts[i];
    const int64_t r0 = 4 * (tb - start), r1 = std::min(part.rows, 4 * (te - start));
    const int64_t q = (r1 - r0) / 4;
    const auto* w = static_cast<const uint8_t*>(part.weight);
    const auto emit = [&](int64_t r, float res) { store_tile(part, r, 1, &res, accumulate); };
    rows4_striped(rows4[i], w, part.row_bytes, r0, q, k, a, emit);
    for (int64_t r = r0 + 4 * q; r < r1; ++r) {  // the part's last tile, < 4 rows
      float res;
      i16[i](w + r * part.row_bytes, k, a, 1, &res);
      emit(r, res);
    }
  }
}

void store_tile(const DecodePart& part, int64_t r0, int64_t nr, const float* res, bool accumulate) {
  for (int64_t j = 0; j < nr; ++j) {
    const float v =
        res[j] + (part.bias != nullptr ? load_as_f32(part.bias, part.bias_dtype, r0 + j) : 0.0f);
    part.out[r0 + j] = accumulate ? part.out[r0 + j] + v : v;
  }
}

ThreadScratch thread_scratch(int64_t k, int64_t n, bool quad) {
  thread_local std::vector<float> h, d, s;
  thread_local std::vector<int16_t> qs, qq;
  h.resize(std::max(h.size(), static_cast<size_t>(k)));
  qs.resize(std::max(qs.size(), static_cast<size_t>(n)));
  if (quad) qq.resize(std::max(qq.size(), static_cast<size_t>(n)));
  d.resize(std::max(d.size(), static_cast<size_t>(n / 32)));
  s.resize(std::max(s.size(), static_cast<size_t>(n / 32)));
  return {h.data(), qs.data(), d.data(), s.data(), quad ? qq.data() : nullptr};
}

}  // namespace quant_detail

}  // namespace strata::cpu

namespace strata::cpu {

bool quant_ffn_decode(const FfnDecodeArgs& f) {
  const int64_t k = f.hidden, F = f.ffn_dim;
  const QuantIsa isa = quant_detail::resolve_quant_isa(QuantIsa::kBest);
  if (isa == QuantIsa::kScalar || quant_decode_int8() || k % 32 != 0 || k % 4 != 0 || F % 32 != 0 ||
      F % 8 != 0 || f.norm.weight == nullptr) {
    return false;
  }
  const DecodePart* parts[3] = {&f.gate, &f.up, &f.down};
  quant_detail::RowsI16Fn rows4[3];
  for (int i = 0; i < 3; ++i) {
    const DType dt = parts[i]->weight_dtype;
    const DTypeInfo& info = dtype_info(dt);
    rows4[i] = info.is_quantized ? quant_detail::rows4_i16_for(dt, isa) : nullptr;
    const int64_t in = i < 2 ? k : F;
    if (rows4[i] == nullptr || in % info.block_size != 0 ||
        parts[i]->row_bytes != in / info.block_size * info.block_bytes ||
        parts[i]->rows != (i < 2 ? F : k)) {
      return false;
    }
  }
  RmsNormParams norm = f.norm;
  norm.n_tokens = 1;
  norm.hidden = k;
  const auto bias_at = [](const DecodePart& p, int64_t r) {
    return p.bias != nullptr ? load_as_f32(p.bias, p.bias_dtype, r) : 0.0f;
  };
  const auto* wg = static_cast<const uint8_t*>(f.gate.weight);
  const auto* wu = static_cast<const uint8_t*>(f.up.weight);
  const auto* wd = static_cast<const uint8_t*>(f.down.weight);
  const int64_t nk = std::max(k, F);
  // The body every thread runs: tid of nt, `barrier` waits for all nt. Items are split into
  // contiguous ranges per thread (OpenMP's static schedule).
  const bool quad = quant_detail::rows4_reads_quad(isa);
  static PhaseClock clock("MLP block", std::array{"norm", "gate_up", "wait", "down"});
  const auto body = [&](int tid, int nt, const auto& barrier) {
    PhaseClock::Call phases(clock, tid == 0);
    // Per thread: h, then act, as int16 blocks; past h, the thread's g and u (<= 2 F floats).
    const quant_detail::ThreadScratch sc = quant_detail::thread_scratch(k + 2 * F, nk, quad);
    float* h = sc.h;
    rms_norm_row(norm, f.x, h);
    const quant_detail::Q16Act a = sc.quantize(h, k);
    phases.mark();
    // The thread's 8-row tiles of gate and up, striped (rows4_striped, a gate and an up tile
    // per step: eight forward streams), then the activation over its rows.
    const int64_t n8 = F / 8;
    const int64_t lo = 8 * (n8 * tid / nt), q = 2 * (n8 * (tid + 1) / nt - n8 * tid / nt);
    float* gu = sc.h + k;  // g of the thread's 4q rows, then u
    const int64_t pf_g = quant_detail::kStripePrefetchRows * f.gate.row_bytes;
    const int64_t pf_u = quant_detail::kStripePrefetchRows * f.up.row_bytes;
    for (int64_t j = 0; j < q; ++j) {
      float g[4], u[4];
      rows4[0](wg + (lo + j) * f.gate.row_bytes, q * f.gate.row_bytes, k, a, g, pf_g);
      rows4[1](wu + (lo + j) * f.up.row_bytes, q * f.up.row_bytes, k, a, u, pf_u);
      for (int i = 0; i < 4; ++i) {
        gu[i * q + j] = g[i] + bias_at(f.gate, lo + i * q + j);
        gu[4 * q + i * q + j] = u[i] + bias_at(f.up, lo + i * q + j);
      }
    }
    if (q > 0) gated_act_row(f.act, gu, gu + 4 * q, f.act_out + lo, 4 * q);
    phases.mark();
    barrier();  // act is complete, and every thread has read x
    phases.mark();
    if (tid == 0) std::memcpy(f.h, h, sizeof(float) * static_cast<size_t>(k));
    const quant_detail::Q16Act b = sc.quantize(f.act_out, F);
    const int64_t n4 = k / 4;
    const int64_t t0 = n4 * tid / nt;
    quant_detail::rows4_striped(rows4[2], wd, f.down.row_bytes, 4 * t0, n4 * (tid + 1) / nt - t0, F,
                                b, [&](int64_t r, float v) { f.x[r] += v + bias_at(f.down, r); });
    phases.mark();
  };
  const bool pooled =
      spin_run(spin_threads(), [&](int tid, int nt) { body(tid, nt, [] { spin_barrier(); }); });
  if (!pooled) {
#pragma omp parallel
    body(omp_get_thread_num(), omp_get_num_threads(), [] {
#pragma omp barrier
    });
  }
  return true;
}

}  // namespace strata::cpu
