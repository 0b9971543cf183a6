# Every dependency comes from a Debian package (scripts/setup.sh installs them).
find_package(Threads REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(Boost 1.74 REQUIRED)  # Asio and Beast are header-only
# https to etcd, inside the etcd transport plugin (src/rendezvous/etcd/transport.hpp), so
# ddprun itself neither loads nor relocates OpenSSL. Static by default: the plugin then
# loads no second and third library when a job uses etcd.
option(DDP_STATIC_OPENSSL "Link OpenSSL statically into the etcd transport plugin" ON)
set(OPENSSL_USE_STATIC_LIBS ${DDP_STATIC_OPENSSL})
find_package(OpenSSL 3 REQUIRED)

set(DDP_HAVE_NCCL OFF)
if(DDP_WITH_NCCL)
  if(NOT CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  find_package(NCCL QUIET)
  if(CUDAToolkit_FOUND AND NCCL_FOUND)
    set(DDP_HAVE_NCCL ON)
    message(STATUS "NCCL backend: CUDA ${CUDAToolkit_VERSION}, NCCL ${NCCL_LIBRARY}")
  else()
    message(STATUS "NCCL backend: off (CUDA toolkit or NCCL not found)")
  endif()
endif()

if(DDP_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
