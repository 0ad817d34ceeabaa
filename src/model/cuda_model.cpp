// CudaModel implementation (see cuda_model.h for the per-layer dataflow). Host code only: every
// kernel is a strata::cuda launcher. Compiled into strata_engine only when CUDA is built.
#include "model/cuda_model.h"

#if !STRATA_HAS_CUDA

namespace strata {

struct CudaModel::Impl {};
CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

Result<std::unique_ptr<CudaModel>> CudaModel::create(const ModelConfig&, const Model*,
                                                     const CudaModelOptions&) {
  return Status(StatusCode::kUnimplemented,
                "this strata was built without CUDA (configure with -DSTRATA_CUDA=ON on a machine "
                "with the CUDA toolkit)");
}
const ModelConfig& CudaModel::config() const {
  std::abort();
}
const CudaModelOptions& CudaModel::options() const {
  std::abort();
}
int64_t CudaModel::num_kv_blocks() const {
  return 0;
}
size_t CudaModel::weight_bytes() const {
  return 0;
}
size_t CudaModel::kv_cache_bytes() const {
  return 0;
}
std::string CudaModel::device_name() const {
  return {};
}
Status CudaModel::forward(const ForwardBatch&, float*) {
  return Status(StatusCode::kUnimplemented, "built without CUDA");
}
Status CudaModel::forward_argmax(const ForwardBatch&, int32_t*) {
  return Status(StatusCode::kUnimplemented, "built without CUDA");
}
Status CudaModel::synchronize() {
  return ok_status();
}
size_t CudaModel::kv_block_bytes() const {
  return 0;
}
Status CudaModel::copy_block_to_host(int32_t, void*) {
  return Status(StatusCode::kUnimplemented, "built without CUDA");
}
Status CudaModel::copy_block_from_host(int32_t, const void*) {
  return Status(StatusCode::kUnimplemented, "built without CUDA");
}
int64_t CudaModel::graph_captures() const {
  return 0;
}
int64_t CudaModel::graph_replays() const {
  return 0;
}

}  // namespace strata

#else  // STRATA_HAS_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/quant.h"
#include "backends/cuda/cuda_allocator.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_kernels.h"
#include "core/env.h"
#include "core/half.h"
#include "core/status.h"

namespace strata {

namespace {

// One device allocation, freed on destruction.
class DeviceMem {
 public:
  DeviceMem() = default;
  ~DeviceMem() {
    if (p_ != nullptr) (void)cudaFree(p_);
  }
  DeviceMem(DeviceMem&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  DeviceMem& operator=(DeviceMem&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  Status allocate(size_t bytes, const char* what) {
    if (bytes == 0) bytes = 256;
    const cudaError_t err = cudaMalloc(&p_, bytes);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      return errorf(StatusCode::kOutOfMemory,
                    "cuda: out of memory allocating {} ({:.2f} GiB needed, {:.2f} GiB free of "
                    "{:.2f} GiB)",
                    what, static_cast<double>(bytes) / (1 << 30),
                    static_cast<double>(free_b) / (1 << 30),
                    static_cast<double>(total_b) / (1 << 30));
    }
    n_ = bytes;
    return ok_status();
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// A linear layer's weight on the device: [rows, cols] row-major, bf16 or int8/fp8 + row scales.
struct DevLinear {
  const void* w = nullptr;
  DType dtype = DType::kBF16;
  const float* scale = nullptr;
  const float* bias = nullptr;
  int64_t rows = 0, cols = 0;
};

struct DevLayer {
  const float* attn_norm = nullptr;  // f32 [hidden]
  const float* ffn_norm = nullptr;
  DevLinear qkv, o, gate_up, down;
};

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// Host rows of a weight tensor as f32 (float dtypes element-wise, GGUF blocks dequantized).
Status host_row_f32(const Tensor& t, int64_t r, float* dst) {
  const int64_t cols = t.cols();
  const char* base = static_cast<const char*>(t.data);
  const void* row = base + dtype_bytes(t.dtype, r * t.row_stride());
  if (dtype_info(t.dtype).is_quantized || t.dtype == DType::kF32 || t.dtype == DType::kF16 ||
      t.dtype == DType::kBF16) {
    return cpu::dequantize_row(t.dtype, row, dst, cols);
  }
  if (t.dtype == DType::kFP8E4M3) {
    for (int64_t c = 0; c < cols; ++c) dst[c] = cpu::load_as_f32(row, t.dtype, c);
    return ok_status();
  }
  return errorf(StatusCode::kUnimplemented, "cuda: weights of dtype {} cannot be uploaded",
                dtype_name(t.dtype));
}

}  // namespace

struct CudaModel::Impl {
  ModelConfig cfg;
  CudaModelOptions opt;
  std::unique_ptr<cuda::CudaDevice> dev;
  cuda::LaunchCtx ctx;

  // ---- weights ----
  std::vector<DeviceMem> weight_mem;
  size_t weight_bytes = 0;
  const void* tok_emb = nullptr;  // bf16 [vocab, hidden]
  std::vector<DevLayer> layers;
  const float* final_norm = nullptr;
  DevLinear lm_head;
  DeviceMem inv_freq;  // f32 [rotary/2]
  int64_t hq = 0, hkv = 0, D = 0, H = 0, F = 0, V = 0, qkv_dim = 0;

  // ---- KV cache: per layer K and V pools [n_blocks + 1, bs, hkv, D] bf16; the last block is
  // a scratch block that padded graph rows write to. ----
  DeviceMem kv;
  int64_t n_blocks = 0;  // usable blocks (the scratch block is n_blocks)
  int64_t max_blocks_per_seq = 0;

  // ---- workspace ----
  DeviceMem ws;
  float* x = nullptr;        // f32 [T, H]
  uint16_t* h = nullptr;     // bf16 [T, max(H, ...)]
  float* qkv = nullptr;      // f32 [T, qkv_dim]
  uint16_t* q = nullptr;     // bf16 [T, hq D]
  uint16_t* attn = nullptr;  // bf16 [T, hq D]
  float* ff = nullptr;       // [T, 2F] cuBLASLt gate/up output, bf16 (sized for f32)
  uint16_t* act = nullptr;   // bf16 [T, F]
  float* sel = nullptr;      // f32 [R, H]
  float* logits = nullptr;   // f32 [R, V]
  int32_t* ids = nullptr;    // [R]
  void* attn_ws = nullptr;   // split-K partials
  size_t attn_ws_bytes = 0;
  // Step inputs on the device (fixed addresses, so graphs can replay over them) and their
  // pinned host staging: tokens[T] | seq[T] | pos[T] | cu_q[S+1] | kv_len[S] | tables[S*B].
  DeviceMem step_dev;
  int32_t* step_host = nullptr;
  size_t step_ints = 0;
  int32_t *d_tokens = nullptr, *d_seq = nullptr, *d_pos = nullptr, *d_cu_q = nullptr,
          *d_kv_len = nullptr, *d_tables = nullptr;
  float* host_logits = nullptr;  // pinned [R, V]
  int32_t* host_ids = nullptr;   // pinned [R]

  // ---- profiling (STRATA_CUDA_PROFILE=1): events around each section of eager launches ----
  bool profile = false;
  struct ProfEvent {
    const char* name;
    cudaEvent_t begin, end;
  };
  std::vector<ProfEvent> prof_pending;
  std::vector<cudaEvent_t> prof_pool;
  std::map<std::string, std::pair<int64_t, double>> prof_totals;  // name -> (calls, ms)
  std::vector<std::string> prof_order;

  cudaEvent_t prof_event() {
    if (!prof_pool.empty()) {
      cudaEvent_t e = prof_pool.back();
      prof_pool.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    (void)cudaEventCreate(&e);
    return e;
  }
  // Marks the start of section `name`; the next mark (or prof_flush) ends it.
  // Sections of decode steps (one token per sequence) and of other passes are kept apart.
  bool prof_decode = false;
  void prof_mark(const char* name) {
    if (!profile) return;
    if (name != nullptr) {
      name = prof_name(name);
    }
    if (!prof_pending.empty() && prof_pending.back().end == nullptr) {
      cudaEvent_t e = prof_event();
      (void)cudaEventRecord(e, ctx.stream);
      prof_pending.back().end = e;
    }
    if (name != nullptr) {
      cudaEvent_t b = prof_event();
      (void)cudaEventRecord(b, ctx.stream);
      prof_pending.push_back({name, b, nullptr});
    }
  }
  const char* prof_name(const char* name) {
    static std::map<std::string, std::string> names;  // stable storage for "decode/<name>"
    const std::string key = std::string(prof_decode ? "decode/" : "prefill/") + name;
    return names.try_emplace(key, key).first->second.c_str();
  }
  // After a synchronize: add the finished sections to the totals.
  void prof_collect() {
    for (ProfEvent& ev : prof_pending) {
      float ms = 0.0f;
      if (ev.end != nullptr && cudaEventElapsedTime(&ms, ev.begin, ev.end) == cudaSuccess) {
        auto [it, fresh] = prof_totals.try_emplace(ev.name, 0, 0.0);
        if (fresh) prof_order.push_back(ev.name);
        it->second.first++;
        it->second.second += ms;
      }
      prof_pool.push_back(ev.begin);
      if (ev.end != nullptr) prof_pool.push_back(ev.end);
    }
    prof_pending.clear();
  }
  void prof_report() {
    if (!profile || prof_totals.empty()) return;
    double total = 0;
    for (auto& [k, v] : prof_totals) total += v.second;
    std::fprintf(stderr, "strata: CUDA profile (eager launches, event-timed sections)\n");
    std::fprintf(stderr, "  %-22s %8s %12s %10s %7s\n", "section", "calls", "total ms", "us/call",
                 "share");
    for (const std::string& k : prof_order) {
      const auto& v = prof_totals[k];
      std::fprintf(stderr, "  %-22s %8lld %12.3f %10.1f %6.1f%%\n", k.c_str(),
                   static_cast<long long>(v.first), v.second,
                   1e3 * v.second / static_cast<double>(std::max<int64_t>(1, v.first)),
                   100.0 * v.second / total);
    }
  }

  // ---- graphs: (batch bucket, kv bucket) -> executable graph ----
  std::map<std::pair<int64_t, int64_t>, cudaGraphExec_t> graphs;
  int64_t captures = 0, replays = 0;

  ~Impl() {
    if (dev) (void)dev->make_current();
    prof_report();
    for (ProfEvent& ev : prof_pending) prof_pool.push_back(ev.begin);
    for (cudaEvent_t e : prof_pool) {
      if (e != nullptr) (void)cudaEventDestroy(e);
    }
    for (auto& [k, g] : graphs) (void)cudaGraphExecDestroy(g);
    if (step_host != nullptr) (void)cudaFreeHost(step_host);
    if (host_logits != nullptr) (void)cudaFreeHost(host_logits);
    if (host_ids != nullptr) (void)cudaFreeHost(host_ids);
  }

  Status check_supported() const {
    const ModelConfig& c = cfg;
    auto no = [&](const char* what) {
      return errorf(StatusCode::kUnimplemented,
                    "cuda: {} ({}) is not supported on the CUDA backend yet; run with --device cpu",
                    what, c.architecture);
    };
    if (c.norm != NormType::kRmsNorm) return no("LayerNorm");
    if (c.pos_embedding != PosEmbedding::kRope) return no("learned position embeddings");
    if (c.parallel_block) return no("the parallel attention/MLP block");
    if (c.qk_norm || c.post_norms) return no("q/k norms and post norms (Gemma-3)");
    if (!c.gated_mlp) return no("an ungated MLP");
    if (c.sliding_window > 0 && !c.layer_is_sliding.empty()) return no("per-layer sliding windows");
    if (c.hidden % 8 != 0 || c.ffn_dim % 8 != 0 || (c.n_heads * c.head_dim) % 8 != 0) {
      return no("dimensions that are not multiples of 8");
    }
    return ok_status();
  }

  // ---- weight upload ----------------------------------------------------------------------

  Result<void*> alloc_weight(size_t bytes, const char* what) {
    DeviceMem m;
    STRATA_RETURN_IF_ERROR(m.allocate(bytes, what));
    void* p = m.get();
    weight_bytes += bytes;
    weight_mem.push_back(std::move(m));
    return p;
  }

  // f32 vector on the device (norm weights, biases, inv_freq), from host floats.
  Result<const float*> upload_f32(const std::vector<float>& v, const char* what) {
    STRATA_ASSIGN_OR_RETURN(void* p, alloc_weight(v.size() * sizeof(float), what));
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return static_cast<const float*>(p);
  }

  Result<const float*> upload_vector(const Tensor& t, int64_t n, const char* what) {
    std::vector<float> v(static_cast<size_t>(n));
    if (t.defined()) {
      for (int64_t i = 0; i < n; ++i)
        v[static_cast<size_t>(i)] = cpu::load_as_f32(t.data, t.dtype, i);
    } else {
      std::fill(v.begin(), v.end(), 1.0f);  // dummy norms
    }
    return upload_f32(v, what);
  }

  // A [rows, cols] weight from the row blocks `parts` (host tensors stacked in order), or random
  // values (dummy). Stored bf16, or quantized per row to opt.weight_dtype.
  Result<DevLinear> upload_linear(const std::vector<const Tensor*>& parts, int64_t rows,
                                  int64_t cols, uint64_t tensor_id, const char* what,
                                  bool allow_quant = true) {
    DevLinear L;
    L.rows = rows;
    L.cols = cols;
    const DType wdt = allow_quant ? opt.weight_dtype : DType::kBF16;
    L.dtype = wdt;
    const size_t n = static_cast<size_t>(rows * cols);
    // bf16 values: either the final buffer (bf16) or a scratch that is then quantized.
    DeviceMem scratch;
    uint16_t* bf = nullptr;
    if (wdt == DType::kBF16) {
      STRATA_ASSIGN_OR_RETURN(void* p, alloc_weight(n * 2, what));
      bf = static_cast<uint16_t*>(p);
    } else {
      STRATA_RETURN_IF_ERROR(scratch.allocate(n * 2, "weight staging"));
      bf = scratch.get<uint16_t>();
    }
    if (opt.dummy_weights) {
      // std of N(0, 0.02) from a uniform: half-width 0.02 * sqrt(3).
      STRATA_RETURN_IF_ERROR(cuda::fill_random_bf16(ctx, bf, static_cast<int64_t>(n),
                                                    opt.seed * 1000003ull + tensor_id, 0.0346410f));
    } else {
      std::vector<uint16_t> host(n);
      std::vector<float> row(static_cast<size_t>(cols));
      int64_t r0 = 0;
      for (const Tensor* t : parts) {
        if (t->cols() != cols) {
          return errorf(StatusCode::kInternal, "cuda: {} part has {} columns, expected {}", what,
                        t->cols(), cols);
        }
        for (int64_t r = 0; r < t->rows(); ++r) {
          STRATA_RETURN_IF_ERROR(host_row_f32(*t, r, row.data()));
          uint16_t* dst = host.data() + (r0 + r) * cols;
          for (int64_t c = 0; c < cols; ++c) dst[c] = f32_to_bf16(row[static_cast<size_t>(c)]);
        }
        r0 += t->rows();
      }
      if (r0 != rows) {
        return errorf(StatusCode::kInternal, "cuda: {} has {} rows, expected {}", what, r0, rows);
      }
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(bf, host.data(), n * 2, cudaMemcpyHostToDevice));
    }
    if (wdt == DType::kBF16) {
      L.w = bf;
    } else {
      STRATA_ASSIGN_OR_RETURN(void* q, alloc_weight(n, what));
      STRATA_ASSIGN_OR_RETURN(void* s, alloc_weight(static_cast<size_t>(rows) * 4, "row scales"));
      STRATA_RETURN_IF_ERROR(
          cuda::quantize_rows(ctx, bf, rows, cols, wdt, q, static_cast<float*>(s)));
      L.w = q;
      L.scale = static_cast<const float*>(s);
      // The staging buffer is freed on return: finish the quantization first.
      STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    }
    return L;
  }

  Result<const float*> upload_bias(const std::vector<const Tensor*>& parts, const char* what) {
    std::vector<float> v;
    for (const Tensor* t : parts) {
      if (!t->defined()) return static_cast<const float*>(nullptr);
      for (int64_t i = 0; i < t->numel(); ++i) v.push_back(cpu::load_as_f32(t->data, t->dtype, i));
    }
    if (opt.dummy_weights) std::fill(v.begin(), v.end(), 0.0f);
    return upload_f32(v, what);
  }

  Status load_weights(const Model* host) {
    const ModelConfig& c = cfg;
    // Fail early, with the numbers, when the weights cannot fit.
    {
      const int64_t per = opt.weight_dtype == DType::kBF16 ? 2 : 1;
      const int64_t emb = c.vocab * c.hidden * 2;  // the embedding table stays bf16
      const int64_t head = c.tie_word_embeddings ? 0 : c.vocab * c.hidden * per;
      const int64_t body =
          (c.parameter_count() - c.vocab * c.hidden * (c.tie_word_embeddings ? 1 : 2)) * per;
      const int64_t need = emb + head + body;
      size_t free_b = 0, total_b = 0;
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
      if (static_cast<size_t>(need) > free_b) {
        return errorf(StatusCode::kOutOfMemory,
                      "cuda: the weights need {:.2f} GiB ({}), but {} has {:.2f} GiB free of "
                      "{:.2f} GiB; try --quantization int8 or fp8, or a smaller model",
                      static_cast<double>(need) / (1 << 30), dtype_name(opt.weight_dtype),
                      dev->name(), static_cast<double>(free_b) / (1 << 30),
                      static_cast<double>(total_b) / (1 << 30));
      }
    }
    const ModelWeights* hw = host ? &host->weights() : nullptr;
    uint64_t id = 1;
    {
      std::vector<const Tensor*> parts;
      if (hw) parts.push_back(&hw->tok_embeddings);
      STRATA_ASSIGN_OR_RETURN(DevLinear e, upload_linear(parts, V, H, id++, "token embeddings",
                                                         /*allow_quant=*/false));
      tok_emb = e.w;
    }
    layers.resize(static_cast<size_t>(c.n_layers));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      DevLayer& d = layers[static_cast<size_t>(l)];
      const LayerWeights* L = hw ? &hw->layers[static_cast<size_t>(l)] : nullptr;
      Tensor none;
      STRATA_ASSIGN_OR_RETURN(d.attn_norm, upload_vector(L ? L->attn_norm.w : none, H, "norm"));
      STRATA_ASSIGN_OR_RETURN(d.ffn_norm, upload_vector(L ? L->ffn_norm.w : none, H, "norm"));
      std::vector<const Tensor*> qkv_parts, gu_parts;
      if (L) {
        qkv_parts = {&L->q.w, &L->k.w, &L->v.w};
        gu_parts = {&L->gate.w, &L->up.w};
      }
      STRATA_ASSIGN_OR_RETURN(d.qkv, upload_linear(qkv_parts, qkv_dim, H, id++, "qkv weights"));
      STRATA_ASSIGN_OR_RETURN(
          d.o, upload_linear(L ? std::vector<const Tensor*>{&L->o.w} : std::vector<const Tensor*>{},
                             H, hq * D, id++, "o_proj weights"));
      STRATA_ASSIGN_OR_RETURN(d.gate_up,
                              upload_linear(gu_parts, 2 * F, H, id++, "gate/up weights"));
      STRATA_ASSIGN_OR_RETURN(d.down, upload_linear(L ? std::vector<const Tensor*>{&L->down.w}
                                                      : std::vector<const Tensor*>{},
                                                    H, F, id++, "down_proj weights"));
      if (L && c.qkv_bias) {
        STRATA_ASSIGN_OR_RETURN(d.qkv.bias, upload_bias({&L->q.b, &L->k.b, &L->v.b}, "qkv bias"));
      } else if (!L && c.qkv_bias) {
        STRATA_ASSIGN_OR_RETURN(
            d.qkv.bias,
            upload_f32(std::vector<float>(static_cast<size_t>(qkv_dim), 0.0f), "qkv bias"));
      }
      if (L && L->o.b.defined()) {
        STRATA_ASSIGN_OR_RETURN(d.o.bias, upload_bias({&L->o.b}, "o bias"));
      }
      if (L && L->gate.b.defined() && L->up.b.defined()) {
        STRATA_ASSIGN_OR_RETURN(d.gate_up.bias,
                                upload_bias({&L->gate.b, &L->up.b}, "gate/up bias"));
      }
      if (L && L->down.b.defined()) {
        STRATA_ASSIGN_OR_RETURN(d.down.bias, upload_bias({&L->down.b}, "down bias"));
      }
    }
    Tensor none;
    STRATA_ASSIGN_OR_RETURN(final_norm,
                            upload_vector(hw ? hw->final_norm.w : none, H, "final norm"));
    if (c.tie_word_embeddings && opt.weight_dtype == DType::kBF16) {
      lm_head = DevLinear{tok_emb, DType::kBF16, nullptr, nullptr, V, H};
    } else {
      std::vector<const Tensor*> parts;
      if (hw) parts.push_back(&hw->lm_head.w);
      STRATA_ASSIGN_OR_RETURN(lm_head, upload_linear(parts, V, H, id++, "lm_head"));
    }
    if (hw && hw->lm_head.b.defined()) {
      STRATA_ASSIGN_OR_RETURN(lm_head.bias, upload_bias({&hw->lm_head.b}, "lm_head bias"));
    }
    // Rotary frequencies.
    std::vector<float> freq;
    if (host) {
      freq = host->inv_freq();
    } else {
      const int64_t half = c.rotary_dim / 2;
      for (int64_t i = 0; i < half; ++i) {
        freq.push_back(static_cast<float>(
            1.0 / std::pow(static_cast<double>(c.rope_theta),
                           static_cast<double>(2 * i) / static_cast<double>(c.rotary_dim))));
      }
    }
    STRATA_RETURN_IF_ERROR(inv_freq.allocate(freq.size() * sizeof(float), "rope frequencies"));
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(inv_freq.get(), freq.data(), freq.size() * sizeof(float),
                                           cudaMemcpyHostToDevice));
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    return ok_status();
  }

  // ---- workspace, step buffers and the KV pool --------------------------------------------

  Status allocate_runtime() {
    const int64_t T = opt.max_num_tokens, S = opt.max_num_seqs, R = opt.max_logit_rows;
    max_blocks_per_seq = (opt.max_model_len + opt.block_size - 1) / opt.block_size;
    auto up = [](int64_t b) { return static_cast<size_t>((b + 255) / 256 * 256); };
    attn_ws_bytes =
        cuda::varlen_attention_workspace_bytes(std::max(S, T), hq, D, opt.max_model_len);
    const int64_t hcols = std::max(H, F);
    const size_t sizes[] = {up(T * H * 4),
                            up(T * hcols * 2),
                            up(T * qkv_dim * 4),
                            up(T * hq * D * 2),
                            up(T * hq * D * 2),
                            up(T * 2 * F * 4),
                            up(T * F * 2),
                            up(R * H * 4),
                            up(R * V * 4),
                            up(R * 4),
                            up(static_cast<int64_t>(attn_ws_bytes))};
    size_t total = 0;
    for (size_t s : sizes) total += s;
    STRATA_RETURN_IF_ERROR(ws.allocate(total, "activation workspace"));
    char* p = ws.get<char>();
    void* ptrs[11];
    for (int i = 0; i < 11; ++i) {
      ptrs[i] = p;
      p += sizes[i];
    }
    x = static_cast<float*>(ptrs[0]);
    h = static_cast<uint16_t*>(ptrs[1]);
    qkv = static_cast<float*>(ptrs[2]);
    q = static_cast<uint16_t*>(ptrs[3]);
    attn = static_cast<uint16_t*>(ptrs[4]);
    ff = static_cast<float*>(ptrs[5]);
    act = static_cast<uint16_t*>(ptrs[6]);
    sel = static_cast<float*>(ptrs[7]);
    logits = static_cast<float*>(ptrs[8]);
    ids = static_cast<int32_t*>(ptrs[9]);
    attn_ws = ptrs[10];

    step_ints = static_cast<size_t>(3 * T + (S + 1) + S + S * max_blocks_per_seq);
    STRATA_RETURN_IF_ERROR(step_dev.allocate(step_ints * 4, "step inputs"));
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(reinterpret_cast<void**>(&step_host), step_ints * 4, cudaHostAllocDefault));
    d_tokens = step_dev.get<int32_t>();
    d_seq = d_tokens + T;
    d_pos = d_seq + T;
    d_cu_q = d_pos + T;
    d_kv_len = d_cu_q + S + 1;
    d_tables = d_kv_len + S;
    STRATA_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_logits),
                                              static_cast<size_t>(R * V) * 4,
                                              cudaHostAllocDefault));
    STRATA_CUDA_RETURN_IF_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_ids),
                                              static_cast<size_t>(R) * 4, cudaHostAllocDefault));

    // KV pool: what is asked for, or what fits under gpu_memory_utilization.
    const size_t block_bytes = static_cast<size_t>(2 * cfg.n_layers * opt.block_size * hkv * D * 2);
    if (opt.num_kv_blocks <= 0) {
      size_t free_b = 0, total_b = 0;
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_b, &total_b));
      const double budget = opt.gpu_memory_utilization * static_cast<double>(total_b);
      const double used = static_cast<double>(total_b - free_b);
      // Leave room for cuBLASLt, graphs and the CUDA context's own growth.
      const double avail = std::min(budget - used, static_cast<double>(free_b)) - 512.0 * (1 << 20);
      const int64_t fit =
          avail > 0 ? static_cast<int64_t>(avail / static_cast<double>(block_bytes)) : 0;
      if (fit < max_blocks_per_seq + 1) {
        return errorf(
            StatusCode::kOutOfMemory,
            "cuda: no room for the KV cache: one {}-token sequence needs {:.2f} GiB but "
            "{:.2f} GiB is left after the weights ({:.2f} GiB) under "
            "--gpu-memory-utilization {}; lower --max-model-len or quantize the weights",
            opt.max_model_len,
            static_cast<double>(block_bytes * static_cast<size_t>(max_blocks_per_seq)) / (1 << 30),
            std::max(0.0, avail) / (1 << 30), static_cast<double>(weight_bytes) / (1 << 30),
            opt.gpu_memory_utilization);
      }
      opt.num_kv_blocks = fit - 1;
    }
    n_blocks = opt.num_kv_blocks;
    STRATA_RETURN_IF_ERROR(
        kv.allocate(block_bytes * static_cast<size_t>(n_blocks + 1), "KV cache"));
    return ok_status();
  }

  uint16_t* k_pool(int64_t l) const {
    const size_t per = static_cast<size_t>((n_blocks + 1) * opt.block_size * hkv * D);
    return kv.get<uint16_t>() + (2 * static_cast<size_t>(l)) * per;
  }
  uint16_t* v_pool(int64_t l) const {
    return k_pool(l) + static_cast<size_t>((n_blocks + 1) * opt.block_size * hkv * D);
  }

  size_t block_bytes() const {
    return static_cast<size_t>(2 * cfg.n_layers * opt.block_size * hkv * D) * 2;
  }

  Status copy_block(int32_t block, void* host, bool to_host) {
    if (block < 0 || block >= n_blocks) {
      return errorf(StatusCode::kOutOfRange, "cuda: KV block {} outside the pool of {}", block,
                    n_blocks);
    }
    STRATA_RETURN_IF_ERROR(dev->make_current());
    const size_t per = static_cast<size_t>(opt.block_size * hkv * D);  // elements of one block
    char* h = static_cast<char*>(host);
    for (int64_t l = 0; l < cfg.n_layers; ++l) {
      for (int which = 0; which < 2; ++which) {
        uint16_t* dev_block =
            (which == 0 ? k_pool(l) : v_pool(l)) + static_cast<size_t>(block) * per;
        char* slot = h + (static_cast<size_t>(2 * l + which) * per) * 2;
        STRATA_CUDA_RETURN_IF_ERROR(
            to_host
                ? cudaMemcpyAsync(slot, dev_block, per * 2, cudaMemcpyDeviceToHost, ctx.stream)
                : cudaMemcpyAsync(dev_block, slot, per * 2, cudaMemcpyHostToDevice, ctx.stream));
      }
    }
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    return ok_status();
  }

  // ---- the forward pass ---------------------------------------------------------------------

  struct Step {
    int64_t n = 0;                                      // tokens (padded for graphs)
    int64_t n_runs = 0;                                 // attention sequences (padded)
    int64_t max_q = 0;                                  // longest run
    int64_t max_kv = 0;                                 // upper bound of kv_len (graph bucket)
    int64_t n_out = 0;                                  // logit rows
    std::vector<std::pair<int64_t, int64_t>> out_runs;  // (first token, count) of logit rows
    bool all_rows = false;                              // logit rows == all tokens in order
  };

  Status linear(const DevLinear& w, const uint16_t* in, int64_t in_stride, void* out,
                DType out_dtype, int64_t out_stride, int64_t n, bool accumulate, bool gated) {
    GpuLinearParams p;
    p.x = in;
    p.x_stride = in_stride;
    p.w = w.w;
    p.w_dtype = w.dtype;
    p.w_stride = w.cols;
    p.w_scale = w.scale;
    p.bias = w.bias;
    p.out = out;
    p.out_dtype = out_dtype;
    p.out_stride = out_stride;
    p.n_tokens = n;
    p.in_features = w.cols;
    p.out_features = gated ? w.rows / 2 : w.rows;
    p.accumulate = accumulate;
    p.gated_silu = gated;
    return cuda::linear(ctx, p);
  }

  Status rms_norm(const float* w, int64_t n) {
    NormBf16Params p;
    p.x = x;
    p.x_stride = H;
    p.weight = w;
    p.weight_dtype = DType::kF32;
    p.out = h;
    p.out_stride = H;
    p.n_tokens = n;
    p.hidden = H;
    p.eps = cfg.norm_eps;
    p.weight_offset = cfg.norm_weight_offset;
    return cuda::norm_bf16(ctx, p);
  }

  // Everything from the embedding to the logits (and argmax) of the rows in `st`; only device
  // work on ctx.stream, no host sync: the body of a graph capture.
  Status launch(const Step& st) {
    const ModelConfig& c = cfg;
    const int64_t n = st.n;
    prof_decode = st.max_q == 1;
    prof_mark("embedding");
    {
      EmbeddingParams p;
      p.table = tok_emb;
      p.table_dtype = DType::kBF16;
      p.table_stride = H;
      p.ids = d_tokens;
      p.out = x;
      p.out_stride = H;
      p.n_tokens = n;
      p.hidden = H;
      p.vocab_offset = 0;
      p.vocab_shard = V;
      p.vocab = V;
      STRATA_RETURN_IF_ERROR(cuda::embedding(ctx, p));
    }
    if (c.embedding_scale != 1.0f) {
      ScaleParams p{x, H, n, H, c.embedding_scale};
      STRATA_RETURN_IF_ERROR(cuda::scale(ctx, p));
    }
    const float attn_scale =
        c.attn_scale > 0.0f ? c.attn_scale : 1.0f / std::sqrt(static_cast<float>(D));
    PagedKvBf16Params cache;
    cache.block_tables = d_tables;
    cache.max_blocks_per_seq = max_blocks_per_seq;
    cache.n_seqs = st.n_runs;
    cache.n_blocks = n_blocks + 1;
    cache.block_size = opt.block_size;
    cache.n_heads_kv = hkv;
    cache.head_dim = D;
    const bool sbi = n <= cuda::sbi_max_tokens();
    for (int64_t l = 0; l < c.n_layers; ++l) {
      const DevLayer& L = layers[static_cast<size_t>(l)];
      cache.k_cache = k_pool(l);
      cache.v_cache = v_pool(l);
      prof_mark("attn_norm");
      STRATA_RETURN_IF_ERROR(rms_norm(L.attn_norm, n));
      prof_mark("qkv");
      STRATA_RETURN_IF_ERROR(linear(L.qkv, h, H, qkv, DType::kF32, qkv_dim, n, false, false));
      prof_mark("rope_kv");
      {
        RopeKvAppendParams p;
        p.qkv = qkv;
        p.qkv_stride = qkv_dim;
        p.q_out = q;
        p.q_out_stride = hq * D;
        p.token_seq = d_seq;
        p.token_pos = d_pos;
        p.n_tokens = n;
        p.n_heads = hq;
        p.inv_freq = inv_freq.get<float>();
        p.rotary_dim = c.rotary_dim;
        p.neox_style = c.rope_neox_style;
        p.cache = cache;
        STRATA_RETURN_IF_ERROR(cuda::rope_kv_append(ctx, p));
      }
      prof_mark("attention");
      {
        VarlenAttentionParams p;
        p.q = q;
        p.q_stride = hq * D;
        p.out = attn;
        p.out_stride = hq * D;
        p.cu_q = d_cu_q;
        p.kv_len = d_kv_len;
        p.n_seqs = st.n_runs;
        p.n_heads = hq;
        p.max_q_len = st.max_q;
        p.max_kv_len = st.max_kv;
        p.cache = cache;
        p.scale = attn_scale;
        p.sliding_window = c.sliding_window;
        p.logit_softcap = 0.0f;
        p.workspace = attn_ws;
        p.workspace_bytes = attn_ws_bytes;
        STRATA_RETURN_IF_ERROR(cuda::varlen_attention(ctx, p));
      }
      prof_mark("o_proj");
      STRATA_RETURN_IF_ERROR(linear(L.o, attn, hq * D, x, DType::kF32, H, n, true, false));
      prof_mark("ffn_norm");
      STRATA_RETURN_IF_ERROR(rms_norm(L.ffn_norm, n));
      prof_mark("gate_up_act");
      if (sbi && c.activation == Activation::kSilu) {
        STRATA_RETURN_IF_ERROR(linear(L.gate_up, h, H, act, DType::kBF16, F, n, false, true));
      } else {
        // gate/up in bf16 (half the bytes of f32 through memory), then silu(gate) * up.
        uint16_t* ff16 = reinterpret_cast<uint16_t*>(ff);
        STRATA_RETURN_IF_ERROR(linear(L.gate_up, h, H, ff16, DType::kBF16, 2 * F, n, false, false));
        GatedActBf16Params p;
        p.in_bf16 = ff16;
        p.in_stride = 2 * F;
        p.out = act;
        p.out_stride = F;
        p.n_tokens = n;
        p.ffn_dim = F;
        p.act = c.activation;
        STRATA_RETURN_IF_ERROR(cuda::gated_act_bf16(ctx, p));
      }
      prof_mark("down");
      STRATA_RETURN_IF_ERROR(linear(L.down, act, F, x, DType::kF32, H, n, true, false));
    }
    prof_mark(st.n_out == 0 ? nullptr : "lm_head");
    if (st.n_out == 0) return ok_status();
    // Final norm and LM head on the logit rows only.
    const float* rows = x;
    if (!st.all_rows) {
      int64_t r = 0;
      for (const auto& [first, count] : st.out_runs) {
        STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sel + r * H, x + first * H,
                                                    static_cast<size_t>(count * H) * 4,
                                                    cudaMemcpyDeviceToDevice, ctx.stream));
        r += count;
      }
      rows = sel;
    }
    {
      NormBf16Params p;
      p.x = const_cast<float*>(rows);
      p.x_stride = H;
      p.weight = final_norm;
      p.weight_dtype = DType::kF32;
      p.out = h;
      p.out_stride = H;
      p.n_tokens = st.n_out;
      p.hidden = H;
      p.eps = c.norm_eps;
      p.weight_offset = c.norm_weight_offset;
      STRATA_RETURN_IF_ERROR(cuda::norm_bf16(ctx, p));
    }
    STRATA_RETURN_IF_ERROR(linear(lm_head, h, H, logits, DType::kF32, V, st.n_out, false, false));
    if (c.final_logit_softcap > 0.0f) {
      SoftcapParams p{logits, V, st.n_out, V, c.final_logit_softcap};
      STRATA_RETURN_IF_ERROR(cuda::softcap(ctx, p));
    }
    ArgmaxParams p{logits, V, st.n_out, V, ids};
    STRATA_RETURN_IF_ERROR(cuda::argmax(ctx, p));
    prof_mark(nullptr);
    return ok_status();
  }

  // Validates the batch and packs the step inputs into pinned staging; fills `st`. Graph-
  // eligible decode steps are padded to the bucket with rows writing to the scratch block.
  Status prepare(const ForwardBatch& b, Step& st, bool& use_graph) {
    const int64_t n = static_cast<int64_t>(b.tokens.size());
    const int64_t T = opt.max_num_tokens, S = opt.max_num_seqs;
    if (static_cast<int64_t>(b.token_seq.size()) != n ||
        static_cast<int64_t>(b.token_pos.size()) != n) {
      return errorf(StatusCode::kInvalidArgument,
                    "forward: token, sequence and position counts differ");
    }
    if (n > T) {
      return errorf(StatusCode::kInvalidArgument,
                    "cuda forward: {} tokens in one batch, the workspace holds {} (max_num_tokens)",
                    n, T);
    }
    if (b.max_blocks_per_seq > max_blocks_per_seq) {
      return errorf(StatusCode::kInvalidArgument,
                    "cuda forward: block tables of {} blocks exceed the {} of --max-model-len {}",
                    b.max_blocks_per_seq, max_blocks_per_seq, opt.max_model_len);
    }
    const int64_t n_out = static_cast<int64_t>(b.logit_rows.size());
    if (n_out > opt.max_logit_rows) {
      return errorf(StatusCode::kInvalidArgument, "cuda forward: {} logit rows, at most {}", n_out,
                    opt.max_logit_rows);
    }
    // Runs: maximal spans of one sequence at consecutive positions.
    std::vector<int64_t> run_begin, run_seq;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t s = b.token_seq[static_cast<size_t>(i)];
      const int32_t pos = b.token_pos[static_cast<size_t>(i)];
      if (s < 0 || s >= b.n_seqs) {
        return errorf(StatusCode::kOutOfRange, "forward: token {} names sequence {} of {}", i, s,
                      b.n_seqs);
      }
      if (pos < 0 || pos >= opt.max_model_len || pos / opt.block_size >= b.max_blocks_per_seq) {
        return errorf(StatusCode::kOutOfRange, "position {} is past the context length {}", pos,
                      opt.max_model_len);
      }
      const bool cont = i > 0 && b.token_seq[static_cast<size_t>(i - 1)] == s &&
                        b.token_pos[static_cast<size_t>(i - 1)] + 1 == pos;
      if (!cont) {
        run_begin.push_back(i);
        run_seq.push_back(s);
      }
    }
    const int64_t n_runs = static_cast<int64_t>(run_begin.size());
    run_begin.push_back(n);
    bool all_rows = n_out == n;
    for (int64_t i = 0; i < n_out; ++i) {
      const int32_t r = b.logit_rows[static_cast<size_t>(i)];
      if (r < 0 || r >= n)
        return errorf(StatusCode::kInvalidArgument, "forward: bad logit row {}", r);
      if (r != i) all_rows = false;
    }
    int64_t max_q = 0, max_kv = 0;
    for (int64_t r = 0; r < n_runs; ++r) {
      const int64_t len = run_begin[static_cast<size_t>(r + 1)] - run_begin[static_cast<size_t>(r)];
      max_q = std::max(max_q, len);
      const int64_t last = run_begin[static_cast<size_t>(r + 1)] - 1;
      max_kv = std::max<int64_t>(max_kv, b.token_pos[static_cast<size_t>(last)] + 1);
    }
    // Graphs: pure decode (one token per run, logits for every row), within the captured sizes.
    use_graph = opt.cuda_graphs && max_q == 1 && all_rows && n <= S;
    int64_t n_pad = n, kv_bound = max_kv;
    if (use_graph) {
      n_pad = std::min(next_pow2(n), S);
      kv_bound =
          std::min(std::max<int64_t>(next_pow2(max_kv), 256), max_blocks_per_seq * opt.block_size);
    }
    // Pack: tokens | seq | pos | cu_q | kv_len | tables.
    int32_t* tok = step_host;
    int32_t* seq = tok + T;
    int32_t* pos = seq + T;
    int32_t* cu = pos + T;
    int32_t* kvl = cu + S + 1;
    int32_t* tab = kvl + S;
    const int64_t B = max_blocks_per_seq;
    const int64_t runs_total = n_runs + (n_pad - n);
    if (runs_total > S) {
      // Prefill of many short runs beyond max_num_seqs: the run arrays hold S entries.
      return errorf(StatusCode::kInvalidArgument,
                    "cuda forward: {} sequences in one batch, at most {} (max_num_seqs)",
                    runs_total, S);
    }
    for (int64_t i = 0; i < n; ++i) {
      tok[i] = b.tokens[static_cast<size_t>(i)];
      pos[i] = b.token_pos[static_cast<size_t>(i)];
      if (tok[i] < 0 || tok[i] >= V) {
        return errorf(StatusCode::kOutOfRange,
                      "forward: token id {} is outside the vocabulary (0..{})", tok[i], V - 1);
      }
    }
    for (int64_t r = 0; r < n_runs; ++r) {
      const int64_t b0 = run_begin[static_cast<size_t>(r)],
                    b1 = run_begin[static_cast<size_t>(r + 1)];
      for (int64_t i = b0; i < b1; ++i) seq[i] = static_cast<int32_t>(r);
      cu[r] = static_cast<int32_t>(b0);
      kvl[r] = b.token_pos[static_cast<size_t>(b1 - 1)] + 1;
      const int32_t* src = b.block_tables + run_seq[static_cast<size_t>(r)] * b.max_blocks_per_seq;
      for (int64_t k = 0; k < B; ++k) {
        const int32_t blk = k < b.max_blocks_per_seq ? src[k] : -1;
        if (k * opt.block_size < kvl[r] && (blk < 0 || blk >= n_blocks)) {
          return errorf(StatusCode::kOutOfRange,
                        "forward: block {} of sequence {} is {}, outside the pool of {} blocks", k,
                        run_seq[static_cast<size_t>(r)], blk, n_blocks);
        }
        tab[r * B + k] = blk;
      }
    }
    // Padding rows (graphs): token 0 at position 0 of a sequence living in the scratch block.
    for (int64_t i = n; i < n_pad; ++i) {
      const int64_t r = n_runs + (i - n);
      tok[i] = 0;
      pos[i] = 0;
      seq[i] = static_cast<int32_t>(r);
      cu[r] = static_cast<int32_t>(i);
      kvl[r] = 1;
      for (int64_t k = 0; k < B; ++k) tab[r * B + k] = static_cast<int32_t>(n_blocks);
    }
    cu[runs_total] = static_cast<int32_t>(n_pad);
    st.n = n_pad;
    st.n_runs = runs_total;
    st.max_q = max_q;
    st.max_kv = kv_bound;
    st.n_out = use_graph ? n_pad : n_out;
    st.all_rows = all_rows;
    st.out_runs.clear();
    if (!all_rows) {
      for (int64_t i = 0; i < n_out; ++i) {
        const int64_t r = b.logit_rows[static_cast<size_t>(i)];
        if (!st.out_runs.empty() && st.out_runs.back().first + st.out_runs.back().second == r) {
          st.out_runs.back().second++;
        } else {
          st.out_runs.emplace_back(r, 1);
        }
      }
    }
    // One copy of the packed inputs (the whole fixed layout; a few KB to a few MB).
    STRATA_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(d_tokens, step_host, step_ints * 4, cudaMemcpyHostToDevice, ctx.stream));
    return ok_status();
  }

  Status run(const Step& st, bool use_graph) {
    if (!use_graph) return launch(st);
    const auto key = std::make_pair(st.n, st.max_kv);
    auto it = graphs.find(key);
    if (it == graphs.end()) {
      // One eager pass first: it loads the kernels' modules and lets cuBLASLt time its
      // algorithms for these shapes (neither can happen during capture). It writes the same K/V
      // values the replay will write, so running it is harmless.
      STRATA_RETURN_IF_ERROR(launch(st));
      cudaGraph_t graph = nullptr;
      STRATA_CUDA_RETURN_IF_ERROR(
          cudaStreamBeginCapture(ctx.stream, cudaStreamCaptureModeThreadLocal));
      Status s = launch(st);
      const cudaError_t end = cudaStreamEndCapture(ctx.stream, &graph);
      if (!s.ok()) {
        if (graph != nullptr) (void)cudaGraphDestroy(graph);
        return s.with_context("cuda graph capture");
      }
      STRATA_CUDA_RETURN_IF_ERROR(end);
      cudaGraphExec_t exec = nullptr;
      const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
      (void)cudaGraphDestroy(graph);
      STRATA_CUDA_RETURN_IF_ERROR(inst);
      it = graphs.emplace(key, exec).first;
      ++captures;
    }
    STRATA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second, ctx.stream));
    ++replays;
    return ok_status();
  }

  Status forward(const ForwardBatch& b, float* out_logits, int32_t* out_ids) {
    STRATA_RETURN_IF_ERROR(dev->make_current());
    const int64_t n = static_cast<int64_t>(b.tokens.size());
    if (n == 0) return ok_status();
    Step st;
    bool use_graph = false;
    STRATA_RETURN_IF_ERROR(prepare(b, st, use_graph));
    STRATA_RETURN_IF_ERROR(run(st, use_graph));
    const int64_t n_out = static_cast<int64_t>(b.logit_rows.size());
    if (n_out > 0 && out_logits != nullptr) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_logits, logits,
                                                  static_cast<size_t>(n_out * V) * 4,
                                                  cudaMemcpyDeviceToHost, ctx.stream));
    }
    if (n_out > 0 && out_ids != nullptr) {
      STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_ids, ids, static_cast<size_t>(n_out) * 4,
                                                  cudaMemcpyDeviceToHost, ctx.stream));
    }
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ctx.stream));
    prof_collect();
    if (n_out > 0 && out_logits != nullptr) {
      std::memcpy(out_logits, host_logits, static_cast<size_t>(n_out * V) * 4);
    }
    if (n_out > 0 && out_ids != nullptr) {
      std::memcpy(out_ids, host_ids, static_cast<size_t>(n_out) * 4);
    }
    return ok_status();
  }
};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

Result<std::unique_ptr<CudaModel>> CudaModel::create(const ModelConfig& config, const Model* host,
                                                     const CudaModelOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->cfg = config;
  impl->opt = options;
  CudaModelOptions& o = impl->opt;
  STRATA_RETURN_IF_ERROR(impl->check_supported());
  if (!host && !o.dummy_weights) {
    return Status(StatusCode::kInvalidArgument,
                  "cuda: no weights given (and not --load-format dummy)");
  }
  if (host && host->parallel().tp_size != 1) {
    return Status(StatusCode::kUnimplemented,
                  "cuda: tensor parallelism is not supported on the CUDA backend yet");
  }
  if (o.weight_dtype != DType::kBF16 && o.weight_dtype != DType::kI8 &&
      o.weight_dtype != DType::kFP8E4M3) {
    return errorf(StatusCode::kInvalidArgument, "cuda: weight dtype {} (use bf16, int8 or fp8)",
                  dtype_name(o.weight_dtype));
  }
  if (o.max_model_len <= 0 || o.max_model_len > config.max_position_embeddings) {
    o.max_model_len = config.max_position_embeddings;
  }
  if (o.block_size < 1 || o.max_num_tokens < 1 || o.max_num_seqs < 1 || o.max_logit_rows < 1) {
    return Status(StatusCode::kInvalidArgument, "cuda: block size and batch limits must be >= 1");
  }
  o.max_logit_rows = std::max(o.max_logit_rows, o.max_num_seqs);
  STRATA_ASSIGN_OR_RETURN(impl->dev, cuda::CudaDevice::create(o.device));
  impl->ctx = impl->dev->launch_ctx();
  const ModelConfig& c = impl->cfg;
  impl->hq = c.n_heads;
  impl->hkv = c.n_heads_kv;
  impl->D = c.head_dim;
  impl->H = c.hidden;
  impl->F = c.ffn_dim;
  impl->V = c.vocab;
  impl->qkv_dim = (c.n_heads + 2 * c.n_heads_kv) * c.head_dim;
  if (env_config().cuda_profile) {
    impl->profile = true;
    o.cuda_graphs = false;  // sections are timed on eager launches
  }
  STRATA_RETURN_IF_ERROR(impl->load_weights(host));
  STRATA_RETURN_IF_ERROR(impl->allocate_runtime());
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

const ModelConfig& CudaModel::config() const {
  return impl_->cfg;
}
const CudaModelOptions& CudaModel::options() const {
  return impl_->opt;
}
int64_t CudaModel::num_kv_blocks() const {
  return impl_->n_blocks;
}
size_t CudaModel::weight_bytes() const {
  return impl_->weight_bytes;
}
size_t CudaModel::kv_cache_bytes() const {
  return impl_->kv.bytes();
}
std::string CudaModel::device_name() const {
  return impl_->dev->name();
}
Status CudaModel::forward(const ForwardBatch& batch, float* logits) {
  return impl_->forward(batch, logits, nullptr);
}
Status CudaModel::forward_argmax(const ForwardBatch& batch, int32_t* ids) {
  return impl_->forward(batch, nullptr, ids);
}
Status CudaModel::synchronize() {
  return impl_->dev->synchronize();
}
size_t CudaModel::kv_block_bytes() const {
  return impl_->block_bytes();
}
Status CudaModel::copy_block_to_host(int32_t block, void* host) {
  return impl_->copy_block(block, host, /*to_host=*/true);
}
Status CudaModel::copy_block_from_host(int32_t block, const void* host) {
  return impl_->copy_block(block, const_cast<void*>(host), /*to_host=*/false);
}
int64_t CudaModel::graph_captures() const {
  return impl_->captures;
}
int64_t CudaModel::graph_replays() const {
  return impl_->replays;
}

}  // namespace strata

#endif  // STRATA_HAS_CUDA
