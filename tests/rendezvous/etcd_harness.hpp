// Real etcd members for the tests and the benchmark: Debian's etcd-server, on loopback
// ports picked free, under a temporary data folder, each stopped by its pid (SIGKILL) and
// killed with the test process (PR_SET_PDEATHSIG). One member or a cluster of several.
// Also: certificates made with `openssl` for the TLS tests, and DDP_TEST_TIMEOUT_SCALE.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <fcntl.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "ports.hpp"
#include "test_timeouts.hpp"
#include "rendezvous/etcd/client.hpp"

namespace ddprun_test {

using std::chrono::milliseconds;

using ddp::test::scaled;  // DDP_TEST_TIMEOUT_SCALE
using ddp::test::free_port;  // below the ephemeral range: etcd binds it later

// The etcd binary: $DDP_ETCD, else etcd on PATH; empty when there is none.
inline std::string find_etcd() {
  if (const char* e = std::getenv("DDP_ETCD"); e && *e) return e;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t c = dirs.find(':', pos);
    std::string dir = dirs.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    std::string p = (dir.empty() ? "." : dir) + "/etcd";
    if (::access(p.c_str(), X_OK) == 0) return p;
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return {};
}

// Under /dev/shm when there is one: etcd fsyncs every write, and on a disk that other
// tests keep busy an fsync can stall for seconds (a lease then ends seconds late).
inline std::string make_temp_dir(const char* stem) {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = ::access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : (tmp && *tmp ? tmp : "/tmp");
  std::string t = dir + "/" + stem + "-XXXXXX";
  if (!::mkdtemp(t.data())) throw std::runtime_error("mkdtemp failed");
  return t;
}

// TLS on the members' client port: their certificate and the CA they check clients with.
struct EtcdServerTls {
  std::string cert, key, ca;
  bool client_cert_auth = true;
};

class EtcdCluster {
 public:
  struct Member {
    std::string name, data, log;
    int client_port = 0, peer_port = 0;
    pid_t pid = -1;
    bool frozen = false;
  };

  // Starts `n` members and waits until each answers and the cluster has a leader.
  // `client_tls`: how the readiness check connects (with server TLS).
  // With check_ready false it only waits for the client port to accept connections (a
  // member whose certificate no client accepts).
  explicit EtcdCluster(int n, std::optional<EtcdServerTls> tls = std::nullopt,
                       ddprun::rdzv::etcd::TlsConfig client_tls = {}, bool check_ready = true)
      : tls_(std::move(tls)), client_tls_(std::move(client_tls)), check_ready_(check_ready) {
    etcd_ = find_etcd();
    if (etcd_.empty()) throw std::runtime_error("no etcd binary (Debian package etcd-server)");
    root_ = make_temp_dir("ddprun-etcd-test");
    std::string token = fmt::format("ddprun-test-{}-{}", ::getpid(), std::random_device{}());
    for (int i = 0; i < n; ++i) {
      Member m;
      m.name = fmt::format("m{}", i);
      m.data = root_ + "/" + m.name;
      m.log = root_ + "/" + m.name + ".log";
      m.client_port = free_port();
      m.peer_port = free_port();
      members_.push_back(m);
    }
    for (const auto& m : members_)
      initial_ += fmt::format("{}{}=http://127.0.0.1:{}", initial_.empty() ? "" : ",", m.name, m.peer_port);
    token_ = token;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) spawn(i);
    wait_ready(scaled(milliseconds(30000)));
    start_time_ = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  }

  ~EtcdCluster() {
    for (int i = 0; i < size(); ++i) kill(i);
    if (!std::getenv("DDP_KEEP_ETCD_DATA")) {
      std::error_code ec;
      std::filesystem::remove_all(root_, ec);
    }
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  milliseconds start_time() const { return start_time_; }
  const Member& member(int i) const { return members_.at(i); }
  std::string endpoint(int i) const { return fmt::format("127.0.0.1:{}", members_.at(i).client_port); }
  std::string endpoints() const {
    std::string out;
    for (int i = 0; i < size(); ++i) {
      if (i) out += ',';
      out += endpoint(i);
    }
    return out;
  }
  bool running(int i) const { return members_.at(i).pid > 0; }

  // SIGKILL, then reap it. The data folder stays, so restart() brings it back.
  void kill(int i) {
    Member& m = members_.at(i);
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGCONT);
    ::kill(m.pid, SIGKILL);
    ::waitpid(m.pid, nullptr, 0);
    m.pid = -1;
    m.frozen = false;
  }
  // SIGSTOP, and returns once every thread of the member has stopped. kill() returns
  // before that: the stop spreads to the other threads only when the thread that took the
  // signal runs, and on a busy machine the others go on answering meanwhile.
  void freeze(int i) {
    Member& m = members_.at(i);
    if (m.pid <= 0 || m.frozen) return;  // a second stop would never be reported
    ::kill(m.pid, SIGSTOP);
    m.frozen = true;
    int status = 0;
    while (::waitpid(m.pid, &status, WUNTRACED) == m.pid && !WIFSTOPPED(status)) {
      if (WIFEXITED(status) || WIFSIGNALED(status)) {
        m.pid = -1;
        throw std::runtime_error(fmt::format("etcd member {} exited instead of stopping:\n{}", i, log_tail(i)));
      }
    }
  }
  void thaw(int i) {
    if (members_.at(i).pid > 0) ::kill(members_[i].pid, SIGCONT);
    members_[i].frozen = false;
  }
  // Starts member i again (its data kept) without waiting; restart() waits until ready.
  void start(int i) {
    kill(i);
    spawn(i);
  }
  void restart(int i, milliseconds timeout = scaled(milliseconds(30000))) {
    start(i);
    wait_ready(timeout);
  }

  // The index of the leader as the running members see it; -1 when there is none.
  int leader() {
    std::vector<uint64_t> ids(size(), 0);
    uint64_t leader = 0;
    for (int i = 0; i < size(); ++i) {
      if (!running(i)) continue;
      try {
        auto st = client(i).status(0, std::chrono::steady_clock::now() + milliseconds(2000));
        ids[i] = st.member_id;
        if (st.leader_id) leader = st.leader_id;
      } catch (const std::exception&) {
      }
    }
    for (int i = 0; i < size(); ++i)
      if (leader && ids[i] == leader) return i;
    return -1;
  }

  // Waits until every running member answers and they agree on a leader.
  void wait_ready(milliseconds timeout) {
    auto end = std::chrono::steady_clock::now() + timeout;
    std::string last;
    while (std::chrono::steady_clock::now() < end) {
      bool all = true;
      uint64_t leader = 0;
      for (int i = 0; i < size() && all; ++i) {
        if (!running(i)) continue;
        int status = 0;
        if (::waitpid(members_[i].pid, &status, WNOHANG) == members_[i].pid) {
          members_[i].pid = -1;
          throw std::runtime_error(fmt::format("etcd member {} exited at start:\n{}", i, log_tail(i)));
        }
        try {
          if (!check_ready_) {
            all = port_open(members_[i].client_port);
            continue;
          }
          auto st = client(i).status(0, std::chrono::steady_clock::now() + milliseconds(1000));
          all = st.leader_id != 0 && (leader == 0 || leader == st.leader_id);
          leader = st.leader_id;
        } catch (const std::exception& e) {
          last = e.what();
          all = false;
        }
      }
      if (all) return;
      std::this_thread::sleep_for(milliseconds(20));
    }
    throw std::runtime_error(fmt::format("etcd not ready within {} ms ({}):\n{}", timeout.count(), last, log_tail(0)));
  }

  std::string log_tail(int i, size_t bytes = 3000) const {
    std::ifstream f(members_.at(i).log, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return s.size() > bytes ? s.substr(s.size() - bytes) : s;
  }

  const std::string& root() const { return root_; }

  // A client of member i alone (with the members' TLS, if any).
  ddprun::rdzv::etcd::Client client(int i) {
    ddprun::rdzv::etcd::ClientOptions o;
    o.endpoints = {{"127.0.0.1", static_cast<uint16_t>(members_[i].client_port)}};
    o.tls = client_tls_;
    o.tls.enabled = tls_.has_value();
    o.connect_timeout = milliseconds(1000);
    return ddprun::rdzv::etcd::Client(o);
  }

 private:
  void spawn(int i) {
    Member& m = members_[i];
    std::string scheme = tls_ ? "https" : "http";
    std::string client_url = fmt::format("{}://127.0.0.1:{}", scheme, m.client_port);
    std::string peer_url = fmt::format("http://127.0.0.1:{}", m.peer_port);
    std::vector<std::string> args{etcd_,
                                  "--name", m.name,
                                  "--data-dir", m.data,
                                  "--listen-client-urls", client_url,
                                  "--advertise-client-urls", client_url,
                                  "--listen-peer-urls", peer_url,
                                  "--initial-advertise-peer-urls", peer_url,
                                  "--initial-cluster", initial_,
                                  "--initial-cluster-token", token_,
                                  "--initial-cluster-state", "new",
                                  "--logger", "zap",
                                  "--log-level", "warn",
                                  "--log-outputs", "stderr"};
    if (tls_) {
      for (std::string s : {"--cert-file", tls_->cert.c_str(), "--key-file", tls_->key.c_str()}) args.push_back(s);
      if (!tls_->ca.empty()) {
        args.push_back("--trusted-ca-file");
        args.push_back(tls_->ca);
      }
      if (tls_->client_cert_auth) args.push_back("--client-cert-auth");
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      int fd = ::open(m.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      int null = ::open("/dev/null", O_RDONLY);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      if (null >= 0) ::dup2(null, 0);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    m.pid = pid;
  }

  static bool port_open(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    if (fd >= 0) ::close(fd);
    return ok;
  }

  std::optional<EtcdServerTls> tls_;
  ddprun::rdzv::etcd::TlsConfig client_tls_;
  bool check_ready_ = true;
  std::string etcd_, root_, initial_, token_;
  std::vector<Member> members_;
  milliseconds start_time_{0};
};

// Certificates for the TLS tests, made with `openssl` (EC P-256, quick to make):
// a CA with a server certificate for 127.0.0.1 and a client certificate; another CA with
// its own client certificate; an expired server certificate and an expired client one.
struct TestPki {
  std::string dir;
  std::string ca, server_cert, server_key, client_cert, client_key;
  std::string other_ca, other_client_cert, other_client_key;
  std::string expired_server_cert, expired_client_cert;

  explicit TestPki(const std::string& folder) : dir(folder) {
    auto f = [&](const char* name) { return dir + "/" + name; };
    ca = f("ca.crt");
    server_cert = f("server.crt");
    server_key = f("server.key");
    client_cert = f("client.crt");
    client_key = f("client.key");
    other_ca = f("other-ca.crt");
    other_client_cert = f("other-client.crt");
    other_client_key = f("other-client.key");
    expired_server_cert = f("expired-server.crt");
    expired_client_cert = f("expired-client.crt");
    std::ofstream(f("server.ext")) << "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n";
    std::ofstream(f("client.ext")) << "extendedKeyUsage=clientAuth\n";
    std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    auto ca_cmd = [&](const std::string& name) {
      return fmt::format("openssl req -x509 {0} -keyout {1}/{2}.key -out {1}/{2}.crt -days 3 -subj /CN=ddprun-test-{2}", ec, dir, name);
    };
    auto leaf = [&](const std::string& name, const std::string& ca_name, const std::string& ext, int days,
                    const std::string& key_of = "") {
      std::string key = key_of.empty() ? name : key_of;
      std::string out;
      if (key_of.empty())
        out = fmt::format("openssl req {} -keyout {}/{}.key -out {}/{}.csr -subj /CN=ddprun-test-{} && ", ec, dir, key, dir, name, name);
      else
        out = fmt::format("openssl req -new -key {}/{}.key -out {}/{}.csr -subj /CN=ddprun-test-{} && ", dir, key, dir, name, name);
      out += fmt::format("openssl x509 -req -in {0}/{1}.csr -CA {0}/{2}.crt -CAkey {0}/{2}.key -CAcreateserial "
                         "-out {0}/{1}.crt -days {3} -extfile {0}/{4}",
                         dir, name, ca_name, days, ext);
      return out;
    };
    std::vector<std::string> cmds{
        ca_cmd("ca"),
        ca_cmd("other-ca"),
        leaf("server", "ca", "server.ext", 3),
        leaf("client", "ca", "client.ext", 3),
        leaf("other-client", "other-ca", "client.ext", 3),
        leaf("expired-server", "ca", "server.ext", -1, "server"),
        leaf("expired-client", "ca", "client.ext", -1, "client"),
    };
    for (const auto& c : cmds) {
      std::string cmd = "cd " + dir + " && (" + c + ") >/dev/null 2>&1";
      if (std::system(cmd.c_str()) != 0) throw std::runtime_error("openssl failed: " + c);
    }
  }
};

}  // namespace ddprun_test
