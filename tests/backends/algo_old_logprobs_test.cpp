// The loss option old_logprobs = current (backends/algo/losses.hpp): the old log-probs are
// the trained pass's own, detached, as in one update per batch.
#include "backends/algo/losses.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
using namespace rlforge::backends::algo;

namespace {

at::Tensor gradient(const loss_output& out, const at::Tensor& x) {
  out.loss.backward();
  return x.grad();
}

} // namespace

// Option old_logprobs = current (the on-policy case of one update per batch) computes exactly
// what the same loss computes with the old log-probs given as the current ones, detached: loss,
// per-token losses, metrics and gradient; with and without the off-policy correction.
TEST(AlgoOldLogprobs, CurrentEqualsTheCurrentLogprobsGivenAsOld) {
  const auto values_of = t2({{-0.5, -1.5, -0.2}, {-2.0, -0.1, -0.9}});
  const std::set<std::string> with_option = {"importance_sampling", "regular", "dual_clip",
                                             "gspo",    "sapo",    "cispo",    "clip_cov",
                                             "kl_cov",  "dro"};
  for (const auto& name : policy_loss_names()) {
    auto opts = loss_option_keys(name);
    const bool has = std::find(opts.begin(), opts.end(), "old_logprobs") != opts.end();
    EXPECT_EQ(has, with_option.count(name) > 0) << name;
  }
  for (const bool off_policy : {false, true}) {
    for (const auto& name : with_option) {
      auto fill = [&](loss_inputs& in, const at::Tensor& logp) {
        in.logprobs = logp;
        in.advantages = t2({{1.0, -2.0, 0.5}, {-1.0, 3.0, 2.0}});
        in.loss_mask = t2({{1, 1, 0}, {1, 1, 1}});
        if (off_policy)
          in.rollout_logprobs = t2({{-0.7, -1.0, -0.2}, {-2.5, -0.1, -0.3}});
      };
      loss_config given_cfg;
      if (name == "dro")
        given_cfg.values["beta"] = 0.5;
      if (off_policy && name != "importance_sampling" && name != "clip_cov" &&
          name != "kl_cov" && name != "dro")
        given_cfg.options["tis_ratio_type"] = "token";
      loss_config current_cfg = given_cfg;
      current_cfg.options["old_logprobs"] = "current";

      auto logp_a = values_of.clone().requires_grad_(true);
      loss_inputs a;
      fill(a, logp_a);
      a.old_logprobs = values_of.clone();
      auto given = compute_loss(name, a, given_cfg);
      auto grad_given = gradient(given, logp_a);

      auto logp_b = values_of.clone().requires_grad_(true);
      loss_inputs b;
      fill(b, logp_b);
      auto current = compute_loss(name, b, current_cfg);
      auto grad_current = gradient(current, logp_b);

      const auto what = name + (off_policy ? " with rollout log-probs" : "");
      EXPECT_EQ(given.loss.item<double>(), current.loss.item<double>()) << what;
      EXPECT_TRUE(at::equal(given.elementwise, current.elementwise)) << what;
      EXPECT_TRUE(at::equal(grad_given, grad_current)) << what;
      EXPECT_EQ(given.metrics, current.metrics) << what;
    }
  }
}

TEST(AlgoOldLogprobs, CurrentRefusesWhatItWouldIgnoreOrContradict) {
  loss_inputs in;
  in.logprobs = t2({{-1.0, -1.0}});
  in.old_logprobs = t2({{-1.0, -1.0}});
  in.advantages = t2({{1.0, 1.0}});
  loss_config current;
  current.options["old_logprobs"] = "current";
  // Both the option and the input: which one is meant is unclear.
  expect_error([&] { compute_loss("regular", in, current); },
               {"'old_logprobs'", "current", "absent"});
  expect_error([&] { check_loss_inputs("regular", in, current); }, {"'old_logprobs'", "absent"});
  // A loss that reads no old log-probs does not take the option.
  in.old_logprobs = at::Tensor();
  expect_error([&] { compute_loss("cross_entropy", in, current); },
               {"'old_logprobs'", "cross_entropy"});
  expect_error([&] { compute_loss("rollout_is", in, current); }, {"'old_logprobs'", "rollout_is"});
  // Nor does cispo anchored on the rollout.
  in.rollout_logprobs = t2({{-1.0, -1.0}});
  loss_config anchored = current;
  anchored.options["cispo_anchor"] = "rollout";
  expect_error([&] { compute_loss("cispo", in, anchored); }, {"cispo_anchor", "old_logprobs"});
  // Values other than given / current are named.
  loss_config odd;
  odd.options["old_logprobs"] = "previous";
  expect_error([&] { validate_loss_config("regular", odd); }, {"previous", "given", "current"});
  // Without the option (or with `given`) the input stays required.
  in.rollout_logprobs = at::Tensor();
  loss_config given;
  given.options["old_logprobs"] = "given";
  expect_error([&] { compute_loss("regular", in, given); }, {"missing input 'old_logprobs'"});
  EXPECT_NO_THROW(compute_loss("regular", in, current));
}
