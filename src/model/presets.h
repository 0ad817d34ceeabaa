// Model shapes by name for `--model-config` (random weights): llama3-8b, llama2-7b,
// qwen2.5-7b, llama3-70b, llama3.2-1b, and the mixture-of-experts qwen3-30b-a3b and
// mixtral-8x7b. kNotFound lists the names.
#pragma once

#include <string>

#include "model/config.h"
#include "strata/status.h"

namespace strata {

Result<ModelConfig> model_config_preset(const std::string& name);

}  // namespace strata
