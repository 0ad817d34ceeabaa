// Shared by the GPU tests: a fixture that creates CUDA device 0 once per test suite and skips
// every test of the suite (with the reason) when there is no GPU or driver.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backends/cuda/cuda_device.h"

namespace strata::cuda::testutil {

class CudaTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dev = CudaDevice::create(0);
    if (dev.ok()) {
      device_ = std::move(dev).value();
    } else {
      skip_reason_ = dev.status().to_string();
    }
  }
  static void TearDownTestSuite() { device_.reset(); }
  void SetUp() override {
    if (!device_) GTEST_SKIP() << "needs a CUDA device: " << skip_reason_;
  }

  static CudaDevice& device() { return *device_; }
  static const LaunchCtx& ctx() { return device_->launch_ctx(); }

 private:
  static inline std::unique_ptr<CudaDevice> device_;
  static inline std::string skip_reason_;
};

}  // namespace strata::cuda::testutil
