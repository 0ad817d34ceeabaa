// AVX2 + FMA + F16C kernels for quantized dot products: the int8-activation path (its dot
// kernels and activation quantizer, below) and the f32-activation path's decode kernels
// (row_dot_f32_avx2 / row_dot_f32_tokens_avx2, used by quant_f32.cpp for n_tokens < 16; see
// that section).
//
// Each function carries __attribute__((target(...))), so this file builds without -mavx2 and
// quant.cpp calls into it only after __builtin_cpu_supports says the CPU has the features.
// int8 activations: the math is the scalar kernels' (quant.cpp) with a different summation
// order:
//   per 32 values: u8 weights x i8 activations -> maddubs (i16 pairs) -> madd with ones (i32)
//   -> f32 -> fused multiply-add with the block's d_w * d_a into a vector accumulator; the
//   min / offset terms c_w * s_a go to a second accumulator. maddubs cannot saturate here:
//   weights are <= 63 (Q6_K) or |q| <= 127 with the sign moved to the activation (Q8_0), and
//   activations are within [-127, 127], so a pair is at most 2 * 128 * 127 < 32767.
// Tiles: with several tokens a weight block is unpacked once for up to 4 of them; with one
// token (decode) the 32-value types take 4 weight rows per pass, sharing each activation load
// and one horizontal reduction; a lone row and token alternates two accumulators to hide FMA
// latency.
#include "backends/cpu/quant_impl.h"

#if defined(STRATA_QUANT_HAVE_AVX2)

#include <immintrin.h>

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))
// Fixed-trip loops over tokens and blocks must be unrolled so accumulators stay in registers
// (GCC at -O2 otherwise keeps acc[t][u & 1] on the stack and chains through store forwarding).
#define STRATA_PRAGMA_(x) _Pragma(#x)
#define STRATA_UNROLL STRATA_PRAGMA_(GCC unroll 8)

namespace strata::cpu::quant_detail {
namespace {

STRATA_AVX2 inline float f16_avx(const uint8_t* p) {
  return _cvtsh_ss(load_u16(p));
}

STRATA_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// i32x8 partial sums of u8 w * i8 a over 32 bytes.
STRATA_AVX2 inline __m256i dot_u8i8(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

// 32 unsigned 4-bit values of a Q4 block: value j < 16 = low nibble of qs[j], j + 16 = high.
STRATA_AVX2 inline __m256i unpack_nibbles16(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// 0x10 in byte j where bit j of qh is set.
STRATA_AVX2 inline __m256i fifth_bits(uint32_t qh) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101,
                                         0x0000000000000000);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Eight f16 values `stride` bytes apart as f32. The 16-bit loads are assembled in general
// registers (integer ports, otherwise idle here) so the vector ports only see two inserts and
// one conversion per eight blocks.
STRATA_AVX2 inline __m256 load_f16x8(const uint8_t* p, int64_t stride) {
  uint64_t lo = 0;
  uint64_t hi = 0;
  STRATA_UNROLL
  for (int i = 0; i < 4; ++i) {
    lo |= static_cast<uint64_t>(load_u16(p + i * stride)) << (16 * i);
    hi |= static_cast<uint64_t>(load_u16(p + (i + 4) * stride)) << (16 * i);
  }
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<int64_t>(hi), static_cast<int64_t>(lo)));
}

// Per-type facts of the 32-value block types: bytes per block, where d and m sit, the offset
// subtracted from the quantized values (c_w = m, or -offset * d), and the value unpacking.
template <DType kT>
struct Blk32 {
  static constexpr bool kQ8 = kT == DType::kQ8_0;
  static constexpr bool kHasMin = kT == DType::kQ4_1 || kT == DType::kQ5_1;
  static constexpr bool kFive = kT == DType::kQ5_0 || kT == DType::kQ5_1;
  static constexpr int64_t kBytes = kQ8 ? 34 : 18 + (kHasMin ? 2 : 0) + (kFive ? 4 : 0);
  static constexpr float kOffset = kT == DType::kQ4_0 ? 8.0f : kT == DType::kQ5_0 ? 16.0f : 0.0f;

  // 32 weight values of the block at b: unsigned (signed for Q8_0).
  STRATA_AVX2 static inline __m256i values(const uint8_t* b) {
    if constexpr (kQ8) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    } else {
      constexpr int64_t kQh = kHasMin ? 4 : 2;
      constexpr int64_t kQs = kQh + (kFive ? 4 : 0);
      const __m256i v = unpack_nibbles16(b + kQs);
      if constexpr (kFive) return _mm256_or_si256(v, fifth_bits(load_u32(b + kQh)));
      return v;
    }
  }
};

template <DType kT>
STRATA_AVX2 inline __m256i block_dot(__m256i w, __m256i a) {
  if constexpr (kT == DType::kQ8_0) {
    // Signed x signed: move w's sign onto a so maddubs sees |w| (u8) x +-a (i8).
    return dot_u8i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  } else {
    return dot_u8i8(w, a);
  }
}

// Sums of four vectors: [sum(v0), sum(v1), sum(v2), sum(v3)].
STRATA_AVX2 inline __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// out[r * kNt + t] for kNr rows (row_bytes apart) x kNt tokens, kNr * kNt <= 4.
// Blocks are taken eight at a time: their d_w (and m_w) are converted together, the products
// d_w * d_a are formed in one vector multiply per row and token, and the c_w * s_a terms go
// into a vector accumulator, so the per-block work is unpack, one integer dot, one convert and
// one FMA. Each activation block is loaded once for all rows and each weight block unpacked
// once for all tokens. A tail of < 8 blocks runs the same math one block at a time.
template <DType kT, int kNr, int kNt>
STRATA_AVX2 void dot_blk32(const uint8_t* w, int64_t row_bytes, int64_t n, const Q8Act& a,
                           float* out) {
  using B = Blk32<kT>;
  constexpr bool kHasC = B::kHasMin || B::kOffset != 0.0f;
  constexpr int kAcc = kNr * kNt == 1 ? 2 : 1;  // independent FMA chains per output
  const int64_t nb = n / 32;
  __m256 acc[kNr][kNt][kAcc];
  __m256 macc[kNr][kNt];
  STRATA_UNROLL
  for (int r = 0; r < kNr; ++r) {
    STRATA_UNROLL
    for (int t = 0; t < kNt; ++t) {
      macc[r][t] = _mm256_setzero_ps();
      STRATA_UNROLL
      for (int u = 0; u < kAcc; ++u) acc[r][t][u] = _mm256_setzero_ps();
    }
  }
  int64_t j = 0;
  for (; j + 8 <= nb; j += 8) {
    alignas(32) float scale[kNr][kNt][8];
    STRATA_UNROLL
    for (int r = 0; r < kNr; ++r) {
      const uint8_t* wb = w + r * row_bytes + j * B::kBytes;
      if constexpr (kNr == 4 && kNt == 1) {
        // One token (decode): the 4 rows are read block-interleaved, as in the int16 kernels;
        // prefetch the same blocks of the tile after next (16 rows on).
        for (int64_t off = 0; off < 8 * B::kBytes; off += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(wb + 16 * row_bytes + off), _MM_HINT_T0);
        }
      }
      const __m256 dw = load_f16x8(wb, B::kBytes);
      __m256 cw = _mm256_setzero_ps();
      if constexpr (B::kHasMin) {
        cw = load_f16x8(wb + 2, B::kBytes);
      } else if constexpr (kHasC) {
        cw = _mm256_mul_ps(dw, _mm256_set1_ps(-B::kOffset));
      }
      STRATA_UNROLL
      for (int t = 0; t < kNt; ++t) {
        const int64_t ab = t * nb + j;
        _mm256_store_ps(scale[r][t], _mm256_mul_ps(dw, _mm256_loadu_ps(a.d + ab)));
        if constexpr (kHasC)
          macc[r][t] = _mm256_fmadd_ps(cw, _mm256_loadu_ps(a.s + ab), macc[r][t]);
      }
    }
    STRATA_UNROLL
    for (int u = 0; u < 8; ++u) {
      __m256i av[kNt];
      STRATA_UNROLL
      for (int t = 0; t < kNt; ++t) {
        av[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + 32 * (t * nb + j + u)));
      }
      STRATA_UNROLL
      for (int r = 0; r < kNr; ++r) {
        const __m256i wv = B::values(w + r * row_bytes + (j + u) * B::kBytes);
        STRATA_UNROLL
        for (int t = 0; t < kNt; ++t) {
          const __m256 p = _mm256_cvtepi32_ps(block_dot<kT>(wv, av[t]));
          __m256& dst = acc[r][t][u % kAcc];
          dst = _mm256_fmadd_ps(_mm256_broadcast_ss(&scale[r][t][u]), p, dst);
        }
      }
    }
  }
  for (; j < nb; ++j) {
    STRATA_UNROLL
    for (int r = 0; r < kNr; ++r) {
      const uint8_t* wb = w + r * row_bytes + j * B::kBytes;
      const float dw = f16_avx(wb);
      float cw = 0.0f;
      if constexpr (B::kHasMin) {
        cw = f16_avx(wb + 2);
      } else {
        cw = -B::kOffset * dw;
      }
      const __m256i wv = B::values(wb);
      STRATA_UNROLL
      for (int t = 0; t < kNt; ++t) {
        const int64_t ab = t * nb + j;
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + 32 * ab));
        const __m256 p = _mm256_cvtepi32_ps(block_dot<kT>(wv, av));
        acc[r][t][0] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d[ab]), p, acc[r][t][0]);
        if constexpr (kHasC) {
          macc[r][t] = _mm256_add_ps(macc[r][t], _mm256_setr_ps(cw * a.s[ab], 0, 0, 0, 0, 0, 0, 0));
        }
      }
    }
  }
  __m256 tot[kNr * kNt];
  STRATA_UNROLL
  for (int r = 0; r < kNr; ++r) {
    STRATA_UNROLL
    for (int t = 0; t < kNt; ++t) {
      __m256 v = _mm256_add_ps(acc[r][t][0], macc[r][t]);
      if constexpr (kAcc == 2) v = _mm256_add_ps(v, acc[r][t][1]);
      tot[r * kNt + t] = v;
    }
  }
  if constexpr (kNr * kNt == 4) {
    _mm_storeu_ps(out, hsum4(tot[0], tot[1], tot[2], tot[3]));
  } else {
    STRATA_UNROLL
    for (int i = 0; i < kNr * kNt; ++i) out[i] = hsum(tot[i]);
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32 per 256-value super-block, each meeting one activation
// block. The dmin * m_j * s_a terms are gathered 8 at a time into a vector accumulator.
template <bool kFiveBit, int kNt>
STRATA_AVX2 void dot_q45_k(const uint8_t* w, int64_t n, const Q8Act& a, float* out) {
  constexpr int64_t kBytes = kFiveBit ? 176 : 144;
  const int64_t nsb = n / kQK;
  const int64_t nb = n / 32;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[kNt][2];
  __m256 macc[kNt];
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) {
    acc[t][0] = acc[t][1] = macc[t] = _mm256_setzero_ps();
  }
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* b = w + sb * kBytes;
    const float d = f16_avx(b);
    const float dmin = f16_avx(b + 2);
    alignas(16) uint8_t sc[8];
    alignas(16) uint8_t mn[8];
    for (int j = 0; j < 8; ++j) k_scale_min(b + 4, j, &sc[j], &mn[j]);
    const uint8_t* qs = kFiveBit ? b + 48 : b + 16;
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFiveBit) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    const __m256 mv = _mm256_mul_ps(
        _mm256_set1_ps(dmin),
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<__m128i*>(mn)))));
    STRATA_UNROLL
    for (int t = 0; t < kNt; ++t) {
      const __m256 sv = _mm256_loadu_ps(a.s + t * nb + sb * 8);
      macc[t] = _mm256_fmadd_ps(mv, sv, macc[t]);
    }
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * i));
      __m256i v0 = _mm256_and_si256(q, low4);
      __m256i v1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFiveBit) {
        const __m256i one = _mm256_set1_epi8(1);
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * i + 1), one);
        v0 = _mm256_or_si256(v0, _mm256_slli_epi16(h0, 4));
        v1 = _mm256_or_si256(v1, _mm256_slli_epi16(h1, 4));
      }
      const float ds0 = d * static_cast<float>(sc[2 * i]);
      const float ds1 = d * static_cast<float>(sc[2 * i + 1]);
      STRATA_UNROLL
      for (int t = 0; t < kNt; ++t) {
        const int64_t ab = t * nb + sb * 8 + 2 * i;
        const int8_t* aq = a.qs + 32 * ab;
        const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq));
        const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(aq + 32));
        acc[t][0] = _mm256_fmadd_ps(_mm256_set1_ps(ds0 * a.d[ab]),
                                    _mm256_cvtepi32_ps(dot_u8i8(v0, a0)), acc[t][0]);
        acc[t][1] = _mm256_fmadd_ps(_mm256_set1_ps(ds1 * a.d[ab + 1]),
                                    _mm256_cvtepi32_ps(dot_u8i8(v1, a1)), acc[t][1]);
      }
    }
  }
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) out[t] = hsum(_mm256_add_ps(acc[t][0], acc[t][1])) - hsum(macc[t]);
}

// Q6_K: per activation block g = 4h + t the 6-bit values are rebuilt from ql / qh, the -32
// offset is taken off in i16 (maddubs(q, a) - maddubs(32, a)), and the two 16-value scales are
// applied by madd with a {sc0 x 8, sc1 x 8} i16 vector.
template <int kNt>
STRATA_AVX2 void dot_q6_k(const uint8_t* w, int64_t n, const Q8Act& a, float* out) {
  const int64_t nsb = n / kQK;
  const int64_t nb = n / 32;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i two = _mm256_set1_epi8(3);
  const __m256i k32 = _mm256_set1_epi8(32);
  __m256 acc[kNt][2];
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* b = w + sb * 210;
    const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
    const float d = f16_avx(b + 208);
    STRATA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      __m256i v[4];
      v[0] = _mm256_and_si256(ql0, low4);
      v[1] = _mm256_and_si256(ql1, low4);
      v[2] = _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4);
      v[3] = _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4);
      STRATA_UNROLL
      for (int t4 = 0; t4 < 4; ++t4) {
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t4), two);
        v[t4] = _mm256_or_si256(v[t4], _mm256_slli_epi16(hi, 4));
      }
      STRATA_UNROLL
      for (int t4 = 0; t4 < 4; ++t4) {
        const int g = 4 * h + t4;
        const __m256i scv =
            _mm256_set_m128i(_mm_set1_epi16(scales[2 * g + 1]), _mm_set1_epi16(scales[2 * g]));
        STRATA_UNROLL
        for (int t = 0; t < kNt; ++t) {
          const int64_t ab = t * nb + sb * 8 + g;
          const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs + 32 * ab));
          const __m256i p16 =
              _mm256_sub_epi16(_mm256_maddubs_epi16(v[t4], av), _mm256_maddubs_epi16(k32, av));
          const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, scv));
          acc[t][t4 & 1] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d[ab]), p, acc[t][t4 & 1]);
        }
      }
    }
  }
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) out[t] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
}

template <DType kT>
void tile_dot_blk32(const uint8_t* w, int64_t row_bytes, int nr, int64_t n, const Q8Act& a, int nt,
                    float* out) {
  if (nt == 1) {
    switch (nr) {
      case 1:
        return dot_blk32<kT, 1, 1>(w, row_bytes, n, a, out);
      case 2:
        return dot_blk32<kT, 2, 1>(w, row_bytes, n, a, out);
      case 3:
        return dot_blk32<kT, 3, 1>(w, row_bytes, n, a, out);
      default:
        return dot_blk32<kT, 4, 1>(w, row_bytes, n, a, out);
    }
  }
  for (int r = 0; r < nr; ++r) {
    const uint8_t* wr = w + r * row_bytes;
    float* o = out + r * nt;
    switch (nt) {
      case 2:
        dot_blk32<kT, 1, 2>(wr, row_bytes, n, a, o);
        break;
      case 3:
        dot_blk32<kT, 1, 3>(wr, row_bytes, n, a, o);
        break;
      default:
        dot_blk32<kT, 1, 4>(wr, row_bytes, n, a, o);
        break;
    }
  }
}

// The K-quant kernels work one row at a time (rows of >= 256 values amortize the row costs).
template <void (*kFn1)(const uint8_t*, int64_t, const Q8Act&, float*),
          void (*kFn2)(const uint8_t*, int64_t, const Q8Act&, float*),
          void (*kFn3)(const uint8_t*, int64_t, const Q8Act&, float*),
          void (*kFn4)(const uint8_t*, int64_t, const Q8Act&, float*)>
void tile_dot_rows(const uint8_t* w, int64_t row_bytes, int nr, int64_t n, const Q8Act& a, int nt,
                   float* out) {
  for (int r = 0; r < nr; ++r) {
    const uint8_t* wr = w + r * row_bytes;
    float* o = out + r * nt;
    switch (nt) {
      case 1:
        kFn1(wr, n, a, o);
        break;
      case 2:
        kFn2(wr, n, a, o);
        break;
      case 3:
        kFn3(wr, n, a, o);
        break;
      default:
        kFn4(wr, n, a, o);
        break;
    }
  }
}

// ---- f32-activation kernels (quant_f32.cpp's small-n path) ------------------------------------
// The activation stays f32: the weight's integer values are widened to i32, converted to f32
// and multiplied with x; a block's (K-quants: a 16- or 32-value group's) product sum is scaled
// by its d with one FMA, and offsets / mins use the activation's per-32 block sums sx:
//   Q8_0: d sum(q x);  Q4_0/Q5_0: d sum(q x) - 8 d sx / - 16 d sx;  Q4_1/Q5_1: d sum(q x) + m sx
//   Q4_K/Q5_K sub-block j: d sc_j sum(q x) - dmin m_j sx;  Q6_K: d sc per 16 values of q - 32
// so results equal the f32 dot with the dequantized row up to f32 summation order.
//
// Every kernel reads its weight rows one after another, so a thread's share of W is one
// sequential stream. NOTE: tiles of 4 rows interleaved block by block (one token's 32
// activations held in registers for all 4 rows) were ~5% faster with W in cache but reached
// only 9-13 GB/s per thread streaming W from DRAM against ~22 GB/s for one row at a time
// (Q8_0, 1 thread, software prefetch tried), and a decode step streams the whole model from
// DRAM. One token: one row per call. Several tokens: each weight block is unpacked once for up
// to 4 tokens.

// The low 8 bytes of v as 8 f32 (signed or unsigned bytes).
template <bool kSigned>
STRATA_AVX2 inline __m256 widen8_f32(__m128i v) {
  return _mm256_cvtepi32_ps(kSigned ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v));
}

// One token, one 32-value block at b: sum over its values of q * x as 8 lanes (q unsigned,
// Q8_0 signed; offsets and mins are left to the caller). The values are unpacked in the byte
// domain (Q5: the fifth bit of value j, bit j of qh, ORed in as 0x10) and widened from two
// 128-bit halves, so each block needs no stores.
template <DType kT>
STRATA_AVX2 inline __m256 block_sum_f32(const uint8_t* b, const float* x) {
  using B = Blk32<kT>;
  __m128i lo, hi;  // values 0..15 and 16..31 as bytes
  if constexpr (B::kQ8) {
    lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2));
    hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18));
  } else {
    constexpr int64_t kQh = B::kHasMin ? 4 : 2;
    constexpr int64_t kQs = kQh + (B::kFive ? 4 : 0);
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs));
    lo = _mm_and_si128(q, mask);
    hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    if constexpr (B::kFive) {
      const __m256i fifth = fifth_bits(load_u32(b + kQh));
      lo = _mm_or_si128(lo, _mm256_castsi256_si128(fifth));
      hi = _mm_or_si128(hi, _mm256_extracti128_si256(fifth, 1));
    }
  }
  __m256 s = _mm256_mul_ps(widen8_f32<B::kQ8>(lo), _mm256_loadu_ps(x));
  s = _mm256_fmadd_ps(widen8_f32<B::kQ8>(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
  s = _mm256_fmadd_ps(widen8_f32<B::kQ8>(hi), _mm256_loadu_ps(x + 16), s);
  return _mm256_fmadd_ps(widen8_f32<B::kQ8>(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), s);
}

// One token, one row of n / 32 blocks: dot(row, x), with xsum[j] = sum of x over block j
// for the offset / min terms (a scalar sum). Blocks go in pairs into two accumulators so the
// FMA latency of d * sum never limits the short per-block work.
template <DType kT>
STRATA_AVX2 float row_dot_blk32_f32(const uint8_t* w, const float* x, const float* xsum,
                                    int64_t n) {
  using B = Blk32<kT>;
  const int64_t nb = n / 32;
  constexpr bool kHasC = B::kHasMin || B::kOffset != 0.0f;
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  float macc = 0.0f;
  int64_t j = 0;
  for (; j + 2 <= nb; j += 2) {
    const uint8_t* b0 = w + j * B::kBytes;
    const uint8_t* b1 = b0 + B::kBytes;
    const float d0 = f16_avx(b0);
    const float d1 = f16_avx(b1);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), block_sum_f32<kT>(b0, x + 32 * j), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(d1), block_sum_f32<kT>(b1, x + 32 * j + 32), acc1);
    if constexpr (kHasC) {
      macc += (B::kHasMin ? f16_avx(b0 + 2) : -B::kOffset * d0) * xsum[j];
      macc += (B::kHasMin ? f16_avx(b1 + 2) : -B::kOffset * d1) * xsum[j + 1];
    }
  }
  if (j < nb) {
    const uint8_t* b0 = w + j * B::kBytes;
    const float d0 = f16_avx(b0);
    acc0 = _mm256_fmadd_ps(_mm256_set1_ps(d0), block_sum_f32<kT>(b0, x + 32 * j), acc0);
    if constexpr (kHasC) macc += (B::kHasMin ? f16_avx(b0 + 2) : -B::kOffset * d0) * xsum[j];
  }
  return hsum(_mm256_add_ps(acc0, acc1)) + macc;
}

// 32 weight values of a 32-value block as 4 x 8 f32, in value order (unsigned; Q8_0 signed).
template <DType kT>
STRATA_AVX2 inline void values_f32(const uint8_t* b, __m256 v[4]) {
  using B = Blk32<kT>;
  if constexpr (B::kQ8) {
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i));
      v[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    }
  } else if constexpr (!B::kFive) {
    // Bytes 0..7 hold values 0..7 (low nibbles) and 16..23 (high); bytes 8..15 the rest.
    const uint8_t* qs = b + (B::kHasMin ? 4 : 2);
    const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
    const __m256i hi =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
    const __m256i m4 = _mm256_set1_epi32(0x0F);
    v[0] = _mm256_cvtepi32_ps(_mm256_and_si256(lo, m4));
    v[1] = _mm256_cvtepi32_ps(_mm256_and_si256(hi, m4));
    v[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4));
    v[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4));
  } else {
    alignas(32) uint8_t buf[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(buf), B::values(b));
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(buf + 8 * i));
      v[i] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
    }
  }
}

// sum over 32 values of v * x as 8 lanes.
STRATA_AVX2 inline __m256 mul_sum4(const __m256 v[4], const float* x) {
  __m256 s = _mm256_mul_ps(v[0], _mm256_loadu_ps(x));
  s = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + 8), s);
  s = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + 16), s);
  return _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + 24), s);
}

// One row, kNt (2..4) tokens: out[t] = dot(row, x + t * x_stride). Blocks are taken eight at
// a time: their d_w (and m_w) are converted together and the c_w * sx terms go to a vector
// accumulator; each block is unpacked once for all tokens.
template <DType kT, int kNt>
STRATA_AVX2 void dot_blk32_f32(const uint8_t* w, int64_t n, const float* x, int64_t x_stride,
                               const float* xsum, float* out) {
  using B = Blk32<kT>;
  constexpr bool kHasC = B::kHasMin || B::kOffset != 0.0f;
  const int64_t nb = n / 32;
  __m256 acc[kNt];
  __m256 macc[kNt];
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) acc[t] = macc[t] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= nb; j += 8) {
    const uint8_t* wb = w + j * B::kBytes;
    alignas(32) float dws[8];
    const __m256 dw = load_f16x8(wb, B::kBytes);
    _mm256_store_ps(dws, dw);
    if constexpr (kHasC) {
      __m256 cw;
      if constexpr (B::kHasMin) {
        cw = load_f16x8(wb + 2, B::kBytes);
      } else {
        cw = _mm256_mul_ps(dw, _mm256_set1_ps(-B::kOffset));
      }
      STRATA_UNROLL
      for (int t = 0; t < kNt; ++t)
        macc[t] = _mm256_fmadd_ps(cw, _mm256_loadu_ps(xsum + t * nb + j), macc[t]);
    }
    STRATA_UNROLL
    for (int u = 0; u < 8; ++u) {
      __m256 v[4];
      values_f32<kT>(wb + u * B::kBytes, v);
      const __m256 dv = _mm256_broadcast_ss(&dws[u]);
      STRATA_UNROLL
      for (int t = 0; t < kNt; ++t)
        acc[t] = _mm256_fmadd_ps(dv, mul_sum4(v, x + t * x_stride + 32 * (j + u)), acc[t]);
    }
  }
  for (; j < nb; ++j) {
    const uint8_t* wb = w + j * B::kBytes;
    const float dw = f16_avx(wb);
    const float cw = B::kHasMin ? f16_avx(wb + 2) : -B::kOffset * dw;
    __m256 v[4];
    values_f32<kT>(wb, v);
    STRATA_UNROLL
    for (int t = 0; t < kNt; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw), mul_sum4(v, x + t * x_stride + 32 * j), acc[t]);
      if constexpr (kHasC) {
        macc[t] =
            _mm256_add_ps(macc[t], _mm256_setr_ps(cw * xsum[t * nb + j], 0, 0, 0, 0, 0, 0, 0));
      }
    }
  }
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) out[t] = hsum(_mm256_add_ps(acc[t], macc[t]));
}

// The 6-bit scales and mins of a Q4_K / Q5_K super-block (its 12 scale bytes at p) as bytes:
// out[0..1] = sc_0..7, out[2..3] = m_0..7 (k_scale_min for all j, on 32-bit words).
inline void k_scales_mins(const uint8_t* p, uint32_t out[4]) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t v[3];
  std::memcpy(v, p, 12);
  out[3] = ((v[2] >> 4) & kLow4) | (((v[1] >> 6) & kLow2) << 4);
  out[2] = v[1] & kLow6;
  out[1] = (v[2] & kLow4) | (((v[0] >> 6) & kLow2) << 4);
  out[0] = v[0] & kLow6;
}

// Eight bytes (two words) as 8 f32.
STRATA_AVX2 inline __m256 u8x8_f32(const uint32_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Q4_K / Q5_K, one row, kNt (1..4) tokens: per sub-block pair i the 32 bytes qs[32 i, 32 i + 32)
// hold sub-block 2 i (low nibbles) and 2 i + 1 (high); the dmin * m_j * sx terms go 8 at a time
// into macc.
template <bool kFiveBit, int kNt>
STRATA_AVX2 void dot_q45_k_f32(const uint8_t* w, int64_t n, const float* x, int64_t x_stride,
                               const float* xsum, float* out) {
  constexpr int64_t kBytes = kFiveBit ? 176 : 144;
  const int64_t nsb = n / kQK;
  const int64_t nb = n / 32;
  const __m256i m4 = _mm256_set1_epi32(0x0F);
  constexpr int kAcc = kNt <= 2 ? 2 : 1;  // independent FMA chains per token
  __m256 acc[kNt][kAcc];
  __m256 macc[kNt];
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) {
    macc[t] = _mm256_setzero_ps();
    STRATA_UNROLL
    for (int u = 0; u < kAcc; ++u) acc[t][u] = _mm256_setzero_ps();
  }
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* b = w + sb * kBytes;
    // d * sc_j and dmin * m_j for the 8 sub-blocks, as vectors (scales unpacked 4 at a time).
    uint32_t scm[4];
    k_scales_mins(b + 4, scm);
    alignas(32) float ds[8];
    _mm256_store_ps(ds, _mm256_mul_ps(_mm256_set1_ps(f16_avx(b)), u8x8_f32(scm)));
    const __m256 mv = _mm256_mul_ps(_mm256_set1_ps(f16_avx(b + 2)), u8x8_f32(scm + 2));
    STRATA_UNROLL
    for (int t = 0; t < kNt; ++t)
      macc[t] = _mm256_fmadd_ps(mv, _mm256_loadu_ps(xsum + t * nb + sb * 8), macc[t]);
    const uint8_t* qs = kFiveBit ? b + 48 : b + 16;
    alignas(32) uint8_t buf[64];  // Q5_K: one sub-block pair's 5-bit values
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint8_t* src = qs + 32 * i;
      if constexpr (kFiveBit) {
        const __m256i low4 = _mm256_set1_epi8(0x0F);
        const __m256i one = _mm256_set1_epi8(1);
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
        const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), one);
        const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * i + 1), one);
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf),
                           _mm256_or_si256(_mm256_and_si256(q, low4), _mm256_slli_epi16(h0, 4)));
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf + 32),
                           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), low4),
                                           _mm256_slli_epi16(h1, 4)));
      }
      __m256 v0[4];
      __m256 v1[4];
      STRATA_UNROLL
      for (int k = 0; k < 4; ++k) {
        if constexpr (kFiveBit) {
          v0[k] = _mm256_cvtepi32_ps(
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(buf + 8 * k))));
          v1[k] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(buf + 32 + 8 * k))));
        } else {
          const __m256i a =
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8 * k)));
          v0[k] = _mm256_cvtepi32_ps(_mm256_and_si256(a, m4));
          v1[k] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
        }
      }
      const __m256 ds0 = _mm256_broadcast_ss(&ds[2 * i]);
      const __m256 ds1 = _mm256_broadcast_ss(&ds[2 * i + 1]);
      STRATA_UNROLL
      for (int t = 0; t < kNt; ++t) {
        const float* xt = x + t * x_stride + sb * kQK + 64 * i;
        acc[t][0] = _mm256_fmadd_ps(ds0, mul_sum4(v0, xt), acc[t][0]);
        acc[t][kAcc - 1] = _mm256_fmadd_ps(ds1, mul_sum4(v1, xt + 32), acc[t][kAcc - 1]);
      }
    }
  }
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) {
    __m256 v = acc[t][0];
    if constexpr (kAcc == 2) v = _mm256_add_ps(v, acc[t][1]);
    out[t] = hsum(v) - hsum(macc[t]);
  }
}

// Q6_K, one row, kNt (1..4) tokens: per half h the values q - 32 of 128 elements are rebuilt as i8
// into buf, then each 16-value group is widened, multiplied with x and scaled by d * sc.
template <int kNt>
STRATA_AVX2 void dot_q6_k_f32(const uint8_t* w, int64_t n, const float* x, int64_t x_stride,
                              const float* /*xsum*/, float* out) {
  const int64_t nsb = n / kQK;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i three = _mm256_set1_epi8(3);
  const __m256i k32 = _mm256_set1_epi8(32);
  __m256 acc[kNt][2];
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* b = w + sb * 210;
    // d * sc for the 16 groups of 16 values.
    const __m256 d = _mm256_set1_ps(f16_avx(b + 208));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    alignas(32) float ds[16];
    _mm256_store_ps(ds, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_store_ps(
        ds + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    STRATA_UNROLL
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      __m256i v[4];
      v[0] = _mm256_and_si256(ql0, low4);
      v[1] = _mm256_and_si256(ql1, low4);
      v[2] = _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4);
      v[3] = _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4);
      alignas(32) int8_t buf[128];
      STRATA_UNROLL
      for (int t4 = 0; t4 < 4; ++t4) {
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t4), three);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(v[t4], _mm256_slli_epi16(hi, 4)), k32);
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf + 32 * t4), q);
      }
      STRATA_UNROLL
      for (int t4 = 0; t4 < 4; ++t4) {
        const int g = 4 * h + t4;
        __m256 f[4];
        STRATA_UNROLL
        for (int k = 0; k < 4; ++k) {
          f[k] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(buf + 32 * t4 + 8 * k))));
        }
        const __m256 s0 = _mm256_broadcast_ss(&ds[2 * g]);
        const __m256 s1 = _mm256_broadcast_ss(&ds[2 * g + 1]);
        STRATA_UNROLL
        for (int t = 0; t < kNt; ++t) {
          const float* xt = x + t * x_stride + sb * kQK + 32 * g;
          const __m256 p0 = _mm256_fmadd_ps(f[1], _mm256_loadu_ps(xt + 8),
                                            _mm256_mul_ps(f[0], _mm256_loadu_ps(xt)));
          const __m256 p1 = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(xt + 24),
                                            _mm256_mul_ps(f[2], _mm256_loadu_ps(xt + 16)));
          acc[t][0] = _mm256_fmadd_ps(s0, p0, acc[t][0]);
          acc[t][1] = _mm256_fmadd_ps(s1, p1, acc[t][1]);
        }
      }
    }
  }
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) out[t] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
}

using RowF32Fn = void (*)(const uint8_t* w, int64_t n, const float* x, int64_t x_stride,
                          const float* xsum, float* out);

// The one-token K-quant kernels in RowDotF32Fn form.
template <bool kFiveBit>
STRATA_AVX2 float row_dot_q45_k_f32(const uint8_t* w, const float* x, const float* xsum,
                                    int64_t n) {
  float out = 0.0f;
  dot_q45_k_f32<kFiveBit, 1>(w, n, x, 0, xsum, &out);
  return out;
}
STRATA_AVX2 float row_dot_q6_k_f32(const uint8_t* w, const float* x, const float* xsum, int64_t n) {
  float out = 0.0f;
  dot_q6_k_f32<1>(w, n, x, 0, xsum, &out);
  return out;
}

// RowDotF32TokensFn: the kernel for nt tokens.
template <RowDotF32Fn kOne, RowF32Fn kFn2, RowF32Fn kFn3, RowF32Fn kFn4>
STRATA_AVX2 void row_dot_tokens(const uint8_t* w, int64_t n, const float* x, int64_t x_stride,
                                const float* xsum, int nt, float* out) {
  switch (nt) {
    case 1:
      *out = kOne(w, x, xsum, n);
      break;
    case 2:
      kFn2(w, n, x, x_stride, xsum, out);
      break;
    case 3:
      kFn3(w, n, x, x_stride, xsum, out);
      break;
    default:
      kFn4(w, n, x, x_stride, xsum, out);
      break;
  }
}

}  // namespace

TileDotFn tile_dot_avx2(DType dt) {
  switch (dt) {
    case DType::kQ8_0:
      return tile_dot_blk32<DType::kQ8_0>;
    case DType::kQ4_0:
      return tile_dot_blk32<DType::kQ4_0>;
    case DType::kQ4_1:
      return tile_dot_blk32<DType::kQ4_1>;
    case DType::kQ5_0:
      return tile_dot_blk32<DType::kQ5_0>;
    case DType::kQ5_1:
      return tile_dot_blk32<DType::kQ5_1>;
    case DType::kQ4_K:
      return tile_dot_rows<dot_q45_k<false, 1>, dot_q45_k<false, 2>, dot_q45_k<false, 3>,
                           dot_q45_k<false, 4>>;
    case DType::kQ5_K:
      return tile_dot_rows<dot_q45_k<true, 1>, dot_q45_k<true, 2>, dot_q45_k<true, 3>,
                           dot_q45_k<true, 4>>;
    case DType::kQ6_K:
      return tile_dot_rows<dot_q6_k<1>, dot_q6_k<2>, dot_q6_k<3>, dot_q6_k<4>>;
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

RowDotF32Fn row_dot_f32_avx2(DType dt) {
  switch (dt) {
    case DType::kQ8_0:
      return row_dot_blk32_f32<DType::kQ8_0>;
    case DType::kQ4_0:
      return row_dot_blk32_f32<DType::kQ4_0>;
    case DType::kQ4_1:
      return row_dot_blk32_f32<DType::kQ4_1>;
    case DType::kQ5_0:
      return row_dot_blk32_f32<DType::kQ5_0>;
    case DType::kQ5_1:
      return row_dot_blk32_f32<DType::kQ5_1>;
    case DType::kQ4_K:
      return row_dot_q45_k_f32<false>;
    case DType::kQ5_K:
      return row_dot_q45_k_f32<true>;
    case DType::kQ6_K:
      return row_dot_q6_k_f32;
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

RowDotF32TokensFn row_dot_f32_tokens_avx2(DType dt) {
  switch (dt) {
    case DType::kQ8_0:
      return row_dot_tokens<row_dot_blk32_f32<DType::kQ8_0>, dot_blk32_f32<DType::kQ8_0, 2>,
                            dot_blk32_f32<DType::kQ8_0, 3>, dot_blk32_f32<DType::kQ8_0, 4>>;
    case DType::kQ4_0:
      return row_dot_tokens<row_dot_blk32_f32<DType::kQ4_0>, dot_blk32_f32<DType::kQ4_0, 2>,
                            dot_blk32_f32<DType::kQ4_0, 3>, dot_blk32_f32<DType::kQ4_0, 4>>;
    case DType::kQ4_1:
      return row_dot_tokens<row_dot_blk32_f32<DType::kQ4_1>, dot_blk32_f32<DType::kQ4_1, 2>,
                            dot_blk32_f32<DType::kQ4_1, 3>, dot_blk32_f32<DType::kQ4_1, 4>>;
    case DType::kQ5_0:
      return row_dot_tokens<row_dot_blk32_f32<DType::kQ5_0>, dot_blk32_f32<DType::kQ5_0, 2>,
                            dot_blk32_f32<DType::kQ5_0, 3>, dot_blk32_f32<DType::kQ5_0, 4>>;
    case DType::kQ5_1:
      return row_dot_tokens<row_dot_blk32_f32<DType::kQ5_1>, dot_blk32_f32<DType::kQ5_1, 2>,
                            dot_blk32_f32<DType::kQ5_1, 3>, dot_blk32_f32<DType::kQ5_1, 4>>;
    case DType::kQ4_K:
      return row_dot_tokens<row_dot_q45_k_f32<false>, dot_q45_k_f32<false, 2>,
                            dot_q45_k_f32<false, 3>, dot_q45_k_f32<false, 4>>;
    case DType::kQ5_K:
      return row_dot_tokens<row_dot_q45_k_f32<true>, dot_q45_k_f32<true, 2>, dot_q45_k_f32<true, 3>,
                            dot_q45_k_f32<true, 4>>;
    case DType::kQ6_K:
      return row_dot_tokens<row_dot_q6_k_f32, dot_q6_k_f32<2>, dot_q6_k_f32<3>, dot_q6_k_f32<4>>;
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

// ---- int16-activation kernels (quant_f32.cpp's decode path, 32-value block types) -----------
// x is quantized per 32 values to int16 (Q16Act: d = max|x_blk| / 32767, s = d * sum(q)), which
// moves each element by at most d / 2 = max|x_blk| / 65534 (256x less than int8). Each block's
// 32 weight values are widened to 16 bits (Q4: straight from the packed nibbles, in value
// order) and meet the activation in two vpmaddwd (i16 x i16 -> i32 pairs; no overflow:
// |q_w| <= 127, |q_a| <= 32767, 32 terms < 2^31), so a block costs about what the int8
// kernels' maddubs + madd costs; the block sums are scaled as in dot_blk32.

template <DType kT>
STRATA_AVX2 inline __m256i block_dot16(const uint8_t* b, const int16_t* a) {
  using B = Blk32<kT>;
  __m256i w0, w1;  // values 0..15 and 16..31 as i16
  if constexpr (B::kQ8) {
    w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
    w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)));
  } else if constexpr (!B::kFive) {
    const __m256i q = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (B::kHasMin ? 4 : 2))));
    w0 = _mm256_and_si256(q, _mm256_set1_epi16(0x0F));
    w1 = _mm256_srli_epi16(q, 4);
  } else {
    const __m256i v = B::values(b);
    w0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v));
    w1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1));
  }
  return _mm256_add_epi32(
      _mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 16))));
}

// block_dot16 with the block's activations already loaded (a0 = values 0..15, a1 = 16..31).
template <DType kT>
STRATA_AVX2 inline __m256i block_dot16_pre(const uint8_t* b, __m256i a0, __m256i a1) {
  using B = Blk32<kT>;
  __m256i w0, w1;
  if constexpr (B::kQ8) {
    w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)));
    w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18)));
  } else if constexpr (!B::kFive) {
    const __m256i q = _mm256_cvtepu8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + (B::kHasMin ? 4 : 2))));
    w0 = _mm256_and_si256(q, _mm256_set1_epi16(0x0F));
    w1 = _mm256_srli_epi16(q, 4);
  } else {
    const __m256i v = B::values(b);
    w0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(v));
    w1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1));
  }
  return _mm256_add_epi32(_mm256_madd_epi16(w0, a0), _mm256_madd_epi16(w1, a1));
}

// One token, 4 rows (row_bytes apart): out[r] = dot(row r, activation). Each activation block
// is loaded once for the 4 rows and the per-row costs (set-up, tail, horizontal sums) are
// shared, which matters for short rows (576 values: 18 blocks). pf_bytes: RowsI16Fn.
template <DType kT>
STRATA_AVX2 void dot_blk32_i16_4rows(const uint8_t* w, int64_t row_bytes, int64_t n,
                                     const Q16Act& a, float* out, int64_t pf_bytes) {
  using B = Blk32<kT>;
  constexpr bool kHasC = B::kHasMin || B::kOffset != 0.0f;
  constexpr int kNr = 4;
  const int64_t nb = n / 32;
  __m256 acc[kNr];
  __m256 macc[kNr];
  STRATA_UNROLL
  for (int r = 0; r < kNr; ++r) acc[r] = macc[r] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= nb; j += 8) {
    alignas(32) float scale[kNr][8];
    const __m256 ad = _mm256_loadu_ps(a.d + j);
    STRATA_UNROLL
    for (int r = 0; r < kNr; ++r) {
      const uint8_t* wb = w + r * row_bytes + j * B::kBytes;
      // The same blocks of a row a later tile reads (RowsI16Fn).
      for (int64_t off = 0; pf_bytes >= 0 && off < 8 * B::kBytes; off += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + pf_bytes + off), _MM_HINT_T0);
      }
      const __m256 dw = load_f16x8(wb, B::kBytes);
      _mm256_store_ps(scale[r], _mm256_mul_ps(dw, ad));
      if constexpr (B::kHasMin) {
        macc[r] = _mm256_fmadd_ps(load_f16x8(wb + 2, B::kBytes), _mm256_loadu_ps(a.s + j), macc[r]);
      } else if constexpr (kHasC) {
        macc[r] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(-B::kOffset)),
                                  _mm256_loadu_ps(a.s + j), macc[r]);
      }
    }
    STRATA_UNROLL
    for (int u = 0; u < 8; ++u) {
      const int16_t* ab = a.qs + 32 * (j + u);
      const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab));
      const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 16));
      STRATA_UNROLL
      for (int r = 0; r < kNr; ++r) {
        const __m256 p = _mm256_cvtepi32_ps(
            block_dot16_pre<kT>(w + r * row_bytes + (j + u) * B::kBytes, a0, a1));
        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(&scale[r][u]), p, acc[r]);
      }
    }
  }
  float ctail[kNr] = {};
  for (; j < nb; ++j) {
    const int16_t* ab = a.qs + 32 * j;
    const __m256i a0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab));
    const __m256i a1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab + 16));
    STRATA_UNROLL
    for (int r = 0; r < kNr; ++r) {
      const uint8_t* wb = w + r * row_bytes + j * B::kBytes;
      const float dw = f16_avx(wb);
      const __m256 p = _mm256_cvtepi32_ps(block_dot16_pre<kT>(wb, a0, a1));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d[j]), p, acc[r]);
      if constexpr (kHasC) ctail[r] += (B::kHasMin ? f16_avx(wb + 2) : -B::kOffset * dw) * a.s[j];
    }
  }
  const __m128 sums = hsum4(_mm256_add_ps(acc[0], macc[0]), _mm256_add_ps(acc[1], macc[1]),
                            _mm256_add_ps(acc[2], macc[2]), _mm256_add_ps(acc[3], macc[3]));
  _mm_storeu_ps(out, _mm_add_ps(sums, _mm_loadu_ps(ctail)));
}

template <DType kT>
STRATA_AVX2 void rows4_i16(const uint8_t* w, int64_t row_bytes, int64_t n, const Q16Act& a,
                           float* out, int64_t pf_bytes) {
  dot_blk32_i16_4rows<kT>(w, row_bytes, n, a, out, pf_bytes);
}

// One row, kNt (1..4) tokens: out[t] = dot(row, activation of token t); token t's blocks are
// a.qs + t * n, a.d / a.s + t * n / 32.
template <DType kT, int kNt>
STRATA_AVX2 void dot_blk32_i16(const uint8_t* w, int64_t n, const Q16Act& a, float* out) {
  using B = Blk32<kT>;
  constexpr bool kHasC = B::kHasMin || B::kOffset != 0.0f;
  constexpr int kAcc = kNt == 1 ? 2 : 1;
  const int64_t nb = n / 32;
  __m256 acc[kNt][kAcc];
  __m256 macc[kNt];
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) {
    macc[t] = _mm256_setzero_ps();
    STRATA_UNROLL
    for (int u = 0; u < kAcc; ++u) acc[t][u] = _mm256_setzero_ps();
  }
  int64_t j = 0;
  for (; j + 8 <= nb; j += 8) {
    const uint8_t* wb = w + j * B::kBytes;
    const __m256 dw = load_f16x8(wb, B::kBytes);
    __m256 cw = _mm256_setzero_ps();
    if constexpr (B::kHasMin) {
      cw = load_f16x8(wb + 2, B::kBytes);
    } else if constexpr (kHasC) {
      cw = _mm256_mul_ps(dw, _mm256_set1_ps(-B::kOffset));
    }
    alignas(32) float scale[kNt][8];
    STRATA_UNROLL
    for (int t = 0; t < kNt; ++t) {
      const int64_t ab = t * nb + j;
      _mm256_store_ps(scale[t], _mm256_mul_ps(dw, _mm256_loadu_ps(a.d + ab)));
      if constexpr (kHasC) macc[t] = _mm256_fmadd_ps(cw, _mm256_loadu_ps(a.s + ab), macc[t]);
    }
    STRATA_UNROLL
    for (int u = 0; u < 8; ++u) {
      STRATA_UNROLL
      for (int t = 0; t < kNt; ++t) {
        const __m256 p =
            _mm256_cvtepi32_ps(block_dot16<kT>(wb + u * B::kBytes, a.qs + 32 * (t * nb + j + u)));
        __m256& dst = acc[t][u % kAcc];
        dst = _mm256_fmadd_ps(_mm256_broadcast_ss(&scale[t][u]), p, dst);
      }
    }
  }
  float ctail[kNt] = {};
  for (; j < nb; ++j) {
    const uint8_t* wb = w + j * B::kBytes;
    const float dw = f16_avx(wb);
    const float cw = B::kHasMin ? f16_avx(wb + 2) : -B::kOffset * dw;
    STRATA_UNROLL
    for (int t = 0; t < kNt; ++t) {
      const int64_t ab = t * nb + j;
      const __m256 p = _mm256_cvtepi32_ps(block_dot16<kT>(wb, a.qs + 32 * ab));
      acc[t][0] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d[ab]), p, acc[t][0]);
      if constexpr (kHasC) ctail[t] += cw * a.s[ab];
    }
  }
  STRATA_UNROLL
  for (int t = 0; t < kNt; ++t) {
    __m256 v = _mm256_add_ps(acc[t][0], macc[t]);
    if constexpr (kAcc == 2) v = _mm256_add_ps(v, acc[t][1]);
    out[t] = hsum(v) + ctail[t];
  }
}

template <DType kT>
STRATA_AVX2 void row_dot_i16(const uint8_t* w, int64_t n, const Q16Act& a, int nt, float* out) {
  switch (nt) {
    case 1:
      dot_blk32_i16<kT, 1>(w, n, a, out);
      break;
    case 2:
      dot_blk32_i16<kT, 2>(w, n, a, out);
      break;
    case 3:
      dot_blk32_i16<kT, 3>(w, n, a, out);
      break;
    default:
      dot_blk32_i16<kT, 4>(w, n, a, out);
      break;
  }
}

RowDotI16Fn row_dot_i16_avx2(DType dt) {
  switch (dt) {
    case DType::kQ8_0:
      return row_dot_i16<DType::kQ8_0>;
    case DType::kQ4_0:
      return row_dot_i16<DType::kQ4_0>;
    case DType::kQ4_1:
      return row_dot_i16<DType::kQ4_1>;
    case DType::kQ5_0:
      return row_dot_i16<DType::kQ5_0>;
    case DType::kQ5_1:
      return row_dot_i16<DType::kQ5_1>;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
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

RowsI16Fn rows4_i16_avx2(DType dt) {
  switch (dt) {
    case DType::kQ8_0:
      return rows4_i16<DType::kQ8_0>;
    case DType::kQ4_0:
      return rows4_i16<DType::kQ4_0>;
    case DType::kQ4_1:
      return rows4_i16<DType::kQ4_1>;
    case DType::kQ5_0:
      return rows4_i16<DType::kQ5_0>;
    case DType::kQ5_1:
      return rows4_i16<DType::kQ5_1>;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
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

// d = max|x_blk| / 32767, q = round-to-nearest-even(x / d) (as quantize_row_q8_avx2 with 32767).
STRATA_AVX2 void quantize_row_q16_avx2(const float* x, int64_t n, int16_t* qs, float* d, float* s,
                                       int16_t* qq) {
  // Per 128-bit lane of 8 values: the even ones, then the odd ones (the quad layout's halves).
  const __m256i evens_odds = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                              0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
  const int64_t n_quad = n / 128 * 4;  // the blocks of whole groups of 4
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lim = _mm256_set1_ps(32767.0f);
  for (int64_t j = 0; j < n / 32; ++j) {
    const float* xb = x + 32 * j;
    __m256 v[4];
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
    __m256 m =
        _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float dj = _mm_cvtss_f32(m4) / 32767.0f;
    const __m256 idv = _mm256_set1_ps(dj != 0.0f ? 1.0f / dj : 0.0f);
    __m256i q[4];
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      __m256 r =
          _mm256_round_ps(_mm256_mul_ps(v[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_max_ps(_mm256_min_ps(r, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
      q[i] = _mm256_cvtps_epi32(r);
    }
    const __m256i sum32 =
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    // packs works per 128-bit lane: put the 64-bit quarters back in order.
    const __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
    const __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * j), p0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * j + 16), p1);
    if (qq != nullptr && j < n_quad) {
      // Values 0..15: evens to k = 0, odds to k = 2; 16..31: evens to k = 1, odds to k = 3.
      int16_t* g = qq + 128 * (j / 4) + 8 * (j % 4);
      const __m256i e0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p0, evens_odds), 0xD8);
      const __m256i e1 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p1, evens_odds), 0xD8);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(g), _mm256_castsi256_si128(e0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(g + 32), _mm256_castsi256_si128(e1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(g + 64), _mm256_extracti128_si256(e0, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(g + 96), _mm256_extracti128_si256(e1, 1));
    }
    d[j] = dj;
    s[j] = dj * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

// ---- dequantization (the GEMM path's weight packing) ------------------------------------------
// Same f32 operations as dequantize_row in quant.cpp (a multiply, then an add or subtract for
// offsets and mins, never fused), so the results are bit-identical to the scalar ones.

template <DType kT>
STRATA_AVX2 void dequant_blk32(const uint8_t* w, float* y, int64_t n) {
  using B = Blk32<kT>;
  const __m256 off = _mm256_set1_ps(B::kOffset);
  for (int64_t j = 0; j < n / 32; ++j, y += 32) {
    const uint8_t* b = w + j * B::kBytes;
    const __m256 d = _mm256_set1_ps(f16_avx(b));
    __m256 v[4];
    values_f32<kT>(b, v);
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      __m256 r;
      if constexpr (B::kHasMin) {
        r = _mm256_add_ps(_mm256_mul_ps(d, v[i]), _mm256_set1_ps(f16_avx(b + 2)));
      } else if constexpr (B::kOffset != 0.0f) {
        r = _mm256_mul_ps(d, _mm256_sub_ps(v[i], off));
      } else {
        r = _mm256_mul_ps(v[i], d);
      }
      _mm256_storeu_ps(y + 8 * i, r);
    }
  }
}

template <bool kFiveBit>
STRATA_AVX2 void dequant_q45_k(const uint8_t* w, float* y, int64_t n) {
  constexpr int64_t kBytes = kFiveBit ? 176 : 144;
  for (int64_t sb = 0; sb < n / kQK; ++sb) {
    const uint8_t* b = w + sb * kBytes;
    uint32_t scm[4];
    k_scales_mins(b + 4, scm);
    alignas(32) float dl[8];
    alignas(32) float ml[8];
    _mm256_store_ps(dl, _mm256_mul_ps(_mm256_set1_ps(f16_avx(b)), u8x8_f32(scm)));
    _mm256_store_ps(ml, _mm256_mul_ps(_mm256_set1_ps(f16_avx(b + 2)), u8x8_f32(scm + 2)));
    const uint8_t* qs = kFiveBit ? b + 48 : b + 16;
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i one = _mm256_set1_epi8(1);
    for (int i = 0; i < 4; ++i) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * i));
      __m256i v0 = _mm256_and_si256(q, low4);
      __m256i v1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), low4);
      if constexpr (kFiveBit) {
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
        v0 = _mm256_or_si256(
            v0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i), one), 4));
        v1 = _mm256_or_si256(
            v1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * i + 1), one), 4));
      }
      alignas(32) uint8_t buf[64];
      _mm256_store_si256(reinterpret_cast<__m256i*>(buf), v0);
      _mm256_store_si256(reinterpret_cast<__m256i*>(buf + 32), v1);
      STRATA_UNROLL
      for (int h = 0; h < 2; ++h) {
        const __m256 d = _mm256_broadcast_ss(&dl[2 * i + h]);
        const __m256 m = _mm256_broadcast_ss(&ml[2 * i + h]);
        float* yo = y + sb * kQK + 64 * i + 32 * h;
        STRATA_UNROLL
        for (int k = 0; k < 4; ++k) {
          const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(buf + 32 * h + 8 * k))));
          _mm256_storeu_ps(yo + 8 * k, _mm256_sub_ps(_mm256_mul_ps(d, f), m));
        }
      }
    }
  }
}

STRATA_AVX2 void dequant_q6_k(const uint8_t* w, float* y, int64_t n) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i three = _mm256_set1_epi8(3);
  const __m256i k32 = _mm256_set1_epi8(32);
  for (int64_t sb = 0; sb < n / kQK; ++sb) {
    const uint8_t* b = w + sb * 210;
    const __m256 d = _mm256_set1_ps(f16_avx(b + 208));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
    alignas(32) float ds[16];
    _mm256_store_ps(ds, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_store_ps(
        ds + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const __m256i v[4] = {_mm256_and_si256(ql0, low4), _mm256_and_si256(ql1, low4),
                            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4)};
      alignas(32) int8_t buf[128];
      STRATA_UNROLL
      for (int t4 = 0; t4 < 4; ++t4) {
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * t4), three);
        _mm256_store_si256(reinterpret_cast<__m256i*>(buf + 32 * t4),
                           _mm256_sub_epi8(_mm256_or_si256(v[t4], _mm256_slli_epi16(hi, 4)), k32));
      }
      // buf[32 t4 + l] is element 128 h + 32 t4 + l, in group (128 h + 32 t4 + l) / 16.
      float* yo = y + sb * kQK + 128 * h;
      STRATA_UNROLL
      for (int k = 0; k < 16; ++k) {
        const __m256 s = _mm256_broadcast_ss(&ds[8 * h + k / 2]);
        const __m256 f = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(buf + 8 * k))));
        _mm256_storeu_ps(yo + 8 * k, _mm256_mul_ps(s, f));
      }
    }
  }
}

DequantFn dequant_avx2(DType dt) {
  switch (dt) {
    case DType::kQ8_0:
      return dequant_blk32<DType::kQ8_0>;
    case DType::kQ4_0:
      return dequant_blk32<DType::kQ4_0>;
    case DType::kQ4_1:
      return dequant_blk32<DType::kQ4_1>;
    case DType::kQ5_0:
      return dequant_blk32<DType::kQ5_0>;
    case DType::kQ5_1:
      return dequant_blk32<DType::kQ5_1>;
    case DType::kQ4_K:
      return dequant_q45_k<false>;
    case DType::kQ5_K:
      return dequant_q45_k<true>;
    case DType::kQ6_K:
      return dequant_q6_k;
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

// Same result bits as quantize_row_q8_scalar: max is exact, d and 1/d are the same f32 ops,
// and _mm256_round_ps(nearest) matches nearbyint in the default rounding mode.
STRATA_AVX2 void quantize_row_q8_avx2(const float* x, int64_t n, int8_t* qs, float* d, float* s) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lim = _mm256_set1_ps(127.0f);
  for (int64_t j = 0; j < n / 32; ++j) {
    const float* xb = x + 32 * j;
    __m256 v[4];
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
    __m256 m =
        _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float dj = amax / 127.0f;
    const float id = dj != 0.0f ? 1.0f / dj : 0.0f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i q[4];
    STRATA_UNROLL
    for (int i = 0; i < 4; ++i) {
      __m256 r =
          _mm256_round_ps(_mm256_mul_ps(v[i], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_max_ps(_mm256_min_ps(r, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
      q[i] = _mm256_cvtps_epi32(r);
    }
    const __m256i sum32 =
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum32), _mm256_extracti128_si256(sum32, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    const int32_t sum = _mm_cvtsi128_si32(s4);
    // packs work per 128-bit lane: fix the order with a dword permute.
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * j), p8);
    d[j] = dj;
    s[j] = dj * static_cast<float>(sum);
  }
}

}  // namespace strata::cpu::quant_detail

#endif  // STRATA_QUANT_HAVE_AVX2
