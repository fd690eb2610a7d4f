#include "actors/tinker_groups.hpp"

#include <algorithm>
#include <vector>

#include <caf/all.hpp>

#include "actors/dispatcher.hpp"
#include "actors/protocol.hpp"
#include "runtime/errc.hpp"
#include "tinker/error.hpp"

namespace rlforge::actors {

tinker::error_category category_of(const caf::error& err) {
  if (is(err, errc::invalid_argument) || is(err, errc::out_of_range) || is(err, errc::decode_error))
    return tinker::error_category::user;
  if (is(err, errc::not_found))
    return tinker::error_category::not_found;
  return tinker::error_category::server;
}

std::string error_text(const caf::error& err) {
  auto text = error_message(err);
  return text.empty() ? caf::to_string(err) : text;
}

void throw_request_error(const caf::error& err, const std::string& context) {
  throw tinker::request_error(category_of(err), context + ": " + error_text(err));
}

void check(caf::expected<void> x, const std::string& context) {
  if (!x)
    throw_request_error(x.error(), context);
}

tinker_groups::tinker_groups(caf::actor_system& sys, const dispatcher_backend_options& opts)
    : sys_(&sys), opts_(&opts), placement_(opts.placement) {}

std::pair<placement_group_info, uint64_t> tinker_groups::placement() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return {placement_, generation_};
}

uint64_t tinker_groups::generation() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return generation_;
}

void tinker_groups::replace_placement(placement_group_info pg) {
  pg.bundles.resize(1); // every group: one rank on bundle 0
  std::lock_guard<std::mutex> guard(mutex_);
  placement_ = std::move(pg);
  ++generation_;
}

std::pair<actor_group, uint64_t> tinker_groups::spawn(const std::string& kind,
                                                      const std::string& what) {
  group_spec s;
  s.name = "tinker-" + kind + "-" + std::to_string(++counter_);
  s.kind = kind;
  auto [pg, generation] = placement();
  s.placement = std::move(pg);
  s.num_ranks = 1;
  s.gpu_per_rank = opts_->gpu_per_group;
  s.threads_per_rank = opts_->threads_per_rank;
  s.collectives = false; // one rank: nothing to all-reduce
  s.placement_manager = opts_->placement_manager;
  auto g = actor_group::spawn(*sys_, s);
  if (!g) // out of placement shares or a runtime failure: the server's, not the request's
    tinker::fail_server(what + ": spawning the " + kind + " group: " + error_message(g.error()));
  return {*g, generation};
}

caf::actor tinker_groups::spawn_dispatcher() {
  return actors::spawn_dispatcher(*sys_);
}

void tinker_groups::stop(const caf::actor& dispatcher) {
  if (dispatcher)
    caf::anon_send_exit(dispatcher, caf::exit_reason::user_shutdown);
}

void tinker_groups::stop_and_wait(actor_group& g) {
  if (!g.handle())
    return;
  auto ranks = g.rank_handles();
  std::vector<caf::actor> actors{g.handle()};
  if (ranks)
    actors.insert(actors.end(), ranks->begin(), ranks->end());
  g.stop();
  caf::scoped_actor self{*sys_};
  for (auto& r : actors)
    self->monitor(r);
  auto deadline = std::chrono::steady_clock::now() + opts_->timeout;
  for (size_t n = 0; n < actors.size();) {
    bool timed_out = false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    self->receive([&](caf::down_msg&) { ++n; },
                  caf::after(std::max(left, std::chrono::milliseconds(1))) >>
                      [&] { timed_out = true; });
    if (timed_out)
      tinker::fail_server("stopping group: its ranks did not terminate within " +
                          std::to_string(opts_->timeout.count()) + " ms");
  }
  // The group sent its releases before terminating: one round trip to the manager after that
  // has them handled.
  if (opts_->placement_manager)
    self->request(opts_->placement_manager, opts_->timeout, pg_table_atom::value)
        .receive([](std::string&) {}, [](caf::error&) {});
}

trainer_client tinker_groups::client(const caf::actor& dispatcher) const {
  return trainer_client(*sys_, dispatcher, opts_->timeout);
}

} // namespace rlforge::actors
