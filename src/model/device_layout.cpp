// The device layout of a model's weights (model/weights.h): what the GPU kernels read, made from
// the CPU layout (Model::to_device) or from random values (Model::random). Every linear layer is
// one matrix (Q/K/V and gate/up concatenated), bf16 or int8 / fp8 with one f32 scale per row
// (quantized on the device from bf16); embeddings stay bf16; norms, biases and rope tables are
// f32. Host work is limited to converting each source row to bf16, except GGUF block-quantized
// weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K with a multiple of 256 input features), which keep their
// blocks in the device row layout of backends/cuda/kernels/gguf_fragments.h (QKV parts of
// different formats stay separate parts; gate/up of different formats, other formats, tensor
// parallelism, weight streaming and STRATA_GGUF_DEQUANT=1 fall back to bf16).
// Mixture-of-experts layers: the router (and Qwen2-MoE's shared-expert gate) stay bf16 (the
// routing decision should not move with the weight format); each layer's experts are two
// stacked arrays, gate/up [E][2 F, H] (gate rows, then up rows, per expert) and down [E][H, F],
// in the weight dtype, which the grouped expert kernels index by expert (ops::moe_experts).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cuda/kernels/gguf_fragments.h"
#include "core/env.h"
#include "core/log.h"
#include "core/status.h"
#include "memory/streamed_weights.h"
#include "model/layer_blob.h"
#include "model/model.h"
#include "model/rope.h"

namespace strata {

namespace {

// std of N(0, 0.02) from a uniform: half-width 0.02 * sqrt(3).
constexpr float kRandomScale = 0.0346410f;

class Uploader {
 public:
  Uploader(ops::Context& ctx, Allocator& alloc, WeightStore& store, const DeviceLayout& layout)
      : ctx_(ctx), alloc_(alloc), store_(store), layout_(layout) {}

  // While set, tensors are allocated into `temp` instead of the store (a streamed layer is built
  // on the device, then copied into its host blob).
  void set_temp(std::vector<Buffer>* temp) { temp_ = temp; }
  // Whether GGUF block-quantized host weights keep their block format (else bf16 on the host).
  void set_gguf_blocks(bool on) { gguf_blocks_ = on; }

  Result<Tensor> device_tensor(DType dt, std::initializer_list<int64_t> shape, const char* what) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    Result<Buffer> b = alloc_.allocate(static_cast<size_t>(dtype_bytes(dt, n)));
    if (!b.ok()) return b.status().with_context(what);
    void* p = b.value().data();
    if (temp_ != nullptr) {
      temp_->push_back(std::move(b).value());  // a streamed layer: copied into its blob
    } else {
      store_.keep(std::move(b).value());
    }
    return Tensor::make(p, dt, shape, ctx_.device);
  }

  // An f32 vector on the device from host floats.
  Result<Tensor> f32_vector(const std::vector<float>& v, const char* what) {
    STRATA_ASSIGN_OR_RETURN(Tensor t,
                            device_tensor(DType::kF32, {static_cast<int64_t>(v.size())}, what));
    STRATA_RETURN_IF_ERROR(ops::upload(ctx_, v.data(), t));
    STRATA_RETURN_IF_ERROR(ops::synchronize(ctx_));
    return t;
  }

  // A [n] vector from a host tensor (any float dtype), or `fill` when the tensor is undefined.
  Result<Tensor> vector(const Tensor* host, int64_t n, float fill, const char* what) {
    std::vector<float> v(static_cast<size_t>(n), fill);
    if (host != nullptr && host->defined()) {
      if (host->numel() != n) {
        return errorf(StatusCode::kInternal, "{} has {} values, expected {}", what, host->numel(),
                      n);
      }
      STRATA_RETURN_IF_ERROR(ops::host_to_f32(*host, v.data()));
    }
    return f32_vector(v, what);
  }

  Result<ops::NormWeight> norm(const ops::NormWeight* host, int64_t n, const char* what) {
    ops::NormWeight w;
    STRATA_ASSIGN_OR_RETURN(w.w, vector(host ? &host->w : nullptr, n, 1.0f, what));
    if (host != nullptr && host->b.defined()) {
      STRATA_ASSIGN_OR_RETURN(w.b, vector(&host->b, n, 0.0f, what));
    }
    return w;
  }

  // A [rows, cols] matrix from the row blocks of `host` (stacked in order), or random values
  // (host null); bf16, or quantized per row to the layout's dtype when `quantize`.
  // gemm: whether a GEMM reads the matrix as it is (not when it is only all-gathered first: the
  // weight-gathered FFN's shards). GGUF block formats with a device kernel stay in their format
  // (gguf_linear); `gated` weights (gate/up) must then be one part.
  Result<ops::LinearWeight> linear(const ops::LinearWeight* host, int64_t rows, int64_t cols,
                                   bool with_bias, bool quantize, const char* what,
                                   bool gemm = true, bool gated = false) {
    const DType wdt = quantize ? layout_.weight_dtype : DType::kBF16;
    if (quantize && dtype_info(wdt).is_quantized) {
      if (host != nullptr) {
        return errorf(StatusCode::kInvalidArgument,
                      "{}: --quantization {} builds random weights only; a GGUF checkpoint keeps "
                      "its own block formats",
                      what, dtype_name(wdt));
      }
      return gguf_linear(nullptr, rows, cols, with_bias, wdt, what);
    }
    if (quantize && host != nullptr && wdt == DType::kBF16) {
      std::string why;
      if (gguf_eligible(*host, cols, gated, &why)) {
        return gguf_linear(host, rows, cols, with_bias, wdt, what);
      }
      if (!why.empty()) log_info("{}: GGUF blocks dequantized to bf16 ({})", what, why);
    }
    const size_t n = static_cast<size_t>(rows * cols);
    // The GPU GEMMs read weight rows with 16-byte loads: 8 bf16 or 16 int8 / fp8 values.
    const int64_t align = wdt == DType::kBF16 ? 8 : 16;
    if (gemm && ctx_.device.is_cuda() && cols % align != 0) {
      return errorf(StatusCode::kUnimplemented,
                    "{}: {} input features are not a multiple of {}, which the CUDA GEMMs need for "
                    "{} weights",
                    what, cols, align, dtype_name(wdt));
    }
    Tensor bf;  // the bf16 matrix: the weight itself, or a staging copy to quantize
    Buffer staging;
    if (wdt == DType::kBF16) {
      STRATA_ASSIGN_OR_RETURN(bf, device_tensor(DType::kBF16, {rows, cols}, what));
    } else {
      Result<Buffer> b = alloc_.allocate(n * 2);
      if (!b.ok()) return b.status().with_context("weight staging");
      staging = std::move(b).value();
      bf = Tensor::make(staging.data(), DType::kBF16, {rows, cols}, ctx_.device);
    }
    if (host == nullptr) {
      STRATA_RETURN_IF_ERROR(
          ops::fill_random(ctx_, bf, layout_.seed * 1000003ull + next_id_++, kRandomScale));
    } else {
      std::vector<uint16_t> h(n);
      int64_t r0 = 0;
      for (int i = 0; i < host->n_parts; ++i) {
        const Tensor& t = host->parts[static_cast<size_t>(i)].w;
        if (t.cols() != cols || r0 + t.dim(0) > rows) {
          return errorf(StatusCode::kInternal, "{} part {} is {}, expected [<= {}, {}]", what, i,
                        t.shape_string(), rows - r0, cols);
        }
        STRATA_RETURN_IF_ERROR(ops::host_rows_to_bf16(t, h.data() + r0 * cols).with_context(what));
        r0 += t.dim(0);
      }
      if (r0 != rows) {
        return errorf(StatusCode::kInternal, "{} has {} rows, expected {}", what, r0, rows);
      }
      STRATA_RETURN_IF_ERROR(ops::upload(ctx_, h.data(), bf));
      STRATA_RETURN_IF_ERROR(ops::synchronize(ctx_));
    }
    Tensor w = bf, scale;
    if (wdt != DType::kBF16) {
      STRATA_ASSIGN_OR_RETURN(w, device_tensor(wdt, {rows, cols}, what));
      STRATA_ASSIGN_OR_RETURN(scale, device_tensor(DType::kF32, {rows}, "row scales"));
      STRATA_RETURN_IF_ERROR(ops::quantize_rows(ctx_, bf, w, scale));
      // The staging buffer is freed on return: finish the quantization first.
      STRATA_RETURN_IF_ERROR(ops::synchronize(ctx_));
    }
    Tensor bias;
    if (with_bias) {
      std::vector<float> b;
      b.reserve(static_cast<size_t>(rows));
      for (int i = 0; host != nullptr && i < host->n_parts; ++i) {
        const LinearWeightPart& p = host->parts[static_cast<size_t>(i)];
        const size_t at = b.size();
        b.resize(at + static_cast<size_t>(p.w.dim(0)), 0.0f);
        if (p.bias.defined()) STRATA_RETURN_IF_ERROR(ops::host_to_f32(p.bias, b.data() + at));
      }
      b.resize(static_cast<size_t>(rows), 0.0f);
      STRATA_ASSIGN_OR_RETURN(bias, f32_vector(b, "bias"));
    }
    ops::LinearWeight out;
    out.add(w, bias, scale);
    return out;
  }

  // Whether `host` (a GGUF checkpoint's weight) keeps its block format on the device; `why`
  // says why not when it holds GGUF blocks (empty for plain float weights).
  bool gguf_eligible(const ops::LinearWeight& host, int64_t cols, bool gated, std::string* why) {
    bool any = false;
    for (int i = 0; i < host.n_parts; ++i) {
      any |= dtype_info(host.parts[static_cast<size_t>(i)].w.dtype).is_quantized;
    }
    if (!any) return false;
    if (!gguf_blocks_) {
      *why = env_config().gguf_dequant ? "STRATA_GGUF_DEQUANT=1"
                                       : "block formats need one rank per layer and no streaming";
      return false;
    }
    DType prev = DType::kF32;
    int groups = 0;
    for (int i = 0; i < host.n_parts; ++i) {
      const Tensor& t = host.parts[static_cast<size_t>(i)].w;
      if (!cpu::gguf_device_ok(t.dtype, cols) || !t.is_contiguous()) {
        *why = fmt::format("{} with {} input features has no device kernel", dtype_name(t.dtype),
                           cols);
        return false;
      }
      groups += t.dtype != prev ? 1 : 0;
      prev = t.dtype;
    }
    if (groups > static_cast<int>(ops::LinearWeight{}.parts.size()) || (gated && groups > 1)) {
      *why = "gate and up in different block formats";
      return false;
    }
    return true;
  }

  // A GGUF weight in its block format: consecutive host parts of one format become one device
  // part (their rows' bytes concatenated, in the device row layout of gguf_pack_row), or random
  // rows of format `wdt` (host null).
  Result<ops::LinearWeight> gguf_linear(const ops::LinearWeight* host, int64_t rows, int64_t cols,
                                        bool with_bias, DType wdt, const char* what) {
    if (!cpu::gguf_device_ok(wdt == DType::kBF16 ? host->parts[0].w.dtype : wdt, cols)) {
      return errorf(StatusCode::kUnimplemented,
                    "{}: {} weights with {} input features (the GPU block formats need a "
                    "multiple of 256)",
                    what, dtype_name(wdt == DType::kBF16 ? host->parts[0].w.dtype : wdt), cols);
    }
    if (host != nullptr && host->rows() != rows) {
      return errorf(StatusCode::kInternal, "{} has {} rows, expected {}", what, host->rows(), rows);
    }
    ops::LinearWeight out;
    std::vector<uint8_t> dev;
    int64_t r0 = 0;
    int i = 0;
    while (r0 < rows) {
      // The group: host parts [i, j) of one format, or all rows (random).
      DType dt = wdt;
      int64_t n = rows;
      int j = i;
      if (host != nullptr) {
        dt = host->parts[static_cast<size_t>(i)].w.dtype;
        n = 0;
        while (j < host->n_parts && host->parts[static_cast<size_t>(j)].w.dtype == dt) {
          n += host->parts[static_cast<size_t>(j)].w.dim(0);
          ++j;
        }
      }
      const int64_t row_bytes = dtype_bytes(dt, cols);
      STRATA_ASSIGN_OR_RETURN(Tensor w, device_tensor(dt, {n, cols}, what));
      // Upload in slabs of rows (host memory of at most ~64 MiB at a time).
      const int64_t slab = std::max<int64_t>(1, (int64_t{64} << 20) / row_bytes);
      const uint64_t seed = layout_.seed * 1000003ull + next_id_++;
      int64_t part = i, part_row = 0;
      for (int64_t s0 = 0; s0 < n; s0 += slab) {
        const int64_t sn = std::min(slab, n - s0);
        dev.resize(static_cast<size_t>(sn * row_bytes));
        if (host == nullptr) {
#pragma omp parallel for schedule(static)
          for (int64_t r = 0; r < sn; ++r) {
            cpu::gguf_fill_random_row(dt, seed, s0 + r, kRandomScale, cols,
                                      dev.data() + r * row_bytes);
          }
        }
        for (int64_t r = 0; r < sn && host != nullptr; ++r) {
          uint8_t* d = dev.data() + r * row_bytes;
          while (part_row >= host->parts[static_cast<size_t>(part)].w.dim(0)) {
            ++part;
            part_row = 0;
          }
          const Tensor& t = host->parts[static_cast<size_t>(part)].w;
          cpu::gguf_pack_row(dt, static_cast<const uint8_t*>(t.data) + part_row * row_bytes, d,
                             cols);
          ++part_row;
        }
        Tensor dst = w.slice_rows(s0, s0 + sn);
        STRATA_RETURN_IF_ERROR(ops::upload(ctx_, dev.data(), dst));
        STRATA_RETURN_IF_ERROR(ops::synchronize(ctx_));
      }
      Tensor bias;
      if (with_bias) {
        std::vector<float> b(static_cast<size_t>(n), 0.0f);
        int64_t at = 0;
        for (int q = i; host != nullptr && q < j; ++q) {
          const ops::LinearWeight::Part& p = host->parts[static_cast<size_t>(q)];
          if (p.bias.defined()) STRATA_RETURN_IF_ERROR(ops::host_to_f32(p.bias, b.data() + at));
          at += p.w.dim(0);
        }
        STRATA_ASSIGN_OR_RETURN(bias, f32_vector(b, "bias"));
      }
      out.add(w, bias);
      r0 += n;
      i = j;
    }
    return out;
  }

  // The experts of one sparse layer as one stacked array [E rows, cols] (expert e's matrix at
  // rows [e rows, (e + 1) rows)), bf16 or quantized per row; returns one single-part view per
  // expert. From the host experts ([host_rows, host_cols] each, as row blocks) or random values.
  // The FFN dimension may be padded (F -> Fp, kExpertFfnAlign): gate/up (`gated`) puts the host's
  // gate rows at [0, F) and up rows at [Fp, Fp + F); down fills each row's first F columns; the
  // padding is zero, which leaves the result exact (silu(0) * 0 = 0 meets zero down columns).
  // Converted, uploaded and quantized one expert at a time (host and staging memory of one
  // expert).
  Result<std::vector<ops::LinearWeight>> experts(const std::vector<ops::LinearWeight>* host,
                                                 int64_t E, int64_t rows, int64_t cols,
                                                 int64_t host_rows, int64_t host_cols, bool gated,
                                                 const char* what) {
    // GGUF block formats (random weights) cover the dense linears; experts stay bf16.
    const DType wdt =
        dtype_info(layout_.weight_dtype).is_quantized ? DType::kBF16 : layout_.weight_dtype;
    const int64_t align = wdt == DType::kBF16 ? 8 : 16;
    if (ctx_.device.is_cuda() && cols % align != 0) {
      return errorf(StatusCode::kUnimplemented,
                    "{}: {} input features are not a multiple of {}, which the CUDA expert "
                    "kernels need for {} weights",
                    what, cols, align, dtype_name(wdt));
    }
    if (host != nullptr && static_cast<int64_t>(host->size()) != E) {
      return errorf(StatusCode::kInternal, "{}: {} experts, expected {}", what, host->size(), E);
    }
    STRATA_ASSIGN_OR_RETURN(Tensor all, device_tensor(wdt, {E * rows, cols}, what));
    Tensor scales;
    Buffer staging;
    Tensor stage;
    if (wdt != DType::kBF16) {
      STRATA_ASSIGN_OR_RETURN(scales, device_tensor(DType::kF32, {E * rows}, "expert row scales"));
      Result<Buffer> b = alloc_.allocate(static_cast<size_t>(rows * cols * 2));
      if (!b.ok()) return b.status().with_context("expert weight staging");
      staging = std::move(b).value();
      stage = Tensor::make(staging.data(), DType::kBF16, {rows, cols}, ctx_.device);
    }
    std::vector<ops::LinearWeight> out(static_cast<size_t>(E));
    std::vector<uint16_t> src, dst;
    const int64_t half = host_rows / 2, half_pad = rows / 2;
    for (int64_t e = 0; e < E; ++e) {
      Tensor w = all.slice_rows(e * rows, (e + 1) * rows);
      Tensor bf = wdt == DType::kBF16 ? w : stage;
      if (host == nullptr) {
        STRATA_RETURN_IF_ERROR(
            ops::fill_random(ctx_, bf, layout_.seed * 1000003ull + next_id_++, kRandomScale));
      } else {
        const ops::LinearWeight& from = (*host)[static_cast<size_t>(e)];
        src.resize(static_cast<size_t>(host_rows * host_cols));
        int64_t r0 = 0;
        for (int i = 0; i < from.n_parts; ++i) {
          const Tensor& t = from.parts[static_cast<size_t>(i)].w;
          if (t.cols() != host_cols || r0 + t.dim(0) > host_rows) {
            return errorf(StatusCode::kInternal,
                          "{} of expert {} part {} is {}, expected [<= {}, {}]", what, e, i,
                          t.shape_string(), host_rows - r0, host_cols);
          }
          STRATA_RETURN_IF_ERROR(
              ops::host_rows_to_bf16(t, src.data() + r0 * host_cols).with_context(what));
          r0 += t.dim(0);
        }
        if (r0 != host_rows) {
          return errorf(StatusCode::kInternal, "{} of expert {} has {} rows, expected {}", what, e,
                        r0, host_rows);
        }
        dst.assign(static_cast<size_t>(rows * cols), 0);
        for (int64_t r = 0; r < host_rows; ++r) {
          const int64_t to = gated && r >= half ? r - half + half_pad : r;
          std::memcpy(dst.data() + to * cols, src.data() + r * host_cols,
                      static_cast<size_t>(host_cols) * 2);
        }
        STRATA_RETURN_IF_ERROR(ops::upload(ctx_, dst.data(), bf));
      }
      Tensor scale;
      if (wdt != DType::kBF16) {
        scale = scales.slice_rows(e * rows, (e + 1) * rows);
        STRATA_RETURN_IF_ERROR(ops::quantize_rows(ctx_, stage, w, scale));
      }
      // The host rows and the staging buffer are reused by the next expert.
      STRATA_RETURN_IF_ERROR(ops::synchronize(ctx_));
      out[static_cast<size_t>(e)].add(w, Tensor{}, scale);
    }
    return out;
  }

  // A bf16 table [rows, cols] (embeddings), from host or random.
  Result<Tensor> table(const Tensor* host, int64_t rows, int64_t cols, const char* what) {
    ops::LinearWeight h;
    if (host != nullptr) h.add(*host);
    STRATA_ASSIGN_OR_RETURN(ops::LinearWeight t,
                            linear(host ? &h : nullptr, rows, cols, false, false, what));
    return t.parts[0].w;
  }

 private:
  using LinearWeightPart = ops::LinearWeight::Part;
  ops::Context& ctx_;
  Allocator& alloc_;
  WeightStore& store_;
  const DeviceLayout& layout_;
  uint64_t next_id_ = 1;
  std::vector<Buffer>* temp_ = nullptr;
  bool gguf_blocks_ = false;
};

// Bytes the device layout of `c` needs on one rank (the fit check before anything is uploaded).
int64_t device_bytes(const ModelConfig& c, const ParallelConfig& par, DType wdt) {
  // Bytes per weight (GGUF block formats of random weights: about 1, an upper bound but Q8_0).
  const int64_t per = wdt == DType::kBF16 ? 2 : 1;
  const int64_t V = par.padded_chunk(c.vocab), H = c.hidden;
  const int64_t emb = V * H * 2;  // the embedding table stays bf16
  const int64_t head = c.tie_word_embeddings && wdt == DType::kBF16 ? 0 : V * H * per;
  // Expert parallelism: a rank holds n_experts / ep_size of each sparse layer's experts.
  int64_t experts = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (c.layer_moe(l)) experts += c.n_experts * 3 * H * c.expert_ffn_dim;
  }
  const int64_t ep = std::max<int64_t>(1, par.ep_size);
  int64_t body = (c.parameter_count() - c.vocab * H * (c.tie_word_embeddings ? 1 : 2) - experts +
                  experts / ep) /
                 par.tp_size * per;
  if (c.n_layers > 0) body = body / c.n_layers * (par.stage_end(c.n_layers) - par.first_layer);
  return emb + head + body;
}

// Offset of a fake base for the disk tier's stored views: their data pointers hold
// kRawBase + the offset in the raw read buffer (never dereferenced), so offset 0 stays defined.
constexpr uintptr_t kRawBase = 4096;
constexpr uint64_t kDirectAlign = 4096;     // O_DIRECT offsets, lengths and buffers
constexpr uint64_t kMergeGap = 1ull << 20;  // tensors closer than this are read in one range

// The disk tier reads the checkpoint's files: check that there is one and the layout packs on
// the host.
Status prepare_stream_source(StreamedWeights& sw, const Model* host, DType wdt) {
  if (sw.tier != LayerTier::kDisk) return ok_status();
  if (host == nullptr || host->store().source() == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  "--offload-weights disk reads the layers from the checkpoint file: not with "
                  "random weights (--load-format dummy / --model-config); use --offload-weights "
                  "cpu");
  }
  if (wdt != DType::kBF16) {
    return errorf(StatusCode::kUnimplemented,
                  "--offload-weights disk streams bf16 layers (converted on the host from the "
                  "checkpoint's tensors); {} weights are quantized on the device: use "
                  "--offload-weights cpu",
                  dtype_name(wdt));
  }
  for (const MappedRegion& r : host->store().source()->mapped_regions()) sw.files.push_back(r.path);
  if (sw.files.empty()) {
    return errorf(StatusCode::kInvalidArgument,
                  "--offload-weights disk: {} is not read from a file this build can reopen",
                  host->store().source()->describe());
  }
  return ok_status();
}

// Layer `l` (built on the device as `d` from the stored layer `L`) becomes a streamed layer: its
// device bytes copied into a host blob (host tier), or the checkpoint reads and the host packing
// that rebuild the blob on every pass (disk tier).
Status add_streamed_layer(StreamedWeights& sw, int64_t l, LayerWeights& d, const LayerWeights* L,
                          const BlobLayout& bl, const DeviceLayout& layout, ops::Context& ctx,
                          const Model* host) {
  sw.index_of_layer[static_cast<size_t>(l)] = static_cast<int>(sw.layers.size());
  StreamedLayer s;
  s.layer = l;
  s.bytes = bl.bytes;
  if (sw.tier == LayerTier::kHost && layout.shared_host) {
    // Another replica's blob of the same layer (same layout, same weights): no second copy.
    const StreamedWeights& other = *layout.shared_host;
    const int k = l < static_cast<int64_t>(other.index_of_layer.size())
                      ? other.index_of_layer[static_cast<size_t>(l)]
                      : -1;
    if (k < 0 || other.layers[static_cast<size_t>(k)].bytes != bl.bytes ||
        other.layers[static_cast<size_t>(k)].host.empty()) {
      return errorf(StatusCode::kInternal,
                    "weight streaming: layer {} differs from the shared replica's host blob", l);
    }
    s.host = other.layers[static_cast<size_t>(k)].host;
    sw.layers.push_back(std::move(s));
    return ok_status();
  }
  if (sw.tier == LayerTier::kHost) {
    if (!layout.host_alloc) return Status(StatusCode::kInternal, "weight streaming: no host_alloc");
    Result<Buffer> b = layout.host_alloc(bl.bytes);
    if (!b.ok()) {
      return b.status().with_context(
          fmt::format("host memory for streamed layer {} ({} bytes)", l, bl.bytes));
    }
    s.host = std::move(b).value();
    size_t i = 0;
    Status st = ok_status();
    visit_layer_blob(d, nullptr, [&](Tensor& t, const BlobSource&) {
      if (st.ok()) st = ops::download(ctx, t, static_cast<uint8_t*>(s.host.data()) + bl.offsets[i]);
      ++i;
    });
    STRATA_RETURN_IF_ERROR(st);
    STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
    sw.layers.push_back(std::move(s));
    return ok_status();
  }
  // Disk tier: where each stored tensor of the layer is in the checkpoint's files.
  const std::vector<MappedRegion> regions = host->store().source()->mapped_regions();
  LayerWeights stored = *L;
  struct Piece {
    Tensor* t;
    int file;
    uint64_t offset, bytes;
  };
  std::vector<Piece> pieces;
  Status st = ok_status();
  for_each_stored_tensor(stored, [&](Tensor& t) {
    if (!st.ok()) return;
    const auto* p = static_cast<const uint8_t*>(t.data);
    for (size_t r = 0; r < regions.size(); ++r) {
      if (p >= regions[r].base && p < regions[r].base + regions[r].size && t.is_contiguous()) {
        pieces.push_back({&t, static_cast<int>(r), static_cast<uint64_t>(p - regions[r].base),
                          static_cast<uint64_t>(t.nbytes())});
        return;
      }
    }
    st = errorf(StatusCode::kUnimplemented,
                "--offload-weights disk: a tensor of layer {} ({}) is not stored in {} as the "
                "model reads it (re-laid out at load), so it cannot be read in place; use "
                "--offload-weights cpu",
                l, t.shape_string(), host->store().source()->describe());
  });
  STRATA_RETURN_IF_ERROR(st);
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) {
    return a.file != b.file ? a.file < b.file : a.offset < b.offset;
  });
  for (const Piece& p : pieces) {
    const uint64_t begin = p.offset / kDirectAlign * kDirectAlign;
    const uint64_t end = p.offset + p.bytes;
    DiskRange* r = s.ranges.empty() ? nullptr : &s.ranges.back();
    if (r == nullptr || r->file != p.file || begin > r->offset + r->bytes + kMergeGap) {
      DiskRange nr;
      nr.file = p.file;
      nr.offset = begin;
      nr.buf_offset = s.read_bytes;
      s.ranges.push_back(nr);
      r = &s.ranges.back();
    }
    r->needed = std::max(r->needed, end - r->offset);
    const uint64_t aligned_len = (r->needed + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    s.read_bytes = r->buf_offset + aligned_len;
    r->bytes = aligned_len;
    p.t->data = reinterpret_cast<void*>(kRawBase + r->buf_offset + (p.offset - r->offset));
  }
  LayerWeights shape = d;
  s.pack = [stored, shape, bl](const uint8_t* raw, uint8_t* blob) {
    LayerWeights h = stored;
    for_each_stored_tensor(h, [&](Tensor& t) {
      t.data = const_cast<uint8_t*>(raw) + (reinterpret_cast<uintptr_t>(t.data) - kRawBase);
    });
    return pack_layer_blob(shape, h, bl, blob);
  };
  sw.layers.push_back(std::move(s));
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<Model>> Model::to_device(const Model& host, const DeviceLayout& layout,
                                                ops::Context& ctx, Allocator& alloc) {
  return build_device_model(host.config(), host.parallel(), &host, layout, ctx, alloc);
}

Result<std::unique_ptr<Model>> Model::random(const ModelConfig& config, const ParallelConfig& par,
                                             const DeviceLayout& layout, ops::Context& ctx,
                                             Allocator& alloc) {
  return build_device_model(config, par, nullptr, layout, ctx, alloc);
}

Result<std::unique_ptr<Model>> build_device_model(const ModelConfig& config,
                                                  const ParallelConfig& par, const Model* host,
                                                  const DeviceLayout& layout, ops::Context& ctx,
                                                  Allocator& alloc) {
  const DType wdt = layout.weight_dtype;
  if (wdt != DType::kBF16 && wdt != DType::kI8 && wdt != DType::kFP8E4M3 &&
      !cuda::gguf::gpu_format(wdt)) {
    return errorf(StatusCode::kInvalidArgument,
                  "weight dtype {} (use bf16, int8, fp8, or for random weights q8_0, q4_0, q4_k, "
                  "q5_k, q6_k)",
                  dtype_name(wdt));
  }
  if (dtype_info(wdt).is_quantized && host != nullptr) {
    return errorf(StatusCode::kInvalidArgument,
                  "--quantization {} builds random weights only (a GGUF checkpoint keeps its own "
                  "block formats)",
                  dtype_name(wdt));
  }
  const ResidencyPlan* plan =
      layout.residency != nullptr && layout.residency->streaming() ? layout.residency : nullptr;
  if (plan != nullptr && static_cast<int64_t>(plan->tier.size()) != config.n_layers) {
    return errorf(StatusCode::kInternal, "residency plan of {} layers for {} layers",
                  plan->tier.size(), config.n_layers);
  }
  if (layout.free_bytes > 0 && plan == nullptr) {
    const int64_t need = device_bytes(config, par, wdt);
    if (static_cast<size_t>(need) > layout.free_bytes) {
      return errorf(StatusCode::kOutOfMemory,
                    "the weights need {:.2f} GiB ({}), but {} has {:.2f} GiB free; try "
                    "--quantization int8 or fp8, or a smaller model",
                    static_cast<double>(need) / (1 << 30), dtype_name(wdt), layout.device_name,
                    static_cast<double>(layout.free_bytes) / (1 << 30));
    }
  }
  std::unique_ptr<Model> m(new Model());
  m->config_ = config;
  m->par_ = par;
  m->device_ = ctx.device;
  m->device_layout_ = true;
  m->weight_dtype_ = wdt;
  STRATA_RETURN_IF_ERROR(m->init_shapes());
  const ModelConfig& c = m->config();
  const int64_t H = c.hidden, D = c.head_dim;
  const int64_t qkv_rows = m->qkv_dim(), q_cols = m->n_heads_local() * D, F = m->ffn_local();
  const int64_t Vl = m->vocab_local();
  // The 2d FFN layout's shards cover a hidden slice: W_in [2 F / Y, E / X], W_out [E / X, F / Y]
  // (model/ffn_layouts.cpp); every other layout's the whole hidden size.
  const int64_t ffn_hidden = par.ffn_layout == FfnLayout::k2D ? H / par.grid_x() : H;
  const ModelWeights* hw = host != nullptr ? &host->weights() : nullptr;
  Uploader up(ctx, alloc, m->store_, layout);
  // GGUF weights keep their block formats with one rank per layer (no tensor-parallel slicing
  // of blocks) and no weight streaming (the disk tier packs bf16 on the host).
  up.set_gguf_blocks(par.tp_size == 1 && plan == nullptr && !env_config().gguf_dequant);
  ModelWeights& w = m->w_;

  STRATA_ASSIGN_OR_RETURN(w.tok_embeddings,
                          up.table(hw ? &hw->tok_embeddings : nullptr, Vl, H, "token embeddings"));
  if (c.pos_embedding == PosEmbedding::kLearned) {
    STRATA_ASSIGN_OR_RETURN(
        w.pos_embeddings, up.table(hw ? &hw->pos_embeddings : nullptr, c.max_position_embeddings, H,
                                   "position embeddings"));
  }
  const bool norm_bias = c.norm == NormType::kLayerNorm;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  std::shared_ptr<StreamedWeights> sw;
  std::vector<BlobLayout> blob_layouts;
  if (plan != nullptr) {
    sw = std::make_shared<StreamedWeights>();
    sw->plan = *plan;
    sw->tier = plan->n_streamed > 0 ? plan->tier.back() : LayerTier::kHost;
    sw->index_of_layer.assign(static_cast<size_t>(c.n_layers), -1);
    STRATA_RETURN_IF_ERROR(prepare_stream_source(*sw, host, wdt));
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (!par.has_layer(l)) continue;  // another pipeline stage's layer
    LayerWeights& d = w.layers[static_cast<size_t>(l)];
    const LayerWeights* L = hw ? &hw->layers[static_cast<size_t>(l)] : nullptr;
    const bool streamed =
        plan != nullptr && plan->tier[static_cast<size_t>(l)] != LayerTier::kResident;
    std::vector<Buffer> temp;  // a streamed layer's device tensors, freed after the copy
    if (streamed) up.set_temp(&temp);
    auto norm = [&](const ops::NormWeight LayerWeights::*f, int64_t n,
                    const char* what) -> Result<ops::NormWeight> {
      if (L != nullptr) return up.norm(&(L->*f), n, what);
      ops::NormWeight ones;
      STRATA_ASSIGN_OR_RETURN(ones, up.norm(nullptr, n, what));
      if (norm_bias) {
        STRATA_ASSIGN_OR_RETURN(ones.b, up.vector(nullptr, n, 0.0f, what));
      }
      return ones;
    };
    STRATA_ASSIGN_OR_RETURN(d.attn_norm, norm(&LayerWeights::attn_norm, H, "norm"));
    STRATA_ASSIGN_OR_RETURN(d.ffn_norm, norm(&LayerWeights::ffn_norm, H, "norm"));
    if (c.qk_norm) {
      STRATA_ASSIGN_OR_RETURN(d.q_norm, norm(&LayerWeights::q_norm, D, "q norm"));
      STRATA_ASSIGN_OR_RETURN(d.k_norm, norm(&LayerWeights::k_norm, D, "k norm"));
    } else if (c.qk_norm_full) {  // OLMoE: over the whole (local) q and k projections
      STRATA_ASSIGN_OR_RETURN(d.q_norm, norm(&LayerWeights::q_norm, q_cols, "q norm"));
      STRATA_ASSIGN_OR_RETURN(d.k_norm,
                              norm(&LayerWeights::k_norm, m->n_heads_kv_local() * D, "k norm"));
    }
    if (c.post_norms) {
      STRATA_ASSIGN_OR_RETURN(d.post_attn_norm, norm(&LayerWeights::post_attn_norm, H, "norm"));
      STRATA_ASSIGN_OR_RETURN(d.post_ffn_norm, norm(&LayerWeights::post_ffn_norm, H, "norm"));
    }
    const bool qkv_bias = L ? L->qkv.has_bias() : c.qkv_bias;
    const bool o_bias = L ? L->o.has_bias() : c.o_bias;
    const bool mlp_bias = L ? L->gate_up.has_bias() : c.mlp_bias;
    const bool down_bias = L ? L->down.has_bias() : c.mlp_bias;
    const int64_t gu_rows = c.gated_mlp ? 2 * F : F;
    STRATA_ASSIGN_OR_RETURN(
        d.qkv, up.linear(L ? &L->qkv : nullptr, qkv_rows, H, qkv_bias, true, "qkv weights"));
    STRATA_ASSIGN_OR_RETURN(
        d.o, up.linear(L ? &L->o : nullptr, H, q_cols, o_bias, true, "o_proj weights"));
    if (c.layer_moe(l)) {
      // This rank's experts, each with its slice of the FFN dimension (Model::expert_range).
      const int64_t E = m->n_experts_local(), Fe = m->expert_ffn_local();
      const int64_t Fs = c.shared_expert_ffn_dim, Fp = expert_ffn_padded(Fe);
      STRATA_ASSIGN_OR_RETURN(d.router, up.linear(L ? &L->router : nullptr, c.n_experts, H, false,
                                                  false, "router weights"));
      STRATA_ASSIGN_OR_RETURN(d.expert_gate_up,
                              up.experts(L ? &L->expert_gate_up : nullptr, E, 2 * Fp, H, 2 * Fe, H,
                                         /*gated=*/true, "expert gate/up weights"));
      STRATA_ASSIGN_OR_RETURN(d.expert_down,
                              up.experts(L ? &L->expert_down : nullptr, E, H, Fp, H, Fe,
                                         /*gated=*/false, "expert down weights"));
      if (Fs > 0) {
        STRATA_ASSIGN_OR_RETURN(d.shared_gate_up,
                                up.linear(L ? &L->shared_gate_up : nullptr, 2 * Fs, H, false, true,
                                          "shared expert gate/up weights", true, true));
        STRATA_ASSIGN_OR_RETURN(d.shared_down,
                                up.linear(L ? &L->shared_down : nullptr, H, Fs, false, true,
                                          "shared expert down weights"));
        STRATA_ASSIGN_OR_RETURN(d.shared_gate, up.linear(L ? &L->shared_gate : nullptr, 1, H, false,
                                                         false, "shared expert gate"));
      }
      continue;
    }
    // Weight-gathered: the shards stay bf16 (the layout gathers them whole each layer; row
    // scales are not gathered) and the GEMMs read the gathered [F, hidden] only.
    // With --ffn-gather-min-tokens the 1d steps' GEMMs read the same bf16 shards.
    const bool gathered = par.gathers_ffn();
    const bool shard_gemm = par.ffn_layout != FfnLayout::kWeightGathered;
    STRATA_ASSIGN_OR_RETURN(
        d.gate_up, up.linear(L ? &L->gate_up : nullptr, gu_rows, ffn_hidden, mlp_bias, !gathered,
                             "gate/up weights", shard_gemm, c.gated_mlp));
    STRATA_ASSIGN_OR_RETURN(d.down, up.linear(L ? &L->down : nullptr, ffn_hidden, F, down_bias,
                                              !gathered, "down_proj weights", shard_gemm));
    if (streamed) {
      up.set_temp(nullptr);
      STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
      blob_layouts.push_back(layer_blob_layout(d));
      STRATA_RETURN_IF_ERROR(
          add_streamed_layer(*sw, l, d, L, blob_layouts.back(), layout, ctx, host));
    }
  }
  if (sw) {
    // The slots: each as large as the largest layer; layer k of the streamed ones always runs
    // from slot k % n_slots, so its views have fixed addresses.
    const int n_slots = std::max(1, plan->n_slots);
    for (const StreamedLayer& s : sw->layers) sw->slot_bytes = std::max(sw->slot_bytes, s.bytes);
    // Partitioned fetch: room for every replica's 256-byte aligned part of the largest layer.
    if (plan->options.fetch_parts > 1) {
      const size_t quantum = static_cast<size_t>(plan->options.fetch_parts) * 256;
      sw->slot_bytes = (sw->slot_bytes + quantum - 1) / quantum * quantum;
    }
    for (int i = 0; i < n_slots; ++i) {
      Result<Buffer> b = alloc.allocate(sw->slot_bytes);
      if (!b.ok()) return b.status().with_context("weight streaming slot");
      sw->slots.push_back(m->store_.keep(std::move(b).value()));
    }
    for (size_t k = 0; k < sw->layers.size(); ++k) {
      StreamedLayer& s = sw->layers[k];
      s.slot = static_cast<int>(k % static_cast<size_t>(n_slots));
      rebase_layer(w.layers[static_cast<size_t>(s.layer)], blob_layouts[k],
                   sw->slots[static_cast<size_t>(s.slot)]);
    }
    m->store_.set_streamed(sw);
  }
  STRATA_ASSIGN_OR_RETURN(w.final_norm, up.norm(hw ? &hw->final_norm : nullptr, H, "final norm"));
  if (!hw && norm_bias) {
    STRATA_ASSIGN_OR_RETURN(w.final_norm.b, up.vector(nullptr, H, 0.0f, "norm"));
  }
  const bool head_is_embedding =
      hw ? hw->lm_head.parts[0].w.data == hw->tok_embeddings.data : c.tie_word_embeddings;
  if (head_is_embedding && wdt == DType::kBF16 && !(hw && hw->lm_head.has_bias())) {
    w.lm_head.add(w.tok_embeddings);
  } else {
    STRATA_ASSIGN_OR_RETURN(w.lm_head, up.linear(hw ? &hw->lm_head : nullptr, Vl, H,
                                                 hw && hw->lm_head.has_bias(), true, "lm_head"));
  }
  // Rotary frequencies: the host model's (with its scaling), or computed for random weights.
  if (c.pos_embedding == PosEmbedding::kRope && c.rotary_dim > 0) {
    auto table = [&](const Tensor* h, float theta, const RopeScaling& s) -> Result<Tensor> {
      std::vector<float> f;
      if (h != nullptr && h->defined()) {
        f.assign(h->ptr<float>(), h->ptr<float>() + h->numel());
      } else {
        f = rope_inv_freq(c.rotary_dim, theta, s);
      }
      return up.f32_vector(f, "rope frequencies");
    };
    STRATA_ASSIGN_OR_RETURN(w.inv_freq,
                            table(hw ? &hw->inv_freq : nullptr, c.rope_theta, c.rope_scaling));
    if (c.family == ArchFamily::kGemma3) {
      STRATA_ASSIGN_OR_RETURN(w.inv_freq_local, table(hw ? &hw->inv_freq_local : nullptr,
                                                      c.rope_theta_local, RopeScaling{}));
    }
  }
  STRATA_RETURN_IF_ERROR(ops::synchronize(ctx));
  m->count_weight_bytes();
  return m;
}

}  // namespace strata
