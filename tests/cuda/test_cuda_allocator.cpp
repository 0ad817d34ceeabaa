// The device memory pool: FreeList bookkeeping (runs anywhere), then CudaPoolAllocator and pinned
// host buffers on a GPU: alignment, reuse, fragmentation and coalescing, OOM messages, ownership.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_allocator.h"
#include "backends/cuda/free_list.h"
#include "cuda_test_util.h"

namespace strata::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// ---- FreeList (no GPU) -----------------------------------------------------------------------

TEST(FreeList, RoundsToAlignmentAndFillsFromTheStart) {
  FreeList fl(4096, 256);
  EXPECT_EQ(fl.block_size(1), 256u);
  EXPECT_EQ(fl.block_size(256), 256u);
  EXPECT_EQ(fl.block_size(257), 512u);
  EXPECT_EQ(fl.allocate(100), std::optional<size_t>(0));
  EXPECT_EQ(fl.allocate(300), std::optional<size_t>(256));
  EXPECT_EQ(fl.used_bytes(), 768u);
  EXPECT_EQ(fl.free_bytes(), 4096u - 768u);
  EXPECT_EQ(fl.free_block_count(), 1u);
}

TEST(FreeList, ReusesAReleasedBlock) {
  FreeList fl(4096, 256);
  const auto a = fl.allocate(1024);
  ASSERT_TRUE(a);
  fl.release(*a, 1024);
  EXPECT_EQ(fl.free_bytes(), 4096u);
  EXPECT_EQ(fl.free_block_count(), 1u);
  EXPECT_EQ(fl.allocate(1024), a);
}

TEST(FreeList, BestFitPicksTheSmallestBlockThatFits) {
  FreeList fl(8 * 256, 256);
  const auto a = fl.allocate(3 * 256);  // [0, 3)
  const auto b = fl.allocate(256);      // [3, 4)
  const auto c = fl.allocate(256);      // [4, 5)
  const auto d = fl.allocate(3 * 256);  // [5, 8): arena full
  ASSERT_TRUE(a && b && c && d);
  EXPECT_FALSE(fl.allocate(1));
  fl.release(*a, 3 * 256);  // free: [0, 3) and [4, 5)
  fl.release(*c, 256);
  EXPECT_EQ(fl.allocate(200), c);  // the one-unit hole, not the front of the big one
  EXPECT_EQ(fl.allocate(2 * 256), a);
}

TEST(FreeList, FragmentationThenCoalescing) {
  FreeList fl(4 * kMiB, 256);
  const auto a = fl.allocate(kMiB);
  const auto b = fl.allocate(kMiB);
  const auto c = fl.allocate(kMiB);
  const auto d = fl.allocate(kMiB);
  ASSERT_TRUE(a && b && c && d);
  fl.release(*a, kMiB);
  fl.release(*c, kMiB);
  EXPECT_EQ(fl.free_bytes(), 2 * kMiB);
  EXPECT_EQ(fl.largest_free_block(), kMiB);
  EXPECT_EQ(fl.free_block_count(), 2u);
  EXPECT_FALSE(fl.allocate(2 * kMiB));  // enough bytes, but not in one piece
  fl.release(*b, kMiB);                 // merges with both neighbours
  EXPECT_EQ(fl.free_block_count(), 1u);
  EXPECT_EQ(fl.largest_free_block(), 3 * kMiB);
  EXPECT_EQ(fl.allocate(3 * kMiB), a);
  fl.release(*d, kMiB);
  fl.release(*a, 3 * kMiB);
  EXPECT_EQ(fl.free_bytes(), 4 * kMiB);
  EXPECT_EQ(fl.free_block_count(), 1u);
}

TEST(FreeList, OversizedAndEmptyArena) {
  FreeList fl(1000, 256);  // capacity rounds down to 768
  EXPECT_EQ(fl.capacity(), 768u);
  EXPECT_FALSE(fl.allocate(769));
  EXPECT_FALSE(fl.allocate(SIZE_MAX));
  FreeList empty(0, 256);
  EXPECT_FALSE(empty.allocate(1));
  EXPECT_EQ(empty.largest_free_block(), 0u);
}

TEST(FreeListDeathTest, DoubleReleaseIsCaught) {
  FreeList fl(4096, 256);
  const auto a = fl.allocate(256);
  ASSERT_TRUE(a);
  fl.release(*a, 256);
  EXPECT_DEATH(fl.release(*a, 256), "check failed");
}

// ---- CudaPoolAllocator (GPU) -----------------------------------------------------------------

class CudaPoolTest : public testutil::CudaTest {
 protected:
  std::unique_ptr<CudaPoolAllocator> make_pool(size_t bytes) {
    auto pool = CudaPoolAllocator::create(device().index(), bytes);
    EXPECT_TRUE(pool.ok()) << pool.status().to_string();
    return pool.ok() ? std::move(pool).value() : nullptr;
  }
};

TEST_F(CudaPoolTest, AllocatesAlignedWritableDeviceMemory) {
  auto pool = make_pool(4 * kMiB);
  ASSERT_TRUE(pool);
  auto a = pool->allocate(1000);
  auto b = pool->allocate(3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->bytes(), 1000u);
  EXPECT_EQ(a->device(), Device::cuda(device().index()));
  EXPECT_EQ(a->residency(), Residency::kDevice);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data()) % CudaPoolAllocator::kAlignment, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % CudaPoolAllocator::kAlignment, 0u);
  EXPECT_NE(a->data(), b->data());

  ASSERT_EQ(cudaMemsetAsync(a->data(), 0x5a, a->bytes(), ctx().stream), cudaSuccess);
  std::vector<uint8_t> host(a->bytes());
  ASSERT_EQ(
      cudaMemcpyAsync(host.data(), a->data(), host.size(), cudaMemcpyDeviceToHost, ctx().stream),
      cudaSuccess);
  ASSERT_TRUE(device().synchronize().ok());
  for (uint8_t v : host) ASSERT_EQ(v, 0x5a);

  auto empty = pool->allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

TEST_F(CudaPoolTest, ReleasedBlocksAreReusedWithoutNewCudaMalloc) {
  auto pool = make_pool(4 * kMiB);
  ASSERT_TRUE(pool);
  void* first = nullptr;
  {
    auto a = pool->allocate(kMiB);
    ASSERT_TRUE(a.ok());
    first = a->data();
    Buffer copy = *a;  // copies share the block
    EXPECT_EQ(pool->stats().used_bytes, kMiB);
  }
  EXPECT_EQ(pool->stats().used_bytes, 0u);
  auto b = pool->allocate(kMiB);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), first);
}

TEST_F(CudaPoolTest, FragmentationAndCoalescing) {
  auto pool = make_pool(4 * kMiB);
  ASSERT_TRUE(pool);
  std::vector<Buffer> blocks;
  for (int i = 0; i < 4; ++i) {
    auto r = pool->allocate(kMiB);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    blocks.push_back(std::move(r).value());
  }
  void* front = blocks[0].data();
  blocks[0] = Buffer();
  blocks[2] = Buffer();
  const CudaPoolStats s = pool->stats();
  EXPECT_EQ(s.free_bytes, 2 * kMiB);
  EXPECT_EQ(s.largest_free_block, kMiB);
  EXPECT_EQ(s.free_blocks, 2u);

  auto big = pool->allocate(2 * kMiB);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(big.status().message().find("largest free block 1048576"), std::string::npos)
      << big.status().message();

  blocks[1] = Buffer();  // [0, 3 MiB) is one free block again
  auto merged = pool->allocate(3 * kMiB);
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  EXPECT_EQ(merged->data(), front);
}

TEST_F(CudaPoolTest, OutOfMemoryNamesRequestedAndFreeBytes) {
  auto pool = make_pool(2 * kMiB);
  ASSERT_TRUE(pool);
  auto a = pool->allocate(kMiB + 1);  // occupies 1 MiB + 256
  ASSERT_TRUE(a.ok());
  auto b = pool->allocate(kMiB);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kOutOfMemory);
  const std::string& msg = b.status().message();
  EXPECT_NE(msg.find("cannot allocate 1048576 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(kMiB - 256) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cuda:"), std::string::npos) << msg;
}

TEST_F(CudaPoolTest, ArenaLargerThanTheDeviceFailsWithStatus) {
  auto pool = CudaPoolAllocator::create(device().index(), size_t{1} << 50);  // 1 PiB
  ASSERT_FALSE(pool.ok());
  EXPECT_EQ(pool.status().code(), StatusCode::kOutOfMemory);
  EXPECT_NE(pool.status().message().find("cannot reserve"), std::string::npos)
      << pool.status().message();
}

TEST_F(CudaPoolTest, BuffersOutliveTheAllocator) {
  auto pool = make_pool(kMiB);
  ASSERT_TRUE(pool);
  auto a = pool->allocate(4096);
  ASSERT_TRUE(a.ok());
  Buffer buf = std::move(a).value();
  pool.reset();  // the arena stays until `buf` goes
  ASSERT_EQ(cudaMemsetAsync(buf.data(), 0, buf.bytes(), ctx().stream), cudaSuccess);
  ASSERT_TRUE(device().synchronize().ok());
}

TEST_F(CudaPoolTest, PinnedHostBuffers) {
  CudaPinnedHostAllocator pinned;
  auto r = pinned.allocate(12345);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->residency(), Residency::kHostPinned);
  EXPECT_TRUE(r->device().is_cpu());
  const auto* bytes = r->as<uint8_t>();
  for (size_t i = 0; i < r->bytes(); ++i) ASSERT_EQ(bytes[i], 0);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, r->data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
}

}  // namespace
}  // namespace strata::cuda
