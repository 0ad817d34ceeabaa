// Shared by the CUDA-vs-CPU kernel tests: device arrays, random inputs (never zeros), NaN
// poisoning and an element-wise comparison in which a NaN matches only a NaN, so an element the
// GPU left unwritten (still poison) where the CPU twin wrote a value fails the test.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "strata/types.h"

namespace strata::cuda::testutil {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Device memory for n elements of T, freed on destruction. Failures are test failures.
template <class T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  DeviceArray(const std::vector<T>& host, cudaStream_t s) : DeviceArray(host.size()) {
    upload(host, s);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return ptr_; }
  void upload(const std::vector<T>& host, cudaStream_t s) {
    EXPECT_EQ(host.size(), n_);
    EXPECT_EQ(cudaMemcpyAsync(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, s),
              cudaSuccess);
  }
  // Every byte 0xff: a NaN for f32, -1 for int32.
  void poison(cudaStream_t s) {
    EXPECT_EQ(cudaMemsetAsync(ptr_, 0xff, n_ * sizeof(T), s), cudaSuccess);
  }
  // Waits for the stream, then copies back.
  std::vector<T> download(cudaStream_t s) const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpyAsync(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost, s),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    return host;
  }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Uniform in [lo, hi], with values too close to zero pushed away from it (|v| >= 1e-3), so no
// input is zero and relative errors stay meaningful.
inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(rng);
    if (std::fabs(x) < 1e-3f) x = x < 0.0f ? -1e-3f : 1e-3f;
  }
  return v;
}

// n random values stored in dtype dt (f32, f16 or bf16), as raw bytes.
inline std::vector<uint8_t> random_typed(DType dt, int64_t n, std::mt19937& rng, float lo,
                                         float hi) {
  const std::vector<float> f = random_floats(static_cast<size_t>(n), rng, lo, hi);
  std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(dt, n)));
  for (int64_t i = 0; i < n; ++i) {
    if (dt == DType::kF32) {
      reinterpret_cast<float*>(bytes.data())[i] = f[i];
    } else if (dt == DType::kF16) {
      reinterpret_cast<uint16_t*>(bytes.data())[i] = f32_to_f16(f[i]);
    } else {
      reinterpret_cast<uint16_t*>(bytes.data())[i] = ::strata::f32_to_bf16(f[i]);
    }
  }
  return bytes;
}

// Pass when |got - ref| <= atol + rtol * |ref| for every element, where a NaN on either side
// matches only a NaN on the other.
struct Tol {
  double rtol = 0.0;
  double atol = 0.0;
};

inline ::testing::AssertionResult all_close(const std::vector<float>& got,
                                            const std::vector<float>& ref, Tol tol) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << ref.size();
  }
  size_t bad = 0;
  size_t first_bad = 0;
  double worst_excess = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool gn = std::isnan(got[i]);
    const bool rn = std::isnan(ref[i]);
    bool ok = gn == rn;
    if (ok && !gn) {
      const double err = std::fabs(static_cast<double>(got[i]) - ref[i]);
      const double allowed = tol.atol + tol.rtol * std::fabs(static_cast<double>(ref[i]));
      ok = err <= allowed;
      if (err - allowed > worst_excess) {
        worst_excess = err - allowed;
        worst = i;
      }
    }
    if (!ok && bad++ == 0) first_bad = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ; first at " << first_bad << ": gpu "
         << got[first_bad] << " cpu " << ref[first_bad] << "; worst at " << worst << ": gpu "
         << got[worst] << " cpu " << ref[worst] << " (rtol " << tol.rtol << ", atol " << tol.atol
         << ")";
}

// NaNs inside the [rows, cols] view of a row-strided matrix (the CPU reference must have none).
inline size_t nan_in_view(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t stride) {
  size_t n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) n += std::isnan(m[static_cast<size_t>(r * stride + c)]);
  }
  return n;
}

}  // namespace strata::cuda::testutil
