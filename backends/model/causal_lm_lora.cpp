// causal_lm's LoRA adapters (causal_lm.hpp): adding, merging, saving and loading them.
#include "backends/model/causal_lm.hpp"
#include "backends/model/causal_lm_impl.hpp"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "backends/error.hpp"
#include "backends/model/lora.hpp"
#include "backends/model/safetensors.hpp"
#include "strings/format.hpp"

namespace rlforge::backends {

using namespace model_detail;
using strings::shape_text;

namespace {

void set_base_trainable(std::vector<std::pair<std::string, at::Tensor>>& base, bool on) {
  for (auto& [name, t] : base)
    t.requires_grad_(on);
}

} // namespace

void causal_lm::enable_lora(lora_config config, uint64_t seed) {
  config.validate();
  if (config.rank < 1)
    fail(error_code::invalid_argument,
         "enable_lora: rank must be >= 1, got " + std::to_string(config.rank));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  impl_->for_each_projection([&](projection& p, const std::string& name) {
    p.lora_a = at::Tensor();
    p.lora_b = at::Tensor();
    if (std::find(config.target_modules.begin(), config.target_modules.end(), name) ==
        config.target_modules.end())
      return;
    auto in = p.weight.size(1);
    auto out = p.weight.size(0);
    // kaiming_uniform_(a=sqrt(5)) as PEFT/nn.Linear: bound = 1/sqrt(fan_in).
    auto bound = 1.0 / std::sqrt(static_cast<double>(in));
    p.lora_a =
        at::empty({config.rank, in}, at::kFloat).uniform_(-bound, bound, gen).to(p.weight.device());
    p.lora_b = at::zeros({out, config.rank}, p.weight.options().dtype(at::kFloat));
    p.lora_a.requires_grad_(true);
    p.lora_b.requires_grad_(true);
  });
  impl_->lora = std::move(config);
  set_base_trainable(impl_->base, false);
}

bool causal_lm::has_lora() const {
  return impl_->lora.rank > 0;
}

const lora_config& causal_lm::lora() const {
  return impl_->lora;
}

void causal_lm::merge_lora() {
  if (!has_lora())
    return;
  c10::NoGradGuard no_grad;
  auto scaling = impl_->lora.scaling();
  if (impl_->head.lora_a.defined())
    impl_->untie(); // the merged lm_head differs from the embedding
  impl_->for_each_projection([&](projection& p, const std::string&) {
    if (p.lora_a.defined())
      p.weight.add_(at::matmul(p.lora_b, p.lora_a), scaling);
    p.lora_a = at::Tensor();
    p.lora_b = at::Tensor();
  });
  impl_->lora = lora_config{};
  set_base_trainable(impl_->base, true);
}

void causal_lm::save_lora_adapter(const std::string& dir, const std::string& base_model) const {
  if (!has_lora())
    fail(error_code::invalid_argument, "save_lora_adapter: the model has no LoRA adapter");
  lora_adapter adapter;
  adapter.config = impl_->lora;
  adapter.base_model = base_model;
  impl_->for_each_projection([&](const projection& p, const std::string&) {
    if (!p.lora_a.defined())
      return;
    adapter.tensors[peft_prefix + p.path + ".lora_A.weight"] = p.lora_a.detach();
    adapter.tensors[peft_prefix + p.path + ".lora_B.weight"] = p.lora_b.detach();
  });
  backends::save_lora_adapter(dir, adapter);
}

void causal_lm::load_lora_adapter(const std::string& dir) {
  auto adapter = backends::load_lora_adapter(dir);
  auto& cfg = adapter.config;
  if (cfg.rank < 1)
    fail(error_code::invalid_argument,
         "load_lora_adapter: adapter in " + dir + " has rank " + std::to_string(cfg.rank));
  // Check everything before touching the model so a bad adapter leaves it unchanged.
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> found;
  size_t used = 0;
  impl_->for_each_projection([&](projection& p, const std::string& name) {
    bool targeted = std::find(cfg.target_modules.begin(), cfg.target_modules.end(), name) !=
                    cfg.target_modules.end();
    auto a_name = peft_prefix + p.path + ".lora_A.weight";
    auto b_name = peft_prefix + p.path + ".lora_B.weight";
    auto a = adapter.tensors.find(a_name);
    auto b = adapter.tensors.find(b_name);
    if (!targeted) {
      if (a != adapter.tensors.end() || b != adapter.tensors.end())
        fail(error_code::invalid_argument, "load_lora_adapter: tensor for " + p.path +
                                               " present but " + name +
                                               " is not in target_modules");
      return;
    }
    if (a == adapter.tensors.end() || b == adapter.tensors.end())
      fail(error_code::invalid_argument,
           "load_lora_adapter: missing " + (a == adapter.tensors.end() ? a_name : b_name));
    auto in = p.weight.size(1);
    auto out = p.weight.size(0);
    auto check = [&](const std::string& n, const at::Tensor& t, int64_t rows, int64_t cols) {
      if (t.dim() != 2 || t.size(0) != rows || t.size(1) != cols)
        fail(error_code::invalid_argument, "load_lora_adapter: " + n + " has shape " +
                                               shape_text(t.sizes()) + ", expected [" +
                                               std::to_string(rows) + ", " + std::to_string(cols) +
                                               "] (rank " + std::to_string(cfg.rank) + ")");
    };
    check(a_name, a->second, cfg.rank, in);
    check(b_name, b->second, out, cfg.rank);
    found[p.path] = {a->second, b->second};
    used += 2;
  });
  if (used != adapter.tensors.size()) {
    for (auto& [n, t] : adapter.tensors) {
      bool known = false;
      for (auto& [path, ab] : found)
        known = known || n == peft_prefix + path + ".lora_A.weight" ||
                n == peft_prefix + path + ".lora_B.weight";
      if (!known)
        fail(error_code::invalid_argument,
             "load_lora_adapter: tensor " + n + " does not match any projection of the model");
    }
  }
  impl_->for_each_projection([&](projection& p, const std::string&) {
    auto i = found.find(p.path);
    p.lora_a = i == found.end() ? at::Tensor() : i->second.first.to(at::kFloat).contiguous();
    p.lora_b = i == found.end() ? at::Tensor() : i->second.second.to(at::kFloat).contiguous();
    if (p.lora_a.defined()) {
      p.lora_a.requires_grad_(true);
      p.lora_b.requires_grad_(true);
    }
  });
  impl_->lora = std::move(cfg);
  set_base_trainable(impl_->base, false);
}

} // namespace rlforge::backends
