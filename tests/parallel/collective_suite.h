// One collective test suite for every host-memory communicator: run by each rank of the MPI
// binary (tests/parallel, under mpirun) and by each thread of the in-process communicator
// (tests/unit/test_inproc_comm.cpp). Every rank derives the same data from (rank, seed), so each
// can compute the expected result of every collective by itself, and results must be exact
// (sums in rank order: bit-identical on every rank, equal to reduce_sum_host).
#pragma once

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "core/half.h"
#include "parallel/comm.h"

namespace strata::testing {

inline float value_of(int rank, int64_t i) {
  // Distinct, non-zero, with some that do not add exactly in f32.
  return static_cast<float>((rank + 1) * 0.37 + static_cast<double>(i % 97) * 1.0e-3 - 0.05);
}

inline std::string fail(const std::string& what, int rank) {
  return "rank " + std::to_string(rank) + ": " + what;
}

// Returns an empty string on success, else the first failure.
inline std::string run_collective_suite(Communicator& c) {
  const int me = c.rank(), n = c.size();
  const CommStream host = CommStream::host();
  // all_reduce f32 / bf16 / i32, against reduce_sum_host over the same inputs.
  for (int64_t count : {int64_t{1}, int64_t{7}, int64_t{1000}}) {
    std::vector<std::vector<float>> all(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) all[static_cast<size_t>(r)].push_back(value_of(r, i));
    }
    std::vector<const void*> ins;
    for (auto& v : all) ins.push_back(v.data());
    std::vector<float> want(static_cast<size_t>(count));
    if (!reduce_sum_host(ins.data(), n, count, DType::kF32, want.data()).ok()) return "reduce";
    std::vector<float> got = all[static_cast<size_t>(me)];
    if (!c.all_reduce(got.data(), count, DType::kF32, host).ok()) return fail("all_reduce f32", me);
    if (std::memcmp(got.data(), want.data(), got.size() * 4) != 0)
      return fail("all_reduce f32 sum", me);

    std::vector<std::vector<uint16_t>> all16(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (float v : all[static_cast<size_t>(r)])
        all16[static_cast<size_t>(r)].push_back(f32_to_bf16(v));
    }
    ins.clear();
    for (auto& v : all16) ins.push_back(v.data());
    std::vector<uint16_t> want16(static_cast<size_t>(count));
    if (!reduce_sum_host(ins.data(), n, count, DType::kBF16, want16.data()).ok()) return "reduce";
    std::vector<uint16_t> got16 = all16[static_cast<size_t>(me)];
    if (!c.all_reduce(got16.data(), count, DType::kBF16, host).ok())
      return fail("all_reduce bf16", me);
    if (got16 != want16) return fail("all_reduce bf16 sum", me);

    std::vector<int32_t> gi(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
      gi[static_cast<size_t>(i)] = static_cast<int32_t>(me * 1000 + i);
    if (!c.all_reduce(gi.data(), count, DType::kI32, host).ok()) return fail("all_reduce i32", me);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t w = 1000LL * n * (n - 1) / 2 + i * n;
      if (gi[static_cast<size_t>(i)] != w) return fail("all_reduce i32 sum", me);
    }
  }
  // all_gather: recv[r * count + i] = value_of(r, i).
  {
    const int64_t count = 13;
    std::vector<float> send(static_cast<size_t>(count)),
        recv(static_cast<size_t>(count * n), -1.0f);
    for (int64_t i = 0; i < count; ++i) send[static_cast<size_t>(i)] = value_of(me, i);
    if (!c.all_gather(send.data(), count, DType::kF32, recv.data(), host).ok())
      return fail("all_gather", me);
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        if (recv[static_cast<size_t>(r * count + i)] != value_of(r, i))
          return fail("all_gather data", me);
      }
    }
  }
  // reduce_scatter: chunk `me` of the sum.
  {
    const int64_t count = 5;
    std::vector<float> send(static_cast<size_t>(count * n)), recv(static_cast<size_t>(count));
    for (int64_t i = 0; i < count * n; ++i) send[static_cast<size_t>(i)] = value_of(me, i);
    if (!c.reduce_scatter(send.data(), count, DType::kF32, recv.data(), host).ok()) {
      return fail("reduce_scatter", me);
    }
    for (int64_t i = 0; i < count; ++i) {
      float s = value_of(0, me * count + i);
      for (int r = 1; r < n; ++r) s += value_of(r, me * count + i);
      if (recv[static_cast<size_t>(i)] != s) return fail("reduce_scatter data", me);
    }
  }
  // all_to_all: chunk r of my send -> rank r; recv chunk r = chunk me of rank r's send.
  {
    const int64_t count = 3;
    std::vector<int32_t> send(static_cast<size_t>(count * n)), recv(static_cast<size_t>(count * n));
    for (int64_t i = 0; i < count * n; ++i)
      send[static_cast<size_t>(i)] = static_cast<int32_t>(me * 100 + i);
    if (!c.all_to_all(send.data(), count, DType::kI32, recv.data(), host).ok())
      return fail("all_to_all", me);
    for (int r = 0; r < n; ++r) {
      for (int64_t i = 0; i < count; ++i) {
        if (recv[static_cast<size_t>(r * count + i)] != r * 100 + me * count + i) {
          return fail("all_to_all data", me);
        }
      }
    }
  }
  // all_to_all_rows: rank s sends the first (s + 2 r) % 4 of its 3 rows (2 i32 each) for rank
  // r (0 to the whole capacity); the counted rows arrive (rows past them are unspecified: the
  // default implementation moves whole blocks).
  {
    constexpr int64_t C = 3, cols = 2;
    auto rows = [](int s, int r) { return static_cast<int32_t>((s + 2 * r) % 4); };
    std::vector<int32_t> send(static_cast<size_t>(n * C * cols)), recv(send.size(), -1);
    std::vector<int32_t> sr(static_cast<size_t>(n)), rr(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      sr[static_cast<size_t>(r)] = rows(me, r);
      rr[static_cast<size_t>(r)] = rows(r, me);
    }
    for (int64_t i = 0; i < n * C * cols; ++i)
      send[static_cast<size_t>(i)] = static_cast<int32_t>(me * 1000 + i);
    if (!c.all_to_all_rows(send.data(), C, cols, DType::kI32, recv.data(), sr.data(), rr.data(),
                           host)
             .ok()) {
      return fail("all_to_all_rows", me);
    }
    for (int s = 0; s < n; ++s) {
      for (int64_t i = 0; i < rows(s, me) * cols; ++i) {
        if (recv[static_cast<size_t>(s * C * cols + i)] != s * 1000 + me * C * cols + i) {
          return fail("all_to_all_rows data", me);
        }
      }
    }
  }
  // all_to_all_v with uneven and empty splits: rank s sends (s + r) % 3 elements to rank r
  // (zero for some pairs), values s * 1000 + r * 10 + j.
  {
    auto n_of = [](int s, int r) { return static_cast<int64_t>((s + r) % 3); };
    std::vector<int64_t> sc(static_cast<size_t>(n)), so(sc.size()), rc(sc.size()), ro(sc.size());
    std::vector<int32_t> send, recv;
    for (int r = 0; r < n; ++r) {
      so[static_cast<size_t>(r)] = static_cast<int64_t>(send.size());
      sc[static_cast<size_t>(r)] = n_of(me, r);
      for (int64_t j = 0; j < n_of(me, r); ++j)
        send.push_back(me * 1000 + r * 10 + static_cast<int32_t>(j));
    }
    int64_t total = 0;
    for (int s = 0; s < n; ++s) {
      ro[static_cast<size_t>(s)] = total;
      rc[static_cast<size_t>(s)] = n_of(s, me);
      total += n_of(s, me);
    }
    recv.assign(static_cast<size_t>(total), -1);
    if (send.empty()) send.push_back(0);
    if (recv.empty()) recv.push_back(0);
    if (!c.all_to_all_v(send.data(), sc.data(), so.data(), recv.data(), rc.data(), ro.data(),
                        DType::kI32, host)
             .ok()) {
      return fail("all_to_all_v", me);
    }
    for (int s = 0; s < n; ++s) {
      for (int64_t j = 0; j < n_of(s, me); ++j) {
        if (recv[static_cast<size_t>(ro[static_cast<size_t>(s)] + j)] != s * 1000 + me * 10 + j) {
          return fail("all_to_all_v data", me);
        }
      }
    }
  }
  // broadcast from the last rank.
  {
    std::vector<int32_t> v(4, me);
    if (!c.broadcast(v.data(), 4, DType::kI32, n - 1, host).ok()) return fail("broadcast", me);
    for (int32_t x : v) {
      if (x != n - 1) return fail("broadcast data", me);
    }
  }
  // send / recv around a ring.
  if (n > 1) {
    const int next = (me + 1) % n, prev = (me + n - 1) % n;
    std::vector<float> out(9, static_cast<float>(me)), in(9, -1.0f);
    // Even ranks send first, odd ranks receive first (blocking implementations).
    if (me % 2 == 0) {
      if (!c.send(out.data(), 9, DType::kF32, next, host).ok()) return fail("send", me);
      if (!c.recv(in.data(), 9, DType::kF32, prev, host).ok()) return fail("recv", me);
    } else {
      if (!c.recv(in.data(), 9, DType::kF32, prev, host).ok()) return fail("recv", me);
      if (!c.send(out.data(), 9, DType::kF32, next, host).ok()) return fail("send", me);
    }
    for (float x : in) {
      if (x != static_cast<float>(prev)) return fail("recv data", me);
    }
  }
  // split into even / odd ranks, ordered by descending rank; a reduction inside each group.
  {
    auto sub = c.split(me % 2, -me);
    if (!sub.ok()) return fail("split", me);
    int members = 0, my_pos = 0;
    for (int r = n - 1; r >= 0; --r) {
      if (r % 2 == me % 2) {
        if (r == me) my_pos = members;
        ++members;
      }
    }
    if ((*sub)->size() != members || (*sub)->rank() != my_pos) return fail("split shape", me);
    int32_t v = me;
    if (!(*sub)->all_reduce(&v, 1, DType::kI32, host).ok()) return fail("sub all_reduce", me);
    int32_t want = 0;
    for (int r = 0; r < n; ++r) want += r % 2 == me % 2 ? r : 0;
    if (v != want) return fail("sub all_reduce data", me);
  }
  if (!c.barrier().ok()) return fail("barrier", me);
  return "";
}

}  // namespace strata::testing
