// liveness.cpp — the liveness responder and probe (liveness.hpp), over UDP: no MPI call is made while the
// job runs, so the responder never advances MPI transfers behind the communicators' backs (with Open MPI any
// MPI call drives every pending transfer, which would blur what the progress thread does).
#include "comm/liveness.hpp"

#include "comm/deadline.hpp"

#include <mpi.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/mpi_comm.hpp"
#include "comm/op_info.hpp"

namespace piper::comm {

namespace {


// A datagram: the magic, the kind, the sender's world rank and the probe's serial.
struct Datagram {
  uint32_t magic = 0x50495045;  // "PIPE"
  uint32_t kind = 0;            // kPing or kPong
  int32_t rank = -1;
  uint32_t serial = 0;
};
constexpr uint32_t kPing = 1, kPong = 2;

// This host's IPv4 address as the other hosts reach it: its name resolved, else loopback.
in_addr host_address() {
  in_addr a{};
  a.s_addr = htonl(INADDR_LOOPBACK);
  const std::string& name = host_name();
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0 || !res) return a;
  a = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

class Responder {
 public:
  // Collective over MPI_COMM_WORLD: every process opens its socket and learns everyone's address.
  Responder() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    sockaddr_in me{};
    me.sin_family = AF_INET;
    me.sin_addr.s_addr = htonl(INADDR_ANY);
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    socklen_t len = sizeof me;
    const bool ok = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&me), sizeof me) == 0 &&
                    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&me), &len) == 0;
    me.sin_addr = host_address();
    if (!ok) me.sin_port = 0;  // nobody can reach this one: probes say so
    peers_.resize(static_cast<size_t>(size_));
    MPI_Allgather(&me, static_cast<int>(sizeof me), MPI_BYTE, peers_.data(), static_cast<int>(sizeof me), MPI_BYTE,
                  MPI_COMM_WORLD);
    if (ok) thread_ = std::thread([this] { run(); });
  }
  ~Responder() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  bool running() const { return thread_.joinable(); }

  // Pings every other rank (three times, 100 ms apart: a datagram may be lost), collects the pongs.
  std::vector<int> silent(double wait_s) {
    std::lock_guard<std::mutex> lock(probe_mu_);
    const uint32_t serial = ++serial_;
    std::vector<bool> answered(static_cast<size_t>(size_), false);
    answered[static_cast<size_t>(rank_)] = true;
    {
      std::lock_guard<std::mutex> l(pong_mu_);
      pongs_.assign(static_cast<size_t>(size_), 0);
    }
    const auto start = Clock::now();
    const auto deadline = deadline_after(wait_s);
    int round = 0;
    while (Clock::now() < deadline) {
      if (round < 3 && Clock::now() >= start + std::chrono::milliseconds(100 * round)) {
        for (int r = 0; r < size_; ++r)
          if (!answered[static_cast<size_t>(r)]) send(r, kPing, serial);
        ++round;
      }
      bool all = true;
      {
        std::lock_guard<std::mutex> l(pong_mu_);
        for (int r = 0; r < size_; ++r) {
          answered[static_cast<size_t>(r)] = answered[static_cast<size_t>(r)] || pongs_[static_cast<size_t>(r)] == serial;
          all = all && answered[static_cast<size_t>(r)];
        }
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::vector<int> out;
    for (int r = 0; r < size_; ++r)
      if (!answered[static_cast<size_t>(r)]) out.push_back(r);
    return out;
  }

 private:
  void send(int to, uint32_t kind, uint32_t serial) {
    const sockaddr_in& a = peers_[static_cast<size_t>(to)];
    if (a.sin_port == 0) return;
    Datagram d;
    d.kind = kind;
    d.rank = rank_;
    d.serial = serial;
    ::sendto(fd_, &d, sizeof d, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&a), sizeof a);
  }
  // Answers pings, files pongs; wakes at least every 100 ms to see whether it should stop.
  void run() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      Datagram d;
      const ssize_t n = ::recv(fd_, &d, sizeof d, MSG_DONTWAIT);
      if (n != static_cast<ssize_t>(sizeof d) || d.magic != Datagram{}.magic || d.rank < 0 || d.rank >= size_)
        continue;
      if (d.kind == kPing) {
        send(d.rank, kPong, d.serial);
      } else if (d.kind == kPong) {
        std::lock_guard<std::mutex> l(pong_mu_);
        if (static_cast<size_t>(d.rank) < pongs_.size()) pongs_[static_cast<size_t>(d.rank)] = d.serial;
      }
    }
  }

  int rank_ = 0, size_ = 1, fd_ = -1;
  std::vector<sockaddr_in> peers_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex probe_mu_, pong_mu_;
  std::vector<uint32_t> pongs_;  // per rank: the serial of the last pong
  uint32_t serial_ = 0;
};

std::mutex g_mu;
std::unique_ptr<Responder> g_responder;

int stop_at_finalize(MPI_Comm, int, void*, void*) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_responder.reset();
  return MPI_SUCCESS;
}

Responder* responder() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_responder && g_responder->running() ? g_responder.get() : nullptr;
}

}  // namespace

void start_liveness_responder() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_responder) return;
  int keyval = MPI_KEYVAL_INVALID;
  MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, stop_at_finalize, &keyval, nullptr);
  MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
  MPI_Comm_free_keyval(&keyval);  // released when MPI_Finalize deletes the attribute
  g_responder = std::make_unique<Responder>();
}

std::vector<int> unresponsive_world_ranks(double wait_s) {
  Responder* r = responder();
  return r ? r->silent(wait_s) : std::vector<int>{};
}

std::string liveness_report(double wait_s) {
  Responder* r = responder();
  if (!r) return "";
  const std::vector<int> silent = r->silent(wait_s);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f s", wait_s);
  if (silent.empty()) return "; every other rank answered a liveness probe within " + std::string(secs);
  std::string list;
  for (size_t i = 0; i < silent.size(); ++i) list += (i ? ", " : "") + std::to_string(silent[i]);
  return "; world rank" + std::string(silent.size() > 1 ? "s " : " ") + list +
         " did not answer a liveness probe within " + secs + " (stalled or dead)";
}

}  // namespace piper::comm
