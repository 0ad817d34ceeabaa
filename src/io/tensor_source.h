// TensorSource: where a model loader gets named weight tensors from (a safetensors checkpoint
// directory, a GGUF file, or random "dummy" weights). Tensors are views that stay valid for
// the source's lifetime; keep_alive() hands out shared ownership of the backing memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "strata/status.h"

namespace strata {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool has(const std::string& name) const = 0;
  virtual Result<Tensor> tensor(const std::string& name) const = 0;
  virtual std::string describe() const = 0;  // the path, for messages
};

}  // namespace strata
