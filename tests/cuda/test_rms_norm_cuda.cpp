// strata::cuda::rms_norm against its CPU twin strata::cpu::rms_norm on awkward shapes: hidden
// sizes that are not multiples of the vector width (769, 5125), few and odd token counts, every
// weight dtype, in place, padded strides. Argument checks run without a GPU.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/cuda_allocator.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/half.h"
#include "cuda_test_util.h"

namespace strata::cuda {
namespace {

constexpr double kMaxRelError = 1e-5;

struct RmsNormCase {
  int64_t n_tokens;
  int64_t hidden;
  DType weight_dtype;
  bool in_place;
  int64_t x_pad = 0;  // x_stride = hidden + x_pad (out_stride too when in place)
  int64_t out_pad = 0;
  float weight_offset = 0.0f;
};

std::string case_name(const ::testing::TestParamInfo<RmsNormCase>& info) {
  const RmsNormCase& c = info.param;
  std::string name = "t" + std::to_string(c.n_tokens) + "_h" + std::to_string(c.hidden) + "_" +
                     std::string(dtype_name(c.weight_dtype));
  if (c.in_place) name += "_inplace";
  if (c.x_pad || c.out_pad)
    name += "_pad" + std::to_string(c.x_pad) + "_" + std::to_string(c.out_pad);
  if (c.weight_offset != 0.0f) name += "_offset";
  return name;
}

// Weight values in the dtype's storage, plus the bytes to copy to the device.
std::vector<uint8_t> make_weight(DType dt, int64_t hidden, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.5f, 1.5f);
  std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(dt, hidden)));
  for (int64_t i = 0; i < hidden; ++i) {
    const float v = dist(rng);
    if (dt == DType::kF32) {
      reinterpret_cast<float*>(bytes.data())[i] = v;
    } else if (dt == DType::kF16) {
      reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_f16(v);
    } else {
      reinterpret_cast<uint16_t*>(bytes.data())[i] = ::strata::f32_to_bf16(v);
    }
  }
  return bytes;
}

class RmsNormCudaTest : public testutil::CudaTest,
                        public ::testing::WithParamInterface<RmsNormCase> {};

TEST_P(RmsNormCudaTest, MatchesCpuTwin) {
  const RmsNormCase& c = GetParam();
  const int64_t x_stride = c.hidden + c.x_pad;
  const int64_t out_stride = c.in_place ? x_stride : c.hidden + c.out_pad;
  std::mt19937 rng(static_cast<uint32_t>(c.hidden * 131 + c.n_tokens));
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);

  std::vector<float> x(static_cast<size_t>(c.n_tokens * x_stride));
  for (float& v : x) v = dist(rng);
  const std::vector<uint8_t> weight = make_weight(c.weight_dtype, c.hidden, rng);

  // CPU reference (in place too when the GPU runs in place).
  std::vector<float> expected = x;
  std::vector<float> cpu_out(static_cast<size_t>(c.n_tokens * out_stride), 0.0f);
  RmsNormParams ref{.x = expected.data(),
                    .weight = weight.data(),
                    .weight_dtype = c.weight_dtype,
                    .out = c.in_place ? expected.data() : cpu_out.data(),
                    .n_tokens = c.n_tokens,
                    .hidden = c.hidden,
                    .x_stride = x_stride,
                    .out_stride = out_stride,
                    .eps = 1e-6f,
                    .weight_offset = c.weight_offset};
  ASSERT_TRUE(cpu::rms_norm(ref).ok());
  if (!c.in_place) expected = cpu_out;

  auto pool = CudaPoolAllocator::create(device().index(), size_t{64} << 20);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  auto d_x = (*pool)->allocate(x.size() * sizeof(float));
  auto d_w = (*pool)->allocate(weight.size());
  auto d_out = (*pool)->allocate(expected.size() * sizeof(float));
  ASSERT_TRUE(d_x.ok() && d_w.ok() && d_out.ok());
  cudaStream_t s = ctx().stream;
  ASSERT_EQ(
      cudaMemcpyAsync(d_x->data(), x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, s),
      cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(d_w->data(), weight.data(), weight.size(), cudaMemcpyHostToDevice, s),
            cudaSuccess);
  // Padding of out starts as zeros and must stay zeros.
  ASSERT_EQ(cudaMemsetAsync(d_out->data(), 0, d_out->bytes(), s), cudaSuccess);

  float* gpu_out = c.in_place ? d_x->as<float>() : d_out->as<float>();
  RmsNormParams p = ref;
  p.x = d_x->as<float>();
  p.weight = d_w->data();
  p.out = gpu_out;
  const Status st = rms_norm(ctx(), p);
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<float> got(expected.size());
  ASSERT_EQ(
      cudaMemcpyAsync(got.data(), gpu_out, got.size() * sizeof(float), cudaMemcpyDeviceToHost, s),
      cudaSuccess);
  const Status sync = device().synchronize();
  ASSERT_TRUE(sync.ok()) << sync.to_string();

  double max_rel = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ref_v = expected[i];
    const double rel = std::fabs(got[i] - ref_v) / std::max(std::fabs(ref_v), double{FLT_MIN});
    if (rel > max_rel) {
      max_rel = rel;
      worst = i;
    }
  }
  EXPECT_LE(max_rel, kMaxRelError)
      << "at element " << worst << ": gpu " << got[worst] << " cpu " << expected[worst];
}

std::vector<RmsNormCase> all_cases() {
  std::vector<RmsNormCase> cases;
  for (int64_t hidden : {72, 769, 4096, 5125}) {
    for (int64_t n_tokens : {1, 7, 33}) {
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (bool in_place : {false, true}) cases.push_back({n_tokens, hidden, dt, in_place});
      }
    }
  }
  // Padded row strides: vector path (multiples of 4) and scalar path (odd), and Gemma's +1.
  cases.push_back({.n_tokens = 5,
                   .hidden = 4096,
                   .weight_dtype = DType::kBF16,
                   .in_place = false,
                   .x_pad = 4,
                   .out_pad = 12});
  cases.push_back(
      {.n_tokens = 5, .hidden = 4096, .weight_dtype = DType::kF16, .in_place = true, .x_pad = 8});
  cases.push_back({.n_tokens = 6,
                   .hidden = 768,
                   .weight_dtype = DType::kF32,
                   .in_place = false,
                   .x_pad = 3,
                   .out_pad = 1});
  cases.push_back({.n_tokens = 3,
                   .hidden = 2048,
                   .weight_dtype = DType::kBF16,
                   .in_place = false,
                   .weight_offset = 1.0f});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AwkwardShapes, RmsNormCudaTest, ::testing::ValuesIn(all_cases()),
                         case_name);

// ---- argument checks: no GPU needed, they fail before any CUDA call --------------------------

RmsNormParams valid_looking_params() {
  // Pointers are never dereferenced: every call below fails its checks or launches nothing.
  static float fake[1];
  return RmsNormParams{.x = fake,
                       .weight = fake,
                       .weight_dtype = DType::kF32,
                       .out = fake,
                       .n_tokens = 2,
                       .hidden = 8,
                       .x_stride = 8,
                       .out_stride = 8};
}

TEST(RmsNormCudaArgs, UnsupportedWeightDtype) {
  RmsNormParams p = valid_looking_params();
  p.weight_dtype = DType::kFP8E4M3;
  const Status st = rms_norm(LaunchCtx{}, p);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("fp8"), std::string::npos) << st.message();
}

TEST(RmsNormCudaArgs, StrideSmallerThanHidden) {
  RmsNormParams p = valid_looking_params();
  p.x_stride = 7;
  const Status st = rms_norm(LaunchCtx{}, p);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("stride"), std::string::npos) << st.message();
}

TEST(RmsNormCudaArgs, InPlaceWithDifferentStrides) {
  RmsNormParams p = valid_looking_params();
  p.out_stride = 16;
  EXPECT_EQ(rms_norm(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
}

TEST(RmsNormCudaArgs, NullPointersAndBadSizes) {
  RmsNormParams p = valid_looking_params();
  p.weight = nullptr;
  EXPECT_EQ(rms_norm(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
  p = valid_looking_params();
  p.hidden = 0;
  EXPECT_EQ(rms_norm(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
  p = valid_looking_params();
  p.n_tokens = -1;
  EXPECT_EQ(rms_norm(LaunchCtx{}, p).code(), StatusCode::kInvalidArgument);
}

TEST(RmsNormCudaArgs, ZeroTokensLaunchesNothing) {
  RmsNormParams p = valid_looking_params();
  p.n_tokens = 0;
  p.x = nullptr;
  p.out = nullptr;
  EXPECT_TRUE(rms_norm(LaunchCtx{}, p).ok());
}

}  // namespace
}  // namespace strata::cuda
