// cpu::quant_attn_decode (one decode token's attention block in one parallel region) against
// the composition it replaces: rms_norm, quant_decode_parts on the Q/K/V parts, the f32
// rope_kv_append steps (q copied out, per-head q / k norms, rope, kv_append), attention, and
// quant_decode_parts on Wo with the residual. Every output must be bit-identical: x, h, the qkv
// row, q, attn and the whole cache.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/phase_clock.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/quant_impl.h"
#include "quant_test_util.h"

namespace strata::cpu {
namespace {

using quant_test::random_quant_rows;
using quant_test::random_rows;

struct BlockCase {
  const char* name;
  DType q, k, v, o;
  bool joined;   // one qkv part instead of three
  bool bias;     // Q/K/V and O biases
  bool qk_norm;  // per-head q / k RMSNorm (Qwen3)
  int64_t rotary_dim;
  bool neox;
  int64_t sliding_window;
  float softcap;
  int64_t pos;  // the token's position: pos cached positions before it
};

// The model shape: hidden 128, 4 query heads and 2 KV heads of 32, blocks of 4 positions, two
// sequences (the token is sequence 1's), a block table that is not the identity.
constexpr int64_t kHidden = 128, kHq = 4, kHkv = 2, kD = 32, kBlock = 4, kBlocks = 12;
constexpr int64_t kMaxBlocksPerSeq = 5;

// The test shape's paged cache over k / v with two sequences' block tables.
PagedKvParams paged_cache(float* k, float* v, const std::vector<int32_t>& tables) {
  PagedKvParams p;
  p.k_cache = k;
  p.v_cache = v;
  p.block_tables = tables.data();
  p.max_blocks_per_seq = kMaxBlocksPerSeq;
  p.n_seqs = 2;
  p.n_blocks = kBlocks;
  p.block_size = kBlock;
  p.n_heads_kv = kHkv;
  p.head_dim = kD;
  return p;
}

struct Fixture {
  std::vector<uint8_t> wq, wk, wv, wj, wo;  // wj: q, k and v rows joined (for `joined`)
  std::vector<float> bqkv, bo, norm_w, qn, kn, inv_freq, x0;
  std::vector<float> k_cache, v_cache;
  std::vector<int32_t> tables;
  int32_t seq = 1, pos = 0;

  explicit Fixture(const BlockCase& c, uint32_t seed) {
    const int64_t kb = kHidden / 32;
    wq = random_quant_rows(c.q, kHq * kD, kb, seed++);
    wk = random_quant_rows(c.k, kHkv * kD, kb, seed++);
    wv = random_quant_rows(c.v, kHkv * kD, kb, seed++);
    wj = random_quant_rows(c.q, (kHq + 2 * kHkv) * kD, kb, seed++);
    wo = random_quant_rows(c.o, kHidden, kHq * kD / 32, seed++);
    bqkv = random_rows(1, (kHq + 2 * kHkv) * kD, seed++);
    bo = random_rows(1, kHidden, seed++);
    norm_w = random_rows(1, kHidden, seed++);
    qn = random_rows(1, kD, seed++);
    kn = random_rows(1, kD, seed++);
    x0 = random_rows(1, kHidden, seed++);
    inv_freq.resize(static_cast<size_t>(c.rotary_dim / 2));
    for (size_t i = 0; i < inv_freq.size(); ++i) {
      inv_freq[i] = 1.0f / std::pow(10000.0f, 2.0f * static_cast<float>(i) /
                                                  static_cast<float>(c.rotary_dim));
    }
    k_cache = random_rows(1, kBlocks * kBlock * kHkv * kD, seed++);
    v_cache = random_rows(1, kBlocks * kBlock * kHkv * kD, seed++);
    tables = {0, 1, 2, 3, 4, 9, 7, 2, 11, 5};  // sequence 1: blocks 9, 7, 2, 11, 5
    pos = static_cast<int32_t>(c.pos);
  }

  PagedKvParams cache(float* k, float* v) const { return paged_cache(k, v, tables); }
};

DecodePart part(const std::vector<uint8_t>& w, DType dt, int64_t rows, int64_t in,
                const float* bias) {
  DecodePart d;
  d.weight = w.data();
  d.weight_dtype = dt;
  d.row_bytes = in / 32 * dtype_info(dt).block_bytes;
  d.rows = rows;
  d.bias = bias;
  return d;
}

// The outputs of one run.
struct Outputs {
  std::vector<float> x, h, qkv, q, attn, k_cache, v_cache;
};

// Q/K/V parts writing into out (3 parts, or one joined part).
int qkv_parts(const Fixture& f, const BlockCase& c, float* out, DecodePart* parts) {
  const float* b = c.bias ? f.bqkv.data() : nullptr;
  if (c.joined) {
    parts[0] = part(f.wj, c.q, (kHq + 2 * kHkv) * kD, kHidden, b);
    parts[0].out = out;
    return 1;
  }
  parts[0] = part(f.wq, c.q, kHq * kD, kHidden, b);
  parts[1] = part(f.wk, c.k, kHkv * kD, kHidden, b != nullptr ? b + kHq * kD : nullptr);
  parts[2] = part(f.wv, c.v, kHkv * kD, kHidden, b != nullptr ? b + (kHq + kHkv) * kD : nullptr);
  parts[0].out = out;
  parts[1].out = out + kHq * kD;
  parts[2].out = out + (kHq + kHkv) * kD;
  return 3;
}

RmsNormParams model_norm(const Fixture& f) {
  RmsNormParams n;
  n.weight = f.norm_w.data();
  n.weight_dtype = DType::kF32;
  n.eps = 1e-5f;
  return n;
}

AttentionKernelParams attention_params(const Fixture& f, const BlockCase& c, Outputs& o) {
  AttentionKernelParams p;
  p.q = o.q.data();
  p.q_stride = kHq * kD;
  p.out = o.attn.data();
  p.out_stride = kHq * kD;
  p.token_seq = &f.seq;
  p.token_pos = &f.pos;
  p.n_tokens = 1;
  p.n_heads = kHq;
  p.cache = f.cache(o.k_cache.data(), o.v_cache.data());
  p.scale = 1.0f / std::sqrt(static_cast<float>(kD));
  p.sliding_window = c.sliding_window;
  p.logit_softcap = c.softcap;
  return p;
}

Outputs fresh(const Fixture& f) {
  Outputs o;
  o.x = f.x0;
  o.h.assign(kHidden, -1.0f);
  o.qkv.assign((kHq + 2 * kHkv) * kD, -1.0f);
  o.q.assign(kHq * kD, -1.0f);
  o.attn.assign(kHq * kD, -1.0f);
  o.k_cache = f.k_cache;
  o.v_cache = f.v_cache;
  return o;
}

Outputs composition(const Fixture& f, const BlockCase& c) {
  Outputs o = fresh(f);
  RmsNormParams n = model_norm(f);
  n.x = o.x.data();
  n.out = o.h.data();
  n.n_tokens = 1;
  n.hidden = kHidden;
  n.x_stride = n.out_stride = kHidden;
  EXPECT_TRUE(rms_norm(n).ok());
  DecodePart parts[3];
  const int np = qkv_parts(f, c, o.qkv.data(), parts);
  EXPECT_TRUE(quant_decode_parts(o.h.data(), kHidden, parts, np, false));
  // rope_kv_append's f32 path (ops.cpp): q copied out, per-head norms, rope, the append.
  std::memcpy(o.q.data(), o.qkv.data(), sizeof(float) * kHq * kD);
  float* k = o.qkv.data() + kHq * kD;
  if (c.qk_norm) {
    for (auto [w, base, heads] :
         {std::tuple{f.qn.data(), o.q.data(), kHq}, std::tuple{f.kn.data(), k, kHkv}}) {
      RmsNormParams p;
      p.x = p.out = base;
      p.weight = w;
      p.weight_dtype = DType::kF32;
      p.n_tokens = heads;
      p.hidden = p.x_stride = p.out_stride = kD;
      p.eps = 1e-6f;
      EXPECT_TRUE(rms_norm(p).ok());
    }
  }
  if (c.rotary_dim > 0) {
    RopeKernelParams r;
    r.n_tokens = 1;
    r.head_dim = kD;
    r.positions = &f.pos;
    r.inv_freq = f.inv_freq.data();
    r.rotary_dim = c.rotary_dim;
    r.neox_style = c.neox;
    r.x = o.q.data();
    r.token_stride = kHq * kD;
    r.head_stride = kD;
    r.n_heads = kHq;
    EXPECT_TRUE(rope(r).ok());
    r.x = k;
    r.n_heads = kHkv;
    EXPECT_TRUE(rope(r).ok());
  }
  KvAppendParams a;
  a.k = k;
  a.v = k + kHkv * kD;
  a.k_stride = a.v_stride = (kHq + 2 * kHkv) * kD;
  a.token_seq = &f.seq;
  a.token_pos = &f.pos;
  a.n_tokens = 1;
  a.cache = f.cache(o.k_cache.data(), o.v_cache.data());
  EXPECT_TRUE(kv_append(a).ok());
  EXPECT_TRUE(attention(attention_params(f, c, o)).ok());
  DecodePart wo = part(f.wo, c.o, kHidden, kHq * kD, c.bias ? f.bo.data() : nullptr);
  wo.out = o.x.data();
  EXPECT_TRUE(quant_decode_parts(o.attn.data(), kHq * kD, &wo, 1, true));
  return o;
}

AttnDecodeArgs fused_args(const Fixture& f, const BlockCase& c, Outputs& o) {
  AttnDecodeArgs a;
  a.x = o.x.data();
  a.hidden = kHidden;
  a.norm = model_norm(f);
  a.h = o.h.data();
  a.n_qkv = qkv_parts(f, c, o.qkv.data(), a.qkv);
  RopeKvAppendF32Params& r = a.rope_kv;
  r.qkv = o.qkv.data();
  r.qkv_stride = (kHq + 2 * kHkv) * kD;
  r.q_out = o.q.data();
  r.q_out_stride = kHq * kD;
  r.token_seq = &f.seq;
  r.token_pos = &f.pos;
  r.n_tokens = 1;
  r.n_heads = kHq;
  r.inv_freq = c.rotary_dim > 0 ? f.inv_freq.data() : nullptr;
  r.rotary_dim = c.rotary_dim;
  r.neox_style = c.neox;
  r.q_norm = c.qk_norm ? f.qn.data() : nullptr;
  r.k_norm = c.qk_norm ? f.kn.data() : nullptr;
  r.norm_eps = 1e-6f;
  r.cache = f.cache(o.k_cache.data(), o.v_cache.data());
  a.attn = attention_params(f, c, o);
  a.o = part(f.wo, c.o, kHidden, kHq * kD, c.bias ? f.bo.data() : nullptr);
  return a;
}

void expect_same(const Outputs& got, const Outputs& want, const char* name) {
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(got.x, want.x)) << name << ": x";
  EXPECT_TRUE(same(got.h, want.h)) << name << ": h";
  EXPECT_TRUE(same(got.qkv, want.qkv)) << name << ": qkv";
  EXPECT_TRUE(same(got.q, want.q)) << name << ": q";
  EXPECT_TRUE(same(got.attn, want.attn)) << name << ": attn";
  EXPECT_TRUE(same(got.k_cache, want.k_cache)) << name << ": k cache";
  EXPECT_TRUE(same(got.v_cache, want.v_cache)) << name << ": v cache";
}

TEST(AttnBlock, DecodeMatchesCompositionBitExactly) {
  if (quant_detail::resolve_quant_isa(QuantIsa::kBest) == QuantIsa::kScalar) {
    GTEST_SKIP() << "no AVX2 on this CPU: quant_attn_decode serves nothing";
  }
  set_quant_decode(QuantDecode::kInt16);
  const std::vector<BlockCase> cases = {
      {"llama q4_1", DType::kQ4_1, DType::kQ4_1, DType::kQ4_1, DType::kQ4_1, false, false, false,
       kD, true, 0, 0.0f, 13},
      {"joined q8_0, bias, first token", DType::kQ8_0, DType::kQ8_0, DType::kQ8_0, DType::kQ4_0,
       true, true, false, kD, true, 0, 0.0f, 0},
      {"mixed, qk norm, partial gpt-j rope", DType::kQ4_0, DType::kQ5_1, DType::kQ8_0, DType::kQ5_0,
       false, true, true, 16, false, 0, 0.0f, 18},
      {"sliding window, softcap, no rope", DType::kQ4_1, DType::kQ8_0, DType::kQ4_1, DType::kQ8_0,
       false, false, false, 0, true, 5, 30.0f, 11},
  };
  uint32_t seed = 700;
  for (const BlockCase& c : cases) {
    const Fixture f(c, seed);
    seed += 20;
    const Outputs want = composition(f, c);
    Outputs got = fresh(f);
    bool done = false;
    ASSERT_TRUE(quant_attn_decode(fused_args(f, c, got), &done).ok()) << c.name;
    ASSERT_TRUE(done) << c.name;
    expect_same(got, want, c.name);
    EXPECT_NE(got.x, f.x0) << c.name;  // the residual moved
  }
  set_quant_decode(QuantDecode::kAuto);
}

// A token whose block-table entry is outside the pool: the composition's error (kOutOfRange),
// and nothing written. A K-quant projection or int8 decode: not served, nothing written.
TEST(AttnBlock, RefusesWithoutWriting) {
  if (quant_detail::resolve_quant_isa(QuantIsa::kBest) == QuantIsa::kScalar) {
    GTEST_SKIP() << "no AVX2 on this CPU: quant_attn_decode serves nothing";
  }
  set_quant_decode(QuantDecode::kInt16);
  const BlockCase c{"q4_1",
                    DType::kQ4_1,
                    DType::kQ4_1,
                    DType::kQ4_1,
                    DType::kQ4_1,
                    false,
                    false,
                    false,
                    kD,
                    true,
                    0,
                    0.0f,
                    6};
  Fixture f(c, 900);
  f.tables[5 + 1] = kBlocks;  // position 6 of sequence 1 is in its second block
  Outputs got = fresh(f);
  const Outputs before = got;
  bool done = true;
  const Status s = quant_attn_decode(fused_args(f, c, got), &done);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.message();
  EXPECT_FALSE(done);
  expect_same(got, before, "bad block");

  Fixture g(c, 901);
  g.wo = random_quant_rows(DType::kQ4_K, kHidden, 1, 3);  // 128 = half a K-quant block: refused
  AttnDecodeArgs a = fused_args(g, c, got);
  a.o.weight_dtype = DType::kQ4_K;
  ASSERT_TRUE(quant_attn_decode(a, &done).ok());
  EXPECT_FALSE(done);
  expect_same(got, before, "k-quant");

  set_quant_decode(QuantDecode::kInt8);
  ASSERT_TRUE(quant_attn_decode(fused_args(f, c, got), &done).ok());
  EXPECT_FALSE(done);
  expect_same(got, before, "int8 decode");
  set_quant_decode(QuantDecode::kAuto);
}

// rope_kv_append_f32 (one parallel loop over tokens x heads) against the kernels it replaces in
// ops::rope_kv_append's f32 path: copy_rows, rms_norm per head, rope, kv_append. 40 tokens of
// two sequences (enough for the parallel loop), with and without q / k norms and rotation.
TEST(RopeKvAppendF32, MatchesCompositionBitExactly) {
  constexpr int64_t n = 40, row = (kHq + 2 * kHkv) * kD;
  std::vector<int32_t> seq(n), pos(n);
  for (int64_t t = 0; t < n; ++t) {
    seq[static_cast<size_t>(t)] = static_cast<int32_t>(t % 2);
    pos[static_cast<size_t>(t)] = static_cast<int32_t>(t / 2);
  }
  std::vector<int32_t> tables = {0, 1, 2, 3, 4, 9, 7, 8, 11, 5};  // 20 positions per sequence
  const std::vector<float> qkv0 = random_rows(n, row, 50), qn = random_rows(1, kD, 51),
                           kn = random_rows(1, kD, 52);
  std::vector<float> inv_freq(kD / 2);
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(0.5f, static_cast<float>(i));
  for (const bool norms : {false, true}) {
    for (const int64_t rotary : {int64_t{0}, int64_t{16}, kD}) {
      const auto cache = [&](std::vector<float>& k, std::vector<float>& v) {
        return paged_cache(k.data(), v.data(), tables);
      };
      const size_t cache_n = static_cast<size_t>(kBlocks * kBlock * kHkv * kD);
      // The composition.
      std::vector<float> qkv_w = qkv0, q_w(n * kHq * kD), kc_w(cache_n, 7.0f), vc_w(cache_n, 7.0f);
      ASSERT_TRUE(copy_rows({.src = qkv_w.data(),
                             .src_stride = row * 4,
                             .dst = q_w.data(),
                             .dst_stride = kHq * kD * 4,
                             .row_bytes = kHq * kD * 4,
                             .rows = n})
                      .ok());
      if (norms) {
        for (auto [w, base, heads, stride] :
             {std::tuple{qn.data(), q_w.data(), kHq, kHq * kD},
              std::tuple{kn.data(), qkv_w.data() + kHq * kD, kHkv, row}}) {
          for (int64_t t = 0; t < n; ++t) {
            RmsNormParams p;
            p.x = p.out = base + t * stride;
            p.weight = w;
            p.weight_dtype = DType::kF32;
            p.n_tokens = heads;
            p.hidden = p.x_stride = p.out_stride = kD;
            p.eps = 1e-6f;
            ASSERT_TRUE(rms_norm(p).ok());
          }
        }
      }
      if (rotary > 0) {
        RopeKernelParams r;
        r.n_tokens = n;
        r.head_dim = kD;
        r.positions = pos.data();
        r.inv_freq = inv_freq.data();
        r.rotary_dim = rotary;
        r.x = q_w.data();
        r.token_stride = kHq * kD;
        r.head_stride = kD;
        r.n_heads = kHq;
        ASSERT_TRUE(rope(r).ok());
        r.x = qkv_w.data() + kHq * kD;
        r.token_stride = row;
        r.n_heads = kHkv;
        ASSERT_TRUE(rope(r).ok());
      }
      KvAppendParams a;
      a.k = qkv_w.data() + kHq * kD;
      a.v = a.k + kHkv * kD;
      a.k_stride = a.v_stride = row;
      a.token_seq = seq.data();
      a.token_pos = pos.data();
      a.n_tokens = n;
      a.cache = cache(kc_w, vc_w);
      ASSERT_TRUE(kv_append(a).ok());

      // The kernel.
      std::vector<float> qkv_g = qkv0, q_g(n * kHq * kD, -1.0f), kc_g(cache_n, 7.0f),
                         vc_g(cache_n, 7.0f);
      RopeKvAppendF32Params p;
      p.qkv = qkv_g.data();
      p.qkv_stride = row;
      p.q_out = q_g.data();
      p.q_out_stride = kHq * kD;
      p.token_seq = seq.data();
      p.token_pos = pos.data();
      p.n_tokens = n;
      p.n_heads = kHq;
      p.inv_freq = inv_freq.data();
      p.rotary_dim = rotary;
      p.q_norm = norms ? qn.data() : nullptr;
      p.k_norm = norms ? kn.data() : nullptr;
      p.cache = cache(kc_g, vc_g);
      ASSERT_TRUE(rope_kv_append_f32(p).ok());
      EXPECT_EQ(qkv_g, qkv_w) << "norms " << norms << " rotary " << rotary;
      EXPECT_EQ(q_g, q_w) << "norms " << norms << " rotary " << rotary;
      EXPECT_EQ(kc_g, kc_w) << "norms " << norms << " rotary " << rotary;
      EXPECT_EQ(vc_g, vc_w) << "norms " << norms << " rotary " << rotary;

      // A position past the block table: kv_append's error, nothing written.
      std::vector<int32_t> bad = pos;
      bad[7] = static_cast<int32_t>(kMaxBlocksPerSeq * kBlock);
      p.token_pos = bad.data();
      std::vector<float> before = kc_g;
      const Status s = rope_kv_append_f32(p);
      EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s.message();
      EXPECT_EQ(kc_g, before);
    }
  }
}

// The fused regions' phase clock (STRATA_PROFILE): a call counts once all its phases are
// marked, by the thread that takes the stamps; a clock that is off, or a call that stops short,
// adds nothing.
TEST(PhaseClock, CountsWholeCallsOfTheStampingThread) {
  PhaseClock clock("test", std::array{"a", "b"}, /*on=*/true);
  {
    PhaseClock::Call c(clock, true);
    c.mark();
    c.mark();
  }
  {
    PhaseClock::Call c(clock, false);  // another thread: takes no stamps
    c.mark();
    c.mark();
  }
  {
    PhaseClock::Call c(clock, true);  // one phase of two
    c.mark();
  }
  EXPECT_EQ(clock.calls(), 1);
  EXPECT_GE(clock.mean_us(0), 0.0);
  EXPECT_GE(clock.mean_us(1), 0.0);
  PhaseClock off("off", std::array{"a"}, /*on=*/false);
  {
    PhaseClock::Call c(off, true);
    c.mark();
  }
  EXPECT_EQ(off.calls(), 0);
}

}  // namespace
}  // namespace strata::cpu
