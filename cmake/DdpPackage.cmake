# CPack: Debian packages from the install components (cd build && cpack -G DEB).
#   ddprun_<version>_amd64.deb       ddprun, ddp-store-server, ddprun(1), completions, examples
#   libddp0_<version>_amd64.deb      the shared library workers link
#   libddp-dev_<version>_amd64.deb   headers and the CMake package (find_package(ddp))
# Depends come from dpkg-shlibdeps. A libddp built with NCCL also needs NVIDIA's CUDA runtime
# and NCCL, which Debian does not ship: that libddp0 depends on NVIDIA's package names, and
# packages meant for a plain Debian system are built with -DDDP_WITH_NCCL=OFF.
set(CPACK_PACKAGE_NAME ddprun)
set(CPACK_PACKAGE_VENDOR "The ddprun authors")
set(CPACK_PACKAGE_CONTACT "The ddprun authors <ddprun@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "launcher for distributed PyTorch training, a drop-in for torchrun")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)
set(CPACK_STRIP_FILES ON)
set(CPACK_COMPONENTS_ALL ddprun libddp dev)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)

set(CPACK_COMPONENT_DDPRUN_DESCRIPTION
  "launcher for distributed PyTorch training, a drop-in for torchrun
 ddprun starts the workers of a distributed training job with torchrun's environment,
 hosts the TCP rendezvous store that PyTorch clients use, forwards every worker's output
 tagged by rank and stops the whole job cleanly on the first failure. It works as a
 container's entrypoint (PID 1) and under Slurm.")
set(CPACK_DEBIAN_DDPRUN_PACKAGE_NAME ddprun)
set(CPACK_DEBIAN_DDPRUN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_DDPRUN_PACKAGE_RECOMMENDS "python3")

set(CPACK_COMPONENT_LIBDDP_DESCRIPTION
  "collectives library for ddprun workers
 libddp lets a C++ worker started by ddprun or torchrun join the job from its environment
 and all-reduce over shared memory, TCP or NCCL.")
set(CPACK_DEBIAN_LIBDDP_PACKAGE_NAME libddp${PROJECT_VERSION_MAJOR})
set(CPACK_DEBIAN_LIBDDP_PACKAGE_SECTION libs)
if(DDP_HAVE_NCCL)
  set(CPACK_DEBIAN_LIBDDP_PACKAGE_DEPENDS
    "libnccl2, cuda-cudart-${CUDAToolkit_VERSION_MAJOR}-${CUDAToolkit_VERSION_MINOR}")
endif()

set(CPACK_COMPONENT_DEV_DESCRIPTION
  "collectives library for ddprun workers (development files)
 Headers and the CMake package of libddp: find_package(ddp) and link ddp::ddp.")
set(CPACK_COMPONENT_DEV_DEPENDS libddp)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libddp-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_ARCHITECTURE amd64)
include(CPack)
