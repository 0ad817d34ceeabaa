// Tokenizer spec from a GGUF file's `tokenizer.ggml.*` metadata (see TokenizerSpec for how
// each vocabulary kind maps).
#pragma once

#include "io/gguf.h"
#include "text/tokenizer.h"

namespace strata {

Result<TokenizerSpec> tokenizer_spec_from_gguf(const GgufFile& file);

}  // namespace strata
