// Prometheus text exposition (format 0.0.4) of ServingMetrics, with vLLM-like metric names under
// the `strata:` prefix.
#pragma once

#include <string>

#include "strata/serving.h"

namespace strata::server {

std::string render_metrics(const ServingMetrics& m, const std::string& model_name);

}  // namespace strata::server
