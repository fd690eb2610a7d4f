#include "actors/dispatcher_backend.hpp"

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/protocol.hpp"
#include "actors/trainer_client.hpp"
#include "backends/algo/losses.hpp"
#include "backends/error.hpp"
#include "backends/model/model_config.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"

namespace rlforge::actors {

namespace {

namespace be = rlforge::backends;
namespace algo = rlforge::backends::algo;
namespace tk = rlforge::tinker;
namespace fs = std::filesystem;

const char* const checkpoint_meta = "tinker_checkpoint.json";
const char* const sampler_marker = "sampler_weights.json";
const char* const checkpoint_role_dir = "model";

[[noreturn]] void fail(const char* category, const std::string& message) {
  throw tk::request_error(category, message);
}

/// A runtime error as a request error: bad input (invalid argument, out of range, undecodable,
/// missing file) is the user's, everything else the server's.
[[noreturn]] void fail_with(const caf::error& err, const std::string& context) {
  auto message = context + ": " + error_message(err);
  if (is(err, errc::invalid_argument) || is(err, errc::out_of_range)
      || is(err, errc::decode_error) || is(err, errc::not_found))
    fail("user", message);
  fail("server", message);
}

template <class T> T value_of(caf::expected<T> x, const std::string& context) {
  if (!x)
    fail_with(x.error(), context);
  return std::move(*x);
}

void check(caf::expected<void> x, const std::string& context) {
  if (!x)
    fail_with(x.error(), context);
}

std::string in_quotes(const std::string& s) {
  return "'" + s + "'";
}

/// One trainable model: its group in the main dispatcher and, once it has sampler weights, its
/// own engine behind a dispatcher private to the model.
struct model_entry {
  std::string id;
  std::string role; ///< policy | critic
  tk::lora_config lora;
  std::mutex mutex; ///< serialises the model's calls
  bool ready = false;
  actor_group group;
  actor_group engine;       ///< empty until the first sampler checkpoint
  caf::actor sampler;       ///< the private dispatcher: roles "trainer" and "engines"
  bool engine_has_weights = false;
};

/// An engine loaded from a persisted sampler export, behind its own dispatcher; stopped when the
/// last user lets go (after eviction from the cache).
struct export_engine {
  actor_group engine;
  caf::actor sampler;
  uint64_t last_used = 0;
  ~export_engine() {
    if (sampler)
      caf::anon_send_exit(sampler, caf::exit_reason::user_shutdown);
    engine.stop();
  }
};

/// Key of the loss groups of one forward_backward batch.
std::string loss_key(const algo::tinker_loss& l) {
  std::ostringstream os;
  os.precision(17);
  os << l.name;
  for (auto& [k, v] : l.config.values)
    os << '|' << k << '=' << v;
  for (auto& [k, v] : l.config.options)
    os << '|' << k << ':' << v;
  return os.str();
}

be::tensor_data to_backend(const tk::tensor_data& t) {
  be::tensor_data out;
  out.shape = t.shape;
  if (tk::is_floating(t.type)) {
    out.dtype = "float32";
    out.data = t.floats;
  } else {
    out.dtype = "int64";
    out.data.assign(t.ints.begin(), t.ints.end());
  }
  return out;
}

/// The last `n` columns of row `row` of a `[B, R]` tensor.
std::vector<double> row_tail(const at::Tensor& t, int64_t row, int64_t n) {
  auto r = t[row].narrow(0, t.size(1) - n, n).to(at::kDouble).contiguous();
  return {r.data_ptr<double>(), r.data_ptr<double>() + n};
}

tk::tensor_data float_tensor(std::vector<double> values) {
  tk::tensor_data out;
  out.type = tk::dtype::float32;
  out.shape = {static_cast<int64_t>(values.size())};
  out.floats = std::move(values);
  return out;
}

at::Tensor optional_tensor(const be::training_batch& b, const char* key) {
  return b.has(key) ? b.get(key).to(at::kFloat) : at::Tensor{};
}

/// The loss inputs of a batch as the workers build them (worker.cpp), without the model's.
algo::loss_inputs loss_inputs_of(const be::training_batch& b) {
  namespace keys = be::batch_keys;
  algo::loss_inputs in;
  in.old_logprobs = optional_tensor(b, keys::action_log_probs);
  in.rollout_logprobs = optional_tensor(b, keys::rollout_logprobs);
  in.advantages = optional_tensor(b, keys::advantages);
  in.loss_mask = b.get(keys::loss_mask).to(at::kFloat);
  in.old_values = optional_tensor(b, keys::values);
  in.returns = optional_tensor(b, keys::returns);
  return in;
}

void write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out)
    fail("server", "cannot write " + path.string());
}

} // namespace

struct dispatcher_backend::impl {
  caf::actor_system* sys = nullptr;
  dispatcher_backend_options opts;
  std::string name;
  be::model_config config;
  caf::actor dispatcher;
  std::atomic<uint64_t> counter{0};

  std::mutex models_mutex;
  std::map<std::string, std::shared_ptr<model_entry>> models;

  std::mutex base_mutex; ///< guards the base engine
  actor_group base_engine;
  caf::actor base_sampler;

  std::mutex exports_mutex; ///< guards the export engines
  std::map<std::string, std::shared_ptr<export_engine>> exports; ///< by canonical directory
  uint64_t export_clock = 0;

  trainer_client client(const caf::actor& d) const {
    return trainer_client(*sys, d, opts.timeout);
  }

  /// A group of one rank of `kind` on bundle 0 of the placement.
  actor_group spawn(const std::string& kind, const std::string& what) {
    group_spec s;
    s.name = "tinker-" + kind + "-" + std::to_string(++counter);
    s.kind = kind;
    s.placement = opts.placement;
    s.num_ranks = 1;
    s.gpu_per_rank = opts.gpu_per_group;
    s.threads_per_rank = opts.threads_per_rank;
    s.collectives = false; // one rank: nothing to all-reduce
    s.placement_manager = opts.placement_manager;
    auto g = actor_group::spawn(*sys, s);
    if (!g) // out of placement shares or a runtime failure: the server's, not the request's
      fail("server", what + ": spawning the " + kind + " group: " + error_message(g.error()));
    return *g;
  }

  /// The entry of `model_id` (locked by the caller), or not_found.
  std::shared_ptr<model_entry> find(const std::string& model_id, const char* op) {
    std::lock_guard<std::mutex> guard(models_mutex);
    auto i = models.find(model_id);
    if (i == models.end() || !i->second->ready)
      fail("not_found", std::string{op} + ": unknown model " + in_quotes(model_id));
    return i->second;
  }

  model_spec spec_of(const model_entry& m) const {
    model_spec s;
    s.hf_dir = opts.base_model_dir;
    s.seed = m.lora.has_seed ? static_cast<uint64_t>(m.lora.seed) : 0;
    s.lora_rank = m.lora.rank;
    s.lora_alpha = opts.lora_alpha;
    if (m.lora.rank > 0 && !(m.lora.train_attn && m.lora.train_mlp)) {
      if (m.lora.train_attn)
        s.lora_target_modules = {"q_proj", "k_proj", "v_proj", "o_proj"};
      else
        s.lora_target_modules = {"gate_proj", "up_proj", "down_proj"};
    }
    return s;
  }

  void unregister(const std::string& role) {
    caf::scoped_actor self{*sys};
    self->request(dispatcher, std::chrono::seconds(30), dispatcher_unregister_atom::value, role)
      .receive([] {}, [](caf::error&) {});
  }

  /// Stops `g` and waits (up to the timeout) until its ranks and its routing actor have
  /// terminated, so their models are freed and their placement shares given back (the manager
  /// has handled the release) when this returns.
  void stop_and_wait(actor_group& g) {
    if (!g.handle())
      return;
    auto ranks = g.rank_handles();
    std::vector<caf::actor> actors{g.handle()};
    if (ranks)
      actors.insert(actors.end(), ranks->begin(), ranks->end());
    g.stop();
    caf::scoped_actor self{*sys};
    for (auto& r : actors)
      self->monitor(r);
    auto deadline = std::chrono::steady_clock::now() + opts.timeout;
    for (size_t n = 0; n < actors.size();) {
      bool timed_out = false;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
      self->receive([&](caf::down_msg&) { ++n; },
                    caf::after(std::max(left, std::chrono::milliseconds(1)))
                      >> [&] { timed_out = true; });
      if (timed_out)
        fail("server", "stopping group: its ranks did not terminate within "
                         + std::to_string(opts.timeout.count()) + " ms");
    }
    // The group sent its releases before terminating: one round trip to the manager after
    // that has them handled.
    if (opts.placement_manager)
      self->request(opts.placement_manager, opts.timeout, pg_table_atom::value)
        .receive([](std::string&) {}, [](caf::error&) {});
  }

  /// Stops everything of `m` and waits for it (used by delete and by a failed create).
  void tear_down(model_entry& m) {
    unregister(m.id);
    if (m.sampler)
      caf::anon_send_exit(m.sampler, caf::exit_reason::user_shutdown);
    m.sampler = caf::actor{};
    m.engine_has_weights = false;
    stop_and_wait(m.engine);
    stop_and_wait(m.group);
#if defined(__GLIBC__)
    malloc_trim(0); // the ranks' arenas would keep the freed model resident
#endif
  }

  /// The model's engine and private dispatcher, spawned on first use.
  void ensure_engine(model_entry& m, const char* op) {
    if (m.sampler)
      return;
    auto context = std::string{op} + "(" + m.id + ")";
    auto engine = spawn("engine", context);
    auto d = spawn_dispatcher(*sys);
    try {
      auto c = client(d);
      value_of(c.register_group("trainer", m.group), context + ": registering the model");
      value_of(c.register_engines(engine, "engines"), context + ": registering its engine");
      model_spec s;
      s.hf_dir = opts.base_model_dir;
      value_of(c.init_model("engines", s), context + ": loading its engine");
    } catch (...) {
      caf::anon_send_exit(d, caf::exit_reason::user_shutdown);
      engine.stop();
      throw;
    }
    m.engine = engine;
    m.sampler = d;
  }

  /// The dispatcher whose "engines" serve the base model.
  caf::actor base_engines() {
    std::lock_guard<std::mutex> guard(base_mutex);
    if (base_sampler)
      return base_sampler;
    auto engine = spawn("engine", "sample(base)");
    auto d = spawn_dispatcher(*sys);
    try {
      auto c = client(d);
      value_of(c.register_engines(engine, "engines"), "sample(base): registering the engine");
      model_spec s;
      s.hf_dir = opts.base_model_dir;
      value_of(c.init_model("engines", s), "sample(base): loading the base model");
    } catch (...) {
      caf::anon_send_exit(d, caf::exit_reason::user_shutdown);
      engine.stop();
      throw;
    }
    base_engine = engine;
    base_sampler = d;
    return d;
  }

  /// The engine serving the persisted export in `dir` (spawned and cached on first use; the
  /// least recently used one goes when more than `max_export_engines` are cached).
  std::shared_ptr<export_engine> export_engine_of(const std::string& dir) {
    std::error_code ec;
    auto key = fs::weakly_canonical(dir, ec).string();
    if (ec)
      key = dir;
    std::lock_guard<std::mutex> guard(exports_mutex);
    auto& slot = exports[key];
    if (!slot) {
      auto e = std::make_shared<export_engine>();
      auto context = "sample(" + dir + ")";
      try {
        e->engine = spawn("engine", context);
        e->sampler = spawn_dispatcher(*sys);
        auto c = client(e->sampler);
        value_of(c.register_engines(e->engine, "engines"), context + ": registering the engine");
        model_spec s;
        s.hf_dir = key;
        value_of(c.init_model("engines", s), context + ": loading the export");
      } catch (...) {
        exports.erase(key);
        throw;
      }
      slot = e;
    }
    slot->last_used = ++export_clock;
    auto found = slot;
    while (exports.size() > opts.max_export_engines) {
      auto oldest = exports.begin();
      for (auto i = exports.begin(); i != exports.end(); ++i)
        if (i->second->last_used < oldest->second->last_used)
          oldest = i;
      exports.erase(oldest); // stops when its last caller is done with it
    }
    return found;
  }

  /// Checks one datum of request `i` and returns it in backend form.
  be::datum convert(const tk::datum& d, const std::string& where) const {
    if (d.tokens.empty())
      fail("user", where + ": model_input has no tokens");
    if (static_cast<int64_t>(d.tokens.size()) + 1 > config.max_position_embeddings)
      fail("user", where + ": " + std::to_string(d.tokens.size()) + " input tokens do not fit the "
                     "context of " + std::to_string(config.max_position_embeddings) + " tokens");
    auto check_ids = [&](const std::vector<int64_t>& ids, const std::string& what) {
      for (size_t k = 0; k < ids.size(); ++k)
        if (ids[k] < 0 || ids[k] >= config.vocab_size)
          fail("user", where + ": " + what + " token id " + std::to_string(ids[k])
                         + " at position " + std::to_string(k) + " is outside the vocabulary [0, "
                         + std::to_string(config.vocab_size) + ")");
    };
    check_ids(d.tokens, "model_input");
    be::datum out;
    out.model_input_tokens = d.tokens;
    for (auto& [key, t] : d.loss_fn_inputs) {
      if (key == "target_tokens") {
        std::vector<int64_t> ids = t.ints;
        for (double x : t.floats) // non-integral values are refused by from_datums
          ids.push_back(std::isfinite(x) && std::abs(x) < 9e18 ? static_cast<int64_t>(x) : -1);
        check_ids(ids, "target_tokens");
      }
      out.loss_fn_inputs.emplace(key, to_backend(t));
    }
    return out;
  }
};

dispatcher_backend::dispatcher_backend(caf::actor_system& sys, dispatcher_backend_options options)
  : impl_(std::make_unique<impl>()) {
  auto& p = *impl_;
  p.sys = &sys;
  p.opts = std::move(options);
  auto& o = p.opts;
  if (o.base_model_dir.empty())
    fail("server", "dispatcher_backend: base_model_dir is empty");
  if (o.timeout.count() <= 0)
    fail("server", "dispatcher_backend: timeout must be > 0 ms, got "
                     + std::to_string(o.timeout.count()));
  if (o.max_export_engines < 1)
    fail("server", "dispatcher_backend: max_export_engines must be >= 1");
  if (o.threads_per_rank < 1)
    fail("server", "dispatcher_backend: threads_per_rank must be >= 1, got "
                     + std::to_string(o.threads_per_rank));
  if (!std::isfinite(o.gpu_per_group) || o.gpu_per_group < 0)
    fail("server", "dispatcher_backend: gpu_per_group must be finite and >= 0");
  if (!std::isfinite(o.lora_alpha) || o.lora_alpha <= 0)
    fail("server", "dispatcher_backend: lora_alpha must be finite and > 0");
  auto config_path = fs::path(o.base_model_dir) / "config.json";
  std::ifstream in(config_path);
  if (!in)
    fail("server", "dispatcher_backend: cannot read " + config_path.string());
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded())
    fail("server", "dispatcher_backend: " + config_path.string() + " is not valid JSON");
  try {
    p.config = be::parse_model_config(j);
  } catch (const std::exception& e) {
    fail("server", "dispatcher_backend: " + config_path.string() + ": " + e.what());
  }
  p.name = o.base_model_name;
  if (p.name.empty()) {
    auto dir = fs::path(o.base_model_dir);
    p.name = (dir.has_filename() ? dir.filename() : dir.parent_path().filename()).string();
  }
  if (o.placement.bundles.empty()) {
    o.placement.name = "tinker";
    o.placement.strategy = "pack";
    o.placement.bundles.push_back({0, "local", {}, {{"CPU", 1.0}}});
  } else {
    o.placement.bundles.resize(1); // every group: one rank on bundle 0
  }
  p.dispatcher = spawn_dispatcher(sys);
}

dispatcher_backend::~dispatcher_backend() {
  auto& p = *impl_;
  std::map<std::string, std::shared_ptr<model_entry>> models;
  {
    std::lock_guard<std::mutex> guard(p.models_mutex);
    models.swap(p.models);
  }
  for (auto& [id, m] : models) {
    std::lock_guard<std::mutex> guard(m->mutex);
    if (m->sampler)
      caf::anon_send_exit(m->sampler, caf::exit_reason::user_shutdown);
    m->engine.stop();
    m->group.stop();
  }
  if (p.base_sampler)
    caf::anon_send_exit(p.base_sampler, caf::exit_reason::user_shutdown);
  p.base_engine.stop();
  caf::anon_send_exit(p.dispatcher, caf::exit_reason::user_shutdown);
}

void dispatcher_backend::create_model(const std::string& model_id, const tk::lora_config& lora,
                                      const std::string& role) {
  auto& p = *impl_;
  auto context = "create_model(" + model_id + ")";
  if (model_id.empty())
    fail("user", "create_model: model_id is empty");
  if (role != "policy" && role != "critic")
    fail("user", context + ": unknown role " + in_quotes(role) + " (roles: policy, critic)");
  if (lora.rank < 0)
    fail("user", context + ": lora rank must be >= 0, got " + std::to_string(lora.rank));
  if (lora.rank > std::min(p.config.hidden_size, p.config.intermediate_size))
    fail("user", context + ": lora rank " + std::to_string(lora.rank)
                   + " exceeds the base model's hidden size "
                   + std::to_string(p.config.hidden_size));
  if (lora.rank > 0 && !lora.train_attn && !lora.train_mlp)
    fail("user", context + ": train_attn and train_mlp are both false: LoRA would adapt nothing");
  if (lora.has_seed && lora.seed < 0)
    fail("user", context + ": lora seed must be >= 0, got " + std::to_string(lora.seed));
  auto m = std::make_shared<model_entry>();
  m->id = model_id;
  m->role = role;
  m->lora = lora;
  std::unique_lock<std::mutex> lock(m->mutex);
  {
    std::lock_guard<std::mutex> guard(p.models_mutex);
    if (p.models.count(model_id))
      fail("user", context + ": a model with this id already exists");
    p.models.emplace(model_id, m);
  }
  try {
    m->group = p.spawn(role, context);
    auto c = p.client(p.dispatcher);
    value_of(c.register_group(model_id, m->group), context + ": registering the group");
    value_of(c.init_model(model_id, p.spec_of(*m)), context + ": building the model");
    m->ready = true;
  } catch (const tk::request_error& e) {
    try {
      p.tear_down(*m);
    } catch (const tk::request_error&) { // the creation error is the one to report
    }
    {
      std::lock_guard<std::mutex> guard(p.models_mutex);
      p.models.erase(model_id);
    }
    // The request was checked above: what fails now (the base directory, the runtime) is the
    // server's.
    throw tk::request_error("server", e.what());
  }
}

bool dispatcher_backend::has_model(const std::string& model_id) {
  auto& p = *impl_;
  std::lock_guard<std::mutex> guard(p.models_mutex);
  auto i = p.models.find(model_id);
  return i != p.models.end() && i->second->ready;
}

void dispatcher_backend::delete_model(const std::string& model_id) {
  auto& p = *impl_;
  auto m = p.find(model_id, "delete_model");
  std::lock_guard<std::mutex> lock(m->mutex);
  if (!m->ready)
    fail("not_found", "delete_model: unknown model " + in_quotes(model_id));
  m->ready = false;
  {
    std::lock_guard<std::mutex> guard(p.models_mutex);
    p.models.erase(model_id);
  }
  p.tear_down(*m);
}

std::vector<tk::forward_backward_output>
dispatcher_backend::forward_backward(const std::vector<tk::forward_backward_request>& batch) {
  auto& p = *impl_;
  if (batch.empty())
    fail("user", "forward_backward: empty batch of requests");
  const auto& model_id = batch.front().model_id;
  const bool forward_only = batch.front().forward_only;
  const char* op = forward_only ? "forward" : "forward_backward";
  for (size_t i = 1; i < batch.size(); ++i) {
    if (batch[i].model_id != model_id)
      fail("user", std::string{op} + ": request " + std::to_string(i) + " is for model "
                     + in_quotes(batch[i].model_id) + ", request 0 for " + in_quotes(model_id)
                     + " (one model per batch)");
    if (batch[i].forward_only != forward_only)
      fail("user", std::string{op} + ": request " + std::to_string(i)
                     + " mixes forward and forward_backward in one batch");
  }
  auto m = p.find(model_id, op);
  std::lock_guard<std::mutex> lock(m->mutex);
  if (!m->ready)
    fail("not_found", std::string{op} + ": unknown model " + in_quotes(model_id));
  const bool critic = m->role == "critic";

  // Check everything before the first call, so a refused batch changes no gradient.
  struct group {
    algo::tinker_loss loss;
    std::vector<size_t> requests;
    std::vector<be::datum> datums;
    be::training_batch batch;
  };
  std::vector<group> groups;
  std::map<std::string, size_t> group_of;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& r = batch[i];
    auto where = std::string{op} + "(" + model_id + ") request " + std::to_string(i) + " (seq_id "
                 + std::to_string(r.seq_id) + ")";
    if (r.data.empty())
      fail("user", where + ": no data");
    algo::tinker_loss loss;
    try {
      loss = algo::tinker_to_loss_config(r.loss_fn, r.loss_fn_config, critic);
    } catch (const std::exception& e) {
      fail("user", where + ": " + e.what());
    }
    if (critic && !algo::is_value_loss(loss.name))
      fail("user", where + ": loss_fn " + in_quotes(r.loss_fn) + " is a policy loss; the critic "
                     + in_quotes(model_id) + " trains only with ppo_critic (or ppo)");
    if (!critic && algo::is_value_loss(loss.name))
      fail("user", where + ": loss_fn " + in_quotes(r.loss_fn) + " is a value loss; the policy "
                     + in_quotes(model_id) + " does not take it");
    std::vector<be::datum> datums;
    for (size_t j = 0; j < r.data.size(); ++j)
      datums.push_back(p.convert(r.data[j], where + " datum " + std::to_string(j)));
    try {
      auto b = be::from_datums(datums);
      at::NoGradGuard no_grad;
      auto in = loss_inputs_of(b);
      auto zeros = at::zeros_like(in.loss_mask);
      (critic ? in.values : in.logprobs) = zeros;
      (void)algo::compute_loss(loss.name, in, loss.config);
    } catch (const tk::request_error&) {
      throw;
    } catch (const std::exception& e) {
      fail("user", where + ": " + e.what());
    }
    auto key = loss_key(loss);
    auto [it, fresh] = group_of.emplace(key, groups.size());
    if (fresh)
      groups.push_back(group{loss, {}, {}, {}});
    auto& g = groups[it->second];
    g.requests.push_back(i);
    for (auto& d : datums)
      g.datums.push_back(std::move(d));
  }
  for (auto& g : groups) {
    try {
      g.batch = be::from_datums(g.datums);
    } catch (const std::exception& e) {
      fail("user", std::string{op} + "(" + model_id + "): " + e.what());
    }
  }

  std::vector<tk::forward_backward_output> outputs(batch.size());
  auto c = p.client(p.dispatcher);
  for (auto& g : groups) {
    auto context = std::string{op} + "(" + model_id + ", " + g.loss.name + ")";
    std::map<std::string, at::Tensor> tensors;
    std::map<std::string, double> metrics;
    if (forward_only) {
      auto out = value_of(c.forward(model_id, g.batch), context);
      tensors = out.outputs;
      metrics = out.metrics;
      at::NoGradGuard no_grad;
      auto in = loss_inputs_of(g.batch);
      (critic ? in.values : in.logprobs) = tensors.at(critic ? "values" : "logprobs").to(at::kFloat);
      if (!critic)
        in.entropy = tensors.at("entropy").to(at::kFloat);
      try {
        auto loss = algo::compute_loss(g.loss.name, in, g.loss.config);
        tensors["elementwise_loss"] = loss.elementwise;
        for (auto& [k, v] : loss.metrics)
          metrics[k] = v;
      } catch (const std::exception& e) {
        fail("user", context + ": " + e.what());
      }
    } else {
      auto out = value_of(c.forward_backward(model_id, g.batch, g.loss.name, g.loss.config),
                          context);
      tensors = out.outputs;
      metrics = out.metrics;
    }
    const auto& first = tensors.at(critic ? "values" : "logprobs");
    const auto& elementwise = tensors.at("elementwise_loss");
    int64_t row = 0;
    for (auto i : g.requests) {
      auto& o = outputs[i];
      o.metrics = metrics;
      double loss_sum = 0;
      for (auto& d : batch[i].data) {
        auto n = static_cast<int64_t>(d.tokens.size());
        std::map<std::string, tk::tensor_data> per;
        per[critic ? "values" : "logprobs"] = float_tensor(row_tail(first, row, n));
        auto el = row_tail(elementwise, row, n);
        for (double x : el)
          loss_sum += x;
        per["elementwise_loss"] = float_tensor(std::move(el));
        o.loss_fn_outputs.push_back(std::move(per));
        ++row;
      }
      o.metrics["loss:sum"] = loss_sum;
    }
  }
  return outputs;
}

std::map<std::string, double> dispatcher_backend::optim_step(const std::string& model_id,
                                                             const tk::adam_params& a) {
  auto& p = *impl_;
  auto context = "optim_step(" + model_id + ")";
  auto m = p.find(model_id, "optim_step");
  std::lock_guard<std::mutex> lock(m->mutex);
  if (!m->ready)
    fail("not_found", "optim_step: unknown model " + in_quotes(model_id));
  be::adam_params hp;
  hp.learning_rate = a.learning_rate;
  hp.beta1 = a.beta1;
  hp.beta2 = a.beta2;
  hp.eps = a.eps;
  hp.weight_decay = a.weight_decay;
  hp.grad_clip_norm = a.grad_clip_norm;
  try {
    hp.validate();
  } catch (const std::exception& e) {
    fail("user", context + ": " + e.what());
  }
  auto r = value_of(p.client(p.dispatcher).optim_step(model_id, hp), context);
  return {{"grad_norm:mean", r.grad_norm},
          {"learning_rate:mean", r.learning_rate},
          {"skipped:max", r.skipped ? 1.0 : 0.0},
          {"clipped:max", r.clipped ? 1.0 : 0.0},
          {"step:max", static_cast<double>(r.step)}};
}

std::vector<tk::sample_response>
dispatcher_backend::sample(const std::string& model_id,
                           const std::vector<tk::sample_request>& requests) {
  auto& p = *impl_;
  auto context = "sample(" + (model_id.empty() ? std::string{"base"} : model_id) + ")";
  if (requests.empty())
    fail("user", context + ": no requests");
  std::vector<sample_request> rs;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& t = requests[i];
    auto where = context + " request " + std::to_string(i);
    if (!t.params.stop_strings.empty())
      fail("user", where + ": stop strings need a tokenizer, which this server does not have; "
                     "send stop token ids instead");
    if (t.topk_prompt_logprobs != 0)
      fail("user", where + ": topk_prompt_logprobs is not supported (got "
                     + std::to_string(t.topk_prompt_logprobs) + "); use prompt_logprobs");
    if (t.num_samples < 1)
      fail("user", where + ": num_samples must be >= 1, got " + std::to_string(t.num_samples));
    if (t.params.max_tokens < 1)
      fail("user", where + ": max_tokens must be >= 1, got " + std::to_string(t.params.max_tokens));
    if (t.prompt.empty())
      fail("user", where + ": empty prompt");
    if (t.params.has_seed && t.params.seed < 0)
      fail("user", where + ": seed must be >= 0, got " + std::to_string(t.params.seed));
    for (size_t k = 0; k < t.prompt.size(); ++k)
      if (t.prompt[k] < 0 || t.prompt[k] >= p.config.vocab_size)
        fail("user", where + ": prompt token id " + std::to_string(t.prompt[k]) + " at position "
                       + std::to_string(k) + " is outside the vocabulary [0, "
                       + std::to_string(p.config.vocab_size) + ")");
    for (auto s : t.params.stop_tokens)
      if (s < 0 || s >= p.config.vocab_size)
        fail("user", where + ": stop token id " + std::to_string(s)
                       + " is outside the vocabulary");
    sample_request r;
    r.prompt = t.prompt;
    r.max_tokens = t.params.max_tokens;
    r.temperature = t.params.temperature;
    r.top_k = t.params.top_k;
    r.top_p = t.params.top_p;
    r.has_seed = t.params.has_seed;
    r.seed = static_cast<uint64_t>(t.params.seed);
    r.stop_token_ids = t.params.stop_tokens;
    r.prompt_logprobs = t.prompt_logprobs;
    r.num_samples = t.num_samples;
    rs.push_back(std::move(r));
  }
  std::vector<sample_output> rows;
  auto target = model_id;
  if (!target.empty() && !has_model(target)) {
    // A sampler checkpoint directory: its export, or the model it synced.
    std::ifstream in(fs::path(target) / sampler_marker);
    if (!in)
      fail("not_found", context + ": unknown model or sampler checkpoint " + in_quotes(target));
    auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("persist") || !j["persist"].is_boolean()
        || !j.contains("model_id") || !j["model_id"].is_string())
      fail("user", context + ": " + std::string{sampler_marker} + " is malformed");
    if (j["persist"].get<bool>()) {
      auto e = p.export_engine_of(target);
      rows = value_of(p.client(e->sampler).generate(rs), context);
      target.clear();
    } else {
      target = j["model_id"].get<std::string>();
      if (!has_model(target))
        fail("not_found", context + ": the model " + in_quotes(target)
                            + " whose weights this sampler checkpoint synced was deleted");
    }
  }
  if (model_id.empty()) {
    rows = value_of(p.client(p.base_engines()).generate(rs), context);
  } else if (!target.empty()) {
    auto m = p.find(target, "sample");
    std::unique_lock<std::mutex> lock(m->mutex);
    if (!m->ready)
      fail("not_found", "sample: unknown model " + in_quotes(target));
    if (m->role == "critic")
      fail("user", context + ": " + in_quotes(target) + " is a critic; only policies sample");
    if (m->engine_has_weights) {
      rows = value_of(p.client(m->sampler).generate(rs), context);
    } else {
      // No sampler checkpoint yet: the model still has the base weights (fresh adapters add 0).
      lock.unlock();
      rows = value_of(p.client(p.base_engines()).generate(rs), context);
    }
  }
  std::vector<tk::sample_response> out;
  size_t row = 0;
  for (auto& t : requests) {
    tk::sample_response resp;
    resp.has_prompt_logprobs = t.prompt_logprobs;
    for (int64_t s = 0; s < t.num_samples; ++s) {
      if (row >= rows.size())
        fail("server", context + ": the engines answered " + std::to_string(rows.size())
                         + " rows, fewer than requested");
      auto& o = rows[row++];
      if (t.prompt_logprobs && s == 0) {
        resp.prompt_logprobs.push_back(std::numeric_limits<double>::quiet_NaN());
        resp.prompt_logprobs.insert(resp.prompt_logprobs.end(), o.prompt_logprobs.begin(),
                                    o.prompt_logprobs.end());
      }
      resp.sequences.push_back({o.stop_reason, std::move(o.tokens), std::move(o.logprobs)});
    }
    out.push_back(std::move(resp));
  }
  return out;
}

void dispatcher_backend::save_checkpoint(const std::string& model_id, const std::string& dir,
                                         bool with_optimizer) {
  auto& p = *impl_;
  auto context = "save_checkpoint(" + model_id + ", " + dir + ")";
  auto m = p.find(model_id, "save_checkpoint");
  std::lock_guard<std::mutex> lock(m->mutex);
  if (!m->ready)
    fail("not_found", "save_checkpoint: unknown model " + in_quotes(model_id));
  if (dir.empty())
    fail("user", "save_checkpoint(" + model_id + "): empty directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    fail("server", context + ": cannot create the directory: " + ec.message());
  // The workers always write the optimizer state; the meta file says what was asked for.
  value_of(p.client(p.dispatcher)
             .call(model_id, "save_checkpoint",
                   caf::make_message(dir, int64_t{0}, std::string{checkpoint_role_dir})),
           context);
  write_json(fs::path(dir) / checkpoint_meta,
             {{"format", "rlforge-tinker-checkpoint"},
              {"role", m->role},
              {"lora_rank", m->lora.rank},
              {"with_optimizer", with_optimizer},
              {"base_model", p.name}});
}

void dispatcher_backend::load_checkpoint(const std::string& model_id, const std::string& dir,
                                         bool with_optimizer) {
  auto& p = *impl_;
  auto context = "load_checkpoint(" + model_id + ", " + dir + ")";
  auto m = p.find(model_id, "load_checkpoint");
  std::lock_guard<std::mutex> lock(m->mutex);
  if (!m->ready)
    fail("not_found", "load_checkpoint: unknown model " + in_quotes(model_id));
  std::ifstream in(fs::path(dir) / checkpoint_meta);
  if (!in)
    fail("user", context + ": no " + std::string{checkpoint_meta}
                   + " in the directory: not a checkpoint of this server");
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("role") || !j.contains("lora_rank")
      || !j.contains("with_optimizer") || !j["role"].is_string()
      || !j["lora_rank"].is_number_integer() || !j["with_optimizer"].is_boolean())
    fail("user", context + ": " + std::string{checkpoint_meta} + " is malformed");
  auto role = j["role"].get<std::string>();
  auto rank = j["lora_rank"].get<int64_t>();
  if (role != m->role || rank != m->lora.rank)
    fail("user", context + ": the checkpoint is of a " + role + " with LoRA rank "
                   + std::to_string(rank) + ", the model is a " + m->role + " with LoRA rank "
                   + std::to_string(m->lora.rank));
  if (with_optimizer && !j["with_optimizer"].get<bool>())
    fail("user", context + ": the checkpoint was saved without optimizer state");
  value_of(p.client(p.dispatcher)
             .call(model_id, "load_checkpoint",
                   caf::make_message(dir, int64_t{0}, std::string{checkpoint_role_dir},
                                     with_optimizer)),
           context);
}

void dispatcher_backend::save_sampler_checkpoint(const std::string& model_id,
                                                 const std::string& dir, bool persist) {
  auto& p = *impl_;
  auto context = "save_sampler_checkpoint(" + model_id + ", " + dir + ")";
  auto m = p.find(model_id, "save_sampler_checkpoint");
  std::lock_guard<std::mutex> lock(m->mutex);
  if (!m->ready)
    fail("not_found", "save_sampler_checkpoint: unknown model " + in_quotes(model_id));
  if (m->role == "critic")
    fail("user", context + ": " + in_quotes(model_id) + " is a critic; only policies sample");
  if (dir.empty())
    fail("user", "save_sampler_checkpoint(" + model_id + "): empty directory");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    fail("server", context + ": cannot create the directory: " + ec.message());
  p.ensure_engine(*m, "save_sampler_checkpoint");
  auto c = p.client(m->sampler);
  if (persist) {
    check(p.client(p.dispatcher).save_hf_model(model_id, dir), context + ": exporting");
    model_spec s;
    s.hf_dir = dir;
    m->engine_has_weights = false; // until the reload below succeeds
    value_of(c.init_model("engines", s), context + ": loading the export into the engine");
    m->engine_has_weights = true;
    write_json(fs::path(dir) / sampler_marker, {{"format", "rlforge-tinker-sampler"},
                                                {"model_id", model_id},
                                                {"persist", true},
                                                {"base_model", p.name}});
    return;
  }
  auto version = value_of(c.save_weights_for_sampler("trainer"), context + ": syncing");
  m->engine_has_weights = true;
  write_json(fs::path(dir) / sampler_marker,
             {{"format", "rlforge-tinker-sampler"},
              {"model_id", model_id},
              {"persist", false},
              {"weight_version", version},
              {"base_model", p.name}});
}

std::string dispatcher_backend::base_model_name() const {
  return impl_->name;
}

int64_t dispatcher_backend::max_context_length() const {
  return impl_->config.max_position_embeddings;
}

int64_t dispatcher_backend::vocab_size() const {
  return impl_->config.vocab_size;
}

const caf::actor& dispatcher_backend::dispatcher() const {
  return impl_->dispatcher;
}

std::vector<caf::actor> dispatcher_backend::model_ranks(const std::string& model_id) {
  auto& p = *impl_;
  std::shared_ptr<model_entry> m;
  {
    std::lock_guard<std::mutex> guard(p.models_mutex);
    auto i = p.models.find(model_id);
    if (i == p.models.end() || !i->second->ready)
      return {};
    m = i->second;
  }
  auto r = m->group.rank_handles();
  return r ? *r : std::vector<caf::actor>{};
}

std::unique_ptr<tinker_backend> make_dispatcher_backend(caf::actor_system& sys,
                                                        dispatcher_backend_options options) {
  return std::make_unique<dispatcher_backend>(sys, std::move(options));
}

} // namespace rlforge::actors
