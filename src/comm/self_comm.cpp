// self_comm.cpp — one process's communicator: collectives as copies, messages to itself by tag.
#include "comm/self_comm.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

namespace piper::comm {

struct SelfCommunicator::Mailbox {
  struct Sent {
    int tag;
    std::vector<unsigned char> data;
  };
  struct Posted {
    int tag;
    void* buf;
    size_t bytes;
    std::shared_ptr<bool> done;
  };
  std::deque<Sent> sent;
  std::deque<Posted> posted;
};

namespace {

void copy_bytes(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memcpy(dst, src, bytes);
}

void copy_floats(float* dst, const float* src, size_t n) { copy_bytes(dst, src, n * sizeof(float)); }

// A receive posted before its send: complete once the send has delivered into it. Nothing else can deliver
// while the owning thread waits, so a wait on an unmatched receive fails at once instead of hanging.
class PostedReceive final : public RequestImpl {
 public:
  PostedReceive(std::shared_ptr<bool> done, std::string what, std::function<void()> cancel)
      : done_(std::move(done)), what_(std::move(what)), cancel_(std::move(cancel)) {}
  bool test() override { return *done_; }
  void wait() override {
    if (!*done_) throw CommError(what_ + ": waited on a receive whose send this process never posted");
  }
  void abandon() noexcept override {
    if (!*done_) cancel_();
  }

 private:
  std::shared_ptr<bool> done_;
  std::string what_;
  std::function<void()> cancel_;
};

}  // namespace

SelfCommunicator::SelfCommunicator(CommOptions options, const std::string& label)
    : options_(options), name_(group_name(label, {0})), mail_(std::make_shared<Mailbox>()) {}

int SelfCommunicator::world_rank(int i) const {
  if (i != 0) throw std::out_of_range(name_ + ": group rank " + std::to_string(i) + " of a group of 1");
  return 0;
}

void SelfCommunicator::check_peer(const char* op, int peer) const {
  if (peer != 0)
    throw std::invalid_argument(name_ + ": " + op + " to peer " + std::to_string(peer) +
                                "; a communicator of one process has peer 0 only");
}

namespace {

// "3 bf16": a message's length in its elements, for errors.
std::string elements(size_t n, backend::DType t) { return std::to_string(n) + " " + backend::dtype_name(t); }

}  // namespace

Request SelfCommunicator::isend(const void* buf, size_t n, backend::DType t, int peer, int tag) {
  check_peer("isend", peer);
  const size_t bytes = n * backend::dtype_size(t);
  const auto* data = static_cast<const unsigned char*>(buf);
  auto& posted = mail_->posted;
  auto it = std::find_if(posted.begin(), posted.end(), [&](const Mailbox::Posted& p) { return p.tag == tag; });
  if (it == posted.end()) {
    mail_->sent.push_back({tag, std::vector<unsigned char>(data, data + bytes)});  // buffered: the send is complete
    return {};
  }
  if (bytes > it->bytes)
    throw CommError(name_ + ": isend of " + elements(n, t) + " (" + std::to_string(bytes) + " bytes) with tag " +
                    std::to_string(tag) + " into a receive of " + std::to_string(it->bytes) + " bytes");
  copy_bytes(it->buf, buf, bytes);
  *it->done = true;
  posted.erase(it);
  return {};
}

Request SelfCommunicator::irecv(void* buf, size_t n, backend::DType t, int peer, int tag) {
  check_peer("irecv", peer);
  const size_t bytes = n * backend::dtype_size(t);
  auto& sent = mail_->sent;
  auto it = std::find_if(sent.begin(), sent.end(), [&](const Mailbox::Sent& s) { return s.tag == tag; });
  if (it != sent.end()) {
    if (it->data.size() > bytes)
      throw CommError(name_ + ": irecv of " + elements(n, t) + " (" + std::to_string(bytes) + " bytes) with tag " +
                      std::to_string(tag) + " matched a send of " + std::to_string(it->data.size()) + " bytes");
    copy_bytes(buf, it->data.data(), it->data.size());
    sent.erase(it);
    return {};
  }
  auto done = std::make_shared<bool>(false);
  mail_->posted.push_back({tag, buf, bytes, done});
  std::weak_ptr<Mailbox> mail = mail_;
  auto cancel = [mail, done] {
    if (auto m = mail.lock())
      m->posted.erase(std::remove_if(m->posted.begin(), m->posted.end(),
                                     [&](const Mailbox::Posted& p) { return p.done == done; }),
                      m->posted.end());
  };
  return Request(std::make_unique<PostedReceive>(
      done, name_ + ": irecv of " + elements(n, t) + " with tag " + std::to_string(tag), cancel));
}

Request SelfCommunicator::ireduce_scatter(const float* in, float* out, size_t n_per_rank) {
  copy_floats(out, in, n_per_rank);
  return {};
}

Request SelfCommunicator::iallgather(const void* in, void* out, size_t n_per_rank, backend::DType t) {
  copy_bytes(out, in, n_per_rank * backend::dtype_size(t));
  return {};
}

Request SelfCommunicator::ialltoall(const void* in, void* out, size_t n_per_rank, backend::DType t) {
  copy_bytes(out, in, n_per_rank * backend::dtype_size(t));
  return {};
}

Request SelfCommunicator::ialltoallv(const void* in, const std::vector<int64_t>& send_counts, void* out,
                                     const std::vector<int64_t>& recv_counts, backend::DType t) {
  if (send_counts.size() != 1 || recv_counts.size() != 1 || send_counts[0] != recv_counts[0])
    throw std::invalid_argument(name_ + ": ialltoallv needs one send and one receive count, equal; got " +
                                std::to_string(send_counts.size()) + " and " + std::to_string(recv_counts.size()));
  copy_bytes(out, in, static_cast<size_t>(send_counts[0]) * backend::dtype_size(t));
  return {};
}

std::unique_ptr<Communicator> SelfCommunicator::split_impl(const std::vector<int>& world_ranks,
                                                           const std::string& label) {
  if (world_ranks != std::vector<int>{0})
    throw std::invalid_argument(name_ + ": split into " + group_name(label, world_ranks) +
                                "; a communicator of one process splits into [0] only");
  return std::make_unique<SelfCommunicator>(options_, label);
}

}  // namespace piper::comm
