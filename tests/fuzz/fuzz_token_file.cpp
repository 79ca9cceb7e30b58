// fuzz_token_file.cpp — the token file reader (src/data/token_file.cpp): the 32-byte header, the file
// size and every id, through the memory map.
//
// Input: the whole file. The harness writes it to a scratch file and opens it as a TokenFile.
// Refusal: data::DataError. On an accepted file the harness reads the first, last and a wrapped sample
// and checks the documented guarantees: size() >= 2, every id < vocab_size().
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/token_file.hpp"
#include "fuzz.hpp"

using namespace piper;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = fuzz::scratch_path("tokens.tok");
  fuzz::write_bytes(path, data, size);
  try {
    const data::TokenFile f(path);
    fuzz::require(f.size() >= data::kTokenMinCount, "an open token file has fewer than 2 tokens");
    fuzz::require(f.id_width() == 2 || f.id_width() == 4, "id width is neither 2 nor 4");
    for (int64_t i : {int64_t{0}, f.size() - 1}) {
      const int32_t id = f.at(i);
      fuzz::require(id >= 0 && static_cast<uint32_t>(id) < f.vocab_size(), "an id outside [0, vocab_size)");
    }
    const int64_t T = 7;
    std::vector<int32_t> sample(T + 1);
    f.sample(3, T, sample.data());  // wraps to the start on a short file
    for (int32_t id : sample)
      fuzz::require(id >= 0 && static_cast<uint32_t>(id) < f.vocab_size(), "a sampled id outside [0, vocab_size)");
    data::check_vocab(f, 256);
    ++fuzz::accepted;
  } catch (const data::DataError&) {
    ++fuzz::refused;
  }
  return 0;
}
