// The Tinker backend's sampling (actors/tinker_sampling.hpp): samplers match the trainer's
// log-probs, snapshots stay bound to the weights they were created from (and are refused once
// evicted), concurrent syncs of several models never cross, per-sample seed streams, persisted
// exports, and bad input.
#include <atomic>
#include <mutex>
#include <thread>

#include "tests/actors/tinker_backend_fixture.hpp"
#include "tests/backends/stop_strings_support.hpp"
#include "text/bpe_trainer.hpp"
#include "text/model_tokenizer.hpp"

namespace rlforge::actors::test {
namespace {

class TinkerSampling : public DispatcherBackend {
protected:
  /// A seeded request on `ref` for `n` samples of `max_tokens` tokens, with prompt log-probs.
  static tk::sample_request request_on(const tk::sampler_ref& ref, int64_t n = 2,
                                       int64_t max_tokens = 6, int64_t seed = 3) {
    tk::sample_request s;
    s.prompt = {5, 17, 42, 8};
    s.num_samples = n;
    s.params.max_tokens = max_tokens;
    s.params.has_seed = true;
    s.params.seed = seed;
    s.prompt_logprobs = true;
    s.sampler = ref;
    return s;
  }

  /// Every sequence's log-probs (and the prompt's) equal model `m`'s forward within `tol`.
  void expect_matches_trainer(const std::string& m, const tk::sample_request& s,
                              const tk::sample_response& r, double tol = 1e-5) {
    ASSERT_EQ(r.sequences.size(), static_cast<size_t>(s.num_samples));
    ASSERT_TRUE(r.has_prompt_logprobs);
    ASSERT_EQ(r.prompt_logprobs.size(), s.prompt.size());
    EXPECT_TRUE(std::isnan(r.prompt_logprobs[0]));
    for (auto& q : r.sequences) {
      ASSERT_FALSE(q.tokens.empty());
      ASSERT_EQ(q.tokens.size(), q.logprobs.size());
      std::vector<int64_t> seq = s.prompt;
      seq.insert(seq.end(), q.tokens.begin(), q.tokens.end());
      auto lp = logprobs(m, {next_tokens(seq)}).at(0);
      auto [prompt_lp, token_lp] = split_logprobs(lp, s.prompt.size());
      for (size_t t = 0; t < token_lp.size(); ++t)
        EXPECT_NEAR(q.logprobs[t], token_lp[t], tol) << m << " token " << t;
      for (size_t t = 0; t < prompt_lp.size(); ++t)
        EXPECT_NEAR(r.prompt_logprobs[t + 1], prompt_lp[t], tol) << m << " prompt " << t + 1;
    }
  }
};

TEST_F(TinkerSampling, SnapshotsAndExportsMatchTheTrainer) {
  backend_->create_model("p", lora(4), policy); // adapts attention, MLP and the unembedding
  auto base = sample_one(request_on(base_ref()));
  expect_matches_trainer("p", request_on(base_ref()), base); // fresh adapters add nothing
  for (int i = 0; i < 3; ++i)
    sft_step("p", 1e-2);
  auto v = backend_->save_sampler_snapshot("p");
  EXPECT_EQ(v, 1);
  auto snap = sample_one(request_on(snapshot_ref("p", v)));
  expect_matches_trainer("p", request_on(snapshot_ref("p", v)), snap);
  EXPECT_NE(snap.sequences[0].tokens, base.sequences[0].tokens);

  sft_step("p", 1e-2);
  auto dir = where("export");
  fs::create_directories(dir.dir);
  backend_->export_sampler_weights("p", dir);
  EXPECT_TRUE(fs::exists(fs::path(dir.dir) / "config.json"));
  EXPECT_TRUE(fs::exists(fs::path(dir.dir) / "model.safetensors"));
  auto exported = request_on(checkpoint_ref(dir.dir, dir.name));
  expect_matches_trainer("p", exported, sample_one(exported));
  // The base engine still serves the base weights.
  EXPECT_EQ(sample_one(request_on(base_ref())).sequences[0].tokens, base.sequences[0].tokens);
}

// Tinker binds every sampler to the weights it was created from: a snapshot keeps sampling them
// after later steps and saves, for as long as the engine retains it.
// topk_prompt_logprobs = k: a prompt_length x k matrix, row 0 empty (the SDK's sentinel). With
// k = the vocabulary every row is the whole distribution: it sums to 1, is sorted, and holds the
// prompt token at the log-prob prompt_logprobs reports; a smaller k is its prefix.
TEST_F(TinkerSampling, TopkPromptLogprobsAreThePromptsDistribution) {
  auto s = request_on(base_ref(), 1, 2);
  s.topk_prompt_logprobs = 512;
  auto full = sample_one(s);
  const size_t n = s.prompt.size(), k = 512;
  ASSERT_EQ(full.topk, 512);
  ASSERT_EQ(full.topk_prompt_ids.size(), n * k);
  ASSERT_EQ(full.topk_prompt_logprobs.size(), n * k);
  for (size_t c = 0; c < k; ++c) {
    EXPECT_EQ(full.topk_prompt_ids[c], 0);
    EXPECT_EQ(full.topk_prompt_logprobs[c], tk::topk_empty_logprob);
  }
  for (size_t row = 1; row < n; ++row) {
    double mass = 0;
    bool found = false;
    for (size_t c = 0; c < k; ++c) {
      const double lp = full.topk_prompt_logprobs[row * k + c];
      mass += std::exp(lp);
      if (c > 0) {
        EXPECT_LE(lp, full.topk_prompt_logprobs[row * k + c - 1]);
      }
      if (full.topk_prompt_ids[row * k + c] == s.prompt[row]) {
        found = true;
        EXPECT_NEAR(lp, full.prompt_logprobs[row], 1e-6) << row;
      }
    }
    EXPECT_NEAR(mass, 1.0, 1e-4) << row;
    EXPECT_TRUE(found) << row;
  }
  s.topk_prompt_logprobs = 3;
  auto top3 = sample_one(s);
  ASSERT_EQ(top3.topk_prompt_ids.size(), n * 3);
  for (size_t row = 1; row < n; ++row)
    for (size_t c = 0; c < 3; ++c) {
      EXPECT_EQ(top3.topk_prompt_ids[row * 3 + c], full.topk_prompt_ids[row * k + c]);
      EXPECT_NEAR(top3.topk_prompt_logprobs[row * 3 + c], full.topk_prompt_logprobs[row * k + c],
                  1e-6);
    }
  // The sequences are those of the same request without top-k.
  s.topk_prompt_logprobs = 0;
  auto plain = sample_one(s);
  EXPECT_EQ(plain.sequences[0].tokens, full.sequences[0].tokens);
  EXPECT_EQ(plain.topk, 0);
  EXPECT_TRUE(plain.topk_prompt_ids.empty());
}

TEST_F(TinkerSampling, ASnapshotKeepsItsWeightsAfterLaterStepsAndSaves) {
  backend_->create_model("p", lora(4), policy);
  sft_step("p", 1e-2);
  auto v1 = backend_->save_sampler_snapshot("p");
  auto at_v1 = sample_one(request_on(snapshot_ref("p", v1)));
  for (int i = 0; i < 2; ++i)
    sft_step("p", 1e-2);
  auto v2 = backend_->save_sampler_snapshot("p");
  EXPECT_EQ(v2, v1 + 1);
  auto again = sample_one(request_on(snapshot_ref("p", v1)));
  ASSERT_EQ(again.sequences.size(), at_v1.sequences.size());
  for (size_t i = 0; i < again.sequences.size(); ++i) {
    EXPECT_EQ(again.sequences[i].tokens, at_v1.sequences[i].tokens);
    EXPECT_EQ(again.sequences[i].logprobs, at_v1.sequences[i].logprobs);
  }
  auto at_v2 = sample_one(request_on(snapshot_ref("p", v2)));
  expect_matches_trainer("p", request_on(snapshot_ref("p", v2)), at_v2);
  EXPECT_NE(at_v2.sequences[0].logprobs, at_v1.sequences[0].logprobs);
  // Both versions in one call: each request on its own weights.
  auto both =
      backend_->sample({request_on(snapshot_ref("p", v1)), request_on(snapshot_ref("p", v2))});
  EXPECT_EQ(both.at(0).sequences[0].logprobs, at_v1.sequences[0].logprobs);
  EXPECT_EQ(both.at(1).sequences[0].logprobs, at_v2.sequences[0].logprobs);
}

TEST_F(TinkerSampling, AnEvictedSnapshotIsRefusedNeverAnsweredFromOtherWeights) {
  dispatcher_backend_options o;
  o.base_model_dir = base_;
  o.max_sampler_snapshots = 2;
  o.timeout = std::chrono::seconds(60);
  backend_ = std::make_unique<dispatcher_backend>(*sys_, o);
  backend_->create_model("p", lora(4), policy);
  std::vector<int64_t> versions;
  for (int i = 0; i < 3; ++i) {
    sft_step("p", 1e-2);
    versions.push_back(backend_->save_sampler_snapshot("p"));
  }
  expect_refused([&] { sample_one(request_on(snapshot_ref("p", versions[0]))); }, not_found,
                 "were evicted: the server keeps the 2 most recently used sampler snapshots");
  EXPECT_NO_THROW(sample_one(request_on(snapshot_ref("p", versions[1]))));
  EXPECT_NO_THROW(sample_one(request_on(snapshot_ref("p", versions[2]))));
  expect_refused([&] { sample_one(request_on(snapshot_ref("p", 99))); }, not_found,
                 "has no snapshot version 99");
  expect_refused([&] { sample_one(request_on(snapshot_ref("nope", 1))); }, not_found,
                 "model 'nope' saved no weights for sampling");
  backend_->delete_model("p");
  expect_refused([&] { sample_one(request_on(snapshot_ref("p", versions[2]))); }, not_found,
                 "its model 'p' was deleted");
}

// Several models sync and sample at the same instant, many rounds: every sample's log-probs
// equal its own model's forward, never another's (the weight-sync channels of concurrent syncs
// are distinct).
TEST_F(TinkerSampling, ConcurrentSyncsOfSeveralModelsNeverCross) {
  const int models = 4, rounds = 6;
  for (int m = 0; m < models; ++m)
    backend_->create_model("m" + std::to_string(m), lora(4, m + 1), policy);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int m = 0; m < models; ++m)
    threads.emplace_back([&, m] {
      auto id = "m" + std::to_string(m);
      try {
        for (int r = 0; r < rounds; ++r) {
          sft_step(id, 1e-2);
          auto v = backend_->save_sampler_snapshot(id);
          auto req = request_on(snapshot_ref(id, v), 2, 4, r);
          // The model's weights are still those of snapshot v: its forward is the reference.
          expect_matches_trainer(id, req, sample_one(req));
        }
      } catch (const std::exception& e) {
        ++failures;
        ADD_FAILURE() << id << ": " << e.what();
      }
    });
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(failures.load(), 0);
  // The models (seeded apart) trained apart: their forwards differ.
  EXPECT_NE(logprobs("m0", sft_data()), logprobs("m1", sft_data()));
}

TEST_F(TinkerSampling, SampleStreamsDependOnlyOnSeedAndSampleIndex) {
  auto with = [](int64_t seed, int64_t n, int64_t first) {
    auto r = request_on(base_ref(), n, 8, seed);
    r.first_sample = first;
    r.prompt_logprobs = false;
    return r;
  };
  auto s7 = sample_one(with(7, 4, 0));
  auto s8 = sample_one(with(8, 4, 0));
  // Sample j of seed 7 is unrelated to sample j-1 of seed 8 (they were equal with s, s+1, ...).
  for (size_t j = 1; j < 4; ++j)
    EXPECT_NE(s7.sequences[j].tokens, s8.sequences[j - 1].tokens) << "sample " << j;
  // The same seed gives the same samples; a slice gives exactly its samples.
  auto again = sample_one(with(7, 4, 0));
  auto slice = sample_one(with(7, 2, 2));
  for (size_t j = 0; j < 4; ++j)
    EXPECT_EQ(again.sequences[j].tokens, s7.sequences[j].tokens);
  EXPECT_EQ(slice.sequences[0].tokens, s7.sequences[2].tokens);
  EXPECT_EQ(slice.sequences[1].tokens, s7.sequences[3].tokens);
  // Batch-mates change nothing.
  auto pair = backend_->sample({with(9, 3, 0), with(7, 4, 0)});
  for (size_t j = 0; j < 4; ++j)
    EXPECT_EQ(pair.at(1).sequences[j].tokens, s7.sequences[j].tokens);
}

TEST_F(TinkerSampling, ExportsOutliveTheirModelAndAreReloadedAfterEviction) {
  dispatcher_backend_options o;
  o.base_model_dir = base_;
  o.max_export_engines = 1;
  o.timeout = std::chrono::seconds(60);
  backend_ = std::make_unique<dispatcher_backend>(*sys_, o);
  backend_->create_model("p", lora(4), policy);
  auto tokens = [&](const tk::checkpoint_ref& c) {
    return sample_one(request_on(checkpoint_ref(c.dir, c.name))).sequences.at(0).tokens;
  };
  sft_step("p", 1e-2);
  auto v1 = where("v1");
  fs::create_directories(v1.dir);
  backend_->export_sampler_weights("p", v1);
  auto at_v1 = tokens(v1);
  for (int i = 0; i < 3; ++i)
    sft_step("p", 1e-2);
  auto v2 = where("v2");
  fs::create_directories(v2.dir);
  backend_->export_sampler_weights("p", v2);
  auto at_v2 = tokens(v2); // evicts v1's engine (one cached)
  ASSERT_NE(at_v1, at_v2);
  EXPECT_EQ(tokens(v1), at_v1); // reloaded
  backend_->delete_model("p");
  EXPECT_EQ(tokens(v2), at_v2);
  // A checkpoint whose files are gone is refused naming it, never its directory.
  auto gone = where("gone");
  try {
    tokens(gone);
    ADD_FAILURE() << "sampled a missing checkpoint";
  } catch (const tk::request_error& e) {
    EXPECT_EQ(e.category(), not_found);
    EXPECT_NE(std::string{e.what()}.find(gone.name), std::string::npos) << e.what();
    EXPECT_EQ(std::string{e.what()}.find(gone.dir), std::string::npos) << e.what();
  }
}

TEST_F(TinkerSampling, BadRequestsAreRefusedNamingTheValue) {
  backend_->create_model("p", lora(4), policy);
  auto v = backend_->save_sampler_snapshot("p");
  tk::sample_request s;
  s.prompt = {1, 2, 3};
  s.params.max_tokens = 4;
  s.sampler = snapshot_ref("p", v);
  auto with = [&](auto change) {
    auto r = s;
    change(r);
    return std::vector<tk::sample_request>{r};
  };
  // The base directory holds no tokenizer: stop strings are refused, and get_info has none.
  EXPECT_FALSE(backend_->tokenizer_id());
  expect_refused([&] { backend_->sample(with([](auto& r) { r.params.stop_strings = {"x"}; })); },
                 user, "stop strings need the model's tokenizer; the base model 'tiny-base' has none");
  expect_refused(
      [&] { backend_->sample(with([](auto& r) { r.params.stop_strings = {"x", ""}; })); }, user,
      "stop string 1 is empty");
  expect_refused([&] { backend_->sample(with([](auto& r) { r.topk_prompt_logprobs = 513; })); },
                 user, "topk_prompt_logprobs must be in 0..512");
  expect_refused([&] { backend_->sample(with([](auto& r) {
                         r.prompt = {1, 600};
                       })); }, user,
                 "prompt token 1 = 600 is outside the vocabulary");
  expect_refused([&] { backend_->sample(with([](auto& r) { r.num_samples = 0; })); }, user,
                 "num_samples");
  expect_refused([&] { backend_->sample(with([](auto& r) { r.params.max_tokens = 0; })); }, user,
                 "max_tokens");
  expect_refused([&] { backend_->sample(with([](auto& r) { r.params.max_tokens = 510; })); }, user,
                 "exceeds the model's context of 512 tokens; lower max_tokens to at most 509");
  expect_refused([&] { backend_->sample(with([](auto& r) { r.params.top_p = 2; })); }, user,
                 "top_p");
  // The engine is intact.
  EXPECT_EQ(backend_->sample({s}).at(0).sequences.size(), 1u);
}

// A base model with a tokenizer: every sampler of it (the base model, a snapshot, an exported
// checkpoint, which has no tokenizer of its own) ends a sequence with the token after which its
// text first contains a stop string, as the same seeded sequence sampled without them shows.
TEST_F(TinkerSampling, StopStringsEndSequencesOnEverySamplerOfABaseWithATokenizer) {
  text::write_tokenizer_files(base_, text::train_model_tokenizer(512));
  dispatcher_backend_options o;
  o.base_model_dir = base_;
  o.timeout = std::chrono::seconds(60);
  backend_ = std::make_unique<dispatcher_backend>(*sys_, o);
  EXPECT_EQ(backend_->tokenizer_id(), fs::absolute(base_).lexically_normal().string());
  backend_->create_model("p", lora(4), policy);
  sft_step("p", 1e-2);
  auto v = backend_->save_sampler_snapshot("p");
  auto dir = where("export");
  fs::create_directories(dir.dir);
  backend_->export_sampler_weights("p", dir);
  ASSERT_FALSE(fs::exists(fs::path(dir.dir) / "tokenizer.json"));
  const auto& tok = be::testing::tiny_tokenizer();
  for (const auto& ref : {base_ref(), snapshot_ref("p", v), checkpoint_ref(dir.dir, dir.name)}) {
    SCOPED_TRACE(ref.name.empty() ? "base" : ref.name);
    auto free_request = request_on(ref, 2, 40, 5);
    auto free_run = sample_one(free_request);
    auto stop = be::testing::spanning_stop(tok, free_run.sequences.at(0).tokens, 3);
    ASSERT_FALSE(stop.empty()) << "no stop string spanning two tokens";
    auto stopped_request = free_request;
    stopped_request.params.stop_strings = {stop, "<never in this text>"};
    auto stopped = sample_one(stopped_request);
    ASSERT_EQ(stopped.sequences.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      const auto& want = free_run.sequences[k];
      const auto& got = stopped.sequences[k];
      auto cut = be::testing::stop_cut(tok, want.tokens, {stop});
      const size_t keep = cut.value_or(want.tokens.size());
      if (k == 0) {
        EXPECT_LT(keep, want.tokens.size()) << "sample 0 does not stop early";
      }
      EXPECT_EQ(got.stop_reason, cut ? "stop" : want.stop_reason) << "sample " << k;
      EXPECT_EQ(got.tokens, std::vector<int64_t>(want.tokens.begin(), want.tokens.begin() + keep))
          << "sample " << k;
      ASSERT_EQ(got.logprobs.size(), keep);
      for (size_t t = 0; t < keep; ++t)
        EXPECT_NEAR(got.logprobs[t], want.logprobs[t], 1e-5) << "sample " << k << " token " << t;
    }
  }
}

// Sampling a snapshot runs while its model trains and syncs new snapshots: every answer is the
// snapshot it names.
TEST_F(TinkerSampling, SnapshotsServeWhileTheirModelTrainsAndSyncs) {
  backend_->create_model("p", lora(4), policy);
  sft_step("p", 1e-2);
  auto v1 = backend_->save_sampler_snapshot("p");
  auto want = sample_one(request_on(snapshot_ref("p", v1)));
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    for (int i = 0; i < 3; ++i) {
      sft_step("p", 1e-2);
      backend_->save_sampler_snapshot("p");
    }
    done = true;
  });
  int checked = 0;
  while (!done || checked < 2) {
    auto got = sample_one(request_on(snapshot_ref("p", v1)));
    EXPECT_EQ(got.sequences[0].logprobs, want.sequences[0].logprobs);
    ++checked;
  }
  trainer.join();
}

} // namespace
} // namespace rlforge::actors::test
