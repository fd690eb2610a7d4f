#include "service/request_scheduler.hpp"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

namespace rlforge::service {

namespace {

failure current_failure() {
  try {
    throw;
  } catch (const tinker::request_error& e) {
    return {e.category(), e.what()};
  } catch (const std::exception& e) {
    return {"server", e.what()};
  } catch (...) {
    return {"server", "unknown exception"};
  }
}

void fail_op_list(std::vector<std::pair<std::function<void(const failure&)>, failure>>& xs) {
  for (auto& [fn, f] : xs)
    if (fn)
      fn(f);
  xs.clear();
}

} // namespace

request_scheduler::request_scheduler(options opts, forward_backward_fn fb, sample_fn sample)
    : opts_(opts), fb_(std::move(fb)), sample_(std::move(sample)) {
  if (opts_.workers < 1)
    throw std::invalid_argument("request_scheduler: workers must be >= 1, got 0");
  if (opts_.gap_timeout.count() <= 0)
    throw std::invalid_argument("request_scheduler: gap_timeout must be > 0 ms, got " +
                                std::to_string(opts_.gap_timeout.count()));
  if (opts_.max_batch < 1)
    throw std::invalid_argument("request_scheduler: max_batch must be >= 1, got 0");
  if (opts_.max_pending_samples < 1)
    throw std::invalid_argument("request_scheduler: max_pending_samples must be >= 1, got 0");
  if (!fb_ || !sample_)
    throw std::invalid_argument("request_scheduler: the forward_backward and sample functions "
                                "must be set");
  for (size_t i = 0; i < opts_.workers; ++i)
    workers_.emplace_back([this] { worker_loop(); });
  monitor_ = std::thread([this] { monitor_loop(); });
}

request_scheduler::~request_scheduler() {
  std::vector<std::pair<std::function<void(const failure&)>, failure>> failed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    stopping_ = true;
    failure f{"server", "server shutting down"};
    for (auto& [id, m] : models_) {
      for (auto& [seq, op] : m.ordered)
        failed.emplace_back(op.is_fb ? op.fb_done.failed : op.done.failed, f);
      for (auto& op : m.unordered)
        failed.emplace_back(op.done.failed, f);
      for (auto& op : m.samples)
        failed.emplace_back(op.done.failed, f);
      m.ordered.clear();
      m.unordered.clear();
      m.samples.clear();
    }
    pending_samples_ = 0;
  }
  work_cv_.notify_all();
  monitor_cv_.notify_all();
  fail_op_list(failed);
  for (auto& t : workers_)
    t.join();
  monitor_.join();
}

void request_scheduler::open_model(const std::string& model_id, int64_t next_seq_id) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (models_.count(model_id) == 0)
    models_[model_id].next_seq = next_seq_id;
}

void request_scheduler::enqueue_ordered(const std::string& model_id, int64_t seq_id,
                                        ordered_op op) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (stopping_)
      throw tinker::request_error("server", "server shutting down");
    auto& m = models_[model_id];
    if (seq_id < m.next_seq)
      throw tinker::request_error("user", "seq_id " + std::to_string(seq_id) + " of model '" +
                                              model_id + "' was already passed (next expected " +
                                              std::to_string(m.next_seq) + ")");
    if (m.ordered.count(seq_id) != 0)
      throw tinker::request_error("user", "seq_id " + std::to_string(seq_id) + " of model '" +
                                              model_id + "' is already queued");
    op.arrived = std::chrono::steady_clock::now();
    m.ordered.emplace(seq_id, std::move(op));
  }
  work_cv_.notify_one();
  monitor_cv_.notify_one();
}

void request_scheduler::submit_forward_backward(tinker::forward_backward_request r,
                                                completion<tinker::forward_backward_output> c) {
  ordered_op op;
  op.is_fb = true;
  auto model_id = r.model_id;
  auto seq_id = r.seq_id;
  op.fb = std::move(r);
  op.fb_done = std::move(c);
  enqueue_ordered(model_id, seq_id, std::move(op));
}

void request_scheduler::submit_ordered(const std::string& model_id, int64_t seq_id,
                                       std::function<std::string()> run,
                                       completion<std::string> c) {
  ordered_op op;
  op.run = std::move(run);
  op.done = std::move(c);
  enqueue_ordered(model_id, seq_id, std::move(op));
}

void request_scheduler::skip(const std::string& model_id, int64_t seq_id) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto i = models_.find(model_id);
    if (stopping_ || i == models_.end() || i->second.closed || seq_id < i->second.next_seq ||
        i->second.ordered.count(seq_id) != 0)
      return;
    ordered_op op;
    op.run = [] { return std::string(); };
    op.done = {[](std::string) {}, [](const failure&) {}};
    op.arrived = std::chrono::steady_clock::now();
    i->second.ordered.emplace(seq_id, std::move(op));
  }
  work_cv_.notify_one();
}

void request_scheduler::submit_unordered(const std::string& model_id,
                                         std::function<std::string()> run,
                                         completion<std::string> c) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (stopping_)
      throw tinker::request_error("server", "server shutting down");
    models_[model_id].unordered.push_back(unordered_op{std::move(run), std::move(c)});
  }
  work_cv_.notify_one();
}

bool request_scheduler::try_submit_sample(const std::string& model_id, tinker::sample_request r,
                                          completion<tinker::sample_response> c) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (stopping_)
      throw tinker::request_error("server", "server shutting down");
    if (pending_samples_ >= opts_.max_pending_samples)
      return false;
    models_[model_id].samples.push_back(sample_op{std::move(r), std::move(c)});
    ++pending_samples_;
  }
  work_cv_.notify_one();
  return true;
}

void request_scheduler::close_model(const std::string& model_id) {
  std::vector<std::pair<std::function<void(const failure&)>, failure>> failed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto i = models_.find(model_id);
    if (i == models_.end())
      return;
    failure f{"not_found", "model '" + model_id + "' was unloaded"};
    for (auto& [seq, op] : i->second.ordered)
      failed.emplace_back(op.is_fb ? op.fb_done.failed : op.done.failed, f);
    for (auto& op : i->second.unordered)
      failed.emplace_back(op.done.failed, f);
    for (auto& op : i->second.samples)
      failed.emplace_back(op.done.failed, f);
    pending_samples_ -= i->second.samples.size();
    if (i->second.busy) {
      // The running job still refers to this state: the worker erases it when the job ends.
      i->second.ordered.clear();
      i->second.unordered.clear();
      i->second.samples.clear();
      i->second.closed = true;
    } else {
      models_.erase(i);
    }
  }
  fail_op_list(failed);
}

int64_t request_scheduler::next_seq_id(const std::string& model_id) const {
  std::lock_guard<std::mutex> guard(mutex_);
  auto i = models_.find(model_id);
  return i == models_.end() || i->second.closed ? -1 : i->second.next_seq;
}

size_t request_scheduler::pending_samples() const {
  std::lock_guard<std::mutex> guard(mutex_);
  return pending_samples_;
}

bool request_scheduler::take_job(job& out) {
  // Round-robin over the models, starting after the one served last, so one busy model cannot
  // starve the others. Priority inside a model: unordered ops (create/unload), then the next
  // ordered op(s), then samples.
  if (models_.empty())
    return false;
  auto start = models_.upper_bound(last_served_);
  for (size_t n = 0; n < models_.size(); ++n, ++start) {
    if (start == models_.end())
      start = models_.begin();
    auto& [id, m] = *start;
    if (m.busy)
      continue;
    if (!m.unordered.empty()) {
      out.unordered.push_back(std::move(m.unordered.front()));
      m.unordered.pop_front();
    } else if (auto head = m.ordered.find(m.next_seq); head != m.ordered.end()) {
      bool fb = head->second.is_fb;
      bool fwd_only = fb && head->second.fb.forward_only;
      while (head != m.ordered.end() && head->first == m.next_seq &&
             out.ordered.size() < opts_.max_batch) {
        if (!out.ordered.empty() &&
            (!fb || !head->second.is_fb || head->second.fb.forward_only != fwd_only))
          break;
        out.ordered.push_back(std::move(head->second));
        head = m.ordered.erase(head);
        ++m.next_seq;
        if (!fb)
          break;
      }
    } else if (!m.samples.empty()) {
      while (!m.samples.empty() && out.samples.size() < opts_.max_batch) {
        out.samples.push_back(std::move(m.samples.front()));
        m.samples.pop_front();
        --pending_samples_;
      }
    } else {
      continue;
    }
    m.busy = true;
    out.model_id = id;
    last_served_ = id;
    return true;
  }
  return false;
}

void request_scheduler::run_job(job& j) {
  if (!j.unordered.empty()) {
    for (auto& op : j.unordered) {
      try {
        auto result = op.run();
        op.done.done(std::move(result));
      } catch (...) {
        op.done.failed(current_failure());
      }
    }
  } else if (!j.ordered.empty() && j.ordered.front().is_fb) {
    std::vector<tinker::forward_backward_request> batch;
    batch.reserve(j.ordered.size());
    for (auto& op : j.ordered)
      batch.push_back(std::move(op.fb));
    std::vector<tinker::forward_backward_output> outputs;
    try {
      outputs = fb_(batch);
      if (outputs.size() != batch.size())
        throw tinker::request_error("server", "backend returned " + std::to_string(outputs.size()) +
                                                  " forward_backward outputs for " +
                                                  std::to_string(batch.size()) + " requests");
    } catch (...) {
      auto f = current_failure();
      for (auto& op : j.ordered)
        op.fb_done.failed(f);
      return;
    }
    for (size_t i = 0; i < outputs.size(); ++i)
      j.ordered[i].fb_done.done(std::move(outputs[i]));
  } else if (!j.ordered.empty()) {
    for (auto& op : j.ordered) {
      try {
        auto result = op.run();
        op.done.done(std::move(result));
      } catch (...) {
        op.done.failed(current_failure());
      }
    }
  } else if (!j.samples.empty()) {
    std::vector<tinker::sample_request> requests;
    requests.reserve(j.samples.size());
    for (auto& op : j.samples)
      requests.push_back(std::move(op.request));
    std::vector<tinker::sample_response> responses;
    try {
      responses = sample_(j.model_id, requests);
      if (responses.size() != requests.size())
        throw tinker::request_error(
            "server", "backend returned " + std::to_string(responses.size()) +
                          " sample responses for " + std::to_string(requests.size()) + " requests");
    } catch (...) {
      auto f = current_failure();
      for (auto& op : j.samples)
        op.done.failed(f);
      return;
    }
    for (size_t i = 0; i < responses.size(); ++i)
      j.samples[i].done.done(std::move(responses[i]));
  }
}

void request_scheduler::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    job j;
    work_cv_.wait(lock, [&] { return stopping_ || take_job(j); });
    if (j.model_id.empty() && j.ordered.empty() && j.unordered.empty() && j.samples.empty()) {
      // Woken by stopping_ with nothing taken.
      return;
    }
    lock.unlock();
    try {
      run_job(j);
    } catch (...) {
      // A completion callback threw: nothing to report it to; keep the worker alive.
    }
    lock.lock();
    if (auto i = models_.find(j.model_id); i != models_.end()) {
      if (i->second.closed)
        models_.erase(i);
      else
        i->second.busy = false;
    }
    // The model is idle again: another worker may now take its next job.
    work_cv_.notify_all();
  }
}

void request_scheduler::expire_gaps(std::chrono::steady_clock::time_point now) {
  std::vector<std::pair<std::function<void(const failure&)>, failure>> failed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (auto& [id, m] : models_) {
      if (m.ordered.empty() || m.ordered.count(m.next_seq) != 0)
        continue;
      auto oldest = now;
      for (auto& [seq, op] : m.ordered)
        oldest = std::min(oldest, op.arrived);
      if (now - oldest < opts_.gap_timeout)
        continue;
      auto missing = m.next_seq;
      auto waited_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - oldest).count();
      for (auto& [seq, op] : m.ordered) {
        failure f{"user", "seq_id " + std::to_string(seq) + " of model '" + id + "' waited " +
                              std::to_string(waited_ms) + " ms for missing seq_id " +
                              std::to_string(missing) + ", which never arrived"};
        failed.emplace_back(op.is_fb ? op.fb_done.failed : op.done.failed, std::move(f));
      }
      m.next_seq = m.ordered.rbegin()->first + 1;
      m.ordered.clear();
    }
  }
  fail_op_list(failed);
}

void request_scheduler::monitor_loop() {
  // Wakes often enough to fail a gap within ~1/4 of its timeout after it expires.
  auto period = std::max(std::chrono::milliseconds(5), opts_.gap_timeout / 4);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    monitor_cv_.wait_for(lock, period);
    if (stopping_)
      break;
    lock.unlock();
    expire_gaps(std::chrono::steady_clock::now());
    lock.lock();
  }
}

} // namespace rlforge::service
