#include "backends/train/training_batch.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "backends/error.hpp"
#include "backends/train/detail.hpp"

namespace rlforge::backends {

namespace {

using detail::in_quotes;
using detail::shape_text;

std::string index_text(const at::Tensor& index_row) {
  std::ostringstream out;
  out << '[';
  for (int64_t i = 0; i < index_row.size(0); ++i)
    out << (i ? ", " : "") << index_row[i].item<int64_t>();
  out << ']';
  return out.str();
}

[[noreturn]] void invalid(const std::string& message) {
  fail(error_code::invalid_argument, message);
}

// Names the first element where `bad` (bool, same shape as `t`) holds, with its value.
[[noreturn]] void report_first(const std::string& name, const at::Tensor& t, const at::Tensor& bad,
                               const std::string& what, error_code code) {
  auto where = bad.nonzero()[0];
  auto value = t.flatten()[bad.flatten().nonzero()[0][0].item<int64_t>()];
  std::ostringstream out;
  out << "training_batch: " << in_quotes(name) << index_text(where) << " = ";
  if (t.is_floating_point())
    out << value.item<double>();
  else
    out << value.item<int64_t>();
  out << ' ' << what;
  fail(code, out.str());
}

void check_binary(const std::string& name, const at::Tensor& t) {
  auto bad = at::logical_and(t != 0, t != 1);
  if (bad.any().item<bool>())
    report_first(name, t, bad, "is not 0 or 1", error_code::invalid_argument);
}

void check_finite(const std::string& name, const at::Tensor& t) {
  auto bad = at::logical_not(at::isfinite(t));
  if (bad.any().item<bool>())
    report_first(name, t, bad, "is not finite", error_code::invalid_argument);
}

void check_dtype(const std::string& name, const at::Tensor& t, at::ScalarType expected) {
  if (t.scalar_type() != expected)
    invalid("training_batch: " + in_quotes(name) + " must be " + c10::toString(expected) +
            ", got " + c10::toString(t.scalar_type()));
}

void check_shape(const std::string& name, const at::Tensor& t, std::vector<int64_t> expected) {
  if (t.sizes().vec() != expected)
    invalid("training_batch: " + in_quotes(name) + " has shape " + shape_text(t.sizes()) +
            ", expected " + shape_text(expected));
}

bool is_sequence_key(const std::string& key) {
  return key == batch_keys::sequences || key == batch_keys::attention_mask;
}

bool is_response_key(const std::string& key) {
  for (const auto& k : response_keys())
    if (k == key)
      return true;
  return false;
}

at::ScalarType expected_dtype(const std::string& key) {
  if (key == batch_keys::sequences || key == batch_keys::attention_mask ||
      key == batch_keys::response_mask || key == batch_keys::target_tokens)
    return at::kLong;
  return at::kFloat;
}

// Rows [begin, end) without range checks (callers check).
training_batch take_rows(const training_batch& batch, int64_t begin, int64_t end) {
  training_batch out;
  out.response_length = batch.response_length;
  for (const auto& [name, t] : batch.tensors)
    out.tensors.emplace(name, t.narrow(0, begin, end - begin));
  int64_t first_pad = batch.batch_size() - batch.pad_size;
  out.pad_size = std::max<int64_t>(0, end - std::max(begin, first_pad));
  auto cut = [&](const std::vector<int64_t>& ids) {
    if (ids.empty())
      return ids;
    return std::vector<int64_t>(ids.begin() + begin, ids.begin() + end);
  };
  out.uids = cut(batch.uids);
  out.group_ids = cut(batch.group_ids);
  return out;
}

void check_ids(const char* name, const std::vector<int64_t>& ids, int64_t rows) {
  if (!ids.empty() && static_cast<int64_t>(ids.size()) != rows)
    invalid(std::string("training_batch: ") + name + " has " + std::to_string(ids.size()) +
            " entries for " + std::to_string(rows) + " rows (expected one per row or none)");
}

// The shared body of both builders: prompts are non-empty, per-token rows match responses.
training_batch build(const std::vector<std::vector<int64_t>>& prompts,
                     const std::vector<std::vector<int64_t>>& responses,
                     const per_token_values& per_token, int64_t pad_token_id) {
  const int64_t b = static_cast<int64_t>(prompts.size());
  int64_t s = 0, r = 0;
  for (int64_t i = 0; i < b; ++i) {
    s = std::max<int64_t>(s, static_cast<int64_t>(prompts[i].size() + responses[i].size()));
    r = std::max<int64_t>(r, static_cast<int64_t>(responses[i].size()));
  }
  auto seq = at::full({b, s}, pad_token_id, at::kLong);
  auto attn = at::zeros({b, s}, at::kLong);
  auto resp = at::zeros({b, r}, at::kLong);
  auto seq_a = seq.accessor<int64_t, 2>();
  auto attn_a = attn.accessor<int64_t, 2>();
  auto resp_a = resp.accessor<int64_t, 2>();
  for (int64_t i = 0; i < b; ++i) {
    const auto& p = prompts[i];
    const auto& q = responses[i];
    int64_t len = static_cast<int64_t>(p.size() + q.size());
    int64_t col = s - len;
    for (auto id : p) {
      seq_a[i][col] = id;
      attn_a[i][col++] = 1;
    }
    for (auto id : q) {
      seq_a[i][col] = id;
      attn_a[i][col++] = 1;
    }
    for (int64_t j = r - static_cast<int64_t>(q.size()); j < r; ++j)
      resp_a[i][j] = 1;
  }
  training_batch batch;
  batch.response_length = r;
  batch.tensors[batch_keys::sequences] = seq;
  batch.tensors[batch_keys::attention_mask] = attn;
  batch.tensors[batch_keys::response_mask] = resp;
  if (per_token.count(batch_keys::loss_mask) == 0)
    batch.tensors[batch_keys::loss_mask] = resp.to(at::kFloat);
  for (const auto& [key, rows] : per_token) {
    auto t = at::zeros({b, r}, at::kFloat);
    auto a = t.accessor<float, 2>();
    for (int64_t i = 0; i < b; ++i) {
      int64_t n = static_cast<int64_t>(rows[i].size());
      for (int64_t j = 0; j < n; ++j)
        a[i][r - n + j] = rows[i][j];
    }
    batch.tensors[key] = t;
  }
  batch.uids.resize(b);
  for (int64_t i = 0; i < b; ++i)
    batch.uids[i] = i;
  return batch;
}

} // namespace

const std::vector<std::string>& optional_response_keys() {
  static const std::vector<std::string> keys = {
      batch_keys::action_log_probs, batch_keys::rollout_logprobs, batch_keys::base_action_log_probs,
      batch_keys::advantages,       batch_keys::values,           batch_keys::returns,
      batch_keys::rewards,          batch_keys::metric_mask};
  return keys;
}

const std::vector<std::string>& response_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = {batch_keys::loss_mask, batch_keys::response_mask,
                                  batch_keys::target_tokens};
    for (const auto& x : optional_response_keys())
      k.push_back(x);
    return k;
  }();
  return keys;
}

int64_t training_batch::batch_size() const {
  auto it = tensors.find(batch_keys::sequences);
  return it == tensors.end() || !it->second.defined() || it->second.dim() < 1 ? 0
                                                                              : it->second.size(0);
}

int64_t training_batch::sequence_length() const {
  auto it = tensors.find(batch_keys::sequences);
  return it == tensors.end() || !it->second.defined() || it->second.dim() < 2 ? 0
                                                                              : it->second.size(1);
}

bool training_batch::has(const std::string& key) const {
  return tensors.count(key) != 0;
}

const at::Tensor& training_batch::get(const std::string& key) const {
  auto it = tensors.find(key);
  if (it == tensors.end()) {
    std::string present;
    for (const auto& [name, t] : tensors)
      present += (present.empty() ? "" : ", ") + name;
    fail(error_code::not_found, "training_batch: no tensor " + in_quotes(key) +
                                    " (present: " + (present.empty() ? "none" : present) + ")");
  }
  return it->second;
}

void training_batch::validate(const batch_checks& checks) const {
  for (const char* key : {batch_keys::sequences, batch_keys::attention_mask, batch_keys::loss_mask,
                          batch_keys::response_mask})
    if (!has(key))
      invalid("training_batch: the required tensor " + in_quotes(key) + " is missing");
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      invalid("training_batch: tensor " + in_quotes(name) + " is undefined");
    if (t.dim() < 1)
      invalid("training_batch: tensor " + in_quotes(name) + " has no row dimension (shape " +
              shape_text(t.sizes()) + ")");
  }
  const auto& seq = get(batch_keys::sequences);
  check_dtype(batch_keys::sequences, seq, at::kLong);
  if (seq.dim() != 2)
    invalid("training_batch: 'sequences' must be [B, S], got shape " + shape_text(seq.sizes()));
  const int64_t b = seq.size(0), s = seq.size(1), r = response_length;
  if (b < 1)
    invalid("training_batch: the batch is empty ('sequences' has shape " + shape_text(seq.sizes()) +
            ")");
  if (r < 1 || r > s - 1)
    invalid("training_batch: response_length " + std::to_string(r) +
            " must lie in [1, S-1] = [1, " + std::to_string(s - 1) + "] (S = " + std::to_string(s) +
            ")");
  for (const auto& [name, t] : tensors) {
    if (is_sequence_key(name)) {
      check_shape(name, t, {b, s});
      check_dtype(name, t, expected_dtype(name));
    } else if (is_response_key(name)) {
      check_shape(name, t, {b, r});
      check_dtype(name, t, expected_dtype(name));
    } else if (t.size(0) != b) {
      invalid("training_batch: " + in_quotes(name) + " has shape " + shape_text(t.sizes()) +
              ", expected " + std::to_string(b) + " rows");
    }
    if (t.is_floating_point())
      check_finite(name, t);
  }
  if (pad_size < 0 || pad_size > b)
    invalid("training_batch: pad_size " + std::to_string(pad_size) + " outside [0, " +
            std::to_string(b) + "]");
  check_ids("uids", uids, b);
  check_ids("group_ids", group_ids, b);

  const auto& attn = get(batch_keys::attention_mask);
  check_binary(batch_keys::attention_mask, attn);
  // Left padding: within a row the mask never drops from 1 back to 0, and the last token is real.
  auto drops = at::zeros({b, s}, at::kBool);
  drops.narrow(1, 1, s - 1).copy_(attn.narrow(1, 1, s - 1) < attn.narrow(1, 0, s - 1));
  if (drops.any().item<bool>())
    report_first(batch_keys::attention_mask, attn, drops,
                 "follows a real token (sequences must be left-padded)",
                 error_code::invalid_argument);
  auto last = attn.narrow(1, s - 1, 1);
  if ((last == 0).any().item<bool>())
    report_first(batch_keys::attention_mask, last, last == 0,
                 "in the last column (every row must end with a real token)",
                 error_code::invalid_argument);

  const auto& resp = get(batch_keys::response_mask);
  check_binary(batch_keys::response_mask, resp);
  auto resp_outside = at::logical_and(resp == 1, attn.narrow(1, s - r, r) == 0);
  if (resp_outside.any().item<bool>())
    report_first(batch_keys::response_mask, resp, resp_outside,
                 "marks a position whose attention_mask is 0", error_code::invalid_argument);

  const auto& loss = get(batch_keys::loss_mask);
  if (!checks.weighted_loss_mask)
    check_binary(batch_keys::loss_mask, loss);
  auto loss_outside = at::logical_and(loss != 0, resp == 0);
  if (loss_outside.any().item<bool>())
    report_first(batch_keys::loss_mask, loss, loss_outside, "is nonzero where response_mask is 0",
                 error_code::invalid_argument);

  for (const char* key : {batch_keys::sequences, batch_keys::target_tokens}) {
    if (!has(key))
      continue;
    const auto& ids = get(key);
    if ((ids < 0).any().item<bool>())
      report_first(key, ids, ids < 0, "is a negative token id", error_code::out_of_range);
    if (checks.vocab_size > 0 && (ids >= checks.vocab_size).any().item<bool>())
      report_first(key, ids, ids >= checks.vocab_size,
                   "is outside the vocabulary [0, " + std::to_string(checks.vocab_size) + ")",
                   error_code::out_of_range);
  }
}

at::Tensor response_columns(const at::Tensor& per_position, int64_t response_length) {
  if (!per_position.defined() || per_position.dim() < 2)
    invalid("response_columns: expected a [B, S-1, ...] tensor, got " +
            (per_position.defined() ? "shape " + shape_text(per_position.sizes()) : "undefined"));
  const int64_t cols = per_position.size(1);
  if (response_length < 1 || response_length > cols)
    invalid("response_columns: response_length " + std::to_string(response_length) +
            " outside [1, " + std::to_string(cols) + "] for shape " +
            shape_text(per_position.sizes()));
  return per_position.narrow(1, cols - response_length, response_length);
}

training_batch from_sequences(const std::vector<std::vector<int64_t>>& prompts,
                              const std::vector<std::vector<int64_t>>& responses,
                              const per_token_values& per_token, int64_t pad_token_id) {
  if (prompts.empty())
    invalid("from_sequences: no rows (prompts is empty)");
  if (responses.size() != prompts.size())
    invalid("from_sequences: " + std::to_string(prompts.size()) + " prompts but " +
            std::to_string(responses.size()) + " responses");
  bool any_response = false;
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty())
      invalid("from_sequences: prompt " + std::to_string(i) +
              " is empty (at least one token must precede the response)");
    any_response = any_response || !responses[i].empty();
  }
  if (!any_response)
    invalid("from_sequences: every response is empty");
  for (const auto& [key, rows] : per_token) {
    if (key != batch_keys::loss_mask) {
      bool known = false;
      for (const auto& k : optional_response_keys())
        known = known || k == key;
      if (!known)
        invalid("from_sequences: unknown per-token key " + in_quotes(key));
    }
    if (rows.size() != prompts.size())
      invalid("from_sequences: per-token " + in_quotes(key) + " has " +
              std::to_string(rows.size()) + " rows for " + std::to_string(prompts.size()) +
              " responses");
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i].size() != responses[i].size())
        invalid("from_sequences: per-token " + in_quotes(key) + " row " + std::to_string(i) +
                " has " + std::to_string(rows[i].size()) + " values for a response of " +
                std::to_string(responses[i].size()) + " tokens");
  }
  auto batch = build(prompts, responses, per_token, pad_token_id);
  batch.validate();
  return batch;
}

training_batch pad_to_multiple(const training_batch& batch, int64_t multiple) {
  if (multiple < 1)
    invalid("pad_to_multiple: multiple must be >= 1, got " + std::to_string(multiple));
  const int64_t b = batch.batch_size();
  const int64_t real = b - batch.pad_size;
  if (real < 1)
    invalid("pad_to_multiple: the batch has no real rows to duplicate (" + std::to_string(b) +
            " rows, pad_size " + std::to_string(batch.pad_size) + ")");
  const int64_t target = (b + multiple - 1) / multiple * multiple;
  const int64_t add = target - b;
  if (add == 0)
    return batch;
  std::vector<int64_t> rows(static_cast<size_t>(target));
  for (int64_t i = 0; i < target; ++i)
    rows[i] = i < b ? i : (i - b) % real;
  auto index = at::tensor(rows, at::kLong);
  training_batch out;
  out.response_length = batch.response_length;
  out.pad_size = batch.pad_size + add;
  for (const auto& [name, t] : batch.tensors)
    out.tensors.emplace(name, t.index_select(0, index));
  for (const char* key : {batch_keys::loss_mask, batch_keys::metric_mask}) {
    auto mask = out.tensors.find(key);
    if (mask != out.tensors.end())
      mask->second.narrow(0, b, add).zero_();
  }
  auto extend = [&](const std::vector<int64_t>& ids) {
    if (ids.empty())
      return ids;
    std::vector<int64_t> x(static_cast<size_t>(target));
    for (int64_t i = 0; i < target; ++i)
      x[i] = ids[rows[i]];
    return x;
  };
  out.uids = extend(batch.uids);
  out.group_ids = extend(batch.group_ids);
  return out;
}

training_batch slice_rows(const training_batch& batch, int64_t begin, int64_t end) {
  const int64_t b = batch.batch_size();
  if (begin < 0 || end > b || begin >= end)
    invalid("slice_rows: range [" + std::to_string(begin) + ", " + std::to_string(end) +
            ") is empty or outside the " + std::to_string(b) + " rows");
  return take_rows(batch, begin, end);
}

std::vector<training_batch> shard(const training_batch& batch, int64_t n) {
  const int64_t b = batch.batch_size();
  if (n < 1)
    invalid("shard: the number of shards must be >= 1, got " + std::to_string(n));
  if (b == 0 || b % n != 0)
    invalid("shard: " + std::to_string(b) + " rows do not split into " + std::to_string(n) +
            " equal shards (pad_to_multiple first)");
  std::vector<training_batch> out;
  out.reserve(static_cast<size_t>(n));
  const int64_t rows = b / n;
  for (int64_t i = 0; i < n; ++i)
    out.push_back(take_rows(batch, i * rows, (i + 1) * rows));
  return out;
}

training_batch concat(const std::vector<training_batch>& batches) {
  if (batches.empty())
    invalid("concat: no batches");
  const auto& first = batches.front();
  bool padding_seen = false;
  for (size_t i = 0; i < batches.size(); ++i) {
    const auto& x = batches[i];
    auto where = "concat: batch " + std::to_string(i);
    if (x.tensors.size() != first.tensors.size())
      invalid(where + " has " + std::to_string(x.tensors.size()) + " tensors, batch 0 has " +
              std::to_string(first.tensors.size()));
    for (const auto& [name, t] : first.tensors) {
      auto it = x.tensors.find(name);
      if (it == x.tensors.end())
        invalid(where + " lacks tensor " + in_quotes(name) + " that batch 0 has");
      if (it->second.dim() != t.dim() ||
          (t.dim() > 1 && it->second.sizes().slice(1) != t.sizes().slice(1)))
        invalid(where + ": tensor " + in_quotes(name) + " has shape " +
                shape_text(it->second.sizes()) + ", batch 0 has " + shape_text(t.sizes()) +
                " (only the row count may differ)");
    }
    if (x.response_length != first.response_length)
      invalid(where + " has response_length " + std::to_string(x.response_length) +
              ", batch 0 has " + std::to_string(first.response_length));
    if (x.uids.empty() != first.uids.empty() || x.group_ids.empty() != first.group_ids.empty())
      invalid(where + " disagrees with batch 0 on carrying uids / group_ids");
    if (padding_seen && x.pad_size != x.batch_size())
      invalid(where + " has real rows after padding rows of an earlier batch");
    padding_seen = padding_seen || x.pad_size > 0;
  }
  training_batch out;
  out.response_length = first.response_length;
  for (const auto& [name, t] : first.tensors) {
    std::vector<at::Tensor> parts;
    parts.reserve(batches.size());
    for (const auto& x : batches)
      parts.push_back(x.tensors.at(name));
    out.tensors.emplace(name, at::cat(parts, 0));
  }
  for (const auto& x : batches) {
    out.pad_size += x.pad_size;
    out.uids.insert(out.uids.end(), x.uids.begin(), x.uids.end());
    out.group_ids.insert(out.group_ids.end(), x.group_ids.begin(), x.group_ids.end());
  }
  return out;
}

at::Tensor trim_padding(const at::Tensor& output, int64_t pad_size) {
  if (!output.defined() || output.dim() < 1)
    invalid("trim_padding: the output has no row dimension");
  const int64_t b = output.size(0);
  if (pad_size < 0 || pad_size > b)
    invalid("trim_padding: pad_size " + std::to_string(pad_size) + " outside [0, " +
            std::to_string(b) + "] for an output of shape " + shape_text(output.sizes()));
  return output.narrow(0, 0, b - pad_size);
}

std::map<std::string, at::Tensor> trim_padding(const std::map<std::string, at::Tensor>& outputs,
                                               int64_t pad_size) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, t] : outputs) {
    try {
      out.emplace(name, trim_padding(t, pad_size));
    } catch (const error& e) {
      fail(e.code(), "output " + in_quotes(name) + ": " + e.what());
    }
  }
  return out;
}

training_batch trim_padding(const training_batch& batch) {
  const int64_t b = batch.batch_size();
  if (batch.pad_size < 0 || batch.pad_size > b)
    invalid("trim_padding: pad_size " + std::to_string(batch.pad_size) + " outside [0, " +
            std::to_string(b) + "]");
  auto out = take_rows(batch, 0, b - batch.pad_size);
  out.pad_size = 0;
  return out;
}

training_batch training_batch::to(const c10::Device& device) const {
  training_batch out = *this;
  for (auto& [name, t] : out.tensors)
    if (t.defined() && t.device() != device)
      t = t.to(device);
  return out;
}

} // namespace rlforge::backends
