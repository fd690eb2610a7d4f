// Persistent Gloo weight channels (actors/weight_sync.hpp): the first transfer on a channel
// rendezvous through a store actor, later ones reuse the group (they succeed with the store
// gone) and deliver exactly the sender's weights; a refused transfer closes the channel at both
// ends; a receiver keeps one channel; bad specs are refused.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <future>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <caf/all.hpp>

#include "actors/rendezvous_store.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/compute_dtype.hpp"
#include "backends/model/lora.hpp"
#include "backends/weights/weight_transport.hpp"
#include "test_support.hpp"

namespace rlforge::actors::test {
namespace {

using namespace std::chrono_literals;
namespace be = rlforge::backends;

class WeightChannels : public rendezvous_fixture {
protected:
  void SetUp() override {
    rendezvous_fixture::SetUp();
    trainer_ = build_model(fp32_model("tiny", 11));
    engine_ = build_model(fp32_model("tiny", 22));
  }

  weight_sync_spec spec(const std::string& channel, int64_t version, int32_t rank) {
    weight_sync_spec s;
    s.transport = "gloo";
    s.channel = channel;
    s.version = version;
    s.timeout_ms = 5000;
    s.bucket_bytes = bucket_bytes_; // several buckets, some packed, some straight from a tensor
    s.store = store_;
    s.world_size = 2;
    s.rank = rank;
    s.delta = delta_;
    return s;
  }

  /// One transfer: the sender on this thread, the engine's receiver on another. Returns the
  /// receiver's result (the version held) or rethrows its error after the sender's.
  int64_t transfer(const std::string& channel, int64_t version, int64_t engine_version) {
    auto received = std::async(std::launch::async, [&] {
      bool torn = false;
      return receive_model_weights(*engine_, engine_version, spec(channel, version, 1), torn,
                                   engine_channels_);
    });
    std::exception_ptr sent;
    try {
      sent_bytes_ = send_model_weights(*trainer_, spec(channel, version, 0), trainer_channels_);
    } catch (...) {
      sent = std::current_exception();
    }
    auto v = received.get();
    if (sent)
      std::rethrow_exception(sent);
    return v;
  }

  /// Moves every trainer weight a little, as a training step would.
  void step_trainer(double by) {
    c10::NoGradGuard no_grad;
    for (auto& [name, t] : trainer_->named_parameters())
      t.add_(by);
  }

  void expect_engine_equals_trainer() {
    auto sent = weights_for_sync(*trainer_);
    auto got = engine_->named_parameters();
    ASSERT_EQ(sent.size(), got.size());
    for (size_t i = 0; i < sent.size(); ++i) {
      EXPECT_EQ(sent[i].first, got[i].first);
      EXPECT_TRUE(at::equal(sent[i].second, got[i].second)) << sent[i].first;
    }
  }

  std::unique_ptr<be::causal_lm> trainer_, engine_;
  int64_t bucket_bytes_ = 1 << 16;
  bool delta_ = false;
  int64_t sent_bytes_ = 0; ///< what the last transfer's sender reported
  weight_channels trainer_channels_, engine_channels_;
};

TEST_F(WeightChannels, LaterTransfersReuseTheChannelWithoutTheStore) {
  EXPECT_EQ(transfer("c1", 1, 0), 1);
  expect_engine_equals_trainer();
  EXPECT_EQ(trainer_channels_.opened(), 1u);
  EXPECT_EQ(engine_channels_.opened(), 1u);
  // With the store gone, only an open channel can carry a transfer.
  caf::scoped_actor self{*sys_};
  self->monitor(store_);
  caf::anon_send_exit(owner_, caf::exit_reason::user_shutdown);
  self->receive([](caf::down_msg&) {}, caf::after(10s) >> [] { FAIL() << "store still up"; });
  for (int64_t v = 2; v <= 4; ++v) {
    step_trainer(0.01 * static_cast<double>(v));
    EXPECT_EQ(transfer("c1", v, v - 1), v);
    expect_engine_equals_trainer();
  }
  EXPECT_EQ(trainer_channels_.opened(), 1u);
  EXPECT_EQ(trainer_channels_.reused(), 3u);
  EXPECT_EQ(engine_channels_.reused(), 3u);
  EXPECT_EQ(trainer_channels_.open_now(), 1u);
  // A new channel needs the store: it fails naming it, and the engine keeps version 4's weights.
  try {
    transfer("c2", 5, 4);
    ADD_FAILURE() << "a new channel opened without its store";
  } catch (const be::error& e) {
    EXPECT_NE(std::string{e.what()}.find("rendezvous store"), std::string::npos) << e.what();
  }
  expect_engine_equals_trainer();
}

TEST_F(WeightChannels, ARefusedTransferClosesTheChannelAtBothEndsAndChangesNothing) {
  EXPECT_EQ(transfer("c1", 1, 0), 1);
  auto before = engine_->named_parameters().front().second.clone();
  step_trainer(0.5);
  try {
    transfer("c1", 1, 1); // the engine already holds version 1
    ADD_FAILURE() << "a stale version was accepted";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::invalid_argument) << e.what();
  }
  EXPECT_TRUE(at::equal(before, engine_->named_parameters().front().second));
  EXPECT_EQ(trainer_channels_.open_now(), 0u);
  EXPECT_EQ(engine_channels_.open_now(), 0u);
  // The next transfer opens a new channel and delivers.
  EXPECT_EQ(transfer("c2", 2, 1), 2);
  expect_engine_equals_trainer();
  EXPECT_EQ(trainer_channels_.opened(), 2u);
}

TEST_F(WeightChannels, AReceiverKeepsOneChannelAndASenderTheOnesItIsToldTo) {
  EXPECT_EQ(transfer("c1", 1, 0), 1);
  EXPECT_EQ(transfer("c2", 2, 1), 2);
  EXPECT_EQ(engine_channels_.open_now(), 1u); // c1 closed when c2 arrived
  EXPECT_EQ(trainer_channels_.open_now(), 2u);
  trainer_channels_.keep_only({"c2"});
  EXPECT_EQ(trainer_channels_.open_now(), 1u);
  EXPECT_EQ(transfer("c2", 3, 2), 3);
  expect_engine_equals_trainer();
}

TEST_F(WeightChannels, WithoutABucketSizeTheChannelTakesItFromTheLinkItMeasured) {
  bucket_bytes_ = 0;
  EXPECT_EQ(transfer("c1", 1, 0), 1);
  auto first = trainer_channels_.link("c1");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->bucket_bytes, be::bucket_bytes_for_link(0, 0)); // not measured yet: 4 MiB
  EXPECT_GT(first->bytes_per_second, 0);
  step_trainer(0.25);
  EXPECT_EQ(transfer("c1", 2, 1), 2);
  expect_engine_equals_trainer();
  std::uint64_t bytes = 0;
  for (auto& [name, t] : weights_for_sync(*trainer_))
    bytes += static_cast<std::uint64_t>(t.nbytes());
  auto second = trainer_channels_.link("c1");
  ASSERT_TRUE(second);
  EXPECT_EQ(second->bucket_bytes, be::bucket_bytes_for_link(first->bytes_per_second, bytes));
  EXPECT_FALSE(engine_channels_.link("c2"));
}

TEST_F(WeightChannels, DeltaTransfersSendTheChangesUntilTheEngineWritesItsWeightsOtherwise) {
  delta_ = true;
  auto poke = [&](double by) { // three elements of one weight change
    c10::NoGradGuard no_grad;
    trainer_->named_parameters().at(1).second.view({-1}).narrow(0, 5, 3).add_(by);
  };
  EXPECT_EQ(transfer("c1", 1, 0), 1);
  const auto full = sent_bytes_;
  poke(0.5);
  EXPECT_EQ(transfer("c1", 2, 1), 2);
  expect_engine_equals_trainer();
  EXPECT_LT(sent_bytes_ * 100, full); // 3 values + indices + the directories
  // The engine's weights were written by other means: the next transfer comes whole.
  engine_channels_.forget_bases();
  poke(0.25);
  EXPECT_EQ(transfer("c1", 3, 2), 3);
  expect_engine_equals_trainer();
  EXPECT_EQ(sent_bytes_, full);
  poke(0.125);
  EXPECT_EQ(transfer("c1", 4, 3), 4);
  EXPECT_LT(sent_bytes_ * 100, full);
  expect_engine_equals_trainer();
  // Delta transfers are Gloo's only.
  auto shm = spec("c2", 5, 0);
  shm.transport = "shm";
  try {
    send_model_weights(*trainer_, shm, trainer_channels_);
    ADD_FAILURE() << "a delta shm transfer was accepted";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::invalid_argument) << e.what();
    EXPECT_NE(std::string{e.what()}.find("transport 'shm' moves whole weights"), std::string::npos)
        << e.what();
  }
}

/// A LoRA trainer's delta syncs: the first brings the base and the adapters, the next ones the
/// adapters alone; each time the engine's weights are, bit for bit, the merged ones a full sync
/// sends (`weights_for_sync`). In bf16 the trainer computes in bf16 and the engine stores bf16.
void lora_syncs(be::causal_lm& trainer, be::causal_lm& engine,
                const std::function<int64_t(const std::string&, int64_t, int64_t)>& transfer,
                const int64_t& sent_bytes) {
  be::lora_config lora;
  lora.rank = 4;
  lora.alpha = 8;
  trainer.enable_lora(lora, 5);
  auto expect_merged = [&](int64_t version) {
    std::map<std::string, at::Tensor> got;
    for (auto& [name, t] : engine.named_parameters())
      got.emplace(name, t);
    auto sent = weights_for_sync(trainer);
    ASSERT_EQ(sent.size(), got.size());
    for (auto& [name, t] : sent) {
      ASSERT_TRUE(got.count(name)) << name;
      const auto& e = got.at(name);
      ASSERT_EQ(e.scalar_type(), t.scalar_type()) << name;
      EXPECT_EQ(std::memcmp(e.contiguous().data_ptr(), t.contiguous().data_ptr(), t.nbytes()), 0)
          << name << " differs after version " << version;
    }
  };
  int64_t adapter_bytes = 0, tensors = 1; // + the scaling
  for (auto& [name, t] : trainer.named_parameters())
    if (name != "value_head.weight") {
      ++tensors;
      if (name.find(".lora_") != std::string::npos)
        adapter_bytes += static_cast<int64_t>(t.nbytes());
    }
  EXPECT_EQ(transfer("c1", 1, 0), 1);
  expect_merged(1);
  const auto first = sent_bytes;
  for (int64_t v = 2; v <= 3; ++v) {
    { // a training step moves every adapter element (B leaves zero)
      c10::NoGradGuard no_grad;
      for (auto& [name, t] : trainer.named_parameters())
        if (name.find(".lora_") != std::string::npos)
          t.add_(at::randn(t.sizes(), at::TensorOptions().dtype(t.scalar_type())) * 0.05);
    }
    EXPECT_EQ(transfer("c1", v, v - 1), v);
    expect_merged(v);
    // The adapters in full sections, the rest directory entries: nothing of the base.
    EXPECT_LE(sent_bytes, adapter_bytes + 8 * tensors);
    EXPECT_GE(sent_bytes, adapter_bytes);
  }
  EXPECT_GT(first, 10 * sent_bytes);
}

TEST_F(WeightChannels, ALoraTrainersDeltaSyncsSendTheAdaptersAndTheEngineMergesThem) {
  delta_ = true;
  lora_syncs(*trainer_, *engine_,
             [&](const std::string& c, int64_t v, int64_t held) { return transfer(c, v, held); },
             sent_bytes_);
}

TEST_F(WeightChannels, ALoraTrainerInBf16SyncsToABf16EngineTheSameWay) {
  delta_ = true;
  trainer_->set_compute_dtype(be::compute_dtype::bf16);
  engine_->store_weights_in_bf16();
  lora_syncs(*trainer_, *engine_,
             [&](const std::string& c, int64_t v, int64_t held) { return transfer(c, v, held); },
             sent_bytes_);
}

TEST(SyncTargets, AdapterSyncsLandInKeptTensorsAndIncompleteOnesAreRefused) {
  be::named_tensors params{{"w.weight", at::zeros({4, 3})}, {"n.weight", at::zeros({4})}};
  auto spec_of = [](const std::string& name, std::vector<int64_t> shape,
                    at::ScalarType dtype = at::kFloat) {
    be::tensor_spec s;
    s.name = name;
    s.shape = std::move(shape);
    s.dtype = dtype;
    return s;
  };
  be::weight_manifest adapter_sync;
  adapter_sync.tensors = {spec_of("w.weight", {4, 3}), spec_of("n.weight", {4}),
                          spec_of("w.lora_A.weight", {2, 3}), spec_of("w.lora_B.weight", {4, 2}),
                          spec_of(lora_scaling_name, {}, at::kDouble)};
  be::named_tensors adapters;
  auto t = sync_targets(adapter_sync, params, adapters);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_TRUE(t[1].second.is_same(params[1].second)); // an unadapted weight: the parameter
  EXPECT_FALSE(t[0].second.is_same(params[0].second)); // an adapted one: its base, kept apart
  ASSERT_EQ(adapters.size(), 4u);
  EXPECT_EQ(adapters[3].second.scalar_type(), at::kDouble);
  // The next adapter sync lands in the same tensors; one whose rank changed gets new ones.
  auto kept = adapters;
  sync_targets(adapter_sync, params, adapters);
  for (size_t i = 0; i < kept.size(); ++i)
    EXPECT_TRUE(adapters[i].second.is_same(kept[i].second)) << adapters[i].first;
  auto rank3 = adapter_sync;
  rank3.tensors[2] = spec_of("w.lora_A.weight", {3, 3});
  rank3.tensors[3] = spec_of("w.lora_B.weight", {4, 3});
  sync_targets(rank3, params, adapters);
  EXPECT_TRUE(adapters[0].second.is_same(kept[0].second));
  EXPECT_EQ(adapters[1].second.sizes(), (at::IntArrayRef{3, 3}));
  // Incomplete adapter syncs are refused naming what they lack, and keep what was kept.
  for (auto [drop, missing] : {std::pair<size_t, std::string>{3, "w.lora_B.weight"},
                               {4, lora_scaling_name},
                               {0, "w.weight"}}) {
    auto bad = adapter_sync;
    bad.tensors.erase(bad.tensors.begin() + static_cast<std::ptrdiff_t>(drop));
    auto before = adapters;
    try {
      sync_targets(bad, params, adapters);
      ADD_FAILURE() << "an adapter sync without " << missing << " was accepted";
    } catch (const be::error& e) {
      EXPECT_EQ(e.code(), be::error_code::invalid_argument);
      EXPECT_NE(std::string{e.what()}.find("without '" + missing + "'"), std::string::npos)
          << e.what();
    }
    ASSERT_EQ(adapters.size(), before.size());
  }
  // A transfer of merged weights: the parameters, and the adapter tensors are let go.
  be::weight_manifest merged;
  merged.tensors = {spec_of("w.weight", {4, 3}), spec_of("n.weight", {4})};
  t = sync_targets(merged, params, adapters);
  EXPECT_TRUE(t[0].second.is_same(params[0].second));
  EXPECT_TRUE(adapters.empty());
}

TEST_F(WeightChannels, BadSpecsAreRefusedBeforeAnythingIsSent) {
  auto bad = spec("c1", 1, 1); // a sender must be rank 0
  EXPECT_THROW(send_model_weights(*trainer_, bad, trainer_channels_), be::error);
  bool torn = false;
  auto as_sender = spec("c1", 1, 0); // a receiver must be rank >= 1
  EXPECT_THROW(receive_model_weights(*engine_, 0, as_sender, torn, engine_channels_), be::error);
  auto no_store = spec("c1", 1, 0);
  no_store.store = rendezvous_store_actor{};
  try {
    send_model_weights(*trainer_, no_store, trainer_channels_);
    ADD_FAILURE() << "a transfer without a store was accepted";
  } catch (const be::error& e) {
    EXPECT_EQ(e.code(), be::error_code::invalid_argument) << e.what();
    EXPECT_NE(std::string{e.what()}.find("no store actor"), std::string::npos) << e.what();
  }
  EXPECT_EQ(trainer_channels_.open_now(), 0u);
  EXPECT_EQ(engine_channels_.open_now(), 0u);
}

} // namespace
} // namespace rlforge::actors::test
