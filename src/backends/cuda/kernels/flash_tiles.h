// Tile shapes of flash_prefill (kernels/flash_prefill.cu), for the tests (every shape must be
// correct, whatever the automatic choice) and bench_attention (which shape is fastest on this
// GPU). Host-only header.
#pragma once

#include "backends/cuda/launch_ctx.h"
#include "backends/kernel_params.h"
#include "strata/status.h"

namespace strata::cuda {

// kW<warps>M<query rows>N<keys per K/V tile>; a warp owns 16 or 32 query rows.
enum class FlashPrefillTile {
  kAuto,       // what flash_prefill picks
  kW4M64N64,   // 4 warps x 16 rows: Q fragments in registers; for small grids
  kW8M128N64,  // 8 warps x 16 rows
  kW4M128N32,  // 4 warps x 32 rows: half the shared-memory reads per MMA
  kW4M128N64,  // 4 warps x 32 rows, 64-key tiles (ptxas spills a few registers at d = 128)
};

// flash_prefill with a given tile shape (head_dim 64 / 128; other head dims and unaligned
// arguments still take the generic kernel).
Status flash_prefill_tile(const LaunchCtx& ctx, const VarlenAttentionParams& p,
                          FlashPrefillTile tile);

}  // namespace strata::cuda
