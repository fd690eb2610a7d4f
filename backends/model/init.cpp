#include "backends/model/init.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "backends/error.hpp"
#include "backends/model/hf_checkpoint.hpp"

namespace rlforge::backends {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

} // namespace

std::map<std::string, at::Tensor> random_hf_weights(const model_config& config, uint64_t seed,
                                                    double std) {
  if (!(std > 0) || !std::isfinite(std))
    fail(error_code::invalid_argument,
         "random_hf_weights: std must be a positive finite number, got " + std::to_string(std));
  validate(config);
  auto shapes = expected_weight_shapes(config);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::map<std::string, at::Tensor> out;
  for (auto& name : expected_weight_names(config)) {
    auto& shape = shapes.at(name);
    at::Tensor t;
    if (ends_with(name, "norm.weight") || ends_with(name, "layernorm.weight"))
      t = at::ones(shape, at::kFloat);
    else if (ends_with(name, ".bias"))
      t = at::zeros(shape, at::kFloat);
    else
      t = at::empty(shape, at::kFloat).normal_(0.0, std, gen);
    out.emplace(name, std::move(t));
  }
  return out;
}

} // namespace rlforge::backends
