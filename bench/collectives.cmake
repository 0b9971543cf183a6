# ddp-bench: all_reduce bandwidth/latency like nccl-tests' all_reduce_perf (build/bin/ddp-bench).
add_executable(ddp-bench ${CMAKE_CURRENT_LIST_DIR}/ddp-bench/main.cpp)
target_link_libraries(ddp-bench PRIVATE ddp ddp_warnings)
target_include_directories(ddp-bench PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ddp-bench)

# The NCCL anchor: a bare ncclAllReduce loop (only where CUDA and NCCL are found).
if(DDP_HAVE_NCCL)
  add_executable(nccl-raw-bench ${CMAKE_CURRENT_LIST_DIR}/ddp-bench/nccl_raw.cpp)
  target_link_libraries(nccl-raw-bench PRIVATE CUDA::cudart NCCL::nccl)
endif()
