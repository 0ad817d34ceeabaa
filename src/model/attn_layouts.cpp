// Batch-sharded attention for multi-query / grouped-query models (seed 003, "Efficiently Scaling
// Transformer Inference", Sec. 3.3), as a block of the layer program. N = the tensor-parallel
// size, n = the step's tokens, H / KV = the model's query / KV heads, hq = H / N and hkv = the
// KV heads of this rank's projection (KV / N, or 1 replicated when KV < N), D = head_dim.
//
// Head-sharded (1D) attention replicates the KV cache when KV < N: every rank holding a copy of
// KV head g stores it for every sequence. Here a sequence's KV cache lives on one rank only, its
// owner (ParallelConfig::attn_owner of its KV blocks: block b is rank b % N's, and the block
// accounting gives a sequence blocks of one rank only, memory/block_manager.h), with all KV
// heads, and
//   qkv   = h Wqkv[heads_r]^T (+ b)              as 1D: [n, (hq + 2 hkv) D], head-sharded
//   recv  = all_to_all_v(qkv rows by owner)      [N n_r, (hq + 2 hkv) D]: rank s's head shard
//                                                of my n_r tokens (block s)
//   full  = the blocks' columns side by side     [n_r, (H + 2 KV) D] (each KV head from the
//                                                first rank holding it)
//   q, cache <- rope(full)                       my sequences' K/V into my cache
//   o     = attention(q, cache)                  [n_r, H D]: every head of my sequences
//   attn  = all_to_all_v(o's head shards)        [n, hq D]: my heads of every token, put back
//                                                in the step's token order
// and o_proj (1D, or the FFN layout's) continues from ws.attn as with head-sharded attention.
// Elements rank r sends per layer, n_r = its tokens: (n - n_r) (hq + 2 hkv) D in the first
// all-to-all and (N - 1) n_r hq D in the second (both ~ (N - 1) / N of n rows when the sequences
// are spread evenly), on top of o_proj's and the FFN's all-reduces, which stay as they were.
//
// The KV pool (memory/kv_pool.h, n_owners = N) holds every KV head per block but only the rank's
// own blocks, block b at local index b / N: n_blocks / N blocks per rank. For the same memory
// per rank the engine's pool therefore has N hkv / KV times the blocks of head-sharded
// attention (2x with 2 KV heads over 4 ranks), and the scheduler counts free blocks per rank
// (serving/scheduler.h).
//
// Prefill takes the same path (the seed keeps it head-sharded; one path is simpler, and the KV
// it writes must land on the owner anyway). The dense Llama family, on the CPU reference (f32
// activations) and the device layout (bf16 activations: the CUDA kernels or their CPU twins; the
// projections stay f32 as ws.qkv is, the workspace gives the dtypes). The plan is host data
// (step arrays read on the host, counts that vary per step): on a GPU the runner uploads its
// step arrays every step and runs the layout eagerly, without CUDA graphs, and for in-process
// ranks on one GPU the all-to-alls are device-to-device copies between the ranks' buffers
// (blocks::group_all_to_all_v: the one-shot kernels have no variable splits). NCCL / mpirun ranks
// are refused
// (runtime/executor.cpp).
#include <algorithm>

#include "core/status.h"
#include "model/program.h"
#include "parallel/comm.h"

namespace strata {

Status plan_batch_sharded_attention(const ops::StepArgs& st, const ParallelConfig& par,
                                    std::span<const int> owner, int64_t block_size, int32_t scratch,
                                    AttnBatchPlan* p) {
  const int N = par.tp_size, me = par.tp_rank;
  const int64_t mb = st.max_blocks_per_seq;
  if (st.n_seqs > 0 && (mb < 1 || st.block_tables == nullptr || st.cu_q == nullptr)) {
    return Status(StatusCode::kInvalidArgument, "batch-sharded attention: a step without blocks");
  }
  if (static_cast<int64_t>(owner.size()) != st.n_seqs) {
    return Status(StatusCode::kInvalidArgument, "batch-sharded attention: one owner per run");
  }
  p->rows_of_rank.assign(static_cast<size_t>(N), 0);
  p->runs.clear();
  p->tokens.clear();
  p->token_seq.clear();
  p->token_pos.clear();
  p->kv_len.clear();
  p->block_tables.clear();
  p->cu_q.assign(1, 0);
  for (int64_t s = 0; s < st.n_seqs; ++s) {
    const int o = owner[static_cast<size_t>(s)];
    if (o < 0 || o >= N)
      return errorf(StatusCode::kInternal, "batch-sharded attention: owner {}", o);
    p->rows_of_rank[static_cast<size_t>(o)] += st.cu_q[s + 1] - st.cu_q[s];
  }
  for (int d = 0; d < N; ++d) {
    for (int64_t s = 0; s < st.n_seqs; ++s) {
      if (owner[static_cast<size_t>(s)] != d) continue;
      const int32_t t0 = st.cu_q[s], t1 = st.cu_q[s + 1];
      p->runs.emplace_back(t0, t1 - t0);
      if (d != me) continue;
      const auto local = static_cast<int32_t>(p->kv_len.size());
      for (int32_t t = t0; t < t1; ++t) {
        p->tokens.push_back(st.tokens != nullptr ? st.tokens[t] : 0);
        p->token_seq.push_back(local);
        p->token_pos.push_back(st.token_pos[t]);
      }
      p->cu_q.push_back(p->cu_q.back() + (t1 - t0));
      p->kv_len.push_back(st.kv_len[s]);
      // The rank's local block indices (block b at b / N).
      for (int64_t k = 0; k < mb; ++k) {
        const int32_t b = st.block_tables[s * mb + k];
        if (k * block_size >= st.kv_len[s]) {
          p->block_tables.push_back(scratch);
          continue;
        }
        if (b < 0 || par.attn_owner(b) != me) {
          return errorf(StatusCode::kInternal,
                        "batch-sharded attention: block {} of a sequence of rank {} is not "
                        "rank {}'s",
                        b, me, me);
        }
        p->block_tables.push_back(b / N);
      }
    }
  }
  p->mine_from_each.assign(static_cast<size_t>(N), p->rows_of_rank[static_cast<size_t>(me)]);
  ops::StepArgs& l = p->step;
  l = st;
  l.n_tokens = p->rows_of_rank[static_cast<size_t>(me)];
  l.n_seqs = static_cast<int64_t>(p->kv_len.size());
  l.tokens = p->tokens.data();
  l.token_seq = p->token_seq.data();
  l.token_pos = p->token_pos.data();
  l.cu_q = p->cu_q.data();
  l.kv_len = p->kv_len.data();
  l.block_tables = p->block_tables.data();
  return ok_status();
}

namespace blocks {

Status batch_sharded_attention(const Model& m, ForwardArgs& a, int64_t layer, bool sliding) {
  const AttnBatchPlan* plan = a.attn_batch;
  if (plan == nullptr) {
    return Status(StatusCode::kFailedPrecondition, "batch-sharded attention without its plan");
  }
  const ModelConfig& c = m.config();
  const LayerWeights& L = m.weights().layers[static_cast<size_t>(layer)];
  const int64_t n = a.step.n_tokens, D = c.head_dim;
  const int N = a.comm.size(), me = a.comm.rank();
  const int64_t H = c.n_heads, KV = c.n_heads_kv;
  const int64_t hq = m.n_heads_local(), hkv = m.n_heads_kv_local();
  const int64_t mine = plan->rows_of_rank[static_cast<size_t>(me)];
  ops::section(a.ctx, "qkv");
  Tensor qkv = rows(a.ws.qkv, n);
  STRATA_RETURN_IF_ERROR(ops::linear(a.ctx, rows(a.ws.h, n), L.qkv, qkv));

  ops::section(a.ctx, "all_to_all_qkv");
  int64_t o = 0;
  for (const auto& [first, count] : plan->runs) {
    Tensor dst = a.ws.bsa_send.slice_rows(o, o + count);
    STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, qkv.slice_rows(first, first + count), dst));
    o += count;
  }
  STRATA_RETURN_IF_ERROR(group_all_to_all_v(a.ctx, a.comm, a.ws.bsa_send, plan->rows_of_rank.data(),
                                            a.ws.bsa_recv, plan->mine_from_each.data()));
  Tensor attn =
      Tensor::make(a.ws.bsa_attn.data, a.ws.bsa_attn.dtype, {mine, H * D}, a.ws.bsa_attn.device);
  if (mine > 0) {
    // My tokens with every head: q of rank s at heads [s hq, (s + 1) hq), KV head g from the
    // first rank whose projection holds it.
    Tensor full = Tensor::make(a.ws.bsa_qkv.data, a.ws.bsa_qkv.dtype, {mine, (H + 2 * KV) * D},
                               a.ws.bsa_qkv.device);
    auto block = [&](int s) { return a.ws.bsa_recv.slice_rows(s * mine, (s + 1) * mine); };
    for (int s = 0; s < N; ++s) {
      Tensor dst = full.slice_cols(s * hq * D, (s + 1) * hq * D);
      STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, block(s).slice_cols(0, hq * D), dst));
    }
    for (int64_t g = 0; g < KV; ++g) {
      const int s = KV >= N ? static_cast<int>(g / hkv) : static_cast<int>(g * (N / KV));
      const int64_t local = KV >= N ? g % hkv : 0;
      for (int64_t part = 0; part < 2; ++part) {  // K, then V
        const int64_t src0 = (hq + part * hkv + local) * D;
        const int64_t dst0 = (H + part * KV + g) * D;
        Tensor dst = full.slice_cols(dst0, dst0 + D);
        STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, block(s).slice_cols(src0, src0 + D), dst));
      }
    }
    ops::section(a.ctx, "rope_kv");
    Tensor q = Tensor::make(a.ws.bsa_q.data, a.ws.bsa_q.dtype, {mine, H, D}, a.ws.bsa_q.device);
    ops::KvLayer& cache = a.kv[static_cast<size_t>(layer)];
    STRATA_RETURN_IF_ERROR(
        ops::rope_kv_append(a.ctx, full, plan->step, rope_args(m, layer, sliding), cache, q));
    ops::section(a.ctx, "attention");
    STRATA_RETURN_IF_ERROR(
        ops::attention(a.ctx, q, plan->step, cache, attention_args(m, a, sliding), attn));
  }

  ops::section(a.ctx, "all_to_all_out");
  for (int s = 0; s < N && mine > 0; ++s) {
    Tensor dst = a.ws.bsa_out_send.slice_rows(s * mine, (s + 1) * mine);
    STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, attn.slice_cols(s * hq * D, (s + 1) * hq * D), dst));
  }
  STRATA_RETURN_IF_ERROR(group_all_to_all_v(a.ctx, a.comm, a.ws.bsa_out_send,
                                            plan->mine_from_each.data(), a.ws.bsa_out_recv,
                                            plan->rows_of_rank.data()));
  Tensor out = rows(a.ws.attn, n);
  o = 0;
  for (const auto& [first, count] : plan->runs) {
    Tensor dst = out.slice_rows(first, first + count);
    STRATA_RETURN_IF_ERROR(ops::copy(a.ctx, a.ws.bsa_out_recv.slice_rows(o, o + count), dst));
    o += count;
  }
  return ok_status();
}

}  // namespace blocks
}  // namespace strata
