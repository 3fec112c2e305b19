// Collectives among the ranks of a tensor-parallel backend, one communicator per rank. A sum is taken in rank order
// (((rank 0 + rank 1) + rank 2) + ...) on every rank, so every rank holds the same bits whatever the timing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace jambo::backend {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  // Every rank passes values of the same length and gets, in each entry, the sum over ranks in rank order. Blocks
  // until every rank has called it.
  virtual void all_reduce_sum(std::span<float> values) = 0;
};

// Communicators for `size` threads of one process, rank r for the thread that runs rank r.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int64_t size);

}  // namespace jambo::backend
