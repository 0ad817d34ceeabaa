// Executor: one model's forward pass on one backend, with the KV block pool it addresses. The
// engines (Engine, ServingEngine) drive an Executor and never ask which device runs it:
//   CPU  - Model::forward over a host KvCache (and the tensor-parallel communicator)
//   CUDA - CudaModel::forward over its device pool; the KvCache here only counts blocks
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "memory/kv_cache.h"
#include "model/config.h"
#include "model/cuda_model.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "strata/status.h"

namespace strata {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const ModelConfig& config() const = 0;
  virtual KvCache& cache() = 0;
  virtual std::string backend_name() const = 0;  // "CPU", "CUDA"
  // Model::forward's contract: logits [logit_rows, vocab] f32 on the host.
  virtual Status forward(const ForwardBatch& batch, float* logits) = 0;
  // ids[i] = argmax of logit row i (first index on ties).
  virtual Status forward_argmax(const ForwardBatch& batch, int32_t* ids) = 0;
};

// Runs `model` on the CPU over a host cache of n_blocks blocks; `comm` must outlive it.
Result<std::unique_ptr<Executor>> make_cpu_executor(std::unique_ptr<Model> model,
                                                    Communicator& comm, int64_t n_blocks,
                                                    int64_t block_size);
// Runs a CudaModel; the block pool is the model's device pool.
Result<std::unique_ptr<Executor>> make_cuda_executor(std::unique_ptr<CudaModel> model);

}  // namespace strata
