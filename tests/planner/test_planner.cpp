// The planner's cost model against numbers it did not produce: seed 003's Table 2 (MFU and
// latency of PaLM 540B on 64 TPU v4) and Table 1 (context limits), and strata's own H100
// measurements (tests/planner/data/*.json, each entry naming its source).
#include <gtest/gtest.h>
#include <array>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "planner/planner.h"
#include "strata/plan.h"

namespace strata::planner {
namespace {

using nlohmann::json;

const std::string kDataDir = std::string(STRATA_FIXTURE_DIR) + "/../planner/data";

json read_json(const std::string& name) {
  std::ifstream in(kDataDir + "/" + name);
  EXPECT_TRUE(in.good()) << kDataDir << "/" << name;
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

FfnLayout parse_ffn(const std::string& s) {
  if (s == "1D-WS") return FfnLayout::k1DWeightStationary;
  if (s == "2D-WS") return FfnLayout::k2DWeightStationary;
  if (s == "WG-X") return FfnLayout::kWeightGatheredX;
  if (s == "WG-XY") return FfnLayout::kWeightGatheredXY;
  EXPECT_EQ(s, "WG-XYZ");
  return FfnLayout::kWeightGatheredXYZ;
}

template <class T>
T value(Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(*r);
}

// ---- seed 003 ----------------------------------------------------------------------------

TEST(Seed003, Table2MfuAccounting) {
  const json seed = read_json("seed003_palm540b.json");
  const ModelShape palm = value(model_shape_preset(seed["model"]));
  const HardwareProfile tpu = value(load_hardware_profile(seed["profile"]));
  // PaLM 540B: 540.35B parameters from the published shapes.
  EXPECT_NEAR(palm.n_params() / 1e9, 540.35, 0.1);
  for (const json& row : seed["table2"]) {
    const double tokens =
        row["batch"].get<double>() *
        (row["phase"] == "prefill" ? row["prompt"].get<double>() : row["gen"].get<double>());
    const double mfu =
        model_flops_utilization(palm, tpu, tokens, row["seconds"].get<double>(), seed["chips"]);
    // The reported latencies have 2-3 significant digits and the MFU is rounded to a percent.
    EXPECT_NEAR(mfu, row["mfu"].get<double>(), 0.01) << row["name"];
  }
}

TEST(Seed003, Table2LatencyWithTheSeedsLayouts) {
  const json seed = read_json("seed003_palm540b.json");
  const ModelShape padded = value(model_shape_preset(seed["padded_model"]));
  const ModelShape palm = value(model_shape_preset(seed["model"]));
  const HardwareProfile tpu = value(load_hardware_profile(seed["profile"]));
  for (const json& row : seed["table2"]) {
    Layout l;
    l.tp = seed["chips"];
    l.ffn = parse_ffn(row["ffn"]);
    l.attention =
        row["attention"] == "batch-sharded" ? AttentionSharding::kBatch : AttentionSharding::kHeads;
    l.block = BlockKind::kParallel;
    PhaseWorkload w;
    w.phase = row["phase"] == "prefill" ? Phase::kPrefill : Phase::kDecode;
    w.batch = row["batch"];
    w.prompt = row["prompt"];
    w.gen = row["gen"];
    w.weights = value(parse_weight_format(row["weights"]));
    const Estimate e = value(estimate(padded, tpu, l, w));
    const double reported = row["seconds"];
    const double err = e.seconds / reported - 1.0;
    const double mfu = model_flops_utilization(palm, tpu, e.tokens, e.seconds, l.tp);
    std::printf(
        "%-24s %-34s predicted %8.3f s, reported %6.2f s (%+5.1f%%), MFU %4.1f%% vs %2.0f%%, "
        "%s-bound (c %.3f m %.3f comm %.3f s), %.1f GB/chip\n",
        row["name"].get<std::string>().c_str(), l.name().c_str(), e.seconds, reported, 100 * err,
        100 * mfu, 100 * row["mfu"].get<double>(), bottleneck_name(e.bottleneck),
        e.compute_s * (e.seconds / e.step_seconds), e.memory_s * (e.seconds / e.step_seconds),
        e.comm_s * (e.seconds / e.step_seconds), e.memory_per_device / 1e9);
    EXPECT_LE(std::fabs(err), 0.20) << row["name"];
    EXPECT_TRUE(e.fits) << row["name"] << ": " << e.memory_per_device / 1e9 << " GB per chip";
  }
}

TEST(Seed003, Table1ContextLimitsFromTheMemoryModel) {
  const json seed = read_json("seed003_palm540b.json");
  const ModelShape palm = value(model_shape_preset(seed["model"]));
  const HardwareProfile tpu = value(load_hardware_profile(seed["profile"]));
  const double kv_fraction = seed["table1"]["kv_fraction"];
  for (const json& row : seed["table1"]["rows"]) {
    ModelShape s = palm;
    s.n_heads_kv = row["n_heads_kv"];
    s.head_dim = row["head_dim"];
    const AttentionSharding a =
        row["attention"] == "batch-sharded" ? AttentionSharding::kBatch : AttentionSharding::kHeads;
    const double ctx = max_context(s, tpu, a, seed["chips"], row["batch"], kv_fraction);
    const double reported = row["max_context"];
    EXPECT_NEAR(ctx / reported, 1.0, 0.03)
        << row["variant"] << " batch " << row["batch"] << ": " << ctx << " vs " << reported;
  }
}

// The layout choices the seed reports (Sections 3.2-3.3, Figures 6-7) come out of the search.
TEST(Seed003, SearchPicksThePhaseLayouts) {
  const ModelShape palm = value(model_shape_preset("palm-540b-padded"));
  const HardwareProfile tpu = value(load_hardware_profile("tpu-v4"));
  PhaseWorkload big_prefill{Phase::kPrefill, 512, 2048, 0, WeightFormat::kBF16};
  auto ranked = value(rank_layouts(palm, tpu, 64, big_prefill, {}));
  ASSERT_FALSE(ranked.empty());
  const FfnLayout top = ranked.front().layout.ffn;
  EXPECT_TRUE(top == FfnLayout::kWeightGatheredXYZ || top == FfnLayout::kWeightGatheredXY ||
              top == FfnLayout::kWeightGatheredX)
      << ranked.front().layout.name();

  PhaseWorkload decode{Phase::kDecode, 64, 2048, 64, WeightFormat::kInt8};
  ranked = value(rank_layouts(palm, tpu, 64, decode, {}));
  ASSERT_FALSE(ranked.empty());
  EXPECT_EQ(ranked.front().layout.attention, AttentionSharding::kBatch)
      << ranked.front().layout.name();
  EXPECT_EQ(ranked.front().layout.ffn, FfnLayout::k2DWeightStationary)
      << ranked.front().layout.name();
  EXPECT_TRUE(ranked.front().estimate.fits);

  // Figure 6: 1D weight-stationary communication stays flat as chips grow (2BLE / bw) while 2D
  // shrinks with sqrt(n), so at 256 chips 2D communicates less than 1D.
  // The bandwidth terms, as in Appendix A (per-hop latency grows with the chips on a torus).
  HardwareProfile tpu_bw = tpu;
  tpu_bw.collective_latency_s = 1e-12;
  PhaseWorkload d512{Phase::kDecode, 512, 2048, 64, WeightFormat::kBF16};
  auto comm = [&](int64_t chips, FfnLayout ffn) {
    Layout l{chips, 1, 1, 1, ffn, AttentionSharding::kBatch, BlockKind::kParallel};
    return value(estimate(palm, tpu_bw, l, d512));
  };
  const Estimate one_d_64 = comm(64, FfnLayout::k1DWeightStationary);
  const Estimate one_d_256 = comm(256, FfnLayout::k1DWeightStationary);
  const Estimate two_d_64 = comm(64, FfnLayout::k2DWeightStationary);
  const Estimate two_d_256 = comm(256, FfnLayout::k2DWeightStationary);
  EXPECT_GT(one_d_256.comm_s, 0.95 * one_d_64.comm_s);
  EXPECT_LT(two_d_256.comm_s, 0.9 * two_d_64.comm_s);
  EXPECT_LT(two_d_256.comm_s, one_d_256.comm_s);
  EXPECT_EQ(two_d_256.x * two_d_256.yz, 256);
  EXPECT_GT(two_d_256.x, 1);
}

// Section 4.3: the serial block makes decode at batch 512 on 64 chips ~14% slower than the
// parallel block (one more exchange of activations per layer).
TEST(Seed003, SerialBlockCostsDecodeLatency) {
  const ModelShape parallel = value(model_shape_preset("palm-540b-padded"));
  ModelShape serial = parallel;
  serial.parallel_block = false;
  const HardwareProfile tpu = value(load_hardware_profile("tpu-v4"));
  PhaseWorkload w{Phase::kDecode, 512, 2048, 64, WeightFormat::kBF16};
  Layout lp{
      64, 1, 1, 1, FfnLayout::k2DWeightStationary, AttentionSharding::kBatch, BlockKind::kParallel};
  Layout ls = lp;
  ls.block = BlockKind::kSerial;
  const double slower =
      value(estimate(serial, tpu, ls, w)).seconds / value(estimate(parallel, tpu, lp, w)).seconds;
  std::printf("serial / parallel block, decode batch 512 on 64 chips: %.3f (seed: ~1.14)\n",
              slower);
  EXPECT_GT(slower, 1.05);
  EXPECT_LT(slower, 1.25);
}

// Appendix A.2.1: with F = 4E the 2D layout's communication is smallest at X = sqrt(n) / 2.
TEST(Seed003, TwoDSplitIsHalfRootN) {
  ModelShape s;
  s.name = "ffn-only";
  s.n_layers = 1;
  s.hidden = 8192;
  s.ffn_dim = 4 * 8192;
  s.n_heads = 1;
  s.n_heads_kv = 1;
  s.head_dim = 1;  // attention negligible: the FFN's communication alone
  s.vocab = 1;
  s.gated_mlp = false;
  s.parallel_block = true;
  HardwareProfile hw = value(load_hardware_profile("tpu-v4"));
  hw.collective_latency_s = 1e-12;  // bandwidth terms only, as in the appendix
  for (int64_t n : {16, 64, 256}) {
    Layout l{n,
             1,
             1,
             1,
             FfnLayout::k2DWeightStationary,
             AttentionSharding::kHeads,
             BlockKind::kParallel};
    const Estimate e = value(estimate(s, hw, l, {Phase::kPrefill, 8, 2048, 0}));
    EXPECT_EQ(e.x * e.x * 4, n) << "n = " << n;
  }
}

// ---- the cost model's own terms -------------------------------------------------------------

TEST(CostModel, PipelineBubbleAndExpertsAndStreaming) {
  const HardwareProfile h100 = value(load_hardware_profile("h100"));
  const ModelShape llama70 = value(model_shape_preset("llama3-70b"));
  PhaseWorkload decode{Phase::kDecode, 1, 512, 16, WeightFormat::kBF16};
  Layout pp{1, 4};
  const Estimate e = value(estimate(llama70, h100, pp, decode));
  // One sequence cannot fill a 4-stage pipeline: 3 of 4 slots are bubble.
  EXPECT_NEAR(e.bubble_fraction, 0.75, 1e-9);
  // Four sequences decode as seed 000's generation schedule: four steps in flight, one per
  // stage, and no stage waits; the step takes four stage times.
  PhaseWorkload decode4 = decode;
  decode4.batch = 4;
  const Estimate e4 = value(estimate(llama70, h100, pp, decode4));
  EXPECT_NEAR(e4.bubble_fraction, 0.0, 1e-9);
  EXPECT_NEAR(e4.step_seconds / e.step_seconds, 1.0, 0.05);  // weight-bound: 4 ~ 1 sequence
  // A prefill pass is cut as the engine cuts it (runtime/pipeline_schedule.cpp: chunks of at
  // least 256 tokens, at most 4 per stage): 2,048 prompt tokens are 8 micro-batches, which fill
  // and drain the 4 stages: 3 of 11 slots idle.
  PhaseWorkload prefill4{Phase::kPrefill, 4, 512, 0, WeightFormat::kBF16};
  const Estimate p4 = value(estimate(llama70, h100, pp, prefill4));
  EXPECT_NEAR(p4.bubble_fraction, 3.0 / 11.0, 1e-9);
  // 256 tokens are one micro-batch: 3 of 4 slots idle.
  PhaseWorkload prefill1{Phase::kPrefill, 1, 256, 0, WeightFormat::kBF16};
  EXPECT_NEAR(value(estimate(llama70, h100, pp, prefill1)).bubble_fraction, 0.75, 1e-9);

  // Experts touched per step grow with the batch and saturate at n_experts.
  const ModelShape moe = value(model_shape_preset("mixtral-8x7b"));
  PhaseWorkload one{Phase::kDecode, 1, 256, 8, WeightFormat::kBF16};
  PhaseWorkload many{Phase::kDecode, 64, 256, 8, WeightFormat::kBF16};
  Layout l{2};
  const Estimate m1 = value(estimate(moe, h100, l, one));
  const Estimate m64 = value(estimate(moe, h100, l, many));
  // Batch 1 reads 2 of 8 experts; batch 64 reads nearly all 8, so weight streaming time
  // grows by close to 4x in the expert part (the attention part is shared).
  EXPECT_GT(m64.memory_s / m1.memory_s, 2.0);
  EXPECT_LT(moe.n_active_params(), 0.35 * moe.n_params());

  // Host-streamed weights are bound by the host link: 70B bf16 over ~48 GB/s is ~3 s a step.
  Layout host{1};
  host.residency = WeightResidency::kHostStreamed;
  const Estimate hs = value(estimate(llama70, h100, host, decode));
  EXPECT_EQ(hs.bottleneck, Bottleneck::kHostLink);
  const double expected = llama70.n_layers * llama70.layer_weights() * 2.0 / (54e9 * 0.9);
  EXPECT_NEAR(hs.step_seconds / expected, 1.0, 0.05);
  EXPECT_LT(hs.weight_bytes_per_device, 0.1 * llama70.n_params() * 2.0);
}

// Ranks sharing one device (strata's in-process --tp / --pp / --ep on one GPU): the device does
// the whole model's work; the layout adds its collectives and the stages' hand-offs.
TEST(CostModel, RanksSharingOneDevice) {
  HardwareProfile hw = value(load_hardware_profile("h100"));
  hw.shared_collective_fixed_s = 10e-6;
  hw.shared_collective_Bps = 100e9;
  const ModelShape llama8 = value(model_shape_preset("llama3-8b"));
  const PhaseWorkload decode{Phase::kDecode, 16, 256, 32, WeightFormat::kBF16};
  const Estimate one = value(estimate(llama8, hw, Layout{1}, decode));
  Layout tp2{2};
  tp2.shared_device = true;
  const Estimate t = value(estimate(llama8, hw, tp2, decode));
  const double E = static_cast<double>(llama8.hidden), V = static_cast<double>(llama8.vocab);
  const double expected =
      2.0 * static_cast<double>(llama8.n_layers) * (10e-6 + 16.0 * E * 4.0 / 100e9) +
      (10e-6 + 16.0 * V * 4.0 / 2.0 / 100e9);
  EXPECT_NEAR(t.step_seconds - one.step_seconds, expected, 1e-9);
  EXPECT_DOUBLE_EQ(t.memory_per_device, one.memory_per_device);  // the whole model on the device
  EXPECT_NE(tp2.name().find("one-device"), std::string::npos);

  // Two stages on the device: a 2,048-token prompt runs as 8 micro-batches of 256 one after
  // another, each handing 256 f32 rows to the next stage through host memory (D2H + H2D).
  Layout pp2{1, 2};
  pp2.shared_device = true;
  const PhaseWorkload prefill{Phase::kPrefill, 1, 2048, 0, WeightFormat::kBF16};
  const PhaseWorkload chunk{Phase::kPrefill, 1, 256, 0, WeightFormat::kBF16};
  const double handoff = 2.0 * 256.0 * E * 4.0 / (hw.host_to_device_Bps * hw.host_link_efficiency);
  const Estimate p = value(estimate(llama8, hw, pp2, prefill));
  EXPECT_NEAR(p.step_seconds,
              8.0 * (value(estimate(llama8, hw, Layout{1}, chunk)).step_seconds + handoff), 1e-9);
  EXPECT_DOUBLE_EQ(p.tokens, 2048.0);
  EXPECT_DOUBLE_EQ(p.bubble_fraction, 0.0);
}

// The profile's measured MoE blocks (plan --calibrate's moe_block_probes) add, per MoE layer,
// what they spent beyond this model's price of their expert GEMMs: a least-squares line over
// the experts they touched. Two profiles whose probes differ by a + b x touched predict MoE
// steps that differ by exactly a + b x (the layer's experts touched) per layer.
TEST(CostModel, MoeBlockProbesPriceTheOverheadPerExpertTouched) {
  const HardwareProfile h100 = value(load_hardware_profile("h100"));
  auto touched = [](double X, double k, double T) { return X * (1.0 - std::pow(1.0 - k / X, T)); };
  HardwareProfile base = h100, more = h100;
  for (const auto& [X, k, H, F] :
       {std::array<int64_t, 4>{128, 8, 2048, 768}, std::array<int64_t, 4>{8, 2, 4096, 14336}}) {
    for (int64_t T : {1, 8, 64}) {
      const double u =
          touched(static_cast<double>(X), static_cast<double>(k), static_cast<double>(T));
      HardwareProfile::MoeBlockProbe p{X, k, H, F, T, 10e-3 + 1e-3 * u};
      base.moe_block_probes.push_back(p);
      p.seconds += 30e-6 + 4e-6 * u;
      more.moe_block_probes.push_back(p);
    }
  }
  const ModelShape mixtral = value(model_shape_preset("mixtral-8x7b"));
  const PhaseWorkload decode{Phase::kDecode, 4, 256, 8, WeightFormat::kBF16};
  const Estimate a = value(estimate(mixtral, base, Layout{1}, decode));
  const Estimate b = value(estimate(mixtral, more, Layout{1}, decode));
  const double per_layer = 30e-6 + 4e-6 * touched(8, 2, 4);
  EXPECT_NEAR(b.step_seconds - a.step_seconds, static_cast<double>(mixtral.n_layers) * per_layer,
              1e-9);
  // Without probes there is no such term: the base profile's is large (10 ms a layer).
  const Estimate none = value(estimate(mixtral, h100, Layout{1}, decode));
  EXPECT_GT(a.step_seconds - none.step_seconds, static_cast<double>(mixtral.n_layers) * 1e-3);
  // A dense model has no MoE layer to price.
  const ModelShape llama8 = value(model_shape_preset("llama3-8b"));
  EXPECT_DOUBLE_EQ(value(estimate(llama8, more, Layout{1}, decode)).step_seconds,
                   value(estimate(llama8, h100, Layout{1}, decode)).step_seconds);
  // Each weight format is priced from its own probes, bf16's when it has none. int8 probes
  // faster than any GEMM pricing leave little int8 overhead (the fit is clamped at zero), where
  // without them int8 steps took bf16's ~10 ms a layer; bf16 steps keep bf16's probes.
  PhaseWorkload decode8 = decode;
  decode8.weights = WeightFormat::kInt8;
  const double bf16_probes = value(estimate(mixtral, base, Layout{1}, decode8)).step_seconds;
  HardwareProfile int8_zero = base;
  for (const auto& p : base.moe_block_probes) {
    HardwareProfile::MoeBlockProbe q = p;
    q.weights = WeightFormat::kInt8;
    q.seconds = 1e-9;
    int8_zero.moe_block_probes.push_back(q);
  }
  const double own = value(estimate(mixtral, int8_zero, Layout{1}, decode8)).step_seconds;
  EXPECT_GT(bf16_probes - own, static_cast<double>(mixtral.n_layers) * 5e-3);
  EXPECT_DOUBLE_EQ(value(estimate(mixtral, int8_zero, Layout{1}, decode)).step_seconds,
                   a.step_seconds);
}

// The decode attention probes (the engine's RoPE + KV append and flash decode of one layer):
// what the KV read at the profile's HBM rate does not explain, a + b x sequences, is added to
// each layer of a decode step, and nothing to prefill.
TEST(CostModel, DecodeAttentionProbesPriceTheFixedCost) {
  const HardwareProfile h100 = value(load_hardware_profile("h100"));
  HardwareProfile probed = h100;
  const double a = 20e-6, b = 0.5e-6;
  for (int64_t kv : {256, 2048}) {
    for (int64_t seqs : {1, 16, 64}) {
      const double bytes = static_cast<double>(seqs * kv) * 2.0 * 8 * 128 * 2.0;
      probed.decode_attention_probes.push_back(
          {seqs, kv, 8, 128,
           bytes / (h100.hbm_read_Bps * h100.memory_efficiency) + a +
               b * static_cast<double>(seqs)});
    }
  }
  const ModelShape llama = value(model_shape_preset("llama3-8b"));
  for (int64_t batch : {1, 16}) {
    const PhaseWorkload decode{Phase::kDecode, batch, 256, 8, WeightFormat::kBF16};
    const double with = value(estimate(llama, probed, Layout{1}, decode)).step_seconds;
    const double without = value(estimate(llama, h100, Layout{1}, decode)).step_seconds;
    EXPECT_NEAR(with - without,
                static_cast<double>(llama.n_layers) * (a + b * static_cast<double>(batch)), 1e-9)
        << batch;
  }
  const PhaseWorkload prefill{Phase::kPrefill, 1, 512, 0, WeightFormat::kBF16};
  EXPECT_DOUBLE_EQ(value(estimate(llama, probed, Layout{1}, prefill)).seconds,
                   value(estimate(llama, h100, Layout{1}, prefill)).seconds);
  // Parsed from a profile, with one-line errors.
  const std::string base =
      R"({"memory_GB": 80, "peak_tflops": {"bf16": 100}, "hbm_read_GBps": 1000,
          "host_to_device_GBps": 10, "interconnect": {"topology": "switch", "bandwidth_GBps": 100,
          "latency_us": 2}, "decode_attention_probes": )";
  auto good = parse_hardware_profile(
      base + R"([{"seqs": 1, "kv_len": 256, "kv_heads": 8, "head_dim": 128, "us": 12.5}]})",
      "d.json");
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  ASSERT_EQ(good->decode_attention_probes.size(), 1u);
  EXPECT_DOUBLE_EQ(good->decode_attention_probes[0].seconds, 12.5e-6);
  for (const char* bad :
       {R"({})", R"([{"seqs": 1}])",
        R"([{"seqs": 0, "kv_len": 256, "kv_heads": 8, "head_dim": 128, "us": 1}])",
        R"([{"seqs": 1, "kv_len": 256, "kv_heads": 8, "head_dim": 128, "us": -1}])"}) {
    auto r = parse_hardware_profile(base + bad + "}", "d.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("d.json: field 'decode_attention_probes'"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(CostModel, BadInputIsAnError) {
  const HardwareProfile h100 = value(load_hardware_profile("h100"));
  const ModelShape llama = value(model_shape_preset("llama3-8b"));
  Layout l;
  l.block = BlockKind::kParallel;
  EXPECT_FALSE(estimate(llama, h100, l, {Phase::kPrefill, 1, 128, 0}).ok());
  EXPECT_FALSE(estimate(llama, h100, Layout{1}, {Phase::kDecode, 1, 128, 0}).ok());
  Layout ep{1, 1, 2};
  EXPECT_FALSE(estimate(llama, h100, ep, {Phase::kPrefill, 1, 128, 0}).ok());
  EXPECT_FALSE(load_hardware_profile("no-such-profile").ok());
  EXPECT_FALSE(parse_hardware_profile("{\"name\": \"x\"}", "x.json").ok());
  EXPECT_FALSE(parse_hardware_profile("not json", "x.json").ok());
  auto missing_bw = parse_hardware_profile(
      R"({"memory_GB": 80, "peak_tflops": {"bf16": 100}, "hbm_read_GBps": 1000,
          "host_to_device_GBps": 10, "interconnect": {"latency_us": 5}})",
      "p.json");
  ASSERT_FALSE(missing_bw.ok());
  EXPECT_NE(missing_bw.status().message().find("bandwidth_GBps"), std::string::npos);
  // A field of the wrong JSON type is an error naming the file, not an exception (the fuzzer's
  // first find), and a bad moe_exchange names the field.
  const std::string base = R"({"memory_GB": 80, "peak_tflops": {"bf16": 100}, "hbm_read_GBps":
      1000, "host_to_device_GBps": 10, "interconnect": {"topology": )";
  auto wrong_type = parse_hardware_profile(base + "5}}", "t.json");
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_NE(wrong_type.status().message().find("t.json"), std::string::npos);
  EXPECT_EQ(wrong_type.status().message().find('\n'), std::string::npos);
  auto bad_moe = parse_hardware_profile(
      base + R"("switch", "bandwidth_GBps": 100, "latency_us": 2}, "moe_exchange": {"GBps": 0}})",
      "m.json");
  ASSERT_FALSE(bad_moe.ok());
  EXPECT_NE(bad_moe.status().message().find("moe_exchange"), std::string::npos);
  auto bad_shared =
      parse_hardware_profile(base + R"("switch", "bandwidth_GBps": 100, "latency_us": 2}, )"
                                    R"("shared_device_collective": {"fixed_us": -1, "GBps": 10}})",
                             "t.json");
  ASSERT_FALSE(bad_shared.ok());
  EXPECT_NE(bad_shared.status().message().find("shared_device_collective"), std::string::npos);
  auto bad_fused = parse_hardware_profile(
      base + R"("switch", "bandwidth_GBps": 100, "latency_us": 2}, "fused_elementwise": 1})",
      "t.json");
  ASSERT_FALSE(bad_fused.ok());
  EXPECT_NE(bad_fused.status().message().find("fused_elementwise"), std::string::npos);
  const std::string ic = R"("switch", "bandwidth_GBps": 100, "latency_us": 2}, )";
  auto bad_paper = parse_hardware_profile(base + ic + R"("paper_layouts": "yes"})", "t.json");
  ASSERT_FALSE(bad_paper.ok());
  EXPECT_NE(bad_paper.status().message().find("paper_layouts"), std::string::npos);
  for (const char* probes :
       {R"([])", R"({"1": {}})", R"({"x2": {}})", R"({"99999": {}})", R"({"2": []})",
        R"({"2": {"all_reduce_nccl_us": [[1024, 5], [512, 6]]}})",
        R"({"2": {"all_gather_nccl_us": [[1024, 0]]}})",
        R"({"2": {"all_reduce_nccl_us": [[1024]]}})", R"({"2\n": {}})"}) {
    auto r =
        parse_hardware_profile(base + ic + R"("collective_probes": )" + probes + "}", "c.json");
    ASSERT_FALSE(r.ok()) << probes;
    EXPECT_NE(r.status().message().find("c.json: collective_probes"), std::string::npos)
        << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos) << r.status().message();
  }
  auto good = parse_hardware_profile(
      base + ic +
          R"("collective_probes": {"4": {"all_reduce_nccl_us": [[1024, 10], [1048576, 30]],)"
          R"( "all_gather_nccl_us": [[1024, 8]], "all_reduce_oneshot_us": [[1024, 6]]}}})",
      "c.json");
  ASSERT_TRUE(good.ok()) << good.status().to_string();
  ASSERT_EQ(good->nccl_curves.count(4), 1u);
  EXPECT_EQ(good->nccl_curves.at(4).all_reduce.size(), 2u);
  EXPECT_DOUBLE_EQ(good->nccl_curves.at(4).all_gather[0].second, 8e-6);
  for (
      const char* probes :
      {R"([{"experts": 8, "k": 9, "hidden": 64, "ffn": 64, "tokens": 1, "us": 5}])",
       R"([{"experts": 8, "k": 2, "hidden": 64, "ffn": 64, "tokens": 1, "us": 5, "weights": 8}])",
       R"([{"experts": 8, "k": 2, "hidden": 64, "ffn": 64, "tokens": 1, "us": 5, "weights": "q4"}])",
       R"([{"experts": 8, "k": 2, "hidden": 64, "ffn": 64, "tokens": 1, "us": 0}])",
       R"([{"experts": 8, "k": 2, "hidden": 64.5, "ffn": 64, "tokens": 1, "us": 5}])",
       R"({"experts": 8})"}) {
    auto bad_probe = parse_hardware_profile(
        base + R"("switch", "bandwidth_GBps": 100, "latency_us": 2}, "moe_block_probes": )" +
            probes + "}",
        "t.json");
    ASSERT_FALSE(bad_probe.ok()) << probes;
    EXPECT_NE(bad_probe.status().message().find("moe_block_probes"), std::string::npos);
  }
  // A key with a newline in it (fuzz_hw_profile): the message stays on one line.
  auto odd_key = parse_hardware_profile(
      R"({"memory_GB": 80, "peak_tflops": {"bf16": 100, "i\n_link": 1}})", "k.json");
  ASSERT_FALSE(odd_key.ok());
  EXPECT_NE(odd_key.status().message().find("k.json: peak_tflops: unknown weight format 'i\\x0a"),
            std::string::npos)
      << odd_key.status().message();
  EXPECT_EQ(odd_key.status().message().find('\n'), std::string::npos);
  // An unknown topology with a newline in it (fuzz_hw_profile): named, on one line.
  auto odd_topo = parse_hardware_profile(
      R"({"memory_GB": 80, "peak_tflops": {"bf16": 100}, "hbm_read_GBps": 1000,
          "host_to_device_GBps": 10, "interconnect": {"topology": "sy\nah"}})",
      "k.json");
  ASSERT_FALSE(odd_topo.ok());
  EXPECT_NE(odd_topo.status().message().find("k.json: interconnect.topology 'sy\\x0aah'"),
            std::string::npos)
      << odd_topo.status().message();
  EXPECT_EQ(odd_topo.status().message().find('\n'), std::string::npos);
  EXPECT_FALSE(model_shape_preset("no-such-model").ok());
  const HardwareProfile a100 = value(load_hardware_profile("a100"));
  EXPECT_FALSE(
      estimate(llama, a100, Layout{}, {Phase::kPrefill, 1, 128, 0, WeightFormat::kFp8}).ok());
}

TEST(CostModel, EveryShippedProfileLoads) {
  for (const std::string& name : shipped_profile_names()) {
    auto p = load_hardware_profile(name);
    ASSERT_TRUE(p.ok()) << name << ": " << p.status().to_string();
    EXPECT_FALSE(p->source.empty()) << name;
  }
  EXPECT_GE(shipped_profile_names().size(), 4u);
}

// ---- strata on one H100 -----------------------------------------------------------------

struct Prediction {
  std::string id;
  double measured = 0, predicted = 0;
  bool higher_is_better = false;
};

// Predictions for a validation set's configurations on `hw`; a configuration's layout is its
// "tp" / "pp" / "ep" fields (one device when absent).
std::vector<Prediction> predict(const json& data, const HardwareProfile& hw) {
  std::vector<Prediction> out;
  for (const json& c : data["configurations"]) {
    const ModelShape s = value(model_shape_preset(c["model"]));
    const WeightFormat f = value(parse_weight_format(c["weights"]));
    Layout l;
    l.tp = c.value("tp", int64_t{1});
    l.pp = c.value("pp", int64_t{1});
    l.ep = c.value("ep", int64_t{1});
    l.shared_device = c.value("shared_device", false);
    const std::string ffn = c.value("ffn", std::string("1d"));
    if (ffn == "2d") {
      l.ffn = FfnLayout::k2DWeightStationary;
    } else if (ffn == "weight-gathered") {
      l.ffn = FfnLayout::kWeightGatheredXYZ;  // strata's: the FFN weights of the whole group
    } else {
      EXPECT_EQ(ffn, "1d") << c["id"];
    }
    if (c.value("attention", std::string("head-sharded")) == "batch-sharded") {
      l.attention = AttentionSharding::kBatch;
    }
    if (c.value("residency", std::string("device")) == "host") {
      l.residency = WeightResidency::kHostStreamed;
    }
    Prediction p;
    p.id = c["id"];
    p.measured = c["measured"];
    const std::string kind = c["kind"];
    if (kind == "offline_output_tok_s") {
      OfflineWorkload w{
          c["prompts"], c["prompt"], c["gen"], c["batch"], c["max_batched_tokens"], f};
      p.predicted = value(offline_output_tokens_per_s(s, hw, l, w));
      p.higher_is_better = true;
    } else {
      PhaseWorkload w;
      w.phase = kind == "prefill_ms" ? Phase::kPrefill : Phase::kDecode;
      w.batch = c["batch"];
      w.prompt = c["prompt"];
      w.gen = c["gen"];
      w.weights = f;
      const Estimate e = value(estimate(s, hw, l, w));
      p.predicted = 1e3 * (w.phase == Phase::kPrefill ? e.seconds : e.step_seconds);
    }
    out.push_back(p);
  }
  return out;
}

// How much slower the configuration with the fastest prediction measured than the measured
// fastest of a scenario (0: the planner picks the best); printed with both names.
double pick_gap(const std::string& name, const std::vector<Prediction>& ps) {
  auto by_pred = std::min_element(
      ps.begin(), ps.end(), [](const auto& a, const auto& b) { return a.predicted < b.predicted; });
  auto by_meas = std::min_element(
      ps.begin(), ps.end(), [](const auto& a, const auto& b) { return a.measured < b.measured; });
  const double gap = by_pred->measured / by_meas->measured - 1.0;
  std::printf("scenario %-36s pick %-42s best %-42s gap %.1f%%\n", name.c_str(),
              by_pred->id.c_str(), by_meas->id.c_str(), 100 * gap);
  return gap;
}

// The profile a measured set names as calibrated in its own job ("profile_file", beside it).
HardwareProfile set_profile(const json& data) {
  return value(load_hardware_profile(kDataDir + "/" + data["profile_file"].get<std::string>()));
}

std::vector<Prediction> predict_h100(const json& data) {
  return predict(data, value(load_hardware_profile(data["profile"])));
}

// Prints each prediction against its measurement; returns the mean and worst |relative error|.
std::pair<double, double> print_errors(const std::vector<Prediction>& preds) {
  double sum = 0, worst = 0;
  for (const Prediction& p : preds) {
    const double err = std::fabs(p.predicted / p.measured - 1.0);
    std::printf("%-26s measured %10.3f predicted %10.3f  %+6.1f%%\n", p.id.c_str(), p.measured,
                p.predicted, 100 * (p.predicted / p.measured - 1.0));
    sum += err;
    worst = std::max(worst, err);
  }
  const double mean = sum / static_cast<double>(preds.size());
  std::printf("%zu configurations: mean |error| %.1f%%, max %.1f%%\n", preds.size(), 100 * mean,
              100 * worst);
  return {mean, worst};
}

TEST(H100Validation, PredictionErrorAgainstMeasurements) {
  const json data = read_json("h100_measured.json");
  const auto preds = predict_h100(data);
  ASSERT_EQ(preds.size(), data["count"].get<size_t>());
  const auto [mean, worst] = print_errors(preds);
  EXPECT_LE(mean, 0.10);
  EXPECT_LE(worst, 0.20);
}

// The one-H100 set of scripts/gpu_plan_set.sh (40 configurations from one device call: decode
// at KV 256, 2,048 and 8,160 up to batch 256, prefill of 128 to 16,384 tokens, int8 and fp8, a
// 34B model streamed from host memory, in-process TP = 2 and PP = 2 of the 8B shape sharing the
// GPU, Qwen3-30B-A3B int8 with one rank and EP = 2 sharing it) against the profile plan
// --calibrate wrote in the same job (bench/results/2026-11-27-h100-s8/planset/: GEMM probes
// timed from CUDA graphs, the MoE block probes of bf16, int8 and fp8 experts, the decode
// attention probes). Issue 14's goals: mean |error| <= 10%, max <= 20%. Measured: all 40 at
// 4.5% / 12.4% (dense 34: 4.5% / 10.7%; MoE 6: 4.8% / 12.4%).
TEST(H100Validation, CalibratedSetPredictionError) {
  const json data = read_json("h100_planset.json");
  const HardwareProfile hw = set_profile(data);
  const auto preds = predict(data, hw);
  ASSERT_EQ(preds.size(), data["count"].get<size_t>());
  ASSERT_GE(preds.size(), 20u);
  std::vector<Prediction> dense, moe;
  for (const Prediction& p : preds) (p.id.rfind("qwen3", 0) == 0 ? moe : dense).push_back(p);
  std::printf("dense:\n");
  const auto [dense_mean, dense_worst] = print_errors(dense);
  std::printf("mixture of experts:\n");
  const auto [moe_mean, moe_worst] = print_errors(moe);
  std::printf("all:\n");
  const auto [mean, worst] = print_errors(preds);
  ASSERT_GE(dense.size(), 30u);
  ASSERT_GE(moe.size(), 6u);
  EXPECT_LE(mean, 0.10);
  EXPECT_LE(worst, 0.20);
  EXPECT_LE(dense_mean, 0.10);
  EXPECT_LE(moe_mean, 0.10);
}

// The same set as scenarios: the configurations of one model, phase, batch and context (bf16 /
// int8 / fp8, TP = 2 or PP = 2 on the GPU, EP = 2 on the GPU). Issue 14's goal: the planner's
// fastest is within 5% of the measured fastest in >= 90% of the scenarios (measured: 8 of 8;
// prefill 1 x 2,048 picks int8, 5.0% slower than fp8, the others the measured best).
TEST(H100Validation, CalibratedSetRankingPicksWithinFivePercent) {
  const json data = read_json("h100_planset.json");
  const HardwareProfile hw = set_profile(data);
  const auto preds = predict(data, hw);
  ASSERT_EQ(preds.size(), data["configurations"].size());
  std::map<std::string, std::vector<Prediction>> scenarios;
  for (size_t i = 0; i < preds.size(); ++i) {
    const json& c = data["configurations"][i];
    ASSERT_EQ(c["id"].get<std::string>(), preds[i].id);
    const std::string key = c["model"].get<std::string>() + "-" + c["kind"].get<std::string>() +
                            "-b" + std::to_string(c["batch"].get<int64_t>()) + "-ctx" +
                            std::to_string(c["prompt"].get<int64_t>());
    scenarios[key].push_back(preds[i]);
  }
  int checked = 0, within = 0;
  for (const auto& [name, ps] : scenarios) {
    if (ps.size() < 2) continue;
    ++checked;
    if (pick_gap(name, ps) <= 0.05 + 1e-9) ++within;
  }
  ASSERT_GE(checked, 8);
  EXPECT_GE(within, static_cast<int>(std::ceil(0.9 * checked)));
}

// ---- strata on two H200s: tensor, pipeline and expert layouts ------------------------------

TEST(H200TwoGpuValidation, PredictionErrorAgainstMeasurements) {
  const json data = read_json("h200x2_measured.json");
  const HardwareProfile hw = value(load_hardware_profile(data["profile"]));
  const auto preds = predict(data, hw);
  ASSERT_EQ(preds.size(), data["count"].get<size_t>());
  ASSERT_GE(preds.size(), 20u);
  const auto [mean, worst] = print_errors(preds);
  // Issue 14's goals (mean <= 10%, max <= 20%) on 25 configurations measured in one two-H200 job
  // (bench/results/2026-11-27-h200x2-s13/, scripts/gpu_issue17.sh), predicted with the shipped
  // h200 profile, which was calibrated in an earlier job (2026-11-26-h200x2-s6): mean 6.5%,
  // worst 19.3% (Mixtral EP = 2 at batch 1, priced 19% slow). On that earlier job's own 26
  // points: 6.5% / 14.8%. The all-reduces are priced as strata runs them: f32 partial sums, the
  // one-shot kernels or the measured NCCL curve.
  EXPECT_LE(mean, 0.10);
  EXPECT_LE(worst, 0.20);
}

// ---- strata on four H200s: TP = 1 / 2 / 4 dense, MoE TP / EP / TP x EP, pipeline throughput ---

TEST(H200FourGpuValidation, PredictionErrorAgainstMeasurements) {
  const json data = read_json("h200x4_measured.json");
  const HardwareProfile hw = set_profile(data);
  const auto preds = predict(data, hw);
  ASSERT_EQ(preds.size(), data["count"].get<size_t>());
  ASSERT_GE(preds.size(), 20u);
  std::vector<Prediction> dense, moe;
  for (const Prediction& p : preds) {
    const bool is_moe = p.id.rfind("mixtral", 0) == 0 || p.id.rfind("qwen3", 0) == 0;
    (is_moe ? moe : dense).push_back(p);
  }
  std::printf("dense (Llama-3-70B shape):\n");
  const auto [dense_mean, dense_worst] = print_errors(dense);
  std::printf("mixture of experts:\n");
  const auto [moe_mean, moe_worst] = print_errors(moe);
  // The profile is the one plan --calibrate wrote in the same 4-GPU job. Far from issue 14's
  // 10% goal: decode of bf16 at batch 1 is within 4%, but prefill (and so offline throughput)
  // is predicted 25-34% off (that job's calibration filled the GEMM operands with one constant
  // byte: its curve is too fast; the probes now use random operands, and the two-H200 set above,
  // re-calibrated so, is within 20%), int8 at batch 64 runs the engine's slow path
  // (SBI-GeMM in 64-token slices, issue 15) that the curve does not know, and the MoE layouts
  // are predicted 2-59% fast: the experts are priced at the GEMM curve's rate while the engine's
  // MoE kernels at these sizes are slower (issue 12's goals are not met either), and TP x EP's
  // extra all-gathers are not modelled; the EP exchange uses the measured fixed-capacity cost
  // (the profile's moe_exchange). Dense / MoE today: mean 21.5% / 26.1%, worst 67.4% / 58.4%;
  // these bounds guard that state.
  EXPECT_LE(dense_mean, 0.25);
  EXPECT_LE(dense_worst, 0.70);
  EXPECT_LE(moe_mean, 0.30);
  EXPECT_LE(moe_worst, 0.62);
}

// Among the MoE layouts measured at the same model and batch (TP = 4, EP = 4, TP = 2 x EP = 2),
// the planner's fastest is the measured fastest (within 5%).
TEST(H200FourGpuValidation, MoeRankingPicksTheMeasuredBest) {
  const json data = read_json("h200x4_measured.json");
  const HardwareProfile hw = set_profile(data);
  std::map<std::string, std::vector<Prediction>> scenarios;
  for (const Prediction& p : predict(data, hw)) {
    if (p.id.rfind("mixtral", 0) != 0 && p.id.rfind("qwen3", 0) != 0) continue;
    scenarios[p.id.substr(0, p.id.rfind('-'))].push_back(p);
  }
  int checked = 0;
  for (const auto& [name, ps] : scenarios) {
    if (ps.size() < 2) continue;
    EXPECT_LE(pick_gap(name, ps), 0.05) << name;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

// ---- the layouts of seed 003 on four H200s (issue 18 item 2) ------------------------------

// Each scenario (a model, phase, batch and context) measured under two layouts of the same
// TP = 4 group: 1d vs 2d FFN in decode, 1d (weight-stationary) vs weight-gathered FFN in
// prefill, head- vs batch-sharded attention at KV 4,096. Prints every prediction and, per
// scenario, the planner's pick against the measured best.
struct LayoutScenarios {
  std::vector<Prediction> preds;
  std::map<std::string, std::vector<Prediction>> by_scenario;
};
LayoutScenarios four_gpu_layouts() {
  const json data = read_json("h200x4_layouts.json");
  const HardwareProfile hw = set_profile(data);
  LayoutScenarios out;
  out.preds = predict(data, hw);
  EXPECT_EQ(out.preds.size(), data["count"].get<size_t>());
  for (const Prediction& p : out.preds)
    out.by_scenario[p.id.substr(0, p.id.rfind('-'))].push_back(p);
  return out;
}

TEST(H200FourGpuLayouts, PlannerPicksTheMeasuredBestLayout) {
  const LayoutScenarios ls = four_gpu_layouts();
  int checked = 0;
  for (const auto& [name, ps] : ls.by_scenario) {
    ASSERT_EQ(ps.size(), 2u) << name;
    EXPECT_LE(pick_gap(name, ps), 0.05) << name;  // issue 18's goal
    ++checked;
  }
  EXPECT_EQ(checked, 9);
}

TEST(H200FourGpuLayouts, PredictionError) {
  const LayoutScenarios ls = four_gpu_layouts();
  std::vector<Prediction> graphs, eager;
  for (const Prediction& p : ls.preds)
    (p.id.find("-batch") != std::string::npos ? eager : graphs).push_back(p);
  std::printf("layouts the engine runs from CUDA graphs (1d / 2d decode) or as one pass:\n");
  const auto [mean, worst] = print_errors(graphs);
  std::printf("batch-sharded attention (the engine's eager correctness path):\n");
  const auto [bs_mean, bs_worst] = print_errors(eager);
  (void)bs_worst;
  // Issue 14 / 18's goals (mean <= 10%; max <= 20%) on the 15 layouts the engine runs as it
  // would serve: mean 4.8%, max 17.4% (8B head-sharded decode at batch 64, predicted fast). The
  // engine's 2D FFN all-reduces f32 partial sums over X and Y on NCCL groups (priced from the
  // profile's measured NCCL curves), its weight-gathered FFN gathers bf16 weights in the step's
  // stream; priced so, the planner picks the measured best in all 9 scenarios. Batch-sharded
  // attention is 34-80% slower than predicted: the engine runs it eagerly (no CUDA graphs, the
  // step's plan uploaded each step), a correctness path; the cost model prices the layout, not
  // that implementation, so these three are reported, not bounded.
  EXPECT_LE(mean, 0.10);
  EXPECT_LE(worst, 0.20);
  EXPECT_GT(bs_mean, 0.0);
}

// The FFN layout per phase, measured (issue 14): Llama-3-70B at TP = 4 on four H200s, bf16,
// with 1d, weight-gathered and the pair (weight-gathered prefill from the crossover, 1d decode)
// in one job. With the profile calibrated on that machine the planner puts the crossover
// between the two prefill sizes measured (weight-gathered slower at 16,384 tokens a step, faster
// at 131,072), --plan takes the pair for a 64 x 2,048 prompt + 128-token workload when the
// engine's steps hold a whole prefill (and not at the default 2,048-token steps), and the pair is
// the measured best of the three for that workload.
TEST(H200FourGpuLayouts, FfnLayoutPerPhaseIsTheMeasuredBest) {
  const json data = read_json("h200x4_ffn_per_phase.json");
  PlanRequest req;
  req.model_config = data["model"].get<std::string>();
  req.gpus = data["gpus"].get<int64_t>();
  req.profile = kDataDir + "/" + data["profile"].get<std::string>();
  req.batch = 64;
  req.prompt = 2048;
  req.gen = 128;
  req.top = 0;
  const PlanReport rep = value(make_plan(req));
  auto c = choose_engine_layout(rep, 0, 64 * 2048);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->decode.tp, 4);
  EXPECT_EQ(c->prefill.ffn, "WG-XYZ");
  EXPECT_EQ(c->decode.ffn, "1D-WS");
  const int64_t t = c->gather_min_tokens;
  EXPECT_EQ(t, data["pair_min_tokens"].get<int64_t>());  // the T the job ran with
  EXPECT_GT(t, 8 * 2048);
  EXPECT_LE(t, 64 * 2048);
  EXPECT_EQ(value(choose_engine_layout(rep, 0, 2048)).gather_min_tokens, 0);
  const json& m = data["measured"];
  auto ms = [&](const char* layout, const char* what) { return m[layout][what].get<double>(); };
  // Measured on each side of the crossover as predicted.
  EXPECT_GT(ms("wg", "prefill_8x2048_ms"), ms("1d", "prefill_8x2048_ms"));
  EXPECT_LT(ms("wg", "prefill_64x2048_ms"), ms("1d", "prefill_64x2048_ms"));
  // The pair runs each step as the layout for its size: within 2% of the faster one.
  for (const char* what : {"prefill_8x2048_ms", "prefill_64x2048_ms"}) {
    const double best = std::min(ms("1d", what), ms("wg", what));
    EXPECT_LE(ms("pair", what), 1.02 * best) << what;
  }
  for (const char* what : {"decode_b1_ms", "decode_b64_ms"}) {
    EXPECT_LE(ms("pair", what), 1.02 * ms("1d", what)) << what;
  }
  // The workload: one prefill of 64 x 2,048 tokens, then 128 decode steps of 64 sequences.
  std::map<std::string, double> total;
  for (const char* l : {"1d", "wg", "pair"}) {
    total[l] = ms(l, "prefill_64x2048_ms") + 128 * ms(l, "decode_b64_ms");
  }
  std::printf(
      "64 x 2,048 + 128 steps, measured: 1d %.0f ms, weight-gathered %.0f ms, pair %.0f ms\n",
      total["1d"], total["wg"], total["pair"]);
  EXPECT_LT(total["pair"], total["1d"]);
  EXPECT_LT(total["pair"], total["wg"]);
  // The plan's own prices of the two prefill passes against the measured ones (within 10%).
  auto predicted = [&](const char* ffn) {
    for (const PhasePlan& p : rep.phases) {
      for (const PlanRow& r : p.rows) {
        if (p.phase == "prefill" && r.tp == 4 && r.pp == 1 && r.ffn == ffn &&
            r.attention == "head-sharded" && !r.host_streamed) {
          return r.latency_s * 1e3;
        }
      }
    }
    return 0.0;
  };
  EXPECT_NEAR(predicted("1D-WS") / ms("1d", "prefill_64x2048_ms"), 1.0, 0.10);
  EXPECT_NEAR(predicted("WG-XYZ") / ms("wg", "prefill_64x2048_ms"), 1.0, 0.10);
}

TEST(H100Validation, RankingPicksTheMeasuredBest) {
  // A scenario is a workload measured under several weight formats; the planner's fastest
  // prediction must be within 5% of the measured best.
  const json data = read_json("h100_measured.json");
  const auto preds = predict_h100(data);
  std::map<std::string, std::vector<Prediction>> scenarios;
  for (const Prediction& p : preds) scenarios[p.id.substr(0, p.id.rfind('-'))].push_back(p);
  int total = 0, good = 0;
  for (const auto& [name, ps] : scenarios) {
    if (ps.size() < 2) continue;
    ++total;
    auto better = [](const Prediction& p, double a, double b) {
      return p.higher_is_better ? a > b : a < b;
    };
    const Prediction* pick = &ps[0];
    const Prediction* best = &ps[0];
    for (const Prediction& p : ps) {
      if (better(p, p.predicted, pick->predicted)) pick = &p;
      if (better(p, p.measured, best->measured)) best = &p;
    }
    const double gap = pick->higher_is_better ? best->measured / pick->measured - 1.0
                                              : pick->measured / best->measured - 1.0;
    std::printf("scenario %-20s pick %-24s best %-24s gap %.1f%%\n", name.c_str(), pick->id.c_str(),
                best->id.c_str(), 100 * gap);
    if (gap <= 0.05) ++good;
  }
  ASSERT_GE(total, 5);
  EXPECT_GE(static_cast<double>(good) / total, 0.9) << good << " of " << total;
}

// --plan: the layout the engine runs, from a plan.
PlanReport engine_plan(const std::string& shape, int64_t gpus, const std::string& profile) {
  PlanRequest req;
  req.model_config = shape;
  req.gpus = gpus;
  req.profile = profile;
  req.batch = 64;
  req.prompt = 512;
  req.gen = 128;
  req.top = 0;
  auto rep = make_plan(req);
  EXPECT_TRUE(rep.ok()) << rep.status().to_string();
  return rep.ok() ? *rep : PlanReport{};
}

// The reference: every runnable (tp, pp) scored by brute force over the rows.
std::pair<int64_t, int64_t> best_runnable(const PlanReport& rep, int world) {
  std::map<std::pair<int64_t, int64_t>, std::map<std::string, double>> best;
  for (const PhasePlan& p : rep.phases) {
    for (const PlanRow& r : p.rows) {
      const bool ok = r.fits && r.ffn == "1D-WS" && r.attention == "head-sharded" &&
                      !r.parallel_block && !r.host_streamed && r.ep == 1 && r.dp == 1 &&
                      (world <= 0 || r.tp * r.pp == world);
      if (!ok) continue;
      auto& m = best[{r.tp, r.pp}];
      if (!m.count(p.phase) || r.phase_s < m[p.phase]) m[p.phase] = r.phase_s;
    }
  }
  std::pair<int64_t, int64_t> pick{0, 0};
  double pick_s = 1e300;
  for (const auto& [k, m] : best) {
    if (m.size() == 2 && m.at("prefill") + m.at("decode") < pick_s) {
      pick_s = m.at("prefill") + m.at("decode");
      pick = k;
    }
  }
  return pick;
}

TEST(EngineLayout, TensorParallelForLlama8bOnTwoGpus) {
  // Measured on two H200s (bench/results/2026-11-26-h200x4/pp-throughput): TP = 2 18,797 out
  // tok/s, PP = 2 17,548; the plan agrees.
  const PlanReport rep = engine_plan("llama3-8b", 2, "h200");
  auto c = choose_engine_layout(rep, 0);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->decode.tp, 2);
  EXPECT_EQ(c->decode.pp, 1);
  EXPECT_EQ(c->prefill.tp, c->decode.tp);
  EXPECT_EQ(c->prefill.pp, c->decode.pp);
  EXPECT_EQ(c->decode.ffn, "1D-WS");
  EXPECT_EQ(c->prefill.attention, "head-sharded");
}

TEST(EngineLayout, MatchesBruteForceOverShapesAndWorlds) {
  for (const char* shape : {"llama3-8b", "llama3-70b", "llama3.2-1b"}) {
    for (int64_t gpus : {1, 2, 4, 8}) {
      const PlanReport rep = engine_plan(shape, gpus, "h100");
      const auto want = best_runnable(rep, 0);
      auto c = choose_engine_layout(rep, 0);
      if (want.first == 0) {
        EXPECT_FALSE(c.ok()) << shape << " on " << gpus;
        continue;
      }
      ASSERT_TRUE(c.ok()) << shape << " on " << gpus << ": " << c.status().to_string();
      EXPECT_EQ(std::make_pair(c->decode.tp, c->decode.pp), want) << shape << " on " << gpus;
    }
  }
}

// A report by hand: 1D-WS and WG-XYZ at TP = 4 with the given phase seconds (the weight-gathered
// prefill row carrying gather_min_tokens), for choose_engine_layout.
PlanReport two_layouts(double prefill_1d, double prefill_wg, double decode_1d, double decode_wg,
                       int64_t gather_min_tokens = 0, const std::string& weights = "") {
  PlanReport rep;
  rep.model = "m";
  rep.n_params = rep.n_active_params = 7e10;
  rep.weights = weights;
  for (const char* phase : {"prefill", "decode"}) {
    PhasePlan p;
    p.phase = phase;
    const bool prefill = std::string(phase) == "prefill";
    for (const char* ffn : {"1D-WS", "WG-XYZ"}) {
      PlanRow r;
      r.tp = 4;
      r.ffn = ffn;
      r.layout = std::string("tp4 ") + ffn;
      r.attention = "head-sharded";
      const bool one = std::string(ffn) == "1D-WS";
      r.phase_s = prefill ? (one ? prefill_1d : prefill_wg) : (one ? decode_1d : decode_wg);
      if (prefill && !one) r.gather_min_tokens = gather_min_tokens;
      p.rows.push_back(r);
    }
    rep.phases.push_back(p);
  }
  return rep;
}

// The engine runs one FFN layout for both phases; a 2D or weight-gathered one replaces 1D only
// when predicted >= 5% faster for the whole workload, with in-process ranks (not mpirun) and a
// dense model. With the profile calibrated on 4 x H200 a serving workload keeps 1D there
// (weight-gathered decodes far slower: it gathers a layer's FFN weights every step).
TEST(EngineLayout, OtherFfnLayoutOnlyWhenFivePercentFaster) {
  auto plan = [](const std::string& shape, int64_t prompt, int64_t gen) {
    PlanRequest req;
    req.model_config = shape;
    req.gpus = 4;
    req.profile = kDataDir + "/h200x4_layouts_calibrated.json";
    req.batch = 64;
    req.prompt = prompt;
    req.gen = gen;
    req.top = 0;
    return value(make_plan(req));
  };
  // Rows by hand: 1D TP = 4 (10 s + 1 s) against weight-gathered (prefill t s + 1 s).
  auto synthetic = [](double wg_prefill_s) { return two_layouts(10.0, wg_prefill_s, 1.0, 1.0); };
  for (const auto& [wg_s, want] : std::vector<std::pair<double, std::string>>{
           {9.0, "WG-XYZ"}, {10.4, "1D-WS"}, {10.5, "1D-WS"}, {12.0, "1D-WS"}}) {
    auto pick = choose_engine_layout(synthetic(wg_s), 0);
    ASSERT_TRUE(pick.ok());
    EXPECT_EQ(pick->decode.ffn, want) << wg_s;  // 10.4 + 1 is 3.6% faster: not enough
    EXPECT_EQ(pick->prefill.ffn, want) << wg_s;
    auto mpi = choose_engine_layout(synthetic(wg_s), 4);
    ASSERT_TRUE(mpi.ok());
    EXPECT_EQ(mpi->decode.ffn, "1D-WS");  // mpirun: one process per GPU, where only 1D runs
  }
  PlanReport moe_rows = synthetic(9.0);
  moe_rows.n_active_params = 1e10;
  EXPECT_EQ(value(choose_engine_layout(moe_rows, 0)).decode.ffn, "1D-WS");
  // The profile measured on 4 x H200, where the planner's pick was the measured best layout:
  // a prefill-only workload for Llama-3-70B does not get 2D (predicted far slower there).
  const PlanReport prefill_only = plan("llama3-70b", 2048, 1);
  auto c = choose_engine_layout(prefill_only, 0);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_NE(c->decode.ffn, "2D-WS");
  // Decode steps make the weight gathers cost more than they save.
  auto serving = choose_engine_layout(plan("llama3-70b", 512, 128), 0);
  ASSERT_TRUE(serving.ok());
  EXPECT_EQ(serving->decode.ffn, "1D-WS");
  // The README's example (8 x H100, shipped profile: 2D ranked first in decode by 2%) keeps 1D.
  PlanRequest readme;
  readme.model_config = "llama3-70b";
  readme.gpus = 8;
  readme.batch = 64;
  readme.prompt = 2048;
  readme.gen = 128;
  readme.top = 0;
  auto ex = choose_engine_layout(value(make_plan(readme)), 0);
  ASSERT_TRUE(ex.ok()) << ex.status().to_string();
  EXPECT_EQ(ex->decode.ffn, "1D-WS");
  auto moe = choose_engine_layout(plan("mixtral-8x7b", 2048, 1), 0);
  ASSERT_TRUE(moe.ok()) << moe.status().to_string();
  EXPECT_EQ(moe->decode.ffn, "1D-WS");
}

// The seed's pair (Sec. 3.2.2 / Table 2): weight-gathered prefill and weight-stationary decode
// from the same shards. The engine runs it as 1D with --ffn-gather-min-tokens T: steps of T tokens
// or more gather. T is where the cost model turns: one step of T tokens is predicted faster
// weight-gathered than 1D on the same ranks, T - 1 is not.
TEST(EngineLayout, WeightGatheredPrefillWithOneDDecode) {
  // Rows by hand: 1D (10 s + 1 s), weight-gathered in both phases (8 s + 3 s), and the pair
  // (8 s + 1 s) wins when the engine's steps reach its 4,096 tokens.
  auto synthetic = [](const std::string& weights) {
    return two_layouts(10.0, 8.0, 1.0, 3.0, 4096, weights);
  };
  auto pair = choose_engine_layout(synthetic("bf16"), 0);
  ASSERT_TRUE(pair.ok()) << pair.status().to_string();
  EXPECT_EQ(pair->prefill.ffn, "WG-XYZ");
  EXPECT_EQ(pair->decode.ffn, "1D-WS");
  EXPECT_EQ(pair->gather_min_tokens, 4096);
  EXPECT_EQ(value(choose_engine_layout(synthetic("bf16"), 0, 8192)).gather_min_tokens, 4096);
  // Not taken: steps that never reach 4,096 tokens, 8-bit weights (the gathers move bf16
  // shards), an mpirun world, a mixture of experts.
  for (const auto& [rep, world, step] : std::vector<std::tuple<PlanReport, int, int64_t>>{
           {synthetic("bf16"), 0, 2048}, {synthetic("int8"), 0, 0}, {synthetic("bf16"), 4, 0}}) {
    auto c = choose_engine_layout(rep, world, step);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    EXPECT_EQ(c->prefill.ffn, "1D-WS") << rep.weights << " " << world << " " << step;
    EXPECT_EQ(c->gather_min_tokens, 0);
  }
  PlanReport moe = synthetic("bf16");
  moe.n_active_params = 1e10;
  EXPECT_EQ(value(choose_engine_layout(moe, 0)).gather_min_tokens, 0);
  // The crossover the plan reports, checked against the plan's own rows at T and T - 1 tokens:
  // Llama-3-70B on four H100s (NVLink ring: the weight gathers pay off only at large steps).
  auto one_step = [](int64_t tokens) {
    PlanRequest req;
    req.model_config = "llama3-70b";
    req.gpus = 4;
    req.batch = 1;
    req.prompt = tokens;
    req.gen = 1;
    req.top = 0;
    return value(make_plan(req));
  };
  auto prefill_s = [](const PlanReport& rep, const std::string& ffn) {
    for (const PhasePlan& p : rep.phases) {
      for (const PlanRow& r : p.rows) {
        if (p.phase == "prefill" && r.tp == 4 && r.pp == 1 && r.ffn == ffn &&
            r.attention == "head-sharded" && !r.host_streamed) {
          return std::make_pair(r.phase_s, r.gather_min_tokens);
        }
      }
    }
    return std::make_pair(-1.0, int64_t{-1});
  };
  const int64_t t = prefill_s(one_step(2048), "WG-XYZ").second;
  ASSERT_GT(t, 1);
  std::printf("[ info ] llama3-70b, 4 x H100 profile: weight-gathered prefill from %lld tokens\n",
              static_cast<long long>(t));
  EXPECT_LT(prefill_s(one_step(t), "WG-XYZ").first, prefill_s(one_step(t), "1D-WS").first);
  EXPECT_GE(prefill_s(one_step(t - 1), "WG-XYZ").first, prefill_s(one_step(t - 1), "1D-WS").first);
  // The plan file keeps it.
  const PlanReport rep = one_step(2048);
  auto back = plan_from_json(plan_to_json(rep), "--plan p.json");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(prefill_s(*back, "WG-XYZ").second, t);
  EXPECT_EQ(back->weights, "bf16");
}

TEST(EngineLayout, WorldOfMpirunAndNothingThatFits) {
  const PlanReport four = engine_plan("llama3-8b", 4, "h100");
  auto c = choose_engine_layout(four, 4);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->decode.tp * c->decode.pp, 4);  // mpirun: the layout fills the world
  EXPECT_EQ(std::make_pair(c->decode.tp, c->decode.pp), best_runnable(four, 4));
  // Every layout of a 4-GPU plan uses 4 ranks: none for a world of 2.
  auto none = choose_engine_layout(four, 2);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("mpirun world of 2"), std::string::npos)
      << none.status().message();
  // 141 GB of bf16 weights do not fit one 80 GB GPU.
  auto big = choose_engine_layout(engine_plan("llama3-70b", 1, "h100"), 0);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("no layout"), std::string::npos);
}

TEST(EngineLayout, PlanFileRoundTripAndBadFiles) {
  const PlanReport rep = engine_plan("llama3-70b", 8, "h100");
  auto back = plan_from_json(plan_to_json(rep), "--plan p.json");
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  auto a = choose_engine_layout(rep, 0);
  auto b = choose_engine_layout(*back, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->decode.tp, b->decode.tp);
  EXPECT_EQ(a->decode.pp, b->decode.pp);
  EXPECT_EQ(a->decode.layout, b->decode.layout);
  for (const char* bad : {"", "{", "[]", "{\"phases\": 3}"}) {
    auto r = plan_from_json(bad, "--plan p.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--plan p.json: not a plan"), std::string::npos)
        << r.status().message();
  }
  auto missing = plan_from_json(
      R"({"phases": {"decode": {"layouts": [{"layout": "tp2", "tp": 2}]}}})", "--plan p.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("lacks a field"), std::string::npos);
  auto zero = plan_from_json(
      R"({"phases": {"decode": {"layouts": [{"layout": "x", "tp": 0, "pp": 1, "ep": 1, "dp": 1,
          "ffn": "1D-WS", "attention": "heads", "parallel_block": false, "host_streamed": false,
          "fits": true, "latency_s": 1, "phase_s": 1}]}}})",
      "--plan p.json");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("'tp' must be a whole number"), std::string::npos)
      << zero.status().message();
  // Numbers past 64 bits parse as floats; converting them was undefined behaviour (found by
  // fuzz_plan_json). Floats and huge sizes are refused, naming the field.
  for (const char* gpus : {"44444444444444444444445", "2.5", "1e300", "-3"}) {
    auto r =
        plan_from_json(std::string(R"({"gpus": )") + gpus + R"(, "phases": {}})", "--plan p.json");
    ASSERT_FALSE(r.ok()) << gpus;
    EXPECT_NE(r.status().message().find("--plan p.json: 'gpus' must be a whole number"),
              std::string::npos)
        << r.status().message();
  }
  auto huge = plan_from_json(
      R"({"phases": {"decode": {"layouts": [{"layout": "x", "tp": 4611686018427387904, "pp": 4,
          "ep": 1, "dp": 1, "ffn": "1D-WS", "attention": "heads", "parallel_block": false,
          "host_streamed": false, "fits": true, "latency_s": 1, "phase_s": 1}]}}})",
      "--plan p.json");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("'tp' must be a whole number"), std::string::npos)
      << huge.status().message();
}

TEST(Planner, RankingIsFast) {
  // A generous bound (the plan itself takes milliseconds; see the README).
  const ModelShape palm = value(model_shape_preset("palm-540b-padded"));
  const HardwareProfile tpu = value(load_hardware_profile("tpu-v4"));
  const auto t0 = std::chrono::steady_clock::now();
  PhaseWorkload w{Phase::kDecode, 512, 2048, 64, WeightFormat::kBF16};
  auto ranked = rank_layouts(palm, tpu, 256, w, {});
  ASSERT_TRUE(ranked.ok());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0);
}

}  // namespace
}  // namespace strata::planner
