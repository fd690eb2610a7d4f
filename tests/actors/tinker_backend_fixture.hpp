#pragma once

// Shared by the tests of the Tinker backend (dispatcher_backend_test.cpp,
// tinker_sampling_test.cpp): datum and request builders and a fixture holding a backend on a
// tiny random base model.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include "actors/base_weights.hpp"
#include "actors/dispatcher.hpp"
#include "actors/dispatcher_backend.hpp"
#include "actors/engine.hpp"
#include "actors/placement_manager.hpp"
#include "actors/protocol.hpp"
#include "actors/worker.hpp"
#include "backends/algo/losses.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "runtime/errc.hpp"
#include "runtime/system_config.hpp"
#include "test_support.hpp"

namespace rlforge::actors::test {

namespace be = rlforge::backends;
namespace algo = rlforge::backends::algo;
namespace tk = rlforge::tinker;
namespace fs = std::filesystem;

inline tk::tensor_data ints(std::vector<int64_t> v) {
  tk::tensor_data t;
  t.type = tk::dtype::int64;
  t.shape = {static_cast<int64_t>(v.size())};
  t.ints = std::move(v);
  return t;
}

inline tk::tensor_data floats(std::vector<double> v) {
  tk::tensor_data t;
  t.type = tk::dtype::float32;
  t.shape = {static_cast<int64_t>(v.size())};
  t.floats = std::move(v);
  return t;
}

/// A datum predicting `seq[1:]` from `seq[:-1]` with unit weights.
inline tk::datum next_tokens(const std::vector<int64_t>& seq) {
  tk::datum d;
  d.tokens.assign(seq.begin(), seq.end() - 1);
  d.loss_fn_inputs["target_tokens"] = ints({seq.begin() + 1, seq.end()});
  d.loss_fn_inputs["weights"] = floats(std::vector<double>(seq.size() - 1, 1.0));
  return d;
}

inline tk::forward_backward_request request(const std::string& model, std::vector<tk::datum> data,
                                            const std::string& loss = "cross_entropy",
                                            std::map<std::string, double> config = {},
                                            bool forward_only = false) {
  tk::forward_backward_request r;
  r.model_id = model;
  r.data = std::move(data);
  r.loss_fn = loss;
  r.loss_fn_config = std::move(config);
  r.forward_only = forward_only;
  return r;
}

inline std::vector<tk::datum> sft_data() {
  return {next_tokens({1, 5, 9, 13, 17, 21}), next_tokens({2, 4, 6, 8, 10}),
          next_tokens({3, 30, 300, 3, 30, 300, 3})};
}

inline tk::lora_config lora(int64_t rank, int64_t seed = 1) {
  tk::lora_config l;
  l.rank = rank;
  l.has_seed = true;
  l.seed = seed;
  return l;
}

constexpr auto user = tk::error_category::user;
constexpr auto not_found = tk::error_category::not_found;
constexpr auto server = tk::error_category::server;
constexpr auto policy = tk::model_role::policy;
constexpr auto critic = tk::model_role::critic;

/// Runs `f` and expects a request_error of `category` whose message contains `part`.
template <class F> void expect_refused(F f, tk::error_category category, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "expected a " << tk::to_string(category) << " error containing '" << part
                  << "'";
  } catch (const tk::request_error& e) {
    EXPECT_EQ(e.category(), category) << e.what();
    EXPECT_NE(std::string{e.what()}.find(part), std::string::npos) << e.what();
  }
}

/// `r` on the weights `ref` names.
inline tk::sample_request on(tk::sample_request r, tk::sampler_ref ref) {
  r.sampler = std::move(ref);
  return r;
}

/// The base model; model `m`'s snapshot `v`; the persisted export in `dir`.
inline tk::sampler_ref base_ref() {
  return {};
}
inline tk::sampler_ref snapshot_ref(const std::string& m, int64_t v) {
  tk::sampler_ref r;
  r.type = tk::sampler_ref::kind::snapshot;
  r.model_id = m;
  r.version = v;
  r.name = "sampler " + m + "@" + std::to_string(v);
  return r;
}
inline tk::sampler_ref checkpoint_ref(const std::string& dir, const std::string& name) {
  tk::sampler_ref r;
  r.type = tk::sampler_ref::kind::checkpoint;
  r.dir = dir;
  r.name = name;
  return r;
}

/// Forward log-probs of `prompt + tokens`: (prompt log-probs after position 0, token log-probs).
inline std::pair<std::vector<double>, std::vector<double>>
split_logprobs(const std::vector<double>& all, size_t prompt) {
  return {{all.begin(), all.begin() + static_cast<long>(prompt - 1)},
          {all.begin() + static_cast<long>(prompt - 1), all.end()}};
}

class DispatcherBackend : public ::testing::Test {
protected:
  void SetUp() override {
    register_worker_kinds();
    register_engine_kind();
    ASSERT_FALSE(cfg_.parse_args({}));
    sys_ = std::make_unique<caf::actor_system>(cfg_);
    base_ = (fs::path(dir_.path()) / "tiny-base").string();
    be::causal_lm::random(be::preset("tiny"), 7)->save_hf(base_);
    dispatcher_backend_options o;
    o.base_model_dir = base_;
    o.timeout = std::chrono::seconds(60);
    backend_ = std::make_unique<dispatcher_backend>(*sys_, o);
  }
  void TearDown() override {
    backend_.reset();
    sys_.reset();
  }

  /// Per datum log-probs of a forward pass.
  std::vector<std::vector<double>> logprobs(const std::string& model,
                                            const std::vector<tk::datum>& data) {
    auto out = backend_->forward_backward({request(model, data, "cross_entropy", {}, true)});
    std::vector<std::vector<double>> rows;
    for (auto& m : out.at(0).loss_fn_outputs)
      rows.push_back(m.at("logprobs").floats);
    return rows;
  }

  double sft_step(const std::string& model, double lr = 2e-3) {
    auto out = backend_->forward_backward({request(model, sft_data())});
    tk::adam_params p;
    p.learning_rate = lr;
    backend_->optim_step(model, p);
    return out.at(0).metrics.at("loss:sum");
  }

  std::string path(const std::string& name) const {
    return (fs::path(dir_.path()) / name).string();
  }

  /// A checkpoint location under the test directory, named as the service would name it.
  tk::checkpoint_ref where(const std::string& name) const {
    return {path(name), "tinker://m/weights/" + name};
  }

  /// One sample request's response.
  tk::sample_response sample_one(const tk::sample_request& r) {
    return backend_->sample({r}).at(0);
  }

  runtime::system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  temp_dir dir_{"tinker_backend"};
  std::string base_;
  std::unique_ptr<dispatcher_backend> backend_;
};

} // namespace rlforge::actors::test
