// The command-line spellings of the typed engine configuration (include/strata/engine.h),
// parsed once at the CLI so nothing below apps/ compares strings.
#include <charconv>
#include <string>

#include "core/status.h"
#include "strata/engine.h"

namespace strata {

Result<DeviceSpec> parse_device(std::string_view text) {
  if (text == "cpu") return DeviceSpec::cpu();
  if (text == "cuda") return DeviceSpec::cuda(0);
  if (text.substr(0, 5) == "cuda:" && text.size() > 5) {
    int index = -1;
    const char* end = text.data() + text.size();
    const auto [p, ec] = std::from_chars(text.data() + 5, end, index);
    if (ec == std::errc() && p == end && index >= 0) return DeviceSpec::cuda(index);
  }
  return errorf(StatusCode::kInvalidArgument, "--device '{}': use cpu, cuda or cuda:N", text);
}

Result<Quantization> parse_quantization(std::string_view text) {
  if (text.empty() || text == "none" || text == "bf16") return Quantization::kNone;
  if (text == "int8") return Quantization::kInt8;
  if (text == "fp8") return Quantization::kFp8;
  if (text == "q8_0") return Quantization::kQ8_0;
  if (text == "q4_0") return Quantization::kQ4_0;
  if (text == "q4_k") return Quantization::kQ4_K;
  if (text == "q5_k") return Quantization::kQ5_K;
  if (text == "q6_k") return Quantization::kQ6_K;
  return errorf(StatusCode::kInvalidArgument,
                "--quantization '{}': use none, int8, fp8, or (random weights) q8_0, q4_0, q4_k, "
                "q5_k, q6_k",
                text);
}

DType quantization_dtype(Quantization q) {
  switch (q) {
    case Quantization::kNone:
      return DType::kBF16;
    case Quantization::kInt8:
      return DType::kI8;
    case Quantization::kFp8:
      return DType::kFP8E4M3;
    case Quantization::kQ8_0:
      return DType::kQ8_0;
    case Quantization::kQ4_0:
      return DType::kQ4_0;
    case Quantization::kQ4_K:
      return DType::kQ4_K;
    case Quantization::kQ5_K:
      return DType::kQ5_K;
    case Quantization::kQ6_K:
      return DType::kQ6_K;
  }
  return DType::kBF16;
}

Result<LoadFormat> parse_load_format(std::string_view text) {
  if (text == "auto") return LoadFormat::kAuto;
  if (text == "dummy") return LoadFormat::kDummy;
  return errorf(StatusCode::kInvalidArgument, "--load-format '{}': use auto or dummy", text);
}

Result<WeightOffload> parse_weight_offload(std::string_view text) {
  if (text == "auto") return WeightOffload::kAuto;
  if (text == "cpu") return WeightOffload::kCpu;
  if (text == "disk") return WeightOffload::kDisk;
  return errorf(StatusCode::kInvalidArgument, "--offload-weights '{}': use auto, cpu or disk",
                text);
}

std::string_view to_string(WeightOffload o) {
  switch (o) {
    case WeightOffload::kAuto:
      return "auto";
    case WeightOffload::kCpu:
      return "cpu";
    case WeightOffload::kDisk:
      return "disk";
  }
  return "?";
}

std::string to_string(const DeviceSpec& d) {
  switch (d.type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return "cuda:" + std::to_string(d.index);
  }
  return "?";
}

std::string_view to_string(Quantization q) {
  switch (q) {
    case Quantization::kNone:
      return "none";
    case Quantization::kInt8:
      return "int8";
    case Quantization::kFp8:
      return "fp8";
    default:
      return dtype_name(quantization_dtype(q));
  }
}

}  // namespace strata
