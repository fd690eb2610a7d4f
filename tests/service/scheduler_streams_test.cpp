// request_scheduler's streamed sample requests (`try_submit_stream`): chunks that are
// continuations add up to the whole request's samples, streams take turns with other requests in
// their lane, a cancelled stream stops generating, failures reach the sink once.
#include "service/request_scheduler.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using rlforge::service::failure;
using rlforge::service::request_scheduler;
namespace tinker = rlforge::tinker;

/// A fake model: sample j's token at position t is 1000 j + t; it emits its stop token after
/// `stop_after(j)` tokens (stop_reason "stop"), or runs to max_tokens ("length"), or to a context
/// of `context` generated tokens ("length" with fewer than asked). A continuation starts at
/// position generated.size(), as the engines do.
struct fake_model {
  int64_t context = 1 << 20;
  std::mutex mutex;
  std::vector<std::string> calls; ///< per call: "<requests>" or "stream:<first_sample>@<start>"
  std::atomic<int> call_count{0};
  /// When `gated`, calls wait until `open()`: a test holds the first call back until it has
  /// queued what must compete with it (else the worker may finish first on a fast machine).
  bool gated = false;
  bool gate_open = false;
  std::condition_variable gate;

  void open() {
    std::lock_guard<std::mutex> guard(mutex);
    gate_open = true;
    gate.notify_all();
  }

  static int64_t stop_after(int64_t j) { return 5 + 3 * j; }

  tinker::sampled_sequence sample(int64_t j, int64_t start, int64_t max_tokens) {
    tinker::sampled_sequence s;
    s.stop_reason = "length";
    for (int64_t t = start; t < max_tokens && t < context; ++t) {
      s.tokens.push_back(1000 * j + t);
      s.logprobs.push_back(-0.001 * static_cast<double>(t));
      if (t + 1 == stop_after(j)) {
        s.stop_reason = "stop";
        break;
      }
    }
    return s;
  }

  request_scheduler::sample_fn fn() {
    return [this](const std::vector<tinker::sample_request>& rs) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        gate.wait(lock, [&] { return !gated || gate_open; });
      }
      ++call_count;
      std::vector<tinker::sample_response> out(rs.size());
      std::string call;
      for (size_t i = 0; i < rs.size(); ++i) {
        const auto& r = rs[i];
        const auto start = static_cast<int64_t>(r.generated.size());
        call += (i ? "," : "") + (r.generated.empty() && r.num_samples > 1
                                      ? std::to_string(r.num_samples)
                                      : std::to_string(r.first_sample) + "@" + std::to_string(start));
        for (int64_t k = 0; k < r.num_samples; ++k)
          out[i].sequences.push_back(sample(r.first_sample + k, start, r.params.max_tokens));
      }
      std::lock_guard<std::mutex> guard(mutex);
      calls.push_back(call);
      return out;
    };
  }
};

request_scheduler::forward_backward_fn no_training() {
  return [](const std::vector<tinker::forward_backward_request>&) {
    ADD_FAILURE() << "no training here";
    return std::vector<tinker::forward_backward_output>{};
  };
}

/// What a stream delivered: per sample index, the tokens, the chunks and how it ended.
struct collected {
  std::mutex mutex;
  std::condition_variable cv;
  std::map<int64_t, tinker::sampled_sequence> samples;
  std::map<int64_t, int> chunks;
  std::map<int64_t, int> finished;
  std::vector<failure> failures;
  int64_t largest_chunk = 0;
  std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
  /// Cancel after this many calls of `tokens` (0: never).
  int cancel_after = 0;
  int tokens_calls = 0;

  request_scheduler::stream_sink sink() {
    request_scheduler::stream_sink s;
    s.cancelled = cancelled;
    s.tokens = [this](int64_t index, tinker::sampled_sequence delta, bool done) {
      std::lock_guard<std::mutex> guard(mutex);
      auto& have = samples[index];
      have.tokens.insert(have.tokens.end(), delta.tokens.begin(), delta.tokens.end());
      have.logprobs.insert(have.logprobs.end(), delta.logprobs.begin(), delta.logprobs.end());
      largest_chunk = std::max<int64_t>(largest_chunk, static_cast<int64_t>(delta.tokens.size()));
      ++chunks[index];
      if (done) {
        have.stop_reason = delta.stop_reason;
        ++finished[index];
      } else {
        EXPECT_TRUE(delta.stop_reason.empty()) << "an unfinished chunk carries a stop reason";
      }
      if (cancel_after > 0 && ++tokens_calls == cancel_after)
        cancelled->store(true);
      cv.notify_all();
    };
    s.failed = [this](const failure& f) {
      std::lock_guard<std::mutex> guard(mutex);
      failures.push_back(f);
      cv.notify_all();
    };
    return s;
  }
  bool wait_chunks(int64_t index, int n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, 10s, [&] { return chunks[index] >= n || !failures.empty(); });
  }
  bool wait_finished(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, 10s, [&] { return finished.size() >= n || !failures.empty(); });
  }
};

tinker::sample_request request(int64_t n, int64_t max_tokens) {
  tinker::sample_request r;
  r.prompt = {1, 2, 3};
  r.num_samples = n;
  r.params.max_tokens = max_tokens;
  r.params.has_seed = true;
  r.params.seed = 7;
  return r;
}

request_scheduler::options one_worker() {
  request_scheduler::options o;
  o.workers = 1;
  return o;
}

tinker::sample_response whole(request_scheduler& s, tinker::sample_request r) {
  std::promise<tinker::sample_response> p;
  auto f = p.get_future();
  EXPECT_TRUE(s.try_submit_sample(std::move(r), {[&](tinker::sample_response x) { p.set_value(x); },
                                                 [&](const failure& e) {
                                                   ADD_FAILURE() << e.message;
                                                   p.set_value({});
                                                 }}));
  return f.get();
}

TEST(SchedulerStreams, ChunksAddUpToTheWholeRequest) {
  fake_model model;
  request_scheduler s(one_worker(), no_training(), model.fn());
  // Samples stop after 5, 8, 11, 14 tokens; max_tokens 12 cuts the last one ("length").
  auto expected = whole(s, request(4, 12));
  collected got;
  ASSERT_TRUE(s.try_submit_stream(request(4, 12), 3, got.sink()));
  ASSERT_TRUE(got.wait_finished(4));
  ASSERT_TRUE(got.failures.empty()) << got.failures[0].message;
  ASSERT_EQ(expected.sequences.size(), 4u);
  for (int64_t j = 0; j < 4; ++j) {
    const auto& want = expected.sequences[static_cast<size_t>(j)];
    EXPECT_EQ(got.samples[j].tokens, want.tokens) << "sample " << j;
    EXPECT_EQ(got.samples[j].logprobs, want.logprobs) << "sample " << j;
    EXPECT_EQ(got.samples[j].stop_reason, want.stop_reason) << "sample " << j;
    EXPECT_EQ(got.finished[j], 1) << "sample " << j << " finished more than once";
    // ceil(tokens / 3) chunks; a sample that ends exactly on a chunk boundary by max_tokens
    // needs no extra call.
    EXPECT_EQ(got.chunks[j], static_cast<int>((want.tokens.size() + 2) / 3)) << "sample " << j;
  }
  EXPECT_EQ(got.samples[3].stop_reason, "length");
  EXPECT_EQ(got.largest_chunk, 3);
  EXPECT_EQ(s.pending_samples(), 0u);
}

TEST(SchedulerStreams, TheContextEndingASampleEarlyFinishesIt) {
  fake_model model;
  model.context = 4; // every sample is cut after 4 tokens, below its 3-token chunks' allowance
  request_scheduler s(one_worker(), no_training(), model.fn());
  collected got;
  ASSERT_TRUE(s.try_submit_stream(request(2, 50), 3, got.sink()));
  ASSERT_TRUE(got.wait_finished(2));
  EXPECT_EQ(got.samples[0].tokens.size(), 4u);
  EXPECT_EQ(got.samples[1].stop_reason, "length");
  EXPECT_EQ(model.call_count.load(), 2); // 3 tokens, then 1 of 3: done
}

TEST(SchedulerStreams, AStreamTakesTurnsWithOtherRequestsOfItsLane) {
  fake_model model;
  model.gated = true; // the stream's first chunk waits until the other request is queued
  request_scheduler s(one_worker(), no_training(), model.fn());
  collected got;
  std::mutex m;
  std::condition_variable cv;
  bool other_done = false;
  int stream_chunks_before_other = -1;
  // A 100-token stream (sample 30 stops after 95 tokens) in chunks of 5.
  auto r = request(1, 100);
  r.first_sample = 30;
  ASSERT_TRUE(s.try_submit_stream(r, 5, got.sink()));
  ASSERT_TRUE(s.try_submit_sample(request(2, 4),
                                  {[&](tinker::sample_response) {
                                     std::lock_guard<std::mutex> g1(got.mutex);
                                     std::lock_guard<std::mutex> g2(m);
                                     stream_chunks_before_other = got.chunks[0];
                                     other_done = true;
                                     cv.notify_all();
                                   },
                                   [&](const failure& f) { ADD_FAILURE() << f.message; }}));
  model.open();
  ASSERT_TRUE(got.wait_finished(1));
  {
    std::unique_lock<std::mutex> lock(m);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return other_done; }));
  }
  EXPECT_EQ(got.samples[0].tokens.size(), 95u);
  EXPECT_EQ(got.chunks[0], 19);
  // The small request ran beside the stream's first chunks, not after its 19 of them.
  EXPECT_LE(stream_chunks_before_other, 2);
}

TEST(SchedulerStreams, ACancelledStreamGeneratesNothingMore) {
  fake_model model;
  request_scheduler s(one_worker(), no_training(), model.fn());
  collected got;
  got.cancel_after = 2; // the client goes away after its second chunk
  auto r = request(1, 1000);
  r.first_sample = 400; // stops after 1205 tokens: never, under max_tokens 1000
  ASSERT_TRUE(s.try_submit_stream(r, 2, got.sink()));
  ASSERT_TRUE(got.wait_chunks(0, 2));
  // A request queued after it on the same lane runs once the stream is dropped.
  auto after = whole(s, request(1, 3));
  EXPECT_EQ(after.sequences.size(), 1u);
  EXPECT_EQ(got.chunks[0], 2);
  EXPECT_EQ(got.finished.count(0), 0u);
  EXPECT_LE(model.call_count.load(), 4); // 2 chunks, perhaps 1 more in flight, and `after`
  EXPECT_EQ(s.pending_samples(), 0u);
}

TEST(SchedulerStreams, AFailedChunkFailsTheStreamOnce) {
  std::atomic<int> calls{0};
  fake_model model;
  auto inner = model.fn();
  request_scheduler s(one_worker(), no_training(),
                      [&](const std::vector<tinker::sample_request>& rs) {
                        if (calls++ == 1)
                          tinker::fail_not_found("weights evicted");
                        return inner(rs);
                      });
  collected got;
  ASSERT_TRUE(s.try_submit_stream(request(2, 40), 2, got.sink()));
  {
    std::unique_lock<std::mutex> lock(got.mutex);
    ASSERT_TRUE(got.cv.wait_for(lock, 10s, [&] { return !got.failures.empty(); }));
  }
  std::this_thread::sleep_for(50ms); // nothing else may arrive
  std::lock_guard<std::mutex> guard(got.mutex);
  ASSERT_EQ(got.failures.size(), 1u);
  EXPECT_EQ(got.failures[0].category, tinker::error_category::not_found);
  EXPECT_EQ(got.chunks[0], 1); // the first call's chunks only
  EXPECT_EQ(s.pending_samples(), 0u);
}

TEST(SchedulerStreams, StreamsCountTowardsTheSampleBound) {
  fake_model model;
  request_scheduler::options o = one_worker();
  o.max_pending_samples = 1;
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  auto inner = model.fn();
  request_scheduler s(o, no_training(), [&](const std::vector<tinker::sample_request>& rs) {
    opened.wait();
    return inner(rs);
  });
  collected got;
  ASSERT_TRUE(s.try_submit_stream(request(1, 4), 2, got.sink()));
  collected refused;
  EXPECT_FALSE(s.try_submit_stream(request(1, 4), 2, refused.sink()));
  EXPECT_FALSE(s.try_submit_sample(request(1, 4), {[](tinker::sample_response) {},
                                                   [](const failure&) {}}));
  gate.set_value();
  ASSERT_TRUE(got.wait_finished(1));
  EXPECT_EQ(s.pending_samples(), 0u);
}

TEST(SchedulerStreams, RefusesWhatTheStreamingFormCannotTake) {
  fake_model model;
  request_scheduler s(one_worker(), no_training(), model.fn());
  collected got;
  EXPECT_THROW(s.try_submit_stream(request(1, 4), 0, got.sink()), std::invalid_argument);
  auto scored = request(1, 4);
  scored.prompt_logprobs = true;
  EXPECT_THROW(s.try_submit_stream(scored, 2, got.sink()), std::invalid_argument);
  auto none = request(0, 4);
  EXPECT_THROW(s.try_submit_stream(none, 2, got.sink()), std::invalid_argument);
  auto no_sink = got.sink();
  no_sink.tokens = nullptr;
  EXPECT_THROW(s.try_submit_stream(request(1, 4), 2, no_sink), std::invalid_argument);
  EXPECT_EQ(s.pending_samples(), 0u);
}

} // namespace
