// The inference-engine kind on a real actor system: generation against the backends sampler on
// the same weights, batching and num_samples seeds, sleep/wake memory accounting with a
// bit-exact round trip, pause/resume with deferred replies, weight versions and set_weights
// acceptance and refusal, and bad input with the engine staying usable.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/batch_wire.hpp"
#include "actors/engine.hpp"
#include "actors/protocol.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "backends/threads.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"
#include "tests/backends/stop_strings_support.hpp"
#include "tests/backends/test_support.hpp"
#include "text/bpe_trainer.hpp"
#include "text/model_tokenizer.hpp"

using namespace rlforge;
using namespace rlforge::actors;
using namespace std::chrono_literals;
namespace be = rlforge::backends;

namespace {

placement_group_info virtual_pg() {
  placement_group_info pg;
  pg.name = "pg";
  pg.strategy = "pack";
  pg.bundles.push_back({0, "node0", {0}, {{"GPU", 1.0}, {"CPU", 1.0}}});
  return pg;
}

model_spec tiny_spec(uint64_t seed) {
  model_spec s;
  s.compute_dtype = "fp32"; // these tests compare fp32 numerics to 1e-5 or tighter
  s.preset = "tiny";
  s.seed = seed;
  return s;
}

sample_request request(std::vector<int64_t> prompt, int64_t max_tokens, double temperature,
                       std::optional<uint64_t> seed) {
  sample_request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.temperature = temperature;
  r.has_seed = seed.has_value();
  r.seed = seed.value_or(0);
  return r;
}

/// Requests covering greedy, plain sampling, top-k/top-p, stop tokens and prompt log-probs.
std::vector<sample_request> mixed_requests() {
  std::vector<sample_request> out;
  out.push_back(request({5, 17, 300}, 6, 0.0, std::nullopt));
  out.push_back(request({9, 1, 2, 3, 4}, 8, 1.0, 11));
  auto r = request({44, 45}, 7, 0.8, 12);
  r.top_k = 20;
  r.top_p = 0.9;
  r.prompt_logprobs = true;
  out.push_back(r);
  auto s = request({100}, 9, 1.2, 13);
  s.stop_token_ids = {7, 8, 9, 10, 11, 12, 13, 14};
  out.push_back(s);
  return out;
}

/// The same generation done directly with the backends (one row per request, no num_samples):
/// a seeded request's row draws from the stream of (seed, first_sample).
std::vector<be::sample_result> local_generate(be::causal_lm& model,
                                              const std::vector<sample_request>& requests) {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<be::sampling_params> params;
  for (auto& r : requests) {
    be::sampling_params p;
    p.max_tokens = r.max_tokens;
    p.temperature = r.temperature;
    p.top_k = r.top_k;
    p.top_p = r.top_p;
    if (r.has_seed)
      p.seed = be::sample_seed(r.seed, static_cast<uint64_t>(r.first_sample));
    p.stop_token_ids = r.stop_token_ids;
    p.prompt_logprobs = r.prompt_logprobs;
    prompts.push_back(r.prompt);
    params.push_back(p);
  }
  return be::generate(model, prompts, params);
}

/// The engine batches continuously over a paged cache while the static sampler pads one batch:
/// the same tokens and stop reasons, log-probs equal to float rounding.
constexpr double logprob_tolerance = 1e-5;

void expect_same(const std::vector<sample_output>& got,
                 const std::vector<be::sample_result>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("row " + std::to_string(i));
    EXPECT_EQ(got[i].tokens, want[i].tokens);
    EXPECT_EQ(got[i].stop_reason, want[i].stop_reason);
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size());
    for (size_t t = 0; t < got[i].logprobs.size(); ++t)
      EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], logprob_tolerance);
    ASSERT_EQ(got[i].prompt_logprobs.size(), want[i].prompt_logprobs.size());
    for (size_t t = 0; t < got[i].prompt_logprobs.size(); ++t)
      EXPECT_NEAR(got[i].prompt_logprobs[t], want[i].prompt_logprobs[t], logprob_tolerance);
  }
}

/// Parameter bytes of a model, distinct storages counted once.
int64_t parameter_bytes(const be::causal_lm& m) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (auto& [name, p] : m.named_parameters())
    if (seen.insert(p.storage().unsafeGetStorageImpl()).second)
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

tensor_map weights_of(const be::causal_lm& m) {
  std::map<std::string, at::Tensor> tensors;
  for (auto& [name, p] : m.named_parameters())
    tensors.emplace(name, p.detach());
  auto blobs = to_blobs(tensors);
  EXPECT_TRUE(blobs);
  return blobs ? *blobs : tensor_map{};
}

class Engines : public ::testing::Test {
protected:
  void SetUp() override {
    register_engine_kind();
    ASSERT_FALSE(cfg_.parse_args({}));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    // The local reference runs on one thread like the engine rank, so reductions match.
    be::set_intra_op_threads(1);
    group_ = spawn_engine("engine");
    auto n = call(engine_ops::init_model.id, caf::make_message(tiny_spec(3)));
    ASSERT_TRUE(n) << sys_->render(n.error());
    model_ = be::causal_lm::random(be::preset("tiny"), 3);
    model_->set_training(false);
  }
  void TearDown() override {
    for (auto& g : groups_)
      g.stop();
    sys_.reset();
  }

  actor_group spawn_engine(const std::string& name) {
    group_spec s;
    s.name = name;
    s.kind = "engine";
    s.placement = virtual_pg();
    s.threads_per_rank = 1;
    s.collectives = false;
    auto g = actor_group::spawn(*sys_, s);
    EXPECT_TRUE(g) << sys_->render(g.error());
    if (!g)
      throw std::runtime_error("spawn failed");
    groups_.push_back(*g);
    return *g;
  }

  /// `op(args)` on the engine's single rank.
  caf::expected<caf::message> call(caf::atom_value op, const caf::message& args,
                                   actor_group* g = nullptr) {
    auto out = (g ? *g : group_).call_all(op, args, 60s);
    if (!out)
      return std::move(out.error());
    return out->at(0);
  }

  template <class T> T value(caf::atom_value op, const caf::message& args = caf::message{}) {
    auto out = call(op, args);
    EXPECT_TRUE(out) << sys_->render(out.error());
    if (!out)
      throw std::runtime_error(op_name(op) + " failed");
    EXPECT_TRUE(out->match_elements<T>()) << caf::to_string(*out);
    return out->get_as<T>(0);
  }

  std::vector<sample_output> generate(const std::vector<sample_request>& requests) {
    return value<std::vector<sample_output>>(engine_ops::generate.id, caf::make_message(requests));
  }

  std::pair<int64_t, int64_t> memory() {
    auto out = call(engine_ops::memory.id, caf::message{});
    EXPECT_TRUE(out) << sys_->render(out.error());
    if (!out || !out->match_elements<int64_t, int64_t>())
      throw std::runtime_error("memory failed");
    return {out->get_as<int64_t>(0), out->get_as<int64_t>(1)};
  }

  /// The engine's counters and gauges (its `stats` op).
  nlohmann::json stats() { return nlohmann::json::parse(value<std::string>(engine_ops::stats.id)); }

  /// Bytes the engine's KV cache holds now (its budget while the cache is awake).
  int64_t kv_bytes() { return stats().at("kv_cache_bytes").get<int64_t>(); }

  void expect_error(const caf::expected<caf::message>& x, errc code,
                    std::vector<std::string> fragments) {
    ASSERT_FALSE(x) << "expected an error, got " << caf::to_string(*x);
    EXPECT_TRUE(is(x.error(), code)) << sys_->render(x.error());
    auto text = sys_->render(x.error());
    for (auto& f : fragments)
      EXPECT_NE(text.find(f), std::string::npos) << "'" << f << "' not in: " << text;
  }

  runtime::system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  std::vector<actor_group> groups_;
  actor_group group_;
  std::unique_ptr<be::causal_lm> model_;
};

} // namespace

TEST_F(Engines, GenerateMatchesTheBackendsSampler) {
  auto requests = mixed_requests();
  auto got = generate(requests);
  expect_same(got, local_generate(*model_, requests));
  EXPECT_EQ(got[2].prompt_logprobs.size(), 1u);
  EXPECT_EQ(got[0].tokens.size(), 6u); // greedy, no stop tokens: runs to max_tokens
  EXPECT_EQ(got[0].stop_reason, "length");
}

TEST_F(Engines, BatchedRequestsEqualOneByOne) {
  auto requests = mixed_requests();
  auto batched = generate(requests);
  ASSERT_EQ(batched.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto single = generate({requests[i]});
    ASSERT_EQ(single.size(), 1u);
    EXPECT_EQ(single[0].tokens, batched[i].tokens) << "request " << i;
    EXPECT_EQ(single[0].stop_reason, batched[i].stop_reason) << "request " << i;
  }
}

TEST_F(Engines, NumSamplesExpandsIntoRowsWithPerSampleSeedStreams) {
  auto multi = request({3, 4, 5}, 6, 1.0, 40);
  multi.num_samples = 3;
  auto greedy = request({8, 9}, 4, 0.0, std::nullopt);
  greedy.num_samples = 2;
  auto got = generate({multi, greedy});
  ASSERT_EQ(got.size(), 5u);
  // Sample j is the single-row request (seed 40, first_sample j): a slice gives the same rows.
  std::vector<sample_request> expanded;
  for (int64_t j = 0; j < 3; ++j) {
    auto one = request({3, 4, 5}, 6, 1.0, 40);
    one.first_sample = j;
    expanded.push_back(one);
  }
  expanded.push_back(request({8, 9}, 4, 0.0, std::nullopt));
  expanded.push_back(request({8, 9}, 4, 0.0, std::nullopt));
  expect_same(got, local_generate(*model_, expanded));
  // Different samples draw different streams (6 draws over 512 tokens).
  EXPECT_NE(got[0].tokens, got[1].tokens);
  EXPECT_EQ(got[3].tokens, got[4].tokens);
  // Sample 1 of seed 40 is not sample 0 of seed 41 (streams s, s+1, ... used to overlap).
  auto next_seed = request({3, 4, 5}, 6, 1.0, 41);
  EXPECT_NE(generate({next_seed}).at(0).tokens, got[1].tokens);
  auto slice = multi;
  slice.first_sample = 1;
  slice.num_samples = 2;
  auto sliced = generate({slice});
  EXPECT_EQ(sliced.at(0).tokens, got[1].tokens);
  EXPECT_EQ(sliced.at(1).tokens, got[2].tokens);
}

TEST_F(Engines, RetainedVersionsServeGenerateAfterNewerWeightsArrive) {
  auto requests = mixed_requests();
  auto v0_out = generate(requests);
  // Version 1 = the current weights, retained; then version 2 (perturbed weights) arrives.
  auto w = value<tensor_map>(engine_ops::get_weights.id);
  ASSERT_TRUE(call(engine_ops::set_weights.id, caf::make_message(w, int64_t{1})));
  ASSERT_TRUE(call(engine_ops::retain_weights.id, caf::make_message(int64_t{1}, int64_t{2})));
  std::map<std::string, at::Tensor> perturbed;
  for (auto& [name, p] : model_->named_parameters())
    perturbed.emplace(name, p.detach() * 1.5);
  ASSERT_TRUE(
      call(engine_ops::set_weights.id, caf::make_message(*to_blobs(perturbed), int64_t{2})));
  auto pinned = requests;
  for (auto& r : pinned)
    r.weight_version = 1;
  auto v1_out = generate(pinned);
  ASSERT_EQ(v1_out.size(), v0_out.size());
  for (size_t i = 0; i < v1_out.size(); ++i) {
    EXPECT_EQ(v1_out[i].tokens, v0_out[i].tokens) << "row " << i;
    EXPECT_EQ(v1_out[i].logprobs, v0_out[i].logprobs) << "row " << i;
  }
  EXPECT_NE(generate(requests).at(1).logprobs, v0_out.at(1).logprobs); // current = version 2
  // Mixed versions in one call: each row on its own weights (another batch shape: equal tokens,
  // log-probs equal to rounding).
  std::vector<sample_request> mixed{pinned.at(1), requests.at(1)};
  auto both = generate(mixed);
  EXPECT_EQ(both.at(0).tokens, v0_out.at(1).tokens);
  ASSERT_EQ(both.at(0).logprobs.size(), v0_out.at(1).logprobs.size());
  for (size_t t = 0; t < both.at(0).logprobs.size(); ++t)
    EXPECT_NEAR(both.at(0).logprobs[t], v0_out.at(1).logprobs[t], 1e-6);
  EXPECT_NE(both.at(1).tokens, v0_out.at(1).tokens);
  // Retaining beyond the bound evicts the least recently used; an evicted version is refused.
  ASSERT_TRUE(call(engine_ops::retain_weights.id, caf::make_message(int64_t{2}, int64_t{1})));
  ASSERT_TRUE(call(engine_ops::set_weights.id, caf::make_message(w, int64_t{3})));
  expect_error(call(engine_ops::generate.id, caf::make_message(pinned)), errc::not_found,
               {"weights version 1 are no longer held by this engine"});
  expect_error(call(engine_ops::retain_weights.id, caf::make_message(int64_t{7}, int64_t{2})),
               errc::invalid_argument, {"is not the engine's current weights version 3"});
  expect_error(call(engine_ops::retain_weights.id, caf::make_message(int64_t{3}, int64_t{0})),
               errc::invalid_argument, {"max_retained must be >= 1"});
  auto bad = requests.at(0);
  bad.weight_version = -1;
  expect_error(call(engine_ops::generate.id, caf::make_message(std::vector<sample_request>{bad})),
               errc::invalid_argument, {"weight_version must be >= 0"});
  // The engine still serves its current weights.
  EXPECT_EQ(generate(requests).size(), requests.size());
}

TEST_F(Engines, SleepingWeightsFreesTheirMemoryAndWakeRestoresThemBitExactly) {
  auto bytes = parameter_bytes(*model_);
  ASSERT_GT(bytes, 0);
  // Resident: the weights and the KV cache's budget (reserved while the cache is awake).
  const auto kv = kv_bytes();
  ASSERT_GT(kv, 0);
  EXPECT_EQ(memory(), std::make_pair(bytes + kv, int64_t{0}));
  auto before = value<tensor_map>(engine_ops::get_weights.id);
  EXPECT_EQ(before, weights_of(*model_));
  auto requests = mixed_requests();
  auto out_before = generate(requests);

  ASSERT_TRUE(call(engine_ops::sleep.id, caf::make_message(std::vector<std::string>{"weights"})));
  EXPECT_EQ(memory(), std::make_pair(kv, bytes));
  expect_error(call(engine_ops::generate.id, caf::make_message(requests)), errc::invalid_argument,
               {"engine is asleep (weights); call wake_up"});
  expect_error(call(engine_ops::get_weights.id, caf::message{}), errc::invalid_argument,
               {"asleep"});
  // Sleeping twice is a no-op.
  ASSERT_TRUE(call(engine_ops::sleep.id, caf::make_message(std::vector<std::string>{"weights"})));
  EXPECT_EQ(memory(), std::make_pair(kv, bytes));

  ASSERT_TRUE(call(engine_ops::wake_up.id, caf::make_message(std::vector<std::string>{"weights"})));
  EXPECT_EQ(memory(), std::make_pair(bytes + kv, int64_t{0}));
  EXPECT_EQ(value<tensor_map>(engine_ops::get_weights.id), before); // byte-for-byte
  auto out_after = generate(requests);
  ASSERT_EQ(out_after.size(), out_before.size());
  for (size_t i = 0; i < out_before.size(); ++i)
    EXPECT_EQ(out_after[i], out_before[i]) << "row " << i; // exact, logprobs included
}

TEST_F(Engines, KvCacheSleepBlocksGenerationAndTagsAreChecked) {
  auto bytes = memory().first;
  const auto kv = kv_bytes();
  ASSERT_TRUE(call(engine_ops::sleep.id, caf::make_message(std::vector<std::string>{"kv_cache"})));
  EXPECT_EQ(kv_bytes(), 0);
  EXPECT_EQ(memory().first, bytes - kv); // the cache is freed, the weights stay
  expect_error(call(engine_ops::generate.id, caf::make_message(mixed_requests())),
               errc::invalid_argument, {"engine is asleep (kv_cache); call wake_up"});
  expect_error(
      call(engine_ops::sleep.id, caf::make_message(std::vector<std::string>{"weights", "gpu"})),
      errc::invalid_argument, {"op 'sleep'", "unknown tag 'gpu'"});
  expect_error(
      call(engine_ops::wake_up.id, caf::make_message(std::vector<std::string>{"optimizer"})),
      errc::invalid_argument, {"unknown tag 'optimizer'"});
  EXPECT_EQ(memory().first, bytes - kv); // the refused sleep changed nothing
  ASSERT_TRUE(
      call(engine_ops::wake_up.id, caf::make_message(std::vector<std::string>{"kv_cache"})));
  EXPECT_EQ(generate({mixed_requests()[0]}).size(), 1u);

  // No tags: both.
  ASSERT_TRUE(call(engine_ops::sleep.id, caf::make_message(std::vector<std::string>{})));
  EXPECT_EQ(memory().first, 0);
  ASSERT_TRUE(call(engine_ops::wake_up.id, caf::make_message(std::vector<std::string>{})));
  EXPECT_EQ(memory().first, bytes);
  expect_same(generate(mixed_requests()), local_generate(*model_, mixed_requests()));
}

TEST_F(Engines, PausedEngineQueuesGenerateAndRunsItAtResume) {
  auto ranks = group_.rank_handles();
  ASSERT_TRUE(ranks) << sys_->render(ranks.error());
  auto rank = ranks->at(0);
  ASSERT_TRUE(call(engine_ops::pause.id, caf::message{}));
  auto first = mixed_requests();
  std::vector<sample_request> second{request({20, 21, 22}, 5, 1.0, 77)};

  caf::scoped_actor self{*sys_};
  auto h1 = self->request(rank, 60s, engine_ops::generate.call(first));
  auto h2 = self->request(rank, 60s, engine_ops::generate.call(second));
  // The paused engine keeps answering other ops, and changes its weights before running the
  // queued calls: their results must come from the new weights.
  auto other = be::causal_lm::random(be::preset("tiny"), 9);
  other->set_training(false);
  ASSERT_TRUE(call(engine_ops::set_weights.id, caf::make_message(weights_of(*other), int64_t{5})));
  EXPECT_EQ(value<int64_t>(engine_ops::weight_version.id), 5);

  // The rank handled both generate calls before set_weights, yet answered neither.
  EXPECT_TRUE(self->mailbox().empty());

  auto h3 = self->request(rank, 60s, engine_ops::resume.call());
  std::vector<sample_output> out1, out2;
  auto fail = [&](caf::error& e) { ADD_FAILURE() << sys_->render(e); };
  h3.receive(
      [&](op_result& r) {
        ASSERT_TRUE(r.value.match_elements<int64_t>()) << to_string(r.value);
        EXPECT_EQ(r.value.get_as<int64_t>(0), 2);
      },
      fail);
  h1.receive([&](op_result& r) { out1 = r.value.get_as<std::vector<sample_output>>(0); }, fail);
  h2.receive([&](op_result& r) { out2 = r.value.get_as<std::vector<sample_output>>(0); }, fail);
  expect_same(out1, local_generate(*other, first));
  expect_same(out2, local_generate(*other, second));
  // Not paused any more: generate answers at once.
  expect_same(generate(second), local_generate(*other, second));
}

TEST_F(Engines, QueuedCallsAreAnsweredInArrivalOrder) {
  auto ranks = group_.rank_handles();
  ASSERT_TRUE(ranks) << sys_->render(ranks.error());
  auto rank = ranks->at(0);
  ASSERT_TRUE(call(engine_ops::pause.id, caf::message{}));
  // Three calls from one event-based actor; each reply records its index when it arrives.
  auto mutex = std::make_shared<std::mutex>();
  auto order = std::make_shared<std::vector<int>>();
  auto errors = std::make_shared<int>(0);
  caf::scoped_actor self{*sys_};
  caf::actor notify = caf::actor_cast<caf::actor>(self);
  sys_->spawn([=](caf::event_based_actor* a) {
    for (int i = 0; i < 3; ++i) {
      std::vector<sample_request> r{request({int64_t{30} + i, 31}, 3 + i, 1.0, 90 + i)};
      a->request(rank, 60s, engine_ops::generate.call(r))
          .then(
              [=](op_result& res) {
                std::lock_guard<std::mutex> lock{*mutex};
                auto out = res.value.get_as<std::vector<sample_output>>(0);
                EXPECT_EQ(out.at(0).tokens.size(), static_cast<size_t>(3 + i));
                order->push_back(i);
              },
              [=](caf::error&) {
                std::lock_guard<std::mutex> lock{*mutex};
                ++*errors;
              });
    }
    a->send(notify, int32_t{3});
  });
  self->receive([](int32_t) {}, caf::after(std::chrono::seconds(30)) >>
                                    [] { ADD_FAILURE() << "the requester did not start"; });
  EXPECT_EQ(value<int64_t>(engine_ops::weight_version.id),
            0); // the rank has taken all three calls by now
  {
    std::lock_guard<std::mutex> lock{*mutex};
    EXPECT_TRUE(order->empty());
  }
  EXPECT_EQ(value<int64_t>(engine_ops::resume.id), 3);
  for (int spin = 0; spin < 3000; ++spin) {
    {
      std::lock_guard<std::mutex> lock{*mutex};
      if (order->size() + *errors == 3)
        break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> lock{*mutex};
  EXPECT_EQ(*errors, 0);
  EXPECT_EQ(*order, (std::vector<int>{0, 1, 2}));
}

TEST_F(Engines, QueuedGenerateFailuresAreAnsweredAtResume) {
  ASSERT_TRUE(call(engine_ops::pause.id, caf::message{}));
  auto ranks = group_.rank_handles();
  ASSERT_TRUE(ranks);
  caf::scoped_actor self{*sys_};
  std::vector<sample_request> bad{request({5, 600}, 3, 0.0, std::nullopt)};
  auto h = self->request(ranks->at(0), 60s, engine_ops::generate.call(bad));
  EXPECT_EQ(value<int64_t>(engine_ops::resume.id), 1);
  bool failed = false;
  h.receive([&](op_result& r) { ADD_FAILURE() << caf::to_string(r.value); },
            [&](caf::error& e) {
              failed = true;
              auto text = sys_->render(e);
              EXPECT_NE(text.find("op 'generate'"), std::string::npos) << text;
              EXPECT_NE(text.find("id 600"), std::string::npos) << text;
            });
  EXPECT_TRUE(failed);
  EXPECT_EQ(value<int64_t>(engine_ops::resume.id),
            0); // resuming an engine that is not paused: nothing queued
  expect_same(generate(mixed_requests()), local_generate(*model_, mixed_requests()));
}

TEST_F(Engines, SetWeightsSetsTheVersionAndRefusedTransfersChangeNothing) {
  EXPECT_EQ(value<int64_t>(engine_ops::weight_version.id), 0);
  auto other = be::causal_lm::random(be::preset("tiny"), 21);
  other->set_training(false);
  auto good = weights_of(*other);
  ASSERT_TRUE(call(engine_ops::set_weights.id, caf::make_message(good, int64_t{3})));
  EXPECT_EQ(value<int64_t>(engine_ops::weight_version.id), 3);
  EXPECT_EQ(value<tensor_map>(engine_ops::get_weights.id), good);
  expect_same(generate(mixed_requests()), local_generate(*other, mixed_requests()));

  auto third = weights_of(*be::causal_lm::random(be::preset("tiny"), 22));
  auto name = third.begin()->first;
  auto missing = third;
  missing.erase(name);
  expect_error(call(engine_ops::set_weights.id, caf::make_message(missing, int64_t{4})),
               errc::invalid_argument, {"op 'set_weights'", "missing parameter '" + name + "'"});
  auto extra = third;
  extra["model.layers.99.mlp.up_proj.weight"] = third.begin()->second;
  expect_error(call(engine_ops::set_weights.id, caf::make_message(extra, int64_t{4})),
               errc::invalid_argument, {"no parameter 'model.layers.99.mlp.up_proj.weight'"});
  auto shape = third;
  shape[name].shape.push_back(1);
  expect_error(call(engine_ops::set_weights.id, caf::make_message(shape, int64_t{4})),
               errc::invalid_argument, {"parameter '" + name + "' has shape"});
  auto dtype_bad = third;
  {
    auto t = from_blobs(third);
    ASSERT_TRUE(t);
    auto widened = to_blobs({{name, t->at(name).to(at::kDouble)}});
    ASSERT_TRUE(widened);
    dtype_bad[name] = widened->at(name);
  }
  expect_error(call(engine_ops::set_weights.id, caf::make_message(dtype_bad, int64_t{4})),
               errc::invalid_argument, {"parameter '" + name + "' has dtype Double"});
  expect_error(call(engine_ops::set_weights.id, caf::make_message(third, int64_t{-1})),
               errc::invalid_argument, {"version must be >= 0, got -1"});
  expect_error(call(engine_ops::set_weights.id, caf::make_message(third)), errc::invalid_argument,
               {"set_weights expects (tensor_map weights, int64 version)"});
  ASSERT_TRUE(call(engine_ops::sleep.id, caf::make_message(std::vector<std::string>{"weights"})));
  expect_error(call(engine_ops::set_weights.id, caf::make_message(third, int64_t{4})),
               errc::invalid_argument, {"asleep (weights)"});
  ASSERT_TRUE(call(engine_ops::wake_up.id, caf::make_message(std::vector<std::string>{"weights"})));

  // Every refusal kept the accepted weights and version.
  EXPECT_EQ(value<int64_t>(engine_ops::weight_version.id), 3);
  EXPECT_EQ(value<tensor_map>(engine_ops::get_weights.id), good);
  expect_same(generate(mixed_requests()), local_generate(*other, mixed_requests()));

  // init_model starts over at version 0.
  ASSERT_TRUE(call(engine_ops::init_model.id, caf::make_message(tiny_spec(3))));
  EXPECT_EQ(value<int64_t>(engine_ops::weight_version.id), 0);
  expect_same(generate(mixed_requests()), local_generate(*model_, mixed_requests()));
}

TEST_F(Engines, BadRequestsAreRefusedAndTheEngineStaysUsable) {
  auto ok = mixed_requests();
  auto expect_usable = [&] { expect_same(generate(ok), local_generate(*model_, ok)); };
  auto refuse = [&](std::vector<sample_request> reqs, errc code,
                    std::vector<std::string> fragments) {
    expect_error(call(engine_ops::generate.id, caf::make_message(reqs)), code, fragments);
    expect_usable();
  };
  auto with = [&](auto edit) {
    auto reqs = mixed_requests();
    edit(reqs[1]);
    return reqs;
  };
  refuse({}, errc::invalid_argument, {"op 'generate'", "no requests"});
  refuse(with([](sample_request& r) { r.max_tokens = 0; }), errc::invalid_argument,
         {"request 1", "max_tokens must be >= 1, got 0"});
  refuse(with([](sample_request& r) { r.max_tokens = -3; }), errc::invalid_argument,
         {"request 1", "got -3"});
  refuse(with([](sample_request& r) { r.prompt.clear(); }), errc::invalid_argument,
         {"request 1", "empty prompt"});
  refuse(with([](sample_request& r) { r.prompt.assign(512, 4); }), errc::invalid_argument,
         {"request 1", "prompt of 512 tokens", "context of 512 tokens"});
  refuse(with([](sample_request& r) { r.prompt[2] = 512; }), errc::out_of_range,
         {"request 1", "prompt token 2 has id 512", "[0, 512)"});
  refuse(with([](sample_request& r) { r.prompt[0] = -1; }), errc::out_of_range,
         {"request 1", "id -1"});
  refuse(with([](sample_request& r) { r.num_samples = 0; }), errc::invalid_argument,
         {"request 1", "num_samples must be >= 1, got 0"});
  refuse(with([](sample_request& r) { r.temperature = -0.5; }), errc::invalid_argument,
         {"request 1", "temperature", "-0.5"});
  refuse(with([](sample_request& r) { r.top_p = 1.5; }), errc::invalid_argument,
         {"request 1", "top_p", "1.5"});
  refuse(with([](sample_request& r) { r.stop_token_ids = {9000}; }), errc::invalid_argument,
         {"request 1", "9000"});
  refuse(with([](sample_request& r) { r.stop_strings = {"ab", ""}; }), errc::invalid_argument,
         {"request 1", "stop string 1 is empty"});
  // A model built from a preset has no tokenizer.
  refuse(with([](sample_request& r) { r.stop_strings = {"ab"}; }), errc::invalid_argument,
         {"request 1", "stop strings need the model's tokenizer", "preset"});
  expect_error(call(engine_ops::generate.id, caf::make_message(std::string{"hello"})),
               errc::invalid_argument, {"generate expects (std::vector<sample_request>)"});
  expect_error(call(caf::atom("decode"), caf::message{}), errc::not_found,
               {"kind 'engine' has no such op", "generate", "set_weights"});
  expect_error(call(engine_ops::init_model.id, caf::make_message(model_spec{})),
               errc::invalid_argument, {"exactly one of hf_dir, preset and config_json (got 0)"});
  auto lora = tiny_spec(3);
  lora.lora_rank = 4;
  expect_error(call(engine_ops::init_model.id, caf::make_message(lora)), errc::invalid_argument,
               {"lora_rank must be 0, got 4"});
  auto no_tokenizer = tiny_spec(4);
  no_tokenizer.tokenizer_dir = "no-such-model-dir";
  expect_error(call(engine_ops::init_model.id, caf::make_message(no_tokenizer)), errc::not_found,
               {"tokenizer_dir 'no-such-model-dir' holds no tokenizer"});
  expect_usable();
}

// Stop strings decode with the tokenizer of the model directory, or of `tokenizer_dir` (an
// exported checkpoint has none of its own): each row stops with the token after which its text
// first contains one, as the same row generated without stop strings shows.
TEST_F(Engines, StopStringsUseTheTokenizerOfTheModelDirectory) {
  be::testing::temp_dir dir("engine_stop_strings");
  const auto with_tokenizer = dir.path() / "with";
  const auto without_tokenizer = dir.path() / "without";
  model_->save_hf(with_tokenizer.string());
  model_->save_hf(without_tokenizer.string());
  text::write_tokenizer_files(with_tokenizer, text::train_model_tokenizer(512));
  const auto& tok = be::testing::tiny_tokenizer();
  std::vector<sample_request> free_runs;
  for (uint64_t seed : {21, 22, 23})
    free_runs.push_back(request({31, 32, 33}, 40, 1.0, seed));
  auto reference = local_generate(*model_, free_runs);
  std::vector<sample_request> stopped = free_runs;
  std::vector<be::sample_result> want = reference;
  bool early = false;
  for (size_t i = 0; i < stopped.size(); ++i) {
    auto stop = be::testing::spanning_stop(tok, reference[i].tokens, 3);
    ASSERT_FALSE(stop.empty()) << "row " << i;
    stopped[i].stop_strings = {stop};
    auto cut = be::testing::stop_cut(tok, reference[i].tokens, {stop});
    ASSERT_TRUE(cut);
    early = early || *cut < reference[i].tokens.size();
    want[i].tokens.resize(*cut);
    want[i].logprobs.resize(*cut);
    want[i].stop_reason = "stop";
  }
  ASSERT_TRUE(early);
  for (bool own : {true, false}) {
    SCOPED_TRACE(own ? "hf_dir's tokenizer" : "tokenizer_dir");
    model_spec spec;
    spec.compute_dtype = "fp32";
    spec.hf_dir = (own ? with_tokenizer : without_tokenizer).string();
    if (!own)
      spec.tokenizer_dir = with_tokenizer.string();
    ASSERT_TRUE(call(engine_ops::init_model.id, caf::make_message(spec)));
    expect_same(generate(stopped), want);
  }
  // Without a tokenizer in its directory the engine serves, and refuses stop strings naming it.
  model_spec bare;
  bare.compute_dtype = "fp32";
  bare.hf_dir = without_tokenizer.string();
  ASSERT_TRUE(call(engine_ops::init_model.id, caf::make_message(bare)));
  expect_error(call(engine_ops::generate.id, caf::make_message(stopped)), errc::invalid_argument,
               {"request 0", "stop strings need the model's tokenizer",
                without_tokenizer.string() + "' has none"});
  expect_same(generate(free_runs), reference);
}

TEST_F(Engines, OpsBeforeInitModelAreRefused) {
  auto fresh = spawn_engine("fresh");
  for (auto op :
       {engine_ops::generate.id, engine_ops::memory.id, engine_ops::pause.id, engine_ops::resume.id,
        engine_ops::weight_version.id, engine_ops::get_weights.id}) {
    auto args =
        op == engine_ops::generate.id ? caf::make_message(mixed_requests()) : caf::message{};
    expect_error(call(op, args, &fresh), errc::invalid_argument,
                 {"group 'fresh'", op_name(op) + " before init_model"});
  }
  expect_error(call(engine_ops::sleep.id, caf::make_message(std::vector<std::string>{}), &fresh),
               errc::invalid_argument, {"sleep before init_model"});
  ASSERT_TRUE(call(engine_ops::init_model.id, caf::make_message(tiny_spec(3)), &fresh));
  auto out = call(engine_ops::generate.id, caf::make_message(mixed_requests()), &fresh);
  ASSERT_TRUE(out) << sys_->render(out.error());
  expect_same(out->get_as<std::vector<sample_output>>(0),
              local_generate(*model_, mixed_requests()));
}
