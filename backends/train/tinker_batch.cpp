#include "backends/train/tinker_batch.hpp"

#include <ATen/ATen.h>

#include <algorithm>

#include "backends/error.hpp"

namespace rlforge::backends {

namespace {

/// The batch key a float loss input fills (logprobs fills two).
std::vector<const char*> keys_of(const std::string& input) {
  if (input == "weights")
    return {batch_keys::loss_mask};
  if (input == "logprobs")
    return {batch_keys::action_log_probs, batch_keys::rollout_logprobs};
  if (input == "advantages")
    return {batch_keys::advantages};
  if (input == "values")
    return {batch_keys::values};
  if (input == "returns")
    return {batch_keys::returns};
  fail(error_code::invalid_argument, "batch_from_datums: unknown loss input '" + input + "'");
}

} // namespace

training_batch batch_from_datums(const std::vector<const tinker::datum*>& data) {
  if (data.empty())
    fail(error_code::invalid_argument, "batch_from_datums: no datums");
  const auto b = static_cast<int64_t>(data.size());
  int64_t r = 0;
  for (const auto* d : data)
    r = std::max<int64_t>(r, static_cast<int64_t>(d->tokens.size()));
  const int64_t s = r + 1;
  auto seq = at::zeros({b, s}, at::kLong);
  auto attn = at::zeros({b, s}, at::kLong);
  auto resp = at::zeros({b, r}, at::kLong);
  auto targets = at::zeros({b, r}, at::kLong);
  auto seq_a = seq.accessor<int64_t, 2>();
  auto attn_a = attn.accessor<int64_t, 2>();
  auto resp_a = resp.accessor<int64_t, 2>();
  auto target_a = targets.accessor<int64_t, 2>();
  std::map<std::string, at::Tensor> floats;
  for (int64_t i = 0; i < b; ++i) {
    const auto& d = *data[i];
    const auto n = static_cast<int64_t>(d.tokens.size());
    const auto& target = d.loss_fn_inputs.at("target_tokens").ints;
    for (int64_t k = 0; k < n; ++k) {
      seq_a[i][s - 1 - n + k] = d.tokens[k];
      attn_a[i][s - 1 - n + k] = 1;
      resp_a[i][r - n + k] = 1;
      target_a[i][r - n + k] = target[k];
    }
    seq_a[i][s - 1] = target[n - 1];
    attn_a[i][s - 1] = 1;
    for (const auto& [input, t] : d.loss_fn_inputs) {
      if (input == "target_tokens")
        continue;
      for (const char* key : keys_of(input)) {
        auto& dest = floats[key];
        if (!dest.defined())
          dest = at::zeros({b, r}, at::kFloat);
        auto a = dest.accessor<float, 2>();
        for (int64_t k = 0; k < n; ++k)
          a[i][r - n + k] = static_cast<float>(t.floats[k]);
      }
    }
  }
  training_batch batch;
  batch.response_length = r;
  batch.tensors[batch_keys::sequences] = seq;
  batch.tensors[batch_keys::attention_mask] = attn;
  batch.tensors[batch_keys::response_mask] = resp;
  batch.tensors[batch_keys::target_tokens] = targets;
  // Rows without weights weigh every position 1; rows with weights weigh as given.
  auto& loss = floats[batch_keys::loss_mask];
  if (!loss.defined()) {
    loss = resp.to(at::kFloat);
  } else {
    for (int64_t i = 0; i < b; ++i)
      if (!data[i]->loss_fn_inputs.count("weights"))
        loss[i].copy_(resp[i]);
  }
  // The metrics' positions: the weighted ones, else the sampled ones (a behaviour log-prob).
  auto metric = (loss != 0).to(at::kFloat);
  auto behaviour = floats.find(batch_keys::action_log_probs);
  for (int64_t i = 0; i < b; ++i)
    if (!data[i]->loss_fn_inputs.count("weights") && data[i]->loss_fn_inputs.count("logprobs"))
      metric[i].copy_((behaviour->second[i] != 0).to(at::kFloat));
  floats[batch_keys::metric_mask] = metric;
  for (auto& [key, t] : floats)
    batch.tensors[key] = t;
  batch.uids.resize(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i)
    batch.uids[i] = i;
  return batch;
}

std::vector<std::map<std::string, tinker::tensor_data>>
datum_outputs(const std::map<std::string, at::Tensor>& outputs,
              const std::vector<int64_t>& lengths) {
  std::vector<std::map<std::string, tinker::tensor_data>> out(lengths.size());
  for (const auto& [name, t] : outputs) {
    auto values = t.to(at::kDouble).contiguous();
    if (values.dim() != 2 || values.size(0) < static_cast<int64_t>(lengths.size()))
      fail(error_code::internal, "datum_outputs: output '" + name +
                                     "' is not [B, R] with B >= " + std::to_string(lengths.size()));
    const int64_t r = values.size(1);
    auto a = values.accessor<double, 2>();
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t n = lengths[i];
      if (n > r)
        fail(error_code::internal, "datum_outputs: datum " + std::to_string(i) + " has " +
                                       std::to_string(n) + " positions, the output only " +
                                       std::to_string(r));
      tinker::tensor_data td;
      td.type = tinker::dtype::float32;
      td.shape = {n};
      td.floats.resize(static_cast<size_t>(n));
      for (int64_t k = 0; k < n; ++k)
        td.floats[k] = a[static_cast<int64_t>(i)][r - n + k];
      out[i].emplace(name, std::move(td));
    }
  }
  return out;
}

} // namespace rlforge::backends
