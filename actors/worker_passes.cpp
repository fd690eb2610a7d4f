#include "actors/worker_state.hpp"

#include <algorithm>
#include <optional>
#include <utility>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <caf/all.hpp>

#include "actors/batch_wire.hpp"
#include "actors/worker.hpp"
#include "backends/algo/kl.hpp"
#include "backends/algo/losses.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/logprobs.hpp"
#include "backends/train/micro_batches.hpp"
#include "backends/train/tinker_batch.hpp"
#include "backends/train/training_batch.hpp"
#include "runtime/errc.hpp"
#include "tinker/datum_check.hpp"

/// The worker's passes over a batch (worker.hpp): `forward` and `forward_backward` on a batch of
/// the RL API, checked here once, and `tinker_forward` / `tinker_forward_backward` on a Tinker
/// request the backend checked (`tinker::check_request`), computed without checking again.
namespace rlforge::actors::worker_detail {

namespace {

void throw_if(const caf::error& err) {
  if (err)
    be::fail(error_code::invalid_argument, error_message(err));
}

template <class T> T value_or_throw(caf::expected<T> x) {
  if (!x) {
    auto code =
        is(x.error(), errc::unsupported) ? error_code::unsupported : error_code::invalid_argument;
    be::fail(code, error_message(x.error()));
  }
  return std::move(*x);
}

/// Decodes and checks a batch: the wire format, then the layout, values and token ids.
be::training_batch decode_batch(const worker_state& st, const batch_payload& p) {
  auto rows = payload_rows(p);
  throw_if(rows ? caf::error{} : rows.error());
  if (*rows == 0)
    be::fail(error_code::invalid_argument, "empty batch: no rows");
  auto batch = value_or_throw(from_payload(p));
  be::batch_checks checks;
  checks.vocab_size = st.model->config().vocab_size;
  checks.weighted_loss_mask = true;
  batch.validate(checks);
  return batch;
}

at::Tensor float_response_mask(const be::training_batch& b) {
  return b.get(keys::response_mask).to(at::kFloat);
}

/// Per response token: log-probs and entropy of the policy (`[b, R]` each). Column j is scored
/// on `target_tokens[:, j]` when the batch carries them, else on the sequence's next token; only
/// the R positions that predict the response go through the lm_head.
be::token_logprobs_result policy_logprobs(worker_state& st, const be::training_batch& mb) {
  const auto& ids = mb.get(keys::sequences);
  const auto& mask = mb.get(keys::attention_mask);
  const int64_t s = ids.size(1), r = mb.response_length;
  auto positions = (mask.cumsum(1) - 1).clamp_min(0);
  auto hidden = st.model->forward_hidden(ids, mask, positions);
  const auto& targets =
      mb.has(keys::target_tokens) ? mb.get(keys::target_tokens) : ids.narrow(1, s - r, r);
  return be::token_logprobs(*st.model, hidden.narrow(1, s - r - 1, r), targets, st.algo.temperature,
                            st.algo.logprob_chunk_size, true);
}

/// Per response token: the critic's value of the state that predicts it (`[b, R]`).
at::Tensor critic_values(worker_state& st, const be::training_batch& mb) {
  const auto& ids = mb.get(keys::sequences);
  const auto& mask = mb.get(keys::attention_mask);
  auto positions = (mask.cumsum(1) - 1).clamp_min(0);
  auto hidden = st.model->forward_hidden(ids, mask, positions);
  auto values = st.model->values(hidden);
  return be::response_columns(values.narrow(1, 0, values.size(1) - 1), mb.response_length);
}

at::Tensor optional_tensor(const be::training_batch& b, const char* key) {
  return b.has(key) ? b.get(key).to(at::kFloat) : at::Tensor{};
}

algo::loss_inputs loss_inputs_of(const be::training_batch& b) {
  algo::loss_inputs in;
  in.old_logprobs = optional_tensor(b, keys::action_log_probs);
  in.rollout_logprobs = optional_tensor(b, keys::rollout_logprobs);
  in.advantages = optional_tensor(b, keys::advantages);
  in.loss_mask = b.get(keys::loss_mask).to(at::kFloat);
  in.old_values = optional_tensor(b, keys::values);
  in.returns = optional_tensor(b, keys::returns);
  in.ref_logprobs = optional_tensor(b, keys::base_action_log_probs);
  in.metric_mask = optional_tensor(b, keys::metric_mask);
  return in;
}

algo::regularizer_config regularizers(const algorithm_config& a) {
  algo::regularizer_config r;
  r.use_kl_loss = a.use_kl_loss;
  r.kl_estimator = a.kl_estimator;
  r.kl_loss_coef = a.kl_loss_coef;
  r.use_entropy_loss = a.use_entropy_loss;
  r.entropy_loss_coef = a.entropy_loss_coef;
  return r;
}

/// What one pass computed: per-row `[B, R]` outputs, the metrics and their weight.
struct pass_output {
  std::map<std::string, at::Tensor> outputs;
  std::map<std::string, double> metrics;
  double tokens = 0;
};

batch_result to_batch_result(pass_output p) {
  batch_result r;
  r.outputs = value_or_throw(to_blobs(p.outputs));
  r.metrics = std::move(p.metrics);
  r.tokens = p.tokens;
  return r;
}

/// The loss of a request, checked for this worker's role (the registry checks its config).
algo::checked_loss check_loss_request(const worker_state& st, const loss_request& req) {
  const bool critic = st.role == "critic";
  if (!algo::is_loss_name(req.loss_fn)) {
    std::vector<std::string> names = critic ? algo::value_loss_names() : algo::policy_loss_names();
    std::string list;
    for (auto& n : names)
      list += (list.empty() ? "" : ", ") + n;
    be::fail(error_code::invalid_argument,
             "unknown loss_fn '" + req.loss_fn + "' (the " + st.role + " takes: " + list + ")");
  }
  if (critic && !algo::is_value_loss(req.loss_fn))
    be::fail(error_code::invalid_argument, "loss_fn '" + req.loss_fn +
                                               "' is a policy loss; a critic trains only with "
                                               "value losses (ppo_critic)");
  if (!critic && algo::is_value_loss(req.loss_fn))
    be::fail(error_code::invalid_argument, "loss_fn '" + req.loss_fn +
                                               "' is a value loss; send it to a critic, not to "
                                               "a policy");
  return algo::check_loss(req.loss_fn, algo::loss_config{req.values, req.options});
}

/// One pass over a batch, micro-batch by micro-batch: the model's outputs (`logprobs` and
/// `entropy`, or `values`) and, with a loss, `elementwise_loss` and the loss's metrics. With
/// `backward` the loss's gradients accumulate. The batch and its loss inputs were checked whole
/// before (`check_batch_pass`, or `tinker::check_request` for a Tinker request), so the
/// micro-batches, slices of the checked batch, are computed without checking again.
pass_output run_pass(worker_state& st, const be::training_batch& batch,
                     const algo::checked_loss* loss, bool backward) {
  const bool critic = st.role == "critic";
  auto reg = regularizers(st.algo);
  if (loss && !critic && reg.use_kl_loss && !batch.has(keys::base_action_log_probs))
    be::fail(error_code::invalid_argument,
             "use_kl_loss needs base_action_log_probs (the reference policy's) in the batch");
  std::optional<c10::NoGradGuard> no_grad;
  if (!backward)
    no_grad.emplace();
  st.model->set_training(backward);
  st.model->set_gradient_checkpointing(st.algo.gradient_checkpointing);
  auto plan =
      be::plan_micro_batches(batch, {st.algo.max_tokens_per_micro_batch, st.algo.micro_batch_size});
  // The regularizers are means over the whole pass, whatever the split into micro-batches.
  reg.pass_rows = static_cast<double>(batch.batch_size());
  reg.pass_tokens = batch.get(keys::loss_mask).to(at::kDouble).abs().sum().item<double>();
  std::vector<at::Tensor> logprobs, entropy, values, elementwise;
  std::vector<std::pair<std::map<std::string, double>, double>> parts;
  std::map<std::string, double> regularizer_metrics; // sums over micro-batches
  double tokens = 0;
  // The batch is planned on the host; each micro-batch computes on the model's device and its
  // outputs come back to the host.
  const auto device = st.model->device();
  auto host = [](const at::Tensor& t) { return t.to(at::kCPU); };
  for (const auto& part : plan) {
    const auto mb = part.batch.to(device);
    auto in = loss_inputs_of(mb);
    auto resp = float_response_mask(mb);
    if (critic) {
      in.values = critic_values(st, mb);
      values.push_back(host(in.values.detach() * resp));
    } else {
      auto r = policy_logprobs(st, mb);
      in.logprobs = r.logprobs;
      in.entropy = backward && reg.use_entropy_loss ? r.entropy : r.entropy.detach();
      logprobs.push_back(host(r.logprobs.detach() * resp));
      entropy.push_back(host(r.entropy.detach() * resp));
    }
    if (!loss) {
      double w = in.loss_mask.abs().sum().item<double>();
      tokens += w;
      if (!critic)
        parts.push_back(
            {{{"entropy:mean", algo::masked_mean(in.entropy, in.loss_mask.abs()).item<double>()}},
             w});
      continue;
    }
    auto out = algo::compute_loss(*loss, in);
    if (!critic) {
      algo::apply_regularizers(out, in, reg);
      // Each micro-batch's regularizer metrics are its share of the pass's means: they add up.
      for (const char* name : {"kl:mean", "kl_loss:mean", "entropy_loss:mean"})
        if (auto i = out.metrics.find(name); i != out.metrics.end()) {
          regularizer_metrics[name] += i->second;
          out.metrics.erase(i);
        }
    }
    if (backward)
      out.loss.backward();
    elementwise.push_back(host(out.elementwise.detach()));
    tokens += out.metric_weight; // the weight of this part's `:mean` metrics
    parts.emplace_back(std::move(out.metrics), out.metric_weight);
  }
  st.model->set_training(false);
  // Back to the batch's rows and response columns (micro-batches may hold other rows, trimmed).
  auto whole = [&](const std::vector<at::Tensor>& per_part) {
    return be::scatter_response_outputs(plan, per_part, batch.batch_size(), batch.response_length);
  };
  std::map<std::string, at::Tensor> outputs;
  if (loss)
    outputs["elementwise_loss"] = whole(elementwise);
  if (critic) {
    outputs["values"] = whole(values);
  } else {
    outputs["logprobs"] = whole(logprobs);
    outputs["entropy"] = whole(entropy);
  }
  auto metrics = combine_metrics(parts);
  for (auto& [name, value] : regularizer_metrics)
    metrics[name] = value;
  return {std::move(outputs), std::move(metrics), tokens};
}

/// The checks of a batch call of the RL API (`forward` with a loss, `forward_backward`): the
/// loss for this role and its config, then the whole batch's loss inputs. Everything is checked
/// before the first micro-batch, so a refused call leaves the gradients as they were.
algo::checked_loss check_batch_pass(const worker_state& st, const be::training_batch& batch,
                                    const loss_request& req) {
  auto loss = check_loss_request(st, req);
  algo::check_request_inputs(loss, loss_inputs_of(batch));
  return loss;
}

/// Consecutive datum ranges [begin, end) of at most `tinker_tokens_per_piece` padded tokens (a
/// single datum may exceed it alone).
std::vector<std::pair<size_t, size_t>> pieces(const std::vector<tinker::datum>& data) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t begin = 0;
  int64_t longest = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    auto n = static_cast<int64_t>(data[i].tokens.size()) + 1;
    auto grown = std::max(longest, n);
    if (i > begin && grown * static_cast<int64_t>(i + 1 - begin) > tinker_tokens_per_piece) {
      out.emplace_back(begin, i);
      begin = i;
      grown = n;
    }
    longest = grown;
  }
  out.emplace_back(begin, data.size());
  return out;
}

/// A checked Tinker request computed as it is: its tensors built from its datums in pieces of
/// at most `tinker_tokens_per_piece` padded tokens (the losses are sums, so the pieces add up),
/// nothing checked again. Builds without NDEBUG check it anyway, as `internal`: only a bug in
/// rlforge makes a checked request that is not valid.
tinker_pass_result tinker_pass(worker_state& st, const tinker::checked_request& req, bool backward,
                               const char* op) {
  const auto& model = resident_model(st, op);
  tinker_pass_result out;
  if (req.data().empty())
    return out; // this data-parallel rank's slice of a request with fewer datums than ranks
#ifndef NDEBUG
  try {
    tinker::check_datums(req.data(), req.loss(), {model.config().vocab_size, 0}, op);
  } catch (const std::exception& e) {
    be::fail(error_code::internal, std::string{op} +
                                       ": a checked request does not pass "
                                       "tinker::check_datums: " +
                                       e.what());
  }
#else
  (void)model;
#endif
  const auto& resolved = req.loss();
  const auto loss = algo::accept_checked_loss(resolved.name,
                                              algo::loss_config{resolved.values, resolved.options});
  const char* first = st.role == "critic" ? "values" : "logprobs";
  std::vector<std::pair<std::map<std::string, double>, double>> parts;
  double loss_sum = 0;
  for (auto [begin, end] : pieces(req.data())) {
    std::vector<const tinker::datum*> rows;
    std::vector<int64_t> lengths;
    for (size_t k = begin; k < end; ++k) {
      rows.push_back(&req.data()[k]);
      lengths.push_back(static_cast<int64_t>(req.data()[k].tokens.size()));
    }
    auto pass = run_pass(st, be::batch_from_datums(rows), &loss, backward);
    std::map<std::string, at::Tensor> wanted{
        {first, pass.outputs.at(first)}, {"elementwise_loss", pass.outputs.at("elementwise_loss")}};
    for (auto& d : be::datum_outputs(wanted, lengths)) {
      for (double x : d.at("elementwise_loss").floats)
        loss_sum += x;
      out.datum_outputs.push_back(std::move(d));
    }
    out.tokens += pass.tokens;
    parts.emplace_back(std::move(pass.metrics), pass.tokens);
  }
  out.metrics = combine_metrics(parts);
  out.metrics["loss:sum"] = loss_sum;
  return out;
}

} // namespace

caf::expected<batch_result> forward(rank_context&, worker_state& st, const batch_payload& payload,
                                    const std::optional<loss_request>& req) {
  resident_model(st, worker_ops::forward.name);
  auto batch = decode_batch(st, payload);
  if (!req)
    return to_batch_result(run_pass(st, batch, nullptr, false));
  auto loss = check_batch_pass(st, batch, *req);
  return to_batch_result(run_pass(st, batch, &loss, false));
}

caf::expected<batch_result> forward_backward(rank_context&, worker_state& st,
                                             const batch_payload& payload,
                                             const loss_request& req) {
  resident_model(st, worker_ops::forward_backward.name);
  auto batch = decode_batch(st, payload);
  auto loss = check_batch_pass(st, batch, req);
  return to_batch_result(run_pass(st, batch, &loss, true));
}

caf::expected<tinker_pass_result> tinker_forward(rank_context&, worker_state& st,
                                                 const tinker::checked_request& req) {
  return tinker_pass(st, req, false, worker_ops::tinker_forward.name);
}

caf::expected<tinker_pass_result> tinker_forward_backward(rank_context&, worker_state& st,
                                                          const tinker::checked_request& req) {
  return tinker_pass(st, req, true, worker_ops::tinker_forward_backward.name);
}

} // namespace rlforge::actors::worker_detail
