#include "rl/rl_loop.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <caf/all.hpp>

#include "rl/rollout_json.hpp"
#include "rl/rollout_producer.hpp"
#include "runtime/errc.hpp"

namespace rlforge::rl {

namespace {

using clock_type = std::chrono::steady_clock;

/// One blocking request to the producer; its answer or the error.
template <class T, class... Ts>
caf::expected<T> ask(caf::actor_system& sys, const caf::actor& producer,
                     std::chrono::milliseconds timeout, Ts&&... xs) {
  caf::scoped_actor self{sys};
  caf::expected<T> out{caf::error{}};
  self->request(producer, timeout, std::forward<Ts>(xs)...)
      .receive([&](T& x) { out = std::move(x); },
               [&](caf::error& e) {
                 if (e == caf::sec::request_timeout)
                   out = make_error(errc::timeout, "rl loop: the rollout producer did not answer");
                 else
                   out = std::move(e);
               });
  return out;
}

} // namespace

const char* to_string(rl_mode m) {
  switch (m) {
    case rl_mode::sync: return "sync";
    case rl_mode::one_step_off: return "one_step_off";
    case rl_mode::fully_async: return "fully_async";
  }
  return "?";
}

bool parse_rl_mode(const std::string& text, rl_mode& out) {
  for (auto m : {rl_mode::sync, rl_mode::one_step_off, rl_mode::fully_async})
    if (text == to_string(m)) {
      out = m;
      return true;
    }
  return false;
}

std::string check(const loop_options& o) {
  if (o.batch_rollouts < 1)
    return "batch_rollouts must be >= 1, got " + std::to_string(o.batch_rollouts);
  if (o.max_staleness < 0)
    return "max_staleness must be >= 0, got " + std::to_string(o.max_staleness);
  if (o.pause_mode != "keep" && o.pause_mode != "abort")
    return "pause_mode must be keep or abort, got '" + o.pause_mode + "'";
  if (o.take_timeout.count() <= 0)
    return "take_timeout must be > 0, got " + std::to_string(o.take_timeout.count()) + " ms";
  if (o.max_submissions < 1)
    return "max_submissions must be >= 1, got " + std::to_string(o.max_submissions);
  if (o.policy_role.empty() || o.engine_role.empty())
    return "policy_role and engine_role must not be empty";
  return "";
}

int64_t batches_ahead(const loop_options& o) {
  switch (o.mode) {
    case rl_mode::sync: return 0;
    case rl_mode::one_step_off: return 1;
    case rl_mode::fully_async: return std::max<int64_t>(1, o.max_staleness);
  }
  return 0;
}

int64_t effective_max_staleness(const loop_options& o) {
  return o.mode == rl_mode::sync ? 0 : o.max_staleness;
}

rl_loop::rl_loop(caf::actor_system& sys, actors::trainer_client& client, loop_options options,
                 request_source source)
    : sys_(&sys), client_(&client), options_(std::move(options)), source_(std::move(source)) {
  if (auto bad = check(options_); !bad.empty())
    throw std::invalid_argument("rl loop: " + bad);
  if (!source_)
    throw std::invalid_argument("rl loop: no request source");
  producer_options po;
  po.engine_role = options_.engine_role;
  po.request_timeout_ms = options_.take_timeout.count();
  po.max_submissions = options_.max_submissions;
  producer_ = spawn_rollout_producer(sys, client.dispatcher(), po);
}

rl_loop::~rl_loop() {
  // Stop what is still generating, then the producer itself.
  ask<int64_t>(*sys_, producer_, std::chrono::seconds(60), rl_stop_atom::value);
  caf::anon_send_exit(producer_, caf::exit_reason::user_shutdown);
}

caf::expected<loop_batch> rl_loop::next_batch() {
  const int64_t target = (batches_ahead(options_) + 1) * options_.batch_rollouts;
  if (held_ < target) {
    std::vector<rollout> fresh;
    for (int64_t i = held_; i < target; ++i) {
      rollout r;
      r.id = next_id_ + static_cast<int64_t>(fresh.size());
      r.request = source_(r.id);
      fresh.push_back(std::move(r));
    }
    auto n = static_cast<int64_t>(fresh.size());
    auto added = ask<int64_t>(*sys_, producer_, std::chrono::minutes(10), rl_add_atom::value,
                              std::move(fresh));
    if (!added)
      return added.error();
    next_id_ += n;
    held_ += n;
  }
  auto t0 = clock_type::now();
  auto batch = ask<rollout_batch>(*sys_, producer_, options_.take_timeout + std::chrono::seconds(5),
                                  rl_take_atom::value, options_.batch_rollouts, version_,
                                  effective_max_staleness(options_),
                                  static_cast<int64_t>(options_.take_timeout.count()));
  if (!batch)
    return batch.error();
  loop_batch out;
  out.wait_seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  out.rollouts = std::move(batch->rollouts);
  out.staleness = std::move(batch->staleness);
  out.dropped = static_cast<int64_t>(batch->dropped_ids.size());
  out.requeued = batch->requeued;
  held_ -= static_cast<int64_t>(out.rollouts.size()) + out.dropped;
  return out;
}

caf::expected<int64_t> rl_loop::update_weights() {
  auto v = client_->save_weights_for_sampler(options_.policy_role, options_.pause_mode,
                                             restored_version_ ? version_ : 0);
  if (!v)
    return v.error();
  version_ = *v;
  restored_version_ = false;
  return *v;
}

caf::expected<nlohmann::json> rl_loop::snapshot(const nlohmann::json& extra) {
  auto st = ask<rollout_state>(*sys_, producer_, std::chrono::minutes(1), rl_state_atom::value);
  if (!st)
    return st.error();
  return nlohmann::json{{"mode", to_string(options_.mode)},
                        {"next_id", next_id_},
                        {"version", version_},
                        {"rollouts", to_json(*st)},
                        {"extra", extra}};
}

caf::expected<nlohmann::json> rl_loop::restore(const nlohmann::json& snapshot) {
  rollout_state st;
  int64_t next_id = 0, version = 0;
  try {
    if (!snapshot.is_object() || !snapshot.contains("rollouts") || !snapshot.contains("next_id") ||
        !snapshot.contains("version") || !snapshot.contains("extra"))
      throw std::invalid_argument("the snapshot needs rollouts, next_id, version and extra");
    st = rollout_state_from_json(snapshot.at("rollouts"));
    next_id = snapshot.at("next_id").get<int64_t>();
    version = snapshot.at("version").get<int64_t>();
    if (next_id < 0 || version < 0)
      throw std::invalid_argument("next_id and version must be >= 0");
    for (const auto* list : {&st.waiting, &st.done})
      for (const auto& r : *list)
        if (r.id < 0 || r.id >= next_id)
          throw std::invalid_argument("rollout id " + std::to_string(r.id) +
                                      " is outside [0, next_id = " + std::to_string(next_id) +
                                      ")");
  } catch (const std::exception& e) {
    return make_error(errc::invalid_argument, std::string{"rl loop: restore: "} + e.what());
  }
  const auto held = static_cast<int64_t>(st.waiting.size() + st.done.size());
  auto r = ask<int64_t>(*sys_, producer_, std::chrono::minutes(10), rl_restore_atom::value,
                        std::move(st));
  if (!r)
    return r.error();
  next_id_ = next_id;
  held_ = held;
  version_ = version;
  restored_version_ = true;
  return snapshot.at("extra");
}

caf::expected<rl_loop::totals> rl_loop::accounting() {
  auto st = ask<rollout_state>(*sys_, producer_, std::chrono::minutes(1), rl_state_atom::value);
  if (!st)
    return st.error();
  totals t;
  t.staleness_counts = st->staleness_counts;
  t.taken = st->taken;
  t.dropped = st->dropped;
  t.requeued = st->requeued;
  return t;
}

} // namespace rlforge::rl
