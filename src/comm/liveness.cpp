// liveness.cpp — the liveness responder and probe (liveness.hpp).
#include "comm/liveness.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/mpi_comm.hpp"

namespace piper::comm {

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kPing = 1, kPong = 2;

class Responder {
 public:
  Responder() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);  // a dead peer is an answer not given, not an abort
    thread_ = std::thread([this] { run(); });
  }
  ~Responder() { stop(); }
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  MPI_Comm comm() const { return comm_; }
  void stop() {
    if (!thread_.joinable()) return;
    stop_ = true;
    thread_.join();
    MPI_Comm_free(&comm_);
  }

 private:
  // Answers each ping with a pong; sleeps 5 ms between polls (a wake-up costs a computing rank ~0.2%).
  void run() {
    int ping = 0, pong = 0;
    MPI_Request in = MPI_REQUEST_NULL;
    std::vector<MPI_Request> out;
    MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, kPing, comm_, &in);
    while (!stop_) {
      int flag = 0;
      MPI_Status st;
      MPI_Test(&in, &flag, &st);
      if (flag) {
        out.emplace_back();
        MPI_Isend(&pong, 1, MPI_INT, st.MPI_SOURCE, kPong, comm_, &out.back());
        MPI_Irecv(&ping, 1, MPI_INT, MPI_ANY_SOURCE, kPing, comm_, &in);
        continue;
      }
      std::erase_if(out, [](MPI_Request& r) {
        int done = 0;
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        return done != 0;
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    MPI_Cancel(&in);
    MPI_Request_free(&in);
    for (MPI_Request& r : out) MPI_Request_free(&r);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::mutex g_mu;
std::unique_ptr<Responder> g_responder;

int stop_at_finalize(MPI_Comm, int, void*, void*) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_responder.reset();
  return MPI_SUCCESS;
}

}  // namespace

void start_liveness_responder() {
  if (!mpi_thread_multiple()) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_responder) return;
  int keyval = MPI_KEYVAL_INVALID;
  MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, stop_at_finalize, &keyval, nullptr);
  MPI_Comm_set_attr(MPI_COMM_SELF, keyval, nullptr);
  MPI_Comm_free_keyval(&keyval);  // released when MPI_Finalize deletes the attribute
  g_responder = std::make_unique<Responder>();
}

std::vector<int> unresponsive_world_ranks(double wait_s) {
  MPI_Comm comm = MPI_COMM_NULL;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_responder) return {};
    comm = g_responder->comm();
  }
  int me = 0, size = 1;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &size);
  // Buffers outlive a probe that gives up: requests left behind may still land in them.
  static std::vector<int> pongs, pings;
  pongs.assign(static_cast<size_t>(size), 0);
  pings.assign(static_cast<size_t>(size), 0);
  std::vector<MPI_Request> recv(static_cast<size_t>(size), MPI_REQUEST_NULL), send;
  std::vector<bool> answered(static_cast<size_t>(size), false);
  answered[static_cast<size_t>(me)] = true;
  for (int r = 0; r < size; ++r) {
    if (r == me) continue;
    MPI_Irecv(&pongs[r], 1, MPI_INT, r, kPong, comm, &recv[r]);
    send.emplace_back();
    MPI_Isend(&pings[r], 1, MPI_INT, r, kPing, comm, &send.back());
  }
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
  while (Clock::now() < deadline) {
    bool all = true;
    for (int r = 0; r < size; ++r) {
      if (answered[r]) continue;
      int flag = 0;
      MPI_Test(&recv[r], &flag, MPI_STATUS_IGNORE);
      answered[r] = flag != 0;
      all = all && answered[r];
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<int> silent;
  for (int r = 0; r < size; ++r)
    if (!answered[r]) {
      silent.push_back(r);
      MPI_Cancel(&recv[r]);
      MPI_Request_free(&recv[r]);
    }
  for (MPI_Request& s : send) MPI_Request_free(&s);
  return silent;
}

std::string liveness_report(double wait_s) {
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_responder) return "";
  }
  const std::vector<int> silent = unresponsive_world_ranks(wait_s);
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f s", wait_s);
  if (silent.empty()) return "; every other rank answered a liveness probe within " + std::string(secs);
  std::string list;
  for (size_t i = 0; i < silent.size(); ++i) list += (i ? ", " : "") + std::to_string(silent[i]);
  return "; world rank" + std::string(silent.size() > 1 ? "s " : " ") + list +
         " did not answer a liveness probe within " + secs + " (stalled or dead)";
}

}  // namespace piper::comm
