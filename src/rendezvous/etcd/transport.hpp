// The boundary between ddprun and its etcd transport, a plugin (lib/ddprun/etcd-http.so
// beside bin/ddprun) that holds Boost.Beast and the statically linked OpenSSL. Loaded only
// when a job talks to etcd, so a launch that does not pays nothing for OpenSSL: no
// relocations of its tables, no initialisation (docs/design.md, "etcd rendezvous backend").
//
// A C interface: ddprun and the plugin each carry their own libstdc++ (linked statically,
// for start-up time), so no C++ object and no exception crosses. Text comes back through a
// sink that the caller's side appends to its own string; a failure comes back as a
// DdprunEtcdError that ddprun turns into the exception it stands for (http.hpp). Deadlines
// are steady_clock (CLOCK_MONOTONIC) nanoseconds.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct DdprunEtcdSink {
  void* user;
  void (*append)(void* user, const char* data, size_t size);
};

enum DdprunEtcdErrorType { kDdprunEtcdUsage = 1, kDdprunEtcdExchange = 2, kDdprunEtcdOther = 3 };

struct DdprunEtcdError {
  int type;             // DdprunEtcdErrorType
  int exchange_kind;    // ExchangeError::Kind, for kDdprunEtcdExchange
  int maybe_delivered;  // the same
  DdprunEtcdSink message;
};

struct DdprunEtcdTls {
  const char* cacert;  // "" for the system's CAs
  const char* cert;    // "" for none
  const char* key;     // "" for none (or in the cert file)
};

// Every call that can fail returns -1 and fills *error; the others say what they return.
struct DdprunEtcdApi {
  int abi;  // kDdprunEtcdAbi of the plugin's build
  // The loaded TLS settings (make_tls_context in http.hpp), or null and *error.
  void* (*tls_open)(const DdprunEtcdTls* config, DdprunEtcdError* error);
  void (*tls_free)(void* tls);
  // A connection to host:port (TLS with `tls` unless null), opened on first use; null when
  // it cannot even be set up (no memory, no io_context).
  void* (*conn_new)(const char* host, uint16_t port, void* tls, int64_t connect_timeout_ms);
  void (*conn_free)(void* conn);
  // HttpSession::post and ::start_stream: 0 with *status and the body given to `body`.
  int (*post)(void* conn, const char* target, const char* body, size_t body_size, int64_t deadline_ns,
              int* status, DdprunEtcdSink response, DdprunEtcdError* error);
  int (*start_stream)(void* conn, const char* target, const char* body, size_t body_size, int64_t deadline_ns,
                      int* status, DdprunEtcdSink response, DdprunEtcdError* error);
  // HttpSession::read_stream: 1 when data came (given to `out`), 0 when the deadline passed.
  int (*read_stream)(void* conn, int64_t deadline_ns, DdprunEtcdSink out, DdprunEtcdError* error);
  void (*close)(void* conn);
  void (*interrupt)(void* conn);  // from any thread while the connection lives
};

// Bumped whenever DdprunEtcdApi or a type it passes changes.
enum { kDdprunEtcdAbi = 1 };

// The plugin's one exported symbol.
const DdprunEtcdApi* ddprun_etcd_transport(void);
typedef const DdprunEtcdApi* (*DdprunEtcdEntry)(void);

}  // extern "C"
