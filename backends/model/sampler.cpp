#include "backends/model/sampler.hpp"

#include <c10/core/GradMode.h>
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <optional>
#include <cmath>
#include <string>

#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/stop_strings.hpp"
#include "backends/model/token_sampler.hpp"

namespace rlforge::backends {
namespace {

// One request's progress.
struct row_state {
  const std::vector<int64_t>* prompt = nullptr;
  const sampling_params* params = nullptr;
  int64_t budget = 0; // tokens this row may generate (max_tokens capped by the context)
  std::optional<row_generator> generator;
  std::optional<stop_string_matcher> stop_strings; ///< when the row has any
  sample_result result;

  // Total length once the row's last sampled token is part of the sequence.
  int64_t length() const { return static_cast<int64_t>(prompt->size() + result.tokens.size()); }
};

void check_requests(const model_config& config, const std::vector<std::vector<int64_t>>& prompts,
                    const std::vector<sampling_params>& params) {
  if (prompts.size() != params.size())
    fail(error_code::invalid_argument, "generate: " + std::to_string(prompts.size()) +
                                           " prompts but " + std::to_string(params.size()) +
                                           " sampling_params (need one per prompt)");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& prompt = prompts[i];
    const std::string which = "generate: request " + std::to_string(i) + ": ";
    if (prompt.empty())
      fail(error_code::invalid_argument, which + "empty prompt");
    for (size_t j = 0; j < prompt.size(); ++j)
      if (prompt[j] < 0 || prompt[j] >= config.vocab_size)
        fail(error_code::out_of_range,
             which + "prompt token " + std::to_string(j) + " is " + std::to_string(prompt[j]) +
                 ", outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
    if (static_cast<int64_t>(prompt.size()) >= config.max_position_embeddings)
      fail(error_code::invalid_argument,
           which + "prompt of " + std::to_string(prompt.size()) +
               " tokens leaves no room to generate within max_position_embeddings " +
               std::to_string(config.max_position_embeddings));
    try {
      validate(params[i], config.vocab_size);
    } catch (const error& e) {
      fail(e.code(), which + e.what());
    }
  }
}

// Left-pads `seqs` to their longest length: ids (padding id 0), mask and positions.
struct padded_batch {
  at::Tensor ids, mask, positions;
};

padded_batch left_pad(const std::vector<std::vector<int64_t>>& seqs) {
  int64_t width = 0;
  for (const auto& s : seqs)
    width = std::max(width, static_cast<int64_t>(s.size()));
  const auto rows = static_cast<int64_t>(seqs.size());
  auto ids = at::zeros({rows, width}, at::kLong);
  auto mask = at::zeros({rows, width}, at::kLong);
  auto ids_a = ids.accessor<int64_t, 2>();
  auto mask_a = mask.accessor<int64_t, 2>();
  for (int64_t r = 0; r < rows; ++r) {
    const auto& s = seqs[static_cast<size_t>(r)];
    const int64_t pad = width - static_cast<int64_t>(s.size());
    for (size_t j = 0; j < s.size(); ++j) {
      ids_a[r][pad + static_cast<int64_t>(j)] = s[j];
      mask_a[r][pad + static_cast<int64_t>(j)] = 1;
    }
  }
  auto positions = (mask.cumsum(1) - 1).clamp_min(0);
  return {ids, mask, positions};
}

// Samples the next token of each active row from its logits row ([A, V], row k belongs to
// rows[active[k]]), appends token and log-prob, and marks rows that finish.
void sample_step(const at::Tensor& logits, std::vector<row_state>& rows,
                 const std::vector<int64_t>& active) {
  std::vector<const sampling_params*> params;
  std::vector<row_generator*> generators;
  for (int64_t r : active) {
    params.push_back(rows[static_cast<size_t>(r)].params);
    generators.push_back(&*rows[static_cast<size_t>(r)].generator);
  }
  auto sampled = sample_tokens(logits, params, generators);
  for (size_t k = 0; k < active.size(); ++k) {
    auto& row = rows[static_cast<size_t>(active[k])];
    const auto& p = *row.params;
    const int64_t token = sampled[k].token;
    row.result.tokens.push_back(token);
    row.result.logprobs.push_back(sampled[k].logprob);
    // The matcher sees every token, so its text stays whole even when a stop token ends the row.
    const bool stop_string = row.stop_strings && row.stop_strings->push(token);
    if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
            p.stop_token_ids.end() ||
        stop_string)
      row.result.stop_reason = "stop";
    else if (static_cast<int64_t>(row.result.tokens.size()) >= row.budget)
      row.result.stop_reason = "length";
  }
}

// log p(prompt[j] | prompt[<j]) and the top-k at each prompt position, for every row that
// asked, from the prefill's hidden states.
void fill_prompt_logprobs(causal_lm& model, const at::Tensor& hidden,
                          std::vector<row_state>& rows) {
  const int64_t width = hidden.size(1);
  for (size_t r = 0; r < rows.size(); ++r) {
    auto& row = rows[r];
    const int64_t k = row.params->topk_prompt_logprobs;
    if (!row.params->prompt_logprobs && k == 0)
      continue;
    const auto n = static_cast<int64_t>(row.prompt->size());
    if (n < 2)
      continue;
    // Positions width-n .. width-2 predict prompt tokens 1 .. n-1.
    auto logits =
        model.logits(hidden.select(0, static_cast<int64_t>(r)).narrow(0, width - n, n - 1));
    if (row.params->prompt_logprobs)
      row.result.prompt_logprobs = token_logprobs(
          logits, std::vector<int64_t>(row.prompt->begin() + 1, row.prompt->end()));
    if (k > 0) {
      auto top = top_token_logprobs(logits, k);
      row.result.topk_prompt_ids = std::move(top.ids);
      row.result.topk_prompt_logprobs = std::move(top.logprobs);
    }
  }
}

// Drops the leading columns that are padding in every remaining row. Without this the cache
// would stay as wide as the longest prompt of rows already finished, and a short prompt that
// generates long could outgrow the model's context although its own length fits.
void trim_common_padding(kv_cache& cache, at::Tensor& mask) {
  auto used = mask.any(0);
  const int64_t width = mask.size(1);
  int64_t lead = 0;
  auto used_a = used.accessor<bool, 1>();
  while (lead < width && !used_a[lead])
    ++lead;
  if (lead == 0)
    return;
  mask = mask.narrow(1, lead, width - lead);
  for (auto& k : cache.keys)
    k = k.narrow(2, lead, width - lead);
  for (auto& v : cache.values)
    v = v.narrow(2, lead, width - lead);
}

at::Tensor index_tensor(const std::vector<int64_t>& xs) {
  return at::tensor(xs, at::kLong);
}

} // namespace

std::vector<sample_result> generate(causal_lm& model,
                                    const std::vector<std::vector<int64_t>>& prompts,
                                    const std::vector<sampling_params>& params,
                                    const generate_options& options) {
  const model_config& config = model.config();
  check_requests(config, prompts, params);
  if (prompts.empty())
    return {};
  c10::NoGradGuard no_grad;

  std::vector<row_state> rows(prompts.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    auto& row = rows[i];
    row.prompt = &prompts[i];
    row.params = &params[i];
    row.budget = std::min(params[i].max_tokens,
                          config.max_position_embeddings - static_cast<int64_t>(prompts[i].size()));
    row.generator.emplace(params[i].seed);
    if (!params[i].stop_strings.empty())
      row.stop_strings.emplace(*params[i].tokenizer, params[i].stop_strings);
  }

  // Prefill: all prompts at once.
  std::vector<int64_t> active(rows.size());
  for (size_t i = 0; i < active.size(); ++i)
    active[i] = static_cast<int64_t>(i);
  auto batch = left_pad(prompts);
  kv_cache cache;
  auto hidden = model.forward_hidden(batch.ids, batch.mask, batch.positions,
                                     options.use_kv_cache ? &cache : nullptr);
  fill_prompt_logprobs(model, hidden, rows);
  auto last_logits = model.logits(hidden.select(1, hidden.size(1) - 1));
  auto mask = batch.mask;
  hidden = at::Tensor();

  for (;;) {
    sample_step(last_logits, rows, active);
    std::vector<int64_t> keep; // positions within `active` of rows that go on
    for (size_t k = 0; k < active.size(); ++k)
      if (rows[static_cast<size_t>(active[k])].result.stop_reason.empty())
        keep.push_back(static_cast<int64_t>(k));
    if (keep.empty())
      break;
    std::vector<int64_t> next_active;
    next_active.reserve(keep.size());
    for (int64_t k : keep)
      next_active.push_back(active[static_cast<size_t>(k)]);

    if (options.use_kv_cache) {
      if (keep.size() != active.size()) {
        auto sel = index_tensor(keep);
        cache.reorder_or_select(sel);
        mask = mask.index_select(0, sel);
        trim_common_padding(cache, mask);
      }
      active = std::move(next_active);
      const auto a = static_cast<int64_t>(active.size());
      auto ids = at::empty({a, 1}, at::kLong);
      auto pos = at::empty({a, 1}, at::kLong);
      auto ids_a = ids.accessor<int64_t, 2>();
      auto pos_a = pos.accessor<int64_t, 2>();
      for (int64_t k = 0; k < a; ++k) {
        const auto& row = rows[static_cast<size_t>(active[static_cast<size_t>(k)])];
        ids_a[k][0] = row.result.tokens.back();
        // The fed token is the last of `length()` tokens.
        pos_a[k][0] = row.length() - 1;
      }
      mask = at::cat({mask, at::ones({a, 1}, at::kLong)}, 1);
      hidden = model.forward_hidden(ids, mask, pos, &cache);
      last_logits = model.logits(hidden.select(1, 0));
    } else {
      // Baseline: the whole sequence again, left-padded afresh.
      active = std::move(next_active);
      std::vector<std::vector<int64_t>> seqs;
      seqs.reserve(active.size());
      for (int64_t r : active) {
        const auto& row = rows[static_cast<size_t>(r)];
        seqs.push_back(*row.prompt);
        seqs.back().insert(seqs.back().end(), row.result.tokens.begin(), row.result.tokens.end());
      }
      auto full = left_pad(seqs);
      hidden = model.forward_hidden(full.ids, full.mask, full.positions, nullptr);
      last_logits = model.logits(hidden.select(1, hidden.size(1) - 1));
    }
  }

  std::vector<sample_result> out;
  out.reserve(rows.size());
  for (auto& row : rows)
    out.push_back(std::move(row.result));
  return out;
}

} // namespace rlforge::backends
