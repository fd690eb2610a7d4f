#include "backends/engine/paged_attention.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

#include "backends/engine/attention_kernels.hpp"
#include "backends/error.hpp"
#include "backends/torch_compat.hpp"

namespace rlforge::backends {

namespace {

/// Calls `f(block, offset, length)` for each run of consecutive block ids that covers positions
/// [from, to) of `blocks` (`from` block-aligned): `offset` counts from `from`.
template <class F>
void for_each_run(const std::vector<int32_t>& blocks, int64_t block_size, int64_t from, int64_t to,
                  F&& f) {
  int64_t pos = from;
  while (pos < to) {
    auto b = static_cast<size_t>(pos / block_size);
    const int32_t start = blocks[b];
    int64_t length = block_size;
    while (pos + length < to && b + 1 < blocks.size() && blocks[b + 1] == blocks[b] + 1) {
      ++b;
      length += block_size;
    }
    length = std::min(length, to - pos);
    f(start, pos - from, length);
    pos += length;
  }
}

/// Runs `work(i)` for i in [0, n) on ATen's threads, each taking the next index when done, so
/// one long item (a prompt) does not leave the other threads idle.
template <class F> void parallel_dynamic(int64_t n, F&& work) {
  std::atomic<int64_t> next{0};
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n));
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w)
      for (int64_t i = next++; i < n; i = next++)
        work(i);
  });
}

} // namespace

paged_attention::paged_attention(paged_kv_cache& cache, int64_t heads,
                                 std::vector<attention_item> items)
    : cache_(cache), heads_(heads), kv_heads_(cache.kv_heads()), group_(heads / cache.kv_heads()),
      head_dim_(cache.head_dim()), block_size_(cache.block_size()), items_(std::move(items)) {
  if (heads_ % kv_heads_ != 0)
    fail(error_code::internal, "paged_attention: heads not a multiple of kv heads");
  const int64_t bs = block_size_;
  std::map<uint64_t, std::vector<size_t>> by_group;
  for (size_t i = 0; i < items_.size(); ++i) {
    const auto& it = items_[i];
    if (!it.blocks || it.count < 1 ||
        static_cast<int64_t>(it.blocks->size()) * bs < it.first + it.count)
      fail(error_code::internal, "paged_attention: an item's block table does not cover it");
    by_group[it.group].push_back(i);
    tokens_ += it.count;
  }
  int64_t offset = 0;
  for (auto& [group, members] : by_group) {
    task t;
    t.items = members;
    if (members.size() > 1) {
      // Leading blocks every member references and none writes in this pass.
      int64_t cap = std::numeric_limits<int64_t>::max();
      for (auto i : members)
        cap = std::min(cap, items_[i].first / bs);
      const auto& b0 = *items_[members[0]].blocks;
      int64_t common = 0;
      while (common < cap) {
        bool same = true;
        for (auto i : members)
          same = same && (*items_[i].blocks)[static_cast<size_t>(common)] ==
                             b0[static_cast<size_t>(common)];
        if (!same)
          break;
        ++common;
      }
      t.shared_blocks = common;
    }
    const int64_t shared = t.shared_blocks * bs;
    for (auto i : members) {
      t.row_of.push_back(t.rows);
      t.rows += items_[i].count * group_;
    }
    t.size = t.rows * shared;
    for (auto i : members) {
      const auto& it = items_[i];
      t.tail_at.push_back(t.size);
      t.size += it.count * group_ * (it.first + it.count - shared);
    }
    t.offset = offset;
    offset += t.size * kv_heads_;
    tasks_.push_back(std::move(t));
  }
  // Largest first, so that dynamic scheduling ends with small tasks.
  std::sort(tasks_.begin(), tasks_.end(),
            [](const task& a, const task& b) { return a.size > b.size; });
  slots_.resize(static_cast<size_t>(tokens_));
  for (const auto& it : items_)
    for (int64_t j = 0; j < it.count; ++j) {
      const int64_t p = it.first + j;
      slots_[static_cast<size_t>(it.token + j)] =
          (*it.blocks)[static_cast<size_t>(p / bs)] * bs + p % bs;
    }
  if (!cache_.device().is_cpu()) {
    plan_device();
    return;
  }
  scores_ = at::empty({std::max<int64_t>(offset, 1)}, at::kFloat);
}

void paged_attention::plan_device() {
  const int64_t bs = block_size_;
  const auto n = static_cast<int64_t>(items_.size());
  for (const auto& it : items_) {
    longest_ = std::max(longest_, it.first + it.count);
    queries_ = std::max(queries_, it.count);
  }
  std::vector<int64_t> gather(static_cast<size_t>(n * longest_), 0);
  std::vector<int64_t> query(static_cast<size_t>(n * queries_), 0);
  std::vector<int64_t> rows(static_cast<size_t>(tokens_), 0);
  std::vector<uint8_t> mask(static_cast<size_t>(n * queries_ * longest_), 0);
  for (int64_t m = 0; m < n; ++m) {
    const auto& it = items_[static_cast<size_t>(m)];
    const int64_t len = it.first + it.count;
    for (int64_t p = 0; p < len; ++p)
      gather[static_cast<size_t>(m * longest_ + p)] =
          (*it.blocks)[static_cast<size_t>(p / bs)] * bs + p % bs;
    for (int64_t j = 0; j < queries_; ++j) {
      uint8_t* row = mask.data() + (m * queries_ + j) * longest_;
      if (j < it.count) {
        query[static_cast<size_t>(m * queries_ + j)] = it.token + j;
        rows[static_cast<size_t>(it.token + j)] = m * queries_ + j;
        std::fill(row, row + it.first + j + 1, 1); // causal: up to itself
      } else {
        row[0] = 1; // a padding query sees one key (no empty softmax); its output is dropped
      }
    }
  }
  const auto longs = at::TensorOptions().dtype(at::kLong);
  const auto device = cache_.device();
  slot_index_ = at::tensor(slots_, longs).to(device);
  gather_index_ = at::tensor(gather, longs).to(device);
  query_index_ = at::tensor(query, longs).to(device);
  output_rows_ = at::tensor(rows, longs).to(device);
  mask_ = at::from_blob(mask.data(), {n, 1, queries_, longest_}, at::TensorOptions().dtype(at::kByte))
              .to(device)
              .to(at::kBool);
}

at::Tensor paged_attention::attend_on_device(int64_t layer, const at::Tensor& q,
                                             const at::Tensor& k, const at::Tensor& v) {
  cache_.write(layer, k, v, slot_index_);
  const auto n = static_cast<int64_t>(items_.size());
  const int64_t rows = cache_.num_blocks() * block_size_;
  auto gather = [&](const at::Tensor& blocks) { // [kv, rows, d] -> [n, heads, longest, d]
    return blocks.view({kv_heads_, rows, head_dim_})
        .index_select(1, gather_index_)
        .view({kv_heads_, n, longest_, head_dim_})
        .permute({1, 0, 2, 3})
        .repeat_interleave(group_, 1);
  };
  const auto dtype = cache_.dtype();
  auto keys = gather(cache_.key_blocks(layer));
  auto values = gather(cache_.value_blocks(layer));
  auto queries = q.index_select(0, query_index_)
                     .view({n, queries_, heads_, head_dim_})
                     .permute({0, 2, 1, 3})
                     .to(dtype); // [n, heads, queries, d], pre-scaled
#if RLFORGE_TORCH_AT_LEAST(2, 1)
  auto out = at::scaled_dot_product_attention(queries, keys, values, mask_, 0.0, false, 1.0);
#else
  auto scores = at::matmul(queries, keys.transpose(-1, -2))
                    .to(at::kFloat)
                    .masked_fill(mask_.logical_not(), -std::numeric_limits<float>::infinity());
  auto out = at::matmul(at::softmax(scores, -1).to(dtype), values);
#endif
  return out.permute({0, 2, 1, 3})
      .reshape({n * queries_, heads_ * head_dim_})
      .index_select(0, output_rows_)
      .to(q.scalar_type());
}

void paged_attention::scores_pass(int64_t layer, const task& t, int64_t h, const float* q,
                                  float* buffer) {
  const int64_t bs = block_size_, d = head_dim_, g = group_;
  const int64_t shared = t.shared_blocks * bs;
  const int64_t head_stride = cache_.num_blocks() * bs * d;
  const float* keys = cache_.keys(layer) + h * head_stride;
  // This head's query rows, stacked item after item (row j * g + r of an item: its token j,
  // query head h * g + r).
  std::vector<float> rows(static_cast<size_t>(t.rows * d));
  for (size_t m = 0; m < t.items.size(); ++m) {
    const auto& it = items_[t.items[m]];
    for (int64_t j = 0; j < it.count; ++j)
      std::memcpy(rows.data() + (t.row_of[m] + j * g) * d,
                  q + ((it.token + j) * heads_ + h * g) * d, sizeof(float) * g * d);
  }
  float* base = buffer + t.offset + h * t.size;
  if (shared > 0)
    for_each_run(*items_[t.items[0]].blocks, bs, 0, shared,
                 [&](int32_t block, int64_t off, int64_t len) {
                   kernels::scores(rows.data(), t.rows, keys + block * bs * d, len, d, base + off,
                                   shared);
                 });
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (size_t m = 0; m < t.items.size(); ++m) {
    const auto& it = items_[t.items[m]];
    const int64_t n = it.first + it.count - shared; // this item's own positions
    const int64_t item_rows = it.count * g;
    float* own = base + t.tail_at[m];
    const float* item_q = rows.data() + t.row_of[m] * d;
    for_each_run(*it.blocks, bs, shared, it.first + it.count,
                 [&](int32_t block, int64_t off, int64_t len) {
                   kernels::scores(item_q, item_rows, keys + block * bs * d, len, d, own + off, n);
                 });
    for (int64_t j = 0; j < it.count; ++j) {
      const int64_t visible = it.first + j + 1 - shared; // causal: up to itself
      for (int64_t r = 0; r < g; ++r) {
        float* row = own + (j * g + r) * n;
        std::fill(row + visible, row + n, neg_inf);
        float* shared_row = base + (t.row_of[m] + j * g + r) * shared;
        const float top = std::max(kernels::max_of(shared_row, shared), kernels::max_of(row, n));
        kernels::subtract(shared_row, shared, top);
        kernels::subtract(row, n, top);
      }
    }
  }
}

void paged_attention::values_pass(int64_t layer, const task& t, int64_t h, float* buffer,
                                  float* out) {
  const int64_t bs = block_size_, d = head_dim_, g = group_;
  const int64_t shared = t.shared_blocks * bs;
  const int64_t head_stride = cache_.num_blocks() * bs * d;
  const float* values = cache_.values(layer) + h * head_stride;
  float* base = buffer + t.offset + h * t.size;
  std::vector<float> acc(static_cast<size_t>(t.rows * d), 0.0f);
  std::vector<float> inverse(static_cast<size_t>(t.rows));
  for (size_t m = 0; m < t.items.size(); ++m) {
    const auto& it = items_[t.items[m]];
    const int64_t n = it.first + it.count - shared;
    const int64_t item_rows = it.count * g;
    float* own = base + t.tail_at[m];
    for (int64_t r = 0; r < item_rows; ++r) {
      const int64_t row = t.row_of[m] + r;
      const float sum = kernels::sum_of(base + row * shared, shared) + kernels::sum_of(own + r * n, n);
      inverse[static_cast<size_t>(row)] = 1.0f / sum;
    }
    for_each_run(*it.blocks, bs, shared, it.first + it.count,
                 [&](int32_t block, int64_t off, int64_t len) {
                   kernels::accumulate(own + off, item_rows, n, values + block * bs * d, len, d,
                                       acc.data() + t.row_of[m] * d);
                 });
  }
  if (shared > 0)
    for_each_run(*items_[t.items[0]].blocks, bs, 0, shared,
                 [&](int32_t block, int64_t off, int64_t len) {
                   kernels::accumulate(base + off, t.rows, shared, values + block * bs * d, len, d,
                                       acc.data());
                 });
  for (int64_t row = 0; row < t.rows; ++row)
    kernels::scale(acc.data() + row * d, d, inverse[static_cast<size_t>(row)]);
  for (size_t m = 0; m < t.items.size(); ++m) {
    const auto& it = items_[t.items[m]];
    for (int64_t j = 0; j < it.count; ++j)
      std::memcpy(out + ((it.token + j) * heads_ + h * g) * d,
                  acc.data() + (t.row_of[m] + j * g) * d, sizeof(float) * g * d);
  }
}

at::Tensor paged_attention::attend(int64_t layer, const at::Tensor& q, const at::Tensor& k,
                                   const at::Tensor& v) {
  if (q.dim() != 3 || q.size(0) != tokens_ || q.size(1) != heads_ || q.size(2) != head_dim_ ||
      q.scalar_type() != at::kFloat)
    fail(error_code::internal, "paged_attention: queries do not match the planned tokens");
  if (!cache_.device().is_cpu())
    return attend_on_device(layer, q, k, v);
  auto qc = q.contiguous();
  cache_.write(layer, k.contiguous(), v.contiguous(), slots_);
  auto out = at::empty({tokens_, heads_ * head_dim_}, at::kFloat);
  float* buffer = scores_.data_ptr<float>();
  const float* qp = qc.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const auto work = static_cast<int64_t>(tasks_.size()) * kv_heads_;
  parallel_dynamic(work, [&](int64_t i) {
    scores_pass(layer, tasks_[static_cast<size_t>(i / kv_heads_)], i % kv_heads_, qp, buffer);
  });
  scores_.exp_();
  parallel_dynamic(work, [&](int64_t i) {
    values_pass(layer, tasks_[static_cast<size_t>(i / kv_heads_)], i % kv_heads_, buffer, op);
  });
  return out;
}

} // namespace rlforge::backends
