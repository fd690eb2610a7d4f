// The continuous-batching engine against the static-batch sampler (`backends::generate`) run on
// each sample alone: batch invariance of seeded rows, requests joining mid-run and finished ones
// leaving, stop tokens / max_tokens / the context limit, prompt log-probs, prefix sharing (one
// prefill for n samples, counted), the prefix cache, preemption under a small budget, releasing
// and restoring the cache, version tags, abort and continuation, and bad input. Also the paged
// attention alone against the model's own forward pass.
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/engine/attention_kernels.hpp"
#include "backends/engine/continuous_engine.hpp"
#include "backends/engine/paged_attention.hpp"
#include "backends/engine/paged_kv_cache.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/model/sampler.hpp"
#include "backends/model/sampling_params.hpp"
#include "stop_strings_support.hpp"

using namespace rlforge::backends;
using rlforge::backends::testing::spanning_stop;
using rlforge::backends::testing::stop_cut;
using rlforge::backends::testing::tiny_detokenizer;
using rlforge::backends::testing::tiny_tokenizer;

namespace {

constexpr double logprob_tolerance = 1e-5;

struct sample_spec {
  std::vector<int64_t> prompt;
  sampling_params params;
  std::vector<std::optional<uint64_t>> seeds{std::nullopt};
};

sampling_params params(int64_t max_tokens, double temperature, int64_t top_k = -1,
                       double top_p = 1.0) {
  sampling_params p;
  p.max_tokens = max_tokens;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

/// Greedy, plain sampling, top-k/top-p, stop tokens, prompt log-probs, several samples.
std::vector<sample_spec> mixed() {
  std::vector<sample_spec> out;
  out.push_back({{5, 17, 300}, params(6, 0.0), {std::nullopt}});
  out.push_back({{9, 1, 2, 3, 4, 8, 8, 8, 8, 1}, params(12, 1.0), {11}});
  auto p = params(7, 0.8, 20, 0.9);
  p.prompt_logprobs = true;
  p.topk_prompt_logprobs = 4;
  out.push_back({{44, 45, 46, 47, 48, 49, 50}, p, {12}});
  auto s = params(20, 1.2);
  s.stop_token_ids = {7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18};
  out.push_back({{100}, s, {13, 14, 15}});
  out.push_back({{200, 201, 202, 203, 204, 205, 206, 207, 208}, params(9, 1.0), {21, 22, 23, 24}});
  return out;
}

engine_request to_request(const sample_spec& s) {
  engine_request r;
  r.prompt = s.prompt;
  r.params = s.params;
  r.seeds = s.seeds;
  return r;
}

/// Runs every step of `key` with `version` until the engine is empty.
std::map<uint64_t, engine_output> drain(continuous_engine& e, int64_t key = 0,
                                        int64_t version = 0) {
  std::map<uint64_t, engine_output> out;
  for (int steps = 0; e.has_work(); ++steps) {
    if (steps > 100000) {
      ADD_FAILURE() << "the engine does not finish";
      break;
    }
    for (auto& o : e.step(key, version))
      out[o.id] = std::move(o);
  }
  return out;
}

/// The static sampler on one sample alone.
sample_result alone(causal_lm& model, const sample_spec& s, size_t sample) {
  auto p = s.params;
  p.seed = s.seeds[sample];
  return generate(model, {s.prompt}, {p}).at(0);
}

void expect_matches(const engine_sample& got, const sample_result& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.stop_reason, want.stop_reason);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t t = 0; t < got.logprobs.size(); ++t)
    EXPECT_NEAR(got.logprobs[t], want.logprobs[t], logprob_tolerance) << "token " << t;
  EXPECT_EQ(got.versions.size(), got.tokens.size());
}

engine_config small_blocks(int64_t bytes = int64_t{64} << 20) {
  engine_config c;
  c.kv_cache_bytes = bytes;
  c.block_size = 4;
  c.max_num_seqs = 16;
  c.max_step_tokens = 64;
  c.prefix_caching = false;
  return c;
}

class ContinuousEngine : public ::testing::Test {
protected:
  void SetUp() override {
    model_ = causal_lm::random(preset("tiny"), 3);
    model_->set_training(false);
    c10::NoGradGuard no_grad;
    for (auto& [name, p] : model_->named_parameters())
      p.requires_grad_(false);
  }

  /// Every sample of every spec through one engine equals the sample alone.
  void expect_all_match(continuous_engine& e, const std::vector<sample_spec>& specs) {
    for (size_t i = 0; i < specs.size(); ++i)
      e.add(i, to_request(specs[i]));
    auto out = drain(e);
    ASSERT_EQ(out.size(), specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
      ASSERT_EQ(out[i].samples.size(), specs[i].seeds.size());
      for (size_t s = 0; s < specs[i].seeds.size(); ++s) {
        auto want = alone(*model_, specs[i], s);
        expect_matches(out[i].samples[s], want,
                       "request " + std::to_string(i) + " sample " + std::to_string(s));
        if (specs[i].params.prompt_logprobs) {
          ASSERT_EQ(out[i].prompt_logprobs.size(), want.prompt_logprobs.size());
          for (size_t t = 0; t < want.prompt_logprobs.size(); ++t)
            EXPECT_NEAR(out[i].prompt_logprobs[t], want.prompt_logprobs[t], logprob_tolerance);
        }
        EXPECT_EQ(out[i].topk_prompt_ids, want.topk_prompt_ids) << "request " << i;
        ASSERT_EQ(out[i].topk_prompt_logprobs.size(), want.topk_prompt_logprobs.size());
        for (size_t t = 0; t < want.topk_prompt_logprobs.size(); ++t)
          EXPECT_NEAR(out[i].topk_prompt_logprobs[t], want.topk_prompt_logprobs[t],
                      logprob_tolerance);
      }
    }
  }

  std::unique_ptr<causal_lm> model_;
};

} // namespace

TEST_F(ContinuousEngine, EverySampleEqualsTheSampleRunAlone) {
  continuous_engine e(*model_, small_blocks());
  expect_all_match(e, mixed());
  EXPECT_EQ(e.stats().free_blocks, e.stats().num_blocks); // everything released
}

TEST_F(ContinuousEngine, TheLoopKernelsGiveTheSameResultsAsBlas) {
  // The loops serve when no BLAS is loaded; here both paths run.
  kernels::force_loops(true);
  continuous_engine e(*model_, small_blocks());
  expect_all_match(e, mixed());
  kernels::force_loops(false);
  EXPECT_TRUE(kernels::have_blas()); // libtorch's BLAS is found on this platform
}

TEST_F(ContinuousEngine, SameResultsWithLargeBlocksTinyStepsAndTheQwenLayouts) {
  engine_config c = small_blocks();
  c.block_size = 64;
  c.max_num_seqs = 4;
  c.max_step_tokens = 5; // prompts prefilled in several chunks
  continuous_engine chunked(*model_, c);
  expect_all_match(chunked, mixed());
  for (const char* name : {"tiny-qwen2", "tiny-qwen3"}) {
    model_ = causal_lm::random(preset(name), 5);
    model_->set_training(false);
    continuous_engine e(*model_, small_blocks());
    expect_all_match(e, mixed());
  }
}

TEST_F(ContinuousEngine, RequestsJoinMidRunAndFinishedOnesLeave) {
  continuous_engine e(*model_, small_blocks());
  sample_spec long_one{{1, 2, 3}, params(40, 1.0), {5}};
  sample_spec short_one{{4, 5, 6, 7}, params(3, 1.0), {6}};
  e.add(1, to_request(long_one));
  for (int i = 0; i < 10; ++i)
    EXPECT_TRUE(e.step(0, 0).empty());
  const auto blocks_before = e.stats().free_blocks;
  e.add(2, to_request(short_one)); // joins the running batch
  std::optional<engine_output> short_out;
  int steps = 0;
  while (!short_out) {
    ASSERT_LT(++steps, 10);
    for (auto& o : e.step(0, 0)) {
      EXPECT_EQ(o.id, 2u); // leaves as soon as it is done, long before the first
      short_out = o;
    }
  }
  EXPECT_EQ(steps, 3); // prefill + first token, then two decode steps
  EXPECT_EQ(e.stats().running, 1);
  EXPECT_GE(e.stats().free_blocks, blocks_before - 1); // its blocks came back (the long one grew)
  auto rest = drain(e);
  ASSERT_EQ(rest.size(), 1u);
  expect_matches(rest.at(1).samples.at(0), alone(*model_, long_one, 0), "long");
  expect_matches(short_out->samples.at(0), alone(*model_, short_one, 0), "short");
}

TEST_F(ContinuousEngine, StopTokensMaxTokensAndTheContextLimit) {
  continuous_engine e(*model_, small_blocks());
  // Greedy tokens of a fixed prompt, then the second of them as a stop token.
  sample_spec greedy{{10, 20, 30}, params(8, 0.0)};
  e.add(1, to_request(greedy));
  auto free_run = drain(e).at(1).samples.at(0);
  ASSERT_EQ(free_run.tokens.size(), 8u);
  EXPECT_EQ(free_run.stop_reason, "length");
  auto stopped = greedy;
  stopped.params.stop_token_ids = {free_run.tokens[1]};
  e.add(2, to_request(stopped));
  auto s = drain(e).at(2).samples.at(0);
  EXPECT_EQ(s.stop_reason, "stop");
  EXPECT_EQ(s.tokens.back(), free_run.tokens[1]); // the stop token is kept
  EXPECT_LE(s.tokens.size(), 2u);
  // A prompt 3 tokens short of the 512-token context generates 3 tokens, not 50.
  sample_spec edge{std::vector<int64_t>(509, 4), params(50, 1.0), {9}};
  e.add(3, to_request(edge));
  auto c = drain(e).at(3).samples.at(0);
  EXPECT_EQ(c.tokens.size(), 3u);
  EXPECT_EQ(c.stop_reason, "length");
  expect_matches(c, alone(*model_, edge, 0), "context edge");
}

TEST_F(ContinuousEngine, StopStringsEndEachSampleWhereItsTextFirstContainsOne) {
  const auto& tok = tiny_tokenizer();
  const int64_t n = 40;
  sample_spec with{{21, 22, 23}, params(n, 1.0), {31, 32, 33}};
  sample_spec without{{21, 22, 23, 24}, params(60, 1.0), {34}}; // outlives the other
  // Reference: each sample alone without stop strings, cut where its prefix text first holds
  // the stop string picked from sample 0.
  std::vector<sample_result> free_runs;
  for (size_t k = 0; k < with.seeds.size(); ++k)
    free_runs.push_back(alone(*model_, with, k));
  auto stop = spanning_stop(tok, free_runs[0].tokens, 3);
  ASSERT_FALSE(stop.empty()) << "no stop string spanning two tokens";
  with.params.stop_strings = {stop, "<never in this text>"};
  with.params.tokenizer = tiny_detokenizer();
  continuous_engine e(*model_, small_blocks());
  e.add(1, to_request(with));
  e.add(2, to_request(without));
  const int64_t blocks_free = e.stats().free_blocks;
  bool freed_early = false;
  std::map<uint64_t, engine_output> out;
  while (e.has_work()) {
    for (auto& o : e.step(0, 0)) {
      // The stopped request leaves while the other one still runs, its blocks back in the pool.
      if (o.id == 1 && e.has_work())
        freed_early = e.stats().running == 1;
      out[o.id] = std::move(o);
    }
  }
  ASSERT_EQ(out.size(), 2u);
  bool early = false;
  for (size_t k = 0; k < with.seeds.size(); ++k) {
    SCOPED_TRACE("sample " + std::to_string(k));
    auto cut = stop_cut(tok, free_runs[k].tokens, {stop});
    sample_result want = free_runs[k];
    if (cut) {
      early = early || *cut < free_runs[k].tokens.size();
      want.tokens.resize(*cut);
      want.logprobs.resize(*cut);
      want.stop_reason = "stop";
    }
    expect_matches(out[1].samples[k], want, "stop strings");
  }
  EXPECT_TRUE(early) << "no sample stops before max_tokens: the test would not see a stop";
  expect_matches(out[2].samples[0], alone(*model_, without, 0), "no stop strings");
  EXPECT_TRUE(freed_early);
  EXPECT_EQ(e.stats().free_blocks, blocks_free);
}

TEST_F(ContinuousEngine, AContinuationSeesTheStopStringThatSpansTheSeam) {
  const auto& tok = tiny_tokenizer();
  sample_spec s{{11, 12, 13, 14, 15}, params(40, 1.0), {77}};
  auto full = alone(*model_, s, 0);
  auto stop = spanning_stop(tok, full.tokens, 4);
  ASSERT_FALSE(stop.empty());
  auto cut = stop_cut(tok, full.tokens, {stop});
  ASSERT_TRUE(cut);
  ASSERT_GE(*cut, 2u);
  s.params.stop_strings = {stop};
  s.params.tokenizer = tiny_detokenizer();
  // Stopped one token before the string completes: the rest is one token that completes it.
  continuous_engine e(*model_, small_blocks());
  auto r = to_request(s);
  r.generated = {std::vector<int64_t>(full.tokens.begin(), full.tokens.begin() + *cut - 1)};
  e.add(1, r);
  auto rest = drain(e).at(1).samples.at(0);
  EXPECT_EQ(rest.tokens, std::vector<int64_t>{full.tokens[*cut - 1]});
  EXPECT_EQ(rest.stop_reason, "stop");
  // A continuation that already holds the stop string has stopped already.
  r.generated = {std::vector<int64_t>(full.tokens.begin(), full.tokens.begin() + *cut)};
  try {
    e.add(2, r);
    ADD_FAILURE() << "a continuation past its stop string was accepted";
  } catch (const error& err) {
    EXPECT_NE(std::string(err.what()).find("completes stop string 0"), std::string::npos)
        << err.what();
  }
  EXPECT_FALSE(e.has_work());
}

TEST_F(ContinuousEngine, SamplesOfOnePromptShareOnePrefillAndEqualSeparateRequests) {
  sample_spec group{{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5}, params(10, 1.0),
                    {101, 102, 103, 104, 105, 106}};
  continuous_engine shared(*model_, small_blocks());
  shared.add(1, to_request(group));
  auto together = drain(shared).at(1);
  EXPECT_EQ(shared.stats().counters.prompt_tokens, 11); // prefilled once for six samples
  EXPECT_GT(shared.stats().counters.copies, 0);        // the partial prompt block, per sample
  continuous_engine separate(*model_, small_blocks());
  for (size_t s = 0; s < group.seeds.size(); ++s)
    separate.add(s, to_request({group.prompt, group.params, {group.seeds[s]}}));
  auto apart = drain(separate);
  EXPECT_EQ(separate.stats().counters.prompt_tokens, 66);
  for (size_t s = 0; s < group.seeds.size(); ++s) {
    EXPECT_EQ(together.samples[s].tokens, apart.at(s).samples.at(0).tokens) << "sample " << s;
    expect_matches(together.samples[s], alone(*model_, group, s), "sample " + std::to_string(s));
  }
}

TEST_F(ContinuousEngine, PrefixCacheHitsAreReportedAndChangeNothing) {
  auto c = small_blocks();
  c.prefix_caching = true;
  continuous_engine e(*model_, c);
  sample_spec first{{7, 7, 7, 7, 8, 8, 8, 8, 9, 9, 9}, params(5, 1.0), {1}};
  sample_spec second{first.prompt, params(5, 1.0), {2}};
  e.add(1, to_request(first));
  drain(e);
  e.add(2, to_request(second));
  auto out = drain(e).at(2);
  auto st = e.stats();
  EXPECT_EQ(st.counters.prefix_query_tokens, 22);
  EXPECT_EQ(st.counters.prefix_hit_tokens, 8); // two full blocks of the second prompt
  EXPECT_NEAR(st.prefix_hit_rate(), 8.0 / 22.0, 1e-12);
  expect_matches(out.samples.at(0), alone(*model_, second, 0), "cached prefix");
  // After new weights the cache is dropped.
  e.weights_changed();
  EXPECT_EQ(e.stats().cached_blocks, 0);
}

TEST_F(ContinuousEngine, ASmallBudgetPreemptsAndRecomputesWithIdenticalResults) {
  auto specs = mixed();
  for (int i = 0; i < 4; ++i)
    specs.push_back({{30 + i, 31, 32, 33, 34}, params(30, 1.0), {300u + i, 400u + i}});
  auto c = small_blocks();
  // Room for a few sequences only: the largest request needs 4 + 4*8 = 36 blocks.
  c.kv_cache_bytes = 40 * paged_kv_cache::block_bytes(model_->config(), c.block_size);
  continuous_engine e(*model_, c);
  expect_all_match(e, specs);
  EXPECT_GT(e.stats().counters.preemptions, 0);
  EXPECT_GT(e.stats().counters.recompute_tokens, 0);
}

TEST_F(ContinuousEngine, ReleasingTheCacheMidRunFreesItAndTheRunCompletesUnchanged) {
  continuous_engine e(*model_, small_blocks());
  auto specs = mixed();
  for (size_t i = 0; i < specs.size(); ++i)
    e.add(i, to_request(specs[i]));
  std::map<uint64_t, engine_output> out;
  for (int i = 0; i < 4; ++i)
    for (auto& o : e.step(0, 0))
      out[o.id] = o;
  EXPECT_GT(e.cache_bytes(), 0);
  e.release_cache();
  EXPECT_EQ(e.cache_bytes(), 0);
  EXPECT_FALSE(e.cache_allocated());
  EXPECT_THROW(e.step(0, 0), error);
  e.restore_cache();
  EXPECT_EQ(e.cache_bytes(), e.stats().num_blocks *
                                 paged_kv_cache::block_bytes(model_->config(), 4));
  for (auto& [id, o] : drain(e))
    out[id] = o;
  ASSERT_EQ(out.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i)
    for (size_t s = 0; s < specs[i].seeds.size(); ++s)
      expect_matches(out[i].samples[s], alone(*model_, specs[i], s), "request " + std::to_string(i));
}

TEST_F(ContinuousEngine, TokensCarryTheVersionOfTheStepThatProducedThem) {
  continuous_engine e(*model_, small_blocks());
  e.add(1, to_request({{1, 2, 3}, params(6, 1.0), {4}}));
  e.step(0, 3);
  e.step(0, 3);
  e.step(0, 4); // e.g. new weights arrived between steps
  auto out = drain(e, 0, 5).at(1).samples.at(0);
  EXPECT_EQ(out.versions, (std::vector<int64_t>{3, 3, 4, 5, 5, 5}));
}

TEST_F(ContinuousEngine, AbortReturnsPartialSamplesAndAContinuationResumesTheStream) {
  sample_spec s{{11, 12, 13, 14, 15}, params(16, 1.0), {77, 78}};
  continuous_engine e(*model_, small_blocks());
  e.add(1, to_request(s));
  for (int i = 0; i < 6; ++i)
    e.step(0, 0);
  auto partial = e.abort(1);
  ASSERT_TRUE(partial);
  EXPECT_TRUE(partial->aborted);
  EXPECT_FALSE(e.has_work());
  EXPECT_FALSE(e.abort(1)); // gone
  ASSERT_EQ(partial->samples.size(), 2u);
  for (auto& sample : partial->samples) {
    EXPECT_EQ(sample.stop_reason, "abort");
    EXPECT_EQ(sample.tokens.size(), 6u);
  }
  // Resubmitted with what it generated, each sample goes on as if never stopped.
  auto r = to_request(s);
  r.generated = {partial->samples[0].tokens, partial->samples[1].tokens};
  e.add(2, r);
  auto rest = drain(e).at(2);
  for (size_t k = 0; k < 2; ++k) {
    auto full = alone(*model_, s, k);
    auto tokens = partial->samples[k].tokens;
    tokens.insert(tokens.end(), rest.samples[k].tokens.begin(), rest.samples[k].tokens.end());
    EXPECT_EQ(tokens, full.tokens) << "sample " << k;
    EXPECT_EQ(rest.samples[k].stop_reason, full.stop_reason);
  }
  // abort_all stops queued requests too, oldest first.
  e.add(5, to_request(s));
  e.add(6, to_request(s));
  auto all = e.abort_all();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].id, 5u);
  EXPECT_EQ(all[1].samples[0].tokens.size(), 0u);
}

TEST_F(ContinuousEngine, BadRequestsAreRefusedNamingTheValueAndTheEngineGoesOn) {
  continuous_engine e(*model_, small_blocks());
  auto refuse = [&](engine_request r, error_code code, const std::string& needle) {
    try {
      e.add(9, std::move(r));
      ADD_FAILURE() << "accepted; expected: " << needle;
    } catch (const error& err) {
      EXPECT_EQ(err.code(), code) << err.what();
      EXPECT_NE(std::string(err.what()).find(needle), std::string::npos) << err.what();
    }
    EXPECT_FALSE(e.has_work());
  };
  auto ok = to_request({{1, 2}, params(4, 1.0), {1}});
  auto r = ok;
  r.prompt.clear();
  refuse(r, error_code::invalid_argument, "empty prompt");
  r = ok;
  r.prompt = {1, 512};
  refuse(r, error_code::out_of_range, "prompt token 1 has id 512");
  r = ok;
  r.prompt.assign(512, 1);
  refuse(r, error_code::invalid_argument, "no room in the model's context of 512");
  r = ok;
  r.params.max_tokens = 0;
  refuse(r, error_code::invalid_argument, "max_tokens must be >= 1");
  r = ok;
  r.params.top_p = 0;
  refuse(r, error_code::invalid_argument, "top_p");
  r = ok;
  r.seeds.clear();
  refuse(r, error_code::invalid_argument, "at least one sample");
  r = ok;
  r.generated = {{1, 2, 3, 4}};
  refuse(r, error_code::invalid_argument, "may generate only 4");
  r = ok;
  r.params.stop_token_ids = {3};
  r.generated = {{3}};
  refuse(r, error_code::invalid_argument, "already stopped");
  r = ok;
  r.params.stop_strings = {"x"};
  refuse(r, error_code::invalid_argument, "stop strings need the model's tokenizer");
  r.params.tokenizer = tiny_detokenizer();
  r.params.stop_strings = {"x", ""};
  refuse(r, error_code::invalid_argument, "stop string 1 is empty");
  auto c = small_blocks(16 * paged_kv_cache::block_bytes(model_->config(), 4));
  continuous_engine tight(*model_, c);
  try {
    tight.add(1, to_request({std::vector<int64_t>(40, 1), params(40, 1.0), {1}}));
    ADD_FAILURE() << "a request larger than the cache was queued";
  } catch (const error& err) {
    EXPECT_NE(std::string(err.what()).find("raise kv_cache_bytes"), std::string::npos);
  }
  e.add(1, ok);
  EXPECT_THROW(e.add(1, ok), error); // duplicate id
  EXPECT_EQ(drain(e).size(), 1u);
  engine_config bad = small_blocks();
  bad.kv_cache_bytes = 10;
  EXPECT_THROW(continuous_engine(*model_, bad), error);
  bad = small_blocks();
  bad.max_step_tokens = 2;
  EXPECT_THROW(continuous_engine(*model_, bad), error);
}

TEST_F(ContinuousEngine, PagedAttentionEqualsTheModelsOwnForward) {
  c10::NoGradGuard no_grad;
  const auto& cfg = model_->config();
  paged_kv_cache cache(cfg, 4);
  cache.allocate(64);
  // Two sequences sharing 8 prompt positions (blocks 0, 1), then each its own blocks, and a
  // third on scattered blocks; each feeds 3 new tokens after its cached past.
  std::vector<int64_t> prompt{3, 1, 4, 1, 5, 9, 2, 6};
  std::vector<std::vector<int64_t>> seqs{{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9},
                                         {3, 1, 4, 1, 5, 9, 2, 6, 7, 9, 3, 2, 3},
                                         {8, 4, 6, 2, 6, 4, 3, 3, 8}};
  std::vector<std::vector<int32_t>> tables{{0, 1, 2, 3}, {0, 1, 4, 5}, {9, 7, 12}};
  std::vector<int64_t> past{10, 10, 6};
  // Fill the pasts: the shared prompt once, then each sequence's own positions.
  auto fill = [&](const std::vector<int64_t>& tokens, int64_t from, int64_t to,
                  const std::vector<int32_t>& table) {
    std::vector<int64_t> ids(tokens.begin() + from, tokens.begin() + to), pos;
    for (int64_t p = from; p < to; ++p)
      pos.push_back(p);
    paged_attention a(cache, cfg.num_attention_heads,
                      {{0, from, to - from, &table, 0}});
    model_->forward_tokens(at::tensor(ids, at::kLong), at::tensor(pos, at::kLong), a);
  };
  fill(seqs[0], 0, 8, tables[0]);
  fill(seqs[0], 8, 10, tables[0]);
  fill(seqs[1], 8, 10, tables[1]);
  fill(seqs[2], 0, 6, tables[2]);
  std::vector<attention_item> items;
  std::vector<int64_t> ids, pos;
  for (size_t i = 0; i < 3; ++i) {
    items.push_back({static_cast<int64_t>(ids.size()), past[i],
                     static_cast<int64_t>(seqs[i].size()) - past[i], &tables[i], i < 2 ? 7u : 8u});
    for (int64_t p = past[i]; p < static_cast<int64_t>(seqs[i].size()); ++p) {
      ids.push_back(seqs[i][static_cast<size_t>(p)]);
      pos.push_back(p);
    }
  }
  paged_attention a(cache, cfg.num_attention_heads, items);
  auto hidden = model_->forward_tokens(at::tensor(ids, at::kLong), at::tensor(pos, at::kLong), a);
  for (size_t i = 0; i < 3; ++i) {
    auto full = model_->forward_hidden(at::tensor(seqs[i], at::kLong).unsqueeze(0))[0];
    auto want = full.narrow(0, past[i], static_cast<int64_t>(seqs[i].size()) - past[i]);
    auto got = hidden.narrow(0, items[i].token, items[i].count);
    EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5))
      << "sequence " << i << " max diff " << (got - want).abs().max().item<double>();
  }
}
