#include "tests/cluster/cluster_fixture.hpp"

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

#include <caf/all.hpp>

#include "actors/cluster.hpp"
#include "actors/engine.hpp"
#include "actors/worker.hpp"
#include "backends/model/causal_lm.hpp"
#include "backends/model/model_config.hpp"
#include "runtime/errc.hpp"

namespace rlforge::cluster_test {

namespace fs = std::filesystem;

const char* rlforge_binary() {
  return RLFORGE_CLI_PATH;
}
const char* sft_example_binary() {
  return RLFORGE_SFT_EXAMPLE_PATH;
}
const char* grpo_example_binary() {
  return RLFORGE_GRPO_EXAMPLE_PATH;
}
const char* python_binary() {
  return RLFORGE_PYTHON_PATH;
}
std::string example_envs_dir() {
  return RLFORGE_EXAMPLE_ENVS_DIR;
}

namespace {

std::string make_temp_dir(const std::string& tag) {
  auto pattern = (fs::temp_directory_path() / ("rlforge_cluster_" + tag + "_XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr)
    throw std::runtime_error("mkdtemp failed for " + pattern);
  return pattern;
}

const std::map<std::string, std::string> child_env{{"OMP_WAIT_POLICY", "PASSIVE"},
                                                   {"OMP_NUM_THREADS", "1"}};

} // namespace

namespace {

/// `args` with the tolerant heartbeat settings unless they set their own.
std::vector<std::string> with_heartbeats(std::vector<std::string> args) {
  for (auto& a : args)
    if (a == "--dead-after-ms")
      return args;
  args.insert(args.end(), tolerant_heartbeats.begin(), tolerant_heartbeats.end());
  return args;
}

} // namespace

test_cluster::test_cluster(const std::string& tag, std::vector<std::string> head_args)
  : tag_(tag), dir_(make_temp_dir(tag)), head_args_(with_heartbeats(std::move(head_args))) {
  start_head();
}

test_cluster::~test_cluster() {
  nodes_.clear();
  head_.reset();
  // RLFORGE_KEEP_CLUSTER_LOGS=1 keeps the logs for a look after the run.
  if (const char* keep = std::getenv("RLFORGE_KEEP_CLUSTER_LOGS"); keep && *keep == '1') {
    std::fprintf(stderr, "cluster logs kept in %s\n", dir_.c_str());
    return;
  }
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void test_cluster::start_head() {
  std::vector<std::string> argv{rlforge_binary(), "head"};
  // The first start picks a free port; a restart takes the same one.
  auto port = endpoint_.empty() ? std::string{"0"} : endpoint_.substr(endpoint_.rfind(':') + 1);
  argv.insert(argv.end(), {"--port", port});
  argv.insert(argv.end(), head_args_.begin(), head_args_.end());
  auto log = dir_ + "/head" + std::to_string(starts_++) + ".log";
  head_ = std::make_unique<child_process>(argv, log, child_env);
  if (!head_->wait_for_log("rlforge head: listening on ", std::chrono::seconds(60)))
    throw std::runtime_error("the head did not start:\n" + head_->log());
  // "rlforge head: listening on 127.0.0.1:41234 (plain TCP)"
  endpoint_ = word_after(head_->log(), "rlforge head: listening on ");
}

void test_cluster::restart_head() {
  head_->kill();
  // The port may linger briefly; the head retries binding with SO_REUSEADDR.
  start_head();
}

child_process& test_cluster::add_node(const std::string& id, int gpus, int cpus,
                                      std::vector<std::string> extra,
                                      std::vector<std::string> wrapper) {
  std::vector<std::string> argv = wrapper;
  argv.insert(argv.end(), {rlforge_binary(), "node", "--head", endpoint_, "--node-id", id,
                           "--gpus", std::to_string(gpus), "--cpus", std::to_string(cpus)});
  extra = with_heartbeats(std::move(extra));
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto log = dir_ + "/node_" + id + "_" + std::to_string(nodes_.size()) + ".log";
  nodes_.erase(id);
  auto& p = nodes_[id] = std::make_unique<child_process>(argv, log, child_env);
  p->wait_for_log("joined cluster", std::chrono::seconds(60));
  return *p;
}

std::string test_cluster::logs() const {
  std::string out = "--- head:\n" + (head_ ? head_->log() : std::string{});
  for (auto& [id, p] : nodes_)
    out += "--- node " + id + ":\n" + p->log();
  return out;
}

test_driver::test_driver(const std::string& endpoint, std::vector<std::string> extra) {
  actors::register_worker_kinds();
  actors::register_engine_kind();
  std::vector<std::string> args{"--cluster", endpoint};
  bool heartbeats = false;
  for (auto& a : extra)
    heartbeats = heartbeats || a == "--dead-after-ms";
  if (!heartbeats)
    args.insert(args.end(), tolerant_heartbeats.begin(), tolerant_heartbeats.end());
  args.insert(args.end(), extra.begin(), extra.end());
  if (auto err = cfg_.parse_args(args)) {
    error_ = caf::to_string(err);
    return;
  }
  sys_ = std::make_unique<caf::actor_system>(cfg_);
  auto m = actors::placement_manager_for(*sys_, cfg_, std::chrono::seconds(30));
  if (!m) {
    error_ = error_message(m.error()).empty() ? sys_->render(m.error()) : error_message(m.error());
    return;
  }
  manager_ = *m;
  pgs_ = std::make_unique<actors::placement_client>(*sys_, manager_);
}

test_driver::~test_driver() {
  pgs_.reset();
  if (manager_)
    actors::stop_placement_manager(manager_);
  manager_ = caf::actor{};
  sys_.reset();
}

caf::expected<actors::actor_group> test_driver::spawn_group(const std::string& name,
                                                            const std::string& kind,
                                                            const placement_group_info& pg,
                                                            bool reserve) {
  actors::group_spec spec;
  spec.name = name;
  spec.kind = kind;
  spec.placement = pg;
  spec.threads_per_rank = 1;
  if (reserve)
    spec.placement_manager = manager_;
  return actors::actor_group::spawn(*sys_, spec);
}

nlohmann::json test_driver::status() {
  caf::scoped_actor self{*sys_};
  nlohmann::json out;
  self->request(manager_, std::chrono::seconds(10), cluster_status_atom::value)
    .receive([&](std::string& text) { out = nlohmann::json::parse(text); },
             [&](caf::error& err) { out = {{"error", sys_->render(err)}}; });
  return out;
}

std::vector<std::string> bundle_nodes(const placement_group_info& pg) {
  std::vector<std::string> out;
  for (auto& b : pg.bundles)
    out.push_back(b.node_id);
  return out;
}

tensor_blob f32_blob(const std::vector<float>& values) {
  tensor_blob b;
  b.dtype = dtype::f32;
  b.shape = {static_cast<int64_t>(values.size())};
  b.bytes.resize(values.size() * sizeof(float));
  std::memcpy(b.bytes.data(), values.data(), b.bytes.size());
  return b;
}

std::vector<float> floats(const tensor_blob& b) {
  std::vector<float> out(b.bytes.size() / sizeof(float));
  std::memcpy(out.data(), b.bytes.data(), b.bytes.size());
  return out;
}

nlohmann::json node_status(const nlohmann::json& status, const std::string& id) {
  if (status.contains("nodes"))
    for (auto& n : status["nodes"])
      if (n["id"] == id)
        return n;
  return nullptr;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (auto r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        !r.is_discarded())
      out.push_back(std::move(r));
  return out;
}

const std::map<std::string, std::string> passive_omp{{"OMP_WAIT_POLICY", "PASSIVE"}};

std::vector<std::string> grpo_split_job(const test_cluster& cluster, const std::string& tag,
                                        const std::vector<std::string>& extra) {
  const auto out = cluster.dir() + "/" + tag;
  std::vector<std::string> args{grpo_example_binary(), "--placement", "split", "--no-goal",
                                "--quiet", "--cluster", cluster.endpoint()};
  args.insert(args.end(), {"--metrics", out + ".jsonl", "--plot", out + ".png"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

served start_serve(test_cluster& cluster, const std::vector<std::string>& flags,
                   const std::vector<std::string>& heartbeats) {
  auto base = cluster.dir() + "/base";
  backends::causal_lm::random(backends::preset("tiny"), 7)->save_hf(base);
  std::vector<std::string> argv{rlforge_binary(), "serve", "--base-model", base, "--port", "0",
                                "--db", cluster.dir() + "/serve.db", "--checkpoint-dir",
                                cluster.dir() + "/checkpoints", "--insecure-no-auth",
                                "--cluster", cluster.endpoint()};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), heartbeats.begin(), heartbeats.end());
  served s;
  s.process = std::make_unique<child_process>(argv, cluster.dir() + "/serve.log", passive_omp);
  if (s.process->wait_for_log("http://127.0.0.1:", std::chrono::seconds(120))) {
    const auto log = s.process->log();
    s.port = std::atoi(log.c_str() + log.find("http://127.0.0.1:") + 17);
  }
  return s;
}

std::string quoted_after(const std::string& text, const std::string& prefix) {
  auto at = text.find(prefix);
  if (at == std::string::npos)
    return {};
  at += prefix.size();
  return text.substr(at, text.find('\'', at) - at);
}

} // namespace rlforge::cluster_test
