// comm.cpp — the backend-independent parts of the communicator interface: Request, group naming, grid splits.
#include "comm/comm.hpp"

#include <cstdio>
#include <exception>
#include <sstream>


namespace piper::comm {

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    finish();
    impl_ = std::move(other.impl_);
  }
  return *this;
}

Request::~Request() { finish(); }

void Request::finish() noexcept {
  if (!impl_) return;
  if (std::uncaught_exceptions() > 0) {
    impl_->abandon();  // an error is on its way to a handler that will abort the job
  } else {
    try {
      impl_->wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "piper comm: pending request destroyed: %s\n", e.what());
      std::fflush(stderr);
      std::terminate();
    }
  }
  impl_.reset();
}

bool Request::test() {
  if (!impl_) return true;
  if (!impl_->test()) return false;
  impl_.reset();
  return true;
}

void Request::wait() {
  if (!impl_) return;
  impl_->wait();
  impl_.reset();
}

void wait_all(std::vector<Request>& requests) {
  for (auto& r : requests) r.wait();
}

std::string group_name(std::string_view label, const std::vector<int>& world_ranks) {
  std::ostringstream s;
  s << label << " [";
  bool contiguous = world_ranks.size() >= 3;
  for (size_t i = 1; contiguous && i < world_ranks.size(); ++i)
    contiguous = world_ranks[i] == world_ranks[i - 1] + 1;
  if (contiguous) {
    s << world_ranks.front() << ".." << world_ranks.back();
  } else {
    const size_t n = world_ranks.size();
    for (size_t i = 0; i < n; ++i) {
      if (n > 8 && i == 4) {  // long lists: the first four, "...", the last
        s << ",...," << world_ranks.back();
        break;
      }
      s << (i ? "," : "") << world_ranks[i];
    }
  }
  s << "]";
  return s.str();
}


}  // namespace piper::comm
