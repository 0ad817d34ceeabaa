// The varlen paged attention kernels (varlen_attention, flash_prefill with every tile shape,
// flash_decode split and unsplit, and the generic kernel they fall back to) against the CPU twin
// cpu::varlen_attention, on mixed batches and awkward sizes: whole prefills (1, 63, 64, 65, 300,
// 2049 tokens), chunks at the end of long caches, decodes of 1..4 tokens with n_seqs 1, 7, 64 and
// different kv_len per sequence (1, 63, 64, 65, 300, 2049), a sequence with no query; block
// sizes 16 and 64 with the pool's blocks in shuffled order; head_dim 64, 128 (tensor-core
// kernels) and 16, 24 (generic), and 64 with an unaligned q stride (generic); GQA 32/8, MQA,
// MHA; sliding windows (blocks wholly before the window are -1 in the table, as if freed) and
// softcap. Inputs are random and non-zero; outputs are NaN-poisoned and their row padding must
// stay untouched; cache slots no query may read hold NaN, so reading one poisons a row.
// Also: a block outside the pool gives NaN rows for its sequence only, a CUDA graph captured
// once replays correctly with other kv_len values, and argument checks (no GPU needed).
//
// Tolerance: |gpu - cpu| <= 2^-7 |cpu| + 1e-2 * max|cpu| over the same (token, head) row. Both
// sides round the output to bf16 once, so values straddling a rounding boundary may differ by
// one bf16 ulp (<= 2^-7 relative). Before that, the twin keeps the softmax weights in f32 while
// the GPU rounds them to bf16 for the tensor-core P.V product: relative errors <= 2^-9 each,
// independent, so the output moves by ~2^-9 of the row's scale (bounded by 2^-9 max|v|);
// ex2.approx and summation order add ~1e-6. Rows have magnitudes from ~1 (kv_len 1: out = v)
// down to ~0.02 (2049 keys averaged), so the scale is taken per row, not over the whole output.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernels/flash_tiles.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"

namespace strata::cuda {
namespace {

using testutil::DeviceArray;

constexpr uint16_t kBf16NaN = 0x7fc0;
constexpr uint16_t kPoison = 0xffff;  // a NaN; also marks the out row padding
constexpr int64_t kOutPad = 8;        // out_stride = n_heads * head_dim + kOutPad

struct Seq {
  int64_t n_q;
  int64_t kv_len;
};

struct VCase {
  std::string name;
  std::vector<Seq> seqs;
  int64_t n_heads;
  int64_t n_heads_kv;
  int64_t head_dim;
  int64_t block_size;
  int64_t window = 0;
  float softcap = 0.0f;
  int64_t q_pad = 0;  // extra elements per q row (4: unaligned rows, generic kernel)
};

int64_t window_start(int64_t pos, int64_t window) {
  return window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
}

// A batch in host memory (bf16 bit patterns) and its copy on the device.
struct Batch {
  std::vector<uint16_t> q, k, v;
  std::vector<int32_t> cu_q, kv_len, tables;
  int64_t n_tokens = 0, max_blocks = 0, n_blocks = 0, max_q = 0, max_kv = 0;
  int64_t q_stride = 0, out_stride = 0;
};

Batch make_batch(const VCase& c, std::mt19937& rng) {
  Batch b;
  const int64_t n_seqs = static_cast<int64_t>(c.seqs.size());
  b.cu_q.push_back(0);
  for (const Seq& s : c.seqs) {
    b.cu_q.push_back(static_cast<int32_t>(b.cu_q.back() + s.n_q));
    b.kv_len.push_back(static_cast<int32_t>(s.kv_len));
    b.max_q = std::max(b.max_q, s.n_q);
    b.max_kv = std::max(b.max_kv, s.kv_len);
    b.max_blocks = std::max(b.max_blocks, (s.kv_len + c.block_size - 1) / c.block_size);
  }
  b.n_tokens = b.cu_q.back();
  b.max_blocks += 1;  // a spare (-1) entry per table
  b.n_blocks = n_seqs * b.max_blocks + 5;
  std::vector<int32_t> ids(static_cast<size_t>(b.n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  b.tables.assign(static_cast<size_t>(n_seqs * b.max_blocks), -1);

  const int64_t slot = c.n_heads_kv * c.head_dim;
  const size_t cache_n = static_cast<size_t>(b.n_blocks * c.block_size * slot);
  b.k.assign(cache_n, kBf16NaN);
  b.v.assign(cache_n, kBf16NaN);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  auto nonzero = [&](float scale) {
    float x = scale * dist(rng);
    if (std::fabs(x) < 1e-3f) x = 1e-3f;
    return ::strata::f32_to_bf16(x);
  };
  size_t next_id = 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t kv = c.seqs[s].kv_len;
    const int64_t lo = c.seqs[s].n_q > 0 ? window_start(kv - c.seqs[s].n_q, c.window) : 0;
    for (int64_t blk = 0; blk * c.block_size < kv; ++blk) {
      const int32_t id = ids[next_id++];
      if ((blk + 1) * c.block_size > lo) b.tables[s * b.max_blocks + blk] = id;  // else "freed"
      for (int64_t i = 0; i < c.block_size; ++i) {
        const int64_t pos = blk * c.block_size + i;
        if (pos < lo || pos >= kv) continue;  // never read: stays NaN
        const size_t at = static_cast<size_t>((id * c.block_size + i) * slot);
        for (int64_t e = 0; e < slot; ++e) {
          b.k[at + e] = nonzero(1.0f);
          b.v[at + e] = nonzero(1.0f);
        }
      }
    }
  }
  const int64_t row = c.n_heads * c.head_dim;
  b.q_stride = row + c.q_pad;
  b.out_stride = row + kOutPad;
  b.q.resize(static_cast<size_t>(b.n_tokens * b.q_stride));
  for (uint16_t& x : b.q) x = nonzero(2.0f);
  return b;
}

VarlenAttentionParams host_params(const VCase& c, Batch& b, uint16_t* out) {
  return VarlenAttentionParams{.q = b.q.data(),
                               .q_stride = b.q_stride,
                               .out = out,
                               .out_stride = b.out_stride,
                               .cu_q = b.cu_q.data(),
                               .kv_len = b.kv_len.data(),
                               .n_seqs = static_cast<int64_t>(c.seqs.size()),
                               .n_heads = c.n_heads,
                               .max_q_len = b.max_q,
                               .max_kv_len = b.max_kv,
                               .cache = {.k_cache = b.k.data(),
                                         .v_cache = b.v.data(),
                                         .block_tables = b.tables.data(),
                                         .max_blocks_per_seq = b.max_blocks,
                                         .n_seqs = static_cast<int64_t>(c.seqs.size()),
                                         .n_blocks = b.n_blocks,
                                         .block_size = c.block_size,
                                         .n_heads_kv = c.n_heads_kv,
                                         .head_dim = c.head_dim},
                               .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                               .sliding_window = c.window,
                               .logit_softcap = c.softcap};
}

struct DeviceBatch {
  DeviceArray<uint16_t> q, k, v, out;
  DeviceArray<int32_t> cu_q, kv_len, tables;
  DeviceArray<float> workspace;
  size_t workspace_bytes;
  DeviceBatch(const Batch& b, size_t ws_bytes, cudaStream_t st)
      : q(b.q, st),
        k(b.k, st),
        v(b.v, st),
        out(static_cast<size_t>(std::max<int64_t>(b.n_tokens, 1) * b.out_stride)),
        cu_q(b.cu_q, st),
        kv_len(b.kv_len, st),
        tables(b.tables, st),
        workspace(ws_bytes / sizeof(float) + 1),
        workspace_bytes(ws_bytes) {}

  VarlenAttentionParams params(VarlenAttentionParams p, bool with_workspace) const {
    p.q = q.get();
    p.out = out.get();
    p.cu_q = cu_q.get();
    p.kv_len = kv_len.get();
    p.cache.k_cache = k.get();
    p.cache.v_cache = v.get();
    p.cache.block_tables = tables.get();
    p.workspace = with_workspace ? workspace.get() : nullptr;
    p.workspace_bytes = with_workspace ? workspace_bytes : 0;
    return p;
  }
};

// Per (token, head) row: NaN where the reference has NaN (and only there), else within
// 2^-7 |ref| + 1e-2 * max|ref| of the row; the padding after each token's heads still kPoison.
::testing::AssertionResult matches(const std::vector<uint16_t>& got,
                                   const std::vector<uint16_t>& ref, int64_t n_tokens,
                                   int64_t n_heads, int64_t hd, int64_t stride) {
  size_t bad = 0;
  std::string first;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const size_t at = static_cast<size_t>(t * stride + h * hd);
      double scale = 0.0;
      for (int64_t d = 0; d < hd; ++d) {
        scale = std::max(scale, std::fabs(static_cast<double>(::strata::bf16_to_f32(ref[at + d]))));
      }
      for (int64_t d = 0; d < hd; ++d) {
        const double g = ::strata::bf16_to_f32(got[at + d]);
        const double r = ::strata::bf16_to_f32(ref[at + d]);
        const bool ok = std::isnan(r)
                            ? std::isnan(g)
                            : std::fabs(g - r) <= std::ldexp(std::fabs(r), -7) + 1e-2 * scale;
        if (!ok && bad++ == 0) {
          first = "token " + std::to_string(t) + " head " + std::to_string(h) + " dim " +
                  std::to_string(d) + ": gpu " + std::to_string(g) + " cpu " + std::to_string(r) +
                  " (row scale " + std::to_string(scale) + ")";
        }
      }
    }
    for (int64_t i = n_heads * hd; i < stride; ++i) {
      if (got[static_cast<size_t>(t * stride + i)] != kPoison && bad++ == 0) {
        first = "token " + std::to_string(t) + " padding element " + std::to_string(i) + " written";
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements differ; first: " << first;
}

// One way of running the GPU attention.
struct Runner {
  std::string name;
  bool with_workspace;
  int sm_count;  // 0: the device's; a large value forces the most splits
  Status (*run)(const LaunchCtx&, const VarlenAttentionParams&);
};

Status run_tile(const LaunchCtx& ctx, const VarlenAttentionParams& p, FlashPrefillTile t) {
  return flash_prefill_tile(ctx, p, t);
}

const Runner kRunners[] = {
    {"varlen_attention", true, 0, varlen_attention},
    {"varlen_attention_no_workspace", false, 0, varlen_attention},
    {"flash_prefill", false, 0, flash_prefill},
    {"prefill_w4m64n64", false, 0,
     [](const LaunchCtx& x, const VarlenAttentionParams& p) {
       return run_tile(x, p, FlashPrefillTile::kW4M64N64);
     }},
    {"prefill_w8m128n64", false, 0,
     [](const LaunchCtx& x, const VarlenAttentionParams& p) {
       return run_tile(x, p, FlashPrefillTile::kW8M128N64);
     }},
    {"prefill_w4m128n32", false, 0,
     [](const LaunchCtx& x, const VarlenAttentionParams& p) {
       return run_tile(x, p, FlashPrefillTile::kW4M128N32);
     }},
    {"prefill_w4m128n64", false, 0,
     [](const LaunchCtx& x, const VarlenAttentionParams& p) {
       return run_tile(x, p, FlashPrefillTile::kW4M128N64);
     }},
    {"decode_split", true, 0, flash_decode},
    {"decode_max_splits", true, 1 << 20, flash_decode},
    {"decode_unsplit", false, 0, flash_decode},
};

std::string seqs_name(const std::vector<Seq>& seqs) {
  std::string s;
  for (size_t i = 0; i < seqs.size() && i < 8; ++i) {
    s += (i ? "," : "") + std::to_string(seqs[i].n_q) + "/" + std::to_string(seqs[i].kv_len);
  }
  return seqs.size() > 8 ? s + ",... (" + std::to_string(seqs.size()) + " seqs)" : s;
}

std::vector<Seq> decode_batch(int n, std::mt19937& rng, int64_t max_kv, int64_t n_q = 1) {
  std::uniform_int_distribution<int64_t> len(n_q, max_kv);
  std::vector<Seq> seqs;
  for (int i = 0; i < n; ++i) seqs.push_back({n_q, len(rng)});
  return seqs;
}

std::vector<VCase> all_cases() {
  std::mt19937 rng(12345);
  const std::vector<Seq> mixed = {{37, 37}, {5, 25}, {1, 50}, {1, 1}, {0, 10}, {1, 300}};
  const std::vector<Seq> awkward = {{1, 1}, {63, 63}, {64, 64}, {65, 65}, {300, 300}};
  const std::vector<Seq> chunks = {{64, 2049}, {65, 300}, {63, 63}, {5, 1000}, {1, 65}};
  const std::vector<Seq> seven = {{1, 1}, {1, 63}, {1, 64}, {1, 65}, {1, 300}, {1, 2049}, {1, 17}};
  const std::vector<Seq> spec = {{4, 100}, {2, 2}, {3, 3000}, {1, 65}, {4, 4}};
  std::vector<VCase> v = {
      {"mixed_gqa", mixed, 32, 8, 128, 16},
      {"mixed_mqa_window_softcap", mixed, 8, 1, 64, 64, 20, 30.0f},
      {"mixed_mha_bs64", mixed, 4, 4, 128, 64},
      {"awkward_prefills", awkward, 6, 2, 64, 16},
      {"awkward_prefills_window", awkward, 4, 1, 128, 64, 40},
      {"long_prefill_mqa", {{2049, 2049}}, 4, 1, 128, 16},
      {"long_prefill_window_softcap", {{2049, 2049}}, 2, 2, 64, 64, 100, 5.0f},
      {"chunks_end_of_cache", chunks, 8, 2, 128, 16},
      {"chunks_window", chunks, 8, 2, 64, 16, 70},
      {"decode_1", {{1, 2049}}, 32, 8, 128, 16},
      {"decode_7", seven, 32, 8, 128, 16},
      {"decode_7_mqa_bs64", seven, 8, 1, 64, 64},
      {"decode_64", decode_batch(64, rng, 600), 32, 8, 128, 16},
      {"decode_64_window_softcap", decode_batch(64, rng, 600), 16, 4, 64, 64, 33, 10.0f},
      {"spec_decode", spec, 32, 8, 128, 16},
      {"spec_decode_mqa", spec, 32, 1, 64, 16, 0, 0.0f},
      {"generic_d16", mixed, 6, 2, 16, 16},
      {"generic_d24_window_softcap", mixed, 6, 2, 24, 16, 9, 3.0f},
      {"generic_d24_decode", seven, 4, 1, 24, 64},
      {"generic_unaligned_q", mixed, 4, 2, 64, 16, 0, 0.0f, 4},
  };
  return v;
}

void PrintTo(const VCase& c, std::ostream* os) {
  *os << c.name;
}

class VarlenAttentionCudaTest : public testutil::CudaTest,
                                public ::testing::WithParamInterface<VCase> {};

TEST_P(VarlenAttentionCudaTest, MatchesCpuTwin) {
  const VCase& c = GetParam();
  const cudaStream_t st = ctx().stream;
  std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 7919 + c.n_heads * 31 + c.seqs.size()));
  Batch b = make_batch(c, rng);
  const int64_t row = c.n_heads * c.head_dim;
  std::vector<uint16_t> ref(static_cast<size_t>(b.n_tokens * b.out_stride), kPoison);
  const VarlenAttentionParams hp = host_params(c, b, ref.data());
  const Status cst = cpu::varlen_attention(hp);
  ASSERT_TRUE(cst.ok()) << cst.to_string();
  for (int64_t t = 0; t < b.n_tokens; ++t) {
    for (int64_t i = 0; i < row; ++i) {
      ASSERT_FALSE(
          std::isnan(::strata::bf16_to_f32(ref[static_cast<size_t>(t * b.out_stride + i)])));
    }
  }

  const size_t ws = varlen_attention_workspace_bytes(hp.n_seqs, c.n_heads, c.head_dim, b.max_kv);
  DeviceBatch d(b, ws, st);
  for (const Runner& r : kRunners) {
    SCOPED_TRACE(r.name + " on " + seqs_name(c.seqs));
    LaunchCtx lc = ctx();
    if (r.sm_count > 0) lc.sm_count = r.sm_count;
    d.out.poison(st);
    const Status s = r.run(lc, d.params(hp, r.with_workspace));
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_TRUE(matches(d.out.download(st), ref, b.n_tokens, c.n_heads, c.head_dim, b.out_stride));
  }
}

INSTANTIATE_TEST_SUITE_P(Batches, VarlenAttentionCudaTest, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name; });

// A block id outside the pool (device data the launcher cannot check) gives NaN rows for that
// sequence's queries, and the other sequences' rows are still right.
class VarlenAttentionCudaBadBlock : public testutil::CudaTest {};

TEST_F(VarlenAttentionCudaBadBlock, NanRowsForThatSequenceOnly) {
  const cudaStream_t st = ctx().stream;
  for (const VCase& c : {VCase{"prefill", {{37, 37}, {70, 200}, {1, 90}}, 8, 2, 128, 16},
                         VCase{"decode", {{1, 37}, {1, 200}, {1, 90}}, 8, 2, 64, 16},
                         VCase{"generic", {{37, 37}, {3, 200}, {1, 90}}, 4, 2, 24, 16}}) {
    std::mt19937 rng(77);
    Batch b = make_batch(c, rng);
    std::vector<uint16_t> ref(static_cast<size_t>(b.n_tokens * b.out_stride), kPoison);
    const VarlenAttentionParams hp = host_params(c, b, ref.data());
    ASSERT_TRUE(cpu::varlen_attention(hp).ok());
    // Sequence 1's block 5 (positions 80..95, read by every query of it) leaves the pool.
    b.tables[static_cast<size_t>(b.max_blocks + 5)] = static_cast<int32_t>(b.n_blocks);
    for (int64_t t = b.cu_q[1]; t < b.cu_q[2]; ++t) {
      for (int64_t i = 0; i < c.n_heads * c.head_dim; ++i) {
        ref[static_cast<size_t>(t * b.out_stride + i)] = kBf16NaN;
      }
    }
    const size_t ws = varlen_attention_workspace_bytes(3, c.n_heads, c.head_dim, b.max_kv);
    DeviceBatch d(b, ws, st);
    for (const Runner& r : kRunners) {
      SCOPED_TRACE(c.name + " " + r.name);
      d.out.poison(st);
      ASSERT_TRUE(r.run(ctx(), d.params(hp, r.with_workspace)).ok());
      EXPECT_TRUE(
          matches(d.out.download(st), ref, b.n_tokens, c.n_heads, c.head_dim, b.out_stride));
    }
  }
}

// Launch geometry depends only on host bounds: a decode step captured once in a CUDA graph
// replays with other kv_len values (written to the same device array) and stays right.
class VarlenAttentionCudaGraph : public testutil::CudaTest {};

TEST_F(VarlenAttentionCudaGraph, ReplaysWithNewLengths) {
  const cudaStream_t st = ctx().stream;
  const int64_t max_kv = 1000;
  VCase c{"graph", {}, 32, 8, 128, 16};
  std::mt19937 rng(5);
  for (int i = 0; i < 9; ++i) c.seqs.push_back({1, max_kv});
  Batch b = make_batch(c, rng);  // every position of every sequence holds data
  const size_t ws = varlen_attention_workspace_bytes(9, c.n_heads, c.head_dim, max_kv);
  ASSERT_GT(ws, 0u);
  DeviceBatch d(b, ws, st);
  std::vector<uint16_t> ref(static_cast<size_t>(b.n_tokens * b.out_stride), kPoison);
  VarlenAttentionParams hp = host_params(c, b, ref.data());
  const VarlenAttentionParams dp = d.params(hp, true);

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status cap = varlen_attention(ctx(), dp);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_TRUE(cap.ok()) << cap.to_string();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  std::uniform_int_distribution<int32_t> len(1, static_cast<int32_t>(max_kv));
  for (int replay = 0; replay < 4; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    for (int32_t& kv : b.kv_len) kv = replay == 0 ? static_cast<int32_t>(max_kv) : len(rng);
    d.kv_len.upload(b.kv_len, st);
    d.out.poison(st);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    std::fill(ref.begin(), ref.end(), kPoison);
    ASSERT_TRUE(cpu::varlen_attention(hp).ok());
    EXPECT_TRUE(matches(d.out.download(st), ref, b.n_tokens, c.n_heads, c.head_dim, b.out_stride));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

TEST(VarlenAttentionCudaArgs, RejectsBadArguments) {
  static uint16_t fake[64];
  static int32_t ids[4];
  const VarlenAttentionParams good{.q = fake,
                                   .q_stride = 32,
                                   .out = fake,
                                   .out_stride = 32,
                                   .cu_q = ids,
                                   .kv_len = ids,
                                   .n_seqs = 1,
                                   .n_heads = 4,
                                   .max_q_len = 1,
                                   .max_kv_len = 1,
                                   .cache = {.k_cache = fake,
                                             .v_cache = fake,
                                             .block_tables = ids,
                                             .max_blocks_per_seq = 1,
                                             .n_seqs = 1,
                                             .n_blocks = 1,
                                             .block_size = 16,
                                             .n_heads_kv = 2,
                                             .head_dim = 8},
                                   .scale = 0.5f};
  using Fn = Status (*)(const LaunchCtx&, const VarlenAttentionParams&);
  for (Fn fn : {Fn{varlen_attention}, Fn{flash_prefill}, Fn{flash_decode}}) {
    auto code = [&](auto&& edit) {
      VarlenAttentionParams p = good;
      edit(p);
      return fn(LaunchCtx{}, p).code();
    };
    constexpr StatusCode kBad = StatusCode::kInvalidArgument;
    EXPECT_EQ(code([](auto& p) { p.n_heads = 3; }), kBad);  // 3 heads on 2 KV heads
    EXPECT_EQ(code([](auto& p) { p.cache.n_heads_kv = 0; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.n_seqs = 2; }), kBad);  // != cache.n_seqs
    EXPECT_EQ(code([](auto& p) { p.q_stride = 31; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.out_stride = 8; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.scale = 0.0f; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.scale = -1.0f; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.sliding_window = -1; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.logit_softcap = -2.0f; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.max_q_len = -1; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.cu_q = nullptr; }), kBad);
    EXPECT_EQ(code([](auto& p) { p.cache.block_tables = nullptr; }), kBad);
    EXPECT_EQ(code([](auto& p) {
                p.cache.head_dim = 512;
                p.q_stride = p.out_stride = 2048;
              }),
              StatusCode::kUnimplemented);
    // Nothing to do: no sequences, or no queries.
    EXPECT_TRUE(code([](auto& p) { p.n_seqs = p.cache.n_seqs = 0; }) == StatusCode::kOk);
    EXPECT_TRUE(code([](auto& p) { p.max_q_len = 0; }) == StatusCode::kOk);
  }
}

TEST(VarlenAttentionCudaArgs, WorkspaceBytes) {
  // Short caches are never split. Otherwise the size covers every batch up to n_seqs (so it
  // never shrinks as n_seqs grows: callers pass their largest batch, even max_num_tokens) and
  // stays bounded (splits * n_seqs <= 512): 32 heads of 128 need less than 40 MiB.
  EXPECT_EQ(varlen_attention_workspace_bytes(1, 32, 128, 32), 0u);
  EXPECT_EQ(varlen_attention_workspace_bytes(0, 32, 128, 4096), 0u);
  const size_t one = varlen_attention_workspace_bytes(1, 32, 128, 4096);
  EXPECT_GT(one, 0u);
  EXPECT_GE(varlen_attention_workspace_bytes(1, 32, 128, 1 << 20), one);
  size_t prev = 0;
  for (int64_t n : {1, 2, 7, 64, 256, 257, 511, 512, 513, 2048, 65535}) {
    const size_t b = varlen_attention_workspace_bytes(n, 32, 128, 1 << 20);
    EXPECT_GE(b, prev) << n;
    EXPECT_LT(b, size_t{40} << 20) << n;
    prev = b;
  }
}

}  // namespace
}  // namespace strata::cuda
