#pragma once

// Shared by the tests/service/server_*_test.cpp suites: a recording tinker_backend, a temporary
// directory and a fixture running an http_server on an ephemeral loopback port.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "actors/tinker_backend.hpp"
#include "service/future_store.hpp"
#include "service/http_server.hpp"
#include "service/tinker_client.hpp"
#include "tests/support/temp_dir.hpp"

namespace rlforge::service::test {

namespace tinker = rlforge::tinker;
using json = nlohmann::json;
using namespace std::chrono_literals;

/// A backend that computes nothing real: it records every call ("create:<id>", "fb:<id>:1,2,3",
/// "fwd:<id>:4", "optim:<id>", "save:<id>", "load:<id>", "snapshot:<id>", "export:<id>",
/// "sample:<sampler>:<n>" with <sampler> "base", "<model id>@<version>" or the checkpoint name,
/// "delete:<id>") in order, answers deterministic results, can hold calls on a gate, and can be
/// told to fail the next call. Snapshot versions count up from 1 per model.
class test_backend : public actors::tinker_backend {
public:
  int64_t vocab = 100; ///< set before the server starts
  static constexpr int64_t context = 64;

  void create_model(const std::string& id, const tinker::lora_config& lora,
                    tinker::model_role role) override {
    enter("create:" + id);
    std::lock_guard<std::mutex> guard(mutex_);
    models_.push_back(id);
  }
  bool has_model(const std::string& id) override {
    std::lock_guard<std::mutex> guard(mutex_);
    return std::find(models_.begin(), models_.end(), id) != models_.end();
  }
  void delete_model(const std::string& id) override {
    enter("delete:" + id);
    std::lock_guard<std::mutex> guard(mutex_);
    models_.erase(std::remove(models_.begin(), models_.end(), id), models_.end());
  }
  std::vector<tinker::forward_backward_output>
  forward_backward(const std::vector<tinker::forward_backward_request>& batch) override {
    std::string call = (batch.front().forward_only ? "fwd:" : "fb:") + batch.front().model_id + ":";
    for (size_t i = 0; i < batch.size(); ++i)
      call += (i ? "," : "") + std::to_string(batch[i].seq_id);
    enter(call);
    std::vector<tinker::forward_backward_output> out;
    for (auto& r : batch) {
      tinker::forward_backward_output o;
      for (auto& d : r.data) {
        tinker::tensor_data t;
        t.shape.push_back(static_cast<int64_t>(d.tokens.size()));
        t.floats.assign(d.tokens.size(), -static_cast<double>(r.seq_id));
        o.loss_fn_outputs.push_back({{"logprobs", t}});
      }
      o.metrics["loss:sum"] = static_cast<double>(r.seq_id);
      out.push_back(std::move(o));
    }
    return out;
  }
  std::map<std::string, double> optim_step(const std::string& id,
                                           const tinker::adam_params& p) override {
    enter("optim:" + id);
    return {{"grad_norm:mean", 0.5}, {"learning_rate:mean", p.learning_rate}};
  }
  int64_t save_sampler_snapshot(const std::string& id) override {
    enter("snapshot:" + id);
    std::lock_guard<std::mutex> guard(mutex_);
    return ++versions_[id];
  }
  void export_sampler_weights(const std::string& id, const tinker::checkpoint_ref& where) override {
    enter("export:" + id);
    std::ofstream(where.dir + "/model.safetensors") << id;
  }
  std::vector<tinker::sample_response>
  sample(const std::vector<tinker::sample_request>& rs) override {
    const auto& ref = rs.front().sampler;
    std::string key = ref.type == tinker::sampler_ref::kind::base ? "base"
                      : ref.type == tinker::sampler_ref::kind::snapshot
                          ? ref.model_id + "@" + std::to_string(ref.version)
                          : ref.name;
    int64_t rows = 0;
    for (auto& r : rs)
      rows += r.num_samples;
    enter("sample:" + key + ":" + std::to_string(rows));
    std::chrono::milliseconds delay;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      delay = sample_delay_;
      for (auto& r : rs)
        prompts_.push_back(r.prompt);
    }
    std::this_thread::sleep_for(delay);
    std::vector<tinker::sample_response> out;
    for (auto& r : rs) {
      tinker::sample_response s;
      // A continuation generates what is left of max_tokens.
      const auto n = r.params.max_tokens - static_cast<int64_t>(r.generated.size());
      for (int64_t i = 0; i < r.num_samples; ++i) {
        // Token j of sample k (counted over the whole request) is prompt[0] + k: slices of one
        // request must come back in sample order.
        auto k = r.first_sample + i;
        s.sequences.push_back(
            {"length", std::vector<int64_t>(n, r.prompt[0] + k), std::vector<double>(n, -0.5)});
      }
      // Top-k rows: at prompt position p, the ids (p + j) % vocab with log-prob -j - 1 (row 0
      // empty, as the engines answer).
      if (r.topk_prompt_logprobs > 0) {
        const auto k = r.topk_prompt_logprobs;
        s.topk = k;
        for (size_t p = 0; p < r.prompt.size(); ++p)
          for (int64_t j = 0; j < k; ++j) {
            s.topk_prompt_ids.push_back(p == 0 ? 0 : (static_cast<int64_t>(p) + j) % vocab);
            s.topk_prompt_logprobs.push_back(p == 0 ? tinker::topk_empty_logprob
                                                    : -static_cast<double>(j) - 1);
          }
      }
      out.push_back(std::move(s));
    }
    return out;
  }
  void save_checkpoint(const std::string& id, const tinker::checkpoint_ref& where, bool) override {
    enter("save:" + id);
    std::ofstream(where.dir + "/state.bin") << "weights of " << id;
  }
  void load_checkpoint(const std::string& id, const tinker::checkpoint_ref& where, bool) override {
    enter("load:" + id);
    if (!std::filesystem::exists(where.dir + "/state.bin"))
      tinker::fail_not_found("no state.bin in " + where.name);
  }
  std::string base_model_name() const override { return "test-base"; }
  std::optional<std::string> tokenizer_id() const override {
    std::lock_guard<std::mutex> guard(mutex_);
    return tokenizer_;
  }
  /// What `tokenizer_id` answers from now on (nullopt at first: no tokenizer).
  void set_tokenizer_id(std::optional<std::string> id) {
    std::lock_guard<std::mutex> guard(mutex_);
    tokenizer_ = std::move(id);
  }
  int64_t max_context_length() const override { return context; }
  int64_t vocab_size() const override { return vocab; }
  /// One engine "base" of 64 blocks, 3 in use; one sync of 1000 bytes and 0.25 s per snapshot.
  actors::backend_stats stats() override {
    actors::backend_stats out;
    out.engines.push_back({"base", 64, 3});
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto& [id, v] : versions_)
      out.syncs += v;
    out.sync_bytes = 1000 * out.syncs;
    out.sync_seconds = 0.25 * static_cast<double>(out.syncs);
    return out;
  }

  /// Calls so far, in order.
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> guard(mutex_);
    return calls_;
  }
  /// Holds every call on entry until `release()`.
  void hold() {
    std::lock_guard<std::mutex> guard(mutex_);
    held_ = true;
  }
  void release() {
    std::lock_guard<std::mutex> guard(mutex_);
    held_ = false;
    cv_.notify_all();
  }
  /// Waits until `n` calls have been entered (held ones included).
  bool wait_entered(size_t n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, 10s, [&] { return calls_.size() >= n; });
  }
  /// The prompt of every sample request so far (slices and chunks each count), in order.
  std::vector<std::vector<int64_t>> prompts() {
    std::lock_guard<std::mutex> guard(mutex_);
    return prompts_;
  }
  /// Every sample call sleeps this long before answering.
  void set_sample_delay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> guard(mutex_);
    sample_delay_ = d;
  }
  /// The next call throws `request_error(category, message)`.
  void fail_next(tinker::error_category category, std::string message) {
    std::lock_guard<std::mutex> guard(mutex_);
    fail_category_ = std::move(category);
    fail_message_ = std::move(message);
  }

private:
  void enter(const std::string& call) {
    std::unique_lock<std::mutex> lock(mutex_);
    calls_.push_back(call);
    cv_.notify_all();
    cv_.wait(lock, [&] { return !held_; });
    if (fail_category_) {
      auto c = *fail_category_;
      auto m = std::move(fail_message_);
      fail_category_.reset();
      throw tinker::request_error(c, m);
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> calls_;
  std::vector<std::string> models_;
  bool held_ = false;
  std::optional<tinker::error_category> fail_category_;
  std::string fail_message_;
  std::map<std::string, int64_t> versions_;
  std::optional<std::string> tokenizer_;
  std::vector<std::vector<int64_t>> prompts_;
  std::chrono::milliseconds sample_delay_{0};
};

/// The tests' one temporary directory (tests/support/temp_dir.hpp).
using ::rlforge::test_support::temp_dir;

constexpr const char* test_key = "test-key-123";

/// Runs an http_server over a test_backend and a store file in a temp dir.
class server_test : public ::testing::Test {
protected:
  temp_dir dir;
  test_backend backend;
  std::unique_ptr<future_store> store;
  std::unique_ptr<http_server> server;
  std::unique_ptr<tinker_client> client;
  server_options opts;

  server_test() {
    opts.api_key = test_key;
    opts.long_poll_hold = 2000ms;
    opts.http_threads = 16;
    opts.scheduler.workers = 2;
    opts.scheduler.gap_timeout = 10s;
  }
  ~server_test() override {
    backend.release();
    server.reset();
  }

  std::string db_path() const { return (dir.path() / "futures.db").string(); }

  void start() {
    opts.checkpoint_dir = (dir.path() / "checkpoints").string();
    if (!store)
      store = future_store::open(db_path());
    server = std::make_unique<http_server>(opts, backend, *store);
    int port = server->start();
    client = std::make_unique<tinker_client>("127.0.0.1", port, test_key);
  }

  /// A session and a model ("<session>:train:0") created through the API.
  std::string make_model() {
    auto session = client->create_session();
    tinker::lora_config lora;
    lora.rank = 4;
    return client->create_model(session, 0, "test-base", lora);
  }

  static tinker::forward_backward_request fb(const std::string& model, int64_t seq,
                                             std::vector<int64_t> tokens = {1, 2, 3}) {
    tinker::forward_backward_request r;
    r.model_id = model;
    r.seq_id = seq;
    r.loss_fn = "cross_entropy";
    tinker::datum d;
    d.tokens = tokens;
    tinker::tensor_data targets;
    targets.type = tinker::dtype::int64;
    targets.shape.push_back(static_cast<int64_t>(tokens.size()));
    targets.ints = tokens;
    tinker::tensor_data weights;
    weights.shape.push_back(static_cast<int64_t>(tokens.size()));
    weights.floats.assign(tokens.size(), 1.0);
    d.loss_fn_inputs["target_tokens"] = targets;
    d.loss_fn_inputs["weights"] = weights;
    r.data.push_back(d);
    return r;
  }

  static json parse(const client_response& r) { return json::parse(r.body); }

  /// Error text of an error answer.
  static std::string error_of(const client_response& r) {
    auto j = json::parse(r.body);
    return j.at("error").get<std::string>();
  }
};

} // namespace rlforge::service::test
