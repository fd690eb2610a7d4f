// serve_chunked_bench: a large forward_backward sent the way the Tinker SDK sends it, against the
// same datums sent as sequential calls, through `rlforge serve`'s HTTP API over loopback on the
// real backend (actors/dispatcher_backend, a tiny random Llama, LoRA rank 8).
//
//  - chunked: DATUMS datums split as the SDK 0.25 splits them (chunks of at most 1,024 datums),
//    consecutive seq_ids, every chunk but the first submitted concurrently from its own thread,
//    then the first (the SDK submits it last so the server sees the whole range at once); then
//    every future is retrieved.
//  - sequential: the same datums as three calls of DATUMS / 3, each submitted after the previous
//    one's result came back.
//
// Rounds alternate between the two on two models of the same server. Prints the medians, the
// ratio chunked / sequential (the goal is <= 1: merging must not cost more than sequential
// calls), and the loss sums of both (equal up to summation order). Exits 1 on any failure.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <future>
#include <string>
#include <unistd.h>
#include <vector>


#include "actors/dispatcher_backend.hpp"
#include "bench/bench_util.hpp"
#include "bench/local_serve.hpp"
#include "service/tinker_client.hpp"
#include "service/wire/forward_backward_codec.hpp"
#include "tinker/types.hpp"

namespace {

using namespace rlforge;
namespace fs = std::filesystem;

constexpr const char* prog = "serve_chunked_bench";
constexpr const char* api_key = "bench";
constexpr size_t sdk_chunk_datums =
    1024; // SDK 0.25: fwdbwd_max_chunk_len // SDK 0.25: fwdbwd_max_chunk_len

/// Datum i: 16..63 input tokens below `vocab`, targets the shifted inputs.
tinker::datum make_datum(size_t i, int64_t vocab) {
  tinker::datum d;
  const size_t n = 16 + (i * 37) % 48;
  tinker::tensor_data targets;
  targets.type = tinker::dtype::int64;
  targets.shape.push_back(static_cast<int64_t>(n));
  for (size_t k = 0; k <= n; ++k) {
    int64_t token = static_cast<int64_t>((3 + 7 * i + 13 * k) % static_cast<size_t>(vocab));
    if (k < n)
      d.tokens.push_back(token);
    if (k > 0)
      targets.ints.push_back(token);
  }
  d.loss_fn_inputs["target_tokens"] = targets;
  return d;
}

tinker::forward_backward_request request(const std::string& model, int64_t seq,
                                         const std::vector<tinker::datum>& all, size_t begin,
                                         size_t end) {
  tinker::forward_backward_request r;
  r.model_id = model;
  r.seq_id = seq;
  r.loss_fn = "cross_entropy";
  r.data.assign(all.begin() + static_cast<long>(begin), all.begin() + static_cast<long>(end));
  return r;
}

/// The loss sum of a finished forward_backward future; throws when it failed or has the wrong
/// number of outputs.
double loss_of(const service::tinker_client& client, const std::string& id, size_t datums) {
  auto r = client.wait_future(id, true);
  if (r.content_type.find("application/x-protobuf") != 0)
    throw std::runtime_error("forward_backward " + id + " failed: " + r.body);
  auto out = service::decode_forward_backward_output_proto(r.body);
  if (out.loss_fn_outputs.size() != datums)
    throw std::runtime_error("forward_backward " + id + ": " +
                             std::to_string(out.loss_fn_outputs.size()) + " outputs for " +
                             std::to_string(datums) + " datums");
  return out.metrics.at("loss:sum");
}

int run(long datums, long rounds, const fs::path& dir) {
  bench::local_serve serve(dir, api_key);
  auto& backend = serve.backend;
  auto& client = serve.client;
  const int64_t vocab = backend.vocab_size();

  std::vector<tinker::datum> all;
  size_t tokens = 0;
  for (long i = 0; i < datums; ++i) {
    all.push_back(make_datum(static_cast<size_t>(i), vocab));
    tokens += all.back().tokens.size();
  }
  tinker::lora_config lora;
  lora.rank = 8;
  auto session = client.create_session();
  const auto chunked_model = client.create_model(session, 0, backend.base_model_name(), lora);
  const auto sequential_model = client.create_model(session, 1, backend.base_model_name(), lora);
  int64_t chunked_seq = 1, sequential_seq = 1;
  const size_t n = all.size();

  auto chunked_round = [&](double& loss) {
    std::vector<std::pair<size_t, size_t>> chunks;
    for (size_t b = 0; b < n; b += sdk_chunk_datums)
      chunks.emplace_back(b, std::min(n, b + sdk_chunk_datums));
    const int64_t first_seq = chunked_seq;
    chunked_seq += static_cast<int64_t>(chunks.size());
    auto t0 = bench::clock_type::now();
    std::vector<std::future<std::string>> rest;
    for (size_t c = 1; c < chunks.size(); ++c)
      rest.push_back(std::async(std::launch::async, [&, c] {
        return client.submit_forward_backward(
            request(chunked_model, first_seq + int64_t(c), all, chunks[c].first, chunks[c].second));
      }));
    std::vector<std::string> ids(chunks.size());
    for (size_t c = 1; c < chunks.size(); ++c)
      ids[c] = rest[c - 1].get();
    ids[0] = client.submit_forward_backward(
        request(chunked_model, first_seq, all, chunks[0].first, chunks[0].second));
    loss = 0;
    for (size_t c = 0; c < chunks.size(); ++c)
      loss += loss_of(client, ids[c], chunks[c].second - chunks[c].first);
    return bench::seconds_since(t0);
  };
  auto sequential_round = [&](double& loss) {
    auto t0 = bench::clock_type::now();
    loss = 0;
    for (size_t part = 0; part < 3; ++part) {
      size_t b = n * part / 3, e = n * (part + 1) / 3;
      auto id =
          client.submit_forward_backward(request(sequential_model, sequential_seq++, all, b, e));
      loss += loss_of(client, id, e - b);
    }
    return bench::seconds_since(t0);
  };

  // The same two shapes on the backend object directly (no HTTP, no scheduler): the SDK's chunks
  // as one merged call, and three separate calls.
  const std::string direct_model = "bench-direct";
  backend.create_model(direct_model, lora, tinker::model_role::policy);
  int64_t direct_seq = 1;
  auto direct_merged = [&] {
    std::vector<tinker::forward_backward_request> batch;
    for (size_t b = 0; b < n; b += sdk_chunk_datums)
      batch.push_back(
          request(direct_model, direct_seq++, all, b, std::min(n, b + sdk_chunk_datums)));
    auto t0 = bench::clock_type::now();
    backend.forward_backward(batch);
    return bench::seconds_since(t0);
  };
  auto direct_separate = [&] {
    auto t0 = bench::clock_type::now();
    for (size_t part = 0; part < 3; ++part)
      backend.forward_backward(
          {request(direct_model, direct_seq++, all, n * part / 3, n * (part + 1) / 3)});
    return bench::seconds_since(t0);
  };

  double chunked_loss = 0, sequential_loss = 0;
  chunked_round(chunked_loss); // warm-up: the first passes allocate
  sequential_round(sequential_loss);
  std::vector<double> chunked_s, sequential_s, merged_s, separate_s;
  for (long r = 0; r < rounds; ++r) {
    chunked_s.push_back(chunked_round(chunked_loss));
    sequential_s.push_back(sequential_round(sequential_loss));
    merged_s.push_back(direct_merged());
    separate_s.push_back(direct_separate());
  }

  const double a = bench::median(chunked_s), b = bench::median(sequential_s);
  std::printf("tiny Llama, LoRA rank 8, forward_backward (cross_entropy) of %zu datums, %zu "
              "tokens (16-63 a datum), %ld interleaved rounds each (medians):\n",
              n, tokens, rounds);
  std::printf("  chunked as the SDK sends it (%zu chunks of <= %zu, in parallel, first last): "
              "%8.3f s\n",
              (n + sdk_chunk_datums - 1) / sdk_chunk_datums, sdk_chunk_datums, a);
  std::printf("  three sequential calls of %zu datums:                              %8.3f s\n",
              n / 3, b);
  std::printf("  ratio chunked / sequential: %.2fx (goal <= 1)\n", a / b);
  std::printf("  on the backend directly: SDK chunks as one call %.3f s, three separate calls "
              "%.3f s (ratio %.2fx)\n",
              bench::median(merged_s), bench::median(separate_s),
              bench::median(merged_s) / bench::median(separate_s));
  std::printf("  loss:sum chunked %.6f, sequential %.6f (relative difference %.1e)\n", chunked_loss,
              sequential_loss,
              std::abs(chunked_loss - sequential_loss) /
                  std::max(1e-12, std::abs(sequential_loss)));
  if (std::abs(chunked_loss - sequential_loss) > 1e-3 * std::abs(sequential_loss)) {
    std::fprintf(stderr, "%s: the two paths disagree on the loss\n", prog);
    return 1;
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  const char* synopsis = "[DATUMS (default 3000)] [ROUNDS (default 5)]";
  long datums = 3000, rounds = 5;
  if (argc > 3)
    return bench::usage_error(argv[0], "too many arguments", synopsis);
  if (argc > 1 && !bench::parse_long(argv[1], 3, 100000, datums))
    return bench::usage_error(argv[0], "DATUMS must be in 3..100000", synopsis);
  if (argc > 2 && !bench::parse_long(argv[2], 1, 1000, rounds))
    return bench::usage_error(argv[0], "ROUNDS must be in 1..1000", synopsis);
  auto dir =
      fs::temp_directory_path() / ("rlforge-serve-chunked-bench-" + std::to_string(::getpid()));
  int code = 1;
  try {
    code = run(datums, rounds, dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", prog, e.what());
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return code;
}
