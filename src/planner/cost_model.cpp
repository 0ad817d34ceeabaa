// The per-layer, per-device cost model (seed 003, Sections 2-3 and Appendix A; seed 000 for the
// pipeline, expert-parallel and ZeRO-Inference terms). Conventions:
//   T      tokens one tensor-parallel group processes in a step (sequences x new tokens)
//   n      chips in the tensor-parallel group; E hidden, F ffn width, a = 2 bytes (bf16)
//   F_in   width of the in-projection output (gated FFN: 2F; + Q/K/V when the block is parallel)
//   F_out  width of the out-projection input (F; + the attention output when parallel)
// A collective over g chips of a D-byte array (all-gather output / reduce-scatter input) costs
// latency x steps(g) + D (g-1)/g / bandwidth: the ring bound of Appendix A.1 (what a chip must
// receive) plus a per-step latency for each hop of the ring. Per block of the layer:
//   1D weight-stationary:  all-gather T E a and reduce-scatter T E a over n      (2 BLE / bw)
//   2D weight-stationary:  all-gather T E a / X over YZ, reduce-scatter T F_in a / YZ over X,
//                          all-gather T F_out a / YZ over X, reduce-scatter T E a / X over YZ,
//                          with the divisor X of n that minimises it (8 BLE / (sqrt(n) bw) at
//                          F = 4E, X = sqrt(n) / 2)
//   weight-gathered over N chips (X, XY or XYZ of the 3D mesh): each chip gathers N/n of the
//                          layer's weights (overlapped with the previous layer's compute) and
//                          the activations, T / N tokens per chip, are 1D over the other n / N
// Batch-sharded attention (Section 3.3) adds an all-to-all of Q/K/V in and of the output out, and
// reads only its sequences' KV; head-sharded attention reads the KV of its heads, replicating
// K/V when there are fewer KV heads than chips.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/status.h"
#include "planner/planner.h"
#include "runtime/pipeline_schedule.h"

namespace strata::planner {

namespace {

constexpr double kActBytes = 2.0;  // bf16 activations
constexpr double kKvBytes = 2.0;   // bf16 KV cache

double as_d(int64_t v) {
  return static_cast<double>(v);
}

// Seconds and the roofline side a GEMM of `tokens` rows over `weights` elements falls on.
struct Timed {
  double seconds = 0;
  bool memory_bound = false;
};

// The GEMM curves are measured on one Llama-3-8B layer's four GEMMs (plan --calibrate's probe,
// and the shipped H100 curve): q/k/v 6144 x 4096, o 4096 x 4096, gate/up 28672 x 4096, down
// 4096 x 14336.
constexpr double kCurveWeights = 6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336;
constexpr double kCurveGemms = 4;

// Seconds the curve's first point spends per GEMM beyond streaming its weights at the measured
// HBM read rate: the ramp-up and tail of each launch (~8 us on an H100, docs/performance.md),
// which a curve of one shape folds into its rate. Split out, a layer of larger GEMMs (70B:
// twice the 8B's weights per GEMM) is not charged it twice over.
double gemm_fixed_seconds(const HardwareProfile& hw, WeightFormat f,
                          const std::vector<std::pair<double, double>>& pts) {
  if (pts.empty() || hw.hbm_read_Bps <= 0) return 0.0;
  const double t = 2.0 * pts.front().first * kCurveWeights / pts.front().second;
  const double stream = kCurveWeights * weight_format_bytes(f) / hw.hbm_read_Bps;
  return std::max(0.0, (t - stream) / kCurveGemms);
}

double gemm_fixed_seconds(const HardwareProfile& hw, WeightFormat f) {
  auto it = hw.gemm_curve.find(f);
  return it == hw.gemm_curve.end() ? 0.0 : gemm_fixed_seconds(hw, f, it->second);
}

// `gemms`: how many GEMMs the `weights` are (each pays the fixed part of the curve).
Timed gemm_time(const HardwareProfile& hw, WeightFormat f, double tokens, double weights,
                double gemms = 1) {
  Timed t;
  if (tokens <= 0.0 || weights <= 0.0) return t;
  const double flops = 2.0 * tokens * weights;
  auto peak_it = hw.peak_flops.find(f);
  const double peak = peak_it != hw.peak_flops.end() ? peak_it->second : hw.peak_bf16();
  const double ideal_compute = flops / (peak * hw.compute_efficiency);
  const double ideal_memory =
      weights * weight_format_bytes(f) / (hw.hbm_read_Bps * hw.memory_efficiency);
  t.memory_bound = ideal_memory >= ideal_compute;
  auto curve_it = hw.gemm_curve.find(f);
  if (curve_it == hw.gemm_curve.end() || curve_it->second.empty()) {
    t.seconds = std::max(ideal_compute, ideal_memory);
    return t;
  }
  // Measured FLOP/s against tokens: below the first point the GEMM streams the same weights
  // (rate proportional to tokens); past the last point it stays on the last rate.
  const auto& pts = curve_it->second;
  double rate = 0;
  if (tokens <= pts.front().first) {
    rate = pts.front().second * tokens / pts.front().first;
  } else if (tokens >= pts.back().first) {
    rate = pts.back().second;
  } else {
    for (size_t i = 1; i < pts.size(); ++i) {
      if (tokens > pts[i].first) continue;
      const double u =
          std::log(tokens / pts[i - 1].first) / std::log(pts[i].first / pts[i - 1].first);
      rate =
          std::exp(std::log(pts[i - 1].second) + u * std::log(pts[i].second / pts[i - 1].second));
      break;
    }
  }
  // The curve's time for its reference layer at `tokens`, less its GEMMs' fixed parts, scaled
  // to these weights; then these GEMMs' fixed parts.
  const double fixed = gemm_fixed_seconds(hw, f, pts);
  const double ref = 2.0 * tokens * kCurveWeights / rate;
  t.seconds = std::max(0.0, ref - kCurveGemms * fixed) * weights / kCurveWeights + gemms * fixed;
  return t;
}

struct Comm {
  const HardwareProfile& hw;
  int64_t total_devices;

  // Seed 003's Appendix A.1: a collective's time is its bytes over the chip's interconnect
  // bandwidth whatever the group (on a torus, a group along fewer axes uses more links per axis).
  double bandwidth(int64_t) const { return hw.link_Bps; }
  // Latency-bound steps of a ring collective over g chips: g - 1 through a switch; on a 3D torus
  // of side s, (s - 1) per full axis the group spans plus the steps of the partial axis.
  double steps(int64_t g) const {
    if (hw.topology == Topology::kSwitch) return as_d(g - 1);
    const int64_t side = std::max<int64_t>(2, std::llround(std::cbrt(as_d(total_devices))));
    double n = 0;
    int64_t rest = g;
    for (int axis = 0; axis < 3 && rest > 1; ++axis) {
      const int64_t along = std::min(rest, side);
      n += as_d(along - 1);
      rest = (rest + along - 1) / along;
    }
    return n + as_d(std::max<int64_t>(rest - 1, 0));
  }
  // All-gather (D = output bytes) or reduce-scatter (D = input bytes) over g chips.
  double gather(double full_bytes, int64_t g) const {
    if (g <= 1 || full_bytes <= 0.0) return 0.0;
    return hw.collective_latency_s * steps(g) + full_bytes * as_d(g - 1) / as_d(g) / bandwidth(g);
  }
  // All-to-all of the bytes one chip holds.
  double all_to_all(double local_bytes, int64_t g) const { return gather(local_bytes, g); }
};

struct Block {
  double f_in = 0, f_out = 0;
};

// Seconds of a collective of `bytes` (all-reduce: the buffer; all-gather: the output) on a
// measured NCCL curve: linear between points, along the first / last segment outside them.
double on_curve(const std::vector<std::pair<double, double>>& pts, double bytes) {
  if (pts.size() == 1) return pts[0].second;
  size_t i = 1;
  while (i + 1 < pts.size() && pts[i].first < bytes) ++i;
  const auto [b0, t0] = pts[i - 1];
  const auto [b1, t1] = pts[i];
  const double t = t0 + (t1 - t0) * (bytes - b0) / (b1 - b0);
  return std::max(t, std::min(t0, t1) * 0.5);
}

// The engine's NCCL all-reduce / all-gather over g GPUs: the profile's measured curve for g when
// it has one, else the ring model (an all-reduce as a reduce-scatter plus an all-gather).
double nccl_all_reduce(const HardwareProfile& hw, const Comm& comm, double bytes, int64_t g) {
  if (g <= 1 || bytes <= 0.0) return 0.0;
  auto it = hw.nccl_curves.find(g);
  if (it != hw.nccl_curves.end() && !it->second.all_reduce.empty())
    return on_curve(it->second.all_reduce, bytes);
  return 2.0 * comm.gather(bytes, g);
}
double nccl_all_gather(const HardwareProfile& hw, const Comm& comm, double bytes, int64_t g) {
  if (g <= 1 || bytes <= 0.0) return 0.0;
  auto it = hw.nccl_curves.find(g);
  if (it != hw.nccl_curves.end() && !it->second.all_gather.empty())
    return on_curve(it->second.all_gather, bytes);
  return comm.gather(bytes, g);
}

// The balanced 3D factorisation f1 <= f2 <= f3 of n (the X, Y, Z axes of a mesh).
void mesh3(int64_t n, int64_t& f1, int64_t& f2, int64_t& f3) {
  f1 = 1;
  for (int64_t d = 1; d * d * d <= n; ++d)
    if (n % d == 0) f1 = d;
  const int64_t rest = n / f1;
  f2 = 1;
  for (int64_t d = 1; d * d <= rest; ++d)
    if (rest % d == 0) f2 = d;
  f3 = rest / f2;
}

int64_t gather_group(FfnLayout l, int64_t n) {
  int64_t f1, f2, f3;
  mesh3(n, f1, f2, f3);
  switch (l) {
    case FfnLayout::k1DWeightStationary:
      return 1;
    case FfnLayout::k2DWeightStationary:
      return 1;
    case FfnLayout::kWeightGatheredX:
      return f1;
    case FfnLayout::kWeightGatheredXY:
      return f1 * f2;
    case FfnLayout::kWeightGatheredXYZ:
      return n;
  }
  return 1;
}

// The experts' GEMMs of one MoE layer on one device: `touched` experts of `weights` elements
// each, `per_expert` tokens each. The engine runs a layer's experts as two grouped GEMMs
// (gate/up, down): two fixed parts per layer, not per expert.
struct ExpertTime {
  double memory = 0, compute = 0;
};
ExpertTime expert_gemm_seconds(const HardwareProfile& hw, WeightFormat f, double touched,
                               double per_expert, double weights) {
  ExpertTime t;
  for (double i = 0; i < touched; i += 1.0) {
    const double frac = std::min(1.0, touched - i);
    const Timed g = gemm_time(hw, f, std::max(1.0, per_expert), weights, 0.0);
    (g.memory_bound ? t.memory : t.compute) += frac * g.seconds;
  }
  if (touched > 0) t.memory += 2.0 * gemm_fixed_seconds(hw, f);
  return t;
}

// Expected distinct experts of X that `tokens` tokens routed to k each touch (uniform routing).
double experts_touched(double X, double k, double tokens) {
  return X * (1.0 - std::pow(1.0 - k / X, tokens));
}

// y = a + b x by least squares, each part at least zero (a fixed cost and a rate); zero
// without points.
struct Line {
  double a = 0, b = 0;
};
Line fit_line(const std::vector<double>& xs, const std::vector<double>& ys) {
  Line l;
  if (xs.empty()) return l;
  const double n = as_d(xs.size());
  double mx = 0, my = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    mx += xs[i] / n;
    my += ys[i] / n;
  }
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) * (xs[i] - mx);
  }
  l.b = sxx > 0 ? std::max(0.0, sxy / sxx) : 0.0;
  l.a = std::max(0.0, my - l.b * mx);
  return l;
}

// The MoE block's time beyond its expert GEMMs at `touched` experts, from the profile's probes
// (HardwareProfile::moe_block_probes: measured block less this model's price of its expert GEMMs
// and of the activation traffic the probe's kernels move), of the model's weight format (else
// bf16). Probes of the model's own block shape (experts, k, hidden, expert FFN) are interpolated
// piecewise-linearly in the experts touched (the end values beyond them): what the GEMM curve
// misprices in a shape's small grouped GEMMs is not a line across shapes. Other shapes get the
// least-squares line a + b x over every probe. Zero without probes; never below zero.
double moe_overhead_seconds(const HardwareProfile& hw, WeightFormat format, const ModelShape& s,
                            double touched) {
  std::vector<HardwareProfile::MoeBlockProbe> probes;
  for (const auto& m : hw.moe_block_probes)
    if (m.weights == format) probes.push_back(m);
  if (probes.empty()) {
    for (const auto& m : hw.moe_block_probes)
      if (m.weights == WeightFormat::kBF16) probes.push_back(m);
  }
  if (probes.empty()) return 0.0;
  std::vector<std::pair<double, double>> all, same;  // (touched, residual seconds)
  for (const HardwareProfile::MoeBlockProbe& m : probes) {
    const double X = as_d(m.experts), k = as_d(m.k), T = as_d(m.tokens);
    const double probe_touched = experts_touched(X, k, T);
    const double per_expert = T * k / probe_touched;
    const double weights = 3.0 * as_d(m.hidden) * as_d(m.ffn);
    const ExpertTime et = expert_gemm_seconds(hw, m.weights, probe_touched, per_expert, weights);
    // Permuted rows in and out (bf16 in, f32 out), the gated activation's bf16 gate, up and out.
    const double traffic = T * k * (as_d(m.hidden) * (2.0 + 4.0) + 6.0 * as_d(m.ffn)) /
                           (hw.hbm_read_Bps * hw.memory_efficiency);
    const std::pair<double, double> point{probe_touched,
                                          m.seconds - (et.memory + et.compute + traffic)};
    all.push_back(point);
    if (m.experts == s.n_experts && m.k == s.n_experts_used && m.hidden == s.hidden &&
        m.ffn == s.expert_ffn_dim) {
      same.push_back(point);
    }
  }
  if (same.empty()) {
    std::vector<double> xs, ys;
    for (const auto& [x, y] : all) {
      xs.push_back(x);
      ys.push_back(y);
    }
    const Line l = fit_line(xs, ys);
    return l.a + l.b * touched;
  }
  std::sort(same.begin(), same.end());
  double y = same.front().second;
  if (touched >= same.back().first) {
    y = same.back().second;
  } else {
    for (size_t i = 1; i < same.size(); ++i) {
      const auto& [x0, y0] = same[i - 1];
      const auto& [x1, y1] = same[i];
      if (touched > x1) continue;
      if (touched > x0) y = x1 > x0 ? y0 + (y1 - y0) * (touched - x0) / (x1 - x0) : y1;
      break;
    }
  }
  return std::max(0.0, y);
}

// The engine's decode attention of a layer beyond its KV read, a + b x (sequences), least squares
// over the profile's probes (HardwareProfile::decode_attention_probes). Zero without probes.
Line decode_attention_overhead(const HardwareProfile& hw) {
  std::vector<double> xs, ys;
  for (const HardwareProfile::DecodeAttentionProbe& d : hw.decode_attention_probes) {
    const double kv =
        as_d(d.seqs) * as_d(d.kv_len) * 2.0 * as_d(d.kv_heads) * as_d(d.head_dim) * kKvBytes;
    xs.push_back(as_d(d.seqs));
    ys.push_back(d.seconds - kv / (hw.hbm_read_Bps * hw.memory_efficiency));
  }
  return fit_line(xs, ys);
}

// One layer's step for one tensor-parallel group.
struct LayerCost {
  double compute = 0, memory = 0, comm = 0, host = 0, overhead = 0;
  int64_t x = 1, yz = 1;
  double total() const { return compute + memory + comm + host + overhead; }
};

struct StepShape {
  double seqs = 0;       // sequences of this tensor-parallel group
  double q = 0;          // new tokens per sequence
  double keys = 0;       // mean keys each query attends to
  double kv_tokens = 0;  // KV entries read per sequence
};

LayerCost layer_cost(const ModelShape& s, const HardwareProfile& hw, const Layout& l,
                     const PhaseWorkload& w, const Comm& comm, const StepShape& st) {
  LayerCost c;
  const int64_t n = l.tp;
  const double T = st.seqs * st.q;
  const double E = as_d(s.hidden);
  const double qkv = as_d((s.n_heads + 2 * s.n_heads_kv) * s.head_dim);
  const double attn_out = as_d(s.n_heads * s.head_dim);
  const double ffn = as_d(s.is_moe() ? 0 : s.ffn_dim);
  const double ffn_in = (s.gated_mlp ? 2.0 : 1.0) * ffn;

  std::vector<Block> blocks;
  if (l.block == BlockKind::kParallel) {
    blocks.push_back({ffn_in + qkv, ffn + attn_out});
  } else {
    blocks.push_back({qkv, attn_out});
    if (!s.is_moe()) blocks.push_back({ffn_in, ffn});
  }

  // The blocks' projections: an in and an out GEMM each.
  const double gemms = 2.0 * as_d(blocks.size());
  auto add_gemm = [&](double tokens, double weights) {
    const Timed t = gemm_time(hw, w.weights, tokens, weights, gemms);
    (t.memory_bound ? c.memory : c.compute) += t.seconds;
    return t.seconds;
  };

  // A block's all-reduce over the tensor-parallel group of `elems` partial sums. The paper's: bf16
  // through the ring. strata's: f32 partial sums (fused with the residual add and the next
  // RMSNorm), through the one-shot kernels or NCCL, whichever is faster for the size (the
  // engine's oneshot_max is set where NCCL takes over): the ring model, whose latency is the
  // one-shot's, or the profile's measured NCCL curve for the group.
  auto tp_all_reduce = [&](double elems) {
    if (hw.paper_layouts) return 2.0 * comm.gather(elems * kActBytes, n);
    return std::min(2.0 * comm.gather(elems * 4.0, n), nccl_all_reduce(hw, comm, elems * 4.0, n));
  };

  // Projections (attention + dense FFN) under the FFN layout.
  const double dense_weights =
      s.attention_weights() + (s.is_moe() ? 0.0 : s.ffn_weights_per_expert());
  const int64_t N = gather_group(l.ffn, n);
  if (N <= 1) {
    const double gemm = add_gemm(T, dense_weights / as_d(n));
    (void)gemm;
    if (l.ffn == FfnLayout::k2DWeightStationary && n > 1 && !hw.paper_layouts) {
      // strata's 2D FFN (model/ffn_layouts.cpp) on an X x Y grid (X = the largest divisor of n
      // up to sqrt(n), as the engine picks, or the layout's): attention keeps the 1D all-reduce;
      // the FFN all-reduces its f32 gate/up partial sums [T, f_in / Y] over X and its f32
      // output [T, E / X] over Y, then all-gathers the output over X. The X and Y groups are
      // NCCL communicators of their own.
      int64_t x = l.x;
      if (x <= 1) {
        x = 1;
        for (int64_t d = 2; d * d <= n; ++d)
          if (n % d == 0) x = d;
      }
      const int64_t y = n / x;
      double t = 0;
      for (size_t i = 0; i < blocks.size(); ++i) {
        const bool ffn_block = !s.is_moe() && i + 1 == blocks.size() && blocks.size() == 2;
        if (!ffn_block) {
          t += tp_all_reduce(T * E);
          continue;
        }
        t += nccl_all_reduce(hw, comm, T * blocks[i].f_in / as_d(y) * 4.0, x);
        t += nccl_all_reduce(hw, comm, T * E / as_d(x) * 4.0, y);
        t += nccl_all_gather(hw, comm, T * E * 4.0, x);
      }
      c.comm += t;
      c.x = x;
      c.yz = y;
    } else if (l.ffn == FfnLayout::k2DWeightStationary && n > 1) {
      double best = -1;
      // A true 2D split: 1 < X < n (X = 1 is the 1D layout).
      for (int64_t x = 2; x < n; ++x) {
        if (n % x != 0) continue;
        if (l.x > 0 && x != l.x) continue;
        const int64_t yz = n / x;
        double t = 0;
        for (const Block& b : blocks) {
          t += comm.gather(T * E * kActBytes / as_d(x), yz);
          t += comm.gather(T * b.f_in * kActBytes / as_d(yz), x);
          t += comm.gather(T * b.f_out * kActBytes / as_d(yz), x);
          t += comm.gather(T * E * kActBytes / as_d(x), yz);
        }
        if (best < 0 || t < best) {
          best = t;
          c.x = x;
          c.yz = yz;
        }
      }
      c.comm += std::max(best, 0.0);
    } else {
      for (size_t i = 0; i < blocks.size(); ++i) c.comm += tp_all_reduce(T * E);
      c.x = 1;
      c.yz = n;
    }
  } else if (!hw.paper_layouts && !s.is_moe() && N == n && blocks.size() == 2) {
    // strata's weight-gathered FFN (model/ffn_layouts.cpp): attention stays 1D on every token;
    // its f32 partial sums are reduce-scattered to each rank's 1 / n of the tokens, the FFN runs
    // there with the layer's FFN weights all-gathered (bf16, in the step's stream: not hidden
    // behind compute), and the f32 result is all-gathered back to every rank.
    const double ffn_weights = s.ffn_weights_per_expert();
    add_gemm(T, s.attention_weights() / as_d(n));
    add_gemm(T / as_d(n), ffn_weights);
    c.comm += comm.gather(T * E * 4.0, n);  // reduce-scatter
    c.comm += nccl_all_gather(hw, comm, ffn_weights * 2.0, n);
    c.comm += nccl_all_gather(hw, comm, T * E * 4.0, n);
    c.x = 1;
    c.yz = n;
  } else {
    const double local_weights = dense_weights * as_d(N) / as_d(n);
    const double gemm = add_gemm(T / as_d(N), local_weights);
    // The next layer's weights are gathered while this layer computes.
    const double gather_s = comm.gather(local_weights * weight_format_bytes(w.weights), N);
    c.comm += std::max(0.0, gather_s - gemm);
    const int64_t m = n / N;
    for (size_t i = 0; i < blocks.size(); ++i)
      c.comm += 2.0 * comm.gather(T / as_d(N) * E * kActBytes, m);
  }

  // Attention: the KV read and the attention FLOPs of this chip.
  double seqs_dev = st.seqs, heads_dev = as_d(s.n_heads), kv_heads_dev = as_d(s.n_heads_kv);
  if (l.attention == AttentionSharding::kBatch) {
    seqs_dev = std::ceil(st.seqs / as_d(n));
    if (n > 1) {
      c.comm += comm.all_to_all(T * qkv * kActBytes / as_d(n), n);
      c.comm += comm.all_to_all(T * attn_out * kActBytes / as_d(n), n);
    }
  } else {
    heads_dev = as_d(s.n_heads) / as_d(n);
    kv_heads_dev = std::ceil(as_d(s.n_heads_kv) / as_d(n));
  }
  const double attn_flops = 4.0 * seqs_dev * st.q * st.keys * heads_dev * as_d(s.head_dim);
  const double kv_bytes =
      seqs_dev * st.kv_tokens * 2.0 * kv_heads_dev * as_d(s.head_dim) * kKvBytes;
  const double attn_rate =
      hw.attention_flops > 0 ? hw.attention_flops : hw.peak_bf16() * hw.compute_efficiency;
  const double attn_c = attn_flops / attn_rate;
  const double attn_m = kv_bytes / (hw.hbm_read_Bps * hw.memory_efficiency);
  (attn_m >= attn_c ? c.memory : c.compute) += std::max(attn_c, attn_m);
  if (w.phase == Phase::kDecode) {
    const Line da = decode_attention_overhead(hw);
    c.overhead += da.a + da.b * seqs_dev;
  }

  // Activations the engine's elementwise kernels move through HBM (the GEMM curve times each GEMM
  // alone, f32 out), per token of this chip: the two RMSNorms (f32 residual in, bf16 out: 6 E
  // bytes each), the residual add in the o and down epilogues (the f32 residual read: 4 E each),
  // RoPE + KV append (the f32 q/k/v in, bf16 q and K/V out) and the gated activation (bf16 gate
  // and up in, bf16 out; MoE: k experts' rows, and the rows permuted to the experts and back).
  // On a 1x2048 Llama-3-8B prefill that is ~200 KB per token and layer, ~10% of the step on an
  // H100. The TPU profile fuses them (fused_elementwise).
  if (!hw.fused_elementwise) {
    const double nn = as_d(n);
    double bytes = 2.0 * 6.0 * E + 2.0 * 4.0 * E + 4.0 * qkv / nn + 2.0 * qkv / nn;
    const double act = s.gated_mlp ? 6.0 : 4.0;
    if (s.is_moe()) {
      const double k = as_d(s.n_experts_used);
      bytes += k * (act * as_d(s.expert_ffn_dim) / nn + 2.0 * 2.0 * E * kActBytes);
    } else {
      bytes += act * ffn / nn;
    }
    c.memory += T * bytes / (hw.hbm_read_Bps * hw.memory_efficiency);
  }

  // Mixture of experts: the experts are split over the ep group and 1D over the tp group; the
  // ep group's tokens are routed to k experts each.
  double expert_local_weights = 0;
  if (s.is_moe()) {
    const int64_t e = l.ep;
    const double k = as_d(s.n_experts_used), X = as_d(s.n_experts);
    const double routed = T * as_d(e);  // the ep group's tokens
    const double touched_total = experts_touched(X, k, routed);
    const double touched_dev = touched_total / as_d(e);
    const double per_expert = touched_total > 0 ? routed * k / touched_total : 0.0;
    expert_local_weights = s.ffn_weights_per_expert() / as_d(n);
    const ExpertTime et =
        expert_gemm_seconds(hw, w.weights, touched_dev, per_expert, expert_local_weights);
    c.memory += et.memory;
    c.compute += et.compute;
    // What the measured MoE block (the profile's probes) spends beyond its expert GEMMs: the
    // router, top-k, permute and combine launches and each touched expert's share of the
    // grouped kernels.
    c.overhead += moe_overhead_seconds(hw, w.weights, s, touched_dev);
    if (e > 1 && w.phase == Phase::kDecode && hw.moe_exchange_Bps > 0) {
      // The engine's decode steps take the fixed-capacity exchange (model/moe_ep.h): each of
      // the n e ranks sends its chunk of P = ceil(T / n) tokens to every ep rank in blocks of
      // C = P min(k, X / e) rows, bf16 out and f32 back, whatever the routing.
      const double P = std::ceil(T / as_d(n));
      const double C = P * std::min(k, X / as_d(e));
      const double bytes = as_d(e) * C * E * (kActBytes + 4.0);
      c.comm += hw.moe_exchange_fixed_s + bytes / hw.moe_exchange_Bps;
    } else if (e > 1) {
      c.comm += 2.0 * comm.all_to_all(T * k * E * kActBytes / as_d(n), e);
    }
    c.comm += 2.0 * comm.gather(T * E * kActBytes, n);
  }

  // Weights streamed from host memory (ZeRO-Inference): the next layer's copy overlaps this one.
  if (l.residency == WeightResidency::kHostStreamed) {
    double layer_bytes = dense_weights / as_d(n) * weight_format_bytes(w.weights);
    if (s.is_moe()) {
      layer_bytes +=
          as_d(s.n_experts) / as_d(l.ep) * expert_local_weights * weight_format_bytes(w.weights);
    }
    const double h2d = layer_bytes / (hw.host_to_device_Bps * hw.host_link_efficiency);
    c.host = std::max(0.0, h2d - (c.compute + c.memory + c.comm));
  }
  c.overhead += hw.layer_overhead_s;
  return c;
}

}  // namespace

bool has_2d_split(int64_t tp) {
  for (int64_t x = 2; x < tp; ++x)
    if (tp % x == 0) return true;
  return false;
}

const char* ffn_layout_name(FfnLayout l) {
  switch (l) {
    case FfnLayout::k1DWeightStationary:
      return "1D-WS";
    case FfnLayout::k2DWeightStationary:
      return "2D-WS";
    case FfnLayout::kWeightGatheredX:
      return "WG-X";
    case FfnLayout::kWeightGatheredXY:
      return "WG-XY";
    case FfnLayout::kWeightGatheredXYZ:
      return "WG-XYZ";
  }
  return "?";
}

const char* attention_sharding_name(AttentionSharding a) {
  switch (a) {
    case AttentionSharding::kHeads:
      return "head-sharded";
    case AttentionSharding::kBatch:
      return "batch-sharded";
  }
  return "?";
}

const char* bottleneck_name(Bottleneck b) {
  switch (b) {
    case Bottleneck::kCompute:
      return "compute";
    case Bottleneck::kMemory:
      return "memory";
    case Bottleneck::kCommunication:
      return "communication";
    case Bottleneck::kHostLink:
      return "host link";
  }
  return "?";
}

std::string Layout::name() const {
  std::string s = fmt::format("tp{}", tp);
  if (pp > 1) s += fmt::format(" pp{}", pp);
  if (ep > 1) s += fmt::format(" ep{}", ep);
  if (dp > 1) s += fmt::format(" dp{}", dp);
  if (tp > 1) {
    s += std::string(" ") + ffn_layout_name(ffn);
    s += std::string(" attn:") + attention_sharding_name(attention);
  }
  if (block == BlockKind::kParallel) s += " parallel";
  if (residency == WeightResidency::kHostStreamed) s += " host-streamed";
  if (shared_device && devices() > 1) s += " one-device";
  return s;
}

double model_flops_utilization(const ModelShape& shape, const HardwareProfile& hw, double tokens,
                               double seconds, int64_t devices) {
  if (seconds <= 0.0 || devices <= 0 || hw.peak_bf16() <= 0.0) return 0.0;
  return 2.0 * shape.n_active_params() * tokens / (seconds * as_d(devices) * hw.peak_bf16());
}

double max_context(const ModelShape& s, const HardwareProfile& hw, AttentionSharding sharding,
                   int64_t devices, int64_t batch, double kv_fraction) {
  if (devices <= 0 || batch <= 0) return 0.0;
  double seqs_dev = as_d(batch), kv_heads_dev = 0;
  if (sharding == AttentionSharding::kBatch) {
    seqs_dev = std::ceil(as_d(batch) / as_d(devices));
    kv_heads_dev = as_d(s.n_heads_kv);
  } else {
    kv_heads_dev = std::ceil(as_d(s.n_heads_kv) / as_d(devices));
  }
  const double per_token = as_d(s.n_layers) * 2.0 * kv_heads_dev * as_d(s.head_dim) * kKvBytes;
  return kv_fraction * hw.memory_bytes / (per_token * seqs_dev);
}

namespace {

// The engine's prompt micro-batches for `tokens` prompt tokens over `stages` stages (its own
// rule, runtime/pipeline_schedule.h, at the default RunnerOptions::pp_min_micro_batch_tokens).
double prompt_micro_batches(int64_t stages, double tokens) {
  constexpr int64_t kMinTokens = 256;
  return std::max(1, strata::prompt_micro_batches(static_cast<int>(stages),
                                                  static_cast<int64_t>(tokens), kMinTokens));
}

// One collective between ranks sharing the device, `bytes` per rank.
double shared_collective_seconds(const HardwareProfile& hw, double bytes) {
  if (hw.shared_collective_Bps > 0)
    return hw.shared_collective_fixed_s + bytes / hw.shared_collective_Bps;
  return 2.0 * hw.collective_latency_s + bytes / hw.link_Bps;
}

}  // namespace

// Every rank on one device (Layout::shared_device): the ranks' kernels share its SMs and HBM, so
// their compute and weight reads add up to one device's for the whole model; on top come the
// collectives between them and, for pipeline stages, the hand-offs of hidden rows through pinned
// host memory (D2H then H2D) and the prompt cut into micro-batches that run one after another.
static Result<Estimate> estimate_shared_device(const ModelShape& s, const HardwareProfile& hw,
                                               const Layout& l, const PhaseWorkload& w) {
  Layout one;
  one.block = l.block;
  one.residency = l.residency;
  const bool prefill = w.phase == Phase::kPrefill;
  const double tokens = prefill ? as_d(w.batch * w.prompt) : as_d(w.batch);
  Estimate est;
  double micro = 1.0;
  if (l.pp > 1 && prefill) {
    micro = prompt_micro_batches(l.pp, tokens);
    PhaseWorkload chunk = w;
    chunk.prompt = std::max<int64_t>(1, static_cast<int64_t>(std::llround(as_d(w.prompt) / micro)));
    STRATA_ASSIGN_OR_RETURN(est, estimate(s, hw, one, chunk));
    // Each micro-batch passes every stage in turn on the one device.
    est.step_seconds *= micro;
    est.compute_s *= micro;
    est.memory_s *= micro;
    est.comm_s *= micro;
    est.host_s *= micro;
    est.overhead_s *= micro;
  } else {
    STRATA_ASSIGN_OR_RETURN(est, estimate(s, hw, one, w));
  }
  const double E = as_d(s.hidden);
  double extra = 0;
  if (l.tp > 1) {
    // Two all-reduces of f32 partial sums per layer (attention and FFN outputs), and the LM
    // head's logits gathered over the vocabulary shards.
    const double rows = prefill ? tokens : as_d(w.batch);
    extra += 2.0 * as_d(s.n_layers) * shared_collective_seconds(hw, rows * E * 4.0);
    extra += shared_collective_seconds(hw, as_d(w.batch) * as_d(s.vocab) * 4.0 / as_d(l.tp));
  }
  if (l.ep > 1 && s.is_moe()) {
    const double layers = as_d(s.n_layers), k = as_d(s.n_experts_used);
    if (prefill) {
      // Dispatch and combine per MoE layer: every routed row out (bf16) and back (f32).
      extra += layers * shared_collective_seconds(hw, tokens * k * E * (kActBytes + 4.0));
    } else {
      // Decode takes the fixed-capacity exchange (model/moe_ep.h): each of the W ranks' chunks
      // of P = ceil(batch / W) tokens goes to every ep rank as a block of C = P min(k, X / ep)
      // rows (bf16 out, f32 back), then the ep group all-gathers its chunks (f32): three
      // collectives per MoE layer.
      const double ep = as_d(l.ep);
      const double P = std::ceil(as_d(w.batch) / as_d(l.tp * l.ep));
      const double C = P * std::min(k, as_d(s.n_experts) / ep);
      extra += layers * (shared_collective_seconds(hw, ep * C * E * kActBytes) +
                         shared_collective_seconds(hw, ep * C * E * 4.0) +
                         shared_collective_seconds(hw, ep * P * E * 4.0));
    }
    // Every expert-parallel rank runs the attention and the LM head over all the tokens (only
    // the experts are split): the other ep - 1 ranks' copies read and compute on the one device
    // too (tensor parallelism within the ep group splits them).
    const double rows = prefill ? tokens : as_d(w.batch);
    const double head_rows = as_d(w.batch);
    const double copy =
        layers * gemm_time(hw, w.weights, rows, s.attention_weights() / as_d(l.tp), 2).seconds +
        gemm_time(hw, w.weights, head_rows, as_d(s.vocab * s.hidden) / as_d(l.tp)).seconds;
    extra += (as_d(l.ep) - 1.0) * copy;
  }
  if (l.pp > 1) {
    const double bytes = tokens / micro * E * 4.0;  // f32 hidden rows per micro-batch
    const double handoff = 2.0 * bytes / (hw.host_to_device_Bps * hw.host_link_efficiency);
    extra += micro * as_d(l.pp - 1) * handoff;
  }
  est.step_seconds += extra;
  est.comm_s += extra;
  if (prefill) {
    est.seconds = est.step_seconds;
    est.tokens = tokens;
    est.model_flops = 2.0 * s.n_active_params() * est.tokens;
  } else {
    est.seconds = est.step_seconds * as_d(w.gen);
  }
  est.tokens_per_s = est.tokens / est.seconds;
  est.mfu = model_flops_utilization(s, hw, est.tokens, est.seconds, 1);
  est.bubble_fraction = 0;
  return est;
}

Result<Estimate> estimate(const ModelShape& s, const HardwareProfile& hw, const Layout& l,
                          const PhaseWorkload& w) {
  if (l.tp < 1 || l.pp < 1 || l.ep < 1 || l.dp < 1)
    return errorf(StatusCode::kInvalidArgument, "layout '{}': group sizes must be >= 1", l.name());
  if (l.pp > s.n_layers)
    return errorf(StatusCode::kInvalidArgument, "layout '{}': {} pipeline stages for {} layers",
                  l.name(), l.pp, s.n_layers);
  if (l.ep > 1 && (!s.is_moe() || s.n_experts % l.ep != 0))
    return errorf(StatusCode::kInvalidArgument,
                  "layout '{}': expert parallelism needs a MoE model whose {} experts divide by {}",
                  l.name(), s.n_experts, l.ep);
  if (l.block == BlockKind::kParallel && !s.parallel_block)
    return errorf(StatusCode::kInvalidArgument,
                  "layout '{}': model '{}' has a serial block (the parallel block is a different "
                  "model)",
                  l.name(), s.name);
  if (l.ffn == FfnLayout::k2DWeightStationary && !has_2d_split(l.tp))
    return errorf(StatusCode::kInvalidArgument,
                  "layout '{}': 2D weight-stationary needs tp with a divisor 1 < X < tp", l.name());
  if (l.x > 0 && l.tp % l.x != 0)
    return errorf(StatusCode::kInvalidArgument, "layout '{}': X = {} does not divide tp = {}",
                  l.name(), l.x, l.tp);
  if (w.batch < 1 || w.prompt < 0 || w.gen < 0 || (w.phase == Phase::kPrefill && w.prompt < 1) ||
      (w.phase == Phase::kDecode && w.gen < 1))
    return errorf(StatusCode::kInvalidArgument,
                  "workload: batch >= 1, prompt >= 1 for prefill, gen >= 1 for decode (got "
                  "batch={} prompt={} gen={})",
                  w.batch, w.prompt, w.gen);
  if (hw.peak_flops.find(w.weights) == hw.peak_flops.end())
    return errorf(StatusCode::kUnimplemented, "profile '{}' has no {} weights (peak_tflops)",
                  hw.name, weight_format_name(w.weights));

  if (l.shared_device && l.devices() > 1) return estimate_shared_device(s, hw, l, w);

  Estimate est;
  const Comm comm{hw, l.devices()};
  // Sequences one tensor-parallel group serves: the batch over replicas and, for MoE, over the
  // ep group (attention is data-parallel across it).
  const double groups = as_d(l.dp * (s.is_moe() ? l.ep : 1));
  const double seqs = std::ceil(as_d(w.batch) / groups);
  // Pipeline micro-batches: a prompt step is cut as the engine cuts it (prompt_micro_batches in
  // runtime/pipeline_schedule.cpp: chunks of at least 256 tokens, at most 4 per stage); decode
  // runs as many micro-batches as stages (seed 000's generation schedule).
  double microbatches = 1.0;
  if (l.pp > 1) {
    microbatches = w.phase == Phase::kPrefill ? prompt_micro_batches(l.pp, seqs * as_d(w.prompt))
                                              : std::min(as_d(l.pp), seqs);
  }
  StepShape st;
  st.seqs = seqs / microbatches;
  if (w.phase == Phase::kPrefill) {
    st.q = as_d(w.prompt);
    st.keys = as_d(w.prompt + 1) / 2.0;  // causal: query i attends to i + 1 keys
    st.kv_tokens = as_d(w.prompt);
  } else {
    st.q = 1.0;
    st.keys = as_d(w.prompt) + as_d(w.gen + 1) / 2.0;  // the mean context over the steps
    st.kv_tokens = st.keys;
  }
  const LayerCost layer = layer_cost(s, hw, l, w, comm, st);
  est.x = layer.x;
  est.yz = layer.yz;
  const double layers_per_stage = std::ceil(as_d(s.n_layers) / as_d(l.pp));

  // LM head on the last stage: vocab-parallel over tp, one row per sequence.
  const Timed head = gemm_time(hw, w.weights, st.seqs, as_d(s.vocab * s.hidden) / as_d(l.tp));
  const double head_gather = comm.gather(st.seqs * as_d(s.vocab) * 4.0, l.tp);
  const double p2p =
      l.pp > 1 ? comm.gather(st.seqs * st.q * as_d(s.hidden) * kActBytes * 2.0, 2) : 0.0;
  const double stage = layers_per_stage * layer.total() + head.seconds + head_gather + p2p;
  // Prefill: the micro-batches fill and drain the pipeline. Decode runs seed 000's generation
  // schedule: pp steps of different sequences in flight across steps, so no stage waits once
  // the pipeline is full; every sequence advances once per pp stage times (a stage time is one
  // micro-batch through one stage), with idle stage slots only when there are fewer
  // micro-batches than stages.
  const double slots = w.phase == Phase::kPrefill ? microbatches + as_d(l.pp) - 1.0
                                                  : std::max(microbatches, as_d(l.pp));
  est.step_seconds = slots * stage;
  est.bubble_fraction = (slots - microbatches) / slots;
  const double scale = slots * layers_per_stage;
  est.compute_s = scale * layer.compute + slots * (head.memory_bound ? 0.0 : head.seconds);
  est.memory_s = scale * layer.memory + slots * (head.memory_bound ? head.seconds : 0.0);
  est.comm_s = scale * layer.comm + slots * (head_gather + p2p);
  est.host_s = scale * layer.host;
  est.overhead_s = scale * layer.overhead;

  if (w.phase == Phase::kPrefill) {
    est.seconds = est.step_seconds;
    est.tokens = as_d(w.batch * w.prompt);
  } else {
    est.seconds = est.step_seconds * as_d(w.gen);
    est.tokens = as_d(w.batch * w.gen);
  }
  est.model_flops = 2.0 * s.n_active_params() * est.tokens;
  est.mfu = model_flops_utilization(s, hw, est.tokens, est.seconds, l.devices());
  est.tokens_per_s = est.tokens / est.seconds;

  // Memory per device: the weights of its stage (2 layers in flight when streamed from the
  // host), its KV cache for prompt + gen tokens, and the activations of one step.
  const double wb = weight_format_bytes(w.weights);
  double layer_weights = s.attention_weights() / as_d(l.tp);
  if (s.is_moe()) {
    layer_weights += as_d(s.n_experts) / as_d(l.ep) * s.ffn_weights_per_expert() / as_d(l.tp);
  } else {
    layer_weights += s.ffn_weights_per_expert() / as_d(l.tp);
  }
  const double embed = s.embedding_weights() / as_d(l.tp) * wb;
  if (l.residency == WeightResidency::kHostStreamed) {
    est.weight_bytes_per_device = 2.0 * layer_weights * wb + embed;
  } else {
    est.weight_bytes_per_device = layers_per_stage * layer_weights * wb + embed;
  }
  const int64_t N = gather_group(l.ffn, l.tp);
  // Weight-gathered: one layer's gathered weights in flight (the matrices are gathered in chunks
  // while the previous chunk multiplies, Section 3.5).
  if (N > 1) est.weight_bytes_per_device += layer_weights * as_d(N) * wb;
  // The cache is stored as the layout shards attention, except that a prefill with fewer KV
  // heads than chips writes it sharded by batch for the decode that follows (Section 3.3: the
  // multiquery cache is never replicated).
  const bool store_by_batch = l.attention == AttentionSharding::kBatch ||
                              (w.phase == Phase::kPrefill && s.n_heads_kv < l.tp);
  double seqs_dev = seqs, kv_heads_dev = as_d(s.n_heads_kv);
  if (store_by_batch) {
    seqs_dev = std::ceil(seqs / as_d(l.tp));
  } else {
    kv_heads_dev = std::ceil(as_d(s.n_heads_kv) / as_d(l.tp));
  }
  est.kv_bytes_per_device = layers_per_stage * seqs_dev * as_d(w.prompt + w.gen) * 2.0 *
                            kv_heads_dev * as_d(s.head_dim) * kKvBytes;
  const double T = st.seqs * st.q;
  const double widest =
      std::max(as_d(s.hidden), (s.gated_mlp ? 2.0 : 1.0) *
                                   as_d(s.is_moe() ? s.expert_ffn_dim : s.ffn_dim) / as_d(l.tp));
  est.workspace_bytes_per_device = 3.0 * T / as_d(N) * widest * kActBytes;
  est.memory_per_device =
      est.weight_bytes_per_device + est.kv_bytes_per_device + est.workspace_bytes_per_device;
  est.fits = est.memory_per_device <= hw.memory_bytes;

  const double parts[] = {est.compute_s, est.memory_s, est.comm_s, est.host_s};
  const Bottleneck kinds[] = {Bottleneck::kCompute, Bottleneck::kMemory, Bottleneck::kCommunication,
                              Bottleneck::kHostLink};
  size_t top = 0;
  for (size_t i = 1; i < 4; ++i)
    if (parts[i] > parts[top]) top = i;
  est.bottleneck = kinds[top];
  return est;
}

Result<double> offline_output_tokens_per_s(const ModelShape& s, const HardwareProfile& hw,
                                           const Layout& l, const OfflineWorkload& w) {
  if (w.prompts < 1 || w.prompt < 1 || w.gen < 1 || w.max_seqs < 1 ||
      w.max_batched_tokens < w.prompt)
    return errorf(StatusCode::kInvalidArgument,
                  "offline workload: prompts, prompt, gen, max_seqs >= 1 and max_batched_tokens >= "
                  "prompt (got {}, {}, {}, {}, {})",
                  w.prompts, w.prompt, w.gen, w.max_seqs, w.max_batched_tokens);
  const int64_t per_chunk = std::min(w.max_batched_tokens / w.prompt, w.prompts);
  PhaseWorkload pre{Phase::kPrefill, per_chunk, w.prompt, 0, w.weights};
  auto p = estimate(s, hw, l, pre);
  if (!p.ok()) return p.status();
  const double chunks = as_d(w.prompts) / as_d(per_chunk);
  const int64_t seqs = std::min(w.max_seqs, w.prompts);
  PhaseWorkload dec{Phase::kDecode, seqs, w.prompt, w.gen, w.weights};
  auto d = estimate(s, hw, l, dec);
  if (!d.ok()) return d.status();
  const double waves = as_d(w.prompts) / as_d(seqs);
  const double seconds = chunks * p->seconds + waves * d->seconds;
  return as_d(w.prompts * w.gen) / seconds;
}

}  // namespace strata::planner
