#include "service/request_scheduler.hpp"

#include <algorithm>
#include <exception>
#include <stdexcept>
#include <utility>

#include "runtime/logging.hpp"

namespace rlforge::service {

namespace {

failure current_failure() {
  try {
    throw;
  } catch (const tinker::request_error& e) {
    return {e.category(), e.what()};
  } catch (const std::exception& e) {
    return {tinker::error_category::server, e.what()};
  } catch (...) {
    return {tinker::error_category::server, "unknown exception"};
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
  if (opts_.sample_slice < 1)
    throw std::invalid_argument("request_scheduler: sample_slice must be >= 1, got " +
                                std::to_string(opts_.sample_slice));
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
    failure f{tinker::error_category::server, "server shutting down"};
    for (auto& [id, m] : models_) {
      for (auto& [seq, op] : m.ordered)
        failed.emplace_back(op.is_fb ? op.fb_done.failed : op.done.failed, f);
      for (auto& op : m.unordered)
        failed.emplace_back(op.done.failed, f);
      m.ordered.clear();
      m.unordered.clear();
    }
    for (auto& [key, lane] : lanes_) {
      for (auto& op : lane.ops)
        if (!op->over) {
          op->over = true;
          failed.emplace_back(op->done.failed, f);
        }
      lane.ops.clear();
    }
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
      tinker::fail_server("server shutting down");
    auto& m = models_[model_id];
    if (seq_id < m.next_seq)
      tinker::fail_user("seq_id " + std::to_string(seq_id) + " of model '" + model_id +
                        "' was already passed (next expected " + std::to_string(m.next_seq) + ")");
    if (m.ordered.count(seq_id) != 0)
      tinker::fail_user("seq_id " + std::to_string(seq_id) + " of model '" + model_id +
                        "' is already queued");
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
      tinker::fail_server("server shutting down");
    models_[model_id].unordered.push_back(unordered_op{std::move(run), std::move(c)});
  }
  work_cv_.notify_one();
}

bool request_scheduler::try_submit_sample(tinker::sample_request r,
                                          completion<tinker::sample_response> c) {
  auto op = std::make_shared<sample_op>();
  op->request = std::move(r);
  op->done = std::move(c);
  op->result.has_prompt_logprobs = op->request.prompt_logprobs;
  return enqueue_sample(std::move(op));
}

bool request_scheduler::enqueue_sample(std::shared_ptr<sample_op> op) {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    if (stopping_)
      tinker::fail_server("server shutting down");
    if (pending_samples_ >= opts_.max_pending_samples)
      return false;
    lanes_[op->request.sampler.engine()].ops.push_back(std::move(op));
    ++pending_samples_;
  }
  work_cv_.notify_one();
  return true;
}

bool request_scheduler::try_submit_stream(tinker::sample_request r, int64_t chunk_tokens,
                                          stream_sink sink) {
  if (chunk_tokens < 1)
    throw std::invalid_argument("request_scheduler: chunk_tokens must be >= 1, got " +
                                std::to_string(chunk_tokens));
  if (r.num_samples < 1)
    throw std::invalid_argument("request_scheduler: a streamed request needs num_samples >= 1, "
                                "got " +
                                std::to_string(r.num_samples));
  if (r.prompt_logprobs || r.topk_prompt_logprobs != 0 || !r.generated.empty())
    throw std::invalid_argument("request_scheduler: a streamed request takes no prompt log-probs "
                                "and no continuation");
  if (!sink.tokens || !sink.failed || !sink.cancelled)
    throw std::invalid_argument("request_scheduler: a stream sink needs tokens, failed and "
                                "cancelled");
  auto op = std::make_shared<sample_op>();
  op->request = std::move(r);
  op->done.failed = sink.failed;
  op->streamed = true;
  op->chunk_tokens = chunk_tokens;
  op->sink = std::move(sink);
  const auto n = static_cast<size_t>(op->request.num_samples);
  op->generated.resize(n);
  op->sample_done.assign(n, false);
  return enqueue_sample(std::move(op));
}

void request_scheduler::wake() {
  work_cv_.notify_all();
}

void request_scheduler::retire(sample_op& op) {
  if (op.over)
    return;
  op.over = true;
  --pending_samples_;
}

void request_scheduler::close_model(const std::string& model_id) {
  std::vector<std::pair<std::function<void(const failure&)>, failure>> failed;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    auto i = models_.find(model_id);
    if (i == models_.end())
      return;
    failure f{tinker::error_category::not_found, "model '" + model_id + "' was unloaded"};
    for (auto& [seq, op] : i->second.ordered)
      failed.emplace_back(op.is_fb ? op.fb_done.failed : op.done.failed, f);
    for (auto& op : i->second.unordered)
      failed.emplace_back(op.done.failed, f);
    if (i->second.busy) {
      // The running job still refers to this state: the worker erases it when the job ends.
      i->second.ordered.clear();
      i->second.unordered.clear();
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

request_scheduler::queue_depths request_scheduler::depths() const {
  std::lock_guard<std::mutex> guard(mutex_);
  queue_depths out;
  for (const auto& [key, lane] : lanes_)
    if (!lane.ops.empty())
      out.sampling[key] = lane.ops.size();
  for (const auto& [id, m] : models_)
    if (m.ordered.size() + m.unordered.size() > 0)
      out.training[id] = m.ordered.size() + m.unordered.size();
  return out;
}

bool request_scheduler::take_job(job& out) {
  // Alternate between training and sampling work when both are ready, so neither starves.
  prefer_samples_ = !prefer_samples_;
  if (prefer_samples_)
    return take_sample_job(out) || take_training_job(out);
  return take_training_job(out) || take_sample_job(out);
}

bool request_scheduler::take_training_job(job& out) {
  // Round-robin over the models, starting after the one served last, so one busy model cannot
  // starve the others. Priority inside a model: unordered ops (create/unload), then the next
  // ordered op(s).
  if (models_.empty())
    return false;
  auto start = models_.upper_bound(last_model_);
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
    } else {
      continue;
    }
    m.busy = true;
    out.model_id = id;
    last_model_ = id;
    return true;
  }
  return false;
}

bool request_scheduler::take_sample_job(job& out) {
  if (lanes_.empty())
    return false;
  auto start = lanes_.upper_bound(last_lane_);
  for (size_t n = 0; n < lanes_.size(); ++n, ++start) {
    if (start == lanes_.end())
      start = lanes_.begin();
    auto& [key, lane] = *start;
    if (lane.busy || lane.ops.empty())
      continue;
    // One slice from each of the first `max_batch` requests; a request with samples left goes
    // to the back, so the next call starts with the requests this one did not reach.
    std::deque<std::shared_ptr<sample_op>> rest;
    while (!lane.ops.empty() && out.slices.size() < opts_.max_batch) {
      auto op = std::move(lane.ops.front());
      lane.ops.pop_front();
      if (op->streamed && !op->over && op->sink.cancelled->load())
        retire(*op);
      if (op->over)
        continue;
      if (op->streamed) {
        if (!op->sink.ready || op->sink.ready())
          take_stream_chunks(op, out);
        rest.push_back(op);
        continue;
      }
      const int64_t total = op->request.num_samples;
      // A request with no valid sample count goes whole: the backend refuses it.
      const int64_t count =
          total < 1 ? total : std::min(opts_.sample_slice, total - op->next_sample);
      slice s{op, op->request};
      s.request.first_sample = op->request.first_sample + op->next_sample;
      s.request.num_samples = count;
      op->next_sample = total < 1 ? 1 : op->next_sample + count;
      if (total >= 1 && op->next_sample < total)
        rest.push_back(op);
      out.slices.push_back(std::move(s));
    }
    for (auto& op : rest)
      lane.ops.push_back(std::move(op));
    if (out.slices.empty())
      continue;
    lane.busy = true;
    out.lane = key;
    last_lane_ = key;
    return true;
  }
  return false;
}

void request_scheduler::take_stream_chunks(const std::shared_ptr<sample_op>& op, job& out) {
  const int64_t n = op->request.num_samples;
  const int64_t max_tokens = op->request.params.max_tokens;
  int64_t taken = 0;
  const int64_t first = op->next_sample;
  for (int64_t k = 0; k < n && taken < opts_.sample_slice && out.slices.size() < opts_.max_batch;
       ++k) {
    const int64_t i = (first + k) % n;
    if (op->sample_done[static_cast<size_t>(i)])
      continue;
    const auto& have = op->generated[static_cast<size_t>(i)];
    const auto len = static_cast<int64_t>(have.size());
    slice s{op, op->request, i, 0};
    s.request.first_sample = op->request.first_sample + i;
    s.request.num_samples = 1;
    s.request.generated = have;
    // A bad max_tokens goes as it is: the backend refuses it, naming it.
    s.request.params.max_tokens =
        max_tokens < 1 ? max_tokens : std::min(max_tokens, len + op->chunk_tokens);
    s.allowance = s.request.params.max_tokens - len;
    out.slices.push_back(std::move(s));
    ++taken;
    op->next_sample = (i + 1) % n;
  }
}

void request_scheduler::finish_stream_chunk(const slice& s, tinker::sample_response& part,
                                            std::vector<std::function<void()>>& callbacks) {
  auto& op = *s.op;
  const auto i = static_cast<size_t>(s.stream_index);
  if (op.sink.cancelled->load()) {
    retire(op);
    return;
  }
  if (part.sequences.size() != 1) {
    retire(op);
    failure f{tinker::error_category::server,
              "backend returned " + std::to_string(part.sequences.size()) +
                  " sequences for one streamed chunk"};
    callbacks.push_back([fn = op.done.failed, f] { fn(f); });
    return;
  }
  auto delta = std::move(part.sequences.front());
  auto& have = op.generated[i];
  have.insert(have.end(), delta.tokens.begin(), delta.tokens.end());
  const auto produced = static_cast<int64_t>(delta.tokens.size());
  // "length" before max_tokens with the whole allowance used is only the chunk's end; with less
  // than the allowance, the context ran out.
  const bool finished = delta.stop_reason != "length" ||
                        static_cast<int64_t>(have.size()) >= op.request.params.max_tokens ||
                        produced < s.allowance;
  if (!finished)
    delta.stop_reason.clear();
  if (finished) {
    op.sample_done[i] = true;
    if (++op.finished >= op.request.num_samples)
      retire(op);
  }
  callbacks.push_back([fn = op.sink.tokens, index = s.stream_index, d = std::move(delta),
                       finished]() mutable { fn(index, std::move(d), finished); });
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
        tinker::fail_server("backend returned " + std::to_string(outputs.size()) +
                            " forward_backward outputs for " + std::to_string(batch.size()) +
                            " requests");
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
  } else if (!j.slices.empty()) {
    run_samples(j);
  }
}

void request_scheduler::run_samples(job& j) {
  std::vector<tinker::sample_request> requests;
  requests.reserve(j.slices.size());
  for (auto& s : j.slices)
    requests.push_back(s.request);
  std::vector<tinker::sample_response> responses;
  failure f;
  bool ok = true;
  try {
    responses = sample_(requests);
    if (responses.size() != requests.size())
      tinker::fail_server("backend returned " + std::to_string(responses.size()) +
                          " sample responses for " + std::to_string(requests.size()) + " requests");
  } catch (...) {
    f = current_failure();
    ok = false;
  }
  std::vector<std::function<void()>> callbacks;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    for (size_t i = 0; i < j.slices.size(); ++i) {
      auto& op = j.slices[i].op;
      if (op->over)
        continue;
      if (!ok) {
        retire(*op);
        callbacks.push_back([op, f] { op->done.failed(f); });
        continue;
      }
      auto& part = responses[i];
      if (op->streamed) {
        finish_stream_chunk(j.slices[i], part, callbacks);
        continue;
      }
      // The prompt's scores come with the request's first slice (they are the same for all).
      if (j.slices[i].request.first_sample == op->request.first_sample) {
        op->result.prompt_logprobs = std::move(part.prompt_logprobs);
        op->result.topk = part.topk;
        op->result.topk_prompt_ids = std::move(part.topk_prompt_ids);
        op->result.topk_prompt_logprobs = std::move(part.topk_prompt_logprobs);
      }
      for (auto& seq : part.sequences)
        op->result.sequences.push_back(std::move(seq));
      op->finished += std::max<int64_t>(j.slices[i].request.num_samples, 1);
      if (op->finished >= op->request.num_samples) {
        retire(*op);
        callbacks.push_back([op] { op->done.done(std::move(op->result)); });
      }
    }
  }
  for (auto& cb : callbacks)
    cb();
}

void request_scheduler::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    job j;
    work_cv_.wait(lock, [&] { return stopping_ || take_job(j); });
    if (j.empty()) {
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
    if (!j.model_id.empty()) {
      if (auto i = models_.find(j.model_id); i != models_.end()) {
        if (i->second.closed)
          models_.erase(i);
        else
          i->second.busy = false;
      }
    }
    if (!j.lane.empty()) {
      if (auto i = lanes_.find(j.lane); i != lanes_.end()) {
        i->second.busy = false;
        if (i->second.ops.empty())
          lanes_.erase(i);
      }
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
      runtime::logger("service.scheduler")
          ->warn("event=gap_timeout model={} missing_seq_id={} failed={} waited_ms={}", id,
                 missing, m.ordered.size(), waited_ms);
      for (auto& [seq, op] : m.ordered) {
        failure f{tinker::error_category::user,
                  "seq_id " + std::to_string(seq) + " of model '" + id + "' waited " +
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
