// Weight-sync bandwidth of each transport for a ~100M-parameter Llama-shaped model (fp32, HF
// names): the trainer side sends `causal_lm::state_dict()`, the engine side receives into its
// own model's `named_parameters()`.
//
//   in_process  sender and receiver are threads of this process
//   shm         the receiver is a second process (fork), the segment is POSIX shared memory:
//               ring mode (default, 8 x 1 MiB slots) and whole-segment mode
//   gloo        2 ranks (threads) of a Gloo group over a TCP store on 127.0.0.1
//
// Each timed transfer is paired with a memcpy of the same bytes (every source tensor copied
// into a pre-touched destination of the same size, one thread) measured just before it, so both
// medians come from the same stretch of machine time. Prints GB/s (payload bytes / median time),
// the ratio to memcpy and the goal (in_process >= 0.8, shm >= 0.5, gloo: measured).
//
//   weight_sync_bench [--layers 1..48] [--iters 5..50] [--warmup 0..10] [--bucket-mb 1..4096]
//                     [--only in_process|shm|gloo]
#include <ATen/ATen.h>

#include <sys/wait.h>
#include <unistd.h>

#include "backends/collective_group.hpp"
#include "backends/error.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "backends/weights/gloo_transport.hpp"
#include "backends/weights/in_process_transport.hpp"
#include "backends/weights/shm_transport.hpp"
#include "backends/weights/weight_transport.hpp"
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

namespace {

namespace be = rlforge::backends;
using rlforge::bench::clock_type;
using rlforge::bench::gbps;
using rlforge::bench::median;
using rlforge::bench::parse_long;
using rlforge::bench::seconds_since;

constexpr std::chrono::milliseconds peer_timeout{60000};

struct settings {
  long layers = 12;
  long iters = 7;
  long warmup = 1;
  long bucket_mb = 256;
  std::string only;
};

// ~100M parameters at 12 layers: vocab 16384, hidden 768, 12 heads, 4 kv heads, MLP 2048.
be::model_config bench_config(long layers) {
  be::model_config c;
  c.arch = be::architecture::llama;
  c.vocab_size = 16384;
  c.hidden_size = 768;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 12;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 2048;
  c.max_position_embeddings = 2048;
  c.tie_word_embeddings = false;
  c.eos_token_ids = {};
  c.bos_token_id.reset();
  return c;
}

be::named_tensors trainer_weights(const be::model_config& c) {
  auto model = be::causal_lm::random(c, 1);
  be::named_tensors out;
  for (auto& [name, t] : model->state_dict())
    out.emplace_back(name, t.contiguous());
  return out;
}

// The engine's model; its parameters are the targets (kept alive by the returned model).
std::unique_ptr<be::causal_lm> engine_model(const be::model_config& c) {
  return be::causal_lm::random(c, 2);
}

std::uint64_t payload_bytes(const be::named_tensors& w) {
  std::uint64_t sum = 0;
  for (const auto& [name, t] : w)
    sum += t.nbytes();
  return sum;
}

bool same_bits(const be::named_tensors& a, const be::named_tensors& b) {
  if (a.size() != b.size())
    return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || a[i].second.nbytes() != b[i].second.nbytes() ||
        std::memcmp(a[i].second.data_ptr(), b[i].second.data_ptr(), a[i].second.nbytes()) != 0)
      return false;
  return true;
}

// Receiver-side tensors in the sender's order (names matched), for the bit-exact checks.
be::named_tensors in_order_of(const be::named_tensors& order, const be::named_tensors& targets) {
  be::named_tensors out;
  for (const auto& [name, t] : order)
    for (const auto& [n2, t2] : targets)
      if (n2 == name)
        out.emplace_back(name, t2);
  return out;
}

// The memcpy peer: every source tensor into a same-sized, already touched destination.
struct memcpy_peer {
  explicit memcpy_peer(const be::named_tensors& src) : src_(src) {
    for (const auto& [name, t] : src)
      dst_.push_back(std::vector<char>(t.nbytes(), 1));
  }
  double time_once() {
    auto start = clock_type::now();
    for (std::size_t i = 0; i < src_.size(); ++i)
      std::memcpy(dst_[i].data(), src_[i].second.data_ptr(), dst_[i].size());
    auto t = seconds_since(start);
    if (!dst_.empty() && !dst_.front().empty())
      sink_ += dst_.front()[dst_.front().size() / 2]; // keep the copies observable
    return t;
  }
  const be::named_tensors& src_;
  std::vector<std::vector<char>> dst_;
  long sink_ = 0;
};

struct series {
  std::vector<double> transfer;
  std::vector<double> memcpy;
};

// Runs `warmup + iters` sends (versions 1, 2, ...), each preceded by one memcpy timing.
series time_sends(const settings& s, memcpy_peer& peer,
                  const std::function<void(std::uint64_t)>& send, std::uint64_t first_version = 1) {
  series out;
  for (long i = 0; i < s.warmup + s.iters; ++i) {
    auto m = peer.time_once();
    auto start = clock_type::now();
    send(first_version + static_cast<std::uint64_t>(i));
    auto t = seconds_since(start);
    if (i >= s.warmup) {
      out.memcpy.push_back(m);
      out.transfer.push_back(t);
    }
  }
  return out;
}

void report(const char* name, const series& r, double bytes, const char* goal, double goal_ratio) {
  auto tgbps = gbps(bytes, r.transfer);
  auto mgbps = gbps(bytes, r.memcpy);
  auto ratio = tgbps / mgbps;
  std::printf("%-30s %6.2f GB/s (median %.1f ms of %zu) | memcpy %5.2f GB/s | ratio %.2f | %s",
              name, tgbps, median(r.transfer) * 1e3, r.transfer.size(), mgbps, ratio, goal);
  if (goal_ratio > 0)
    std::printf(": %s", ratio >= goal_ratio ? "met" : "missed");
  std::printf("\n");
}

int run_in_process(const settings& s, const be::named_tensors& w, memcpy_peer& peer,
                   be::named_tensors& targets) {
  be::transport_options o;
  o.bucket_bytes = static_cast<std::uint64_t>(s.bucket_mb) << 20;
  o.timeout = peer_timeout;
  auto ch = std::make_shared<be::in_process_channel>(o);
  be::in_process_sender sender(ch);
  be::in_process_receiver receiver(ch);
  series r;
  if (!rlforge::bench::run_with_peer_thread(
          "weight_sync_bench", "in_process sender",
          [&] { r = time_sends(s, peer, [&](std::uint64_t v) { sender.send(w, v); }); },
          "in_process receiver",
          [&] {
            for (long i = 0; i < s.warmup + s.iters; ++i)
              receiver.receive(targets);
          }))
    return 1;
  report("in_process (2 threads)", r, double(payload_bytes(w)), "goal >= 0.8", 0.8);
  if (!same_bits(w, in_order_of(w, targets))) {
    std::printf("ERROR: in_process: the engine's weights differ from the trainer's\n");
    return 1;
  }
  return 0;
}

// The engine process of the shm runs (ring mode, then whole-segment mode; the receiver follows
// whichever the descriptor says): receives every transfer, then checks the last one's bits
// against the trainer's weights rebuilt from the same seed.
int shm_engine(const settings& s, const be::model_config& c,
               std::shared_ptr<be::shm_link> link) {
  try {
    auto engine = engine_model(c);
    auto targets = engine->named_parameters();
    be::transport_options o;
    o.bucket_bytes = static_cast<std::uint64_t>(s.bucket_mb) << 20;
    o.timeout = peer_timeout;
    be::shm_receiver receiver(std::move(link), o);
    for (long i = 0; i < 2 * (s.warmup + s.iters); ++i)
      receiver.receive(targets);
    auto w = trainer_weights(c);
    return same_bits(w, in_order_of(w, targets)) ? 0 : 3;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weight_sync_bench: shm engine process: %s\n", e.what());
    return 1;
  }
}

int run_shm(const settings& s, const be::model_config& c, const be::named_tensors& w,
            memcpy_peer& peer, std::shared_ptr<be::shm_link> link, pid_t child) {
  be::transport_options o;
  o.bucket_bytes = static_cast<std::uint64_t>(s.bucket_mb) << 20;
  o.timeout = peer_timeout;
  int code = 0;
  try {
    be::shm_options ring; // the default: 8 slots of 1 MiB
    be::shm_sender sender(link, o, ring);
    auto r = time_sends(s, peer, [&](std::uint64_t v) { sender.send(w, v); });
    report("shm ring (2 processes)", r, double(payload_bytes(w)), "goal >= 0.5", 0.5);
    be::shm_options whole;
    whole.ring_slot_bytes = 0;
    be::shm_sender whole_sender(link, o, whole);
    auto first = static_cast<std::uint64_t>(s.warmup + s.iters + 1);
    auto rw = time_sends(s, peer, [&](std::uint64_t v) { whole_sender.send(w, v); }, first);
    report("shm whole segment (2 proc.)", rw, double(payload_bytes(w)), "goal >= 0.5", 0.5);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "weight_sync_bench: shm sender: %s\n", e.what());
    code = 1;
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::printf("ERROR: shm: the engine process failed (status %d%s)\n", status,
                WIFEXITED(status) && WEXITSTATUS(status) == 3 ? ": weights differ" : "");
    code = 1;
  }
  return code;
}

int run_gloo(const settings& s, const be::named_tensors& w, memcpy_peer& peer,
             be::named_tensors& targets) {
  be::collective_options co;
  co.timeout = peer_timeout;
  co.group_name = "weight_sync_bench";
  auto server = be::make_tcp_store("127.0.0.1", 0, true, 2, peer_timeout);
  auto client = be::make_tcp_store("127.0.0.1", server.port(), false, 2, peer_timeout);
  be::transport_options o;
  o.bucket_bytes = static_cast<std::uint64_t>(s.bucket_mb) << 20;
  series r;
  if (!rlforge::bench::run_with_peer_thread(
          "weight_sync_bench", "gloo sender",
          [&] {
            auto g = be::collective_group::create(server, 0, 2, co);
            be::gloo_sender sender(*g, o);
            r = time_sends(s, peer, [&](std::uint64_t v) { sender.send(w, v); });
          },
          "gloo receiver",
          [&] {
            auto g = be::collective_group::create(client, 1, 2, co);
            be::gloo_receiver receiver(*g, o);
            for (long i = 0; i < s.warmup + s.iters; ++i)
              receiver.receive(targets);
          }))
    return 1;
  report("gloo (2 ranks, TCP loopback)", r, double(payload_bytes(w)), "measured, no goal", 0);
  if (!same_bits(w, in_order_of(w, targets))) {
    std::printf("ERROR: gloo: the engine's weights differ from the trainer's\n");
    return 1;
  }
  return 0;
}

int usage(const std::string& why) {
  return rlforge::bench::usage_error("weight_sync_bench", why,
                                     "[--layers 1..48] [--iters 5..50] [--warmup 0..10] "
                                     "[--bucket-mb 1..4096] [--only in_process|shm|gloo]");
}

} // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc)
      return usage("missing value after " + flag);
    const char* value = argv[++i];
    bool ok = true;
    if (flag == "--layers")
      ok = parse_long(value, 1, 48, s.layers);
    else if (flag == "--iters")
      ok = parse_long(value, 5, 50, s.iters);
    else if (flag == "--warmup")
      ok = parse_long(value, 0, 10, s.warmup);
    else if (flag == "--bucket-mb")
      ok = parse_long(value, 1, 4096, s.bucket_mb);
    else if (flag == "--only") {
      s.only = value;
      ok = s.only == "in_process" || s.only == "shm" || s.only == "gloo";
    } else
      return usage("unknown flag " + flag);
    if (!ok)
      return usage(std::string("bad value '") + value + "' for " + flag);
  }
  auto wanted = [&](const char* name) { return s.only.empty() || s.only == name; };
  auto config = bench_config(s.layers);

  // The engine process is forked before this process runs any torch operation or starts a
  // thread, so the child starts from a clean runtime.
  std::shared_ptr<be::shm_link> trainer_end;
  pid_t child = -1;
  if (wanted("shm")) {
    auto [a, b] = be::make_socket_link_pair();
    child = ::fork();
    if (child < 0) {
      std::perror("weight_sync_bench: fork");
      return 1;
    }
    if (child == 0) {
      a.reset();
      std::fflush(stdout);
      ::_exit(shm_engine(s, config, std::move(b)));
    }
    trainer_end = std::move(a);
  }

  auto w = trainer_weights(config);
  auto engine = engine_model(config);
  auto targets = engine->named_parameters();
  memcpy_peer peer(w);
  std::printf("weight_sync_bench: %.1fM parameters, %.1f MB in %zu tensors, bucket %ld MB, "
              "median of %ld (after %ld warm-up)\n",
              double(be::num_parameters(config)) / 1e6, double(payload_bytes(w)) / 1e6, w.size(),
              s.bucket_mb, s.iters, s.warmup);
  std::fflush(stdout);
  int code = 0;
  if (wanted("in_process"))
    code |= run_in_process(s, w, peer, targets);
  if (wanted("shm"))
    code |= run_shm(s, config, w, peer, std::move(trainer_end), child);
  if (wanted("gloo"))
    code |= run_gloo(s, w, peer, targets);
  return code;
}
