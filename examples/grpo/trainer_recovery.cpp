// The GRPO job's trainer replaced in place (trainer_recovery.hpp).
#include "examples/grpo/trainer_recovery.hpp"

#include <filesystem>
#include <optional>

#include <caf/all.hpp>

#include "actors/rank_actor.hpp"
#include "backends/train/checkpoint.hpp"
#include "runtime/errc.hpp"

#include "../common/driver.hpp"
#include "examples/grpo/group_replacement.hpp"
#include "examples/grpo/policy_update.hpp"

namespace rlforge::examples::grpo {

std::string ref_model_dir(const options& opt) {
  return (std::filesystem::path(opt.checkpoint_dir) / "ref_model").string();
}

model_spec from_directory(model_spec base, const std::string& dir) {
  base.hf_dir = dir;
  base.config_json.clear();
  base.preset.clear();
  return base;
}

trainer_recovery::trainer_recovery(const fatal_errors& or_die, actors::trainer_client& client,
                                   actors::placement_client& pgs, caf::actor manager,
                                   actors::actor_group& policy, actors::actor_group& ref,
                                   model_spec model, const options& opt, restart_budget& budget)
    : or_die_(or_die), client_(client), pgs_(pgs), manager_(std::move(manager)), policy_(policy),
      ref_(ref), model_(std::move(model)), opt_(opt), budget_(budget) {
}

bool trainer_recovery::trainer_lost(std::chrono::milliseconds patience) {
  return !policy_.call_all(actors::rank_ops::ping, patience) ||
         !ref_.call_all(actors::rank_ops::ping, patience);
}

caf::expected<trainer_recovery::replaced> trainer_recovery::replace() {
  ++budget_.used;
  auto& sys = or_die_.sys;
  auto failed = [&](const std::string& doing, const caf::error& err) {
    return make_error(errc::rank_failed, "trainer recovery: " + doing + ": " + sys.render(err));
  };
  std::optional<int64_t> step;
  if (opt_.checkpoint_every > 0) {
    try {
      step = backends::latest_step(opt_.checkpoint_dir);
    } catch (const std::exception& e) {
      return make_error(errc::not_found, std::string{"trainer recovery: "} + e.what());
    }
  }
  if (!step)
    return make_error(errc::not_found,
                      "trainer recovery: no committed checkpoint to roll the trainer back to "
                      "(--checkpoint-every N --checkpoint-dir DIR write them)");
  policy_.stop();
  ref_.stop();
  auto placed = replace_groups(
      or_die_, pgs_, split_layout::training, split_layout::bundle(),
      [&](const placement_group_info& pg) {
        return std::vector<actors::group_spec>{
            role_group_spec(manager_, pg, "policy", "policy", true, split_layout::trainer_gpu_per_rank),
            role_group_spec(manager_, pg, "ref", "ref", true, split_layout::trainer_gpu_per_rank)};
      },
      opt_.recovery_timeout, "trainer recovery: no policy and reference");
  if (!placed)
    return std::move(placed.error());
  policy_ = placed->groups.at(0);
  ref_ = placed->groups.at(1);
  if (auto n = client_.register_group("policy", policy_); !n)
    return failed("registering the policy", n.error());
  if (auto n = client_.register_group("ref", ref_); !n)
    return failed("registering the reference", n.error());
  if (auto n = client_.init_model("policy", model_); !n)
    return failed("initializing the policy", n.error());
  auto ref_model = from_directory(model_, ref_model_dir(opt_));
  if (auto n = client_.init_model("ref", ref_model); !n)
    return failed("initializing the reference from " + ref_model.hf_dir, n.error());
  auto loaded = client_.load_checkpoint(opt_.checkpoint_dir, *step, {"policy"});
  if (!loaded)
    return failed("loading the checkpoint of step " + std::to_string(*step), loaded.error());
  if (auto n = configure_training(client_, opt_); !n)
    return failed("configuring the policy and the reference", n.error());
  return replaced{placed->node, *step};
}

} // namespace rlforge::examples::grpo
