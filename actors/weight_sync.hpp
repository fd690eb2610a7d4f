#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <caf/expected.hpp>
#include <caf/message.hpp>

#include "runtime/messages.hpp"

namespace rlforge::backends {
class causal_lm;
} // namespace rlforge::backends

namespace rlforge::actors {

/// Where a rank runs: a host identity (host name, boot id and network namespace, so two
/// containers, two reboots or two network namespaces with one host name differ: shared memory
/// and its abstract socket only reach peers with the same identity), the process id, and the
/// address peers on other hosts reach this process at (the node's advertised address). Ranks
/// answer it through the built-in op `location` as (host, pid, address).
struct process_location {
  std::string host;
  int64_t pid = 0;
  std::string address = "127.0.0.1";
  /// Where the rank's weights live: "cpu" or "cuda:N" (a rank's `location` op fills it;
  /// `this_process` leaves "cpu").
  std::string device = "cpu";
};

/// This process's location.
process_location this_process();

/// Sets the address this process advertises to peers (a node's `--node-ip`; default
/// 127.0.0.1): Gloo groups and TCP stores of its ranks bind to it and peers connect to it. Call
/// before ranks start. Thread-safe.
void set_advertised_address(const std::string& address);

/// The address set by `set_advertised_address`.
std::string advertised_address();

/// A fresh name for one transfer's meeting point (in-process channel, shared-memory socket, Gloo
/// store and group), unique across every process and host of a cluster: a random per-process
/// nonce, the pid and a process-wide counter. Every transfer must use its own: two transfers
/// meeting on one name would deliver one sender's weights to the other's receivers.
/// Thread-safe.
std::string new_sync_channel();

/// The fastest weight transport that reaches `receiver` from `sender`: "in_process" when they
/// share a process; when they share a host identity (host, boot and network namespace),
/// "cuda_ipc" if both hold their weights on CUDA devices, else "shm"; "gloo" otherwise. The
/// host transports move CUDA weights through host memory (staged on both ends).
std::string choose_transport(const process_location& sender, const process_location& receiver);

/// The weights a trainer sends to its engines: the policy's base weights under Hugging Face
/// names with any LoRA update merged in (`causal_lm::state_dict()`, copies) or, without LoRA,
/// the live parameters themselves (no copy); never the value head.
/// Exposed for tests; `send_model_weights` sends exactly these.
std::vector<std::pair<std::string, at::Tensor>> weights_for_sync(const backends::causal_lm& model);

/// Sender side of one planned transfer (`spec.rank` must be 0): sends `weights_for_sync(model)`
/// as `spec.version` through `spec.transport` and returns once the receiver(s) committed it.
/// Returns the bytes sent. Throws `backends::error`: `invalid_argument` for a bad spec or when a
/// receiver rejected the manifest (its reason included where the transport carries it),
/// `timeout` when no receiver took the transfer within `spec.timeout_ms`.
/// Transport "message" is not handled here (the dispatcher moves a `tensor_map`).
int64_t send_model_weights(const backends::causal_lm& model, const weight_sync_spec& spec);

/// Receiver side (an engine, `spec.rank` >= 1 for gloo): waits for the transfer and commits it
/// into `model`'s parameters in place. `spec.version` must exceed `current_version` (checked
/// by the transport, which reports the refusal to the sender). A rejected transfer (a stale
/// version, or names, shapes or dtypes that differ from the model's) changes nothing and throws
/// `backends::error{invalid_argument}` naming the differences; `torn` is set when a transfer
/// broke after the copy began (the shared-memory ring when the sender stops mid-stream), which
/// leaves the weights a mix of two versions. Returns the version now held.
int64_t receive_model_weights(backends::causal_lm& model, int64_t current_version,
                              const weight_sync_spec& spec, bool& torn);

/// For "gloo": opens, on the sender's side, the TCP store of the transfer `channel` on `host`
/// (port picked by the OS) for `world_size` ranks, kept until `send_model_weights` for that
/// channel ends (or `close_sync_store`). Returns the port receivers connect to.
int32_t open_sync_store(const std::string& channel, const std::string& host, int32_t world_size,
                        int64_t timeout_ms);

/// Drops the store `open_sync_store` opened for `channel` (no-op when there is none).
void close_sync_store(const std::string& channel);

class rank_context;

/// The trainer side of a weight sync as ops of the worker kinds (policy):
///  - `send_weights` (std::vector<weight_sync_spec>) → int64 bytes sent: rank 0 sends the
///    model's weights (`weights_for_sync`) once per spec, in order; the other ranks answer 0 at
///    once. Refused before init_model and while the model is offloaded.
///  - `open_sync_store` (std::string channel, std::string host, int32 world_size,
///    int64 timeout_ms) → int32 port: rank 0 opens the TCP store of a gloo transfer.
caf::expected<caf::message> send_weights_op(rank_context& ctx, const caf::message& args);
caf::expected<caf::message> open_sync_store_op(rank_context& ctx, const caf::message& args);

} // namespace rlforge::actors
