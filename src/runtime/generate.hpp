// generate.hpp — `piper generate`: a checkpoint of any strategy, loaded on one process, continues a
// prompt with the tokenizer the checkpoint records (docs/data.md, "Generating text").
#pragma once

#include <cstdint>
#include <string>

#include "runtime/mpi_env.hpp"

namespace piper::runtime {

struct GenerateOptions {
  std::string checkpoint;  // a .h5 file, a folder, or its `latest` pointer
  std::string prompt;
  int64_t tokens = 200;     // new tokens
  float temperature = 0.8f; // 0: greedy
  int64_t top_k = 0;        // sample among the k most likely tokens; 0: all
  uint64_t seed = 0;
  std::string device = "cpu";  // train.device for the run (the checkpoint's own is where it was trained)
};

struct Generated {
  std::string text;        // the prompt and its continuation, safe to print
  std::string tokenizer;   // its kind
  int64_t step = 0;        // of the checkpoint
  int64_t prompt_tokens = 0, new_tokens = 0;
};

// Reads the checkpoint's config and tokenizer, builds its model as one rank holding every unit,
// loads the parameters (from whatever strategy wrote them) and samples. Throws UserError: more
// than one process, an empty prompt, a checkpoint that cannot be read, or one whose prompt does
// not encode to any token.
Generated generate(const GenerateOptions& options, const MpiEnv& env);

}  // namespace piper::runtime
