// GGUF models: ModelConfig from `general.architecture` metadata (llama, gemma3), and a
// TensorSource that serves the file's tensors under the Hugging Face names the loader uses,
// so one loader shards both formats. GGUF llama Q/K weights are stored permuted for
// interleaved rotary pairs, so their config sets rope_neox_style = false.
#pragma once

#include <memory>

#include "io/gguf.h"
#include "io/tensor_source.h"
#include "model/config.h"

namespace strata {

Result<ModelConfig> model_config_from_gguf(const GgufFile& file);

std::shared_ptr<TensorSource> make_gguf_tensor_source(std::shared_ptr<const GgufFile> file,
                                                      ArchFamily family);

}  // namespace strata
