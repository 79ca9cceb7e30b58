// agreement.cpp — bounded agreement and bounded waits over raw MPI (agreement.hpp).
#include "comm/agreement.hpp"
#include "comm/op_info.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/deadline.hpp"
#include "comm/liveness.hpp"
#include "comm/mpi_comm.hpp"

namespace piper::comm {

namespace {

// One report or answer: a status byte, then the error text (NUL-terminated, cut to fit).
constexpr int kMessage = 2048;
constexpr char kOk = 0, kFailed = 1, kStalled = 2;
constexpr int kReportTag = 32001, kAnswerTag = 32002;

std::vector<char> message(char status, const std::string& text) {
  std::vector<char> m(kMessage, '\0');
  m[0] = status;
  std::memcpy(m.data() + 1, text.data(), std::min(text.size(), static_cast<size_t>(kMessage - 2)));
  return m;
}

std::string text_of(const std::vector<char>& m) { return std::string(m.data() + 1); }

int world_rank_of(MPI_Comm comm, int r) {
  MPI_Group g, world;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int w = r;
  MPI_Group_translate_ranks(g, 1, &r, world, &w);
  MPI_Group_free(&g);
  MPI_Group_free(&world);
  return w;
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

std::string here() { return rank_and_host(mpi_world_rank()); }

// Polls until `done` or the deadline; false at the deadline. Sleeps between polls, from 50 us up to 5 ms,
// so a long wait costs no core.
template <class Done>
bool poll_until(Clock::time_point deadline, Done&& done) {
  auto nap = std::chrono::microseconds(50);
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(5000));
  }
  return true;
}

}  // namespace

std::string agree(MPI_Comm comm, const std::string& local_error, double timeout_s, const std::string& phase) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (size == 1) return local_error;
  const auto start = Clock::now();
  if (rank != 0) {
    std::vector<char> report = message(local_error.empty() ? kOk : kFailed, local_error), answer(kMessage);
    MPI_Request req[2];
    MPI_Isend(report.data(), kMessage, MPI_CHAR, 0, kReportTag, comm, &req[0]);
    MPI_Irecv(answer.data(), kMessage, MPI_CHAR, 0, kAnswerTag, comm, &req[1]);
    const bool answered = poll_until(deadline_after(2 * timeout_s + 1), [&] {
      int flag = 0;
      MPI_Testall(2, req, &flag, MPI_STATUSES_IGNORE);
      return flag != 0;
    });
    if (!answered) {
      // The job is ending; the buffers stay alive for the requests left behind.
      MPI_Cancel(&req[1]);
      (void)new std::vector<char>(std::move(report));
      (void)new std::vector<char>(std::move(answer));
      throw StallError("piper comm: " + here() + " waited " + seconds(seconds_since(start)) + " at " + phase +
                       " for world rank " + std::to_string(world_rank_of(comm, 0)) +
                       ", which did not answer (parallel.comm_timeout_s = " + seconds(timeout_s) + ")" +
                       liveness_report(kLivenessProbeS));
    }
    if (answer[0] == kStalled) throw StallError(text_of(answer));
    return answer[0] == kFailed ? text_of(answer) : std::string();
  }
  // Rank 0: every report, then one answer to every rank that reported.
  std::vector<std::vector<char>> reports(static_cast<size_t>(size), std::vector<char>(kMessage));
  std::vector<MPI_Request> req(static_cast<size_t>(size), MPI_REQUEST_NULL);
  for (int r = 1; r < size; ++r)
    MPI_Irecv(reports[r].data(), kMessage, MPI_CHAR, r, kReportTag, comm, &req[r]);
  std::vector<bool> arrived(static_cast<size_t>(size), false);
  arrived[0] = true;
  poll_until(deadline_after(timeout_s), [&] {
    for (int r = 1; r < size; ++r) {
      if (arrived[r]) continue;
      int flag = 0;
      MPI_Test(&req[r], &flag, MPI_STATUS_IGNORE);
      arrived[r] = flag != 0;
    }
    return std::all_of(arrived.begin(), arrived.end(), [](bool a) { return a; });
  });
  std::string missing;
  int n_missing = 0;
  for (int r = 1; r < size; ++r)
    if (!arrived[r]) {
      missing += (missing.empty() ? "" : ", ") + std::to_string(world_rank_of(comm, r));
      ++n_missing;
      MPI_Cancel(&req[r]);
    }
  if (n_missing > 0) (void)new std::vector<std::vector<char>>(std::move(reports));  // kept for the cancelled receives
  char status = kOk;
  std::string text;
  if (n_missing > 0) {
    status = kStalled;
    text = "piper comm: world rank" + std::string(n_missing > 1 ? "s " : " ") + missing + " did not reach " + phase +
           " within " + seconds(timeout_s) + " (stalled or dead; parallel.comm_timeout_s); noticed by " + here();
  } else if (!local_error.empty()) {
    status = kFailed;
    text = local_error;
  } else {
    for (int r = 1; r < size; ++r)
      if (reports[r][0] == kFailed) {
        status = kFailed;
        text = text_of(reports[r]);
        break;
      }
  }
  const std::vector<char> answer = message(status, text);
  std::vector<MPI_Request> sent;
  for (int r = 1; r < size; ++r) {
    if (!arrived[r]) continue;
    sent.emplace_back();
    MPI_Isend(answer.data(), kMessage, MPI_CHAR, r, kAnswerTag, comm, &sent.back());
  }
  wait_bounded(sent.data(), static_cast<int>(sent.size()), timeout_s, phase + " (answering)", comm);
  if (status == kStalled) throw StallError(text);
  return text;
}

void wait_bounded(MPI_Request* requests, int n, double timeout_s, const std::string& phase, MPI_Comm comm) {
  if (n == 0) return;
  const auto start = Clock::now();
  const bool done = poll_until(deadline_after(timeout_s), [&] {
    int flag = 0;
    MPI_Testall(n, requests, &flag, MPI_STATUSES_IGNORE);
    return flag != 0;
  });
  if (done) return;
  int size = 1;
  MPI_Comm_size(comm, &size);
  throw StallError("piper comm: " + here() + " waited " + seconds(seconds_since(start)) + " at " + phase +
                   " for the other " + std::to_string(size - 1) +
                   " rank(s), and some did not arrive (parallel.comm_timeout_s = " + seconds(timeout_s) + ")" +
                   liveness_report(kLivenessProbeS));
}

}  // namespace piper::comm
