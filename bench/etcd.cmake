# The etcd rendezvous backend's primitives against a real etcd member, with ddprun's TCP
# store as the anchor in the same run (bench/etcd/etcd_bench.cpp, bench/etcd/run.sh).
add_executable(etcd-bench ${CMAKE_CURRENT_SOURCE_DIR}/etcd/etcd_bench.cpp)
target_include_directories(etcd-bench PRIVATE ${PROJECT_SOURCE_DIR}/tests/rendezvous ${PROJECT_SOURCE_DIR}/tests/common)
target_link_libraries(etcd-bench PRIVATE ddprun_rdzv_etcd ddp_store_server ddp_core fmt::fmt-header-only ddp_warnings)

add_custom_target(bench-etcd
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/etcd/run.sh ${PROJECT_BINARY_DIR}
  DEPENDS etcd-bench
  USES_TERMINAL
  COMMENT "etcd backend benchmark (bench/etcd/run.sh)")
