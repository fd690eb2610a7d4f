#pragma once
// Multi-process clusters on 127.0.0.1 for the tests: `rlforge head` and `rlforge node` run as
// child processes (process.hpp: killed by pid when the test ends, and with the test process);
// this test process attaches to them as a driver. Logs go to a temporary directory removed at
// the end (kept with RLFORGE_KEEP_CLUSTER_LOGS=1); a failing test prints them.
#include <chrono>
#include <thread>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <nlohmann/json.hpp>

#include "actors/actor_group.hpp"
#include "actors/engine.hpp"
#include "actors/placement_manager.hpp"
#include "actors/rank_actor.hpp"
#include "runtime/system_config.hpp"
#include "tests/cluster/process.hpp"

namespace rlforge::cluster_test {

/// The rlforge binary and the example drivers (paths from the build).
const char* rlforge_binary();
const char* sft_example_binary();
const char* grpo_example_binary();

/// The Python interpreter the build found and the example environments' folder
/// (examples/envs), for --env runs; python is "" when the build found none.
const char* python_binary();
std::string example_envs_dir();

/// Heartbeat settings the tests run with unless a test needs the default (a loaded CI machine
/// must not lose a node to a slow scheduler).
inline const std::vector<std::string> tolerant_heartbeats{"--heartbeat-ms", "200",
                                                          "--dead-after-ms", "4000"};

/// A head and its nodes as child processes.
class test_cluster {
public:
  /// Starts `rlforge head --port 0` (plus `head_args`) and waits until it listens.
  explicit test_cluster(const std::string& tag, std::vector<std::string> head_args = {});
  ~test_cluster();

  /// Starts `rlforge node --head <endpoint> --node-id <id> --gpus <gpus> --cpus <cpus>` (plus
  /// `extra`); with `wrapper` (e.g. {"ip", "netns", "exec", "ns1"}) the command runs through
  /// it. Waits until the node joined (or exited) and returns it.
  child_process& add_node(const std::string& id, int gpus = 2, int cpus = 2,
                          std::vector<std::string> extra = {},
                          std::vector<std::string> wrapper = {});

  /// Kills the head (SIGKILL) and starts a new one on the same port.
  void restart_head();

  child_process& head() { return *head_; }
  child_process& node(const std::string& id) { return *nodes_.at(id); }
  /// Forgets node `id` (its process is killed).
  void drop_node(const std::string& id) { nodes_.erase(id); }

  /// "127.0.0.1:<port>" (or `<address>:<port>` with --bind).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& dir() const { return dir_; }

  /// Every log, for failure messages.
  std::string logs() const;

private:
  void start_head();

  std::string tag_;
  std::string dir_;
  std::vector<std::string> head_args_;
  std::string endpoint_;
  int starts_ = 0;
  std::unique_ptr<child_process> head_;
  std::map<std::string, std::unique_ptr<child_process>> nodes_;
};

/// This process as a driver attached to a cluster: an actor system whose actor groups land on
/// the cluster's nodes.
class test_driver {
public:
  /// Attaches to `endpoint` with `extra` system_config arguments (e.g. --tls DIR).
  explicit test_driver(const std::string& endpoint, std::vector<std::string> extra = {});
  ~test_driver();

  /// Empty when attached, else why not.
  const std::string& error() const { return error_; }

  caf::actor_system& sys() { return *sys_; }
  const caf::actor& manager() const { return manager_; }
  actors::placement_client& pgs() { return *pgs_; }

  /// `rlforge status --json` through the driver's session; `{"error": text}` when the head
  /// does not answer within 10 s.
  nlohmann::json status();

  /// Spawns group `name` of `kind` on `pg`, one thread a rank; with `reserve` its shares are
  /// reserved through the driver's placement manager.
  caf::expected<actors::actor_group> spawn_group(const std::string& name, const std::string& kind,
                                                 const placement_group_info& pg,
                                                 bool reserve = false);

private:
  runtime::system_config cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  caf::actor manager_;
  std::unique_ptr<actors::placement_client> pgs_;
  std::string error_;
};

/// A 1-D float32 tensor blob of `values`, and the values of one (for collective calls).
tensor_blob f32_blob(const std::vector<float>& values);
std::vector<float> floats(const tensor_blob& b);

/// The node of each bundle, in bundle order.
std::vector<std::string> bundle_nodes(const placement_group_info& pg);

/// Polls `status()` (a `test_driver::status()`) until `pred` holds (true) or `timeout` passes
/// (false). An error status (`{"error": ...}`: the head did not answer) never satisfies `pred`,
/// which is not called with it, so a predicate may read the keys of a real status.
template <class Status, class Pred>
bool eventually(Status status, Pred pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const nlohmann::json s = status();
    if (!(s.is_object() && s.contains("error")) && pred(s))
      return true;
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

/// The status entry of node `id` (null JSON when absent).
nlohmann::json node_status(const nlohmann::json& status, const std::string& id);

/// OpenMP threads sleep while they wait (several ranks share the cores).
extern const std::map<std::string, std::string> passive_omp;

/// The GRPO job (examples/grpo) on `cluster`, placement split (the policy and ref on one node,
/// the engines on another), not judged (--no-goal) and quiet, its metrics in DIR/TAG.jsonl and
/// its plot in DIR/TAG.png (DIR the cluster's directory), then `extra`.
std::vector<std::string> grpo_split_job(const test_cluster& cluster, const std::string& tag,
                                        const std::vector<std::string>& extra = {});

/// `rlforge serve --cluster` of a test cluster (`start_serve`), on a tiny random base model.
struct served {
  std::unique_ptr<child_process> process;
  int port = 0; ///< where it serves HTTP on 127.0.0.1; 0 when it did not start within 120 s

  std::string log() const { return process->log(); }
  void kill() { process->kill(); }
};

/// Starts `rlforge serve --cluster` on `cluster` without authentication, its base model (the
/// "tiny" preset, seed 7), database and checkpoints in the cluster's directory, with `flags`
/// and `heartbeats`, and waits until it listens.
served start_serve(test_cluster& cluster, const std::vector<std::string>& flags,
                   const std::vector<std::string>& heartbeats = tolerant_heartbeats);

/// The text between `prefix` and the next quote in `text` (empty when absent): e.g. the node
/// after "engines (1) on node '" in the GRPO job's opening line.
std::string quoted_after(const std::string& text, const std::string& prefix);

/// The records of a JSONL file (a job's metrics); a line that is not JSON (empty, or the partial
/// last line of a file being written) is skipped; none when the file is absent.
std::vector<nlohmann::json> read_jsonl(const std::string& path);

} // namespace rlforge::cluster_test
