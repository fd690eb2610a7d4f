// The Tinker backend heals a lost rank (actors/tinker_healing.hpp): the call that saw the loss is
// retried on a model rebuilt from its recovery checkpoint and journal, and every figure after it
// equals the uninterrupted run's; snapshots in the journal are saved again at their versions and
// older ones are refused naming the loss; the restart budget ends it with every loss named; bad
// options are refused. The cluster version (a node killed under `rlforge serve --cluster`) is
// tests/cluster/service_test.cpp.
#include <thread>

#include "tests/actors/tinker_backend_fixture.hpp"

namespace rlforge::actors::test {
namespace {

/// Everything one model's scripted run answered.
struct run_figures {
  std::vector<double> losses;      ///< forward_backward's loss:sum per step
  std::vector<double> grad_norms;  ///< optim_step's grad_norm:mean per step
  std::vector<int64_t> versions;   ///< the snapshot versions saved
  std::vector<std::vector<double>> final_logprobs;
  std::vector<std::vector<int64_t>> last_snapshot_tokens; ///< a seeded sample on the last one
  std::vector<std::vector<int64_t>> base_tokens;          ///< a seeded sample on the base
};

class TinkerHealing : public DispatcherBackend {
protected:
  /// Replaces the fixture's backend by one that heals up to `max_restarts` losses, with a
  /// recovery checkpoint every `every` optimizer steps.
  void use_healing(int max_restarts, int64_t every = 2) {
    backend_.reset();
    dispatcher_backend_options o;
    o.base_model_dir = base_;
    o.timeout = std::chrono::seconds(60);
    o.max_restarts = max_restarts;
    o.recovery_checkpoint_every = every;
    o.recovery_dir = path("recovery");
    backend_ = std::make_unique<dispatcher_backend>(*sys_, o);
  }

  /// Kills `model`'s rank, as a failed actor or a lost node would end it.
  void kill_rank(const std::string& model) {
    auto ranks = backend_->model_ranks(model);
    ASSERT_EQ(ranks.size(), 1u);
    caf::scoped_actor self{*sys_};
    self->monitor(ranks.front());
    caf::anon_send_exit(ranks.front(), caf::exit_reason::kill);
    self->receive([](caf::down_msg&) {});
  }

  static tk::sample_request seeded(const tk::sampler_ref& ref) {
    tk::sample_request s;
    s.prompt = {5, 17, 42, 8};
    s.num_samples = 2;
    s.params.max_tokens = 6;
    s.params.has_seed = true;
    s.params.seed = 11;
    s.sampler = ref;
    return s;
  }

  static std::vector<std::vector<int64_t>> tokens_of(const tk::sample_response& r) {
    std::vector<std::vector<int64_t>> out;
    for (auto& q : r.sequences)
      out.push_back(q.tokens);
    return out;
  }

  /// Six SFT steps of `model` (a snapshot after steps 1, 3 and 5); `before(step)` runs first.
  run_figures script(const std::string& model, const std::function<void(int)>& before = {}) {
    run_figures f;
    for (int step = 0; step < 6; ++step) {
      if (before)
        before(step);
      auto out = backend_->forward_backward({request(model, sft_data())});
      f.losses.push_back(out.at(0).metrics.at("loss:sum"));
      tk::adam_params p;
      p.learning_rate = 5e-3;
      f.grad_norms.push_back(backend_->optim_step(model, p).at("grad_norm:mean"));
      if (step % 2 == 1)
        f.versions.push_back(backend_->save_sampler_snapshot(model));
    }
    f.final_logprobs = logprobs(model, sft_data());
    f.last_snapshot_tokens = tokens_of(sample_one(seeded(snapshot_ref(model, f.versions.back()))));
    f.base_tokens = tokens_of(sample_one(seeded(base_ref())));
    return f;
  }

  static void expect_same(const run_figures& a, const run_figures& b, const std::string& what) {
    EXPECT_EQ(a.losses, b.losses) << what;
    EXPECT_EQ(a.grad_norms, b.grad_norms) << what;
    EXPECT_EQ(a.versions, b.versions) << what;
    EXPECT_EQ(a.final_logprobs, b.final_logprobs) << what;
    EXPECT_EQ(a.last_snapshot_tokens, b.last_snapshot_tokens) << what;
    EXPECT_EQ(a.base_tokens, b.base_tokens) << what;
  }
};

TEST_F(TinkerHealing, AModelWhoseRankDiesIsRebuiltAndEveryFigureEqualsTheUninterruptedRun) {
  // Alone and uninterrupted: the reference figures of two models.
  use_healing(3);
  backend_->create_model("a", lora(4, 1), policy);
  backend_->create_model("b", lora(4, 2), policy);
  auto want_a = script("a");
  auto want_b = script("b");
  // Again, both at once, and a's rank is killed before step 3 (after the recovery checkpoint of
  // step 2, so the rebuild loads it and replays the calls since) and b's before step 5.
  use_healing(3);
  backend_->create_model("a", lora(4, 1), policy);
  backend_->create_model("b", lora(4, 2), policy);
  run_figures got_a, got_b;
  std::thread ta([&] { got_a = script("a", [&](int s) { if (s == 3) kill_rank("a"); }); });
  std::thread tb([&] { got_b = script("b", [&](int s) { if (s == 5) kill_rank("b"); }); });
  ta.join();
  tb.join();
  expect_same(got_a, want_a, "model a");
  expect_same(got_b, want_b, "model b");
}

TEST_F(TinkerHealing, SnapshotsInTheJournalComeBackAndOlderOnesAreRefusedNamingTheLoss) {
  use_healing(2, /*every=*/2);
  backend_->create_model("p", lora(4), policy);
  std::vector<int64_t> versions;
  std::vector<std::vector<std::vector<int64_t>>> before;
  for (int step = 0; step < 3; ++step) {
    sft_step("p");
    versions.push_back(backend_->save_sampler_snapshot("p"));
    before.push_back(tokens_of(sample_one(seeded(snapshot_ref("p", versions.back())))));
  }
  // The recovery checkpoint was written after the second optimizer step: the journal holds
  // snapshot 2 and the third step and snapshot.
  kill_rank("p");
  sft_step("p"); // sees the loss: heals, rebuilds the model, and its engine saves them again
  for (size_t i = 1; i < versions.size(); ++i)
    EXPECT_EQ(tokens_of(sample_one(seeded(snapshot_ref("p", versions[i])))), before[i])
        << "version " << versions[i];
  expect_refused([&] { sample_one(seeded(snapshot_ref("p", versions[0]))); }, not_found,
                 "were lost with node 'local' and are older than the model's last recovery "
                 "checkpoint");
  // The model goes on: its next snapshot is a new version.
  sft_step("p");
  EXPECT_EQ(backend_->save_sampler_snapshot("p"), versions.back() + 1);
}

TEST_F(TinkerHealing, ASpentBudgetFailsTheCallNamingEveryLoss) {
  use_healing(1);
  backend_->create_model("p", lora(4), policy);
  sft_step("p");
  kill_rank("p");
  sft_step("p"); // healed: the one restart
  kill_rank("p");
  expect_refused([&] { sft_step("p"); }, server,
                 "the restart budget (1, --max-restarts) is spent; losses: "
                 "forward_backward(p): its rank on node 'local' was lost; "
                 "forward_backward(p): its rank on node 'local' was lost");
}

TEST_F(TinkerHealing, WithoutABudgetALostRankFailsItsCalls) {
  backend_->create_model("p", lora(4), policy);
  sft_step("p");
  kill_rank("p");
  expect_refused([&] { sft_step("p"); }, server, "forward_backward(p, cross_entropy)");
}

TEST_F(TinkerHealing, BadOptionsAreRefused) {
  auto refused = [&](const std::function<void(dispatcher_backend_options&)>& change,
                     const std::string& part) {
    dispatcher_backend_options o;
    o.base_model_dir = base_;
    o.max_restarts = 1;
    o.recovery_dir = path("recovery");
    change(o);
    expect_refused([&] { dispatcher_backend b(*sys_, o); }, server, part);
  };
  refused([](auto& o) { o.max_restarts = -1; }, "max_restarts must be >= 0, got -1");
  refused([](auto& o) { o.recovery_dir.clear(); }, "needs a recovery_dir");
  refused([](auto& o) { o.recovery_checkpoint_every = 0; },
          "recovery_checkpoint_every must be >= 1, got 0");
  refused([](auto& o) { o.recovery_timeout = std::chrono::milliseconds(0); },
          "recovery_timeout must be > 0 ms");
  refused([&](auto& o) { o.placement_manager = backend_->dispatcher(); },
          "needs the placement_request to place again");
}

} // namespace
} // namespace rlforge::actors::test
