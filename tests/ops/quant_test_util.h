// Helpers shared by the block-quant kernel tests (test_quant.cpp, test_quant_gemm_i8.cpp):
// random activations and weight rows, the activation quantizer's output as vectors, and the
// ISA parameters (each test runs once per variant and skips, saying why, the ones this CPU
// cannot run).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/quant.h"
#include "core/half.h"

namespace strata::cpu::quant_test {

struct TypeCase {
  const char* name;
  DType dtype;
};
inline const TypeCase kQuantTypes[] = {
    {"q8_0", DType::kQ8_0}, {"q4_0", DType::kQ4_0}, {"q4_1", DType::kQ4_1}, {"q5_0", DType::kQ5_0},
    {"q5_1", DType::kQ5_1}, {"q4_k", DType::kQ4_K}, {"q5_k", DType::kQ5_K}, {"q6_k", DType::kQ6_K}};

inline std::vector<float> random_rows(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * k));
  for (float& v : x) v = nd(rng);
  // A spike and an all-zero block to exercise extreme scales.
  if (k >= 64) {
    x[3] = 25.0f;
    for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = 0.0f;
  }
  return x;
}

struct Q8Row {
  std::vector<int8_t> qs;
  std::vector<float> d;
  std::vector<float> s;
  Q8Act act() const { return {qs.data(), d.data(), s.data()}; }
};
inline Q8Row quantize(const float* x, int64_t k, QuantIsa isa) {
  Q8Row q;
  q.qs.resize(static_cast<size_t>(k));
  q.d.resize(static_cast<size_t>(k / 32));
  q.s.resize(static_cast<size_t>(k / 32));
  quantize_row_q8(x, k, q.qs.data(), q.d.data(), q.s.data(), isa);
  return q;
}

// Random rows of block-quantized weights: random bytes, with the f16 scales set to sane values
// (d in [0.002, 0.05]; Q4_1/Q5_1 m = -d * [0, 2^bits - 1] so blocks straddle 0, as a quantizer's
// min would; K-quant dmin in [0.001, 0.02]) so every value stays finite.
inline std::vector<uint8_t> random_quant_rows(DType dt, int64_t rows, int64_t row_blocks,
                                              uint32_t seed) {
  const DTypeInfo& info = dtype_info(dt);
  std::vector<uint8_t> w(static_cast<size_t>(rows * row_blocks * info.block_bytes));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  for (uint8_t& b : w) b = static_cast<uint8_t>(rng());
  auto put_f16 = [](uint8_t* p, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(p, &h, 2);
  };
  for (int64_t j = 0; j < rows * row_blocks; ++j) {
    uint8_t* b = w.data() + j * info.block_bytes;
    const float d = 0.002f + 0.048f * ud(rng);
    switch (dt) {
      case DType::kQ6_K:
        put_f16(b + 208, d);
        break;
      case DType::kQ4_K:
      case DType::kQ5_K:
        put_f16(b, d);
        put_f16(b + 2, 0.001f + 0.019f * ud(rng));
        break;
      case DType::kQ4_1:
      case DType::kQ5_1:
        put_f16(b, d);
        put_f16(b + 2, -d * ud(rng) * (dt == DType::kQ4_1 ? 15.0f : 31.0f));
        break;
      default:
        put_f16(b, d);
        break;
    }
  }
  return w;
}

// The SIMD variants of the block-quant kernels; each test below runs once per variant and
// skips (saying why) the ones this CPU cannot run.
// quant_linear over w (m rows of row_blocks blocks of dt) and x ([n, x_stride], k features),
// with bias, int8 activations and the scalar kernels; callers set out, isa and the switches
// they test.
inline QuantLinearParams linear_params(DType dt, const std::vector<uint8_t>& w,
                                       const std::vector<float>& bias, const std::vector<float>& x,
                                       int64_t n, int64_t k, int64_t m, int64_t x_stride,
                                       int64_t out_stride, int64_t row_blocks) {
  QuantLinearParams p;
  p.x = x.data();
  p.weight = w.data();
  p.weight_dtype = dt;
  p.bias = bias.data();
  p.n_tokens = n;
  p.in_features = k;
  p.out_features = m;
  p.x_stride = x_stride;
  p.out_stride = out_stride;
  p.weight_row_blocks = row_blocks;
  p.f32_activations = false;
  p.isa = QuantIsa::kScalar;
  return p;
}

inline const QuantIsa kSimdIsas[] = {QuantIsa::kAvx2, QuantIsa::kAvx512, QuantIsa::kAvx512Vnni};
inline std::string isa_test_name(const ::testing::TestParamInfo<QuantIsa>& info) {
  std::string s = quant_isa_name(info.param);
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}
// Why this CPU cannot run `isa`'s kernels; empty when it can.
inline std::string cannot_run(QuantIsa isa) {
  if (quant_isa_supported(isa)) return "";
  return std::string("this CPU cannot run the ") + quant_isa_name(isa) +
         " kernels (best here: " + quant_isa_name(quant_best_isa()) + ")";
}

}  // namespace strata::cpu::quant_test
