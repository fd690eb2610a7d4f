// `rlforge serve` end to end: a real process on a tiny random Llama, driven over loopback HTTP as
// the Tinker SDK drives it (session, LoRA model, forward_backward, optim_step, saves, sampling),
// then stopped with SIGTERM. Usage: serve_e2e_test <path of the rlforge binary>.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "service/tinker_client.hpp"
#include "service/wire/forward_backward_codec.hpp"
#include "service/wire/json_bodies.hpp"
#include "service/wire/sample_codec.hpp"

#include "tests/cli/serve_process.hpp"
#include "tests/runtime/prometheus_parse.hpp"

namespace {

using rlforge::cli_test::serve_process;

namespace fs = std::filesystem;
namespace tinker = rlforge::tinker;
using rlforge::service::tinker_client;

std::string rlforge_bin;

/// Runs argv to completion; returns its exit status (-1 when it could not run).
int run(std::vector<std::string> argv) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> args;
    for (auto& a : argv)
      args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0)
    return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

tinker::forward_backward_request sft_request(const std::string& model, int64_t seq) {
  tinker::forward_backward_request r;
  r.model_id = model;
  r.seq_id = seq;
  r.loss_fn = "cross_entropy";
  for (int row = 0; row < 2; ++row) {
    tinker::datum d;
    d.tokens = {1, 17, 42, 99, 100 + row};
    tinker::tensor_data targets;
    targets.type = tinker::dtype::int64;
    targets.shape.push_back(5);
    targets.ints = {17, 42, 99, 100 + row, 2};
    tinker::tensor_data weights;
    weights.shape.push_back(5);
    weights.floats = {0, 1, 1, 1, 1};
    d.loss_fn_inputs["target_tokens"] = targets;
    d.loss_fn_inputs["weights"] = weights;
    r.data.push_back(d);
  }
  return r;
}

TEST(ServeEndToEnd, TrainsSavesAndSamplesThroughHttp) {
  ASSERT_FALSE(rlforge_bin.empty()) << "usage: serve_e2e_test <rlforge binary>";
  char tmpl[] = "/tmp/rlforge-serve-e2e-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  fs::path dir = tmpl;
  ASSERT_EQ(run({rlforge_bin, "init-model", "--preset", "tiny", "--out", (dir / "base").string()}),
            0);
  {
    serve_process serve(rlforge_bin, dir, "e2e-key");
    ASSERT_GT(serve.port(), 0) << serve.output();
    tinker_client client("127.0.0.1", serve.port(), "e2e-key");
    tinker_client wrong("127.0.0.1", serve.port(), "nope");
    EXPECT_EQ(wrong.get("get_server_capabilities").status, 401);
    auto caps = client.get("get_server_capabilities");
    ASSERT_EQ(caps.status, 200) << caps.body;
    EXPECT_NE(caps.body.find("\"max_context_length\":512"), std::string::npos) << caps.body;

    auto session = client.create_session();
    tinker::lora_config lora;
    lora.rank = 4;
    auto model = client.create_model(session, 0, "base", lora);
    auto first = client.forward_backward(sft_request(model, 1));
    ASSERT_EQ(first.loss_fn_outputs.size(), 2u);
    EXPECT_EQ(first.loss_fn_outputs[0].at("logprobs").floats.size(), 5u);
    double loss0 = first.metrics.at("loss:sum");
    EXPECT_GT(loss0, 0);
    tinker::adam_params p;
    p.learning_rate = 1e-2;
    client.optim_step(model, 2, p);
    auto second = client.forward_backward(sft_request(model, 3));
    EXPECT_LT(second.metrics.at("loss:sum"), loss0); // one step on the same batch lowers it
    client.optim_step(model, 4, p);
    auto state = client.save_weights(model, 5, "step4");
    EXPECT_EQ(state, "tinker://" + model + "/weights/step4");
    client.load_weights(model, 6, state, true);
    auto sampler = client.save_weights_for_sampler(model, 7, "s4");
    auto sid = client.create_sampling_session(session, 0, sampler, "");
    auto out = client.sample(sid, 0, {1, 17, 42}, 2, 4);
    ASSERT_EQ(out.sequences.size(), 2u);
    double generated = 0;
    for (auto& s : out.sequences) {
      EXPECT_FALSE(s.tokens.empty());
      EXPECT_EQ(s.tokens.size(), s.logprobs.size());
      generated += static_cast<double>(s.tokens.size());
    }
    // An ephemeral sampler is a snapshot: one weight sync to the model's engine.
    auto eph = client.post("save_weights_for_sampler",
                           "{\"model_id\":\"" + model +
                               "\",\"seq_id\":8,\"sampling_session_seq_id\":1}");
    ASSERT_EQ(eph.status, 200) << eph.body;
    ASSERT_EQ(client.wait_future(tinker_client::request_id_of(eph), false).status, 200);
    // GET /metrics: what the real backend did, in Prometheus text.
    auto m = client.get_url("http://127.0.0.1:" + std::to_string(serve.port()) + "/metrics",
                            {{"Authorization", "Bearer e2e-key"}});
    ASSERT_EQ(m.status, 200) << m.body;
    auto scrape = rlforge::test::parse_prometheus(m.body);
    ASSERT_TRUE(scrape.error.empty()) << scrape.error << "\n" << m.body;
    EXPECT_EQ(scrape.value("rlforge_tokens_total{kind=\"generated\"}"), generated);
    EXPECT_EQ(scrape.value("rlforge_tokens_total{kind=\"trained\"}"), 2 * 2 * 5.0) << m.body;
    EXPECT_EQ(scrape.value("rlforge_weight_syncs_total"), 1) << m.body;
    EXPECT_GT(scrape.value("rlforge_weight_sync_bytes_total"), 1e5) << m.body;
    EXPECT_GT(scrape.value("rlforge_weight_sync_seconds_total"), 0) << m.body;
    EXPECT_GT(scrape.value("rlforge_engine_kv_blocks{engine=\"checkpoint:s4\"}"), 0) << m.body;
    EXPECT_GT(scrape.value("rlforge_engine_kv_blocks{engine=\"model:" + model + "\"}"), 0)
        << m.body;
    EXPECT_EQ(scrape.value("rlforge_engine_kv_blocks_in_use{engine=\"model:" + model + "\"}"), 0)
        << m.body;
    EXPECT_EQ(serve.stop(), 0) << serve.output();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

tinker::tensor_data floats(std::vector<double> v) {
  tinker::tensor_data t;
  t.shape.push_back(static_cast<int64_t>(v.size()));
  t.floats = std::move(v);
  return t;
}

tinker::tensor_data ints(std::vector<int64_t> v) {
  tinker::tensor_data t;
  t.type = tinker::dtype::int64;
  t.shape.push_back(static_cast<int64_t>(v.size()));
  t.ints = std::move(v);
  return t;
}

/// RL datums as the Tinker cookbook builds them from sampled sequences: input = prompt +
/// completion[:-1], targets shifted by one, the sampler's log-probs and the advantage on the
/// completion's positions (0 on the prompt's).
std::vector<tinker::datum> rl_datums(const std::vector<int64_t>& prompt,
                                     const tinker::sample_response& out) {
  std::vector<tinker::datum> data;
  for (size_t i = 0; i < out.sequences.size(); ++i) {
    const auto& s = out.sequences[i];
    tinker::datum d;
    d.tokens = prompt;
    d.tokens.insert(d.tokens.end(), s.tokens.begin(), s.tokens.end() - 1);
    std::vector<int64_t> targets(prompt.begin() + 1, prompt.end());
    targets.insert(targets.end(), s.tokens.begin(), s.tokens.end());
    std::vector<double> lp(prompt.size() - 1, 0.0), adv(prompt.size() - 1, 0.0);
    lp.insert(lp.end(), s.logprobs.begin(), s.logprobs.end());
    adv.insert(adv.end(), s.tokens.size(), i % 2 == 0 ? 1.0 : -1.0);
    d.loss_fn_inputs["target_tokens"] = ints(targets);
    d.loss_fn_inputs["logprobs"] = floats(lp);
    d.loss_fn_inputs["advantages"] = floats(adv);
    data.push_back(std::move(d));
  }
  return data;
}

TEST(ServeEndToEnd, RlWithEveryTinkerLossAndACriticThroughHttp) {
  ASSERT_FALSE(rlforge_bin.empty()) << "usage: serve_e2e_test <rlforge binary>";
  char tmpl[] = "/tmp/rlforge-serve-rl-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  fs::path dir = tmpl;
  ASSERT_EQ(run({rlforge_bin, "init-model", "--preset", "tiny", "--out", (dir / "base").string()}),
            0);
  {
    serve_process serve(rlforge_bin, dir, "rl-key");
    ASSERT_GT(serve.port(), 0) << serve.output();
    tinker_client client("127.0.0.1", serve.port(), "rl-key");
    auto session = client.create_session();
    tinker::lora_config lora;
    lora.rank = 4;
    auto policy = client.create_model(session, 0, "base", lora);

    // Rollouts from the base model; a fresh LoRA policy (B = 0) computes the same function.
    const std::vector<int64_t> prompt{1, 17, 42, 99};
    auto base = client.create_sampling_session(session, 0, "", "base");
    auto rollouts = client.sample(base, 0, prompt, 4, 6);
    ASSERT_EQ(rollouts.sequences.size(), 4u);
    auto data = rl_datums(prompt, rollouts);

    int64_t seq = 1;
    tinker::adam_params adam;
    adam.learning_rate = 1e-2;
    const std::vector<std::pair<std::string, std::map<std::string, double>>> losses{
        {"importance_sampling", {}},
        {"ppo", {{"clip_low_threshold", 0.8}, {"clip_high_threshold", 1.2}}},
        {"cispo", {{"clip_low_threshold", 0.8}, {"clip_high_threshold", 1.2}}},
        {"dro", {{"beta", 0.1}}},
    };
    for (size_t k = 0; k < losses.size(); ++k) {
      tinker::forward_backward_request r;
      r.model_id = policy;
      r.seq_id = seq++;
      r.loss_fn = losses[k].first;
      r.loss_fn_config = losses[k].second;
      r.data = data;
      auto out = client.forward_backward(r);
      ASSERT_EQ(out.loss_fn_outputs.size(), data.size()) << r.loss_fn;
      EXPECT_TRUE(std::isfinite(out.metrics.at("loss:sum"))) << r.loss_fn;
      for (size_t i = 0; i < data.size(); ++i) {
        const auto& lp = out.loss_fn_outputs[i].at("logprobs").floats;
        ASSERT_EQ(lp.size(), data[i].tokens.size()) << r.loss_fn;
        if (k != 0)
          continue;
        // Before any step the trainer's log-probs are the sampler's.
        for (size_t t = prompt.size() - 1; t < lp.size(); ++t) {
          EXPECT_NEAR(lp[t], data[i].loss_fn_inputs.at("logprobs").floats[t], 1e-4)
              << "datum " << i << " position " << t;
        }
      }
      client.optim_step(policy, seq++, adam);
    }
    // An unknown config key is refused by the backend (its one check against the model), naming
    // it: the future fails as the user's; the model keeps serving.
    tinker::forward_backward_request bad;
    bad.model_id = policy;
    bad.seq_id = seq++;
    bad.loss_fn = "ppo";
    bad.loss_fn_config = {{"clip_ratio", 0.2}};
    bad.data = data;
    auto submitted = client.post("forward_backward",
                                 rlforge::service::encode_forward_backward_request_proto(bad),
                                 "application/x-protobuf");
    ASSERT_EQ(submitted.status, 200) << submitted.body;
    auto refused = client.wait_future(tinker_client::request_id_of(submitted), false);
    EXPECT_NE(refused.body.find("\"category\":\"user\""), std::string::npos) << refused.body;
    EXPECT_NE(refused.body.find("clip_ratio"), std::string::npos) << refused.body;

    // A critic on the same base: create_model with model_role "critic", trained with ppo_critic.
    auto created =
        client.post("create_model", "{\"session_id\":\"" + session +
                                        "\",\"model_seq_id\":1,"
                                        "\"base_model\":\"base\",\"lora_config\":{\"rank\":4},"
                                        "\"model_role\":\"critic\",\"type\":\"create_model\"}");
    ASSERT_EQ(created.status, 200) << created.body;
    auto answer = client.wait_future(tinker_client::request_id_of(created), false);
    auto at = answer.body.find("\"model_id\":\"");
    ASSERT_NE(at, std::string::npos) << answer.body;
    auto critic = answer.body.substr(at + 12, answer.body.find('"', at + 12) - at - 12);
    std::vector<double> first_loss;
    for (int64_t step = 0; step < 3; ++step) {
      tinker::forward_backward_request r;
      r.model_id = critic;
      r.seq_id = 2 * step + 1;
      r.loss_fn = "ppo_critic";
      for (auto d : data) {
        std::vector<double> returns(d.tokens.size(), 0.5);
        d.loss_fn_inputs.erase("logprobs");
        d.loss_fn_inputs.erase("advantages");
        d.loss_fn_inputs["returns"] = floats(returns);
        d.loss_fn_inputs["values"] = floats(std::vector<double>(d.tokens.size(), 0.0));
        r.data.push_back(std::move(d));
      }
      auto out = client.forward_backward(r);
      ASSERT_EQ(out.loss_fn_outputs.size(), data.size());
      EXPECT_EQ(out.loss_fn_outputs[0].at("values").floats.size(), data[0].tokens.size());
      first_loss.push_back(out.metrics.at("loss:sum"));
      client.optim_step(critic, 2 * step + 2, adam);
    }
    EXPECT_LT(first_loss.back(), first_loss.front()); // the values move toward the returns
    // A policy loss on the critic is refused.
    tinker::forward_backward_request wrong;
    wrong.model_id = critic;
    wrong.seq_id = 7;
    wrong.loss_fn = "importance_sampling";
    wrong.data = data;
    auto no = client.post("forward_backward",
                          rlforge::service::encode_forward_backward_request_proto(wrong),
                          "application/x-protobuf");
    if (no.status == 200) {
      auto failed = client.wait_future(tinker_client::request_id_of(no), false);
      EXPECT_NE(failed.body.find("\"error\""), std::string::npos) << failed.body;
    } else {
      EXPECT_EQ(no.status, 400) << no.body;
    }

    // The RL-trained policy: save its state, load it without and with optimizer.
    auto state = client.save_weights(policy, seq++, "rl");
    client.load_weights(policy, seq++, state, false);
    client.load_weights(policy, seq++, state, true);
    EXPECT_EQ(serve.stop(), 0) << serve.output();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

} // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1)
    rlforge_bin = argv[1];
  return RUN_ALL_TESTS();
}
