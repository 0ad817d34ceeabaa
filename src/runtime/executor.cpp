#include "runtime/executor.h"

#include <vector>

#include "core/status.h"

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

}  // namespace strata
