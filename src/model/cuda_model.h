// CudaModel: the decoder forward pass on one GPU (the executor of DeepSpeed-Inference's
// single-GPU path). Weights live on the device as bf16 (or int8 / fp8-e4m3 with per-row scales,
// quantized at load), with Q/K/V and gate/up concatenated so each is one GEMM; the residual
// stream is f32 and every GEMM reads bf16 activations; the KV cache is a bf16 paged pool the
// caller addresses with block tables, exactly like the CPU Model's.
//
// Per layer (Deep-Fusion, Sec. III-B of the seed paper):
//   h = rms_norm(x) -> bf16                    (residual add already done by the last GEMM)
//   qkv = h Wqkv^T (+ b)                       one GEMM: SBI-GeMM <= 16 tokens, cuBLASLt above
//   q = rope(q); cache <- rope(k), v           one fused kernel, bf16 out
//   a = attention(q, cache)                    flash-decode (split-K) or flash-prefill, bf16 out
//   x += a Wo^T                                residual add fused into the GEMM epilogue
//   h = rms_norm(x) -> bf16
//   g = silu(h Wg^T) * (h Wu^T)                fused into the SBI epilogue (cuBLASLt: + 1 kernel)
//   x += g Wd^T
// Decode steps (one token per sequence) are captured as CUDA graphs per (batch bucket, KV-length
// bucket) and replayed; inputs are copied into fixed device buffers before each replay.
//
// No CUDA type appears here: the implementation (cuda_model.cpp) is compiled only with CUDA;
// without it create() fails with a clear message.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/config.h"
#include "model/model.h"
#include "strata/status.h"

namespace strata {

struct CudaModelOptions {
  int device = 0;
  DType weight_dtype = DType::kBF16;  // kBF16, kI8 or kFP8E4M3 (weight-only, per-row scales)
  int64_t max_num_tokens = 2048;      // most tokens in one forward (workspace size)
  int64_t max_num_seqs = 64;          // most sequences in one forward (decode batch)
  int64_t max_logit_rows = 512;       // most rows of logits one forward returns
  int64_t max_model_len = 0;          // context length (block-table width); 0 = the model's
  int64_t block_size = 16;
  int64_t num_kv_blocks = 0;            // 0: fill gpu_memory_utilization of the device
  double gpu_memory_utilization = 0.9;  // share of total device memory strata may hold
  bool cuda_graphs = true;              // replay captured decode steps
  // Random weights (`--load-format dummy`): uniform values with the std of N(0, 0.02), from a
  // counter-based hash of (seed, tensor, index); norms are 1.
  bool dummy_weights = false;
  uint64_t seed = 0;
};

class CudaModel {
 public:
  // Uploads the weights of `host` (a CPU Model, already sharded and re-laid-out by its loader;
  // GGUF blocks are dequantized to bf16 here) or, with options.dummy_weights, random weights of
  // `config`'s shapes (host may be null). Errors: kUnimplemented for architectures the CUDA path
  // does not run yet, kOutOfMemory naming bytes needed vs free, kNotFound without a GPU.
  static Result<std::unique_ptr<CudaModel>> create(const ModelConfig& config, const Model* host,
                                                   const CudaModelOptions& options);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const;
  const CudaModelOptions& options() const;  // with max_model_len / num_kv_blocks resolved
  int64_t num_kv_blocks() const;            // block ids the caller may use: [0, num_kv_blocks)
  size_t weight_bytes() const;              // device bytes of weights (incl. scales)
  size_t kv_cache_bytes() const;
  std::string device_name() const;

  // Same contract as Model::forward (block tables index this model's device KV pool), with one
  // restriction: the tokens of a sequence that appear together must have consecutive positions
  // (what prefill chunks and decode steps are). logits: [logit_rows, vocab] f32 on the host.
  Status forward(const ForwardBatch& batch, float* logits);
  // Greedy: ids[i] = argmax of logit row i, computed on the device (only the ids are copied).
  Status forward_argmax(const ForwardBatch& batch, int32_t* ids);
  // Swap support: one block of every layer's K and V (bf16) to or from host memory laid out
  // [n_layers, 2, block_size, n_heads_kv, head_dim]; kv_block_bytes() bytes.
  size_t kv_block_bytes() const;
  Status copy_block_to_host(int32_t block, void* host);
  Status copy_block_from_host(int32_t block, const void* host);
  // Waits for queued work (the forward calls return after their results are on the host).
  Status synchronize();

  // Counters for tests and `strata bench`: graph captures made and graph replays run.
  int64_t graph_captures() const;
  int64_t graph_replays() const;

 private:
  struct Impl;
  explicit CudaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Model shapes by name for `--model-config` (random weights): llama3-8b, llama2-7b,
// qwen2.5-7b, llama3-70b, llama3.2-1b. kNotFound lists the names.
Result<ModelConfig> model_config_preset(const std::string& name);

}  // namespace strata
