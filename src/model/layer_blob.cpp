#include "model/layer_blob.h"

#include <cstring>

#include "core/status.h"

namespace strata {

namespace {

constexpr size_t kBlobAlign = 256;

}  // namespace

void visit_layer_blob(LayerWeights& d, const LayerWeights* stored,
                      const std::function<void(Tensor&, const BlobSource&)>& fn) {
  auto norm = [&](ops::NormWeight LayerWeights::*f) {
    ops::NormWeight& n = d.*f;
    const ops::NormWeight* s = stored != nullptr ? &(stored->*f) : nullptr;
    if (n.w.defined()) fn(n.w, {BlobSource::kVectorF32, nullptr, s ? &s->w : nullptr, 1.0f});
    if (n.b.defined()) fn(n.b, {BlobSource::kVectorF32, nullptr, s ? &s->b : nullptr, 0.0f});
  };
  auto linear = [&](ops::LinearWeight LayerWeights::*f) {
    ops::LinearWeight& l = d.*f;
    const ops::LinearWeight* s = stored != nullptr ? &(stored->*f) : nullptr;
    for (int i = 0; i < l.n_parts; ++i) {
      ops::LinearWeight::Part& p = l.parts[static_cast<size_t>(i)];
      if (p.w.defined()) {
        const bool bf16 = p.w.dtype == DType::kBF16;
        fn(p.w, {bf16 ? BlobSource::kRowsBf16 : BlobSource::kDevice, s, nullptr, 0.0f});
      }
      if (p.scale.defined()) fn(p.scale, {BlobSource::kDevice, s, nullptr, 0.0f});
      if (p.bias.defined()) fn(p.bias, {BlobSource::kBiasF32, s, nullptr, 0.0f});
    }
  };
  norm(&LayerWeights::attn_norm);
  norm(&LayerWeights::ffn_norm);
  norm(&LayerWeights::q_norm);
  norm(&LayerWeights::k_norm);
  norm(&LayerWeights::post_attn_norm);
  norm(&LayerWeights::post_ffn_norm);
  linear(&LayerWeights::qkv);
  linear(&LayerWeights::o);
  linear(&LayerWeights::gate_up);
  linear(&LayerWeights::down);
}

BlobLayout layer_blob_layout(LayerWeights& d) {
  BlobLayout b;
  visit_layer_blob(d, nullptr, [&](Tensor& t, const BlobSource&) {
    b.offsets.push_back(b.bytes);
    b.bytes += (static_cast<size_t>(t.nbytes()) + kBlobAlign - 1) / kBlobAlign * kBlobAlign;
  });
  return b;
}

void rebase_layer(LayerWeights& d, const BlobLayout& layout, void* base) {
  size_t i = 0;
  visit_layer_blob(d, nullptr, [&](Tensor& t, const BlobSource&) {
    t.data = static_cast<uint8_t*>(base) + layout.offsets[i++];
  });
}

Status pack_layer_blob(LayerWeights d, const LayerWeights& stored, const BlobLayout& layout,
                       uint8_t* blob) {
  size_t i = 0;
  Status st = ok_status();
  visit_layer_blob(d, &stored, [&](Tensor& t, const BlobSource& src) {
    if (!st.ok()) return;
    uint8_t* dst = blob + layout.offsets[i++];
    switch (src.kind) {
      case BlobSource::kDevice:
        st = Status(StatusCode::kUnimplemented,
                    "streaming from disk packs bf16 layers on the host: int8 / fp8 weights are "
                    "quantized on the device (use --offload-weights cpu)");
        return;
      case BlobSource::kRowsBf16: {
        const int64_t cols = t.cols();
        auto* out = reinterpret_cast<uint16_t*>(dst);
        int64_t r0 = 0;
        for (int p = 0; p < src.linear->n_parts; ++p) {
          const Tensor& w = src.linear->parts[static_cast<size_t>(p)].w;
          if (w.cols() != cols || r0 + w.dim(0) > t.dim(0)) {
            st = errorf(StatusCode::kInternal, "layer blob: part {} is {}, expected [<= {}, {}]", p,
                        w.shape_string(), t.dim(0) - r0, cols);
            return;
          }
          st = ops::host_rows_to_bf16(w, out + r0 * cols);
          if (!st.ok()) return;
          r0 += w.dim(0);
        }
        return;
      }
      case BlobSource::kBiasF32: {
        auto* out = reinterpret_cast<float*>(dst);
        std::memset(out, 0, static_cast<size_t>(t.nbytes()));
        int64_t r0 = 0;
        for (int p = 0; p < src.linear->n_parts; ++p) {
          const ops::LinearWeight::Part& part = src.linear->parts[static_cast<size_t>(p)];
          if (part.bias.defined()) {
            st = ops::host_to_f32(part.bias, out + r0);
            if (!st.ok()) return;
          }
          r0 += part.w.dim(0);
        }
        return;
      }
      case BlobSource::kVectorF32: {
        auto* out = reinterpret_cast<float*>(dst);
        if (src.vector != nullptr && src.vector->defined()) {
          if (src.vector->numel() != t.numel()) {
            st = errorf(StatusCode::kInternal, "layer blob: a norm has {} values, expected {}",
                        src.vector->numel(), t.numel());
            return;
          }
          st = ops::host_to_f32(*src.vector, out);
        } else {
          for (int64_t k = 0; k < t.numel(); ++k) out[k] = src.fill;
        }
        return;
      }
    }
  });
  return st;
}

void for_each_stored_tensor(LayerWeights& s, const std::function<void(Tensor&)>& fn) {
  auto t = [&](Tensor& x) {
    if (x.defined()) fn(x);
  };
  auto norm = [&](ops::NormWeight& n) {
    t(n.w);
    t(n.b);
  };
  auto linear = [&](ops::LinearWeight& l) {
    for (int i = 0; i < l.n_parts; ++i) {
      ops::LinearWeight::Part& p = l.parts[static_cast<size_t>(i)];
      t(p.w);
      t(p.scale);
      t(p.bias);
    }
  };
  norm(s.attn_norm);
  norm(s.ffn_norm);
  norm(s.q_norm);
  norm(s.k_norm);
  norm(s.post_attn_norm);
  norm(s.post_ffn_norm);
  linear(s.qkv);
  linear(s.o);
  linear(s.gate_up);
  linear(s.down);
  linear(s.router);
  for (auto& e : s.expert_gate_up) linear(e);
  for (auto& e : s.expert_down) linear(e);
  linear(s.shared_gate_up);
  linear(s.shared_down);
  linear(s.shared_gate);
}

}  // namespace strata
