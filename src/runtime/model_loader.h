// Loading a model for the engines: checks the parallel launch, parses config.json, loads and
// shards the weights for this rank and opens the tokenizer. Shared by the single-request
// Engine (engine.cpp) and the ServingEngine (src/serving/engine_loop.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/tokenizer.h"
#include "model/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "strata/engine.h"

namespace strata {

struct LoadedModel {
  ModelInfo info;
  int64_t max_len = 0;  // context length: EngineConfig::max_model_len capped by the model's
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the checkpoint has no tokenizer.json
};

Result<ModelConfig> read_model_config(const std::string& model);
ModelInfo make_model_info(const std::string& path, const ModelConfig& config);
Result<LoadedModel> load_model(const EngineConfig& config);

}  // namespace strata
