// CPU twins of the GPU executor's linear layer (cuda::linear / sbi_gemm / cublaslt_linear) and of
// its load-time weight quantization (cuda::quantize_rows). Plain loops, written to be obviously
// right rather than fast: the CUDA tests compare against them, and they are tested against the
// f32 reference cpu::linear (tests/ops/test_gpu_linear_twin.cpp).
//
// Rounding points, the same as the CUDA kernels: bf16 x and the stored weights are exact in f32;
// the dot product accumulates in f32 (in k order here; the GPU sums in another order, which is
// the only difference); then * w_scale[m], + bias[m], silu(gate) * up, + out (accumulate), and
// one rounding to bf16 for bf16 out. gpu_linear_a8w8 twins the A8W8 path (int8 weights above
// the crossover): x rounded per token to int8, exact int32 dot products, then the scales. GGUF
// block formats (cuda::gguf_linear) are read as the GPU's bf16 weights (gguf_row_to_bf16): the
// decode kernel and the dequantize-then-GEMM path multiply exactly those.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/random_hash.h"
#include "core/half.h"
#include "core/status.h"

namespace strata::cpu {
namespace {

constexpr const char* kOp = "gpu_linear";

// Every fp8 e4m3 byte as f32 (a lookup instead of the bit decoding per weight).
const std::array<float, 256>& fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = fp8e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// Row r of the weight matrix as f32 values (exact for bf16, int8 and fp8; GGUF blocks as the
// GPU's bf16 weights, gguf_row_to_bf16).
void load_weight_row(const GpuLinearParams& p, int64_t r, float* dst) {
  const int64_t k = p.in_features;
  if (p.w_dtype == DType::kBF16) {
    const uint16_t* w = static_cast<const uint16_t*>(p.w) + r * p.w_stride;
    for (int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(w[i]);
  } else if (p.w_dtype == DType::kI8) {
    const int8_t* w = static_cast<const int8_t*>(p.w) + r * p.w_stride;
    for (int64_t i = 0; i < k; ++i) dst[i] = static_cast<float>(w[i]);
  } else if (dtype_info(p.w_dtype).is_quantized) {  // GGUF blocks in the device row layout
    thread_local std::vector<uint16_t> row;
    row.resize(static_cast<size_t>(k));
    const auto* w = static_cast<const uint8_t*>(p.w) + r * dtype_bytes(p.w_dtype, p.w_stride);
    gguf_row_to_bf16(p.w_dtype, w, k, row.data());
    for (int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(row[static_cast<size_t>(i)]);
  } else {
    const std::array<float, 256>& t = fp8_table();
    const uint8_t* w = static_cast<const uint8_t*>(p.w) + r * p.w_stride;
    for (int64_t i = 0; i < k; ++i) dst[i] = t[w[i]];
  }
}

Status check(const GpuLinearParams& p) {
  const bool gguf = dtype_info(p.w_dtype).is_quantized;
  if (gguf && !gguf_device_ok(p.w_dtype, p.in_features)) {
    return errorf(StatusCode::kUnimplemented,
                  "{}: {} weights with {} input features (device formats: q8_0, q4_0, q4_k, "
                  "q5_k, q6_k with a multiple of 256)",
                  kOp, dtype_name(p.w_dtype), p.in_features);
  }
  if (!gguf && p.w_dtype != DType::kBF16 && p.w_dtype != DType::kI8 &&
      p.w_dtype != DType::kFP8E4M3) {
    return errorf(StatusCode::kUnimplemented, "{}: weight dtype {} (want bf16, i8 or fp8_e4m3)",
                  kOp, dtype_name(p.w_dtype));
  }
  if (gguf && (p.w_scale != nullptr || p.w_stride != p.in_features)) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: {} weights carry their scales (no w_scale) and have dense rows", kOp,
                  dtype_name(p.w_dtype));
  }
  if (p.out_dtype != DType::kF32 && p.out_dtype != DType::kBF16) {
    return errorf(StatusCode::kUnimplemented, "{}: out dtype {} (want f32 or bf16)", kOp,
                  dtype_name(p.out_dtype));
  }
  const bool quantized = p.w_dtype == DType::kI8 || p.w_dtype == DType::kFP8E4M3;
  if (quantized && p.w_scale == nullptr) {
    return errorf(StatusCode::kInvalidArgument, "{}: {} weights need w_scale", kOp,
                  dtype_name(p.w_dtype));
  }
  if (!quantized && p.w_scale != nullptr) {
    return errorf(StatusCode::kInvalidArgument, "{}: w_scale given for bf16 weights", kOp);
  }
  if (p.accumulate && p.out_dtype != DType::kF32) {
    return errorf(StatusCode::kInvalidArgument, "{}: accumulate needs f32 out, got {}", kOp,
                  dtype_name(p.out_dtype));
  }
  if (p.n_tokens < 0 || p.in_features <= 0 || p.out_features <= 0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: bad sizes n_tokens {} in_features {} out_features {}", kOp, p.n_tokens,
                  p.in_features, p.out_features);
  }
  if (p.x_stride < p.in_features || p.w_stride < p.in_features || p.out_stride < p.out_features) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: a row stride is below its row length (x_stride {}, w_stride {} vs "
                  "in_features {}; out_stride {} vs out_features {})",
                  kOp, p.x_stride, p.w_stride, p.in_features, p.out_stride, p.out_features);
  }
  if (p.n_tokens > 0 && (p.x == nullptr || p.w == nullptr || p.out == nullptr)) {
    return errorf(StatusCode::kInvalidArgument, "{}: null x, w or out", kOp);
  }
  return ok_status();
}

float silu(float v) {
  return v / (1.0f + std::exp(-v));
}

}  // namespace

Status gpu_linear(const GpuLinearParams& p) {
  STRATA_RETURN_IF_ERROR(check(p));
  if (p.n_tokens == 0) return ok_status();
  const int64_t n = p.n_tokens;
  const int64_t k = p.in_features;
  const int64_t m = p.out_features;

  // x once as f32 (bf16 values are exact in f32).
  std::vector<float> x(static_cast<size_t>(n * k));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < k; ++i)
      x[static_cast<size_t>(t * k + i)] = bf16_to_f32(p.x[t * p.x_stride + i]);
  }

#pragma omp parallel
  {
    std::vector<float> w0(static_cast<size_t>(k));
    std::vector<float> w1(p.gated_silu ? static_cast<size_t>(k) : 0);
    // One weight row's dot product with token t, scaled and biased: the pre-activation value.
    const auto pre = [&](const std::vector<float>& w, int64_t r, int64_t t) {
      const float* xt = x.data() + t * k;
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) acc += xt[i] * w[static_cast<size_t>(i)];
      if (p.w_scale) acc *= p.w_scale[r];
      if (p.bias) acc += p.bias[r];
      return acc;
    };
#pragma omp for schedule(static)
    for (int64_t j = 0; j < m; ++j) {
      load_weight_row(p, j, w0.data());
      if (p.gated_silu) load_weight_row(p, m + j, w1.data());
      for (int64_t t = 0; t < n; ++t) {
        float v = p.gated_silu ? silu(pre(w0, j, t)) * pre(w1, m + j, t) : pre(w0, j, t);
        if (p.out_dtype == DType::kF32) {
          float* out = static_cast<float*>(p.out) + t * p.out_stride + j;
          if (p.accumulate) v += *out;
          *out = v;
        } else {
          static_cast<uint16_t*>(p.out)[t * p.out_stride + j] = f32_to_bf16(v);
        }
      }
    }
  }
  return ok_status();
}

Status quantize_activations_i8(const uint16_t* x, int64_t x_stride, int64_t n_tokens, int64_t k,
                               int8_t* q, int64_t q_stride, float* x_scale) {
  if (n_tokens < 0 || k <= 0 || x_stride < k || q_stride < k) {
    return errorf(StatusCode::kInvalidArgument,
                  "quantize_activations_i8: bad shape n_tokens {} k {} (x_stride {}, q_stride {})",
                  n_tokens, k, x_stride, q_stride);
  }
  if (n_tokens > 0 && (x == nullptr || q == nullptr || x_scale == nullptr)) {
    return Status(StatusCode::kInvalidArgument, "quantize_activations_i8: null x, q or x_scale");
  }
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const uint16_t* xr = x + t * x_stride;
    float amax = 0.0f;
    for (int64_t i = 0; i < k; ++i) amax = std::fmax(amax, std::fabs(bf16_to_f32(xr[i])));
    const float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    x_scale[t] = s;
    for (int64_t i = 0; i < k; ++i) {
      const float v = std::clamp(std::nearbyint(bf16_to_f32(xr[i]) / s), -127.0f, 127.0f);
      q[t * q_stride + i] = static_cast<int8_t>(v);
    }
  }
  return ok_status();
}

Status gpu_linear_a8w8(const GpuLinearParams& p) {
  STRATA_RETURN_IF_ERROR(check(p));
  if (!a8w8_eligible(p)) {
    return errorf(StatusCode::kInvalidArgument,
                  "gpu_linear_a8w8: needs int8 weights without gated_silu and in/out features "
                  "multiples of 4 (got {} weights, gated_silu {}, in {} out {})",
                  dtype_name(p.w_dtype), p.gated_silu, p.in_features, p.out_features);
  }
  if (p.n_tokens == 0) return ok_status();
  const int64_t n = p.n_tokens;
  const int64_t k = p.in_features;
  const int64_t m = p.out_features;
  std::vector<int8_t> xq(static_cast<size_t>(n * k));
  std::vector<float> xs(static_cast<size_t>(n));
  STRATA_RETURN_IF_ERROR(quantize_activations_i8(p.x, p.x_stride, n, k, xq.data(), k, xs.data()));
#pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < m; ++j) {
    const int8_t* w = static_cast<const int8_t*>(p.w) + j * p.w_stride;
    const float b = p.bias ? p.bias[j] : 0.0f;
    for (int64_t t = 0; t < n; ++t) {
      const int8_t* xt = xq.data() + t * k;
      int32_t acc = 0;  // exact: |acc| <= 127 * 127 * k
      for (int64_t i = 0; i < k; ++i) acc += int32_t{xt[i]} * int32_t{w[i]};
      // The GPU epilogue's operations in its order (linear_epilogue.cu).
      const float v =
          std::fma(static_cast<float>(acc) * xs[static_cast<size_t>(t)], p.w_scale[j], b);
      if (p.out_dtype == DType::kF32) {
        float* out = static_cast<float*>(p.out) + t * p.out_stride + j;
        *out = p.accumulate ? *out + v : v;
      } else {
        static_cast<uint16_t*>(p.out)[t * p.out_stride + j] = f32_to_bf16(v);
      }
    }
  }
  return ok_status();
}

// scale[r] = max|w[r, :]| / qmax; q = round-to-nearest-even(w / scale), saturating. An all-zero
// row gets scale 1 (so its q are 0 and dequantize to 0). Weights must be finite.
Status quantize_rows(const uint16_t* w_bf16, int64_t rows, int64_t cols, DType q_dtype, void* q,
                     float* scale) {
  if (q_dtype != DType::kI8 && q_dtype != DType::kFP8E4M3) {
    return errorf(StatusCode::kInvalidArgument, "quantize_rows: q_dtype {} (want i8 or fp8_e4m3)",
                  dtype_name(q_dtype));
  }
  if (rows < 0 || cols <= 0) {
    return errorf(StatusCode::kInvalidArgument, "quantize_rows: bad shape [{}, {}]", rows, cols);
  }
  if (rows > 0 && (w_bf16 == nullptr || q == nullptr || scale == nullptr)) {
    return errorf(StatusCode::kInvalidArgument, "quantize_rows: null w, q or scale");
  }
  const bool i8 = q_dtype == DType::kI8;
  const float qmax = i8 ? 127.0f : 448.0f;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* w = w_bf16 + r * cols;
    float amax = 0.0f;
    for (int64_t c = 0; c < cols; ++c) amax = std::fmax(amax, std::fabs(bf16_to_f32(w[c])));
    const float s = amax > 0.0f ? amax / qmax : 1.0f;
    scale[r] = s;
    for (int64_t c = 0; c < cols; ++c) {
      const float v = bf16_to_f32(w[c]) / s;
      if (i8) {
        const float rounded = std::clamp(std::nearbyint(v), -127.0f, 127.0f);
        static_cast<int8_t*>(q)[r * cols + c] = static_cast<int8_t>(rounded);
      } else {
        static_cast<uint8_t*>(q)[r * cols + c] = f32_to_fp8e4m3(v);
      }
    }
  }
  return ok_status();
}

Status fill_random_bf16(uint16_t* dst, int64_t n, uint64_t seed, float scale) {
  if (n < 0 || (n > 0 && dst == nullptr)) {
    return Status(StatusCode::kInvalidArgument, "fill_random_bf16: null dst or negative n");
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    dst[i] = f32_to_bf16(cuda::random_uniform(seed, static_cast<uint64_t>(i), scale));
  }
  return ok_status();
}

}  // namespace strata::cpu
