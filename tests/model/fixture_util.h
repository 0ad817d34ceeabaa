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

}  // namespace strata::testing
