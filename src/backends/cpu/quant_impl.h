// Internals shared by quant.cpp (scalar kernels, dispatch, quant_linear) and quant_avx2.cpp.
//
// Block layouts (ggml; all little-endian, d/m/dmin are f16):
//   Q8_0  34 B: d, qs[32] i8                       x = d * q
//   Q4_0  18 B: d, qs[16]                          x = d * (q - 8)
//   Q4_1  20 B: d, m, qs[16]                       x = d * q + m
//   Q5_0  22 B: d, qh u32, qs[16]                  x = d * (q - 16)
//   Q5_1  24 B: d, m, qh u32, qs[16]               x = d * q + m
//     4-bit value j < 16 is the low nibble of qs[j], value j + 16 the high nibble; the fifth
//     bit of value j is bit j of qh.
//   Q4_K 144 B: d, dmin, scales[12], qs[128]       x = d * sc_j * q - dmin * m_j
//   Q5_K 176 B: d, dmin, scales[12], qh[32], qs[128]
//     8 sub-blocks of 32; sub-block 2i / 2i + 1 are the low / high nibbles of qs[32i, 32i + 32);
//     6-bit sc_j, m_j packed in scales[12] (see k_scale_min); Q5_K's fifth bit of value l in
//     sub-block j is bit j of qh[l].
//   Q6_K 210 B: ql[128], qh[64], scales[16] i8, d   x = d * sc[e / 16] * (q - 32)
//     element e = 128 h + 32 t + l (h < 2, t < 4, l < 32): low 4 bits from ql[64 h + 32 (t & 1)
//     + l] (nibble t >> 1), high 2 bits are bits 2t, 2t + 1 of qh[32 h + l].
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backends/cpu/quant.h"

namespace strata::cpu::quant_detail {

constexpr int64_t kQK = 256;  // K-quant super-block

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K super-block.
inline void k_scale_min(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// out[r * nt + t] = dot(weight row r, activation of token t) for r < nr, t < nt (each 1..4),
// where weight row r (n values) starts at w + r * row_bytes and token t's activation is
// a.qs + t * n, a.d + t * n / 32, a.s + t * n / 32.
using TileDotFn = void (*)(const uint8_t* w, int64_t row_bytes, int nr, int64_t n, const Q8Act& a,
                           int nt, float* out);
// The int8-activation tile kernel of dt for `isa` (resolved: kBest is this CPU's best), the
// scalar one where that ISA has none (quant.cpp).
TileDotFn tile_dot_isa(DType dt, QuantIsa isa);

// f32 activations (quant_f32.cpp's decode path, n_tokens < 16): each weight block is
// dequantized in registers, so results equal the dequantize_row + f32 dot product up to f32
// summation order (offsets and mins are folded in as c_w * sum(x_block)). xsum holds the
// per-32 block sums of the activation row(s): token t's at xsum + t * (n / 32).
// One token: dot(weight row of n values at w, x).
using RowDotF32Fn = float (*)(const uint8_t* w, const float* x, const float* xsum, int64_t n);
// nt tokens (1..4): out[t] = dot(weight row at w, x + t * x_stride); the row is unpacked once.
using RowDotF32TokensFn = void (*)(const uint8_t* w, int64_t n, const float* x, int64_t x_stride,
                                   const float* xsum, int nt, float* out);

// One activation row quantized to int16 blocks of 32 values (the decode path's activations).
struct Q16Act {
  const int16_t* qs = nullptr;  // [n]
  const float* d = nullptr;     // [n / 32] block scales: max|x_blk| / 32767
  const float* s = nullptr;     // [n / 32] d * sum(qs over the block)
  // [n / 128 * 128] or null: qs in the quad layout of the AVX-512 4-bit decode kernels, per
  // group g of 4 blocks (b = 0..3, i = 0..7, 128 values at qq + 128 g):
  //   qq[128 g + 32 k + 8 b + i] = qs[32 (4 g + b) + o_k + 2 i], o = {0, 16, 1, 17}
  // (quantize_row_q16_avx2 writes it). One token's Q16Act given to rows4_i16_for's kernels has
  // it wherever they are to give the same bits.
  const int16_t* qq = nullptr;
};
// nt tokens (1..4): out[t] = dot(weight row of n values at w, token t's activation at
// a.qs + t * n, a.d / a.s + t * n / 32).
using RowDotI16Fn = void (*)(const uint8_t* w, int64_t n, const Q16Act& a, int nt, float* out);
// One token, 4 weight rows `stride` bytes apart: out[r] = dot(row r, activation) for r < 4.
// Each block read is software-prefetched `pf_bytes` further on (the same block of a row a
// later tile reads); no prefetch where pf_bytes < 0.
using RowsI16Fn = void (*)(const uint8_t* w, int64_t stride, int64_t n, const Q16Act& a, float* out,
                           int64_t pf_bytes);

// y[0, n) = the n values (whole blocks) of a row starting at w, bit-identical to dequantize_row.
using DequantFn = void (*)(const uint8_t* w, float* y, int64_t n);

// ---- The int8-activation GEMM (quant_gemm_i8.cpp; prefill and batches of >= 16 tokens) -------
// Weights are packed per panel of kGemmRows rows and k-block into unsigned bytes u with a
// per-32-group scale dw and offset cw (w = dw * u + cw for every block type it takes: Q4_0
// u = q, cw = -8 dw; Q4_1 cw = m; Q5_0 / Q5_1 likewise with the fifth bit; Q8_0 u = q + 128,
// cw = -128 dw; Q4_K / Q5_K sub-block j: dw = d sc_j, cw = -dmin m_j). A group's product with
// a token's int8 activation block (Q8Act) is dw d_a sum(u q_a) + cw s_a, as in the tile kernels.
// Panel layout, kc values (a multiple of 32) by kGemmRows rows:
//   q [kc / 4][kGemmRows][4]  u8: quad i of row r (values 4i..4i+3) at (i * kGemmRows + r) * 4
//   dw, cw [kc / 32][kGemmRows] f32
// so one 64-byte load holds one quad of all 16 rows (16 i32 lanes of vpdpbusd, or two
// 8-lane halves in AVX2) and a token's 4 activation bytes are broadcast against it.
constexpr int64_t kGemmRows = 16;
constexpr int64_t kGemmTokens = 8;  // tokens per micro-kernel call (zero-padded at the end)

// c[t * kGemmRows + r] = sum over the ng groups of (dw d_a isum + cw s_a) for t < kGemmTokens,
// r < kGemmRows, where isum = sum(u q_a) of the group; token t's activation bytes start at
// aq + t * a_stride and its d / s at ad / as + t * ad_stride (all at the k-block's start).
using GemmI8MicroFn = void (*)(int64_t ng, const uint8_t* wq, const float* wd, const float* wc,
                               const int8_t* aq, int64_t a_stride, const float* ad, const float* as,
                               int64_t ad_stride, float* c);

// The largest u the packer writes for dt (15, 31, 255), 0 when dt cannot be packed (Q6_K: its
// 16-value scales; the plain types).
int gemm_i8_max_u(DType dt);
// Packs rows [r0, r0 + nr) (nr <= kGemmRows; the rest zero) of values [k0, k0 + kc) into q, dw,
// cw (the layout above); row r starts at w + r * row_bytes. Portable: every ISA's GEMM runs the
// same packer.
void gemm_i8_pack(DType dt, const uint8_t* w, int64_t row_bytes, int64_t nr, int64_t k0, int64_t kc,
                  uint8_t* q, float* dw, float* cw);
GemmI8MicroFn gemm_i8_micro_scalar();
// The micro-kernel for dt on `isa` (resolved on this CPU): nullptr where dt has none there.
GemmI8MicroFn gemm_i8_micro(DType dt, QuantIsa isa);

TileDotFn tile_dot_scalar(DType dt);
void quantize_row_q8_scalar(const float* x, int64_t n, int8_t* qs, float* d, float* s);

#if defined(__x86_64__) || defined(__i386__)
#define STRATA_QUANT_HAVE_AVX2 1
TileDotFn tile_dot_avx2(DType dt);
RowDotF32Fn row_dot_f32_avx2(DType dt);
RowDotF32TokensFn row_dot_f32_tokens_avx2(DType dt);
void quantize_row_q8_avx2(const float* x, int64_t n, int8_t* qs, float* d, float* s);
DequantFn dequant_avx2(DType dt);
// The int16-activation kernels: the 32-value block types only (nullptr for the others).
RowDotI16Fn row_dot_i16_avx2(DType dt);
RowsI16Fn rows4_i16_avx2(DType dt);
// qq: null, or [n / 128 * 128] for the quad layout (Q16Act::qq) of the whole groups.
void quantize_row_q16_avx2(const float* x, int64_t n, int16_t* qs, float* d, float* s,
                           int16_t* qq = nullptr);
// The int8 GEMM micro-kernel with vpmaddubsw (u <= max_u: 15 or 31; nullptr above, where the
// u8 x i8 pair sums would saturate).
GemmI8MicroFn gemm_i8_micro_avx2(int max_u);

// The AVX-512 kernels (quant_avx512.cpp), one namespace per copy: avx512 (F/BW/DQ/VL) and
// avx512_vnni (the same plus vpdpbusd for the u8 x i8 products). The int8-activation tiles
// for every block type, the activation quantizer, and the int16-activation decode kernels of
// the 32-value block types (nullptr for the others).
#define STRATA_QUANT_HAVE_AVX512 1
namespace avx512 {
TileDotFn tile_dot(DType dt);
void quantize_row_q8(const float* x, int64_t n, int8_t* qs, float* d, float* s);
RowDotI16Fn row_dot_i16(DType dt);
RowsI16Fn rows4_i16(DType dt);
}  // namespace avx512
namespace avx512_vnni {
TileDotFn tile_dot(DType dt);
void quantize_row_q8(const float* x, int64_t n, int8_t* qs, float* d, float* s);
RowDotI16Fn row_dot_i16(DType dt);
RowsI16Fn rows4_i16(DType dt);
}  // namespace avx512_vnni
// The int8 GEMM micro-kernel in 512-bit registers (quant_gemm_i8_avx512.cpp): VNNI takes every
// u (vpdpbusd adds into i32 without saturating); without VNNI, u <= 31 (nullptr above).
namespace avx512 {
GemmI8MicroFn gemm_i8_micro(int max_u);
}  // namespace avx512
namespace avx512_vnni {
GemmI8MicroFn gemm_i8_micro(int max_u);
}  // namespace avx512_vnni
#if defined(__linux__)
// The int8 GEMM micro-kernel on AMX tiles (quant_gemm_i8_amx.cpp; every u up to 255), for CPUs
// with AMX-INT8 (cpu_has_amx_int8) once request_tile_data() has had Linux grant this process
// the tile state.
#define STRATA_QUANT_HAVE_AMX 1
namespace amx {
bool request_tile_data();
GemmI8MicroFn gemm_i8_micro();
}  // namespace amx
#endif
#endif

// `isa` resolved on this CPU: kBest becomes the best supported variant, a variant the CPU
// lacks the best one below it (never kBest).
QuantIsa resolve_quant_isa(QuantIsa isa);

// The one-token 4-row int16 kernel decode runs on a resolved `isa`: AVX512-VNNI's for Q4_0,
// Q4_1 (four blocks per register with Q16Act::qq, else two) and Q8_0 (two; vpdpwssd), else
// AVX2's (nullptr for the types without int16 kernels).
RowsI16Fn rows4_i16_for(DType dt, QuantIsa isa);
// Whether rows4_i16_for's kernels on `isa` read the quad layout (Q16Act::qq): the AVX-512 ones
// (AVX512-VNNI) do, and the activation quantizer writes it only for them.
inline bool rows4_reads_quad(QuantIsa isa) {
  return isa == QuantIsa::kAvx512Vnni;
}

// One token's rows [r0, r0 + 4 q) of a matrix through a 4-row kernel, striped: tile j takes rows
// r0 + j + {0, q, 2q, 3q}, so a thread reads four forward streams a quarter of its rows apart
// (the hardware prefetchers follow each one, and the software prefetch runs kStripePrefetchRows
// rows ahead in each), not four consecutive rows block-interleaved, whose reads jump back and
// forth within a page. Every row goes through the same kernel as in consecutive tiles, whose
// rows do not mix: the same bits. emit(row, value) takes each result.
// Xeon (model 207) at 2 threads, SmolLM2 Q4_1 tg128, 15 rotated rounds: striped / consecutive
// 1.08x with 4 rows of prefetch, 1.05x with none (docs/performance.md, nineteenth session).
constexpr int64_t kStripePrefetchRows = 4;
template <typename Emit>
inline void rows4_striped(RowsI16Fn rows4, const uint8_t* w, int64_t row_bytes, int64_t r0,
                          int64_t q, int64_t k, const Q16Act& a, const Emit& emit) {
  const int64_t pf = kStripePrefetchRows * row_bytes;
  for (int64_t j = 0; j < q; ++j) {
    float res[4];
    rows4(w + (r0 + j) * row_bytes, q * row_bytes, k, a, res, pf);
    for (int i = 0; i < 4; ++i) emit(r0 + i * q + j, res[i]);
  }
}

// A fused decode region's per-thread scratch (quant_ffn_decode, quant_attn_decode): the thread's
// own normalized row h and one activation row as int16 blocks, in grow-only thread_local storage
// (a warm decode step allocates nothing). thread_scratch(k, n, quad): h of k floats, rows of up
// to n, with the quad layout (Q16Act::qq) where `quad` (rows4_reads_quad of the kernels' isa).
struct ThreadScratch {
  float* h;
  int16_t* qs;
  float* d;
  float* s;
  int16_t* qq;  // null without the quad layout
  Q16Act quantize(const float* x, int64_t n) const {
    quantize_row_q16_avx2(x, n, qs, d, s, qq);
    return {qs, d, s, qq};
  }
};
ThreadScratch thread_scratch(int64_t k, int64_t n, bool quad);

// The int16 decode kernels of up to kMaxParts DecodeParts that share one activation row of k
// values, their 4-row tiles numbered part after part: quant_decode_parts' work, for it and for
// the fused attention block (attn_block.cpp), which runs the tiles inside its own region.
struct DecodeTilesI16 {
  static constexpr int kMaxParts = 4;
  const DecodePart* parts = nullptr;
  int n_parts = 0;
  int64_t k = 0;
  RowDotI16Fn i16[kMaxParts] = {};
  RowsI16Fn rows4[kMaxParts] = {};
  int64_t tile_end[kMaxParts] = {};  // prefix sums of each part's tiles
  int64_t tiles = 0;
  // False where a part has no int16 kernel on `isa` or k is not whole blocks of its type.
  bool init(const DecodePart* parts, int n_parts, int64_t k, QuantIsa isa);
  // Tiles [t0, t1): their rows of each part (striped, rows4_striped; a part's last rows past a
  // multiple of 4 one at a time), bias added, into part.out (+= with accumulate).
  void run(int64_t t0, int64_t t1, const Q16Act& a, bool accumulate) const;
};

// Where tile t of parts whose 4-row tiles end at tile_end[] lies: part *i, rows [*r0, *r0 + *nr).
inline void locate_tile(const int64_t* tile_end, int64_t t, int* i, int64_t* r0, int64_t* nr,
                        const DecodePart* parts) {
  int j = 0;
  while (t >= tile_end[j]) ++j;
  *i = j;
  *r0 = (t - (j > 0 ? tile_end[j - 1] : 0)) * 4;
  *nr = std::min<int64_t>(4, parts[j].rows - *r0);
}
// A tile's results res[0, nr) with the part's bias into its out rows (+= with accumulate).
void store_tile(const DecodePart& part, int64_t r0, int64_t nr, const float* res, bool accumulate);

}  // namespace strata::cpu::quant_detail
