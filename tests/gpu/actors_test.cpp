// Ranks on a real CUDA device (actors/): a worker and an engine bound to their bundle's GPU, the
// colocation state machine's offload / sleep returning device memory to the driver (read through
// the ranks' `device_memory` op: the caching allocator and cudaMemGetInfo), onload and wake_up
// bringing back the same numbers, and a weight sync from the worker to the engine on the device.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <caf/all.hpp>

#include "actors/actor_group.hpp"
#include "actors/batch_wire.hpp"
#include "actors/engine.hpp"
#include "actors/weight_sync.hpp"
#include "actors/worker.hpp"
#include "backends/train/training_batch.hpp"
#include "gpu_support.hpp"
#include "tests/actors/test_support.hpp"

using namespace rlforge;
using namespace rlforge::actors;
namespace be = rlforge::backends;
using namespace std::chrono_literals;

namespace {

constexpr int64_t mib = int64_t{1} << 20;

struct device_memory {
  int64_t allocated = 0, reserved = 0, peak = 0, free = 0, total = 0;
};

model_spec small_spec() {
  model_spec s;
  s.compute_dtype = "fp32";
  s.preset = "small";
  s.seed = 5;
  s.learning_rate = 1e-3;
  return s;
}

be::training_batch make_batch() {
  std::vector<std::vector<int64_t>> prompts, responses;
  be::per_token_values per_token;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  for (int64_t i = 0; i < 4; ++i) {
    auto p = at::randint(1, 4000, {6 + i}, gen, at::kLong);
    auto r = at::randint(1, 4000, {5 + i}, gen, at::kLong);
    prompts.emplace_back(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel());
    responses.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
    per_token["advantages"].push_back(std::vector<float>(responses.back().size(), i % 2 ? 1.f : -1.f));
  }
  return be::from_sequences(prompts, responses, per_token);
}

class GpuActors : public test::actor_fixture {
protected:
  void register_kinds() override {
    register_worker_kinds();
    register_engine_kind();
  }

  caf::message call(actor_group& g, caf::atom_value op, caf::message args = {}) {
    return ok(g.call_all(op, std::move(args), 120s)).at(0);
  }

  device_memory memory_of(actor_group& g) {
    auto m = call(g, actors::rank_ops::device_memory.id);
    EXPECT_TRUE((m.match_elements<int64_t, int64_t, int64_t, int64_t, int64_t>()))
        << caf::to_string(m);
    return {m.get_as<int64_t>(0), m.get_as<int64_t>(1), m.get_as<int64_t>(2),
            m.get_as<int64_t>(3), m.get_as<int64_t>(4)};
  }

  at::Tensor forward(actor_group& g, const be::training_batch& batch,
                     const std::optional<loss_request>& loss = std::nullopt) {
    auto payload = ok(to_payload(batch));
    auto args = loss ? caf::make_message(payload, *loss) : caf::make_message(payload);
    auto r = call(
        g, loss ? actors::worker_ops::forward_backward.id : actors::worker_ops::forward.id, args);
    return ok(from_blobs(r.get_as<batch_result>(0).outputs)).at("logprobs");
  }
};

sample_request greedy(std::vector<int64_t> prompt, int64_t max_tokens) {
  sample_request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.temperature = 0.0;
  return r;
}

} // namespace

TEST_F(GpuActors, AWorkerOffloadsToTheHostAndComesBackBitForBit) {
  RLFORGE_REQUIRE_DEVICE();
  const bool cuda = !gpu_test::rehearsing_on_cpu();
  auto g = ok(spawn_group("policy", "policy", 1));
  call(g, actors::worker_ops::init_model.id, caf::make_message(small_spec()));
  EXPECT_EQ(call(g, actors::rank_ops::info.id).get_as<rank_info>(0).virtual_gpu, !cuda);
  auto batch = make_batch();
  forward(g, batch, loss_request{"cross_entropy", {}, {}});
  rlforge::tinker::adam_params adam;
  adam.learning_rate = 1e-3;
  call(g, actors::worker_ops::optim_step.id, caf::make_message(adam));
  forward(g, batch, loss_request{"cross_entropy", {}, {}}); // gradients accumulated again
  auto before = forward(g, batch);
  device_memory resident, offloaded;
  if (cuda)
    resident = memory_of(g);
  // Parameters, gradients and two AdamW moments of ~5M fp32 weights: ~76 MiB.
  call(g, actors::worker_ops::offload.id, caf::make_message(std::vector<std::string>{}));
  if (cuda) {
    offloaded = memory_of(g);
    EXPECT_LE(offloaded.allocated, resident.allocated - 70 * mib);
    EXPECT_LE(offloaded.reserved, resident.reserved - 70 * mib);
    EXPECT_GE(offloaded.free, resident.free + 60 * mib); // back to the driver
  }
  call(g, actors::worker_ops::onload.id, caf::make_message(std::vector<std::string>{}));
  EXPECT_TRUE(at::equal(forward(g, batch), before));
  if (cuda) {
    EXPECT_GE(memory_of(g).allocated, resident.allocated - 4 * mib);
  }
  call(g, actors::worker_ops::optim_step.id, caf::make_message(adam)); // the moments came back too
}

TEST_F(GpuActors, AnEngineSleepsOffTheDeviceAndWakesToTheSameTokens) {
  RLFORGE_REQUIRE_DEVICE();
  const bool cuda = !gpu_test::rehearsing_on_cpu();
  auto e = ok(spawn_engines("engines", 1));
  call(e, actors::worker_ops::init_model.id, caf::make_message(small_spec()));
  std::vector<sample_request> requests{greedy({5, 17, 300}, 12), greedy({9, 1, 2, 3}, 8)};
  auto first = call(e, actors::engine_ops::generate.id, caf::make_message(requests))
                   .get_as<std::vector<sample_output>>(0);
  device_memory awake;
  if (cuda)
    awake = memory_of(e);
  call(e, actors::engine_ops::sleep.id,
       caf::make_message(std::vector<std::string>{"weights", "kv_cache"}));
  if (cuda) {
    // The KV cache (256 MiB by default) and the weights (~20 MiB) leave the device.
    auto asleep = memory_of(e);
    EXPECT_LE(asleep.allocated, awake.allocated - 250 * mib);
    EXPECT_GE(asleep.free, awake.free + 200 * mib);
  } else {
    // A virtual GPU has no device memory to read.
    auto refused = e.call_all(rank_ops::device_memory.id, caf::message{}, 60s);
    EXPECT_FALSE(refused);
  }
  call(e, actors::engine_ops::wake_up.id,
       caf::make_message(std::vector<std::string>{"weights", "kv_cache"}));
  auto again = call(e, actors::engine_ops::generate.id, caf::make_message(requests))
                   .get_as<std::vector<sample_output>>(0);
  ASSERT_EQ(again.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(again[i].tokens, first[i].tokens) << "request " << i;
    EXPECT_EQ(again[i].logprobs, first[i].logprobs) << "request " << i;
  }
}

TEST_F(GpuActors, WeightsGoFromAWorkerToAnEngineOnTheDevice) {
  RLFORGE_REQUIRE_DEVICE();
  auto g = ok(spawn_group("policy", "policy", 1));
  auto e = ok(spawn_engines("engines", 1));
  auto spec = small_spec();
  call(g, actors::worker_ops::init_model.id, caf::make_message(spec));
  spec.seed = 99; // the engine starts from other weights
  call(e, actors::worker_ops::init_model.id, caf::make_message(spec));
  auto batch = make_batch();
  forward(g, batch, loss_request{"cross_entropy", {}, {}});
  rlforge::tinker::adam_params adam;
  adam.learning_rate = 1e-2;
  call(g, actors::worker_ops::optim_step.id, caf::make_message(adam));
  // One sync through the host staging of the in-process transport (both ranks live here).
  weight_sync_spec sync;
  sync.transport = "in_process";
  sync.channel = new_sync_channel();
  sync.version = 1;
  sync.timeout_ms = 60000;
  // The sender waits for the receiver: both calls run at once.
  auto sending = std::async(std::launch::async, [&] {
    return g.call_all(worker_ops::send_weights.id,
                      caf::make_message(std::vector<weight_sync_spec>{sync}), 120s);
  });
  auto got = e.call_all(engine_ops::receive_weights.id, caf::make_message(sync), 120s);
  auto sent = sending.get();
  ASSERT_TRUE(sent) << sys_->render(sent.error());
  ASSERT_TRUE(got) << sys_->render(got.error());
  // The engine now scores a response as the worker does.
  std::vector<sample_request> requests{greedy({5, 17, 300, 41}, 10)};
  auto out = call(e, actors::engine_ops::generate.id, caf::make_message(requests))
                 .get_as<std::vector<sample_output>>(0);
  std::vector<int64_t> response = out[0].tokens;
  auto scored = be::from_sequences({{5, 17, 300, 41}}, {response}, {});
  auto logprobs = forward(g, scored);
  ASSERT_EQ(logprobs.size(1), static_cast<int64_t>(response.size()));
  for (size_t k = 0; k < response.size(); ++k)
    EXPECT_NEAR(out[0].logprobs[k], logprobs[0][static_cast<int64_t>(k)].item<double>(), 1e-3)
        << "token " << k;
}
