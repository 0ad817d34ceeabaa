// Data-parallel replicas with partitioned weight fetch (ZeRO-Inference Sec. VI, issue 13 item 4)
// on the CPU: N replicas as threads (make_in_process_dp_executor), each streaming the device
// layout's bf16 twins through its slots, where every replica copies only its 1/N part of each
// layer from the one shared host copy and the in-process all-gather completes the slot. A batch
// of sequences split among the replicas must give the logits and greedy ids of one replica with
// every layer resident (bf16 tolerance: the replicas run smaller batches), and bit-identical
// ones to the same replicas without streaming (the same splits: a part landing at the wrong
// offset, a gather pairing the wrong layers, or a slot overwritten early would show). The
// counters say each replica copied its part only. Replicas without a sequence in a step (DP=3
// over two sequences) still take part in every layer's all-gather.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/mapped_file.h"
#include "fixture_util.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/model.h"
#include "model/residency.h"
#include "parallel/comm.h"
#include "partitioned_fetch_util.h"
#include "runtime/executor.h"
#include "runtime/weight_streamer.h"

namespace strata {
namespace {

using namespace testing::pfetch;  // NOLINT: the shared helpers
constexpr int64_t kSeqs = 4;

Result<ModelConfig> fixture_config(const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(std::string text, read_text_file(dir + "/config.json"));
  return parse_hf_config(text, dir + "/config.json");
}

RunnerOptions options(const ResidencyOptions& res) {
  RunnerOptions o;
  o.act_dtype = DType::kBF16;  // the device layout's CPU twins (what streaming moves)
  o.max_model_len = kMaxLen;
  o.num_kv_blocks = kSeqs * kMaxLen / kBlock;
  o.block_size = kBlock;
  o.max_num_tokens = 128;
  o.max_num_seqs = 8;
  o.residency = res;
  return o;
}

struct Exec {
  std::unique_ptr<Communicator> comm;  // a single runner's group
  std::unique_ptr<Executor> exec;
};

// dp == 0: one plain runner; else dp replicas.
Result<Exec> make(const std::string& dir, int dp, const ResidencyOptions& res,
                  bool partitioned = true) {
  STRATA_ASSIGN_OR_RETURN(ModelConfig config, fixture_config(dir));
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<Checkpoint> ckpt, Checkpoint::open(dir));
  Exec e;
  if (dp == 0) {
    STRATA_ASSIGN_OR_RETURN(auto model, Model::load(config, ParallelConfig{}, ckpt));
    e.comm = make_single_rank_communicator();
    STRATA_ASSIGN_OR_RETURN(
        e.exec, make_runner(config, ParallelConfig{}, std::move(model), *e.comm, options(res)));
    return e;
  }
  auto load = [&](const ParallelConfig& par) { return Model::load(config, par, ckpt); };
  STRATA_ASSIGN_OR_RETURN(e.exec,
                          make_in_process_dp_executor(config, load, dp, options(res), partitioned));
  return e;
}

class PartitionedFetch : public ::testing::TestWithParam<const char*> {};

TEST_P(PartitionedFetch, ReplicasEqualOneResidentRunner) {
  const std::string dir = testing::fixture_model(GetParam());
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " not present";
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  auto one = make(dir, 0, ResidencyOptions{});
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  constexpr int kSteps = 4;
  for (int dp : {2, 3}) {
    for (int n_seqs : {2, 3}) {
      const auto prompts = prompts_of(*ref, n_seqs);
      auto want = run(*one->exec, prompts, kSteps);
      ASSERT_TRUE(want.ok()) << want.status().to_string();
      // The same replicas with every layer resident: the same splits, so bit-identical.
      auto plain = make(dir, dp, ResidencyOptions{});
      ASSERT_TRUE(plain.ok()) << plain.status().to_string();
      auto same_split = run(*plain->exec, prompts, kSteps);
      ASSERT_TRUE(same_split.ok()) << same_split.status().to_string();
      // Each layer fetched in 4 pieces, in 1 (whole-layer all-gathers), and in 3 without prefetch.
      for (auto [prefetch, pieces] :
           {std::pair{true, 4}, std::pair{true, 1}, std::pair{false, 3}}) {
        ResidencyOptions o;
        o.offload = WeightOffload::kCpu;
        o.prefetch = prefetch;
        o.fetch_pieces = pieces;
        auto s = make(dir, dp, o);
        ASSERT_TRUE(s.ok()) << s.status().to_string();
        EXPECT_EQ(s->exec->data_parallel_size(), dp);
        auto got = run(*s->exec, prompts, kSteps);
        ASSERT_TRUE(got.ok()) << got.status().to_string();
        const std::string what = std::string(GetParam()) + " dp " + std::to_string(dp) + ", " +
                                 std::to_string(n_seqs) + " sequences, prefetch " +
                                 std::to_string(prefetch) + ", " + std::to_string(pieces) +
                                 " pieces";
        EXPECT_TRUE(bit_equal(got->logits, same_split->logits))
            << what << ": streamed replicas differ from resident replicas (max err "
            << testing::relative_error(got->logits, same_split->logits) << ")";
        EXPECT_EQ(got->ids, same_split->ids) << what;
        EXPECT_LT(testing::relative_error(got->logits, want->logits), 2e-2)
            << what << ": replicas differ from one runner";
        EXPECT_EQ(got->ids, want->ids) << what << ": greedy ids differ from one runner";
        expect_partitioned(s->exec->replica_stream_stats(), dp, what, pieces);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, PartitionedFetch,
                         ::testing::Values("llama", "llama_bf16", "gpt2", "qwen2", "gemma3"));

// Resident layers before streamed ones, three slots, and the fetch off (every replica copies
// whole layers: no all-gather).
TEST(PartitionedFetchMixed, ResidentLayersSlotsAndFetchOff) {
  const std::string dir = testing::fixture_model("llama");
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const auto prompts = prompts_of(*ref, 3);
  auto plain = make(dir, 2, ResidencyOptions{});
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  auto want = run(*plain->exec, prompts, 3);
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  for (bool partitioned : {true, false}) {
    ResidencyOptions o;
    o.offload = WeightOffload::kCpu;
    o.gpu_weight_budget = int64_t{1} << 40;
    o.max_resident_layers = 1;
    o.n_slots = 3;
    o.fetch_pieces = 2;
    auto s = make(dir, 2, o, partitioned);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    ASSERT_EQ(s->exec->residency_plan()->n_resident, 1);
    auto got = run(*s->exec, prompts, 3);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(bit_equal(got->logits, want->logits)) << "partitioned " << partitioned;
    EXPECT_EQ(got->ids, want->ids);
    const auto st = s->exec->replica_stream_stats();
    ASSERT_EQ(st.size(), 2u);
    if (partitioned) {
      expect_partitioned(st, 2, "llama, 1 resident, 3 slots, 2 pieces", 2);
    } else {
      for (const StreamStats& r : st) {
        EXPECT_EQ(r.fetch_parts, 1);
        EXPECT_EQ(r.gathered_bytes, 0);
        EXPECT_EQ(r.bytes, st[0].bytes);
      }
    }
  }
}

// Disk tier: every replica reads the layers from the checkpoint and copies its part.
TEST(PartitionedFetchDisk, ReplicasEqualResidentReplicas) {
  for (const char* name : {"llama", "llama_bf16"}) {
    const std::string dir = testing::fixture_model(name);
    auto ref = testing::load_reference(dir);
    ASSERT_TRUE(ref.ok()) << ref.status().to_string();
    const auto prompts = prompts_of(*ref, 3);
    auto plain = make(dir, 2, ResidencyOptions{});
    ASSERT_TRUE(plain.ok()) << plain.status().to_string();
    auto want = run(*plain->exec, prompts, 2);
    ASSERT_TRUE(want.ok()) << want.status().to_string();
    ResidencyOptions o;
    o.offload = WeightOffload::kDisk;
    o.fetch_pieces = 4;
    auto s = make(dir, 2, o);
    ASSERT_TRUE(s.ok()) << name << ": " << s.status().to_string();
    auto got = run(*s->exec, prompts, 2);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(bit_equal(got->logits, want->logits))
        << name << " (max err " << testing::relative_error(got->logits, want->logits) << ")";
    EXPECT_EQ(got->ids, want->ids);
    expect_partitioned(s->exec->replica_stream_stats(), 2, std::string(name) + " disk", 4);
  }
}

// Preemption by swapping: a sequence's blocks copied to host slots and back under other block
// ids. It must stay on the replica that holds its KV (its first block's replica travels with
// the host slot); given another replica, its decode steps would attend to nothing.
TEST(PartitionedFetchSwap, SwappedSequenceKeepsItsReplica) {
  const std::string dir = testing::fixture_model("llama");
  auto ref = testing::load_reference(dir);
  ASSERT_TRUE(ref.ok()) << ref.status().to_string();
  const auto prompts = prompts_of(*ref, 3);
  auto swap_first = [&](Executor& e) {
    return [&e, &prompts](std::vector<int32_t>& tables) -> Status {
      // Sequence 0's blocks to the host and back at blocks 24.. (sequence 3's, unused).
      const int64_t per = kMaxLen / kBlock;
      const int64_t used = (static_cast<int64_t>(prompts[0].size()) + kBlock - 1) / kBlock;
      std::vector<std::vector<uint8_t>> host(static_cast<size_t>(used),
                                             std::vector<uint8_t>(e.block_bytes()));
      for (int64_t j = 0; j < used; ++j) {
        STRATA_RETURN_IF_ERROR(e.copy_block_to_host(tables[static_cast<size_t>(j)],
                                                    host[static_cast<size_t>(j)].data()));
      }
      for (int64_t j = 0; j < used; ++j) {
        tables[static_cast<size_t>(j)] = static_cast<int32_t>(3 * per + j);
        STRATA_RETURN_IF_ERROR(e.copy_block_from_host(tables[static_cast<size_t>(j)],
                                                      host[static_cast<size_t>(j)].data()));
      }
      return ok_status();
    };
  };
  auto one = make(dir, 0, ResidencyOptions{});
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  auto want = run(*one->exec, prompts, 4, swap_first(*one->exec));
  ASSERT_TRUE(want.ok()) << want.status().to_string();
  ResidencyOptions o;
  o.offload = WeightOffload::kCpu;
  auto s = make(dir, 2, o);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  auto got = run(*s->exec, prompts, 4, swap_first(*s->exec));
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_LT(testing::relative_error(got->logits, want->logits), 2e-2);
  EXPECT_EQ(got->ids, want->ids);
}

// The parts: 256-byte aligned, covering the blob once, the last one shorter (or empty).
TEST(PartitionedFetchParts, UnevenSizes) {
  for (size_t bytes :
       {size_t{1}, size_t{255}, size_t{256}, size_t{1000}, size_t{4096}, size_t{100003}}) {
    for (int n : {1, 2, 3, 4, 7}) {
      const size_t part = part_bytes(bytes, n);
      EXPECT_EQ(part % 256, 0u);
      EXPECT_GE(part * static_cast<size_t>(n), bytes) << bytes << " over " << n;
      EXPECT_LT(part * static_cast<size_t>(n - 1), bytes + 256 * static_cast<size_t>(n))
          << bytes << " over " << n;
      // The slots are padded to a multiple of n x 256 bytes: every part fits.
      const size_t q = static_cast<size_t>(n) * 256, slot = (bytes + q - 1) / q * q;
      EXPECT_LE(part * static_cast<size_t>(n), slot) << bytes << " over " << n;
    }
  }
}

// A layer fetched in pieces (fetch_pieces): for every size, rank count and piece count, the
// pieces tile the slot from 0 to the blob rounded up to n x 256 bytes (where the slots end) in
// 256-byte aligned all-gathers, the ranks' copies cover every blob byte exactly once, each rank
// copies about 1/n, the piece count is min(asked, what the size allows), every piece but the
// last has the same part and the last is no larger; one piece is the whole-layer fetch.
TEST(PartitionedFetchParts, PiecesTileTheSlot) {
  std::vector<size_t> sizes;
  for (size_t b = 0; b <= 4096; ++b) sizes.push_back(b);
  for (size_t b : {size_t{100003}, size_t{1} << 20, (size_t{1} << 20) + 1, size_t{123456789},
                   size_t{1'384'120'320}, size_t{1'384'120'321}}) {
    sizes.push_back(b);
  }
  int checked = 0;
  for (size_t bytes : sizes) {
    for (int n : {1, 2, 3, 4, 5, 8}) {
      const size_t k = static_cast<size_t>(n), q = k * 256;
      const size_t slot = (bytes + q - 1) / q * q;  // ResidencyOptions::fetch_parts padding
      for (int p : {1, 2, 3, 4, 7, 16}) {
        const std::string what = std::to_string(bytes) + " bytes, " + std::to_string(n) +
                                 " ranks, " + std::to_string(p) + " pieces";
        const std::vector<FetchPiece> pieces = fetch_pieces(bytes, n, p);
        ASSERT_FALSE(pieces.empty()) << what;
        ASSERT_LE(pieces.size(), static_cast<size_t>(p)) << what;
        if (p == 1) {
          ASSERT_EQ(pieces.size(), 1u) << what;
          EXPECT_EQ(pieces[0].offset, 0u) << what;
          EXPECT_EQ(pieces[0].part, part_bytes(bytes, n)) << what;
        }
        // As many pieces as asked unless fewer full-size ones already hold the blob.
        const size_t full = part_bytes(bytes, n * p) * k;
        if (bytes > 0) {
          EXPECT_EQ(pieces.size(),
                    std::min<size_t>(static_cast<size_t>(p), (bytes + full - 1) / full))
              << what;
        }
        size_t end = 0;
        std::vector<size_t> per_rank(k, 0);
        size_t covered = 0;  // the ranks' ranges, in order, must tile [0, bytes)
        for (size_t j = 0; j < pieces.size(); ++j) {
          const FetchPiece& f = pieces[j];
          EXPECT_EQ(f.offset, end) << what << ", piece " << j << ": not contiguous";
          EXPECT_EQ(f.offset % q, 0u) << what << ", piece " << j;
          EXPECT_EQ(f.part % 256, 0u) << what << ", piece " << j;
          if (bytes > 0) EXPECT_GT(f.part, 0u) << what << ", piece " << j;
          if (j + 1 < pieces.size()) {
            EXPECT_EQ(f.part, pieces[0].part) << what << ", piece " << j;
            EXPECT_LT(f.offset + k * f.part, bytes) << what << ", piece " << j << " is not needed";
          } else {
            EXPECT_LE(f.part, pieces[0].part) << what << ": the last piece is larger";
          }
          for (int r = 0; r < n; ++r) {
            const ByteRange b = fetch_piece_range(f, bytes, r);
            ASSERT_LE(b.begin, b.end) << what;
            ASSERT_LE(b.end, bytes) << what;
            if (b.end > b.begin) {
              // Inside rank r's part of the piece: the all-gather's in-place send buffer.
              EXPECT_GE(b.begin, f.offset + static_cast<size_t>(r) * f.part) << what;
              EXPECT_LE(b.end, f.offset + static_cast<size_t>(r + 1) * f.part) << what;
              EXPECT_EQ(b.begin, covered) << what << ", piece " << j << ", rank " << r;
              covered = b.end;
            }
            per_rank[static_cast<size_t>(r)] += b.end - b.begin;
          }
          end = f.offset + k * f.part;
        }
        EXPECT_EQ(covered, bytes) << what << ": the ranks' copies do not cover the blob";
        EXPECT_EQ(end, slot) << what << ": the pieces do not end where the slot does";
        for (size_t r = 0; r < k; ++r) {
          // About 1/n each: the pieces' parts add up to at most bytes / n + 256.
          EXPECT_LE(per_rank[r], bytes / k + 256) << what << ", rank " << r;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

TEST(PartitionedFetchParts, ResolvePieces) {
  EXPECT_EQ(resolve_fetch_pieces(3), 3);
  EXPECT_EQ(resolve_fetch_pieces(1), 1);
  if (std::getenv("STRATA_FETCH_PIECES") == nullptr) {
    EXPECT_EQ(resolve_fetch_pieces(0), kDefaultFetchPieces);
  }
}

}  // namespace
}  // namespace strata
