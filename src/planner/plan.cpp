// The public face of the planner (include/strata/plan.h): resolve the model and the profile,
// rank the layouts of each phase, and print them as a table or JSON.
#include <chrono>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/status.h"
#include "planner/planner.h"
#include "runtime/model_loader.h"
#include "strata/plan.h"

namespace strata {

namespace {

using planner::Phase;

Result<planner::ModelShape> resolve_model(const PlanRequest& r) {
  if (!r.model_config.empty() && !r.model.empty())
    return errorf(StatusCode::kInvalidArgument, "give --model-config or -m, not both");
  if (!r.model_config.empty()) return planner::model_shape_preset(r.model_config);
  if (r.model.empty())
    return errorf(StatusCode::kInvalidArgument,
                  "strata plan needs a model: --model-config NAME or -m MODEL");
  auto files = open_model(r.model, /*with_weights=*/false);
  if (!files.ok()) return files.status();
  return planner::model_shape_from_config(files->config, files->path);
}

PlanRow to_row(const planner::RankedLayout& r) {
  const planner::Layout& l = r.layout;
  const planner::Estimate& e = r.estimate;
  PlanRow row;
  row.layout = l.name();
  row.tp = l.tp;
  row.pp = l.pp;
  row.ep = l.ep;
  row.dp = l.dp;
  row.ffn = planner::ffn_layout_name(l.ffn);
  row.attention = planner::attention_sharding_name(l.attention);
  row.parallel_block = l.block == planner::BlockKind::kParallel;
  row.host_streamed = l.residency == planner::WeightResidency::kHostStreamed;
  row.x = e.x;
  row.yz = e.yz;
  row.phase_s = e.seconds;
  row.tokens_per_s = e.tokens_per_s;
  row.mfu = e.mfu;
  row.memory_per_device = e.memory_per_device;
  row.weight_bytes = e.weight_bytes_per_device;
  row.kv_bytes = e.kv_bytes_per_device;
  row.compute_s = e.compute_s;
  row.memory_s = e.memory_s;
  row.comm_s = e.comm_s;
  row.host_s = e.host_s;
  row.bubble = e.bubble_fraction;
  row.bottleneck = planner::bottleneck_name(e.bottleneck);
  row.fits = e.fits;
  row.meets_target = r.meets_target;
  return row;
}

// The fewest tokens in one prefill step at which `wg` (a weight-gathered layout) is predicted
// faster than the same ranks with the 1D weight-stationary FFN; 0 when it is not up to 2^20.
// The FFN's cost is what differs: 1D's collectives grow with the tokens, weight-gathered's
// all-gather of the weights does not.
Result<int64_t> gather_crossover(const planner::ModelShape& shape,
                                 const planner::HardwareProfile& hw, const planner::Layout& wg,
                                 planner::WeightFormat weights) {
  planner::Layout one = wg;
  one.ffn = planner::FfnLayout::k1DWeightStationary;
  auto wins = [&](int64_t tokens) -> Result<bool> {
    planner::PhaseWorkload w{Phase::kPrefill, 1, tokens, 1, weights};
    STRATA_ASSIGN_OR_RETURN(planner::Estimate a, planner::estimate(shape, hw, wg, w));
    STRATA_ASSIGN_OR_RETURN(planner::Estimate b, planner::estimate(shape, hw, one, w));
    return a.seconds < b.seconds;
  };
  constexpr int64_t kMax = int64_t{1} << 20;
  int64_t hi = 1;
  for (;; hi *= 2) {
    STRATA_ASSIGN_OR_RETURN(bool w, wins(hi));
    if (w) break;
    if (hi >= kMax) return int64_t{0};
  }
  int64_t lo = hi / 2;  // loses (or 0); hi wins: the first win in (lo, hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    STRATA_ASSIGN_OR_RETURN(bool w, wins(mid));
    (w ? hi : lo) = mid;
  }
  return hi;
}

std::string human_time(double s) {
  if (s >= 1.0) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

}  // namespace

Status parse_plan_workload(const std::string& text, PlanRequest& request) {
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return errorf(StatusCode::kInvalidArgument,
                    "--workload '{}': expected key=value items (prompt=, gen=, batch=)", text);
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    int64_t v = 0;
    try {
      size_t used = 0;
      v = std::stoll(value, &used);
      if (used != value.size()) throw std::invalid_argument(value);
    } catch (const std::exception&) {
      return errorf(StatusCode::kInvalidArgument, "--workload: '{}' is not an integer ({})", value,
                    key);
    }
    if (key == "prompt" && v >= 1) {
      request.prompt = v;
    } else if (key == "gen" && v >= 1) {
      request.gen = v;
    } else if (key == "batch" && v >= 1) {
      request.batch = v;
    } else {
      return errorf(StatusCode::kInvalidArgument,
                    "--workload: '{}' (keys prompt, gen, batch; values >= 1)", item);
    }
  }
  return ok_status();
}

Result<PlanReport> make_plan(const PlanRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  auto shape = resolve_model(r);
  if (!shape.ok()) return shape.status();
  auto hw = planner::load_hardware_profile(r.profile);
  if (!hw.ok()) return hw.status();
  auto weights = planner::parse_weight_format(r.weights);
  if (!weights.ok()) return weights.status().with_context("--weights");
  if (r.batch < 1 || r.prompt < 1 || r.gen < 1)
    return errorf(StatusCode::kInvalidArgument,
                  "--workload: batch, prompt and gen must be >= 1 (got {}, {}, {})", r.batch,
                  r.prompt, r.gen);
  PlanReport report;
  report.model = shape->name;
  report.n_params = shape->n_params();
  report.n_active_params = shape->n_active_params();
  report.profile = hw->name;
  report.profile_source = hw->source;
  report.gpus = r.gpus;
  report.batch = r.batch;
  report.prompt = r.prompt;
  report.gen = r.gen;
  report.weights = planner::weight_format_name(*weights);
  for (Phase phase : {Phase::kPrefill, Phase::kDecode}) {
    planner::PhaseWorkload w{phase, r.batch, r.prompt, r.gen, *weights};
    planner::SearchOptions options;
    options.max_latency_s = 1e-3 * (phase == Phase::kPrefill ? r.max_prefill_ms : r.max_decode_ms);
    auto ranked = planner::rank_layouts(*shape, *hw, r.gpus, w, options);
    if (!ranked.ok()) return ranked.status();
    PhasePlan p;
    p.phase = phase == Phase::kPrefill ? "prefill" : "decode";
    p.considered = static_cast<int64_t>(ranked->size());
    for (const planner::RankedLayout& rl : *ranked) {
      PlanRow row = to_row(rl);
      row.latency_s = phase == Phase::kPrefill ? rl.estimate.seconds : rl.estimate.step_seconds;
      const planner::Layout& l = rl.layout;
      if (phase == Phase::kPrefill && l.ffn == planner::FfnLayout::kWeightGatheredXYZ && l.tp > 1 &&
          l.ep == 1 && l.residency == planner::WeightResidency::kDevice) {
        auto t = gather_crossover(*shape, *hw, l, *weights);
        if (!t.ok()) return t.status();
        row.gather_min_tokens = *t;
      }
      p.rows.push_back(row);
    }
    report.phases.push_back(std::move(p));
  }
  if (Result<EngineLayoutChoice> c = choose_engine_layout(report, 0); c.ok()) {
    std::string ffn = "1d";
    if (c->decode.ffn == "2D-WS") ffn = fmt::format("2d --ffn-2d-x {}", c->decode.x);
    if (c->decode.ffn == "WG-XYZ") ffn = "weight-gathered";
    if (c->gather_min_tokens > 0) {
      ffn += fmt::format(" --ffn-gather-min-tokens {}", c->gather_min_tokens);
    }
    report.engine_layout =
        fmt::format("--tp {} --pp {} --ffn-layout {}; prefill {} ({}), decode {} per token ({})",
                    c->decode.tp, c->decode.pp, ffn, human_time(c->prefill.latency_s),
                    c->prefill.layout, human_time(c->decode.latency_s), c->decode.layout);
  }
  if (r.top > 0) {
    for (PhasePlan& p : report.phases) {
      if (static_cast<int64_t>(p.rows.size()) > r.top) p.rows.resize(static_cast<size_t>(r.top));
    }
  }
  report.plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

std::string format_plan(const PlanReport& rep) {
  std::string out = fmt::format(
      "model {} ({:.2f}B parameters{}), profile {}, {} device{}, batch {}, prompt {}, gen {}, {} "
      "weights\n",
      rep.model, rep.n_params / 1e9,
      rep.n_active_params < rep.n_params
          ? fmt::format(", {:.2f}B active", rep.n_active_params / 1e9)
          : std::string(),
      rep.profile, rep.gpus, rep.gpus == 1 ? "" : "s", rep.batch, rep.prompt, rep.gen, rep.weights);
  for (const PhasePlan& p : rep.phases) {
    out += fmt::format("\n{} ({} layouts considered; latency = {})\n", p.phase, p.considered,
                       p.phase == "prefill" ? "the whole pass" : "per generated token");
    out += fmt::format("{:>3}  {:<40} {:>10} {:>12} {:>6} {:>10}  {}\n", "#", "layout", "latency",
                       "tokens/s", "MFU", "mem/dev", "bottleneck");
    int i = 0;
    for (const PlanRow& row : p.rows) {
      std::string note = row.bottleneck;
      if (!row.fits) note += ", does not fit";
      if (!row.meets_target) note += ", misses target";
      std::string layout = row.layout;
      if (row.ffn == "2D-WS" && row.tp > 1) layout += fmt::format(" X={}", row.x);
      out += fmt::format("{:>3}  {:<40} {:>10} {:>12.0f} {:>5.1f}% {:>7.1f} GB  {}\n", ++i, layout,
                         human_time(row.latency_s), row.tokens_per_s, 100 * row.mfu,
                         row.memory_per_device / 1e9, note);
    }
  }
  if (!rep.engine_layout.empty()) {
    out += "\nthe engine's layout (--plan, ranks in one process): " + rep.engine_layout + "\n";
  }
  out += fmt::format("\nplanned in {:.1f} ms\n", rep.plan_seconds * 1e3);
  return out;
}

std::string plan_to_json(const PlanReport& rep) {
  nlohmann::json j;
  j["model"] = rep.model;
  j["n_params"] = rep.n_params;
  j["n_active_params"] = rep.n_active_params;
  j["profile"] = rep.profile;
  j["profile_source"] = rep.profile_source;
  j["gpus"] = rep.gpus;
  j["workload"] = {
      {"batch", rep.batch}, {"prompt", rep.prompt}, {"gen", rep.gen}, {"weights", rep.weights}};
  j["plan_seconds"] = rep.plan_seconds;
  if (!rep.engine_layout.empty()) j["engine_layout"] = rep.engine_layout;
  for (const PhasePlan& p : rep.phases) {
    nlohmann::json rows = nlohmann::json::array();
    for (const PlanRow& r : p.rows) {
      rows.push_back({{"layout", r.layout},
                      {"tp", r.tp},
                      {"pp", r.pp},
                      {"ep", r.ep},
                      {"dp", r.dp},
                      {"ffn", r.ffn},
                      {"attention", r.attention},
                      {"parallel_block", r.parallel_block},
                      {"host_streamed", r.host_streamed},
                      {"x", r.x},
                      {"yz", r.yz},
                      {"latency_s", r.latency_s},
                      {"phase_s", r.phase_s},
                      {"tokens_per_s", r.tokens_per_s},
                      {"mfu", r.mfu},
                      {"memory_per_device_bytes", r.memory_per_device},
                      {"weight_bytes_per_device", r.weight_bytes},
                      {"kv_bytes_per_device", r.kv_bytes},
                      {"compute_s", r.compute_s},
                      {"memory_s", r.memory_s},
                      {"comm_s", r.comm_s},
                      {"host_s", r.host_s},
                      {"bubble", r.bubble},
                      {"bottleneck", r.bottleneck},
                      {"fits", r.fits},
                      {"meets_target", r.meets_target},
                      {"gather_min_tokens", r.gather_min_tokens}});
    }
    j["phases"][p.phase] = {{"considered", p.considered}, {"layouts", rows}};
  }
  return j.dump(2) + "\n";
}

namespace {

// A whole number in [lo, hi] from a plan file. nlohmann's get<int64_t>() on a float (a number too
// large for 64 bits parses as one) or on an out-of-range value is undefined behaviour; sizes this
// large are never a real plan, and bounding them keeps tp * pp far from overflow.
Result<int64_t> plan_int(const nlohmann::json& v, const char* field, int64_t lo, int64_t hi,
                         const std::string& what) {
  // Non-negative numbers parse as unsigned: compare those as unsigned, the rest as signed.
  const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                                                     static_cast<int64_t>(v.get<uint64_t>()) >= lo
                                               : v.is_number_integer() && v.get<int64_t>() >= lo &&
                                                     v.get<int64_t>() <= hi;
  if (!in_range) {
    return errorf(StatusCode::kInvalidArgument, "{}: '{}' must be a whole number in [{}, {}]", what,
                  field, lo, hi);
  }
  return v.get<int64_t>();
}

}  // namespace

Result<PlanReport> plan_from_json(const std::string& text, const std::string& what) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("phases") || !j["phases"].is_object()) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: not a plan (write one with `strata plan ... --json`)", what);
  }
  PlanReport rep;
  try {
    rep.model = j.value("model", "");
    rep.profile = j.value("profile", "");
    rep.n_params = j.value("n_params", 0.0);
    rep.n_active_params = j.value("n_active_params", rep.n_params);
    if (j.contains("workload") && j["workload"].is_object()) {
      rep.weights = j["workload"].value("weights", "");
    }
    constexpr int64_t kMaxSize = int64_t{1} << 20;  // devices or ranks along any axis
    if (j.contains("gpus")) {
      STRATA_ASSIGN_OR_RETURN(rep.gpus, plan_int(j["gpus"], "gpus", 1, kMaxSize, what));
    }
    for (const auto& [name, phase] : j["phases"].items()) {
      PhasePlan p;
      p.phase = name;
      for (const auto& r : phase.at("layouts")) {
        PlanRow row;
        row.layout = r.at("layout").get<std::string>();
        for (auto [field, dst] : {std::pair{"tp", &row.tp}, std::pair{"pp", &row.pp},
                                  std::pair{"ep", &row.ep}, std::pair{"dp", &row.dp}}) {
          auto n = plan_int(r.at(field), field, 1, kMaxSize, what);
          if (!n.ok()) {
            return errorf(StatusCode::kInvalidArgument, "{} (layout '{}')", n.status().message(),
                          row.layout);
          }
          *dst = *n;
        }
        row.ffn = r.at("ffn").get<std::string>();
        row.attention = r.at("attention").get<std::string>();
        // Plans written before the names became --attn-layout's.
        if (row.attention == "heads") row.attention = "head-sharded";
        if (row.attention == "batch") row.attention = "batch-sharded";
        row.parallel_block = r.at("parallel_block").get<bool>();
        row.host_streamed = r.at("host_streamed").get<bool>();
        row.fits = r.at("fits").get<bool>();
        row.latency_s = r.at("latency_s").get<double>();
        row.phase_s = r.at("phase_s").get<double>();
        if (r.contains("gather_min_tokens")) {  // plans written before it have none
          auto n = plan_int(r["gather_min_tokens"], "gather_min_tokens", 0, kMaxSize, what);
          if (!n.ok()) {
            return errorf(StatusCode::kInvalidArgument, "{} (layout '{}')", n.status().message(),
                          row.layout);
          }
          row.gather_min_tokens = *n;
        }
        p.rows.push_back(std::move(row));
      }
      rep.phases.push_back(std::move(p));
    }
  } catch (const nlohmann::json::exception& e) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: a layout lacks a field or has a wrong type ({})", what, e.what());
  }
  return rep;
}

Result<EngineLayoutChoice> choose_engine_layout(const PlanReport& rep, int world,
                                                int64_t max_step_tokens) {
  // The 2D and weight-gathered FFN run with in-process tensor-parallel ranks (not under mpirun,
  // not with pipeline stages) on dense models; weight-gathered gathers bf16 shards.
  const bool moe = rep.n_active_params < rep.n_params;
  const bool bf16 = rep.weights.empty() || rep.weights == "bf16";
  auto other_ffn = [&](const PlanRow& r) {
    return (r.ffn == "2D-WS" || (r.ffn == "WG-XYZ" && bf16)) && world == 0 && r.pp == 1 &&
           r.tp >= 2 && !moe;
  };
  auto runs = [&](const PlanRow& r) {
    if (!r.fits || (r.ffn != "1D-WS" && !other_ffn(r)) || r.attention != "head-sharded" ||
        r.parallel_block || r.host_streamed || r.ep != 1 || r.dp != 1) {
      return false;
    }
    // mpirun (world > 0): one GPU per process, tp x pp processes.
    if (world > 0) return r.tp * r.pp == world;
    return true;
  };
  struct Pick {
    const PlanRow* prefill = nullptr;
    const PlanRow* decode = nullptr;
  };
  // Picks per (tp, pp, FFN layout) in both phases, and the seed's pair per (tp, pp): a
  // weight-gathered prefill with a 1D decode (the same shards).
  std::map<std::tuple<int64_t, int64_t, std::string>, Pick> picks;
  std::map<std::pair<int64_t, int64_t>, const PlanRow*> gathered_prefill;
  for (const PhasePlan& p : rep.phases) {
    if (p.phase != "prefill" && p.phase != "decode") continue;
    for (const PlanRow& r : p.rows) {
      if (!runs(r)) continue;
      Pick& k = picks[{r.tp, r.pp, r.ffn}];
      const PlanRow*& slot = p.phase == "prefill" ? k.prefill : k.decode;
      if (slot == nullptr || r.phase_s < slot->phase_s) slot = &r;
      if (p.phase == "prefill" && r.ffn == "WG-XYZ" && r.gather_min_tokens > 0 &&
          (max_step_tokens <= 0 || r.gather_min_tokens <= max_step_tokens)) {
        const PlanRow*& g = gathered_prefill[{r.tp, r.pp}];
        if (g == nullptr || r.phase_s < g->phase_s) g = &r;
      }
    }
  }
  auto total = [](const Pick& k) { return k.prefill->phase_s + k.decode->phase_s; };
  const Pick* best = nullptr;
  for (const auto& [key, k] : picks) {
    if (k.prefill == nullptr || k.decode == nullptr || std::get<2>(key) != "1D-WS") continue;
    if (best == nullptr || total(k) < total(*best)) best = &k;
  }
  // Any other FFN replaces the 1D one only when predicted at least 5% faster for the workload:
  // about the planner's error on the layouts measured (4 x H200, 2026-11-26), and a profile
  // without measured NCCL curves prices their collectives from the ring model alone.
  std::vector<Pick> others;
  for (const auto& [key, k] : picks) {
    if (k.prefill == nullptr || k.decode == nullptr || std::get<2>(key) == "1D-WS") continue;
    others.push_back(k);
  }
  for (const auto& [key, g] : gathered_prefill) {
    auto one = picks.find({key.first, key.second, "1D-WS"});
    if (one != picks.end() && one->second.decode != nullptr) {
      others.push_back(Pick{g, one->second.decode});
    }
  }
  const Pick* other = nullptr;
  for (const Pick& k : others) {
    if (other == nullptr || total(k) < total(*other)) other = &k;
  }
  if (other != nullptr && (best == nullptr || total(*other) < 0.95 * total(*best))) best = other;
  if (best == nullptr) {
    return errorf(
        StatusCode::kInvalidArgument,
        "no layout of the plan ({}, {} GPUs, profile {}) is one the engine runs and "
        "fits: 1D weight-stationary, head-sharded attention, tensor or pipeline "
        "parallel{}",
        rep.model, rep.gpus, rep.profile,
        world > 0 ? ", tp = the mpirun world of " + std::to_string(world) : std::string());
  }
  EngineLayoutChoice c{*best->prefill, *best->decode};
  if (c.prefill.ffn == "WG-XYZ" && c.decode.ffn == "1D-WS") {
    c.gather_min_tokens = c.prefill.gather_min_tokens;
  }
  return c;
}

#if !defined(STRATA_HAS_CUDA)
Result<std::string> calibrate_profile(const std::string& name) {
  return errorf(StatusCode::kUnimplemented,
                "--calibrate '{}': this strata was built without CUDA (configure with "
                "-DSTRATA_CUDA=ON on a GPU machine)",
                name);
}
#endif

}  // namespace strata
