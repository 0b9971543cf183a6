// CUDA helpers for the NCCL backend, usable without CUDA headers (device memory as void*).
// When libddp is built without CUDA/NCCL, nccl_available() is false, cuda_device_count()
// is 0 and the rest throw CollectiveError.
#pragma once

#include <cstddef>

namespace ddp {

// True when libddp was built with the NCCL backend.
bool nccl_available();

// Number of usable CUDA devices; 0 when there is no GPU/driver or no CUDA in this build
// (never throws).
int cuda_device_count();

// Owning device allocation on one CUDA device (RAII; move-only).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, int device);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  int device() const { return device_; }
  // Copies of n bytes at byte offset `offset`, complete when they return (so a collective on
  // the group's stream sees the data), and zero-filling, also complete when it returns.
  void copy_from_host(const void* src, size_t n, size_t offset = 0);
  void copy_to_host(void* dst, size_t n, size_t offset = 0) const;
  void fill_zero();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  int device_ = -1;
};

}  // namespace ddp
