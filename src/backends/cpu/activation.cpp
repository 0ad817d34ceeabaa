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
  for (; i < n; ++i) o[i] = apply<Activation::kSilu>(g[i]) * u[i];
}

void silu_gated_rows_avx2(const GatedActParams& p) {
#pragma omp parallel for schedule(static) if (p.n_tokens * p.ffn_dim >= kParallelMinElems)
  for (int64_t r = 0; r < p.n_tokens; ++r) {
    silu_gated_avx2(p.gate + r * p.gate_stride, p.up + r * p.up_stride, p.out + r * p.out_stride,
                    p.ffn_dim);
  }
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
      for (int64_t i = 0; i < n; ++i) out[i] = apply<Activation::kSilu>(gate[i]) * up[i];
      return;
    case Activation::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) out[i] = apply<Activation::kGeluTanh>(gate[i]) * up[i];
      return;
    case Activation::kGeluErf:
      for (int64_t i = 0; i < n; ++i) out[i] = apply<Activation::kGeluErf>(gate[i]) * up[i];
      return;
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) out[i] = apply<Activation::kRelu>(gate[i]) * up[i];
      return;
  }
}

Status gated_act(const GatedActParams& p) {
  switch (p.act) {
    case Activation::kSilu:
#if defined(__x86_64__)
      if (cpu_supports(CpuIsa::kAvx2)) {
        silu_gated_rows_avx2(p);
        break;
      }
#endif
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
