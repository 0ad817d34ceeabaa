// Activations on the CPU: act(x) in place and the gated form act(gate) * up of SwiGLU/GeGLU
// MLPs. f32 throughout; gate/up may be strided column views of one fused projection output.
#include <cmath>

#include "backends/cpu/activation_impl.h"
#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/simd_math.h"

namespace strata::cpu {
namespace {

template <Activation A>
inline float apply(float x) {
  return apply_activation<A>(x);
}

template <Activation A>
void gated_row(const float* g, const float* u, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = apply<A>(g[i]) * u[i];
}

template <Activation A>
void act_rows(const ActParams& p) {
#pragma omp parallel for schedule(static) if (p.rows * p.cols >= kParallelMinElems)
  for (int64_t r = 0; r < p.rows; ++r) {
    float* x = p.x + r * p.stride;
    for (int64_t i = 0; i < p.cols; ++i) x[i] = apply<A>(x[i]);
  }
}

#if defined(__x86_64__)
// SiLU(g) * u with 8-wide exps (simd::exp_ps, within 2 ulp of std::exp; the quotient rounds as
// the scalar formula's does).
__attribute__((target("avx2,fma"))) void silu_gated_avx2(const float* g, const float* u, float* o,
                                                         int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 e = simd::exp_ps(_mm256_xor_ps(x, sign));
    const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
    _mm256_storeu_ps(o + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
  gated_row<Activation::kSilu>(g + i, u + i, o + i, n - i);
}
#endif

}  // namespace

void gated_act_row(Activation act, const float* gate, const float* up, float* out, int64_t n) {
  switch (act) {
    case Activation::kSilu:
#if defined(__x86_64__)
      if (cpu_supports(CpuIsa::kAvx2)) {
        silu_gated_avx2(gate, up, out, n);
        return;
      }
#endif
      gated_row<Activation::kSilu>(gate, up, out, n);
      return;
    case Activation::kGeluTanh:
      gated_row<Activation::kGeluTanh>(gate, up, out, n);
      return;
    case Activation::kGeluErf:
      gated_row<Activation::kGeluErf>(gate, up, out, n);
      return;
    case Activation::kRelu:
      gated_row<Activation::kRelu>(gate, up, out, n);
      return;
  }
}

Status gated_act(const GatedActParams& p) {
#pragma omp parallel for schedule(static) if (p.n_tokens * p.ffn_dim >= kParallelMinElems)
  for (int64_t r = 0; r < p.n_tokens; ++r) {
    gated_act_row(p.act, p.gate + r * p.gate_stride, p.up + r * p.up_stride,
                  p.out + r * p.out_stride, p.ffn_dim);
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
