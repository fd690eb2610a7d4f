// The fused, chunked lm_head + log-prob (`backends::chunked_token_logprobs`: the [tokens x vocab]
// logits exist one chunk at a time, forward and backward) against the unfused path (all logits
// in fp32, log-softmax, gather), forward + backward of the mean log-prob, in bf16 mixed precision
// (bf16 products, fp32 log-softmax) at Qwen2.5's vocabulary. Each path runs in its own process
// (this program re-runs itself with --path) so that its peak resident memory is its own; the
// parent prints both medians, both peaks and the ratios.
//
//   logprob_bench [--tokens 1024] [--hidden 896] [--vocab 151936] [--chunk 256] [--reps 3]
//                 [--threads 2]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "backends/model/logprobs.hpp"
#include "backends/threads.hpp"

namespace be = rlforge::backends;

namespace {

struct options {
  int64_t tokens = 1024, hidden = 896, vocab = 151936, chunk = 256;
  int reps = 3, threads = 2;
  std::string path; // "fused" or "unfused": this process measures one path
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Runs one path `reps` times (after a warm-up) and prints {"seconds", "peak_rss_mib"}.
int measure(const options& o) {
  be::set_intra_op_threads(o.threads);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  auto hidden = (at::randn({o.tokens, o.hidden}, gen) * 0.5).requires_grad_(true);
  auto weight = (at::randn({o.vocab, o.hidden}, gen) * 0.02).requires_grad_(true);
  auto weight_bf16 = weight.detach().to(at::kBFloat16);
  auto targets = at::randint(0, o.vocab, {1, o.tokens}, gen, at::kLong);
  std::vector<double> times;
  for (int r = 0; r <= o.reps; ++r) {
    hidden.mutable_grad() = at::Tensor();
    weight.mutable_grad() = at::Tensor();
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor lp;
    if (o.path == "fused") {
      lp = be::chunked_token_logprobs(hidden.unsqueeze(0), weight, targets, 1.0, o.chunk, false,
                                      -1, {}, weight_bf16)
               .logprobs;
    } else {
      // The unfused bf16 path: every logit in fp32, then log-softmax and gather.
      auto logits = at::mm(hidden.to(at::kBFloat16), weight.to(at::kBFloat16).t()).to(at::kFloat);
      lp = at::log_softmax(logits, -1).gather(1, targets.view({-1, 1})).view({1, -1});
    }
    (-lp.mean()).backward();
    if (r > 0)
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  std::printf("%s\n", nlohmann::json{{"path", o.path},
                                     {"seconds", median(times)},
                                     {"peak_rss_mib", static_cast<double>(u.ru_maxrss) / 1024.0}}
                          .dump()
                          .c_str());
  return 0;
}

nlohmann::json run_child(const options& o, const std::string& path) {
  // The shell popen starts is /proc/self/exe there: name this program by its own path.
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof self - 1) <= 0)
    throw std::runtime_error("cannot read /proc/self/exe");
  std::string cmd = std::string(self) + " --path " + path + " --tokens " + std::to_string(o.tokens) +
                    " --hidden " + std::to_string(o.hidden) + " --vocab " + std::to_string(o.vocab) +
                    " --chunk " + std::to_string(o.chunk) + " --reps " + std::to_string(o.reps) +
                    " --threads " + std::to_string(o.threads);
  FILE* p = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p && std::fgets(buf, sizeof buf, p))
    out += buf;
  if (!p || ::pclose(p) != 0)
    throw std::runtime_error("the " + path + " run failed: " + out);
  return nlohmann::json::parse(out.substr(out.rfind('{')));
}

} // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "logprob_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    std::string v = argv[++i];
    if (a == "--tokens") o.tokens = std::atoll(v.c_str());
    else if (a == "--hidden") o.hidden = std::atoll(v.c_str());
    else if (a == "--vocab") o.vocab = std::atoll(v.c_str());
    else if (a == "--chunk") o.chunk = std::atoll(v.c_str());
    else if (a == "--reps") o.reps = std::atoi(v.c_str());
    else if (a == "--threads") o.threads = std::atoi(v.c_str());
    else if (a == "--path") o.path = v;
    else {
      std::fprintf(stderr, "usage: logprob_bench [--tokens N] [--hidden H] [--vocab V] "
                           "[--chunk C] [--reps R] [--threads T]\n");
      return 2;
    }
  }
  if (o.tokens < 1 || o.hidden < 1 || o.vocab < 2 || o.chunk < 1 || o.reps < 1 || o.threads < 1) {
    std::fprintf(stderr, "logprob_bench: sizes must be >= 1 (vocab >= 2)\n");
    return 2;
  }
  if (!o.path.empty())
    return measure(o);
  auto fused = run_child(o, "fused");
  auto unfused = run_child(o, "unfused");
  std::printf("logprob_bench: %lld tokens, hidden %lld, vocab %lld, bf16 products, forward + "
              "backward, %d threads\n",
              static_cast<long long>(o.tokens), static_cast<long long>(o.hidden),
              static_cast<long long>(o.vocab), o.threads);
  std::printf("  fused (chunks of %lld rows): %.3f s, peak RSS %.0f MiB\n",
              static_cast<long long>(o.chunk), fused["seconds"].get<double>(),
              fused["peak_rss_mib"].get<double>());
  std::printf("  unfused (all logits in fp32): %.3f s, peak RSS %.0f MiB\n",
              unfused["seconds"].get<double>(), unfused["peak_rss_mib"].get<double>());
  std::printf("  fused / unfused: time %.2fx, peak memory %.2fx\n",
              fused["seconds"].get<double>() / unfused["seconds"].get<double>(),
              fused["peak_rss_mib"].get<double>() / unfused["peak_rss_mib"].get<double>());
  return 0;
}
