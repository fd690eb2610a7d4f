#include "actors/tinker_training.hpp"

#include <algorithm>
#include <utility>

#include <ATen/ATen.h>

#include "actors/batch_wire.hpp"
#include "actors/worker.hpp"
#include "backends/train/optimizer.hpp"
#include "backends/train/tinker_batch.hpp"
#include "tinker/error.hpp"
#include "tinker/loss_catalog.hpp"

namespace rlforge::actors {

namespace {

/// Consecutive datum ranges [begin, end) of at most `tinker_tokens_per_call` padded tokens (a
/// single datum may exceed it alone).
std::vector<std::pair<size_t, size_t>> pieces(const std::vector<tinker::datum>& data) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  int64_t longest = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    auto n = static_cast<int64_t>(data[i].tokens.size()) + 1;
    auto grown = std::max(longest, n);
    if (i > begin && grown * static_cast<int64_t>(i + 1 - begin) > tinker_tokens_per_call) {
      out.emplace_back(begin, i);
      begin = i;
      grown = n;
    }
    longest = grown;
  }
  out.emplace_back(begin, data.size());
  return out;
}

} // namespace

std::vector<tinker::forward_backward_output>
tinker_forward_backward(tinker_groups& groups, const caf::actor& dispatcher, tinker_model& m,
                        const tinker::model_limits& limits,
                        const std::vector<tinker::forward_backward_request>& batch) {
  if (batch.empty())
    tinker::fail_user("forward_backward: empty batch of requests");
  const bool forward_only = batch.front().forward_only;
  const char* op = forward_only ? worker_ops::forward.name : worker_ops::forward_backward.name;
  const bool critic = m.role == tinker::model_role::critic;
  // Everything is checked before the first call, so a refused batch changes no gradient.
  std::vector<tinker::resolved_loss> losses;
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& r = batch[i];
    auto where = std::string{op} + "(" + m.id + ") request " + std::to_string(i) + " (seq_id " +
                 std::to_string(r.seq_id) + ")";
    if (r.model_id != m.id)
      tinker::fail_user(where + " is for model '" + r.model_id + "' (one model per batch)");
    if (r.forward_only != forward_only)
      tinker::fail_user(where + " mixes forward and forward_backward in one batch");
    try {
      losses.push_back(tinker::resolve_loss(r.loss_fn, r.loss_fn_config, m.role));
    } catch (const tinker::request_error& e) {
      tinker::fail_user(where + ": " + e.what());
    }
    tinker::check_datums(r.data, losses.back(), limits, where);
  }
  auto c = groups.client(dispatcher);
  const char* first = critic ? "values" : "logprobs";
  std::vector<tinker::forward_backward_output> outputs(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& r = batch[i];
    const auto& loss = losses[i];
    auto context = std::string{op} + "(" + m.id + ", " + r.loss_fn + ")";
    loss_request lr{loss.name, loss.values, loss.options};
    std::vector<std::pair<std::map<std::string, double>, double>> metric_parts;
    auto& out = outputs[i];
    double loss_sum = 0;
    for (auto [begin, end] : pieces(r.data)) {
      std::vector<const tinker::datum*> rows;
      std::vector<int64_t> lengths;
      for (size_t k = begin; k < end; ++k) {
        rows.push_back(&r.data[k]);
        lengths.push_back(static_cast<int64_t>(r.data[k].tokens.size()));
      }
      auto payload = to_payload(backends::batch_from_datums(rows));
      if (!payload)
        throw_request_error(payload.error(), context);
      auto result = value_of(forward_only ? c.forward(m.id, std::move(*payload), lr)
                                          : c.forward_backward(m.id, std::move(*payload), lr),
                             context);
      std::map<std::string, at::Tensor> wanted{
          {first, result.outputs.at(first)},
          {"elementwise_loss", result.outputs.at("elementwise_loss")}};
      for (auto& d : backends::datum_outputs(wanted, lengths)) {
        for (double x : d.at("elementwise_loss").floats)
          loss_sum += x;
        out.loss_fn_outputs.push_back(std::move(d));
      }
      metric_parts.emplace_back(std::move(result.metrics), result.tokens);
    }
    out.metrics = combine_metrics(metric_parts);
    out.metrics["loss:sum"] = loss_sum;
  }
  return outputs;
}

std::map<std::string, double> tinker_optim_step(tinker_groups& groups, const caf::actor& dispatcher,
                                                tinker_model& m, const tinker::adam_params& a) {
  auto context = "optim_step(" + m.id + ")";
  try {
    backends::validate(a);
  } catch (const std::exception& e) {
    tinker::fail_user(context + ": " + e.what());
  }
  auto r = value_of(groups.client(dispatcher).optim_step(m.id, a), context);
  return {{"grad_norm:mean", r.grad_norm},
          {"learning_rate:mean", r.learning_rate},
          {"skipped:max", r.skipped ? 1.0 : 0.0},
          {"clipped:max", r.clipped ? 1.0 : 0.0},
          {"step:max", static_cast<double>(r.step)}};
}

} // namespace rlforge::actors
