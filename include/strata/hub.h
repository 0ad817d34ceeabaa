// Models by Hugging Face Hub id: `-m org/name[@REVISION][:FILE.gguf]` resolves through the local
// Hugging Face cache (the layout huggingface_hub writes, so either tool reuses the other's
// downloads) and, unless offline, downloads what is missing from the hub (HF_ENDPOINT).
#pragma once

#include <string>

#include "strata/status.h"

namespace strata {

struct HubOptions {
  // HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
  // ~/.cache/huggingface/hub.
  std::string cache_dir;
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT
  std::string token;      // HF_TOKEN, else the file $HF_TOKEN_PATH or $HF_HOME/token
  bool offline = false;   // HF_HUB_OFFLINE=1 (or --offline): never touch the network
  double timeout_s = 10;  // HF_HUB_DOWNLOAD_TIMEOUT: connect timeout and longest stall, seconds
  bool progress = true;   // a progress bar on stderr (a line per file when it is not a terminal)
};

HubOptions hub_options_from_env();

// Whether `model` has the hub-id form org/name[@REVISION][:FILE.gguf] (syntax only).
bool is_hub_model_id(const std::string& model);

// The local path strata opens for a -m argument: an existing file or directory, or a strata
// alias (smollm2, gemma3-270m), is returned unchanged (they win over hub ids); a hub id is the
// folder (or .gguf file) of its snapshot in the cache, downloaded first where files are missing
// and the network is allowed. Anything else is returned unchanged (opening it reports the error).
Result<std::string> resolve_model_location(const std::string& model, const HubOptions& options);

}  // namespace strata
