// config.hpp — the resolved configuration of a run: model, training, data and
// parallel strategy. Parsed from one YAML file plus `--set key=value`
// overrides, validated once, then passed down by value. Only src/config
// includes yaml-cpp. Every field documents itself here; docs/config.md lists
// them for users.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace piper::config {

// Model sizes (docs/model.md). Derived sizes are methods, not fields.
struct ModelConfig {
  std::string pattern = "M-M*M-M-";  // one symbol per block: M mamba2, * attention, - mlp, E moe
  int64_t vocab_size = 256;          // V
  int64_t d_model = 256;             // D
  int64_t n_heads = 8;               // H (attention)
  int64_t n_kv_heads = 4;            // KV (attention), H % KV == 0
  int64_t ffn_hidden = 768;          // F (MLP)
  int64_t d_state = 32;              // N (mamba2)
  int64_t head_dim = 32;             // P (mamba2 head dim)
  int64_t expand = 2;                // d_inner = expand * D
  int64_t n_groups = 1;              // G (mamba2 B/C groups)
  int64_t d_conv = 4;                // K (mamba2 conv width)
  double rope_theta = 10000.0;
  int64_t ssd_chunk = 32;            // chunk length of the SSD scan (speed only, not numerics)
  // MoE blocks ('E'); a pattern with E needs the first three (0: not given).
  int64_t n_experts = 0;             // E
  int64_t top_k = 0;                 // K experts per token, <= n_experts
  int64_t moe_ffn_hidden = 0;        // F of each expert
  double moe_aux_coef = 0.01;        // weight of the sequence-wise balance loss

  int64_t n_blocks() const { return static_cast<int64_t>(pattern.size()); }
  bool has_attention() const { return pattern.find('*') != std::string::npos; }
  bool has_mamba() const { return pattern.find('M') != std::string::npos; }
  int64_t attn_head_dim() const { return d_model / n_heads; }       // hd
  int64_t d_inner() const { return expand * d_model; }
  int64_t mamba_heads() const { return d_inner() / head_dim; }      // Hm
  int64_t conv_channels() const { return d_inner() + 2 * n_groups * d_state; }
  int64_t in_proj_rows() const { return 2 * d_inner() + 2 * n_groups * d_state + mamba_heads(); }

  bool operator==(const ModelConfig&) const = default;
};

// Optimisation and the step loop.
struct TrainConfig {
  int64_t steps = 100;          // optimiser steps
  int64_t global_batch = 8;     // sequences per step, over all ranks and microbatches
  int64_t seq_len = 256;        // T
  double lr = 3e-3;             // peak learning rate
  double min_lr_ratio = 0.1;    // cosine decays to lr * min_lr_ratio at the last step
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;       // global-norm clip; 0 = off
  int64_t warmup_steps = 10;    // linear warmup from lr/warmup_steps to lr
  uint64_t seed = 1234;         // initialisation seed
  int64_t log_every = 1;        // progress line every N steps
  int64_t sample_every = 0;     // generate a text sample every N steps; 0 = off
  int64_t sample_tokens = 64;   // length of a generated sample
  int64_t threads = 0;          // OpenMP threads per rank; 0 = leave OMP_NUM_THREADS / default
  // Where a rank's tensors live and its ops run (docs/backend.md): cpu | cuda (the rank's GPU) |
  // cpu_detached (the CPU backend with its memory out of the host's reach, a check of the runtime).
  // Read by device_of.
  std::string device = "cpu";
  // How tensors on a device the host cannot address travel between ranks (docs/comm.md, "Device
  // buffers"): auto (NCCL where every rank has a GPU of its own, else mpi) | nccl | mpi (the MPI
  // communicator through page-locked host staging; two ranks may share a GPU). Read by device_comm_of.
  std::string device_comm = "auto";
  // The precision of the computation (docs/backend.md): fp32 | tf32 (TF32 product inputs where the device
  // has TF32 units; the CPU computes fp32) | bf16 (bf16 parameters, product inputs and stored activations;
  // fp32 accumulation, master weights, gradients, optimiser state and checkpoints). Read by precision_of.
  std::string precision = "fp32";
  // Held-out evaluation (docs/data.md, "Held-out data"): the mean loss over the first eval_batches
  // global batches of the held-out sequences, after every eval_every-th step and the last.
  int64_t eval_every = 0;       // 0 = off; > 0 needs held-out data (data.eval_fraction or data.eval_path)
  int64_t eval_batches = 4;     // held-out batches of global_batch sequences each (>= 1)
  // Online strategy switching (docs/switching.md): the `switch:` list and a switch file.
  std::string switch_file;        // a strategy file read at every step boundary when it appears or changes ("" = none)
  double switch_buffer_mb = 64;   // staging memory per rank for moving state in a switch, MiB (> 0)
  int64_t standby = 0;            // the last N ranks of the job start in reserve, for a grow (>= 0, < job size)
  std::string switch_hardware;    // the tuner's hardware (a table name or a file) for a switch without a strategy
  std::string switch_cost;        // or the tuner's cost file (piper calibrate); at most one of the two
  double switch_tune_s = 10;      // the tuner's time budget for such a switch (> 0)

  bool operator==(const TrainConfig&) const = default;
};

// Checkpoints (docs/checkpoint.md): one HDF5 file per save in `dir`.
struct CheckpointConfig {
  std::string dir;          // where checkpoints go; "" = no checkpoints
  int64_t every = 0;        // save every N optimiser steps (and at the end); 0 = only at the end and on a signal
  int64_t keep = 3;         // keep the newest N checkpoints
  bool async = false;       // write in the background; the step loop waits only for the copy
  bool direct_io = true;    // write whole pages with O_DIRECT where the file system allows it
  std::string on_error = "stop";  // a failed save: stop (exit 3) | continue (warn, keep training)

  bool operator==(const CheckpointConfig&) const = default;
};

struct DataConfig {
  std::string path = "build/data/corpus.tok";  // token file (docs/data.md)
  // Held-out data, at most one of the two (docs/data.md, "Held-out data").
  double eval_fraction = 0.0;  // the last ceil(eval_fraction x sequences) of `path` held out, in [0, 1)
  std::string eval_path;       // or a token file of held-out sequences ("" = none)

  bool operator==(const DataConfig&) const = default;
};

// The parallel strategy shorthand. At world size 1 only dp=tp=pp=1, zero=0 work.
struct ParallelConfig {
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t ep = 1;                   // expert parallelism, carved out of dp (ep divides dp)
  int64_t zero = 0;                 // 0..3
  std::string schedule = "1f1b";    // a pipeline schedule of ir::schedule_names() (docs/schedules.md)
  int64_t microbatches = 1;         // split of the per-replica batch (gradient accumulation)
  int64_t virtual_stages = 1;
  bool split_backward = false;      // emit BWD_I + BWD_W instead of fused BWD
  bool pairs = false;               // the schedule's steady-phase forward/backward pairs run interleaved (docs/schedules.md)
  std::string order = "tp-dp-pp";   // rank grid order, first varies fastest (Megatron's RankGenerator)
  double bucket_mb = 25.0;          // data-parallel gradient bucket size, MiB
  double comm_timeout_s = 300.0;    // a communication pending longer aborts the job
  std::string recompute = "none";   // activation recomputation of every block: none | selective | full

  bool operator==(const ParallelConfig&) const = default;
};

// ---- directives (docs/directives.md) -------------------------------------------
// The optional `directives:` section: the parallel strategy written as the
// rewrites the IR applies (split, place, replicate, shard, order, grid), in the
// order written. Each directive overrides the `parallel:` shorthand values it
// sets; fields no directive sets keep the shorthand's values. Parsed here into
// plain values (the IR does not see YAML); ir::expand applies them.

// A filter over the tags every DAG node carries (ir::Tags): which units (and,
// for directives that act on passes, which microbatches and passes) a
// directive applies to. A unit matches when it passes every key given; an
// empty key matches anything. Stage i of `place: {stages: [...]}` is a filter,
// and split_backward, replicate and recompute take one inline, beside their own keys
// (docs/directives.md). ir::selects says what a filter selects.
struct Filter {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;  // inclusive index ranges: 3 is {3, 3}, "3-7" {3, 7}
  Ranges stages;                    // pipeline stages
  Ranges microbatches;
  std::vector<std::string> passes;  // "F", "B", "BI", "BW"
  std::vector<std::string> units;   // a unit index as `piper plan` lists them ("0"), or a unit name ("layers.3")
  Ranges blocks;                    // block indices (never the embedding or the head)
  std::vector<std::string> kinds;   // "M", "*", "-", "E", "embed", "head"
  bool empty() const {
    return stages.empty() && microbatches.empty() && passes.empty() && units.empty() && blocks.empty() && kinds.empty();
  }
  bool operator==(const Filter&) const = default;
};

// One op of a hand-written schedule, as ir::pipe_op_name prints it: "F3",
// "B3", "BI3", "BW3", "F3.1" (chunk 1 of the rank), "F3/4-6" (units 4..6 of
// the stage only), and in a group (a YAML list inside the rank's list,
// "[F3, B1]") the ops after the first are `grouped`.
struct OrderOp {
  std::string pass = "F";  // F, B (fused backward), BI (input gradients), BW (weight gradients)
  int64_t microbatch = 0;
  int64_t chunk = 0;       // model chunk of the rank, 0 when not written
  int64_t first_unit = -1, last_unit = -1;  // a range of the stage's units; -1 when not written: all of them
  bool grouped = false;    // runs interleaved with the op before it (same group)
  std::string name(bool with_chunk) const;
  bool operator==(const OrderOp&) const = default;
};

// One rank's ops as an order lists them, the ops of a group in brackets: `ops[i]` is an op's
// name, `grouped[i]` says it runs with the one before. "F0, [F3, B1], B2".
std::string order_text(const std::vector<std::string>& ops, const std::vector<bool>& grouped);

enum class DirectiveKind : uint8_t { SPLIT, SPLIT_BACKWARD, PLACE, REPLICATE, SHARD, ORDER, GRID, RECOMPUTE };
const char* directive_name(DirectiveKind k);  // "split", "split_backward", "place", ...

// One list item of `directives:`; only the fields of its kind can be set, and
// only the keys written are (std::nullopt: keep the value so far).
struct Directive {
  DirectiveKind kind = DirectiveKind::SPLIT;
  std::optional<int64_t> microbatches;                     // split
  std::optional<bool> split_backward;                       // split_backward: BOOL
  std::optional<int64_t> pp, virtual_stages;                // place
  std::optional<std::vector<int64_t>> stage_of_unit;        // place, by unit (embed, blocks, head)
  std::optional<std::vector<Filter>> stages;                // place, stage i = the units stages[i] selects
  std::optional<std::vector<int64_t>> rank_of_stage;        // place: {ranks: [...]}, the pipeline rank of each stage
  std::optional<int64_t> dp;                                // replicate
  std::optional<bool> shard_optimizer, shard_grads, shard_params;  // replicate: ZeRO 1, 2, 3
  std::optional<double> bucket_mb;                          // replicate
  std::optional<int64_t> tp, ep;                            // shard
  std::optional<std::string> schedule;                      // order: a named schedule
  std::optional<bool> pairs;                                // order: the named schedule's F&B pairs interleave
  std::optional<std::vector<std::vector<OrderOp>>> ranks;   // order: ops of pipeline rank 0, 1, ...
  std::optional<std::string> grid_order;                    // grid: {order: "tp-dp-pp"}
  std::optional<std::string> mode;                          // recompute: none | selective | full
  Filter filter;  // split_backward, replicate, recompute: the units the directive applies to; empty: all
  bool operator==(const Directive&) const = default;
};

struct DirectivesConfig {
  bool present = false;         // the config has a `directives:` section (possibly empty)
  std::vector<Directive> list;  // in the order written
  bool operator==(const DirectivesConfig&) const = default;
};

// ---- strategy switches (docs/switching.md) --------------------------------------

// One strategy change: what the job runs from `at_step` on (an entry of the `switch:` list) or from
// the next step boundary (the switch file).
struct SwitchTarget {
  int64_t at_step = -1;                     // `switch:` entries: steps 0..at_step-1 run before it; -1 in a switch file
  std::optional<int64_t> world;             // ranks of the new strategy; none: the current ranks less those leaving
  std::vector<int64_t> leave;               // job ranks (as mpirun numbers them) that leave the job (switch file only)
  std::optional<ParallelConfig> parallel;   // the new `parallel:` section: the current one with the keys written here set
  DirectivesConfig directives;              // the new `directives:` (present: replaces the current ones)
  bool has_strategy() const { return parallel.has_value() || directives.present; }  // false: the tuner chooses
  std::string source;                       // "config.yaml" or the switch file's path
  // Where each key of the entry was set, like Config::locations: "switch[1]" (the item),
  // "switch[1].at_step", "switch[1].parallel.dp", "switch[1].directives[0]" ...; a switch file's keys
  // are keyed without the "switch[i]." prefix ("parallel.dp", "leave").
  std::map<std::string, std::string> locations;
  bool operator==(const SwitchTarget&) const = default;

  // The `parallel:` keys the target writes ("dp", "schedule"), in the order of the parallel section:
  // those `locations` holds ("switch[1].parallel.dp"). `parallel` holds the defaults elsewhere;
  // apply_switch sets only these keys.
  std::vector<std::string> parallel_keys() const;
  // "switch[1]" for an entry of the `switch:` list, "" for a switch file (or a target without locations).
  std::string path() const;
  // Same settings: every field but source and locations, and the same parallel_keys().
  bool same_settings(const SwitchTarget& o) const;
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  CheckpointConfig checkpoint;
  ParallelConfig parallel;
  DirectivesConfig directives;
  std::vector<SwitchTarget> switches;   // the `switch:` list, in step order
  std::string source = "<defaults>";  // file the config came from ("<defaults>" if none)
  std::string yaml_text;   // the resolved config, re-emitted as YAML
  // Where each "section.key" that was set came from: "file:line:col" (1-based)
  // for a key of the file, "--set" for an override. Keys left at their
  // default have no entry. validate() quotes these in its messages.
  // Directives are keyed by path: "directives[2]" (the item),
  // "directives[2].replicate.dp", "directives[1].place.stages[0]",
  // "directives[3].order.ranks[1]" and "directives[3].order.ranks[1][4]";
  // a directive's inline filter is at "directives[2].replicate.filter" (its
  // first filter key), each of its keys at "directives[2].replicate.kind".
  std::map<std::string, std::string> locations;

  // Same settings (model, train, data, parallel, directives, switches); source,
  // yaml_text and locations (also the switches') are not compared.
  bool same_settings(const Config& o) const {
    return model == o.model && train == o.train && data == o.data && checkpoint == o.checkpoint &&
           parallel == o.parallel && directives == o.directives &&
           std::equal(switches.begin(), switches.end(), o.switches.begin(), o.switches.end(),
                      [](const SwitchTarget& a, const SwitchTarget& b) { return a.same_settings(b); });
  }
};

// A user-facing configuration error: `what()` is the whole message, already
// naming the file, line and column where there is one. The CLI prints it and
// exits with code 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Reads `path` and applies `overrides` ("section.key=value", value parsed as a
// YAML scalar; for a text key, a value that is not valid YAML is taken as
// written). Fills source, yaml_text and locations. Checks names and types
// only: call validate() once the world size is known. Throws ConfigError
// (also when the file cannot be read).
Config load(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from YAML text already in memory; `source` names it in messages.
Config parse(const std::string& yaml_text, const std::string& source,
             const std::vector<std::string>& overrides = {});
// train.precision read: the one table of its names. What each asks of the backend and the units is
// model::precision_of's; what the units compute on is stored in bf16 or not (stores_in_bf16), the
// one fact the strategy needs too, for the bytes of its messages and gathers.
enum class Precision : uint8_t { PRECISION_FP32, PRECISION_TF32, PRECISION_BF16 };
// The precision `name` names ("fp32", "tf32", "bf16"); nullopt for any other.
std::optional<Precision> precision_named(const std::string& name);
// train.precision of cfg; throws ConfigError naming the key for a name that is none of them.
Precision precision_of(const TrainConfig& train);
// "'fp32', 'tf32' or 'bf16'", for messages.
std::string precision_names();
// Whether p stores what the units compute on in bf16: the activations a unit keeps for its backward,
// those between units (and pipeline stages), an MoE block's rows between ranks, and the parameters
// ZeRO-3 gathers for a pass. bf16 does; fp32 and tf32 store f32.
bool stores_in_bf16(Precision p);
// Bytes of an element of what p stores the units' tensors in: 2 where stores_in_bf16, else 4.
int storage_bytes(Precision p);

// train.device read: the one table of its names. The backend each names is the runtime's
// (runtime::backend_of).
enum class Device : uint8_t { DEVICE_CPU, DEVICE_CUDA, DEVICE_CPU_DETACHED };
// The device `name` names ("cpu", "cuda", "cpu_detached"); nullopt for any other.
std::optional<Device> device_named(const std::string& name);
// train.device of cfg; throws ConfigError naming the key for a name that is none of them.
Device device_of(const TrainConfig& train);
// Every name, in the enum's order (a command line's choices), and d's.
std::vector<std::string> device_names();
const char* device_name(Device d);

// train.device_comm read: the one table of its names. What each chooses is comm::for_device's.
enum class DeviceComm : uint8_t { DEVICE_COMM_AUTO, DEVICE_COMM_NCCL, DEVICE_COMM_MPI };
// The choice `name` names ("auto", "nccl", "mpi"); nullopt for any other.
std::optional<DeviceComm> device_comm_named(const std::string& name);
// train.device_comm of cfg; throws ConfigError naming the key for a name that is none of them.
DeviceComm device_comm_of(const TrainConfig& train);

// Checks the rules the config owns: values in their ranges and bounds, model
// sizes against each other, the strategy's sizes against the world size and
// the batch, and the `switch:` entries' steps and worlds (each entry's strategy is
// validate_switch's, at the world it runs at); throws ConfigError listing every problem
// found, one per line.
// The rules of schedules, stages and hand-written orders belong to the IR:
// ir::validate checks them too, and is what a command calls.
void validate(const Config& cfg, int world_size);
// The resolved config as YAML text (every key, defaults included); parse()
// reads it back to the same settings.
std::string to_yaml(const Config& cfg);

// Where the keys of a config were set, for messages that point at them
// (Config::locations). A key that a directive set is shown under the
// directive's path ("parallel.dp" reads "directives[2].replicate.dp") and
// points at the directive.
class Positions {
 public:
  Positions() = default;
  Positions(Config effective, std::map<std::string, std::string> names);
  // The name a message gives `key`: its own, or the path of the directive that set it.
  std::string shown(const std::string& key) const;
  // The value of "section.key", as to_yaml writes it.
  std::string value(const std::string& key) const;
  // "file:line:col: key=value" / "--set key=value" / "key=value": the start of a message about `key`.
  std::string head(const std::string& key) const;
  std::string head(const std::string& key, const std::string& shown) const;
  // "key=value (at file:line:col)" / "(from --set)" / "(default)": another key a message names.
  std::string ref(const std::string& key) const;
  // "file:line:col: path" for a path of Config::locations, or "path".
  std::string at(const std::string& path) const;
  std::string at(const std::string& path, const std::string& shown) const;

 private:
  Config c_;
  std::map<std::string, std::string> names_;
};

// The candidate closest to `word`, or "" when none is close enough to be a
// typo: the "did you mean" of a message.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// The config a target runs under: `current` with the target's `parallel:` keys set over its own
// parallel section and its directives replaced by the target's (none when the target has none).
// model, train, data and checkpoint are `current`'s (its switches too). yaml_text is re-emitted for
// the result; its locations point at the target's keys for what the target set ("parallel.dp" at
// "config.yaml:31:20", "directives[0]" at the entry's directive).
Config apply_switch(const Config& current, const SwitchTarget& target);
// A switch file's text: a YAML map with the keys `parallel`, `directives`, `world`, `leave` (all
// optional; at least one). Throws ConfigError naming source:line:col and the key.
SwitchTarget parse_switch(const std::string& yaml_text, const std::string& source);
// Checks a target against the world it runs at (what validate() checks for the main strategy, on
// apply_switch(current, target) at `world`), every message starting with the position of the entry
// or of its key ("config.yaml:31:5: switch[1].parallel.dp=3: ..."), all problems listed, one per
// line. A target without a strategy has only its world and leave checked: the tuner's choice is
// checked when it is made. Throws ConfigError.
void validate_switch(const Config& current, const SwitchTarget& target, int world);

// The strategy the shorthand and the directives give together: the
// `parallel:` values with every directive applied in order (zero from the
// shard_* flags), the stage of each unit a place directive gave (its
// stage_of_unit list, or its stages filters resolved over model.pattern), the
// directives that apply to a subset of the units, and the per-rank ops of a
// hand-written order.
struct EffectiveStrategy {
  // A split_backward or replicate directive with a filter: the selected units
  // get `value` (split_backward: 1; replicate: the ZeRO stage). Applied in
  // order over the uniform parallel.split_backward / parallel.zero; a later
  // directive without a filter sets every unit and drops the subsets before it.
  struct Subset {
    Filter filter;
    int64_t value = 0;
    std::string path;  // the directive: "directives[2].replicate" (its filter at path + ".filter")
    bool operator==(const Subset&) const = default;
  };
  ParallelConfig parallel;
  std::vector<int64_t> stage_of_unit;   // a place directive's stage_of_unit list
  std::vector<Filter> stage_filters;    // a place directive's stages: filters (ir resolves them over the units)
  std::string place_path;  // where either came from: "directives[1].place.stages"; "" when neither: the
                           // units are balanced over the stages
  std::vector<Subset> split_subsets;    // split_backward for some units
  std::vector<Subset> zero_subsets;     // the ZeRO stage of some units
  std::vector<int64_t> rank_of_stage;  // a place directive's ranks list; empty: the schedule's layout
  std::string ranks_path;              // where it came from: "directives[1].place.ranks"; "" when empty
  std::vector<std::vector<OrderOp>> order_ranks;  // empty: parallel.schedule orders the ops
  std::string order_path;  // where order_ranks came from: "directives[3].order.ranks"; "" when empty
  Positions positions;     // the parallel values' positions, under the names of the directives that set them
  // The recompute directives in order, each over parallel.recompute (ir resolves their filters).
  struct RecomputeRule {
    std::string mode;
    Filter filter;
    std::string path;  // "directives[2].recompute" (its filter at path + ".filter")
  };
  std::vector<RecomputeRule> recompute;
};
// ir::expand uses it; ir::validate checks the stages and the order it gives.
EffectiveStrategy effective_strategy(const Config& cfg);

}  // namespace piper::config
