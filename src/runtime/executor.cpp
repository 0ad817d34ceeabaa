#include "runtime/executor.h"

#include <vector>

#include "core/status.h"
#include "runtime/model_loader.h"

namespace strata {

namespace {

int32_t argmax_row(const float* row, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (row[i] > row[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

class CpuExecutor final : public Executor {
 public:
  CpuExecutor(std::unique_ptr<Model> model, Communicator& comm, KvCache cache)
      : model_(std::move(model)), comm_(comm), cache_(std::move(cache)) {}
  const ModelConfig& config() const override { return model_->config(); }
  KvCache& cache() override { return cache_; }
  std::string backend_name() const override { return "CPU"; }
  Status forward(const ForwardBatch& batch, float* logits) override {
    return model_->forward(batch, cache_, comm_, logits);
  }
  Status forward_argmax(const ForwardBatch& batch, int32_t* ids) override {
    const int64_t V = model_->config().vocab;
    scratch_.resize(batch.logit_rows.size() * static_cast<size_t>(V));
    STRATA_RETURN_IF_ERROR(model_->forward(batch, cache_, comm_, scratch_.data()));
    for (size_t i = 0; i < batch.logit_rows.size(); ++i) {
      ids[i] = argmax_row(scratch_.data() + i * static_cast<size_t>(V), V);
    }
    return ok_status();
  }
  size_t block_bytes() const override {
    return static_cast<size_t>(cache_.block_floats()) * sizeof(float);
  }
  Status copy_block_to_host(int32_t block, void* host) override {
    cache_.copy_block_to_host(block, static_cast<float*>(host));
    return ok_status();
  }
  Status copy_block_from_host(int32_t block, const void* host) override {
    cache_.copy_block_from_host(block, static_cast<const float*>(host));
    return ok_status();
  }

 private:
  std::unique_ptr<Model> model_;
  Communicator& comm_;
  KvCache cache_;
  std::vector<float> scratch_;
};

class CudaExecutor final : public Executor {
 public:
  CudaExecutor(std::unique_ptr<CudaModel> model, KvCache cache)
      : model_(std::move(model)), cache_(std::move(cache)) {}
  const ModelConfig& config() const override { return model_->config(); }
  KvCache& cache() override { return cache_; }
  std::string backend_name() const override { return "CUDA"; }
  Status forward(const ForwardBatch& batch, float* logits) override {
    return model_->forward(batch, logits);
  }
  Status forward_argmax(const ForwardBatch& batch, int32_t* ids) override {
    return model_->forward_argmax(batch, ids);
  }
  size_t block_bytes() const override { return model_->kv_block_bytes(); }
  Status copy_block_to_host(int32_t block, void* host) override {
    return model_->copy_block_to_host(block, host);
  }
  Status copy_block_from_host(int32_t block, const void* host) override {
    return model_->copy_block_from_host(block, host);
  }

 private:
  std::unique_ptr<CudaModel> model_;
  KvCache cache_;
};

}  // namespace

Result<std::unique_ptr<Executor>> make_cpu_executor(std::unique_ptr<Model> model,
                                                    Communicator& comm, int64_t n_blocks,
                                                    int64_t block_size) {
  STRATA_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(model->kv_config(n_blocks, block_size)));
  return std::unique_ptr<Executor>(new CpuExecutor(std::move(model), comm, std::move(cache)));
}

Result<std::unique_ptr<Executor>> make_cuda_executor(std::unique_ptr<CudaModel> model) {
  const ModelConfig& c = model->config();
  KvCacheConfig kc;
  kc.n_layers = c.n_layers;
  kc.n_blocks = model->num_kv_blocks();
  kc.block_size = model->options().block_size;
  kc.n_heads_kv = c.n_heads_kv;
  kc.head_dim = c.head_dim;
  STRATA_ASSIGN_OR_RETURN(KvCache cache, KvCache::create_unbacked(kc));
  return std::unique_ptr<Executor>(new CudaExecutor(std::move(model), std::move(cache)));
}

Result<LoadedExecutor> load_executor(const EngineConfig& cfg, const ExecutorOptions& eo) {
  LoadedExecutor out;
  const bool cuda = cfg.device == "cuda" || cfg.device.rfind("cuda:", 0) == 0;
  if (!cuda && cfg.device != "cpu") {
    return errorf(StatusCode::kInvalidArgument, "--device '{}': use cpu, cuda or cuda:N",
                  cfg.device);
  }
  if (cfg.load_format != "auto" && cfg.load_format != "dummy") {
    return errorf(StatusCode::kInvalidArgument, "--load-format '{}': use auto or dummy",
                  cfg.load_format);
  }
  // A shape preset has no files to read: it implies dummy weights.
  const bool dummy = cfg.load_format == "dummy" || !cfg.model_config.empty();
  DType wdt = DType::kBF16;
  if (cfg.quantization == "int8") {
    wdt = DType::kI8;
  } else if (cfg.quantization == "fp8") {
    wdt = DType::kFP8E4M3;
  } else if (!cfg.quantization.empty() && cfg.quantization != "none") {
    return errorf(StatusCode::kInvalidArgument, "--quantization '{}': use none, int8 or fp8",
                  cfg.quantization);
  }
  if (!cuda && (wdt != DType::kBF16 || dummy)) {
    return Status(StatusCode::kInvalidArgument,
                  "--quantization, --load-format dummy and --model-config need --device cuda");
  }
  if (!cuda) {
    STRATA_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(cfg));
    out.info = std::move(loaded.info);
    out.max_len = loaded.max_len;
    out.comm = std::move(loaded.comm);
    out.tokenizer = std::move(loaded.tokenizer);
    int64_t n_blocks = eo.cpu_blocks;
    if (n_blocks <= 0 && eo.cpu_kv_bytes > 0) {
      const auto per =
          static_cast<int64_t>(KvCache::bytes_needed(loaded.model->kv_config(1, eo.block_size)));
      n_blocks = eo.cpu_kv_bytes / per;
      if (n_blocks < 1) {
        return errorf(StatusCode::kOutOfMemory,
                      "KV cache of {} bytes holds no block ({} bytes each)", eo.cpu_kv_bytes, per);
      }
    }
    if (n_blocks <= 0) n_blocks = (out.max_len + eo.block_size - 1) / eo.block_size * eo.cpu_seqs;
    STRATA_ASSIGN_OR_RETURN(
        out.exec, make_cpu_executor(std::move(loaded.model), *out.comm, n_blocks, eo.block_size));
    out.info.kv_cache_blocks = n_blocks;
    out.info.kv_block_size = eo.block_size;
    return out;
  }
  if (cfg.tensor_parallel_size != 1) {
    return Status(StatusCode::kUnimplemented,
                  "--tensor-parallel-size > 1 is not supported with --device cuda yet");
  }
  if (cfg.max_model_len < 0) {
    return errorf(StatusCode::kInvalidArgument, "--max-model-len must be >= 0");
  }
  if (cfg.gpu_memory_utilization <= 0.0 || cfg.gpu_memory_utilization > 1.0) {
    return errorf(StatusCode::kInvalidArgument, "--gpu-memory-utilization must be in (0, 1]");
  }
  CudaModelOptions o;
  o.device = cfg.device.size() > 5 ? std::atoi(cfg.device.c_str() + 5) : 0;
  o.weight_dtype = wdt;
  o.max_num_tokens = std::max<int64_t>(1, cfg.max_num_batched_tokens);
  o.max_num_seqs = cfg.max_num_seqs > 0 ? cfg.max_num_seqs : 64;
  o.max_model_len = cfg.max_model_len;
  o.block_size = eo.block_size;
  o.num_kv_blocks = eo.cuda_blocks;
  o.gpu_memory_utilization = cfg.gpu_memory_utilization;
  o.cuda_graphs = cfg.cuda_graphs;
  out.comm = make_single_rank_communicator();
  std::unique_ptr<CudaModel> model;
  if (dummy) {
    ModelConfig config;
    if (!cfg.model_config.empty()) {
      STRATA_ASSIGN_OR_RETURN(config, model_config_preset(cfg.model_config));
      out.info = make_model_info("dummy:" + cfg.model_config, config);
    } else {
      STRATA_ASSIGN_OR_RETURN(ModelFiles files, open_model(cfg.model, /*with_weights=*/false));
      config = files.config;
      out.info = std::move(files.info);
      out.tokenizer = std::move(files.tokenizer);
    }
    o.dummy_weights = true;
    STRATA_ASSIGN_OR_RETURN(model, CudaModel::create(config, nullptr, o));
  } else {
    STRATA_ASSIGN_OR_RETURN(LoadedModel loaded, load_model(cfg));
    out.info = std::move(loaded.info);
    out.tokenizer = std::move(loaded.tokenizer);
    STRATA_ASSIGN_OR_RETURN(model,
                            CudaModel::create(loaded.model->config(), loaded.model.get(), o));
  }
  out.max_len = model->options().max_model_len;
  out.info.backend = "CUDA";
  out.info.device_name = model->device_name();
  out.info.weight_format = std::string(dtype_name(wdt));
  out.info.device_weight_bytes = static_cast<int64_t>(model->weight_bytes());
  out.info.kv_cache_blocks = model->num_kv_blocks();
  out.info.kv_block_size = eo.block_size;
  STRATA_ASSIGN_OR_RETURN(out.exec, make_cuda_executor(std::move(model)));
  return out;
}

}  // namespace strata
