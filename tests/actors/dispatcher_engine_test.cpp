// The dispatcher with inference engines: least-loaded spreading and request order, weight sync
// over every transport (engine log-probs equal the trainer's forward), LoRA merged before sync,
// colocation (one model resident per device, values intact after offload/onload), syncs while
// generate calls are in flight, refused transfers, and bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/dispatcher.hpp"
#include "actors/engine.hpp"
#include "actors/protocol.hpp"
#include "actors/weight_sync.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"
#include "test_support.hpp"

namespace rlforge::actors::test {
namespace {

namespace be = rlforge::backends;

model_spec spec_of(const std::string& preset, uint64_t seed, int64_t lora_rank = 0) {
  model_spec s;
  s.compute_dtype = "fp32"; // these tests compare fp32 numerics to 1e-5 or tighter
  s.preset = preset;
  s.seed = seed;
  s.lora_rank = lora_rank;
  return s;
}

sample_request request(std::vector<int64_t> prompt, int64_t max_tokens, uint64_t seed,
                       int64_t num_samples = 1) {
  sample_request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.temperature = 1.0;
  r.has_seed = true;
  r.seed = seed;
  r.num_samples = num_samples;
  return r;
}

std::vector<sample_request> some_requests() {
  std::vector<sample_request> rs;
  for (int i = 0; i < 6; ++i)
    rs.push_back(request({1 + i, 7, 3 + 2 * i}, 4 + i % 3, 100 + static_cast<uint64_t>(i),
                         1 + i % 2));
  return rs;
}

void expect_error(const caf::expected<caf::message>& x, errc code, const std::string& part) {
  ASSERT_FALSE(x) << "expected an error containing '" << part << "'";
  EXPECT_TRUE(is(x.error(), code)) << error_message(x.error());
  EXPECT_NE(error_message(x.error()).find(part), std::string::npos) << error_message(x.error());
}

class EngineDispatch : public actor_fixture {
protected:
  void register_kinds() override {
    register_worker_kinds();
    register_engine_kind();
  }

  /// Spawns and registers a policy group and an engine group of `engines` ranks.
  void setup(const std::string& policy_preset, const std::string& engine_preset, int engines,
             int64_t lora_rank = 0, bool one_device = false) {
    policy_ = ok(spawn_group("policy", "policy", 1));
    ok(client_->register_group("policy", policy_));
    ok(client_->init_model("policy", spec_of(policy_preset, 11, lora_rank)));
    engines_ = ok(spawn_engines("engines", engines, one_device));
    ok(client_->register_engines(engines_));
    ok(client_->init_model("engines", spec_of(engine_preset, 22)));
  }

  /// One training step so the policy's weights differ from its initial ones.
  void train_step() {
    auto batch = be::from_sequences({{1, 2, 3}, {4, 5}}, {{6, 7}, {8, 9, 10}});
    ok(client_->forward_backward("policy", batch, "cross_entropy"));
    be::adam_params p;
    p.learning_rate = 1e-2;
    ok(client_->optim_step("policy", p));
  }

  /// The policy's forward log-probs of each output row's tokens after its prompt.
  std::vector<std::vector<double>> trainer_logprobs(const std::vector<sample_request>& requests,
                                                    const std::vector<sample_output>& outputs) {
    std::vector<std::vector<int64_t>> prompts, responses;
    size_t row = 0;
    for (auto& r : requests)
      for (int64_t s = 0; s < r.num_samples; ++s) {
        prompts.push_back(r.prompt);
        responses.push_back(outputs[row++].tokens);
      }
    auto batch = be::from_sequences(prompts, responses);
    auto out = ok(client_->forward("policy", batch));
    auto lp = out.outputs.at("logprobs").to(at::kDouble);
    std::vector<std::vector<double>> rows;
    auto width = lp.size(1);
    for (size_t i = 0; i < responses.size(); ++i) {
      auto n = static_cast<int64_t>(responses[i].size());
      auto row_lp = lp[static_cast<int64_t>(i)].narrow(0, width - n, n).contiguous();
      rows.emplace_back(row_lp.data_ptr<double>(), row_lp.data_ptr<double>() + n);
    }
    return rows;
  }

  void expect_engines_match_trainer() {
    auto requests = some_requests();
    auto outputs = ok(client_->generate(requests));
    auto expected = trainer_logprobs(requests, outputs);
    ASSERT_EQ(expected.size(), outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      ASSERT_EQ(outputs[i].logprobs.size(), expected[i].size()) << "row " << i;
      for (size_t t = 0; t < expected[i].size(); ++t)
        EXPECT_NEAR(outputs[i].logprobs[t], expected[i][t], 1e-5) << "row " << i << " token " << t;
    }
  }

  /// The bytes the syncs sent since the last call (since the start for the first).
  int64_t bytes_synced_since() {
    auto now = ok(client_->syncs()).bytes;
    auto out = now - synced_bytes_;
    synced_bytes_ = now;
    return out;
  }
  int64_t synced_bytes_ = 0;

  int64_t engine_version(size_t rank) {
    auto handles = ok(engines_.rank_handles());
    caf::scoped_actor self{*sys_};
    int64_t v = -1;
    self->request(handles.at(rank), std::chrono::seconds(30), engine_ops::weight_version.call())
        .receive([&](op_result& r) { v = r.value.get_as<int64_t>(0); },
                 [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); });
    return v;
  }

  void done(caf::expected<void> x) {
    ASSERT_TRUE(x) << sys_->render(x.error());
  }

  actor_group policy_;
  actor_group engines_;
};

// -- spreading ---------------------------------------------------------------------------------

TEST(SpreadRequests, LeastLoadedFirstWithTiesToTheLowestEngine) {
  std::vector<sample_request> rs{request({1, 2}, 8, 0), request({1, 2}, 8, 0),
                                 request({1, 2, 3, 4}, 16, 0, 2), request({1}, 1, 0)};
  std::vector<int64_t> added(2, 0);
  auto owner = spread_requests(rs, added, {});
  // costs: 10, 10, 40, 2 → engine 0, 1, 0 (tie 10/10), 1 (10 < 50)
  EXPECT_EQ(owner, (std::vector<size_t>{0, 1, 0, 1}));
  EXPECT_EQ(added, (std::vector<int64_t>{50, 12}));
}

TEST(SpreadRequests, WorkInFlightCounts) {
  std::vector<sample_request> rs{request({1, 2}, 8, 0), request({1, 2}, 8, 0)};
  std::vector<int64_t> added(3, 0);
  auto owner = spread_requests(rs, added, {100, 0, 5});
  EXPECT_EQ(owner, (std::vector<size_t>{1, 2}));
}

TEST(WeightSyncTransport, TheFastestTransportThatReachesTheEngine) {
  process_location a{"host-a/boot-1", 100}, same{"host-a/boot-1", 100};
  process_location sibling{"host-a/boot-1", 200}, far{"host-b/boot-9", 100};
  EXPECT_EQ(choose_transport(a, same), "in_process");
  EXPECT_EQ(choose_transport(a, sibling), "shm");
  EXPECT_EQ(choose_transport(a, far), "gloo");
  auto here = this_process();
  EXPECT_FALSE(here.host.empty());
  EXPECT_GT(here.pid, 0);
}

TEST_F(EngineDispatch, GenerateSpreadsOverEnginesAndKeepsRequestOrder) {
  setup("tiny", "tiny", 3);
  auto requests = some_requests();
  auto spread = ok(client_->generate(requests));
  // The same requests one at a time (each on one engine) give the same rows in the same order.
  std::vector<sample_output> single;
  for (auto& r : requests)
    for (auto& o : ok(client_->generate({r})))
      single.push_back(o);
  ASSERT_EQ(spread.size(), single.size());
  for (size_t i = 0; i < spread.size(); ++i) {
    EXPECT_EQ(spread[i].tokens, single[i].tokens) << "row " << i;
    ASSERT_EQ(spread[i].logprobs.size(), single[i].logprobs.size()) << "row " << i;
    for (size_t t = 0; t < single[i].logprobs.size(); ++t) // batch composition moves last bits
      EXPECT_NEAR(spread[i].logprobs[t], single[i].logprobs[t], 1e-5) << "row " << i;
  }
}

// -- weight sync -------------------------------------------------------------------------------

class SyncTransports : public EngineDispatch,
                       public ::testing::WithParamInterface<const char*> {};

TEST_P(SyncTransports, EngineLogprobsEqualTheTrainersForwardAfterASync) {
  setup("tiny", "tiny", 2);
  done(client_->set_weight_transport(GetParam()));
  train_step();
  EXPECT_EQ(ok(client_->save_weights_for_sampler()), 1);
  EXPECT_EQ(engine_version(0), 1);
  EXPECT_EQ(engine_version(1), 1);
  expect_engines_match_trainer();
  train_step();
  EXPECT_EQ(ok(client_->save_weights_for_sampler()), 2);
  expect_engines_match_trainer();
}

INSTANTIATE_TEST_SUITE_P(EngineDispatch, SyncTransports,
                         ::testing::Values("auto", "in_process", "shm", "gloo"));

TEST_F(EngineDispatch, GlooSyncsReuseOneChannelUntilTheirEnginesChange) {
  setup("tiny", "tiny", 2);
  done(client_->set_weight_transport("gloo"));
  auto channel = [&] { return ok(client_->status()); };
  for (int64_t v = 1; v <= 3; ++v) {
    train_step();
    EXPECT_EQ(ok(client_->save_weights_for_sampler()), v);
    expect_engines_match_trainer();
  }
  auto s = channel();
  EXPECT_EQ(s["gloo_channels_opened"].get<int64_t>(), 1) << s.dump();
  EXPECT_EQ(s["gloo_channels"]["policy"]["syncs"].get<int64_t>(), 3) << s.dump();
  auto first = s["gloo_channels"]["policy"]["channel"].get<std::string>();
  // An engine dies: the next sync that succeeds opens a channel to the one left. (A sync racing
  // the news of the death fails naming the rank; its channel is closed too.)
  caf::anon_send_exit(ok(engines_.rank_handles()).at(1), caf::exit_reason::kill);
  train_step();
  auto v = client_->save_weights_for_sampler();
  for (int tries = 0; !v && tries < 200; ++tries) { // the news of the death may be on its way
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    v = client_->save_weights_for_sampler();
  }
  ASSERT_TRUE(v) << error_message(v.error());
  EXPECT_EQ(engine_version(0), *v);
  s = channel();
  EXPECT_EQ(s["gloo_channels_opened"].get<int64_t>(), 2) << s.dump();
  EXPECT_EQ(s["gloo_channels"]["policy"]["syncs"].get<int64_t>(), 1) << s.dump();
  EXPECT_NE(s["gloo_channels"]["policy"]["channel"].get<std::string>(), first);
}

TEST_F(EngineDispatch, DeltaSyncsGiveTheEnginesTheBitsOfFullOnes) {
  setup("tiny", "tiny", 2);
  done(client_->set_weight_transport("gloo"));
  done(client_->set_weight_delta(true));
  EXPECT_TRUE(ok(client_->status())["delta"].get<bool>());
  auto engine_weights = [&](size_t rank) {
    caf::scoped_actor self{*sys_};
    tensor_map out;
    self->request(ok(engines_.rank_handles()).at(rank), std::chrono::seconds(30),
                  engine_ops::get_weights.call())
        .receive([&](op_result& r) { out = r.value.get_as<tensor_map>(0); },
                 [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); });
    return out;
  };
  train_step();
  ok(client_->save_weights_for_sampler()); // the first sync of a channel is whole
  const auto full = bytes_synced_since();
  train_step();
  ok(client_->save_weights_for_sampler()); // a delta where it is smaller
  expect_engines_match_trainer();
  EXPECT_LE(bytes_synced_since(), full);
  const auto delta0 = engine_weights(0), delta1 = engine_weights(1);
  // Nothing changed since: only the buckets' directories travel, and the engines hold the
  // same bits as before.
  ok(client_->save_weights_for_sampler());
  EXPECT_LT(bytes_synced_since() * 100, full);
  EXPECT_EQ(engine_weights(0), delta0);
  // The same weights sent whole: the same bits, byte for byte.
  done(client_->set_weight_delta(false));
  ok(client_->save_weights_for_sampler());
  EXPECT_EQ(bytes_synced_since(), full);
  EXPECT_EQ(engine_weights(0), delta0);
  EXPECT_EQ(engine_weights(1), delta1);
  EXPECT_EQ(engine_weights(0), engine_weights(1));
  // Delta syncs and a transport that moves whole weights exclude each other.
  done(client_->set_weight_transport("shm"));
  auto refused = client_->set_weight_delta(true);
  ASSERT_FALSE(refused);
  EXPECT_NE(error_message(refused.error()).find("forced to 'shm'"), std::string::npos)
      << error_message(refused.error());
  done(client_->set_weight_transport("auto"));
  done(client_->set_weight_delta(true));
  refused = client_->set_weight_transport("in_process");
  ASSERT_FALSE(refused);
  EXPECT_NE(error_message(refused.error()).find("delta syncs are on"), std::string::npos)
      << error_message(refused.error());
}

TEST_F(EngineDispatch, DeltaSyncsOfALoraPolicySendItsAdaptersForTheEnginesToMerge) {
  setup("tiny", "tiny", 2, 4);
  done(client_->set_weight_transport("gloo"));
  done(client_->set_weight_delta(true));
  train_step();
  ok(client_->save_weights_for_sampler()); // the base and the adapters
  const auto first = bytes_synced_since();
  expect_engines_match_trainer();
  for (int i = 0; i < 2; ++i) {
    train_step(); // B moves away from zero: the adapters change the outputs
    ok(client_->save_weights_for_sampler()); // the adapters alone
    EXPECT_LT(bytes_synced_since() * 10, first);
    expect_engines_match_trainer();
  }
}

TEST_F(EngineDispatch, LoraAdaptersAreMergedBeforeTheSync) {
  setup("tiny", "tiny", 1, 4);
  train_step(); // B moves away from zero: the adapters now change the outputs
  train_step();
  ok(client_->save_weights_for_sampler());
  expect_engines_match_trainer();
}

TEST_F(EngineDispatch, ARefusedTransferKeepsTheEnginesWeightsAndVersion) {
  setup("tiny", "tiny-qwen2", 2); // another architecture: names and shapes differ
  auto requests = some_requests();
  auto before = ok(client_->generate(requests));
  auto r = client_->save_weights_for_sampler();
  ASSERT_FALSE(r);
  EXPECT_TRUE(is(r.error(), errc::invalid_argument)) << error_message(r.error());
  EXPECT_NE(error_message(r.error()).find("engine role 'engines' rank"), std::string::npos)
    << error_message(r.error());
  EXPECT_EQ(engine_version(0), 0);
  EXPECT_EQ(engine_version(1), 0);
  auto after = ok(client_->generate(requests));
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i)
    EXPECT_EQ(before[i].logprobs, after[i].logprobs) << "row " << i;
}

TEST_F(EngineDispatch, ASyncWhileGenerateCallsAreInFlightWaitsForThem) {
  setup("tiny", "tiny", 2);
  train_step();
  std::vector<sample_request> long_requests;
  for (int i = 0; i < 8; ++i)
    long_requests.push_back(request({1, 2, 3}, 48, 7 + static_cast<uint64_t>(i)));
  // Two generate calls in flight, then a sync, from other threads at the same time.
  trainer_client other(*sys_, dispatcher_, std::chrono::seconds(60));
  trainer_client third(*sys_, dispatcher_, std::chrono::seconds(60));
  auto gen = std::async(std::launch::async, [&] { return other.generate(long_requests); });
  auto gen2 = std::async(std::launch::async, [&] { return third.generate(long_requests); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto version = client_->save_weights_for_sampler();
  ASSERT_TRUE(version) << error_message(version.error());
  auto a = gen.get();
  auto b = gen2.get();
  ASSERT_TRUE(a) << error_message(a.error());
  ASSERT_TRUE(b) << error_message(b.error());
  EXPECT_EQ(a->size(), long_requests.size());
  EXPECT_EQ(*version, 1);
  expect_engines_match_trainer();
}

// -- colocation --------------------------------------------------------------------------------

class Colocated : public EngineDispatch {
protected:
  /// Policy, ref and two engines on one virtual GPU, colocated.
  void setup_colocated() {
    setup("tiny", "tiny", 2, 0, true);
    ref_ = ok(spawn_group("ref", "ref", 1));
    ok(client_->register_group("ref", ref_));
    ok(client_->init_model("ref", spec_of("tiny", 11)));
    done(client_->colocate({"policy", "ref", "engines"}));
  }

  /// The roles with resident bytes on each device, per the dispatcher's ledger.
  std::map<std::string, std::vector<std::string>> resident() {
    auto s = ok(client_->status());
    std::map<std::string, std::vector<std::string>> out;
    for (auto& [device, roles] : s.at("devices").items())
      for (auto& [role, bytes] : roles.items())
        if (bytes.get<int64_t>() > 0)
          out[device].push_back(role);
    return out;
  }

  void expect_only(const std::string& role) {
    auto r = resident();
    ASSERT_EQ(r.size(), 1u) << ok(client_->status()).dump();
    EXPECT_EQ(r.begin()->second, std::vector<std::string>{role}) << ok(client_->status()).dump();
  }

  actor_group ref_;
};

TEST_F(Colocated, OnlyTheCalledRoleIsResidentAndValuesSurviveTheRoundTrips) {
  setup_colocated();
  // Colocated engines sleep while the policy trains: there is nothing to abort.
  expect_error(client_->call("policy", dispatcher_ops::sync_weights.id, caf::make_message("abort")),
               errc::invalid_argument, "pause mode 'abort' needs engines that are not colocated");
  auto batch = be::from_sequences({{1, 2, 3}, {4, 5}}, {{6, 7}, {8, 9, 10}});
  auto first = ok(client_->forward("policy", batch)).outputs.at("logprobs");
  expect_only("policy");
  ok(client_->generate(some_requests()));
  expect_only("engines");
  ok(client_->forward("ref", batch));
  expect_only("ref");
  // The policy comes back bit-identical after being offloaded twice.
  auto again = ok(client_->forward("policy", batch)).outputs.at("logprobs");
  EXPECT_TRUE(at::equal(first, again));
  ok(client_->forward_backward("policy", batch, "cross_entropy"));
  expect_only("policy");
  ok(client_->forward("ref", batch)); // gradients and optimizer state leave with the model
  expect_only("ref");
  // optim_step never onloads: after another role ran, the worker refuses it clearly.
  be::adam_params p;
  p.learning_rate = 1e-2;
  auto refused = client_->optim_step("policy", p);
  ASSERT_FALSE(refused);
  EXPECT_NE(error_message(refused.error()).find("offload"), std::string::npos)
    << error_message(refused.error());
  ok(client_->forward_backward("policy", batch, "cross_entropy"));
  ok(client_->optim_step("policy", p));
  expect_only("policy");
  EXPECT_EQ(ok(client_->save_weights_for_sampler()), 1);
  expect_only("engines");
  auto s = ok(client_->status());
  EXPECT_FALSE(s["roles"]["policy"]["model_on_device"].get<bool>());
  EXPECT_TRUE(s["roles"]["engines"]["weights_awake"].get<bool>());
  EXPECT_TRUE(s["roles"]["engines"]["kv_cache_awake"].get<bool>());
  expect_engines_match_trainer();
}

// -- bad input ---------------------------------------------------------------------------------

TEST_F(EngineDispatch, BadGenerateRequestsAreRefusedNamingTheRequest) {
  setup("tiny", "tiny", 2);
  auto call = [&](std::vector<sample_request> rs) {
    return client_->call("engines", engine_ops::generate.id, caf::make_message(std::move(rs)));
  };
  expect_error(call({}), errc::invalid_argument, "no requests");
  auto rs = some_requests();
  rs[3].prompt.clear();
  expect_error(call(rs), errc::invalid_argument, "request 3: empty prompt");
  rs = some_requests();
  rs[2].max_tokens = 0;
  expect_error(call(rs), errc::invalid_argument, "request 2: max_tokens must be >= 1");
  rs = some_requests();
  rs[1].num_samples = 0;
  expect_error(call(rs), errc::invalid_argument, "request 1: num_samples must be >= 1");
  rs = some_requests();
  rs[4].prompt.assign(100000, 1);
  expect_error(call(rs), errc::invalid_argument, "context");
  rs = some_requests();
  rs[0].prompt[0] = 1 << 30;
  expect_error(call(rs), errc::out_of_range, "vocabulary");
  expect_error(
      client_->call("engines", engine_ops::generate.id, caf::make_message(std::string{"x"})),
      errc::invalid_argument, "expects");
  // Still serving.
  EXPECT_EQ(ok(client_->generate(some_requests())).size(), 9u);
}

TEST_F(EngineDispatch, GenerateOnASleepingEngineSaysToWakeIt) {
  setup("tiny", "tiny", 1);
  ok(client_->call("engines", engine_ops::sleep.id, caf::make_message(std::vector<std::string>{})));
  expect_error(
      client_->call("engines", engine_ops::generate.id, caf::make_message(some_requests())),
      errc::invalid_argument, "asleep");
  ok(client_->call("engines", engine_ops::wake_up.id,
                   caf::make_message(std::vector<std::string>{})));
  ok(client_->generate(some_requests()));
}

TEST_F(EngineDispatch, BadSyncsAndSettingsAreRefused) {
  policy_ = ok(spawn_group("policy", "policy", 1));
  ok(client_->register_group("policy", policy_));
  ok(client_->init_model("policy", spec_of("tiny", 11)));
  auto none = client_->save_weights_for_sampler();
  ASSERT_FALSE(none);
  EXPECT_NE(error_message(none.error()).find("no engine role"), std::string::npos);
  engines_ = ok(spawn_engines("engines", 1));
  ok(client_->register_engines(engines_));
  ok(client_->init_model("engines", spec_of("tiny", 22)));
  expect_error(client_->call("engines", dispatcher_ops::sync_weights.id, caf::message{}),
               errc::invalid_argument, "not from an engine role");
  expect_error(client_->call("policy", dispatcher_ops::sync_weights.id, caf::make_message(1)),
               errc::invalid_argument, "takes no arguments or a pause mode");
  expect_error(client_->call("policy", dispatcher_ops::sync_weights.id, caf::make_message("drain")),
               errc::invalid_argument, "unknown pause mode 'drain'");
  expect_error(client_->call("policy", dispatcher_ops::sync_weights.id,
                             caf::make_message("keep", int64_t{-1})),
               errc::invalid_argument, "the least version must be >= 0, got -1");
  auto t = client_->set_weight_transport("carrier-pigeon");
  ASSERT_FALSE(t);
  EXPECT_NE(error_message(t.error()).find("unknown weight transport"), std::string::npos);
  auto c = client_->colocate({"policy"});
  ASSERT_FALSE(c);
  EXPECT_NE(error_message(c.error()).find("at least two roles"), std::string::npos);
  EXPECT_EQ(ok(client_->save_weights_for_sampler()), 1);
  // A resumed run continues its numbering; later syncs count on from there.
  EXPECT_EQ(ok(client_->save_weights_for_sampler("policy", "abort", 40)), 40);
  EXPECT_EQ(ok(client_->save_weights_for_sampler("policy", "keep", 3)), 41);
  // Registration with an unknown kind and a status request without a deadline are refused.
  caf::scoped_actor self{*sys_};
  self->request(dispatcher_, std::chrono::seconds(10), dispatcher_register_atom::value,
                std::string{"x"}, engines_.handle(), std::string{"toaster"})
    .receive([](int32_t) { ADD_FAILURE() << "an unknown kind was accepted"; },
             [](caf::error& e) {
               EXPECT_NE(error_message(e).find("unknown kind 'toaster'"), std::string::npos)
                 << error_message(e);
             });
  self->request(dispatcher_, std::chrono::seconds(10), dispatcher_status_atom::value, int64_t{0})
    .receive([](std::string&) { ADD_FAILURE() << "a status without deadline was answered"; },
             [](caf::error& e) {
               EXPECT_NE(error_message(e).find("timeout must be > 0"), std::string::npos)
                 << error_message(e);
             });
  auto roles = ok(client_->status())["roles"];
  EXPECT_FALSE(roles.contains("x"));
}

} // namespace
} // namespace rlforge::actors::test
