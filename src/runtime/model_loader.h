// Loading a model for the engines: checks the parallel launch, parses config.json, loads and
// shards the weights for this rank and opens the tokenizer. Shared by the single-request
// Engine (engine.cpp) and the ServingEngine (src/serving/engine_loop.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "io/tensor_source.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "strata/engine.h"
#include "text/tokenizer.h"

namespace strata {

struct LoadedModel {
  ModelInfo info;
  int64_t max_len = 0;  // context length: EngineConfig::max_model_len capped by the model's
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Model> model;          // null with pipeline stages: each stage loads its layers
  std::unique_ptr<Tokenizer> tokenizer;  // null when the checkpoint has no tokenizer.json
  ModelConfig config;
  std::shared_ptr<TensorSource> weights;  // the checkpoint, for loading stages
};

// A model's files opened: `model` is a HF checkpoint directory, a .gguf file, or an alias
// (smollm2, gemma3-270m) resolved to strata's cache directory.
struct ModelFiles {
  std::string path;  // resolved path
  ModelConfig config;
  ModelInfo info;
  std::shared_ptr<TensorSource> weights;  // null unless opened with_weights
  std::unique_ptr<Tokenizer> tokenizer;   // null when the model has none
  bool has_chat_template = false;
  // Touch every weight page (reading the file from disk now rather than during the first
  // forward), reporting bytes done / total. Set when opened with_weights.
  std::function<void(const std::function<void(uint64_t, uint64_t)>&)> prefault;
};

Result<ModelFiles> open_model(const std::string& model, bool with_weights);
ModelInfo make_model_info(const std::string& path, const ModelConfig& config);
Result<LoadedModel> load_model(const EngineConfig& config);
// --ffn-layout / --ffn-2d-x (sizes) into par, with one-line errors naming the flags.
Status apply_ffn_layout(const ParallelSizes& sizes, ParallelConfig* par);
// --attn-layout (sizes) into par, with a one-line error naming the flag.
Status apply_attn_layout(const ParallelSizes& sizes, ParallelConfig* par);

}  // namespace strata
