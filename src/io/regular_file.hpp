// regular_file.hpp — how piper opens the files a user names: only regular files, of a bounded size. A FIFO
// would block the open (or the read) forever, a device never ends, a directory is no file at all; each is
// refused before it is opened (stat), and again on the descriptor (fstat: the open is non-blocking, so a
// path that turned into a FIFO in between cannot hang). Every reader of a user's file asks here.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace piper::io {

// The reason a file cannot be used, without its path (the caller names the file and what it should be):
// "not a regular file: it is a FIFO (named pipe)", "cannot open: No such file or directory", "is 20971520
// bytes, more than the 16777216 allowed".
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "a directory", "a FIFO (named pipe)", "a socket", "a character device", "a block device".
std::string kind_of(mode_t mode);

struct Opened {
  int fd;         // read-only; the caller closes it
  int64_t bytes;  // the file's size
};
// Opens PATH for reading when it is a regular file of at most max_bytes (0: any size).
Opened open_regular(const std::string& path, int64_t max_bytes = 0);

// The bytes of a regular file of at most max_bytes.
std::string read_regular(const std::string& path, int64_t max_bytes);

// "" when PATH does not exist or is a regular file, else why it is not one — for a file about to be written
// (opening a FIFO for writing waits for a reader forever) or one that names something else.
std::string why_not_regular(const std::string& path);

}  // namespace piper::io
