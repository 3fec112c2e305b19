// The NCCL communicators of a tensor-parallel CUDA backend (device_communicator.h). The all-reduce is a reduce-scatter
// and an all-gather, both as NCCL sends and receives: rank j adds slice j of every rank's values in rank order, then
// hands its sum to the others. That moves what a ring all-reduce moves, 2 (N-1)/N of the values per rank.
#include "backend/cuda/device_communicator.h"

#include "core/error.h"

#ifdef JAMBO_WITH_NCCL
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#endif

namespace jambo::backend::cuda {

#ifdef JAMBO_WITH_NCCL
namespace {

[[noreturn]] void fail_nccl(ncclResult_t status, const char* call, const char* file, int line) {
  fail("{}:{}: {} failed: {} ({}){}", file, line, call, ncclGetErrorString(status), int(status),
       status == ncclSystemError || status == ncclUnhandledCudaError
           ? "; NCCL_DEBUG=WARN prints NCCL's own account of it"
           : "");
}

#define JAMBO_NCCL_CHECK(call)                                                        \
  do {                                                                                \
    const ncclResult_t jambo_status_ = (call);                                        \
    if (jambo_status_ != ncclSuccess) fail_nccl(jambo_status_, #call, __FILE__, __LINE__); \
  } while (0)

// The communicators of one group: an abort ends them all (ncclCommAbort), and an aborted one is not destroyed again.
struct NcclGroup {
  std::vector<ncclComm_t> comms;  // [size]
  std::once_flag aborted_once;
  std::atomic<bool> aborted{false};

  void abort() {
    std::call_once(aborted_once, [&] {
      aborted = true;
      for (ncclComm_t comm : comms) ncclCommAbort(comm);
    });
  }
};

class NcclCommunicator final : public DeviceCommunicator {
 public:
  NcclCommunicator(std::shared_ptr<NcclGroup> group, int64_t rank)
      : group_(std::move(group)),
        comm_(group_->comms[size_t(rank)]),
        rank_(rank),
        size_(int64_t(group_->comms.size())) {}
  ~NcclCommunicator() override {
    const DeviceScope scope(device());
    received_ = {};
    if (!group_->aborted) ncclCommDestroy(comm_);
  }

  int64_t rank() const override { return rank_; }
  int64_t size() const override { return size_; }
  int device() const override { return int(rank_); }
  bool capturable() const override { return true; }
  void release_scratch() override { received_ = {}; }
  void abort() override { group_->abort(); }

  void all_reduce_sum(float* values, int64_t count, cudaStream_t stream) override {
    if (size_ == 1 || count == 0) return;
    const int64_t chunk = (count + size_ - 1) / size_;
    const auto first = [&](int64_t rank) { return std::min(rank * chunk, count); };
    const auto length = [&](int64_t rank) { return std::min(chunk, count - first(rank)); };
    float* received = received_.reserve(size_ * chunk);  // [size, chunk] each rank's slice `rank_` of its values
    exchange([&](int64_t peer) {
      if (length(peer) > 0) send(values + first(peer), length(peer), peer, stream);
      if (length(rank_) > 0) receive(received + peer * chunk, length(rank_), peer, stream);
    });
    RankParts parts;
    parts.num_parts = size_;
    for (int64_t r = 0; r < size_; ++r) parts.parts[r] = r == rank_ ? values + first(rank_) : received + r * chunk;
    sum_in_rank_order(parts, values + first(rank_), length(rank_), stream);
    exchange([&](int64_t peer) {
      if (length(rank_) > 0) send(values + first(rank_), length(rank_), peer, stream);
      if (length(peer) > 0) receive(values + first(peer), length(peer), peer, stream);
    });
  }

 private:
  // One group of point-to-point calls with every other rank: NCCL runs them together, so no order can deadlock.
  template <typename WithPeer>
  void exchange(const WithPeer& with_peer) {
    JAMBO_NCCL_CHECK(ncclGroupStart());
    for (int64_t peer = 0; peer < size_; ++peer)
      if (peer != rank_) with_peer(peer);
    JAMBO_NCCL_CHECK(ncclGroupEnd());
  }
  void send(const float* values, int64_t count, int64_t peer, cudaStream_t stream) {
    JAMBO_NCCL_CHECK(ncclSend(values, size_t(count), ncclFloat32, int(peer), comm_, stream));
  }
  void receive(float* values, int64_t count, int64_t peer, cudaStream_t stream) {
    JAMBO_NCCL_CHECK(ncclRecv(values, size_t(count), ncclFloat32, int(peer), comm_, stream));
  }

  std::shared_ptr<NcclGroup> group_;
  ncclComm_t comm_;
  int64_t rank_, size_;
  DeviceBuffer<float> received_;  // [size, chunk]
};

}  // namespace

bool nccl_available() { return true; }

std::vector<std::unique_ptr<DeviceCommunicator>> make_nccl_group(int64_t size) {
  JAMBO_REQUIRE(size >= 1 && size <= kMaxRanks, "an NCCL group takes 1 to {} ranks, got {}", kMaxRanks, size);
  int num_devices = 0;
  JAMBO_CUDA_CHECK(cudaGetDeviceCount(&num_devices));
  JAMBO_REQUIRE(num_devices >= size,
                "{} tensor-parallel ranks need {} GPUs, one each, and {} are visible (check nvidia-smi and "
                "CUDA_VISIBLE_DEVICES)",
                size, size, num_devices);
  // NVLink multicast (NVLS) can take GPUs of a shared host out of service, and the sends and receives never need it:
  // off unless the environment says otherwise.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  auto shared = std::make_shared<NcclGroup>();
  shared->comms.resize(size_t(size));
  std::vector<int> devices(static_cast<size_t>(size));
  for (int64_t rank = 0; rank < size; ++rank) devices[size_t(rank)] = int(rank);
  JAMBO_NCCL_CHECK(ncclCommInitAll(shared->comms.data(), int(size), devices.data()));
  std::vector<std::unique_ptr<DeviceCommunicator>> group;
  for (int64_t rank = 0; rank < size; ++rank) group.push_back(std::make_unique<NcclCommunicator>(shared, rank));
  return group;
}

#else

bool nccl_available() { return false; }

std::vector<std::unique_ptr<DeviceCommunicator>> make_nccl_group(int64_t) {
  fail("tensor parallelism on the CUDA backend needs NCCL, and this build has none: build where nccl.h and libnccl "
       "are found (CMake's NCCL_ROOT, e.g. the nvidia/nccl folder of a PyTorch install)");
}

#endif

}  // namespace jambo::backend::cuda
