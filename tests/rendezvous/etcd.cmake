# The etcd backend against real etcd members (Debian's etcd-server). One ctest per group of
# members, so each group starts once per process: one member, three members, TLS.
add_executable(test_etcd_backend ${CMAKE_CURRENT_LIST_DIR}/test_etcd_backend.cpp)
target_include_directories(test_etcd_backend PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(test_etcd_backend PRIVATE ddprun_rdzv_etcd fmt::fmt-header-only GTest::gtest_main ddp_warnings)

foreach(group
    "one:EtcdOne/*:EtcdRun.*:EtcdOptions.*"
    "three:EtcdThree/*:EtcdCluster3.*"
    "tls:EtcdTls.*")
  string(REPLACE ":" ";" parts "${group}")
  list(POP_FRONT parts name)
  string(REPLACE ";" ":" filter "${parts}")
  add_test(NAME rendezvous.etcd.${name}
    COMMAND test_etcd_backend --gtest_filter=${filter} --gtest_brief=1)
  set_tests_properties(rendezvous.etcd.${name} PROPERTIES LABELS "rendezvous;etcd" TIMEOUT ${DDP_TEST_TIMEOUT_300}
    COST ${DDP_COST_LONG})
endforeach()
