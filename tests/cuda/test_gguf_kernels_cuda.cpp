// The GGUF block-format kernels (kernels/gguf_gemv.cuh) against their CPU twin:
//   - the dequantizer writes exactly cpu::gguf_row_to_bf16's bits, for 16-byte aligned rows and
//     for rows that are not (Q6_K / Q8_0 / Q4_0 rows at k = 256 and an odd row offset);
//   - cuda::gguf_linear (decode kernel up to 16 tokens, dequantized tiles above; f32 and bf16
//     out, bias, accumulate, gated) matches cpu::gpu_linear within summation order (1e-5 of
//     max|out| for f32 out, one bf16 ulp for bf16 out).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
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

using testutil::DeviceArray;

constexpr DType kFormats[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::vector<uint8_t> random_rows(DType dt, int64_t rows, int64_t k, uint64_t seed) {
  const int64_t rb = dtype_bytes(dt, k);
  std::vector<uint8_t> w(static_cast<size_t>(rows * rb));
  for (int64_t r = 0; r < rows; ++r)
    cpu::gguf_fill_random_row(dt, seed, r, 0.5f, k, &w[static_cast<size_t>(r * rb)]);
  return w;
}

class GgufKernelsCuda : public testutil::CudaTest {};

TEST_F(GgufKernelsCuda, DequantizerWritesTheTwinsBits) {
  const cudaStream_t st = ctx().stream;
  for (DType dt : kFormats) {
    for (int64_t k : {256, 2048}) {
      for (int64_t offset_rows : {0, 1}) {  // row 1 onwards: misaligned for 210 / 34 / 18 B
        const int64_t rows = 37, rb = dtype_bytes(dt, k);
        const std::vector<uint8_t> w = random_rows(dt, rows + offset_rows, k, 3);
        DeviceArray<uint8_t> dw(w, st);
        DeviceArray<uint16_t> out(static_cast<size_t>(rows * k));
        out.poison(st);
        ASSERT_TRUE(
            gguf::dequant(ctx(), dt, dw.get() + offset_rows * rb, rb, rows, k, out.get(), k).ok());
        const std::vector<uint16_t> got = out.download(st);
        std::vector<uint16_t> want(static_cast<size_t>(rows * k));
        for (int64_t r = 0; r < rows; ++r) {
          cpu::gguf_row_to_bf16(dt, &w[static_cast<size_t>((r + offset_rows) * rb)], k,
                                &want[static_cast<size_t>(r * k)]);
        }
        size_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i] ? 1 : 0;
        EXPECT_EQ(bad, 0u) << dtype_name(dt) << " k " << k << " offset " << offset_rows;
      }
    }
  }
}

struct LinCase {
  int64_t n, k, m;
  bool gated, bias, acc, bf16_out;
};

TEST_F(GgufKernelsCuda, LinearMatchesTwin) {
  const cudaStream_t st = ctx().stream;
  const LinCase cases[] = {
      {1, 256, 72, false, false, false, false},   {3, 512, 1031, false, true, true, false},
      {8, 2048, 200, false, false, false, true},  {16, 2048, 520, false, true, false, false},
      {17, 256, 100, false, false, true, false},  {64, 512, 300, false, true, false, true},
      {1, 256, 176, true, false, false, true},    {16, 2048, 200, true, false, false, true},
      {5, 4096, 1024, false, false, false, false}};
  std::mt19937 rng(9);
  for (DType dt : kFormats) {
    for (const LinCase& c : cases) {
      const int64_t wrows = c.gated ? 2 * c.m : c.m;
      const std::vector<uint8_t> w = random_rows(dt, wrows, c.k, 5);
      std::vector<uint16_t> x(static_cast<size_t>(c.n * c.k));
      for (uint16_t& v : x)
        v = ::strata::f32_to_bf16(std::uniform_real_distribution<float>(-1, 1)(rng));
      std::vector<float> bias(static_cast<size_t>(wrows));
      for (float& v : bias) v = std::uniform_real_distribution<float>(-1, 1)(rng);
      std::vector<float> prior(static_cast<size_t>(c.n * c.m));
      for (float& v : prior) v = std::uniform_real_distribution<float>(-1, 1)(rng);

      GpuLinearParams p;
      p.x_stride = c.k;
      p.w_dtype = dt;
      p.w_stride = c.k;
      p.out_dtype = c.bf16_out ? DType::kBF16 : DType::kF32;
      p.out_stride = c.m;
      p.n_tokens = c.n;
      p.in_features = c.k;
      p.out_features = c.m;
      p.accumulate = c.acc;
      p.gated_silu = c.gated;

      std::vector<float> want_f = prior;
      std::vector<uint16_t> want_b(static_cast<size_t>(c.n * c.m));
      GpuLinearParams h = p;
      h.x = x.data();
      h.w = w.data();
      h.bias = c.bias ? bias.data() : nullptr;
      h.out = c.bf16_out ? static_cast<void*>(want_b.data()) : want_f.data();
      ASSERT_TRUE(cpu::gpu_linear(h).ok());

      DeviceArray<uint16_t> dx(x, st);
      DeviceArray<uint8_t> dw(w, st);
      DeviceArray<float> db(bias, st);
      DeviceArray<float> dof(prior, st);
      DeviceArray<uint16_t> dob(static_cast<size_t>(c.n * c.m));
      if (!c.acc) dof.poison(st);
      dob.poison(st);
      GpuLinearParams d = p;
      d.x = dx.get();
      d.w = dw.get();
      d.bias = c.bias ? db.get() : nullptr;
      d.out = c.bf16_out ? static_cast<void*>(dob.get()) : dof.get();
      const Status s = linear(ctx(), d);
      ASSERT_TRUE(s.ok()) << s.to_string();
      std::vector<float> got, want;
      if (c.bf16_out) {
        for (uint16_t v : dob.download(st)) got.push_back(::strata::bf16_to_f32(v));
        for (uint16_t v : want_b) want.push_back(::strata::bf16_to_f32(v));
      } else {
        got = dof.download(st);
        want = want_f;
      }
      double scale = 0, err = 0;
      bool finite = true;
      for (size_t i = 0; i < want.size(); ++i) {
        scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
        finite = finite && std::isfinite(got[i]);
        err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
      }
      const std::string what = std::string(dtype_name(dt)) + " n" + std::to_string(c.n) + " k" +
                               std::to_string(c.k) + " m" + std::to_string(c.m) +
                               (c.gated ? " gated" : "");
      EXPECT_TRUE(finite) << what;
      EXPECT_LE(err, (c.bf16_out ? 8e-3 : 1e-5) * scale) << what;
    }
  }
}

}  // namespace
}  // namespace strata::cuda
