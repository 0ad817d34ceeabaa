// The GPU linear layer against its CPU twin cpu::gpu_linear:
//   - sbi_gemm on awkward shapes: m = 1, 15, 17, 431, 4112 (tails of the 16-row tiles and of
//     partially filled blocks), k = 8, 72, 200, 4104 (k tails; for 8-bit weights k % 16 == 8, so
//     half pieces), n = 1..17, 33, 64, 100 (partly filled 8-token tiles, 64-token slices), every
//     weight dtype, bias, accumulate, gated_silu, f32 and bf16 out, padded strides whose padding
//     holds NaN (x, bf16 weights) or 0x7f bytes (8-bit weights) so any read past k shows, and
//     every compiled block shape (m-tiles per block forced to 1, 2, 4);
//   - cublaslt_linear: bf16 (direct and scratch paths), fp8 (per-token fp8 activations: compared
//     with a reference that quantizes x the same way), int8: the A8W8 path (per-token int8
//     activations, int8 x int8 -> int32 GEMM, int32 epilogue) against its twin
//     cpu::gpu_linear_a8w8, which computes the same integer sums and the same f32 epilogue (so
//     f32 out agrees to the last bit barring the f32 conversion of sums above 2^24), and SBI
//     slices for int8 shapes IMMA does not take (out_features not a multiple of 4);
//   - linear(): the dispatch on both sides of the crossover, gated_silu above it;
//   - CUDA graph capture and replay of all three paths;
//   - quantize_rows, quantize_activations_i8: the same bytes and scales as the CPU twins;
//   - the route: int8 above the crossover takes the A8W8 GEMM for Llama-3 shapes.
// Outputs start as NaN (or the prior values, for accumulate) and are compared in full, padding
// included: an element the GPU failed to write, or wrote past the view, fails.
// Tolerances, relative to max |reference|: f32 out 1e-5 (same values, f32 accumulation in another
// order); bf16 out additionally one bf16 ulp of the element (both sides round their f32 result
// once; they can land on the two sides of a rounding boundary); the fp8 cuBLASLt path 1e-3
// against the same per-token fp8 activations (Hopper's fp8 tensor cores accumulate with ~14
// mantissa bits between cuBLASLt's f32 promotions; wrong scales or indices give O(1) errors).
// Argument checks run without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/gpu_linear_internal.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"

namespace strata::cuda {
namespace {

using testutil::all_close;
using testutil::DeviceArray;
using testutil::random_floats;

constexpr uint16_t kBf16NaN = 0x7fc0;

enum class Path { kSbi, kLt, kLinear };

const char* path_name(Path p) {
  switch (p) {
    case Path::kSbi:
      return "sbi";
    case Path::kLt:
      return "lt";
    case Path::kLinear:
      return "linear";
  }
  return "?";
}

struct Case {
  Path path;
  int64_t n;
  int64_t k;
  int64_t m;
  DType w_dtype;
  bool bias = false;
  bool accumulate = false;
  bool gated = false;
  DType out_dtype = DType::kF32;
  bool pad = false;
  int m_tiles = 0;  // sbi only: forced m-tiles per block
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = std::string(path_name(c.path)) + "_n" + std::to_string(c.n) + "_k" +
                  std::to_string(c.k) + "_m" + std::to_string(c.m) + "_" +
                  std::string(dtype_name(c.w_dtype)) + "_" + std::string(dtype_name(c.out_dtype));
  if (c.bias) s += "_bias";
  if (c.accumulate) s += "_acc";
  if (c.gated) s += "_gated";
  if (c.pad) s += "_pad";
  if (c.m_tiles) s += "_mt" + std::to_string(c.m_tiles);
  return s;
}

// Host data of one case, laid out as the kernels see it.
struct Problem {
  int64_t rows = 0;  // weight rows (2m when gated)
  int64_t x_stride = 0;
  int64_t w_stride = 0;
  int64_t out_stride = 0;
  std::vector<uint16_t> x;           // bf16 [n, x_stride], padding NaN
  std::vector<uint8_t> w;            // [rows, w_stride] of w_dtype, padding NaN / 0x7f
  std::vector<float> scale;          // per row (8-bit weights)
  std::vector<float> bias;           // per row
  std::vector<float> prior;          // f32 out before the call: random (accumulate) or NaN
  std::vector<uint16_t> prior_bf16;  // bf16 out before the call: NaN
};

Problem make_problem(const Case& c) {
  Problem pr;
  const bool q8 = c.w_dtype != DType::kBF16;
  pr.rows = c.gated ? 2 * c.m : c.m;
  pr.x_stride = c.k + (c.pad ? 8 : 0);
  pr.w_stride = q8 ? (c.k + 15) / 16 * 16 + (c.pad ? 16 : 0) : c.k + (c.pad ? 16 : 0);
  pr.out_stride = c.m + (c.pad ? 3 : 0);
  std::mt19937 rng(static_cast<uint32_t>(c.n * 7919 + c.k * 131 + c.m * 7 + c.gated));

  const std::vector<float> xf = random_floats(static_cast<size_t>(c.n * c.k), rng, -1.0f, 1.0f);
  pr.x.assign(static_cast<size_t>(c.n * pr.x_stride), kBf16NaN);
  for (int64_t t = 0; t < c.n; ++t) {
    for (int64_t i = 0; i < c.k; ++i) {
      pr.x[static_cast<size_t>(t * pr.x_stride + i)] =
          strata::f32_to_bf16(xf[static_cast<size_t>(t * c.k + i)]);
    }
  }
  std::vector<float> wf = random_floats(static_cast<size_t>(pr.rows * c.k), rng, -1.0f, 1.0f);
  // Some tiny weights, so fp8 quantization reaches the e4m3 subnormals.
  for (size_t i = 0; i < wf.size(); i += 37) wf[i] *= 1e-4f;
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = strata::f32_to_bf16(wf[i]);
  if (!q8) {
    pr.w.assign(static_cast<size_t>(pr.rows * pr.w_stride * 2), 0);
    auto* dst = reinterpret_cast<uint16_t*>(pr.w.data());
    for (int64_t r = 0; r < pr.rows; ++r) {
      for (int64_t i = 0; i < pr.w_stride; ++i) {
        dst[r * pr.w_stride + i] = i < c.k ? wb[static_cast<size_t>(r * c.k + i)] : kBf16NaN;
      }
    }
  } else {
    std::vector<uint8_t> q(wb.size());
    pr.scale.resize(static_cast<size_t>(pr.rows));
    EXPECT_TRUE(
        cpu::quantize_rows(wb.data(), pr.rows, c.k, c.w_dtype, q.data(), pr.scale.data()).ok());
    pr.w.assign(static_cast<size_t>(pr.rows * pr.w_stride), 0x7f);
    for (int64_t r = 0; r < pr.rows; ++r) {
      std::memcpy(pr.w.data() + r * pr.w_stride, q.data() + r * c.k, static_cast<size_t>(c.k));
    }
  }
  pr.bias = random_floats(static_cast<size_t>(pr.rows), rng, -1.0f, 1.0f);
  if (c.accumulate) {
    pr.prior = random_floats(static_cast<size_t>(c.n * pr.out_stride), rng, -1.0f, 1.0f);
  } else {
    pr.prior.assign(static_cast<size_t>(c.n * pr.out_stride), testutil::kNaN);
  }
  pr.prior_bf16.assign(static_cast<size_t>(c.n * pr.out_stride), 0xffff);
  return pr;
}

GpuLinearParams params_for(const Case& c, const Problem& pr, const void* x, const void* w,
                           const float* scale, const float* bias, void* out) {
  return GpuLinearParams{.x = static_cast<const uint16_t*>(x),
                         .x_stride = pr.x_stride,
                         .w = w,
                         .w_dtype = c.w_dtype,
                         .w_stride = pr.w_stride,
                         .w_scale = c.w_dtype == DType::kBF16 ? nullptr : scale,
                         .bias = c.bias ? bias : nullptr,
                         .out = out,
                         .out_dtype = c.out_dtype,
                         .out_stride = pr.out_stride,
                         .n_tokens = c.n,
                         .in_features = c.k,
                         .out_features = c.m,
                         .accumulate = c.accumulate,
                         .gated_silu = c.gated};
}

// The expected output of cublaslt_linear's fp8 scratch path: x quantized per token to fp8 the
// way quantize_activations_fp8 does (same f32 divisions, same rounding), then exact products.
std::vector<float> fp8_activation_reference(const Case& c, const Problem& pr) {
  std::vector<float> out = pr.prior;
  std::vector<double> xq(static_cast<size_t>(c.k));
  for (int64_t t = 0; t < c.n; ++t) {
    float amax = 0.0f;
    for (int64_t i = 0; i < c.k; ++i) {
      amax = std::fmax(
          amax, std::fabs(strata::bf16_to_f32(pr.x[static_cast<size_t>(t * pr.x_stride + i)])));
    }
    const float s = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (int64_t i = 0; i < c.k; ++i) {
      xq[static_cast<size_t>(i)] = fp8e4m3_to_f32(
          f32_to_fp8e4m3(strata::bf16_to_f32(pr.x[static_cast<size_t>(t * pr.x_stride + i)]) / s));
    }
    for (int64_t j = 0; j < c.m; ++j) {
      double acc = 0.0;
      for (int64_t i = 0; i < c.k; ++i) {
        acc += xq[static_cast<size_t>(i)] *
               fp8e4m3_to_f32(pr.w[static_cast<size_t>(j * pr.w_stride + i)]);
      }
      double v = acc * s * pr.scale[static_cast<size_t>(j)];
      if (c.bias) v += pr.bias[static_cast<size_t>(j)];
      float& o = out[static_cast<size_t>(t * pr.out_stride + j)];
      o = c.accumulate ? static_cast<float>(o + v) : static_cast<float>(v);
    }
  }
  return out;
}

double max_abs_in_view(const std::vector<float>& v, int64_t rows, int64_t cols, int64_t stride) {
  double m = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      m = std::max(m, std::fabs(double{v[static_cast<size_t>(r * stride + c)]}));
  }
  return m;
}

class GpuLinearCudaTest : public testutil::CudaTest, public ::testing::WithParamInterface<Case> {};

TEST_P(GpuLinearCudaTest, MatchesCpuTwin) {
  const Case& c = GetParam();
  const Problem pr = make_problem(c);
  const cudaStream_t st = ctx().stream;
  const bool f32_out = c.out_dtype == DType::kF32;

  // CPU twin.
  std::vector<float> want = pr.prior;
  std::vector<uint16_t> want_bf16 = pr.prior_bf16;
  {
    const GpuLinearParams p =
        params_for(c, pr, pr.x.data(), pr.w.data(), pr.scale.data(), pr.bias.data(),
                   f32_out ? static_cast<void*>(want.data()) : want_bf16.data());
    const Status s = cpu::gpu_linear(p);
    ASSERT_TRUE(s.ok()) << s.to_string();
  }

  DeviceArray<uint16_t> dx(pr.x, st);
  DeviceArray<uint8_t> dw(pr.w, st);
  DeviceArray<float> dscale(pr.scale.empty() ? std::vector<float>{1.0f} : pr.scale, st);
  DeviceArray<float> dbias(pr.bias, st);
  DeviceArray<float> dout(pr.prior, st);
  DeviceArray<uint16_t> dout_bf16(pr.prior_bf16, st);
  const GpuLinearParams p = params_for(c, pr, dx.get(), dw.get(), dscale.get(), dbias.get(),
                                       f32_out ? static_cast<void*>(dout.get()) : dout_bf16.get());

  bool fp8_activations = false;
  bool i8_activations = false;  // the A8W8 path: compare with cpu::gpu_linear_a8w8
  Status s;
  switch (c.path) {
    case Path::kSbi:
      s = sbi::sbi_gemm_with_m_tiles(ctx(), p, c.m_tiles);
      break;
    case Path::kLt: {
      LtRoute route = LtRoute::kSbi;
      ASSERT_TRUE(cublaslt_route(ctx(), p, &route).ok());
      fp8_activations = c.w_dtype == DType::kFP8E4M3 &&
                        (route == LtRoute::kScratch || route == LtRoute::kFp8Scaled);
      i8_activations = c.w_dtype == DType::kI8 && route == LtRoute::kScratch;
      RecordProperty("route", route == LtRoute::kDirect      ? "direct"
                              : route == LtRoute::kFp8Scaled ? "fp8-scaled"
                              : route == LtRoute::kScratch   ? "scratch"
                                                             : "sbi");
      s = cublaslt_linear(ctx(), p);
      break;
    }
    case Path::kLinear:
      if (c.w_dtype != DType::kBF16 && c.n > sbi_max_tokens() && !c.gated) {
        LtRoute route = LtRoute::kSbi;
        ASSERT_TRUE(cublaslt_route(ctx(), p, &route).ok());
        fp8_activations = c.w_dtype == DType::kFP8E4M3 &&
                          (route == LtRoute::kScratch || route == LtRoute::kFp8Scaled);
        i8_activations = c.w_dtype == DType::kI8 && route == LtRoute::kScratch;
      }
      s = linear(ctx(), p);
      break;
  }
  ASSERT_TRUE(s.ok()) << s.to_string();
  RecordProperty("i8_activations", i8_activations ? "yes" : "no");
  if (i8_activations) {
    // The GPU quantized x per token to int8: the twin of that path is the reference.
    want = pr.prior;
    want_bf16 = pr.prior_bf16;
    const GpuLinearParams hp =
        params_for(c, pr, pr.x.data(), pr.w.data(), pr.scale.data(), pr.bias.data(),
                   f32_out ? static_cast<void*>(want.data()) : want_bf16.data());
    const Status ts = cpu::gpu_linear_a8w8(hp);
    ASSERT_TRUE(ts.ok()) << ts.to_string();
  }

  std::vector<float> got;
  if (f32_out) {
    got = dout.download(st);
  } else {
    const std::vector<uint16_t> h = dout_bf16.download(st);
    got.resize(h.size());
    for (size_t i = 0; i < h.size(); ++i) got[i] = strata::bf16_to_f32(h[i]);
    want.resize(want_bf16.size());
    for (size_t i = 0; i < want_bf16.size(); ++i) want[i] = strata::bf16_to_f32(want_bf16[i]);
  }
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  double tol = 1e-5;
  if (fp8_activations) {
    // Compare with x quantized like the GPU did; bf16 out then rounds that result.
    std::vector<float> ref = fp8_activation_reference(c, pr);
    if (!f32_out) {
      for (size_t i = 0; i < ref.size(); ++i)
        ref[i] = std::isnan(ref[i]) ? ref[i] : strata::bf16_to_f32(strata::f32_to_bf16(ref[i]));
    }
    want = ref;
    tol = 1e-3;
  }
  ASSERT_EQ(testutil::nan_in_view(want, c.n, c.m, pr.out_stride), 0u) << "reference has NaN";
  const double scale = max_abs_in_view(want, c.n, c.m, pr.out_stride);
  const testutil::Tol t{.rtol = f32_out ? 0.0 : 1.0 / 128, .atol = tol * scale};
  EXPECT_TRUE(all_close(got, want, t));
}

std::vector<Case> all_cases() {
  std::vector<Case> cs;
  const DType kW[] = {DType::kBF16, DType::kI8, DType::kFP8E4M3};
  // SBI: every token count 1..17, with the options rotating.
  for (DType dt : kW) {
    for (int64_t n = 1; n <= 17; ++n) {
      cs.push_back({.path = Path::kSbi,
                    .n = n,
                    .k = 200,
                    .m = 431,
                    .w_dtype = dt,
                    .bias = n % 2 == 1,
                    // accumulate is for f32 out only (argument-checked below)
                    .accumulate = n % 3 == 0 && n % 4 != 2,
                    .out_dtype = n % 4 == 2 ? DType::kBF16 : DType::kF32,
                    .pad = n % 5 == 1});
    }
    for (int64_t n : {33, 64, 100}) {
      cs.push_back({.path = Path::kSbi, .n = n, .k = 72, .m = 17, .w_dtype = dt, .bias = true});
    }
    // Shapes: m and k tails, a long k, a partial last block of a big m.
    const int64_t kShapes[][2] = {{1, 8}, {15, 72}, {17, 200}, {431, 4104}, {4112, 4104}};
    for (const auto& mk : kShapes) {
      for (int64_t n : {1, 5, 16}) {
        cs.push_back({.path = Path::kSbi,
                      .n = n,
                      .k = mk[1],
                      .m = mk[0],
                      .w_dtype = dt,
                      .bias = true,
                      .accumulate = n == 5,
                      .pad = n == 16});
      }
    }
    // gated_silu, including above the crossover (up to 64 tokens).
    for (int64_t n : {1, 8, 9, 16, 33, 64}) {
      cs.push_back({.path = Path::kSbi,
                    .n = n,
                    .k = n % 2 ? 72 : 200,
                    .m = n < 16 ? 17 : 431,
                    .w_dtype = dt,
                    .bias = n != 8,
                    .gated = true,
                    .out_dtype = n == 9 || n == 33 ? DType::kBF16 : DType::kF32,
                    .pad = n == 16});
    }
    // Every compiled block shape.
    for (int mt : {1, 2, 4}) {
      for (int64_t n : {3, 12, 20, 40}) {
        if (mt == 4 && n > 8) continue;
        cs.push_back({.path = Path::kSbi,
                      .n = n,
                      .k = 200,
                      .m = 431,
                      .w_dtype = dt,
                      .bias = true,
                      .m_tiles = mt});
      }
      for (int64_t n : {5, 12, 40}) {
        if (mt == 4 || (mt == 2 && n > 8)) continue;  // gated: 2 x mt tiles per block
        cs.push_back({.path = Path::kSbi,
                      .n = n,
                      .k = 136,
                      .m = 431,
                      .w_dtype = dt,
                      .gated = true,
                      .m_tiles = mt});
      }
    }
    // cuBLASLt above the crossover.
    for (int64_t n : {17, 33, 64, 100}) {
      const int64_t m = n == 64 ? 4112 : n == 33 ? 15 : 431;
      const int64_t k = n == 33 ? 72 : n == 64 ? 4104 : 256;
      cs.push_back({.path = Path::kLt,
                    .n = n,
                    .k = k,
                    .m = m,
                    .w_dtype = dt,
                    .bias = n != 33,
                    .accumulate = n == 100,
                    .out_dtype = n == 17 || n == 64 ? DType::kBF16 : DType::kF32,
                    .pad = n == 33});
    }
    // fp8 without a bias from 128 tokens: the scaled GEMM (both scales inside cuBLASLt, out
    // written directly). bf16 and f32 out, accumulate, padded strides, several slices.
    if (dt == DType::kFP8E4M3) {
      struct F8 {
        int64_t n, k, m;
        bool acc;
        DType out;
        bool pad;
      };
      for (const F8& q : {F8{128, 1024, 2048, true, DType::kF32, false},
                          F8{200, 1024, 1024, false, DType::kF32, true},
                          F8{257, 1024, 2048, false, DType::kBF16, true},
                          F8{1031, 1024, 1024, true, DType::kF32, false},
                          F8{256, 4096, 1024, true, DType::kF32, false}}) {  // k >= 2 m: scratch
        cs.push_back({.path = Path::kLt,
                      .n = q.n,
                      .k = q.k,
                      .m = q.m,
                      .w_dtype = dt,
                      .bias = false,
                      .accumulate = q.acc,
                      .out_dtype = q.out,
                      .pad = q.pad});
      }
    }
    // int8 above the crossover with out_features a multiple of 4: the A8W8 path. Odd token
    // counts, k not a multiple of 16 (x rows padded in the scratch), bias, accumulate, bf16 out,
    // padded strides, and a prefill chunk of several workspace slices' worth of tokens.
    if (dt == DType::kI8) {
      struct I8 {
        int64_t n, k, m;
        bool bias, acc;
        DType out;
        bool pad;
      };
      for (const I8& q : {I8{17, 256, 432, true, false, DType::kF32, false},
                          I8{33, 72, 16, false, false, DType::kF32, true},
                          I8{65, 200, 428, true, false, DType::kBF16, false},
                          I8{100, 4104, 1024, true, true, DType::kF32, false},
                          I8{257, 1024, 2048, true, false, DType::kBF16, true},
                          I8{1031, 2048, 1024, false, true, DType::kF32, false}}) {
        cs.push_back({.path = Path::kLt,
                      .n = q.n,
                      .k = q.k,
                      .m = q.m,
                      .w_dtype = dt,
                      .bias = q.bias,
                      .accumulate = q.acc,
                      .out_dtype = q.out,
                      .pad = q.pad});
      }
      for (int64_t n : {17, 63, 64, 2048}) {
        cs.push_back({.path = Path::kLinear,
                      .n = n,
                      .k = 2048,
                      .m = 1024,
                      .w_dtype = dt,
                      .bias = n == 63,
                      .accumulate = n == 64,
                      .out_dtype = n == 17 ? DType::kBF16 : DType::kF32});
      }
    }
    // linear() on both sides of the crossover.
    for (int64_t n : {1, 16, 17, 100}) {
      cs.push_back({.path = Path::kLinear,
                    .n = n,
                    .k = 4104,
                    .m = 431,
                    .w_dtype = dt,
                    .bias = true,
                    .out_dtype = n == 16 ? DType::kBF16 : DType::kF32});
    }
    cs.push_back({.path = Path::kLinear,
                  .n = 40,
                  .k = 200,
                  .m = 431,
                  .w_dtype = dt,
                  .gated = true,
                  .out_dtype = DType::kBF16});
  }
  return cs;
}

INSTANTIATE_TEST_SUITE_P(AwkwardShapes, GpuLinearCudaTest, ::testing::ValuesIn(all_cases()),
                         case_name);

// ---- CUDA graphs: capture once, replay, same result as the eager call ------------------------

class GpuLinearGraphTest : public testutil::CudaTest {};

TEST_F(GpuLinearGraphTest, CapturedCallsReplay) {
  const cudaStream_t st = ctx().stream;
  for (const Case& c : {Case{.path = Path::kLinear,
                       .n = 4,
                       .k = 1024,
                       .m = 512,
                       .w_dtype = DType::kBF16,
                       .bias = true},
                        Case{.path = Path::kLinear,
                        .n = 48,
                        .k = 1024,
                        .m = 512,
                        .w_dtype = DType::kBF16,
                        .bias = true},
                        Case{.path = Path::kLinear,
                        .n = 48,
                        .k = 1024,
                        .m = 512,
                        .w_dtype = DType::kFP8E4M3,
                        .out_dtype = DType::kBF16},
                        Case{.path = Path::kLinear,
                        .n = 24,
                        .k = 1024,
                        .m = 512,
                        .w_dtype = DType::kI8,
                        .accumulate = true}}) {
    SCOPED_TRACE(case_name(::testing::TestParamInfo<Case>(c, 0)));
    const Problem pr = make_problem(c);
    const bool f32_out = c.out_dtype == DType::kF32;
    DeviceArray<uint16_t> dx(pr.x, st);
    DeviceArray<uint8_t> dw(pr.w, st);
    DeviceArray<float> dscale(pr.scale.empty() ? std::vector<float>{1.0f} : pr.scale, st);
    DeviceArray<float> dbias(pr.bias, st);
    DeviceArray<float> eager(pr.prior, st);
    DeviceArray<float> graphed(pr.prior, st);
    DeviceArray<uint16_t> eager_bf16(pr.prior_bf16, st);
    DeviceArray<uint16_t> graphed_bf16(pr.prior_bf16, st);
    const auto params = [&](void* out) {
      return params_for(c, pr, dx.get(), dw.get(), dscale.get(), dbias.get(), out);
    };
    ASSERT_TRUE(
        linear(ctx(), params(f32_out ? static_cast<void*>(eager.get()) : eager_bf16.get())).ok());
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);

    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const Status s =
        linear(ctx(), params(f32_out ? static_cast<void*>(graphed.get()) : graphed_bf16.get()));
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    ASSERT_TRUE(s.ok()) << s.to_string();
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    // The same kernels on the same data: equal up to cuBLASLt's freedom to reduce split-k
    // partial sums in another order.
    std::vector<float> a;
    std::vector<float> b;
    if (f32_out) {
      a = graphed.download(st);
      b = eager.download(st);
    } else {
      for (uint16_t h : graphed_bf16.download(st)) a.push_back(strata::bf16_to_f32(h));
      for (uint16_t h : eager_bf16.download(st)) b.push_back(strata::bf16_to_f32(h));
    }
    const double scale = max_abs_in_view(b, c.n, c.m, pr.out_stride);
    EXPECT_TRUE(all_close(a, b, {.rtol = f32_out ? 0.0 : 1.0 / 128, .atol = 1e-6 * scale}));
  }
}

// ---- quantize_rows: the CPU twin's bytes -----------------------------------------------------

class QuantizeRowsCudaTest : public testutil::CudaTest {};

TEST_F(QuantizeRowsCudaTest, SameBytesAsCpuTwin) {
  const cudaStream_t st = ctx().stream;
  for (DType dt : {DType::kI8, DType::kFP8E4M3}) {
    for (int64_t cols : {8, 301, 4104}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " cols " + std::to_string(cols));
      const int64_t rows = 7;
      std::mt19937 rng(static_cast<uint32_t>(cols));
      std::vector<float> src = random_floats(static_cast<size_t>(rows * cols), rng, -3.0f, 3.0f);
      for (int64_t c = 0; c < cols; ++c) src[static_cast<size_t>(2 * cols + c)] = 0.0f;  // zero row
      for (int64_t c = 0; c < cols; c += 3) src[static_cast<size_t>(4 * cols + c)] *= 1e-5f;
      std::vector<uint16_t> w(src.size());
      for (size_t i = 0; i < w.size(); ++i) w[i] = strata::f32_to_bf16(src[i]);
      std::vector<uint8_t> q(w.size());
      std::vector<float> scale(static_cast<size_t>(rows));
      ASSERT_TRUE(cpu::quantize_rows(w.data(), rows, cols, dt, q.data(), scale.data()).ok());

      DeviceArray<uint16_t> dw(w, st);
      DeviceArray<uint8_t> dq(q.size());
      DeviceArray<float> dscale(scale.size());
      dq.poison(st);
      dscale.poison(st);
      const Status s = quantize_rows(ctx(), dw.get(), rows, cols, dt, dq.get(), dscale.get());
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(dscale.download(st), scale);
      EXPECT_EQ(dq.download(st), q);
    }
  }
}

// ---- quantize_activations_i8: the CPU twin's bytes ------------------------------------------

TEST_F(QuantizeRowsCudaTest, ActivationsI8SameBytesAsCpuTwin) {
  const cudaStream_t st = ctx().stream;
  for (int64_t k : {8, 72, 301, 4104}) {
    SCOPED_TRACE("k " + std::to_string(k));
    const int64_t n = 9, x_stride = k + 8, q_stride = (k + 15) / 16 * 16;
    std::mt19937 rng(static_cast<uint32_t>(k));
    const std::vector<float> src =
        random_floats(static_cast<size_t>(n * x_stride), rng, -3.0f, 3.0f);
    std::vector<uint16_t> x(src.size());
    for (size_t i = 0; i < x.size(); ++i) x[i] = strata::f32_to_bf16(src[i]);
    for (int64_t i = 0; i < k; ++i) x[static_cast<size_t>(2 * x_stride + i)] = 0;  // zero token
    for (int64_t i = 0; i < k; i += 3) {  // a token of tiny values, and one with an outlier
      x[static_cast<size_t>(4 * x_stride + i)] =
          strata::f32_to_bf16(src[static_cast<size_t>(i)] * 1e-6f);
    }
    x[static_cast<size_t>(6 * x_stride + k / 2)] = strata::f32_to_bf16(250.0f);
    std::vector<int8_t> q(static_cast<size_t>(n * q_stride), 0x33);
    std::vector<float> scale(static_cast<size_t>(n));
    ASSERT_TRUE(
        cpu::quantize_activations_i8(x.data(), x_stride, n, k, q.data(), q_stride, scale.data())
            .ok());
    std::vector<uint8_t> q_bytes(q.size());
    std::memcpy(q_bytes.data(), q.data(), q.size());

    DeviceArray<uint16_t> dx(x, st);
    DeviceArray<uint8_t> dq(std::vector<uint8_t>(q.size(), 0x33), st);  // padding kept: 0x33
    DeviceArray<float> dscale(scale.size());
    dscale.poison(st);
    const Status s =
        quantize_activations_i8(ctx(), dx.get(), x_stride, n, k,
                                reinterpret_cast<int8_t*>(dq.get()), q_stride, dscale.get());
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(dscale.download(st), scale);
    EXPECT_EQ(dq.download(st), q_bytes);
  }
}

// ---- the route: int8 above the crossover takes the A8W8 GEMM --------------------------------

TEST_F(GpuLinearGraphTest, Int8AboveCrossoverRoutesToA8W8) {
  // Llama-3-8B's projections (qkv 6144 x 4096, o 4096 x 4096, gate/up as one GEMM 28672 x
  // 4096 above the crossover, down 4096 x 14336) at decode batches and a prefill chunk: cuBLASLt
  // must have an int8 algorithm (route kScratch), or int8 stays on the slow SBI slices. Only
  // plans are looked up: no weights are needed, but the pointers must look aligned.
  const cudaStream_t st = ctx().stream;
  DeviceArray<uint8_t> buf(std::vector<uint8_t>(256, 0), st);
  DeviceArray<float> scale(std::vector<float>(1, 1.0f), st);
  const int64_t shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  for (const auto& mk : shapes) {
    for (int64_t n : {17, 33, 64, 2048}) {
      GpuLinearParams p{.x = reinterpret_cast<const uint16_t*>(buf.get()),
                        .x_stride = mk[1],
                        .w = buf.get(),
                        .w_dtype = DType::kI8,
                        .w_stride = mk[1],
                        .w_scale = scale.get(),
                        .out = buf.get(),
                        .out_dtype = DType::kBF16,
                        .out_stride = mk[0],
                        .n_tokens = n,
                        .in_features = mk[1],
                        .out_features = mk[0]};
      LtRoute route = LtRoute::kDirect;
      const Status s = cublaslt_route(ctx(), p, &route);
      ASSERT_TRUE(s.ok()) << s.to_string();
      EXPECT_EQ(route, LtRoute::kScratch) << "m " << mk[0] << " k " << mk[1] << " n " << n
                                          << ": no int8 cuBLASLt algorithm (STRATA_NO_I8_GEMM "
                                             "set?)";
    }
  }
  // out_features not a multiple of 4: IMMA's rule, so SBI slices.
  GpuLinearParams p{.x = reinterpret_cast<const uint16_t*>(buf.get()),
                    .x_stride = 64,
                    .w = buf.get(),
                    .w_dtype = DType::kI8,
                    .w_stride = 64,
                    .w_scale = scale.get(),
                    .out = buf.get(),
                    .out_stride = 431,
                    .n_tokens = 64,
                    .in_features = 64,
                    .out_features = 431};
  LtRoute route = LtRoute::kDirect;
  ASSERT_TRUE(cublaslt_route(ctx(), p, &route).ok());
  EXPECT_EQ(route, LtRoute::kSbi);
}

TEST_F(GpuLinearGraphTest, Fp8AboveCrossoverTakesScaledGemm) {
  // The same projections with fp8 weights: on Hopper, from 128 tokens and where k < 2 m,
  // cuBLASLt must take both scales itself (outer-vector scaling; route kFp8Scaled) for bf16 out
  // and for the f32 residual accumulated into, or those fp8 GEMMs pay an f32 scratch and an
  // epilogue kernel. Fewer tokens, down's shape (k = 3.5 m) and a bias keep the scratch path.
  int dev = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "fp8 GEMMs need compute capability 9.0";
  const cudaStream_t st = ctx().stream;
  DeviceArray<uint8_t> buf(std::vector<uint8_t>(256, 0), st);
  DeviceArray<float> scale(std::vector<float>(1, 1.0f), st);
  const int64_t shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  for (const auto& mk : shapes) {
    for (int64_t n : {17, 64, 128, 256, 2048}) {
      for (const bool residual : {false, true}) {
        GpuLinearParams p{.x = reinterpret_cast<const uint16_t*>(buf.get()),
                          .x_stride = mk[1],
                          .w = buf.get(),
                          .w_dtype = DType::kFP8E4M3,
                          .w_stride = mk[1],
                          .w_scale = scale.get(),
                          .out = buf.get(),
                          .out_dtype = residual ? DType::kF32 : DType::kBF16,
                          .out_stride = mk[0],
                          .n_tokens = n,
                          .in_features = mk[1],
                          .out_features = mk[0],
                          .accumulate = residual};
        LtRoute route = LtRoute::kDirect;
        const Status s = cublaslt_route(ctx(), p, &route);
        ASSERT_TRUE(s.ok()) << s.to_string();
        const bool scaled = n >= 128 && mk[1] < 2 * mk[0];
        EXPECT_EQ(route, scaled ? LtRoute::kFp8Scaled : LtRoute::kScratch)
            << "m " << mk[0] << " k " << mk[1] << " n " << n << (residual ? " f32 +=" : " bf16")
            << (scaled ? ": no scaled fp8 cuBLASLt algorithm (STRATA_NO_FP8_SCALED_GEMM set?)"
                       : "");
        p.bias = scale.get();
        ASSERT_TRUE(cublaslt_route(ctx(), p, &route).ok());
        EXPECT_EQ(route, LtRoute::kScratch);
      }
    }
  }
}

// ---- argument checks: no GPU needed, they fail before any CUDA call --------------------------

alignas(16) uint8_t g_fake[256];
float g_fake_scale[4];

GpuLinearParams valid_looking() {
  return GpuLinearParams{.x = reinterpret_cast<const uint16_t*>(g_fake),
                         .x_stride = 16,
                         .w = g_fake,
                         .w_dtype = DType::kBF16,
                         .w_stride = 16,
                         .out = g_fake,
                         .out_stride = 4,
                         .n_tokens = 2,
                         .in_features = 16,
                         .out_features = 4};
}

void expect_error(const GpuLinearParams& p, StatusCode code, const std::string& needle) {
  for (const auto& [name, fn] :
       {std::pair<const char*, Status (*)(const LaunchCtx&, const GpuLinearParams&)>{"sbi_gemm",
                                                                                     sbi_gemm},
        {"cublaslt_linear", cublaslt_linear},
        {"linear", linear}}) {
    const Status s = fn(LaunchCtx{}, p);
    EXPECT_EQ(s.code(), code) << name << ": " << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << name << ": " << s.message();
  }
}

TEST(GpuLinearCudaArgs, BadDtypes) {
  GpuLinearParams p = valid_looking();
  p.w_dtype = DType::kF16;
  expect_error(p, StatusCode::kUnimplemented, "f16");
  p = valid_looking();
  p.out_dtype = DType::kF16;
  expect_error(p, StatusCode::kUnimplemented, "out dtype");
}

TEST(GpuLinearCudaArgs, ScalesAndAccumulate) {
  GpuLinearParams p = valid_looking();
  p.w_dtype = DType::kI8;
  expect_error(p, StatusCode::kInvalidArgument, "w_scale");
  p = valid_looking();
  p.w_scale = g_fake_scale;
  expect_error(p, StatusCode::kInvalidArgument, "w_scale");
  p = valid_looking();
  p.out_dtype = DType::kBF16;
  p.accumulate = true;
  expect_error(p, StatusCode::kInvalidArgument, "accumulate");
}

TEST(GpuLinearCudaArgs, ShapesStridesAndAlignment) {
  GpuLinearParams p = valid_looking();
  p.in_features = 12;
  p.x_stride = 12;
  p.w_stride = 12;
  expect_error(p, StatusCode::kInvalidArgument, "multiple of 8");
  p = valid_looking();
  p.w_stride = 8;
  expect_error(p, StatusCode::kInvalidArgument, "stride");
  p = valid_looking();
  p.out_features = 0;
  expect_error(p, StatusCode::kInvalidArgument, "out_features");
  p = valid_looking();
  p.x = reinterpret_cast<const uint16_t*>(g_fake + 2);
  expect_error(p, StatusCode::kInvalidArgument, "x rows");
  p = valid_looking();
  p.x_stride = 20;
  expect_error(p, StatusCode::kInvalidArgument, "x rows");
  p = valid_looking();
  p.w = g_fake + 8;
  expect_error(p, StatusCode::kInvalidArgument, "weight rows");
  p = valid_looking();
  p.w_dtype = DType::kFP8E4M3;
  p.w_scale = g_fake_scale;
  p.w_stride = 24;  // 24 bytes per row
  expect_error(p, StatusCode::kInvalidArgument, "weight rows");
  p = valid_looking();
  p.out = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "null");
}

TEST(GpuLinearCudaArgs, GatedLimits) {
  GpuLinearParams p = valid_looking();
  p.gated_silu = true;
  p.n_tokens = 65;
  p.x_stride = 16;
  const Status s = linear(LaunchCtx{}, p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("gated_silu"), std::string::npos) << s.message();
  p.n_tokens = 2;
  const Status lt = cublaslt_linear(LaunchCtx{}, p);
  EXPECT_EQ(lt.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(lt.message().find("SBI-only"), std::string::npos) << lt.message();
}

TEST(GpuLinearCudaArgs, MissingCublasLtHandleAndBadTiles) {
  GpuLinearParams p = valid_looking();
  p.n_tokens = 100;
  p.x_stride = 16;
  const Status s = cublaslt_linear(LaunchCtx{}, p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cuBLASLt"), std::string::npos) << s.message();
  EXPECT_EQ(sbi::sbi_gemm_with_m_tiles(LaunchCtx{}, valid_looking(), 3).code(),
            StatusCode::kInvalidArgument);
}

TEST(GpuLinearCudaArgs, ZeroTokensLaunchNothing) {
  GpuLinearParams p = valid_looking();
  p.n_tokens = 0;
  p.x = nullptr;
  p.out = nullptr;
  EXPECT_TRUE(sbi_gemm(LaunchCtx{}, p).ok());
  EXPECT_TRUE(cublaslt_linear(LaunchCtx{}, p).ok());
  EXPECT_TRUE(linear(LaunchCtx{}, p).ok());
}

TEST(GpuLinearCudaArgs, QuantizeRows) {
  EXPECT_EQ(quantize_rows(LaunchCtx{}, reinterpret_cast<const uint16_t*>(g_fake), 1, 8,
                          DType::kBF16, g_fake, g_fake_scale)
                .code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(quantize_rows(LaunchCtx{}, nullptr, 1, 8, DType::kI8, g_fake, g_fake_scale).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(quantize_rows(LaunchCtx{}, nullptr, 0, 8, DType::kI8, nullptr, nullptr).ok());
  EXPECT_EQ(sbi_max_tokens(), sbi::kMaxTokensDefault);
}

}  // namespace
}  // namespace strata::cuda
