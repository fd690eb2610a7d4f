#include "backends/train/checkpoint.hpp"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/model/model_config.hpp"
#include "backends/train/lr_schedule.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/rng_state.hpp"
#include "test_support.hpp"

using namespace rlforge::backends;
using namespace rlforge::backends::testing;
namespace fs = std::filesystem;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A small linear model's parameters, with gradients, and an optimizer that has stepped once.
struct linear_setup {
  named_parameters params;
  adamw optimizer;
  lr_schedule schedule{lr_schedule_config{lr_schedule_kind::cosine, 1e-2, 2, 20, 0.1}};

  explicit linear_setup(uint64_t seed) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    params = {{"linear.weight", leaf(at::empty({3, 4}).normal_(0, 1, gen))},
              {"linear.bias", leaf(at::empty({3}).normal_(0, 1, gen))}};
    for (auto& [name, p] : params)
      p.mutable_grad() = at::empty_like(p).normal_(0, 1, gen);
    adam_params hp;
    hp.learning_rate = schedule.lr() + 1e-3;
    optimizer.step(params, hp);
    schedule.advance();
  }
};

checkpoint_location location(const std::string& root, int64_t step, int64_t rank = 0,
                             int64_t world_size = 1, const std::string& role = "policy") {
  return checkpoint_location{root, step, role, rank, world_size};
}

void seed_torch(uint64_t seed) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

// One training step of a tiny causal LM on a batch drawn from torch's default generator and a
// std engine (row padding), with the learning rate from the schedule. Returns the loss.
double train_step(causal_lm& model, adamw& opt, lr_schedule& schedule, std::mt19937& engine) {
  const int64_t b = 4, s = 12;
  auto ids = at::randint(0, model.config().vocab_size, {b, s}, at::kLong);
  auto mask = at::ones({b, s}, at::kLong);
  for (int64_t i = 0; i < b; ++i) {
    int64_t pad = std::uniform_int_distribution<int64_t>(0, 4)(engine);
    if (pad > 0) {
      mask[i].narrow(0, 0, pad).zero_();
      ids[i].narrow(0, 0, pad).zero_();
    }
  }
  auto params = model.named_parameters();
  zero_grad(params);
  auto lp = sequence_logprobs(model, ids, mask).logprobs;
  auto target_mask = mask.narrow(1, 1, s - 1).to(at::kFloat);
  auto loss = -(lp * target_mask).sum() / target_mask.sum();
  loss.backward();
  adam_params hp;
  hp.learning_rate = schedule.lr();
  hp.weight_decay = 0.01;
  hp.grad_clip_norm = 1.0;
  opt.step(params, hp);
  schedule.advance();
  return loss.item<double>();
}

lr_schedule tiny_schedule() {
  return lr_schedule(lr_schedule_config{lr_schedule_kind::cosine, 5e-3, 2, 12, 0.1});
}

} // namespace

TEST(Checkpoint, ResumeReproducesLossesBitForBit) {
  temp_dir dir;
  auto config = preset("tiny");
  auto model = causal_lm::random(config, 1);
  adamw opt;
  auto schedule = tiny_schedule();
  std::mt19937 engine(7);
  seed_torch(1234);
  for (int i = 0; i < 3; ++i)
    train_step(*model, opt, schedule, engine);

  auto rng = capture_rng_state();
  save_engine(rng, "batch_padding", engine);
  save_rank_state(location(dir.str(), 3), model->named_parameters(), opt, &schedule, rng);
  finalize_checkpoint(dir.str(), 3, nlohmann::json{{"epoch", 0}, {"consumed_samples", 12}});

  std::vector<double> expected;
  for (int i = 0; i < 3; ++i)
    expected.push_back(train_step(*model, opt, schedule, engine));

  // A different model, a blank optimizer, another schedule position and disturbed RNGs.
  auto fresh = causal_lm::random(config, 99);
  adamw fresh_opt;
  auto fresh_schedule = tiny_schedule();
  std::mt19937 fresh_engine(12345);
  seed_torch(999);
  (void)at::randn({17});
  auto step = latest_step(dir.str());
  ASSERT_TRUE(step.has_value());
  ASSERT_EQ(*step, 3);
  auto restored = restore_rank_state(location(dir.str(), *step), fresh->named_parameters(),
                                     fresh_opt, &fresh_schedule);
  restore_engine(restored, "batch_padding", fresh_engine);
  EXPECT_EQ(fresh_schedule.step(), 3);
  EXPECT_EQ(read_trainer_state(dir.str(), 3).at("consumed_samples"), 12);

  std::vector<double> resumed;
  for (int i = 0; i < 3; ++i)
    resumed.push_back(train_step(*fresh, fresh_opt, fresh_schedule, fresh_engine));
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(resumed[i], expected[i]) << "step " << i;
  auto a = model->named_parameters();
  auto b = fresh->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
}

TEST(Checkpoint, WritesTheDocumentedLayout) {
  temp_dir dir;
  linear_setup s(1);
  auto rng = capture_rng_state();
  for (int64_t rank = 0; rank < 2; ++rank)
    save_rank_state(location(dir.str(), 5, rank, 2), s.params, s.optimizer, &s.schedule, rng);
  save_rank_state(location(dir.str(), 5, 0, 1, "critic"), s.params, s.optimizer, nullptr, rng);
  EXPECT_FALSE(latest_step(dir.str()).has_value()); // nothing committed yet
  finalize_checkpoint(dir.str(), 5, nlohmann::json{{"note", "x"}});

  const fs::path root = dir.str();
  for (const char* file : {"model.safetensors", "optimizer.safetensors", "optimizer.json",
                           "scheduler.json", "rng.safetensors", "meta.json"}) {
    EXPECT_TRUE(fs::exists(root / "global_step_5/policy/rank_0" / file)) << file;
    EXPECT_TRUE(fs::exists(root / "global_step_5/policy/rank_1" / file)) << file;
    EXPECT_TRUE(fs::exists(root / "global_step_5/critic/rank_0" / file)) << file;
  }
  EXPECT_EQ(rank_directory(location(dir.str(), 5, 1, 2)),
            (root / "global_step_5/policy/rank_1").string());
  auto meta = nlohmann::json::parse(read_text((root / "global_step_5/policy/rank_1/meta.json")));
  EXPECT_EQ(meta.at("world_size"), 2);
  EXPECT_EQ(meta.at("rank"), 1);
  EXPECT_EQ(meta.at("role"), "policy");
  EXPECT_EQ(meta.at("global_step"), 5);
  EXPECT_EQ(meta.at("format_version"), checkpoint_format_version);
  EXPECT_EQ(read_text((root / "latest_global_step.txt").string()), "5\n");
  auto trainer = read_trainer_state(dir.str(), 5);
  EXPECT_EQ(trainer.at("note"), "x");
  EXPECT_EQ(trainer.at("global_step"), 5);
  // No temporary files are left behind.
  for (const auto& entry : fs::recursive_directory_iterator(root))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();

  auto loaded = load_rank_state(location(dir.str(), 5, 1, 2));
  ASSERT_EQ(loaded.model.size(), 2u);
  EXPECT_TRUE(at::equal(loaded.model.at("linear.weight"), s.params[0].second));
  EXPECT_EQ(loaded.optimizer.params.at("linear.bias").step, 1);
  EXPECT_TRUE(at::equal(loaded.optimizer.params.at("linear.bias").exp_avg_sq,
                        s.optimizer.state_of("linear.bias")->exp_avg_sq));
  EXPECT_EQ(loaded.optimizer.last_params, s.optimizer.last_params());
  ASSERT_TRUE(loaded.scheduler.has_value());
  EXPECT_EQ(loaded.scheduler->step(), 1);
  EXPECT_EQ(loaded.scheduler->config(), s.schedule.config());
  EXPECT_EQ(loaded.rng.torch_cpu, rng.torch_cpu);
  EXPECT_FALSE(load_rank_state(location(dir.str(), 5, 0, 1, "critic")).scheduler.has_value());

  // A later checkpoint moves the pointer.
  save_rank_state(location(dir.str(), 10), s.params, s.optimizer, nullptr, rng);
  finalize_checkpoint(dir.str(), 10, nlohmann::json::object());
  EXPECT_EQ(latest_step(dir.str()), 10);
}

TEST(Checkpoint, LoadingWithAnotherWorldSizeIsRefused) {
  temp_dir dir;
  linear_setup s(2);
  auto rng = capture_rng_state();
  for (int64_t rank = 0; rank < 2; ++rank)
    save_rank_state(location(dir.str(), 4, rank, 2), s.params, s.optimizer, nullptr, rng);
  auto rank0 = (fs::path(dir.str()) / "global_step_4/policy/rank_0").string();
  expect_error([&] { load_rank_state(location(dir.str(), 4, 0, 1)); }, error_code::invalid_argument,
               {"checkpoint '" + rank0 + "' was saved with world size 2, this group has 1"});
  expect_error([&] { load_rank_state(location(dir.str(), 4, 1, 4)); }, error_code::invalid_argument,
               {"was saved with world size 2, this group has 4"});
  // A rank the saving group did not have.
  save_rank_state(location(dir.str(), 8), s.params, s.optimizer, nullptr, rng);
  expect_error([&] { load_rank_state(location(dir.str(), 8, 1, 2)); }, error_code::invalid_argument,
               {"was saved with world size 1, this group has 2"});
  named_parameters target = {{"linear.weight", leaf(at::zeros({3, 4}))},
                             {"linear.bias", leaf(at::zeros({3}))}};
  adamw opt;
  expect_error([&] { restore_rank_state(location(dir.str(), 4, 0, 1), target, opt, nullptr); },
               error_code::invalid_argument, {"world size 2, this group has 1"});
}

TEST(Checkpoint, MissingOrCorruptFilesNameThePath) {
  temp_dir dir;
  linear_setup s(3);
  auto rng = capture_rng_state();
  auto where = location(dir.str(), 2);
  const fs::path rank_dir = rank_directory(where);
  auto fresh_save = [&] {
    fs::remove_all(dir.str());
    save_rank_state(where, s.params, s.optimizer, &s.schedule, rng);
  };
  auto path_of = [&](const char* file) { return (rank_dir / file).string(); };

  fresh_save();
  fs::remove(path_of("optimizer.safetensors"));
  expect_error([&] { load_rank_state(where); }, error_code::not_found,
               {path_of("optimizer.safetensors")});

  fresh_save();
  write_text(path_of("model.safetensors"), "not a safetensors file at all");
  expect_error([&] { load_rank_state(where); }, error_code::decode_error,
               {path_of("model.safetensors")});

  fresh_save();
  write_text(path_of("meta.json"), "{\"world_size\": ");
  expect_error([&] { load_rank_state(where); }, error_code::decode_error,
               {path_of("meta.json"), "not valid JSON"});

  fresh_save();
  write_text(path_of("meta.json"), R"({"format_version": 99, "world_size": 1, "rank": 0,
                                       "role": "policy", "global_step": 2})");
  expect_error([&] { load_rank_state(where); }, error_code::decode_error, {"format version 99"});

  fresh_save();
  write_text(path_of("meta.json"), R"({"format_version": 1, "world_size": 1, "rank": 0,
                                       "role": "critic", "global_step": 2})");
  expect_error([&] { load_rank_state(where); }, error_code::invalid_argument,
               {path_of("meta.json"), "role 'critic'"});

  fresh_save();
  write_text(path_of("meta.json"), R"({"format_version": 1, "rank": 0})");
  expect_error([&] { load_rank_state(where); }, error_code::decode_error,
               {path_of("meta.json"), "'world_size'"});

  fresh_save();
  write_text(path_of("optimizer.json"), R"({"format_version": 1, "last_params": {}})");
  expect_error([&] { load_rank_state(where); }, error_code::decode_error,
               {path_of("optimizer.json"), "'steps'"});

  fresh_save();
  {
    auto j = nlohmann::json::parse(read_text(path_of("optimizer.json")));
    j["steps"]["linear.extra"] = 1;
    write_text(path_of("optimizer.json"), j.dump());
  }
  expect_error([&] { load_rank_state(where); }, error_code::decode_error,
               {path_of("optimizer.safetensors"), "'linear.extra.exp_avg'"});

  fresh_save();
  {
    auto j = nlohmann::json::parse(read_text(path_of("optimizer.json")));
    j["steps"].erase("linear.bias");
    write_text(path_of("optimizer.json"), j.dump());
  }
  expect_error([&] { load_rank_state(where); }, error_code::decode_error,
               {path_of("optimizer.safetensors"), "2 tensors"});

  fresh_save();
  {
    auto j = nlohmann::json::parse(read_text(path_of("optimizer.json")));
    j["steps"]["linear.bias"] = -4;
    write_text(path_of("optimizer.json"), j.dump());
  }
  expect_error([&] { load_rank_state(where); }, error_code::invalid_argument,
               {path_of("optimizer.json"), "step -4"});

  fresh_save();
  {
    auto j = nlohmann::json::parse(read_text(path_of("optimizer.json")));
    j["last_params"]["beta1"] = "high";
    write_text(path_of("optimizer.json"), j.dump());
  }
  expect_error([&] { load_rank_state(where); }, error_code::decode_error,
               {path_of("optimizer.json"), "'beta1'"});

  fresh_save();
  write_text(path_of("scheduler.json"), R"({"kind": "cosine"})");
  expect_error([&] { load_rank_state(where); }, error_code::decode_error,
               {path_of("scheduler.json"), "'base_lr'"});

  fresh_save();
  fs::remove(path_of("rng.safetensors"));
  expect_error([&] { load_rank_state(where); }, error_code::not_found,
               {path_of("rng.safetensors")});

  fresh_save();
  fs::remove(path_of("meta.json"));
  expect_error([&] { load_rank_state(where); }, error_code::not_found, {path_of("meta.json")});

  expect_error([&] { load_rank_state(location(dir.str(), 77)); }, error_code::not_found,
               {"global_step_77", "meta.json"});
}

TEST(Checkpoint, LatestStepAndTrainerStateReportBadFiles) {
  temp_dir dir;
  const fs::path root = dir.str();
  EXPECT_FALSE(latest_step(dir.str()).has_value());
  auto latest = (root / "latest_global_step.txt").string();
  write_text(latest, "twelve\n");
  expect_error([&] { latest_step(dir.str()); }, error_code::decode_error, {latest, "'twelve\n'"});
  write_text(latest, "-3");
  expect_error([&] { latest_step(dir.str()); }, error_code::decode_error, {latest});
  write_text(latest, "");
  expect_error([&] { latest_step(dir.str()); }, error_code::decode_error, {latest});
  write_text(latest, "12\n");
  expect_error([&] { latest_step(dir.str()); }, error_code::not_found,
               {latest, "step 12", "global_step_12"});
  fs::create_directories(root / "global_step_12");
  EXPECT_EQ(latest_step(dir.str()), 12);

  expect_error([&] { finalize_checkpoint(dir.str(), 13, nlohmann::json::object()); },
               error_code::not_found, {"global_step_13"});
  expect_error([&] { finalize_checkpoint(dir.str(), 12, nlohmann::json::array()); },
               error_code::invalid_argument, {"JSON object", "array"});
  expect_error([&] { finalize_checkpoint(dir.str(), -1, nlohmann::json::object()); },
               error_code::invalid_argument, {"global_step -1"});
  auto state_path = (root / "global_step_12/trainer_state.json").string();
  expect_error([&] { read_trainer_state(dir.str(), 12); }, error_code::not_found, {state_path});
  finalize_checkpoint(dir.str(), 12, nlohmann::json{{"global_step", 5}});
  EXPECT_EQ(read_trainer_state(dir.str(), 12).at("global_step"), 12);
  write_text(state_path, R"({"format_version": 1, "global_step": 11})");
  expect_error([&] { read_trainer_state(dir.str(), 12); }, error_code::decode_error,
               {state_path, "global_step 11", "expected 12"});
  write_text(state_path, "[1, 2");
  expect_error([&] { read_trainer_state(dir.str(), 12); }, error_code::decode_error,
               {state_path, "not valid JSON"});
}

TEST(Checkpoint, RejectsBadLocations) {
  linear_setup s(4);
  auto rng = capture_rng_state();
  auto save = [&](checkpoint_location where) {
    save_rank_state(where, s.params, s.optimizer, nullptr, rng);
  };
  expect_error([&] { save(location("", 1)); }, error_code::invalid_argument, {"root"});
  expect_error([&] { save(location("unused_root", -1)); }, error_code::invalid_argument,
               {"global_step -1"});
  for (const char* role : {"", "..", ".", "a/b"})
    expect_error([&] { save(location("unused_root", 1, 0, 1, role)); },
                 error_code::invalid_argument, {"role '" + std::string(role) + "'"});
  expect_error([&] { save(location("unused_root", 1, 2, 2)); }, error_code::invalid_argument,
               {"rank 2", "[0, 2)"});
  expect_error([&] { save(location("unused_root", 1, -1, 2)); }, error_code::invalid_argument,
               {"rank -1"});
  expect_error([&] { save(location("unused_root", 1, 0, 0)); }, error_code::invalid_argument,
               {"world_size 0"});
  expect_error([&] { load_rank_state(location("unused_root", 1, 3, 2)); },
               error_code::invalid_argument, {"rank 3"});
  temp_dir dir;
  named_parameters dup = {{"w", leaf(at::zeros({2}))}, {"w", leaf(at::zeros({2}))}};
  expect_error([&] { save_rank_state(location(dir.str(), 1), dup, s.optimizer, nullptr, rng); },
               error_code::invalid_argument, {"'w'", "twice"});
  named_parameters undefined = {{"w", at::Tensor()}};
  expect_error(
      [&] { save_rank_state(location(dir.str(), 1), undefined, s.optimizer, nullptr, rng); },
      error_code::invalid_argument, {"'w'", "undefined"});
  // An unwritable root is an I/O error naming the path.
  auto file_root = (fs::path(dir.str()) / "plain_file").string();
  write_text(file_root, "x");
  expect_error([&] { save(location(file_root, 1)); }, error_code::io_error, {file_root});
}

TEST(Checkpoint, LoadParametersChecksNamesShapesAndDtypes) {
  named_parameters params = {{"a", leaf(at::zeros({2, 2}))}, {"b", leaf(at::zeros({3}))}};
  std::map<std::string, at::Tensor> good = {{"a", at::ones({2, 2})}, {"b", at::full({3}, 2.0f)}};
  auto expect_untouched = [&] {
    EXPECT_EQ(params[0].second.abs().sum().item<double>(), 0.0);
    EXPECT_EQ(params[1].second.abs().sum().item<double>(), 0.0);
  };
  auto missing = good;
  missing.erase("b");
  expect_error([&] { load_parameters(params, missing); }, error_code::invalid_argument,
               {"no saved tensor", "'b'"});
  auto extra = good;
  extra["c"] = at::ones({1});
  expect_error([&] { load_parameters(params, extra); }, error_code::invalid_argument,
               {"'c'", "matches no parameter"});
  auto shaped = good;
  shaped["a"] = at::ones({4});
  expect_error([&] { load_parameters(params, shaped); }, error_code::invalid_argument,
               {"'a'", "[4]", "[2, 2]"});
  auto typed = good;
  typed["b"] = at::ones({3}, at::kDouble);
  expect_error([&] { load_parameters(params, typed); }, error_code::invalid_argument,
               {"'b'", "Double", "Float"});
  expect_untouched();
  load_parameters(params, good);
  EXPECT_TRUE(at::equal(params[0].second, good["a"]));
  EXPECT_TRUE(at::equal(params[1].second, good["b"]));
  EXPECT_TRUE(params[0].second.requires_grad());

  // restore_rank_state: asking for a schedule the checkpoint lacks.
  temp_dir dir;
  linear_setup s(5);
  auto rng = capture_rng_state();
  save_rank_state(location(dir.str(), 1), s.params, s.optimizer, nullptr, rng);
  adamw opt;
  auto schedule = tiny_schedule();
  expect_error([&] { restore_rank_state(location(dir.str(), 1), s.params, opt, &schedule); },
               error_code::invalid_argument, {"rank_0", "no learning-rate schedule"});
  // Parameters that do not match the checkpoint: the error names the rank directory.
  expect_error([&] { restore_rank_state(location(dir.str(), 1), params, opt, nullptr); },
               error_code::invalid_argument, {"rank_0", "load_parameters"});
}

TEST(RngState, RestoreReplaysTorchAndStdEngines) {
  seed_torch(42);
  (void)at::rand({5});
  std::mt19937_64 engine(3);
  engine.discard(10);
  auto state = capture_rng_state();
  save_engine(state, "sampler", engine);
  auto torch_first = at::rand({8});
  auto engine_first = engine();
  (void)at::rand({100});
  engine.discard(50);
  restore_rng_state(state);
  restore_engine(state, "sampler", engine);
  EXPECT_TRUE(at::equal(at::rand({8}), torch_first));
  EXPECT_EQ(engine(), engine_first);
}

TEST(RngState, RejectsMissingOrMalformedState) {
  rng_state empty;
  expect_error([&] { restore_rng_state(empty); }, error_code::invalid_argument,
               {"no torch CPU generator state"});
  rng_state short_bytes;
  short_bytes.torch_cpu = {1, 2, 3};
  expect_error([&] { restore_rng_state(short_bytes); }, error_code::invalid_argument, {"3 bytes"});
  std::mt19937 engine;
  expect_error([&] { restore_engine(short_bytes, "data", engine); }, error_code::not_found,
               {"'data'"});
  short_bytes.std_engines["data"] = "not an engine state";
  expect_error([&] { restore_engine(short_bytes, "data", engine); }, error_code::decode_error,
               {"'data'"});
}
