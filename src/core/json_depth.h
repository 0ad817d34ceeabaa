// A guard run before parsing untrusted JSON (HTTP request bodies, the hub's API answers):
// nlohmann's parser keeps its own stack, but copying, comparing or dumping a value recurses once
// per level, so a document nested ~100,000 levels deep would overflow a thread's stack in the
// code that reads it.
#pragma once

#include <string_view>

namespace strata {

// Whether the JSON text opens more than `max_depth` arrays/objects at once (a byte scan that
// skips strings; run before parsing, so it also bounds the parser).
bool json_too_deep(std::string_view s, int max_depth);

}  // namespace strata
