// TensorSource: where a model loader gets named weight tensors from (a safetensors checkpoint
// directory, a GGUF file, or random "dummy" weights). Tensors are views that stay valid for
// the source's lifetime; keep_alive() hands out shared ownership of the backing memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "strata/status.h"

namespace strata {

// A file the source maps whole: tensor views into [base, base + size) are at file offset
// (view - base). Lets weight streaming read a tensor from the file itself (O_DIRECT).
struct MappedRegion {
  std::string path;
  const uint8_t* base = nullptr;
  size_t size = 0;
};

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual Result<Tensor> tensor(const std::string& name) const = 0;
  virtual std::string describe() const = 0;  // the path, for messages
  // The files the views point into (empty: not file-backed, e.g. random weights).
  virtual std::vector<MappedRegion> mapped_regions() const { return {}; }
};

}  // namespace strata
