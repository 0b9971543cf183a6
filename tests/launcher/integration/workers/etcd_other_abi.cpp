// An etcd transport plugin from "another build": ddprun's own interface (transport.hpp)
// with an interface number this ddprun does not speak. test_etcd copies it beside a copy of
// ddprun as lib/ddprun/etcd-http.so and expects the job refused by name, before any call.
#include "rendezvous/etcd/transport.hpp"

extern "C" __attribute__((visibility("default"))) const DdprunEtcdApi* ddprun_etcd_transport(void) {
  static const DdprunEtcdApi api{kDdprunEtcdAbi + 1, nullptr, nullptr, nullptr, nullptr, nullptr,
                                 nullptr,            nullptr, nullptr, nullptr};
  return &api;
}
