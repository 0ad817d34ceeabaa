// Split-K flash-decoding over the bf16 paged KV cache for few queries per sequence (decode: 1;
// speculative tokens or short chunks: up to 4 by varlen_attention's choice, any count works),
// varlen layout (VarlenAttentionParams, CPU twin src/backends/cpu/varlen_attention.cpp).
//
// Grid (splits, n_heads_kv * subgroups, n_seqs). A CTA takes one KV head of one sequence and one
// chunk of its cached positions, and computes every query row that reads that KV head: the
// (query head of the group, query) pairs, up to 16 of them (one m16 MMA tile; a group with more
// rows is cut into subgroups, each re-reading the KV head). So a K/V row is read once for all
// query heads of its GQA group (the batch-sharded multi-query idea) and decode reads each cache
// byte once per step. The 4 warps take 16 keys each of every 64-key tile; tiles stream through a
// 3-stage cp.async pipeline (16-byte copies, keys gathered through the block table), and each
// warp runs S = Q K^T and O += P V on tensor cores (mma.sync m16n8k16, ldmatrix) with its own
// online softmax. At the end the warps merge through shared memory, and the CTA writes either
// the bf16 output (one split) or a partial (max, sum, unnormalized accumulator, f32) to the
// workspace, which the combine kernel reduces across splits.
//
// Split count: as many CTAs (n_seqs * n_heads_kv * subgroups * splits) as the GPU holds at once,
// rounded down -- one more split would start a second wave, mostly empty, that every sequence
// waits for (measured on an H100, Llama-3-8B's heads at batch 16 and KV 8,192: 2 splits, 256
// CTAs, 0.198 ms; 3 splits, 384 CTAs, 0.248 ms) -- with chunks of at least 32 keys, as many as
// the workspace holds; it depends only on host values (n_seqs, max_q_len, max_kv_len, SM count,
// the kernel's occupancy, workspace size), never on kv_len, so a captured CUDA graph replays
// with any lengths up to max_kv_len. STRATA_DECODE_CTAS_PER_SM replaces the occupancy (A/B). A
// split past a sequence's kv_len (or wholly before its window) writes a neutral partial (sum 0),
// which the combine skips. Rows of a sequence whose device data is invalid (see SeqView, or a block
// outside the pool) come out NaN.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_kernels.h"
#include "backends/cuda/kernels/flash_common.cuh"
#include "core/env.h"

namespace strata::cuda {
namespace {

using namespace flash;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileKeys = 16 * kWarps;  // keys per pipeline stage, 16 per warp
constexpr int kStages = 3;
constexpr int kRows = 16;  // query rows per CTA: one m16 tile
constexpr int64_t kMinChunk = 32;
constexpr int64_t kMaxSplits = 128;
// splits * n_seqs at most: bounds the workspace (varlen_attention_workspace_bytes) while
// leaving room for ~2 CTAs per SM on GPUs of up to 256 SMs with one KV head.
constexpr int64_t kSplitSeqBudget = 512;
constexpr int64_t kWorkspaceQ = 4;  // queries per sequence the workspace is sized for

template <int D>
struct DecodeCfg {
  static constexpr int kStageElems = 2 * kTileKeys * D;  // K tile, then V tile
  static constexpr int kORow = D + 8;  // floats per merged row (padding spreads banks)
  static constexpr size_t kPipeBytes = size_t{kStages} * kStageElems * sizeof(uint16_t);
  static constexpr size_t kMergeBytes = size_t{kWarps} * kRows * (kORow + 2) * sizeof(float);
  static constexpr size_t kSmemBytes =
      size_t{kRows} * D * sizeof(uint16_t) + (kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes);
};

// Workspace layout for `splits` splits: ml[splits][slots][2] (max in the log2 domain, sum), then
// acc[splits][slots][D] at a 16-byte boundary; slot = (seq * max_q_len + query) * n_heads + head.
struct WsLayout {
  int64_t slots = 0;
  int64_t acc_offset = 0;  // floats
  size_t bytes = 0;
};

WsLayout ws_layout(int64_t splits, int64_t n_seqs, int64_t max_q, int64_t n_heads, int64_t d) {
  WsLayout w;
  w.slots = n_seqs * max_q * n_heads;
  w.acc_offset = round_up<int64_t>(splits * w.slots * 2, 4);
  w.bytes = static_cast<size_t>(w.acc_offset + splits * w.slots * d) * sizeof(float);
  return w;
}

int64_t max_splits(int64_t n_seqs, int64_t max_kv_len) {
  if (n_seqs <= 0) return 1;
  return std::max<int64_t>(1, std::min({ceil_div<int64_t>(max_kv_len, kMinChunk), kMaxSplits,
                                        kSplitSeqBudget / n_seqs}));
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_decode_kernel(const __grid_constant__ VarlenAttentionParams p, const int chunk,
                        const int64_t n_slots, float* __restrict__ ws_ml,
                        float* __restrict__ ws_acc) {
  pdl_trigger();  // the (PDL-launched) o_proj GEMM may start prefetching its weights
  using Cfg = DecodeCfg<D>;
  constexpr int kChunks = D / 8;                    // 16-byte chunks per row
  constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of the CTA copies
  constexpr int kDT = D / 8;                        // n8 tiles of O
  constexpr int kRowBytes = D * 2;
  extern __shared__ __align__(1024) uint16_t smem[];
  uint16_t* s_pipe = smem;                                    // [kStages][K, V][kTileKeys][D]
  uint16_t* s_q = smem + Cfg::kPipeBytes / sizeof(uint16_t);  // [kRows][D]
  float* s_merge = reinterpret_cast<float*>(smem);            // after the loop, over s_pipe

  const PagedKvBf16Params& c = p.cache;
  const int split = static_cast<int>(blockIdx.x);
  const int n_splits = static_cast<int>(gridDim.x);
  const int s = static_cast<int>(blockIdx.z);
  const int group = static_cast<int>(p.n_heads / c.n_heads_kv);
  const int mq = static_cast<int>(p.max_q_len);
  const int n_sub = ceil_div(group * mq, kRows);
  const int kv_head = static_cast<int>(blockIdx.y) / n_sub;
  const int row0 = (static_cast<int>(blockIdx.y) % n_sub) * kRows;  // first (head, query) pair
  const SeqView sv = seq_view(p, s);
  if (sv.n_q <= 0) return;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int n_q = min(sv.n_q, mq);
  // Row r of the CTA is pair row0 + r: query head kv_head * group + pair / mq, query pair % mq.
  auto row_valid = [&](int r) { return row0 + r < group * mq && (row0 + r) % mq < n_q; };
  auto row_head = [&](int r) { return kv_head * group + (row0 + r) / mq; };
  auto row_query = [&](int r) { return (row0 + r) % mq; };

  // Writes row r's result: out = acc / sum (one split), else the partial (m2 = max * log2e-scale).
  auto write_row = [&](int r, float m2, float sum, const float* acc, int d0, int nd, bool nan) {
    const int head = row_head(r);
    const int qi = row_query(r);
    if (n_splits == 1) {
      uint16_t* out = p.out + int64_t{sv.q0 + qi} * p.out_stride + int64_t{head} * D + d0;
      const float inv = 1.0f / sum;
      for (int i = 0; i < nd; i += 2) {
        const uint32_t v = nan ? 0x7fc07fc0u : pack_bf16(acc[i] * inv, acc[i + 1] * inv);
        *reinterpret_cast<uint32_t*>(out + i) = v;
      }
      return;
    }
    const int64_t slot = (int64_t{s} * mq + qi) * p.n_heads + head;
    const int64_t at = int64_t{split} * n_slots + slot;
    if (d0 == 0) {
      ws_ml[2 * at] = nan ? 0.0f : (sum > 0.0f ? m2 : -INFINITY);
      ws_ml[2 * at + 1] = nan ? __int_as_float(0x7fc00000) : sum;
    }
    if (!nan && sum > 0.0f) {
      float* dst = ws_acc + at * D + d0;
      for (int i = 0; i < nd; i += 4) {
        *reinterpret_cast<float4*>(dst + i) =
            make_float4(acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
      }
    }
  };
  // Thread tid writes dims [d0, d0 + kPart) of row tid / 8 at the end.
  constexpr int kPart = D / 8;
  const int my_row = tid / 8;
  const int my_d0 = (tid % 8) * kPart;

  // NaN rows for bad device data, and should the shared memory not be 1024-byte aligned as
  // requested (the ldmatrix addressing relies on it, see flash_prefill.cu).
  if (sv.bad || smem_u32(smem) % 1024 != 0) {
    if (row_valid(my_row)) write_row(my_row, 0.0f, 0.0f, nullptr, my_d0, kPart, true);
    return;
  }
  const int off = sv.kv_len - sv.n_q;  // position of query 0
  const int k_begin = max(split * chunk, window_start(off, p.sliding_window));
  const int k_end = min(split * chunk + chunk, sv.kv_len);
  const int n_tiles = k_begin < k_end ? ceil_div(k_end - k_begin, kTileKeys) : 0;
  if (n_tiles == 0) {  // a neutral partial (only possible with several splits)
    if (row_valid(my_row)) write_row(my_row, 0.0f, 0.0f, nullptr, my_d0, 0, false);
    return;
  }

  const int32_t* table = c.block_tables + int64_t{s} * c.max_blocks_per_seq;
  const int64_t slot_stride = c.n_heads_kv * D;
  bool bad_block = false;
  {  // the CTA's query rows (invalid rows zero-filled)
    const int chunk16 = tid % kChunks;
#pragma unroll
    for (int i = 0; i < kRows / kRowsPerPass + (kRows % kRowsPerPass != 0); ++i) {
      const int r = tid / kChunks + i * kRowsPerPass;
      if (r < kRows) {
        const bool valid = row_valid(r);
        const uint16_t* src =
            p.q +
            (valid ? int64_t{sv.q0 + row_query(r)} * p.q_stride + int64_t{row_head(r)} * D : 0) +
            chunk16 * 8;
        cp_async_16(smem_u32(s_q + swizzle<D>(r, chunk16)), src, valid ? 16 : 0);
      }
    }
  }
  // Tile t's keys [k_begin + 64 t, +64) into stage `stage`; keys from k_end on are zero-filled.
  auto load_tile = [&](int t, int stage) {
    uint16_t* dk = s_pipe + stage * Cfg::kStageElems;
    uint16_t* dv = dk + kTileKeys * D;
    const int chunk16 = tid % kChunks;
#pragma unroll
    for (int i = 0; i < kTileKeys / kRowsPerPass; ++i) {
      const int row = tid / kChunks + i * kRowsPerPass;
      const int key = k_begin + t * kTileKeys + row;
      int slot = -1;
      if (key < k_end) {
        slot = kv_slot(c, table, key);
        bad_block |= slot < 0;
      }
      const int64_t at = (slot >= 0 ? slot * slot_stride : 0) + int64_t{kv_head} * D + chunk16 * 8;
      cp_async_16(smem_u32(dk + swizzle<D>(row, chunk16)), c.k_cache + at, slot >= 0 ? 16 : 0);
      cp_async_16(smem_u32(dv + swizzle<D>(row, chunk16)), c.v_cache + at, slot >= 0 ? 16 : 0);
    }
  };
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < n_tiles) load_tile(t, t);
    cp_async_commit();
  }

  const bool capped = p.logit_softcap > 0.0f;
  const float pre_cap = capped ? p.scale / p.logit_softcap : 0.0f;
  const float scale_log2 = (capped ? p.logit_softcap : p.scale) * kLog2e;
  const int window = static_cast<int>(p.sliding_window);
  const int g = lane / 4;
  const int t4 = lane % 4;
  const int pos_g[2] = {off + row_query(g), off + row_query(g + 8)};  // the lane's two rows

  // ldmatrix addresses as in flash_prefill.cu: rows (lane & 7) + multiples of 8, k step = XOR.
  const uint32_t q_addr = smem_u32(s_q) + (lane & 15) * kRowBytes + ((lane / 16) ^ (lane & 7)) * 16;
  const uint32_t k_addr = smem_u32(s_pipe) +
                          (warp * 16 + (lane & 7) + (lane / 16) * 8) * kRowBytes +
                          (((lane / 8) & 1) ^ (lane & 7)) * 16;
  const uint32_t v_addr = smem_u32(s_pipe) + (kTileKeys + warp * 16 + (lane & 15)) * kRowBytes +
                          ((lane / 16) ^ (lane & 7)) * 16;

  uint32_t qf[D / 16][4];
  float o[kDT][4];
#pragma unroll
  for (int dn = 0; dn < kDT; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  for (int it = 0; it < n_tiles; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // tile `it` landed; every warp is done with the stage refilled next
    if (it + kStages - 1 < n_tiles) load_tile(it + kStages - 1, (it + kStages - 1) % kStages);
    cp_async_commit();
    if (it == 0) {
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) ldmatrix_x4(qf[ks], q_addr ^ (ks * 32));
    }
    const int key0 = k_begin + it * kTileKeys + warp * 16;  // this warp's 16 keys
    if (key0 >= k_end) continue;
    const uint32_t stage_off = (it % kStages) * Cfg::kStageElems * 2;

    float sc[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t b[4];
      ldmatrix_x4(b, (k_addr + stage_off) ^ (ks * 32));
      mma_bf16(sc[0], qf[ks], b[0], b[1]);
      mma_bf16(sc[1], qf[ks], b[2], b[3]);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& x = sc[nt][e];
        if (capped) x = tanhf(x * pre_cap);
        const int key = key0 + nt * 8 + 2 * t4 + (e & 1);
        const int pr = pos_g[e / 2];
        if (key >= k_end || key > pr || (window > 0 && key <= pr - window)) x = -INFINITY;
      }
    }
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float mx = fmaxf(row_max[hr], fmaxf(fmaxf(sc[0][2 * hr], sc[0][2 * hr + 1]),
                                          fmaxf(sc[1][2 * hr], sc[1][2 * hr + 1])));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
      const float alpha = fast_exp2(row_max[hr] * scale_log2 - m_scaled);
      row_max[hr] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float w = fast_exp2(fmaf(sc[nt][2 * hr + e], scale_log2, -m_scaled));
          sc[nt][2 * hr + e] = w;
          sum += w;
        }
      }
      row_sum[hr] = row_sum[hr] * alpha + sum;
#pragma unroll
      for (int dn = 0; dn < kDT; ++dn) {
        o[dn][2 * hr] *= alpha;
        o[dn][2 * hr + 1] *= alpha;
      }
    }
    const uint32_t a[4] = {pack_bf16(sc[0][0], sc[0][1]), pack_bf16(sc[0][2], sc[0][3]),
                           pack_bf16(sc[1][0], sc[1][1]), pack_bf16(sc[1][2], sc[1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldmatrix_x4_trans(b, (v_addr + stage_off) ^ (dp * 32));
      mma_bf16(o[2 * dp], a, b[0], b[1]);
      mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
    }
  }

  // Merge the 4 warps' (max, sum, acc) per row through shared memory (over the pipeline).
  cp_async_wait<0>();
  const bool bad = __syncthreads_or(bad_block);
  float* s_max = s_merge;                 // [kWarps][kRows]
  float* s_sum = s_max + kWarps * kRows;  // [kWarps][kRows]
  float* s_o = s_sum + kWarps * kRows;    // [kWarps][kRows][kORow]
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float l = row_sum[hr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int r = g + 8 * hr;
    if (t4 == 0) {
      s_max[warp * kRows + r] = row_max[hr];
      s_sum[warp * kRows + r] = l;
    }
    float* dst = s_o + (warp * kRows + r) * Cfg::kORow + 2 * t4;
#pragma unroll
    for (int dn = 0; dn < kDT; ++dn) {
      *reinterpret_cast<float2*>(dst + dn * 8) = make_float2(o[dn][2 * hr], o[dn][2 * hr + 1]);
    }
  }
  __syncthreads();
  if (!row_valid(my_row)) return;
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_max[w * kRows + my_row]);
  const float m_scaled = mx == -INFINITY ? 0.0f : mx * scale_log2;
  float weight[kWarps];
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = fast_exp2(s_max[w * kRows + my_row] * scale_log2 - m_scaled);
    sum += s_sum[w * kRows + my_row] * weight[w];
  }
  float acc[kPart];
#pragma unroll
  for (int i = 0; i < kPart; ++i) {
    acc[i] = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      acc[i] += s_o[(w * kRows + my_row) * Cfg::kORow + my_d0 + i] * weight[w];
  }
  write_row(my_row, m_scaled, sum, acc, my_d0, kPart, bad);
}

// out = sum_s acc_s 2^(m_s - M) / sum_s l_s 2^(m_s - M) over the splits with l_s > 0; a NaN
// partial (invalid data) makes the row NaN. One warp per (query, head), lanes over head_dim
// (and over the splits for the max).
template <int D>
__global__ void flash_decode_combine_kernel(const __grid_constant__ VarlenAttentionParams p,
                                            const int n_splits, const int64_t n_slots,
                                            const float* __restrict__ ws_ml,
                                            const float* __restrict__ ws_acc) {
  pdl_trigger();
  constexpr int kPer = D / kWarpSize;  // dims per lane: 2 or 4
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t pair = int64_t{blockIdx.x} * kWarps + threadIdx.x / kWarpSize;
  const int s = static_cast<int>(blockIdx.y);
  const int mq = static_cast<int>(p.max_q_len);
  if (pair >= int64_t{mq} * p.n_heads) return;
  const int qi = static_cast<int>(pair / p.n_heads);
  const int head = static_cast<int>(pair % p.n_heads);
  const SeqView sv = seq_view(p, s);
  if (qi >= min(sv.n_q, mq)) return;
  const int64_t slot = (int64_t{s} * mq + qi) * p.n_heads + head;
  // The max over the splits: the lanes read 32 splits' (m, l) at a time (fmaxf: any order).
  float mx = -INFINITY;
  bool nan = false;
  for (int sp = lane; sp < n_splits; sp += kWarpSize) {
    const float2 ml = *reinterpret_cast<const float2*>(ws_ml + 2 * (int64_t{sp} * n_slots + slot));
    nan |= ml.y != ml.y;
    if (ml.y > 0.0f) mx = fmaxf(mx, ml.x);
  }
  mx = warp_reduce_max(mx);
  nan = __any_sync(0xffffffffu, nan);
  // The sums in split order, kUnroll splits' loads issued before their adds (a latency chain
  // of one load per split before).
  constexpr int kUnroll = 4;
  float acc[kPer] = {};
  float sum = 0.0f;
  for (int sp0 = 0; sp0 < n_splits && !nan; sp0 += kUnroll) {
    float2 ml[kUnroll];
    float v[kUnroll][kPer];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      ml[u] = make_float2(0.0f, 0.0f);
      if (sp0 + u < n_splits) {
        const int64_t at = int64_t{sp0 + u} * n_slots + slot;
        ml[u] = *reinterpret_cast<const float2*>(ws_ml + 2 * at);
        load_f32<kPer>(ws_acc + at * D + lane * kPer, v[u]);  // unused for an empty split
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!(ml[u].y > 0.0f)) continue;
      const float w = fast_exp2(ml[u].x - mx);
      sum += ml[u].y * w;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] += v[u][i] * w;
    }
  }
  uint16_t* out = p.out + int64_t{sv.q0 + qi} * p.out_stride + int64_t{head} * D + lane * kPer;
  const float inv = 1.0f / sum;
#pragma unroll
  for (int i = 0; i < kPer; i += 2) {
    *reinterpret_cast<uint32_t*>(out + i) =
        nan ? 0x7fc07fc0u : pack_bf16(acc[i] * inv, acc[i + 1] * inv);
  }
}

struct SplitPlan {
  int64_t splits = 1;
  int64_t chunk = 0;  // keys per split
  WsLayout ws;
};

// resident: CTAs of the kernel one SM holds at once.
SplitPlan plan_splits(const LaunchCtx& ctx, const VarlenAttentionParams& p, int64_t n_sub,
                      int resident) {
  SplitPlan plan;
  const int64_t kv = std::max<int64_t>(p.max_kv_len, 1);
  plan.chunk = kv;
  const int64_t sms = ctx.sm_count > 0 ? ctx.sm_count : 132;
  const int64_t ctas = p.n_seqs * p.cache.n_heads_kv * n_sub;
  const int64_t per_sm =
      env_config().decode_ctas_per_sm > 0 ? env_config().decode_ctas_per_sm : resident;
  // Rounded down: a split more would start a second, mostly empty wave of CTAs.
  int64_t splits = std::min(std::max<int64_t>(1, per_sm * sms / ctas), max_splits(p.n_seqs, kv));
  // As many as the workspace holds (none without one).
  while (splits > 1 &&
         (p.workspace == nullptr || !is_aligned(p.workspace, 16) ||
          ws_layout(splits, p.n_seqs, p.max_q_len, p.n_heads, p.cache.head_dim).bytes >
              p.workspace_bytes)) {
    --splits;
  }
  if (splits <= 1) return plan;
  plan.chunk = round_up<int64_t>(ceil_div<int64_t>(kv, splits), kMinChunk);
  plan.splits = ceil_div<int64_t>(kv, plan.chunk);
  plan.ws = ws_layout(plan.splits, p.n_seqs, p.max_q_len, p.n_heads, p.cache.head_dim);
  return plan;
}

// CTAs of flash_decode_kernel<D> one SM holds at once (shared memory bound: 2 for D = 128 on
// Hopper), asked once; 2 if the query fails. Needs the kernel's shared-memory attribute set.
template <int D>
int resident_ctas_per_sm() {
  static const int n = [] {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, flash_decode_kernel<D>, kThreads,
                                                      DecodeCfg<D>::kSmemBytes) != cudaSuccess ||
        blocks < 1) {
      (void)cudaGetLastError();
      return 2;
    }
    return blocks;
  }();
  return n;
}

template <int D>
Status launch(const LaunchCtx& ctx, const VarlenAttentionParams& p) {
  using Cfg = DecodeCfg<D>;
  const int64_t group = p.n_heads / p.cache.n_heads_kv;
  const int64_t n_sub = ceil_div<int64_t>(group * p.max_q_len, kRows);
  if (p.cache.n_heads_kv * n_sub > 65535) return varlen_attention_generic(ctx, p);
  const auto kernel = flash_decode_kernel<D>;
  STRATA_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::kSmemBytes)));
  const SplitPlan plan = plan_splits(ctx, p, n_sub, resident_ctas_per_sm<D>());
  float* ws = static_cast<float*>(p.workspace);
  float* ws_ml = plan.splits > 1 ? ws : nullptr;
  float* ws_acc = plan.splits > 1 ? ws + plan.ws.acc_offset : nullptr;
  const dim3 grid(static_cast<unsigned>(plan.splits),
                  static_cast<unsigned>(p.cache.n_heads_kv * n_sub),
                  static_cast<unsigned>(p.n_seqs));
  kernel<<<grid, kThreads, Cfg::kSmemBytes, ctx.stream>>>(p, static_cast<int>(plan.chunk),
                                                          plan.ws.slots, ws_ml, ws_acc);
  STRATA_RETURN_IF_ERROR(kernel_launch_status("flash_decode_kernel"));
  if (plan.splits == 1) return ok_status();
  const dim3 cgrid(static_cast<unsigned>(ceil_div<int64_t>(p.max_q_len * p.n_heads, kWarps)),
                   static_cast<unsigned>(p.n_seqs));
  flash_decode_combine_kernel<D><<<cgrid, kThreads, 0, ctx.stream>>>(
      p, static_cast<int>(plan.splits), plan.ws.slots, ws_ml, ws_acc);
  return kernel_launch_status("flash_decode_combine_kernel");
}

}  // namespace

// Enough for every batch of at most n_seqs sequences (callers size it once, for their largest
// batch): the largest need of any n <= n_seqs at its split cap. Since splits * n <=
// kSplitSeqBudget, the size stops growing beyond a few sequences.
size_t varlen_attention_workspace_bytes(int64_t n_seqs, int64_t n_heads, int64_t head_dim,
                                        int64_t max_kv_len) {
  if (n_seqs <= 0 || n_heads <= 0 || head_dim <= 0) return 0;
  const int64_t kv = std::max<int64_t>(max_kv_len, 1);
  size_t bytes = 0;
  for (int64_t n = 1; n <= std::min(n_seqs, kSplitSeqBudget); ++n) {
    const int64_t splits = max_splits(n, kv);
    if (splits > 1)
      bytes = std::max(bytes, ws_layout(splits, n, kWorkspaceQ, n_heads, head_dim).bytes);
  }
  return bytes;
}

Status flash_decode(const LaunchCtx& ctx, const VarlenAttentionParams& p) {
  STRATA_RETURN_IF_ERROR(check_varlen("flash_decode", p));
  if (p.n_seqs == 0 || p.max_q_len == 0) return ok_status();
  if (!flash_supported(p)) return varlen_attention_generic(ctx, p);
  if (p.cache.head_dim == 64) return launch<64>(ctx, p);
  return launch<128>(ctx, p);
}

}  // namespace strata::cuda
