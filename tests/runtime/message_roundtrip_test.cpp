// Sends a value of every registered message type across a real publish/remote_actor connection
// on 127.0.0.1 (two actor systems in one process) and checks it comes back equal.
#include <gtest/gtest.h>

#include <chrono>
#include <limits>

#include <caf/all.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/io/all.hpp>

#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"
#include "runtime/type_registry.hpp"

using namespace rlforge;
using namespace std::chrono_literals;

namespace {

// One non-trivial sample per registered type. A type added to `message_types` without a sample
// here fails to compile (no matching overload), so the test cannot silently skip it.
tensor_blob sample(tensor_blob*) {
  tensor_blob x;
  x.dtype = dtype::f32;
  x.shape = {2, 3};
  x.bytes.assign(24, '\0');
  for (size_t i = 0; i < x.bytes.size(); ++i)
    x.bytes[i] = static_cast<char>(i * 7 + 1);
  return x;
}
node_resources sample(node_resources*) {
  return {"node-7", 64, int64_t{1} << 40, 8, false, {{"accelerator_type:X", 1.5}}};
}
placement_group_request sample(placement_group_request*) {
  return {"pg-a", {{{"GPU", 0.2}, {"CPU", 1}}, {{"GPU", 1}}}, "strict_spread", 2.5};
}
bundle_placement sample(bundle_placement*) {
  return {3, "node-1", {4, 5}, {{"GPU", 2.0}, {"memory", 1e9}}};
}
placement_group_info sample(placement_group_info*) {
  return {"pg-b", "spread", {sample(static_cast<bundle_placement*>(nullptr)), {0, "n0", {}, {}}}};
}
rank_info sample(rank_info*) {
  return {"policy", 3, 4, "node-2", {1}, 0.2, 2, true};
}
/// A handle of a live actor of the client's system: it comes back as itself (a typed handle is
/// an actor address on the wire; the cast does not check the interface).
caf::actor handle_source;
collective_spec sample(collective_spec*) {
  return {"actor", "grp#9", caf::actor_cast<rendezvous_store_actor>(handle_source), 1234};
}
op_result sample(op_result*) {
  return {caf::make_message(std::string{"loss"}, 0.25, sample(static_cast<collective_spec*>(nullptr)))};
}
resource_amounts sample(resource_amounts*) {
  return {{"GPU", 0.0001}, {"CPU", 48}, {"custom", -0.5}};
}
std::vector<int32_t> sample(std::vector<int32_t>*) {
  return {std::numeric_limits<int32_t>::min(), -1, 0, 7, std::numeric_limits<int32_t>::max()};
}
std::vector<int64_t> sample(std::vector<int64_t>*) {
  return {std::numeric_limits<int64_t>::min(), 0, int64_t{1} << 62};
}
std::vector<float> sample(std::vector<float>*) {
  return {-1.5f, 0.0f, 3.25f, std::numeric_limits<float>::max()};
}
std::vector<double> sample(std::vector<double>*) {
  return {-1e300, 0.1, 2.0};
}
std::vector<caf::message> sample(std::vector<caf::message>*) {
  return {caf::make_message(int32_t{1}, std::string{"x"}), caf::make_message(sample(
                                                             static_cast<rank_info*>(nullptr)))};
}
std::vector<uint8_t> sample(std::vector<uint8_t>*) {
  return {0, 1, 254, 255};
}
batch_payload sample(batch_payload*) {
  batch_payload x;
  x.tensors["sequences"] = sample(static_cast<tensor_blob*>(nullptr));
  x.tensors["loss_mask"] = tensor_blob{dtype::f32, {2, 1}, std::string(8, '\x01')};
  x.response_length = 1;
  x.pad_size = 1;
  x.uids = {7, 7};
  x.group_ids = {0, 3};
  return x;
}
loss_request sample(loss_request*) {
  return {"regular", {{"eps_clip_low", 0.2}, {"eps_clip_high", 0.28}}, {{"tis_ratio_type", "token"}}};
}
batch_result sample(batch_result*) {
  return {{{"logprobs", sample(static_cast<tensor_blob*>(nullptr))}},
          {{"loss:sum", -3.5}, {"clip_ratio:mean", 0.125}},
          17.0};
}
rlforge::tinker::adam_params sample(rlforge::tinker::adam_params*) {
  return {3e-5, 0.8, 0.99, 1e-8, 0.01, 1.0};
}
optim_result sample(optim_result*) {
  return {12.5, false, true, 3e-5, 42};
}
model_spec sample(model_spec*) {
  return {"", "tiny", "{}", 77, 8, 32.0, {"q_proj", "v_proj"}, 0.05, "cosine", 2e-4, 3, 30, 0.1, true, "bf16",
          true, "base-model"};
}
algorithm_config sample(algorithm_config*) {
  return {4, 2048, true, 0.7, 64, true, "k2", 0.01, true, 0.02};
}
tensor_map sample(tensor_map*) {
  return {{"lm_head.weight", sample(static_cast<tensor_blob*>(nullptr))},
          {"norm.weight", tensor_blob{dtype::f32, {2}, std::string(8, '\x02')}}};
}
sample_request sample(sample_request*) {
  return {{5, 9, 2}, 12, 0.7, 40, 0.9, true, 1234567890123ULL, {0, 3}, {"\n\n", "Ende ¶"},
          true, 3, 1, 2, 6, {11, 12}};
}
sample_output sample(sample_output*) {
  return {{7, 8, 3}, {-0.5, -1.25, -2.0}, "stop", {-3.0, -0.125}, {4, 4, 5}, {9, 1, 6, 2},
          {-0.5, -1.5, -0.75, -2.5}};
}
generation_result sample(generation_result*) {
  return {42, {sample(static_cast<sample_output*>(nullptr))}, "stopped", 7, 1};
}
engine_options sample(engine_options*) {
  return {int64_t{1} << 30, 32, 64, 1024, false};
}
rollout sample(rollout*) {
  return {17, sample(static_cast<sample_request*>(nullptr)),
          {sample(static_cast<sample_output*>(nullptr)), sample(static_cast<sample_output*>(nullptr))},
          2};
}
rollout_batch sample(rollout_batch*) {
  return {{sample(static_cast<rollout*>(nullptr))}, {1}, {3, 5}, 4};
}
rlforge::tinker::checked_request sample(rlforge::tinker::checked_request*) {
  namespace tk = rlforge::tinker;
  tk::forward_backward_request r;
  r.model_id = "lora-7";
  r.data.resize(2);
  r.data[0].tokens = {3, 1, 4};
  r.data[0].loss_fn_inputs["target_tokens"] = {tk::dtype::int32, {3}, {}, {1, 4, 1}};
  r.data[0].loss_fn_inputs["logprobs"] = {tk::dtype::float32, {3}, {-0.5, -1.25, -2}, {}};
  r.data[0].loss_fn_inputs["advantages"] = {tk::dtype::bfloat16, {3}, {1, 0.5, -0.25}, {}};
  r.data[1].tokens = {5};
  r.data[1].loss_fn_inputs["target_tokens"] = {tk::dtype::int64, {1}, {}, {9}};
  r.data[1].loss_fn_inputs["logprobs"] = {tk::dtype::float32, {1}, {-3}, {}};
  r.data[1].loss_fn_inputs["advantages"] = {tk::dtype::float32, {1}, {2}, {}};
  r.loss_fn = "ppo";
  r.loss_fn_config = {{"clip_low_threshold", 0.75}};
  r.forward_only = true;
  return tk::check_request(r, tk::model_role::policy, {16, 8}, "round trip");
}
tinker_pass_result sample(tinker_pass_result*) {
  namespace tk = rlforge::tinker;
  return {{{{"logprobs", {tk::dtype::float32, {2}, {-0.5, -4}, {}}},
            {"elementwise_loss", {tk::dtype::float32, {2}, {0.5, 4}, {}}}},
           {}},
          {{"loss:sum", 4.5}, {"clip_ratio:mean", 0.25}},
          2.0};
}
rollout_state sample(rollout_state*) {
  return {{sample(static_cast<rollout*>(nullptr))}, {sample(static_cast<rollout*>(nullptr))}, 9,
          2, 1, {5, 3, 1}};
}
weight_sync_spec sample(weight_sync_spec*) {
  return {"gloo", "sync-7", 3, 1 << 20, 5000,
          caf::actor_cast<rendezvous_store_actor>(handle_source), 3, 1};
}

node_join_request sample(node_join_request*) {
  return {sample(static_cast<node_resources*>(nullptr)), "10.0.0.7", 41234, "0.1.0",
          {"rlforge::x: x(0)", "interface y: z"}, {"engine", "policy"}, "host-a", 4242};
}
join_reply sample(join_reply*) {
  return {"c0ffee", "0.1.0", 200, 1000};
}
driver_hello sample(driver_hello*) {
  return {"host-a:99:abcd", "0.1.0", {"line 1", "line 2"}, "host-a", 99};
}
node_endpoint sample(node_endpoint*) {
  return {"n3", "::1", 6380};
}
node_heartbeat sample(node_heartbeat*) {
  return {"n3", {"driver-a", "driver-b"}, {2, 5}};
}
group_record sample(group_record*) {
  return {"policy", "policy", "train", {"n1", "n2"}};
}
node_agent_actor sample(node_agent_actor*) {
  return caf::actor_cast<node_agent_actor>(handle_source);
}
head_actor sample(head_actor*) {
  return caf::actor_cast<head_actor>(handle_source);
}
rendezvous_store_actor sample(rendezvous_store_actor*) {
  return caf::actor_cast<rendezvous_store_actor>(handle_source);
}

bool equal(const std::vector<caf::message>& a, const std::vector<caf::message>& b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (to_string(a[i]) != to_string(b[i]))
      return false;
  return true;
}
template <class T>
bool equal(const T& a, const T& b) {
  return a == b;
}

caf::behavior echo(caf::event_based_actor* self) {
  self->set_default_handler(caf::reflect);
  return {[](int64_t, int64_t) {}}; // never sent; a behavior needs at least one handler
}

class MessageRoundTrip : public ::testing::Test {
protected:
  void SetUp() override {
    ASSERT_FALSE(server_cfg_.parse_args({}));
    ASSERT_FALSE(client_cfg_.parse_args({}));
    server_ = std::make_unique<caf::actor_system>(server_cfg_);
    client_ = std::make_unique<caf::actor_system>(client_cfg_);
    auto echo_actor = server_->spawn(echo);
    auto port = server_->middleman().publish(echo_actor, 0, "127.0.0.1");
    ASSERT_TRUE(port) << server_->render(port.error());
    auto remote = client_->middleman().remote_actor("127.0.0.1", *port);
    ASSERT_TRUE(remote) << client_->render(remote.error());
    remote_ = *remote;
    local_echo_ = echo_actor;
    handle_source = client_->spawn(echo);
  }

  void TearDown() override {
    caf::anon_send_exit(handle_source, caf::exit_reason::user_shutdown);
    handle_source = caf::actor{};
    caf::anon_send_exit(local_echo_, caf::exit_reason::user_shutdown);
    remote_ = caf::actor{};
    local_echo_ = caf::actor{};
    client_.reset();
    server_.reset();
  }

  template <class T>
  void round_trip() {
    auto original = sample(static_cast<T*>(nullptr));
    caf::scoped_actor self{*client_};
    bool got = false;
    self->request(remote_, 10s, original)
      .receive(
        [&](T& back) {
          got = true;
          EXPECT_TRUE(equal(back, original)) << caf::deep_to_string(original);
        },
        [&](caf::error& err) { ADD_FAILURE() << client_->render(err); });
    EXPECT_TRUE(got);
  }

  template <class... Ts>
  void round_trip_all(caf::detail::type_list<Ts...>) {
    (round_trip<Ts>(), ...);
  }

  runtime::system_config server_cfg_;
  runtime::system_config client_cfg_;
  std::unique_ptr<caf::actor_system> server_;
  std::unique_ptr<caf::actor_system> client_;
  caf::actor remote_;
  caf::actor local_echo_;
};

} // namespace

TEST_F(MessageRoundTrip, EveryRegisteredTypeComesBackEqual) {
  round_trip_all(runtime::message_types{});
}

TEST_F(MessageRoundTrip, ErrcErrorsCrossTheConnectionWithCodeAndMessage) {
  caf::scoped_actor self{*client_};
  auto err = make_error(errc::infeasible, "bundle 2 needs GPU: 8");
  // The int32 tag keeps the echoed error a result (a lone error would be an error response).
  self->request(remote_, 10s, err, int32_t{42})
    .receive(
      [&](caf::error& back, int32_t tag) {
        EXPECT_EQ(tag, 42);
        EXPECT_TRUE(is(back, errc::infeasible));
        EXPECT_EQ(error_message(back), "bundle 2 needs GPU: 8");
        EXPECT_EQ(client_->render(back), "rlforge.infeasible: bundle 2 needs GPU: 8");
      },
      [&](caf::error& e) { ADD_FAILURE() << client_->render(e); });
}

// A Tinker tensor whose dtype code is unknown is refused when it is read back, naming the code.
TEST(TinkerTensorWire, ReadingBackRefusesAnUnknownDtypeCode) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  uint8_t bad = 7;
  std::vector<int64_t> shape{1};
  std::vector<double> floats{1.0};
  std::vector<int64_t> ints;
  ASSERT_FALSE(sink(bad, shape, floats, ints));
  rlforge::tinker::tensor_data back;
  caf::binary_deserializer source{nullptr, buf};
  auto err = source(back);
  ASSERT_TRUE(err);
  EXPECT_TRUE(rlforge::is(err, rlforge::errc::decode_error));
  EXPECT_NE(rlforge::error_message(err).find("dtype code 7 is unknown"), std::string::npos)
      << rlforge::error_message(err);
}
