// The GPU executor's fused bf16 kernels against their CPU twins (src/backends/cpu/fused_bf16.cpp,
// themselves tested against the f32 reference ops in tests/ops/test_fused_bf16_twin.cpp):
//   norm_bf16   hidden 1, 7, 576, 4096, 5125 x tokens 1, 3, 17, 200 x weight f32/f16/bf16 x
//                   residual on/off; padded strides (vector body + scalar tail, odd strides),
//                   weight_offset 1, a misaligned x (scalar path).
//   gated_act_bf16  every activation x ffn 1, 7, 576, 4096, 5125 x tokens 1, 3, 17, 200, padded
//                   and odd strides.
//   rope_kv_append  head_dim 12, 16, 64, 128, full / partial / no rotary, both pair styles, MHA,
//                   GQA and MQA, padded and odd strides, tokens 1, 3, 17, 200 of 3 sequences at
//                   positions up to 100000 in 16-slot blocks with shuffled ids, attention_factor,
//                   and tokens with an invalid sequence / position / block.
//   f32_to_bf16, bf16_to_f32, fill_random_bf16: exact against the host's conversion / hash.
//   One CUDA graph capturing the fused kernels, replayed: same results.
// Every output starts NaN-poisoned (the whole KV cache too) and is compared in full, padding
// included, so an element written that should not be, or not written that should, fails.
//
// Bound: bf16 outputs equal the twin's or are 1 bf16 ulp apart. Both sides compute the same f32
// value up to a few f32 ulp (norm_bf16: f32 block reduction vs the twin's double sum;
// gated_act_bf16: CUDA expf/tanhf/erff within 2 ulp of the host's, gate inputs kept in [-3, 3]
// where 1 + tanh / 1 + erf cancel by less than 2^-9; rope_kv_append: bit-equal f32 arithmetic,
// only a double sincos that straddles an f32 midpoint differs), and two reals less than one bf16
// ulp apart round to bf16 values at most one ulp apart. Exact elsewhere: the f32 residual stream
// written back (one IEEE add), relu, the conversions and the random fill. The number of 1-ulp
// differences is printed per test.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/random_hash.h"
#include "core/half.h"
#include "cuda_test_util.h"
#include "kernel_test_util.h"

namespace strata::cuda {
namespace {

using testutil::DeviceArray;
using testutil::random_floats;

constexpr uint16_t kPoison = 0xffff;  // a bf16 NaN: what DeviceArray::poison writes

bool bf16_is_nan(uint16_t b) {
  return (b & 0x7fffu) > 0x7f80u;
}

// Position on a monotonic integer line (+0 and -0 both at 0x8000): the distance of two non-NaN
// bf16 values is the number of bf16 steps between them.
int32_t bf16_ordinal(uint16_t b) {
  return (b & 0x8000u) ? 0x8000 - (b & 0x7fff) : 0x8000 + b;
}

// got == ref, or both non-NaN and at most `max_ulp` bf16 steps apart; a NaN matches only a NaN
// (poison must stay poison, and every element the twin wrote must be written). Adds the number
// of inexact elements to *inexact.
::testing::AssertionResult bf16_match(const std::vector<uint16_t>& got,
                                      const std::vector<uint16_t>& ref, int max_ulp,
                                      size_t* inexact) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << "sizes differ: " << got.size() << " vs " << ref.size();
  }
  size_t bad = 0;
  size_t first_bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == ref[i]) continue;
    const bool ok = !bf16_is_nan(got[i]) && !bf16_is_nan(ref[i]) &&
                    std::abs(bf16_ordinal(got[i]) - bf16_ordinal(ref[i])) <= max_ulp;
    if (ok) {
      ++*inexact;
    } else if (bad++ == 0) {
      first_bad = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements differ by more than " << max_ulp
         << " ulp; first at " << first_bad << ": gpu 0x" << std::hex << got[first_bad] << " ("
         << ::strata::bf16_to_f32(got[first_bad]) << ") cpu 0x" << ref[first_bad] << " ("
         << ::strata::bf16_to_f32(ref[first_bad]) << ")" << std::dec;
}

// Bit equality of f32 arrays (NaN payloads included).
::testing::AssertionResult bits_equal(const std::vector<float>& got,
                                      const std::vector<float>& ref) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &ref[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "first difference at " << i << ": gpu " << got[i] << " cpu " << ref[i];
    }
  }
  return ::testing::AssertionSuccess();
}

void report_inexact(const char* what, size_t inexact, size_t total) {
  std::cout << "[   INFO   ] " << what << ": " << inexact << " of " << total
            << " bf16 outputs 1 ulp from the CPU twin, the rest identical\n";
}

std::vector<uint16_t> poisoned(size_t n) {
  return std::vector<uint16_t>(n, kPoison);
}

// ---- norm_bf16 ---------------------------------------------------------------------------

struct NormCase {
  int64_t n;
  int64_t hidden;
  DType dt;
  bool residual;
  int64_t x_pad = 0;
  int64_t res_pad = 0;
  int64_t out_pad = 0;
  float offset = 0.0f;
  bool misalign = false;  // x, residual and out start one element past an aligned address
};

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> cases;
  for (int64_t hidden : {1, 7, 576, 4096, 5125}) {
    for (int64_t n : {1, 3, 17, 200}) {
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (bool residual : {false, true}) cases.push_back({n, hidden, dt, residual});
      }
    }
  }
  // Strides that are multiples of 4 around odd hidden sizes: vector body + scalar tail.
  cases.push_back({3, 7, DType::kBF16, true, 1, 5, 1});
  cases.push_back({17, 5125, DType::kF16, true, 3, 7, 3});
  // Odd strides (scalar variant) on a vector-friendly width; Gemma's (1 + w); misaligned views.
  cases.push_back({17, 576, DType::kF32, true, 1, 2, 3});
  cases.push_back({200, 4096, DType::kBF16, true, 4, 8, 4, 1.0f});
  cases.push_back({3, 576, DType::kBF16, false, 0, 0, 0, 1.0f});
  cases.push_back({17, 4096, DType::kF32, true, 0, 0, 0, 0.0f, true});
  return cases;
}

class FusedBf16CudaTest : public testutil::CudaTest {};

TEST_F(FusedBf16CudaTest, RmsNormBf16MatchesCpuTwin) {
  const cudaStream_t st = ctx().stream;
  size_t inexact = 0;
  size_t total = 0;
  for (const NormCase& c : norm_cases()) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " hidden " + std::to_string(c.hidden) + " " +
                 std::string(dtype_name(c.dt)) + (c.residual ? " residual" : "") + " pads " +
                 std::to_string(c.x_pad) + "/" + std::to_string(c.res_pad) + "/" +
                 std::to_string(c.out_pad) + (c.offset != 0.0f ? " offset" : "") +
                 (c.misalign ? " misaligned" : ""));
    std::mt19937 rng(static_cast<uint32_t>(c.n * 7919 + c.hidden * 31 + c.residual));
    const size_t off = c.misalign ? 1 : 0;
    const int64_t xs = c.hidden + c.x_pad;
    const int64_t rs = c.hidden + c.res_pad;
    const int64_t os = c.hidden + c.out_pad;
    const std::vector<float> x0 = random_floats(off + static_cast<size_t>(c.n * xs), rng, -2, 2);
    const std::vector<float> res = random_floats(off + static_cast<size_t>(c.n * rs), rng, -2, 2);
    const std::vector<uint8_t> w = testutil::random_typed(c.dt, c.hidden, rng, -1.5f, 1.5f);

    std::vector<float> x = x0;
    std::vector<uint16_t> out = poisoned(off + static_cast<size_t>(c.n * os));
    NormBf16Params p{.x = x.data() + off,
                        .x_stride = xs,
                        .residual = c.residual ? res.data() + off : nullptr,
                        .residual_stride = rs,
                        .weight = w.data(),
                        .weight_dtype = c.dt,
                        .out = out.data() + off,
                        .out_stride = os,
                        .n_tokens = c.n,
                        .hidden = c.hidden,
                        .eps = 1e-6f,
                        .weight_offset = c.offset};
    ASSERT_TRUE(cpu::norm_bf16(p).ok());

    DeviceArray<float> dx(x0, st), dres(res, st);
    DeviceArray<uint8_t> dw(w, st);
    DeviceArray<uint16_t> dout(out.size());
    dout.poison(st);
    p.x = dx.get() + off;
    p.residual = c.residual ? dres.get() + off : nullptr;
    p.weight = dw.get();
    p.out = dout.get() + off;
    const Status status = norm_bf16(ctx(), p);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_TRUE(bits_equal(dx.download(st), x)) << "x (residual stream)";
    EXPECT_TRUE(bf16_match(dout.download(st), out, 1, &inexact)) << "out";
    total += out.size();
  }
  report_inexact("norm_bf16", inexact, total);
}

// LayerNorm through norm_bf16 (kind kLayer, GPT-2 / NeoX), with and without bias and residual.
TEST_F(FusedBf16CudaTest, LayerNormBf16MatchesCpuTwin) {
  const cudaStream_t st = ctx().stream;
  size_t inexact = 0;
  size_t total = 0;
  for (int64_t hidden : {1, 7, 576, 4096, 5125}) {
    for (int64_t n : {1, 3, 17, 200}) {
      for (DType dt : {DType::kF32, DType::kBF16}) {
        for (int variant = 0; variant < 3; ++variant) {  // plain, bias, bias + residual + pads
          const bool bias = variant > 0, residual = variant == 2;
          const int64_t pad = variant == 2 ? 3 : 0;
          SCOPED_TRACE("hidden " + std::to_string(hidden) + " n " + std::to_string(n) + " " +
                       std::string(dtype_name(dt)) + " variant " + std::to_string(variant));
          std::mt19937 rng(static_cast<uint32_t>(hidden * 17 + n * 5 + variant));
          const int64_t xs = hidden + pad, os = hidden + pad;
          // A large common offset: the centred variance must not cancel away.
          std::vector<float> x0 = random_floats(static_cast<size_t>(n * xs), rng, -2, 2);
          for (float& v : x0) v += 30.0f;
          const std::vector<float> res = random_floats(static_cast<size_t>(n * xs), rng, -2, 2);
          const std::vector<uint8_t> w = testutil::random_typed(dt, hidden, rng, 0.5f, 1.5f);
          const std::vector<uint8_t> b = testutil::random_typed(dt, hidden, rng, -0.5f, 0.5f);
          std::vector<float> x = x0;
          std::vector<uint16_t> out = poisoned(static_cast<size_t>(n * os));
          NormBf16Params p{.kind = NormKind::kLayer,
                           .x = x.data(),
                           .x_stride = xs,
                           .residual = residual ? res.data() : nullptr,
                           .residual_stride = xs,
                           .weight = w.data(),
                           .weight_dtype = dt,
                           .bias = bias ? b.data() : nullptr,
                           .bias_dtype = dt,
                           .out = out.data(),
                           .out_stride = os,
                           .n_tokens = n,
                           .hidden = hidden,
                           .eps = 1e-5f};
          ASSERT_TRUE(cpu::norm_bf16(p).ok());
          DeviceArray<float> dx(x0, st), dres(res, st);
          DeviceArray<uint8_t> dw(w, st), db(b, st);
          DeviceArray<uint16_t> dout(out.size());
          dout.poison(st);
          p.x = dx.get();
          p.residual = residual ? dres.get() : nullptr;
          p.weight = dw.get();
          p.bias = bias ? db.get() : nullptr;
          p.out = dout.get();
          const Status status = norm_bf16(ctx(), p);
          ASSERT_TRUE(status.ok()) << status.to_string();
          EXPECT_TRUE(bits_equal(dx.download(st), x)) << "x (residual stream)";
          EXPECT_TRUE(bf16_match(dout.download(st), out, 1, &inexact)) << "out";
          total += out.size();
        }
      }
    }
  }
  report_inexact("norm_bf16 (LayerNorm)", inexact, total);
}

// ---- gated_act_bf16 --------------------------------------------------------------------------

TEST_F(FusedBf16CudaTest, GatedActBf16MatchesCpuTwin) {
  const cudaStream_t st = ctx().stream;
  const Activation acts[] = {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluErf,
                             Activation::kRelu};
  for (Activation act : acts) {
    size_t inexact = 0;
    size_t total = 0;
    for (int64_t ffn : {1, 7, 576, 4096, 5125}) {
      // Padding cycles with the token count: none (vector path when ffn % 4 == 0), 4 (vector
      // path on padded rows), 3 (odd strides: scalar path).
      const std::pair<int64_t, int64_t> runs[] = {{1, 0}, {3, 4}, {17, 3}, {200, 0}};
      for (const auto& [n, pad] : runs) {
        SCOPED_TRACE("act " + std::to_string(static_cast<int>(act)) + " ffn " +
                     std::to_string(ffn) + " n " + std::to_string(n) + " pad " +
                     std::to_string(pad));
        std::mt19937 rng(static_cast<uint32_t>(ffn * 131 + n * 7 + static_cast<int>(act)));
        const int64_t in_stride = 2 * ffn + pad;
        const int64_t out_stride = ffn + pad;
        // gate in [-3, 3] (see the bound above), up in [-2, 2].
        std::vector<float> in = random_floats(static_cast<size_t>(n * in_stride), rng, -3, 3);
        for (int64_t r = 0; r < n; ++r) {
          for (int64_t i = ffn; i < 2 * ffn; ++i)
            in[static_cast<size_t>(r * in_stride + i)] *= 2.0f / 3.0f;
        }
        std::vector<uint16_t> out = poisoned(static_cast<size_t>(n * out_stride));
        GatedActBf16Params p{.in = in.data(),
                             .in_stride = in_stride,
                             .out = out.data(),
                             .out_stride = out_stride,
                             .n_tokens = n,
                             .ffn_dim = ffn,
                             .act = act};
        ASSERT_TRUE(cpu::gated_act_bf16(p).ok());
        DeviceArray<float> din(in, st);
        DeviceArray<uint16_t> dout(out.size());
        dout.poison(st);
        p.in = din.get();
        p.out = dout.get();
        const Status status = gated_act_bf16(ctx(), p);
        ASSERT_TRUE(status.ok()) << status.to_string();
        // relu: a comparison and one multiply, rounded once: exact.
        const int max_ulp = act == Activation::kRelu ? 0 : 1;
        EXPECT_TRUE(bf16_match(dout.download(st), out, max_ulp, &inexact));
        total += out.size();
      }
    }
    report_inexact(("gated_act_bf16 act " + std::to_string(static_cast<int>(act))).c_str(), inexact,
                   total);
  }
}

// The bf16-input variant (the gate/up GEMM's bf16 output), against the same twin.
TEST_F(FusedBf16CudaTest, GatedActBf16InputMatchesCpuTwin) {
  const cudaStream_t st = ctx().stream;
  for (Activation act : {Activation::kSilu, Activation::kGeluTanh}) {
    size_t inexact = 0;
    size_t total = 0;
    for (int64_t ffn : {1, 7, 576, 5125}) {
      for (const auto& [n, pad] : {std::pair<int64_t, int64_t>{1, 0}, {3, 4}, {17, 3}, {200, 0}}) {
        SCOPED_TRACE("ffn " + std::to_string(ffn) + " n " + std::to_string(n));
        std::mt19937 rng(static_cast<uint32_t>(ffn * 17 + n));
        const int64_t in_stride = 2 * ffn + pad;
        const int64_t out_stride = ffn + pad;
        const std::vector<float> f = random_floats(static_cast<size_t>(n * in_stride), rng, -3, 3);
        std::vector<uint16_t> in(f.size());
        for (size_t i = 0; i < f.size(); ++i) in[i] = ::strata::f32_to_bf16(f[i]);
        std::vector<uint16_t> out = poisoned(static_cast<size_t>(n * out_stride));
        GatedActBf16Params p{.in = nullptr,
                             .in_stride = in_stride,
                             .in_bf16 = in.data(),
                             .out = out.data(),
                             .out_stride = out_stride,
                             .n_tokens = n,
                             .ffn_dim = ffn,
                             .act = act};
        ASSERT_TRUE(cpu::gated_act_bf16(p).ok());
        DeviceArray<uint16_t> din(in, st);
        DeviceArray<uint16_t> dout(out.size());
        dout.poison(st);
        p.in_bf16 = din.get();
        p.out = dout.get();
        const Status status = gated_act_bf16(ctx(), p);
        ASSERT_TRUE(status.ok()) << status.to_string();
        EXPECT_TRUE(bf16_match(dout.download(st), out, 1, &inexact));
        total += out.size();
      }
    }
    report_inexact("gated_act_bf16 (bf16 in)", inexact, total);
  }
}

// Plain (ungated) MLP activation, f32 and bf16 input.
TEST_F(FusedBf16CudaTest, UngatedActBf16MatchesCpuTwin) {
  const cudaStream_t st = ctx().stream;
  for (Activation act : {Activation::kGeluTanh, Activation::kGeluErf, Activation::kRelu}) {
    size_t inexact = 0;
    size_t total = 0;
    for (int64_t ffn : {1, 7, 576, 5125}) {
      for (const auto& [n, pad] : {std::pair<int64_t, int64_t>{1, 0}, {3, 4}, {17, 3}, {200, 0}}) {
        for (bool bf16_in : {false, true}) {
          SCOPED_TRACE("ffn " + std::to_string(ffn) + " n " + std::to_string(n) +
                       (bf16_in ? " bf16 in" : " f32 in"));
          std::mt19937 rng(static_cast<uint32_t>(ffn * 29 + n * 3 + bf16_in));
          const int64_t in_stride = ffn + pad, out_stride = ffn + pad;
          const std::vector<float> in =
              random_floats(static_cast<size_t>(n * in_stride), rng, -3, 3);
          std::vector<uint16_t> in16(in.size());
          for (size_t i = 0; i < in.size(); ++i) in16[i] = ::strata::f32_to_bf16(in[i]);
          std::vector<uint16_t> out = poisoned(static_cast<size_t>(n * out_stride));
          GatedActBf16Params p{.gated = false,
                               .in = bf16_in ? nullptr : in.data(),
                               .in_stride = in_stride,
                               .in_bf16 = bf16_in ? in16.data() : nullptr,
                               .out = out.data(),
                               .out_stride = out_stride,
                               .n_tokens = n,
                               .ffn_dim = ffn,
                               .act = act};
          ASSERT_TRUE(cpu::gated_act_bf16(p).ok());
          DeviceArray<float> din(in, st);
          DeviceArray<uint16_t> din16(in16, st);
          DeviceArray<uint16_t> dout(out.size());
          dout.poison(st);
          p.in = bf16_in ? nullptr : din.get();
          p.in_bf16 = bf16_in ? din16.get() : nullptr;
          p.out = dout.get();
          const Status status = gated_act_bf16(ctx(), p);
          ASSERT_TRUE(status.ok()) << status.to_string();
          EXPECT_TRUE(bf16_match(dout.download(st), out, act == Activation::kRelu ? 0 : 1, &inexact));
          total += out.size();
        }
      }
    }
    report_inexact(("act_bf16 act " + std::to_string(static_cast<int>(act))).c_str(), inexact,
                   total);
  }
}

// ---- rope_kv_append --------------------------------------------------------------------------

// The paged layout of tests/ops/test_fused_bf16_twin.cpp: token t belongs to sequence t % 3 at
// position base[seq] + t / 3 (bases up to ~1e5, sequence 0 from position 0); each (sequence,
// logical block) used gets its own block from a shuffled pool with 3 spare blocks; unused table
// entries are -1.
struct PagedLayout {
  int64_t n_seqs = 3;
  int64_t block_size = 16;
  int64_t max_blocks_per_seq = 0;
  int64_t n_blocks = 0;
  std::vector<int32_t> token_seq;
  std::vector<int32_t> token_pos;
  std::vector<int32_t> block_tables;
};

PagedLayout make_layout(int64_t n_tokens, std::mt19937& rng) {
  PagedLayout l;
  const int64_t max_pos = 100000;
  l.max_blocks_per_seq = max_pos / l.block_size + 1;
  std::vector<int64_t> base(static_cast<size_t>(l.n_seqs));
  for (int64_t& b : base) b = std::uniform_int_distribution<int64_t>(0, max_pos - n_tokens)(rng);
  base[0] = 0;
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

// Turns the last 5 tokens (of n >= 8) into tokens that must write nothing to the cache: sequence
// -1, sequence n_seqs, position -1, a position past the block table, and a block id past the
// pool (an otherwise unused table entry of sequence 1 set to n_blocks).
void add_invalid_tokens(PagedLayout& l) {
  const size_t n = l.token_seq.size();
  l.token_seq[n - 5] = -1;
  l.token_seq[n - 4] = static_cast<int32_t>(l.n_seqs);
  l.token_seq[n - 3] = 0, l.token_pos[n - 3] = -1;
  l.token_seq[n - 2] = 2;
  l.token_pos[n - 2] = static_cast<int32_t>(l.max_blocks_per_seq * l.block_size);
  int64_t logical = l.max_blocks_per_seq - 1;  // find an unmapped block of sequence 1
  while (l.block_tables[static_cast<size_t>(l.max_blocks_per_seq + logical)] >= 0) --logical;
  l.block_tables[static_cast<size_t>(l.max_blocks_per_seq + logical)] =
      static_cast<int32_t>(l.n_blocks);
  l.token_seq[n - 1] = 1;
  l.token_pos[n - 1] = static_cast<int32_t>(logical * l.block_size + 3);
}

struct RopeCase {
  int64_t head_dim;
  int64_t rotary_dim;
  int64_t n_heads;
  int64_t n_heads_kv;
  int64_t qkv_pad;  // extra floats per qkv row
  int64_t q_pad;    // extra bf16 per q_out row
  float attention_factor = 1.0f;
  bool qk_norm = false;      // per-head RMSNorm of q and k before the rotation (Gemma-3)
  float norm_offset = 0.0f;  // (1 + w) with 1
};

TEST_F(FusedBf16CudaTest, RopeKvAppendMatchesCpuTwin) {
  // {head_dim, rotary_dim, n_heads, n_heads_kv, qkv_pad, q_pad, attention_factor}
  const RopeCase cases[] = {
      {12, 12, 2, 1, 0, 0},                                // neox: 6 pairs, scalar; GPT-J: vector
      {12, 6, 4, 2, 0, 0},                                 // partial, 3 pairs: scalar both
      {16, 16, 4, 2, 0, 0, 1.1f},                          // vector both, attention_factor
      {16, 8, 3, 1, 1, 2},                                 // odd qkv stride: scalar
      {64, 64, 4, 4, 4, 4},                                // MHA, padded vector
      {64, 32, 8, 2, 0, 0},                                // partial (NeoX rotary_pct 0.5)
      {64, 0, 2, 1, 0, 0},                                 // no rotation (learned positions)
      {128, 128, 8, 2, 0, 0},                              // Llama-style GQA
      {128, 64, 4, 1, 0, 8, 1.1f}, {128, 32, 4, 2, 3, 1},  // partial + odd strides
      // q/k norms: Gemma-3-270M (head_dim 256, 4 heads, 1 KV head, (1 + w)), an odd head_dim,
      // partial rotary, no rotation.
      {256, 256, 4, 1, 0, 0, 1.0f, true, 1.0f}, {12, 12, 2, 1, 1, 0, 1.0f, true},
      {64, 32, 8, 2, 0, 4, 1.0f, true, 1.0f}, {64, 0, 2, 2, 0, 0, 1.0f, true},
  };
  const cudaStream_t st = ctx().stream;
  size_t inexact = 0;
  size_t total = 0;
  for (const RopeCase& c : cases) {
    for (int64_t n_tokens : {1, 3, 17, 200}) {
      for (bool neox : {true, false}) {
        SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " rotary " +
                     std::to_string(c.rotary_dim) + " heads " + std::to_string(c.n_heads) + "/" +
                     std::to_string(c.n_heads_kv) + " pads " + std::to_string(c.qkv_pad) + "/" +
                     std::to_string(c.q_pad) + " tokens " + std::to_string(n_tokens) +
                     (neox ? " neox" : " gptj") + (c.qk_norm ? " qk-norm" : ""));
        std::mt19937 rng(static_cast<uint32_t>(c.head_dim * 1009 + c.rotary_dim * 101 +
                                               c.n_heads * 13 + n_tokens * 3 + neox));
        PagedLayout l = make_layout(n_tokens, rng);
        if (n_tokens >= 17) add_invalid_tokens(l);
        const int64_t d = c.head_dim;
        const int64_t qkv_stride = (c.n_heads + 2 * c.n_heads_kv) * d + c.qkv_pad;
        const int64_t q_stride = c.n_heads * d + c.q_pad;
        const std::vector<float> qkv =
            random_floats(static_cast<size_t>(n_tokens * qkv_stride), rng, -2, 2);
        std::vector<float> inv_freq(static_cast<size_t>(std::max<int64_t>(c.rotary_dim / 2, 1)));
        for (size_t i = 0; i < inv_freq.size(); ++i) {
          inv_freq[i] =
              static_cast<float>(1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) /
                                                             std::max<int64_t>(c.rotary_dim, 1)));
        }
        const size_t cache_n = static_cast<size_t>(l.n_blocks * l.block_size * c.n_heads_kv * d);
        const std::vector<float> q_norm = random_floats(static_cast<size_t>(d), rng, 0.5f, 1.5f);
        const std::vector<float> k_norm = random_floats(static_cast<size_t>(d), rng, 0.5f, 1.5f);

        std::vector<uint16_t> q = poisoned(static_cast<size_t>(n_tokens * q_stride));
        std::vector<uint16_t> kc = poisoned(cache_n);
        std::vector<uint16_t> vc = poisoned(cache_n);
        RopeKvAppendParams p{.qkv = qkv.data(),
                             .qkv_stride = qkv_stride,
                             .q_out = q.data(),
                             .q_out_stride = q_stride,
                             .token_seq = l.token_seq.data(),
                             .token_pos = l.token_pos.data(),
                             .n_tokens = n_tokens,
                             .n_heads = c.n_heads,
                             .inv_freq = inv_freq.data(),
                             .rotary_dim = c.rotary_dim,
                             .neox_style = neox,
                             .attention_factor = c.attention_factor,
                             .q_norm = c.qk_norm ? q_norm.data() : nullptr,
                             .k_norm = c.qk_norm ? k_norm.data() : nullptr,
                             .norm_eps = 1e-6f,
                             .norm_weight_offset = c.norm_offset,
                             .cache = {.k_cache = kc.data(),
                                       .v_cache = vc.data(),
                                       .block_tables = l.block_tables.data(),
                                       .max_blocks_per_seq = l.max_blocks_per_seq,
                                       .n_seqs = l.n_seqs,
                                       .n_blocks = l.n_blocks,
                                       .block_size = l.block_size,
                                       .n_heads_kv = c.n_heads_kv,
                                       .head_dim = d}};
        ASSERT_TRUE(cpu::rope_kv_append(p).ok());

        DeviceArray<float> dqkv(qkv, st), dfreq(inv_freq, st), dqn(q_norm, st), dkn(k_norm, st);
        DeviceArray<int32_t> dseq(l.token_seq, st), dpos(l.token_pos, st),
            dtables(l.block_tables, st);
        DeviceArray<uint16_t> dq(q.size()), dkc(cache_n), dvc(cache_n);
        dq.poison(st);
        dkc.poison(st);
        dvc.poison(st);
        p.qkv = dqkv.get();
        p.q_out = dq.get();
        p.token_seq = dseq.get();
        p.token_pos = dpos.get();
        p.inv_freq = dfreq.get();
        if (c.qk_norm) {
          p.q_norm = dqn.get();
          p.k_norm = dkn.get();
        }
        p.cache.k_cache = dkc.get();
        p.cache.v_cache = dvc.get();
        p.cache.block_tables = dtables.get();
        const Status status = rope_kv_append(ctx(), p);
        ASSERT_TRUE(status.ok()) << status.to_string();
        EXPECT_TRUE(bf16_match(dq.download(st), q, 1, &inexact)) << "q_out";
        EXPECT_TRUE(bf16_match(dkc.download(st), kc, 1, &inexact)) << "k_cache";
        EXPECT_TRUE(bf16_match(dvc.download(st), vc, 0, &inexact)) << "v_cache (a copy: exact)";
        total += q.size() + 2 * cache_n;
      }
    }
  }
  report_inexact("rope_kv_append", inexact, total);
}

// ---- conversions and the random fill -----------------------------------------------------------

TEST_F(FusedBf16CudaTest, F32ToBf16RoundsAsHost) {
  const cudaStream_t st = ctx().stream;
  std::mt19937 rng(123);
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
    for (size_t off : {0, 1}) {  // 1: misaligned, scalar kernel
      SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(off));
      // Random bit patterns cover every class (normals, subnormals, inf, NaN); then specials.
      std::vector<float> src(off + static_cast<size_t>(n));
      for (float& v : src) {
        const uint32_t bits = rng();
        std::memcpy(&v, &bits, 4);
      }
      const float specials[] = {0.0f,
                                -0.0f,
                                1.0f,
                                std::numeric_limits<float>::infinity(),
                                -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::max(),  // rounds up to inf
                                std::numeric_limits<float>::denorm_min(),
                                1.00390625f,   // 1 + 2^-8: a tie, stays 1 (even)
                                1.01171875f};  // 1 + 3 * 2^-8: a tie, rounds up (to even)
      for (size_t i = 0; i < std::size(specials) && off + i < src.size(); ++i) {
        src[off + i] = specials[i];
      }
      DeviceArray<float> dsrc(src, st);
      DeviceArray<uint16_t> ddst(src.size());
      ddst.poison(st);
      const Status status = f32_to_bf16(ctx(), dsrc.get() + off, ddst.get() + off, n);
      ASSERT_TRUE(status.ok()) << status.to_string();
      const std::vector<uint16_t> got = ddst.download(st);
      if (off) EXPECT_EQ(got[0], kPoison);
      size_t bad = 0;
      for (size_t i = off; i < src.size(); ++i) {
        const bool ok =
            std::isnan(src[i]) ? bf16_is_nan(got[i]) : got[i] == ::strata::f32_to_bf16(src[i]);
        if (!ok && bad++ == 0) {
          ADD_FAILURE() << "element " << i << ": " << src[i] << " -> 0x" << std::hex << got[i]
                        << ", host 0x" << ::strata::f32_to_bf16(src[i]);
        }
      }
      EXPECT_EQ(bad, 0u);
    }
  }
}

TEST_F(FusedBf16CudaTest, Bf16ToF32IsExact) {
  const cudaStream_t st = ctx().stream;
  for (size_t off : {0, 1}) {
    std::vector<uint16_t> src(off + 65536);  // every bf16 bit pattern
    for (size_t i = 0; i < 65536; ++i) src[off + i] = static_cast<uint16_t>(i);
    DeviceArray<uint16_t> dsrc(src, st);
    DeviceArray<float> ddst(src.size());
    ddst.poison(st);
    const Status status =
        bf16_to_f32(ctx(), dsrc.get() + off, ddst.get() + off, static_cast<int64_t>(65536));
    ASSERT_TRUE(status.ok()) << status.to_string();
    const std::vector<float> got = ddst.download(st);
    std::vector<float> want(src.size());
    std::memset(want.data(), 0xff, want.size() * sizeof(float));  // the poison
    for (size_t i = off; i < src.size(); ++i) want[i] = ::strata::bf16_to_f32(src[i]);
    EXPECT_TRUE(bits_equal(got, want)) << "offset " << off;
  }
}

TEST_F(FusedBf16CudaTest, FillRandomBf16MatchesHostHash) {
  const cudaStream_t st = ctx().stream;
  const int64_t n = (int64_t{1} << 20) + 3;
  std::vector<uint16_t> first_seed;
  for (uint64_t seed : {uint64_t{0}, uint64_t{42}, uint64_t{0xdeadbeefcafef00d}}) {
    for (float scale : {0.02f, 1.0f}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " scale " + std::to_string(scale));
      DeviceArray<uint16_t> d(static_cast<size_t>(n) + 1);
      d.poison(st);
      const Status status = fill_random_bf16(ctx(), d.get() + 1, n, seed, scale);
      ASSERT_TRUE(status.ok()) << status.to_string();
      const std::vector<uint16_t> got = d.download(st);
      EXPECT_EQ(got[0], kPoison);
      size_t bad = 0;
      double sum = 0.0;
      float lo = scale;
      float hi = -scale;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t want =
            ::strata::f32_to_bf16(random_uniform(seed, static_cast<uint64_t>(i), scale));
        const uint16_t g = got[static_cast<size_t>(i) + 1];
        if (g != want && bad++ == 0) {
          ADD_FAILURE() << "element " << i << ": gpu 0x" << std::hex << g << " host 0x" << want;
        }
        const float v = ::strata::bf16_to_f32(g);
        sum += v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      EXPECT_EQ(bad, 0u);
      // Uniform(-scale, scale): mean ~0 (sigma of the mean: scale / sqrt(3n) ~ 6e-4 scale),
      // range close to the bounds (which bf16 rounding may pass by half an ulp, 2^-9 relative).
      EXPECT_LT(std::fabs(sum / static_cast<double>(n)), 5e-3 * scale);
      EXPECT_GE(lo, -scale * (1.0f + 0x1p-8f));
      EXPECT_LE(hi, scale * (1.0f + 0x1p-8f));
      EXPECT_LT(lo, -0.99f * scale);
      EXPECT_GT(hi, 0.99f * scale);
      if (first_seed.empty()) {
        first_seed = got;
      } else if (scale == 0.02f) {
        EXPECT_NE(got, first_seed) << "another seed gave the same values";
      }
    }
  }
}

// The hash is part of the `--load-format dummy` contract (same weights on every run): pin it.
TEST(FusedBf16CudaHost, RandomHashGoldenValues) {
  EXPECT_EQ(splitmix64(0), 0xe220a8397b1dcdafull);  // the reference splitmix64's first output
  EXPECT_EQ(random_hash(0, 0), 0xa706dd2f4d197e6full);
  EXPECT_EQ(random_hash(42, 7), 0x16062d6c1339e500ull);
  EXPECT_EQ(random_uniform(1, 2, 0.0f), 0.0f);
  for (uint64_t i = 0; i < 1000; ++i) {
    const float u = random_uniform(9, i, 1.0f);
    EXPECT_GE(u, -1.0f);
    EXPECT_LT(u, 1.0f);
  }
}

// ---- CUDA graph capture ----------------------------------------------------------------------

// The fused kernels launched inside a stream capture (no allocation, no sync, no host reads of
// device data), then replayed once: same results as the twins (and as an eager launch).
TEST_F(FusedBf16CudaTest, GraphCaptureAndReplay) {
  const cudaStream_t st = ctx().stream;
  std::mt19937 rng(77);
  const int64_t n = 17;
  const int64_t hidden = 576;
  const int64_t ffn = 1536;
  const int64_t n_heads = 8;
  const int64_t n_kv = 2;
  const int64_t d = 64;
  const int64_t qkv_stride = (n_heads + 2 * n_kv) * d;
  const PagedLayout l = make_layout(n, rng);
  const std::vector<float> x0 = random_floats(static_cast<size_t>(n * hidden), rng, -2, 2);
  const std::vector<float> res = random_floats(x0.size(), rng, -2, 2);
  const std::vector<uint8_t> w = testutil::random_typed(DType::kBF16, hidden, rng, -1.5f, 1.5f);
  const std::vector<float> gu = random_floats(static_cast<size_t>(n * 2 * ffn), rng, -3, 3);
  const std::vector<float> qkv = random_floats(static_cast<size_t>(n * qkv_stride), rng, -2, 2);
  std::vector<float> inv_freq(static_cast<size_t>(d / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / d));
  }
  const size_t cache_n = static_cast<size_t>(l.n_blocks * l.block_size * n_kv * d);

  // CPU twins.
  std::vector<float> x = x0;
  std::vector<uint16_t> norm_out = poisoned(x0.size());
  NormBf16Params norm{.x = x.data(),
                         .x_stride = hidden,
                         .residual = res.data(),
                         .residual_stride = hidden,
                         .weight = w.data(),
                         .weight_dtype = DType::kBF16,
                         .out = norm_out.data(),
                         .out_stride = hidden,
                         .n_tokens = n,
                         .hidden = hidden};
  std::vector<uint16_t> act_out = poisoned(static_cast<size_t>(n * ffn));
  GatedActBf16Params act{.in = gu.data(),
                         .in_stride = 2 * ffn,
                         .out = act_out.data(),
                         .out_stride = ffn,
                         .n_tokens = n,
                         .ffn_dim = ffn};
  std::vector<uint16_t> q = poisoned(static_cast<size_t>(n * n_heads * d));
  std::vector<uint16_t> kc = poisoned(cache_n);
  std::vector<uint16_t> vc = poisoned(cache_n);
  RopeKvAppendParams rope{.qkv = qkv.data(),
                          .qkv_stride = qkv_stride,
                          .q_out = q.data(),
                          .q_out_stride = n_heads * d,
                          .token_seq = l.token_seq.data(),
                          .token_pos = l.token_pos.data(),
                          .n_tokens = n,
                          .n_heads = n_heads,
                          .inv_freq = inv_freq.data(),
                          .rotary_dim = d,
                          .cache = {.k_cache = kc.data(),
                                    .v_cache = vc.data(),
                                    .block_tables = l.block_tables.data(),
                                    .max_blocks_per_seq = l.max_blocks_per_seq,
                                    .n_seqs = l.n_seqs,
                                    .n_blocks = l.n_blocks,
                                    .block_size = l.block_size,
                                    .n_heads_kv = n_kv,
                                    .head_dim = d}};
  ASSERT_TRUE(cpu::norm_bf16(norm).ok());
  ASSERT_TRUE(cpu::gated_act_bf16(act).ok());
  ASSERT_TRUE(cpu::rope_kv_append(rope).ok());

  // Device buffers, allocated before the capture.
  DeviceArray<float> dx(x0.size()), dres(res, st), dgu(gu, st), dqkv(qkv, st), dfreq(inv_freq, st);
  DeviceArray<uint8_t> dw(w, st);
  DeviceArray<int32_t> dseq(l.token_seq, st), dpos(l.token_pos, st), dtables(l.block_tables, st);
  DeviceArray<uint16_t> dnorm(norm_out.size()), dact(act_out.size()), dq(q.size()), dkc(cache_n),
      dvc(cache_n);
  norm.x = dx.get();
  norm.residual = dres.get();
  norm.weight = dw.get();
  norm.out = dnorm.get();
  act.in = dgu.get();
  act.out = dact.get();
  rope.qkv = dqkv.get();
  rope.q_out = dq.get();
  rope.token_seq = dseq.get();
  rope.token_pos = dpos.get();
  rope.inv_freq = dfreq.get();
  rope.cache.k_cache = dkc.get();
  rope.cache.v_cache = dvc.get();
  rope.cache.block_tables = dtables.get();
  // x back to its input (the norm adds the residual into it) and every output poisoned.
  const auto reset = [&] {
    dx.upload(x0, st);
    for (DeviceArray<uint16_t>* a : {&dnorm, &dact, &dq, &dkc, &dvc}) a->poison(st);
    EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  };
  const auto check = [&](const char* what) {
    SCOPED_TRACE(what);
    size_t inexact = 0;
    EXPECT_TRUE(bits_equal(dx.download(st), x));
    EXPECT_TRUE(bf16_match(dnorm.download(st), norm_out, 1, &inexact));
    EXPECT_TRUE(bf16_match(dact.download(st), act_out, 1, &inexact));
    EXPECT_TRUE(bf16_match(dq.download(st), q, 1, &inexact));
    EXPECT_TRUE(bf16_match(dkc.download(st), kc, 1, &inexact));
    EXPECT_TRUE(bf16_match(dvc.download(st), vc, 0, &inexact));
  };

  // Once eagerly: the reference for the replay, and it loads the kernels (lazy module loading)
  // outside the capture.
  reset();
  ASSERT_TRUE(norm_bf16(ctx(), norm).ok());
  ASSERT_TRUE(gated_act_bf16(ctx(), act).ok());
  ASSERT_TRUE(rope_kv_append(ctx(), rope).ok());
  check("eager");

  reset();
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status s1 = norm_bf16(ctx(), norm);
  const Status s2 = gated_act_bf16(ctx(), act);
  const Status s3 = rope_kv_append(ctx(), rope);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_TRUE(s1.ok()) << s1.to_string();
  ASSERT_TRUE(s2.ok()) << s2.to_string();
  ASSERT_TRUE(s3.ok()) << s3.to_string();
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
  check("graph replay");
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
}

// ---- argument checks: no GPU needed, they fail before any CUDA call --------------------------

// Fake pointers: never dereferenced, every call below fails its checks or launches nothing.
float g_fake_f32[4096];
uint16_t g_fake_bf16[4096];
int32_t g_fake_i32[64];

void expect_invalid(const Status& st, const std::string& op, const std::string& word) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_NE(st.message().find(op), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(word), std::string::npos) << st.message();
}

NormBf16Params norm_args() {
  return {.x = g_fake_f32,
          .x_stride = 8,
          .residual = g_fake_f32 + 1024,
          .residual_stride = 8,
          .weight = g_fake_f32 + 2048,
          .out = g_fake_bf16,
          .out_stride = 8,
          .n_tokens = 2,
          .hidden = 8};
}

TEST(FusedBf16CudaArgs, RmsNormBf16) {
  NormBf16Params p = norm_args();
  p.hidden = 0;
  expect_invalid(norm_bf16(LaunchCtx{}, p), "norm_bf16", "hidden");
  p = norm_args();
  p.n_tokens = -1;
  expect_invalid(norm_bf16(LaunchCtx{}, p), "norm_bf16", "n_tokens");
  p = norm_args();
  p.x_stride = 7;
  expect_invalid(norm_bf16(LaunchCtx{}, p), "norm_bf16", "x row stride");
  p = norm_args();
  p.residual_stride = 7;
  expect_invalid(norm_bf16(LaunchCtx{}, p), "norm_bf16", "residual row stride");
  p = norm_args();
  p.out_stride = 7;
  expect_invalid(norm_bf16(LaunchCtx{}, p), "norm_bf16", "out row stride");
  p = norm_args();
  p.weight = nullptr;
  expect_invalid(norm_bf16(LaunchCtx{}, p), "norm_bf16", "weight");
  p = norm_args();
  p.x = nullptr;
  expect_invalid(norm_bf16(LaunchCtx{}, p), "norm_bf16", "null x");
  p = norm_args();
  p.out = reinterpret_cast<uint16_t*>(g_fake_f32 + 4);  // inside x's rows
  expect_invalid(norm_bf16(LaunchCtx{}, p), "norm_bf16", "overlaps");
  p = norm_args();
  p.weight_dtype = DType::kFP8E4M3;
  const Status st = norm_bf16(LaunchCtx{}, p);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("norm_bf16 weight"), std::string::npos) << st.message();
  p = norm_args();
  p.n_tokens = 0;
  p.x = nullptr;
  p.out = nullptr;
  p.weight = nullptr;
  EXPECT_TRUE(norm_bf16(LaunchCtx{}, p).ok());
}

GatedActBf16Params act_args() {
  return {.in = g_fake_f32,
          .in_stride = 16,
          .out = g_fake_bf16,
          .out_stride = 8,
          .n_tokens = 2,
          .ffn_dim = 8};
}

TEST(FusedBf16CudaArgs, GatedActBf16) {
  GatedActBf16Params p = act_args();
  p.ffn_dim = 0;
  expect_invalid(gated_act_bf16(LaunchCtx{}, p), "gated_act_bf16", "ffn_dim");
  p = act_args();
  p.in_stride = 15;
  expect_invalid(gated_act_bf16(LaunchCtx{}, p), "gated_act_bf16", "in row stride");
  p = act_args();
  p.out_stride = 7;
  expect_invalid(gated_act_bf16(LaunchCtx{}, p), "gated_act_bf16", "out row stride");
  p = act_args();
  p.in = nullptr;
  expect_invalid(gated_act_bf16(LaunchCtx{}, p), "gated_act_bf16", "null in");
  p = act_args();
  p.out = reinterpret_cast<uint16_t*>(g_fake_f32 + 8);
  expect_invalid(gated_act_bf16(LaunchCtx{}, p), "gated_act_bf16", "overlaps");
  p = act_args();
  p.act = static_cast<Activation>(42);
  expect_invalid(gated_act_bf16(LaunchCtx{}, p), "gated_act_bf16", "activation");
  p = act_args();
  p.n_tokens = 0;
  p.in = nullptr;
  p.out = nullptr;
  EXPECT_TRUE(gated_act_bf16(LaunchCtx{}, p).ok());
}

RopeKvAppendParams rope_args() {
  return {.qkv = g_fake_f32,
          .qkv_stride = 4 * 8,  // 2 q heads, 1 kv head of 8
          .q_out = g_fake_bf16,
          .q_out_stride = 16,
          .token_seq = g_fake_i32,
          .token_pos = g_fake_i32 + 8,
          .n_tokens = 2,
          .n_heads = 2,
          .inv_freq = g_fake_f32 + 1024,
          .rotary_dim = 8,
          .cache = {.k_cache = g_fake_bf16 + 1024,
                    .v_cache = g_fake_bf16 + 2048,
                    .block_tables = g_fake_i32 + 16,
                    .max_blocks_per_seq = 2,
                    .n_seqs = 2,
                    .n_blocks = 4,
                    .block_size = 16,
                    .n_heads_kv = 1,
                    .head_dim = 8}};
}

TEST(FusedBf16CudaArgs, RopeKvAppend) {
  const std::string op = "rope_kv_append";
  RopeKvAppendParams p = rope_args();
  for (int64_t rot : {-2, 7, 10}) {
    p.rotary_dim = rot;
    expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "rotary_dim");
  }
  p = rope_args();
  p.qkv_stride = 31;
  expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "qkv_stride");
  p = rope_args();
  p.q_out_stride = 15;
  expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "q_out_stride");
  p = rope_args();
  p.n_heads = 0;
  expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "n_heads");
  p = rope_args();
  p.n_tokens = -3;
  expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "n_tokens");
  p = rope_args();
  p.inv_freq = nullptr;
  expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "inv_freq");
  p = rope_args();
  p.token_pos = nullptr;
  expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "token_pos");
  p = rope_args();
  p.cache.block_size = 0;
  expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "block_size");
  p = rope_args();
  p.cache.v_cache = nullptr;
  expect_invalid(rope_kv_append(LaunchCtx{}, p), op, "v_cache");
  // Nothing to do: fine without a GPU, and without inv_freq when nothing rotates.
  p = rope_args();
  p.n_tokens = 0;
  p.qkv = nullptr;
  p.q_out = nullptr;
  EXPECT_TRUE(rope_kv_append(LaunchCtx{}, p).ok());
  p.rotary_dim = 0;
  p.inv_freq = nullptr;
  EXPECT_TRUE(rope_kv_append(LaunchCtx{}, p).ok());
}

TEST(FusedBf16CudaArgs, Conversions) {
  expect_invalid(f32_to_bf16(LaunchCtx{}, g_fake_f32, g_fake_bf16, -1), "f32_to_bf16", "n -1");
  expect_invalid(f32_to_bf16(LaunchCtx{}, nullptr, g_fake_bf16, 4), "f32_to_bf16", "null");
  expect_invalid(bf16_to_f32(LaunchCtx{}, g_fake_bf16, nullptr, 4), "bf16_to_f32", "null");
  expect_invalid(bf16_to_f32(LaunchCtx{}, g_fake_bf16, g_fake_f32, -5), "bf16_to_f32", "n -5");
  expect_invalid(fill_random_bf16(LaunchCtx{}, nullptr, 4, 1, 1.0f), "fill_random_bf16", "dst");
  expect_invalid(fill_random_bf16(LaunchCtx{}, g_fake_bf16, -1, 1, 1.0f), "fill_random_bf16",
                 "n -1");
  expect_invalid(fill_random_bf16(LaunchCtx{}, g_fake_bf16, 4, 1, std::nanf("")),
                 "fill_random_bf16", "scale");
  EXPECT_TRUE(f32_to_bf16(LaunchCtx{}, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(bf16_to_f32(LaunchCtx{}, nullptr, nullptr, 0).ok());
  EXPECT_TRUE(fill_random_bf16(LaunchCtx{}, nullptr, 0, 1, 1.0f).ok());
}

}  // namespace
}  // namespace strata::cuda
