#include "actors/tinker_sampling.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <tuple>
#include <utility>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/engine.hpp"
#include "backends/model/detokenizer.hpp"
#include "runtime/errc.hpp"
#include "tinker/error.hpp"

namespace rlforge::actors {

namespace {

namespace fs = std::filesystem;

/// `text` with every occurrence of `from` replaced by `to` (hides server paths in messages).
std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  if (from.empty())
    return text;
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

/// The engine request of one Tinker request.
sample_request engine_request(const tinker::sample_request& t) {
  sample_request r;
  r.prompt = t.prompt;
  r.max_tokens = t.params.max_tokens;
  r.temperature = t.params.temperature;
  r.top_k = t.params.top_k;
  r.top_p = t.params.top_p;
  r.has_seed = t.params.has_seed;
  r.seed = static_cast<uint64_t>(t.params.seed);
  r.stop_token_ids = t.params.stop_tokens;
  r.stop_strings = t.params.stop_strings;
  r.prompt_logprobs = t.prompt_logprobs;
  r.topk_prompt_logprobs = t.topk_prompt_logprobs;
  r.num_samples = t.num_samples;
  r.first_sample = t.first_sample;
  r.weight_version = t.sampler.type == tinker::sampler_ref::kind::snapshot ? t.sampler.version : 0;
  r.generated = t.generated;
  return r;
}

std::string sampler_name(const tinker::sampler_ref& ref) {
  if (!ref.name.empty())
    return ref.name;
  switch (ref.type) {
  case tinker::sampler_ref::kind::base:
    return "the base model";
  case tinker::sampler_ref::kind::snapshot:
    return "the snapshot of model '" + ref.model_id + "' at version " + std::to_string(ref.version);
  case tinker::sampler_ref::kind::checkpoint:
    return "a sampler checkpoint";
  }
  return "a sampler";
}

} // namespace

tinker_sampling::engine::~engine() {
  if (dispatcher)
    caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
  group.stop();
}

tinker_sampling::tinker_sampling(tinker_groups& groups, tinker_healing& healing,
                                 tinker::model_limits limits, std::string base_name,
                                 std::function<void(const std::string&)> refresh_model)
    : groups_(groups),
      healing_(healing),
      refresh_model_(std::move(refresh_model)),
      limits_(limits),
      base_name_(std::move(base_name)),
      base_has_tokenizer_(backends::has_tokenizer(groups.options().base_model_dir)) {}

tinker_sampling::~tinker_sampling() = default;

std::shared_ptr<tinker_sampling::engine>
tinker_sampling::make_engine(const std::string& dir, const std::string& what, bool untie) {
  auto e = std::make_shared<engine>();
  std::tie(e->group, e->generation) = groups_.spawn("engine", what);
  e->dispatcher = groups_.spawn_dispatcher();
  auto c = groups_.client(e->dispatcher);
  value_of(c.register_engines(e->group, "engines"), what + ": registering the engine");
  model_spec s;
  s.hf_dir = dir;
  s.untie_word_embeddings = untie;
  s.compute_dtype = groups_.options().compute_dtype;
  s.batch_invariant = groups_.options().batch_invariant;
  // Exports hold no tokenizer of their own; they share the base model's vocabulary.
  if (base_has_tokenizer_)
    s.tokenizer_dir = groups_.options().base_model_dir;
  value_of(c.init_model("engines", s), what + ": loading the weights");
  return e;
}

bool tinker_sampling::stale(const engine& e) const {
  return e.generation < groups_.generation();
}

void tinker_sampling::drop_if_stale(model_engine& me) {
  if (!me.e || !stale(*me.e))
    return;
  // Lost with its placement: what the engine retained is gone, unless saved again.
  for (int64_t v = 1; v <= me.version; ++v)
    if (!me.evicted.count(v))
      me.lost.insert(v);
  me.lost_node = node_of(me.e->group);
  me.e.reset();
}

std::shared_ptr<tinker_sampling::engine> tinker_sampling::base_engine() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (base_ && stale(*base_))
    base_.reset(); // on a lost placement: stopped when its last user is done with it
  if (!base_)
    base_ = make_engine(groups_.options().base_model_dir, "sample(base)");
  base_->last_used = ++clock_;
  return base_;
}

std::shared_ptr<tinker_sampling::engine>
tinker_sampling::export_engine(const tinker::sampler_ref& ref) {
  std::lock_guard<std::mutex> guard(mutex_);
  auto& slot = exports_[ref.dir];
  if (slot && stale(*slot))
    slot.reset();
  if (!slot) {
    auto what = "sample(" + sampler_name(ref) + ")";
    try {
      if (!fs::exists(fs::path(ref.dir) / "config.json"))
        tinker::fail_not_found(what + ": the checkpoint's weights are gone (deleted or expired)");
      slot = make_engine(ref.dir, what);
    } catch (const tinker::request_error& e) {
      exports_.erase(ref.dir);
      throw tinker::request_error(e.category(), replace_all(e.what(), ref.dir, sampler_name(ref)));
    }
  }
  slot->last_used = ++clock_;
  auto found = slot;
  while (exports_.size() > groups_.options().max_export_engines) {
    auto oldest = exports_.begin();
    for (auto i = exports_.begin(); i != exports_.end(); ++i)
      if (i->second->last_used < oldest->second->last_used)
        oldest = i;
    exports_.erase(oldest); // stops when its last user is done with it
  }
  return found;
}

std::shared_ptr<tinker_sampling::engine>
tinker_sampling::snapshot_engine(const tinker::sampler_ref& ref) {
  auto model_engine_of = [&] {
    std::lock_guard<std::mutex> guard(mutex_);
    auto i = models_.find(ref.model_id);
    if (i == models_.end())
      tinker::fail_not_found("sample(" + sampler_name(ref) + "): " +
                             (deleted_.count(ref.model_id)
                                  ? "its model '" + ref.model_id + "' was deleted"
                                  : "model '" + ref.model_id + "' saved no weights for sampling"));
    return i->second;
  };
  auto me = model_engine_of();
  bool on_lost_placement = false;
  {
    std::lock_guard<std::mutex> guard(me->mutex);
    on_lost_placement = me->e && stale(*me->e);
  }
  if (on_lost_placement) {
    // The model's rebuild spawns its engine again and saves its journal's snapshots there.
    refresh_model_(ref.model_id);
    me = model_engine_of();
  }
  std::lock_guard<std::mutex> guard(me->mutex);
  drop_if_stale(*me);
  if (me->lost.count(ref.version))
    tinker::fail_not_found("sample(" + sampler_name(ref) + "): its weights (version " +
                           std::to_string(ref.version) + " of model '" + ref.model_id +
                           "') were lost with node '" + me->lost_node +
                           "' and are older than the model's last recovery checkpoint; save "
                           "weights for a new sampler");
  if (ref.version < 1 || ref.version > me->version)
    tinker::fail_not_found("sample(" + sampler_name(ref) + "): model '" + ref.model_id +
                           "' has no snapshot version " + std::to_string(ref.version));
  if (me->evicted.count(ref.version))
    tinker::fail_not_found(
        "sample(" + sampler_name(ref) + "): its weights (version " + std::to_string(ref.version) +
        " of model '" + ref.model_id + "') were evicted: the server keeps the " +
        std::to_string(groups_.options().max_sampler_snapshots) +
        " most recently used sampler snapshots per model; save weights for a new sampler");
  if (!me->e)
    tinker::fail_server("sample(" + sampler_name(ref) + "): no engine holds model '" +
                        ref.model_id + "''s snapshots");
  return me->e;
}

int64_t tinker_sampling::save_snapshot(tinker_model& m, int64_t replayed_version) {
  auto context = "save_weights_for_sampler(" + m.id + ")";
  if (m.role != tinker::model_role::policy)
    tinker::fail_user(context + ": '" + m.id + "' is a critic; only policies sample");
  std::shared_ptr<model_engine> me;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto& slot = models_[m.id];
    if (!slot)
      slot = std::make_shared<model_engine>();
    me = slot;
    deleted_.erase(m.id);
  }
  std::lock_guard<std::mutex> guard(me->mutex);
  drop_if_stale(*me);
  if (replayed_version > 0 && me->e && replayed_version <= me->version &&
      !me->lost.count(replayed_version) && !me->evicted.count(replayed_version))
    return replayed_version; // a rebuild that had not finished saved it again already
  if (!me->e) {
    // An adapted unembedding makes the merged lm_head differ from the embedding.
    me->e = make_engine(groups_.options().base_model_dir, context,
                        m.lora.rank > 0 && m.lora.train_unembed);
    me->trainer = caf::actor{};
  }
  if (me->trainer != m.group.handle()) { // a new engine, or the model was rebuilt
    value_of(groups_.client(me->e->dispatcher).register_group("trainer", m.group),
             context + ": registering the model with its engine");
    me->trainer = m.group.handle();
  }
  auto least = replayed_version > 0 ? replayed_version : me->version + 1;
  auto version = value_of(
      groups_.client(me->e->dispatcher).save_weights_for_sampler("trainer", "", least),
      context + ": syncing");
  if (replayed_version > 0 && version != replayed_version)
    tinker::fail_server(context + ": replaying snapshot version " +
                        std::to_string(replayed_version) + " gave version " +
                        std::to_string(version));
  auto evicted =
      value_of(me->e->group.call_all(engine_ops::retain_weights, groups_.options().timeout, version,
                                     static_cast<int64_t>(groups_.options().max_sampler_snapshots)),
               context + ": retaining the snapshot");
  for (auto& versions : evicted)
    for (auto v : versions)
      me->evicted.insert(v);
  me->version = std::max(me->version, version);
  me->lost.erase(version);
  // The dispatcher is the model's own: what its totals grew by is this sync.
  if (auto totals = groups_.client(me->e->dispatcher).syncs()) {
    std::lock_guard<std::mutex> guard(mutex_);
    syncs_.count += totals->count - me->synced.count;
    syncs_.bytes += totals->bytes - me->synced.bytes;
    syncs_.seconds += totals->seconds - me->synced.seconds;
    me->synced = *totals;
  }
  return version;
}

backend_stats tinker_sampling::stats(std::chrono::milliseconds timeout) {
  std::vector<std::pair<std::string, std::shared_ptr<engine>>> engines;
  backend_stats out;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (base_)
      engines.emplace_back("base", base_);
    for (auto& [id, me] : models_) {
      std::unique_lock<std::mutex> model_lock(me->mutex, std::try_to_lock);
      if (model_lock.owns_lock() && me->e) // a model busy syncing is read at the next scrape
        engines.emplace_back("model:" + id, me->e);
    }
    for (auto& [dir, e] : exports_)
      engines.emplace_back("checkpoint:" + fs::path(dir).filename().string(), e);
    out.syncs = syncs_.count;
    out.sync_bytes = syncs_.bytes;
    out.sync_seconds = syncs_.seconds;
  }
  for (auto& [name, e] : engines) {
    auto answers = e->group.call_all(engine_ops::stats, timeout);
    if (!answers)
      continue;
    backend_stats::engine_cache c;
    c.engine = name;
    for (auto& text : *answers) {
      auto j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_discarded())
        continue;
      c.blocks += j.value("num_blocks", int64_t{0});
      c.blocks_in_use += j.value("num_blocks", int64_t{0}) - j.value("free_blocks", int64_t{0});
    }
    out.engines.push_back(std::move(c));
  }
  return out;
}

void tinker_sampling::drop_model(const std::string& model_id) {
  std::shared_ptr<model_engine> me;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto i = models_.find(model_id);
    deleted_.insert(model_id);
    if (i == models_.end())
      return;
    me = i->second;
    models_.erase(i);
  }
  std::lock_guard<std::mutex> guard(me->mutex);
  if (me->e) {
    groups_.stop(me->e->dispatcher);
    me->e->dispatcher = caf::actor{};
    groups_.stop_and_wait(me->e->group);
  }
}

std::shared_ptr<tinker_sampling::engine> tinker_sampling::engine_for(const tinker::sampler_ref& ref) {
  switch (ref.type) {
  case tinker::sampler_ref::kind::base:
    return base_engine();
  case tinker::sampler_ref::kind::snapshot:
    return snapshot_engine(ref);
  case tinker::sampler_ref::kind::checkpoint:
    return export_engine(ref);
  }
  tinker::fail_server("sample: unknown sampler kind");
}

std::vector<tinker::sample_response>
tinker_sampling::sample(const std::vector<tinker::sample_request>& requests) {
  if (requests.empty())
    tinker::fail_user("sample: no requests");
  // Check everything first, then run the requests of each engine as one generate call.
  std::map<std::string, std::vector<size_t>> by_engine;
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& t = requests[i];
    auto where = "sample(" + sampler_name(t.sampler) + ") request " + std::to_string(i);
    tinker::check_sample(t, limits_, where);
    if (!t.params.stop_strings.empty() && !base_has_tokenizer_)
      tinker::fail_user(where + ": stop strings need the model's tokenizer; the base model '" +
                        base_name_ +
                        "' has none (neither tokenizer.json nor tokenizer.model); send stop "
                        "token ids instead");
    by_engine[t.sampler.engine()].push_back(i);
  }
  std::vector<std::vector<sample_output>> rows(requests.size());
  for (auto& [key, indices] : by_engine) {
    const auto& ref = requests[indices.front()].sampler;
    auto context = "sample(" + sampler_name(ref) + ")";
    std::vector<sample_request> rs;
    for (auto i : indices)
      rs.push_back(engine_request(requests[i]));
    auto e = engine_for(ref);
    auto out = groups_.client(e->dispatcher).generate(rs);
    if (!out && healing_.enabled() && category_of(out.error()) == tinker::error_category::server &&
        healing_.lost(e->group)) {
      // Its engine was lost: heal (or see that another call did), then once more on a new one.
      healing_.heal(e->generation, node_of(e->group), context);
      e = engine_for(ref);
      out = groups_.client(e->dispatcher).generate(rs);
    }
    if (!out) {
      auto message = error_text(out.error());
      if (ref.type == tinker::sampler_ref::kind::checkpoint)
        message = replace_all(message, ref.dir, sampler_name(ref));
      // e.g. a tokenizer that did not load names its directory: the base model's.
      message = replace_all(message, "'" + groups_.options().base_model_dir + "'",
                            "the base model '" + base_name_ + "'");
      if (is(out.error(), errc::not_found) && ref.type == tinker::sampler_ref::kind::snapshot)
        tinker::fail_not_found(context + ": its weights (version " + std::to_string(ref.version) +
                               " of model '" + ref.model_id + "') are no longer held: " + message);
      throw tinker::request_error(category_of(out.error()), context + ": " + message);
    }
    size_t row = 0;
    for (auto i : indices) {
      auto n = static_cast<size_t>(requests[i].num_samples);
      if (row + n > out->size())
        tinker::fail_server(context + ": the engine answered " + std::to_string(out->size()) +
                            " rows, fewer than requested");
      rows[i].assign(std::make_move_iterator(out->begin() + row),
                     std::make_move_iterator(out->begin() + row + n));
      row += n;
    }
  }
  std::vector<tinker::sample_response> responses;
  for (size_t i = 0; i < requests.size(); ++i) {
    tinker::sample_response resp;
    resp.has_prompt_logprobs = requests[i].prompt_logprobs;
    for (size_t s = 0; s < rows[i].size(); ++s) {
      auto& o = rows[i][s];
      if (resp.has_prompt_logprobs && s == 0) {
        resp.prompt_logprobs.push_back(std::numeric_limits<double>::quiet_NaN());
        resp.prompt_logprobs.insert(resp.prompt_logprobs.end(), o.prompt_logprobs.begin(),
                                    o.prompt_logprobs.end());
      }
      if (requests[i].topk_prompt_logprobs > 0 && s == 0) {
        const auto k = requests[i].topk_prompt_logprobs;
        resp.topk = k;
        resp.topk_prompt_ids.assign(static_cast<size_t>(k), 0);
        resp.topk_prompt_logprobs.assign(static_cast<size_t>(k), tinker::topk_empty_logprob);
        resp.topk_prompt_ids.insert(resp.topk_prompt_ids.end(), o.topk_prompt_ids.begin(),
                                    o.topk_prompt_ids.end());
        resp.topk_prompt_logprobs.insert(resp.topk_prompt_logprobs.end(),
                                         o.topk_prompt_logprobs.begin(),
                                         o.topk_prompt_logprobs.end());
      }
      resp.sequences.push_back({o.stop_reason, std::move(o.tokens), std::move(o.logprobs)});
    }
    responses.push_back(std::move(resp));
  }
  return responses;
}

} // namespace rlforge::actors
