// validate.cpp — the rules a config owns: every value in its range and bound, the model's sizes
// against each other, the strategy's sizes against the world size and the batch (docs/config.md).
// The rules of schedules, stages and hand-written orders are the IR's (ir::validate).
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <tuple>

#include "config/checked.hpp"
#include "config/internal.hpp"

namespace piper::config {
namespace {

using namespace detail;

// A switch target being checked (validate_switch): every message starts at the target or at one of
// its own keys.
struct Scope {
  std::string head;           // "config.yaml:30:5: switch[1]", or the switch file's path
  std::string prefix;         // what its paths are named under: "switch[1]." or ""
  std::set<std::string> own;  // the "parallel.*" keys the target sets, itself or by its directives
};

// Messages about the keys of a config, and the checks that write them.
class Checker {
 public:
  explicit Checker(Positions where, std::optional<Scope> scope = std::nullopt)
      : where_(std::move(where)), scope_(std::move(scope)) {}

  std::string head(const std::string& key) const { return own(key) ? where_.head(key) : scope_->head + ": " + ref(key); }
  std::string head(const std::string& key, const std::string& shown) const {
    return own(key) ? where_.head(key, shown) : scope_->head + ": " + shown;
  }
  std::string ref(const std::string& key) const { return where_.ref(key); }
  std::string at(const std::string& path) const { return scope_ ? where_.at(path, scope_->prefix + path) : where_.at(path); }
  // What starts a message that heads with no key: "" for a config, the target's head for a switch.
  std::string origin() const { return scope_ ? scope_->head + ": " : ""; }

  void fail(const std::string& msg) { errors_.push_back(msg); }
  const std::vector<std::string>& errors() const { return errors_; }


  bool at_least(const std::string& key, int64_t v, int64_t lo) {
    if (v >= lo) return true;
    fail(head(key) + ": must be at least " + std::to_string(lo));
    return false;
  }
  // lo <= v <= hi; `why` says what the upper bound protects.
  bool within(const std::string& key, int64_t v, int64_t lo, int64_t hi, const std::string& why) {
    if (!at_least(key, v, lo)) return false;
    if (v <= hi) return true;
    fail(head(key) + ": must be at most " + std::to_string(hi) + " (" + why + "; docs/config.md, Bounds)");
    return false;
  }
  // The product of `factors` (label, value) is at most `limit`, computed in
  // checked arithmetic; else one message from `key` naming every factor and
  // the figure, with the other keys involved as references.
  bool product_within(const std::string& key, const std::vector<std::string>& others, const std::string& what,
                      const std::vector<std::pair<std::string, int64_t>>& factors, int64_t limit,
                      const std::string& limit_text) {
    std::vector<int64_t> values;
    std::string labels, numbers;
    for (const auto& [label, v] : factors) {
      values.push_back(v);
      labels += (labels.empty() ? "" : " x ") + label;
      numbers += (numbers.empty() ? "" : " x ") + std::to_string(v);
    }
    const std::optional<int64_t> p = checked_product(values);
    if (p && *p <= limit) return true;
    std::vector<std::string> refs;
    for (const std::string& k : others) refs.push_back(ref(k));
    fail(head(key) + ": " + what + " " + labels + " = " + numbers + " = " +
         (p ? std::to_string(*p) : std::string("more than 2^63")) + " is above the bound " + limit_text +
         (refs.empty() ? std::string() : " (" + join(refs, ", ") + ")") +
         "; use smaller values (docs/config.md, Bounds)");
    return false;
  }
  void real(const std::string& key, double v, double lo, bool lo_open, double hi, bool hi_open,
            const std::string& range) {
    bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok) fail(head(key) + ": must be " + range);
  }

 private:
  // A key whose own position starts its messages: every key of a config, a target's own keys.
  bool own(const std::string& key) const { return !scope_ || scope_->own.count(key) > 0; }

  Positions where_;
  std::optional<Scope> scope_;
  std::vector<std::string> errors_;
};

std::string multiples_hint(int64_t v, int64_t m) {
  const int64_t lo = v / m * m;
  if (lo > std::numeric_limits<int64_t>::max() - m) return std::to_string(lo);  // no multiple above fits
  const int64_t hi = lo + m;
  return lo > 0 ? std::to_string(lo) + " or " + std::to_string(hi) : std::to_string(hi);
}

// Divisors of n nearest to v, below and above: "32 or 64".
std::string divisors_hint(int64_t n, int64_t v) {
  int64_t below = 0, above = 0;
  for (int64_t d = std::min(v, n); d >= 1; --d)
    if (n % d == 0) { below = d; break; }
  for (int64_t d = std::max<int64_t>(v, 1); d <= n; ++d)
    if (n % d == 0) { above = d; break; }
  if (below && above && below != above) return std::to_string(below) + " or " + std::to_string(above);
  return std::to_string(below ? below : above);
}

bool pattern_ok(const std::string& pattern) {
  return !pattern.empty() && pattern.find_first_not_of("M*-E") == std::string::npos;
}

// Upper bounds of the sizes (docs/config.md, "Bounds"): far above any model
// that trains, low enough that every product piper forms from them fits 64
// bits. Whether a model fits in memory is checked by `train` before it
// allocates (src/runtime/fit.cpp).
constexpr int64_t kMaxVocab = 2147483647;            // 2^31 - 1: token ids are 32-bit
constexpr int64_t kMaxWidth = int64_t{1} << 20;      // d_model
constexpr int64_t kMaxFfn = int64_t{1} << 24;        // ffn_hidden
constexpr int64_t kMaxSmall = int64_t{1} << 16;      // heads, groups, experts
constexpr int64_t kMaxState = 4096;                  // d_state, head_dim: a P x N state per Mamba-2 head
constexpr int64_t kMaxExpand = 1024;
constexpr int64_t kMaxConv = 1024;
constexpr int64_t kMaxChunk = 4096;                  // ssd_chunk: a [chunk, chunk] scratch per thread
constexpr int64_t kMaxBlocks = 4096;                 // pattern length
constexpr int64_t kMaxMatrix = int64_t{1} << 40;     // elements of one weight matrix
constexpr const char* kMaxMatrixText = "2^40 = 1099511627776 elements for one weight matrix";
constexpr int64_t kMaxBatch = int64_t{1} << 24;      // global_batch
constexpr int64_t kMaxSeq = int64_t{1} << 24;        // seq_len
constexpr int64_t kMaxStepTokens = int64_t{1} << 36; // global_batch x seq_len
constexpr int64_t kMaxRunTokens = int64_t{1} << 62;  // steps x global_batch x seq_len
constexpr int64_t kMaxSampleTokens = int64_t{1} << 16;  // one forward pass per generated token
constexpr int64_t kMaxThreads = 4096;
constexpr int64_t kMaxRanks = int64_t{1} << 16;      // dp, tp, pp each
constexpr int64_t kMaxMicrobatches = int64_t{1} << 16;
constexpr int64_t kMaxVirtualStages = 4096;
constexpr int64_t kMaxUnitPasses = int64_t{1} << 20;  // (blocks + 2) x microbatches
constexpr double kMaxMiB = 1048576.0;                // a buffer of 1 TiB (bucket_mb, switch_buffer_mb)
constexpr double kMaxSeconds = 1e9;                  // ~31 years: fits a nanosecond clock

// The MoE keys, when the pattern has an E block: given, in bounds, top_k <= n_experts.
bool check_moe(const ModelConfig& m, Checker& ck) {
  const size_t first = m.pattern.find('E');
  ck.real("model.moe_aux_coef", m.moe_aux_coef, 0, false, HUGE_VAL, false, ">= 0 (0 = no balance loss; typical 0.01)");
  if (first == std::string::npos) return true;
  const std::string why = "the pattern \"" + m.pattern + "\" has MoE blocks (block " + std::to_string(first) + " is E)";
  bool ok = true;
  const std::tuple<const char*, int64_t, int64_t, const char*, const char*> keys[] = {
      {"model.n_experts", m.n_experts, kMaxSmall, "2^16 experts per block", "8"},
      {"model.top_k", m.top_k, kMaxSmall, "2^16 experts per token", "2"},
      {"model.moe_ffn_hidden", m.moe_ffn_hidden, kMaxFfn, "2^24, the largest expert width", "the MLP's ffn_hidden"}};
  for (auto [key, v, hi, bound, example] : keys) {
    if (v == 0) {
      ck.fail(ck.head("model.pattern", key) + ": not given; " + why + ", which need it: set " + key + " (e.g. " +
              example + ")");
      ok = false;
      continue;
    }
    ok &= ck.within(key, v, 1, hi, bound);
  }
  if (ok && m.top_k > m.n_experts) {
    ck.fail(ck.head("model.top_k") + ": " + std::to_string(m.top_k) + " experts per token, but " +
            ck.ref("model.n_experts") + " is " + std::to_string(m.n_experts) + "; use top_k <= n_experts");
    ok = false;
  }
  return ok;
}

void check_model(const ModelConfig& m, Checker& ck) {
  bool sizes_ok = true;
  const std::tuple<const char*, int64_t, int64_t, const char*> sizes[] = {
      {"model.vocab_size", m.vocab_size, kMaxVocab, "token ids are 32-bit"},
      {"model.d_model", m.d_model, kMaxWidth, "2^20, the largest model width"},
      {"model.n_heads", m.n_heads, kMaxSmall, "2^16"},
      {"model.n_kv_heads", m.n_kv_heads, kMaxSmall, "2^16"},
      {"model.ffn_hidden", m.ffn_hidden, kMaxFfn, "2^24, the largest MLP width"},
      {"model.d_state", m.d_state, kMaxState, "each Mamba-2 head holds a head_dim x d_state state"},
      {"model.head_dim", m.head_dim, kMaxState, "each Mamba-2 head holds a head_dim x d_state state"},
      {"model.expand", m.expand, kMaxExpand, "d_inner = expand x d_model"},
      {"model.n_groups", m.n_groups, kMaxSmall, "2^16"},
      {"model.d_conv", m.d_conv, kMaxConv, "the causal conv width"},
      {"model.ssd_chunk", m.ssd_chunk, kMaxChunk,
       "the SSD scan holds a chunk x chunk scratch per thread; a chunk longer than train.seq_len is one chunk"}};
  for (auto [key, v, hi, why] : sizes) sizes_ok &= ck.within(key, v, 1, hi, why);
  ck.real("model.rope_theta", m.rope_theta, 0, true, HUGE_VAL, false, "> 0 (usually 10000)");
  if (static_cast<int64_t>(m.pattern.size()) > kMaxBlocks) {
    ck.fail(ck.head("model.pattern", "model.pattern") + ": " + std::to_string(m.pattern.size()) +
            " blocks; the pattern may have at most " + std::to_string(kMaxBlocks) +
            " (docs/config.md, Bounds)");
    sizes_ok = false;
  }

  const std::string symbols = "M (Mamba-2), * (attention), - (MLP) or E (MoE)";
  if (m.pattern.empty())
    ck.fail(ck.head("model.pattern") + ": the pattern is empty; it needs one symbol per block: " + symbols);
  for (size_t i = 0; i < m.pattern.size(); ++i) {
    char s = m.pattern[i];
    if (s != 'M' && s != '*' && s != '-' && s != 'E') {
      ck.fail(ck.head("model.pattern") + ": '" + std::string(1, s) + "' (block " + std::to_string(i) +
              ") is not a block symbol; use " + symbols);
      break;
    }
  }
  sizes_ok &= check_moe(m, ck);
  if (!sizes_ok) return;

  // Weight matrices, in checked arithmetic (the sizes above keep d_inner, the
  // in_proj rows and d_model x d_model far inside 64 bits).
  const bool attn = m.has_attention(), mamba = m.has_mamba();
  sizes_ok &= ck.product_within("model.vocab_size", {"model.d_model"}, "the embedding (and head) matrix",
                                {{"vocab_size", m.vocab_size}, {"d_model", m.d_model}}, kMaxMatrix, kMaxMatrixText);
  if (m.pattern.find('-') != std::string::npos)
    sizes_ok &= ck.product_within("model.ffn_hidden", {"model.d_model"}, "the MLP gate/up matrix",
                                  {{"ffn_hidden", m.ffn_hidden}, {"d_model", m.d_model}}, kMaxMatrix, kMaxMatrixText);
  if (m.pattern.find('E') != std::string::npos)
    sizes_ok &= ck.product_within("model.n_experts", {"model.moe_ffn_hidden", "model.d_model"},
                                  "the stacked expert gate/up tensor",
                                  {{"n_experts", m.n_experts}, {"moe_ffn_hidden", m.moe_ffn_hidden},
                                   {"d_model", m.d_model}},
                                  kMaxMatrix, kMaxMatrixText);
  if (mamba)
    sizes_ok &= ck.product_within(
        "model.d_model", {"model.expand", "model.n_groups", "model.d_state", "model.head_dim"},
        "the Mamba-2 in_proj matrix",
        {{"(2 d_inner + 2 n_groups d_state + heads)", m.in_proj_rows()}, {"d_model", m.d_model}}, kMaxMatrix,
        kMaxMatrixText);
  if (!sizes_ok) return;

  if (attn) {
    if (m.d_model % m.n_heads != 0) {
      ck.fail(ck.head("model.d_model") + ": not divisible by " + ck.ref("model.n_heads") +
              "; attention needs whole heads: use d_model " + multiples_hint(m.d_model, m.n_heads) +
              ", or n_heads " + divisors_hint(m.d_model, m.n_heads));
    } else if (m.attn_head_dim() % 2 != 0) {
      ck.fail(ck.head("model.d_model") + ": attention head dim d_model/n_heads = " + std::to_string(m.d_model) +
              "/" + std::to_string(m.n_heads) + " = " + std::to_string(m.attn_head_dim()) +
              " is odd; RoPE rotates pairs of channels, so it must be even (change d_model or " +
              ck.ref("model.n_heads") + ")");
    }
    if (m.n_heads % m.n_kv_heads != 0)
      ck.fail(ck.head("model.n_heads") + ": not divisible by " + ck.ref("model.n_kv_heads") +
              "; grouped-query attention shares each kv head among n_heads/n_kv_heads query heads: use n_kv_heads " +
              divisors_hint(m.n_heads, m.n_kv_heads));
  }
  if (mamba) {
    int64_t di = m.d_inner();
    std::string di_text = "d_inner = expand(" + std::to_string(m.expand) + ") x d_model(" +
                          std::to_string(m.d_model) + ") = " + std::to_string(di);
    if (di % m.head_dim != 0) {
      ck.fail(ck.head("model.head_dim") + ": does not divide " + di_text + "; use head_dim " +
              divisors_hint(di, m.head_dim));
    } else if (m.mamba_heads() % m.n_groups != 0) {
      ck.fail(ck.head("model.n_groups") + ": does not divide the Mamba-2 head count d_inner/head_dim = " +
              std::to_string(di) + "/" + std::to_string(m.head_dim) + " = " + std::to_string(m.mamba_heads()) +
              "; use n_groups " + divisors_hint(m.mamba_heads(), m.n_groups));
    } else if (di % m.n_groups != 0) {
      ck.fail(ck.head("model.n_groups") + ": does not divide " + di_text + "; use n_groups " +
              divisors_hint(di, m.n_groups));
    }
  }
}

void check_train(const TrainConfig& t, Checker& ck) {
  bool sizes_ok = ck.at_least("train.steps", t.steps, 1);
  sizes_ok &= ck.within("train.global_batch", t.global_batch, 1, kMaxBatch, "2^24 sequences per step");
  sizes_ok &= ck.within("train.seq_len", t.seq_len, 1, kMaxSeq, "2^24 tokens per sequence");
  if (sizes_ok &&
      ck.product_within("train.global_batch", {"train.seq_len"}, "the tokens per step",
                        {{"global_batch", t.global_batch}, {"seq_len", t.seq_len}}, kMaxStepTokens,
                        "2^36 = 68719476736 tokens per step"))
    ck.product_within("train.steps", {"train.global_batch", "train.seq_len"}, "the tokens of the run",
                      {{"steps", t.steps}, {"global_batch", t.global_batch}, {"seq_len", t.seq_len}}, kMaxRunTokens,
                      "2^62 tokens (the sample index of the data order is 64-bit)");
  ck.real("train.lr", t.lr, 0, true, HUGE_VAL, false, "> 0 (typical: 1e-4 .. 3e-3)");
  ck.real("train.min_lr_ratio", t.min_lr_ratio, 0, false, 1, false, "in [0, 1]");
  ck.real("train.weight_decay", t.weight_decay, 0, false, HUGE_VAL, false, ">= 0 (0 = none)");
  ck.real("train.beta1", t.beta1, 0, false, 1, true, "in [0, 1) (typical: 0.9)");
  ck.real("train.beta2", t.beta2, 0, false, 1, true, "in [0, 1) (typical: 0.95)");
  ck.real("train.eps", t.eps, 0, true, HUGE_VAL, false, "> 0 (typical: 1e-8)");
  ck.real("train.grad_clip", t.grad_clip, 0, false, HUGE_VAL, false, ">= 0 (0 = no clipping)");
  ck.at_least("train.warmup_steps", t.warmup_steps, 0);
  ck.at_least("train.log_every", t.log_every, 1);
  ck.at_least("train.sample_every", t.sample_every, 0);
  ck.within("train.sample_tokens", t.sample_tokens, 1, kMaxSampleTokens, "2^16 tokens per generated sample, one forward pass each");
  ck.within("train.threads", t.threads, 0, kMaxThreads, "OpenMP threads per rank");
  ck.real("train.switch_buffer_mb", t.switch_buffer_mb, 0, true, kMaxMiB, false,
          "> 0 and at most 1048576 MiB (1 TiB) (typical: 64)");
  ck.at_least("train.standby", t.standby, 0);
  ck.real("train.switch_tune_s", t.switch_tune_s, 0, true, kMaxSeconds, false, "> 0 and at most 1e9 seconds");
  if (!t.switch_hardware.empty() && !t.switch_cost.empty())
    ck.fail(ck.head("train.switch_cost") + ": give train.switch_hardware or train.switch_cost, not both (" +
            ck.ref("train.switch_hardware") + "); the tuner takes its costs from one of them");
}

// Held-out data and its evaluation (docs/data.md, "Held-out data"). What the token files hold (enough
// sequences to train on and to evaluate) is checked by train once it has opened them.
void check_eval(const Config& c, Checker& ck) {
  const TrainConfig& t = c.train;
  const DataConfig& d = c.data;
  ck.real("data.eval_fraction", d.eval_fraction, 0, false, 1, true,
          "in [0, 1): the share of the token file's sequences held out (0 = none; 1 would leave nothing to "
          "train on; typical: 0.01)");
  if (d.eval_fraction > 0 && !d.eval_path.empty())
    ck.fail(ck.head("data.eval_path") + ": give data.eval_fraction or data.eval_path, not both (" +
            ck.ref("data.eval_fraction") + "); the held-out sequences come from one of them");
  const bool every_ok = ck.at_least("train.eval_every", t.eval_every, 0);
  if (ck.within("train.eval_batches", t.eval_batches, 1, kMaxBatch, "2^24 batches per evaluation") &&
      t.global_batch >= 1 && t.seq_len >= 1)
    ck.product_within("train.eval_batches", {"train.global_batch", "train.seq_len"}, "the tokens of an evaluation",
                      {{"eval_batches", t.eval_batches}, {"global_batch", t.global_batch}, {"seq_len", t.seq_len}},
                      kMaxRunTokens, "2^62 tokens (the sample index of the held-out data is 64-bit)");
  if (every_ok && t.eval_every > 0 && d.eval_fraction == 0 && d.eval_path.empty())
    ck.fail(ck.head("train.eval_every") + ": evaluates on held-out data, and there is none: set "
            "data.eval_fraction (e.g. 0.01, the last 1% of the token file's sequences) or data.eval_path (a token "
            "file of held-out sequences)");
}

// "file:line:col: path" for a path of the target's locations ("switch[1].at_step"), or "path".
std::string target_at(const SwitchTarget& t, const std::string& path) {
  auto it = t.locations.find(path);
  return it == t.locations.end() ? path : it->second + ": " + path;
}

// What a target says besides its strategy: the ranks it runs at and the ranks that leave.
void check_target_ranks(const SwitchTarget& t, const std::string& prefix, Checker& ck) {
  if (t.world && *t.world < 1)
    ck.fail(target_at(t, prefix + "world") + "=" + std::to_string(*t.world) +
            ": must be at least 1 (the ranks of the new strategy)");
  std::set<int64_t> seen;
  for (int64_t r : t.leave) {
    if (r < 0)
      ck.fail(target_at(t, prefix + "leave") + ": " + std::to_string(r) +
              " is no job rank; ranks count from 0, as mpirun numbers them");
    else if (!seen.insert(r).second)
      ck.fail(target_at(t, prefix + "leave") + ": rank " + std::to_string(r) + " is listed twice; list it once");
  }
}

// The `switch:` entries: each at a step of the run, in step order, with a strategy or the tuner's
// inputs to choose one. Their strategies are checked by validate_switch, at the world each runs at.
void check_switches(const Config& c, Checker& ck) {
  for (size_t i = 0; i < c.switches.size(); ++i) {
    const SwitchTarget& t = c.switches[i];
    const std::string path = spath(i);
    const std::string step = target_at(t, path + ".at_step") + "=" + std::to_string(t.at_step);
    if (t.at_step < 1 || t.at_step >= c.train.steps)
      ck.fail(step + ": must be at least 1 and less than " + ck.ref("train.steps") +
              ": steps 0..at_step-1 run before the switch");
    else if (i > 0 && t.at_step <= c.switches[i - 1].at_step)
      ck.fail(step + ": must be above " + spath(i - 1) + ".at_step=" + std::to_string(c.switches[i - 1].at_step) +
              "; list the entries in step order, one switch per step");
    check_target_ranks(t, path + ".", ck);
    if (!t.has_strategy() && c.train.switch_hardware.empty() && c.train.switch_cost.empty())
      ck.fail(target_at(t, path) + " has no strategy, so the tuner chooses one; set train.switch_hardware or "
              "train.switch_cost");
  }
}

// ep: carved out of dp (it divides dp), and whole experts per ep rank; only for a model with MoE blocks.
void check_expert_parallel(const Config& c, Checker& ck) {
  const ParallelConfig& p = c.parallel;
  const ModelConfig& m = c.model;
  if (p.ep == 1) return;
  if (m.pattern.find('E') == std::string::npos) {
    ck.fail(ck.head("parallel.ep") + ": " + std::to_string(p.ep) + " expert-parallel ranks, but the pattern \"" +
            m.pattern + "\" has no MoE block (E) whose experts they would split; use ep 1 or add E blocks");
    return;
  }
  if (p.dp % p.ep != 0)
    ck.fail(ck.head("parallel.ep") + ": " + std::to_string(p.ep) + " does not divide " + ck.ref("parallel.dp") +
            "; expert parallelism is carved out of the data-parallel ranks (groups of ep "
            "consecutive dp ranks): use ep " + divisors_hint(p.dp, p.ep) + ", or dp " + multiples_hint(p.dp, p.ep));
  if (m.n_experts > 0 && m.n_experts % p.ep != 0)
    ck.fail(ck.head("parallel.ep") + ": " + ck.ref("model.n_experts") + " does not split into " + std::to_string(p.ep) + " equal groups of whole experts; use ep " +
            divisors_hint(m.n_experts, p.ep));
}

void check_parallel(const Applied& a, int world_size, Checker& ck) {
  const Config& c = a.cfg;
  const ParallelConfig& p = c.parallel;
  const std::string ranks_why = "2^16 ranks along one axis of the rank grid";
  bool dims_ok = ck.within("parallel.dp", p.dp, 1, kMaxRanks, ranks_why);
  dims_ok &= ck.within("parallel.tp", p.tp, 1, kMaxRanks, ranks_why);
  dims_ok &= ck.within("parallel.pp", p.pp, 1, kMaxRanks, ranks_why);
  dims_ok &= ck.within("parallel.ep", p.ep, 1, kMaxRanks, ranks_why);
  bool mb_ok = ck.within("parallel.microbatches", p.microbatches, 1, kMaxMicrobatches, "2^16 microbatches per step");
  ck.within("parallel.virtual_stages", p.virtual_stages, 1, kMaxVirtualStages, "model chunks per rank");
  bool zero_ok = p.zero >= 0 && p.zero <= 3;
  if (!zero_ok) ck.fail(ck.head("parallel.zero") + ": must be 0, 1, 2 or 3 (ZeRO stage)");

  // The plan holds a node per unit, microbatch and pass: its size, and the time to build it.
  if (mb_ok && pattern_ok(c.model.pattern))
    ck.product_within("parallel.microbatches", {"model.pattern"}, "the unit passes of a step",
                      {{"(blocks + 2)", static_cast<int64_t>(c.model.pattern.size()) + 2},
                       {"microbatches", p.microbatches}},
                      kMaxUnitPasses, "2^20 = 1048576 (the plan holds nodes for each unit and microbatch)");
  // dims_ok and mb_ok bound these products far inside 64 bits; checked all the same.
  const int64_t dp_mb = checked_product({p.dp, p.microbatches}).value_or(INT64_MAX);
  const int64_t dp_tp_pp = checked_product({p.dp, p.tp, p.pp}).value_or(INT64_MAX);
  if (dims_ok && mb_ok && c.train.global_batch >= 1 && c.train.global_batch % dp_mb != 0) {
    int64_t m = dp_mb;
    ck.fail(ck.head("train.global_batch") + ": not divisible by dp x microbatches = " + std::to_string(p.dp) +
            " x " + std::to_string(p.microbatches) + " = " + std::to_string(m) + " (" + ck.ref("parallel.dp") +
            ", " + ck.ref("parallel.microbatches") + "); use global_batch " +
            multiples_hint(c.train.global_batch, m));
  }

  if (world_size < 1) ck.fail(ck.origin() + "world size " + std::to_string(world_size) + " must be at least 1");
  if (dims_ok && world_size >= 1 && dp_tp_pp != world_size) {
    const std::string prod = std::to_string(dp_tp_pp);
    const std::string run = ck.origin().empty() ? "launch " + prod + " ranks (mpirun -n " + prod + ")"
                                                : "run it at " + prod + " ranks (world: " + prod + ")";
    ck.fail(ck.origin() + "world size " + std::to_string(world_size) + " != dp(" + std::to_string(p.dp) + ") x tp(" +
            std::to_string(p.tp) + ") x pp(" + std::to_string(p.pp) + ") = " + prod + "; " + run + " or change " +
            ck.ref("parallel.dp") + ", " + ck.ref("parallel.tp") + ", " + ck.ref("parallel.pp") +
            " so that their product is " + std::to_string(world_size));
  }

  if (dims_ok) check_expert_parallel(c, ck);
  if (dims_ok && p.tp > 1) {
    // Megatron's rules: whole heads, kv heads, groups and vocabulary rows per tp rank.
    const ModelConfig& m = c.model;
    auto need = [&](const char* what, int64_t n, const std::string& key) {
      if (n % p.tp != 0)
        ck.fail(ck.head("parallel.tp") + ": " + what + " (" + key + " = " +
                std::to_string(n) + ") must divide by tp; use a tp that divides " + std::to_string(n));
    };
    const bool attn = m.has_attention(), mamba = m.has_mamba();
    need("the vocabulary (vocab-parallel embedding and head)", m.vocab_size, "model.vocab_size");
    if (attn) need("the attention heads", m.n_heads, "model.n_heads");
    if (attn) need("the key/value heads", m.n_kv_heads, "model.n_kv_heads");
    if (m.pattern.find('-') != std::string::npos) need("the MLP hidden size", m.ffn_hidden, "model.ffn_hidden");
    // Experts are tensor-parallel inside (each expert's hidden size split over tp, as the MLP's).
    if (m.pattern.find('E') != std::string::npos && m.moe_ffn_hidden > 0)
      need("the expert hidden size (experts are split over tp inside)", m.moe_ffn_hidden, "model.moe_ffn_hidden");
    if (mamba && m.head_dim > 0) need("the Mamba-2 heads", m.mamba_heads(), "d_inner / head_dim");
    if (mamba) need("the Mamba-2 groups", m.n_groups, "model.n_groups");
  }
  if (zero_ok && p.zero > 0 && dims_ok && p.dp == 1)
    ck.fail(ck.head("parallel.zero") +
            ": ZeRO shards over data-parallel ranks and " + ck.ref("parallel.dp") + "; use dp >= 2 or zero 0");
  for (const EffectiveStrategy::Subset& sub : a.zero_subsets)
    if (sub.value > 0 && dims_ok && p.dp == 1)
      ck.fail(ck.at(sub.path + ".filter") + ": ZeRO shards over data-parallel ranks and " + ck.ref("parallel.dp") +
              "; use dp >= 2 or leave out the shard_* keys");
  ck.real("parallel.bucket_mb", p.bucket_mb, 0, true, kMaxMiB, false,
          "> 0 and at most 1048576 MiB (1 TiB) (typical: 25)");
  ck.real("parallel.comm_timeout_s", p.comm_timeout_s, 0, true, kMaxSeconds, false,
          "> 0 and at most 1e9 seconds");
  if (p.order.empty()) ck.fail(ck.head("parallel.order") + ": empty; use e.g. tp-dp-pp");
}

// The names of a key's values, in its enum's order.
constexpr const char* kPrecisionNames[] = {"fp32", "tf32", "bf16"};
constexpr const char* kDeviceNames[] = {"cpu", "cuda", "cpu_detached"};
constexpr const char* kDeviceCommNames[] = {"auto", "nccl", "mpi"};

template <class E, size_t N>
std::optional<E> enum_named(const char* const (&names)[N], const std::string& name) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

// "'a', 'b' or 'c'", for messages.
template <size_t N>
std::string listed(const char* const (&names)[N]) {
  std::string out;
  for (size_t i = 0; i < N; ++i) out += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + "'" + names[i] + "'";
  return out;
}

// The value of `key` in its enum; throws ConfigError naming the key and its names.
template <class E, size_t N>
E enum_of(const char* const (&names)[N], const char* key, const std::string& value) {
  if (auto e = enum_named<E>(names, value)) return *e;
  throw ConfigError(std::string(key) + ": must be " + listed(names) + ", not '" + value + "'");
}

}  // namespace

std::optional<Precision> precision_named(const std::string& name) { return enum_named<Precision>(kPrecisionNames, name); }

std::string precision_names() { return listed(kPrecisionNames); }

Precision precision_of(const TrainConfig& train) {
  return enum_of<Precision>(kPrecisionNames, "train.precision", train.precision);
}

std::optional<Device> device_named(const std::string& name) { return enum_named<Device>(kDeviceNames, name); }

Device device_of(const TrainConfig& train) { return enum_of<Device>(kDeviceNames, "train.device", train.device); }

std::vector<std::string> device_names() { return {std::begin(kDeviceNames), std::end(kDeviceNames)}; }

const char* device_name(Device d) { return kDeviceNames[static_cast<size_t>(d)]; }

std::optional<DeviceComm> device_comm_named(const std::string& name) {
  return enum_named<DeviceComm>(kDeviceCommNames, name);
}

DeviceComm device_comm_of(const TrainConfig& train) {
  return enum_of<DeviceComm>(kDeviceCommNames, "train.device_comm", train.device_comm);
}

bool stores_in_bf16(Precision p) { return p == Precision::PRECISION_BF16; }

int storage_bytes(Precision p) { return stores_in_bf16(p) ? 2 : 4; }

void validate(const Config& cfg, int world_size) {
  // Parallel values are checked as the directives leave them, and named by the directive that set them.
  const Applied a = apply_directives(cfg);
  Checker ck(Positions(a.cfg, a.names));
  check_model(cfg.model, ck);
  check_train(cfg.train, ck);
  ck.at_least("checkpoint.every", cfg.checkpoint.every, 0);
  ck.at_least("checkpoint.keep", cfg.checkpoint.keep, 1);
  if (cfg.checkpoint.on_error != "stop" && cfg.checkpoint.on_error != "continue")
    ck.fail(ck.head("checkpoint.on_error") + ": must be 'stop' (end the job, exit 3) or 'continue' (warn and "
            "train on without that checkpoint), not '" + cfg.checkpoint.on_error + "'");
  const std::optional<Device> device = device_named(cfg.train.device);
  if (!device)
    ck.fail(ck.head("train.device") + ": must be " + listed(kDeviceNames) + " (cuda: each rank's GPU; cpu_detached: "
            "the CPU backend with its memory out of the host's reach, docs/backend.md), not '" + cfg.train.device + "'");
  const std::optional<DeviceComm> device_comm = device_comm_named(cfg.train.device_comm);
  if (!device_comm)
    ck.fail(ck.head("train.device_comm") + ": must be " + listed(kDeviceCommNames) +
            " (mpi: host staging; docs/comm.md), not '" + cfg.train.device_comm + "'");
  else if (*device_comm == DeviceComm::DEVICE_COMM_NCCL && device != Device::DEVICE_CUDA)
    ck.fail(ck.head("train.device_comm") + ": 'nccl' moves GPU tensors and needs train.device: " +
            device_name(Device::DEVICE_CUDA) + ", not '" + cfg.train.device + "'; use 'auto'");
  if (!precision_named(cfg.train.precision))
    ck.fail(ck.head("train.precision") + ": must be " + precision_names() +
            " (the matrix products' inputs and the activations' storage; docs/backend.md), not '" +
            cfg.train.precision + "'");
  if (cfg.data.path.empty()) ck.fail(ck.head("data.path") + ": must name the token file (docs/data.md)");
  check_eval(cfg, ck);
  check_parallel(a, world_size, ck);
  check_switches(cfg, ck);
  if (!ck.errors().empty()) throw ConfigError(join(ck.errors(), "\n"));
}

void validate_switch(const Config& current, const SwitchTarget& target, int world) {
  const std::string prefix = target.path().empty() ? "" : target.path() + ".";
  Scope scope{target.path().empty() ? target.source : target_at(target, target.path()), prefix, {}};
  const Applied a = apply_directives(apply_switch(current, target));
  // The target's own keys are named by its paths: switch[1].parallel.dp, switch[1].directives[0].replicate.dp.
  std::map<std::string, std::string> names;
  for (const std::string& key : target.parallel_keys()) names["parallel." + key] = prefix + "parallel." + key;
  for (const auto& [key, name] : a.names) names[key] = prefix + name;
  for (const auto& [key, name] : names) scope.own.insert(key);
  Checker ck(Positions(a.cfg, names), scope);
  check_target_ranks(target, prefix, ck);
  if (target.has_strategy()) check_parallel(a, world, ck);
  if (!ck.errors().empty()) throw ConfigError(join(ck.errors(), "\n"));
}

}  // namespace piper::config
