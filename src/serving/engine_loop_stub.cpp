// TEMPORARY STUB from the `server` branch — DELETE THIS FILE when the serving engine is merged.
//
// It lets the `strata` binary link before the real ServingEngine::create exists; `strata serve`
// then listens, answers /health with 503, and exits with "engine unavailable" once loading fails.
// Declared weak so that a real definition linked alongside it wins.
#include "strata/serving.h"

namespace strata {

__attribute__((weak)) Result<std::unique_ptr<ServingEngine>> ServingEngine::create(const ServingConfig&) {
  return Status(StatusCode::kUnimplemented,
                "serving engine unavailable: this build has only src/serving/engine_loop_stub.cpp");
}

}  // namespace strata
