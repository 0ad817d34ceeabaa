// Executor: one model's forward pass on one backend, with the KV block pool it addresses. The
// engines (Engine, ServingEngine) drive an Executor and never ask which device runs it:
//   CPU  - Model::forward over a host KvCache (and the tensor-parallel communicator)
//   CUDA - CudaModel::forward over its device pool; the KvCache here only counts blocks
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "text/tokenizer.h"
#include "memory/kv_cache.h"
#include "model/config.h"
#include "model/cuda_model.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "strata/engine.h"
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
  // Swapping a preempted sequence's KV: one block (every layer's K and V) to or from a host
  // slot of block_bytes() bytes.
  virtual size_t block_bytes() const = 0;
  virtual Status copy_block_to_host(int32_t block, void* host) = 0;
  virtual Status copy_block_from_host(int32_t block, const void* host) = 0;
};

// An executor for EngineConfig (device, weights, quantization, load format), with what the
// engines need beside it. Member order matters: `exec` may refer to `comm`.
struct LoadedExecutor {
  ModelInfo info;
  int64_t max_len = 0;  // context length
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the model has none (or dummy presets)
  std::unique_ptr<Executor> exec;
};

struct ExecutorOptions {
  int64_t block_size = 16;
  int64_t cpu_blocks = 0;    // CPU pool size in blocks; 0: from cpu_kv_bytes, else
  int64_t cpu_kv_bytes = 0;  // cpu_seqs sequences of max_len
  int64_t cpu_seqs = 1;
  int64_t cuda_blocks = 0;  // CUDA pool size in blocks; 0 = fill --gpu-memory-utilization
};

Result<LoadedExecutor> load_executor(const EngineConfig& config, const ExecutorOptions& options);

// Runs `model` on the CPU over a host cache of n_blocks blocks; `comm` must outlive it.
Result<std::unique_ptr<Executor>> make_cpu_executor(std::unique_ptr<Model> model,
                                                    Communicator& comm, int64_t n_blocks,
                                                    int64_t block_size);
// Runs a CudaModel; the block pool is the model's device pool.
Result<std::unique_ptr<Executor>> make_cuda_executor(std::unique_ptr<CudaModel> model);

}  // namespace strata
