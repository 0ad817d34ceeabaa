// The shipped hardware profiles (src/planner/profiles/*.json), embedded at build time by
// CMakeLists.txt so `strata plan --profile h100` works from any directory.
#pragma once

#include <string>
#include <vector>

namespace strata::planner {

struct EmbeddedProfile {
  const char* name;  // the file name without .json
  const char* json;
};

const std::vector<EmbeddedProfile>& embedded_profiles();

}  // namespace strata::planner
