// Shared by the CPU and CUDA KV-offload tests: the executor's offload copies move every byte of
// a block (all layers, K and V) to the host pool and back into other device blocks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/executor.h"

namespace strata::testing {

inline void check_offload_round_trip(Executor& exec) {
  const int64_t n_blocks = exec.cache().config().n_blocks;
  ASSERT_GE(n_blocks, 6);
  ASSERT_TRUE(exec.kv_offload_enable(12).ok());
  const size_t bytes = exec.block_bytes();
  // Patterns into device blocks 0, 1, 2 (swap's per-block copies: an independent path).
  std::vector<std::vector<uint8_t>> want(3, std::vector<uint8_t>(bytes));
  for (size_t b = 0; b < 3; ++b) {
    for (size_t i = 0; i < bytes; ++i) {
      want[b][i] = static_cast<uint8_t>((i * 7 + b * 31 + i / 251) & 0xff);
    }
    ASSERT_TRUE(exec.copy_block_from_host(static_cast<int32_t>(b), want[b].data()).ok());
  }
  // Device 0, 1, 2 -> host 5, 6, 11 -> device 5, 3, 4 (a merged run and a lone block).
  const int32_t dev_out[] = {0, 1, 2}, host[] = {5, 6, 11}, dev_in[] = {5, 3, 4};
  ASSERT_TRUE(exec.kv_offload_store(dev_out, host).ok());
  ASSERT_TRUE(exec.kv_offload_load(dev_in, host).ok());
  ASSERT_TRUE(exec.kv_offload_wait_loads().ok());
  ASSERT_TRUE(exec.kv_offload_synchronize().ok());
  for (size_t b = 0; b < 3; ++b) {
    std::vector<uint8_t> got(bytes);
    ASSERT_TRUE(exec.copy_block_to_host(dev_in[b], got.data()).ok());
    EXPECT_EQ(got, want[b]) << "block " << dev_out[b] << " -> host " << host[b] << " -> block "
                            << dev_in[b];
  }
  // Out-of-range ids are errors, not copies.
  const int32_t bad_host[] = {12};
  const int32_t one[] = {0};
  EXPECT_FALSE(exec.kv_offload_load(one, bad_host).ok());
}

}  // namespace strata::testing
