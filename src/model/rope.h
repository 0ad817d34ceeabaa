// Inverse frequencies of rotary position embeddings, with Hugging Face's rope_scaling
// semantics (transformers' default rope and ROPE_INIT_FUNCTIONS "linear" and "llama3").
// The result feeds ops::RopeParams::inv_freq.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace strata {

// inv_freq[i] = theta^(-2i / rotary_dim) for i < rotary_dim / 2, then scaled:
//   kNone:   unchanged.
//   kLinear: divided by factor (the same as dividing positions by factor).
//   kLlama3: by wavelength 2 pi / inv_freq, against low_freq_wavelen = orig_ctx /
//            low_freq_factor and high_freq_wavelen = orig_ctx / high_freq_factor:
//            wavelen > low  -> inv_freq / factor;  wavelen < high -> unchanged;
//            between        -> (1 - s) inv_freq / factor + s inv_freq with
//                              s = (orig_ctx / wavelen - low_freq_factor) /
//                                  (high_freq_factor - low_freq_factor).
// Computed in double and rounded once (HF computes in f32; the two agree within 2 ulp).
// rotary_dim must be even and positive, factor positive, and for llama3
// high_freq_factor != low_freq_factor (ModelConfig::validate checks these); an empty vector
// is returned for rotary_dim <= 0.
std::vector<float> rope_inv_freq(int64_t rotary_dim, float theta, const RopeScaling& scaling);

}  // namespace strata
