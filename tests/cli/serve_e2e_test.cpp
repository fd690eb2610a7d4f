// `rlforge serve` end to end: a real process on a tiny random Llama, driven over loopback HTTP as
// the Tinker SDK drives it (session, LoRA model, forward_backward, optim_step, saves, sampling),
// then stopped with SIGTERM. Usage: serve_e2e_test <path of the rlforge binary>.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
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

namespace {

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

/// `rlforge serve` as a child process; its stderr is read until it names its port.
class serve_process {
public:
  serve_process(const fs::path& dir, const std::string& key) {
    int fds[2];
    if (pipe(fds) != 0)
      throw std::runtime_error("pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      setenv("RLFORGE_API_KEY", key.c_str(), 1);
      setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
      std::string base = (dir / "base").string(), db = (dir / "serve.db").string(),
                  ck = (dir / "checkpoints").string();
      execl(rlforge_bin.c_str(), rlforge_bin.c_str(), "serve", "--base-model", base.c_str(),
            "--port", "0", "--db", db.c_str(), "--checkpoint-dir", ck.c_str(), nullptr);
      _exit(127);
    }
    close(fds[1]);
    err_ = fds[0];
    // "rlforge serve: <model> on http://127.0.0.1:<port>/api/v1/ ..."
    std::string text;
    char buf[4096];
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (std::chrono::steady_clock::now() < deadline) {
      ssize_t n = read(err_, buf, sizeof(buf));
      if (n <= 0)
        break;
      text.append(buf, static_cast<size_t>(n));
      auto at = text.find("http://127.0.0.1:");
      if (at != std::string::npos && text.find('/', at + 17) != std::string::npos) {
        port_ = std::atoi(text.c_str() + at + 17);
        break;
      }
    }
    output_ = text;
    // Keep draining stderr so the server never blocks on a full pipe.
    drain_ = std::thread([this] {
      char b[4096];
      ssize_t n;
      while ((n = read(err_, b, sizeof(b))) > 0) {
        std::lock_guard<std::mutex> guard(mutex_);
        output_.append(b, static_cast<size_t>(n));
      }
    });
  }
  ~serve_process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (drain_.joinable())
      drain_.join(); // the child is gone: read() returns 0
    if (err_ >= 0)
      close(err_);
  }
  int port() const { return port_; }
  std::string output() {
    std::lock_guard<std::mutex> guard(mutex_);
    return output_;
  }

  /// SIGTERM, then the exit status (-1 when it did not exit normally within 60 s).
  int stop() {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 600; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }

private:
  pid_t pid_ = -1;
  int err_ = -1;
  int port_ = 0;
  std::mutex mutex_;
  std::string output_;
  std::thread drain_;
};

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
    serve_process serve(dir, "e2e-key");
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
    for (auto& s : out.sequences) {
      EXPECT_FALSE(s.tokens.empty());
      EXPECT_EQ(s.tokens.size(), s.logprobs.size());
    }
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
