// Hardware profiles: small JSON files (src/planner/profiles/*.json, embedded in the binary) or a
// file written by `strata plan --calibrate`. Every field is documented in README.md ("strata
// plan"); a missing required field or a non-positive number is an error naming the field.
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "planner/embedded_profiles.h"
#include "planner/planner.h"

namespace strata::planner {

namespace {

using nlohmann::json;

Result<double> positive(const json& j, const char* key, const std::string& where, bool required,
                        double fallback) {
  if (!j.contains(key)) {
    if (required) return errorf(StatusCode::kInvalidArgument, "{}: missing field '{}'", where, key);
    return fallback;
  }
  const json& v = j.at(key);
  if (!v.is_number())
    return errorf(StatusCode::kInvalidArgument, "{}: field '{}' must be a number", where, key);
  const double d = v.get<double>();
  if (!(d > 0.0) || !std::isfinite(d))
    return errorf(StatusCode::kInvalidArgument, "{}: field '{}' must be positive (got {})", where,
                  key, d);
  return d;
}

// A field {"fixed_us": >= 0, "GBps": > 0} (a fixed time and a byte rate), when present: into
// *fixed_s and *bytes_per_s.
Status fixed_and_rate(const json& j, const char* key, const std::string& source, double* fixed_s,
                      double* bytes_per_s) {
  if (!j.contains(key)) return ok_status();
  const json& m = j.at(key);
  if (!m.is_object() || !m.contains("fixed_us") || !m.contains("GBps") ||
      !m.at("fixed_us").is_number() || !m.at("GBps").is_number() ||
      m.at("fixed_us").get<double>() < 0.0 || m.at("GBps").get<double>() <= 0.0) {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: field '{}' must be {{\"fixed_us\": >= 0, \"GBps\": > 0}}", source, key);
  }
  *fixed_s = m.at("fixed_us").get<double>() * 1e-6;
  *bytes_per_s = m.at("GBps").get<double>() * 1e9;
  return ok_status();
}

// One measured probe of a profile's list (moe_block_probes, decode_attention_probes): the named
// whole-number fields (1 .. 2^24) and "us" (> 0, finite) into *seconds. false: a field is
// missing or out of range.
bool probe_fields(const json& e, std::initializer_list<std::pair<const char*, int64_t*>> ints,
                  double* seconds) {
  for (const auto& [name, out] : ints) {
    if (!e.contains(name) || !e.at(name).is_number_integer()) return false;
    const auto v = e.at(name).get<int64_t>();
    if (v < 1 || v > (int64_t{1} << 24)) return false;
    *out = v;
  }
  if (!e.contains("us") || !e.at("us").is_number()) return false;
  *seconds = e.at("us").get<double>() * 1e-6;
  return *seconds > 0.0 && std::isfinite(*seconds);
}

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBF16:
      return "bf16";
    case WeightFormat::kInt8:
      return "int8";
    case WeightFormat::kFp8:
      return "fp8";
  }
  return "?";
}

Result<WeightFormat> parse_weight_format(const std::string& s) {
  if (s == "bf16") return WeightFormat::kBF16;
  if (s == "int8" || s == "i8") return WeightFormat::kInt8;
  if (s == "fp8") return WeightFormat::kFp8;
  return errorf(StatusCode::kInvalidArgument, "unknown weight format '{}' (bf16, int8, fp8)",
                printable_for_message(s, 40));
}

double weight_format_bytes(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBF16:
      return 2.0;
    case WeightFormat::kInt8:
      return 1.0;
    case WeightFormat::kFp8:
      return 1.0;
  }
  return 2.0;
}

double HardwareProfile::peak_bf16() const {
  auto it = peak_flops.find(WeightFormat::kBF16);
  return it == peak_flops.end() ? 0.0 : it->second;
}

namespace {

Result<HardwareProfile> parse_profile_object(const json& j, const std::string& source);

}  // namespace

Result<HardwareProfile> parse_hardware_profile(const std::string& json_text,
                                               const std::string& source) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return errorf(StatusCode::kInvalidArgument, "{}: not valid JSON ({})", source, e.what());
  }
  // A field of the wrong JSON type that a check below does not catch (e.g. a number where a
  // string goes) throws from the JSON library: a clear error, not an abort (found by
  // tests/fuzz/fuzz_hw_profile.cpp).
  try {
    return parse_profile_object(j, source);
  } catch (const json::exception& e) {
    return errorf(StatusCode::kInvalidArgument, "{}: a field has the wrong type ({})", source,
                  e.what());
  }
}

namespace {

Result<HardwareProfile> parse_profile_object(const json& j, const std::string& source) {
  if (!j.is_object())
    return errorf(StatusCode::kInvalidArgument, "{}: a profile is a JSON object", source);
  HardwareProfile p;
  p.name = j.value("name", source);
  p.source = j.value("source", std::string());
  auto mem = positive(j, "memory_GB", source, true, 0);
  if (!mem.ok()) return mem.status();
  p.memory_bytes = *mem * 1e9;
  if (!j.contains("peak_tflops") || !j.at("peak_tflops").is_object())
    return errorf(StatusCode::kInvalidArgument, "{}: missing object 'peak_tflops'", source);
  for (const auto& [key, value] : j.at("peak_tflops").items()) {
    auto f = parse_weight_format(key);
    if (!f.ok()) return f.status().with_context(source + ": peak_tflops");
    auto v = positive(j.at("peak_tflops"), key.c_str(), source + ": peak_tflops", true, 0);
    if (!v.ok()) return v.status();
    p.peak_flops[*f] = *v * 1e12;
  }
  if (p.peak_bf16() <= 0.0)
    return errorf(StatusCode::kInvalidArgument, "{}: peak_tflops needs 'bf16'", source);
  auto hbm = positive(j, "hbm_read_GBps", source, true, 0);
  if (!hbm.ok()) return hbm.status();
  p.hbm_read_Bps = *hbm * 1e9;
  auto h2d = positive(j, "host_to_device_GBps", source, true, 0);
  if (!h2d.ok()) return h2d.status();
  p.host_to_device_Bps = *h2d * 1e9;
  if (!j.contains("interconnect") || !j.at("interconnect").is_object())
    return errorf(StatusCode::kInvalidArgument, "{}: missing object 'interconnect'", source);
  const json& ic = j.at("interconnect");
  const std::string topo = ic.value("topology", std::string("switch"));
  if (topo == "switch") {
    p.topology = Topology::kSwitch;
  } else if (topo == "torus3d") {
    p.topology = Topology::kTorus3d;
  } else {
    return errorf(StatusCode::kInvalidArgument,
                  "{}: interconnect.topology '{}' (expected switch or torus3d)", source,
                  printable_for_message(topo, 40));
  }
  auto bw = positive(ic, "bandwidth_GBps", source + ": interconnect", true, 0);
  if (!bw.ok()) return bw.status();
  p.link_Bps = *bw * 1e9;
  auto lat = positive(ic, "latency_us", source + ": interconnect", true, 0);
  if (!lat.ok()) return lat.status();
  p.collective_latency_s = *lat * 1e-6;
  if (j.contains("efficiency")) {
    const json& e = j.at("efficiency");
    const std::string where = source + ": efficiency";
    auto c = positive(e, "compute", where, false, 1.0);
    auto m = positive(e, "memory", where, false, 1.0);
    auto h = positive(e, "host_link", where, false, 1.0);
    if (!c.ok()) return c.status();
    if (!m.ok()) return m.status();
    if (!h.ok()) return h.status();
    if (*c > 1.0 || *m > 1.0 || *h > 1.0)
      return errorf(StatusCode::kInvalidArgument, "{}: efficiencies are fractions (<= 1)", where);
    p.compute_efficiency = *c;
    p.memory_efficiency = *m;
    p.host_link_efficiency = *h;
  }
  if (j.contains("attention_tflops")) {
    auto a = positive(j, "attention_tflops", source, true, 0);
    if (!a.ok()) return a.status();
    p.attention_flops = *a * 1e12;
  }
  if (j.contains("layer_overhead_us")) {
    const json& v = j.at("layer_overhead_us");
    if (!v.is_number() || v.get<double>() < 0.0)
      return errorf(StatusCode::kInvalidArgument,
                    "{}: field 'layer_overhead_us' must be a number >= 0", source);
    p.layer_overhead_s = v.get<double>() * 1e-6;
  }
  if (j.contains("fused_elementwise")) {
    const json& v = j.at("fused_elementwise");
    if (!v.is_boolean())
      return errorf(StatusCode::kInvalidArgument,
                    "{}: field 'fused_elementwise' must be true or false", source);
    p.fused_elementwise = v.get<bool>();
  }
  if (j.contains("paper_layouts")) {
    const json& v = j.at("paper_layouts");
    if (!v.is_boolean())
      return errorf(StatusCode::kInvalidArgument, "{}: field 'paper_layouts' must be true or false",
                    source);
    p.paper_layouts = v.get<bool>();
  }
  if (j.contains("collective_probes")) {
    const json& cp = j.at("collective_probes");
    auto bad = [&](const std::string& what) {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: collective_probes{}: expected {{\"<GPUs>\": {{\"all_reduce_nccl_us\": "
                    "[[bytes, us], ...], \"all_gather_nccl_us\": [...]}}}} with GPUs 2..1024 and "
                    "bytes increasing, us > 0",
                    source, what);
    };
    if (!cp.is_object()) return bad("");
    for (const auto& [key, group] : cp.items()) {
      const std::string where = "." + printable_for_message(key, 40);
      int64_t g = 0;
      for (char ch : key) {
        if (ch < '0' || ch > '9' || g > 1024) return bad(where);
        g = g * 10 + (ch - '0');
      }
      if (g < 2 || g > 1024 || !group.is_object()) return bad(where);
      HardwareProfile::CollectiveCurve curve;
      const std::pair<const char*, std::vector<std::pair<double, double>>*> fields[] = {
          {"all_reduce_nccl_us", &curve.all_reduce}, {"all_gather_nccl_us", &curve.all_gather}};
      for (const auto& [name, out] : fields) {
        if (!group.contains(name)) continue;
        const json& pts = group.at(name);
        if (!pts.is_array()) return bad(where + "." + name);
        for (const json& pt : pts) {
          if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number())
            return bad(where + "." + name);
          const double bytes = pt[0].get<double>(), us = pt[1].get<double>();
          if (!(bytes > 0.0) || !std::isfinite(bytes) || !(us > 0.0) || !std::isfinite(us) ||
              (!out->empty() && bytes <= out->back().first))
            return bad(where + "." + name);
          out->emplace_back(bytes, us * 1e-6);
        }
      }
      // all_reduce_oneshot_us (the engine's one-shot kernels) is read elsewhere: skipped here.
      p.nccl_curves[g] = std::move(curve);
    }
  }
  STRATA_RETURN_IF_ERROR(fixed_and_rate(j, "shared_device_collective", source,
                                        &p.shared_collective_fixed_s, &p.shared_collective_Bps));
  if (j.contains("moe_block_probes")) {
    const json& a = j.at("moe_block_probes");
    auto bad = [&] {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: field 'moe_block_probes' must be a list of {{\"experts\", \"k\", "
                    "\"hidden\", \"ffn\", \"tokens\": whole numbers >= 1 (k <= experts), "
                    "\"us\": > 0, optionally \"weights\": bf16|int8|fp8}}",
                    source);
    };
    if (!a.is_array()) return bad();
    for (const json& e : a) {
      if (!e.is_object()) return bad();
      HardwareProfile::MoeBlockProbe m;
      if (!probe_fields(e,
                        {{"experts", &m.experts},
                         {"k", &m.k},
                         {"hidden", &m.hidden},
                         {"ffn", &m.ffn},
                         {"tokens", &m.tokens}},
                        &m.seconds) ||
          m.k > m.experts) {
        return bad();
      }
      if (e.contains("weights")) {
        if (!e.at("weights").is_string()) return bad();
        auto f = parse_weight_format(e.at("weights").get<std::string>());
        if (!f.ok()) return f.status().with_context(source + ": moe_block_probes");
        m.weights = *f;
      }
      p.moe_block_probes.push_back(m);
    }
  }
  if (j.contains("decode_attention_probes")) {
    const json& a = j.at("decode_attention_probes");
    auto bad = [&] {
      return errorf(StatusCode::kInvalidArgument,
                    "{}: field 'decode_attention_probes' must be a list of {{\"seqs\", "
                    "\"kv_len\", \"kv_heads\", \"head_dim\": whole numbers >= 1, \"us\": > 0}}",
                    source);
    };
    if (!a.is_array()) return bad();
    for (const json& e : a) {
      if (!e.is_object()) return bad();
      HardwareProfile::DecodeAttentionProbe d;
      if (!probe_fields(e,
                        {{"seqs", &d.seqs},
                         {"kv_len", &d.kv_len},
                         {"kv_heads", &d.kv_heads},
                         {"head_dim", &d.head_dim}},
                        &d.seconds)) {
        return bad();
      }
      p.decode_attention_probes.push_back(d);
    }
  }
  STRATA_RETURN_IF_ERROR(
      fixed_and_rate(j, "moe_exchange", source, &p.moe_exchange_fixed_s, &p.moe_exchange_Bps));
  if (j.contains("gemm_tflops")) {
    for (const auto& [key, curve] : j.at("gemm_tflops").items()) {
      auto f = parse_weight_format(key);
      if (!f.ok()) return f.status().with_context(source + ": gemm_tflops");
      std::vector<std::pair<double, double>> points;
      if (!curve.is_array() || curve.empty())
        return errorf(StatusCode::kInvalidArgument,
                      "{}: gemm_tflops.{} must be a non-empty array of [tokens, TFLOP/s]", source,
                      key);
      for (const json& pt : curve) {
        if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number() ||
            pt[0].get<double>() < 1.0 || pt[1].get<double>() <= 0.0)
          return errorf(StatusCode::kInvalidArgument,
                        "{}: gemm_tflops.{}: each point is [tokens >= 1, TFLOP/s > 0]", source,
                        key);
        if (!points.empty() && pt[0].get<double>() <= points.back().first)
          return errorf(StatusCode::kInvalidArgument,
                        "{}: gemm_tflops.{}: token counts must increase", source, key);
        points.emplace_back(pt[0].get<double>(), pt[1].get<double>() * 1e12);
      }
      p.gemm_curve[*f] = std::move(points);
    }
  }
  return p;
}

}  // namespace

std::vector<std::string> shipped_profile_names() {
  std::vector<std::string> names;
  for (const EmbeddedProfile& e : embedded_profiles()) names.emplace_back(e.name);
  return names;
}

Result<HardwareProfile> load_hardware_profile(const std::string& name_or_path) {
  for (const EmbeddedProfile& e : embedded_profiles()) {
    if (name_or_path == e.name) return parse_hardware_profile(e.json, std::string(e.name));
  }
  std::ifstream in(name_or_path);
  if (!in) {
    std::string names;
    for (const std::string& n : shipped_profile_names()) names += (names.empty() ? "" : ", ") + n;
    return errorf(StatusCode::kNotFound,
                  "--profile '{}': not a shipped profile ({}) and not a readable file",
                  name_or_path, names);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hardware_profile(ss.str(), name_or_path);
}

}  // namespace strata::planner
