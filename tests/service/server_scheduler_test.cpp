// request_scheduler: seq_id ordering, batching, barriers, the gap rule, sampling lanes, fair
// slices and sample backpressure.
#include "service/request_scheduler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using rlforge::service::failure;
using rlforge::service::request_scheduler;
namespace tinker = rlforge::tinker;

/// Records the batches the scheduler hands to the backend functions; can hold them on a gate.
struct recorder {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::string> calls; ///< "fb:1,2,3" / "fwd:4" / "op:5" / "sample:<lane>:<requests>"
  bool gate_open = true;
  int entered = 0;

  void wait_gate() {
    std::unique_lock<std::mutex> lock(mutex);
    ++entered;
    cv.notify_all();
    cv.wait(lock, [&] { return gate_open; });
  }
  void record(std::string s) {
    std::lock_guard<std::mutex> guard(mutex);
    calls.push_back(std::move(s));
  }
  void open() {
    std::lock_guard<std::mutex> guard(mutex);
    gate_open = true;
    cv.notify_all();
  }
  void wait_entered(int n) {
    std::unique_lock<std::mutex> lock(mutex);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return entered >= n; }));
  }
  std::vector<std::string> snapshot() {
    std::lock_guard<std::mutex> guard(mutex);
    return calls;
  }
};

request_scheduler::forward_backward_fn fb_fn(recorder& rec) {
  return [&rec](const std::vector<tinker::forward_backward_request>& batch) {
    rec.wait_gate();
    std::string s = batch.front().forward_only ? "fwd:" : "fb:";
    std::vector<tinker::forward_backward_output> out;
    for (size_t i = 0; i < batch.size(); ++i) {
      s += (i ? "," : "") + std::to_string(batch[i].seq_id);
      tinker::forward_backward_output o;
      o.metrics["seq:sum"] = static_cast<double>(batch[i].seq_id);
      out.push_back(o);
    }
    rec.record(s);
    return out;
  };
}

request_scheduler::sample_fn sample_fn(recorder& rec) {
  return [&rec](const std::vector<tinker::sample_request>& rs) {
    rec.wait_gate();
    auto lane = rs.front().sampler.engine();
    for (auto& r : rs)
      EXPECT_EQ(r.sampler.engine(), lane) << "one call mixes lanes";
    rec.record("sample:" + lane + ":" + std::to_string(rs.size()));
    std::vector<tinker::sample_response> out(rs.size());
    for (size_t i = 0; i < rs.size(); ++i)
      for (int64_t k = 0; k < rs[i].num_samples; ++k) // sample j answers token j
        out[i].sequences.push_back({"length", {rs[i].first_sample + k}, {-1.0}});
    return out;
  };
}

/// A sample request on model `m`'s snapshot (lane "model:<m>"), or on the base model ("").
tinker::sample_request sample_on(const std::string& m, int64_t num_samples = 1) {
  tinker::sample_request r;
  r.prompt = {1, 2};
  r.num_samples = num_samples;
  if (!m.empty()) {
    r.sampler.type = tinker::sampler_ref::kind::snapshot;
    r.sampler.model_id = m;
    r.sampler.version = 1;
  }
  return r;
}

/// Collects results and failures of submissions; `wait(n)` blocks until n arrived.
struct sink {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::string> results;
  std::vector<failure> failures;

  template <class T>
  request_scheduler::completion<T> make(std::function<std::string(const T&)> show) {
    return {[this, show](T x) {
              std::lock_guard<std::mutex> guard(mutex);
              results.push_back(show(x));
              cv.notify_all();
            },
            [this](const failure& f) {
              std::lock_guard<std::mutex> guard(mutex);
              failures.push_back(f);
              cv.notify_all();
            }};
  }
  request_scheduler::completion<tinker::forward_backward_output> fb() {
    return make<tinker::forward_backward_output>([](const tinker::forward_backward_output& o) {
      return std::to_string(static_cast<int>(o.metrics.at("seq:sum")));
    });
  }
  request_scheduler::completion<std::string> op() {
    return make<std::string>([](const std::string& s) { return s; });
  }
  bool wait(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, 10s, [&] { return results.size() + failures.size() >= n; });
  }
};

tinker::forward_backward_request fb_request(const std::string& model, int64_t seq,
                                            bool forward_only = false) {
  tinker::forward_backward_request r;
  r.model_id = model;
  r.seq_id = seq;
  r.loss_fn = "cross_entropy";
  r.forward_only = forward_only;
  return r;
}

request_scheduler::options one_worker() {
  request_scheduler::options o;
  o.workers = 1;
  o.gap_timeout = 60s;
  return o;
}

TEST(ServerScheduler, ExecutesOutOfOrderChunksInSeqIdOrderAsOneBatch) {
  recorder rec;
  sink out;
  request_scheduler s(one_worker(), fb_fn(rec), sample_fn(rec));
  s.open_model("m", 1);
  // The SDK sends chunks 2 and 3 first and chunk 1 last.
  s.submit_forward_backward(fb_request("m", 3), out.fb());
  s.submit_forward_backward(fb_request("m", 2), out.fb());
  EXPECT_TRUE(rec.snapshot().empty());
  s.submit_forward_backward(fb_request("m", 1), out.fb());
  ASSERT_TRUE(out.wait(3));
  EXPECT_EQ(rec.snapshot(), (std::vector<std::string>{"fb:1,2,3"}));
  EXPECT_EQ(out.results, (std::vector<std::string>{"1", "2", "3"}));
  EXPECT_EQ(s.next_seq_id("m"), 4);
}

TEST(ServerScheduler, BarrierSplitsBatchesAndRunsAlone) {
  recorder rec;
  sink out;
  request_scheduler s(one_worker(), fb_fn(rec), sample_fn(rec));
  s.open_model("m", 1);
  auto op = [&](int64_t seq) {
    return [&rec, seq] {
      rec.record("op:" + std::to_string(seq));
      return std::string("done") + std::to_string(seq);
    };
  };
  // Everything arrives before seq 1, so the scheduler sees the whole sequence at once.
  s.submit_forward_backward(fb_request("m", 2), out.fb());
  s.submit_ordered("m", 3, op(3), out.op()); // optim_step: barrier
  s.submit_forward_backward(fb_request("m", 4), out.fb());
  s.submit_forward_backward(fb_request("m", 5, true), out.fb()); // forward: its own batch
  s.submit_forward_backward(fb_request("m", 6, true), out.fb());
  s.submit_ordered("m", 7, op(7), out.op());
  s.submit_forward_backward(fb_request("m", 1), out.fb());
  ASSERT_TRUE(out.wait(7));
  EXPECT_EQ(rec.snapshot(),
            (std::vector<std::string>{"fb:1,2", "op:3", "fb:4", "fwd:5,6", "op:7"}));
  EXPECT_TRUE(out.failures.empty());
}

TEST(ServerScheduler, RequestsArrivingWhileTheModelIsBusyFormTheNextBatch) {
  recorder rec;
  sink out;
  request_scheduler::options o = one_worker();
  o.workers = 2;
  o.max_batch = 2;
  request_scheduler s(o, fb_fn(rec), sample_fn(rec));
  s.open_model("m", 1);
  rec.gate_open = false;
  s.submit_forward_backward(fb_request("m", 1), out.fb());
  rec.wait_entered(1);
  for (int seq = 2; seq <= 4; ++seq)
    s.submit_forward_backward(fb_request("m", seq), out.fb());
  rec.open();
  ASSERT_TRUE(out.wait(4));
  // Two workers, but one model never runs twice at once; max_batch caps the batch.
  EXPECT_EQ(rec.snapshot(), (std::vector<std::string>{"fb:1", "fb:2,3", "fb:4"}));
}

TEST(ServerScheduler, RejectsDuplicateAndStaleSeqIds) {
  recorder rec;
  sink out;
  request_scheduler s(one_worker(), fb_fn(rec), sample_fn(rec));
  s.open_model("m", 5);
  s.submit_forward_backward(fb_request("m", 7), out.fb());
  try {
    s.submit_forward_backward(fb_request("m", 7), out.fb());
    FAIL() << "duplicate seq_id accepted";
  } catch (const tinker::request_error& e) {
    EXPECT_EQ(e.category(), tinker::error_category::user);
    EXPECT_NE(std::string(e.what()).find("seq_id 7 of model 'm' is already queued"),
              std::string::npos)
        << e.what();
  }
  try {
    s.submit_ordered(
        "m", 4, [] { return std::string(); }, out.op());
    FAIL() << "stale seq_id accepted";
  } catch (const tinker::request_error& e) {
    EXPECT_NE(std::string(e.what()).find("seq_id 4 of model 'm' was already passed (next "
                                         "expected 5)"),
              std::string::npos)
        << e.what();
  }
  // The queue is intact: filling the gap runs 5..7.
  s.submit_forward_backward(fb_request("m", 5), out.fb());
  s.submit_forward_backward(fb_request("m", 6), out.fb());
  ASSERT_TRUE(out.wait(3));
  EXPECT_EQ(out.results, (std::vector<std::string>{"5", "6", "7"}));
}

TEST(ServerScheduler, GapThatNeverFillsFailsWaitersNamingTheMissingSeqId) {
  recorder rec;
  sink out;
  request_scheduler::options o = one_worker();
  o.gap_timeout = 50ms;
  request_scheduler s(o, fb_fn(rec), sample_fn(rec));
  s.open_model("m", 1);
  s.submit_forward_backward(fb_request("m", 2), out.fb());
  s.submit_forward_backward(fb_request("m", 3), out.fb());
  ASSERT_TRUE(out.wait(2));
  ASSERT_EQ(out.failures.size(), 2u);
  for (auto& f : out.failures) {
    EXPECT_EQ(f.category, tinker::error_category::user);
    EXPECT_NE(f.message.find("missing seq_id 1"), std::string::npos) << f.message;
  }
  EXPECT_TRUE(rec.snapshot().empty());
  // The model keeps serving: the next seq_id after the failed ones runs; seq 1 is now stale.
  EXPECT_EQ(s.next_seq_id("m"), 4);
  EXPECT_THROW(s.submit_forward_backward(fb_request("m", 1), out.fb()), tinker::request_error);
  s.submit_forward_backward(fb_request("m", 4), out.fb());
  ASSERT_TRUE(out.wait(3));
  EXPECT_EQ(out.results, (std::vector<std::string>{"4"}));
}

TEST(ServerScheduler, BackendErrorsFailTheWholeBatchAndTheModelStaysUsable) {
  recorder rec;
  sink out;
  std::atomic<int> calls{0};
  request_scheduler s(
      one_worker(),
      [&](const std::vector<tinker::forward_backward_request>& batch) {
        if (calls++ == 0)
          tinker::fail_user("token id 999 outside the vocabulary");
        std::vector<tinker::forward_backward_output> out(batch.size());
        for (size_t i = 0; i < batch.size(); ++i)
          out[i].metrics["seq:sum"] = static_cast<double>(batch[i].seq_id);
        return out;
      },
      sample_fn(rec));
  s.open_model("m", 1);
  s.submit_forward_backward(fb_request("m", 2), out.fb());
  s.submit_forward_backward(fb_request("m", 1), out.fb());
  ASSERT_TRUE(out.wait(2));
  ASSERT_EQ(out.failures.size(), 2u);
  EXPECT_EQ(out.failures[0].category, tinker::error_category::user);
  EXPECT_EQ(out.failures[0].message, "token id 999 outside the vocabulary");
  s.submit_ordered(
      "m", 3, []() -> std::string { throw std::runtime_error("disk full"); }, out.op());
  ASSERT_TRUE(out.wait(3));
  EXPECT_EQ(out.failures[2].category, tinker::error_category::server);
  EXPECT_EQ(out.failures[2].message, "disk full");
  s.submit_forward_backward(fb_request("m", 4), out.fb());
  ASSERT_TRUE(out.wait(4));
  EXPECT_EQ(out.failures.size(), 3u);
  EXPECT_EQ(out.results, (std::vector<std::string>{"4"}));
}

TEST(ServerScheduler, WrongOutputCountIsAServerError) {
  recorder rec;
  sink out;
  request_scheduler s(
      one_worker(),
      [](const std::vector<tinker::forward_backward_request>&) {
        return std::vector<tinker::forward_backward_output>{};
      },
      sample_fn(rec));
  s.open_model("m", 1);
  s.submit_forward_backward(fb_request("m", 1), out.fb());
  ASSERT_TRUE(out.wait(1));
  ASSERT_EQ(out.failures.size(), 1u);
  EXPECT_EQ(out.failures[0].category, tinker::error_category::server);
  EXPECT_NE(out.failures[0].message.find("0 forward_backward outputs for 1 requests"),
            std::string::npos);
}

TEST(ServerScheduler, SampleQueueIsBoundedAndBatchesPerLane) {
  recorder rec;
  sink out;
  request_scheduler::options o = one_worker();
  o.max_pending_samples = 3;
  request_scheduler s(o, fb_fn(rec), sample_fn(rec));
  auto sample_done = [&] {
    return out.make<tinker::sample_response>(
        [](const tinker::sample_response& r) { return std::to_string(r.sequences.size()); });
  };
  rec.gate_open = false;
  ASSERT_TRUE(s.try_submit_sample(sample_on("a"), sample_done()));
  rec.wait_entered(1); // the first one runs (and blocks); it still counts as pending
  ASSERT_TRUE(s.try_submit_sample(sample_on("b"), sample_done()));
  ASSERT_TRUE(s.try_submit_sample(sample_on("b"), sample_done()));
  EXPECT_EQ(s.pending_samples(), 3u);
  EXPECT_FALSE(s.try_submit_sample(sample_on("b"), sample_done())); // full: the server answers 429
  rec.open();
  ASSERT_TRUE(out.wait(3));
  EXPECT_EQ(rec.snapshot(), (std::vector<std::string>{"sample:model:a:1", "sample:model:b:2"}));
  EXPECT_EQ(s.pending_samples(), 0u);
  EXPECT_TRUE(s.try_submit_sample(sample_on("b"), sample_done()));
  ASSERT_TRUE(out.wait(4));
}

TEST(ServerScheduler, SnapshotSamplesRunWhileTheirModelTrains) {
  recorder rec;
  sink out;
  request_scheduler::options o = one_worker();
  o.workers = 3;
  request_scheduler s(o, fb_fn(rec), sample_fn(rec));
  s.open_model("m", 1);
  rec.gate_open = false;
  s.submit_forward_backward(fb_request("m", 1), out.fb());
  rec.wait_entered(1);
  ASSERT_TRUE(s.try_submit_sample(
      sample_on("m"),
      out.make<tinker::sample_response>([](const tinker::sample_response&) { return "s"; })));
  rec.wait_entered(2); // the sample runs beside the training step of its own model
  rec.open();
  ASSERT_TRUE(out.wait(2));
  EXPECT_TRUE(out.failures.empty());
}

TEST(ServerScheduler, LargeSampleRequestsRunInFairSlicesInSampleOrder) {
  recorder rec;
  sink out;
  request_scheduler::options o = one_worker();
  o.sample_slice = 4;
  request_scheduler s(o, fb_fn(rec), sample_fn(rec));
  std::vector<std::vector<int64_t>> order; // first token of each sequence, per completed request
  auto done = [&] {
    return out.make<tinker::sample_response>([&](const tinker::sample_response& r) {
      std::vector<int64_t> firsts;
      for (auto& q : r.sequences)
        firsts.push_back(q.tokens.at(0));
      order.push_back(firsts);
      return std::to_string(r.sequences.size());
    });
  };
  rec.gate_open = false;
  ASSERT_TRUE(s.try_submit_sample(sample_on("", 40), done())); // 10 slices of 4
  rec.wait_entered(1);                                         // its first slice runs
  ASSERT_TRUE(s.try_submit_sample(sample_on("", 2), done()));  // a small request arrives
  rec.open();
  ASSERT_TRUE(out.wait(2));
  // The small request finished first: it joined the second call instead of waiting for all 40.
  EXPECT_EQ(out.results, (std::vector<std::string>{"2", "40"}));
  auto calls = rec.snapshot();
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls[0], "sample:base:1");
  EXPECT_EQ(calls[1], "sample:base:2"); // a slice of the big request beside the small one
  EXPECT_EQ(calls.size(), 10u);         // one call per slice of the big request
  // Every sample came back once, in sample order (sample j answered token j).
  std::vector<int64_t> all(40);
  for (int64_t j = 0; j < 40; ++j)
    all[j] = j;
  EXPECT_EQ(order.at(1), all);
  EXPECT_EQ(order.at(0), (std::vector<int64_t>{0, 1}));
}

TEST(ServerScheduler, AFailedSliceFailsItsRequestOnceAndTheLaneKeepsServing) {
  recorder rec;
  sink out;
  request_scheduler::options o = one_worker();
  o.sample_slice = 2;
  std::atomic<int> calls{0};
  request_scheduler s(o, fb_fn(rec), [&](const std::vector<tinker::sample_request>& rs) {
    if (calls++ == 1)
      tinker::fail_not_found("weights evicted");
    std::vector<tinker::sample_response> r(rs.size());
    for (size_t i = 0; i < rs.size(); ++i)
      for (int64_t k = 0; k < rs[i].num_samples; ++k)
        r[i].sequences.push_back({"length", {k}, {-1.0}});
    return r;
  });
  auto done = [&] {
    return out.make<tinker::sample_response>(
        [](const tinker::sample_response& r) { return std::to_string(r.sequences.size()); });
  };
  ASSERT_TRUE(s.try_submit_sample(sample_on("m", 6), done())); // slices 0, 1 (fails), 2
  ASSERT_TRUE(out.wait(1));
  ASSERT_EQ(out.failures.size(), 1u);
  EXPECT_EQ(out.failures[0].category, tinker::error_category::not_found);
  EXPECT_EQ(s.pending_samples(), 0u);
  ASSERT_TRUE(s.try_submit_sample(sample_on("m", 3), done()));
  ASSERT_TRUE(out.wait(2));
  EXPECT_EQ(out.results, (std::vector<std::string>{"3"}));
}

TEST(ServerScheduler, CloseModelFailsQueuedOpsAsNotFound) {
  recorder rec;
  sink out;
  request_scheduler s(one_worker(), fb_fn(rec), sample_fn(rec));
  s.open_model("m", 1);
  s.submit_forward_backward(fb_request("m", 2), out.fb());
  s.close_model("m");
  ASSERT_TRUE(out.wait(1));
  ASSERT_EQ(out.failures.size(), 1u);
  EXPECT_EQ(out.failures[0].category, tinker::error_category::not_found);
  EXPECT_EQ(s.next_seq_id("m"), -1);
}

TEST(ServerScheduler, UnorderedOpsRunBeforeTheModelsOrderedOps) {
  recorder rec;
  sink out;
  request_scheduler s(one_worker(), fb_fn(rec), sample_fn(rec));
  s.open_model("m", 1);
  s.submit_unordered(
      "m",
      [&] {
        rec.record("create");
        return std::string("m");
      },
      out.op());
  s.submit_forward_backward(fb_request("m", 1), out.fb());
  ASSERT_TRUE(out.wait(2));
  EXPECT_EQ(rec.snapshot(), (std::vector<std::string>{"create", "fb:1"}));
}

TEST(ServerScheduler, ShutdownFailsQueuedWork) {
  recorder rec;
  sink out;
  {
    request_scheduler s(one_worker(), fb_fn(rec), sample_fn(rec));
    s.open_model("m", 1);
    s.submit_forward_backward(fb_request("m", 3), out.fb());
  }
  ASSERT_EQ(out.failures.size(), 1u);
  EXPECT_EQ(out.failures[0].message, "server shutting down");
}

TEST(ServerScheduler, SkippedSeqIdsDoNotBlockLaterRequests) {
  recorder rec;
  sink out;
  request_scheduler s(one_worker(), fb_fn(rec), sample_fn(rec));
  s.open_model("m", 1);
  s.submit_forward_backward(fb_request("m", 2), out.fb());
  s.skip("m", 1); // seq 1 was refused at submission
  ASSERT_TRUE(out.wait(1));
  EXPECT_EQ(out.results, (std::vector<std::string>{"2"}));
  EXPECT_EQ(s.next_seq_id("m"), 3);
  s.skip("m", 2);       // passed: ignored
  s.skip("unknown", 1); // no state: ignored
  EXPECT_EQ(s.next_seq_id("unknown"), -1);
  s.submit_forward_backward(fb_request("m", 3), out.fb());
  ASSERT_TRUE(out.wait(2));
  EXPECT_EQ(rec.snapshot(), (std::vector<std::string>{"fb:2", "fb:3"}));
}

TEST(ServerScheduler, RejectsBadOptions) {
  recorder rec;
  auto make = [&](request_scheduler::options o) {
    request_scheduler s(o, fb_fn(rec), sample_fn(rec));
  };
  request_scheduler::options o;
  o.workers = 0;
  EXPECT_THROW(make(o), std::invalid_argument);
  o = {};
  o.gap_timeout = 0ms;
  EXPECT_THROW(make(o), std::invalid_argument);
  o = {};
  o.max_batch = 0;
  EXPECT_THROW(make(o), std::invalid_argument);
  o = {};
  o.max_pending_samples = 0;
  EXPECT_THROW(make(o), std::invalid_argument);
  EXPECT_THROW(request_scheduler(request_scheduler::options{}, nullptr, sample_fn(rec)),
               std::invalid_argument);
}

} // namespace
