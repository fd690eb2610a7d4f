// The continuous-batching engine rank on a real actor system: calls joining the running batch
// and leaving it when done (the tokens in flight and busy time its stats report), streaming (`submit`: each request delivered when it finishes, in
// finishing order), one prefill per prompt for n samples (counted), preemption under a small
// KV budget with unchanged results, the KV cache freed and restored mid-run, per-token weight
// versions across pause(keep) and a pinned version across an update, pause(abort) handing back
// partial rollouts, deadlines (also while paused), cancel, an engine killed mid-run (the
// dispatcher reports exactly its requests as lost), and bad submissions.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/batch_wire.hpp"
#include "actors/engine.hpp"
#include "actors/protocol.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "backends/model/sampling_params.hpp"
#include "backends/threads.hpp"
#include "runtime/errc.hpp"
#include "test_support.hpp"

namespace rlforge::actors::test {
namespace {

namespace be = rlforge::backends;
using namespace std::chrono_literals;

constexpr double logprob_tolerance = 1e-5;

sample_request request(std::vector<int64_t> prompt, int64_t max_tokens, double temperature,
                       std::optional<uint64_t> seed, int64_t num_samples = 1) {
  sample_request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.temperature = temperature;
  r.has_seed = seed.has_value();
  r.seed = seed.value_or(0);
  r.num_samples = num_samples;
  return r;
}

/// Sample j of `r` run alone by the static sampler.
be::sample_result alone(be::causal_lm& model, const sample_request& r, int64_t j) {
  be::sampling_params p;
  p.max_tokens = r.max_tokens;
  p.temperature = r.temperature;
  p.top_k = r.top_k;
  p.top_p = r.top_p;
  p.stop_token_ids = r.stop_token_ids;
  p.prompt_logprobs = r.prompt_logprobs;
  if (r.has_seed)
    p.seed = be::sample_seed(r.seed, static_cast<uint64_t>(r.first_sample + j));
  return be::generate(model, {r.prompt}, {p}).at(0);
}

void expect_row(const sample_output& got, const be::sample_result& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.stop_reason, want.stop_reason);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t t = 0; t < got.logprobs.size(); ++t)
    EXPECT_NEAR(got.logprobs[t], want.logprobs[t], logprob_tolerance) << "token " << t;
  EXPECT_EQ(got.token_versions.size(), got.tokens.size());
}

class ContinuousEngines : public actor_fixture {
protected:
  void register_kinds() override {
    register_worker_kinds();
    register_engine_kind();
  }

  /// Two engine ranks registered as role `role`, holding `model_`'s weights (tiny, seed 3, fp32).
  actor_group two_engines(const std::string& role) {
    auto two = ok(spawn_group(role, "engine", 2));
    ok(client_->register_engines(two, role));
    model_spec s;
    s.preset = "tiny";
    s.seed = 3;
    s.compute_dtype = "fp32";
    ok(client_->init_model(role, s));
    return two;
  }

  void SetUp() override {
    actor_fixture::SetUp();
    be::set_intra_op_threads(1);
    engines_ = ok(spawn_group("engines", "engine", 1));
    model_spec s;
    s.preset = "tiny";
    s.seed = 3;
    s.compute_dtype = "fp32"; // compared with the fp32 static sampler within 1e-5
    ok(engines_.call_all(engine_ops::init_model.id, caf::make_message(s), 60s));
    rank_ = ok(engines_.rank_handles()).at(0);
    model_ = be::causal_lm::random(be::preset("tiny"), 3);
    model_->set_training(false);
  }

  void TearDown() override {
    rank_ = caf::actor{}; // a detached actor ends only when no handle keeps it
    actor_fixture::TearDown();
  }

  /// `op(args)` on the engine rank.
  caf::expected<caf::message> call(caf::atom_value op, caf::message args, caf::actor rank = {}) {
    caf::scoped_actor self{*sys_};
    caf::expected<caf::message> out{caf::message{}};
    self->request(rank ? rank : rank_, 60s,
                  caf::message::concat(caf::make_message(op), std::move(args)))
        .receive([&](op_result& r) { out = std::move(r.value); },
                 [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  template <class T> T value(caf::atom_value op, caf::message args = caf::message{}) {
    auto out = ok(call(op, std::move(args)));
    EXPECT_TRUE(out.match_elements<T>()) << caf::to_string(out);
    return out.get_as<T>(0);
  }

  nlohmann::json stats() { return nlohmann::json::parse(value<std::string>(engine_ops::stats.id)); }

  /// Waits until the engine generated at least `tokens` tokens (bounded).
  void wait_for_tokens(int64_t tokens) {
    for (int i = 0; i < 5000; ++i) {
      if (stats().at("generated_tokens").get<int64_t>() >= tokens)
        return;
      std::this_thread::sleep_for(1ms);
    }
    FAIL() << "the engine did not generate " << tokens << " tokens";
  }

  /// Submits to the rank for `consumer`.
  caf::expected<caf::message> submit(caf::actor consumer, std::vector<int64_t> ids,
                                     std::vector<sample_request> requests,
                                     int64_t timeout_ms = 60000) {
    return call(engine_ops::submit.id,
                caf::make_message(consumer, std::move(ids), std::move(requests), timeout_ms));
  }

  /// The next `generation_result` to `self` (bounded).
  generation_result next_result(caf::scoped_actor& self) {
    generation_result out;
    out.id = -1;
    self->receive([&](generation_result& r) { out = std::move(r); },
                  caf::after(60s) >> [] { ADD_FAILURE() << "no generation_result in 60 s"; });
    return out;
  }

  void expect_error(const caf::expected<caf::message>& x, errc code, const std::string& part) {
    ASSERT_FALSE(x) << "expected an error containing '" << part << "', got "
                    << caf::to_string(*x);
    EXPECT_TRUE(is(x.error(), code)) << sys_->render(x.error());
    EXPECT_NE(error_message(x.error()).find(part), std::string::npos) << error_message(x.error());
  }

  actor_group engines_;
  caf::actor rank_;
  std::unique_ptr<be::causal_lm> model_;
};

TEST_F(ContinuousEngines, ACallJoinsTheRunningBatchAndLeavesItWhenDone) {
  auto long_req = request({1, 2, 3}, 300, 1.0, 5);
  auto short_req = request({7, 8, 9, 10}, 4, 1.0, 6);
  caf::scoped_actor self{*sys_};
  auto first =
      self->request(rank_, 60s, engine_ops::generate.call(std::vector<sample_request>{long_req}));
  wait_for_tokens(5); // the long call is running
  auto second =
      self->request(rank_, 60s, engine_ops::generate.call(std::vector<sample_request>{short_req}));
  // The short call joins the batch and is answered while the long one still runs.
  second.receive(
      [&](op_result& r) {
        expect_row(r.value.get_as<std::vector<sample_output>>(0).at(0),
                   alone(*model_, short_req, 0), "short");
      },
      [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); });
  auto s = stats();
  EXPECT_EQ(s.at("running").get<int64_t>(), 1) << s.dump();
  EXPECT_LT(s.at("generated_tokens").get<int64_t>(), 300 + 4) << s.dump();
  // In flight: the long row so far, which is everything generated but the short row.
  EXPECT_EQ(s.at("in_flight_tokens").get<int64_t>(), s.at("generated_tokens").get<int64_t>() - 4)
      << s.dump();
  EXPECT_GT(s.at("busy_seconds").get<double>(), 0.0) << s.dump();
  first.receive(
      [&](op_result& r) {
        expect_row(r.value.get_as<std::vector<sample_output>>(0).at(0),
                   alone(*model_, long_req, 0), "long");
      },
      [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); });
  EXPECT_EQ(stats().at("free_blocks"), stats().at("num_blocks")); // every block came back
  auto after = stats();
  EXPECT_EQ(after.at("in_flight_tokens").get<int64_t>(), 0) << after.dump();
  EXPECT_GE(after.at("busy_seconds").get<double>(), s.at("busy_seconds").get<double>());
}

TEST_F(ContinuousEngines, StreamedRequestsArriveAsTheyFinishInFinishingOrder) {
  caf::scoped_actor self{*sys_};
  auto me = caf::actor_cast<caf::actor>(self);
  std::vector<sample_request> rs{request({5, 6}, 12, 0.0, std::nullopt),
                                 request({5, 7}, 3, 0.0, std::nullopt),
                                 request({5, 8}, 7, 1.0, 4, 2)};
  EXPECT_EQ(ok(submit(me, {10, 11, 12}, rs)).get_as<int64_t>(0), 3);
  std::vector<int64_t> order;
  for (int i = 0; i < 3; ++i) {
    auto r = next_result(self);
    order.push_back(r.id);
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.engine_rank, 0);
    const auto& req = rs.at(static_cast<size_t>(r.id - 10));
    ASSERT_EQ(r.samples.size(), static_cast<size_t>(req.num_samples));
    for (int64_t j = 0; j < req.num_samples; ++j)
      expect_row(r.samples[static_cast<size_t>(j)], alone(*model_, req, j),
                 "id " + std::to_string(r.id));
  }
  EXPECT_EQ(order, (std::vector<int64_t>{11, 12, 10})); // 3, 7, then 12 tokens
}

TEST_F(ContinuousEngines, TheSamplesOfOneRequestPrefillItsPromptOnce) {
  std::vector<int64_t> prompt;
  for (int64_t t = 0; t < 40; ++t)
    prompt.push_back((t * 37) % 500);
  auto group = request(prompt, 6, 1.0, 77, 5);
  auto before = stats().at("prompt_tokens").get<int64_t>();
  auto rows = value<std::vector<sample_output>>(
      engine_ops::generate.id, caf::make_message(std::vector<sample_request>{group}));
  EXPECT_EQ(stats().at("prompt_tokens").get<int64_t>() - before, 40); // not 5 x 40
  ASSERT_EQ(rows.size(), 5u);
  for (int64_t j = 0; j < 5; ++j)
    expect_row(rows[static_cast<size_t>(j)], alone(*model_, group, j), "sample " + std::to_string(j));
}

TEST_F(ContinuousEngines, ASmallKvBudgetPreemptsAndRecomputesWithTheSameResults) {
  std::vector<sample_request> rs;
  for (int i = 0; i < 8; ++i)
    rs.push_back(request({int64_t{20} + i, 21, 22, 23, 24, 25}, 40, 1.0, 100u + i, 2));
  // Tiny: 512 bytes per position; 24 blocks of 16 positions, the biggest request needs 7.
  engine_options small;
  small.kv_cache_bytes = 24 * 16 * 512;
  small.max_num_seqs = 16;
  small.max_step_tokens = 64;
  ok(call(engine_ops::configure.id, caf::make_message(small)));
  auto rows = value<std::vector<sample_output>>(engine_ops::generate.id, caf::make_message(rs));
  auto s = stats();
  EXPECT_GT(s.at("preemptions").get<int64_t>(), 0) << s.dump();
  EXPECT_EQ(s.at("kv_cache_bytes").get<int64_t>(), small.kv_cache_bytes);
  size_t row = 0;
  for (auto& r : rs)
    for (int64_t j = 0; j < r.num_samples; ++j, ++row)
      expect_row(rows.at(row), alone(*model_, r, j), "row " + std::to_string(row));
}

TEST_F(ContinuousEngines, SleepingTheKvCacheMidRunFreesItAndTheRunCompletesUnchanged) {
  auto r = request({3, 3, 3}, 200, 1.0, 8, 3);
  caf::scoped_actor self{*sys_};
  auto pending =
      self->request(rank_, 60s, engine_ops::generate.call(std::vector<sample_request>{r}));
  wait_for_tokens(10);
  const auto kv = stats().at("kv_cache_bytes").get<int64_t>();
  const auto before = ok(call(engine_ops::memory.id, caf::message{})).get_as<int64_t>(0);
  ok(call(engine_ops::sleep.id, caf::make_message(std::vector<std::string>{"kv_cache"})));
  EXPECT_EQ(ok(call(engine_ops::memory.id, caf::message{})).get_as<int64_t>(0), before - kv);
  const auto frozen = stats().at("generated_tokens").get<int64_t>();
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(stats().at("generated_tokens").get<int64_t>(), frozen); // nothing runs asleep
  ok(call(engine_ops::wake_up.id, caf::make_message(std::vector<std::string>{"kv_cache"})));
  pending.receive(
      [&](op_result& res) {
        auto rows = res.value.get_as<std::vector<sample_output>>(0);
        for (int64_t j = 0; j < 3; ++j)
          expect_row(rows.at(static_cast<size_t>(j)), alone(*model_, r, j), "sample");
      },
      [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); });
  EXPECT_GT(stats().at("recompute_tokens").get<int64_t>(), 0); // re-fed after the wake
}

TEST_F(ContinuousEngines, PauseKeepTagsTokensWithTheVersionThatProducedThemAndPinnedRequestsStay) {
  caf::scoped_actor self{*sys_};
  auto me = caf::actor_cast<caf::actor>(self);
  // Version 1 = the initial weights, retained; one request follows updates, one is pinned to 1.
  auto w1 = value<tensor_map>(engine_ops::get_weights.id);
  ok(call(engine_ops::set_weights.id, caf::make_message(w1, int64_t{1})));
  ok(call(engine_ops::retain_weights.id, caf::make_message(int64_t{1}, int64_t{2})));
  auto live = request({4, 5, 6}, 400, 1.0, 31);
  auto pinned = request({4, 5, 6}, 400, 1.0, 31);
  pinned.weight_version = 1;
  ok(submit(me, {1, 2}, {live, pinned}));
  wait_for_tokens(20);
  EXPECT_EQ(
      ok(call(engine_ops::pause.id, caf::make_message(std::string{"keep"}))).get_as<int64_t>(0), 0);
  auto other = be::causal_lm::random(be::preset("tiny"), 9);
  std::map<std::string, at::Tensor> w2;
  for (auto& [name, p] : other->named_parameters())
    w2.emplace(name, p.detach());
  ok(call(engine_ops::set_weights.id, caf::make_message(*to_blobs(w2), int64_t{2})));
  EXPECT_EQ(value<int64_t>(engine_ops::resume.id), 0);
  std::map<int64_t, generation_result> got;
  for (int i = 0; i < 2; ++i) {
    auto r = next_result(self);
    got[r.id] = r;
  }
  auto full = alone(*model_, live, 0); // the whole run on version 1's weights
  const auto& lv = got.at(1).samples.at(0);
  ASSERT_EQ(lv.token_versions.size(), lv.tokens.size());
  size_t switch_at = 0;
  while (switch_at < lv.token_versions.size() && lv.token_versions[switch_at] == 1)
    ++switch_at;
  ASSERT_GT(switch_at, 0u);
  ASSERT_LT(switch_at, lv.tokens.size()) << "the live request finished before the update";
  for (size_t t = switch_at; t < lv.token_versions.size(); ++t)
    EXPECT_EQ(lv.token_versions[t], 2) << "token " << t;
  // Before the update: exactly the version-1 run.
  EXPECT_EQ(std::vector<int64_t>(lv.tokens.begin(), lv.tokens.begin() + switch_at),
            std::vector<int64_t>(full.tokens.begin(), full.tokens.begin() + switch_at));
  // The pinned request ran entirely on version 1.
  const auto& pv = got.at(2).samples.at(0);
  EXPECT_EQ(pv.token_versions, std::vector<int64_t>(pv.tokens.size(), 1));
  expect_row(pv, full, "pinned");
}

TEST_F(ContinuousEngines, PauseAbortHandsBackPartialRolloutsAndTheEngineGoesOn) {
  caf::scoped_actor self{*sys_};
  auto me = caf::actor_cast<caf::actor>(self);
  auto streamed = request({9, 9}, 400, 1.0, 41, 2);
  auto called = request({8, 8}, 400, 1.0, 42);
  ok(submit(me, {7}, {streamed}));
  auto call_handle =
      self->request(rank_, 60s, engine_ops::generate.call(std::vector<sample_request>{called}));
  wait_for_tokens(20);
  EXPECT_EQ(
      ok(call(engine_ops::pause.id, caf::make_message(std::string{"abort"}))).get_as<int64_t>(0),
      2);
  auto r = next_result(self);
  EXPECT_EQ(r.id, 7);
  EXPECT_TRUE(r.error.empty()) << r.error;
  ASSERT_EQ(r.samples.size(), 2u);
  for (int j = 0; j < 2; ++j) {
    auto& row = r.samples[static_cast<size_t>(j)];
    EXPECT_EQ(row.stop_reason, "abort");
    ASSERT_GT(row.tokens.size(), 0u);
    ASSERT_LT(row.tokens.size(), 400u);
    auto full = alone(*model_, streamed, j);
    EXPECT_EQ(row.tokens, std::vector<int64_t>(full.tokens.begin(),
                                               full.tokens.begin() +
                                                   static_cast<std::ptrdiff_t>(row.tokens.size())));
  }
  call_handle.receive(
      [&](op_result& res) {
        auto rows = res.value.get_as<std::vector<sample_output>>(0);
        ASSERT_EQ(rows.size(), 1u);
        EXPECT_EQ(rows[0].stop_reason, "abort");
      },
      [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); });
  EXPECT_EQ(stats().at("running").get<int64_t>(), 0);
  // Resubmitted after resume, a rollout starts over and reproduces its seeded tokens.
  EXPECT_EQ(value<int64_t>(engine_ops::resume.id), 0);
  auto again = request({9, 9}, 30, 1.0, 41, 2);
  auto rows = value<std::vector<sample_output>>(
      engine_ops::generate.id, caf::make_message(std::vector<sample_request>{again}));
  expect_row(rows.at(1), alone(*model_, again, 1), "resubmitted");
}

TEST_F(ContinuousEngines, DeadlinesHoldAlsoWhilePausedAndCancelStopsRequests) {
  caf::scoped_actor self{*sys_};
  auto me = caf::actor_cast<caf::actor>(self);
  ok(call(engine_ops::pause.id, caf::message{}));
  ok(submit(me, {1}, {request({1, 2}, 10, 1.0, 1)}, 30)); // 30 ms, and the engine is paused
  auto r = next_result(self);
  EXPECT_EQ(r.id, 1);
  EXPECT_EQ(r.error_code, static_cast<int32_t>(errc::timeout)) << r.error;
  EXPECT_NE(r.error.find("did not finish within 30 ms"), std::string::npos) << r.error;
  ok(submit(me, {2, 3}, {request({1, 2}, 10, 1.0, 1), request({1, 3}, 10, 1.0, 1)}));
  EXPECT_EQ(ok(call(engine_ops::cancel.id, caf::make_message(me, std::vector<int64_t>{3, 99})))
                .get_as<int64_t>(0),
            1);
  auto c = next_result(self);
  EXPECT_EQ(c.id, 3);
  EXPECT_EQ(c.samples.at(0).stop_reason, "abort");
  EXPECT_EQ(value<int64_t>(engine_ops::resume.id),
            1); // the submission of 2 and 3 (3 already cancelled)
  auto done = next_result(self);
  EXPECT_EQ(done.id, 2);
  EXPECT_EQ(done.samples.at(0).tokens.size(), 10u);
}

TEST_F(ContinuousEngines, BadSubmissionsAreRefusedAndTheEngineStaysAlive) {
  caf::scoped_actor self{*sys_};
  auto me = caf::actor_cast<caf::actor>(self);
  auto good = request({1, 2}, 3, 1.0, 1);
  expect_error(submit(caf::actor{}, {1}, {good}), errc::invalid_argument, "consumer");
  expect_error(submit(me, {1, 2}, {good}), errc::invalid_argument, "2 ids for 1 requests");
  expect_error(submit(me, {1}, {good}, 0), errc::invalid_argument, "timeout_ms must be > 0");
  expect_error(submit(me, {1, 1}, {good, good}), errc::invalid_argument, "appears twice");
  auto bad = good;
  bad.prompt = {1, 600};
  expect_error(submit(me, {1, 2}, {good, bad}), errc::out_of_range,
               "submit: request 1: prompt token 1 has id 600");
  auto huge = request(std::vector<int64_t>(100, 1), 400, 1.0, 1, 2000); // > 256 MiB of KV
  expect_error(submit(me, {5}, {huge}), errc::invalid_argument, "raise kv_cache_bytes");
  expect_error(call(engine_ops::submit.id, caf::make_message(std::string{"x"})),
               errc::invalid_argument, "submit expects");
  expect_error(call(engine_ops::cancel.id, caf::make_message(int64_t{1})), errc::invalid_argument,
               "cancel expects");
  expect_error(call(engine_ops::pause.id, caf::make_message(std::string{"drain"})),
               errc::invalid_argument, "unknown mode 'drain'");
  engine_options tiny_budget;
  tiny_budget.kv_cache_bytes = 100;
  expect_error(call(engine_ops::configure.id, caf::make_message(tiny_budget)),
               errc::invalid_argument, "below one block");
  engine_options bad_steps;
  bad_steps.max_step_tokens = 8;
  expect_error(call(engine_ops::configure.id, caf::make_message(bad_steps)), errc::invalid_argument,
               "max_step_tokens");
  // Nothing was accepted; a request in flight blocks configure; the engine still serves.
  EXPECT_EQ(stats().at("waiting").get<int64_t>() + stats().at("running").get<int64_t>(), 0);
  ok(submit(me, {1}, {request({1, 2}, 300, 1.0, 1)}));
  expect_error(submit(me, {1}, {good}), errc::invalid_argument, "already in flight");
  expect_error(call(engine_ops::configure.id, caf::make_message(engine_options{})),
               errc::invalid_argument, "in flight");
  auto r = next_result(self);
  EXPECT_EQ(r.id, 1);
  EXPECT_EQ(r.samples.at(0).tokens.size(), 300u);
  ok(call(engine_ops::configure.id, caf::make_message(engine_options{})));
}

TEST_F(ContinuousEngines, AKilledEngineLosesOnlyItsOwnRequestsAndTheConsumerIsToldWhich) {
  auto two = two_engines("pair");
  caf::scoped_actor self{*sys_};
  auto me = caf::actor_cast<caf::actor>(self);
  std::vector<sample_request> rs;
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    // Short ones on even ids, long ones on odd ids; spreading alternates ranks.
    rs.push_back(request({int64_t{10} + i, 11}, i % 2 ? 450 : 3, 1.0, 60u + i));
    ids.push_back(100 + i);
  }
  auto placed = ok(client_->call("pair", engine_ops::submit.id, caf::make_message(me, ids, rs)));
  auto ranks = placed.get_as<std::vector<int32_t>>(0);
  ASSERT_EQ(ranks.size(), 6u);
  std::set<int64_t> on_victim;
  for (size_t i = 0; i < 6; ++i)
    if (ranks[i] == 1)
      on_victim.insert(ids[i]);
  ASSERT_FALSE(on_victim.empty());
  // Kill rank 1 once its first result is out (its short request), while its long ones run.
  std::map<int64_t, generation_result> results;
  bool killed = false;
  while (results.size() < 6) {
    auto r = next_result(self);
    if (r.id < 0)
      break;
    EXPECT_EQ(results.count(r.id), 0u) << "id " << r.id << " delivered twice";
    results[r.id] = r;
    if (!killed && r.engine_rank == 1 && r.error.empty()) {
      caf::anon_send_exit(ok(two.rank_handles()).at(1), caf::exit_reason::kill);
      killed = true;
    }
  }
  ASSERT_TRUE(killed);
  ASSERT_EQ(results.size(), 6u);
  std::set<int64_t> lost;
  for (auto& [id, r] : results) {
    if (r.error_code == static_cast<int32_t>(errc::rank_failed)) {
      lost.insert(id);
      EXPECT_NE(r.error.find("engine rank 1 of role 'pair' died"), std::string::npos) << r.error;
      EXPECT_TRUE(r.samples.empty());
    } else {
      EXPECT_TRUE(r.error.empty()) << r.error;
      const auto i = static_cast<size_t>(id - 100);
      expect_row(r.samples.at(0), alone(*model_, rs[i], 0), "id " + std::to_string(id));
    }
  }
  // Exactly the long requests of the dead rank are lost; rank 0's all came back.
  std::set<int64_t> expected;
  for (auto id : on_victim)
    if ((id - 100) % 2 == 1)
      expected.insert(id);
  EXPECT_EQ(lost, expected);
  EXPECT_FALSE(lost.empty());

  // Requeued, the lost requests all go to the live rank and come back as if run alone.
  std::vector<int64_t> again_ids(lost.begin(), lost.end());
  std::vector<sample_request> again;
  for (auto id : again_ids)
    again.push_back(rs[static_cast<size_t>(id - 100)]);
  auto replaced =
      ok(client_->call("pair", engine_ops::submit.id, caf::make_message(me, again_ids, again)));
  for (auto rank : replaced.get_as<std::vector<int32_t>>(0))
    EXPECT_EQ(rank, 0);
  for (size_t n = 0; n < again_ids.size(); ++n) {
    auto r = next_result(self);
    ASSERT_GE(r.id, 100);
    EXPECT_TRUE(r.error.empty()) << r.error;
    EXPECT_EQ(r.engine_rank, 0);
    expect_row(r.samples.at(0), alone(*model_, rs[static_cast<size_t>(r.id - 100)], 0),
               "requeued id " + std::to_string(r.id));
  }
  // Engine-wide ops skip the dead rank; once no rank is left, calls fail naming each cause.
  ok(client_->call("pair", engine_ops::generate.id,
                   caf::make_message(std::vector<sample_request>{rs[0]})));
  caf::anon_send_exit(ok(two.rank_handles()).at(0), caf::exit_reason::kill);
  auto gone = client_->call("pair", engine_ops::submit.id, caf::make_message(me, ids, rs));
  for (int tries = 0; gone && tries < 50; ++tries) { // the down message may still be on its way
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gone = client_->call("pair", engine_ops::submit.id,
                         caf::make_message(me, std::vector<int64_t>{900 + tries},
                                           std::vector<sample_request>{rs[0]}));
  }
  expect_error(gone, errc::rank_failed, "no engine rank is left alive (rank 0: died");
  expect_error(client_->call("pair", engine_ops::generate.id,
                             caf::make_message(std::vector<sample_request>{rs[0]})),
               errc::rank_failed, "rank 1: died");
}

TEST_F(ContinuousEngines, AGenerateCallWhoseEngineDiesGoesAgainToTheOthers) {
  auto two = two_engines("duo");
  std::vector<sample_request> rs;
  for (int i = 0; i < 4; ++i)
    rs.push_back(request({int64_t{20} + i, 11}, 300, 1.0, 80u + i));
  caf::scoped_actor self{*sys_};
  // The call is on its way (or running) when rank 1 dies; it still answers every request.
  auto pending = self->request(client_->dispatcher(), std::chrono::seconds(60),
                               dispatcher_call_atom::value, std::string{"duo"},
                               engine_ops::generate.id, caf::make_message(rs), int64_t{50000});
  caf::anon_send_exit(ok(two.rank_handles()).at(1), caf::exit_reason::kill);
  std::vector<sample_output> out;
  std::string failure;
  pending.receive([&](op_result& r) { out = r.value.get_as<std::vector<sample_output>>(0); },
                  [&](caf::error& e) { failure = sys_->render(e); });
  ASSERT_TRUE(failure.empty()) << failure;
  ASSERT_EQ(out.size(), rs.size());
  for (size_t i = 0; i < rs.size(); ++i)
    expect_row(out[i], alone(*model_, rs[i], 0), "request " + std::to_string(i));
}

} // namespace
} // namespace rlforge::actors::test
