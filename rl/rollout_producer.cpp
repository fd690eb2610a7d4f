#include "rl/rollout_producer.hpp"

#include <chrono>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/dispatcher.hpp"
#include "rl/rollout_buffer.hpp"
#include "runtime/errc.hpp"
#include "runtime/logging.hpp"
#include "runtime/messages.hpp"

namespace rlforge::rl {

namespace {

/// The take the trainer is waiting for.
struct waiting_take {
  caf::response_promise promise;
  int64_t count = 0;
  int64_t version = 0;
  int64_t max_staleness = 0;
  int64_t serial = 0; ///< matches its expiry message
};

struct producer_state {
  caf::actor dispatcher;
  producer_options options;
  /// Rollouts queued or in flight on the engines, by id (no rows).
  std::map<int64_t, rollout> waiting;
  rollout_buffer buffer;
  std::optional<waiting_take> take;
  int64_t take_serial = 0;
  /// Set once a submission failed for good; every later take fails with it.
  caf::error failure;
  static const char* name;
};

const char* producer_state::name = "rlforge.rollout_producer";

using self_ptr = caf::stateful_actor<producer_state>*;

/// Answers the waiting take when it can be answered: with the failure, or with a batch.
void try_take(self_ptr self) {
  auto& st = self->state;
  if (!st.take)
    return;
  if (st.failure) {
    st.take->promise.deliver(st.failure);
    st.take.reset();
    return;
  }
  auto batch = st.buffer.take(st.take->count, st.take->version, st.take->max_staleness);
  if (batch) {
    st.take->promise.deliver(std::move(*batch));
    st.take.reset();
    return;
  }
  // Stale rollouts were dropped: if what is left can never fill the take, say so now.
  auto held = static_cast<int64_t>(st.waiting.size() + st.buffer.size());
  if (held < st.take->count) {
    st.take->promise.deliver(make_error(
        errc::out_of_range, "rollout producer: a take of " + std::to_string(st.take->count) +
                                " rollouts cannot be filled: " + std::to_string(held) +
                                " are held (" + std::to_string(st.waiting.size()) +
                                " waiting, " + std::to_string(st.buffer.size()) +
                                " finished); add more"));
    st.take.reset();
  }
}

void fail(self_ptr self, caf::error err) {
  if (!self->state.failure) {
    runtime::logger("rl.producer")->error("{}", self->system().render(err));
    self->state.failure = std::move(err);
  }
  try_take(self);
}

/// Submits `ids` (all in `waiting`) through the dispatcher; `k` gets the dispatcher's answer.
void submit(self_ptr self, const std::vector<int64_t>& ids,
            std::function<void(caf::error)> k) {
  auto& st = self->state;
  std::vector<sample_request> requests;
  for (auto id : ids) {
    auto& r = st.waiting.at(id);
    ++r.submissions;
    requests.push_back(r.request);
  }
  const auto timeout_ms = st.options.request_timeout_ms;
  self->request(st.dispatcher, std::chrono::milliseconds{timeout_ms + 5000},
                actors::dispatcher_call_atom::value, st.options.engine_role,
                actors::dispatcher_ops::submit.id,
                actors::dispatcher_ops::submit.args(caf::actor_cast<caf::actor>(self), ids,
                                                    std::move(requests)),
                timeout_ms)
      .then([k](op_result&) { k(caf::error{}); }, [k](caf::error& err) { k(std::move(err)); });
}

/// Submits rollout `id` again after `why`, or gives up once it used its tries.
void requeue(self_ptr self, int64_t id, const std::string& why) {
  auto& st = self->state;
  auto i = st.waiting.find(id);
  if (i == st.waiting.end())
    return;
  if (i->second.submissions >= st.options.max_submissions)
    return fail(self, make_error(errc::rank_failed,
                                 "rollout producer: rollout " + std::to_string(id) +
                                     " was submitted " + std::to_string(i->second.submissions) +
                                     " times without finishing; last: " + why));
  st.buffer.count_requeue();
  runtime::logger("rl.producer")->info("requeue rollout={} after: {}", id, why);
  submit(self, {id}, [=](caf::error err) {
    if (err)
      fail(self, std::move(err));
  });
}

/// A finished (or stopped, or lost) submission.
void on_result(self_ptr self, generation_result& r) {
  auto& st = self->state;
  auto i = st.waiting.find(r.id);
  if (i == st.waiting.end())
    return; // stopped by rl_stop_atom
  bool aborted = false;
  for (auto& s : r.samples)
    aborted = aborted || s.stop_reason == "abort";
  const auto code = static_cast<errc>(r.error_code);
  if (code == errc::rank_failed || code == errc::timeout || (r.error.empty() && aborted))
    return requeue(self, r.id, r.error.empty() ? "handed back by pause(abort)" : r.error);
  if (!r.error.empty())
    return fail(self, make_error(code == errc::none ? errc::internal : code,
                                 "rollout producer: rollout " + std::to_string(r.id) +
                                     " failed: " + r.error));
  auto done = std::move(i->second);
  st.waiting.erase(i);
  done.samples = std::move(r.samples);
  st.buffer.add(std::move(done));
  try_take(self);
}

caf::behavior producer(self_ptr self, caf::actor dispatcher, producer_options options) {
  self->state.dispatcher = std::move(dispatcher);
  self->state.options = std::move(options);
  return {
      [=](generation_result& r) { on_result(self, r); },
      [=](rl_add_atom, std::vector<rollout>& rs) -> caf::result<int64_t> {
        auto& st = self->state;
        std::set<int64_t> fresh;
        for (auto& r : rs) {
          if (!r.samples.empty())
            return make_error(errc::invalid_argument, "rollout producer: rollout " +
                                                          std::to_string(r.id) +
                                                          " already has rows; add new ones");
          if (st.waiting.count(r.id) || !fresh.insert(r.id).second)
            return make_error(errc::already_exists, "rollout producer: rollout id " +
                                                        std::to_string(r.id) + " is held already");
        }
        if (rs.empty())
          return static_cast<int64_t>(st.waiting.size() + st.buffer.size());
        std::vector<int64_t> ids;
        for (auto& r : rs) {
          ids.push_back(r.id);
          r.submissions = 0;
          st.waiting.emplace(r.id, std::move(r));
        }
        auto promise = self->make_response_promise<int64_t>();
        submit(self, ids, [=](caf::error err) mutable {
          auto& s = self->state;
          if (err) { // all or none: nothing of this call is kept
            for (auto id : ids)
              s.waiting.erase(id);
            promise.deliver(std::move(err));
          } else {
            promise.deliver(static_cast<int64_t>(s.waiting.size() + s.buffer.size()));
          }
        });
        return promise;
      },
      [=](rl_take_atom, int64_t count, int64_t version, int64_t max_staleness,
          int64_t timeout_ms) -> caf::result<rollout_batch> {
        auto& st = self->state;
        if (count < 1 || max_staleness < 0 || version < 0 || timeout_ms <= 0)
          return make_error(errc::invalid_argument,
                            "rollout producer: take needs count >= 1, version >= 0, "
                            "max_staleness >= 0 and timeout_ms > 0; got " +
                                std::to_string(count) + ", " + std::to_string(version) + ", " +
                                std::to_string(max_staleness) + ", " + std::to_string(timeout_ms));
        if (st.take)
          return make_error(errc::busy, "rollout producer: another take is waiting");
        auto promise = self->make_response_promise<rollout_batch>();
        st.take = waiting_take{promise, count, version, max_staleness, ++st.take_serial};
        self->delayed_send(self, std::chrono::milliseconds{timeout_ms}, rl_expire_atom::value,
                           st.take_serial);
        try_take(self);
        return promise;
      },
      [=](rl_expire_atom, int64_t serial) {
        auto& st = self->state;
        if (!st.take || st.take->serial != serial)
          return;
        st.take->promise.deliver(make_error(
            errc::timeout, "rollout producer: no batch of " + std::to_string(st.take->count) +
                               " fresh rollouts in time: " + std::to_string(st.waiting.size()) +
                               " still generating, " + std::to_string(st.buffer.size()) +
                               " finished"));
        st.take.reset();
      },
      [=](rl_state_atom) -> rollout_state {
        auto& st = self->state;
        auto out = st.buffer.state();
        for (auto& [id, r] : st.waiting) {
          auto w = r;
          w.samples.clear();
          out.waiting.push_back(std::move(w));
        }
        return out;
      },
      [=](rl_restore_atom, rollout_state& s) -> caf::result<int64_t> {
        auto& st = self->state;
        if (!st.waiting.empty() || st.buffer.size() > 0 || st.take)
          return make_error(errc::invalid_argument,
                            "rollout producer: restore needs a producer that holds nothing yet");
        std::vector<rollout> waiting = std::move(s.waiting);
        s.waiting.clear();
        st.buffer.restore(s);
        std::vector<int64_t> ids;
        for (auto& r : waiting) {
          if (!r.samples.empty() || st.waiting.count(r.id)) {
            st.waiting.clear();
            st.buffer.restore(rollout_state{});
            return make_error(errc::invalid_argument,
                              "rollout producer: the snapshot's waiting rollout " +
                                  std::to_string(r.id) + " is repeated or has rows");
          }
          ids.push_back(r.id);
          r.submissions = 0;
          st.waiting.emplace(r.id, std::move(r));
        }
        if (ids.empty())
          return int64_t{0};
        auto promise = self->make_response_promise<int64_t>();
        const auto n = static_cast<int64_t>(ids.size());
        submit(self, ids, [=](caf::error err) mutable {
          if (err) {
            for (auto id : ids)
              self->state.waiting.erase(id);
            promise.deliver(std::move(err));
          } else {
            promise.deliver(n);
          }
        });
        return promise;
      },
      [=](rl_stop_atom) -> caf::result<int64_t> {
        auto& st = self->state;
        std::vector<int64_t> ids;
        for (auto& [id, r] : st.waiting)
          ids.push_back(id);
        st.waiting.clear();
        if (ids.empty())
          return int64_t{0};
        auto promise = self->make_response_promise<int64_t>();
        self->request(st.dispatcher, std::chrono::seconds(60), actors::dispatcher_call_atom::value,
                      st.options.engine_role, actors::engine_ops::cancel.id,
                      actors::engine_ops::cancel.args(caf::actor_cast<caf::actor>(self), ids),
                      int64_t{55000})
            .then(
                [=](op_result& r) mutable {
                  auto stopped = actors::engine_ops::cancel.answer(std::move(r.value));
                  if (stopped)
                    promise.deliver(*stopped);
                  else
                    promise.deliver(make_error(errc::internal, "rollout producer: " +
                                                                   error_message(stopped.error())));
                },
                [=](caf::error& err) mutable { promise.deliver(std::move(err)); });
        return promise;
      },
  };
}

} // namespace

caf::actor spawn_rollout_producer(caf::actor_system& sys, caf::actor dispatcher,
                                  producer_options options) {
  return sys.spawn(producer, std::move(dispatcher), std::move(options));
}

} // namespace rlforge::rl
