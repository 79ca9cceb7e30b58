// regular_file.cpp — regular files only, of a bounded size (regular_file.hpp).
#include "io/regular_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace piper::io {

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "of another kind";
}

namespace {

[[noreturn]] void not_regular(mode_t mode) { throw FileError("not a regular file: it is " + kind_of(mode)); }

void check_size(int64_t bytes, int64_t max_bytes) {
  if (max_bytes > 0 && bytes > max_bytes)
    throw FileError("is " + std::to_string(bytes) + " bytes, more than the " + std::to_string(max_bytes) +
                    " allowed");
}

}  // namespace

Opened open_regular(const std::string& path, int64_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) not_regular(st.st_mode);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw FileError(std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw FileError(std::string("cannot stat: ") + std::strerror(err));
  }
  try {
    if (!S_ISREG(st.st_mode)) not_regular(st.st_mode);
    check_size(static_cast<int64_t>(st.st_size), max_bytes);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return {fd, static_cast<int64_t>(st.st_size)};
}

std::string read_regular(const std::string& path, int64_t max_bytes) {
  const Opened f = open_regular(path, max_bytes);
  std::string text;
  text.reserve(static_cast<size_t>(f.bytes));
  char buf[1 << 16];
  int err = 0;
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) err = errno;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (max_bytes > 0 && static_cast<int64_t>(text.size()) > max_bytes) break;  // grew while being read
  }
  ::close(f.fd);
  if (err) throw FileError(std::string("cannot read: ") + std::strerror(err));
  check_size(static_cast<int64_t>(text.size()), max_bytes);
  return text;
}

std::string why_not_regular(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode)) return "";
  return "not a regular file: it is " + kind_of(st.st_mode);
}

}  // namespace piper::io
