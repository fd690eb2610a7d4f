// serve_backend_bench: the Tinker service over the real backend (actors/dispatcher_backend) on a
// tiny random Llama, in-process, over loopback. Two measurements, one run each:
//  1. Overhead: rounds of {forward_backward (cross_entropy, protobuf) + optim_step} on a LoRA
//     model through HTTP (tinker_client: submit, then retrieve_future until final) against the
//     same calls on a second model made on the dispatcher_backend object directly, rounds
//     interleaved; medians and the ratio HTTP / direct. Then the latency of a retrieve_future
//     for a future already stored (median; on a new connection, as tinker_client does, and on a
//     keep-alive one), against a bare healthz round trip.
//  2. Load: SAMPLES asample submissions from THREADS threads, each on one keep-alive connection,
//     all submitted before any is retrieved. A 429 (sample queue full) is backed off and the
//     same seq_id resubmitted, as the SDK does. Then every future is retrieved and checked.
//     Prints completed / errors / 429s / wall time / samples per second; exits 1 on any error.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "actors/dispatcher_backend.hpp"
#include "bench/bench_util.hpp"
#include "bench/local_serve.hpp"
#include "service/tinker_client.hpp"
#include "service/wire/forward_backward_codec.hpp"
#include "service/wire/json_bodies.hpp"
#include "service/wire/sample_codec.hpp"
#include "tinker/types.hpp"

namespace {

using namespace rlforge;
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* prog = "serve_backend_bench";
constexpr const char* api_key = "bench";
constexpr int datums = 4, tokens_per_datum = 32;

/// A cross_entropy forward_backward of `datums` x `tokens_per_datum` tokens below `vocab`.
tinker::forward_backward_request fb_request(const std::string& model, int64_t seq, int64_t vocab) {
  tinker::forward_backward_request r;
  r.model_id = model;
  r.seq_id = seq;
  r.loss_fn = "cross_entropy";
  for (int row = 0; row < datums; ++row) {
    tinker::datum d;
    for (int i = 0; i < tokens_per_datum; ++i)
      d.tokens.push_back((3 + 7 * row + 13 * i) % vocab);
    tinker::tensor_data targets;
    targets.type = tinker::dtype::int64;
    targets.shape.push_back(tokens_per_datum);
    for (int i = 0; i < tokens_per_datum; ++i)
      targets.ints.push_back((3 + 7 * row + 13 * (i + 1)) % vocab);
    d.loss_fn_inputs["target_tokens"] = targets;
    r.data.push_back(d);
  }
  return r;
}

/// Throws unless `out` holds one `tokens_per_datum` log-prob vector per datum and a loss.
void check_output(const tinker::forward_backward_output& out, const char* path) {
  bool ok = out.loss_fn_outputs.size() == static_cast<size_t>(datums) &&
            out.metrics.count("loss:sum") == 1;
  for (auto& o : out.loss_fn_outputs)
    ok = ok && o.count("logprobs") == 1 &&
         o.at("logprobs").floats.size() == static_cast<size_t>(tokens_per_datum);
  if (!ok)
    throw std::runtime_error(std::string(path) + ": forward_backward output has the wrong shape");
}

httplib::Headers headers(const char* accept) {
  return {{"X-API-Key", api_key}, {"Accept", accept}};
}

std::string retrieve_body(const std::string& request_id) {
  return json{{"request_id", request_id}, {"allow_metadata_only", false}}.dump();
}

/// One long-poll retrieve_future on `cli`: the protobuf result, or "" while not final. Throws
/// naming the request for an HTTP error, no answer or a failed future.
std::string retrieve_once(httplib::Client& cli, const std::string& request_id) {
  auto r = cli.Post("/api/v1/retrieve_future", headers("application/x-protobuf"),
                    retrieve_body(request_id), "application/json");
  if (!r)
    throw std::runtime_error("retrieve_future " + request_id + ": no answer (" +
                             httplib::to_string(r.error()) + ")");
  if (r->status == 408 || r->status >= 500)
    return "";
  if (r->status != 200)
    throw std::runtime_error("retrieve_future " + request_id + ": HTTP " +
                             std::to_string(r->status) + " " + r->body);
  if (r->get_header_value("Content-Type").find("application/json") == 0) {
    auto j = json::parse(r->body);
    if (j.value("type", std::string()) == "try_again")
      return "";
    throw std::runtime_error("future " + request_id + " failed: " + r->body);
  }
  return r->body;
}

struct load_result {
  std::atomic<long> completed{0}, errors{0}, too_many{0};
  std::mutex mutex;
  std::string first_error;
  std::condition_variable all_submitted;
  long submitting = 0; ///< threads still submitting (guarded by `mutex`)
  bench::clock_type::time_point submitted_at;
  void error(const std::string& what) {
    ++errors;
    std::lock_guard<std::mutex> guard(mutex);
    if (first_error.empty())
      first_error = what;
  }
};

/// Thread `t` of `threads`: submits samples t, t+threads, ... (seq_id = index + 1) on one
/// keep-alive connection, resubmitting the same body after each 429 with a growing backoff,
/// waits until every thread has submitted, then retrieves and checks each of its futures.
void load_thread(int port, const std::string& session, long t, long threads, long samples,
                 int64_t vocab, load_result& out) {
  httplib::Client cli("127.0.0.1", port);
  cli.set_keep_alive(true);
  cli.set_tcp_nodelay(true); // as the SDK's asyncio transport: no Nagle wait on the body write
  cli.set_read_timeout(60, 0);
  std::vector<std::string> ids;
  for (long i = t; i < samples; i += threads) {
    std::vector<int64_t> prompt{1, (17 + i) % vocab, (42 + 3 * i) % vocab};
    auto body = service::tinker_client::sample_body(session, i + 1, prompt, 1, 4);
    auto backoff = std::chrono::milliseconds(10);
    for (;;) {
      auto r = cli.Post("/api/v1/asample", headers("application/json"), body, "application/json");
      if (r && r->status == 429) {
        ++out.too_many;
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
        continue;
      }
      if (!r || r->status != 200) {
        out.error("asample " + std::to_string(i + 1) + ": " +
                  (r ? "HTTP " + std::to_string(r->status) + " " + r->body
                     : "no answer (" + httplib::to_string(r.error()) + ")"));
        break;
      }
      ids.push_back(json::parse(r->body).at("request_id").get<std::string>());
      break;
    }
  }
  {
    // Every submission is in before any future is retrieved.
    std::unique_lock<std::mutex> lock(out.mutex);
    if (--out.submitting == 0) {
      out.submitted_at = bench::clock_type::now();
      out.all_submitted.notify_all();
    }
    out.all_submitted.wait(lock, [&] { return out.submitting == 0; });
  }
  for (auto& id : ids) {
    try {
      std::string result;
      auto deadline = bench::clock_type::now() + std::chrono::seconds(120);
      while ((result = retrieve_once(cli, id)).empty())
        if (bench::clock_type::now() > deadline)
          throw std::runtime_error("future " + id + " not final after 120 s");
      auto s = service::decode_sample_response_proto(result);
      if (s.sequences.size() != 1 || s.sequences[0].tokens.empty() ||
          s.sequences[0].tokens.size() != s.sequences[0].logprobs.size())
        throw std::runtime_error("future " + id + ": sample response has the wrong shape");
      ++out.completed;
    } catch (const std::exception& e) {
      out.error(e.what());
    }
  }
}

int run(long rounds, long samples, long threads, const fs::path& dir) {
  bench::local_serve serve(dir, api_key);
  auto& backend = serve.backend;
  auto& client = serve.client;
  const int port = serve.port();
  const int64_t vocab = backend.vocab_size();

  // ---- 1. overhead ---------------------------------------------------------------------------
  tinker::lora_config lora;
  lora.rank = 8;
  tinker::adam_params adam;
  adam.learning_rate = 1e-3;
  auto session = client.create_session();
  const auto http_model = client.create_model(session, 0, backend.base_model_name(), lora);
  const std::string direct_model = "bench-direct";
  backend.create_model(direct_model, lora, tinker::model_role::policy);

  int64_t seq = 1;
  std::vector<std::string> fb_ids;
  auto http_round = [&](std::vector<double>* fb_s) {
    auto t0 = bench::clock_type::now();
    auto id = client.submit_forward_backward(fb_request(http_model, seq++, vocab));
    auto r = client.wait_future(id, true);
    if (r.content_type.find("application/x-protobuf") != 0)
      throw std::runtime_error("HTTP forward_backward failed: " + r.body);
    check_output(service::decode_forward_backward_output_proto(r.body), "HTTP");
    if (fb_s)
      fb_s->push_back(bench::seconds_since(t0));
    client.optim_step(http_model, seq++, adam);
    fb_ids.push_back(id);
  };
  int64_t direct_seq = 1;
  auto direct_round = [&](std::vector<double>* fb_s) {
    auto t0 = bench::clock_type::now();
    auto out = backend.forward_backward({fb_request(direct_model, direct_seq++, vocab)});
    if (out.size() != 1)
      throw std::runtime_error("direct forward_backward: expected 1 output");
    check_output(out[0], "direct");
    if (fb_s)
      fb_s->push_back(bench::seconds_since(t0));
    backend.optim_step(direct_model, adam);
  };
  http_round(nullptr); // warm-up: first passes allocate
  direct_round(nullptr);
  std::vector<double> http_s, direct_s, http_fb, direct_fb;
  for (long i = 0; i < rounds; ++i) {
    auto t0 = bench::clock_type::now();
    http_round(&http_fb);
    http_s.push_back(bench::seconds_since(t0));
    t0 = bench::clock_type::now();
    direct_round(&direct_fb);
    direct_s.push_back(bench::seconds_since(t0));
  }

  // retrieve_future of stored futures (each was polled to completion above).
  std::vector<double> health, fresh, kept;
  httplib::Client keep("127.0.0.1", port);
  keep.set_keep_alive(true);
  keep.set_tcp_nodelay(true);
  const int per_id = 10;
  for (int k = 0; k < per_id; ++k)
    for (auto& id : fb_ids) {
      auto t0 = bench::clock_type::now();
      if (client.get("healthz").status != 200)
        throw std::runtime_error("healthz failed");
      health.push_back(bench::seconds_since(t0));
      t0 = bench::clock_type::now();
      auto r = client.wait_future(id, true);
      fresh.push_back(bench::seconds_since(t0));
      if (r.content_type.find("application/x-protobuf") != 0)
        throw std::runtime_error("stored future " + id + " is not a protobuf result: " + r.body);
      t0 = bench::clock_type::now();
      if (retrieve_once(keep, id).empty())
        throw std::runtime_error("stored future " + id + " answered try_again");
      kept.push_back(bench::seconds_since(t0));
    }

  const double a = bench::median(http_s), b = bench::median(direct_s);
  const double afb = bench::median(http_fb), bfb = bench::median(direct_fb);
  const double h = bench::median(health);
  std::printf("tiny Llama, LoRA rank 8, forward_backward %d datums x %d tokens (cross_entropy) + "
              "optim_step, %ld interleaved rounds each (medians):\n",
              datums, tokens_per_datum, rounds);
  std::printf("  round through HTTP (submit + retrieve_future): %8.2f ms\n", a * 1e3);
  std::printf("  round on dispatcher_backend directly:          %8.2f ms\n", b * 1e3);
  std::printf("  ratio HTTP / direct:                           %8.2fx (+%.2f ms a round)\n", a / b,
              (a - b) * 1e3);
  std::printf("  forward_backward alone: HTTP %.2f ms, direct %.2f ms, ratio %.2fx\n", afb * 1e3,
              bfb * 1e3, afb / bfb);
  std::printf("retrieve_future of a stored result (median of %zu):\n", fresh.size());
  std::printf("  new connection (tinker_client): %8.1f us = %.2fx a healthz round trip (%.1f us)\n",
              bench::median(fresh) * 1e6, bench::median(fresh) / h, h * 1e6);
  std::printf("  keep-alive connection:          %8.1f us\n", bench::median(kept) * 1e6);

  // ---- 2. load -------------------------------------------------------------------------------
  auto sampler = client.create_sampling_session(session, 0, "", backend.base_model_name());
  client.sample(sampler, 0, {1, 17, 42}, 1, 4); // warm-up: spawns the base engine
  load_result load;
  load.submitting = threads;
  auto t0 = bench::clock_type::now();
  std::vector<std::thread> pool;
  for (long t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { load_thread(port, sampler, t, threads, samples, vocab, load); });
  for (auto& th : pool)
    th.join();
  const double wall = bench::seconds_since(t0);
  std::printf(
      "load: %ld concurrent asample (1 sample, max_tokens 4) from %ld threads on keep-alive "
      "connections, sample queue bound %zu:\n",
      samples, threads, service::server_options{}.scheduler.max_pending_samples);
  std::printf("  completed %ld, errors %ld, 429 answers %ld (each resubmitted), all submitted "
              "after %.2f s, wall %.2f s, %.0f samples/s\n",
              load.completed.load(), load.errors.load(), load.too_many.load(),
              std::chrono::duration<double>(load.submitted_at - t0).count(), wall,
              static_cast<double>(load.completed.load()) / wall);
  if (load.errors.load() > 0 || load.completed.load() != samples) {
    std::fprintf(stderr, "%s: %ld of %ld samples failed; first error: %s\n", prog,
                 samples - load.completed.load(), samples, load.first_error.c_str());
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const char* synopsis = "[ROUNDS (default 50)] [SAMPLES (default 1000)] [THREADS (default 16)]";
  long rounds = 50, samples = 1000, threads = 16;
  if (argc > 4)
    return bench::usage_error(argv[0], "too many arguments", synopsis);
  if (argc > 1 && !bench::parse_long(argv[1], 1, 100000, rounds))
    return bench::usage_error(argv[0], "ROUNDS must be in 1..100000", synopsis);
  if (argc > 2 && !bench::parse_long(argv[2], 1, 1000000, samples))
    return bench::usage_error(argv[0], "SAMPLES must be in 1..1000000", synopsis);
  if (argc > 3 && !bench::parse_long(argv[3], 1, 64, threads))
    return bench::usage_error(argv[0], "THREADS must be in 1..64", synopsis);
  auto dir =
      fs::temp_directory_path() / ("rlforge-serve-backend-bench-" + std::to_string(::getpid()));
  int code = 1;
  try {
    code = run(rounds, samples, threads, dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", prog, e.what());
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return code;
}
