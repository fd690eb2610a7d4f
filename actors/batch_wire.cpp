#include "actors/batch_wire.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include "actors/tensor_convert.hpp"
#include "runtime/errc.hpp"
#include "strings/format.hpp"

namespace rlforge::actors {

namespace {

caf::error bad(const std::string& what) {
  return make_error(errc::invalid_argument, what);
}

using strings::in_quotes;

/// Bytes per row of a blob with at least one dimension.
size_t row_bytes(const tensor_blob& b) {
  size_t n = element_size(b.dtype);
  for (size_t i = 1; i < b.shape.size(); ++i)
    n *= static_cast<size_t>(b.shape[i]);
  return n;
}

tensor_blob rows_of(const tensor_blob& b, int64_t begin, int64_t end) {
  tensor_blob out;
  out.dtype = b.dtype;
  out.shape = b.shape;
  out.shape[0] = end - begin;
  auto rb = row_bytes(b);
  out.bytes = b.bytes.substr(static_cast<size_t>(begin) * rb,
                             static_cast<size_t>(end - begin) * rb);
  return out;
}

template <class T>
std::vector<T> slice_ids(const std::vector<T>& ids, int64_t begin, int64_t end) {
  if (ids.empty())
    return {};
  return std::vector<T>(ids.begin() + begin, ids.begin() + end);
}

} // namespace

caf::expected<std::map<std::string, tensor_blob>>
to_blobs(const std::map<std::string, at::Tensor>& tensors) {
  std::map<std::string, tensor_blob> out;
  for (const auto& [name, t] : tensors) {
    auto b = to_blob(t);
    if (!b)
      return make_error(static_cast<errc>(b.error().code()),
                        "tensor " + in_quotes(name) + ": " + error_message(b.error()));
    out.emplace(name, std::move(*b));
  }
  return out;
}

caf::expected<std::map<std::string, at::Tensor>>
from_blobs(const std::map<std::string, tensor_blob>& blobs) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, b] : blobs) {
    auto t = from_blob(b);
    if (!t)
      return make_error(static_cast<errc>(t.error().code()),
                        "tensor " + in_quotes(name) + ": " + error_message(t.error()));
    out.emplace(name, std::move(*t));
  }
  return out;
}

caf::expected<batch_payload> to_payload(const backends::training_batch& batch) {
  auto tensors = to_blobs(batch.tensors);
  if (!tensors)
    return std::move(tensors.error());
  batch_payload p;
  p.tensors = std::move(*tensors);
  p.response_length = batch.response_length;
  p.pad_size = batch.pad_size;
  p.uids = batch.uids;
  p.group_ids = batch.group_ids;
  return p;
}

caf::expected<backends::training_batch> from_payload(const batch_payload& payload) {
  auto tensors = from_blobs(payload.tensors);
  if (!tensors)
    return std::move(tensors.error());
  backends::training_batch b;
  b.tensors = std::move(*tensors);
  b.response_length = payload.response_length;
  b.pad_size = payload.pad_size;
  b.uids = payload.uids;
  b.group_ids = payload.group_ids;
  return b;
}

caf::expected<int64_t> payload_rows(const batch_payload& p) {
  int64_t rows = -1;
  std::string first;
  for (const auto& [name, b] : p.tensors) {
    if (auto err = validate(b))
      return bad("batch tensor " + in_quotes(name) + ": " + error_message(err));
    if (b.shape.empty())
      return bad("batch tensor " + in_quotes(name) + " has no dimensions (expected [B, ...])");
    if (rows < 0) {
      rows = b.shape[0];
      first = name;
    } else if (b.shape[0] != rows) {
      return bad("batch tensor " + in_quotes(name) + " has " + std::to_string(b.shape[0])
                 + " rows but " + in_quotes(first) + " has " + std::to_string(rows));
    }
  }
  if (rows < 0)
    rows = 0;
  auto check_ids = [&](const std::vector<int64_t>& ids, const char* what) -> caf::error {
    if (!ids.empty() && static_cast<int64_t>(ids.size()) != rows)
      return bad(std::string{"batch "} + what + " has " + std::to_string(ids.size())
                 + " entries for " + std::to_string(rows) + " rows");
    return caf::none;
  };
  if (auto err = check_ids(p.uids, "uids"))
    return err;
  if (auto err = check_ids(p.group_ids, "group_ids"))
    return err;
  if (p.pad_size < 0 || p.pad_size > rows)
    return bad("batch pad_size " + std::to_string(p.pad_size) + " outside [0, "
               + std::to_string(rows) + "]");
  return rows;
}

caf::expected<batch_payload> slice_payload(const batch_payload& p, int64_t begin, int64_t end) {
  auto rows = payload_rows(p);
  if (!rows)
    return std::move(rows.error());
  if (begin < 0 || end > *rows || begin >= end)
    return bad("rows [" + std::to_string(begin) + ", " + std::to_string(end)
               + ") are empty or outside the batch's " + std::to_string(*rows) + " rows");
  batch_payload out;
  for (const auto& [name, b] : p.tensors)
    out.tensors.emplace(name, rows_of(b, begin, end));
  out.response_length = p.response_length;
  int64_t first_pad = *rows - p.pad_size;
  out.pad_size = std::max<int64_t>(0, end - std::max(begin, first_pad));
  out.uids = slice_ids(p.uids, begin, end);
  out.group_ids = slice_ids(p.group_ids, begin, end);
  return out;
}

caf::expected<batch_payload> pad_payload(const batch_payload& p, int64_t multiple) {
  if (multiple < 1)
    return bad("pad to a multiple of " + std::to_string(multiple) + ": must be >= 1");
  auto rows = payload_rows(p);
  if (!rows)
    return std::move(rows.error());
  int64_t real = *rows - p.pad_size;
  if (real < 1)
    return bad("the batch is empty (" + std::to_string(*rows) + " rows, "
               + std::to_string(p.pad_size) + " of them padding)");
  int64_t target = (*rows + multiple - 1) / multiple * multiple;
  int64_t add = target - *rows;
  if (add == 0)
    return p;
  batch_payload out = p;
  for (auto& [name, b] : out.tensors) {
    auto rb = row_bytes(b);
    const auto& src = p.tensors.at(name).bytes;
    b.bytes.reserve(static_cast<size_t>(target) * rb);
    for (int64_t i = 0; i < add; ++i) {
      auto row = static_cast<size_t>(i % real);
      if (name == backends::batch_keys::loss_mask || name == backends::batch_keys::metric_mask)
        b.bytes.append(rb, '\0'); // +0.0 in every float format
      else
        b.bytes.append(src, row * rb, rb);
    }
    b.shape[0] = target;
  }
  auto extend = [&](std::vector<int64_t>& ids) {
    if (ids.empty())
      return;
    for (int64_t i = 0; i < add; ++i)
      ids.push_back(ids[static_cast<size_t>(i % real)]);
  };
  extend(out.uids);
  extend(out.group_ids);
  out.pad_size = p.pad_size + add;
  return out;
}

caf::expected<std::vector<batch_payload>> shard_payload(const batch_payload& p, int64_t n) {
  if (n < 1)
    return bad("shard into " + std::to_string(n) + " parts: must be >= 1");
  auto rows = payload_rows(p);
  if (!rows)
    return std::move(rows.error());
  if (*rows == 0 || *rows % n != 0)
    return bad(std::to_string(*rows) + " rows do not split into " + std::to_string(n)
               + " equal shards (pad first)");
  std::vector<batch_payload> out;
  out.reserve(static_cast<size_t>(n));
  int64_t per = *rows / n;
  for (int64_t i = 0; i < n; ++i) {
    auto s = slice_payload(p, i * per, (i + 1) * per);
    if (!s)
      return std::move(s.error());
    out.push_back(std::move(*s));
  }
  return out;
}

std::map<std::string, double>
combine_metrics(const std::vector<std::pair<std::map<std::string, double>, double>>& parts) {
  struct acc {
    double value = 0;
    double weight = 0;
    double plain = 0;
    int64_t count = 0;
  };
  std::map<std::string, acc> accs;
  auto suffix = [](const std::string& name) {
    auto pos = name.rfind(':');
    return pos == std::string::npos ? std::string{"mean"} : name.substr(pos + 1);
  };
  for (const auto& [metrics, weight] : parts) {
    for (const auto& [name, v] : metrics) {
      auto& a = accs[name];
      auto kind = suffix(name);
      if (kind == "sum") {
        a.value += v;
      } else if (kind == "max") {
        a.value = a.count == 0 ? v : std::max(a.value, v);
      } else if (kind == "min") {
        a.value = a.count == 0 ? v : std::min(a.value, v);
      } else {
        a.value += v * weight;
        a.weight += weight;
        a.plain += v;
      }
      ++a.count;
    }
  }
  std::map<std::string, double> out;
  for (const auto& [name, a] : accs) {
    auto kind = suffix(name);
    if (kind == "sum" || kind == "max" || kind == "min")
      out[name] = a.value;
    else
      out[name] = a.weight > 0 ? a.value / a.weight : a.plain / static_cast<double>(a.count);
  }
  return out;
}

caf::expected<batch_result> merge_results(const std::vector<batch_result>& parts,
                                          int64_t pad_size) {
  if (parts.empty())
    return bad("merge_results: no results");
  batch_result out;
  const auto& first = parts.front();
  int64_t total_rows = -1;
  for (const auto& [name, b0] : first.outputs) {
    if (auto err = validate(b0))
      return bad("rank 0 output " + in_quotes(name) + ": " + error_message(err));
    if (b0.shape.empty())
      return bad("rank 0 output " + in_quotes(name) + " has no dimensions");
    tensor_blob merged;
    merged.dtype = b0.dtype;
    merged.shape = b0.shape;
    merged.shape[0] = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      auto it = parts[r].outputs.find(name);
      if (it == parts[r].outputs.end())
        return bad("rank " + std::to_string(r) + " did not return output " + in_quotes(name));
      const auto& b = it->second;
      if (auto err = validate(b))
        return bad("rank " + std::to_string(r) + " output " + in_quotes(name) + ": "
                   + error_message(err));
      if (b.dtype != b0.dtype || b.shape.size() != b0.shape.size()
          || !std::equal(b.shape.begin() + 1, b.shape.end(), b0.shape.begin() + 1))
        return bad("rank " + std::to_string(r) + " output " + in_quotes(name)
                   + " differs from rank 0's in dtype or trailing shape");
      merged.bytes += b.bytes;
      merged.shape[0] += b.shape[0];
    }
    if (total_rows < 0)
      total_rows = merged.shape[0];
    else if (merged.shape[0] != total_rows)
      return bad("output " + in_quotes(name) + " has " + std::to_string(merged.shape[0])
                 + " rows, others " + std::to_string(total_rows));
    if (pad_size < 0 || pad_size > merged.shape[0])
      return bad("pad_size " + std::to_string(pad_size) + " outside the "
                 + std::to_string(merged.shape[0]) + " output rows");
    if (pad_size > 0)
      merged = rows_of(merged, 0, merged.shape[0] - pad_size);
    out.outputs.emplace(name, std::move(merged));
  }
  for (size_t r = 1; r < parts.size(); ++r)
    if (parts[r].outputs.size() != first.outputs.size())
      return bad("rank " + std::to_string(r) + " returned " + std::to_string(parts[r].outputs.size())
                 + " outputs, rank 0 returned " + std::to_string(first.outputs.size()));
  std::vector<std::pair<std::map<std::string, double>, double>> metric_parts;
  for (const auto& p : parts) {
    metric_parts.emplace_back(p.metrics, p.tokens);
    out.tokens += p.tokens;
  }
  out.metrics = combine_metrics(metric_parts);
  return out;
}

} // namespace rlforge::actors
