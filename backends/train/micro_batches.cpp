#include "backends/train/micro_batches.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "backends/error.hpp"

namespace rlforge::backends {

namespace {

namespace keys = batch_keys;

[[noreturn]] void invalid(const std::string& what) {
  fail(error_code::invalid_argument, what);
}

/// `rows` of `batch` (in that order), each tensor trimmed to the rows' longest sequence and
/// longest response: left padding and response columns no row of the micro-batch uses are cut.
training_batch gather(const training_batch& batch, const std::vector<int64_t>& rows,
                      int64_t seq_len, int64_t resp_len) {
  auto index = at::tensor(at::ArrayRef<int64_t>(rows), at::kLong);
  const int64_t s = batch.sequence_length(), r = batch.response_length;
  training_batch out;
  out.response_length = resp_len;
  for (const auto& [name, t] : batch.tensors) {
    auto picked = t.index_select(0, index);
    const auto& response = response_keys();
    if (name == keys::sequences || name == keys::attention_mask)
      picked = picked.narrow(1, s - seq_len, seq_len);
    else if (std::find(response.begin(), response.end(), name) != response.end())
      picked = picked.narrow(1, r - resp_len, resp_len);
    out.tensors.emplace(name, picked.contiguous());
  }
  const int64_t first_pad = batch.batch_size() - batch.pad_size;
  for (auto row : rows) {
    if (row >= first_pad)
      ++out.pad_size;
    if (!batch.uids.empty())
      out.uids.push_back(batch.uids[static_cast<size_t>(row)]);
    if (!batch.group_ids.empty())
      out.group_ids.push_back(batch.group_ids[static_cast<size_t>(row)]);
  }
  return out;
}

} // namespace

std::vector<micro_batch> plan_micro_batches(const training_batch& batch,
                                            const micro_batch_limits& limits) {
  if (limits.max_tokens < 0)
    invalid("plan_micro_batches: max_tokens must be >= 0, got " +
            std::to_string(limits.max_tokens));
  if (limits.max_rows < 0)
    invalid("plan_micro_batches: max_rows must be >= 0, got " + std::to_string(limits.max_rows));
  const int64_t b = batch.batch_size();
  std::vector<micro_batch> out;
  if (limits.max_tokens == 0) {
    const int64_t size = limits.max_rows > 0 ? std::min(limits.max_rows, b) : b;
    for (int64_t begin = 0; begin < b; begin += size) {
      micro_batch mb;
      const int64_t end = std::min(b, begin + size);
      for (int64_t i = begin; i < end; ++i)
        mb.rows.push_back(i);
      mb.batch = slice_rows(batch, begin, end);
      out.push_back(std::move(mb));
    }
    return out;
  }
  // Sequence and response lengths: real tokens are the attention mask's ones (left padding),
  // response tokens the response mask's (right-aligned).
  auto seq = batch.get(keys::attention_mask).to(at::kLong).sum(1).contiguous();
  auto resp = batch.get(keys::response_mask).to(at::kLong).sum(1).contiguous();
  const int64_t* seq_len = seq.data_ptr<int64_t>();
  const int64_t* resp_len = resp.data_ptr<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(b));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return seq_len[x] > seq_len[y]; });
  std::vector<std::vector<int64_t>> groups;
  int64_t longest = 0;
  for (auto row : order) {
    // The first row of a group is its longest (descending order).
    if (groups.empty() || static_cast<int64_t>(groups.back().size() + 1) * longest >
                              limits.max_tokens) {
      groups.emplace_back();
      longest = std::max<int64_t>(seq_len[row], 1);
    }
    groups.back().push_back(row);
  }
  for (auto& g : groups) {
    // Within a micro-batch the rows keep the batch's order (only which rows go together
    // changes).
    std::sort(g.begin(), g.end());
    int64_t s = 1, r = 1;
    for (auto row : g) {
      s = std::max(s, seq_len[row]);
      r = std::max(r, resp_len[row]);
    }
    // Response columns need the position before them: R < S.
    s = std::max(s, r + 1);
    micro_batch mb;
    mb.rows = g;
    mb.batch = gather(batch, g, std::min(s, batch.sequence_length()),
                      std::min(r, batch.response_length));
    out.push_back(std::move(mb));
  }
  return out;
}

at::Tensor scatter_response_outputs(const std::vector<micro_batch>& plan,
                                    const std::vector<at::Tensor>& outputs, int64_t rows,
                                    int64_t response_length) {
  if (plan.size() != outputs.size())
    invalid("scatter_response_outputs: " + std::to_string(outputs.size()) + " outputs for " +
            std::to_string(plan.size()) + " micro-batches");
  if (outputs.empty())
    invalid("scatter_response_outputs: no micro-batches");
  auto out = at::zeros({rows, response_length}, outputs.front().options());
  for (size_t i = 0; i < plan.size(); ++i) {
    const auto& o = outputs[i];
    const auto n = static_cast<int64_t>(plan[i].rows.size());
    if (o.dim() != 2 || o.size(0) != n || o.size(1) > response_length)
      invalid("scatter_response_outputs: micro-batch " + std::to_string(i) + " output must be [" +
              std::to_string(n) + ", <= " + std::to_string(response_length) + "]");
    auto index = at::tensor(at::ArrayRef<int64_t>(plan[i].rows), at::kLong);
    out.narrow(1, response_length - o.size(1), o.size(1)).index_copy_(0, index, o);
  }
  return out;
}

} // namespace rlforge::backends
