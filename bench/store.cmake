# Store benchmarks (bench/store/): the store-load rendezvous load generator; run.sh runs it
# and PyTorch's tcpstore_bench.py anchor against torch's server and ddp-store-server.
add_executable(store-load ${CMAKE_CURRENT_SOURCE_DIR}/store/store_load.cpp)
target_link_libraries(store-load PRIVATE ddp_store_server ddp_warnings)

add_custom_target(bench-store
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/store/run.sh ${PROJECT_BINARY_DIR}
  DEPENDS store-load ddp-store-server
  USES_TERMINAL
  COMMENT "store benchmarks (bench/store/run.sh)")
