// The CPU twins of the fused bf16 GPU kernels (src/backends/cpu/fused_bf16.cpp) against a
// composition of the f32 reference kernels followed by one bf16 rounding:
//   norm_bf16  = cpu::add (x += residual) + cpu::rms_norm, rounded
//   gated_act_bf16 = cpu::gated_act on the two halves of the fused gate/up row, rounded
//   rope_kv_append = cpu::rope on the q and k heads of the fused qkv row + cpu::kv_append into an
//                    f32 cache, both rounded
// The twins promise the same f32 operations in the same order, so results must be bit-equal
// (bf16 bit patterns compared, NaN poison included). Also: tokens with an invalid slot leave
// the cache untouched but still write q, and bad rotary_dim / activation are rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/half.h"
#include "op_test_util.h"

namespace strata {
namespace {

using testing::make_typed;
using testing::random_floats;

// Poison for outputs: an all-ones NaN, which f32_to_bf16 maps to the all-ones bf16 NaN, so a
// rounded f32 reference and a bf16 output agree on the elements neither side writes.
constexpr uint16_t kPoison = 0xffff;
const float kPoisonF32 = std::bit_cast<float>(uint32_t{0xffffffff});

std::vector<uint16_t> round_all(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// Index of the first difference, or -1.
int64_t first_diff(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  }
  return -1;
}

// ---- norm_bf16 ---------------------------------------------------------------------------

struct NormCase {
  int64_t n;
  int64_t hidden;
  DType w_dtype;
  bool residual;
  int64_t pad = 0;  // extra elements per row of x, residual and out
  float offset = 0.0f;
};

class RmsNormBf16TwinTest : public ::testing::TestWithParam<NormCase> {};

TEST_P(RmsNormBf16TwinTest, MatchesAddThenRmsNormRounded) {
  const NormCase& c = GetParam();
  const int64_t stride = c.hidden + c.pad;
  const size_t rows = static_cast<size_t>(c.n * stride);
  const uint32_t seed = static_cast<uint32_t>(c.n * 31 + c.hidden * 7 + c.residual);
  const std::vector<float> x0 = random_floats(rows, seed, -2.0f, 2.0f);
  const std::vector<float> res = random_floats(rows, seed + 1, -2.0f, 2.0f);
  testing::TypedBuffer w =
      make_typed(random_floats(static_cast<size_t>(c.hidden), seed + 2, -1.5f, 1.5f), c.w_dtype);

  // Reference: x += residual (cpu::add), then cpu::rms_norm into f32, then round.
  std::vector<float> ref_x = x0;
  if (c.residual) {
    ASSERT_TRUE(cpu::add({.a = ref_x.data(),
                          .a_stride = stride,
                          .b = res.data(),
                          .b_stride = stride,
                          .out = ref_x.data(),
                          .out_stride = stride,
                          .rows = c.n,
                          .cols = c.hidden})
                    .ok());
  }
  std::vector<float> ref_out(rows, kPoisonF32);
  ASSERT_TRUE(cpu::rms_norm({.x = ref_x.data(),
                             .weight = w.data(),
                             .weight_dtype = c.w_dtype,
                             .out = ref_out.data(),
                             .n_tokens = c.n,
                             .hidden = c.hidden,
                             .x_stride = stride,
                             .out_stride = stride,
                             .eps = 1e-6f,
                             .weight_offset = c.offset})
                  .ok());

  std::vector<float> x = x0;
  std::vector<uint16_t> out(rows, kPoison);
  ASSERT_TRUE(cpu::norm_bf16({.x = x.data(),
                                  .x_stride = stride,
                                  .residual = c.residual ? res.data() : nullptr,
                                  .residual_stride = stride,
                                  .weight = w.data(),
                                  .weight_dtype = c.w_dtype,
                                  .out = out.data(),
                                  .out_stride = stride,
                                  .n_tokens = c.n,
                                  .hidden = c.hidden,
                                  .eps = 1e-6f,
                                  .weight_offset = c.offset})
                  .ok());
  EXPECT_EQ(x, ref_x);  // the residual stream: exact f32, padding untouched
  const int64_t bad = first_diff(out, round_all(ref_out));
  EXPECT_EQ(bad, -1) << "out differs at " << bad;
}

const NormCase kNormCases[] = {
    {1, 1, DType::kF32, false},
    {3, 7, DType::kBF16, true, 1},
    {17, 576, DType::kF16, true},
    {3, 4096, DType::kBF16, true, 0, 1.0f},
    {17, 5125, DType::kF32, false, 3},
    {200, 576, DType::kBF16, true, 4},
    {1, 4096, DType::kF32, true, 0, 1.0f},
};

INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormBf16TwinTest, ::testing::ValuesIn(kNormCases),
                         [](const ::testing::TestParamInfo<NormCase>& info) {
                           const NormCase& c = info.param;
                           return "n" + std::to_string(c.n) + "_h" + std::to_string(c.hidden) +
                                  "_" + std::string(dtype_name(c.w_dtype)) +
                                  (c.residual ? "_res" : "") + (c.pad ? "_pad" : "") +
                                  (c.offset != 0.0f ? "_offset" : "");
                         });

// ---- gated_act_bf16 --------------------------------------------------------------------------

TEST(GatedActBf16Twin, MatchesGatedActRounded) {
  for (Activation act :
       {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluErf, Activation::kRelu}) {
    for (int64_t ffn : {1, 7, 576, 5125}) {
      for (int64_t n : {1, 3, 17}) {
        SCOPED_TRACE("act " + std::to_string(static_cast<int>(act)) + " ffn " +
                     std::to_string(ffn) + " n " + std::to_string(n));
        const int64_t in_stride = 2 * ffn + 3;
        const int64_t out_stride = ffn + 1;
        const std::vector<float> in = random_floats(
            static_cast<size_t>(n * in_stride), static_cast<uint32_t>(ffn * 5 + n), -4.0f, 4.0f);
        std::vector<float> ref(static_cast<size_t>(n * out_stride), kPoisonF32);
        ASSERT_TRUE(cpu::gated_act({.gate = in.data(),
                                    .gate_stride = in_stride,
                                    .up = in.data() + ffn,
                                    .up_stride = in_stride,
                                    .out = ref.data(),
                                    .out_stride = out_stride,
                                    .n_tokens = n,
                                    .ffn_dim = ffn,
                                    .act = act})
                        .ok());
        std::vector<uint16_t> out(ref.size(), kPoison);
        ASSERT_TRUE(cpu::gated_act_bf16({.in = in.data(),
                                         .in_stride = in_stride,
                                         .out = out.data(),
                                         .out_stride = out_stride,
                                         .n_tokens = n,
                                         .ffn_dim = ffn,
                                         .act = act})
                        .ok());
        const int64_t bad = first_diff(out, round_all(ref));
        EXPECT_EQ(bad, -1) << "out differs at " << bad;
      }
    }
  }
}

// bf16 input gives what the f32 input of the same (bf16-exact) values gives.
TEST(GatedActBf16Twin, Bf16InputEqualsWidenedF32Input) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  const int64_t n = 5, ffn = 37, stride = 2 * ffn + 3;
  std::vector<uint16_t> in(static_cast<size_t>(n * stride));
  std::vector<float> wide(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = f32_to_bf16(dist(rng));
    wide[i] = bf16_to_f32(in[i]);
  }
  std::vector<uint16_t> a(static_cast<size_t>(n * ffn)), b(a.size());
  ASSERT_TRUE(cpu::gated_act_bf16({.in = wide.data(),
                                   .in_stride = stride,
                                   .out = a.data(),
                                   .out_stride = ffn,
                                   .n_tokens = n,
                                   .ffn_dim = ffn,
                                   .act = Activation::kSilu})
                  .ok());
  ASSERT_TRUE(cpu::gated_act_bf16({.in = nullptr,
                                   .in_stride = stride,
                                   .in_bf16 = in.data(),
                                   .out = b.data(),
                                   .out_stride = ffn,
                                   .n_tokens = n,
                                   .ffn_dim = ffn,
                                   .act = Activation::kSilu})
                  .ok());
  EXPECT_EQ(a, b);
}

TEST(GatedActBf16Twin, RejectsUnknownActivation) {
  float in[2] = {1.0f, 2.0f};
  uint16_t out[1];
  const Status st = cpu::gated_act_bf16({.in = in,
                                         .in_stride = 2,
                                         .out = out,
                                         .out_stride = 1,
                                         .n_tokens = 1,
                                         .ffn_dim = 1,
                                         .act = static_cast<Activation>(99)});
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("gated_act_bf16"), std::string::npos) << st.message();
}

// ---- rope_kv_append --------------------------------------------------------------------------

struct RopeCase {
  int64_t n_tokens;
  int64_t n_heads;
  int64_t n_heads_kv;
  int64_t head_dim;
  int64_t rotary_dim;
  bool neox;
  float attention_factor = 1.0f;
};

// A paged cache of n_seqs sequences whose tokens sit at positions up to ~1e5: token t belongs
// to sequence t % n_seqs at position base[seq] + t / n_seqs; each (sequence, logical block)
// that a token touches gets its own physical block from a shuffled pool with spare blocks
// (which must stay untouched), and every other block table entry is -1.
struct PagedLayout {
  int64_t n_seqs = 3;
  int64_t block_size = 16;
  int64_t max_blocks_per_seq = 0;
  int64_t n_blocks = 0;
  std::vector<int32_t> token_seq;
  std::vector<int32_t> token_pos;
  std::vector<int32_t> block_tables;
};

PagedLayout make_layout(int64_t n_tokens, uint32_t seed) {
  PagedLayout l;
  std::mt19937 rng(seed);
  const int64_t max_pos = 100000;
  l.max_blocks_per_seq = max_pos / l.block_size + 1;
  std::vector<int64_t> base(static_cast<size_t>(l.n_seqs));
  for (int64_t& b : base) {
    b = std::uniform_int_distribution<int64_t>(0, max_pos - n_tokens)(rng);
  }
  base[0] = 0;                                    // position 0 is in every test
  std::vector<std::pair<int64_t, int64_t>> used;  // (seq, logical block)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t seq = t % l.n_seqs;
    const int64_t pos = base[static_cast<size_t>(seq)] + t / l.n_seqs;
    l.token_seq.push_back(static_cast<int32_t>(seq));
    l.token_pos.push_back(static_cast<int32_t>(pos));
    used.emplace_back(seq, pos / l.block_size);
  }
  std::sort(used.begin(), used.end());
  used.erase(std::unique(used.begin(), used.end()), used.end());
  l.n_blocks = static_cast<int64_t>(used.size()) + 3;
  std::vector<int32_t> ids(static_cast<size_t>(l.n_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  l.block_tables.assign(static_cast<size_t>(l.n_seqs * l.max_blocks_per_seq), -1);
  for (size_t i = 0; i < used.size(); ++i) {
    l.block_tables[static_cast<size_t>(used[i].first * l.max_blocks_per_seq + used[i].second)] =
        ids[i];
  }
  return l;
}

std::vector<float> inv_freq_for(int64_t rotary_dim) {
  std::vector<float> f(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < f.size(); ++i) {
    f[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / rotary_dim));
  }
  return f;
}

class RopeKvAppendTwinTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeKvAppendTwinTest, MatchesRopeThenKvAppendRounded) {
  const RopeCase& c = GetParam();
  const int64_t d = c.head_dim;
  const int64_t hkv = c.n_heads_kv;
  const int64_t qkv_stride = (c.n_heads + 2 * hkv) * d + 5;  // padded rows
  const int64_t q_out_stride = c.n_heads * d + 2;
  const PagedLayout l = make_layout(c.n_tokens, static_cast<uint32_t>(c.n_tokens * 3 + d));
  const std::vector<float> qkv = random_floats(static_cast<size_t>(c.n_tokens * qkv_stride),
                                               static_cast<uint32_t>(d * 11 + c.rotary_dim));
  const std::vector<float> inv_freq = inv_freq_for(c.rotary_dim);
  const size_t cache_elems = static_cast<size_t>(l.n_blocks * l.block_size * hkv * d);

  // Reference: f32 rope in place on a copy (q heads, then k heads), f32 kv_append, round.
  std::vector<float> ref_qkv = qkv;
  if (c.rotary_dim > 0) {
    for (int64_t first_head : {int64_t{0}, c.n_heads}) {
      ASSERT_TRUE(cpu::rope({.x = ref_qkv.data() + first_head * d,
                             .token_stride = qkv_stride,
                             .head_stride = d,
                             .n_tokens = c.n_tokens,
                             .n_heads = first_head == 0 ? c.n_heads : hkv,
                             .head_dim = d,
                             .positions = l.token_pos.data(),
                             .inv_freq = inv_freq.data(),
                             .rotary_dim = c.rotary_dim,
                             .neox_style = c.neox,
                             .attention_factor = c.attention_factor})
                      .ok());
    }
  }
  std::vector<float> ref_k(cache_elems, kPoisonF32);
  std::vector<float> ref_v(cache_elems, kPoisonF32);
  const PagedKvParams ref_cache{.k_cache = ref_k.data(),
                                .v_cache = ref_v.data(),
                                .block_tables = l.block_tables.data(),
                                .max_blocks_per_seq = l.max_blocks_per_seq,
                                .n_seqs = l.n_seqs,
                                .n_blocks = l.n_blocks,
                                .block_size = l.block_size,
                                .n_heads_kv = hkv,
                                .head_dim = d};
  ASSERT_TRUE(cpu::kv_append({.k = ref_qkv.data() + c.n_heads * d,
                              .k_stride = qkv_stride,
                              .v = ref_qkv.data() + (c.n_heads + hkv) * d,
                              .v_stride = qkv_stride,
                              .token_seq = l.token_seq.data(),
                              .token_pos = l.token_pos.data(),
                              .n_tokens = c.n_tokens,
                              .cache = ref_cache})
                  .ok());
  std::vector<uint16_t> ref_q(static_cast<size_t>(c.n_tokens * q_out_stride), kPoison);
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    for (int64_t j = 0; j < c.n_heads * d; ++j) {
      ref_q[static_cast<size_t>(t * q_out_stride + j)] =
          f32_to_bf16(ref_qkv[static_cast<size_t>(t * qkv_stride + j)]);
    }
  }

  std::vector<uint16_t> q_out(ref_q.size(), kPoison);
  std::vector<uint16_t> k_cache(cache_elems, kPoison);
  std::vector<uint16_t> v_cache(cache_elems, kPoison);
  ASSERT_TRUE(cpu::rope_kv_append({.qkv = qkv.data(),
                                   .qkv_stride = qkv_stride,
                                   .q_out = q_out.data(),
                                   .q_out_stride = q_out_stride,
                                   .token_seq = l.token_seq.data(),
                                   .token_pos = l.token_pos.data(),
                                   .n_tokens = c.n_tokens,
                                   .n_heads = c.n_heads,
                                   .inv_freq = c.rotary_dim > 0 ? inv_freq.data() : nullptr,
                                   .rotary_dim = c.rotary_dim,
                                   .neox_style = c.neox,
                                   .attention_factor = c.attention_factor,
                                   .cache = {.k_cache = k_cache.data(),
                                             .v_cache = v_cache.data(),
                                             .block_tables = l.block_tables.data(),
                                             .max_blocks_per_seq = l.max_blocks_per_seq,
                                             .n_seqs = l.n_seqs,
                                             .n_blocks = l.n_blocks,
                                             .block_size = l.block_size,
                                             .n_heads_kv = hkv,
                                             .head_dim = d}})
                  .ok());
  int64_t bad = first_diff(q_out, ref_q);
  EXPECT_EQ(bad, -1) << "q_out differs at " << bad;
  bad = first_diff(k_cache, round_all(ref_k));
  EXPECT_EQ(bad, -1) << "k_cache differs at " << bad;
  bad = first_diff(v_cache, round_all(ref_v));
  EXPECT_EQ(bad, -1) << "v_cache differs at " << bad;
}

const RopeCase kRopeCases[] = {
    {1, 2, 1, 12, 12, true},  {3, 4, 2, 12, 6, false},          {17, 4, 2, 16, 16, false, 1.1f},
    {17, 4, 4, 64, 32, true}, {200, 8, 2, 128, 128, true},      {17, 3, 1, 128, 64, false},
    {3, 2, 2, 64, 0, true},   {200, 4, 1, 64, 64, false, 1.1f},
};

INSTANTIATE_TEST_SUITE_P(Shapes, RopeKvAppendTwinTest, ::testing::ValuesIn(kRopeCases),
                         [](const ::testing::TestParamInfo<RopeCase>& info) {
                           const RopeCase& c = info.param;
                           return "t" + std::to_string(c.n_tokens) + "_h" +
                                  std::to_string(c.n_heads) + "_kv" + std::to_string(c.n_heads_kv) +
                                  "_d" + std::to_string(c.head_dim) + "_r" +
                                  std::to_string(c.rotary_dim) + (c.neox ? "_neox" : "_gptj") +
                                  (c.attention_factor != 1.0f ? "_af" : "");
                         });

// Tokens whose sequence, position or block is invalid write q but nothing to the cache.
TEST(RopeKvAppendTwin, InvalidSlotWritesOnlyQ) {
  const int64_t d = 8;
  const int64_t n_tokens = 6;
  const int64_t qkv_stride = 3 * d;  // one q head, one kv head
  const std::vector<float> qkv = random_floats(static_cast<size_t>(n_tokens * qkv_stride), 7);
  const std::vector<float> inv_freq = inv_freq_for(d);
  // Two sequences of 2 blocks of 4 positions; sequence 1's second block is unmapped (-1) and
  // sequence 0's second block id is past the pool.
  const std::vector<int32_t> tables = {0, 5, 1, -1};
  const std::vector<int32_t> seq = {-1, 2, 0, 0, 1, 1};
  const std::vector<int32_t> pos = {0, 0, -3, 5, 4, 8};
  std::vector<uint16_t> q_out(static_cast<size_t>(n_tokens * d), kPoison);
  std::vector<uint16_t> k_cache(static_cast<size_t>(2 * 4 * d), kPoison);
  std::vector<uint16_t> v_cache(k_cache.size(), kPoison);
  ASSERT_TRUE(cpu::rope_kv_append({.qkv = qkv.data(),
                                   .qkv_stride = qkv_stride,
                                   .q_out = q_out.data(),
                                   .q_out_stride = d,
                                   .token_seq = seq.data(),
                                   .token_pos = pos.data(),
                                   .n_tokens = n_tokens,
                                   .n_heads = 1,
                                   .inv_freq = inv_freq.data(),
                                   .rotary_dim = d,
                                   .cache = {.k_cache = k_cache.data(),
                                             .v_cache = v_cache.data(),
                                             .block_tables = tables.data(),
                                             .max_blocks_per_seq = 2,
                                             .n_seqs = 2,
                                             .n_blocks = 2,
                                             .block_size = 4,
                                             .n_heads_kv = 1,
                                             .head_dim = d}})
                  .ok());
  for (uint16_t v : q_out) EXPECT_NE(v, kPoison);
  for (uint16_t v : k_cache) EXPECT_EQ(v, kPoison);
  for (uint16_t v : v_cache) EXPECT_EQ(v, kPoison);
}

TEST(RopeKvAppendTwin, RejectsBadRotaryDim) {
  RopeKvAppendParams p;
  p.cache.head_dim = 8;
  for (int64_t rot : {-2, 3, 10}) {
    p.rotary_dim = rot;
    const Status st = cpu::rope_kv_append(p);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << rot;
    EXPECT_NE(st.message().find("rotary_dim"), std::string::npos) << st.message();
  }
}


// ---- options added for every family on the device layout -------------------------------------

// LayerNorm through norm_bf16 = cpu::add (residual) + cpu::layer_norm, rounded once.
TEST(NormBf16Twin, LayerNormMatchesAddThenLayerNormRounded) {
  for (int64_t hidden : {1, 7, 64, 576, 5125}) {
    for (bool bias : {false, true}) {
      for (bool residual : {false, true}) {
        SCOPED_TRACE("hidden " + std::to_string(hidden) + (bias ? " bias" : "") +
                     (residual ? " residual" : ""));
        uint32_t rng = static_cast<uint32_t>(hidden * 3 + bias * 2 + residual);
        const int64_t n = 5, stride = hidden + 2;
        std::vector<float> x0 = random_floats(static_cast<size_t>(n * stride), rng++, -2, 2);
        for (float& v : x0) v += 20.0f;  // a large mean
        const std::vector<float> res = random_floats(static_cast<size_t>(n * stride), rng++, -1, 1);
        const std::vector<float> w = random_floats(static_cast<size_t>(hidden), rng++, 0.5f, 1.5f);
        const std::vector<float> b = random_floats(static_cast<size_t>(hidden), rng++, -0.5f, 0.5f);
        // Reference: x += residual, layer_norm into f32, rounded.
        std::vector<float> xr = x0;
        if (residual) {
          ASSERT_TRUE(cpu::add({xr.data(), stride, res.data(), stride, xr.data(), stride, n, hidden})
                          .ok());
        }
        std::vector<float> ref(static_cast<size_t>(n * stride), kPoisonF32);
        ASSERT_TRUE(cpu::layer_norm({.x = xr.data(),
                                     .weight = w.data(),
                                     .weight_dtype = DType::kF32,
                                     .bias = bias ? b.data() : nullptr,
                                     .bias_dtype = DType::kF32,
                                     .out = ref.data(),
                                     .n_tokens = n,
                                     .hidden = hidden,
                                     .x_stride = stride,
                                     .out_stride = stride,
                                     .eps = 1e-5f})
                        .ok());
        std::vector<float> x = x0;
        std::vector<uint16_t> out(static_cast<size_t>(n * stride), kPoison);
        ASSERT_TRUE(cpu::norm_bf16({.kind = NormKind::kLayer,
                                    .x = x.data(),
                                    .x_stride = stride,
                                    .residual = residual ? res.data() : nullptr,
                                    .residual_stride = stride,
                                    .weight = w.data(),
                                    .weight_dtype = DType::kF32,
                                    .bias = bias ? b.data() : nullptr,
                                    .bias_dtype = DType::kF32,
                                    .out = out.data(),
                                    .out_stride = stride,
                                    .n_tokens = n,
                                    .hidden = hidden,
                                    .eps = 1e-5f})
                        .ok());
        EXPECT_EQ(first_diff(out, round_all(ref)), -1);
        EXPECT_EQ(x, xr) << "the residual stream written back";
      }
    }
  }
}

// Plain activation (gated = false) = cpu::act, rounded; bf16 input = the widened f32 input.
TEST(GatedActBf16Twin, UngatedMatchesActRounded) {
  for (Activation act : {Activation::kGeluTanh, Activation::kGeluErf, Activation::kRelu,
                         Activation::kSilu}) {
    uint32_t rng = static_cast<uint32_t>(act) + 5;
    const int64_t n = 4, ffn = 37, stride = 41;
    std::vector<float> in = random_floats(static_cast<size_t>(n * stride), rng++, -4, 4);
    for (float& v : in) v = bf16_to_f32(f32_to_bf16(v));  // exactly representable in bf16
    std::vector<float> ref = in;
    ASSERT_TRUE(cpu::act({ref.data(), stride, n, ffn, act}).ok());
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = ffn; i < stride; ++i) ref[static_cast<size_t>(r * stride + i)] = kPoisonF32;
    }
    for (bool bf16_in : {false, true}) {
      std::vector<uint16_t> in16 = round_all(in);
      std::vector<uint16_t> out(static_cast<size_t>(n * stride), kPoison);
      ASSERT_TRUE(cpu::gated_act_bf16({.gated = false,
                                       .in = bf16_in ? nullptr : in.data(),
                                       .in_stride = stride,
                                       .in_bf16 = bf16_in ? in16.data() : nullptr,
                                       .out = out.data(),
                                       .out_stride = stride,
                                       .n_tokens = n,
                                       .ffn_dim = ffn,
                                       .act = act})
                      .ok());
      EXPECT_EQ(first_diff(out, round_all(ref)), -1) << static_cast<int>(act) << " " << bf16_in;
    }
  }
}

// embedding with scale = the row times scale; with accumulate = out + row (other shards' rows
// leave out as it was).
TEST(EmbeddingTwin, ScaleAndAccumulate) {
  uint32_t rng = 3;
  const int64_t vocab = 20, hidden = 9, n = 6;
  const std::vector<float> table = random_floats(static_cast<size_t>(vocab * hidden), rng++, -1, 1);
  const std::vector<int32_t> ids = {0, 5, 19, 7, 12, 5};
  const std::vector<float> out0 = random_floats(static_cast<size_t>(n * hidden), rng++, -1, 1);
  for (bool accumulate : {false, true}) {
    std::vector<float> out = out0;
    const float scale = accumulate ? 1.0f : 3.0f;
    // The second half of the vocabulary only: ids < 10 belong to another shard.
    ASSERT_TRUE(cpu::embedding({.table = table.data() + 10 * hidden,
                                .table_dtype = DType::kF32,
                                .table_stride = hidden,
                                .ids = ids.data(),
                                .out = out.data(),
                                .out_stride = hidden,
                                .n_tokens = n,
                                .hidden = hidden,
                                .vocab_offset = 10,
                                .vocab_shard = 10,
                                .vocab = vocab,
                                .scale = scale,
                                .accumulate = accumulate})
                    .ok());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t i = 0; i < hidden; ++i) {
        const size_t k = static_cast<size_t>(t * hidden + i);
        const bool mine = ids[static_cast<size_t>(t)] >= 10;
        const float row = mine ? table[static_cast<size_t>(ids[static_cast<size_t>(t)] * hidden + i)]
                               : 0.0f;
        const float want = accumulate ? (mine ? out0[k] + scale * row : out0[k]) : row * scale;
        EXPECT_EQ(out[k], want) << "token " << t << " dim " << i << " acc " << accumulate;
      }
    }
  }
}

// rope_kv_append with q/k norms = per-head cpu::rms_norm (with the weight offset) before cpu::rope,
// then the append, all rounded once.
TEST(RopeKvAppendTwin, QkNormsMatchRmsNormThenRope) {
  uint32_t rng = 17;
  const int64_t n = 4, hq = 4, hkv = 2, d = 16, rot = 8, block_size = 4, n_blocks = 4;
  const int64_t row = (hq + 2 * hkv) * d;
  const std::vector<float> qkv = random_floats(static_cast<size_t>(n * row), rng++, -2, 2);
  const std::vector<float> qn = random_floats(static_cast<size_t>(d), rng++, -0.5f, 0.5f);
  const std::vector<float> kn = random_floats(static_cast<size_t>(d), rng++, -0.5f, 0.5f);
  std::vector<float> inv_freq(static_cast<size_t>(rot / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(100.0f, -2.0f * i / rot);
  const std::vector<int32_t> seq = {0, 0, 0, 0}, pos = {0, 1, 2, 3}, tables = {2, 0, 1, 3};
  // Reference: per-head norm (offset 1: Gemma's (1 + w)), rope, kv_append, rounded.
  std::vector<float> ref_qkv = qkv;
  for (int64_t t = 0; t < n; ++t) {
    float* r = ref_qkv.data() + t * row;
    ASSERT_TRUE(cpu::rms_norm({.x = r, .weight = qn.data(), .weight_dtype = DType::kF32,
                               .out = r, .n_tokens = hq, .hidden = d, .x_stride = d,
                               .out_stride = d, .eps = 1e-6f, .weight_offset = 1.0f}).ok());
    ASSERT_TRUE(cpu::rms_norm({.x = r + hq * d, .weight = kn.data(), .weight_dtype = DType::kF32,
                               .out = r + hq * d, .n_tokens = hkv, .hidden = d, .x_stride = d,
                               .out_stride = d, .eps = 1e-6f, .weight_offset = 1.0f}).ok());
  }
  for (int64_t h0 : {int64_t{0}, hq}) {
    ASSERT_TRUE(cpu::rope({.x = ref_qkv.data() + h0 * d, .token_stride = row, .head_stride = d,
                           .n_tokens = n, .n_heads = h0 == 0 ? hq : hkv, .head_dim = d,
                           .positions = pos.data(), .inv_freq = inv_freq.data(),
                           .rotary_dim = rot, .neox_style = true}).ok());
  }
  const size_t cache_n = static_cast<size_t>(n_blocks * block_size * hkv * d);
  std::vector<uint16_t> q(static_cast<size_t>(n * hq * d), kPoison), kc(cache_n, kPoison),
      vc(cache_n, kPoison);
  ASSERT_TRUE(cpu::rope_kv_append({.qkv = qkv.data(),
                                   .qkv_stride = row,
                                   .q_out = q.data(),
                                   .q_out_stride = hq * d,
                                   .token_seq = seq.data(),
                                   .token_pos = pos.data(),
                                   .n_tokens = n,
                                   .n_heads = hq,
                                   .inv_freq = inv_freq.data(),
                                   .rotary_dim = rot,
                                   .neox_style = true,
                                   .q_norm = qn.data(),
                                   .k_norm = kn.data(),
                                   .norm_eps = 1e-6f,
                                   .norm_weight_offset = 1.0f,
                                   .cache = {.k_cache = kc.data(),
                                             .v_cache = vc.data(),
                                             .block_tables = tables.data(),
                                             .max_blocks_per_seq = 4,
                                             .n_seqs = 1,
                                             .n_blocks = n_blocks,
                                             .block_size = block_size,
                                             .n_heads_kv = hkv,
                                             .head_dim = d}})
                  .ok());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < hq * d; ++j) {
      EXPECT_EQ(q[static_cast<size_t>(t * hq * d + j)],
                f32_to_bf16(ref_qkv[static_cast<size_t>(t * row + j)]))
          << "q token " << t << " elem " << j;
    }
    const int64_t slot = tables[static_cast<size_t>(pos[static_cast<size_t>(t)] / block_size)] *
                             block_size + pos[static_cast<size_t>(t)] % block_size;
    for (int64_t j = 0; j < hkv * d; ++j) {
      EXPECT_EQ(kc[static_cast<size_t>(slot * hkv * d + j)],
                f32_to_bf16(ref_qkv[static_cast<size_t>(t * row + hq * d + j)]))
          << "k token " << t << " elem " << j;
      EXPECT_EQ(vc[static_cast<size_t>(slot * hkv * d + j)],
                f32_to_bf16(qkv[static_cast<size_t>(t * row + (hq + hkv) * d + j)]));
    }
  }
}

}  // namespace
}  // namespace strata
