// One decode token's attention block in one parallel region (quant_attn_decode, quant.h): the
// input norm, the Q/K/V projection, rope (with per-head q/k norms) and the KV append, attention
// over the cache, and the output projection with the residual. The composition runs five
// parallel regions and two serial steps per layer; at 16 threads a region's fork and join cost
// about 4 us (bench_sync on the Xeon) against ~0.3-2 us of work in each of them for a small
// model. Here each thread normalizes x and quantizes h itself, and three barriers separate
// the phases:
//   1. h = norm(x), quantized to int16; the thread's 4-row tiles of the Q/K/V parts (striped)
//   2. per head: q copied out, q / k norms, rotation; each KV head's k and v appended
//   3. the attention items (attention_items)
//   4. attn quantized to int16; the thread's 4-row tiles of Wo, added to x
// Every step is the composition's kernel on the same data (the same tiles, row functions and
// items), so every output is bit-identical to it.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/phase_clock.h"
#include "backends/cpu/quant.h"
#include "backends/cpu/quant_impl.h"
#include "backends/cpu/spin_pool.h"
#include "core/status.h"

namespace strata::cpu {

Status quant_attn_decode(const AttnDecodeArgs& a, bool* done) {
  *done = false;
  const int64_t k = a.hidden;
  const RopeKvAppendF32Params& rk = a.rope_kv;  // phase 2's work: its units of token 0
  AttentionKernelParams ap = a.attn;
  ap.q = rk.q_out;
  ap.n_tokens = 1;
  const PagedKvParams& c = ap.cache;
  const int64_t hq = ap.n_heads, hkv = c.n_heads_kv, D = c.head_dim;
  const QuantIsa isa = quant_detail::resolve_quant_isa(QuantIsa::kBest);
  if (isa == QuantIsa::kScalar || quant_decode_int8() || k % 32 != 0 || (hq * D) % 32 != 0 ||
      a.attn.n_tokens != 1 || rk.n_tokens != 1 || a.norm.weight == nullptr || a.n_qkv < 1 ||
      a.n_qkv > 3 || hkv < 1 || hq % hkv != 0) {
    return ok_status();
  }
  quant_detail::DecodeTilesI16 qkv_tiles, o_tiles;
  int64_t qkv_rows = 0;
  for (int i = 0; i < a.n_qkv; ++i) qkv_rows += a.qkv[i].rows;
  DecodePart o = a.o;
  o.out = a.x;  // the output projection accumulates into x
  if (qkv_rows != (hq + 2 * hkv) * D || o.rows != k || !qkv_tiles.init(a.qkv, a.n_qkv, k, isa) ||
      !o_tiles.init(&o, 1, hq * D, isa)) {
    return ok_status();
  }
  if (rk.rotary_dim != 0 && !rotary_dim_ok(rk.rotary_dim, D)) return ok_status();
  // The checks the composition's kernels make before they write (the slots the token appends to
  // and reads), and the attention's items, sized for the threads attention() would use.
  const int nt_omp = omp_get_max_threads();
  STRATA_RETURN_IF_ERROR(check_kv_slot(c, "kv_append", 0, ap.token_seq[0], ap.token_pos[0]));
  AttentionItems items;
  STRATA_RETURN_IF_ERROR(attention_items(ap, nt_omp, &items));
  RmsNormParams norm = a.norm;
  norm.n_tokens = 1;
  norm.hidden = k;
  const float* cos_sin = rope_kv_cos_sin(rk);  // the calling thread's, read inside the region
  const int64_t units = hq + hkv;              // rope units: q heads, then KV heads
  const int64_t nk = std::max(k, hq * D);

  const bool quad = quant_detail::rows4_reads_quad(isa);
  static PhaseClock clock("attention block", std::array{"norm", "qkv", "wait", "rope", "wait",
                                                        "attention", "wait", "o_proj"});
  const auto body = [&](int tid, int nt, const auto& barrier) {
    const auto range = [&](int64_t n, int64_t* lo, int64_t* hi) {
      *lo = n * tid / nt;
      *hi = n * (tid + 1) / nt;
    };
    PhaseClock::Call phases(clock, tid == 0);
    const quant_detail::ThreadScratch sc = quant_detail::thread_scratch(k, nk, quad);
    float* h = sc.h;
    rms_norm_row(norm, a.x, h);
    const quant_detail::Q16Act ha = sc.quantize(h, k);
    phases.mark();
    int64_t lo, hi;
    range(qkv_tiles.tiles, &lo, &hi);
    qkv_tiles.run(lo, hi, ha, false);
    phases.mark();
    barrier();  // the qkv row is complete
    phases.mark();

    if (tid == 0) std::memcpy(a.h, h, sizeof(float) * static_cast<size_t>(k));
    range(units, &lo, &hi);
    for (int64_t u = lo; u < hi; ++u) rope_kv_unit(rk, cos_sin, 0, u);
    phases.mark();
    barrier();  // q and the cache slot are written
    phases.mark();

    range(items.count, &lo, &hi);
    for (int64_t i = lo; i < hi; ++i) run_attention_item(items, i);
    phases.mark();
    barrier();  // attn is complete, and every thread has read x
    phases.mark();

    const int64_t n_attn = hq * D;
    const quant_detail::Q16Act oa = sc.quantize(ap.out, n_attn);
    range(o_tiles.tiles, &lo, &hi);
    o_tiles.run(lo, hi, oa, true);
    phases.mark();
  };
  const bool pooled =
      spin_run(spin_threads(), [&](int tid, int nt) { body(tid, nt, [] { spin_barrier(); }); });
  if (!pooled) {
#pragma omp parallel num_threads(nt_omp)
    body(omp_get_thread_num(), omp_get_num_threads(), [] {
#pragma omp barrier
    });
  }
  *done = true;
  return ok_status();
}

}  // namespace strata::cpu
