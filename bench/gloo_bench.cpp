// Gloo broadcast and all-reduce (SUM) bandwidth between 2 ranks through collective_group, as 2
// threads of this process and as 2 processes (this program starts a copy of itself), each over
// a TCP store on 127.0.0.1. Prints algbw (bytes / median time) and its ratio to a memcpy of the
// same size measured in the same run.
//
//   gloo_bench [--mb N] [--iters N] [--warmup N] [--mode threads|processes|both]
#include <ATen/ATen.h>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/collective_group.hpp"
#include "backends/error.hpp"
#include "bench_util.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using namespace rlforge::backends;
using rlforge::bench::clock_type;
using rlforge::bench::gbps;
using rlforge::bench::median;
using rlforge::bench::parse_long;
using rlforge::bench::seconds_since;

constexpr std::chrono::milliseconds group_timeout{20000};
constexpr int64_t bucketed_pieces = 64;

struct settings {
  int64_t mb = 64;
  int iters = 9;
  int warmup = 2;
  std::string mode = "both";
  // Internal: the child process of --mode processes.
  bool worker = false;
  int rank = 0;
  int port = 0;
};

struct rank_times {
  std::vector<double> broadcast;
  std::vector<double> all_reduce;
  std::vector<double> bucketed;
  bool correct = true;
};

// Times one collective `iters` times after `warmup` untimed runs; a barrier lines the ranks up
// before each run so every sample measures the collective alone.
std::vector<double> time_op(collective_group& g, const settings& s,
                            const std::function<void()>& prepare, const std::function<void()>& op) {
  std::vector<double> out;
  for (int i = 0; i < s.warmup + s.iters; ++i) {
    prepare();
    g.barrier();
    auto start = clock_type::now();
    op();
    auto t = seconds_since(start);
    if (i >= s.warmup)
      out.push_back(t);
  }
  return out;
}

rank_times run_rank(const store_handle& store, int rank, const settings& s) {
  collective_options opts;
  opts.timeout = group_timeout;
  auto g = collective_group::create(store, rank, 2, opts);
  const int64_t numel = s.mb * (int64_t{1} << 20) / 4;
  rank_times r;
  auto t = at::empty({numel}, at::kFloat);
  float mine = float(rank + 1);

  // Correctness once, against closed forms: broadcast from 0 gives 1, the sum gives 1 + 2.
  t.fill_(mine);
  g->broadcast(t, 0);
  r.correct = r.correct && t.eq(1.0f).all().item<bool>();
  t.fill_(mine);
  g->all_reduce_sum(t);
  r.correct = r.correct && t.eq(3.0f).all().item<bool>();

  r.broadcast = time_op(
      *g, s, [&] {}, [&] { g->broadcast(t, 0); });
  r.all_reduce = time_op(
      *g, s, [&] { t.fill_(mine); }, [&] { g->all_reduce_sum(t); });

  std::vector<at::Tensor> pieces;
  for (int64_t i = 0; i < bucketed_pieces; ++i)
    pieces.push_back(at::empty({numel / bucketed_pieces}, at::kFloat));
  r.bucketed = time_op(
      *g, s,
      [&] {
        for (auto& p : pieces)
          p.fill_(mine);
      },
      [&] { g->all_reduce_sum(pieces); });
  for (auto& p : pieces)
    r.correct = r.correct && p.eq(3.0f).all().item<bool>();
  g->barrier();
  return r;
}

double memcpy_gbps(std::size_t bytes, int reps) {
  std::vector<char> a(bytes, 1);
  std::vector<char> b(bytes, 0); // both touched before timing
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    auto start = clock_type::now();
    std::memcpy(b.data(), a.data(), bytes);
    times.push_back(seconds_since(start));
    a[static_cast<std::size_t>(i)] = static_cast<char>(i); // the compiler must copy every time
  }
  if (b[bytes / 2] != 1)
    std::fprintf(stderr, "memcpy baseline copied the wrong bytes\n");
  return gbps(double(bytes), times);
}

void report(const char* name, const std::string& size, const char* how,
            const std::vector<double>& times, double bytes, double memcpy) {
  auto algbw = gbps(bytes, times);
  std::printf("%-28s %-9s 2 ranks, %-9s: %6.2f GB/s (median of %zu) | memcpy %.1f GB/s | "
              "ratio %.2f\n",
              name, size.c_str(), how, algbw, times.size(), memcpy, algbw / memcpy);
}

void print_results(const rank_times& r, const settings& s, const char* how, double memcpy) {
  auto bytes = double(s.mb) * double(1 << 20);
  auto size = std::to_string(s.mb) + "MB";
  report("gloo.broadcast", size, how, r.broadcast, bytes, memcpy);
  report("gloo.all_reduce_sum", size, how, r.all_reduce, bytes, memcpy);
  report("gloo.all_reduce_sum.bucketed",
         std::to_string(bucketed_pieces) + "x" + std::to_string(s.mb * 1024 / bucketed_pieces) +
             "KB",
         how, r.bucketed, bytes, memcpy);
  if (!r.correct)
    std::printf("ERROR: a collective returned wrong values (%s)\n", how);
}

int run_threads(const settings& s, double memcpy) {
  auto server = make_tcp_store("127.0.0.1", 0, true, 2, group_timeout);
  auto client = make_tcp_store("127.0.0.1", server.port(), false, 2, group_timeout);
  rank_times r0;
  rank_times r1;
  if (!rlforge::bench::run_with_peer_thread(
          "gloo_bench", "rank 0", [&] { r0 = run_rank(server, 0, s); }, "rank 1",
          [&] { r1 = run_rank(client, 1, s); }))
    return 1;
  print_results(r0, s, "threads", memcpy);
  return r0.correct && r1.correct ? 0 : 1;
}

int run_processes(const settings& s, const char* self, double memcpy) {
  auto server = make_tcp_store("127.0.0.1", 0, true, 2, group_timeout);
  std::vector<std::string> args{self,       "--worker",
                                "--rank",   "1",
                                "--port",   std::to_string(server.port()),
                                "--mb",     std::to_string(s.mb),
                                "--iters",  std::to_string(s.iters),
                                "--warmup", std::to_string(s.warmup)};
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child = 0;
  if (int rc = ::posix_spawn(&child, self, nullptr, nullptr, argv.data(), environ); rc != 0) {
    std::fprintf(stderr, "gloo_bench: cannot start %s: %s\n", self, std::strerror(rc));
    return 1;
  }
  int code = 0;
  rank_times r0;
  try {
    r0 = run_rank(server, 0, s);
    print_results(r0, s, "processes", memcpy);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench: rank 0: %s\n", e.what());
    code = 1;
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "gloo_bench: the rank 1 process failed (status %d)\n", status);
    code = 1;
  }
  return code != 0 ? code : (r0.correct ? 0 : 1);
}

int run_worker(const settings& s) {
  try {
    auto store =
        make_tcp_store("127.0.0.1", static_cast<std::uint16_t>(s.port), false, 2, group_timeout);
    auto r = run_rank(store, s.rank, s);
    return r.correct ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_bench: rank %d process: %s\n", s.rank, e.what());
    return 1;
  }
}

int usage(const std::string& why) {
  return rlforge::bench::usage_error(
      "gloo_bench", why,
      "[--mb 1..1024] [--iters 1..100] [--warmup 0..20] [--mode threads|processes|both]");
}

} // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--worker") {
      s.worker = true;
      continue;
    }
    if (i + 1 >= argc)
      return usage("missing value after " + flag);
    const char* value = argv[++i];
    long v = 0;
    if (flag == "--mode") {
      s.mode = value;
      if (s.mode != "threads" && s.mode != "processes" && s.mode != "both")
        return usage("--mode must be threads, processes or both, got '" + s.mode + "'");
    } else if (flag == "--mb") {
      if (!parse_long(value, 1, 1024, v))
        return usage("--mb must be in [1, 1024], got '" + std::string(value) + "'");
      s.mb = v;
    } else if (flag == "--iters") {
      if (!parse_long(value, 1, 100, v))
        return usage("--iters must be in [1, 100], got '" + std::string(value) + "'");
      s.iters = int(v);
    } else if (flag == "--warmup") {
      if (!parse_long(value, 0, 20, v))
        return usage("--warmup must be in [0, 20], got '" + std::string(value) + "'");
      s.warmup = int(v);
    } else if (flag == "--rank") {
      if (!parse_long(value, 0, 1, v))
        return usage("--rank must be 0 or 1, got '" + std::string(value) + "'");
      s.rank = int(v);
    } else if (flag == "--port") {
      if (!parse_long(value, 1, 65535, v))
        return usage("--port must be in [1, 65535], got '" + std::string(value) + "'");
      s.port = int(v);
    } else {
      return usage("unknown flag '" + flag + "'");
    }
  }
  if (s.worker)
    return run_worker(s);

  auto bytes = static_cast<std::size_t>(s.mb) << 20;
  auto memcpy = memcpy_gbps(bytes, 15);
  std::printf("# algbw = bytes / median time; GB = 1e9 bytes; memcpy of %lld MB measured now "
              "(median of 15)\n",
              static_cast<long long>(s.mb));
  int code = 0;
  if (s.mode == "threads" || s.mode == "both")
    code |= run_threads(s, memcpy);
  if (s.mode == "processes" || s.mode == "both") {
    char self[4096];
    auto n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
      std::fprintf(stderr, "gloo_bench: cannot find this program's path\n");
      return 1;
    }
    self[n] = '\0';
    code |= run_processes(s, self, memcpy);
  }
  return code;
}
