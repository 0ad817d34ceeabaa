// Shared helpers for the golden tests over tests/fixtures/models (made by
// scripts/make_fixtures.py with Hugging Face transformers; see tests/fixtures/README.md).
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/safetensors.h"

namespace strata::testing {

inline std::string fixture_model(const std::string& name) {
  return std::string(STRATA_FIXTURE_DIR) + "/models/" + name;
}

struct Reference {
  std::vector<std::vector<int32_t>> inputs;  // input_ids_0, input_ids_1
  std::vector<std::vector<float>> logits;    // [len, vocab] each
  std::vector<int32_t> greedy_prompt, greedy_tokens;
};

inline std::vector<int32_t> ints(const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = t.dtype == DType::kI64 ? static_cast<int32_t>(t.ptr<int64_t>()[i]) : t.ptr<int32_t>()[i];
  }
  return v;
}

inline Result<Reference> load_reference(const std::string& model_dir) {
  STRATA_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(model_dir + "/reference.safetensors"));
  Reference r;
  for (int i = 0; i < 2; ++i) {
    STRATA_ASSIGN_OR_RETURN(Tensor ids, file->tensor("input_ids_" + std::to_string(i)));
    STRATA_ASSIGN_OR_RETURN(Tensor lg, file->tensor("logits_" + std::to_string(i)));
    r.inputs.push_back(ints(ids));
    r.logits.emplace_back(lg.ptr<float>(), lg.ptr<float>() + lg.numel());
  }
  STRATA_ASSIGN_OR_RETURN(Tensor gp, file->tensor("greedy_prompt"));
  STRATA_ASSIGN_OR_RETURN(Tensor gt, file->tensor("greedy_tokens"));
  r.greedy_prompt = ints(gp);
  r.greedy_tokens = ints(gt);
  return r;
}

// max |a - b| / max |b|
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::fabs(static_cast<double>(b[i])));
  }
  return a.size() == b.size() ? diff / std::max(ref, 1e-30) : INFINITY;
}

// Greedy ids of `got` against `want` ([positions, vocab] logits each) at the positions where
// want's top two logits are more than `margin` * max|want| apart (elsewhere a near-tie may flip
// within the logits' tolerance): `decided` such positions, `differ` of them with another argmax.
struct GreedyAgreement {
  int decided = 0;
  int differ = 0;
};
inline GreedyAgreement greedy_agreement(const std::vector<float>& got,
                                        const std::vector<float>& want, int64_t vocab,
                                        double margin) {
  GreedyAgreement g;
  double scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  const size_t V = static_cast<size_t>(vocab);
  for (size_t p = 0; p + V <= want.size(); p += V) {
    size_t best = p;
    for (size_t i = p; i < p + V; ++i) {
      if (want[i] > want[best]) best = i;
    }
    double second_v = -1e30;
    for (size_t i = p; i < p + V; ++i) {
      if (i != best) second_v = std::max(second_v, static_cast<double>(want[i]));
    }
    if (want[best] - second_v <= margin * scale) continue;
    ++g.decided;
    size_t gb = p;
    for (size_t i = p; i < p + V; ++i) {
      if (got[i] > got[gb]) gb = i;
    }
    g.differ += gb != best ? 1 : 0;
  }
  return g;
}

// Mixture-of-experts models under bf16: a router's top-k can flip where two experts' logits
// nearly tie (qwen2_moe sequence 1, last position: layer 2's experts 0 and 4 are 0.055 apart in
// f32 and swap under the bf16 layout's drift), which moves that position's logits by far more
// than rounding. Compared position by position (rows of `vocab` logits, scaled by max |b| over
// all rows): `worst` is the largest error, `worst_routed` the largest outside the single worst
// position, `over` how many positions exceed `tol`.
struct RowErrors {
  double worst = 0.0;
  double worst_routed = 0.0;
  int over = 0;
};
inline RowErrors row_errors(const std::vector<float>& a, const std::vector<float>& b, size_t vocab,
                            double tol) {
  RowErrors r;
  double ref = 1e-30;
  for (float v : b) ref = std::max(ref, std::fabs(static_cast<double>(v)));
  if (a.size() != b.size() || vocab == 0) {
    r.worst = r.worst_routed = INFINITY;
    r.over = 1 << 30;
    return r;
  }
  std::vector<double> per;
  for (size_t row = 0; row * vocab < a.size(); ++row) {
    double d = 0.0;
    for (size_t i = row * vocab; i < (row + 1) * vocab; ++i) {
      d = std::isfinite(a[i]) ? std::max(d, std::fabs(static_cast<double>(a[i]) - b[i])) : INFINITY;
    }
    per.push_back(d / ref);
    if (d / ref > tol) ++r.over;
  }
  std::sort(per.begin(), per.end());
  r.worst = per.back();
  r.worst_routed = per.size() > 1 ? per[per.size() - 2] : 0.0;
  return r;
}

}  // namespace strata::testing
