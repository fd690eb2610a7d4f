#pragma once
// Shared by the dispatcher and worker tests: a virtual placement group, a self-removing temp
// directory (tests/backends' guard), tensor comparison and a fixture owning an actor system, a
// dispatcher, a blocking trainer_client and the worker groups spawned through it.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/dispatcher.hpp"
#include "actors/rendezvous_store.hpp"
#include "actors/trainer_client.hpp"
#include "actors/worker.hpp"
#include "runtime/system_config.hpp"

#include "../backends/test_support.hpp"

namespace rlforge::actors::test {

/// `bundles` bundles of one GPU and one CPU on node0, bundle i on GPU i.
inline placement_group_info virtual_pg(int bundles) {
  placement_group_info pg;
  pg.name = "pg";
  pg.strategy = "pack";
  for (int i = 0; i < bundles; ++i)
    pg.bundles.push_back({static_cast<uint32_t>(i), "node0", {i}, {{"GPU", 1.0}, {"CPU", 1.0}}});
  return pg;
}

/// A fresh directory `<tmp>/rlforge_<tag>_<pid>_<n>`, removed with its contents on destruction.
using backends::testing::temp_dir;

/// A random model of `preset` from `seed`, computing in fp32 (tests compare numerics tightly).
inline model_spec fp32_model(const std::string& preset, uint64_t seed) {
  model_spec s;
  s.compute_dtype = "fp32";
  s.preset = preset;
  s.seed = seed;
  return s;
}

/// An actor system, a rendezvous store (actors/rendezvous_store.hpp) and the actor that owns it:
/// stopping `owner_` stops the store.
class rendezvous_fixture : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(cfg_.parse_args({}));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    owner_ = sys_->spawn([](caf::event_based_actor*) -> caf::behavior {
      return {[](int32_t x) { return x; }};
    });
    store_ = spawn_rendezvous_store(*sys_, owner_);
  }
  void TearDown() override {
    caf::anon_send_exit(owner_, caf::exit_reason::user_shutdown);
    sys_.reset();
  }

  runtime::system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::actor owner_;
  rendezvous_store_actor store_;
};

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

/// An actor system with the worker kinds (plus those of `register_kinds`), a dispatcher and a
/// trainer_client (60 s deadline); the groups spawned through `spawn_group` stop on tear-down.
class actor_fixture : public ::testing::Test {
protected:
  void SetUp() override {
    register_kinds();
    ASSERT_FALSE(cfg_.parse_args({}));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    dispatcher_ = spawn_dispatcher(*sys_);
    client_ = std::make_unique<trainer_client>(*sys_, dispatcher_, std::chrono::seconds(60));
  }
  void TearDown() override {
    for (auto& g : groups_)
      g.stop();
    caf::anon_send_exit(dispatcher_, caf::exit_reason::user_shutdown);
    client_.reset();
    sys_.reset();
  }

  /// The actor kinds the tests use; registered before the system starts.
  virtual void register_kinds() { register_worker_kinds(); }

  /// Spawns a group `name` of `kind` with `ranks` ranks on a virtual placement group, one
  /// thread a rank; a spawned group is kept to be stopped on tear-down.
  caf::expected<actor_group> spawn_group(const std::string& name, const std::string& kind,
                                         int ranks) {
    group_spec s;
    s.name = name;
    s.kind = kind;
    s.placement = virtual_pg(ranks);
    s.threads_per_rank = 1;
    s.init_timeout = std::chrono::seconds(20);
    auto g = actor_group::spawn(*sys_, s);
    if (g)
      groups_.push_back(*g);
    return g;
  }

  /// `ranks` engines (the `engine` kind must be registered), one per virtual GPU, or all on
  /// GPU 0 at 0.2 GPU each (`one_device`); kept to be stopped on tear-down.
  caf::expected<actor_group> spawn_engines(const std::string& name, int ranks,
                                           bool one_device = false) {
    group_spec s;
    s.name = name;
    s.kind = "engine";
    s.placement = virtual_pg(one_device ? 1 : ranks);
    if (one_device) {
      s.num_ranks = ranks;
      s.gpu_per_rank = 0.2;
    }
    s.threads_per_rank = 1;
    s.collectives = false;
    s.init_timeout = std::chrono::seconds(20);
    auto g = actor_group::spawn(*sys_, s);
    if (g)
      groups_.push_back(*g);
    return g;
  }

  /// The value of a call that must succeed; otherwise a failure and an exception ending the test.
  template <class T> T ok(caf::expected<T> x) {
    EXPECT_TRUE(x) << sys_->render(x.error());
    if (!x)
      throw std::runtime_error("call failed");
    return std::move(*x);
  }

  runtime::system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::actor dispatcher_;
  std::unique_ptr<trainer_client> client_;
  std::vector<actor_group> groups_;
};

} // namespace rlforge::actors::test
