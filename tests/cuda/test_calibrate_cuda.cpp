// strata plan --calibrate on the GPU: the profile it writes parses, its numbers are physical
// (within the H100/H200 envelope), its GEMM curves rise with tokens, and the calibrated profile
// predicts strata's own measured Llama-3-8B decode step (bench/results, H100) within 20%.
#include <gtest/gtest.h>

#include <string>

#include "cuda_test_util.h"
#include "planner/planner.h"
#include "strata/plan.h"

namespace strata::cuda {
namespace {

class CalibrateTest : public testutil::CudaTest {};

TEST_F(CalibrateTest, ProfileParsesAndIsPhysical) {
  auto text = calibrate_profile("calibrated");
  ASSERT_TRUE(text.ok()) << text.status().to_string();
  auto p = planner::parse_hardware_profile(*text, "calibrated");
  ASSERT_TRUE(p.ok()) << p.status().to_string() << "\n" << *text;
  std::printf("%s", text->c_str());
  // Hopper: 3.35 TB/s (H100 SXM) to 4.8 TB/s (H200) nominal, ~990 TFLOP/s dense bf16 nominal.
  EXPECT_GT(p->hbm_read_Bps, 1.5e12);
  EXPECT_LT(p->hbm_read_Bps, 5.0e12);
  EXPECT_GT(p->peak_bf16(), 300e12);
  EXPECT_LT(p->peak_bf16(), 1000e12);
  EXPECT_GT(p->host_to_device_Bps, 5e9);
  EXPECT_GT(p->attention_flops, 30e12);
  for (const auto& [format, curve] : p->gemm_curve) {
    ASSERT_GE(curve.size(), 10u) << planner::weight_format_name(format);
    // More tokens over the same weights: more FLOP/s (the memory-bound end is ~linear).
    EXPECT_GT(curve[4].second, 4.0 * curve[0].second) << planner::weight_format_name(format);
    EXPECT_GT(curve.back().second, curve[4].second) << planner::weight_format_name(format);
    EXPECT_LT(curve.back().second, 2.5 * p->peak_bf16()) << planner::weight_format_name(format);
  }
  // The measured decode step of bench/results/2026-11-23-h100-unified-program-vs-peer.json
  // (batch 1, KV 256..288, bf16): 5.852 ms on an H100. Only checked on an H100.
  if (p->source.find("H100") == std::string::npos) return;
  auto llama = planner::model_shape_preset("llama3-8b");
  ASSERT_TRUE(llama.ok());
  planner::PhaseWorkload w{planner::Phase::kDecode, 1, 256, 32, planner::WeightFormat::kBF16};
  auto e = planner::estimate(*llama, *p, planner::Layout{}, w);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  EXPECT_NEAR(e->step_seconds / 5.852e-3, 1.0, 0.2) << e->step_seconds * 1e3 << " ms";
}

}  // namespace
}  // namespace strata::cuda
