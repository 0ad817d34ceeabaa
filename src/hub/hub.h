// The hub resolver: a HubId to a local path through the Hugging Face cache, downloading what is
// missing unless offline. Cache layout (huggingface_hub's):
//   <cache>/models--ORG--NAME/refs/REVISION          the commit sha a branch or tag points at
//   <cache>/models--ORG--NAME/snapshots/SHA/FILE     relative symlink to ../../blobs/ETAG
//   <cache>/models--ORG--NAME/blobs/ETAG             the content (ETAG: LFS sha256 or git blob id)
//   <cache>/models--ORG--NAME/blobs/ETAG.incomplete  a partial download, resumed by Range
//   <cache>/models--ORG--NAME/.no_exist/SHA/FILE     the revision has no such (optional) file
//   <cache>/.locks/models--ORG--NAME/ETAG.lock       flock'ed while a blob downloads
#pragma once

#include <string>

#include "hub/hub_metadata.h"
#include "strata/hub.h"

namespace strata::hub {

std::string repo_folder_name(const std::string& repo);  // models--org--name

Result<std::string> resolve(const HubId& id, const HubOptions& options);

}  // namespace strata::hub
