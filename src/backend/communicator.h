// Collectives among the ranks of a tensor-parallel backend, one communicator per rank. A sum is taken in rank order
// (((rank 0 + rank 1) + rank 2) + ...) on every rank, so every rank holds the same bits whatever the timing.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
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
  // Ends the group: every rank's collective in progress, and each one after, throws jambo::Error. For a rank that
  // failed mid-step, so that the others do not wait for it forever. Any rank may call it, from any thread.
  virtual void abort() = 0;
};

// A barrier of `size` threads that can be aborted: once abort() was called, arrive_and_wait throws jambo::Error on
// every thread waiting and on each that comes after.
class GroupBarrier {
 public:
  explicit GroupBarrier(int64_t size) : size_(size) {}
  void arrive_and_wait();
  void abort();

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t size_, num_arrived_ = 0, generation_ = 0;
  bool aborted_ = false;
};

// Communicators for `size` threads of one process, rank r for the thread that runs rank r.
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int64_t size);

}  // namespace jambo::backend
