// CudaDevice: creation fails with a Status (and no crash) where there is no GPU or driver; on a
// GPU it reports its name, memory and a complete LaunchCtx.
#include <gtest/gtest.h>

#include <string>

#include "backends/cuda/cuda_allocator.h"
#include "backends/cuda/cuda_device.h"
#include "cuda_test_util.h"

namespace strata::cuda {
namespace {

TEST(CudaDeviceCreate, MissingDeviceIsAStatusNotACrash) {
  const int count = cuda_device_count();
  EXPECT_GE(count, 0);
  if (count == 0) {
    auto dev = CudaDevice::create(0);
    ASSERT_FALSE(dev.ok());
    EXPECT_EQ(dev.status().code(), StatusCode::kNotFound);
    EXPECT_EQ(dev.status().message().rfind("no CUDA device: ", 0), 0u) << dev.status().message();
    // Nothing else crashes either: pools and pinned buffers fail with a Status.
    EXPECT_FALSE(CudaPoolAllocator::create(0, 1 << 20).ok());
    EXPECT_FALSE(allocate_pinned_host(4096).ok());
  } else {
    auto dev = CudaDevice::create(count);
    ASSERT_FALSE(dev.ok());
    EXPECT_EQ(dev.status().code(), StatusCode::kOutOfRange);
  }
  EXPECT_FALSE(CudaDevice::create(-1).ok());
}

class CudaDeviceTest : public testutil::CudaTest {};

TEST_F(CudaDeviceTest, ReportsPropertiesAndMemory) {
  EXPECT_FALSE(device().name().empty());
  EXPECT_TRUE(device().device().is_cuda());
  auto mem = device().memory_info();
  ASSERT_TRUE(mem.ok()) << mem.status().to_string();
  EXPECT_GT(mem->total_bytes, 0u);
  EXPECT_LE(mem->free_bytes, mem->total_bytes);
  const LaunchCtx& c = ctx();
  EXPECT_NE(c.stream, nullptr);
  EXPECT_NE(c.cublaslt, nullptr);
  EXPECT_NE(c.workspace, nullptr);
  EXPECT_EQ(c.workspace_bytes, CudaDeviceOptions{}.workspace_bytes);
  EXPECT_GT(c.sm_count, 0);
  EXPECT_GE(c.cc_major, 7);
  EXPECT_GT(c.max_smem_per_block_optin, 0u);
  EXPECT_TRUE(device().synchronize().ok());
}

}  // namespace
}  // namespace strata::cuda
