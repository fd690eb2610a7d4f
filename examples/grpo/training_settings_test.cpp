#include "examples/grpo/training_settings.hpp"

#include <gtest/gtest.h>

using namespace rlforge::examples::grpo;

TEST(TrainingSettings, TheTrainerComputesLogprobsAtTheSamplingTemperature) {
  auto r =
      parse_options({"--temperature", "0.7", "--kl-coef", "0.01", "--micro-batch-tokens", "512"});
  ASSERT_TRUE(r.error.empty()) << r.error;
  const auto cfg = training_config(r.opts);
  EXPECT_DOUBLE_EQ(cfg.temperature, 0.7);
  EXPECT_TRUE(cfg.use_kl_loss);
  EXPECT_DOUBLE_EQ(cfg.kl_loss_coef, 0.01);
  EXPECT_EQ(cfg.max_tokens_per_micro_batch, 512);
  // The job's default temperature, and no KL term on the long-response tasks.
  EXPECT_DOUBLE_EQ(training_config(options{}).temperature, options{}.temperature);
  const auto count = training_config(parse_options({"--task", "count"}).opts);
  EXPECT_FALSE(count.use_kl_loss);
  EXPECT_DOUBLE_EQ(count.temperature, options{}.temperature);
}

TEST(TrainingSettings, TheLearningRateDecaysFromLrToATenthOfIt) {
  options o;
  o.lr = 1e-3;
  o.steps = 5;
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 1e-3);
  EXPECT_NEAR(learning_rate(o, 3), 0.55e-3, 1e-15); // halfway: the mean of both ends
  EXPECT_NEAR(learning_rate(o, 5), 1e-4, 1e-15);
  EXPECT_GT(learning_rate(o, 2), learning_rate(o, 3));
  o.steps = 1;
  EXPECT_DOUBLE_EQ(learning_rate(o, 1), 1e-3);
}
