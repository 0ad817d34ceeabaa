// Weight streaming at run time (ZeRO-Inference; issue 13): the LayerWeightHook Model::forward
// calls around each layer. Streamed layers are items of an endless sequence (item n = streamed
// layer n % K, one forward pass consumes K items in order); item n is copied into its layer's
// fixed slot once the slot's previous item has run, at most n_slots items ahead of the layer that
// computes (prefetch), or just before its layer runs (prefetch off). On a GPU the copies run on a
// copy stream ordered by events (WeightCopier), so layer i + 1's copy overlaps layer i's compute;
// on the CPU a copy thread plays the copy stream, so CI runs the same bookkeeping with copies
// that overlap the compute.
//
// Partitioned fetch (ZeRO-Inference Sec. VI; data-parallel replicas that run the same layer
// sequence): with a fetch group of N ranks, each S-byte blob is fetched in up to P pieces
// (fetch_pieces(); P from --fetch-pieces / STRATA_FETCH_PIECES, default 4). In piece j rank r
// copies only its 1/N of the piece from host memory into the same offsets of its slot, then an
// in-place all-gather over the group brings the peers' parts of the piece. The copies run on the
// copy stream, the all-gathers on a gather stream of their own (WeightCopier::gather), each
// after its piece's copy, so piece j's all-gather over the peer links runs while piece j + 1
// (or the next layer's first piece) crosses the host link; the slot is ready after the last
// piece's all-gather. (With one piece on the copy stream, the old schedule, the host link idled
// during every layer's all-gather: ~1/5 of the time on two H200s.) Every host link carries 1/N
// of the layer; the all-gathers ride the GPUs' peer links. The item sequence and the pieces are
// the same on every rank, so the gathers pair up; a replica with no work in a step still runs
// the streamer's hooks (Executor::stream_pass). On the disk tier every rank still reads and
// packs the whole layer (the host-to-device copy is partitioned).
//
// Disk tier: reader threads (two reads in flight) read each item's ranges of the checkpoint file
// with O_DIRECT into aligned buffers, pack the blob into one of three pinned staging buffers (the
// host conversions of the upload), and the copy to the slot takes it from there; a staging buffer
// is reused only after its copy finished.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "memory/streamed_weights.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "runtime/device_runtime.h"

namespace strata {

struct StreamStats {
  int64_t passes = 0;
  int64_t layers = 0;          // layer copies issued
  int64_t bytes = 0;           // bytes copied into slots from host memory by this rank
  int64_t gathered_bytes = 0;  // partitioned fetch: bytes of the slots the peers' parts filled
  int fetch_parts = 1;         // ranks sharing each layer's fetch (1: the whole layer here)
  int fetch_pieces = 1;        // partitioned fetch: the most pieces (all-gathers) per layer
  int64_t gathers = 0;         // partitioned fetch: all-gathers issued (pieces of layers)
  double disk_wait_s = 0.0;    // the forward pass waiting for the disk readers
  int64_t disk_bytes = 0;      // bytes read from the checkpoint files
  bool direct_io = false;      // the reads used O_DIRECT
  int64_t bytes_per_pass = 0;  // the streamed layers' blobs
  int64_t slot_bytes = 0;      // all slots together (device memory)
};

// A rank's part of a partitioned fetch of `bytes` over n ranks (256-byte aligned).
size_t part_bytes(size_t bytes, int n);

// Partitioned fetch in pieces: a blob of `bytes` is fetched as up to `pieces` consecutive
// pieces, each an in-place all-gather of its own. Piece j covers slot bytes
// [offset, offset + n * part): rank r copies host bytes [offset + r part, offset + (r + 1) part)
// clipped to the blob (fetch_piece_range) into the same offsets of its slot, then the piece's
// all-gather of `part` bytes per rank fills in the rest, while the next piece's copy runs.
// Every piece but the last has part = part_bytes(bytes, n * pieces); the last one may be
// shorter (part_bytes of what is left over n ranks), and there are fewer pieces than asked when the
// blob is small (at least one; a piece's part is a multiple of 256 bytes, never 0 unless the
// blob is empty). The pieces end at the blob rounded up to n x 256 bytes, where the slots end
// (ResidencyOptions::fetch_parts). With pieces = 1 this is the whole-layer fetch: one piece,
// part = part_bytes(bytes, n).
struct FetchPiece {
  size_t offset = 0;  // in the blob and the slot; a multiple of n x 256
  size_t part = 0;    // bytes per rank (a multiple of 256)
};
std::vector<FetchPiece> fetch_pieces(size_t bytes, int n, int pieces);

// The blob bytes [begin, end) rank r of n copies for `piece` (empty past the blob's end).
struct ByteRange {
  size_t begin = 0, end = 0;
};
ByteRange fetch_piece_range(const FetchPiece& piece, size_t bytes, int rank);

// The pieces per layer a partitioned fetch uses: `requested` when > 0, else the environment's
// STRATA_FETCH_PIECES when set (> 0), else kDefaultFetchPieces.
constexpr int kDefaultFetchPieces = 4;
int resolve_fetch_pieces(int requested);

class WeightStreamer final : public LayerWeightHook {
 public:
  static Result<std::unique_ptr<WeightStreamer>> create(std::shared_ptr<StreamedWeights> weights,
                                                        DeviceRuntime& runtime, bool prefetch,
                                                        Communicator* fetch_group = nullptr,
                                                        int fetch_pieces = 0);
  ~WeightStreamer() override;

  Status begin_pass(int64_t first_layer, int64_t last_layer) override;
  Status before_layer(int64_t layer) override;
  Status after_layer(int64_t layer) override;

  StreamStats stats() const;
  const StreamedWeights& weights() const { return *w_; }
  bool prefetch() const { return prefetch_; }

 private:
  WeightStreamer() = default;
  Status issue(int64_t item);
  Status pump();
  Status start_readers();
  void reader_loop();
  Status read_item(int64_t item, uint8_t* raw, uint8_t* blob);

  std::shared_ptr<StreamedWeights> w_;
  std::unique_ptr<WeightCopier> copier_;
  Communicator* group_ = nullptr;  // partitioned fetch (null: whole layers)
  int pieces_ = 1;                 // partitioned fetch: the most pieces a layer is fetched in
  bool prefetch_ = true;
  int64_t K_ = 0;  // streamed layers
  int S_ = 0;      // slots
  int64_t issued_ = 0, consumed_ = 0;
  std::vector<int64_t> slot_owner_;  // the last item copied into each slot (-1: none)
  StreamStats stats_;

  // Disk tier.
  static constexpr int kStaging = 3;
  static constexpr int kReaders = 2;
  std::vector<int> fds_;
  bool direct_ = false;
  std::vector<Buffer> staging_;
  std::vector<std::thread> readers_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int64_t next_read_ = 0;       // the next item a reader claims
  int64_t released_ = 0;        // items whose staging buffer the copy has taken (in order)
  std::vector<int64_t> ready_;  // per staging buffer: the item it holds, packed (-1: none)
  Status reader_error_;
  int64_t disk_bytes_ = 0;
};

}  // namespace strata
