// train_data.cpp — the token files of a run and the split of them into the training order's tokens
// and the held-out sequences (docs/data.md, "Held-out data"), with the refusals that need the files.
#include "runtime/train_data.hpp"

#include <cmath>
#include <cstdio>
#include <string>

#include "runtime/trainer.hpp"

namespace piper::runtime {

namespace {

// Every rank reads the token file `path` (of the config key `key`) and, with `tokenizer`, the tokenizer
// it was made with; all stop if any cannot.
std::unique_ptr<data::TokenFile> open_tokens(const std::string& path, const std::string& key,
                                             const config::Config& cfg, const MpiEnv& env,
                                             std::unique_ptr<data::Tokenizer>* tokenizer = nullptr) {
  std::unique_ptr<data::TokenFile> tokens;
  std::string data_error;
  const config::Positions at(cfg, {});
  const std::string head = at.head(key);
  try {
    tokens = std::make_unique<data::TokenFile>(path);
    if (tokenizer) *tokenizer = data::tokenizer_of(*tokens);
  } catch (const data::DataError& e) {
    data_error = head + ": " + e.what();
  }
  if (env.any(!data_error.empty()))
    throw UserError(!data_error.empty() ? data_error
                                        : head + ": another rank could not read '" + path +
                                              "'; every rank needs the token file (a shared file system or a copy per node)");
  try {  // the same file on every rank: the same answer
    data::check_vocab(*tokens, cfg.model.vocab_size);
  } catch (const data::DataError& e) {
    throw UserError(at.head("model.vocab_size") + ": " + e.what() + " (" + at.ref(key) + ")");
  }
  return tokens;
}

// A fraction for a message, rounded towards `up` or down at the sixth decimal, so that it keeps the
// side of the bound it stands for.
std::string fraction_text(double f, bool up) {
  char s[32];
  std::snprintf(s, sizeof s, "%g", (up ? std::ceil(f * 1e6) : std::floor(f * 1e6)) / 1e6);
  return s;
}

std::string sequences_text(const data::TokenFile& f, int64_t sequences, int64_t T) {
  return "'" + f.path() + "' (" + std::to_string(f.size()) + " tokens) holds " + std::to_string(sequences) +
         " whole sequence(s) of train.seq_len + 1 = " + std::to_string(T + 1) + " tokens";
}

// data.eval_fraction leaves a sequence to train on.
void check_training_left(const TrainData& d, const config::Config& cfg) {
  const data::Split& s = d.split;
  if (s.train.count > 0) return;
  const config::Positions at(cfg, {});
  const std::string head = at.head("data.eval_fraction") + ": " + sequences_text(*d.tokens, s.sequences, cfg.train.seq_len);
  if (s.sequences < 2)
    throw UserError(head + ", and holding some out needs at least 2 (one to train on, one held out); use a longer "
                    "token file, a smaller train.seq_len, or data.eval_path");
  throw UserError(head + "; holding out ceil(" + fraction_text(cfg.data.eval_fraction, false) + " x " +
                  std::to_string(s.sequences) + ") = " + std::to_string(s.held) +
                  " of them leaves none to train on; use an eval_fraction of at most " +
                  fraction_text(static_cast<double>(s.sequences - 1) / static_cast<double>(s.sequences), false));
}

// An evaluation's eval_batches x global_batch sequences are held out.
void check_enough_held_out(const TrainData& d, const config::Config& cfg) {
  const config::TrainConfig& t = cfg.train;
  const int64_t need = t.eval_batches * t.global_batch, held = d.split.held;
  if (t.eval_every == 0 || need <= held) return;
  const config::Positions at(cfg, {});
  std::string msg = at.head("train.eval_batches") + ": an evaluation reads eval_batches x global_batch = " +
                    std::to_string(t.eval_batches) + " x " + std::to_string(t.global_batch) + " = " +
                    std::to_string(need) + " held-out sequences (" + at.ref("train.global_batch") + "), but ";
  std::string fix = held >= t.global_batch ? "use eval_batches <= " + std::to_string(held / t.global_batch) + ", or "
                                           : "use ";
  if (d.held) {
    msg += at.ref("data.eval_path") + ": " + sequences_text(*d.held, held, t.seq_len);
    fix += "a held-out file of at least " + std::to_string(need * t.seq_len + 1) + " tokens";
  } else {
    msg += at.ref("data.eval_fraction") + " holds out ceil(" + fraction_text(cfg.data.eval_fraction, false) + " x " +
           std::to_string(d.split.sequences) + ") = " + std::to_string(held) + " of the " +
           std::to_string(d.split.sequences) + " whole sequences of '" + d.tokens->path() + "'";
    fix += need < d.split.sequences
               ? "an eval_fraction of at least " +
                     fraction_text(static_cast<double>(need) / static_cast<double>(d.split.sequences), true)
               : "a longer token file";
  }
  throw UserError(msg + "; " + fix);
}

}  // namespace

TrainData open_data(const config::Config& cfg, const MpiEnv& env) {
  TrainData d;
  d.tokens = open_tokens(cfg.data.path, "data.path", cfg, env, &d.tokenizer);
  const int64_t T = cfg.train.seq_len;
  d.split = data::split_tail(d.tokens->size(), T, cfg.data.eval_fraction);
  if (!cfg.data.eval_path.empty()) {
    d.held = open_tokens(cfg.data.eval_path, "data.eval_path", cfg, env);
    if (!(d.held->tokenizer() == d.tokens->tokenizer()))
      throw UserError(config::Positions(cfg, {}).head("data.eval_path") + ": '" + cfg.data.eval_path +
                      "' was made with the " + data::kind_name(d.held->tokenizer().kind) + " tokenizer (hash " +
                      std::to_string(d.held->tokenizer().hash) + "), data.path '" + cfg.data.path + "' with the " +
                      data::kind_name(d.tokens->tokenizer().kind) + " tokenizer (hash " +
                      std::to_string(d.tokens->tokenizer().hash) +
                      "); prepare the held-out text with the training data's model (piper prepare --tokenizer)");
    d.split.held = data::sequence_count(d.held->size(), T);
    d.split.held_out = d.held->all();
  }
  check_training_left(d, cfg);
  check_enough_held_out(d, cfg);
  return d;
}

}  // namespace piper::runtime
