// Shared by the fixed-capacity expert-parallel exchange tests (tests/model on the CPU twin,
// tests/cuda on one GPU): one exchange round trip over an expert-parallel group with a chosen
// routing, checked against what the variable-split path would group and return.
//
// Every rank r of ep ranks has a chunk of tokens[r] tokens (0 allowed) routed to k distinct
// experts of E = ep El; its rows are grouped by expert with ops::moe_offsets / moe_permute, sent
// through ep_dispatch, and the receiving rank checks its grouped rows and offsets against the
// expected grouping (local expert, then source rank, then the source's order). The "experts"
// then write y = 2 x + (rank + 1) (f32), ep_combine sends them back, and each sender checks that
// its rows came back in its permuted order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "model/moe_ep.h"
#include "ops/ops.h"
#include "parallel/comm.h"

namespace strata::testing {

struct EpRouting {
  int ep = 2;
  int64_t experts_per_rank = 4, k = 2, hidden = 24, per = 4;  // per: the chunk size bound
  std::vector<int64_t> tokens;            // [ep]: tokens of each rank's chunk (<= per)
  std::vector<std::vector<int32_t>> ids;  // [ep][tokens k]: the chunk's experts
  int64_t capacity() const { return per * std::min(k, experts_per_rank); }
};

// kind: "uneven" (random experts), "full" (every row to rank 0's experts: the capacity exactly
// reached when El >= k), "empty" (the last rank has no tokens, no row goes to rank 1), "skewed"
// (rank 0 has no tokens and every row goes to the last rank's experts: every other rank
// receives nothing).
inline EpRouting make_routing(int ep, const std::string& kind, uint32_t seed) {
  EpRouting r;
  r.ep = ep;
  r.tokens.assign(static_cast<size_t>(ep), r.per);
  if (kind == "uneven") {
    for (int s = 0; s < ep; ++s) r.tokens[static_cast<size_t>(s)] = 1 + (s * 3 + seed) % r.per;
  }
  if (kind == "empty") r.tokens[static_cast<size_t>(ep - 1)] = 0;
  if (kind == "skewed") r.tokens[0] = 0;
  const int64_t E = ep * r.experts_per_rank;
  std::mt19937 rng(seed);
  for (int s = 0; s < ep; ++s) {
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < r.tokens[static_cast<size_t>(s)]; ++t) {
      std::vector<int32_t> pool;
      for (int32_t e = 0; e < E; ++e) {
        const int32_t owner = e / static_cast<int32_t>(r.experts_per_rank);
        if (kind == "full" && owner != 0) continue;
        if (kind == "empty" && owner == 1) continue;
        if (kind == "skewed" && owner != ep - 1) continue;
        pool.push_back(e);
      }
      std::shuffle(pool.begin(), pool.end(), rng);
      for (int64_t j = 0; j < r.k; ++j) ids.push_back(pool[static_cast<size_t>(j)]);
    }
    r.ids.push_back(std::move(ids));
  }
  return r;
}

// x[t, i] of rank s: exact in bf16 (at most 8 significant bits).
inline float ep_x(int s, int64_t t, int64_t i) {
  return static_cast<float>(s * 16 + t) + 0.25f * static_cast<float>(i % 4);
}

// The round trip on rank `me` of `group`, its buffers allocated with `alloc(bytes)` on ctx's
// device and copied with ops::upload / download. act: f32 or bf16. counted: EpExchange::counted
// (only the routed rows move) or whole blocks. "" on success.
inline std::string ep_round_trip(ops::Context& ctx, Communicator& group, const EpRouting& R,
                                 DType act, const std::function<void*(int64_t)>& alloc,
                                 bool counted = true) {
  const int me = group.rank(), ep = R.ep;
  const int64_t El = R.experts_per_rank, E = ep * El, k = R.k, H = R.hidden, C = R.capacity();
  const int64_t mc = R.tokens[static_cast<size_t>(me)], rows = mc * k;
  const Device dev = ctx.device;
  auto tensor = [&](DType dt, int64_t r, int64_t c) {
    return Tensor::make(alloc(dtype_bytes(dt, std::max<int64_t>(r, 1) * c)), dt, {r, c}, dev);
  };
  auto fail = [&](const std::string& what) { return "rank " + std::to_string(me) + ": " + what; };
  // The chunk, grouped by expert.
  std::vector<float> xf(static_cast<size_t>(std::max<int64_t>(mc, 1) * H));
  for (int64_t t = 0; t < mc; ++t) {
    for (int64_t i = 0; i < H; ++i) xf[static_cast<size_t>(t * H + i)] = ep_x(me, t, i);
  }
  std::vector<uint16_t> xb(xf.size());
  for (size_t i = 0; i < xf.size(); ++i) xb[i] = f32_to_bf16(xf[i]);
  Tensor x = tensor(act, mc, H), ids = tensor(DType::kI32, mc, k);
  Tensor offsets = tensor(DType::kI32, 1, E + 1), x_perm = tensor(act, rows, H);
  Tensor perm = tensor(DType::kI32, 1, std::max<int64_t>(rows, 1));
  EpExchange ex;
  ex.ep = ep;
  ex.experts_per_rank = El;
  ex.capacity = C;
  ex.counted = counted;
  ex.send_x = tensor(act, ep * C, H);
  ex.recv_x = tensor(act, ep * C, H);
  ex.offsets = tensor(DType::kI32, 1, El + 1);
  ex.y = tensor(DType::kF32, ep * C, H);
  ex.recv_y = tensor(DType::kF32, ep * C, H);
  const int64_t n_index = ep_index_entries(ep, El, C, R.per * k);
  carve_ep_index(ex, static_cast<int32_t*>(alloc(n_index * 4)), R.per * k, dev);
  Tensor y_perm = tensor(DType::kF32, rows, H);
  // Every buffer exists before the first collective (on one GPU, a rank in cudaMalloc can wait
  // for a peer's one-shot kernel, which waits for this rank).
  Status st = group.barrier();
  if (st.ok() && mc > 0) {
    st = ops::upload(ctx, act == DType::kF32 ? static_cast<const void*>(xf.data()) : xb.data(), x);
    if (st.ok()) st = ops::upload(ctx, R.ids[static_cast<size_t>(me)].data(), ids);
    if (st.ok()) st = ops::moe_offsets(ctx, ids, E, offsets);
    Tensor pv = Tensor::make(perm.data, DType::kI32, {1, rows}, dev);
    if (st.ok()) st = ops::moe_permute(ctx, x, ids, offsets, x_perm, pv);
    if (st.ok()) st = ops::synchronize(ctx);
  }
  if (st.ok()) st = group.barrier();  // every rank's chunk is ready
  if (!st.ok()) return fail(st.to_string());
  st = ep_dispatch(ctx, group, x_perm, offsets, ex);
  if (st.ok()) st = ops::synchronize(ctx);
  if (!st.ok()) return fail("dispatch: " + st.to_string());
  // Expected grouping: for each local expert, each source in rank order, its rows (token order).
  std::vector<int32_t> want_off(1, 0);
  std::vector<float> want_rows;
  for (int64_t e = 0; e < El; ++e) {
    int64_t n = 0;
    for (int s = 0; s < ep; ++s) {
      const std::vector<int32_t>& sid = R.ids[static_cast<size_t>(s)];
      for (size_t slot = 0; slot < sid.size(); ++slot) {
        if (sid[slot] != me * El + e) continue;
        const int64_t t = static_cast<int64_t>(slot) / k;
        for (int64_t i = 0; i < H; ++i) want_rows.push_back(ep_x(s, t, i));
        ++n;
      }
    }
    want_off.push_back(static_cast<int32_t>(want_off.back() + n));
  }
  std::vector<int32_t> got_off(static_cast<size_t>(El + 1));
  st = ops::download(ctx, ex.offsets, got_off.data());
  const int64_t total = want_off.back();
  std::vector<uint8_t> grouped(static_cast<size_t>(dtype_bytes(act, ep * C * H)));
  if (st.ok()) st = ops::download(ctx, ex.grouped(), grouped.data());
  if (st.ok()) st = ops::synchronize(ctx);
  if (!st.ok()) return fail(st.to_string());
  if (got_off != want_off) return fail("offsets of the grouped rows differ");
  auto value = [&](int64_t idx) {
    if (act == DType::kF32) {
      float f;
      std::memcpy(&f, grouped.data() + 4 * idx, 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, grouped.data() + 2 * idx, 2);
    return bf16_to_f32(b);
  };
  for (int64_t g = 0; g < total * H; ++g) {
    if (value(g) != want_rows[static_cast<size_t>(g)]) {
      return fail("grouped row " + std::to_string(g / H) + " differs");
    }
  }
  for (int64_t g = total * H; g < ep * C * H; ++g) {
    if (value(g) != 0.0f) return fail("a padding row of the grouped rows is not zero");
  }
  // The experts: y = 2 x + (me + 1) on the grouped rows.
  std::vector<float> y(static_cast<size_t>(ep * C * H), -9.0f);
  for (int64_t g = 0; g < total * H; ++g) {
    y[static_cast<size_t>(g)] = 2.0f * value(g) + static_cast<float>(me + 1);
  }
  st = ops::upload(ctx, y.data(), ex.y);
  if (st.ok()) st = ops::synchronize(ctx);
  if (st.ok()) st = group.barrier();
  if (st.ok()) st = ep_combine(ctx, group, ex, y_perm);
  if (st.ok()) st = ops::synchronize(ctx);
  if (!st.ok()) return fail("combine: " + st.to_string());
  if (rows == 0) return "";
  std::vector<float> back(static_cast<size_t>(rows * H));
  std::vector<int32_t> pm(static_cast<size_t>(rows));
  st = ops::download(ctx, y_perm, back.data());
  Tensor pv = Tensor::make(perm.data, DType::kI32, {1, rows}, dev);
  if (st.ok()) st = ops::download(ctx, pv, pm.data());
  if (st.ok()) st = ops::synchronize(ctx);
  if (!st.ok()) return fail(st.to_string());
  const std::vector<int32_t>& mid = R.ids[static_cast<size_t>(me)];
  for (int64_t slot = 0; slot < rows; ++slot) {
    const int64_t t = slot / k, r = pm[static_cast<size_t>(slot)];
    const int owner = mid[static_cast<size_t>(slot)] / static_cast<int>(El);
    for (int64_t i = 0; i < H; ++i) {
      const float want = 2.0f * ep_x(me, t, i) + static_cast<float>(owner + 1);
      if (back[static_cast<size_t>(r * H + i)] != want) {
        return fail("the output of slot " + std::to_string(slot) + " came back wrong");
      }
    }
  }
  return "";
}

}  // namespace strata::testing
