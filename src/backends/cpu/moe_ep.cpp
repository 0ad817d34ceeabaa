// The fixed-capacity expert-parallel exchange's index plans and row gather on the CPU (the
// semantics: backends/moe_params.h, MoeEpSendPlanParams / MoeEpRecvPlanParams / GatherRowsParams);
// the twins of backends/cuda/kernels/moe_ep.cu.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "core/status.h"

namespace strata::cpu {

Status moe_ep_send_plan(const MoeEpSendPlanParams& p) {
  const int64_t ep = p.ep, El = p.experts_per_rank, C = p.capacity;
  if (ep < 1 || El < 1 || C < 0 || p.n_rows < 0) {
    return Status(StatusCode::kInvalidArgument, "moe_ep_send_plan: bad sizes");
  }
  Status st = ok_status();
  for (int64_t d = 0; d < ep; ++d) {
    const int64_t first = p.offsets != nullptr ? p.offsets[d * El] : 0;
    const int64_t rows = p.offsets != nullptr ? p.offsets[(d + 1) * El] - first : 0;
    if (rows > C && st.ok()) {
      st = errorf(StatusCode::kOutOfRange,
                  "moe_ep_send_plan: {} rows for rank {} exceed the capacity of {}", rows, d, C);
    }
    if (p.rows != nullptr) p.rows[d] = static_cast<int32_t>(std::min(rows, C));
    for (int64_t e = 0; e < El; ++e) {
      p.counts[d * El + e] =
          p.offsets != nullptr ? p.offsets[d * El + e + 1] - p.offsets[d * El + e] : 0;
    }
    for (int64_t i = 0; i < C; ++i) {
      p.send_map[d * C + i] = i < rows ? static_cast<int32_t>(first + i) : -1;
    }
    for (int64_t i = 0; i < rows && first + i < p.n_rows; ++i) {
      p.back_map[first + i] = i < C ? static_cast<int32_t>(d * C + i) : -1;
    }
  }
  return st;
}

Status moe_ep_recv_plan(const MoeEpRecvPlanParams& p) {
  const int64_t ep = p.ep, El = p.experts_per_rank, C = p.capacity;
  if (ep < 1 || El < 1 || C < 0) {
    return Status(StatusCode::kInvalidArgument, "moe_ep_recv_plan: bad sizes");
  }
  Status st = ok_status();
  // Each source's counts, cut to its capacity.
  std::vector<int32_t> cnt(static_cast<size_t>(ep * El));
  for (int64_t s = 0; s < ep; ++s) {
    int64_t left = C;
    for (int64_t e = 0; e < El; ++e) {
      int64_t c = p.counts[s * El + e];
      if (c < 0 || c > left) {
        if (st.ok()) {
          st = errorf(StatusCode::kOutOfRange,
                      "moe_ep_recv_plan: rank {} sends {} rows for expert {} (capacity {})", s, c,
                      e, C);
        }
        c = c < 0 ? 0 : left;
      }
      cnt[static_cast<size_t>(s * El + e)] = static_cast<int32_t>(c);
      left -= c;
    }
    if (p.rows != nullptr) p.rows[s] = static_cast<int32_t>(C - left);
  }
  p.offsets[0] = 0;
  for (int64_t e = 0; e < El; ++e) {
    int64_t total = 0;
    for (int64_t s = 0; s < ep; ++s) total += cnt[static_cast<size_t>(s * El + e)];
    p.offsets[e + 1] = static_cast<int32_t>(p.offsets[e] + total);
  }
  for (int64_t i = 0; i < ep * C; ++i) {
    p.group_map[i] = -1;
    p.ungroup_map[i] = -1;
  }
  for (int64_t e = 0; e < El; ++e) {
    int64_t g = p.offsets[e];
    for (int64_t s = 0; s < ep; ++s) {
      int64_t row = 0;  // source s's rows before expert e
      for (int64_t e2 = 0; e2 < e; ++e2) row += cnt[static_cast<size_t>(s * El + e2)];
      for (int64_t j = 0; j < cnt[static_cast<size_t>(s * El + e)]; ++j, ++g) {
        p.group_map[g] = static_cast<int32_t>(s * C + row + j);
        p.ungroup_map[s * C + row + j] = static_cast<int32_t>(g);
      }
    }
  }
  return st;
}

Status gather_rows(const GatherRowsParams& p) {
  if (p.n_rows < 0 || p.row_bytes < 0 || p.src_rows < 0) {
    return Status(StatusCode::kInvalidArgument, "gather_rows: bad sizes");
  }
  const auto bytes = static_cast<size_t>(p.row_bytes);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < p.n_rows; ++i) {
    char* d = static_cast<char*>(p.dst) + i * p.row_bytes;
    const int64_t r = p.map[i];
    if (r >= 0 && r < p.src_rows) {
      std::memcpy(d, static_cast<const char*>(p.src) + r * p.row_bytes, bytes);
    } else if (p.zero_unmapped) {
      std::memset(d, 0, bytes);
    }
  }
  return ok_status();
}

}  // namespace strata::cpu
