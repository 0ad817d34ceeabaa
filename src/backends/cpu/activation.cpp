// Activations on the CPU: act(x) in place and the gated form act(gate) * up of SwiGLU/GeGLU
// MLPs. f32 throughout; gate/up may be strided column views of one fused projection output.
#include <cmath>

#include "backends/cpu/activation_impl.h"
#include "backends/cpu/cpu_kernels.h"

namespace strata::cpu {
namespace {

template <Activation A>
inline float apply(float x) {
  return apply_activation<A>(x);
}

template <Activation A>
void gated_rows(const GatedActParams& p) {
#pragma omp parallel for schedule(static) if (p.n_tokens * p.ffn_dim >= kParallelMinElems)
  for (int64_t r = 0; r < p.n_tokens; ++r) {
    const float* g = p.gate + r * p.gate_stride;
    const float* u = p.up + r * p.up_stride;
    float* o = p.out + r * p.out_stride;
    for (int64_t i = 0; i < p.ffn_dim; ++i) o[i] = apply<A>(g[i]) * u[i];
  }
}

template <Activation A>
void act_rows(const ActParams& p) {
#pragma omp parallel for schedule(static) if (p.rows * p.cols >= kParallelMinElems)
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.stride;
    for (int64_t i = 0; i < p.cols; ++i) x[i] = apply<A>(x[i]);
  }
}

}  // namespace

Status gated_act(const GatedActParams& p) {
  switch (p.act) {
    case Activation::kSilu:
      gated_rows<Activation::kSilu>(p);
      break;
    case Activation::kGeluTanh:
      gated_rows<Activation::kGeluTanh>(p);
      break;
    case Activation::kGeluErf:
      gated_rows<Activation::kGeluErf>(p);
      break;
    case Activation::kRelu:
      gated_rows<Activation::kRelu>(p);
      break;
  }
  return ok_status();
}

Status act(const ActParams& p) {
  switch (p.act) {
    case Activation::kSilu:
      act_rows<Activation::kSilu>(p);
      break;
    case Activation::kGeluTanh:
      act_rows<Activation::kGeluTanh>(p);
      break;
    case Activation::kGeluErf:
      act_rows<Activation::kGeluErf>(p);
      break;
    case Activation::kRelu:
      act_rows<Activation::kRelu>(p);
      break;
  }
  return ok_status();
}

}  // namespace strata::cpu
