// Built when CUDA or NCCL is missing: the NCCL API exists but reports its absence.
#include "backends.hpp"
#include "ddp/error.hpp"
#include "ddp/nccl.hpp"

namespace ddp {

namespace {
[[noreturn]] void absent(const char* what) {
  throw CollectiveError(std::string(what) +
                        ": this libddp was built without CUDA/NCCL (DDP_HAVE_NCCL off)");
}
}  // namespace

bool nccl_available() { return false; }
int cuda_device_count() { return 0; }

DeviceBuffer::DeviceBuffer(size_t, int) { absent("DeviceBuffer"); }
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), device_(o.device_) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&&) noexcept { return *this; }
void DeviceBuffer::copy_from_host(const void*, size_t, size_t) { absent("DeviceBuffer"); }
void DeviceBuffer::copy_to_host(void*, size_t, size_t) const { absent("DeviceBuffer"); }
void DeviceBuffer::fill_zero() { absent("DeviceBuffer"); }

namespace detail {
std::unique_ptr<ProcessGroup> make_nccl_group(const ProcessGroupOptions&) {
  absent("Backend::kNccl");
}
}  // namespace detail

}  // namespace ddp
