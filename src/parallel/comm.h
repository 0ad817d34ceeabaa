// Communicator: the collectives tensor-parallel inference needs, behind one interface with a
// single-rank, an MPI (CPU) and later an NCCL (GPU) implementation. Every collective is an
// explicit call in a model's forward pass; nothing communicates behind the caller's back.
#pragma once

#include <cstdint>
#include <memory>

#include "strata/status.h"

namespace strata {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;  // "single", "mpi", "nccl"

  // data[0..n) = sum over ranks of data[0..n), in place.
  virtual Status all_reduce_sum(float* data, int64_t n) = 0;
  // recv[r * n_per_rank + i] = send_of_rank_r[i]; recv holds size() * n_per_rank floats.
  virtual Status all_gather(const float* send, int64_t n_per_rank, float* recv) = 0;
  virtual Status broadcast(void* data, int64_t bytes, int root) = 0;
  virtual Status barrier() = 0;
};

// One rank: every collective is the identity.
std::unique_ptr<Communicator> make_single_rank_communicator();

// All ranks of MPI_COMM_WORLD (initializes MPI if needed; finalizes when the last MPI
// communicator is destroyed). Unimplemented when strata was built without MPI.
Result<std::unique_ptr<Communicator>> make_mpi_communicator();

// True when this process was started by an MPI launcher with more than one rank.
bool launched_under_mpi();

}  // namespace strata
