// Model shapes for the planner: from a ModelConfig (presets, config.json, GGUF) or from the
// planner's own table of shapes the engine does not run yet (PaLM for seed 003's tables, MoE
// models for the expert-parallel terms).
#include <string>
#include <vector>

#include "core/status.h"
#include "model/config.h"
#include "model/presets.h"
#include "planner/planner.h"

namespace strata::planner {

namespace {

struct ShapeRow {
  const char* name;
  int64_t layers, hidden, heads, kv_heads, head_dim, ffn, vocab;
  bool parallel_block, tied;
  int64_t experts, experts_used, expert_ffn;
};

// Published configurations. PaLM 540B (seed 003, Section 4; the PaLM paper's Table 1): 118
// layers, d_model 18432, 48 heads of 256, multi-query attention, SwiGLU d_ff = 4 d_model, 256k
// vocabulary with shared input/output embeddings, parallel block. On 64 chips seed 003 pads the
// heads to 64 (palm-540b-padded: ~3% more parameters).
constexpr ShapeRow kPlannerShapes[] = {
    {"palm-540b", 118, 18432, 48, 1, 256, 73728, 256000, true, true, 0, 0, 0},
    {"palm-540b-padded", 118, 18432, 64, 1, 256, 73728, 256000, true, true, 0, 0, 0},
    {"llama-34b", 48, 8192, 64, 8, 128, 22016, 32000, false, false, 0, 0, 0},
    {"mixtral-8x7b", 32, 4096, 32, 8, 128, 0, 32000, false, false, 8, 2, 14336},
    {"qwen3-30b-a3b", 48, 2048, 32, 4, 128, 0, 151936, false, false, 128, 8, 768},
};

const char* kEnginePresets[] = {"llama3-8b", "llama2-7b", "qwen2.5-7b", "llama3-70b",
                                "llama3.2-1b"};

}  // namespace

double ModelShape::attention_weights() const {
  const double q = static_cast<double>(n_heads * head_dim);
  const double kv = static_cast<double>(n_heads_kv * head_dim);
  return static_cast<double>(hidden) * (2.0 * q + 2.0 * kv);
}

double ModelShape::ffn_weights_per_expert() const {
  const double f = static_cast<double>(is_moe() ? expert_ffn_dim : ffn_dim);
  return (gated_mlp ? 3.0 : 2.0) * static_cast<double>(hidden) * f;
}

double ModelShape::layer_weights() const {
  return attention_weights() +
         ffn_weights_per_expert() * static_cast<double>(is_moe() ? n_experts : 1) +
         (is_moe() ? static_cast<double>(hidden * n_experts) : 0.0);  // router
}

double ModelShape::embedding_weights() const {
  return static_cast<double>(vocab * hidden) * (tied_embeddings ? 1.0 : 2.0);
}

double ModelShape::n_params() const {
  return layer_weights() * static_cast<double>(n_layers) + embedding_weights();
}

double ModelShape::n_active_params() const {
  if (!is_moe()) return n_params();
  const double active_layer = attention_weights() +
                              ffn_weights_per_expert() * static_cast<double>(n_experts_used) +
                              static_cast<double>(hidden * n_experts);
  return active_layer * static_cast<double>(n_layers) + embedding_weights();
}

double ModelShape::kv_bytes_per_token() const {
  return 2.0 * 2.0 * static_cast<double>(n_layers * n_heads_kv * head_dim);
}

Result<ModelShape> model_shape_from_config(const ModelConfig& c, const std::string& name) {
  if (c.n_layers <= 0 || c.hidden <= 0 || c.n_heads <= 0 || c.head_dim <= 0 || c.ffn_dim <= 0)
    return errorf(StatusCode::kInvalidArgument,
                  "model '{}': the planner needs n_layers, hidden, n_heads, head_dim and ffn_dim "
                  "(got {}, {}, {}, {}, {})",
                  name, c.n_layers, c.hidden, c.n_heads, c.head_dim, c.ffn_dim);
  ModelShape s;
  s.name = name;
  s.n_layers = c.n_layers;
  s.hidden = c.hidden;
  s.n_heads = c.n_heads;
  s.n_heads_kv = c.n_heads_kv > 0 ? c.n_heads_kv : c.n_heads;
  s.head_dim = c.head_dim;
  s.ffn_dim = c.ffn_dim;
  s.vocab = c.vocab;
  s.gated_mlp = c.gated_mlp;
  s.parallel_block = c.parallel_block;
  s.tied_embeddings = c.tie_word_embeddings;
  return s;
}

Result<ModelShape> model_shape_preset(const std::string& name) {
  for (const ShapeRow& r : kPlannerShapes) {
    if (name != r.name) continue;
    ModelShape s;
    s.name = r.name;
    s.n_layers = r.layers;
    s.hidden = r.hidden;
    s.n_heads = r.heads;
    s.n_heads_kv = r.kv_heads;
    s.head_dim = r.head_dim;
    s.ffn_dim = r.ffn;
    s.vocab = r.vocab;
    s.gated_mlp = true;
    s.parallel_block = r.parallel_block;
    s.tied_embeddings = r.tied;
    s.n_experts = r.experts;
    s.n_experts_used = r.experts_used;
    s.expert_ffn_dim = r.expert_ffn;
    return s;
  }
  auto config = model_config_preset(name);
  if (config.ok()) return model_shape_from_config(*config, name);
  std::string names;
  for (const std::string& n : model_shape_preset_names()) names += (names.empty() ? "" : ", ") + n;
  return errorf(StatusCode::kNotFound, "unknown --model-config '{}' (known: {})", name, names);
}

std::vector<std::string> model_shape_preset_names() {
  std::vector<std::string> names(std::begin(kEnginePresets), std::end(kEnginePresets));
  for (const ShapeRow& r : kPlannerShapes) names.emplace_back(r.name);
  return names;
}

}  // namespace strata::planner
