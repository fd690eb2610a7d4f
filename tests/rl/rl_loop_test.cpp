// The RL loop over a real policy and real engines (tiny models, fp32): sync mode gives exactly
// the losses of the hand-written generate → train → sync loop; staleness stays within its bound
// under a slow trainer and under slow engines; pause(keep) tags the tokens of a rollout that
// spans a weight update with both versions, pause(abort) requeues it; a resume from a snapshot
// loses no rollout; a killed engine's rollouts are requeued to the other and the loop fails
// clearly once no engine is left; bad options and snapshots are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/engine.hpp"
#include "backends/train/training_batch.hpp"
#include "rl/rl_loop.hpp"
#include "rl/rollout_buffer.hpp"
#include "rl/rollout_json.hpp"
#include "rl/rollout_producer.hpp"
#include "runtime/errc.hpp"

#include "../actors/test_support.hpp"

namespace rlforge::rl {
namespace {

namespace be = rlforge::backends;
using actors::test::actor_fixture;

model_spec tiny(uint64_t seed) {
  return actors::test::fp32_model("tiny", seed);
}

class RlLoop : public actor_fixture {
public:
  using actor_fixture::ok;

  void register_kinds() override {
    actors::register_worker_kinds();
    actors::register_engine_kind();
  }

  /// A policy (1 rank) and `engines` engine ranks, the engines holding the policy's weights.
  void setup(int engines, int64_t max_num_seqs = 256) {
    policy_ = ok(spawn_group("policy", "policy", 1));
    ok(client_->register_group("policy", policy_));
    engines_ = ok(spawn_engines("engines", engines));
    ok(client_->register_engines(engines_));
    ok(client_->init_model("engines", tiny(22)));
    engine_options eo;
    eo.max_num_seqs = max_num_seqs;
    eo.kv_cache_bytes = int64_t{64} << 20;
    ok(client_->call("engines", actors::engine_ops::configure.id, caf::make_message(eo)));
    reset_models();
  }

  /// Both roles back to their initial weights (a fresh optimizer), the engines synced; the
  /// engines' version.
  int64_t reset_models() {
    ok(client_->init_model("policy", tiny(11)));
    ok(client_->init_model("engines", tiny(22)));
    return ok(client_->save_weights_for_sampler());
  }

  /// Request `id` of the tests' task: a short prompt drawn from `rng`, `samples` seeded samples.
  static sample_request draw(std::mt19937_64& rng, int64_t max_tokens, int64_t samples = 2) {
    sample_request r;
    r.prompt = {1 + static_cast<int64_t>(rng() % 20), 3, 5 + static_cast<int64_t>(rng() % 7)};
    r.max_tokens = max_tokens;
    r.temperature = 1.0;
    r.has_seed = true;
    r.seed = rng();
    r.num_samples = samples;
    return r;
  }

  /// One supervised step on the rows (cross-entropy on the responses); its loss.
  double train_on(const std::vector<std::vector<int64_t>>& prompts,
                  const std::vector<std::vector<int64_t>>& responses) {
    auto batch = be::from_sequences(prompts, responses);
    auto out = ok(client_->forward_backward("policy", batch, "cross_entropy"));
    be::adam_params p;
    p.learning_rate = 1e-2;
    ok(client_->optim_step("policy", p));
    return out.metric("loss:sum");
  }

  /// `role`'s log-prob of each response token after `prompt` (a forward without gradients).
  std::vector<double> logprobs_of(const std::string& role, const std::vector<int64_t>& prompt,
                                  const std::vector<int64_t>& response) {
    auto out = ok(client_->forward(role, be::from_sequences({prompt}, {response})));
    auto lp = out.outputs.at("logprobs").to(at::kDouble)[0];
    const auto n = static_cast<int64_t>(response.size());
    lp = lp.narrow(0, lp.size(0) - n, n).contiguous();
    return {lp.data_ptr<double>(), lp.data_ptr<double>() + n};
  }

  /// Engine op `op` on the engine ranks; rank 0's reply.
  caf::message call_engines(caf::atom_value op, caf::message args) {
    return ok(client_->call("engines", op, std::move(args)));
  }

  double train_on(const loop_batch& b) {
    std::vector<std::vector<int64_t>> prompts, responses;
    for (auto& r : b.rollouts)
      for (auto& s : r.samples) {
        prompts.push_back(r.request.prompt);
        responses.push_back(s.tokens);
      }
    return train_on(prompts, responses);
  }

  loop_options options(rl_mode mode, int64_t batch, int64_t max_staleness = 1) {
    loop_options o;
    o.mode = mode;
    o.batch_rollouts = batch;
    o.max_staleness = max_staleness;
    o.take_timeout = std::chrono::seconds(60);
    return o;
  }

  actors::actor_group policy_, engines_;
};

TEST_F(RlLoop, SyncModeGivesTheLossesOfTheHandWrittenLoop) {
  setup(2);
  constexpr int steps = 4, batch = 3;
  // Today's loop: generate a batch, train on it, sync.
  std::vector<double> expected;
  {
    std::mt19937_64 rng(5);
    for (int s = 0; s < steps; ++s) {
      std::vector<sample_request> rs;
      for (int i = 0; i < batch; ++i)
        rs.push_back(draw(rng, 12));
      auto out = ok(client_->generate(rs));
      std::vector<std::vector<int64_t>> prompts, responses;
      for (size_t row = 0; row < out.size(); ++row) {
        prompts.push_back(rs[row / 2].prompt);
        responses.push_back(out[row].tokens);
      }
      expected.push_back(train_on(prompts, responses));
      ok(client_->save_weights_for_sampler());
    }
  }
  const auto version = reset_models();
  std::mt19937_64 rng(5);
  rl_loop loop(*sys_, *client_, options(rl_mode::sync, batch),
               [&](int64_t) { return draw(rng, 12); });
  loop.set_version(version);
  for (int s = 0; s < steps; ++s) {
    auto b = ok(loop.next_batch());
    ASSERT_EQ(b.rollouts.size(), static_cast<size_t>(batch));
    for (auto st : b.staleness)
      EXPECT_EQ(st, 0);
    EXPECT_EQ(train_on(b), expected[static_cast<size_t>(s)]) << "step " << s;
    ok(loop.update_weights());
  }
}

/// Runs `steps` steps of `loop`, sleeping `trainer_delay` per step; checks every batch's
/// staleness against the bound and returns the total dropped.
int64_t run_and_check_staleness(rl_loop& loop, int steps,
                                std::chrono::milliseconds trainer_delay, int64_t bound) {
  int64_t dropped = 0, taken = 0;
  for (int s = 0; s < steps; ++s) {
    auto b = loop.next_batch();
    if (!b) {
      ADD_FAILURE() << "step " << s << ": " << error_message(b.error());
      return dropped;
    }
    for (size_t i = 0; i < b->rollouts.size(); ++i) {
      EXPECT_LE(b->staleness[i], bound) << "step " << s;
      EXPECT_EQ(b->staleness[i], staleness_of(b->rollouts[i], loop.version()));
    }
    dropped += b->dropped;
    taken += static_cast<int64_t>(b->rollouts.size());
    std::this_thread::sleep_for(trainer_delay);
    if (!loop.update_weights())
      ADD_FAILURE() << "update_weights failed at step " << s;
  }
  auto acc = loop.accounting();
  EXPECT_TRUE(acc);
  if (acc) {
    int64_t histogram = 0;
    for (size_t s = 0; s < acc->staleness_counts.size(); ++s) {
      histogram += acc->staleness_counts[s];
      if (acc->staleness_counts[s] > 0) {
        EXPECT_LE(static_cast<int64_t>(s), bound);
      }
    }
    EXPECT_EQ(histogram, taken);
    EXPECT_EQ(acc->dropped, dropped);
  }
  return dropped;
}

TEST_F(RlLoop, StalenessStaysWithinItsBoundUnderASlowTrainerAndUnderSlowEngines) {
  setup(1);
  std::mt19937_64 rng(9);
  {
    // A slow trainer: the engines run a batch ahead and finish it long before the trainer
    // takes it, but nothing older than one version is trained on.
    auto o = options(rl_mode::fully_async, 2, 1);
    rl_loop loop(*sys_, *client_, o, [&](int64_t) { return draw(rng, 6); });
    loop.set_version(1);
    run_and_check_staleness(loop, 6, std::chrono::milliseconds(150), 1);
  }
  {
    // Slow engines (one sequence at a time, long rows) and a bound of 0 in fully_async mode:
    // every rollout that saw an update is dropped and replaced, never trained on.
    ok(client_->call("engines", actors::engine_ops::configure.id, caf::make_message([] {
                       engine_options eo;
                       eo.max_num_seqs = 1;
                       eo.kv_cache_bytes = int64_t{64} << 20;
                       return eo;
                     }())));
    auto o = options(rl_mode::fully_async, 1, 0);
    rl_loop loop(*sys_, *client_, o, [&](int64_t) { return draw(rng, 300, 1); });
    loop.set_version(ok(client_->save_weights_for_sampler()));
    auto dropped = run_and_check_staleness(loop, 4, std::chrono::milliseconds(0), 0);
    EXPECT_GT(dropped, 0) << "the queued batch saw every update; it should have been dropped";
  }
}

TEST_F(RlLoop, StreamingTakesRolloutsInCompletionOrderSoALongOneHoldsNoStepBack) {
  setup(1);
  std::mt19937_64 rng(12);
  // Every fifth rollout is long (a long tail inside the stream); the rest are short.
  auto long_one = [](int64_t id) { return id % 5 == 0; };
  auto o = options(rl_mode::fully_async, 2, 2);
  rl_loop loop(*sys_, *client_, o,
               [&](int64_t id) { return draw(rng, long_one(id) ? 400 : 6, 1); });
  loop.set_version(1);
  std::set<int64_t> trained;
  int64_t dropped = 0;
  const int steps = 8;
  for (int s = 0; s < steps; ++s) {
    auto b = ok(loop.next_batch());
    ASSERT_EQ(b.rollouts.size(), 2u);
    if (s == 0) {
      for (auto& r : b.rollouts) {
        // Rollout 0 was asked for first but needs 400 tokens; the step starts on two short
        // ones that finished while it generates.
        EXPECT_FALSE(long_one(r.id)) << "the first step waited for long rollout " << r.id;
      }
    }
    for (size_t i = 0; i < b.rollouts.size(); ++i) {
      EXPECT_LE(b.staleness[i], 2) << "step " << s;
      EXPECT_TRUE(trained.insert(b.rollouts[i].id).second)
          << "rollout " << b.rollouts[i].id << " trained twice";
    }
    dropped += b.dropped;
    train_on(b);
    ok(loop.update_weights());
  }
  // Nothing is lost: every rollout asked for was trained, dropped as too stale (counted), or is
  // still held by the loop.
  auto snap = ok(loop.snapshot());
  const auto next_id = snap.at("next_id").get<int64_t>();
  std::set<int64_t> held;
  for (const char* part : {"waiting", "done"})
    for (auto& r : snap.at("rollouts").at(part))
      EXPECT_TRUE(held.insert(r.at("id").get<int64_t>()).second);
  for (auto id : held)
    EXPECT_EQ(trained.count(id), 0u) << "rollout " << id << " trained and still held";
  auto acc = ok(loop.accounting());
  EXPECT_EQ(acc.dropped, dropped);
  EXPECT_EQ(acc.taken, static_cast<int64_t>(trained.size()));
  EXPECT_EQ(static_cast<int64_t>(trained.size() + held.size()) + dropped, next_id);
}

/// One sequence at a time: the second rollout starts when the first is done. The engine is
/// paused (keep) once the second has some tokens and is still running, so the weight update
/// after the first lands in the middle of the second one's row however slow the trainer is.
/// Returns that rollout's batch.
loop_batch update_mid_rollout(RlLoop* t, rl_loop& loop) {
  loop.set_version(1);
  auto first = t->ok(loop.next_batch());
  int64_t before = -1;
  for (int tries = 0;; ++tries) {
    t->call_engines(actors::engine_ops::pause.id, caf::make_message(std::string{"keep"}));
    auto s = nlohmann::json::parse(
        t->call_engines(actors::engine_ops::stats.id, caf::make_message()).get_as<std::string>(0));
    if (before < 0)
      before = s.at("generated_tokens").get<int64_t>();
    else if (s.at("running").get<int64_t>() == 1 && s.at("generated_tokens") > before)
      break;
    if (tries == 10000) {
      ADD_FAILURE() << "the second rollout never ran: " << s.dump();
      break;
    }
    t->call_engines(actors::engine_ops::resume.id, caf::make_message());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  t->train_on(first);
  EXPECT_EQ(t->ok(loop.update_weights()), 2); // resumes the engine
  auto second = t->ok(loop.next_batch());
  EXPECT_EQ(second.rollouts.size(), 1u);
  const auto& row = second.rollouts.at(0).samples.at(0);
  EXPECT_EQ(row.token_versions.size(), row.tokens.size());
  EXPECT_TRUE(std::is_sorted(row.token_versions.begin(), row.token_versions.end()));
  return second;
}

TEST_F(RlLoop, PauseKeepTagsTheTokensOfARolloutSpanningAnUpdateWithBothVersions) {
  setup(1, 1);
  std::mt19937_64 rng(3);
  auto o = options(rl_mode::one_step_off, 1, 2);
  o.pause_mode = "keep";
  rl_loop loop(*sys_, *client_, o, [&](int64_t) { return draw(rng, 300, 1); });
  // A frozen copy of version 1 (the policy's initial weights, which the engines got as
  // version 1), to score the row with after the policy has moved on to version 2.
  auto frozen = ok(spawn_group("frozen", "policy", 1));
  ok(client_->register_group("frozen", frozen));
  ok(client_->init_model("frozen", tiny(11)));
  auto second = update_mid_rollout(this, loop);
  const auto& row = second.rollouts.at(0).samples.at(0);
  const auto& versions = row.token_versions;
  ASSERT_FALSE(versions.empty());
  EXPECT_EQ(versions.front(), 1);
  EXPECT_EQ(versions.back(), 2);
  EXPECT_EQ(second.staleness.at(0), 1);
  EXPECT_EQ(second.requeued, 0);
  EXPECT_EQ(second.rollouts[0].submissions, 1);
  // Each token carries the behaviour log-prob of the weights that sampled it. The version-1
  // tokens are exactly version 1's scores. The version-2 tokens were sampled by the new
  // weights over the keys and values version 1 computed for the prefix (the cache is kept, as
  // in PipelineRL's in-flight updates), so neither version alone reproduces them; they are
  // not version 1's scores.
  const auto prompt = second.rollouts[0].request.prompt;
  const auto v1 = logprobs_of("frozen", prompt, row.tokens);
  ASSERT_EQ(v1.size(), row.logprobs.size());
  double v2_tokens_gap = 0;
  int64_t v1_tokens = 0;
  for (size_t t = 0; t < row.tokens.size(); ++t) {
    if (versions[t] == 1) {
      ++v1_tokens;
      EXPECT_NEAR(row.logprobs[t], v1[t], 1e-4) << "version-1 token " << t;
    } else {
      v2_tokens_gap = std::max(v2_tokens_gap, std::abs(row.logprobs[t] - v1[t]));
    }
  }
  EXPECT_GT(v1_tokens, 0);
  EXPECT_GT(v2_tokens_gap, 1e-2) << "the version-2 tokens carry version 1's log-probs";
}

TEST_F(RlLoop, PauseAbortRequeuesTheRolloutSpanningAnUpdate) {
  setup(1, 1);
  std::mt19937_64 rng(3);
  auto o = options(rl_mode::one_step_off, 1, 2);
  o.pause_mode = "abort";
  rl_loop loop(*sys_, *client_, o, [&](int64_t) { return draw(rng, 300, 1); });
  auto second = update_mid_rollout(this, loop);
  // Handed back at the update and generated again from scratch, on version 2 only.
  const auto& versions = second.rollouts.at(0).samples.at(0).token_versions;
  ASSERT_EQ(versions.size(), 300u);
  EXPECT_EQ(versions.front(), 2);
  EXPECT_EQ(versions.back(), 2);
  EXPECT_EQ(second.staleness.at(0), 0);
  EXPECT_GE(second.requeued, 1);
  EXPECT_EQ(second.rollouts[0].submissions, 2);
  // Generated again from scratch on version 2 alone: its log-probs are the policy's (version 2).
  const auto& row = second.rollouts[0].samples[0];
  const auto v2 = logprobs_of("policy", second.rollouts[0].request.prompt, row.tokens);
  ASSERT_EQ(v2.size(), row.logprobs.size());
  for (size_t t = 0; t < v2.size(); ++t)
    EXPECT_NEAR(row.logprobs[t], v2[t], 1e-4) << "token " << t;
}

TEST_F(RlLoop, AResumeFromASnapshotLosesNoRollout) {
  setup(1);
  std::mt19937_64 rng(4);
  std::set<int64_t> trained, dropped_or_trained;
  auto o = options(rl_mode::fully_async, 2, 1);
  nlohmann::json snap;
  std::vector<int64_t> before;
  {
    rl_loop loop(*sys_, *client_, o, [&](int64_t) { return draw(rng, 8); });
    loop.set_version(1);
    for (int s = 0; s < 3; ++s) {
      auto b = ok(loop.next_batch());
      for (auto& r : b.rollouts)
        EXPECT_TRUE(trained.insert(r.id).second) << "rollout " << r.id << " trained twice";
      train_on(b);
      ok(loop.update_weights());
    }
    snap = ok(loop.snapshot({{"rng", "state"}}));
    // The run goes on after the snapshot; a resume replays from the snapshot instead.
    ok(loop.next_batch());
  }
  const auto next_id = snap.at("next_id").get<int64_t>();
  const auto version = snap.at("version").get<int64_t>();
  auto held = snap.at("rollouts").at("waiting").size() + snap.at("rollouts").at("done").size();
  EXPECT_EQ(static_cast<int64_t>(held + trained.size()) +
                snap.at("rollouts").at("dropped").get<int64_t>(),
            next_id);
  // A fresh producer (the same engines, as a restarted job would have).
  rl_loop resumed(*sys_, *client_, o, [&](int64_t) { return draw(rng, 8); });
  auto extra = ok(resumed.restore(snap));
  EXPECT_EQ(extra, (nlohmann::json{{"rng", "state"}}));
  EXPECT_EQ(resumed.version(), version);
  auto v = ok(resumed.update_weights());
  EXPECT_GE(v, version); // the numbering continues
  auto acc = ok(resumed.accounting());
  EXPECT_EQ(acc.taken, static_cast<int64_t>(trained.size()));
  std::set<int64_t> seen = trained;
  for (int s = 0; s < 6; ++s) {
    auto b = ok(resumed.next_batch());
    for (auto& r : b.rollouts)
      EXPECT_TRUE(seen.insert(r.id).second) << "rollout " << r.id << " trained twice";
    train_on(b);
    ok(resumed.update_weights());
  }
  auto after = ok(resumed.accounting());
  // Every rollout the snapshot held is accounted for: trained after the resume or dropped.
  int64_t lost = 0;
  for (int64_t id = 0; id < next_id; ++id)
    if (!seen.count(id))
      ++lost;
  EXPECT_EQ(lost, after.dropped) << "rollouts of the snapshot neither trained nor dropped";
}

TEST_F(RlLoop, AKilledEngineIsRequeuedToTheOtherAndNoEngineLeftIsAClearError) {
  setup(2, 2);
  std::mt19937_64 rng(8);
  auto o = options(rl_mode::fully_async, 2, 3);
  o.take_timeout = std::chrono::seconds(30);
  rl_loop loop(*sys_, *client_, o, [&](int64_t) { return draw(rng, 200, 1); });
  loop.set_version(1);
  ok(loop.next_batch());
  // Rollouts are now running on both engines; kill rank 1.
  caf::anon_send_exit(ok(engines_.rank_handles()).at(1), caf::exit_reason::kill);
  int64_t requeued = 0;
  for (int s = 0; s < 3; ++s) {
    auto b = ok(loop.next_batch());
    EXPECT_EQ(b.rollouts.size(), 2u);
    requeued += b.requeued;
    train_on(b);
    ok(loop.update_weights()); // the sync skips the dead rank
  }
  EXPECT_GE(requeued, 1);
  caf::anon_send_exit(ok(engines_.rank_handles()).at(0), caf::exit_reason::kill);
  // Let the dispatcher see the death before asking (a call racing it reports the dead rank
  // itself rather than "no engine left").
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto t0 = std::chrono::steady_clock::now();
  caf::expected<loop_batch> b{caf::error{}};
  for (int s = 0; s < 4; ++s) {
    b = loop.next_batch();
    if (!b)
      break;
  }
  ASSERT_FALSE(b);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(25));
  EXPECT_TRUE(is(b.error(), errc::rank_failed)) << error_message(b.error());
  EXPECT_NE(error_message(b.error()).find("no engine rank is left alive"), std::string::npos)
      << error_message(b.error());
  auto sync = loop.update_weights();
  ASSERT_FALSE(sync);
  EXPECT_NE(error_message(sync.error()).find("no engine rank is left alive"), std::string::npos);
}

TEST_F(RlLoop, TwoLoopsOnTheSameEnginesGetWhatEachGetsAlone) {
  setup(2);
  // Each loop's rollouts (seeded) as tokens, by rollout id.
  auto run = [&](rl_loop& loop, int steps) {
    std::map<int64_t, std::vector<std::vector<int64_t>>> out;
    for (int s = 0; s < steps; ++s) {
      auto b = loop.next_batch();
      if (!b) {
        ADD_FAILURE() << error_message(b.error());
        break;
      }
      for (auto& r : b->rollouts)
        for (auto& row : r.samples)
          out[r.id].push_back(row.tokens);
    }
    return out;
  };
  auto source = [](uint64_t seed) {
    auto rng = std::make_shared<std::mt19937_64>(seed);
    return [rng](int64_t) { return draw(*rng, 20); };
  };
  // Alone, in sync mode, 5 batches are rollouts 0..14 in order. Fully async with 3 batches of 3
  // and staleness 2 asks for at most 9 + 2 * 3 = 15 rollouts (ids 0..14) and takes whichever
  // finish first, so the reference covers every rollout the concurrent loops can take.
  std::map<int64_t, std::vector<std::vector<int64_t>>> alone_a, alone_b;
  {
    rl_loop a(*sys_, *client_, options(rl_mode::sync, 3), source(1));
    alone_a = run(a, 5);
  }
  {
    rl_loop b(*sys_, *client_, options(rl_mode::sync, 3), source(2));
    alone_b = run(b, 5);
  }
  ASSERT_EQ(alone_a.size(), 15u);
  ASSERT_EQ(alone_b.size(), 15u);
  rl_loop a(*sys_, *client_, options(rl_mode::fully_async, 3, 2), source(1));
  rl_loop b(*sys_, *client_, options(rl_mode::fully_async, 3, 2), source(2));
  std::map<int64_t, std::vector<std::vector<int64_t>>> together_a, together_b;
  std::thread ta([&] { together_a = run(a, 3); });
  std::thread tb([&] { together_b = run(b, 3); });
  ta.join();
  tb.join();
  // No weight updates here: the same rollouts, the same tokens, whoever else is generating.
  auto same_as_alone = [](const auto& together, const auto& alone) {
    EXPECT_EQ(together.size(), 9u);
    for (auto& [id, rows] : together) {
      auto it = alone.find(id);
      if (it == alone.end())
        ADD_FAILURE() << "rollout " << id << " is not among the first 15";
      else
        EXPECT_EQ(rows, it->second) << "rollout " << id;
    }
  };
  same_as_alone(together_a, alone_a);
  same_as_alone(together_b, alone_b);
  EXPECT_NE(together_a, together_b);
}

TEST_F(RlLoop, BadOptionsRequestsAndSnapshotsAreRefused) {
  setup(1);
  auto source = [](int64_t) {
    sample_request r;
    r.prompt = {1, 2};
    r.max_tokens = 4;
    return r;
  };
  auto refused = [&](loop_options o, const std::string& part) {
    try {
      rl_loop loop(*sys_, *client_, o, source);
      ADD_FAILURE() << "accepted options with " << part;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string{e.what()}.find(part), std::string::npos) << e.what();
    }
  };
  auto o = options(rl_mode::sync, 1);
  o.batch_rollouts = 0;
  refused(o, "batch_rollouts must be >= 1, got 0");
  o = options(rl_mode::sync, 1, -1);
  refused(o, "max_staleness must be >= 0, got -1");
  o = options(rl_mode::sync, 1);
  o.pause_mode = "drain";
  refused(o, "pause_mode must be keep or abort, got 'drain'");
  rl_mode m;
  EXPECT_FALSE(parse_rl_mode("async", m));
  ASSERT_TRUE(parse_rl_mode("one_step_off", m));
  EXPECT_EQ(m, rl_mode::one_step_off);

  // A request the engines refuse fails the batch, naming it; the loop stays usable.
  bool bad = true;
  rl_loop loop(*sys_, *client_, options(rl_mode::sync, 1), [&](int64_t) {
    auto r = source(0);
    if (bad)
      r.prompt = {1, 100000};
    return r;
  });
  auto b = loop.next_batch();
  ASSERT_FALSE(b);
  EXPECT_NE(error_message(b.error()).find("100000"), std::string::npos) << error_message(b.error());
  bad = false;
  auto good = ok(loop.next_batch());
  EXPECT_EQ(good.rollouts.size(), 1u);

  // Snapshots: malformed, ids outside the range, or into a loop that holds rollouts already.
  auto snap = ok(loop.snapshot());
  rl_loop fresh(*sys_, *client_, options(rl_mode::sync, 1), source);
  auto broken = snap;
  broken.erase("next_id");
  EXPECT_FALSE(fresh.restore(broken));
  broken = snap;
  broken["rollouts"]["done"] = nlohmann::json::array({nlohmann::json{{"id", 1}}});
  auto r = fresh.restore(broken);
  ASSERT_FALSE(r);
  EXPECT_NE(error_message(r.error()).find("state.done[0].submissions is missing"),
            std::string::npos)
      << error_message(r.error());
  broken = snap;
  broken["next_id"] = 0;
  broken["rollouts"]["waiting"] =
      nlohmann::json::array({to_json(rollout_state{{rollout{}}, {}, 0, 0, 0, {}})["waiting"][0]});
  r = fresh.restore(broken);
  ASSERT_FALSE(r);
  EXPECT_NE(error_message(r.error()).find("outside [0, next_id = 0)"), std::string::npos)
      << error_message(r.error());
  rl_loop busy(*sys_, *client_, options(rl_mode::one_step_off, 1), source);
  ok(busy.next_batch()); // one more rollout is held for the next batch
  r = busy.restore(snap);
  ASSERT_FALSE(r);
  EXPECT_NE(error_message(r.error()).find("holds nothing yet"), std::string::npos)
      << error_message(r.error());
}

} // namespace
} // namespace rlforge::rl
