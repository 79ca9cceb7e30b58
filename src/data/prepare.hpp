// prepare.hpp — `piper prepare`: text files in, one byte-level token file out (docs/data.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace piper::data {

// Concatenates the documents named by `inputs` — a file is one document; a directory stands
// for every regular file under it, recursively, sorted by path — in the order given, with a
// blank line between documents (a newline is added first where a document does not end with
// one; empty files are skipped). Tokenizes the bytes with ByteTokenizer and writes the token
// file `output` (vocab 256), creating its directory. Returns the token count.
// Throws DataError: no inputs, an input that is missing or not a file or directory, an
// unreadable file, fewer than 2 tokens in all, or a failure writing `output`.
int64_t prepare(const std::vector<std::string>& inputs, const std::string& output);

}  // namespace piper::data
