// serve_bench: cost of the Tinker service's HTTP + future machinery, with a backend that computes
// nothing, over loopback. Prints the median latency of a bare `healthz` round trip (the peer: one
// HTTP request on a new connection), of a whole forward_backward future (protobuf submit, then
// retrieve_future until the protobuf result), and the future throughput of T client threads on
// T models, as a ratio to the bare round trip.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "actors/tinker_backend.hpp"
#include "bench/bench_util.hpp"
#include "service/future_store.hpp"
#include "service/http_server.hpp"
#include "service/tinker_client.hpp"

namespace {

using namespace rlforge;
namespace tinker = rlforge::tinker;

/// Answers every call at once with outputs of the right shape.
class null_backend : public actors::tinker_backend {
public:
  void create_model(const std::string&, const tinker::lora_config&, tinker::model_role) override {}
  bool has_model(const std::string&) override { return true; }
  void delete_model(const std::string&) override {}
  std::vector<tinker::forward_backward_output>
  forward_backward(const std::vector<tinker::forward_backward_request>& batch) override {
    std::vector<tinker::forward_backward_output> out(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      for (auto& d : batch[i].data) {
        tinker::tensor_data t;
        t.shape.push_back(static_cast<int64_t>(d.tokens.size()));
        t.floats.assign(d.tokens.size(), -1.0);
        out[i].loss_fn_outputs.push_back({{"logprobs", t}});
      }
      out[i].metrics["loss:sum"] = 1.0;
    }
    return out;
  }
  std::map<std::string, double> optim_step(const std::string&,
                                           const tinker::adam_params&) override {
    return {};
  }
  int64_t save_sampler_snapshot(const std::string&) override { return 1; }
  void export_sampler_weights(const std::string&, const tinker::checkpoint_ref&) override {}
  std::vector<tinker::sample_response>
  sample(const std::vector<tinker::sample_request>& rs) override {
    return std::vector<tinker::sample_response>(rs.size());
  }
  void save_checkpoint(const std::string&, const tinker::checkpoint_ref&, bool) override {}
  void load_checkpoint(const std::string&, const tinker::checkpoint_ref&, bool) override {}
  std::string base_model_name() const override { return "null"; }
  std::optional<std::string> tokenizer_id() const override { return std::nullopt; }
  int64_t max_context_length() const override { return 4096; }
  int64_t vocab_size() const override { return 32000; }
  actors::backend_stats stats() override { return {}; }
};

tinker::forward_backward_request request(const std::string& model, int64_t seq, int tokens) {
  tinker::forward_backward_request r;
  r.model_id = model;
  r.seq_id = seq;
  r.loss_fn = "cross_entropy";
  tinker::datum d;
  for (int i = 0; i < tokens; ++i)
    d.tokens.push_back(i % 1000);
  tinker::tensor_data targets;
  targets.type = tinker::dtype::int64;
  targets.shape.push_back(tokens);
  targets.ints = d.tokens;
  d.loss_fn_inputs["target_tokens"] = targets;
  r.data.push_back(d);
  return r;
}

} // namespace

int main(int argc, char** argv) {
  const char* synopsis = "[OPS (default 300)] [THREADS (default 4)]";
  long ops = 300, threads = 4;
  if (argc > 1 && !bench::parse_long(argv[1], 10, 1000000, ops))
    return bench::usage_error(argv[0], "OPS must be in 10..1000000", synopsis);
  if (argc > 2 && !bench::parse_long(argv[2], 1, 64, threads))
    return bench::usage_error(argv[0], "THREADS must be in 1..64", synopsis);
  auto dir = std::filesystem::temp_directory_path() /
             ("rlforge-serve-bench-" + std::to_string(::getpid()));
  null_backend backend;
  auto store = service::future_store::open((dir.string() + ".db"));
  service::server_options o;
  o.api_key = "bench";
  o.checkpoint_dir = dir.string();
  o.scheduler.workers = 2;
  service::http_server server(o, backend, *store);
  service::tinker_client client("127.0.0.1", server.start(), "bench");

  std::vector<double> health;
  for (long i = 0; i < ops; ++i) {
    auto t0 = bench::clock_type::now();
    if (client.get("healthz").status != 200)
      return std::fprintf(stderr, "serve_bench: healthz failed\n"), 1;
    health.push_back(bench::seconds_since(t0));
  }
  auto session = client.create_session();
  std::vector<std::string> models;
  for (long t = 0; t < threads; ++t)
    models.push_back(client.create_model(session, t, "null", {}));

  std::vector<double> futures;
  int64_t seq = 1;
  for (long i = 0; i < ops; ++i) {
    auto t0 = bench::clock_type::now();
    client.forward_backward(request(models[0], seq++, 128));
    futures.push_back(bench::seconds_since(t0));
  }

  long per_thread = ops / threads;
  auto t0 = bench::clock_type::now();
  std::vector<std::thread> pool;
  for (long t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      int64_t s = t == 0 ? seq : 1;
      for (long i = 0; i < per_thread; ++i)
        client.forward_backward(request(models[t], s++, 128));
    });
  for (auto& th : pool)
    th.join();
  double elapsed = bench::seconds_since(t0);
  double rate = static_cast<double>(per_thread * threads) / elapsed;

  double h = bench::median(health), f = bench::median(futures);
  std::printf("healthz round trip (new connection):        %8.1f us (median of %ld)\n", h * 1e6,
              ops);
  std::printf("forward_backward future, 1 datum x 128 tok: %8.1f us (median of %ld) = %.1fx a "
              "round trip\n",
              f * 1e6, ops, f / h);
  std::printf("futures/s with %ld client threads:          %8.0f /s (%.1fx 1/round trip)\n",
              threads, rate, rate * h);
  server.stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  for (auto suffix : {".db", ".db-wal", ".db-shm"})
    std::filesystem::remove(dir.string() + suffix, ec);
  return 0;
}
